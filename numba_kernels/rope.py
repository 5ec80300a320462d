"""Rotary position embedding, rotate-half, on the first 2·half dims of every head: ``rope`` (in
place) and ``qk_norm_rope`` (an attention layer's q/k norms, RoPE and K/V cache write in one op).

Shapes: X [≥R, heads·D]; cos, sin [max_ctx, half] (float32 tables computed on the host in
float64 and rounded once); row r sits at position start + r. Each pair
(x1, x2) = (X[r, h·D + i], X[r, h·D + i + half]) becomes (x1·c − x2·s, x2·c + x1·s), each an fma
over a rounded product (:func:`rope_vals`).

``qk_norm_rope`` reads the fused projection QKV [≥R, 2·hq·D + 2·hkv·D] (query ‖ gate ‖ K ‖ V):
each query head's zero-centred RMSNorm (weights ``wq``) then RoPE into Q [R, hq·D]; each KV
head's norm (``wk``) then RoPE into the K cache row start + r, its V copied into the V cache row.
The same operations, in the same order, as ``head_rmsnorm`` ×2, ``rope`` ×2 and ``kv_write``
(each normed value computed once, rotated straight from its register). CUDA: one block per
(row, head) of the hq + hkv heads (:func:`~numba_kernels.norms.block_sumsq`).
"""

from __future__ import annotations

import numpy as np

from .exact import F32
from .norms import NORM_THREADS, PS_WORDS, block_sumsq, norm_val, rms_inv, rms_scale
from .tags import block_size, body, cuda, fma, fmul, grid1, kernel, launch, launcher, twin, zero_pos


@body
def rope_vals(X, r, o, half, x1, x2, c, s):
    """X[r, o], X[r, o + half] = the pair (x1, x2) rotated by cos c, sin s."""
    X[r, o] = fma(x1, c, -fmul(x2, s))
    X[r, o + half] = fma(x2, c, fmul(x1, s))


@body
def rope_pair(X, r, o, half, c, s):
    """Rotate-half RoPE of the pair (X[r, o], X[r, o+half]) in place with cos c, sin s."""
    rope_vals(X, r, o, half, X[r, o], X[r, o + half], c, s)


@body
def rope_at(X, D, half, cos, sin, p, r, h, i):
    """Pair i of head h of row r, at position p."""
    rope_pair(X, r, h * D + i, half, cos[p, i], sin[p, i])


@twin("rope")
def rope_cpu(X, heads, D, half, cos, sin, start, R):
    """RoPE in place on X[:, h·D : h·D + 2·half] for rows at positions start + r."""
    for r in range(R):
        for h in range(heads):
            for i in range(half):
                rope_at(X, D, half, cos, sin, start + r, r, h, i)


@kernel
def rope_k(X, heads, D, half, cos, sin, start, pb, R):
    i = cuda.grid(1)
    if i < R * heads * half:
        r = i // (heads * half)
        rem = i - r * heads * half
        h = rem // half
        rope_at(X, D, half, cos, sin, start + pb[0] + r, r, h, rem - h * half)


@launcher("rope")
def rope_cuda(X, heads, D, half, cos, sin, start, R, pos=None):
    """One thread per pair. ``pos``: an int32 [1] device array added to ``start`` (the
    device-side position of a captured step); None adds zero."""
    launch(rope_k, *grid1(R * heads * half), X, heads, D, half, cos, sin, start, zero_pos() if pos is None else pos, R)


# ------------------------------------------------------------------------------------------------
# qk_norm_rope: head_rmsnorm (q, k) + rope (q, k) + kv_write in one op
# ------------------------------------------------------------------------------------------------
@body
def norm_rope_span(X, r, xo, D, w, inv, half, cos, sin, p, out, orow, oo, i0, step):
    """out[orow, oo + i] for i < D: X[r, xo + i] normed (:func:`~numba_kernels.norms.norm_val`),
    the first 2·half rotated at position p. Item j in range(i0, D − half, step) is the pair
    (j, j + half) for j < half, else the single value j + half."""
    for j in range(i0, D - half, step):
        if j < half:
            rope_vals(out, orow, oo + j, half, norm_val(X[r, xo + j], inv, w[j]),
                      norm_val(X[r, xo + j + half], inv, w[j + half]), cos[p, j], sin[p, j])
        else:
            out[orow, oo + j + half] = norm_val(X[r, xo + j + half], inv, w[j + half])


@body
def qk_head_in(hq, D, h):
    """Where head h (queries first, then the KV heads) starts in a QKV row."""
    if h < hq:
        return h * D
    return hq * D + h * D


@body
def qk_head_span(QKV, xo, hq, hkv, D, wq, wk, inv, half, cos, sin, p, Q, kc, vc, r, h, i0, step):
    """Head h of row r (at position p; its input at QKV[r, xo:], :func:`qk_head_in`), normed with
    ``inv``: a query head into Q[r]; KV head j = h − hq into kc[p] and its V (unnormed) into
    vc[p]. Items in range(i0, ·, step)."""
    if h < hq:
        norm_rope_span(QKV, r, xo, D, wq, inv, half, cos, sin, p, Q, r, h * D, i0, step)
    else:
        o = (h - hq) * D
        norm_rope_span(QKV, r, xo, D, wk, inv, half, cos, sin, p, kc, p, o, i0, step)
        vo = xo + hkv * D
        for i in range(i0, D, step):
            vc[p, o + i] = QKV[r, vo + i]


@twin("qk_norm_rope")
def qk_norm_rope_cpu(QKV, hq, hkv, D, wq, wk, eps, half, cos, sin, start, Q, kc, vc, R):
    """Per row r (position start + r): query heads normed (``wq``) and rotated into Q[r], KV heads
    normed (``wk``) and rotated into kc[start + r], V copied into vc[start + r]."""
    for r in range(R):
        for h in range(hq + hkv):
            xo = qk_head_in(hq, D, h)
            inv = rms_inv(QKV, r, xo, D, eps)
            qk_head_span(QKV, xo, hq, hkv, D, wq, wk, inv, half, cos, sin, start + r, Q, kc, vc, r, h, 0, 1)


@kernel
def qk_norm_rope_k(QKV, hq, hkv, D, wq, wk, eps, half, cos, sin, start, pb, Q, kc, vc, R):
    """One block per (row, head) (:func:`~numba_kernels.norms.block_sumsq`)."""
    b = cuda.blockIdx.x
    H = hq + hkv
    r = b // H
    h = b - r * H
    ps = cuda.shared.array(PS_WORDS, np.float32)
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    xo = qk_head_in(hq, D, h)
    inv = rms_scale(block_sumsq(QKV, r, xo, D, ps, tid, nt), D, eps)
    qk_head_span(QKV, xo, hq, hkv, D, wq, wk, inv, half, cos, sin, start + pb[0] + r, Q, kc, vc, r, h, tid, nt)


@launcher("qk_norm_rope")
def qk_norm_rope_cuda(QKV, hq, hkv, D, wq, wk, eps, half, cos, sin, start, Q, kc, vc, R, pos=None):
    """One block per (row, head); ``pos`` as in ``rope``."""
    if R * (hq + hkv):
        launch(qk_norm_rope_k, R * (hq + hkv), block_size(NORM_THREADS), QKV, hq, hkv, D, wq, wk, F32(eps), half, cos,
               sin, start, zero_pos() if pos is None else pos, Q, kc, vc, R)
