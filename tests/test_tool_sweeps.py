"""tools/decode_kernels.py's line search (``--sweep-search line``): the GPU sweep's configuration
search, checked here on made-up timing functions (no GPU)."""

import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

from decode_kernels import SWEEP_FIELDS, line_search  # noqa: E402

SPACE = ((4, 8), (1, 2, 4, 8), (1, 4, 8), (1, 2, 3), (1, 2))  # the bf16 sweep's space


def counted(f):
    """``f`` with a cache (as the sweep's ``measure``) and the list of points it timed."""
    seen = {}

    def measure(p):
        if p not in seen:
            seen[p] = f(p)
        return seen[p]

    return measure, seen


def test_line_search_finds_a_separable_minimum_with_fewer_points_than_the_grid():
    want = (8, 4, 1, 3, 2)
    cost = lambda p: sum((a - b) ** 2 for a, b in zip(p, want)) + 10.0  # noqa: E731
    measure, seen = counted(cost)
    assert line_search(measure, (4, 1, 8, 1, 1), SPACE) == want
    grid = len(list(itertools.product(*SPACE)))
    assert len(seen) < grid // 4, (len(seen), grid)
    assert len(SWEEP_FIELDS) == len(SPACE)


def test_line_search_skips_invalid_points_and_keeps_a_best_start():
    # invalid (None) wherever the second field is 8; the start is already the fastest valid point
    cost = lambda p: None if p[1] == 8 else 1.0 + sum(p) / 100 + (0 if p == (4, 2, 4, 2, 1) else 1)  # noqa: E731
    measure, seen = counted(cost)
    assert line_search(measure, (4, 2, 4, 2, 1), SPACE) == (4, 2, 4, 2, 1)
    assert any(p[1] == 8 for p in seen)  # asked, and passed over


def test_line_search_moves_across_coupled_fields_in_later_passes():
    """A minimum that one pass cannot reach: at the start's third field the first field's other
    value is slower, so the first pass leaves it; once the third field has moved, the second
    pass finds the first field's other value faster."""
    table = {(4, 1): 5, (8, 1): 6, (4, 4): 7, (8, 4): 7, (4, 8): 4, (8, 8): 1}
    measure, _ = counted(lambda p: table[p[0], p[2]] + p[1] + p[3] + p[4])
    assert line_search(measure, (4, 1, 1, 1, 1), SPACE) == (8, 1, 8, 1, 1)
    measure, _ = counted(lambda p: table[p[0], p[2]] + p[1] + p[3] + p[4])
    assert line_search(measure, (4, 1, 1, 1, 1), SPACE, passes=1) == (4, 1, 8, 1, 1)
