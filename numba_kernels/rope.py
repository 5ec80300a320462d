"""Rotary position embedding, rotate-half, in place on the first 2·half dims of every head.

Shapes: X [≥R, heads·D]; cos, sin [max_ctx, half] (float32 tables computed on the host in
float64 and rounded once, DESIGN.md §3); row r sits at position start + r. Each pair
(x1, x2) = (X[r, h·D + i], X[r, h·D + i + half]) becomes (x1·c − x2·s, x2·c + x1·s), each an fma
over a rounded product (:func:`rope_pair`).
"""

from __future__ import annotations

from .tags import body, cuda, fma, fmul, grid1, kernel, launch, launcher, twin, zero_pos


@body
def rope_pair(X, r, o, half, c, s):
    """Rotate-half RoPE of the pair (X[r, o], X[r, o+half]) in place with cos c, sin s."""
    x1 = X[r, o]
    x2 = X[r, o + half]
    X[r, o] = fma(x1, c, -fmul(x2, s))
    X[r, o + half] = fma(x2, c, fmul(x1, s))


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
