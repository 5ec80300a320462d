"""Split-KV CUDA attention for few query rows (decode, verify), bit-identical to the twin.

The canonical order computes, per 64-key tile at absolute positions, the tile's max score, its
``p = exp(s − m)``, ``Σp`` and ``Σ p·v`` (fma chain in key order), then merges tiles left to
right. The per-tile statistics do not depend on each other, so kernel 1 computes them for every
(row, head, tile) in parallel; kernel 2 merges them per (row, head) in tile order with the same
expressions as the single-kernel path. Used when the statistics fit ``MAX_STATS_BYTES``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .cuda import _go, attention_tiled, dot_rows, exp32, fma, fmul, merge_acc, merge_scale, zero_pos

F32 = np.float32
TILE = 64
MAX_STATS_BYTES = 256 * 1024 * 1024


@cuda.jit
def _tile_stats_k(Q, kc, vc, start, pb, hq, hkv, D, scale, stats):
    r = cuda.blockIdx.x
    h = cuda.blockIdx.y
    tix = cuda.blockIdx.z
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    pos = start + pb[0] + r
    if tix > pos // TILE:
        return
    kvh = h // (hq // hkv)
    qo = h * D
    ko = kvh * D
    sc = cuda.shared.array(TILE, np.float32)
    k0 = tix * TILE
    n = min(k0 + TILE, pos + 1) - k0
    for j in range(tid, n, nt):
        sc[j] = fmul(dot_rows(Q, r, qo, kc, k0 + j, ko, D), scale)
    cuda.syncthreads()
    mt = sc[0]
    for j in range(1, n):
        if sc[j] > mt:
            mt = sc[j]
    cuda.syncthreads()
    for j in range(tid, n, nt):
        sc[j] = exp32(sc[j] - mt)
    cuda.syncthreads()
    for d in range(tid, D, nt):
        a = F32(0.0)
        for j in range(n):
            a = fma(sc[j], vc[k0 + j, ko + d], a)
        stats[r, h, tix, 2 + d] = a
    if tid == 0:
        lt = F32(0.0)
        for j in range(n):
            lt = lt + sc[j]
        stats[r, h, tix, 0] = mt
        stats[r, h, tix, 1] = lt


@cuda.jit
def _merge_k(stats, start, pb, D, out):
    r = cuda.blockIdx.x
    h = cuda.blockIdx.y
    ntiles = (start + pb[0] + r) // TILE + 1
    for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        m = stats[r, h, 0, 0]
        l = stats[r, h, 0, 1]
        acc = stats[r, h, 0, 2 + d]
        for tix in range(1, ntiles):
            m, alpha, beta = merge_scale(m, stats[r, h, tix, 0])
            l = merge_acc(l, alpha, stats[r, h, tix, 1], beta)
            acc = merge_acc(acc, alpha, stats[r, h, tix, 2 + d], beta)
        out[r, h * D + d] = acc / l


SPLIT_MAX_ROWS = 16
_STATS = {}


def attention_split(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """Returns False (did nothing) when the per-tile statistics would not fit. With ``pos`` (the
    device-side position added to ``start``) the grid covers the cache's capacity, tiles past a
    row's position exit at once."""
    ntiles = (start + R - 1) // TILE + 1 if pos is None else (kc.shape[0] - 1) // TILE + 1
    need = R * hq * ntiles * (D + 2) * 4
    if need > MAX_STATS_BYTES:
        return False
    buf = _STATS.get("buf")
    if buf is None or buf.size < R * hq * ntiles * (D + 2):
        buf = _STATS["buf"] = cuda.device_array(max(R * hq * ntiles * (D + 2), 1 << 20), np.float32)
    stats = buf[: R * hq * ntiles * (D + 2)].reshape(R, hq, ntiles, D + 2)
    nt = max(32, min(256, ((D + 31) // 32) * 32))
    pb = zero_pos() if pos is None else pos
    _go(_tile_stats_k, (R, hq, ntiles), nt, Q, kc, vc, start, pb, hq, hkv, D, F32(scale), stats)
    _go(_merge_k, (R, hq), nt, stats, start, pb, D, out)
    return True


def attention(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """Few rows: split-KV; many rows (prime) or stats too large: one block per (row, head).
    ``pos``: an int32 [1] device array added to ``start`` (see ``cuda.rope``)."""
    if R <= SPLIT_MAX_ROWS and attention_split(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos):
        return
    attention_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)
