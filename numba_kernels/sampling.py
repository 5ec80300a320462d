"""Sampling: the host-side helpers of the sampler (float32, index order: CPU only, whatever the
backend -- the sampler reads logits on the host, ``harness/walk/sampling.py``), and
``greedy_pick``, the greedy decode's pick on the device (a chained decode step feeds the next one
its token with no host in between).

``greedy_pick`` is ``numpy.argmax`` of one logits row: the first index of the largest value, a
NaN larger than any number (the first NaN wins, as numpy's), ``-0.0`` equal to ``0.0``. That order
is total on (value, index), so the kernel's blocks and tree may combine candidates in any order
and give the twin's answer: no float arithmetic, only comparisons.
"""

from __future__ import annotations

import math

import numpy as np

from .exact import ZERO
from .tags import barrier, block_size, body, cuda, fmul, kernel, launch, launcher, scratch, twin

PICK_THREADS = 256  # greedy_pick's block (block_size: 32 under the simulator)
PICK_SPAN = 2048  # the logits one block of greedy_pick's first kernel scans


@twin("normalise", host=True)
def normalise_cpu(e):
    """e / Σe with the sum taken in index order."""
    s = ZERO
    for i in range(e.size):
        s = s + e[i]
    out = np.empty_like(e)
    for i in range(e.size):
        out[i] = e[i] / s
    return out


@twin("draw_index", host=True)
def draw_index_cpu(p, u):
    """The first i whose running sum of p (index order) exceeds u · Σp; the last nonzero
    index when rounding leaves the sum short."""
    t = ZERO
    for i in range(p.size):
        t = t + p[i]
    target = fmul(u, t)
    c = ZERO
    last = 0
    for i in range(p.size):
        if p[i] > ZERO:
            last = i
        c = c + p[i]
        if c > target:
            return i
    return last


# ------------------------------------------------------------------------------------------------
# greedy pick on the device
# ------------------------------------------------------------------------------------------------
@body
def pick_better(v, i, bv, bi):
    """Whether (v, i) comes before (bv, bi) in numpy.argmax's order: the larger value (a NaN
    larger than any number, ``-0.0 == 0.0``), the lower index between equals."""
    if v != v:
        return bv == bv or i < bi
    if bv != bv:
        return False
    return v > bv or (v == bv and i < bi)


@twin("greedy_pick")
def greedy_pick_cpu(logits, io, picked, slot):
    """The greedy pick that chains decode steps: t = numpy.argmax(logits[0]) (see the module
    docstring); io[1] = t (the next step's token), io[0] += 1 (its position), picked[slot] = t
    (int32 ``io`` [2] = [position, token], int32 ``picked``)."""
    bv, bi = logits[0, 0], 0
    for i in range(1, logits.shape[1]):
        if pick_better(logits[0, i], i, bv, bi):
            bv, bi = logits[0, i], i
    io[1] = bi
    io[0] = io[0] + 1
    picked[slot] = bi


@body
def pick_tree(sv, si, t, nt):
    """Thread 0's (sv[0], si[0]) becomes the first of the block's nt candidates (sv, si in shared
    memory, nt a power of two). Every thread of the block must call it (it holds barriers)."""
    h = nt // 2
    while h > 0:
        if t < h and pick_better(sv[t + h], si[t + h], sv[t], si[t]):
            sv[t] = sv[t + h]
            si[t] = si[t + h]
        barrier()
        h //= 2


@body
def pick_block(bv, bi, sv, si, t, nt):
    """The first of the block's candidates, one (bv, bi) per thread, into thread 0's (sv[0],
    si[0]) (every thread of the block must call it: it holds barriers)."""
    sv[t] = bv
    si[t] = bi
    barrier()
    pick_tree(sv, si, t, nt)


@kernel
def greedy_pick_part_k(logits, V, pv, pi):
    """Block b: the first of logits[0, b·PICK_SPAN ..] into (pv[b], pi[b])."""
    sv = cuda.shared.array(PICK_THREADS, np.float32)
    si = cuda.shared.array(PICK_THREADS, np.int32)
    t, nt, b = cuda.threadIdx.x, cuda.blockDim.x, cuda.blockIdx.x
    lo = b * PICK_SPAN
    hi = min(lo + PICK_SPAN, V)
    bv, bi = logits[0, lo], lo
    for i in range(lo + t, hi, nt):
        if pick_better(logits[0, i], i, bv, bi):
            bv, bi = logits[0, i], i
    pick_block(bv, bi, sv, si, t, nt)
    if t == 0:
        pv[b] = sv[0]
        pi[b] = si[0]


@kernel
def greedy_pick_final_k(pv, pi, G, io, picked, slot):
    """The first of the G block candidates: the pick (greedy_pick_cpu's stores)."""
    sv = cuda.shared.array(PICK_THREADS, np.float32)
    si = cuda.shared.array(PICK_THREADS, np.int32)
    t, nt = cuda.threadIdx.x, cuda.blockDim.x
    bv, bi = pv[0], pi[0]
    for j in range(t, G, nt):
        if pick_better(pv[j], pi[j], bv, bi):
            bv, bi = pv[j], pi[j]
    pick_block(bv, bi, sv, si, t, nt)
    if t == 0:
        io[1] = si[0]
        io[0] = io[0] + 1
        picked[slot] = si[0]


@launcher("greedy_pick")
def greedy_pick_cuda(logits, io, picked, slot):
    V = logits.shape[1]
    G = math.ceil(V / PICK_SPAN)
    pv = scratch("greedy_pick.v", G, np.float32, 256)[:G]
    pi = scratch("greedy_pick.i", G, np.int32, 256)[:G]
    nt = block_size(PICK_THREADS)
    launch(greedy_pick_part_k, G, nt, logits, V, pv, pi)
    launch(greedy_pick_final_k, 1, nt, pv, pi, G, io, picked, slot)
