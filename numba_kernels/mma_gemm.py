"""exact-bf16 linear layers: every output a chain of the H200's bf16 MMA steps (issue #19).

``out[r, o] = Σ_k bf16(X[r, k])·bf16(W[o, k])`` accumulated as in ``numba_kernels/MMA.md`` §1: K in
steps of 16, in order, each step one ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``
whose c is the previous step's result (the first step's c is +0); a last step of fewer than 16
terms is the zero-padded one (a zero product is no term: same bits).

Shapes: X [≥R, K] float32; W [N, K] float32 holding bf16 values (rounded at load, so rounding
them again is the identity); out [≥R, N] float32.

One step (:func:`mma_step`) is the measured rule of :mod:`numba_kernels.mma` (``DEFAULT``),
specialised and in integer arithmetic on the fields, exact by construction:

1. NaN in, ∞·0, or +∞ with −∞ → ``0x7fffffff``; else any ∞ → that ∞;
2. term exponents are sums of exponent fields (subnormals count as −126), emax the largest;
3. every term truncated toward zero to a multiple of 2^g, g = max(emax − 25, −158);
4. the truncated terms added exactly (int64: 16 terms < 2^27 and c < 2^26 in grid units);
5. one rounding toward zero to float32; a zero result is +0.

``tests/test_mma_gemm.py`` checks :func:`mma_step` bitwise against the emulation (and so against
every recorded H200 output). Both operands are rounded float32 → bf16 (nearest even) as they are
read (:func:`bf16_of`), so attention can use the same step on Q, K, P and V.

- ``linear_mma_cpu`` (the twin): ``prange`` over outputs, :func:`mma_dot` each;
- ``linear_mma_naive`` (CUDA, one thread per output, the same body): the reference launch, and
  what runs under the simulator, which cannot run the inline PTX of a tensor-core kernel.
"""

from __future__ import annotations

import numpy as np

from .exact import silu32
from .tags import bits_to_f32, body, cuda, fmul, grid1, kernel, launch, launcher, prange, scratch, twin, wbits

MMA_K = 16  # terms per MMA step
MMA_GRID_FLOOR = -158  # the alignment grid never goes below 2^-158 (mma.GRID_FLOOR)
MMA_NAN = 0x7FFFFFFF  # the NaN the H200 writes (mma.NAN_CUDA)
PACK_ERROR = "xp: the packed output needs uint32 [>= R, >= (offset + width)/2] and an even offset and width"
XP_ERROR = "linear_mma: xp must be uint32 [>= R, K/2]"


@body
def bf16_of(u):
    """bf16 bits (int64) of the float32 with bits ``u``: round to nearest even; NaN → quiet NaN
    with its sign (``mma.f32_to_bf16``)."""
    u = np.int64(u) & 0xFFFFFFFF
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return ((u >> 16) & 0x8000) | 0x7FC0
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


@body
def bf16_one(x):
    """bf16 bits (int64) of the float32 x for a packed output: :func:`bf16_of`, every NaN as the
    one quiet NaN 0x7fc0 (a NaN's sign is not part of the contract -- the GPU's and the CPU's
    float32 NaNs may differ in it -- and the MMA makes any NaN input the same NaN output)."""
    u = np.int64(wbits(x)) & 0xFFFFFFFF
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return np.int64(0x7FC0)
    return bf16_of(u)


@body
def bf16_pair(lo, hi):
    """The bf16 pair of two float32 values as one word, ``lo`` in the low half (:func:`bf16_one`
    each): an MMA fragment register, as the GEMV and GEMM read X (``mma_tc.mma_pack_x_k``, which
    keeps a NaN's sign: the same MMA results)."""
    return np.uint32(bf16_one(lo) | (bf16_one(hi) << 16))


@body
def pack_span(out, r, c0, n, xp, i0, step):
    """The packed output of a producer op (``xp=``: norms, gates): xp[r, j] = bf16_pair(out[r, 2j],
    out[r, 2j + 1]) for j = c0/2 + i, i in range(i0, n/2, step) (c0 and n even)."""
    j0 = c0 >> 1
    for i in range(i0, n >> 1, step):
        j = j0 + i
        xp[r, j] = bf16_pair(out[r, 2 * j], out[r, 2 * j + 1])


@body
def unpack_at(xp, Xu, r, j):
    """Pair j of row r of packed X back to the float32 bits of its two bf16 values (Xu uint32)."""
    w = np.uint32(xp[r, j])
    Xu[r, 2 * j] = np.uint32((w & np.uint32(0xFFFF)) << np.uint32(16))
    Xu[r, 2 * j + 1] = np.uint32(w & np.uint32(0xFFFF0000))


@body
def mma_bitlen(x):
    """Bits of x ≥ 0 (0 → 0)."""
    n = 0
    while x >= 65536:
        x >>= 16
        n += 16
    while x > 0:
        x >>= 1
        n += 1
    return n


@body
def mma_round(S, g):
    """The float32 bits (int64) of S·2^g rounded toward zero (the MMA's one rounding); 0 → +0."""
    if S == 0:
        return np.int64(0)
    sign = np.int64(0)
    M = S
    if S < 0:
        sign = np.int64(0x80000000)
        M = -S
    p = mma_bitlen(M) - 1
    E = p + g
    if E >= -126:
        if p > 23:
            q = M >> (p - 23)
        else:
            q = M << (23 - p)
        if E > 127:
            return sign | np.int64(0x7F800000)
        return sign | ((E + 127) << 23) | (q & 0x7FFFFF)
    sh = g + 149  # subnormal: multiples of 2^-149
    if sh >= 0:
        q = M << sh
    elif -sh < 62:
        q = M >> (-sh)
    else:
        q = np.int64(0)
    if q == 0:
        return np.int64(0)
    return sign | q


@body
def mma_f32(d):
    """The float32 of MMA bits d (int64, low 32 bits)."""
    if d >= 0x80000000:
        d -= 0x100000000
    return bits_to_f32(np.int32(d))


@body
def mma_term(m, l, g):
    """m·2^l (m ≥ 0) truncated toward zero to a multiple of 2^g, in units of 2^g."""
    sh = l - g
    if sh >= 0:
        return m << sh
    if sh > -62:
        return m >> (-sh)
    return np.int64(0)


@body
def add_c_term(S, c, ec, fc, g):
    """S with the accumulator c (float32 bits, exponent field ec, fraction fc; not zero)
    truncated to the grid g and added with its sign."""
    t = mma_term(fc | 0x800000 if ec != 0 else fc, (ec if ec != 0 else 1) - 150, g)
    return S - t if (c >> 31) & 1 else S + t


@body
def mma_step(Au, ra, ca, Bu, rb, cb, sr, sc, n, c):
    """One MMA step of one output: c (float32 bits) + Σ_{k<n} a_k·b_k with a_k = bf16(Au[ra, ca+k])
    and b_k = bf16(Bu[rb + k·sr, cb + k·sc]) (Au, Bu: uint32 views of float32); n ≤ 16, the
    rest zero-padded. Returns the float32 bits (int64)."""
    c = np.int64(c) & 0xFFFFFFFF
    ec = (c >> 23) & 0xFF
    fc = c & 0x7FFFFF
    nan = False
    pinf = False
    ninf = False
    emax = np.int64(-(1 << 20))
    for k in range(n):
        a = bf16_of(wbits(Au[ra, ca + k]))
        b = bf16_of(wbits(Bu[rb + k * sr, cb + k * sc]))
        ea = (a >> 7) & 0xFF
        eb = (b >> 7) & 0xFF
        za = ea == 0 and (a & 0x7F) == 0
        zb = eb == 0 and (b & 0x7F) == 0
        if ea == 255 or eb == 255:
            if (ea == 255 and (a & 0x7F) != 0) or (eb == 255 and (b & 0x7F) != 0) or za or zb:
                nan = True
            elif ((a ^ b) >> 15) & 1:
                ninf = True
            else:
                pinf = True
            continue
        if za or zb:
            continue
        e = (ea if ea != 0 else 1) + (eb if eb != 0 else 1) - 254
        if e > emax:
            emax = e
    c_zero = ec == 0 and fc == 0
    if ec == 255:
        if fc != 0:
            nan = True
        elif (c >> 31) & 1:
            ninf = True
        else:
            pinf = True
    elif not c_zero:
        e = (ec if ec != 0 else 1) - 127
        if e > emax:
            emax = e
    if nan or (pinf and ninf):
        return np.int64(MMA_NAN)
    if pinf:
        return np.int64(0x7F800000)
    if ninf:
        return np.int64(0xFF800000)
    if emax == -(1 << 20):
        return np.int64(0)  # every term zero: +0
    g = emax - 25
    if g < MMA_GRID_FLOOR:
        g = MMA_GRID_FLOOR
    S = np.int64(0)
    for k in range(n):
        a = bf16_of(wbits(Au[ra, ca + k]))
        b = bf16_of(wbits(Bu[rb + k * sr, cb + k * sc]))
        ea = (a >> 7) & 0xFF
        eb = (b >> 7) & 0xFF
        ma = a & 0x7F
        mb = b & 0x7F
        if (ea == 0 and ma == 0) or (eb == 0 and mb == 0):
            continue
        if ea != 0:
            ma |= 0x80
        if eb != 0:
            mb |= 0x80
        t = mma_term(ma * mb, (ea if ea != 0 else 1) + (eb if eb != 0 else 1) - 268, g)
        if ((a ^ b) >> 15) & 1:
            S -= t
        else:
            S += t
    return mma_round(S if c_zero else add_c_term(S, c, ec, fc, g), g)


@body
def mma_dot(Au, ra, ca, Bu, rb, cb, sr, sc, K):
    """Float32 bits of the K-term dot of :func:`mma_step`'s operands: steps of 16 in order, each
    step's c the previous result, from +0."""
    d = np.int64(0)
    for s in range(0, K, MMA_K):
        d = mma_step(Au, ra, ca + s, Bu, rb + s * sr, cb + s * sc, sr, sc, min(MMA_K, K - s), d)
    return d


@body
def linear_mma_at(Xu, Wu, outu, r, o):
    outu[r, o] = mma_dot(Xu, r, 0, Wu, o, 0, 0, 1, Wu.shape[1])


@body
def mma_decode(Au, r, K, M, L):
    """Row r of Au (uint32 view of float32), K columns, as bf16 fields: M[r, k] the signed significand (the
    implicit bit included; 0 for ±0), L[r, k] the exponent field (1 for a subnormal). Returns
    True when the row holds ±∞ or NaN (its outputs take :func:`mma_dot`)."""
    special = False
    for k in range(K):
        a = bf16_of(wbits(Au[r, k]))
        ea = (a >> 7) & 0xFF
        m = a & 0x7F
        if ea == 255:
            special = True
        if ea != 0:
            m |= 0x80
        if (a >> 15) & 1:
            m = -m
        M[r, k] = m
        L[r, k] = ea if ea != 0 else 1
    return special


@body
def mma_step_dec(XM, XL, r, WM, WL, o, k0, n, c):
    """:func:`mma_step` on decoded finite operands (:func:`mma_decode`); c may be anything."""
    c = np.int64(c) & 0xFFFFFFFF
    ec = (c >> 23) & 0xFF
    fc = c & 0x7FFFFF
    if ec == 255:
        return np.int64(MMA_NAN) if fc != 0 else c
    emax = np.int64(-(1 << 20))
    for k in range(k0, k0 + n):
        if XM[r, k] != 0 and WM[o, k] != 0:
            e = np.int64(XL[r, k] + WL[o, k])
            if e > emax:
                emax = e
    emax -= 254
    c_zero = ec == 0 and fc == 0
    if not c_zero:
        e = (ec if ec != 0 else 1) - 127
        if e > emax:
            emax = e
    if emax < -(1 << 19):
        return np.int64(0)
    g = emax - 25
    if g < MMA_GRID_FLOOR:
        g = MMA_GRID_FLOOR
    S = np.int64(0)
    for k in range(k0, k0 + n):
        p = np.int64(XM[r, k]) * np.int64(WM[o, k])
        if p != 0:
            t = mma_term(p if p > 0 else -p, np.int64(XL[r, k] + WL[o, k]) - 268, g)
            if p > 0:
                S += t
            else:
                S -= t
    return mma_round(S if c_zero else add_c_term(S, c, ec, fc, g), g)


@body
def linear_mma_dec_at(Xu, Wu, XM, XL, xs, WM, WL, ws, outu, r, o):
    """One output from decoded rows (:func:`mma_step_dec`), or :func:`mma_dot` where the row or
    the weight row holds ±∞/NaN: the same bits either way (``tests/test_mma_gemm.py``)."""
    K = Wu.shape[1]
    if xs[r] or ws[o]:
        outu[r, o] = mma_dot(Xu, r, 0, Wu, o, 0, 0, 1, K)
        return
    d = np.int64(0)
    for s in range(0, K, MMA_K):
        d = mma_step_dec(XM, XL, r, WM, WL, o, s, min(MMA_K, K - s), d)
    outu[r, o] = d


@twin("linear_mma", parallel=True)
def linear_mma_cpu(X, W, out, R, xp=None):
    """exact-bf16 ``out[r, o] = Σ_k bf16(X[r, k])·W[o, k]`` (MMA steps of 16) for r < R.
    X: [≥R, K]; W: [N, K] (bf16 values); out: [≥R, N]; all float32, C-contiguous. The rows of X
    and W are decoded to bf16 fields once (:func:`mma_decode`), then every output runs its steps
    on the fields (:func:`mma_step_dec`). ``xp`` (optional, uint32 [≥R, K/2]): X's bf16 pairs as
    a producer op wrote them beside X (:func:`pack_span`); when given, the bf16 values are read
    from it, not from X (the same values when xp is X's packing, which the caller guarantees)."""
    N, K = W.shape
    if xp is not None:
        if 2 * xp.shape[1] != K or xp.shape[0] < R:
            raise ValueError(XP_ERROR)
        Xu = np.empty((R, K), np.uint32)
        for r in prange(R):
            for j in range(K >> 1):
                unpack_at(xp, Xu, r, j)
    else:
        Xu = X.view(np.uint32)  # W as it is: float32 or bf16 bits (uint16), read through wbits
    outu = out.view(np.uint32)
    XM = np.empty((R, K), np.int16)
    XL = np.empty((R, K), np.int16)
    WM = np.empty((N, K), np.int16)
    WL = np.empty((N, K), np.int16)
    xs = np.zeros(R, np.bool_)
    ws = np.zeros(N, np.bool_)
    for r in prange(R):
        xs[r] = mma_decode(Xu, r, K, XM, XL)
    for o in prange(N):
        ws[o] = mma_decode(W, o, K, WM, WL)
    for ro in prange(R * N):
        r = ro // N
        linear_mma_dec_at(Xu, W, XM, XL, xs, WM, WL, ws, outu, r, ro - r * N)


@twin("mma_steps", parallel=True, host=True)
def mma_steps_cpu(A, B, C, out):
    """One MMA step per output, for checking :func:`mma_step` against recorded tiles: out[t, i, j]
    = bits of C[t, i, j] + Σ_k A[t, i, k]·B[t, k, j]. A [T, 16, 16], B [T, 16, 8] float32 (bf16
    values), C [T, 16, 8] float32; out [T, 16, 8] uint32."""
    T = A.shape[0]
    A2 = A.reshape(T * 16, 16).view(np.uint32)
    B2 = B.reshape(T * 16, 8).view(np.uint32)
    C2 = C.reshape(T * 16, 8).view(np.uint32)
    for t in prange(T):
        for i in range(16):
            for j in range(8):
                out[t, i, j] = mma_step(A2, t * 16 + i, 0, B2, t * 16, j, 1, 0, 16, C2[t * 16 + i, j])


@kernel
def linear_mma_naive_k(Xu, Wu, outu, R):
    i = cuda.grid(1)
    N = Wu.shape[0]
    if i < R * N:
        r = i // N
        linear_mma_at(Xu, Wu, outu, r, i - r * N)


@kernel
def mma_unpack_x_k(xp, Xu, R):
    i = cuda.grid(1)
    h = xp.shape[1]
    if i < R * h:
        r = i // h
        unpack_at(xp, Xu, r, i - r * h)


@launcher(of="linear_mma")
def linear_mma_naive(X, W, out, R, xp=None):
    """One thread per output, the twin's body (the MMA emulated in integer arithmetic); with
    ``xp``, X's bf16 values unpacked from it first (into kernel-owned scratch), as the twin does."""
    Xu = X.view(np.uint32)
    if xp is not None:
        K = W.shape[1]
        if 2 * xp.shape[1] != K or xp.shape[0] < R:
            raise ValueError(XP_ERROR)
        Xu = scratch("linear_mma.xu", R * K, np.uint32)[:R * K].reshape(R, K)
        launch(mma_unpack_x_k, *grid1(R * (K // 2)), xp, Xu, R)
    launch(linear_mma_naive_k, *grid1(R * W.shape[0]), Xu, W, out.view(np.uint32), R)


@launcher("linear_mma")
def linear_mma_cuda(X, W, out, R, xp=None):
    """exact-bf16 linear (see the twin)."""
    linear_mma_naive(X, W, out, R, xp)


# ------------------------------------------------------------------------------------------------
# MoE experts on the MMA (shapes and routing as numba_kernels.moe)
# ------------------------------------------------------------------------------------------------
@body
def moe_up_mma_at(Xu, G2u, U2u, idx, I, act, rq, i):
    """act[rq, i] = silu(MMA-dot(x_r, G[e, i]))·MMA-dot(x_r, U[e, i]) for rank q of row r."""
    k = idx.shape[1]
    r = rq // k
    row = idx[r, rq - r * k] * I + i
    H = Xu.shape[1]
    act[rq, i] = fmul(silu32(mma_f32(mma_dot(Xu, r, 0, G2u, row, 0, 0, 1, H))),
                      mma_f32(mma_dot(Xu, r, 0, U2u, row, 0, 0, 1, H)))


@body
def moe_down_mma_at(actu, D2u, idx, H, yu, rq, d):
    k = idx.shape[1]
    r = rq // k
    yu[rq, d] = mma_dot(actu, rq, 0, D2u, idx[r, rq - r * k] * H + d, 0, 0, 1, actu.shape[1])


@twin("moe_up_mma", parallel=True)
def moe_up_mma_cpu(X, G2, U2, idx, I, act, R):
    """exact-bf16 ``moe_up``: the expert dots on the MMA (G2, U2 bf16 values)."""
    Xu = X.view(np.uint32)  # G2, U2 as they are: float32 or bf16 bits (uint16)
    for rqi in prange(R * idx.shape[1] * I):
        rq = rqi // I
        moe_up_mma_at(Xu, G2, U2, idx, I, act, rq, rqi - rq * I)


@twin("moe_down_mma", parallel=True)
def moe_down_mma_cpu(act, D2, idx, H, y, R):
    """exact-bf16 ``moe_down`` (D2 bf16 values)."""
    actu = act.view(np.uint32)
    yu = y.view(np.uint32)  # D2 as it is: float32 or bf16 bits (uint16)
    for rqd in prange(R * idx.shape[1] * H):
        rq = rqd // H
        moe_down_mma_at(actu, D2, idx, H, yu, rq, rqd - rq * H)


@kernel
def moe_up_mma_k(Xu, G2u, U2u, idx, I, act, R):
    i = cuda.grid(1)
    if i < R * idx.shape[1] * I:
        rq = i // I
        moe_up_mma_at(Xu, G2u, U2u, idx, I, act, rq, i - rq * I)


@launcher("moe_up_mma")
def moe_up_mma_cuda(X, G2, U2, idx, I, act, R):
    launch(moe_up_mma_k, *grid1(R * idx.shape[1] * I), X.view(np.uint32), G2, U2, idx, I, act, R)


@kernel
def moe_down_mma_k(actu, D2u, idx, H, yu, R):
    i = cuda.grid(1)
    if i < R * idx.shape[1] * H:
        rq = i // H
        moe_down_mma_at(actu, D2u, idx, H, yu, rq, i - rq * H)


@launcher("moe_down_mma")
def moe_down_mma_cuda(act, D2, idx, H, y, R):
    launch(moe_down_mma_k, *grid1(R * idx.shape[1] * H), act.view(np.uint32), D2, idx, H, y.view(np.uint32), R)
