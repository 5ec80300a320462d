"""The trunk schedule: seed semantics (segments, batching rule, tokenwise override) and input
validation."""

import itertools

import pytest

from harness.walk.schedule import PRIME_MIN_T, TrunkChunk, chunk_ranges, trunk_schedule


def whole(n):
    return [(0, n)]


def never_called(n):
    raise AssertionError(f"ranges({n}) called for a non-batched segment")


def recording(chunk_rows):
    """A ``ranges`` that cuts by ``chunk_rows`` and records every segment length it is asked for."""
    calls = []

    def ranges(n):
        calls.append(n)
        return chunk_ranges(n, chunk_rows)

    return ranges, calls


# Ports of the seed's unit tests.


def test_stable_captures_preserve_segment_local_ranges_and_tiny_tail_program():
    chunks = trunk_schedule(2061, 1024, 2048, False, whole)
    assert [(c.start, c.end, c.segment_start) for c in chunks] == [
        (0, 1024, 0),
        (1024, 2048, 1024),
        (2048, 2061, 2048),
    ]
    assert chunks[0].batched and chunks[1].batched
    assert not chunks[2].batched and not chunks[2].target_step
    assert [row for c in chunks for row in range(c.start, c.end)] == list(range(2061))


def test_tokenwise_override_retains_the_legacy_segment_program():
    cold = trunk_schedule(2048, None, None, True, never_called)
    assert len(cold) == 1
    assert not cold[0].batched and cold[0].target_step

    split = trunk_schedule(2048, 1024, 1024, True, whole)
    assert len(split) == 2
    assert split[0].batched
    assert not split[1].batched and not split[1].target_step


# Properties over many shapes.

TPS = [1, 2, PRIME_MIN_T - 1, PRIME_MIN_T, PRIME_MIN_T + 1, 64, 65, 100, 257, 2061]
CHUNK_ROWS = [None, 1, 7, PRIME_MIN_T, 1000]


def stop_candidates(tp):
    inside = {1, PRIME_MIN_T - 1, PRIME_MIN_T, tp // 2, tp - PRIME_MIN_T, tp - 1}
    return [None] + sorted(s for s in inside if 0 < s < tp)


def schedule_cases():
    for tp in TPS:
        stops = stop_candidates(tp)
        for split, ckpt, tokenwise in itertools.product(stops, stops, (False, True)):
            yield tp, split, ckpt, tokenwise


@pytest.mark.parametrize("chunk_rows", CHUNK_ROWS)
def test_schedule_properties(chunk_rows):
    cases = 0
    for tp, split, ckpt, tokenwise in schedule_cases():
        ranges, calls = recording(chunk_rows)
        chunks = trunk_schedule(tp, split, ckpt, tokenwise, ranges)
        case = (tp, split, ckpt, tokenwise, chunk_rows)

        # Chunks tile 0..tp in order, each non-empty and inside its segment.
        assert [row for c in chunks for row in range(c.start, c.end)] == list(range(tp)), case
        assert all(c.rows > 0 for c in chunks), case
        assert all(c.segment_start <= c.start < c.end <= c.segment_end for c in chunks), case

        # Segments are cut at exactly the stops.
        bounds = sorted({0, tp} | {s for s in (split, ckpt) if s is not None})
        segments = list(dict.fromkeys((c.segment_start, c.segment_end) for c in chunks))
        assert segments == list(zip(bounds, bounds[1:])), case

        # The batching rule, segment by segment; ranges is asked only for batched segments.
        segmented = len(bounds) > 2
        batched_lengths = []
        for lo, hi in segments:
            seg = [c for c in chunks if c.segment_start == lo]
            expect_batched = hi - lo >= PRIME_MIN_T and ((segmented and hi < tp) or not tokenwise)
            if expect_batched:
                batched_lengths.append(hi - lo)
                assert all(c.batched and not c.target_step for c in seg), case
                local = [(c.start - lo, c.end - lo) for c in seg]
                assert local == chunk_ranges(hi - lo, chunk_rows), case
            else:
                assert seg == [TrunkChunk(lo, hi, lo, hi, False, not segmented)], case
        assert calls == batched_lengths, case
        cases += 1
    assert cases > 500


@pytest.mark.parametrize("tokenwise", [False, True])
@pytest.mark.parametrize("tp", [1, 5, PRIME_MIN_T - 1])
def test_short_unsegmented_prompt_is_one_target_step_chunk(tp, tokenwise):
    assert trunk_schedule(tp, None, None, tokenwise, never_called) == [
        TrunkChunk(0, tp, 0, tp, batched=False, target_step=True)
    ]


def test_short_segments_run_token_by_token_without_target_steps():
    chunks = trunk_schedule(20, 10, None, False, never_called)
    assert chunks == [
        TrunkChunk(0, 10, 0, 10, batched=False, target_step=False),
        TrunkChunk(10, 20, 10, 20, batched=False, target_step=False),
    ]


def test_segment_of_exactly_prime_min_t_rows_is_batched():
    chunks = trunk_schedule(2 * PRIME_MIN_T, PRIME_MIN_T, None, True, whole)
    assert [(c.start, c.end, c.batched) for c in chunks] == [
        (0, PRIME_MIN_T, True),
        (PRIME_MIN_T, 2 * PRIME_MIN_T, False),
    ]


@pytest.mark.parametrize("tokenwise, tail_batched", [(False, True), (True, False)])
def test_tail_segment_batched_only_when_not_tokenwise(tokenwise, tail_batched):
    chunks = trunk_schedule(2100, 1024, None, tokenwise, whole)
    assert [(c.start, c.end) for c in chunks] == [(0, 1024), (1024, 2100)]
    assert chunks[0].batched
    assert chunks[1].batched is tail_batched
    assert not chunks[1].target_step


def test_unsegmented_long_prompt_batched_unless_tokenwise():
    assert trunk_schedule(100, None, None, False, whole) == [
        TrunkChunk(0, 100, 0, 100, batched=True, target_step=False)
    ]
    assert trunk_schedule(100, None, None, True, never_called) == [
        TrunkChunk(0, 100, 0, 100, batched=False, target_step=True)
    ]


@pytest.mark.parametrize("tokenwise", [False, True])
def test_split_equal_to_checkpoint_is_one_stop(tokenwise):
    both = trunk_schedule(100, 50, 50, tokenwise, whole)
    assert both == trunk_schedule(100, 50, None, tokenwise, whole)
    assert both == trunk_schedule(100, None, 50, tokenwise, whole)
    assert [(c.segment_start, c.segment_end) for c in both] == [(0, 50), (50, 100)]


def test_stop_order_does_not_matter():
    forward = trunk_schedule(300, 100, 200, False, whole)
    assert trunk_schedule(300, 200, 100, False, whole) == forward


def test_multi_chunk_ranges_are_segment_local():
    ranges, calls = recording(40)
    chunks = trunk_schedule(300, 100, None, False, ranges)
    assert calls == [100, 200]
    assert [(c.start, c.end, c.segment_start, c.segment_end) for c in chunks] == [
        (0, 40, 0, 100),
        (40, 80, 0, 100),
        (80, 100, 0, 100),
        (100, 140, 100, 300),
        (140, 180, 100, 300),
        (180, 220, 100, 300),
        (220, 260, 100, 300),
        (260, 300, 100, 300),
    ]
    assert [c.rows for c in chunks] == [40, 40, 20, 40, 40, 40, 40, 40]


# Validation.


@pytest.mark.parametrize("tp", [0, -1])
def test_rejects_empty_prompt(tp):
    with pytest.raises(ValueError, match="tp >= 1"):
        trunk_schedule(tp, None, None, False, whole)


@pytest.mark.parametrize(
    "split, ckpt, name",
    [(0, None, "prime_split"), (100, None, "prime_split"), (-5, None, "prime_split"),
     (None, 0, "ckpt_rel"), (None, 100, "ckpt_rel"), (50, 101, "ckpt_rel")],
)
def test_rejects_stops_outside_the_prompt(split, ckpt, name):
    with pytest.raises(ValueError, match=name):
        trunk_schedule(100, split, ckpt, False, whole)


@pytest.mark.parametrize(
    "bad_ranges",
    [
        lambda n: [],
        lambda n: [(0, n - 1)],
        lambda n: [(0, n + 1)],
        lambda n: [(1, n)],
        lambda n: [(0, 10), (11, n)],
        lambda n: [(0, 10), (5, n)],
        lambda n: [(10, n), (0, 10)],
        lambda n: [(0, 0), (0, n)],
        lambda n: [(0, n), (n, n)],
    ],
    ids=["none", "short", "long", "late-start", "gap", "overlap", "out-of-order", "empty-first",
         "empty-last"],
)
def test_rejects_ranges_that_do_not_tile_the_segment(bad_ranges):
    with pytest.raises(ValueError, match=r"ranges\(100\)"):
        trunk_schedule(100, None, None, False, bad_ranges)


# chunk_ranges.


@pytest.mark.parametrize(
    "n, chunk_rows, expected",
    [
        (10, 3, [(0, 3), (3, 6), (6, 9), (9, 10)]),
        (9, 3, [(0, 3), (3, 6), (6, 9)]),
        (10, 10, [(0, 10)]),
        (10, 20, [(0, 10)]),
        (10, 1, [(i, i + 1) for i in range(10)]),
        (10, None, [(0, 10)]),
        (10, 0, [(0, 10)]),
        (10, -4, [(0, 10)]),
        (0, 3, []),
        (0, None, []),
    ],
)
def test_chunk_ranges(n, chunk_rows, expected):
    assert chunk_ranges(n, chunk_rows) == expected


def test_chunk_ranges_rejects_negative_rows():
    with pytest.raises(ValueError):
        chunk_ranges(-1, 4)
