"""bf16 weights on the CPU twin (issue #14): ``linear``, ``embed``, ``moe_up`` and ``moe_down``
accept a weight of bf16 bit patterns (numpy uint16, same signature) and widen each element
exactly in registers (``widen``: bits << 16), so their outputs are bit-identical to the float32
path on the widened weights (DESIGN.md §8). The CUDA kernels (GEMV, GEMM, the one-thread
launches) read the same uint16 weights: tests/test_cudasim.py and tests/test_sim_gemv.py /
tests/test_sim_gemm.py check them against these twins under the simulator.
"""

from __future__ import annotations

import numpy as np

from numba_kernels import cpu as kp

F32 = np.float32
rng = np.random.default_rng(5)


def bf16(shape, scale=1.0):
    """(uint16 bit patterns, the same values widened to float32)."""
    w = (scale * rng.standard_normal(shape)).astype(F32)
    h = (w.view(np.uint32) >> 16).astype(np.uint16)
    h.flat[:3] = [0x8000, 0x7F80, 0x7FC0]  # -0, +inf, NaN
    return h, (h.astype(np.uint32) << 16).view(F32)


def same(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_linear_bf16_equals_widened_fp32():
    for R, K, N in ((1, 70, 9), (5, 1100, 33), (9, 64, 40)):
        X = rng.standard_normal((R, K)).astype(F32)
        h, w = bf16((N, K), K ** -0.5)
        a, b = np.full((R + 1, N), 7.0, F32), np.full((R + 1, N), 7.0, F32)
        kp.linear(X, h, a, R)
        kp.linear(X, w, b, R)
        assert same(a, b) and (a[R] == 7.0).all()


def test_embed_bf16_equals_widened_fp32():
    h, w = bf16((50, 12))
    ids = rng.integers(0, 50, 6).astype(np.int32)
    a, b = np.zeros((6, 12), F32), np.zeros((6, 12), F32)
    kp.embed(ids, h, a)
    kp.embed(ids, w, b)
    assert same(a, b)


def test_moe_experts_bf16_equal_widened_fp32():
    E, I, H, R, k = 4, 6, 40, 3, 2
    idx = np.array([[1, 3], [0, 2], [3, 1]], np.int32)
    X = rng.standard_normal((R, H)).astype(F32)
    (gh, gw), (uh, uw), (dh, dw) = bf16((E * I, H), 0.2), bf16((E * I, H), 0.2), bf16((E * H, I), 0.3)
    a, b = np.zeros((R * k, I), F32), np.zeros((R * k, I), F32)
    kp.moe_up(X, gh, uh, idx, I, a, R)
    kp.moe_up(X, gw, uw, idx, I, b, R)
    assert same(a, b)
    ya, yb = np.zeros((R * k, H), F32), np.zeros((R * k, H), F32)
    kp.moe_down(np.nan_to_num(a), dh, idx, H, ya, R)
    kp.moe_down(np.nan_to_num(a), dw, idx, H, yb, R)
    assert same(ya, yb)
