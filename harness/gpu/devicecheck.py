"""``harness device-check``: every kernel on CUDA against its CPU twin, bit for bit.

1. Each op runs on random inputs of several shapes — Qwen3-Next sizes included (hidden 2048,
   16 key / 32 value heads × 128, attention 16 heads / 2 KV heads × 256, 512 experts top-10) —
   once on the CPU twin and once on CUDA; outputs (and updated state) are compared bitwise, with
   the max ulp distance reported where they differ.
2. The tiny model, a larger random config and the Qwen3.5-layout bf16 ``tiny-q35`` run
   tokenwise, batched and split primes on both backends; last-row logits, per-row logits and
   cache digests are compared across backends and across schedules. ``tiny-q35`` runs with its
   weights bf16-resident on CUDA (the default for a bf16 checkpoint) and again widened to float32
   (``*-f32-weights``): both must be the CPU twin's bits. Each also decodes greedily after the
   prompt (``greedy``: ``Engine.decode_greedy``'s chained steps, captured and, ``greedy-uncaptured``,
   not), compared with the CPU twin's and with the ``decode_step`` calls it stands for.

The receipt (device, driver, commit, per-op and per-schedule verdicts) is written atomically.
"""

from __future__ import annotations

import datetime as _dt
import json
import time

import numpy as np

from ..atomic import write_text_atomic
from ..engine.digests import canonical_f32, continuation_digest, logits_digest
from ..engine.modes import round_bf16
from ..errors import InputError
from ..matrix.runner import ulp_distance
from .evidence import REPO, evidence_block

F32 = np.float32


def _r(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(F32)


def _w16(rng, *shape, scale=1.0):
    """Random bf16 weights as their bits (uint16)."""
    return (_r(rng, *shape, scale=scale).view(np.uint32) >> 16).astype(np.uint16)


def op_cases(rng, full: bool = True):
    """(op, case id, args builder -> tuple of numpy args, indices of outputs to compare)."""
    cases = []

    def add(op, cid, args, outs):
        cases.append((op, cid, args, outs))

    for n in ([1 << 20] if full else [4096]):
        x = np.concatenate([_r(rng, n - 8, scale=30.0), np.array([0, -0.0, 88.7, -103.9, 20, -20, 1e-8, -1e-8], F32)])
        for op in ("map_exp", "map_sigmoid", "map_silu", "map_softplus"):
            add(op, f"n{n}", (x, np.zeros_like(x)), [1])
    lin = [(1, 2048, 8192 + 256), (4, 5632, 2048), (2, 1100, 77), (7, 2048, 2048), (64, 2048, 5632), (3, 64, 260),
           (130, 97, 33)]
    for R, K, N in (lin if full else lin[5:]):
        add("linear", f"R{R}-K{K}-N{N}", (_r(rng, R, K), _r(rng, N, K, scale=K ** -0.5), np.zeros((R, N), F32), R), [2])
    # every side of the dispatch table (numba_kernels.dispatch: GEMV row buckets up to 8, the GEMM
    # above and its 64-row tiles), K % 4 != 0 (scalar loads), bf16 weights (uint16 bit patterns),
    # the GEMV shape classes of gemv_pick (tiny / small / large / huge N; float32 and bf16 weights), NaN and ±inf inputs
    for R in (1, 4, 5, 8, 9, 16, 17, 63, 64, 65) + ((3000,) if full else ()):
        K, N = (1100, 300) if R % 2 else (1024, 257)
        add("linear", f"R{R}-K{K}-N{N}", (_r(rng, R, K), _r(rng, N, K, scale=K ** -0.5), np.zeros((R, N), F32), R), [2])
        W16 = _w16(rng, N, K, scale=K ** -0.5)
        add("linear", f"bf16-R{R}-K{K}-N{N}", (_r(rng, R, K), W16, np.zeros((R, N), F32), R), [2])
    for N in ((500, 1024, 8192, 40000) if full else (500, 1024)):
        for R in (1, 2, 4, 5, 8):
            add("linear", f"class-R{R}-K2048-N{N}",
                (_r(rng, R, 2048), _r(rng, N, 2048, scale=2048 ** -0.5), np.zeros((R, N), F32), R), [2])
            add("linear", f"class-bf16-R{R}-K2048-N{N}",
                (_r(rng, R, 2048), _w16(rng, N, 2048, scale=2048 ** -0.5), np.zeros((R, N), F32), R), [2])
    for R in (1, 8, 9):
        X = _r(rng, R, 96)
        X[0, 3], X[R - 1, 50] = np.nan, np.inf
        W = _r(rng, 70, 96)
        W[5, 7] = -np.inf
        add("linear", f"nonfinite-R{R}-K96-N70", (X, W, np.zeros((R, 70), F32), R), [2])
    ids = rng.integers(0, 260, 9).astype(np.int32)
    add("embed", "R9-V260-H64", (ids, _r(rng, 260, 64), np.zeros((9, 64), F32)), [2])
    add("embed", "bf16-R9-V260-H64", (ids, _w16(rng, 260, 64),
                                      np.zeros((9, 64), F32)), [2])
    # 2048: one pass of 64 slices; 5000: a ragged last slice; 17000: two passes (512 slices, then 20); 20: one ragged slice
    for R, N in ([(5, 2048), (64, 64), (1, 5000), (1, 17000), (3, 20)] if full else [(64, 64)]):
        add("rmsnorm", f"R{R}-N{N}", (_r(rng, R, N), _r(rng, N, scale=0.1), F32(1e-6), np.zeros((R, 2 * N), F32), N, R), [3])
        add("add", f"R{R}-N{N}", (_r(rng, R, N), _r(rng, R, N), np.zeros((R, N), F32), R), [2])
        D = _r(rng, R, N)
        D[R - 1, N // 2] = np.inf  # a non-finite sum: the same bits as add then rmsnorm (NaN compared canonical)
        add("add_rmsnorm", f"R{R}-N{N}", (_r(rng, R, N), D, _r(rng, N, scale=0.1), F32(1e-6), np.zeros((R, 2 * N), F32),
                                          N, R, np.zeros(3, np.int32), 1), [0, 4, 7])
        add("add_rmsnorm", f"R{R}-N{N}-finite", (_r(rng, R, N), _r(rng, R, N), _r(rng, N, scale=0.1), F32(1e-6),
                                                 np.zeros((R, N), F32), 0, R, np.zeros(2, np.int32), 0), [0, 4, 7])
    packed_cases(rng, full, add)
    # the lm head's linear + NaN/Inf flag (the GEMV checks each output it stores): the bench's
    # vocabulary at 1 and 5 rows, every bucket at an odd width, the GEMM side; a NaN input row
    W_head = _r(rng, 151936, 2048, scale=2048 ** -0.5) if full else None  # 1.2 GB: one for both rows
    for R, K, N in ([(1, 2048, 151936), (5, 2048, 151936)] if full else []) + [(R, 37, 70) for R in (1, 2, 4, 5, 8, 9)]:
        A = _r(rng, R, K)
        if K == 37 and R in (2, 9):
            A[R - 1, 3] = np.nan
        W = W_head if N == 151936 else _r(rng, N, K, scale=K ** -0.5)
        add("linear_flag", f"R{R}-K{K}-N{N}", (A, W, np.zeros((R, N), F32), R, np.zeros(2, np.int32), 1), [2, 4])
    for R, H, D in ([(3, 32, 128), (20, 4, 16), (2, 3, 1100)] if full else [(20, 4, 16)]):
        add("gated_rmsnorm", f"R{R}-H{H}-D{D}",
            (_r(rng, R, H * D), _r(rng, R, 3 * H * D), 2 * H * D, H, D, _r(rng, D), F32(1e-6), np.zeros((R, H * D), F32), R), [7])
    for R, H, D in ([(5, 16, 256), (7, 4, 16), (2, 3, 1100)] if full else [(7, 4, 16)]):
        add("head_rmsnorm", f"R{R}-H{H}-D{D}",
            (_r(rng, R, 3 * H * D), H * D, H, D, _r(rng, D, scale=0.1), F32(1e-6), np.zeros((R, H * D), F32), R), [6])
        half = D // 8
        n = 1200
        ang = np.outer(np.arange(n), 10000.0 ** (-np.arange(half) * 2.0 / (2 * half)))
        for start in (0, 1000):
            add("rope", f"R{R}-H{H}-D{D}-p{start}",
                (_r(rng, R, H * D), H, D, half, np.cos(ang).astype(F32), np.sin(ang).astype(F32), start, R), [0])
        for hq, hkv in ((H, max(1, H // 4)), (H + 1, 1)):
            add("qk_norm_rope", f"R{R}-Hq{hq}-Hkv{hkv}-D{D}-p1000",
                (_r(rng, R, 2 * (hq + hkv) * D), hq, hkv, D, _r(rng, D, scale=0.1), _r(rng, D, scale=0.1), F32(1e-6), half,
                 np.cos(ang).astype(F32), np.sin(ang).astype(F32), 1000, np.zeros((R, hq * D), F32),
                 _r(rng, 1000 + R + 3, hkv * D), _r(rng, 1000 + R + 3, hkv * D), R), [11, 12, 13])
        add("sigmoid_gate", f"R{R}-N{H * D}", (_r(rng, R, H * D), _r(rng, R, 2 * H * D), H * D, np.zeros((R, H * D), F32), R), [3])
        add("swiglu_act", f"R{R}-I{H * D}", (_r(rng, R, 2 * H * D), H * D, np.zeros((R, H * D), F32), R), [2])
    # one thread per channel up to CONV_SEQ_MAX_ROWS (8) rows (R 2 < K − 1 = 4 at K 5: fewer rows
    # than the window), one per (row, channel) past it (K 2 to 5)
    conv = [(8192, 4, 1), (8192, 4, 65), (96, 3, 7), (8192, 4, 9), (100, 5, 300), (96, 2, 20), (40, 5, 2), (40, 5, 10)]
    for C, K, R in (conv if full else [(96, 3, 7), (40, 4, 2), (40, 3, 12)]):
        add("conv1d_silu", f"C{C}-K{K}-R{R}",
            (_r(rng, R, C + 5), 5, _r(rng, C, K, scale=0.5), _r(rng, K - 1, C), np.zeros((R, C), F32), R,
             np.zeros((R, K - 1, C), F32), True), [3, 4, 6])
    gd = [(16, 32, 128, 128, 1), (16, 32, 128, 128, 70), (16, 32, 128, 128, 4), (16, 32, 128, 128, 8),
          (16, 32, 128, 128, 9), (16, 32, 128, 128, 2500), (3, 9, 100, 24, 2), (3, 6, 16, 24, 9)]
    for hk, nv, dk, dv, R in (gd if full else gd[-1:]):
        kd = hk * dk
        add("gdn_prep", f"Hk{hk}-Hv{nv}-dk{dk}-R{R}",
            (_r(rng, R, 2 * kd + nv * dv), kd, hk, dk, _r(rng, R, 7 + 2 * nv), 7, nv,
             np.log(rng.uniform(1, 16, nv)).astype(F32), _r(rng, nv), F32(dk ** -0.5), np.zeros((R, kd), F32),
             np.zeros((R, kd), F32), np.zeros((R, nv), F32), np.zeros((R, nv), F32), R), [10, 11, 12, 13])
        q = _r(rng, R, kd, scale=dk ** -0.5)
        k = _r(rng, R, kd, scale=dk ** -0.5)
        add("gdn_recurrence", f"Hk{hk}-Hv{nv}-dk{dk}-dv{dv}-R{R}",
            (q, k, _r(rng, R, 7 + nv * dv), 7, -np.abs(_r(rng, R, nv, scale=0.5)), rng.uniform(0, 1, (R, nv)).astype(F32),
             _r(rng, nv, dk, dv, scale=0.1), np.zeros((R, nv * dv), F32), R, dk, dv, nv // hk,
             np.zeros((R, nv, dk, dv), F32), True), [6, 7, 12])
    def attention_and_kv_write(hq, hkv, D, start, R, spare, tag="", cap=""):
        """Attention over a cache of start + R + ``spare`` rows and a K/V write at ``start``."""
        ctx = start + R
        add("attention" + tag, f"Hq{hq}-Hkv{hkv}-D{D}-p{start}-R{R}{cap}",
            (_r(rng, R, hq * D), _r(rng, ctx + spare, hkv * D), _r(rng, ctx + spare, hkv * D),
             np.zeros((R, hq * D), F32), start, R, hq, hkv, D, F32(D ** -0.5)), [3])
        add("kv_write" + tag, f"Hkv{hkv}-D{D}-p{start}-R{R}",
            (_r(rng, R, 2 * hkv * D), hkv * D, _r(rng, R, hkv * D), 0, np.zeros((ctx, hkv * D), F32),
             np.zeros((ctx, hkv * D), F32), start, R), [4, 5])

    att = [(16, 2, 256, 0, 70), (16, 2, 256, 500, 1), (16, 2, 256, 130, 5), (3, 1, 16, 60, 9)]
    for hq, hkv, D, start, R in (att if full else att[3:]):
        attention_and_kv_write(hq, hkv, D, start, R, 3)
    # the attention dispatch (split-KV up to SPLIT_MAX_ROWS rows, query tiles above): a context of
    # one key, one tile, several tiles with a partial last one; query tiles starting mid-tile;
    # odd head counts and head dims; a few thousand rows
    thr = [(1, 0), (1, 63), (4, 61), (5, 100), (8, 0), (9, 200), (16, 61), (17, 61), (63, 1), (64, 64), (65, 10),
           (2500, 37)]
    for R, start in (thr if full else thr[:8]):
        attention_and_kv_write(16, 2, 128 if full else 16, start, R, 3, cap="-thr")
    for hq, hkv, D, start, R in ([(6, 2, 36, 30, 3), (6, 2, 36, 30, 40), (3, 3, 9, 100, 2), (3, 1, 9, 5, 70)]
                                if full else [(3, 1, 9, 5, 20)]):
        attention_and_kv_write(hq, hkv, D, start, R, 3, cap="-odd")
    moe = [(4, 512, 10, 512, 2048, True), (6, 8, 2, 24, 64, False)]
    for R, E, k, I, H, renorm in (moe if full else moe[1:]):
        logits = _r(rng, R, E)
        logits[0, 1] = logits[0, 3] = logits[0].max() + 1  # a tie: lowest index wins
        add("moe_route", f"R{R}-E{E}-k{k}-renorm{int(renorm)}",
            (logits, k, renorm, np.zeros((R, E), F32), np.zeros((R, k), np.int32), np.zeros((R, k), F32), R), [3, 4, 5])
        idx = np.stack([rng.choice(E, k, replace=False) for _ in range(R)]).astype(np.int32)
        add("moe_up", f"R{R}-E{E}-k{k}-I{I}-H{H}",
            (_r(rng, R, H), _r(rng, E * I, H, scale=H ** -0.5), _r(rng, E * I, H, scale=H ** -0.5), idx, I,
             np.zeros((R * k, I), F32), R), [5])
        add("moe_down", f"R{R}-E{E}-k{k}-I{I}-H{H}",
            (_r(rng, R * k, I), _r(rng, E * H, I, scale=I ** -0.5), idx, H, np.zeros((R * k, H), F32), R), [4])
        b16 = _w16(rng, E * I, H, scale=H ** -0.5)
        add("moe_up", f"bf16-R{R}-E{E}-k{k}-I{I}-H{H}", (_r(rng, R, H), b16, b16, idx, I, np.zeros((R * k, I), F32), R),
            [5])
        add("moe_down", f"bf16-R{R}-E{E}-k{k}-I{I}-H{H}",
            (_r(rng, R * k, I), _w16(rng, E * H, I, scale=I ** -0.5), idx, H,
             np.zeros((R * k, H), F32), R), [4])
        # exact-bf16 (issue #19): the experts on the MMA, weights float32 of bf16 values or bf16 bits
        # (the naive kernels: one thread per output; the small config covers their indexing, and
        # the big one's weights, 2 GB a form, would be built by every shard process)
        for tag, wt in ((("", lambda *sh, scale: round_bf16(_r(rng, *sh, scale=scale))),
                         ("bf16-", lambda *sh, scale: _w16(rng, *sh, scale=scale))) if E * I * H <= 1 << 22 else ()):
            add("moe_up_mma", f"{tag}R{R}-E{E}-k{k}-I{I}-H{H}",
                (_r(rng, R, H), wt(E * I, H, scale=H ** -0.5), wt(E * I, H, scale=H ** -0.5), idx, I,
                 np.zeros((R * k, I), F32), R), [5])
            add("moe_down_mma", f"{tag}R{R}-E{E}-k{k}-I{I}-H{H}",
                (_r(rng, R * k, I), wt(E * H, I, scale=I ** -0.5), idx, H, np.zeros((R * k, H), F32), R), [4])
        add("moe_combine", f"R{R}-k{k}-H{H}",
            (_r(rng, R * k, H), rng.uniform(0, 1, (R, k)).astype(F32), _r(rng, R, H), _r(rng, R, 1), True,
             np.zeros((R, H), F32), R), [5])
    # the device-side position of captured steps (harness.engine.graphs): start read from an int32 [1]
    # device array; the CPU twin takes the same start as a scalar
    for hq, hkv, D, start, R in (att[1:3] if full else att[3:]):
        ctx = start + R
        attention_and_kv_write(hq, hkv, D, start, R, 200, "@pos", f"-cap{ctx + 200}")
        half = D // 8
        ang = np.outer(np.arange(ctx), 10000.0 ** (-np.arange(half) * 2.0 / (2 * half)))
        add("rope@pos", f"R{R}-H{hq}-D{D}-p{start}",
            (_r(rng, R, hq * D), hq, D, half, np.cos(ang).astype(F32), np.sin(ang).astype(F32), start, R), [0])
        add("qk_norm_rope@pos", f"R{R}-Hq{hq}-Hkv{hkv}-D{D}-p{start}",
            (_r(rng, R, 2 * (hq + hkv) * D), hq, hkv, D, _r(rng, D, scale=0.1), _r(rng, D, scale=0.1), F32(1e-6), half,
             np.cos(ang).astype(F32), np.sin(ang).astype(F32), start, np.zeros((R, hq * D), F32),
             _r(rng, ctx + 2, hkv * D), _r(rng, ctx + 2, hkv * D), R), [11, 12, 13])
    bad = _r(rng, 4, 33)
    bad[2, 7] = np.nan
    add("nonfinite_flag", "R4-N33-nan", (bad, 4, np.zeros(3, np.int32), 1), [2])
    add("copy_i32", "n9", (rng.integers(-2 ** 31, 2 ** 31, 9).astype(np.int32), np.zeros(10, np.int32), 9), [1])
    # the greedy pick (numpy.argmax) at vocab sizes of one block, several and bench-8l's, with equal
    # maxima in different blocks, NaNs, signed zeros, all -inf
    for V in ((7, 2049, 151936, 248320, 300001) if full else (7, 2049)):  # 300,001: more blocks than threads
        lg = _r(rng, 1, V)
        add("greedy_pick", f"V{V}", (lg, np.array([511, 3], np.int32), np.full(2, -1, np.int32), 1), [1, 2])
        ties = lg.copy()
        ties[0, [V // 2, V - 1, 0]] = 40.0
        add("greedy_pick", f"V{V}-ties", (ties, np.array([0, 0], np.int32), np.full(2, -1, np.int32), 0), [1, 2])
        nan = lg.copy()
        nan[0, [V - 1, V // 3]] = np.nan
        add("greedy_pick", f"V{V}-nan", (nan, np.array([0, 0], np.int32), np.full(2, -1, np.int32), 0), [1, 2])
    z = np.zeros((1, 5000), F32)
    z[0, [0, 4000]] = -0.0
    add("greedy_pick", "V5000-zeros", (z, np.array([0, 0], np.int32), np.full(2, -1, np.int32), 1), [1, 2])
    add("greedy_pick", "V5000-neg-inf", (np.full((1, 5000), -np.inf, F32), np.array([0, 0], np.int32),
                                         np.full(2, -1, np.int32), 1), [1, 2])
    # the trace's row hash (harness bisect): a logits-wide row, many rows, the k routed experts of
    # a token as one traced row (m > 1), a column window, chained onto earlier hashes
    hashes = rng.integers(0, 2 ** 63, (4096, 3), dtype=np.uint64)
    for R, m, N, c0, c1, chain in ([(1, 1, 151936, 0, 151936, False), (4096, 1, 2048, 0, 2048, False),
                                    (300, 10, 512, 0, 512, False), (17, 2, 600, 3, 517, True)] if full
                                   else [(17, 2, 600, 3, 517, True)]):
        X = rng.integers(0, 2 ** 32, (R * m + 1, N), dtype=np.uint64).astype(np.uint32)
        add("row_hash", f"R{R}-m{m}-N{N}-c{c0}:{c1}{'-chain' if chain else ''}",
            (X, 1, m, c0, c1, hashes.copy(), 1, chain, R), [5])
    mma_op_cases(rng, full, add)
    return cases


def _packed(X):
    """X's rows as the producers pack them for exact-bf16's GEMMs (xp=): uint32 pairs of bf16 bits
    (every NaN 0x7fc0)."""
    from numba_kernels.mma import f32_to_bf16

    b = np.where(np.isnan(X), 0x7FC0, f32_to_bf16(X)).astype(np.uint32)
    return np.ascontiguousarray(b[:, 0::2] | (b[:, 1::2] << 16))


def packed_cases(rng, full, add):
    """exact-bf16's packed GEMM inputs (``xp=``): the five producer ops writing their outputs' bf16
    pairs beside them (one block a row or a head, after a barrier; one thread a pair for the gates),
    NaN and ±inf outputs among them, and ``linear_mma`` reading X from them (every GEMV kernel by the
    rows it stages, the packed-X GEMM, float32 weights)."""
    U = np.zeros
    for R, N, oo in ([(5, 2048, 2048), (1, 17000, 0), (3, 20, 0)] if full else [(3, 20, 0)]):
        X = _r(rng, R, N)
        X[R - 1, 3] = np.nan
        add("rmsnorm", f"R{R}-N{N}-oo{oo}-xp", (X, _r(rng, N, scale=0.1), F32(1e-6), U((R, oo + N), F32), oo, R,
                                                U((R, (oo + N) // 2), np.uint32)), [3, 6])
        D = _r(rng, R, N)
        D[0, N // 2] = np.inf
        add("add_rmsnorm", f"R{R}-N{N}-xp", (_r(rng, R, N), D, _r(rng, N, scale=0.1), F32(1e-6), U((R, N), F32), 0, R,
                                             U(2, np.int32), 1, U((R, N // 2), np.uint32)), [0, 4, 7, 9])
    for R, H, D in ([(5, 32, 128), (20, 4, 16)] if full else [(20, 4, 16)]):
        X = _r(rng, R, H * D)
        X[0, D + 1] = np.inf  # head 1 of row 0: ±inf and NaN outputs
        add("gated_rmsnorm", f"R{R}-H{H}-D{D}-xp", (X, _r(rng, R, 3 * H * D), 2 * H * D, H, D, _r(rng, D), F32(1e-6),
                                                    U((R, H * D), F32), R, U((R, H * D // 2), np.uint32)), [7, 9])
        GU = _r(rng, R, 2 * H * D, scale=3.0)
        GU[R - 1, 1], GU[0, H * D + 2] = np.nan, -np.inf
        add("swiglu_act", f"R{R}-I{H * D}-xp", (GU, H * D, U((R, H * D), F32), R, U((R, H * D // 2), np.uint32)), [2, 4])
        add("sigmoid_gate", f"R{R}-N{H * D}-xp", (_r(rng, R, H * D), GU, H * D, U((R, H * D), F32), R,
                                                  U((R, H * D // 2), np.uint32)), [3, 5])
    for R, K, N in ([(1, 2048, 2048), (2, 2048, 5632), (5, 1096, 77), (8, 520, 300), (16, 776, 77), (17, 264, 130),
                     (64, 2048, 520)] if full else [(5, 1096, 77), (17, 264, 130)]):
        X = _r(rng, R, K)
        X[R - 1, K - 1] = np.nan
        add("linear_mma", f"bf16-R{R}-K{K}-N{N}-xp", (X, _w16(rng, N, K, scale=K ** -0.5), U((R, N), F32), R, _packed(X)),
            [2])
    X = _r(rng, 5, 264)
    add("linear_mma", "R5-K264-N70-xp", (X, round_bf16(_r(rng, 70, 264, scale=264 ** -0.5)), U((5, 70), F32), 5,
                                         _packed(X)), [2])
    # the MLP's gate‖up projection and its SwiGLU (linear_swiglu_mma): up to 32 rows the GEMV
    # storing silu(gate)·up (every X-row kernel: 1, 2, 4, 8, 16 staged; bench-8l's I = 5632 and
    # odd I, no pairs), from 33 rows, K % 8 != 0 and float32 weights the projection then
    # swiglu_act; non-finite activations and weights
    glu = [(1, 2048, 5632, True), (2, 520, 77, False), (3, 1096, 300, True), (5, 2048, 5632, True),
           (8, 264, 130, True), (9, 776, 41, False), (16, 520, 300, True), (17, 264, 130, True),
           (32, 264, 77, False), (33, 264, 130, True), (4, 1100, 64, True)]
    for i, (R, K, I, pairs) in enumerate(glu if full else glu[4:5] + glu[9:]):
        X = _r(rng, R, K, scale=4.0)
        if R >= 3:  # a non-finite row among finite ones
            X[R - 1, K // 3] = np.nan if i % 2 == 0 else np.inf
        W = _w16(rng, 2 * I, K, scale=K ** -0.5)
        W[min(5, I - 1), 3] = 0x7F80  # +inf: a gate
        xp = _packed(X) if K % 8 == 0 else None
        args = (X, W, I, U((R, I), F32), R, U((R, 2 * I), F32), xp, U((R, I // 2), np.uint32) if pairs else None)
        add("linear_swiglu_mma", f"R{R}-K{K}-I{I}{'-pairs' if pairs else ''}", args, [3, 7] if pairs else [3])
    X = _r(rng, 5, 264, scale=4.0)
    add("linear_swiglu_mma", "R5-K264-I70-f32w", (X, round_bf16(_r(rng, 140, 264, scale=264 ** -0.5)), 70,
                                                  U((5, 70), F32), 5, U((5, 140), F32), None, U((5, 35), np.uint32)),
        [3, 7])
    # the lm head (linear_flag_mma): the bf16 GEMV checks each output as it stores it -- every
    # GEMV kernel by the rows it stages, the 512-k and 256-k rings, a wide vocabulary; a NaN row
    # (flagged), a NaN row past R (never stored: not flagged), an all-finite run (not flagged);
    # from 33 rows, K % 8 != 0 and float32 weights: the GEMM or GEMV, then nonfinite_flag
    flag_shapes = [(1, 2048, 40000), (2, 520, 4104), (4, 1096, 77), (5, 2048, 4104), (8, 264, 130), (16, 520, 77),
                   (17, 264, 300), (33, 264, 130), (3, 1100, 41)]
    for i, (R, K, N) in enumerate(flag_shapes if full else flag_shapes[4:5] + flag_shapes[7:]):
        X = _r(rng, R + 1, K)
        X[R, 7] = np.nan  # past R
        if i % 2 == 0:
            X[R - 1, K // 2] = np.nan
        W = _w16(rng, N, K, scale=K ** -0.5)
        xp = _packed(X) if K % 8 == 0 else None
        args = (X, W, U((R + 1, N), F32), R, U(2, np.int32), 1) + ((xp,) if xp is not None else ())
        add("linear_flag_mma", f"bf16-R{R}-K{K}-N{N}{'-nan' if i % 2 == 0 else '-finite'}", args, [2, 4])
    X = _r(rng, 5, 264)
    X[2, 9] = np.inf
    add("linear_flag_mma", "R5-K264-N70-f32w", (X, round_bf16(_r(rng, 70, 264, scale=264 ** -0.5)), U((5, 70), F32), 5,
                                                U(2, np.int32), 0), [2, 4])


def mma_op_cases(rng, full, add):
    """exact-bf16 (issue #19): the MMA ops at 1 row, 4/5 (the fp32 GEMV threshold), 16/17 (one
    MMA row tile and past it) and many rows; K not a multiple of 16, N not of 8; weights bf16."""

    # K % 4 == 0 takes the tensor-core kernel with 16-byte loads (K 260 and 1100: a last step of
    # 4 and 12 terms), other K the scalar one (1026, 97)
    # rows from GEMM_MIN_ROWS (33) take the block-tiled GEMM (K 260, 1100: a last K tile of one
    # step; N 130, 300: a partial block; 32 rows the one-warp kernel)
    lin = [(1, 2048, 5632), (4, 1100, 77), (5, 2048, 2048), (16, 2048, 2048), (1, 1026, 41), (17, 260, 130),
           (64, 2048, 5632), (130, 97, 33), (32, 1100, 77), (33, 260, 130), (200, 1100, 300)]
    for R, K, N in (lin if full else lin[5:6] + lin[7:]):
        add("linear_mma", f"R{R}-K{K}-N{N}",
            (_r(rng, R, K), round_bf16(_r(rng, N, K, scale=K ** -0.5)), np.zeros((R, N), F32), R), [2])
    # bf16-resident weights (uint16, the default on CUDA): K % 8 == 0 takes the GEMV below
    # W16_MIN_ROWS (33) rows (K 264 and 1096: a last step of 8 terms, a last stage part-filled; 520,
    # 776, 1032: a last pair of steps part-filled; every GEMV kernel -- X rows staged 1, 2, 4, 8, 16
    # -- at every row count 1-9, 16, 17 and 32, 17 a second 16-row block of one row) and the
    # packed-X GEMM from it (33, 48, 64, 200, 520; N 130, 136, 300: partial blocks; K 264: a last
    # 32-k tile of one step, 1048: of a step and a half); other K (1100, 97) the one-warp kernel on
    # element loads; up to 4 rows on at most VD_WIDE_MAX_N (4096) outputs the 512-k ring (one row
    # on 130), on more (4104) the 256-k ring
    w16 = [(1, 2048, 5632), (4, 1096, 77), (17, 264, 130), (32, 2048, 2048), (1, 1100, 41), (33, 264, 130),
           (200, 1096, 300), (130, 97, 33), (520, 512, 384), (64, 5632, 2048), (2, 520, 77), (3, 2056, 130),
           (5, 776, 41), (6, 264, 16), (7, 1032, 300), (8, 520, 9), (9, 264, 130), (16, 776, 77), (1, 1288, 130),
           (2, 520, 4104), (3, 1032, 4104), (48, 1048, 136)]
    for R, K, N in (w16 if full else w16[2:3] + w16[5:8]):
        X = _r(rng, R, K)
        if R >= 3:  # non-finite activations: their rows only
            X[1, 5], X[R - 1, K - 1] = np.inf, np.nan
        W = _w16(rng, N, K, scale=K ** -0.5)
        W[3, 7] = 0x7F80  # +inf: the column's outputs ±inf or NaN
        add("linear_mma", f"bf16-R{R}-K{K}-N{N}", (X, W, np.zeros((R, N), F32), R), [2])
    # split-KV up to SPLIT_MAX_ROWS (16) rows; past it the tensor-core kernel (head_dim a multiple
    # of 4 up to 256: D 40 is not one of 16; odd heads; starts on and off a 64-key tile; warps
    # whose 16 rows straddle a tile), one block per (row, head) for other head dims (D 6); the
    # captured step's device-side position (@pos: the grid covers the cache's capacity); head_dim 12
    # (packed: a last n-tile of 4 columns, one MMA step of a 32-k block)
    att = [(16, 2, 256, 1000, 1, ""), (4, 2, 64, 61, 17, ""), (16, 2, 256, 5000, 4, "@pos"), (3, 1, 24, 130, 16, ""),
           (16, 2, 256, 300, 20, ""), (7, 7, 40, 64, 1, "@pos"), (7, 7, 40, 64, 33, ""), (8, 2, 128, 0, 70, ""),
           (4, 2, 64, 500, 40, "@pos"), (3, 1, 6, 10, 20, ""), (3, 3, 12, 130, 40, ""),
           (34, 2, 72, 700, 3, "@pos"), (17, 1, 8, 63, 2, "")]  # split on the MMA: 17 heads a KV head (two groups)
    for hq, hkv, D, start, R, tag in (att if full else att[1:2] + att[5:]):
        ctx = start + R
        cap = ctx + (100 if tag else 0)
        add("attention_mma" + tag, f"R{R}-Hq{hq}-Hkv{hkv}-D{D}-p{start}" + (f"-cap{cap}" if tag else ""),
            (_r(rng, R, hq * D), _r(rng, cap, hkv * D), _r(rng, cap, hkv * D), np.zeros((R, hq * D), F32), start, R,
             hq, hkv, D, F32(D ** -0.5)), [3])
    # non-finite inputs past the split: a NaN query, an ∞ key; V ∞ (and a value that rounds to a bf16 ∞)
    # at keys some rows of a 16-row warp read and others do not (the tensor-core kernel's fallback)
    Q, K, V = _r(rng, 40, 2 * 64), _r(rng, 40, 64), _r(rng, 40, 64)
    Q[3, 5], K[20, 9], V[7, 3], V[22, 60] = np.nan, np.inf, -np.inf, F32(3.4e38)
    add("attention_mma", "R40-Hq2-Hkv1-D64-p0-nonfinite",
        (Q, K, V, np.zeros((40, 128), F32), 0, 40, 2, 1, 64, F32(0.125)), [3])
    # the same in split-KV (R ≤ 16, one block a KV head's query heads): a NaN query, ±∞ keys, an ∞ V
    # and a V that rounds to a bf16 ∞ at keys the rows read, NaN V and K past the last row's key
    # (the cache's unwritten capacity: masked, never read into a product)
    Q, K, V = _r(rng, 5, 4 * 64), _r(rng, 300, 2 * 64), _r(rng, 300, 2 * 64)
    Q[1, 7], K[30, 3], K[131, 70], V[12, 5], V[100, 64] = np.nan, np.inf, -np.inf, np.inf, F32(3.4e38)
    K[105:, :], V[105:, :] = np.nan, np.nan
    add("attention_mma@pos", "R5-Hq4-Hkv2-D64-p100-nonfinite-cap300",
        (Q, K, V, np.zeros((5, 256), F32), 100, 5, 4, 2, 64, F32(0.125)), [3])
    # the tile max (the twin's scan: first score, then strictly greater ones) where it is not a
    # plain max: rows of tied +0 scores (zero queries), scores past float32 (±∞; ∞ − ∞ in exp),
    # a NaN key at a tile's first key (a NaN max) and inside a tile (skipped by the scan)
    Q, K, V = _r(rng, 120, 4 * 64), _r(rng, 130, 2 * 64), _r(rng, 130, 2 * 64)
    Q[5:9], Q[40:44], K[70:75] = 0, Q[40:44] * F32(1e19), K[70:75] * F32(1e19)
    K[64, 5], K[100, 70], K[3, 0] = np.nan, np.nan, -np.inf
    add("attention_mma", "R120-Hq4-Hkv2-D64-p10-tilemax",
        (Q, K, V, np.zeros((120, 256), F32), 10, 120, 4, 2, 64, F32(0.125)), [3])


POS_ARG = {"rope": 6, "kv_write": 6, "qk_norm_rope": 10, "attention": 4, "attention_mma": 4}  # where ``start`` sits in the args


def run_op_case(cpu_ops, cuda_ops, cuda, op, args, outs):
    """Run one case on both targets; returns (equal, max ulp, cpu seconds, cuda seconds).
    ``op@pos``: the CUDA op takes start 0 and the position as a device array (``pos=``)."""
    op, _, how = op.partition("@")
    cargs = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    t0 = time.perf_counter()
    getattr(cpu_ops, op)(*cargs)
    t_cpu = time.perf_counter() - t0
    kw = {}
    if how == "pos":
        i = POS_ARG[op]
        kw = {"pos": cuda.to_device(np.array([args[i]], np.int32))}
        args = args[:i] + (0,) + args[i + 1:]
    dargs = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    getattr(cuda_ops, op)(*dargs, **kw)
    cuda.synchronize()
    dargs2 = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    t0 = time.perf_counter()
    getattr(cuda_ops, op)(*dargs2, **kw)
    cuda.synchronize()
    t_gpu = time.perf_counter() - t0
    equal, ulp = True, 0
    for i in outs:
        a, b = cargs[i], dargs2[i].copy_to_host()
        if a.dtype == F32:  # bit for bit, every NaN as the canonical NaN (the contract)
            a, b = canonical_f32(a), canonical_f32(b)
            same = np.array_equal(a.view(np.uint32), b.view(np.uint32))
            if not same:
                ulp = max(ulp, ulp_distance(a, b))
        else:
            same = np.array_equal(a, b)
            if not same:
                ulp = max(ulp, -1)
        equal &= same
    return equal, ulp, t_cpu, t_gpu


def larger_config():
    from ..engine.config import ModelConfig

    return ModelConfig.from_dict(dict(
        vocab_size=1024, hidden_size=512, num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        rope_parameters={"rope_theta": 1e6, "partial_rotary_factor": 0.25}, intermediate_size=1024,
        num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128, shared_expert_intermediate_size=256,
        decoder_sparse_step=2, norm_topk_prob=True, num_nextn_predict_layers=1))


def schedule_runs(engine, ids, tokenwise_only=False):
    """Logits (per row, tokenwise) and digests of tokenwise / batched / split primes. On CUDA the
    tokenwise rows are captured steps (run once, captured, replayed) unless the engine has
    graphs off. ``tokenwise_only``: that schedule alone."""
    T = len(ids)
    out = {}
    s = engine.new_session(T + 8)
    rows = [engine.decode_step(s, int(t))[0] for t in ids]
    out["tokenwise"] = (np.stack(rows), s.cache.digest())
    if tokenwise_only:
        return out
    s = engine.new_session(T + 8)
    logits, _ = engine.target_step(s, ids)
    out["batched"] = (logits, s.cache.digest())
    s = engine.new_session(T + 8)
    a, b = T // 3, (2 * T) // 3
    parts = [engine.target_step(s, ids[lo:hi])[0] for lo, hi in ((0, a), (a, b), (b, T))]
    out["split3"] = (np.concatenate(parts), s.cache.digest())
    out.update(greedy_runs(engine, ids))
    return out


def greedy_runs(engine, ids):
    """Greedy decode after the prompt's first T - 1 rows, from its last token: ``greedy``
    (Engine.decode_greedy -- chained steps, the pick on the device; on CUDA with graphs, each of
    its two slots eager, then captured and replayed) and ``greedy-stepwise`` (the decode_step
    calls it stands for), each (logits of every step, cache digest)."""
    T = len(ids)
    out = {}
    for name, run in (("greedy", lambda s: engine.decode_greedy(s, int(ids[-1]), GREEDY_STEPS, keep_logits=True)),
                      ("greedy-stepwise", lambda s: engine._greedy_stepwise(s, int(ids[-1]), GREEDY_STEPS, True))):
        s = engine.new_session(T + GREEDY_STEPS + 8)
        engine.target_step(s, ids[:-1])
        out[name] = (run(s)[1], s.cache.digest())
    return out


GREEDY_STEPS = 8  # decode_greedy's steps in a device-check schedule


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (``--shard``): shard I of N, 0 <= I < N; a one-line error otherwise."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise InputError(f"device-check --shard {text!r}: expected I/N (shard I of N, e.g. 0/3)") from None
    if not (n >= 1 and 0 <= i < n):
        raise InputError(f"device-check --shard {text}: needs 0 <= I < N")
    return i, n


def _mine(u: int, shard) -> bool:
    """Work unit ``u`` (an op case, then a model's schedule runs, numbered on) belongs to ``shard``."""
    return shard is None or u % shard[1] == shard[0]


def _summary(ops_rows, models) -> dict:
    return {"ops": len(ops_rows), "ops_bitwise": sum(r["verdict"] == "bitwise" for r in ops_rows),
            "schedules": len(models),
            "schedules_bitwise": sum(r["cpu_vs_cuda"] == "bitwise" and r["vs_tokenwise"] == "bitwise" for r in models)}


def device_check(out_path: str, commit: str | None = None, full: bool = True, seed: int = 0, ops=None,
                 shard=None) -> dict:
    """Every op case and every schedule of the check models on CUDA against the CPU twin; the
    receipt at ``out_path``. ``ops``: only the cases of these ops and no schedules (a partial
    receipt, marked ``ops_filter``, which ``harness evidence`` does not take as the check).
    ``shard`` ``(I, N)``: every N-th unit of work from the I-th (op cases, then the models' schedule
    runs), a receipt marked ``shard`` that :func:`merge_shards` joins with the other N - 1 (most of
    the check's time is compiling kernels on the CPU, which N processes on one GPU share out)."""
    from ..engine import backend as bk
    from ..engine import bf16
    from ..engine.model import Engine
    from ..engine.weights import Checkpoint, load_checkpoint
    from ..models import default_model_path, model_path
    from ..synth import random_tensors

    rng = np.random.default_rng(seed)
    t_all = time.perf_counter()
    if ops:  # the names first, from the quick cases (half a second; the full ones take a minute or
        # more to build, and cover the same ops)
        known = {c[0] for c in op_cases(np.random.default_rng(seed), False)}
        unknown = sorted(set(ops) - known)
        if unknown:
            raise InputError(f"device-check --ops: no cases for {', '.join(unknown)} "
                             f"(ops with cases: {', '.join(sorted(known))})")
    cases = op_cases(rng, full)  # every shard builds them all: the random inputs follow one stream
    if ops:
        cases = [c for c in cases if c[0] in ops]
    cpu_b = bk.get_backend("cpu")
    gpu_b = bk.get_backend("cuda")
    ops_rows = []
    for u, (op, cid, args, outs) in enumerate(cases):
        if not _mine(u, shard):
            continue
        eq, ulp, tc, tg = run_op_case(cpu_b.ops, gpu_b.ops, gpu_b.cuda, op, args, outs)
        ops_rows.append({"op": op, "case": cid, "verdict": "bitwise" if eq else "differs",
                         "max_ulp": ulp, "cpu_s": round(tc, 6), "cuda_s": round(tg, 6), "unit": u})
        print(f"op {op:16s} {cid:36s} {'bitwise' if eq else f'DIFFERS max_ulp={ulp}'}", flush=True)
    models = []
    runs = ()
    if not ops:
        big_cfg = larger_config()
        loaders = {  # each loaded on first use: a shard may need none of them
            "tiny": lambda: load_checkpoint(default_model_path()),
            "larger-random": lambda: Checkpoint(big_cfg, random_tensors(big_cfg, seed=7), "random:larger", "random-seed-7"),
            "tiny-q35": lambda: load_checkpoint(model_path("tiny-q35")),  # Qwen3.5 layout, bf16: bf16-resident on CUDA
        }
        loaded = {}

        # exact-bf16 (issue #19) on tiny and on the bf16 Qwen3.5 checkpoint (its weights f32-resident in the mode)
        runs = (("tiny", 130, "exact"), ("larger-random", 97 if full else 40, "exact"),
                ("tiny-q35", 130, "exact"), ("tiny", 130, "exact-bf16"), ("tiny-q35", 130, "exact-bf16"))
    for j, (name, T, mode) in enumerate(runs):
        u = len(cases) + j
        if not _mine(u, shard):
            continue
        if name not in loaded:
            loaded[name] = loaders[name]()
        c = loaded[name]
        ids = np.random.default_rng(1).integers(0, c.config.vocab_size, T).astype(np.int32)
        res = {}
        for bname in ("cpu", "cuda"):
            eng = Engine(c, bname, mode=mode)
            t0 = time.perf_counter()
            res[bname] = schedule_runs(eng, ids)
            res[bname + "_s"] = time.perf_counter() - t0
        # the CUDA engine without captured steps: every launch from Python, start as a scalar
        res["cuda"]["tokenwise-uncaptured"] = schedule_runs(Engine(c, "cuda", graphs=False, mode=mode), ids,
                                                            tokenwise_only=True)["tokenwise"]
        res["cpu"]["tokenwise-uncaptured"] = res["cpu"]["tokenwise"]
        res["cuda"]["greedy-uncaptured"] = greedy_runs(Engine(c, "cuda", graphs=False, mode=mode), ids)["greedy"]
        res["cpu"]["greedy-uncaptured"] = res["cpu"]["greedy"]
        scheds = ["tokenwise", "tokenwise-uncaptured", "batched", "split3", "greedy", "greedy-uncaptured"]
        if mode == "exact" and bf16.resolve(None, "cuda", c) == "bf16":  # the same bits with the weights widened on the host
            for sched in ("tokenwise", "batched"):
                res["cuda"][sched + "-f32-weights"] = schedule_runs(Engine(c, "cuda", weights="f32"), ids)[sched]
                res["cpu"][sched + "-f32-weights"] = res["cpu"][sched]
                scheds.append(sched + "-f32-weights")
        for sched in scheds:
            lc, dc = res["cpu"][sched]
            lg, dg = res["cuda"][sched]
            lo, do = res["cpu"]["greedy-stepwise" if sched.startswith("greedy") else "tokenwise"]
            same = np.array_equal(lc.view(np.uint32), lg.view(np.uint32)) and dc == dg
            inv = np.array_equal(lc.view(np.uint32), lo.view(np.uint32)) and dc == do
            models.append({"model": name, "mode": mode, "prompt_len": T, "schedule": sched,
                           "cpu_vs_cuda": "bitwise" if same else "differs",
                           "max_ulp": 0 if same else ulp_distance(lc, lg),
                           "vs_tokenwise": "bitwise" if inv else "differs",
                           "cpu_digest": dc, "cuda_digest": dg, "unit": u})
            print(f"model {name:14s} {mode:10s} T={T:4d} {sched:10s} cpu-vs-cuda {models[-1]['cpu_vs_cuda']} "
                  f"schedule-invariant {models[-1]['vs_tokenwise']}", flush=True)
    receipt = {
        "kind": "device-check", "schema_version": 1,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": gpu_b.device_name(), "driver": gpu_b.driver(), "cpu": cpu_b.device_name(), "pdl": gpu_b.pdl(),
        "commit": commit, "full": full, "seed": seed, **({"ops_filter": sorted(ops)} if ops else {}),
        **({"shard": {"index": shard[0], "count": shard[1]}, "units": len(cases) + len(runs)} if shard else {}),
        "ops": ops_rows, "schedules": models, "wall_s": round(time.perf_counter() - t_all, 2),
        **evidence_block(REPO),
        "summary": _summary(ops_rows, models),
    }
    write_text_atomic(out_path, json.dumps(receipt, indent=1, sort_keys=True) + "\n")
    return receipt


# the fields every shard of one check must agree on
_SHARD_SAME = ("kind", "schema_version", "device", "driver", "pdl", "commit", "full", "seed", "ops_filter", "units",
               "code_fingerprint", "fingerprint_files")


def merge_shards(paths, out_path: str) -> dict:
    """Join the N shard receipts of one device-check (``--shard I/N``, I = 0..N-1, each once, the
    same code, commit, device and seed) into the receipt a single process would have written:
    op rows and schedule rows in the order of their units, the summary recomputed, ``wall_s`` the
    longest shard's; ``shards`` records N. One-line errors for anything else."""
    docs = []
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise InputError(f"device-check --merge: cannot read {p}: {e}") from None
        if not isinstance(d, dict) or d.get("kind") != "device-check":
            raise InputError(f"device-check --merge: {p} is not a device-check receipt")
        if not isinstance(d.get("shard"), dict):
            raise InputError(f"device-check --merge: {p} is not a shard (run with --shard I/N)")
        docs.append((p, d))
    if not docs:
        raise InputError("device-check --merge: no shard receipts given")
    n = docs[0][1]["shard"]["count"]
    got = sorted(d["shard"]["index"] for _, d in docs)
    if any(d["shard"]["count"] != n for _, d in docs) or got != list(range(n)):
        have = ", ".join(f"{d['shard']['index']}/{d['shard']['count']}" for _, d in docs)
        raise InputError(f"device-check --merge: needs shards 0/{n} .. {n - 1}/{n} once each, got {have}")
    first = docs[0][1]
    for p, d in docs[1:]:
        for k in _SHARD_SAME:
            if d.get(k) != first.get(k):
                raise InputError(f"device-check --merge: {p} and {docs[0][0]} differ in {k!r} "
                                 "(shards of different checks)")
    ops_rows = sorted((r for _, d in docs for r in d["ops"]), key=lambda r: r["unit"])
    models = sorted((r for _, d in docs for r in d["schedules"]), key=lambda r: r["unit"])  # stable: a run's order kept
    receipt = {k: v for k, v in first.items() if k not in ("shard", "units", "ops", "schedules", "summary")}
    receipt.update({
        "created": max(d["created"] for _, d in docs), "shards": n,
        "ops": ops_rows, "schedules": models, "wall_s": max(d["wall_s"] for _, d in docs),
        "summary": _summary(ops_rows, models)})
    write_text_atomic(out_path, json.dumps(receipt, indent=1, sort_keys=True) + "\n")
    return receipt


# ------------------------------------------------------------------------------------------------
# walker, check and speculative decoding on both backends
# ------------------------------------------------------------------------------------------------
def walker_runs(engine, lengths, ks, seed=0):
    """The prime-walker check, and greedy speculative vs plain generation, on one backend.
    Returns {case id: {digests, verdicts}}."""
    from ..walk.check import check_mtp_prime_walker
    from ..walk.speculative import generate

    out = {}
    for T in lengths:
        prompt = np.random.default_rng(seed + T).integers(0, engine.cfg.vocab_size, T).tolist()
        for k in ks:
            r = check_mtp_prime_walker(engine, prompt, k)
            out[f"check/p{T}/k{k}"] = {"ok": r["ok"], "yields": r["yields"], "logits": r["logits_digest"],
                                       "captures": r["capture_digest"],
                                       "final_state": r["session"].cache.digest()}
        plain, _ = generate(engine, prompt[:200], 24, 1, speculative=False)
        for name, vocab in (("spec", None), ("spec-draft-vocab", walker_draft_vocab(engine.cfg.vocab_size))):
            engine.set_draft_vocab(vocab)  # drafts among every third id: their pick on both targets
            for k in ks:
                spec, run = generate(engine, prompt[:200], 24, k)
                out[f"{name}/p{min(T, 200)}/k{k}"] = {
                    "ok": spec.tokens == plain.tokens, "logits": logits_digest(run.prepared.logits),
                    "continuation": continuation_digest(spec.tokens),
                    "mean_acceptance_length": spec.metrics["mean_acceptance_length"]}
        engine.set_draft_vocab(None)
    return out


def walker_draft_vocab(vocab_size):
    """The device walker's draft vocabulary (``harness.engine.draft``): every third id, so a draft
    index and its id differ and the full head's favourite is often left out."""
    return list(range(1, vocab_size, 3))


def device_walker(out_path, commit=None, lengths=(130, 257, 1000, 2061), ks=(1, 2, 3, 4)):
    from ..engine import backend as bk
    from ..engine.model import Engine
    from ..engine.weights import load_checkpoint
    from ..models import default_model_path

    ck = load_checkpoint(default_model_path())
    res, walls = {}, {}
    for b in ("cpu", "cuda"):
        t0 = time.perf_counter()
        res[b] = walker_runs(Engine(ck, b), lengths, ks)
        walls[b] = round(time.perf_counter() - t0, 2)
    cases = []
    for cid in res["cpu"]:
        c, g = res["cpu"][cid], res["cuda"][cid]
        dig = {k: v for k, v in c.items() if isinstance(v, str)}
        same = all(g.get(k) == v for k, v in dig.items())
        cases.append({"case": cid, "cpu_ok": c["ok"], "cuda_ok": g["ok"], "digests_equal": same,
                      "cpu": c, "cuda": g})
        print(f"{cid:18s} cpu {'PASS' if c['ok'] else 'FAIL'} cuda {'PASS' if g['ok'] else 'FAIL'} "
              f"digests {'equal' if same else 'DIFFER'}", flush=True)
    gpu = bk.get_backend("cuda")
    receipt = {"kind": "device-walker", "schema_version": 1,
               "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "device": gpu.device_name(), "driver": gpu.driver(), "cpu": bk.get_backend("cpu").device_name(),
               "commit": commit, "model": "tiny", "weights_sha256": ck.sha256, "wall_s": walls, "cases": cases,
               **evidence_block(REPO),
               "summary": {"cases": len(cases), "all_pass": all(c["cpu_ok"] and c["cuda_ok"] for c in cases),
                           "digests_equal": all(c["digests_equal"] for c in cases)}}
    write_text_atomic(out_path, json.dumps(receipt, indent=1, sort_keys=True) + "\n")
    return receipt
