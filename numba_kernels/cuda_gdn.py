"""Fast CUDA gated-delta-rule recurrence, bit-identical to ``exact.gdn_column``.

A state column S[h, :, j] (dk values) is split by the canonical dot slices: thread (s, j) keeps
rows s·32 … s·32+31 of column j in registers/local memory for all T tokens. Per token the
block shares k and q through shared memory; each thread's slice partial of ``Sᵀk`` (and later
``Sᵀq``) is an fma chain over its rows, and every thread of the column adds the partials in
slice order from +0 — exactly ``dot_col``. Grid: (value head, group of ``COLS`` columns);
block: (slices, ``COLS``) threads.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .cuda import _go, exp32, fma, fmul

F32 = np.float32
SLICE = 32
COLS = 32
MAX_DK = 256
MAX_SLICES = MAX_DK // SLICE


@cuda.jit
def _gdn_fast_k(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    h = cuda.blockIdx.x
    s = cuda.threadIdx.x  # slice
    jl = cuda.threadIdx.y
    j = cuda.blockIdx.y * COLS + jl
    nsl = cuda.blockDim.x
    hk = h // vpk
    ko = hk * dk
    ks = cuda.shared.array(MAX_DK, np.float32)
    qs = cuda.shared.array(MAX_DK, np.float32)
    ps = cuda.shared.array((MAX_SLICES, COLS), np.float32)
    st = cuda.local.array(SLICE, np.float32)
    i0 = s * SLICE
    n = min(SLICE, dk - i0)
    live = j < dv
    if live:
        for ii in range(n):
            st[ii] = S[h, i0 + ii, j]
    tid = jl * nsl + s
    nthreads = nsl * COLS
    for t in range(R):
        for i in range(tid, dk, nthreads):
            ks[i] = Kn[t, ko + i]
            qs[i] = Qn[t, ko + i]
        cuda.syncthreads()
        eg = exp32(g[t, h])
        part = F32(0.0)
        if live:
            for ii in range(n):
                st[ii] = fmul(st[ii], eg)
            for ii in range(n):
                part = fma(st[ii], ks[i0 + ii], part)
        ps[s, jl] = part
        cuda.syncthreads()
        kv = F32(0.0)
        for q in range(nsl):
            kv = kv + ps[q, jl]
        cuda.syncthreads()
        part = F32(0.0)
        if live:
            delta = fmul(V[t, vo + h * dv + j] - kv, beta[t, h])
            for ii in range(n):
                st[ii] = fma(ks[i0 + ii], delta, st[ii])
            for ii in range(n):
                part = fma(st[ii], qs[i0 + ii], part)
            if capture:
                for ii in range(n):
                    cap[t, h, i0 + ii, j] = st[ii]
        ps[s, jl] = part
        cuda.syncthreads()
        if live and s == 0:
            o = F32(0.0)
            for q in range(nsl):
                o = o + ps[q, jl]
            out[t, h * dv + j] = o
        cuda.syncthreads()
    if live:
        for ii in range(n):
            S[h, i0 + ii, j] = st[ii]


def gdn_recurrence(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    """Same contract as the CPU twin's ``gdn_recurrence``."""
    nv = S.shape[0]
    nsl = (dk + SLICE - 1) // SLICE
    if dk > MAX_DK:
        raise ValueError(f"linear_key_head_dim {dk} > {MAX_DK} is not supported by the CUDA recurrence")
    grid = (nv, (dv + COLS - 1) // COLS)
    _go(_gdn_fast_k, grid, (nsl, COLS), Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture)
