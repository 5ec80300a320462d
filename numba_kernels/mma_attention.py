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

- ``attention_mma_cpu`` (the twin): ``prange`` over (row, head);
- ``attention_mma_naive`` (CUDA, one thread per (row, head), the same body): the reference launch
  and what the simulator runs.
"""

from __future__ import annotations

import numpy as np

from .attention import attn_out, merge_stats, merge_value
from .exact import ATT_TILE, ZERO, exp32
from .mma_gemm import mma_dot, mma_f32
from .tags import body, cuda, fmul, grid1, kernel, launch, launcher, prange, scratch, twin, zero_pos


@body
def tile_stats_mma(Qu, r, qo, Ku, Vu, ko, D, scale, k0, n, sc, scu, pv):
    """Keys k0 … k0+n−1 for query row r: returns (m, Σp) and writes Σ p·v into pv[:D]. sc: float32
    [1, ATT_TILE] scratch, scu its uint32 view (P as the MMA's A row)."""
    for j in range(n):
        sc[0, j] = fmul(mma_f32(mma_dot(Qu, r, qo, Ku, k0 + j, ko, 0, 1, D)), scale)
    mt = sc[0, 0]
    for j in range(1, n):
        if sc[0, j] > mt:
            mt = sc[0, j]
    lt = ZERO
    for j in range(n):
        sc[0, j] = exp32(sc[0, j] - mt)
        lt = lt + sc[0, j]
    for d in range(D):
        pv[d] = mma_f32(mma_dot(scu, 0, 0, Vu, k0, ko + d, 1, 0, n))
    return mt, lt


@body
def attend_mma(Qu, Ku, Vu, out, r, h, kvh, pos, D, scale, sc, scu, pv, acc):
    """Query row r, head h (KV head kvh) at position pos over keys 0 … pos: out[r, h·D : h·D + D]."""
    qo = h * D
    ko = kvh * D
    m = ZERO
    l = ZERO
    for tix in range(pos // ATT_TILE + 1):
        k0 = tix * ATT_TILE
        mt, lt = tile_stats_mma(Qu, r, qo, Ku, Vu, ko, D, scale, k0, min(ATT_TILE, pos + 1 - k0), sc, scu, pv)
        m, l, alpha, beta = merge_stats(tix, m, l, mt, lt)
        for d in range(D):
            acc[d] = merge_value(tix, acc[d], alpha, pv[d], beta)
    for d in range(D):
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
                   np.empty(D, np.float32), np.empty(D, np.float32))


@kernel
def attention_mma_naive_k(Qu, Ku, Vu, out, start, pb, R, hq, hkv, D, scale, scratch_f, scratch_u, pv, acc):
    i = cuda.grid(1)
    if i < R * hq:
        r = i // hq
        h = i - r * hq
        attend_mma(Qu, Ku, Vu, out, r, h, h // (hq // hkv), start + pb[0] + r, D, scale, scratch_f[i:i + 1],
                   scratch_u[i:i + 1], pv[i], acc[i])


@launcher(of="attention_mma")
def attention_mma_naive(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """One thread per (row, head), the twin's body; per-thread scratch in global memory."""
    n = R * hq
    sf = scratch("attention_mma.sc", n * ATT_TILE)[:n * ATT_TILE].reshape(n, ATT_TILE)
    work = scratch("attention_mma.pv", 2 * n * D)[:2 * n * D].reshape(2, n, D)
    launch(attention_mma_naive_k, *grid1(n, 32), Q.view(np.uint32), kc.view(np.uint32), vc.view(np.uint32), out,
           start, zero_pos() if pos is None else pos, R, hq, hkv, D, np.float32(scale), sf, sf.view(np.uint32),
           work[0], work[1])


@launcher("attention_mma")
def attention_mma_cuda(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """exact-bf16 attention (see the twin); ``pos`` as in ``attention_tiled``."""
    attention_mma_naive(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)
