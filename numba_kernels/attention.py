"""Causal GQA attention and the K/V cache write.

Shapes: Q [R, hq·D] (query row r at position start + r); kc, vc [max_ctx, hkv·D]; out [R, hq·D];
query head h reads KV head h // (hq / hkv).

The order, per (row, head): keys in tiles of ``ATT_TILE`` = 64 absolute positions, never past
the row's position. Per tile (:func:`tile_stats`): the scores ``s = dot(q, k)·scale``, the tile
max ``m``, ``p = exp(s − m)``, ``Σp`` and ``Σ p·v`` (fma chain in key order). Tiles are merged
left to right (:func:`merge_stats`, :func:`merge_value`): tile 0 as it is, then
``m' = max(m, m_t)``, ``x' = x·exp(m − m') + x_t·exp(m_t − m')`` for ``Σp`` and each ``Σ p·v``;
finally ``out = Σ p·v / Σp`` (:func:`attn_out`).

- ``attention_cpu`` (twin) and ``attention_tiled`` (CUDA, one block per (row, head)) run the
  same body, :func:`attend`: the block's threads share each tile's keys and value columns, with a
  barrier between the phases (a no-op on the CPU);
- ``attention_split`` (CUDA, split-KV, few rows): one block per (row, head, tile) computes
  :func:`tile_stats` into a kernel-owned buffer, then one block per (row, head) merges them in
  tile order. With ``pos`` (the device-side position of a captured step) its grid covers the
  cache's capacity and tiles past a row's position exit at once.

Which one runs is :mod:`numba_kernels.dispatch`'s table.
"""

from __future__ import annotations

import numpy as np

from . import dispatch
from .dispatch import SPLIT_MAX_STATS_BYTES
from .exact import ATT_TILE, F32, ONE, ZERO, dot_rows, exp32, fma_chain, row_col
from .tags import (barrier, body, cuda, fma, fmul, grid1, kernel, launch, launcher, prange, scratch, twin,
                   zero_pos)

ATT_MAX_D = 1024  # head dim of the tiled kernel: its per-column accumulators live in shared memory


@body
def tile_stats(Q, r, qo, kc, vc, ko, D, scale, k0, n, sc, pv, lane, lanes):
    """Keys k0 … k0+n−1 (n ≤ ATT_TILE) for query row r: scores into sc[:n], then p = exp(s − m)
    over them; returns (m, Σp) and writes Σ p·v into pv[d] for d in range(lane, D, lanes).
    ``lanes`` threads share the work, lane ``lane`` taking every lanes-th key and column."""
    for j in range(lane, n, lanes):
        sc[j] = fmul(dot_rows(Q, r, qo, kc, k0 + j, ko, D), scale)
    barrier()
    mt = sc[0]
    for j in range(1, n):
        if sc[j] > mt:
            mt = sc[j]
    barrier()
    for j in range(lane, n, lanes):
        sc[j] = exp32(sc[j] - mt)
    barrier()
    lt = ZERO
    for j in range(n):
        lt = lt + sc[j]
    for d in range(lane, D, lanes):
        pv[d] = fma_chain(sc, vc[k0:, ko + d], n, 0)
    barrier()  # sc is read: the next tile may overwrite it
    return mt, lt


@body
def merge_scale(m_old, m_tile):
    """Online-softmax tile merge: (m_new, alpha, beta) with alpha = exp(m_old − m_new),
    beta = exp(m_tile − m_new)."""
    m_new = m_old if m_old >= m_tile else m_tile
    return m_new, exp32(m_old - m_new), exp32(m_tile - m_new)


@body
def merge_acc(a_old, alpha, a_tile, beta):
    return fma(a_old, alpha, fmul(a_tile, beta))


@body
def merge_stats(tix, m, l, mt, lt):
    """Tile tix's max mt and Σp lt folded into the running (m, l): returns (m, l, alpha, beta)
    for :func:`merge_value`; tile 0 is taken as it is."""
    if tix == 0:
        return mt, lt, ONE, ONE
    m_new, alpha, beta = merge_scale(m, mt)
    return m_new, merge_acc(l, alpha, lt, beta), alpha, beta


@body
def merge_value(tix, a, alpha, at, beta):
    """Tile tix's Σ p·v of one column folded into the running one."""
    if tix == 0:
        return at
    return merge_acc(a, alpha, at, beta)


@body
def attn_out(a, l):
    return a / l


@body
def attend(Q, kc, vc, out, r, h, kvh, pos, D, scale, sc, pv, acc, lane, lanes):
    """Query row r, head h (KV head kvh) at position pos over keys 0 … pos, tile by tile:
    out[r, h·D + d] for d in range(lane, D, lanes). sc [ATT_TILE], pv and acc [≥ D]: scratch."""
    qo = h * D
    ko = kvh * D
    m = ZERO
    l = ZERO
    for tix in range(pos // ATT_TILE + 1):
        k0 = tix * ATT_TILE
        mt, lt = tile_stats(Q, r, qo, kc, vc, ko, D, scale, k0, min(ATT_TILE, pos + 1 - k0), sc, pv, lane, lanes)
        m, l, alpha, beta = merge_stats(tix, m, l, mt, lt)
        for d in range(lane, D, lanes):
            acc[d] = merge_value(tix, acc[d], alpha, pv[d], beta)
    for d in range(lane, D, lanes):
        out[r, qo + d] = attn_out(acc[d], l)


@twin("attention", parallel=True)
def attention_cpu(Q, kc, vc, out, start, R, hq, hkv, D, scale):
    """Causal GQA attention; query row r at position start + r, head h reads KV head
    h // (hq / hkv). Q: [R, hq·D]; kc, vc: [max_ctx, hkv·D]; out: [R, hq·D]."""
    rep = hq // hkv
    for rh in prange(R * hq):
        r = rh // hq
        h = rh - r * hq
        attend(Q, kc, vc, out, r, h, h // rep, start + r, D, scale, np.empty(ATT_TILE, np.float32),
               np.empty(D, np.float32), np.empty(D, np.float32), 0, 1)


@kernel
def attention_tiled_k(Q, kc, vc, out, start, pb, hq, hkv, D, scale):
    h = cuda.blockIdx.y
    sc = cuda.shared.array(ATT_TILE, np.float32)
    pv = cuda.shared.array(ATT_MAX_D, np.float32)
    acc = cuda.shared.array(ATT_MAX_D, np.float32)
    r = cuda.blockIdx.x
    attend(Q, kc, vc, out, r, h, h // (hq // hkv), start + pb[0] + r, D, scale, sc, pv, acc, cuda.threadIdx.x,
           cuda.blockDim.x)


@kernel
def attention_tile_k(Q, kc, vc, start, pb, hq, hkv, D, scale, stats):
    r = cuda.blockIdx.x
    h = cuda.blockIdx.y
    tix = cuda.blockIdx.z
    pos = start + pb[0] + r
    if tix > pos // ATT_TILE:
        return
    sc = cuda.shared.array(ATT_TILE, np.float32)
    k0 = tix * ATT_TILE
    mt, lt = tile_stats(Q, r, h * D, kc, vc, (h // (hq // hkv)) * D, D, scale, k0, min(ATT_TILE, pos + 1 - k0), sc,
                        stats[r, h, tix, 2:], cuda.threadIdx.x, cuda.blockDim.x)
    if cuda.threadIdx.x == 0:
        stats[r, h, tix, 0] = mt
        stats[r, h, tix, 1] = lt


@kernel
def attention_merge_k(stats, start, pb, D, out):
    r = cuda.blockIdx.x
    h = cuda.blockIdx.y
    ntiles = (start + pb[0] + r) // ATT_TILE + 1
    for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        m = ZERO
        l = ZERO
        a = ZERO
        for tix in range(ntiles):
            m, l, alpha, beta = merge_stats(tix, m, l, stats[r, h, tix, 0], stats[r, h, tix, 1])
            a = merge_value(tix, a, alpha, stats[r, h, tix, 2 + d], beta)
        out[r, h * D + d] = attn_out(a, l)


@launcher(of="attention")
def attention_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """One block per (row, head), tiles merged in order as they are computed. ``pos``: an int32
    [1] device array added to ``start`` (the device-side position of a captured step); None adds
    zero."""
    if D > ATT_MAX_D:
        raise ValueError(f"head_dim {D} > {ATT_MAX_D} is not supported by the CUDA attention")
    nt = max(32, min(1024, ((D + 31) // 32) * 32))
    launch(attention_tiled_k, (R, hq), nt, Q, kc, vc, out, start, zero_pos() if pos is None else pos, hq, hkv, D,
           F32(scale))


@launcher(of="attention")
def attention_split(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """Split-KV. Returns False (did nothing) when the per-tile statistics would not fit
    ``SPLIT_MAX_STATS_BYTES``. With ``pos`` the grid covers the cache's capacity."""
    ntiles = (start + R - 1) // ATT_TILE + 1 if pos is None else (kc.shape[0] - 1) // ATT_TILE + 1
    n = R * hq * ntiles * (D + 2)
    if 4 * n > SPLIT_MAX_STATS_BYTES:
        return False
    stats = scratch("attention.stats", n)[:n].reshape(R, hq, ntiles, D + 2)
    nt = max(32, min(256, ((D + 31) // 32) * 32))
    pb = zero_pos() if pos is None else pos
    launch(attention_tile_k, (R, hq, ntiles), nt, Q, kc, vc, start, pb, hq, hkv, D, F32(scale), stats)
    launch(attention_merge_k, (R, hq), nt, stats, start, pb, D, out)
    return True


@launcher("attention")
def attention_cuda(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """Causal GQA attention (see the twin); the kernel is the dispatch table's pick, split-KV
    falling back to tiled when its statistics would not fit. ``pos`` as in ``attention_tiled``."""
    if dispatch.pick("attention", R) == "attention_split" and attention_split(Q, kc, vc, out, start, R, hq, hkv, D,
                                                                              scale, pos):
        return
    attention_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)


# ------------------------------------------------------------------------------------------------
# the K/V cache write
# ------------------------------------------------------------------------------------------------
@body
def kv_write_at(Kh, ko, Vh, vo, kc, vc, start, r, c):
    kc[start + r, c] = Kh[r, ko + c]
    vc[start + r, c] = Vh[r, vo + c]


@twin("kv_write")
def kv_write_cpu(Kh, ko, Vh, vo, kc, vc, start, R):
    """Copy R rows of K (Kh[:, ko:ko+N]) and V (Vh[:, vo:vo+N]) into the caches
    ([max_ctx, N], N = Hkv·D) at rows start.."""
    for r in range(R):
        for c in range(kc.shape[1]):
            kv_write_at(Kh, ko, Vh, vo, kc, vc, start, r, c)


@kernel
def kv_write_k(Kh, ko, Vh, vo, kc, vc, start, pb, R):
    i = cuda.grid(1)
    if i < R * kc.shape[1]:
        r, c = row_col(i, kc.shape[1])
        kv_write_at(Kh, ko, Vh, vo, kc, vc, start + pb[0], r, c)


@launcher("kv_write")
def kv_write_cuda(Kh, ko, Vh, vo, kc, vc, start, R, pos=None):
    """``pos`` as in ``attention_tiled``."""
    launch(kv_write_k, *grid1(R * kc.shape[1]), Kh, ko, Vh, vo, kc, vc, start, zero_pos() if pos is None else pos, R)
