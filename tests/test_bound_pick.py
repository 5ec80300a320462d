"""bound_pick (numba_kernels.sampling): the greedy pick of X·Wᵀ from approximate bf16 logits and
the exact dot of the rows the bound leaves, against greedy_pick of the exact logits.

- the bound itself (harness.engine.draft.bound_tables) holds, and is nearly tight, for inputs built
  to reach it (x aligned with a row's bf16 rounding error);
- the CPU twin picks numpy.argmax of the exact logits on random rows, ties inside and across
  blocks, rows the bf16 copy orders wrongly, x = 0 (every row a candidate), NaN/Inf in x or W,
  values whose dots could overflow and products that underflow;
- the bound leaves few rows on random inputs (the point of it);
- the kernel under Numba's simulator picks what the twin picks (blocks of one warp there);
- an engine's chained drafts with it are its stepwise drafts (tests/test_draft_vocab.py).
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from harness.engine.draft import BOUND_MAX_K, bound_tables, bound_wanted
from harness.engine.modes import round_bf16
from harness.errors import InputError
from numba_kernels import cpu
from numba_kernels.sampling import BP_ROWS
from tool_runs import sim_result

F32 = np.float32


def _exact(X, W):
    out = np.zeros((1, W.shape[0]), F32)
    cpu.linear(X, W, out, 1)
    return out


def _greedy(X, W):
    io, picked = np.array([4, 0], np.int32), np.full(2, -1, np.int32)
    cpu.greedy_pick(_exact(X, W), io, picked, 1)
    return int(picked[1]), io.tolist()


def _bound(X, W):
    w16, rc, mc, xf = bound_tables(W)
    A = np.zeros((1, W.shape[0]), F32)
    cpu.linear(X, w16, A, 1)
    io, picked = np.array([4, 0], np.int32), np.full(2, -1, np.int32)
    cpu.bound_pick(X, W, A, rc, mc, xf, io, picked, 1)
    return int(picked[1]), io.tolist()


def _cases(rng):
    """(name, X [1, K], W [N, K]) float32: the inputs the twin and the kernel are checked on."""
    out = []
    for N, K in ((600, 96), (300, 2048), (33, 5), (700, 1100)):
        W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(F32)
        X = rng.standard_normal((1, K)).astype(F32)
        top = int(np.argmax(_exact(X, W)))
        out.append((f"random-N{N}-K{K}", X, W))
        d = W.copy()
        d[[N // 2, N - 1, top]] = W[top]  # exact ties, in other blocks than the first one
        out.append((f"ties-N{N}-K{K}", X, d))
        out.append((f"zero-x-N{N}-K{K}", np.zeros_like(X), W))
        for where in ((0, 3), (0, K - 1)):
            n = X.copy()
            n[where] = np.nan
            out.append((f"nan-x{where[1]}-N{N}-K{K}", n, W))
        i = X.copy()
        i[0, K // 2] = np.inf
        out.append((f"inf-x-N{N}-K{K}", i, W))
        wi = W.copy()
        wi[N // 3, 1] = np.inf
        wi[N // 4, 0] = np.nan
        out.append((f"inf-nan-w-N{N}-K{K}", X, wi))
        out.append((f"big-N{N}-K{K}", (X * F32(1e30)).astype(F32), (W * F32(1e10)).astype(F32)))
        out.append((f"huge-x-N{N}-K{K}", (X * F32(3e19)).astype(F32), W))  # ‖x‖² overflows float32
        out.append((f"tiny-N{N}-K{K}", (X * F32(1e-25)).astype(F32), (W * F32(1e-20)).astype(F32)))
    # rows whose bf16 copies order them wrongly: row 1 is row 0 (bf16 values) times 1 + 2**-12,
    # which rounds back to row 0, so its exact logit is larger (x has the weights' signs), its
    # approximate one equal
    K = 64
    w0 = round_bf16(rng.standard_normal((1, K)).astype(F32) / 8)[0]
    W = np.tile(w0, (40, 1)) * F32(0.5)
    W[0] = w0
    W[1] = w0 * F32(1 + 2.0 ** -12)
    X = np.abs(rng.standard_normal((1, K))).astype(F32) * np.sign(w0).astype(F32)
    out.append(("bf16-reversed", X, W.astype(F32)))
    return out


@pytest.fixture(scope="module")
def cases():
    return _cases(np.random.default_rng(7))


def test_the_bound_holds_where_it_is_tight():
    """|L − A| ≤ Rc·‖x‖ + 2**-120 with x along a row's bf16 rounding error, where Cauchy–Schwarz is
    an equality: the largest ratio reached is near 1 (the bound is tight, not slack) and never
    above."""
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(200):
        K = int(rng.integers(1, 300))
        W = (rng.standard_normal((6, K)) * np.exp(rng.uniform(-5, 5))).astype(F32)
        err = W.astype(np.float64) - round_bf16(W)
        X = (err[:1] / (np.abs(err[0]).max() + 1e-300)).astype(F32)
        w16, rc, mc, xf = bound_tables(W)
        A = np.zeros((1, 6), F32)
        cpu.linear(X, w16, A, 1)
        xn = np.sqrt(np.sum(X.astype(np.float64) ** 2))
        worst = max(worst, float(np.max(np.abs(_exact(X, W)[0].astype(np.float64) - A[0]) / (rc * xn + 2.0 ** -120))))
    assert 0.99 < worst <= 1.0, worst


def test_the_twin_is_numpy_argmax(cases):
    for name, X, W in cases:
        want = _greedy(X, W)
        assert _bound(X, W) == want, name
        assert want[1] == [5, want[0]]


def test_the_bf16_copy_alone_would_pick_wrongly(cases):
    """The reversed case is one the approximate logits get wrong: the exact dots decide it."""
    (X, W), = [(x, w) for n, x, w in cases if n == "bf16-reversed"]
    A = np.zeros((1, W.shape[0]), F32)
    cpu.linear(X, bound_tables(W)[0], A, 1)
    assert int(np.argmax(A[0])) == 0 and _greedy(X, W)[0] == _bound(X, W)[0] == 1


def test_few_rows_are_left_on_random_inputs():
    """bench-8l's shape class (K = 2,048, 32,768 rows): the bound leaves a handful of rows a block
    (each block keeps at least its own best), not the block."""
    rng = np.random.default_rng(3)
    N, K = 8 * BP_ROWS, 2048
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(F32)
    X = rng.standard_normal((1, K)).astype(F32)
    w16, rc, mc, xf = bound_tables(W)
    A = np.zeros((1, N), F32)
    cpu.linear(X, w16, A, 1)
    xn = np.float64(np.sqrt(np.sum(X.astype(np.float64) ** 2))) * xf
    e = rc * xn * (1 + 2.0 ** -10) + np.abs(A[0]) * 2.0 ** -21
    left = 0
    for r0 in range(0, N, BP_ROWS):
        a, b = A[0, r0:r0 + BP_ROWS], e[r0:r0 + BP_ROWS]
        left += int(np.sum(a + b >= np.max(a - b)))
    assert N // BP_ROWS <= left <= 4 * N // BP_ROWS, left


def test_the_bf16_copy_is_the_projects_rounding():
    """The copy's bits are numba_kernels.mma.f32_to_bf16's (round_bf16's), special values included:
    ties to even, the largest float32 (to inf), subnormals, signed zeros, infinities, NaNs."""
    from numba_kernels.mma import f32_to_bf16

    bits = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00000001, 0x807FFFFF, 0x80000000, 0x7F800000,
                     0xFF800000, 0x7F800001, 0xFFC12345, 0x7FFFFFFF], np.uint32)
    W = np.concatenate([bits.view(F32), np.random.default_rng(2).standard_normal(53).astype(F32)]).reshape(8, 8)
    np.testing.assert_array_equal(bound_tables(W)[0], f32_to_bf16(W))


def test_tables_refuse_what_the_bound_does_not_cover():
    with pytest.raises(ValueError, match="float32"):
        bound_tables(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="over"):
        bound_tables(np.zeros((1, BOUND_MAX_K + 1), F32))
    w16, rc, mc, xf = bound_tables(np.array([[1.0, np.inf], [np.nan, 0.0], [3.0, 4.0]], F32))
    assert np.isinf(mc[0]) and np.isnan(mc[1]) and mc[2] >= 5 and rc[2] >= 0 and xf > 1


def test_where_it_applies(monkeypatch):
    monkeypatch.delenv("PRIMEWALK_DRAFT_BOUND", raising=False)
    assert bound_wanted("cuda", "exact", "f32") and not bound_wanted("cpu", "exact", "f32")
    assert not bound_wanted("cuda", "exact-bf16", "f32") and not bound_wanted("cuda", "exact", "bf16")
    monkeypatch.setenv("PRIMEWALK_DRAFT_BOUND", "1")
    assert bound_wanted("cpu", "exact", "f32") and not bound_wanted("cpu", "exact", "bf16")
    monkeypatch.setenv("PRIMEWALK_DRAFT_BOUND", "0")
    assert not bound_wanted("cuda", "exact", "f32")
    monkeypatch.setenv("PRIMEWALK_DRAFT_BOUND", "yes")
    with pytest.raises(InputError, match="PRIMEWALK_DRAFT_BOUND"):
        bound_wanted("cuda", "exact", "f32")


SIM = textwrap.dedent(r'''
    import sys
    sys.path.insert(0, "tests")
    import cudasim_blocks
    cudasim_blocks.install()
    import json
    import numpy as np
    from numba import cuda
    from numba.core import config
    assert config.ENABLE_CUDASIM
    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    from harness.engine.draft import bound_tables
    from test_bound_pick import _cases

    res = []
    for name, X, W in _cases(np.random.default_rng(7)):
        if W.shape[0] * W.shape[1] > 200000:
            continue  # the simulator runs each thread in Python
        w16, rc, mc, xf = bound_tables(W)
        A = np.zeros((1, W.shape[0]), np.float32)
        kp.linear(X, w16, A, 1)
        io, picked = np.array([4, 0], np.int32), np.full(2, -1, np.int32)
        kp.bound_pick(X, W, A, rc, mc, xf, io, picked, 1)
        dio, dp = cuda.to_device(np.array([4, 0], np.int32)), cuda.to_device(np.full(2, -1, np.int32))
        for _ in range(2):  # the done-counter is left at zero: a second launch picks again
            kc.bound_pick(cuda.to_device(X), cuda.to_device(W), cuda.to_device(A), cuda.to_device(rc),
                          cuda.to_device(mc), xf, dio, dp, 1)
        res.append(dict(name=name, want=picked.tolist(), got=dp.copy_to_host().tolist(),
                        io=dio.copy_to_host().tolist(), want_io=io.tolist()))
    print("RESULT " + json.dumps(res))
''')


def test_the_kernel_under_the_simulator_picks_what_the_twin_picks():
    res = sim_result(SIM, timeout=900)
    assert len(res) >= 20
    for r in res:
        assert r["got"] == r["want"], r
        assert r["io"] == [r["want_io"][0] + 1, r["want_io"][1]], r  # two launches: the position moved twice
