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
from .tags import barrier, block_size, body, cuda, fmul, kernel, launch, launcher, scratch, twin, zero_buffer

PICK_THREADS = 256  # greedy_pick's block (block_size: 32 under the simulator)
PICK_LOADS = 4  # the logits a thread of greedy_pick reads (all in flight at once; the kernel spells out four)


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
def greedy_pick_k(logits, V, pv, pi, done, io, picked, slot):
    """Block b: the first of its PICK_LOADS · blockDim logits into (pv[b], pi[b]); the last block
    to finish (``done[0]``, a counter it leaves at zero again) takes the first of the G block
    candidates and makes greedy_pick_cpu's stores. A thread's PICK_LOADS loads are issued before
    any comparison; an index past the row reads the row's last logit (a real candidate again:
    the order is total, so a repeat changes nothing)."""
    sv = cuda.shared.array(PICK_THREADS, np.float32)
    si = cuda.shared.array(PICK_THREADS, np.int32)
    last = cuda.shared.array(1, np.int32)
    t, nt, b, G = cuda.threadIdx.x, cuda.blockDim.x, cuda.blockIdx.x, cuda.gridDim.x
    top = V - 1
    i0 = min(b * nt * PICK_LOADS + t, top)
    i1 = min(i0 + nt, top)
    i2 = min(i1 + nt, top)
    i3 = min(i2 + nt, top)
    bv, v1, v2, v3 = logits[0, i0], logits[0, i1], logits[0, i2], logits[0, i3]
    bi = i0
    if pick_better(v1, i1, bv, bi):
        bv, bi = v1, i1
    if pick_better(v2, i2, bv, bi):
        bv, bi = v2, i2
    if pick_better(v3, i3, bv, bi):
        bv, bi = v3, i3
    pick_block(bv, bi, sv, si, t, nt)
    if t == 0:
        pv[b] = sv[0]
        pi[b] = si[0]
        cuda.threadfence()  # the candidate is visible to every block before this one counts itself done
        last[0] = 1 if cuda.atomic.add(done, 0, 1) == G - 1 else 0
    barrier()
    if last[0] == 1:  # every other block's candidate is stored and visible
        bv, bi = pv[0], pi[0]
        for j in range(t, G, nt):
            if pick_better(pv[j], pi[j], bv, bi):
                bv, bi = pv[j], pi[j]
        pick_block(bv, bi, sv, si, t, nt)
        if t == 0:
            io[1] = si[0]
            io[0] = io[0] + 1
            picked[slot] = si[0]
            done[0] = 0  # for the next launch (a captured step replays this one)


@launcher("greedy_pick")
def greedy_pick_cuda(logits, io, picked, slot):
    V = logits.shape[1]
    nt = block_size(PICK_THREADS)
    G = math.ceil(V / (nt * PICK_LOADS))
    pv = scratch("greedy_pick.v", G, np.float32, 256)[:G]
    pi = scratch("greedy_pick.i", G, np.int32, 256)[:G]
    launch(greedy_pick_k, G, nt, logits, V, pv, pi, zero_buffer("greedy_pick.done", 1, np.int32), io, picked, slot)
