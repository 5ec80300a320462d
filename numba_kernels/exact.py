"""The exact-mode arithmetic: one Python source, compiled for the CPU twin and for CUDA.

These are plain Python functions. :func:`specialise` clones them with a target's primitives as
globals and compiles them with that target's decorator (``numba.njit`` for the CPU twin,
``numba.cuda.jit(device=True)`` for the GPU), so both targets run the same float32 operations in
the same order (DESIGN.md §3):

- every multiply-add is an explicit ``fma``; every other multiply is ``fmul`` (on CUDA
  ``__fmul_rn``, which the compiler may not contract into an FMA; on the CPU a plain multiply,
  which LLVM does not contract without fast-math);
- ``exp32``, ``log1p_unit``, ``sigmoid32``, ``softplus32``, ``silu32`` are our own (range
  reduction + polynomial in fma), never libm or libdevice;
- ``/`` and ``sqrt`` are IEEE on both targets; literals are float32 constants.

Canonical reduction orders (independent of row counts, chunk starts and sessions):

- **dot** of length n: slices of ``SLICE`` = 32 consecutive terms; inside a slice an fma chain
  from 0 in index order; slice partials added left to right into an accumulator that starts at
  +0. Linear layers, norms, L2 norms, attention scores and the DeltaNet's ``Sᵀk``/``Sᵀq`` all use
  it.
- **attention**: keys in tiles of ``ATT_TILE`` = 64 absolute positions; per tile the max score,
  ``p = exp(s - m)``, the sum of ``p`` and ``Σ p·v`` (fma chain) in key order; tiles merged in
  order with rescaling by ``exp(m_old - m_new)`` / ``exp(m_tile - m_new)``. Keys after the
  query's position are never visited.
- **sums over experts**: in top-k rank order, then the gated shared expert.
"""

from __future__ import annotations

import math
import types

import numpy as np

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
def pow2(n):
    """2**n for integer n in [-126, 127], exactly, from the exponent bits."""
    return bits_to_f32(np.int32((n + 127) << 23))  # noqa: F821 (target primitive)


def exp32(x):
    """e**x: n = round(x·log2e), r = x − n·ln2 (two fma), degree-7 Taylor in fma on
    |r| ≤ ln2/2, times 2**n applied in two exact halves. Max rel. error ≈ 2e-7."""
    if x != x:
        return x
    if x > EXP_HI:
        return INF
    if x < EXP_LO:
        return ZERO
    n = int(math.floor(fmul(x, LOG2E) + HALF))  # noqa: F821 (CUDA floor returns a float)
    nf = F32(n)
    r = fma(-nf, LN2_HI, x)  # noqa: F821
    r = fma(-nf, LN2_LO, r)  # noqa: F821
    p = fma(E7, r, E6)  # noqa: F821
    p = fma(p, r, E5)  # noqa: F821
    p = fma(p, r, E4)  # noqa: F821
    p = fma(p, r, E3)  # noqa: F821
    p = fma(p, r, E2)  # noqa: F821
    p = fma(p, r, ONE)  # noqa: F821
    p = fma(p, r, ONE)  # noqa: F821
    n1 = n >> 1
    return fmul(fmul(p, pow2(n1)), pow2(n - n1))  # noqa: F821


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
    s2 = fmul(s, s)  # noqa: F821
    p = fma(A11, s2, A9)  # noqa: F821
    p = fma(p, s2, A7)  # noqa: F821
    p = fma(p, s2, A5)  # noqa: F821
    p = fma(p, s2, A3)  # noqa: F821
    t = fmul(fmul(s, s2), p)  # noqa: F821
    return fma(TWO, s + t, base)  # noqa: F821


def sigmoid32(x):
    """1 / (1 + e**-x); below −EXP_HI, where e**-x overflows, e**x itself (1 + e**x rounds to 1
    there long before), so the subnormal tail is not flushed to 0."""
    if x < -EXP_HI:
        return exp32(x)
    return ONE / (ONE + exp32(-x))


def silu32(x):
    """x / (1 + e**-x); below −EXP_HI, where e**-x overflows, x·e**x as (x·h)·h with
    h = e**(x/2) (normal down to x = 2·EXP_LO), so results there keep full precision; −0 at
    x = −inf (the limit)."""
    if x < -EXP_HI:
        h = exp32(fmul(x, HALF))  # noqa: F821
        if h == ZERO:
            return -ZERO
        return fmul(fmul(x, h), h)  # noqa: F821
    return x / (ONE + exp32(-x))


def softplus32(x):
    """log(1 + e**x) = max(x, 0) + log1p(e**-|x|)."""
    m = x if x > ZERO else ZERO
    return m + log1p_unit(exp32(-abs(x)))


# ------------------------------------------------------------------------------------------------
# the canonical dot product
# ------------------------------------------------------------------------------------------------
def dot_rows(A, ra, ao, B, rb, bo, n):
    """Σ_i A[ra, ao+i]·B[rb, bo+i], i < n, in the canonical slice order."""
    acc = ZERO
    k0 = 0
    while k0 < n:
        k1 = min(k0 + SLICE, n)
        part = ZERO
        for i in range(k0, k1):
            part = fma(A[ra, ao + i], B[rb, bo + i], part)  # noqa: F821
        acc = acc + part
        k0 = k1
    return acc


def dot_col(S, h, j, B, rb, bo, n):
    """Σ_i S[h, i, j]·B[rb, bo+i], i < n (a column of a DeltaNet state), canonical order."""
    acc = ZERO
    k0 = 0
    while k0 < n:
        k1 = min(k0 + SLICE, n)
        part = ZERO
        for i in range(k0, k1):
            part = fma(S[h, i, j], B[rb, bo + i], part)  # noqa: F821
        acc = acc + part
        k0 = k1
    return acc


def rms_scale(ss, n, eps):
    """1 / sqrt(ss / n + eps) in float32 (``ss``: the canonical dot of a row with itself)."""
    return ONE / math.sqrt(ss / F32(n) + F32(eps))


def rms_inv(X, r, off, n, eps):
    """1 / sqrt(mean(x²) + eps) over X[r, off:off+n], all in float32: ``eps`` is rounded to
    float32 first (a Python float would make the CPU twin add, sqrt and divide in float64)."""
    return rms_scale(dot_rows(X, r, off, X, r, off, n), n, eps)


def l2_inv(X, r, off, n):
    """1 / sqrt(Σ x² + 1e-6) over X[r, off:off+n] (FLA's l2norm)."""
    return ONE / math.sqrt(dot_rows(X, r, off, X, r, off, n) + L2_EPS)


# ------------------------------------------------------------------------------------------------
# per-element bodies shared by the CPU loops and the CUDA threads
# ------------------------------------------------------------------------------------------------
def conv_channel(X, xo, W, state, out, c, T, K, cap, capture):
    """Causal depthwise conv + SiLU for channel c over T rows. X[t, xo + c] are the inputs,
    W[c, :K] the taps (oldest first), state[:K-1, c] the previous inputs (oldest first; updated).
    With ``capture``, cap[t, :, c] receives the state after row t."""
    for t in range(T):
        acc = ZERO
        for j in range(K - 1):
            acc = fma(W[c, j], state[j, c], acc)  # noqa: F821
        x = X[t, xo + c]
        acc = fma(W[c, K - 1], x, acc)  # noqa: F821
        out[t, c] = silu32(acc)
        for j in range(K - 2):
            state[j, c] = state[j + 1, c]
        if K > 1:
            state[K - 2, c] = x
        if capture:
            for j in range(K - 1):
                cap[t, j, c] = state[j, c]


def gdn_column(Q, K_, V, vo, G, Beta, S, out, h, j, hk, dk, dv, T, cap, capture):
    """The gated delta rule for value head h, state column j, over T rows.

    Q, K_: [T, Hk·dk] (normalised; q scaled), key head hk; V[:, vo:]: [T, Hv·dv] values;
    G, Beta: [T, Hv];
    S: [Hv, dk, dv] (updated); out: [T, Hv·dv]. With ``capture``, cap[t, h, :, j] receives the
    column after row t."""
    ko = hk * dk
    for t in range(T):
        eg = exp32(G[t, h])
        for i in range(dk):
            S[h, i, j] = fmul(S[h, i, j], eg)  # noqa: F821
        kv = dot_col(S, h, j, K_, t, ko, dk)
        delta = fmul(V[t, vo + h * dv + j] - kv, Beta[t, h])  # noqa: F821
        for i in range(dk):
            S[h, i, j] = fma(K_[t, ko + i], delta, S[h, i, j])  # noqa: F821
        out[t, h * dv + j] = dot_col(S, h, j, Q, t, ko, dk)
        if capture:
            for i in range(dk):
                cap[t, h, i, j] = S[h, i, j]


def rope_pair(X, r, o, half, c, s):
    """Rotate-half RoPE of the pair (X[r, o+i], X[r, o+i+half]) in place with cos c, sin s."""
    x1 = X[r, o]
    x2 = X[r, o + half]
    X[r, o] = fma(x1, c, -fmul(x2, s))  # noqa: F821
    X[r, o + half] = fma(x2, c, fmul(x1, s))  # noqa: F821


def merge_scale(m_old, m_tile):
    """Online-softmax tile merge: (m_new, alpha, beta) with alpha = exp(m_old − m_new),
    beta = exp(m_tile − m_new)."""
    m_new = m_old if m_old >= m_tile else m_tile
    return m_new, exp32(m_old - m_new), exp32(m_tile - m_new)


def merge_acc(a_old, alpha, a_tile, beta):
    return fma(a_old, alpha, fmul(a_tile, beta))  # noqa: F821


def route_row(L, r, E, topk, renorm, P, idx, wts):
    """Softmax over L[r, :E] into P[r], then top-k (ties to the lowest index) into idx[r], wts[r]
    in descending order, renormalised over the k when ``renorm``."""
    m = L[r, 0]
    for e in range(1, E):
        if L[r, e] > m:
            m = L[r, e]
    s = ZERO
    for e in range(E):
        p = exp32(L[r, e] - m)
        P[r, e] = p
        s = s + p
    for e in range(E):
        P[r, e] = P[r, e] / s
    for q in range(topk):
        best = -1
        for e in range(E):
            if P[r, e] >= ZERO and (best < 0 or P[r, e] > P[r, best]):
                best = e
        idx[r, q] = best
        wts[r, q] = P[r, best]
        P[r, best] = -ONE
    if renorm:
        t = ZERO
        for q in range(topk):
            t = t + wts[r, q]
        for q in range(topk):
            wts[r, q] = wts[r, q] / t


BODIES = [
    pow2, exp32, log1p_unit, sigmoid32, silu32, softplus32, dot_rows, dot_col, rms_scale, rms_inv, l2_inv,
    conv_channel, gdn_column, rope_pair, merge_scale, merge_acc, route_row,
]


def specialise(primitives: dict, jit, bodies=None) -> dict:
    """Compile the bodies for one target.

    ``primitives`` maps ``fma``, ``fmul`` and ``bits_to_f32`` to that target's functions; ``jit``
    compiles a Python function for the target. Returns {name: compiled function}; later bodies
    see earlier ones (and the primitives and this module's constants) as globals."""
    ns = {k: v for k, v in globals().items() if k.isupper() or k in ("math", "np")}
    ns["__name__"] = __name__  # numba rebuilds a cached function's environment from it
    ns.update(primitives)
    out = {}
    for f in bodies or BODIES:
        clone = types.FunctionType(f.__code__, ns, f.__name__, f.__defaults__, f.__closure__)
        clone.__doc__ = f.__doc__
        ns[f.__name__] = out[f.__name__] = jit(clone)
    return out
