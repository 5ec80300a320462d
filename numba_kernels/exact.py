"""The exact-mode arithmetic every op shares: float32 constants, our own scalar math, the
canonical dot order (and ``row_col``, a thread's flat index as row and column).

These are ``@body`` functions (:mod:`numba_kernels.tags`): the front doors compile them for the
CPU twin (``numba.njit``) and for CUDA (``numba.cuda.jit(device=True)``) with that target's
primitives, so both targets run the same float32 operations in the same order (DESIGN.md §3):

- every multiply-add is an explicit ``fma``; every other multiply is ``fmul`` (on CUDA
  ``__fmul_rn``, which the compiler may not contract into an FMA; on the CPU a plain multiply,
  which LLVM does not contract without fast-math);
- ``exp32``, ``log1p_unit``, ``sigmoid32``, ``softplus32``, ``silu32`` are our own (range
  reduction + polynomial in fma), never libm or libdevice;
- ``/`` and ``sqrt32`` are IEEE on both targets; literals are float32 constants.

Canonical reduction orders (independent of row counts, chunk starts and sessions):

- **dot** of length n: slices of ``SLICE`` = 32 consecutive terms; inside a slice an fma chain
  from +0 in index order (:func:`fma_chain`); slice partials added left to right into an
  accumulator that starts at +0 (:func:`add_partial`). Linear layers, norms, L2 norms, attention
  scores and the DeltaNet's ``Sᵀk``/``Sᵀq`` all use it; a fast kernel may compute the partials in
  parallel and add them in slice order (:func:`add_partials`).
- **attention**: keys in tiles of ``ATT_TILE`` = 64 absolute positions, merged in order
  (:mod:`numba_kernels.attention`).
- **sums over experts**: in top-k rank order, then the gated shared expert
  (:mod:`numba_kernels.moe`).
"""

from __future__ import annotations

import math

import numpy as np

from .tags import bits_to_f32, body, fma, fmul, widen

SLICE = 32
ATT_TILE = 64

F32 = np.float32
ZERO = F32(0.0)
ONE = F32(1.0)
TWO = F32(2.0)
HALF = F32(0.5)
INF = F32(np.inf)
LOG2E = F32(1.4426950408889634)
LN2 = F32(0.6931471805599453)
LN2_HI = F32(0.693145751953125)  # 16 significant bits: n * LN2_HI is exact
LN2_LO = F32(0.6931471805599453 - 0.693145751953125)
EXP_HI = F32(88.72283)  # exp overflows float32 above this
EXP_LO = F32(-103.972084)  # exp underflows to +0 below this
SQRT2M1 = F32(0.41421356237309503)
L2_EPS = F32(1e-6)
E2, E3, E4, E5, E6, E7 = (F32(1.0 / math.factorial(i)) for i in range(2, 8))
A3, A5, A7, A9, A11 = (F32(1.0 / i) for i in (3, 5, 7, 9, 11))


# ------------------------------------------------------------------------------------------------
# scalar math (float32 in, float32 out)
# ------------------------------------------------------------------------------------------------
@body
def pow2(n):
    """2**n for integer n in [-126, 127], exactly, from the exponent bits."""
    return bits_to_f32(np.int32((n + 127) << 23))  


@body
def exp32(x):
    """e**x: n = round(x·log2e), r = x − n·ln2 (two fma), degree-7 Taylor in fma on
    |r| ≤ ln2/2, times 2**n applied in two exact halves. Max rel. error ≈ 2e-7."""
    if x != x:
        return x
    if x > EXP_HI:
        return INF
    if x < EXP_LO:
        return ZERO
    n = int(math.floor(fmul(x, LOG2E) + HALF))  # CUDA's floor returns a float
    nf = F32(n)
    r = fma(-nf, LN2_HI, x)
    r = fma(-nf, LN2_LO, r)
    p = fma(E7, r, E6)
    p = fma(p, r, E5)
    p = fma(p, r, E4)
    p = fma(p, r, E3)
    p = fma(p, r, E2)
    p = fma(p, r, ONE)
    p = fma(p, r, ONE)
    n1 = n >> 1
    return fmul(fmul(p, pow2(n1)), pow2(n - n1))


@body
def log1p_unit(y):
    """log(1 + y) for y in [0, 1] as 2·atanh(s): s = y/(2+y) for y ≤ √2−1, otherwise
    log 2 + 2·atanh((u−2)/(u+2)) with u = 1 + y; |s| ≤ 0.172, odd series to s**11."""
    if y <= SQRT2M1:
        s = y / (TWO + y)
        base = ZERO
    else:
        u = ONE + y
        s = (u - TWO) / (u + TWO)
        base = LN2
    s2 = fmul(s, s)
    p = fma(A11, s2, A9)
    p = fma(p, s2, A7)
    p = fma(p, s2, A5)
    p = fma(p, s2, A3)
    t = fmul(fmul(s, s2), p)
    return fma(TWO, s + t, base)


@body
def sigmoid32(x):
    """1 / (1 + e**-x); below −EXP_HI, where e**-x overflows, e**x itself (1 + e**x rounds to 1
    there long before), so the subnormal tail is not flushed to 0."""
    if x < -EXP_HI:
        return exp32(x)
    return ONE / (ONE + exp32(-x))


@body
def silu32(x):
    """x / (1 + e**-x); below −EXP_HI, where e**-x overflows, x·e**x as (x·h)·h with
    h = e**(x/2) (normal down to x = 2·EXP_LO), so results there keep full precision; −0 at
    x = −inf (the limit)."""
    if x < -EXP_HI:
        h = exp32(fmul(x, HALF))
        if h == ZERO:
            return -ZERO
        return fmul(fmul(x, h), h)
    return x / (ONE + exp32(-x))


@body
def softplus32(x):
    """log(1 + e**x) = max(x, 0) + log1p(e**-|x|)."""
    m = x if x > ZERO else ZERO
    return m + log1p_unit(exp32(-abs(x)))


# ------------------------------------------------------------------------------------------------
# the canonical dot product
# ------------------------------------------------------------------------------------------------
@body
def fma_chain(a, b, n, x):
    """Σ a[e ^ x]·b[e ^ x] over e < n as an fma chain from +0 in e order: with n ≤ SLICE, one
    slice partial of the canonical dot. ``a``, ``b``: 1-D views starting at the first term; ``b``
    (the weight of a linear layer, an expert) may hold bf16 bit patterns (uint16), widened
    exactly (``widen``): the same chain as on the widened float32 weights. ``x``: an XOR swizzle
    of the index (0 for plain vectors)."""
    part = ZERO
    for e in range(n):
        part = fma(a[e ^ x], widen(b[e ^ x]), part)
    return part


@body
def add_partial(acc, part):
    """One step of the ordered sum: the next slice's partial added to the accumulator."""
    return acc + part


@body
def add_partials(acc, parts, m):
    """``acc`` + parts[0] + … + parts[m−1], left to right (slice partials computed in parallel),
    with the loads of eight partials issued before their adds (a block's partials in shared
    memory: one load latency per eight adds, not one per add)."""
    s = 0
    while s + 8 <= m:
        p0, p1, p2, p3 = parts[s], parts[s + 1], parts[s + 2], parts[s + 3]
        p4, p5, p6, p7 = parts[s + 4], parts[s + 5], parts[s + 6], parts[s + 7]
        acc = add_partial(add_partial(add_partial(add_partial(acc, p0), p1), p2), p3)
        acc = add_partial(add_partial(add_partial(add_partial(acc, p4), p5), p6), p7)
        s += 8
    while s < m:
        acc = add_partial(acc, parts[s])
        s += 1
    return acc


@body
def dot(a, b, n):
    """Σ a[i]·b[i] for i < n (1-D views) in the canonical slice order."""
    acc = ZERO
    for k0 in range(0, n, SLICE):
        acc = add_partial(acc, fma_chain(a[k0:], b[k0:], min(SLICE, n - k0), 0))
    return acc


@body
def dot_rows(A, ra, ao, B, rb, bo, n):
    """Σ_i A[ra, ao+i]·B[rb, bo+i], i < n, in the canonical slice order."""
    return dot(A[ra, ao:], B[rb, bo:], n)


# ------------------------------------------------------------------------------------------------
# indexing
# ------------------------------------------------------------------------------------------------
@body
def row_col(i, N):
    """A CUDA thread's flat index over [R, N] outputs as (row, column)."""
    r = i // N
    return r, i - r * N
