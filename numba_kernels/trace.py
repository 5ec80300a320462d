"""Trace ops: ``row_hash`` (a 64-bit FNV-1a of each traced row) and ``flip_low_bit`` (the fault
hook of ``harness bisect``). Integer arithmetic only, so both targets give the same results.

Both take their buffers as 32-bit integer views (``a.view(np.uint32)`` of a float32 or int32
array): they never compute with a float, and ``row_hash`` only reads the buffer it hashes.

Shapes: X [N, C] uint32; H [≥R, S] uint64 (one column per traced op: ``slot``). Traced row r
(r < R) is the ``m`` consecutive buffer rows ``x0 + r·m … x0 + r·m + m - 1``, columns
``c0 … c1 - 1`` of each, read row by row (``m`` > 1: the k routed experts of one token).

Hash (lane-interleaved FNV-1a, so one row is hashed by a whole block with coalesced loads): the
row's ``n = m·(c1 - c0)`` words w_0 … w_{n-1}, in reading order, are dealt to ``HASH_LANES``
(256) lanes, word t to lane ``t mod HASH_LANES``. Each lane runs FNV-1a over its words in order,
``h ← (h ⊕ w) · FNV_PRIME`` mod 2⁶⁴ from ``FNV_OFFSET``; the row's hash is FNV-1a over the lanes'
hashes in lane order (64-bit words), from ``FNV_OFFSET`` (or from ``H[r, slot]`` when ``chain``: a
second buffer appended to the first). For fixed other inputs every step is a bijection of h (xor
with a word, then a multiply by an odd number mod 2⁶⁴), so rows that differ in exactly one word
always hash differently: that word changes its lane's hash, which changes the row's. The CPU twin
loops over rows and words; the CUDA kernel runs one block of ``HASH_LANES`` threads per row, one
thread per lane, and thread 0 combines the lanes.
"""

from __future__ import annotations

import numpy as np

from .tags import body, cuda, kernel, launch, launcher, twin

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
LOW_BIT = np.uint32(1)


HASH_LANES = 256  # lanes a traced row's words are dealt to (= threads per block of the kernel)


@body
def fnv_step(h, w):
    return (h ^ w) * FNV_PRIME


@body
def combine_lanes(lanes, h):
    """h advanced over the lanes' hashes, in lane order."""
    for q in range(HASH_LANES):
        h = fnv_step(h, lanes[q])
    return h


@twin("row_hash")
def row_hash_cpu(X, x0, m, c0, c1, H, slot, chain, R):
    """H[r, slot] = the lane-interleaved FNV-1a of traced row r of X, for r < R (continuing from
    H[r, slot] when ``chain``)."""
    lanes = np.empty(HASH_LANES, np.uint64)
    for r in range(R):
        lanes[:] = FNV_OFFSET
        t = 0
        for j in range(m):
            i = x0 + r * m + j
            for c in range(c0, c1):
                q = t % HASH_LANES
                lanes[q] = fnv_step(lanes[q], np.uint64(X[i, c]))
                t += 1
        H[r, slot] = combine_lanes(lanes, H[r, slot] if chain else FNV_OFFSET)


@kernel
def row_hash_k(X, x0, m, c0, c1, H, slot, chain):
    r = cuda.blockIdx.x
    q = cuda.threadIdx.x
    lanes = cuda.shared.array(HASH_LANES, np.uint64)
    W = c1 - c0
    h = FNV_OFFSET
    if W > 0:
        j, c = q // W, q % W  # word t = q, q + HASH_LANES, ... of the row: sub-row j, column c0 + c
        while j < m:
            h = fnv_step(h, np.uint64(X[x0 + r * m + j, c0 + c]))
            c += HASH_LANES
            while c >= W:
                c -= W
                j += 1
    lanes[q] = h
    cuda.syncthreads()
    if q == 0:
        H[r, slot] = combine_lanes(lanes, H[r, slot] if chain else FNV_OFFSET)


@launcher("row_hash")
def row_hash_cuda(X, x0, m, c0, c1, H, slot, chain, R):
    if R > 0:
        launch(row_hash_k, R, HASH_LANES, X, x0, m, c0, c1, H, slot, chain)


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
