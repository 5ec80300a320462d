"""Zero-centred RMS norms: ``rmsnorm`` (rows), ``add_rmsnorm`` (the residual add in place, its
NaN/Inf flag, then rmsnorm: one launch for three), ``head_rmsnorm`` (per head, q/k norms) and
``gated_rmsnorm`` (the DeltaNet's output norm, ``norm(x)·w·silu(z)``).

Per row (or head) of n values: ``inv = 1 / sqrt(dot(x, x) / n + eps)`` in float32 (``eps``
rounded to float32 first, whatever the caller passes), the dot in the canonical order; then each
output is ``x·inv·(1 + w)`` (``norm_span``) or ``x·inv·w·silu(z)`` (``gated_norm_head``).

CUDA: one block per row (``rmsnorm``) or per (row, head) (the head norms). The block computes
the canonical dot with :func:`block_sumsq`: thread t runs slice t's fma chain straight from
global memory (a full slice's 32 loads unrolled and issued together), the partials meet in
shared memory, and thread 0 adds them in slice order -- the same operations in the same order as
one thread doing it all. Then every thread writes its share of the outputs.
"""

from __future__ import annotations

import numpy as np

from .elementwise import nonfinite
from .mma_gemm import PACK_ERROR, bf16_pair, pack_span
from .exact import F32, ONE, SLICE, ZERO, add_partials, dot_rows, fma_chain, silu32
from .tags import barrier, block_size, body, cuda, fmul, kernel, launch, launcher, pdl_trigger, sqrt32, twin

NORM_THREADS = 128  # a head norm's block: heads of 64-256 values (block_size: 32 under the simulator)
RMS_THREADS = 512  # rmsnorm's block: a row, few outputs per thread (block_size: 32 under the simulator)
PS_WORDS = 513  # block_sumsq's shared partials: one per thread of the largest block, and the total
assert PS_WORDS > max(NORM_THREADS + 1, RMS_THREADS)


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
def sq_chain(X, r, k0, n):
    """Σ X[r, k0 + e]² over e < n (n ≤ SLICE): :func:`fma_chain` of the row with itself, one
    slice partial of the canonical dot; a full slice called with the constant SLICE, so its loop
    unrolls and its loads issue before the chain."""
    row = X[r, k0:]
    if n == SLICE:
        return fma_chain(row, row, SLICE, 0)
    return fma_chain(row, row, n, 0)


@body
def block_sumsq(X, r, off, n, ps, tid, nt):
    """Σ X[r, off + i]² over i < n in the canonical dot order, computed by the ``nt`` threads of
    one block (this one is ``tid``) and returned to all of them: thread t runs slice t's chain
    (``nt`` slices a pass), thread 0 adds the partials in slice order. ``ps``: shared float32
    [PS_WORDS] (more than ``nt``). Every thread of the block must call it (it holds barriers)."""
    acc = ZERO
    per = nt * SLICE
    for c0 in range(0, n, per):
        k = c0 + tid * SLICE
        if k < n:
            ps[tid] = sq_chain(X, r, off + k, min(SLICE, n - k))
        barrier()
        if tid == 0:
            acc = add_partials(acc, ps, (min(per, n - c0) + SLICE - 1) // SLICE)
        barrier()
    if tid == 0:
        ps[nt] = acc
    barrier()
    return ps[nt]


@body
def block_sumsq2(X, r, off1, off2, n, ps, tid, nt):
    """(Σ X[r, off1 + i]², Σ X[r, off2 + i]²) over i < n, side by side: the block's first half
    runs :func:`block_sumsq`'s passes for the first sum with ``nt / 2`` threads (partials in
    ps[0 ..]), its second half for the second (ps[nt / 2 ..]); a pass's partials are added left to
    right into one accumulator whatever the pass width, so each sum is the one block_sumsq
    returns. ``nt`` even; ``ps`` holds nt + 2 words (the sums at ps[nt], ps[nt + 1])."""
    half = nt >> 1
    second = tid >= half
    t = tid - half if second else tid
    off = off2 if second else off1
    base = half if second else 0
    acc = ZERO
    per = half * SLICE
    for c0 in range(0, n, per):
        k = c0 + t * SLICE
        if k < n:
            ps[base + t] = sq_chain(X, r, off + k, min(SLICE, n - k))
        barrier()
        if t == 0:
            acc = add_partials(acc, ps[base:], (min(per, n - c0) + SLICE - 1) // SLICE)
        barrier()
    if t == 0:
        ps[nt + (1 if second else 0)] = acc
    barrier()
    return ps[nt], ps[nt + 1]


@body
def norm_val(x, inv, w):
    """One zero-centred norm output: x·inv·(1 + w)."""
    return fmul(fmul(x, inv), ONE + w)


@body
def norm_span4(X, r, xo, n, w, inv, out, oo, i0, step):
    """:func:`norm_span` by one thread of a block, four items at a time: the four x and w loads
    issued before the four stores (a store may alias a later load, so the compiler would not move
    the loads up itself); the same outputs. Unsigned indices: no negative-index wrap code."""
    ru, xu, ou, nu, su = np.uint64(r), np.uint64(xo), np.uint64(oo), np.uint64(n), np.uint64(step)
    i = np.uint64(i0)
    while i < nu:
        i1 = i + su
        i2 = i1 + su
        i3 = i2 + su
        x0, w0 = X[ru, xu + i], w[i]
        x1, w1 = (X[ru, xu + i1], w[i1]) if i1 < nu else (ZERO, ZERO)
        x2, w2 = (X[ru, xu + i2], w[i2]) if i2 < nu else (ZERO, ZERO)
        x3, w3 = (X[ru, xu + i3], w[i3]) if i3 < nu else (ZERO, ZERO)
        out[ru, ou + i] = norm_val(x0, inv, w0)
        if i1 < nu:
            out[ru, ou + i1] = norm_val(x1, inv, w1)
        if i2 < nu:
            out[ru, ou + i2] = norm_val(x2, inv, w2)
        if i3 < nu:
            out[ru, ou + i3] = norm_val(x3, inv, w3)
        i = i3 + su


@body
def norm_span(X, r, xo, n, w, inv, out, oo, i0, step):
    """out[r, oo + i] = X[r, xo + i]·inv·(1 + w[i]) for i in range(i0, n, step)."""
    for i in range(i0, n, step):
        out[r, oo + i] = norm_val(X[r, xo + i], inv, w[i])


@body
def norm_pairs(X, r, n, w, inv, out, oo, xp, i0, step):
    """:func:`norm_span`'s outputs of row r (X from column 0) two at a time -- the pairs (2i, 2i + 1)
    for i in range(i0, n/2, step) -- each pair also packed into xp[r, oo/2 + i] (:func:`bf16_pair`):
    the packed output in the same pass, no barrier and no second read (oo and n even)."""
    ru, ou, ju, su = np.uint64(r), np.uint64(oo), np.uint64(oo >> 1), np.uint64(step)
    i = np.uint64(i0)
    while i < np.uint64(n >> 1):
        k = i + i
        o0 = norm_val(X[ru, k], inv, w[k])
        o1 = norm_val(X[ru, k + np.uint64(1)], inv, w[k + np.uint64(1)])
        out[ru, ou + k] = o0
        out[ru, ou + k + np.uint64(1)] = o1
        xp[ru, ju + i] = bf16_pair(o0, o1)
        i += su


@body
def norm_head(X, xo, D, w, eps, out, r, h):
    """Head h of row r: X[r, xo + h·D : …] normalised into out[r, h·D : (h+1)·D]."""
    off = xo + h * D
    norm_span(X, r, off, D, w, rms_inv(X, r, off, D, eps), out, h * D, 0, 1)


@body
def gated_val(x, inv, w, z):
    """One gated norm output: x·inv·w·silu(z)."""
    return fmul(fmul(fmul(x, inv), w), silu32(z))


@body
def gated_span(X, Z, zo, D, w, inv, out, r, h, i0, step):
    """out[r, c] = x·inv·w[i]·silu(Z[r, zo + c]) for c = h·D + i, i in range(i0, D, step)."""
    ru = np.uint64(r)
    o = np.uint64(h * D)
    zc = np.uint64(zo + h * D)
    i = np.uint64(i0)
    while i < np.uint64(D):  # unsigned: no negative-index wrap code (see conv_at)
        out[ru, o + i] = gated_val(X[ru, o + i], inv, w[i], Z[ru, zc + i])
        i += np.uint64(step)


@body
def gated_pairs(X, Z, zo, D, w, inv, out, xp, r, h, i0, step):
    """:func:`gated_span`'s outputs two at a time (the head's pairs (2i, 2i + 1), i in
    range(i0, D/2, step)), each pair also packed into xp (:func:`bf16_pair`; D even)."""
    ru, su = np.uint64(r), np.uint64(step)
    o = np.uint64(h * D)
    zc = np.uint64(zo + h * D)
    j0 = np.uint64((h * D) >> 1)
    i = np.uint64(i0)
    while i < np.uint64(D >> 1):
        k = i + i
        k1 = k + np.uint64(1)
        v0 = gated_val(X[ru, o + k], inv, w[k], Z[ru, zc + k])
        v1 = gated_val(X[ru, o + k1], inv, w[k1], Z[ru, zc + k1])
        out[ru, o + k] = v0
        out[ru, o + k1] = v1
        xp[ru, j0 + i] = bf16_pair(v0, v1)
        i += su


@body
def gated_norm_head(X, Z, zo, D, w, eps, out, r, h):
    """Head h of row r, gated (:func:`gated_span`)."""
    gated_span(X, Z, zo, D, w, rms_inv(X, r, h * D, D, eps), out, r, h, 0, 1)


@twin("rmsnorm")
def rmsnorm_cpu(X, w, eps, out, oo, R, xp=None):
    """Zero-centred RMSNorm over rows of X: [≥R, N]: out[r, oo + i] = x·inv·(1 + w). ``xp``
    (optional, uint32 [≥R, ≥(oo + N)/2]; oo and N even): each output pair's bf16 bits packed
    there too (:func:`pack_span`: exact-bf16's GEMM input, no packing launch of its own)."""
    N = X.shape[1]
    if xp is not None:
        if oo % 2 != 0 or N % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < oo + N:
            raise ValueError(PACK_ERROR)
    for r in range(R):
        norm_span(X, r, 0, N, w, rms_inv(X, r, 0, N, eps), out, oo, 0, 1)
        if xp is not None:
            pack_span(out, r, oo, N, xp, 0, 1)


@kernel
def rmsnorm_k(X, w, eps, out, oo, R, xp):
    """One block per row (:func:`block_sumsq`); with ``xp`` (None: not) the outputs a pair a
    thread at a time, each pair packed as it is stored (:func:`norm_pairs`)."""
    pdl_trigger()  # a GEMV launched with PDL after this kernel may start now (launch.launch)
    r = cuda.blockIdx.x
    ps = cuda.shared.array(PS_WORDS, np.float32)
    N = X.shape[1]
    inv = rms_scale(block_sumsq(X, r, 0, N, ps, cuda.threadIdx.x, cuda.blockDim.x), N, eps)
    if xp is None:
        norm_span4(X, r, 0, N, w, inv, out, oo, cuda.threadIdx.x, cuda.blockDim.x)
    else:
        norm_pairs(X, r, N, w, inv, out, oo, xp, cuda.threadIdx.x, cuda.blockDim.x)


@launcher("rmsnorm")
def rmsnorm_cuda(X, w, eps, out, oo, R, xp=None):
    """One block per row."""
    if xp is not None:
        if oo % 2 != 0 or X.shape[1] % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < oo + X.shape[1]:
            raise ValueError(PACK_ERROR)
    launch(rmsnorm_k, R, block_size(RMS_THREADS), X, w, F32(eps), out, oo, R, xp)


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


@body
def add_span4(X, D, r, i0, n, step):
    """:func:`add_span` by one thread of a block, four items at a time (the loads of four sums
    issued before their stores, as :func:`norm_span4`); the same sums and flag. Unsigned indices."""
    bad = False
    ru, nu, su = np.uint64(r), np.uint64(n), np.uint64(step)
    i = np.uint64(i0)
    while i < nu:
        i1 = i + su
        i2 = i1 + su
        i3 = i2 + su
        x0, d0 = X[ru, i], D[ru, i]
        x1, d1 = (X[ru, i1], D[ru, i1]) if i1 < nu else (ZERO, ZERO)
        x2, d2 = (X[ru, i2], D[ru, i2]) if i2 < nu else (ZERO, ZERO)
        x3, d3 = (X[ru, i3], D[ru, i3]) if i3 < nu else (ZERO, ZERO)
        v0, v1, v2, v3 = x0 + d0, x1 + d1, x2 + d2, x3 + d3
        X[ru, i] = v0
        if i1 < nu:
            X[ru, i1] = v1
        if i2 < nu:
            X[ru, i2] = v2
        if i3 < nu:
            X[ru, i3] = v3
        if nonfinite(v0) or nonfinite(v1) or nonfinite(v2) or nonfinite(v3):
            bad = True
        i = i3 + su
    return bad


@twin("add_rmsnorm")
def add_rmsnorm_cpu(X, D, w, eps, out, oo, R, flags, slot, xp=None):
    """The residual add and the RMSNorm after it, in one op: X[r] += D[r] (in place), then
    out[r, oo + i] = rmsnorm(X[r]) -- the same operations as ``add`` then ``rmsnorm``. With
    ``slot >= 0``, also ``nonfinite_flag(X, R, flags, slot)`` on the sums (``flags[slot] = 1``
    when one is NaN or ±inf); ``slot < 0`` leaves ``flags`` alone. ``xp``: as rmsnorm's."""
    N = X.shape[1]
    if xp is not None:
        if oo % 2 != 0 or N % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < oo + N:
            raise ValueError(PACK_ERROR)
    for r in range(R):
        if add_span(X, D, r, 0, N, 1) and slot >= 0:
            flags[slot] = 1
        norm_span(X, r, 0, N, w, rms_inv(X, r, 0, N, eps), out, oo, 0, 1)
        if xp is not None:
            pack_span(out, r, oo, N, xp, 0, 1)


@kernel
def add_rmsnorm_k(X, D, w, eps, out, oo, R, flags, slot, xp):
    """One block per row: the add (each thread its share, raising the flag on a non-finite sum,
    then a barrier: the block's global writes are visible to all its threads after it), then
    :func:`block_sumsq` and the outputs (and ``xp``'s pairs) as in rmsnorm_k."""
    pdl_trigger()  # a GEMV launched with PDL after this kernel may start now (launch.launch)
    r = cuda.blockIdx.x
    ps = cuda.shared.array(PS_WORDS, np.float32)
    N = X.shape[1]
    if add_span4(X, D, r, cuda.threadIdx.x, N, cuda.blockDim.x) and slot >= 0:
        flags[slot] = 1
    barrier()
    inv = rms_scale(block_sumsq(X, r, 0, N, ps, cuda.threadIdx.x, cuda.blockDim.x), N, eps)
    if xp is None:
        norm_span4(X, r, 0, N, w, inv, out, oo, cuda.threadIdx.x, cuda.blockDim.x)
    else:
        norm_pairs(X, r, N, w, inv, out, oo, xp, cuda.threadIdx.x, cuda.blockDim.x)


@launcher("add_rmsnorm")
def add_rmsnorm_cuda(X, D, w, eps, out, oo, R, flags, slot, xp=None):
    """One block per row."""
    if xp is not None:
        if oo % 2 != 0 or X.shape[1] % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < oo + X.shape[1]:
            raise ValueError(PACK_ERROR)
    launch(add_rmsnorm_k, R, block_size(RMS_THREADS), X, D, w, F32(eps), out, oo, R, flags, slot, xp)


@twin("head_rmsnorm")
def head_rmsnorm_cpu(X, xo, heads, D, w, eps, out, R):
    """Zero-centred RMSNorm per head of X[:, xo + h·D : xo + (h+1)·D] into out[:, h·D : ...]."""
    for r in range(R):
        for h in range(heads):
            norm_head(X, xo, D, w, eps, out, r, h)


@kernel
def head_rmsnorm_k(X, xo, heads, D, w, eps, out, R):
    """One block per (row, head) (:func:`block_sumsq`)."""
    b = cuda.blockIdx.x
    r = b // heads
    h = b - r * heads
    ps = cuda.shared.array(PS_WORDS, np.float32)
    off = xo + h * D
    inv = rms_scale(block_sumsq(X, r, off, D, ps, cuda.threadIdx.x, cuda.blockDim.x), D, eps)
    norm_span4(X, r, off, D, w, inv, out, h * D, cuda.threadIdx.x, cuda.blockDim.x)


@launcher("head_rmsnorm")
def head_rmsnorm_cuda(X, xo, heads, D, w, eps, out, R):
    """One block per (row, head)."""
    if R * heads:
        launch(head_rmsnorm_k, R * heads, block_size(NORM_THREADS), X, xo, heads, D, w, F32(eps), out, R)


@twin("gated_rmsnorm")
def gated_rmsnorm_cpu(X, Z, zo, heads, D, w, eps, out, R, xp=None):
    """Per head h: out[r, h·D + i] = x·inv·w[i]·silu(Z[r, zo + h·D + i]) over X[r, h·D : (h+1)·D].
    ``xp`` (optional, uint32 [≥R, ≥heads·D/2]; D even): the pairs packed as rmsnorm's."""
    if xp is not None:
        if D % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < heads * D:
            raise ValueError(PACK_ERROR)
    for r in range(R):
        for h in range(heads):
            gated_norm_head(X, Z, zo, D, w, eps, out, r, h)
            if xp is not None:
                pack_span(out, r, h * D, D, xp, 0, 1)


@kernel
def gated_rmsnorm_k(X, Z, zo, heads, D, w, eps, out, R, xp):
    """One block per (row, head) (:func:`block_sumsq`); with ``xp`` (None: not) a pair a thread
    at a time, packed as stored (:func:`gated_pairs`)."""
    pdl_trigger()  # a GEMV launched with PDL after this kernel may start now (launch.launch)
    b = cuda.blockIdx.x
    r = b // heads
    h = b - r * heads
    ps = cuda.shared.array(PS_WORDS, np.float32)
    inv = rms_scale(block_sumsq(X, r, h * D, D, ps, cuda.threadIdx.x, cuda.blockDim.x), D, eps)
    if xp is None:
        gated_span(X, Z, zo, D, w, inv, out, r, h, cuda.threadIdx.x, cuda.blockDim.x)
    else:
        gated_pairs(X, Z, zo, D, w, inv, out, xp, r, h, cuda.threadIdx.x, cuda.blockDim.x)


@launcher("gated_rmsnorm")
def gated_rmsnorm_cuda(X, Z, zo, heads, D, w, eps, out, R, xp=None):
    """One block per (row, head)."""
    if xp is not None:
        if D % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < heads * D:
            raise ValueError(PACK_ERROR)
    if R * heads:
        launch(gated_rmsnorm_k, R * heads, block_size(NORM_THREADS), X, Z, zo, heads, D, w, F32(eps), out, R, xp)
