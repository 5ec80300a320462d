"""The prime walker protocol, pinned on a fake walker built on GuardedWalker."""

import logging

import pytest

from harness.walk.protocol import (
    GuardedWalker,
    PrimeChunk,
    PrimeError,
    PrimeProgress,
    PrimeWalker,
    advance_prime,
    finish_prime,
    trace_chunk,
)

PLAN = (
    PrimeChunk("mtp-trunk", 64),
    PrimeChunk("mtp-trunk", 64),
    PrimeChunk("mtp-trunk", 13),
    PrimeChunk("mtp-draft-fill", 32),
    PrimeChunk("mtp-draft-fill", 9),
)


class FakeWalker(GuardedWalker):
    """Runs a planned tape, logging each chunk it executes. ``fail_at`` makes that chunk raise
    once (the fault is transient: only the guard keeps the walker unusable afterwards);
    ``fail_finish`` makes ``_finish`` raise."""

    def __init__(self, plan=PLAN, fail_at=None, fail_finish=False):
        super().__init__()
        self.plan = tuple(plan)
        self.cursor = 0
        self.work = []
        self.fail_at = fail_at
        self.fail_finish = fail_finish

    def remaining_chunks(self):
        return len(self.plan) - self.cursor

    def next_chunk(self):
        return self.plan[self.cursor] if self.remaining_chunks() else None

    def _advance(self):
        if self.cursor == self.fail_at:
            self.fail_at = None
            raise RuntimeError(f"device fault in chunk {self.cursor}\nsecond line")
        chunk = self.plan[self.cursor]
        self.work.append((self.cursor, chunk))
        self.cursor += 1
        return chunk

    def _finish(self):
        if self.fail_finish:
            raise RuntimeError("setup incomplete")
        return tuple(self.work)


class SkippingWalker(FakeWalker):
    """A buggy walker that consumes ``step`` chunks per advance."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def _advance(self):
        chunk = self.plan[self.cursor]
        self.cursor += self.step
        return chunk


def drain(walker, observe=None):
    progress = advance_prime(walker, yield_after_chunk=False, observe=observe)
    return progress, finish_prime(walker)


def run_yielded(walker, observe=None):
    progresses = []
    while walker.remaining_chunks():
        progresses.append(advance_prime(walker, yield_after_chunk=True, observe=observe))
    return progresses, finish_prime(walker)


def test_yielded_and_drained_runs_execute_identical_tapes():
    drained, yielded = FakeWalker(), FakeWalker()
    progress, drained_out = drain(drained)
    progresses, yielded_out = run_yielded(yielded)

    assert drained.work == yielded.work == list(enumerate(PLAN))
    assert drained_out == yielded_out
    assert progress == PrimeProgress(PLAN[-1], len(PLAN), 0)
    assert progresses == [
        PrimeProgress(chunk, 1, len(PLAN) - i - 1) for i, chunk in enumerate(PLAN)
    ]


def test_each_advance_consumes_exactly_one_chunk():
    walker = FakeWalker()
    for i, planned in enumerate(PLAN):
        assert walker.remaining_chunks() == len(PLAN) - i
        assert walker.advance_chunk() == planned
        assert walker.work == list(enumerate(PLAN))[: i + 1]
    assert walker.remaining_chunks() == 0


@pytest.mark.parametrize("step", [0, 2])
def test_guard_rejects_an_advance_that_does_not_consume_one_chunk(step):
    walker = SkippingWalker(step)
    with pytest.raises(PrimeError, match=f"consumed {step} chunks"):
        walker.advance_chunk()
    with pytest.raises(PrimeError, match="poisoned"):
        walker.advance_chunk()


def test_advancing_with_no_chunks_left_is_rejected_without_poisoning():
    walker = FakeWalker(plan=PLAN[:1])
    walker.advance_chunk()
    with pytest.raises(PrimeError, match="no chunks left"):
        walker.advance_chunk()
    assert finish_prime(walker) == ((0, PLAN[0]),)


def test_next_chunk_peeks_without_consuming():
    walker = FakeWalker()
    for planned in PLAN:
        assert walker.next_chunk() == planned
        assert walker.next_chunk() == planned
        assert walker.remaining_chunks() == len(PLAN) - len(walker.work)
        assert walker.advance_chunk() == planned
    assert walker.next_chunk() is None


def test_next_chunk_defaults_to_none():
    class Opaque(GuardedWalker):
        def remaining_chunks(self):
            return 1

        def _advance(self):
            raise NotImplementedError

        def _finish(self):
            raise NotImplementedError

    assert Opaque().next_chunk() is None


@pytest.mark.parametrize("fail_at", range(len(PLAN)))
def test_failing_chunk_leaves_walker_unadvanced_and_unfinishable(fail_at):
    walker = FakeWalker(fail_at=fail_at)
    for _ in range(fail_at):
        walker.advance_chunk()
    done = list(walker.work)

    with pytest.raises(RuntimeError, match=f"device fault in chunk {fail_at}"):
        walker.advance_chunk()
    assert walker.work == done
    assert walker.remaining_chunks() == len(PLAN) - fail_at
    assert walker.next_chunk() == PLAN[fail_at]

    # The fault was transient, yet the walker stays poisoned and names the original error.
    for call in (walker.advance_chunk, walker.finish, lambda: advance_prime(walker, False)):
        with pytest.raises(PrimeError) as info:
            call()
        assert str(info.value) == (
            "prime walker poisoned by an earlier error: "
            f"RuntimeError: device fault in chunk {fail_at}"
        )
    assert walker.work == done


def test_failure_inside_advance_prime_propagates_after_observing_earlier_chunks():
    walker = FakeWalker(fail_at=2)
    seen = []
    with pytest.raises(RuntimeError, match="chunk 2"):
        advance_prime(walker, yield_after_chunk=False, observe=seen.append)
    assert seen == list(PLAN[:2])
    assert walker.remaining_chunks() == len(PLAN) - 2


def test_failing_finish_poisons():
    walker = FakeWalker(fail_finish=True)
    advance_prime(walker, yield_after_chunk=False)
    with pytest.raises(RuntimeError, match="setup incomplete"):
        walker.finish()
    with pytest.raises(PrimeError, match="poisoned.*setup incomplete"):
        walker.finish()


@pytest.mark.parametrize("advanced", range(len(PLAN)))
def test_finish_rejects_an_incomplete_prime(advanced):
    walker = FakeWalker()
    for _ in range(advanced):
        walker.advance_chunk()
    with pytest.raises(PrimeError, match=f"incomplete: {len(PLAN) - advanced} chunks remain"):
        finish_prime(walker)
    # An early finish is a misuse, not a failure: the walker can still complete.
    advance_prime(walker, yield_after_chunk=False)
    assert finish_prime(walker) == tuple(enumerate(PLAN))


def test_finished_walker_does_no_more_work():
    walker = FakeWalker()
    drain(walker)
    work = list(walker.work)
    with pytest.raises(PrimeError, match="already finished"):
        walker.finish()
    with pytest.raises(PrimeError, match="already finished"):
        walker.advance_chunk()
    assert advance_prime(walker, yield_after_chunk=True) == PrimeProgress(None, 0, 0)
    assert walker.work == work


def test_empty_tape_finishes_without_advancing():
    walker = FakeWalker(plan=())
    assert advance_prime(walker, yield_after_chunk=True) == PrimeProgress(None, 0, 0)
    assert finish_prime(walker) == ()


@pytest.mark.parametrize("yielded", [False, True])
def test_observe_sees_every_chunk_in_order(yielded):
    seen = []
    walker = FakeWalker()
    (run_yielded if yielded else drain)(walker, observe=seen.append)
    assert seen == list(PLAN)


def test_trace_chunk_is_a_quiet_debug_observer(caplog, capsys):
    walker = FakeWalker()
    with caplog.at_level(logging.DEBUG, logger="harness.walk.protocol"):
        drain(walker, observe=trace_chunk)
    assert [r.getMessage() for r in caplog.records] == [
        f"prime chunk {c.phase} rows={c.rows}" for c in PLAN
    ]
    assert capsys.readouterr() == ("", "")


def test_prime_walker_is_abstract():
    with pytest.raises(TypeError):
        PrimeWalker()
    with pytest.raises(TypeError):
        GuardedWalker()
