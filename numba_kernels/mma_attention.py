"""exact-bf16 attention: ``QKᵀ`` and ``P·V`` on the bf16 MMA, everything else as in
:mod:`numba_kernels.attention` (issue #19; ``numba_kernels/MMA.md`` §1).

Shapes and the tile order are :mod:`numba_kernels.attention`'s: keys in tiles of ``ATT_TILE`` = 64
absolute positions, never past the row's position, tiles merged left to right in float32. Per
tile (:func:`tile_stats_mma`):

- the score of key j: ``s = fmul(MMA-dot(bf16(q), bf16(k_j)), scale)``, the dot over head_dim in
  steps of 16 from +0 (:func:`numba_kernels.mma_gemm.mma_dot`);
- the tile max ``m``, ``p = exp32(s − m)`` and ``Σp`` (float32, key order), as today;
- ``Σ p·v`` of column d: the MMA-dot of bf16(p) (round to nearest even, as FlashAttention does)
  and bf16(v[:, d]) over the tile's keys in steps of 16 from +0. Each tile starts from +0, so
  split-KV keeps its meaning. Keys past the row's position are not read (a padded MMA gives them
  P = +0, a zero product: no term, the same bits).

- ``attention_mma_cpu`` (the twin): ``prange`` over (row, head), one lane each;
- ``attention_mma_split`` (CUDA, up to ``SPLIT_MAX_ROWS`` rows: decode, verify, drafts): one block
  per (tile, head, row) runs :func:`tile_stats_mma` with its threads as lanes, then the fp32 mode's
  ordered merge folds the tiles;
- ``attention_mma_tiled`` (CUDA, more rows, or when split's buffers would not fit): one block per
  (row, head), its threads as lanes, tiles merged in order as in the twin;
- ``attention_mma_naive`` (CUDA, one thread per (row, head), the twin's body): the reference
  launch.

The lanes change who computes a key's score or a column's Σ p·v, never the operations or their
order, so every launch gives the twin's bits.
"""

from __future__ import annotations

import numpy as np

from .attention import ATT_MAX_D, ATT_MERGE_NT, attention_merge_source, attn_out, merge_stats, merge_value
from .dispatch import SPLIT_MAX_ROWS, SPLIT_MAX_STATS_BYTES
from .exact import ATT_TILE, ZERO, exp32
from .mma_gemm import mma_dot, mma_f32
from .tags import (barrier, block_size, body, cuda, fmul, generated, grid1, kernel, launch, launcher, prange, scratch,
                   twin, zero_pos)


@body
def tile_stats_mma(Qu, r, qo, Ku, Vu, ko, D, scale, k0, n, sc, scu, pv, lane, lanes):
    """Keys k0 … k0+n−1 for query row r: returns (m, Σp) and writes Σ p·v into pv[d] for d in
    range(lane, D, lanes). sc: float32 [1, ATT_TILE] scratch, scu its uint32 view (P as the MMA's A
    row). ``lanes`` threads share the work (lane ``lane`` takes every lanes-th key and column); the
    max and Σp run in key order in every thread, as :func:`numba_kernels.attention.tile_stats`."""
    for j in range(lane, n, lanes):
        sc[0, j] = fmul(mma_f32(mma_dot(Qu, r, qo, Ku, k0 + j, ko, 0, 1, D)), scale)
    barrier()
    mt = sc[0, 0]
    for j in range(1, n):
        if sc[0, j] > mt:
            mt = sc[0, j]
    barrier()
    for j in range(lane, n, lanes):
        sc[0, j] = exp32(sc[0, j] - mt)
    barrier()
    lt = ZERO
    for j in range(n):
        lt = lt + sc[0, j]
    for d in range(lane, D, lanes):
        pv[d] = mma_f32(mma_dot(scu, 0, 0, Vu, k0, ko + d, 1, 0, n))
    barrier()  # sc is read: the next tile may overwrite it
    return mt, lt


@body
def attend_mma(Qu, Ku, Vu, out, r, h, kvh, pos, D, scale, sc, scu, pv, acc, lane, lanes):
    """Query row r, head h (KV head kvh) at position pos over keys 0 … pos:
    out[r, h·D + d] for d in range(lane, D, lanes)."""
    qo = h * D
    ko = kvh * D
    m = ZERO
    l = ZERO
    for tix in range(pos // ATT_TILE + 1):
        k0 = tix * ATT_TILE
        mt, lt = tile_stats_mma(Qu, r, qo, Ku, Vu, ko, D, scale, k0, min(ATT_TILE, pos + 1 - k0), sc, scu, pv,
                                lane, lanes)
        m, l, alpha, beta = merge_stats(tix, m, l, mt, lt)
        for d in range(lane, D, lanes):
            acc[d] = merge_value(tix, acc[d], alpha, pv[d], beta)
    for d in range(lane, D, lanes):
        out[r, qo + d] = attn_out(acc[d], l)


@twin("attention_mma", parallel=True)
def attention_mma_cpu(Q, kc, vc, out, start, R, hq, hkv, D, scale):
    """exact-bf16 causal GQA attention (signature of ``attention``). Q: [R, hq·D]; kc, vc:
    [max_ctx, hkv·D]; out: [R, hq·D]; float32, C-contiguous."""
    rep = hq // hkv
    Qu = Q.view(np.uint32)
    Ku = kc.view(np.uint32)
    Vu = vc.view(np.uint32)
    for rh in prange(R * hq):
        r = rh // hq
        h = rh - r * hq
        sc = np.empty((1, ATT_TILE), np.float32)
        attend_mma(Qu, Ku, Vu, out, r, h, h // rep, start + r, D, scale, sc, sc.view(np.uint32),
                   np.empty(D, np.float32), np.empty(D, np.float32), 0, 1)


@kernel
def attention_mma_naive_k(Qu, Ku, Vu, out, start, pb, R, hq, hkv, D, scale, scratch_f, scratch_u, pv, acc):
    i = cuda.grid(1)
    if i < R * hq:
        r = i // hq
        h = i - r * hq
        attend_mma(Qu, Ku, Vu, out, r, h, h // (hq // hkv), start + pb[0] + r, D, scale, scratch_f[i:i + 1],
                   scratch_u[i:i + 1], pv[i], acc[i], 0, 1)


@launcher(of="attention_mma")
def attention_mma_naive(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """One thread per (row, head), the twin's body; per-thread scratch in global memory."""
    n = R * hq
    sf = scratch("attention_mma.sc", n * ATT_TILE)[:n * ATT_TILE].reshape(n, ATT_TILE)
    work = scratch("attention_mma.pv", 2 * n * D)[:2 * n * D].reshape(2, n, D)
    launch(attention_mma_naive_k, *grid1(n, 32), Q.view(np.uint32), kc.view(np.uint32), vc.view(np.uint32), out,
           start, zero_pos() if pos is None else pos, R, hq, hkv, D, np.float32(scale), sf, sf.view(np.uint32),
           work[0], work[1])


@kernel
def attention_mma_tiled_k(Qu, Ku, Vu, out, start, pb, hq, hkv, D, scale, sf, su):
    r = cuda.blockIdx.x
    h = cuda.blockIdx.y
    pv = cuda.shared.array(ATT_MAX_D, np.float32)
    acc = cuda.shared.array(ATT_MAX_D, np.float32)
    i = r * hq + h
    attend_mma(Qu, Ku, Vu, out, r, h, h // (hq // hkv), start + pb[0] + r, D, scale, sf[i:i + 1], su[i:i + 1], pv,
               acc, cuda.threadIdx.x, cuda.blockDim.x)


@launcher(of="attention_mma")
def attention_mma_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """One block per (row, head) whose threads share each tile (keys, then columns), tiles merged
    in order as they are computed; scores and P in a global scratch row per block."""
    if D > ATT_MAX_D:
        raise ValueError(f"head_dim {D} > {ATT_MAX_D} is not supported by the CUDA attention")
    n = R * hq
    if n <= 0:
        return
    sf = scratch("attention_mma.sc", n * ATT_TILE)[:n * ATT_TILE].reshape(n, ATT_TILE)
    launch(attention_mma_tiled_k, (R, hq), block_size(ATT_TILE), Q.view(np.uint32), kc.view(np.uint32),
           vc.view(np.uint32), out, start, zero_pos() if pos is None else pos, hq, hkv, D, np.float32(scale), sf,
           sf.view(np.uint32))


@kernel
def attention_mma_split_k(Qu, Ku, Vu, start, pb, hq, hkv, D, scale, sf, su, ML, A):
    t = cuda.blockIdx.x
    h = cuda.blockIdx.y
    r = cuda.blockIdx.z
    pos = start + pb[0] + r
    k0 = t * ATT_TILE
    if k0 > pos:  # uniform over the block: a tile past the row's position
        return
    vg = r * hq + h
    i = vg * cuda.gridDim.x + t
    mt, lt = tile_stats_mma(Qu, r, h * D, Ku, Vu, (h // (hq // hkv)) * D, D, scale, k0, min(ATT_TILE, pos + 1 - k0),
                            sf[i:i + 1], su[i:i + 1], A[vg, t], cuda.threadIdx.x, cuda.blockDim.x)
    if cuda.threadIdx.x == 0:
        ML[vg, t, 0] = mt
        ML[vg, t, 1] = lt


@launcher(of="attention_mma")
def attention_mma_split(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """Split-KV (few rows): one block per (64-key tile, head, row) computes the tile exactly as
    :func:`tile_stats_mma` and writes (mt, lt) and Σ p·v into kernel-owned buffers; the fp32 mode's
    ordered merge (:func:`numba_kernels.attention.attention_merge_source`, the same
    ``merge_stats`` / ``merge_value`` / ``attn_out`` as :func:`attend_mma`) folds them in tile
    order. With ``pos`` the grid covers the cache's capacity and tiles past a row's position exit at
    once. Returns False (did nothing) when the buffers would not fit ``SPLIT_MAX_STATS_BYTES``."""
    ntiles = (start + R - 1) // ATT_TILE + 1 if pos is None else (kc.shape[0] - 1) // ATT_TILE + 1
    need = R * hq * ntiles
    if 4 * need * (D + 2 + ATT_TILE) > SPLIT_MAX_STATS_BYTES:
        return False
    if R <= 0:
        return True
    ML = scratch("attention_mma.ml", 2 * need)[:2 * need].reshape(R * hq, ntiles, 2)
    A = scratch("attention_mma.a", need * D)[:need * D].reshape(R * hq, ntiles, D)
    sf = scratch("attention_mma.split_sc", need * ATT_TILE)[:need * ATT_TILE].reshape(need, ATT_TILE)
    pb = zero_pos() if pos is None else pos
    launch(attention_mma_split_k, (ntiles, hq, R), block_size(ATT_TILE), Q.view(np.uint32), kc.view(np.uint32),
           vc.view(np.uint32), np.int64(start), pb, hq, hkv, D, np.float32(scale), sf, sf.view(np.uint32), ML, A)
    launch(generated(attention_merge_source, None), (R, hq, (D + ATT_MERGE_NT - 1) // ATT_MERGE_NT), ATT_MERGE_NT,
           ML, A, out, np.int64(start), pb, np.int64(D))
    return True


@launcher("attention_mma")
def attention_mma_cuda(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """exact-bf16 attention (see the twin); ``pos`` as in ``attention_tiled``. Split-KV for up to
    ``SPLIT_MAX_ROWS`` rows when its buffers fit, one block per (row, head) otherwise."""
    if R <= SPLIT_MAX_ROWS and attention_mma_split(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos):
        return
    attention_mma_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)
