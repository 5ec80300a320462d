"""Fast CUDA linear layers in the canonical dot order (bit-identical to the CPU twin).

The order (``exact.dot_rows``): K in slices of 32; an fma chain from +0 inside a slice; slice
partials added left to right into an accumulator that starts at +0. Both kernels keep it:

- ``gemv`` (few rows, decode): one warp per output column; lane l computes the partials of
  slices l, l+32, …; the partials go through shared memory and are added in slice order.
- ``gemm`` (many rows, prime): 64×64 output tiles, 256 threads with 4×4 outputs each; K is
  staged through shared memory one 32-wide slice at a time, each thread's 16 slice partials are
  fma chains over the slice, then added to its accumulators.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .cuda import fma

F32 = np.float32
SLICE = 32
BM = BN = 64
TM = TN = 4
GEMV_MAX_ROWS = 4
GEMV_WARPS = 4


@cuda.jit
def _gemv_k(X, W, out, R):
    tid = cuda.threadIdx.x
    lane = tid & 31
    w = tid >> 5
    o = cuda.blockIdx.x * GEMV_WARPS + w
    N, K = W.shape
    ps = cuda.shared.array((GEMV_WARPS, 32), np.float32)
    nsl = (K + SLICE - 1) // SLICE
    for r in range(R):
        acc = F32(0.0)
        for base in range(0, nsl, 32):
            s = base + lane
            part = F32(0.0)
            if s < nsl and o < N:
                k0 = s * SLICE
                k1 = min(k0 + SLICE, K)
                for i in range(k0, k1):
                    part = fma(X[r, i], W[o, i], part)
            ps[w, lane] = part
            cuda.syncthreads()
            for src in range(min(32, nsl - base)):
                acc = acc + ps[w, src]
            cuda.syncthreads()
        if lane == 0 and o < N:
            out[r, o] = acc


@cuda.jit
def _gemm_k(X, W, out, R):
    N, K = W.shape
    As = cuda.shared.array((SLICE, BM + 1), np.float32)  # padded: no bank conflicts on stores
    Bs = cuda.shared.array((SLICE, BN + 1), np.float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * 16 + tx
    row0 = cuda.blockIdx.y * BM
    col0 = cuda.blockIdx.x * BN
    acc = cuda.local.array((TM, TN), np.float32)
    part = cuda.local.array((TM, TN), np.float32)
    a = cuda.local.array(TM, np.float32)
    b = cuda.local.array(TN, np.float32)
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = F32(0.0)
    for k0 in range(0, K, SLICE):
        kl = min(SLICE, K - k0)
        for e in range(8):
            idx = tid + e * 256
            m = idx >> 5
            kk = idx & 31
            gk = k0 + kk
            gr = row0 + m
            gc = col0 + m
            As[kk, m] = X[gr, gk] if gr < R and gk < K else F32(0.0)
            Bs[kk, m] = W[gc, gk] if gc < N and gk < K else F32(0.0)
        cuda.syncthreads()
        for i in range(TM):
            for j in range(TN):
                part[i, j] = F32(0.0)
        for kk in range(kl):
            for i in range(TM):
                a[i] = As[kk, ty * TM + i]
            for j in range(TN):
                b[j] = Bs[kk, tx * TN + j]
            for i in range(TM):
                for j in range(TN):
                    part[i, j] = fma(a[i], b[j], part[i, j])
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = acc[i, j] + part[i, j]
        cuda.syncthreads()
    for i in range(TM):
        r = row0 + ty * TM + i
        if r < R:
            for j in range(TN):
                c = col0 + tx * TN + j
                if c < N:
                    out[r, c] = acc[i, j]


def gemv(X, W, out, R):
    N = W.shape[0]
    _gemv_k[(N + GEMV_WARPS - 1) // GEMV_WARPS, 32 * GEMV_WARPS](X, W, out, R)


def gemm(X, W, out, R):
    N = W.shape[0]
    grid = ((N + BN - 1) // BN, (R + BM - 1) // BM)
    _gemm_k[grid, (16, 16)](X, W, out, R)


def linear(X, W, out, R):
    """out[r, o] = dot(X[r, :K], W[o, :K]) for r < R, canonical order."""
    if R <= GEMV_MAX_ROWS:
        gemv(X, W, out, R)
    else:
        gemm(X, W, out, R)
