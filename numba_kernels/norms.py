"""Zero-centred RMS norms: ``rmsnorm`` (rows), ``add_rmsnorm`` (the residual add in place, its
NaN/Inf flag, then rmsnorm: one launch for three), ``head_rmsnorm`` (per head, q/k norms) and
``gated_rmsnorm`` (the DeltaNet's output norm, ``norm(x)·w·silu(z)``).

Per row (or head) of n values: ``inv = 1 / sqrt(dot(x, x) / n + eps)`` in float32 (``eps``
rounded to float32 first, whatever the caller passes), the dot in the canonical order; then each
output is ``x·inv·(1 + w)`` (``norm_span``) or ``x·inv·w·silu(z)`` (``gated_norm_head``).

CUDA: one block per row (``rmsnorm``, ``add_rmsnorm``: :func:`slice_norm_row`) or one warp per
(row, head) (the head norms: :func:`warp_sumsq`). Both compute the canonical dot with a thread per
slice: a warp loads 32 slices coalesced (lane l: value l of each), transposes them through shared
memory, and lane l runs slice l's fma chain; the partials are added in slice order -- the same
operations in the same order as one thread doing it all. Then every thread writes its share of
the outputs. The row norms size the block to the row (a warp per 32 slices, up to RMS_THREADS
threads) and keep the row's sums and weights in registers from the loads to the outputs.
"""

from __future__ import annotations

import numpy as np

from .elementwise import nonfinite
from .exact import F32, ONE, SLICE, ZERO, add_partial, add_partials, dot_rows, silu32
from .tags import barrier, block_size, body, cuda, fma, fmul, kernel, launch, launcher, sqrt32, syncwarp, twin

HEAD_THREADS = 32  # a head norm's block: one warp (warp_sumsq)
RMS_THREADS = 256  # the row norms' largest block: a thread per slice, rows of more slices in passes (block_size: 32 under the simulator)
PS_WORDS = 513  # a row norm's shared partials: one per thread of the largest block, and the total
WARP_SLICES = 32 * SLICE  # the values of a warp's slices: a row norm's block has a warp per WARP_SLICES values
TILE_WORDS = 32 * (SLICE + 1)  # a warp's transpose tile (rows padded by one word: conflict-free both ways)
ROW_TILES = (RMS_THREADS // 32) * TILE_WORDS
assert PS_WORDS > RMS_THREADS


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
def warp_sumsq(X, r, off, n, T, lane):
    """Σ X[r, off + i]² over i < n in the canonical dot order, computed by one warp (this lane
    ``lane``) and returned to all its lanes: per WARP_SLICES values, lane l loads value l of each
    of the 32 slices (coalesced), the warp transposes them through ``T`` (shared float32
    [TILE_WORDS]: 32 × 33 words) so that lane l runs slice l's fma chain (values past n are
    zeros: fma(0, 0, p) = p), and every lane adds the partials in slice order
    (:func:`add_partials8`). Every lane of the warp must call it (it holds warp barriers)."""
    acc = ZERO
    x = cuda.local.array(SLICE, np.float32)
    for c0 in range(0, n, WARP_SLICES):
        for e in range(SLICE):
            i = c0 + e * SLICE + lane
            x[e] = X[r, off + i] if i < n else ZERO
        for e in range(SLICE):
            T[e * (SLICE + 1) + lane] = x[e]
        syncwarp()
        part = ZERO
        for e in range(SLICE):
            y = T[lane * (SLICE + 1) + e]
            part = fma(y, y, part)
        syncwarp()
        T[lane] = part
        syncwarp()
        acc = add_partials8(acc, T, min(SLICE, (n - c0 + SLICE - 1) // SLICE))
        syncwarp()
    return acc


@body
def norm_val(x, inv, w):
    """One zero-centred norm output: x·inv·(1 + w)."""
    return fmul(fmul(x, inv), ONE + w)


@body
def norm_span(X, r, xo, n, w, inv, out, oo, i0, step):
    """out[r, oo + i] = X[r, xo + i]·inv·(1 + w[i]) for i in range(i0, n, step)."""
    for i in range(i0, n, step):
        out[r, oo + i] = norm_val(X[r, xo + i], inv, w[i])


@body
def norm_head(X, xo, D, w, eps, out, r, h):
    """Head h of row r: X[r, xo + h·D : …] normalised into out[r, h·D : (h+1)·D]."""
    off = xo + h * D
    norm_span(X, r, off, D, w, rms_inv(X, r, off, D, eps), out, h * D, 0, 1)


@body
def gated_span(X, Z, zo, D, w, inv, out, r, h, i0, step):
    """out[r, c] = x·inv·w[i]·silu(Z[r, zo + c]) for c = h·D + i, i in range(i0, D, step)."""
    o = h * D
    for i in range(i0, D, step):
        c = o + i
        out[r, c] = fmul(fmul(fmul(X[r, c], inv), w[i]), silu32(Z[r, zo + c]))


@body
def gated_norm_head(X, Z, zo, D, w, eps, out, r, h):
    """Head h of row r, gated (:func:`gated_span`)."""
    gated_span(X, Z, zo, D, w, rms_inv(X, r, h * D, D, eps), out, r, h, 0, 1)


@body
def add_partials8(acc, parts, m):
    """:func:`add_partials` with the loads of eight partials issued before their adds (the
    same additions in the same order)."""
    s = 0
    while s + 8 <= m:
        p0, p1, p2, p3 = parts[s], parts[s + 1], parts[s + 2], parts[s + 3]
        p4, p5, p6, p7 = parts[s + 4], parts[s + 5], parts[s + 6], parts[s + 7]
        acc = add_partial(add_partial(add_partial(add_partial(acc, p0), p1), p2), p3)
        acc = add_partial(add_partial(add_partial(add_partial(acc, p4), p5), p6), p7)
        s += 8
    return add_partials(acc, parts[s:], m - s)


@body
def slice_norm_row(X, D, add, w, eps, out, oo, r, t, nt, ps, T, N):
    """Row r of the CUDA ``rmsnorm`` (``add`` False) or ``add_rmsnorm`` (``add`` True: X[r] +=
    D[r] first) by the ``nt`` threads of one block (a multiple of 32), this one ``t``; returns
    whether this thread saw a non-finite sum. A pass covers ``nt`` slices, a warp 32 of them
    (WARP_SLICES values): lane l loads value l of each (coalesced: x, d and w together), adds and
    writes the sums back, and the warp transposes them through its shared tile ``T`` (32 × 33
    words a warp) so that lane l runs the fma chain of slice l, value by value; thread 0 adds
    the pass's partials in slice order (:func:`add_partials8`) -- the canonical dot, as
    :func:`rms_inv` (values past N are zeros: fma(0, 0, p) = p). In a one-pass row the outputs
    come from the same registers; otherwise each pass's values are read again. ``ps``: shared
    float32 [PS_WORDS] (more than ``nt``). Every thread of the block calls it (barriers)."""
    lane = t & 31
    tb = (t >> 5) * TILE_WORDS
    ns = (N + SLICE - 1) // SLICE
    per = nt * SLICE
    one = N <= per  # one pass: the row's values stay in registers for the outputs
    v = cuda.local.array(SLICE, np.float32)
    wv = cuda.local.array(SLICE, np.float32)
    bad = False
    acc = ZERO
    for c0 in range(0, N, per):
        base = c0 + (t - lane) * SLICE + lane
        for e in range(SLICE):
            i = base + e * SLICE
            v[e] = X[r, i] if i < N else ZERO
        if add:
            for e in range(SLICE):
                i = base + e * SLICE
                wv[e] = D[r, i] if i < N else ZERO
            for e in range(SLICE):
                i = base + e * SLICE
                v[e] = v[e] + wv[e]
                if i < N:
                    X[r, i] = v[e]
                    if nonfinite(v[e]):
                        bad = True
        if one:
            for e in range(SLICE):
                i = base + e * SLICE
                wv[e] = w[i] if i < N else ZERO
        for e in range(SLICE):
            T[tb + e * (SLICE + 1) + lane] = v[e]
        syncwarp()
        part = ZERO
        for e in range(SLICE):
            y = T[tb + lane * (SLICE + 1) + e]
            part = fma(y, y, part)
        ps[t] = part
        barrier()
        if t == 0:
            acc = add_partials8(acc, ps, min(nt, ns - c0 // SLICE))
        barrier()
    if t == 0:
        ps[nt] = acc
    barrier()
    inv = rms_scale(ps[nt], N, eps)
    for c0 in range(0, N, per):
        base = c0 + (t - lane) * SLICE + lane
        for e in range(SLICE):
            i = base + e * SLICE
            if i < N:
                if one:
                    out[r, oo + i] = norm_val(v[e], inv, wv[e])
                else:
                    out[r, oo + i] = norm_val(X[r, i], inv, w[i])
    return bad


@twin("rmsnorm")
def rmsnorm_cpu(X, w, eps, out, oo, R):
    """Zero-centred RMSNorm over rows of X: [≥R, N]: out[r, oo + i] = x·inv·(1 + w)."""
    N = X.shape[1]
    for r in range(R):
        norm_span(X, r, 0, N, w, rms_inv(X, r, 0, N, eps), out, oo, 0, 1)


@kernel
def rmsnorm_k(X, w, eps, out, oo, R):
    """One block per row (:func:`slice_norm_row`, no add)."""
    ps = cuda.shared.array(PS_WORDS, np.float32)
    T = cuda.shared.array(ROW_TILES, np.float32)  # (each on its own line: the simulator keys them by line)
    slice_norm_row(X, X, False, w, eps, out, oo, cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, ps, T, X.shape[1])


@launcher("rmsnorm")
def rmsnorm_cuda(X, w, eps, out, oo, R):
    """One block per row."""
    launch(rmsnorm_k, R, block_size(min(RMS_THREADS, (X.shape[1] + WARP_SLICES - 1) // WARP_SLICES * 32)), X, w, F32(eps), out, oo, R)


@body
def add_span(X, D, r, i0, n, step):
    """X[r, i] = X[r, i] + D[r, i] for i in range(i0, n, step) (the residual add, in place);
    returns whether any of those sums is NaN or ±inf."""
    bad = False
    for i in range(i0, n, step):
        v = X[r, i] + D[r, i]
        X[r, i] = v
        if nonfinite(v):
            bad = True
    return bad


@twin("add_rmsnorm")
def add_rmsnorm_cpu(X, D, w, eps, out, oo, R, flags, slot):
    """The residual add and the RMSNorm after it, in one op: X[r] += D[r] (in place), then
    out[r, oo + i] = rmsnorm(X[r]) -- the same operations as ``add`` then ``rmsnorm``. With
    ``slot >= 0``, also ``nonfinite_flag(X, R, flags, slot)`` on the sums (``flags[slot] = 1``
    when one is NaN or ±inf); ``slot < 0`` leaves ``flags`` alone."""
    N = X.shape[1]
    for r in range(R):
        if add_span(X, D, r, 0, N, 1) and slot >= 0:
            flags[slot] = 1
        norm_span(X, r, 0, N, w, rms_inv(X, r, 0, N, eps), out, oo, 0, 1)


@kernel
def add_rmsnorm_k(X, D, w, eps, out, oo, R, flags, slot):
    """One block per row (:func:`slice_norm_row` with the add)."""
    ps = cuda.shared.array(PS_WORDS, np.float32)
    T = cuda.shared.array(ROW_TILES, np.float32)
    if slice_norm_row(X, D, True, w, eps, out, oo, cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, ps, T,
                      X.shape[1]) and slot >= 0:
        flags[slot] = 1


@launcher("add_rmsnorm")
def add_rmsnorm_cuda(X, D, w, eps, out, oo, R, flags, slot):
    """One block per row."""
    launch(add_rmsnorm_k, R, block_size(min(RMS_THREADS, (X.shape[1] + WARP_SLICES - 1) // WARP_SLICES * 32)), X, D, w, F32(eps), out, oo, R, flags, slot)


@twin("head_rmsnorm")
def head_rmsnorm_cpu(X, xo, heads, D, w, eps, out, R):
    """Zero-centred RMSNorm per head of X[:, xo + h·D : xo + (h+1)·D] into out[:, h·D : ...]."""
    for r in range(R):
        for h in range(heads):
            norm_head(X, xo, D, w, eps, out, r, h)


@kernel
def head_rmsnorm_k(X, xo, heads, D, w, eps, out, R):
    """One warp per (row, head) (:func:`warp_sumsq`)."""
    b = cuda.blockIdx.x
    r = b // heads
    h = b - r * heads
    T = cuda.shared.array(TILE_WORDS, np.float32)
    off = xo + h * D
    inv = rms_scale(warp_sumsq(X, r, off, D, T, cuda.threadIdx.x), D, eps)
    norm_span(X, r, off, D, w, inv, out, h * D, cuda.threadIdx.x, 32)


@launcher("head_rmsnorm")
def head_rmsnorm_cuda(X, xo, heads, D, w, eps, out, R):
    """One warp per (row, head)."""
    if R * heads:
        launch(head_rmsnorm_k, R * heads, HEAD_THREADS, X, xo, heads, D, w, F32(eps), out, R)


@twin("gated_rmsnorm")
def gated_rmsnorm_cpu(X, Z, zo, heads, D, w, eps, out, R):
    """Per head h: out[r, h·D + i] = x·inv·w[i]·silu(Z[r, zo + h·D + i]) over X[r, h·D : (h+1)·D]."""
    for r in range(R):
        for h in range(heads):
            gated_norm_head(X, Z, zo, D, w, eps, out, r, h)


@kernel
def gated_rmsnorm_k(X, Z, zo, heads, D, w, eps, out, R):
    """One warp per (row, head) (:func:`warp_sumsq`)."""
    b = cuda.blockIdx.x
    r = b // heads
    h = b - r * heads
    T = cuda.shared.array(TILE_WORDS, np.float32)
    inv = rms_scale(warp_sumsq(X, r, h * D, D, T, cuda.threadIdx.x), D, eps)
    gated_span(X, Z, zo, D, w, inv, out, r, h, cuda.threadIdx.x, 32)


@launcher("gated_rmsnorm")
def gated_rmsnorm_cuda(X, Z, zo, heads, D, w, eps, out, R):
    """One warp per (row, head)."""
    if R * heads:
        launch(gated_rmsnorm_k, R * heads, HEAD_THREADS, X, Z, zo, heads, D, w, F32(eps), out, R)
