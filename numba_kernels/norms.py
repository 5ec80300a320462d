"""Zero-centred RMS norms: ``rmsnorm`` (rows), ``head_rmsnorm`` (per head, q/k norms) and
``gated_rmsnorm`` (the DeltaNet's output norm, ``norm(x)·w·silu(z)``).

Per row (or head) of n values: ``inv = 1 / sqrt(dot(x, x) / n + eps)`` in float32 (``eps``
rounded to float32 first, whatever the caller passes), the dot in the canonical order; then each
output is ``x·inv·(1 + w)`` (``norm_span``) or ``x·inv·w·silu(z)`` (``gated_norm_head``).

CUDA: ``rmsnorm`` runs one block per row (the slice partials of the row's dot in parallel, added
in slice order by one thread); the head norms one thread per (row, head), like the twins' loops.
"""

from __future__ import annotations

import numpy as np

from .exact import F32, ONE, SLICE, ZERO, add_partials, dot_rows, fma_chain, silu32
from .tags import body, cuda, fmul, grid1, kernel, launch, launcher, sqrt32, twin

RMS_MAX_SLICES = 1024  # rows of up to 32768 get their slice partials in parallel
RMS_THREADS = 128


@body
def rms_scale(ss, n, eps):
    """1 / sqrt(ss / n + eps) in float32 (``ss``: the canonical dot of a row with itself)."""
    return ONE / sqrt32(ss / F32(n) + F32(eps))


@body
def rms_inv(X, r, off, n, eps):
    """1 / sqrt(mean(x²) + eps) over X[r, off:off+n], all in float32: ``eps`` is rounded to
    float32 first (a Python float would make the CPU twin add, sqrt and divide in float64)."""
    return rms_scale(dot_rows(X, r, off, X, r, off, n), n, eps)


@body
def norm_span(X, r, xo, n, w, inv, out, oo, i0, step):
    """out[r, oo + i] = X[r, xo + i]·inv·(1 + w[i]) for i in range(i0, n, step)."""
    for i in range(i0, n, step):
        out[r, oo + i] = fmul(fmul(X[r, xo + i], inv), ONE + w[i])


@body
def norm_head(X, xo, D, w, eps, out, r, h):
    """Head h of row r: X[r, xo + h·D : …] normalised into out[r, h·D : (h+1)·D]."""
    off = xo + h * D
    norm_span(X, r, off, D, w, rms_inv(X, r, off, D, eps), out, h * D, 0, 1)


@body
def gated_norm_head(X, Z, zo, D, w, eps, out, r, h):
    """out[r, c] = x·inv·w[i]·silu(Z[r, zo + c]) for c = h·D + i over head h of row r."""
    o = h * D
    inv = rms_inv(X, r, o, D, eps)
    for i in range(D):
        c = o + i
        out[r, c] = fmul(fmul(fmul(X[r, c], inv), w[i]), silu32(Z[r, zo + c]))


@twin("rmsnorm")
def rmsnorm_cpu(X, w, eps, out, oo, R):
    """Zero-centred RMSNorm over rows of X: [≥R, N]: out[r, oo + i] = x·inv·(1 + w)."""
    N = X.shape[1]
    for r in range(R):
        norm_span(X, r, 0, N, w, rms_inv(X, r, 0, N, eps), out, oo, 0, 1)


@kernel
def rmsnorm_k(X, w, eps, out, oo, R):
    """One block per row. The canonical dot of the row with itself: the block's threads compute
    the slice partials, then one thread adds them left to right -- the same operations in the
    same order as one thread doing it all."""
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    inv_s = cuda.shared.array(1, np.float32)
    ps = cuda.shared.array(RMS_MAX_SLICES, np.float32)
    N = X.shape[1]
    nsl = (N + SLICE - 1) // SLICE
    if nsl <= RMS_MAX_SLICES:
        for s in range(tid, nsl, nt):
            k0 = s * SLICE
            ps[s] = fma_chain(X[r, k0:], X[r, k0:], min(SLICE, N - k0), 0)
        cuda.syncthreads()
        if tid == 0:
            inv_s[0] = rms_scale(add_partials(ZERO, ps, nsl), N, eps)
    elif tid == 0:
        inv_s[0] = rms_inv(X, r, 0, N, eps)
    cuda.syncthreads()
    norm_span(X, r, 0, N, w, inv_s[0], out, oo, tid, nt)


@launcher("rmsnorm")
def rmsnorm_cuda(X, w, eps, out, oo, R):
    """One block per row."""
    launch(rmsnorm_k, R, RMS_THREADS, X, w, F32(eps), out, oo, R)


@twin("head_rmsnorm")
def head_rmsnorm_cpu(X, xo, heads, D, w, eps, out, R):
    """Zero-centred RMSNorm per head of X[:, xo + h·D : xo + (h+1)·D] into out[:, h·D : ...]."""
    for r in range(R):
        for h in range(heads):
            norm_head(X, xo, D, w, eps, out, r, h)


@kernel
def head_rmsnorm_k(X, xo, heads, D, w, eps, out, R):
    i = cuda.grid(1)
    if i < R * heads:
        r = i // heads
        norm_head(X, xo, D, w, eps, out, r, i - r * heads)


@launcher("head_rmsnorm")
def head_rmsnorm_cuda(X, xo, heads, D, w, eps, out, R):
    """One thread per (row, head)."""
    launch(head_rmsnorm_k, *grid1(R * heads, 32), X, xo, heads, D, w, F32(eps), out, R)


@twin("gated_rmsnorm")
def gated_rmsnorm_cpu(X, Z, zo, heads, D, w, eps, out, R):
    """Per head h: out[r, h·D + i] = x·inv·w[i]·silu(Z[r, zo + h·D + i]) over X[r, h·D : (h+1)·D]."""
    for r in range(R):
        for h in range(heads):
            gated_norm_head(X, Z, zo, D, w, eps, out, r, h)


@kernel
def gated_rmsnorm_k(X, Z, zo, heads, D, w, eps, out, R):
    i = cuda.grid(1)
    if i < R * heads:
        r = i // heads
        gated_norm_head(X, Z, zo, D, w, eps, out, r, i - r * heads)


@launcher("gated_rmsnorm")
def gated_rmsnorm_cuda(X, Z, zo, heads, D, w, eps, out, R):
    """One thread per (row, head)."""
    launch(gated_rmsnorm_k, *grid1(R * heads, 32), X, Z, zo, heads, D, w, F32(eps), out, R)
