"""Trace ops: ``row_hash`` (a 64-bit FNV-1a of each traced row) and ``flip_low_bit`` (the fault
hook of ``harness bisect``). Integer arithmetic only, so both targets give the same results.

Both take their buffers as 32-bit integer views (``a.view(np.uint32)`` of a float32 or int32
array): they never compute with a float, and ``row_hash`` only reads the buffer it hashes.

Shapes: X [N, C] uint32; H [≥R, S] uint64 (one column per traced op: ``slot``). Traced row r
(r < R) is the ``m`` consecutive buffer rows ``x0 + r·m … x0 + r·m + m - 1``, columns
``c0 … c1 - 1`` of each, read row by row (``m`` > 1: the k routed experts of one token).

Hash: FNV-1a over 32-bit words, ``h ← (h ⊕ w) · FNV_PRIME`` mod 2⁶⁴ from ``FNV_OFFSET`` (or
from ``H[r, slot]`` when ``chain``: a second buffer appended to the first). For fixed later words
each step is a bijection of h (xor with a word, then a multiply by an odd number mod 2⁶⁴), so
rows that differ in exactly one word always hash differently. The CPU twin loops over rows, the
CUDA kernel runs one thread per row.
"""

from __future__ import annotations

import numpy as np

from .tags import body, cuda, grid1, kernel, launch, launcher, twin

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
LOW_BIT = np.uint32(1)


@body
def hash_row(X, x0, m, c0, c1, r, h):
    """h advanced over the words of traced row r (see the module docstring)."""
    for j in range(m):
        i = x0 + r * m + j
        for c in range(c0, c1):
            h = (h ^ np.uint64(X[i, c])) * FNV_PRIME
    return h


@body
def row_hash_at(X, x0, m, c0, c1, H, slot, chain, r):
    h = H[r, slot] if chain else FNV_OFFSET
    H[r, slot] = hash_row(X, x0, m, c0, c1, r, h)


@twin("row_hash")
def row_hash_cpu(X, x0, m, c0, c1, H, slot, chain, R):
    """H[r, slot] = FNV-1a of traced row r of X, for r < R (continuing from H[r, slot] when
    ``chain``)."""
    for r in range(R):
        row_hash_at(X, x0, m, c0, c1, H, slot, chain, r)


@kernel
def row_hash_k(X, x0, m, c0, c1, H, slot, chain, R):
    r = cuda.grid(1)
    if r < R:
        row_hash_at(X, x0, m, c0, c1, H, slot, chain, r)


@launcher("row_hash")
def row_hash_cuda(X, x0, m, c0, c1, H, slot, chain, R):
    launch(row_hash_k, *grid1(R), X, x0, m, c0, c1, H, slot, chain, R)


@body
def flip_at(X, i, c):
    X[i, c] = X[i, c] ^ LOW_BIT


@twin("flip_low_bit")
def flip_low_bit_cpu(X, i, c):
    """X[i, c] ^= 1: a float32's lowest mantissa bit flipped, one ulp away (toward or away from
    zero) for every finite value."""
    flip_at(X, i, c)


@kernel
def flip_low_bit_k(X, i, c):
    if cuda.grid(1) == 0:
        flip_at(X, i, c)


@launcher("flip_low_bit")
def flip_low_bit_cuda(X, i, c):
    launch(flip_low_bit_k, 1, 1, X, i, c)
