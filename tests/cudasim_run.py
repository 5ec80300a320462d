"""The CUDA backend under Numba's simulator against the CPU twins, bit for bit (run by
tests/test_cudasim.py in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``; prints one ``RESULT`` line
of JSON).

The simulator runs every CUDA thread in Python. :mod:`numba_kernels.launch` binds primitives that
round like the GPU (a true fused multiply-add, float32 rounding everywhere else), so a simulated
kernel computes the GPU's bits and every comparison here is exact. Per case it records whether
the outputs are bitwise equal, the largest ulp distance, and which kernels ran
(``numba_kernels.cuda.LAUNCHES``); the test decides.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cudasim_blocks  # noqa: E402

cudasim_blocks.install()

from numba import cuda  # noqa: E402
from numba.core import config  # noqa: E402

assert config.ENABLE_CUDASIM, "the simulator is not on"

from numba_kernels import cpu as kp  # noqa: E402
from numba_kernels import cuda as kc  # noqa: E402
from numba_kernels import dispatch  # noqa: E402
from numba_kernels import linear as kl  # noqa: E402
from step_compare import model_step  # noqa: E402  (the model steps below)

assert kc.SIMULATED

F32 = np.float32
rng = np.random.default_rng(0)
CASES: list = []
POS_ARG = {"rope": 6, "kv_write": 6, "qk_norm_rope": 10, "attention": 4, "attention_split": 4, "attention_prime": 4, "attention_tiled": 4,
           "attention_mma": 4, "attention_mma_split": 4, "attention_mma_tiled": 4}


def r(*shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(F32)


def w16(*shape, scale=1.0):
    """Random bf16 weights as their bits (uint16)."""
    return (r(*shape, scale=scale).view(np.uint32) >> 16).astype(np.uint16)


def ulps(a, b):
    """Largest distance in float32 ulps (on the monotone integer line of the bits)."""
    def line(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, np.int64(-(2 ** 31)) - i, i)
    return int(np.abs(line(a) - line(b)).max()) if a.size else 0


def case(op, cid, args, outs, cuda_op=None, rows=None, pos=False):
    """Run op on the CPU twin and ``cuda_op`` (default: the same op) on the simulator; compare
    args[i] for i in ``outs``. ``pos``: the CUDA side takes start 0 and the position as an int32
    [1] device array (the captured-step variant)."""
    cuda_op = cuda_op or op
    host = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    getattr(kp, op)(*host)
    kw = {}
    if pos:
        i = POS_ARG[cuda_op]
        kw["pos"] = cuda.to_device(np.array([args[i]], np.int32))
        args = args[:i] + (0,) + args[i + 1:]
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    kc.LAUNCHES.clear()
    t0 = time.perf_counter()
    getattr(kc, cuda_op)(*dev, **kw)
    secs = time.perf_counter() - t0
    bitwise, worst = True, 0
    for i in outs:
        got, want = dev[i].copy_to_host(), host[i]
        if got.dtype == F32:
            same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
            worst = max(worst, 0 if same else ulps(got, want))
        else:
            same = np.array_equal(got, want)
        bitwise &= bool(same)
    CASES.append(dict(op=op, cuda_op=cuda_op, case=cid + ("@pos" if pos else ""), rows=rows, pos=pos, bitwise=bitwise,
                      max_ulp=worst, kernels=sorted(kc.LAUNCHES), seconds=round(secs, 2)))


def primitives():
    """The simulator's primitives round like the GPU's."""
    ns = kc._NS
    a = F32(1 + 2 ** -12)
    out = {"fma fused": bool(ns["fma"](a, a, F32(-(1 + 2 ** -11))) == F32(2 ** -24)),
           "fma is the twin's": all(ns["fma"](x, y, z) == kp.fma(x, y, z) for x, y, z in r(200, 3))}
    x = np.abs(r(500)) * F32(1e3)
    out["sqrt32 float32"] = bool(all(ns["sqrt32"](v) == np.sqrt(v) and type(ns["sqrt32"](v)) is F32 for v in x))
    out["fmul float32"] = bool(all(type(ns["fmul"](v, v)) is F32 and ns["fmul"](v, v) == v * v for v in x))
    return out


def op_cases():
    # scalar maps: the tails too (sigmoid / silu below -88.7, softplus both ways)
    x = np.array([0.0, -0.0, 1.0, -1.0, 20.0, -20.0, 88.0, -90.0, -100.0, 1e-8, np.inf, -np.inf, np.nan, 3.5], F32)
    for op in kc.OPS:
        if op.startswith("map_"):
            case(op, "tails", (x, np.zeros_like(x)), [1])
    # linear through the dispatch table: 1 row and both sides of every threshold (the GEMV's row
    # buckets, the GEMM's 64-row boundaries); K = 72 (128-bit loads) and K = 70 (scalar loads:
    # three dot slices 32, 32, 6), N = 9 leaves the last GEMV block and the GEMM tile ragged; row R
    # of the output is a sentinel that must stay untouched
    rows = {1, 4, 5, 8, 9, 16, 17, 63, 64, 65} | {n for most, _ in dispatch.TABLE["linear"] if most
                                                  for n in (most, most + 1)}
    for R in sorted(rows):
        K = 70 if R in (5, 9) else 72
        X, W = r(R + 1, K), r(9, K, scale=K ** -0.5)
        case("linear", f"R{R}-K{K}-N9", (X, W, np.full((R + 1, 9), 7.0, F32), R), [2], rows=R)
    # bf16 weights (uint16 bit patterns): the twin widens them, both CUDA kernels too
    for R in (1, 5, 9):
        W16 = (r(11, 72, scale=72 ** -0.5).view(np.uint32) >> 16).astype(np.uint16)
        case("linear", f"bf16-R{R}-K72-N11", (r(R + 1, 72), W16, np.full((R + 1, 11), 7.0, F32), R), [2], rows=R)
    # the GEMV's shape classes (tiny / small / large N: gemv_pick) at their row buckets; every
    # version on its own; the one-thread-per-output launch
    from numba_kernels import linear as lin
    for N, R in ((9, 1), (lin.GEMV_TINY_N, 1), (lin.GEMV_LARGE_N, 2), (lin.GEMV_LARGE_N, 4)):
        cfg = lin.gemv_pick(N, 64, R)
        X, W = r(R, 64), r(40, 64, scale=0.125)
        case("linear", f"gemv-{cfg.name()}", (X, W, np.zeros((R, 40), F32), R), [2], cuda_op="gemv", rows=R)
    case("linear", "gemm-R70-K40-N70", (r(70, 40), r(70, 40, scale=40 ** -0.5), np.zeros((70, 70), F32), 70), [2],
         cuda_op="gemm", rows=70)
    case("linear", "naive-R3-K33-N130", (r(4, 33), r(130, 33), np.full((4, 130), 7.0, F32), 3), [2],
         cuda_op="linear_naive", rows=3)
    # norms: column offsets, two-slice heads, rows and heads of more than one pass (a slice per
    # thread of the block and pass), a partial last slice
    case("rmsnorm", "R3-N70-oo70", (r(3, 70), r(70, scale=0.1), F32(1e-6), np.zeros((3, 140), F32), 70, 3), [3])
    case("rmsnorm", "R2-N64", (r(2, 64), r(64, scale=0.1), F32(1e-6), np.zeros((2, 64), F32), 0, 2), [3])
    case("rmsnorm", "R1-N32800", (r(1, 32800), r(32800, scale=0.1), 1e-6, np.zeros((1, 32800), F32), 0, 1), [3])
    bad = r(4, 70)
    bad[2, 69] = np.nan  # flagged; the same NaN in the row past R is not
    bad[3, 0] = np.inf
    case("add_rmsnorm", "R3-N70-oo70", (r(4, 70), bad, r(70, scale=0.1), F32(1e-6), np.zeros((4, 140), F32), 70, 3,
                                        np.zeros(2, np.int32), 1), [0, 4, 7])
    case("add_rmsnorm", "R1-N70-past-row-R", (r(4, 70), bad, r(70, scale=0.1), F32(1e-6), np.zeros((4, 70), F32), 0, 1,
                                              np.zeros(2, np.int32), 1), [0, 4, 7])
    case("add_rmsnorm", "R2-N2100", (r(2, 2100), r(2, 2100), r(2100, scale=0.1), 1e-6, np.zeros((2, 2100), F32), 0, 2,
                                     np.zeros(1, np.int32), -1), [0, 4, 7])
    case("add_rmsnorm", "R2-N96", (r(2, 96), r(2, 96), r(96, scale=0.1), 1e-6, np.zeros((2, 96), F32), 0, 2,
                                   np.zeros(1, np.int32), 0), [0, 4, 7])
    # the lm head's linear + NaN/Inf flag: each GEMV bucket, the GEMM side; a NaN row in and out of R
    for R in (1, 2, 5, 8, 9):
        A = r(R + 1, 40)
        A[R - 1 if R in (2, 9) else R, 7] = np.nan
        case("linear_flag", f"R{R}-K40-N70", (A, r(70, 40, scale=0.2), np.zeros((R + 1, 70), F32), R,
                                              np.zeros(2, np.int32), 1), [2, 4], rows=R)
    case("head_rmsnorm", "R2-H1-D1100", (r(2, 1100), 0, 1, 1100, r(1100, scale=0.1), F32(1e-6), np.zeros((2, 1100), F32),
                                         2), [6])
    case("head_rmsnorm", "R3-H2-D40-xo9", (r(3, 90), 9, 2, 40, r(40, scale=0.1), F32(1e-6), np.zeros((3, 80), F32), 3),
         [6])
    case("gated_rmsnorm", "R3-H2-D40-zo5", (r(3, 80), r(3, 85), 5, 2, 40, 1 + r(40, scale=0.1), F32(1e-6),
                                            np.zeros((3, 80), F32), 3), [7])
    # elementwise
    case("embed", "R3-V50-H8", (rng.integers(0, 50, 3).astype(np.int32), r(50, 8), np.zeros((3, 8), F32)), [2])
    case("add", "R3-N9", (r(4, 9), r(4, 9), np.zeros((4, 9), F32), 3), [2])
    case("swiglu_act", "R3-I7", (r(3, 14, scale=3.0), 7, np.zeros((3, 7), F32), 3), [2])
    case("sigmoid_gate", "R3-N6-go6", (r(3, 6), r(3, 13, scale=3.0), 6, np.zeros((3, 6), F32), 3), [3])
    for bad in (np.nan, -np.inf):
        X = r(3, 5)
        X[1, 3] = bad
        case("nonfinite_flag", f"R3-{bad}", (X, 3, np.zeros(2, np.int32), 1), [2])
    case("nonfinite_flag", "R1-inf-past-row-R", (X, 1, np.zeros(2, np.int32), 0), [2])
    # the DeltaNet: conv with and without captures, prep and the recurrence over two dot slices
    # (dk = 40) and two column groups (dv = 36), value heads sharing key heads
    for capture in (True, False):
        case("conv1d_silu", f"C20-K4-xo5-capture{int(capture)}",
             (r(3, 25), 5, r(20, 4, scale=0.5), r(3, 20), np.zeros((3, 20), F32), 3, np.zeros((3, 3, 20), F32),
              capture), [3, 4, 6])
        # past CONV_SEQ_MAX_ROWS: one thread per (row, channel), then the state (K 3 and 5)
        for K in (3, 5):
            case("conv1d_silu", f"C20-K{K}-R12-xo5-capture{int(capture)}",
                 (r(12, 25), 5, r(20, K, scale=0.5), r(K - 1, 20), np.zeros((12, 20), F32), 12,
                  np.zeros((12, K - 1, 20), F32), capture), [3, 4, 6])
    hk, nv, dk, dv = 2, 4, 40, 36
    case("gdn_prep", f"Hk{hk}-Hv{nv}-dk{dk}",
         (r(3, 2 * hk * dk + 8), hk * dk, hk, dk, r(3, 5 + 2 * nv), 5, nv, np.log(rng.uniform(1, 16, nv)).astype(F32),
          r(nv), F32(dk ** -0.5), np.zeros((3, hk * dk), F32), np.zeros((3, hk * dk), F32), np.zeros((3, nv), F32),
          np.zeros((3, nv), F32), 3), [10, 11, 12, 13])
    # (the fast recurrence's own variants: tests/test_sim_gdn.py)
    for ver, R in (("gdn_recurrence", 1), ("gdn_recurrence", 3), ("gdn_recurrence", 9), ("gdn_recurrence_fast", 3),
                   ("gdn_recurrence_naive", 3)):
        for capture in (True, False):
            args = (r(R, hk * dk, scale=0.15), r(R, hk * dk, scale=0.15), r(R, 3 + nv * dv), 3,
                    -np.abs(r(R, nv, scale=0.5)), rng.uniform(0, 1, (R, nv)).astype(F32), r(nv, dk, dv, scale=0.1),
                    np.zeros((R, nv * dv), F32), R, dk, dv, nv // hk, np.zeros((R, nv, dk, dv), F32), capture)
            case("gdn_recurrence", f"{ver}-R{R}-dk{dk}-dv{dv}-vpk2-capture{int(capture)}", args, [6, 7, 12],
                 cuda_op=ver, rows=R)
    # rope and the K/V write at position 70, also with the position on the device
    ang = np.outer(np.arange(80), 10000.0 ** (-np.arange(2) / 2.0))
    cos, sin = np.cos(ang).astype(F32), np.sin(ang).astype(F32)
    case("copy_i32", "n5-of-7", (np.arange(7, dtype=np.int32) - 3, np.full(7, 9, np.int32), 5), [1])
    # the greedy pick (numpy.argmax): one block and several, equal maxima in different blocks,
    # NaNs, signed zeros, all -inf, +inf everywhere but the first values
    picks = {"V7": r(1, 7), "V4100": r(1, 4100), "V2049-ties": r(1, 2049)}
    picks["V2049-ties"][0, [5, 2048]] = 9.0
    picks["V4100-nan"] = r(1, 4100)
    picks["V4100-nan"][0, [2500, 4000]] = np.nan
    picks["V4100-zeros"] = np.zeros((1, 4100), F32)
    picks["V4100-zeros"][0, [0, 3000]] = -0.0
    picks["V4100-neg-inf"] = np.full((1, 4100), -np.inf, F32)
    picks["V4100-inf"] = np.full((1, 4100), np.inf, F32)
    picks["V4100-inf"][0, :5] = 1.0
    for cid, lg in picks.items():
        case("greedy_pick", cid, (lg, np.array([70, 3], np.int32), np.full(2, -1, np.int32), 1), [1, 2])
    for pos in (False, True):
        case("rope", "R2-H3-D8-p70", (r(2, 3 * 8), 3, 8, 2, cos, sin, 70, 2), [0], pos=pos)
        case("kv_write", "R2-p70", (r(2, 20), 3, r(2, 30), 11, np.zeros((75, 8), F32), np.zeros((75, 8), F32), 70, 2),
             [4, 5], pos=pos)
        # q/k norms + RoPE + K/V write: odd heads, a head dim over two passes of the block's slices
        # (D 1100 > 32 threads × 32), a partial rotary dim; cache rows around the written ones kept
        for R, hq, hkv, D, half in ((2, 3, 1, 8, 2), (1, 1, 1, 1100, 2), (3, 5, 2, 36, 1)):
            case("qk_norm_rope", f"R{R}-Hq{hq}-Hkv{hkv}-D{D}-p70",
                 (r(R, 2 * (hq + hkv) * D), hq, hkv, D, r(D, scale=0.1), r(D, scale=0.1), F32(1e-6), half, cos, sin, 70,
                  np.zeros((R, hq * D), F32), r(75, hkv * D), r(75, hkv * D), R), [11, 12, 13], pos=pos)
    # attention through the dispatch table -- a context of one key; one row over three tiles, the
    # last partial; rows starting mid-tile on both sides of the split-KV threshold -- and every
    # version on its own, with the position as a scalar and on the device. Keys past the last
    # row's position are NaN: reading one would show.
    def attn(R, start, hq=4, hkv=2, D=8, spare=70):
        ctx = start + R
        kc_, vc_ = r(ctx + spare, hkv * D, scale=2.0), r(ctx + spare, hkv * D)
        kc_[ctx:] = np.nan
        vc_[ctx:] = np.nan
        return (r(R, hq * D, scale=2.0), kc_, vc_, np.zeros((R, hq * D), F32), start, R, hq, hkv, D, F32(D ** -0.5))

    split = dispatch.SPLIT_MAX_ROWS
    # a context of one key; one row over three tiles, the last partial; query tiles that start
    # mid-tile on both sides of the split-KV threshold and of the 64-row query tile; odd heads
    for R, start in ((1, 0), (1, 130), (4, 61), (5, 3), (8, 100), (9, 0), (split, 61), (split + 1, 61), (65, 10)):
        case("attention", f"R{R}-p{start}-Hq4-Hkv2-D8", attn(R, start), [3], rows=R)
    case("attention", "R2-p60-Hq2-Hkv1-D40", attn(2, 60, 2, 1, 40), [3], rows=2)
    case("attention", "R3-p20-Hq3-Hkv1-D9", attn(3, 20, 3, 1, 9), [3], rows=3)
    case("attention", "R20-p50-Hq3-Hkv1-D9", attn(20, 50, 3, 1, 9), [3], rows=20)
    for ver in ("attention_split", "attention_prime", "attention_tiled"):
        for pos in (False, True):
            case("attention", f"{ver}-R3-p126", attn(3, 126), [3], cuda_op=ver, rows=3, pos=pos)
    # MoE: a tie in the router (lowest index first), with and without renormalisation and the
    # shared expert
    L = r(3, 8)
    L[0, 2] = L[0, 6] = L[0].max() + 1
    for renorm in (True, False):
        case("moe_route", f"tie-renorm{int(renorm)}", (L, 2, renorm, np.zeros((3, 8), F32), np.zeros((3, 2), np.int32),
                                                       np.zeros((3, 2), F32), 3), [3, 4, 5])
    idx = np.array([[1, 5], [7, 0], [3, 2]], np.int32)
    case("moe_up", "R3-k2-I6-H40", (r(3, 40), r(8 * 6, 40), r(8 * 6, 40), idx, 6, np.zeros((6, 6), F32), 3), [5])
    case("moe_down", "R3-k2-I40-H8", (r(6, 40), r(8 * 8, 40), idx, 8, np.zeros((6, 8), F32), 3), [4])
    # bf16 expert and embedding weights (uint16 bit patterns, widened exactly)
    def b16(*shape):
        return (r(*shape, scale=0.2).view(np.uint32) >> 16).astype(np.uint16)
    case("moe_up", "bf16-R3-k2-I6-H40", (r(3, 40), b16(8 * 6, 40), b16(8 * 6, 40), idx, 6, np.zeros((6, 6), F32), 3),
         [5])
    case("moe_down", "bf16-R3-k2-I40-H8", (r(6, 40), b16(8 * 8, 40), idx, 8, np.zeros((6, 8), F32), 3), [4])
    case("embed", "bf16-R3-V50-H8", (rng.integers(0, 50, 3).astype(np.int32), b16(50, 8), np.zeros((3, 8), F32)), [2])
    mma_cases(attn)
    for shared in (True, False):
        case("moe_combine", f"shared{int(shared)}", (r(6, 8), rng.uniform(0, 1, (3, 2)).astype(F32), r(3, 8), r(3, 1),
                                                     shared, np.zeros((3, 8), F32), 3), [5])
    # trace ops (integers only): row hashes over a column window of two buffer rows per traced
    # row, and chained onto earlier hashes; the fault hook's one flipped bit
    H = rng.integers(0, 2 ** 63, (5, 3), dtype=np.uint64)
    case("row_hash", "R4-m2-x1-c3:10", (r(10, 11).view(np.uint32), 1, 2, 3, 10, H, 1, False, 4), [5])
    case("row_hash", "R4-chain", (r(4, 6).view(np.uint32), 0, 1, 0, 6, H, 2, True, 4), [5])
    # wide traced rows: a 285-column window of three buffer rows each
    case("row_hash", "R3-m3-x1-c5:290", (r(10, 300).view(np.uint32), 1, 3, 5, 290, H, 0, False, 3), [5])
    case("flip_low_bit", "i5-c7", (r(9, 11).view(np.uint32), 5, 7), [0])


def mma_cases(attn):
    """exact-bf16 (issue #19): under the simulator every MMA op runs its naive kernel (the twin's
    per-output emulation; inline PTX cannot run here), so these check the kernels' indexing and
    data movement bitwise; the tensor-core kernel is harness device-check's on a GPU."""
    def bf(a):
        return ((a.view(np.uint32).astype(np.uint64) + 0x8000) >> 16 << 16).astype(np.uint32).view(F32)

    for R in (1, 5, 17):
        X = r(R, 40)
        X[0, 3] = np.inf if R == 5 else X[0, 3]
        case("linear_mma", f"R{R}-K40-N9", (X, bf(r(9, 40, scale=0.2)), np.zeros((R, 9), F32), R), [2], rows=R)
    case("linear_mma", "naive-R3-K21-N5", (r(3, 21), bf(r(5, 21)), np.zeros((3, 5), F32), 3), [2],
         cuda_op="linear_mma_naive", rows=3)
    for R, start in ((1, 70), (3, 60)):
        case("attention_mma", f"R{R}-p{start}-Hq3-Hkv1-D24", attn(R, start, 3, 1, 24, 4), [3], rows=R)
    case("attention_mma", "naive-R2-p10", attn(2, 10, 2, 1, 16, 4), [3], cuda_op="attention_mma_naive", rows=2)
    # past the split-KV threshold (one block per (row, head)), each version on its own, and the
    # captured step's device-side position (split over the cache's capacity: tiles past it exit)
    split = dispatch.SPLIT_MAX_ROWS
    case("attention_mma", f"R{split + 1}-p50-Hq2-Hkv1-D16", attn(split + 1, 50, 2, 1, 16, 4), [3], rows=split + 1)
    case("attention_mma", "tiled-R2-p70-Hq3-Hkv1-D24", attn(2, 70, 3, 1, 24, 4), [3], cuda_op="attention_mma_tiled",
         rows=2)
    case("attention_mma", "split-R2-p70-Hq3-Hkv1-D24", attn(2, 70, 3, 1, 24, 4), [3], cuda_op="attention_mma_split",
         rows=2)
    case("attention_mma", "R1-p130-Hq3-Hkv1-D24@pos", attn(1, 130, 3, 1, 24, 70), [3], rows=1, pos=True)
    idx = np.array([[1, 5], [7, 0], [3, 2]], np.int32)
    case("moe_up_mma", "R3-k2-I6-H40", (r(3, 40), bf(r(8 * 6, 40)), bf(r(8 * 6, 40)), idx, 6, np.zeros((6, 6), F32), 3),
         [5])
    case("moe_down_mma", "R3-k2-I40-H8", (r(6, 40), bf(r(8 * 8, 40)), idx, 8, np.zeros((6, 8), F32), 3), [4])

    # exact-bf16's packed GEMM inputs (xp=): each producer writes its outputs' bf16 pairs beside
    # them (NaN and ±inf outputs included: a NaN's half is the quiet NaN with its sign), and
    # linear_mma reads X's bf16 values from them (here the naive kernel: unpacked first)
    bad = r(4, 70)
    bad[1, 4], bad[2, 9] = np.nan, np.inf
    U = np.zeros
    case("rmsnorm", "R3-N70-oo70-xp", (bad, r(70, scale=0.1), F32(1e-6), U((3, 140), F32), 70, 3, U((4, 70), np.uint32)),
         [3, 6])
    case("add_rmsnorm", "R3-N70-xp", (r(4, 70), bad, r(70, scale=0.1), F32(1e-6), U((4, 70), F32), 0, 3,
                                      U(2, np.int32), 1, U((3, 35), np.uint32)), [0, 4, 7, 9])
    G = r(3, 80)
    G[2, 41] = np.nan  # head 1 of row 2: every output NaN
    case("gated_rmsnorm", "R3-H2-D40-xp", (G, r(3, 85), 5, 2, 40, 1 + r(40, scale=0.1), F32(1e-6), U((3, 80), F32), 3,
                                           U((3, 40), np.uint32)), [7, 9])
    GU = r(3, 16, scale=3.0)
    GU[0, 3], GU[2, 12] = np.nan, -np.inf
    case("swiglu_act", "R3-I8-xp", (GU, 8, U((3, 8), F32), 3, U((3, 4), np.uint32)), [2, 4])
    case("sigmoid_gate", "R3-N6-go6-xp", (np.ascontiguousarray(bad[:3, :6]), r(3, 13, scale=3.0), 6, U((3, 6), F32), 3, U((3, 3), np.uint32)),
         [3, 5])
    X = r(3, 40)
    X[1, 3] = np.inf
    Xb = (bf(X).view(np.uint32) >> 16).astype(np.uint32)  # not X's own rounding: both sides read xp, not X
    XP = Xb[:, 0::2] | (Xb[:, 1::2] << 16)
    case("linear_mma", "R3-K40-N9-xp", (X, bf(r(9, 40, scale=0.2)), U((3, 9), F32), 3, XP), [2], rows=3)
    case("linear_mma", "bf16-R3-K40-N9-xp", (X, w16(9, 40, scale=0.2), U((3, 9), F32), 3, XP), [2], rows=3)
    # the lm head in exact-bf16 (linear_flag_mma): the flag on a NaN/∞ row, none on a finite run
    case("linear_flag_mma", "bf16-R3-K40-N9-xp", (X, w16(9, 40, scale=0.2), U((3, 9), F32), 3, U(2, np.int32), 1, XP),
         [2, 4], rows=3)
    case("linear_flag_mma", "R2-K40-N9-finite", (r(2, 40), bf(r(9, 40, scale=0.2)), U((2, 9), F32), 2, U(2, np.int32), 0),
         [2, 4], rows=2)
    # an MLP's input in exact-bf16 (linear_swiglu_mma): the gate‖up projection and its SwiGLU, pairs packed
    case("linear_swiglu_mma", "bf16-R3-K40-I6-xp", (X, w16(12, 40, scale=0.5), 6, U((3, 6), F32), 3, U((3, 12), F32), XP,
                                                    U((3, 3), np.uint32)), [3, 7], rows=3)

    # bf16 bits (uint16, w16): the weights an exact-bf16 engine keeps resident on CUDA
    case("linear_mma", "bf16-R5-K40-N9", (r(5, 40), w16(9, 40, scale=0.2), np.zeros((5, 9), F32), 5), [2], rows=5)
    case("moe_up_mma", "bf16-R3-k2-I6-H40",
         (r(3, 40), w16(8 * 6, 40), w16(8 * 6, 40), idx, 6, np.zeros((6, 6), F32), 3), [5])
    case("moe_down_mma", "bf16-R3-k2-I40-H8", (r(6, 40), w16(8 * 8, 40), idx, 8, np.zeros((6, 8), F32), 3), [4])


# ------------------------------------------------------------------------------------------------
# a small model on the engine
# ------------------------------------------------------------------------------------------------
SIM_MODEL = dict(
    vocab_size=20, hidden_size=36, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    linear_conv_kernel_dim=4, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    rms_norm_eps=1e-6, intermediate_size=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=4,
    shared_expert_intermediate_size=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
    tie_word_embeddings=False, num_nextn_predict_layers=1,
)


def model_steps():
    """The CPU engine and the CUDA engine (simulated) run the same steps; after each, the logits
    and the cache digests are compared. Hidden size 36: every linear layer's dot has two slices,
    the second ragged. The CUDA session starts from the CPU-primed cache of 50
    rows (a restore across backends), then primes 17 rows on CUDA (rows 50..66 cross the 64-key
    tile), verifies 5 and 8 rows with rollback (the GEMV's largest row bucket), decodes 3 rows
    (eager, captured, replayed), primes 9 rows (the GEMM just past the GEMV), and two captured MTP
    rows."""
    from harness.engine.config import ModelConfig
    from harness.engine.model import Engine
    from harness.synth import random_tensors
    from harness.engine.weights import Checkpoint

    cfg = ModelConfig.from_dict(SIM_MODEL, "simulator model")
    ck = Checkpoint(cfg, random_tensors(cfg, seed=3))
    ec, eg = Engine(ck, "cpu"), Engine(ck, "cuda")
    assert eg.B.name == "cuda" and eg.graphs
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, 100)
    sc, sg = ec.new_session(96), eg.new_session(96)
    ec.prime_chunk(sc, ids[:50])
    sg.cache.restore(sc.cache.snapshot())
    steps = [dict(step="restore p50", rows=None, kernels=[], logits_bitwise=None,  # no logits: digests only
                  digest_equal=sc.cache.digest() == sg.cache.digest())]

    def step(name, rows, f):
        steps.append(model_step(name, rows, f, ec, sc, eg, sg))

    def rollback(keep):
        ec.rollback(sc, keep)
        eg.rollback(sg, keep)
        steps.append(dict(step=f"rollback to {keep}", rows=None, kernels=[], logits_bitwise=None,
                          digest_equal=sc.cache.digest() == sg.cache.digest()))

    step("prime p50 R17", 17, lambda e, s: e.prime_chunk(s, ids[50:67]))
    step("verify p67 R5", 5, lambda e, s: e.target_step(s, ids[67:72], capture=True))
    rollback(3)
    step("verify p70 R8", 8, lambda e, s: e.target_step(s, ids[70:78], capture=True))
    rollback(2)
    for i in range(3):
        step(f"decode p{72 + i} ({['eager', 'captured', 'replayed'][i]})", 1,
             lambda e, s: e.decode_step(s, int(ids[72 + i])))
    step("prime p75 R9", 9, lambda e, s: e.prime_chunk(s, ids[75:84]))
    for i in range(2):
        h = r(1, cfg.hidden_size)
        step(f"MTP row p{i}", 1, lambda e, s: e.mtp_rows(s, [int(ids[80 + i])], h if e is ec else e.B.upload(h), i,
                                                          logits_rows=1))
    # a session reset for reuse (the scheduler's session pool): its digest is a new cache's, and
    # the steps captured on its cache replay for the next session
    from harness.walk.scheduler import reset_session, zero_snapshot

    fresh = ec.new_session(96).cache.digest()
    reset_session(sc, zero_snapshot(ec), 7)
    reset_session(sg, zero_snapshot(eg), 7)
    steps.append(dict(step="reset", rows=None, kernels=[], logits_bitwise=None,
                      digest_equal=sc.cache.digest() == sg.cache.digest() == fresh))
    step("prime p0 R12 after reset", 12, lambda e, s: e.prime_chunk(s, ids[:12]))
    for i in range(2):
        step(f"decode p{12 + i} after reset (replayed)", 1, lambda e, s: e.decode_step(s, int(ids[12 + i])))
    step("verify p14 R5 after reset", 5, lambda e, s: e.target_step(s, ids[14:19], capture=True))
    rollback(2)
    # chained greedy steps (Engine.decode_greedy): each slot run eagerly, captured, replayed; the
    # logits of every step compared, the device's picks checked against numpy's argmax of them
    last = {}

    def greedy(e, s, n):
        picks, L = e.decode_greedy(s, last.get(id(e), int(ids[16])), n, keep_logits=True)
        assert picks == [int(np.argmax(x)) for x in L], picks
        last[id(e)] = picks[-1]
        return (L,)

    step("greedy p16 n5 (eager, captured)", 1, lambda e, s: greedy(e, s, 5))
    step("greedy p21 n4 (replayed)", 1, lambda e, s: greedy(e, s, 4))
    # chained MTP drafts (Engine.mtp_draft): a two-row first pass and two chained passes, each
    # run eagerly, captured, replayed; then again drafting among a draft vocabulary (every
    # third id: a pick is an index into it, and the passes after the first embed from its rows)
    hs = r(2, cfg.hidden_size)

    def drafts(e, s):
        s.cache.mtp_len = s.cache.pos - 1
        return (np.array(e.mtp_draft(s, [int(t) for t in ids[40:42]], hs if e is ec else e.B.upload(hs), 3)),)

    for vocab in (None, list(range(1, cfg.vocab_size, 3))):
        ec.set_draft_vocab(vocab)
        eg.set_draft_vocab(vocab)
        for i in range(3):
            step(f"draft K3 {'draft vocabulary' if vocab else 'vocabulary'} ({['eager', 'captured', 'replayed'][i]})",
                 2, drafts)
    return steps


def bf16_model_steps():
    """The simulator model with bf16-exact weights: the CUDA engine keeping them bf16
    (``weights="bf16"``: the weight ops on uint16 bits) against the CPU engine on the widened float32
    weights, logits and cache digests after each step (prime 17 rows: the widened GEMM; verify 5;
    decode eager, captured, replayed: the bf16 GEMV; an MTP row)."""
    from harness.engine import bf16
    from harness.engine.config import ModelConfig
    from harness.engine.model import Engine
    from harness.engine.weights import Checkpoint
    from harness.synth import random_tensors

    cfg = ModelConfig.from_dict(SIM_MODEL, "simulator model")
    t = random_tensors(cfg, seed=4)
    t.update({k: bf16.widen(bf16.narrow(t[k])) for k in bf16.matrix_names(t)})  # truncated: bf16 values
    ck = Checkpoint(cfg, t)
    ec, eg = Engine(ck, "cpu", weights="f32"), Engine(ck, "cuda", weights="bf16")
    assert eg.weights == "bf16" and eg.lm_head.dtype == np.uint16
    ids = np.random.default_rng(2).integers(0, cfg.vocab_size, 40)
    sc, sg = ec.new_session(40), eg.new_session(40)
    steps = []

    def step(name, rows, f):
        steps.append(model_step("bf16 " + name, rows, f, ec, sc, eg, sg))

    step("prime R17", 17, lambda e, s: e.target_step(s, ids[:17]))
    step("verify p17 R5", 5, lambda e, s: e.target_step(s, ids[17:22], capture=True))
    for i in range(3):
        step(f"decode p{22 + i} ({['eager', 'captured', 'replayed'][i]})", 1,
             lambda e, s: e.decode_step(s, int(ids[22 + i])))
    h = r(1, cfg.hidden_size)
    step("MTP row p0", 1, lambda e, s: e.mtp_rows(s, [int(ids[30])], h if e is ec else e.B.upload(h), 0,
                                                   logits_rows=1))
    return steps


def front_doors():
    """{op: [cpu signature, cuda signature]} as the front doors export them."""
    def sig(f):
        return str(inspect.signature(getattr(f, "py_func", f)))
    names = sorted(set(kp.OPS) | set(kc.OPS))
    return {n: [sig(kp.OPS[n]) if n in kp.OPS else None, sig(kc.OPS[n]) if n in kc.OPS else None] for n in names}


if __name__ == "__main__":  # (tools/check_compile.py imports this module for its op cases)
    # ``cudasim_run.py [ops|model|all]``: the op cases, the model steps or both (tests/test_cudasim.py
    # runs the two parts as two processes at once: each is one core's work)
    part = sys.argv[1] if len(sys.argv) > 1 else "all"
    if part not in ("ops", "model", "all"):
        sys.exit(f"usage: cudasim_run.py [ops|model|all], not {part!r}")
    t0 = time.perf_counter()
    prims = primitives() if part != "model" else {}
    if part != "model":
        op_cases()
    t1 = time.perf_counter()
    model = model_steps() + bf16_model_steps() if part != "ops" else []
    t2 = time.perf_counter()
    print("RESULT " + json.dumps(dict(part=part, primitives=prims, ops=CASES, model=model, front_doors=front_doors(),
                                      versions=kc.VERSIONS, ops_s=round(t1 - t0, 1), model_s=round(t2 - t1, 1))))
