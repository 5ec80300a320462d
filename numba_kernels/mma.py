"""Bit-exact CPU emulation of the H200's bf16 tensor-core MMA (issue #19, mode "exact-bf16").

One instruction, ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``, computes
``D = A·B + C`` for a 16×16 bf16 ``A`` (m, k), a 16×8 bf16 ``B`` (k, n) and a 16×8 float32
``C``. Each of the 128 outputs is a dot product of 16 bf16 pairs plus one float32 accumulator:

    d = c + Σ_{k<16} a_k·b_k

and the hardware does **not** compute it like sixteen IEEE fmas. The rule below is written on
values, not on an order of operations: the 17 terms have no order.

The MMA rule (``DEFAULT``; measured on an H200, 100 % of 1,174,272 recorded outputs)
------------------------------------------------------------------------------------------------
Notation: for a finite non-zero bf16 or float32 ``x`` with exponent field ``E`` and fraction
``F``, ``ex(x) = E − 127`` when ``E > 0`` (= floor(log2|x|)).

1. **Specials first**, over the 16 pairs and c:

   - any NaN operand (a_k, b_k or c) → NaN;
   - a product ∞ × 0 → NaN (``inf_zero`` = NAN);
   - +∞ and −∞ both present among the products (∞ × finite non-zero, sign = sign(a)·sign(b))
     and c → NaN;
   - otherwise any ∞ → that ∞.

   Every NaN result is the single bit pattern ``0x7fffffff`` (``nan_bits``); no payload or sign
   is propagated.
2. **Products are exact.** a·b is the integer product of the two 8-bit significands (hidden bit
   included) times 2^(sum of the two LSB exponents): up to 16 significant bits, with an
   exponent that may lie far outside float32's range (2^100·2^100 = 2^200 is an ordinary term;
   nothing overflows or underflows at this stage, ``prod_ovf`` = EXACT).
3. **Exponents of terms.** For a non-zero product, ``e_k = ex(a_k) + ex(b_k)``: the sum of the
   exponent fields, *not* the product's own exponent (1.5·1.5 = 2.25 has e_k = 0, not 1). For a
   non-zero c, ``e_c = ex(c)``. Zero terms have no exponent. ``emax`` = the largest of them.
   A bf16 subnormal input (exponent field 0, F ≠ 0) counts as ex = −126 (``in_sub`` = FIELD),
   and so does a float32 subnormal c (``c_sub`` = FIELD); their values are exact.
4. **Alignment with truncation, on a grid that stops at 2^−158.** Let

       g = max(emax − 25, −158)        (``grid_floor`` = −158)

   Every non-zero term t (c included) is truncated toward zero to a multiple of ``2^g``, *each
   on its own* (a negative term moves up, a positive one down). Above the floor, the term with
   exponent emax keeps its 25 or 26 leading bits (a product in [2, 4)·2^emax keeps 27).
   The floor acts only when emax ≤ −134, i.e. when c = ±0 (a non-zero c has e_c ≥ −126) and
   every product is below 2^−133; equivalently, emax is taken as max(emax, −133). A product below
   2^−158 then contributes nothing.
5. **Exact sum** of the 17 truncated terms (an integer S in units of 2^g; |S| < 2^33).
6. **One rounding, toward zero, to float32.** |S|·2^g is truncated to 24 significant bits
   (``norm_round`` = RZ); a magnitude ≥ 2^128 gives ±∞ (``overflow`` = INF); below 2^−126 the
   result is truncated to a multiple of 2^−149 (``out_sub`` = RZ).
7. **Zero is +0.** A zero result is always +0 (``zero_sign`` = PLUS): when all 17 terms are zero
   (even 16 products −0 and c = −0), when the truncated terms cancel (S = 0), and when a
   non-zero S is truncated to zero by step 6 (|S|·2^g < 2^−149, either sign). The hardware
   wrote no −0 among the 1,174,272 recorded outputs.

With these, a product that is far below the grid contributes nothing (not even a sticky bit),
and the result can differ from the correctly rounded sum by more than one ulp of the result
when many small terms are each truncated.

What the recorded vectors establish, and the limits
---------------------------------------------------
``receipts/mma/h200-mma-vectors.npz``: 1,174,272 outputs recorded by ``tools/mma_vectors.py`` on
one NVIDIA H200 (driver 580.159.04, CUDA 13.0) in 36 categories (normal inputs, zeros,
cancellations, truncation edges, subnormal results / inputs / accumulators, float32 overflow,
products beyond float32, ±∞/NaN in A, B, C, signed zeros, random bit patterns). ``DEFAULT``
matches all of them bit for bit (``tests/test_mma.py``). Each part of the rule is pinned by the
outputs that a different choice would get wrong (counts over the whole file):

=============================  =========  ==================================================
change from ``DEFAULT``        wrong      where
=============================  =========  ==================================================
``in_sub`` LOG2 / DAZ          7,413 /    bf16 subnormal inputs
                               31,384
``c_sub`` LOG2 / DAZ           10,671 /   subnormal accumulators, subnormal results
                               68,470
``out_sub`` RNE / RNA /        25,782 /   subnormal results (RZ is right; FTZ: all 101,455
RZ24RNE / FTZ                  31,263 /   non-zero subnormal outputs wrong)
                               24,019 /
                               101,455
``grid_floor`` none            3          emax −134 (2), −136 (1): the hardware is 1 ulp
                                          below the unfloored rule
``grid_floor`` −159 / −157     2 / 10     emax −134 (both); −133 … −137 (−157)
``grid_floor`` −156 … −149     52 … 52,494
``overflow`` MAXFLT            130,855    overflow is ±∞, not ±FLT_MAX
``prod_ovf`` INF               75,726     products beyond 2^128 are exact terms
``inf_zero`` ZERO              10,907     ∞ × 0 is NaN
``zero_sign`` IEEE             5,124      5,120 all-(−0) products with c = −0; 4 negative
                                          sums (−3·2^−151, −1·2^−151) truncated to zero
``nan_bits`` 0x7fc00000        36,633     every NaN output is 0x7fffffff
``norm_round`` RNE             245,468    normal results are truncated, not rounded
=============================  =========  ==================================================

Limits (what one recording on one device does not settle):

- **The floor's evidence is thin and local.** Without a floor only 3 outputs differ (two with
  emax −134, one with −136); a floor of −159 gets 2 of them wrong, −157 gets 10 others wrong
  (emax −133 … −137). So −158 is pinned, but by 12 outputs with emax in −137 … −133, all in
  category ``subnormal_result``. No recorded output with emax = −135 or ≤ −137 tells the floor
  from no floor: that the bound holds there too (the simplest reading: a fixed lower bound on
  the grid) is not yet measured. ``tools/mma_vectors.py`` now has a category for it
  (``floor_edge``).
- **A non-zero sum truncated to zero is +0** rests on 4 outputs (all with a subnormal c);
  the exact-zero cases (5,120) are many. Category ``underflow_sign`` targets the former.
- Why −158 (2^−158 = 2^−149 · 2^−9; emax clamped at −133, the exponent of bf16's smallest
  subnormal) is not known; the rule states what the hardware does, not how.
- One GPU (H200, sm_90), one driver, one instruction shape and type
  (m16n8k16, bf16 → f32). ``wgmma.mma_async m64n8k16`` gave the same bits as ``mma.sync`` on
  512,000 outputs of normal tiles only; its special cases are not recorded.
- The earlier probe (3.1 M normal-range outputs, 100 %) and this file agree; sequential fp32 fma
  matched only 46–59 % of normal outputs there, exact-sum-then-round-to-nearest 57–70 %.

The other values of ``Rule``'s fields are kept for the recorder's analysis
(``tools/mma_vectors.py`` prints the match rate of every single change per category, and searches
for the best rule) and for ``harness mma-check FILE.npz --rule SPEC``:

- ``in_sub``, ``c_sub``: FIELD (ex = −126) · LOG2 (ex = floor(log2|x|)) · DAZ (a signed zero).
- ``out_sub``: RZ · RNE · RNA · RZ24RNE (24 significant bits, then RNE to 2^−149) · FTZ.
- ``grid_floor``: an integer, or ``none`` (no bound on g).
- ``overflow``: INF · MAXFLT. ``prod_ovf``: EXACT · INF (a product with e_k ≥ 128 is ±∞ on its
  own). ``inf_zero``: NAN · ZERO. ``zero_sign``: PLUS · IEEE (−0 when c = −0 and all 16
  products are −0, and a negative sum truncated to zero keeps its sign). ``nan_bits``: a pattern.
  ``norm_round``: RZ · RNE (a foil).

Implementations
---------------
- ``mma_m16n8k16(A, B, C, P)``: Numba ``@njit(cache=True)``, one tile, integer arithmetic on
  exponents and significands (exact by construction: |S| < 2^33, shifts bounded).
- ``mma_check(A, B, C, rule)``: n tiles ([n,16,16] u16, [n,16,8] u16, [n,16,8] f32 → f32),
  parallel over tiles (``prange``), never reducing across threads.
- ``ref_mma(A, B, C, rule)``: pure Python with ``fractions.Fraction``, written independently
  from the same rule text, for tests (on 216 fresh random tiles of every recorder category,
  27,648 outputs, it equals the Numba emulation bit for bit).
- ``explain_dot(arow, bcol, cbits, rule, hw_bits)``: the rule's steps for one output as text
  (terms, exponents, grid, what truncation removes, S), for studying a mismatch.

Layouts here are plain row-major (m, k) for A, (k, n) for B and (m, n) for C/D; the register
fragment layout of the instruction belongs to the kernels (``tools/mma_vectors.py``).
How GEMMs and attention compose this instruction in the exact-bf16 mode: ``MMA.md``.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
from numba import njit, prange

# ------------------------------------------------------------------------------------------------
# the rule's uncertain parts: named candidates
# ------------------------------------------------------------------------------------------------
SUB_FIELD, SUB_LOG2, SUB_DAZ = 0, 1, 2  # in_sub, c_sub
OUT_RZ, OUT_RNE, OUT_RZ24_RNE, OUT_FTZ, OUT_RNA = 0, 1, 2, 3, 4  # out_sub
OVF_INF, OVF_MAXFLT = 0, 1  # overflow
PROD_EXACT, PROD_INF = 0, 1  # prod_ovf
IZ_NAN, IZ_ZERO = 0, 1  # inf_zero
ZS_IEEE, ZS_PLUS = 0, 1  # zero_sign
RND_RZ, RND_RNE = 0, 1  # norm_round
NO_FLOOR = -(1 << 20)  # grid_floor: none
GRID_FLOOR = -158  # measured: the alignment grid never goes below 2^-158

NAMES = {
    "in_sub": {SUB_FIELD: "field", SUB_LOG2: "log2", SUB_DAZ: "daz"},
    "c_sub": {SUB_FIELD: "field", SUB_LOG2: "log2", SUB_DAZ: "daz"},
    "out_sub": {OUT_RZ: "rz", OUT_RNE: "rne", OUT_RZ24_RNE: "rz24rne", OUT_FTZ: "ftz", OUT_RNA: "rna"},
    "overflow": {OVF_INF: "inf", OVF_MAXFLT: "maxflt"},
    "prod_ovf": {PROD_EXACT: "exact", PROD_INF: "inf"},
    "inf_zero": {IZ_NAN: "nan", IZ_ZERO: "zero"},
    "zero_sign": {ZS_IEEE: "ieee", ZS_PLUS: "plus"},
    "norm_round": {RND_RZ: "rz", RND_RNE: "rne"},
}
FIELDS = ("in_sub", "c_sub", "out_sub", "grid_floor", "overflow", "prod_ovf", "inf_zero",
          "zero_sign", "nan_bits", "norm_round")
NAN_CUDA = 0x7FFFFFFF
QNAN = 0x7FC00000


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule: the fixed core plus a choice for each named part. The defaults are the measured
    H200 rule (``DEFAULT``); the other values are the alternatives the recorder's analysis and
    ``harness mma-check --rule`` compare against it."""

    in_sub: int = SUB_FIELD
    c_sub: int = SUB_FIELD
    out_sub: int = OUT_RZ
    grid_floor: int = GRID_FLOOR
    overflow: int = OVF_INF
    prod_ovf: int = PROD_EXACT
    inf_zero: int = IZ_NAN
    zero_sign: int = ZS_PLUS
    nan_bits: int = NAN_CUDA
    norm_round: int = RND_RZ

    def params(self) -> np.ndarray:
        """The int64 parameter vector the Numba functions take (order = ``FIELDS``)."""
        return np.array([getattr(self, f) for f in FIELDS], np.int64)

    def replace(self, **kw) -> "Rule":
        return dataclasses.replace(self, **kw)

    def label(self) -> str:
        """Short name of the fields that differ from ``DEFAULT`` ("rule" when none)."""
        parts = []
        for f in FIELDS:
            v, d = getattr(self, f), getattr(DEFAULT, f)
            if v != d:
                parts.append(f"{f}={describe(f, v)}")
        return ",".join(parts) or "rule"


def describe(field: str, value: int) -> str:
    if field == "nan_bits":
        return f"{value:#010x}"
    if field == "grid_floor":
        return "none" if value == NO_FLOOR else str(value)
    return NAMES[field].get(value, str(value))


def parse_rule(text: str, base: "Rule | None" = None) -> Rule:
    """``"out_sub=rne,grid_floor=-150"`` → Rule (names as in ``describe``; "" → base)."""
    r = base or DEFAULT
    for item in filter(None, (t.strip() for t in text.split(","))):
        if item == "rule":
            continue
        k, _, v = item.partition("=")
        if k not in FIELDS:
            raise ValueError(f"unknown rule field {k!r} (fields: {', '.join(FIELDS)})")
        if k == "nan_bits":
            val = int(v, 0)
        elif k == "grid_floor":
            val = NO_FLOOR if v == "none" else int(v)
        else:
            inv = {n: c for c, n in NAMES[k].items()}
            if v not in inv:
                raise ValueError(f"{k}: expected one of {', '.join(inv)}, got {v!r}")
            val = inv[v]
        r = r.replace(**{k: val})
    return r


DEFAULT = Rule()
_P_DEFAULT = DEFAULT.params()


# ------------------------------------------------------------------------------------------------
# Numba: integer arithmetic on fields
# ------------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _bitlen(x):
    """Number of bits of x ≥ 0 (0 → 0)."""
    n = 0
    while x >= 65536:
        x >>= 16
        n += 16
    while x > 0:
        x >>= 1
        n += 1
    return n


@njit(cache=True, inline="always")
def _ex16(e, f, mode):
    """ex() of a finite non-zero bf16 with exponent field e and fraction f."""
    if e != 0:
        return e - 127
    if mode == SUB_LOG2:
        return _bitlen(f) - 1 - 133  # value = f·2^-133
    return -126


@njit(cache=True, inline="always")
def _ex32(e, f, mode):
    """ex() of a finite non-zero float32 with exponent field e and fraction f."""
    if e != 0:
        return e - 127
    if mode == SUB_LOG2:
        return _bitlen(f) - 1 - 149  # value = f·2^-149
    return -126


@njit(cache=True, inline="always")
def _shift_rne(m, r):
    """m·2^-r rounded to nearest, ties to even (m ≥ 0, r ≥ 1)."""
    if r >= 62:
        return 0  # m < 2^34 here
    q = m >> r
    rem = m - (q << r)
    half = np.int64(1) << (r - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return q


@njit(cache=True, inline="always")
def _shift_rna(m, r):
    """m·2^-r rounded to nearest, ties away from zero (m ≥ 0, r ≥ 1)."""
    if r >= 62:
        return 0
    q = m >> r
    if m - (q << r) >= (np.int64(1) << (r - 1)):
        q += 1
    return q


@njit(cache=True)
def _dot_bits(A, B, Cb, i, j, P):
    """Bits (int64, low 32 used) of d[i, j] for one tile: A u16 [16,16], B u16 [16,8], Cb u32."""
    in_sub = P[0]
    c_sub = P[1]
    out_sub = P[2]
    grid_floor = P[3]
    overflow = P[4]
    prod_ovf = P[5]
    inf_zero = P[6]
    zero_sign = P[7]
    nan_bits = P[8]
    norm_round = P[9]

    cb = np.int64(Cb[i, j])
    sc = (cb >> 31) & 1
    ec = (cb >> 23) & 0xFF
    fc = cb & 0x7FFFFF

    # ---- pass 1: specials, zeros, emax ------------------------------------------------------
    nan = False
    pinf = False
    ninf = False
    nneg0 = 0  # products that are −0
    nterms = 0
    emax = NO_FLOOR
    for k in range(16):
        a = np.int64(A[i, k])
        b = np.int64(B[k, j])
        sa = (a >> 15) & 1
        ea = (a >> 7) & 0xFF
        fa = a & 0x7F
        sb = (b >> 15) & 1
        eb = (b >> 7) & 0xFF
        fb = b & 0x7F
        s = sa ^ sb
        if (ea == 255 and fa != 0) or (eb == 255 and fb != 0):
            nan = True
            continue
        za = ea == 0 and (fa == 0 or in_sub == SUB_DAZ)
        zb = eb == 0 and (fb == 0 or in_sub == SUB_DAZ)
        if ea == 255 or eb == 255:
            if za or zb:
                if inf_zero == IZ_NAN:
                    nan = True
                else:
                    nneg0 += s
                continue
            if s == 1:
                ninf = True
            else:
                pinf = True
            continue
        if za or zb:
            nneg0 += s
            continue
        e = _ex16(ea, fa, in_sub) + _ex16(eb, fb, in_sub)
        if prod_ovf == PROD_INF and e >= 128:
            if s == 1:
                ninf = True
            else:
                pinf = True
            continue
        nterms += 1
        if e > emax:
            emax = e
    c_zero = ec == 0 and (fc == 0 or c_sub == SUB_DAZ)
    if ec == 255:
        if fc != 0:
            nan = True
        elif sc == 1:
            ninf = True
        else:
            pinf = True
    elif not c_zero:
        nterms += 1
        e = _ex32(ec, fc, c_sub)
        if e > emax:
            emax = e
    if nan or (pinf and ninf):
        return nan_bits
    if pinf:
        return np.int64(0x7F800000)
    if ninf:
        return np.int64(0xFF800000)
    if nterms == 0:
        if zero_sign == ZS_IEEE and sc == 1 and nneg0 == 16:
            return np.int64(0x80000000)
        return np.int64(0)

    # ---- pass 2: truncate each term to the grid 2^g and add exactly -------------------------
    g = emax - 25
    if g < grid_floor:
        g = grid_floor
    S = np.int64(0)
    for k in range(16):
        a = np.int64(A[i, k])
        b = np.int64(B[k, j])
        ea = (a >> 7) & 0xFF
        eb = (b >> 7) & 0xFF
        fa = a & 0x7F
        fb = b & 0x7F
        if ea == 255 or eb == 255:
            continue  # only inf·0 as a zero product gets here
        if ea == 0 and (fa == 0 or in_sub == SUB_DAZ):
            continue
        if eb == 0 and (fb == 0 or in_sub == SUB_DAZ):
            continue
        if ea != 0:
            ma = fa | 0x80
            la = ea - 134  # value = ma·2^la
        else:
            ma = fa
            la = -133
        if eb != 0:
            mb = fb | 0x80
            lb = eb - 134
        else:
            mb = fb
            lb = -133
        m = ma * mb
        sh = la + lb - g
        if sh >= 0:
            t = m << sh
        elif sh > -62:
            t = m >> (-sh)
        else:
            t = np.int64(0)
        if ((a ^ b) >> 15) & 1:
            S -= t
        else:
            S += t
    if ec != 255 and not c_zero:
        if ec != 0:
            m = fc | 0x800000
            lc = ec - 150
        else:
            m = fc
            lc = -149
        sh = lc - g
        if sh >= 0:
            t = m << sh
        elif sh > -62:
            t = m >> (-sh)
        else:
            t = np.int64(0)
        if sc == 1:
            S -= t
        else:
            S += t

    # ---- one rounding to float32 -------------------------------------------------------------
    if S == 0:
        return np.int64(0)
    sign = np.int64(0)
    M = S
    if S < 0:
        sign = np.int64(0x80000000)
        M = -S
    p = _bitlen(M) - 1
    E = p + g
    if E >= -126:
        if p > 23:
            r = p - 23
            q = M >> r
            if norm_round == RND_RNE:
                q = _shift_rne(M, r)
                if q == (np.int64(1) << 24):
                    q >>= 1
                    E += 1
        else:
            q = M << (23 - p)
        if E > 127:
            if overflow == OVF_INF:
                return sign | np.int64(0x7F800000)
            return sign | np.int64(0x7F7FFFFF)
        return sign | ((E + 127) << 23) | (q & 0x7FFFFF)
    # subnormal range: the grid is 2^-149
    if out_sub == OUT_FTZ:
        return sign if zero_sign == ZS_IEEE else np.int64(0)
    sh = g + 149
    if sh >= 0:
        q = M << sh
    else:
        r = -sh
        if out_sub == OUT_RZ:
            q = M >> r if r < 62 else np.int64(0)
        elif out_sub == OUT_RNE:
            q = _shift_rne(M, r)
        elif out_sub == OUT_RNA:
            q = _shift_rna(M, r)
        else:  # OUT_RZ24_RNE
            if p > 23:
                M = (M >> (p - 23)) << (p - 23)
            q = _shift_rne(M, r)
    if q == 0 and zero_sign == ZS_PLUS:
        return np.int64(0)  # a sum that rounds to zero is +0, whatever its sign
    return sign | q  # q == 2^23 is the smallest normal, bit for bit


@njit(cache=True)
def _tile_bits(A, B, Cb, P, out):
    for i in range(16):
        for j in range(8):
            out[i, j] = _dot_bits(A, B, Cb, i, j, P)


@njit(cache=True)
def mma_m16n8k16(A, B, C, P=None):
    """One m16n8k16 MMA: A u16 [16,16] (m,k) bf16 bits, B u16 [16,8] (k,n), C f32 [16,8] →
    D f32 [16,8]. ``P`` = ``Rule.params()`` (default: ``DEFAULT``). Arrays C-contiguous."""
    Pv = _P_DEFAULT if P is None else P
    out = np.empty((16, 8), np.uint32)
    _tile_bits(A, B, C.view(np.uint32), Pv, out)
    return out.view(np.float32)


@njit(cache=True, parallel=True)
def _batch_bits(A, B, Cb, P, out):
    for t in prange(A.shape[0]):
        _tile_bits(A[t], B[t], Cb[t], P, out[t])


def _check_shapes(A, B, C):
    A = np.ascontiguousarray(A)
    B = np.ascontiguousarray(B)
    C = np.ascontiguousarray(C)
    if A.dtype != np.uint16 or B.dtype != np.uint16 or C.dtype != np.float32:
        raise TypeError(f"dtypes: A {A.dtype} (want uint16), B {B.dtype} (want uint16), "
                        f"C {C.dtype} (want float32)")
    n = A.shape[0] if A.ndim == 3 else -1
    if A.shape != (n, 16, 16) or B.shape != (n, 16, 8) or C.shape != (n, 16, 8):
        raise ValueError(f"shapes: A {A.shape}, B {B.shape}, C {C.shape}; "
                         "want [n,16,16], [n,16,8], [n,16,8]")
    return A, B, C


def mma_check_bits(A, B, C, rule: Rule = DEFAULT) -> np.ndarray:
    """The emulated D of n tiles as uint32 bits [n,16,8]."""
    A, B, C = _check_shapes(A, B, C)
    out = np.empty(C.shape, np.uint32)
    _batch_bits(A, B, C.view(np.uint32), rule.params(), out)
    return out


def mma_check(A, B, C, rule: Rule = DEFAULT) -> np.ndarray:
    """The emulated D = A·B + C of n tiles: A u16 [n,16,16], B u16 [n,16,8], C f32 [n,16,8]
    → f32 [n,16,8]."""
    return mma_check_bits(A, B, C, rule).view(np.float32)


# ------------------------------------------------------------------------------------------------
# slow reference: Fractions, written from the rule text
# ------------------------------------------------------------------------------------------------
def _floor_log2(x: Fraction) -> int:
    """floor(log2 x) for x > 0, by comparison with powers of two."""
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    return e


def _decode(bits: int, nexp: int, nfrac: int):
    """→ ("nan", sign) | ("inf", sign) | ("fin", sign, value ≥ 0, field, frac)."""
    sign = bits >> (nexp + nfrac) & 1
    field = bits >> nfrac & ((1 << nexp) - 1)
    frac = bits & ((1 << nfrac) - 1)
    bias = (1 << (nexp - 1)) - 1
    if field == (1 << nexp) - 1:
        return ("nan", sign) if frac else ("inf", sign)
    if field == 0:
        value = Fraction(frac) * Fraction(2) ** (1 - bias - nfrac)
    else:
        value = Fraction((1 << nfrac) + frac) * Fraction(2) ** (field - bias - nfrac)
    return ("fin", sign, value, field, frac)


def _ex_ref(d, mode: int) -> int:
    _, _, value, field, _ = d
    if field != 0:
        return _floor_log2(value)  # = field − 127 for a normal number
    return _floor_log2(value) if mode == SUB_LOG2 else -126


def _to_f32_bits(x: Fraction, rule: Rule) -> int:
    """Round x ≠ 0 to float32 bits under the rule's rounding choices."""
    sign = 0x80000000 if x < 0 else 0
    a = abs(x)
    E = _floor_log2(a)
    if E >= -126:
        quantum = Fraction(2) ** (E - 23)
        n = a / quantum
        q = int(n)
        if rule.norm_round == RND_RNE:
            fr = n - q
            if fr > Fraction(1, 2) or (fr == Fraction(1, 2) and q % 2 == 1):
                q += 1
        bits = ((E + 127) << 23) + (q - (1 << 23))
        if bits >= 0x7F800000:
            return sign | (0x7F800000 if rule.overflow == OVF_INF else 0x7F7FFFFF)
        return sign | bits
    if rule.out_sub == OUT_FTZ:
        return sign if rule.zero_sign == ZS_IEEE else 0
    quantum = Fraction(2) ** -149
    if rule.out_sub == OUT_RZ24_RNE:
        q24 = Fraction(2) ** (E - 23)
        a = int(a / q24) * q24
    n = a / quantum
    q = int(n)
    fr = n - q
    if rule.out_sub in (OUT_RNE, OUT_RZ24_RNE):
        if fr > Fraction(1, 2) or (fr == Fraction(1, 2) and q % 2 == 1):
            q += 1
    elif rule.out_sub == OUT_RNA and fr >= Fraction(1, 2):
        q += 1
    if q == 0 and rule.zero_sign == ZS_PLUS:
        return 0  # a sum that rounds to zero is +0
    return sign | q


def ref_dot(arow, bcol, cbits: int, rule: Rule = DEFAULT) -> int:
    """float32 bits of c + Σ a_k·b_k under ``rule``; arow, bcol: 16 bf16 bit patterns each."""
    ds = []
    nan = invalid = False
    infs = set()
    zero_signs = []
    for a, b in zip(arow, bcol):
        da, db = _decode(int(a), 8, 7), _decode(int(b), 8, 7)
        if rule.in_sub == SUB_DAZ:  # subnormals become signed zeros
            da = ("fin", da[1], Fraction(0), 0, 0) if da[0] == "fin" and da[3] == 0 else da
            db = ("fin", db[1], Fraction(0), 0, 0) if db[0] == "fin" and db[3] == 0 else db
        s = da[1] ^ db[1]
        if da[0] == "nan" or db[0] == "nan":
            nan = True
        elif da[0] == "inf" or db[0] == "inf":
            other = db if da[0] == "inf" else da
            if other[0] == "fin" and other[2] == 0:
                if rule.inf_zero == IZ_NAN:
                    invalid = True
                else:
                    zero_signs.append(s)
            else:
                infs.add(s)
        elif da[2] == 0 or db[2] == 0:
            zero_signs.append(s)
        else:
            e = _ex_ref(da, rule.in_sub) + _ex_ref(db, rule.in_sub)
            if rule.prod_ovf == PROD_INF and e >= 128:
                infs.add(s)
                continue
            ds.append((e, (-1) ** s * da[2] * db[2]))
    dc = _decode(int(cbits), 8, 23)
    if dc[0] == "nan":
        nan = True
    elif dc[0] == "inf":
        infs.add(dc[1])
    elif dc[2] != 0 and not (rule.c_sub == SUB_DAZ and dc[3] == 0):
        ds.append((_ex_ref(dc, rule.c_sub), (-1) ** dc[1] * dc[2]))
    if nan or invalid or len(infs) == 2:
        return rule.nan_bits
    if infs:
        return 0xFF800000 if 1 in infs else 0x7F800000
    if not ds:
        all_neg = dc[1] == 1 and len(zero_signs) == 16 and all(zero_signs)
        return 0x80000000 if rule.zero_sign == ZS_IEEE and all_neg else 0
    emax = max(e for e, _ in ds)
    g = max(emax - 25, rule.grid_floor)
    unit = Fraction(2) ** g
    total = sum((int(v / unit) * unit for _, v in ds), Fraction(0))  # int(): toward zero
    if total == 0:
        return 0
    return _to_f32_bits(total, rule)


def _f32_value(bits: int):
    d = _decode(int(bits), 8, 23)
    return None if d[0] != "fin" else (-1) ** d[1] * d[2]


def explain_dot(arow, bcol, cbits: int, rule: Rule = DEFAULT, hw_bits: "int | None" = None) -> str:
    """The rule's steps for one output, as text: each non-zero term with its exponent e, its value
    in units of the grid 2^g and what truncation leaves; S; the exact sum; the rule's result and,
    given ``hw_bits``, the hardware's (for studying a mismatch). Finite inputs only."""
    rows = []
    for k, (a, b) in enumerate(zip(arow, bcol)):
        da, db = _decode(int(a), 8, 7), _decode(int(b), 8, 7)
        if da[0] != "fin" or db[0] != "fin":
            return f"k={k}: a {int(a):04x} b {int(b):04x} is ±inf/NaN: rule step 1 (specials)"
        if da[2] == 0 or db[2] == 0:
            continue
        e = _ex_ref(da, rule.in_sub) + _ex_ref(db, rule.in_sub)
        rows.append((e, f"k={k:<2d} a {int(a):04x} b {int(b):04x}", (-1) ** (da[1] ^ db[1]) * da[2] * db[2]))
    dc = _decode(int(cbits), 8, 23)
    if dc[0] != "fin":
        return f"c {int(cbits):08x} is ±inf/NaN: rule step 1 (specials)"
    if dc[2] != 0:
        rows.append((_ex_ref(dc, rule.c_sub), f"c    {int(cbits):08x}     ", (-1) ** dc[1] * dc[2]))
    if not rows:
        return "all 17 terms zero → +0" if rule.zero_sign == ZS_PLUS else "all 17 terms zero"
    emax = max(r[0] for r in rows)
    g = max(emax - 25, rule.grid_floor)
    unit = Fraction(2) ** g
    out = [f"emax {emax}, grid 2^{g} (emax − 25 = {emax - 25}"
           + (f", floor {rule.grid_floor})" if rule.grid_floor != NO_FLOOR else ", no floor)")]
    S = 0
    for e, name, v in sorted(rows, key=lambda r: -r[0]):
        q = v / unit
        t = int(q)
        S += t
        out.append(f"  {name} e={e:5d}  {float(v):+.9e} = {float(q):+.6f}·2^{g} → {t:+d} (lost {float(q - t):+.6f})")
    exact = sum((r[2] for r in rows), Fraction(0))
    sub = Fraction(2) ** -149
    out.append(f"  S = {S:+d}·2^{g} = {float(S * unit / sub):+.6f}·2^-149; exact sum "
               f"{float(exact / sub):+.9f}·2^-149 ({float(exact):+.9e})")
    mine = ref_dot(arow, bcol, cbits, rule)
    out.append(f"  rule: {mine:08x} = {float(_f32_value(mine) / sub):+.1f}·2^-149")
    if hw_bits is not None:
        hv = _f32_value(int(hw_bits))
        txt = f"{float(hv / sub):+.1f}·2^-149" if hv is not None else "non-finite"
        out.append(f"  hardware: {int(hw_bits):08x} = {txt}")
    return "\n".join(out)


def ref_mma(A, B, C, rule: Rule = DEFAULT) -> np.ndarray:
    """Slow reference of one tile: A u16 [16,16], B u16 [16,8], C f32 [16,8] → u32 bits [16,8]."""
    Cb = np.ascontiguousarray(C, np.float32).view(np.uint32)
    out = np.empty((16, 8), np.uint32)
    for i in range(16):
        for j in range(8):
            out[i, j] = ref_dot(A[i, :], B[:, j], int(Cb[i, j]), rule)
    return out


# ------------------------------------------------------------------------------------------------
# bf16 helpers
# ------------------------------------------------------------------------------------------------
def f32_to_bf16(x) -> np.ndarray:
    """float32 → bf16 bits, round to nearest even (NaN → 0x7fc0 with the sign kept)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = np.where(nan, ((u >> 16) & 0x8000) | 0x7FC0, r)
    return r.astype(np.uint16)


def bf16_to_f32(bits) -> np.ndarray:
    """bf16 bits → float32 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)
