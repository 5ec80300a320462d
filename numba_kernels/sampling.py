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

from .exact import F32, SLICE, ZERO, add_partials, dot_rows, fma_chain
from .tags import (barrier, block_size, body, cuda, fmul, kernel, launch, launcher, scratch, sqrt32, syncwarp, twin,
                   zero_buffer)

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


@body
def pick_settle(bv, bi, sv, si, last, pv, pi, done, io, picked, slot, t, nt, b, G):
    """Block b of a grid of G, every thread calling it with its candidate (bv, bi): the block's
    first goes to (pv[b], pi[b]); the last block to finish (``done[0]``, a counter it leaves at
    zero again: a captured step replays the launch) takes the first of the G block candidates
    and makes greedy_pick_cpu's stores (io[1] = it, io[0] += 1, picked[slot] = it). The order is
    total on (value, index), so the order blocks finish in changes nothing."""
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
            done[0] = 0


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
    pick_settle(bv, bi, sv, si, last, pv, pi, done, io, picked, slot, t, nt, b, G)


@launcher("greedy_pick")
def greedy_pick_cuda(logits, io, picked, slot):
    V = logits.shape[1]
    nt = block_size(PICK_THREADS)
    G = math.ceil(V / (nt * PICK_LOADS))
    pv = scratch("greedy_pick.v", G, np.float32, 256)[:G]
    pi = scratch("greedy_pick.i", G, np.int32, 256)[:G]
    launch(greedy_pick_k, G, nt, logits, V, pv, pi, zero_buffer("greedy_pick.done", 1, np.int32), io, picked, slot)


# ------------------------------------------------------------------------------------------------
# bound_pick: the greedy pick of X·Wᵀ, certified from approximate logits
# ------------------------------------------------------------------------------------------------
# bound_pick(X, W, A, Rc, Mc, xf, io, picked, slot) makes greedy_pick's stores for the logits row
# L = linear(X[:1], W) (the canonical dot of each weight row), without computing most of it:
# A [1, N] holds approximate logits (a GEMV of bf16 weights: half the bytes) and the bound
#
#     |L_j − A_j| ≤ Rc_j·‖x‖ + 2**-120   whenever Mc_j·‖x‖ < 2**125
#
# (float32 Rc, Mc per row, from harness.engine.draft.bound_tables; its docstring derives them) says
# which rows can still be the largest: in a block of rows, the row k with the largest A_k − E_k
# (E the bound, with margins for its own rounding) has L_k ≥ A_k − E_k =: lb, so every row that
# ties or beats row k has A_j + E_j ≥ lb. Only those rows ("candidates") get their exact dot; the
# block's first by numpy.argmax's order among them is the block's first among all its rows, and
# the blocks' firsts are combined as greedy_pick_k combines them. A block whose bound cannot be
# used -- x not finite or so large that ‖x‖² overflows, an A_j not finite, a row with Mc_j·‖x‖ ≥
# 2**125 (an overflow could occur, or a weight is not finite) -- takes every row as a candidate:
# the pick is numpy.argmax of L in every case, NaNs included. ‖x‖ is bounded from above by
# xn = sqrt(dot(x, x))·xf + 2**-60 (the canonical dot; xf covers its rounding and sqrt's).
BP_ROWS = 256  # rows of W a block of bound_pick owns, one a thread (block_size: 32 under the simulator)
BP_WARPS = BP_ROWS // 32
BP_EF = F32(1.0 + 2.0 ** -10)  # E = Rc·xn·BP_EF + |A|·BP_AF + BP_ABS: covers the rounding of E, A ± E
BP_AF = F32(2.0 ** -21)
BP_ABS = F32(2.0 ** -120)
BP_XABS = F32(2.0 ** -60)  # xn's absolute term: x² terms lost to underflow (K ≤ 2**20)
BP_LIM = F32(2.0 ** 125)  # Mc·xn below it: no partial sum of either dot can overflow
NEG_INF = F32(-np.inf)


@body
def bound_xn(x2, xf):
    """The upper bound of ‖x‖ that bound_pick's margins use, from x2 = dot(x, x) in the canonical
    order (NaN or inf when x is not finite or ‖x‖² overflows)."""
    return fmul(sqrt32(x2), xf) + BP_XABS


@body
def bound_row(a, rc, mc, xn):
    """(usable, lo, hi) of one row: whether its bound holds as used, and A ∓ E."""
    e = fmul(fmul(rc, xn), BP_EF) + fmul(abs(a), BP_AF) + BP_ABS
    ok = a - a == ZERO and fmul(mc, xn) < BP_LIM  # False for an A or an xn not finite, a NaN mc
    return ok, a - e, a + e


@twin("bound_pick")
def bound_pick_cpu(X, W, A, Rc, Mc, xf, io, picked, slot):
    """greedy_pick_cpu of linear(X[:1], W) (numpy.argmax of the exact logits row), computing the
    exact dot only of the rows the bound leaves (see above); blocks of BP_ROWS rows, as the kernel's."""
    N, K = W.shape[0], W.shape[1]
    xn = bound_xn(dot_rows(X, 0, 0, X, 0, 0, K), xf)
    bv, bi = NEG_INF, N
    for r0 in range(0, N, BP_ROWS):
        r1 = min(r0 + BP_ROWS, N)
        ok = True
        lb = NEG_INF
        for j in range(r0, r1):
            u, lo, hi = bound_row(A[0, j], Rc[j], Mc[j], xn)
            ok = ok and u
            if lo > lb:
                lb = lo
        for j in range(r0, r1):
            u, lo, hi = bound_row(A[0, j], Rc[j], Mc[j], xn)
            if not ok or not hi < lb:
                v = dot_rows(X, 0, 0, W, j, 0, K)
                if pick_better(v, j, bv, bi):
                    bv, bi = v, j
    io[1] = bi
    io[0] = io[0] + 1
    picked[slot] = bi


@body
def warp_dot(X, W, r, K, P, lane):
    """dot_rows(X, 0, 0, W, r, 0, K) by one warp, the value in lane 0: lane l runs the fma chains of
    slices l, l + 32, …; each round's 32 partials go through the warp's shared row P [32] and lane 0
    adds them in slice order (every lane of the warp must call it)."""
    acc = ZERO
    for k0 in range(0, K, 32 * SLICE):
        k = k0 + lane * SLICE
        P[lane] = fma_chain(X[0, k:], W[r, k:], min(SLICE, K - k), 0) if k < K else ZERO
        syncwarp()
        if lane == 0:
            acc = add_partials(acc, P, min(32, (K - k0 + SLICE - 1) // SLICE))
        syncwarp()
    return acc


@kernel
def bound_pick_k(X, W, A, Rc, Mc, xf, N, K, pv, pi, done, io, picked, slot):
    """Block b owns rows b·blockDim + t (thread t's); warp 0 first computes xn; a thread's row is a
    candidate per the bound; the block's warps take the candidates in turn (warp_dot), and the
    block's first of them and the grid's are settled as greedy_pick_k's (pick_settle)."""
    P = cuda.shared.array((BP_WARPS, 32), np.float32)
    sv = cuda.shared.array(BP_ROWS, np.float32)
    si = cuda.shared.array(BP_ROWS, np.int32)
    cl = cuda.shared.array(BP_ROWS, np.int32)
    cnt = cuda.shared.array(2, np.int32)
    xs = cuda.shared.array(1, np.float32)
    last = cuda.shared.array(1, np.int32)
    t, nt, b, G = cuda.threadIdx.x, cuda.blockDim.x, cuda.blockIdx.x, cuda.gridDim.x
    lane, w, nw = t % 32, t // 32, nt // 32
    if w == 0:
        x2 = warp_dot(X, X, 0, K, P[0], lane)
        if lane == 0:
            xs[0] = bound_xn(x2, xf)
            cnt[0] = 0
            cnt[1] = 0
    barrier()
    j = b * nt + t
    lo, hi = NEG_INF, NEG_INF
    if j < N:
        u, lo, hi = bound_row(A[0, j], Rc[j], Mc[j], xs[0])
        if not u:
            cnt[1] = 1  # every thread that writes writes 1
            lo = NEG_INF
    sv[t] = lo
    barrier()
    h = nt // 2
    while h > 0:
        if t < h and sv[t + h] > sv[t]:
            sv[t] = sv[t + h]
        barrier()
        h //= 2
    lb = sv[0]
    if j < N and (cnt[1] == 1 or not hi < lb):
        cl[cuda.atomic.add(cnt, 0, 1)] = j
    barrier()
    bv, bi = NEG_INF, N
    for c in range(w, cnt[0], nw):
        r = cl[c]
        v = warp_dot(X, W, r, K, P[w], lane)
        if lane == 0 and pick_better(v, r, bv, bi):
            bv, bi = v, r
    barrier()  # sv is read above (lb) by every thread
    pick_settle(bv, bi, sv, si, last, pv, pi, done, io, picked, slot, t, nt, b, G)


@launcher("bound_pick")
def bound_pick_cuda(X, W, A, Rc, Mc, xf, io, picked, slot):
    N, K = W.shape[0], W.shape[1]
    nt = block_size(BP_ROWS)
    G = math.ceil(N / nt)
    pv = scratch("bound_pick.v", G, np.float32, 1024)[:G]
    pi = scratch("bound_pick.i", G, np.int32, 1024)[:G]
    launch(bound_pick_k, G, nt, X, W, A, Rc, Mc, xf, N, K, pv, pi, zero_buffer("bound_pick.done", 1, np.int32), io,
           picked, slot)
