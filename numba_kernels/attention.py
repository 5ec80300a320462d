"""Causal GQA attention and the K/V cache write.

Shapes: Q [R, hq·D] (query row r at position start + r); kc, vc [max_ctx, hkv·D]; out [R, hq·D];
query head h reads KV head h // (hq / hkv).

The order, per (row, head): keys in tiles of ``ATT_TILE`` = 64 absolute positions, never past
the row's position. Per tile (:func:`tile_stats`): the scores ``s = dot(q, k)·scale``, the tile
max ``m`` (the first score, then strictly greater ones in key order), ``p = exp(s − m)``, ``Σp``
left to right and ``Σ p·v`` (an fma chain in key order, from +0). Tiles are merged left to right
(:func:`merge_stats`, :func:`merge_value`): tile 0 as it is, then ``m' = max(m, m_t)``,
``x' = x·exp(m − m') + x_t·exp(m_t − m')`` for ``Σp`` and each ``Σ p·v``; finally
``out = Σ p·v / Σp`` (:func:`attn_out`).

- ``attention_cpu`` (twin) and ``attention_tiled`` (CUDA, one block per (row, head)) run the
  same body, :func:`attend`: the block's threads share each tile's keys and value columns, with a
  barrier between the phases (a no-op on the CPU). The tiled kernel is the fallback for head dims
  whose tiles do not fit the fast kernels' shared memory;
- ``attention_prime`` (many rows) and ``attention_split`` (few rows) are generated
  (:func:`attention_source`, configuration :class:`AttnCfg`). A block owns BQ query vectors of one
  KV head (rows × the heads of its group): each 64-key tile of K and V is staged in shared memory
  once for all of them (``cp.async``), and the tile's two products are small register-tiled GEMMs
  whose per-element orders are the twin's: ``S = Q·Kᵀ`` (each score the canonical dot over D;
  ``D % 4 != 0`` zero-pads q and k: ``fma(0, 0, p)`` only changes the sign of a zero partial at
  the end of the last slice, and a total that starts at +0 is never −0), the row pass (the tile
  max by the twin's scan, NaN rule included; ``p = exp32(s − m)``; ``Σp`` left to right), then
  ``P·V`` (each output an fma chain over keys in order; in a tile that is partial for a vector its
  chain stops at the vector's last key). ``attention_prime`` loops over its vectors' tiles and
  merges in registers (query tiles of 64 rows, longest first); ``attention_split`` writes each
  tile's statistics (mt, Σp, Σ p·v) to kernel-owned buffers and a merge kernel
  (:func:`attention_merge_source`) folds them in tile order. Measured on an H200
  (``receipts/probes/h200-probe-attn.log``): the prime at 26-31 TFLOP/s (4k-32k context), decode
  19-446 µs.

With ``pos`` (the device-side position of a captured step) the split grid covers the cache's
capacity and tiles past a row's position exit at once. Which kernel runs is
:mod:`numba_kernels.dispatch`'s table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from . import dispatch
from .dispatch import SPLIT_BLOCKS, SPLIT_MAX_STATS_BYTES
from .exact import ATT_TILE, F32, ONE, SLICE, ZERO, dot_rows, exp32, fma_chain, row_col
from .tags import (MAX_SMEM, KernelSource, aligned, barrier, body, cuda, fma, fmul, generated, generator, grid1,
                   kernel, launch, launcher, prange, scratch, twin, zero_pos)

ATT_MAX_D = 1024  # head dim of the tiled kernel: its per-column accumulators live in shared memory


@body
def tile_stats(Q, r, qo, kc, vc, ko, D, scale, k0, n, sc, pv, lane, lanes):
    """Keys k0 … k0+n−1 (n ≤ ATT_TILE) for query row r: scores into sc[:n], then p = exp(s − m)
    over them; returns (m, Σp) and writes Σ p·v into pv[d] for d in range(lane, D, lanes).
    ``lanes`` threads share the work, lane ``lane`` taking every lanes-th key and column."""
    for j in range(lane, n, lanes):
        sc[j] = fmul(dot_rows(Q, r, qo, kc, k0 + j, ko, D), scale)
    barrier()
    mt = sc[0]
    for j in range(1, n):
        if sc[j] > mt:
            mt = sc[j]
    barrier()
    for j in range(lane, n, lanes):
        sc[j] = exp32(sc[j] - mt)
    barrier()
    lt = ZERO
    for j in range(n):
        lt = lt + sc[j]
    for d in range(lane, D, lanes):
        pv[d] = fma_chain(sc, vc[k0:, ko + d], n, 0)
    barrier()  # sc is read: the next tile may overwrite it
    return mt, lt


@body
def merge_scale(m_old, m_tile):
    """Online-softmax tile merge: (m_new, alpha, beta) with alpha = exp(m_old − m_new),
    beta = exp(m_tile − m_new)."""
    m_new = m_old if m_old >= m_tile else m_tile
    return m_new, exp32(m_old - m_new), exp32(m_tile - m_new)


@body
def merge_acc(a_old, alpha, a_tile, beta):
    return fma(a_old, alpha, fmul(a_tile, beta))


@body
def merge_stats(tix, m, l, mt, lt):
    """Tile tix's max mt and Σp lt folded into the running (m, l): returns (m, l, alpha, beta)
    for :func:`merge_value`; tile 0 is taken as it is."""
    if tix == 0:
        return mt, lt, ONE, ONE
    m_new, alpha, beta = merge_scale(m, mt)
    return m_new, merge_acc(l, alpha, lt, beta), alpha, beta


@body
def merge_value(tix, a, alpha, at, beta):
    """Tile tix's Σ p·v of one column folded into the running one."""
    if tix == 0:
        return at
    return merge_acc(a, alpha, at, beta)


@body
def attn_out(a, l):
    return a / l


@body
def attend(Q, kc, vc, out, r, h, kvh, pos, D, scale, sc, pv, acc, lane, lanes):
    """Query row r, head h (KV head kvh) at position pos over keys 0 … pos, tile by tile:
    out[r, h·D + d] for d in range(lane, D, lanes). sc [ATT_TILE], pv and acc [≥ D]: scratch."""
    qo = h * D
    ko = kvh * D
    m = ZERO
    l = ZERO
    for tix in range(pos // ATT_TILE + 1):
        k0 = tix * ATT_TILE
        mt, lt = tile_stats(Q, r, qo, kc, vc, ko, D, scale, k0, min(ATT_TILE, pos + 1 - k0), sc, pv, lane, lanes)
        m, l, alpha, beta = merge_stats(tix, m, l, mt, lt)
        for d in range(lane, D, lanes):
            acc[d] = merge_value(tix, acc[d], alpha, pv[d], beta)
    for d in range(lane, D, lanes):
        out[r, qo + d] = attn_out(acc[d], l)


@twin("attention", parallel=True)
def attention_cpu(Q, kc, vc, out, start, R, hq, hkv, D, scale):
    """Causal GQA attention; query row r at position start + r, head h reads KV head
    h // (hq / hkv). Q: [R, hq·D]; kc, vc: [max_ctx, hkv·D]; out: [R, hq·D]."""
    rep = hq // hkv
    for rh in prange(R * hq):
        r = rh // hq
        h = rh - r * hq
        attend(Q, kc, vc, out, r, h, h // rep, start + r, D, scale, np.empty(ATT_TILE, np.float32),
               np.empty(D, np.float32), np.empty(D, np.float32), 0, 1)


@kernel
def attention_tiled_k(Q, kc, vc, out, start, pb, hq, hkv, D, scale):
    h = cuda.blockIdx.y
    sc = cuda.shared.array(ATT_TILE, np.float32)
    pv = cuda.shared.array(ATT_MAX_D, np.float32)
    acc = cuda.shared.array(ATT_MAX_D, np.float32)
    r = cuda.blockIdx.x
    attend(Q, kc, vc, out, r, h, h // (hq // hkv), start + pb[0] + r, D, scale, sc, pv, acc, cuda.threadIdx.x,
           cuda.blockDim.x)


@launcher(of="attention")
def attention_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """One block per (row, head), tiles merged in order as they are computed. ``pos``: an int32
    [1] device array added to ``start`` (the device-side position of a captured step); None adds
    zero."""
    if D > ATT_MAX_D:
        raise ValueError(f"head_dim {D} > {ATT_MAX_D} is not supported by the CUDA attention")
    nt = max(32, min(1024, ((D + 31) // 32) * 32))
    launch(attention_tiled_k, (R, hq), nt, Q, kc, vc, out, start, zero_pos() if pos is None else pos, hq, hkv, D,
           F32(scale))


# ------------------------------------------------------------------------------------------------
# generated kernels: query-tiled prime, split-KV decode and its ordered merge
# ------------------------------------------------------------------------------------------------
def _need(ok, what):
    if not ok:
        raise ValueError(f"attention configuration: {what}")


def _ru(x, m):
    return (x + m - 1) // m * m


@dataclass(frozen=True)
class AttnCfg:
    """One kernel configuration: BQ vectors (RB = BQ // G rows × G heads) per block, NT threads.

    Q·Kᵀ: a thread owns TMS vectors × TNS keys; a warp's lanes are WSY × WSX (WSY·WSX = 32);
    thread vectors are ``wbase + ly + WSY·a``, keys ``kbase + lx + WSX·b`` (interleaved, so the
    128-bit loads of a quarter warp hit distinct banks). P·V: a thread owns TMO vectors × TNO
    columns in groups of min(4, ·) consecutive ones (128-bit loads of P, stored [key][vector],
    and of V), lanes WOY × WOX.
    ``mode``: "prime" (a block loops over its rows' tiles and merges) or "split" (a block does
    TPB consecutive tiles and writes their statistics). ``cpa``: stage K/V/Q with cp.async (else
    synchronous loads). ``kv_shared`` (split, TPB = 1): V reuses K's buffer after Q·Kᵀ (smaller
    footprint: more blocks per SM). ``vec``: 16-byte global loads (D % 4 == 0, aligned rows)."""
    mode: str
    D: int
    BQ: int
    NT: int
    G: int
    TMS: int
    TNS: int
    WSY: int
    TMO: int
    TNO: int
    WOY: int
    TPB: int = 1
    vec: bool = True
    cpa: bool = True
    kv_shared: bool = False
    name: str = ""

    RB = property(lambda s: s.BQ // s.G)  # rows per block
    WSX = property(lambda s: 32 // s.WSY)
    WOX = property(lambda s: 32 // s.WOY)
    DQ = property(lambda s: _ru(s.D, 4))  # q / k columns in shared memory (zero padded)
    DP = property(lambda s: s.DQ + 4)  # row stride of Qs / Ks
    NQT = property(lambda s: s.NT // s.BQ)  # row-pass threads per vector
    SEG = property(lambda s: ATT_TILE // s.NQT)  # keys per row-pass thread
    PS = property(lambda s: s.BQ + 4)  # row stride of Ss ([key][vector])

    @property
    def DPV(self):  # P·V columns computed (≥ D; the rest is padding, never stored)
        return (self.NT // 32) // (self.BQ // (self.WOY * self.TMO)) * self.WOX * self.TNO

    @property
    def VP(self):  # row stride of Vs
        return max(self.DPV, self.DQ) + 4

    def layout(self):
        """Offsets (floats) of Qs, Ks, Vs, Ss in the dynamic shared array, and its size in bytes."""
        qs = 0
        ks = qs + self.BQ * self.DP
        if self.kv_shared:
            vs = ks
            ss = ks + ATT_TILE * max(self.DP, self.VP)
        else:
            vs = ks + ATT_TILE * self.DP
            ss = vs + ATT_TILE * self.VP
        return qs, ks, vs, ss, 4 * (ss + ATT_TILE * self.PS)

    def check(self):
        _need(self.mode in ("prime", "split"), f"mode {self.mode!r}")
        _need(self.G <= self.BQ and self.NT % 32 == 0, f"{self.G} heads, {self.NT} threads")
        nw = self.NT // 32
        wr, wk = self.WSY * self.TMS, self.WSX * self.TNS
        _need(self.BQ % wr == 0 and ATT_TILE % wk == 0 and (self.BQ // wr) * (ATT_TILE // wk) == nw,
              f"Q·Kᵀ tiles of {self}")
        orow = self.WOY * self.TMO
        _need(self.BQ % orow == 0 and nw % (self.BQ // orow) == 0, f"P·V tiles of {self}")
        _need((self.TMO in (1, 2) or self.TMO % 4 == 0) and (self.TNO in (1, 2) or self.TNO % 4 == 0),
              f"P·V groups of {self}")
        _need(self.DPV >= self.D, f"P·V columns {self.DPV} < D = {self.D}")
        _need(self.NT % self.BQ == 0 and ATT_TILE % self.NQT == 0, "row pass threads")  # NQT threads per vector
        _need(not (self.kv_shared and (self.mode == "prime" or self.TPB != 1)), "kv_shared needs split, TPB 1")
        _need(not (self.vec and self.D % 4), "vector loads need D % 4 == 0")
        _need(self.layout()[4] + 5 * 4 * self.BQ * max(1, self.NQT) <= MAX_SMEM,
              f"{self.layout()[4]} bytes of shared memory for D = {self.D}")
        return self


def _pv_tno(D, BQ, NT, TMO, WOY):
    """TNO so that the P·V grid covers D columns."""
    wr = BQ // (WOY * TMO)  # warps along vectors
    per = (NT // 32) // wr * (32 // WOY)  # column groups
    tno = -(-D // per)
    return _ru(tno, 4) if tno > 2 else tno


def make_cfg(mode, D, BQ, NT, G, TMS, TNS, WSY, TMO, WOY, **kw):
    return AttnCfg(mode, D, BQ, NT, G, TMS, TNS, WSY, TMO, _pv_tno(D, BQ, NT, TMO, WOY), WOY, **kw).check()


# The menu. Prime: 64 vectors × 256 threads (Q·Kᵀ 4×4 and P·V 8×8 per thread at D = 256).
ATT_PRIME_VARIANTS = {
    "p64": dict(BQ=64, NT=256, G=1, TMS=4, TNS=4, WSY=4, TMO=8, WOY=4),
    "p64g8": dict(BQ=64, NT=256, G=8, TMS=4, TNS=4, WSY=4, TMO=8, WOY=4),
    "p64w2": dict(BQ=64, NT=256, G=1, TMS=4, TNS=4, WSY=2, TMO=8, WOY=4),  # Q·Kᵀ lanes 2 × 16
    "p32": dict(BQ=32, NT=128, G=1, TMS=4, TNS=4, WSY=4, TMO=8, WOY=4),
    # 512 threads: 16 warps hide latency; ≤ 128 registers (Q·Kᵀ 4×2, P·V 8×4 per thread)
    "p64t512": dict(BQ=64, NT=512, G=1, TMS=4, TNS=2, WSY=4, TMO=8, WOY=4),
    "p64t512g8": dict(BQ=64, NT=512, G=8, TMS=4, TNS=2, WSY=4, TMO=8, WOY=4),
}
# Split (decode / verify), chosen by the vectors per KV head (R · hq / hkv).
ATT_SPLIT_VARIANTS = {
    "s8": dict(BQ=8, NT=128, TMS=4, TNS=1, WSY=2, TMO=8, WOY=1),
    "s16": dict(BQ=16, NT=128, TMS=4, TNS=2, WSY=4, TMO=4, WOY=4),
    "s32": dict(BQ=32, NT=128, TMS=4, TNS=4, WSY=4, TMO=8, WOY=4),
    "s64": dict(BQ=64, NT=256, TMS=4, TNS=4, WSY=4, TMO=8, WOY=4),
    "s32w": dict(BQ=32, NT=256, TMS=4, TNS=2, WSY=4, TMO=4, WOY=8),  # 8 warps for 32 vectors
    "s64t512": dict(BQ=64, NT=512, TMS=4, TNS=2, WSY=4, TMO=8, WOY=4),
}


# ------------------------------------------------------------------------------------------------
# code generation: small device functions (force-inlined) carry the unrolled register tiles, so
# the kernel text stays short (Numba's front end is superlinear in statements); every index is a
# compile-time constant or one base + constant
# ------------------------------------------------------------------------------------------------
def _flat(*parts):
    out = []
    for p in parts:
        if isinstance(p, str):
            out.extend(p.split("\n"))
        else:
            out.extend(_flat(*p))
    return out


def _ind(n, *parts):
    return ["    " * n + ln if ln else ln for ln in _flat(*parts)]


def _tup(items):
    items = list(items)
    assert len(items) <= 30  # CPython builds longer displays through a list (Numba mishandles it)
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _tile(rows, cols, f):
    """A register tile as a tuple of row tuples: element (a, b) is f(a, b)."""
    return _tup(_tup(f(a, b) for b in range(cols)) for a in range(rows))


def _zeros(rows, cols):
    return _tile(rows, cols, lambda a, b: "F0")


def _copy(c, dst, arr, row, col, width):
    """Global arr[row, col : col + width] → sm[dst : dst + width] (width 4: 16 bytes; 1: scalar)."""
    if width == 4:
        if c.cpa:
            return f"cp16(sm, {dst}, {arr}, {row}, {col})"
        return [f"x0, x1, x2, x3 = ld4g({arr}, {row}, {col})", f"sts4(sm, {dst}, x0, x1, x2, x3)"]
    if c.cpa:
        return f"cp4(sm, {dst}, {arr}, {row}, {col})"
    return f"sm[{dst}] = {arr}[{row}, {col}]"


def _loader(c, buf, stride, arr, kstart, nk):
    """Stage rows kstart .. kstart + nk − 1 of arr[:, ko : ko + D] at sm[buf + j·stride]."""
    w = 4 if c.vec else 1
    cpr = c.D // w  # copies per row
    rs = "rsk" if arr == "kc" else "rsv"  # row stride of arr in elements
    if c.NT % cpr == 0:  # every thread copies one fixed column of rows lj, lj + NT/cpr, …
        step = c.NT // cpr
        if c.cpa:
            op = f"cp16f(sm, ld_, {arr}, ls_, {rs})" if w == 4 else f"cp4f(sm, ld_, {arr}, ls_, {rs})"
        else:
            op = (f"x0, x1, x2, x3 = ld4gf({arr}, ls_, {rs})\nsts4(sm, ld_, x0, x1, x2, x3)" if w == 4
                  else f"x0 = {arr}[({kstart}) + lj_, ko + lcol]\nsm[ld_] = x0")
        return _flat("lj_ = lj",
                     f"ld_ = {buf} + lj * {stride} + lcol",
                     f"ls_ = (({kstart}) + lj) * {rs} + ko + lcol",
                     f"lk_ = {nk}",
                     "while lj_ < lk_:",
                     _ind(1, op),
                     f"    lj_ += {step}",
                     f"    ld_ += {step * stride}",
                     f"    ls_ += {step} * {rs}")
    return [f"for e in range(tid, ({nk}) * {cpr}, {c.NT}):",
            f"    j = e // {cpr}",
            f"    cc = (e - j * {cpr}) * {w}"] + _ind(1, _copy(c, f"{buf} + j * {stride} + cc", arr,
                                                             f"{kstart} + j", "ko + cc", w))


def _qload(c, QS):
    """Q: vector v < nv is (row r0 + v // G, head hb + v % G); the others are zeros (never stored).
    Pad columns D .. DQ − 1 of Qs and Ks are zeroed (the loaders never write them)."""
    w = 4 if c.vec else 1
    cpr = c.D // w
    zero = f"sts4(sm, {QS} + v * {c.DP} + cc, F0, F0, F0, F0)" if w == 4 else f"sm[{QS} + v * {c.DP} + cc] = F0"
    L = [f"for e in range(tid, {c.BQ * cpr}, {c.NT}):",
         f"    v = e // {cpr}",
         f"    cc = (e - v * {cpr}) * {w}",
         "    if v < nv:"]
    L += _ind(2, _copy(c, f"{QS} + v * {c.DP} + cc", "Q", f"r0 + v // {c.G}", f"(hb + v % {c.G}) * {c.D} + cc", w))
    L += ["    else:", "        " + zero]
    if c.DQ > c.D:
        npad = c.DQ - c.D
        _, KS, _, _, _ = c.layout()
        assert KS == QS + c.BQ * c.DP  # Ks rows follow Qs rows
        L += [f"for e in range(tid, {(c.BQ + ATT_TILE) * npad}, {c.NT}):",
              f"    v = e // {npad}",
              f"    sm[{QS} + v * {c.DP} + {c.D} + e - v * {npad}] = F0"]
    return L


def _devfuncs(c):
    """The register tiles, as tuples of row tuples: a Q·Kᵀ step (4 d), the slice add, the score store;
    a P·V step (1 key) and its masked twin; the merge; the output / statistics stores. Built from
    per-row helpers so that the text Numba types stays small (everything is force-inlined)."""
    TMS, TNS, TMO, TNO = c.TMS, c.TNS, c.TMO, c.TNO
    gp, gv = min(4, TMO), min(4, TNO)
    qoff = [c.WSY * a * c.DP for a in range(TMS)]
    koff = [c.WSX * b * c.DP for b in range(TNS)]
    roff = [g * c.WOY * gp + e for g in range(TMO // gp) for e in range(gp)]  # vector offsets from oy
    coff = [g * c.WOX * gv + e for g in range(TNO // gv) for e in range(gv)]  # column offsets from ox
    ld = {4: "lds4", 2: "lds2"}
    F = []
    # Q·Kᵀ: the chain of (vector, key) continues over 4 more d, in d order
    F += ["@devf", "def dot4(q, k, p):",
          "    return fma(q[3], k[3], fma(q[2], k[2], fma(q[1], k[1], fma(q[0], k[0], p))))"]
    F += ["@devf", "def qkrow(q, ks, pr):", "    return " + _tup(f"dot4(q, ks[{b}], pr[{b}])" for b in range(TNS))]
    F += ["@devf", "def qk4(sm, qa, ka, p):"]
    F += [f"    k{b} = lds4(sm, ka + {koff[b]})" for b in range(TNS)]
    F += ["    ks = " + _tup(f"k{b}" for b in range(TNS))]
    F += ["    return " + _tup(f"qkrow(lds4(sm, qa + {qoff[a]}), ks, p[{a}])" for a in range(TMS))]
    F += ["@devf", "def addrow(t, p):", "    return " + _tup(f"t[{b}] + p[{b}]" for b in range(TNS))]
    F += ["@devf", "def tadd(t, p):", "    return " + _tup(f"addrow(t[{a}], p[{a}])" for a in range(TMS))]
    F += ["@devf", "def sstore(sm, sb, t, scale):"]
    F += [f"    sts1(sm, sb + {c.WSX * b * c.PS + c.WSY * a}, fmul(t[{a}][{b}], scale))"
          for a in range(TMS) for b in range(TNS)]

    # P·V: one key for every (vector, column)
    def pvloads():
        L = []
        for g in range(TMO // gp):
            names = ", ".join(f"pp{g * gp + e}" for e in range(gp))
            L.append(f"    {names} = {ld[gp]}(sm, pa + {g * c.WOY * gp})" if gp > 1 else f"    {names} = lds1(sm, pa + {g * c.WOY})")
        for g in range(TNO // gv):
            names = ", ".join(f"vv{g * gv + e}" for e in range(gv))
            L.append(f"    {names} = {ld[gv]}(sm, va + {g * c.WOX * gv})" if gv > 1 else f"    {names} = lds1(sm, va + {g * c.WOX})")
        return L + ["    vv = " + _tup(f"vv{b}" for b in range(TNO))]
    F += ["@devf", "def fmarow(x, v, o):", "    return " + _tup(f"fma(x, v[{b}], o[{b}])" for b in range(TNO))]
    F += ["@devf", "def fmarowm(ok, x, v, o):", "    return " + _tup(f"sel(ok, fma(x, v[{b}], o[{b}]), o[{b}])" for b in range(TNO))]
    F += ["@devf", "def pv1(sm, pa, va, o):"] + pvloads()
    F += ["    return " + _tup(f"fmarow(pp{a}, vv, o[{a}])" for a in range(TMO))]
    F += ["@devf", "def pv1m(sm, pa, va, o, j, n):"] + pvloads()
    F += ["    return " + _tup(f"fmarowm(j < n[{a}], pp{a}, vv, o[{a}])" for a in range(TMO))]
    F += ["@devf", "def nrows(Nv, oy):", "    return " + _tup(f"lds1(Nv, oy + {roff[a]})" for a in range(TMO))]
    # merge of tile t into the running accumulators (prime): the first tile sets, later ones merge
    F += ["@devf", "def mrow(n, first, al, be, c, o):",
          "    return " + _tup(f"sel(n, sel(first, o[{b}], fma(c[{b}], al, fmul(o[{b}], be))), c[{b}])" for b in range(TNO))]
    F += ["@devf", "def merge(c, o, first, Nv, Al, Be, oy):",
          "    return " + _tup(f"mrow(lds1(Nv, oy + {roff[a]}) > 0, first, lds1(Al, oy + {roff[a]}), lds1(Be, oy + {roff[a]}), c[{a}], o[{a}])"
                               for a in range(TMO))]
    # outputs
    F += ["@devf", "def orow(out, ra, oa, c, la, ox):"]
    for b in range(TNO):
        if c.DPV > c.D:
            F += [f"    if ox + {coff[b]} < {c.D}:", f"        out[ra, oa + {coff[b]}] = c[{b}] / la"]
        else:
            F += [f"    out[ra, oa + {coff[b]}] = c[{b}] / la"]
    F += ["@devf", "def store_out(out, c, Ls, oy, ox, r0, hb, nv):"]
    for a in range(TMO):
        F += [f"    if oy + {roff[a]} < nv:",
              f"        orow(out, r0 + (oy + {roff[a]}) // {c.G}, (hb + (oy + {roff[a]}) % {c.G}) * {c.D} + ox, c[{a}], "
              f"lds1(Ls, oy + {roff[a]}), ox)"]
    F += ["@devf", "def srow(A, vg, t, o, ox):"]
    for b in range(TNO):
        if c.DPV > c.D:
            F += [f"    if ox + {coff[b]} < {c.D}:", f"        A[vg, t, ox + {coff[b]}] = o[{b}]"]
        else:
            F += [f"    A[vg, t, ox + {coff[b]}] = o[{b}]"]
    F += ["@devf", "def store_stats(A, o, t, Nv, oy, ox, r0, hb, hq):"]
    for a in range(TMO):
        F += [f"    if lds1(Nv, oy + {roff[a]}) > 0:",
              f"        srow(A, (r0 + (oy + {roff[a]}) // {c.G}) * hq + hb + (oy + {roff[a]}) % {c.G}, t, o[{a}], ox)"]
    return F


def _qk(c):
    """t: the canonical dot of the thread's (vector, key) pairs: per 32-wide slice an fma chain from
    +0 (4 d per 128-bit load), the slice partial added to the total (which starts at +0)."""
    L = [f"ts = {_zeros(c.TMS, c.TNS)}"]

    def slice_(db, nsteps):
        return _flat(f"p = {_zeros(c.TMS, c.TNS)}",
                     [f"p = qk4(sm, qb + {db} + {4 * k}, kb + {db} + {4 * k}, p)" for k in range(nsteps)],
                     "ts = tadd(ts, p)")

    nfull, rem = divmod(c.DQ, SLICE)
    if nfull:
        L += [f"for sl in range({nfull}):"] + _ind(1, slice_(f"sl * {SLICE}", SLICE // 4))
    if rem:
        L += slice_(str(nfull * SLICE), rem // 4)
    return L


def _pv(c, unroll=2):
    """o: Σ_j fma(p[vector, key j], v[key j, column], ·), keys in order from +0; in a tile that is
    partial for some vector (not ``full``) the chain of a vector stops at its n keys."""
    return _flat(
        f"o = {_zeros(c.TMO, c.TNO)}",
        "if full:",
        f"    for j in range(0, {ATT_TILE}, {unroll}):",
        [f"        o = pv1(sm, pa + (j + {u}) * {c.PS}, va + (j + {u}) * {c.VP}, o)" for u in range(unroll)],
        "else:",
        "    nn = nrows(Nv, oy)",
        "    for j in range(jmax):",
        f"        o = pv1m(sm, pa + j * {c.PS}, va + j * {c.VP}, o, j, nn)",
    )


def _row_pass(c, SS, tail):
    """Per vector v of the tile: n = its keys in the tile, mt by the twin's scan (NQT threads per
    vector scan segments of SEG keys for the first maximum that is not NaN, then combine the
    segments in order; a NaN first score is the twin's answer), p = exp32(s − mt) in place, then
    lt = Σ p left to right (one thread per vector) and ``tail`` (the merge or the statistics)."""
    PS, SEG, BQ = c.PS, c.SEG, c.BQ
    A = [f"rv = tid % {BQ}",
         f"rq = tid // {BQ}",
         f"rn = min({ATT_TILE}, p0 + r0 + rv // {c.G} + 1 - k0) if rv < nv else 0",
         "if rq == 0:",
         "    Nv[rv] = rn",
         f"s0 = sm[{SS} + rv]",  # before anyone overwrites key 0 with its p
         f"rs = {SS} + rq * {SEG * PS} + rv",
         "mx = NAN",
         f"if rn - rq * {SEG} >= {SEG}:"]  # a full segment: its loads first, then the scan
    A += [f"    x{k} = sm[rs + {k * PS}]" for k in range(SEG)]
    for k in range(SEG):
        A += [f"    if x{k} > mx or mx != mx:", f"        mx = x{k}"]
    A += ["else:",
          f"    for k in range(rn - rq * {SEG}):",
          f"        x = sm[rs + k * {PS}]",
          "        if x > mx or mx != mx:",
          "            mx = x",
         f"Mq[rq * {BQ} + rv] = mx",
         "cuda.syncthreads()"]
    B = ["if rn > 0:", "    mt = Mq[rv]"]
    if c.NQT > 1:
        B += [f"    for q in range(1, {c.NQT}):", f"        x = Mq[q * {BQ} + rv]", "        if x > mt or mt != mt:",
              "            mt = x"]
    B += ["    if s0 != s0:", "        mt = s0",
          "    if rq == 0:", "        Ms[rv] = mt",
          f"    for k in range(min({SEG}, rn - rq * {SEG})):",
          f"        sm[rs + k * {PS}] = exp32(sm[rs + k * {PS}] - mt)",
          "cuda.syncthreads()"]
    C = ["if rq == 0 and rn > 0:",
         "    lt = F0",
         f"    if rn == {ATT_TILE}:",
         f"        for j0 in range(0, {ATT_TILE * PS}, {16 * PS}):"]  # 16 loads in flight, then their adds in order
    C += [f"            y{j} = sm[{SS} + j0 + {j * PS} + rv]" for j in range(16)]
    C += [f"            lt = lt + y{j}" for j in range(16)]
    C += ["    else:",
          "        for j in range(rn):",
          f"            lt = lt + sm[{SS} + j * {PS} + rv]"]
    return A + B + C + _ind(1, tail)


@generator
def attention_source(c: AttnCfg) -> KernelSource:
    """The prime (``kern(Q, kc, vc, out, start, pb, R, hq, hkv, scale)``) or split
    (``kern(Q, kc, vc, start, pb, R, hq, hkv, scale, ML, A)``) kernel of configuration ``c``, every
    constant folded in; its dynamic shared memory holds Q, K, V and the scores of a tile."""
    c.check()
    QS, KS, VS, SS, _ = c.layout()
    nw = c.NT // 32
    wgr = c.BQ // (c.WSY * c.TMS)  # Q·Kᵀ warps along vectors
    wor = c.BQ // (c.WOY * c.TMO)  # P·V warps along vectors
    gp, gv = min(4, c.TMO), min(4, c.TNO)
    w = 4 if c.vec else 1
    cpr = c.D // w
    setup = ["tid = cuda.threadIdx.x",
             "rsk = kc.strides[0] // 4",
             "rsv = vc.strides[0] // 4",
             "kvh = hb // (hq // hkv)",
             f"ko = kvh * {c.D}",
             f"nv = nr * {c.G}",
             "lane = tid % 32",
             "warp = tid // 32",
             f"sy = (warp % {wgr}) * {c.WSY * c.TMS} + lane // {c.WSX}",
             f"sx = (warp // {wgr}) * {c.WSX * c.TNS} + lane % {c.WSX}",
             f"qb = {QS} + sy * {c.DP}", f"kb = {KS} + sx * {c.DP}", f"sb = {SS} + sx * {c.PS} + sy",
             f"oy = (warp % {wor}) * {c.WOY * c.TMO} + (lane // {c.WOX}) * {gp}",
             f"ox = (warp // {wor}) * {c.WOX * c.TNO} + (lane % {c.WOX}) * {gv}",
             f"pa = {SS} + oy", f"va = {VS} + ox"]
    if c.NT % cpr == 0:
        setup += [f"lj = tid // {cpr}", f"lcol = (tid % {cpr}) * {w}"]
    _ = nw
    loadK = lambda t: _loader(c, KS, c.DP, "kc", f"({t}) * {ATT_TILE}", f"min({ATT_TILE}, pmax + 1 - ({t}) * {ATT_TILE})")  # noqa: E731
    loadV = lambda t: _loader(c, VS, c.VP, "vc", f"({t}) * {ATT_TILE}", f"min({ATT_TILE}, pmax + 1 - ({t}) * {ATT_TILE})")  # noqa: E731
    shared = ["sm = cuda.shared.array(0, float32)",
              f"Ms = cuda.shared.array({c.BQ}, float32)",
              f"Mq = cuda.shared.array({c.BQ * c.NQT}, float32)",
              f"Al = cuda.shared.array({c.BQ}, float32)",
              f"Be = cuda.shared.array({c.BQ}, float32)",
              f"Nv = cuda.shared.array({c.BQ}, int32)"]
    pv_head = [f"full = k0 + {ATT_TILE - 1} <= pmin", f"jmax = min({ATT_TILE}, pmax + 1 - k0)"]
    if c.mode == "prime":
        sig = "def kern(Q, kc, vc, out, start, pb, R, hq, hkv, scale):"
        where = ["qt = cuda.gridDim.x - 1 - cuda.blockIdx.x",  # longest blocks first
                 f"hb = cuda.blockIdx.y * {c.G}",
                 f"r0 = qt * {c.RB}",
                 "p0 = start + pb[0]",
                 f"nr = min({c.RB}, R - r0)",
                 "pmin = p0 + r0",
                 "pmax = pmin + nr - 1",
                 "t0 = 0",
                 f"t1 = pmax // {ATT_TILE} + 1"]
        tail = ["if t == 0:", "    m = Ms[rv]", "    l = lt",
                "else:", "    m, alpha, beta = merge_scale(m, Ms[rv])", "    l = merge_acc(l, alpha, lt, beta)",
                "    Al[rv] = alpha", "    Be[rv] = beta"]
        use = ["c = merge(c, o, t == 0, Nv, Al, Be, oy)"]
        init = ["m = F0", "l = F0", f"c = {_zeros(c.TMO, c.TNO)}"]
        fin = ["cp_wait0()", "cuda.syncthreads()",  # the last Al reads are done: Al holds l now
               f"if tid < {c.BQ}:", "    Al[tid] = l", "cuda.syncthreads()",
               "store_out(out, c, Al, oy, ox, r0, hb, nv)"]
    else:
        sig = "def kern(Q, kc, vc, start, pb, R, hq, hkv, scale, ML, A):"
        where = [f"hb = cuda.blockIdx.y * {c.G}",
                 f"r0 = cuda.blockIdx.z * {c.RB}",
                 "p0 = start + pb[0]",
                 f"nr = min({c.RB}, R - r0)",
                 "pmin = p0 + r0",
                 "pmax = pmin + nr - 1",
                 f"t0 = cuda.blockIdx.x * {c.TPB}",
                 f"t1 = min(t0 + {c.TPB}, pmax // {ATT_TILE} + 1)",
                 "if t0 >= t1:",  # past the position: exit at once
                 "    return"]
        tail = [f"vg = (r0 + rv // {c.G}) * hq + hb + rv % {c.G}",
                "ML[vg, t, 0] = Ms[rv]",
                "ML[vg, t, 1] = lt"]
        use = ["store_stats(A, o, t, Nv, oy, ox, r0, hb, hq)"]
        init, fin = [], ["cp_wait0()"]

    if c.kv_shared:  # one tile; V goes into K's buffer once Q·Kᵀ is done
        prologue = _flat(_qload(c, QS), loadK("t0"), "cp_commit()")
        loop = _flat("t = t0", f"k0 = t * {ATT_TILE}", "cp_wait0()", "cuda.syncthreads()",
                     _qk(c), "sstore(sm, sb, ts, scale)", "cuda.syncthreads()",
                     loadV("t"), "cp_commit()",
                     _row_pass(c, SS, tail),
                     "cp_wait0()", "cuda.syncthreads()",
                     pv_head, _pv(c), use)
    else:
        prologue = _flat(_qload(c, QS), loadK("t0"), "cp_commit()", loadV("t0"), "cp_commit()")
        loop = _flat(
            "for t in range(t0, t1):",
            _ind(1,
                 f"k0 = t * {ATT_TILE}",
                 "cp_wait1()",  # K_t (and Q) landed; V_t may still be in flight
                 "cuda.syncthreads()",
                 _qk(c), "sstore(sm, sb, ts, scale)",
                 "cuda.syncthreads()",
                 "if t + 1 < t1:", _ind(1, loadK("t + 1")),
                 "cp_commit()",
                 _row_pass(c, SS, tail),
                 "cp_wait1()",  # V_t landed; K_{t+1} may still be in flight
                 "cuda.syncthreads()",
                 pv_head, _pv(c), use,
                 "cuda.syncthreads()",
                 "if t + 1 < t1:", _ind(1, loadV("t + 1")),
                 "cp_commit()"))
    body = _flat("F0 = F32(0.0)", "NAN = F32(np.nan)", _devfuncs(c), sig,
                 _ind(1, where, shared, setup, prologue, init, loop, fin))
    name = (f"attn_{c.mode}_{c.name or 'custom'}_D{c.D}_G{c.G}_tno{c.TNO}{'' if c.vec else '_scalar'}"
            f"{'' if c.cpa else '_sync'}{'_kvs' if c.kv_shared else ''}{'' if c.TPB == 1 else f'_tpb{c.TPB}'}")
    return KernelSource(name, _lower_shared("\n".join(body) + "\n"), c.NT, c.layout()[4], (("launch_bounds", c.NT),))


def _lower_shared(src):
    """Shared-memory subscripts → lds1 / sts1 (Numba's negative-index wraparound would otherwise make
    every constant offset its own register)."""
    names = "sm|Ms|Mq|Al|Be|Nv"
    src = re.sub(rf"^(\s*)({names})\[([^\[\]]*)\] = (.*)$", r"\1sts1(\2, \3, \4)", src, flags=re.M)
    return re.sub(rf"\b({names})\[([^\[\]]*)\]", r"lds1(\1, \2)", src)


# ---- the ordered merge of split statistics -------------------------------------------------------
ATT_MERGE_NT = 64  # threads per merge block: 64 consecutive d
ATT_MERGE_CH = 128  # tiles staged in shared memory at a time
ATT_MERGE_BATCH = 16  # sequential steps whose loads are issued together


@generator
def attention_merge_source(_=None) -> KernelSource:
    """``kern(ML, A, out, start, pb, D)``: fold tiles 0 … pos // 64 of (row r, head h) in order,
    exactly as the twin: the running max m_new = m_old if m_old >= m_tile else m_tile
    (sequential, thread 0), alpha = exp32(m_old − m_new) and beta = exp32(m_tile − m_new) (in
    parallel), then l and acc ← merge_acc(·, alpha, ·, beta) in tile order, out = acc / l. Block z
    covers d = 64z … 64z + 63. ML [R·hq, tiles, 2] (mt, lt), A [R·hq, tiles, D] (a_t); out [R, hq·D].
    The three sequential chains issue their loads ``ATT_MERGE_BATCH`` at a time (a rolled loop would
    wait for each load: ~500 cycles × 512 tiles at 32k)."""
    ks = range(ATT_MERGE_BATCH)
    L = ["@devf", "def mx_batch(m, Mt, Mo, Mn, i):"]
    L += [f"    x{k} = Mt[i + {k}]" for k in ks]
    for k in ks:
        L += [f"    mn = m if m >= x{k} else x{k}", f"    Mo[i + {k}] = m", f"    Mn[i + {k}] = mn", "    m = mn"]
    L += ["    return m", "@devf", "def l_batch(l, Lv, Al, Be, i):"]
    L += [f"    x{k} = Lv[i + {k}]" for k in ks]
    L += [f"    l = merge_acc(l, Al[i + {k}], x{k}, Be[i + {k}])" for k in ks]
    L += ["    return l", "@devf", "def acc_batch(acc, A, vg, t, dd, Al, Be, i):"]
    L += [f"    x{k} = A[vg, t + {k}, dd]" for k in ks]
    L += [f"    acc = merge_acc(acc, Al[i + {k}], x{k}, Be[i + {k}])" for k in ks]
    L += ["    return acc"]
    NT, CH, MB = ATT_MERGE_NT, ATT_MERGE_CH, ATT_MERGE_BATCH
    L += f"""def kern(ML, A, out, start, pb, D):
    r = cuda.blockIdx.x
    h = cuda.blockIdx.y
    hq = cuda.gridDim.y
    d = cuda.blockIdx.z * {NT} + cuda.threadIdx.x
    tid = cuda.threadIdx.x
    vg = r * hq + h
    ntl = (start + pb[0] + r) // {ATT_TILE} + 1
    Mo = cuda.shared.array({CH}, float32)
    Mn = cuda.shared.array({CH}, float32)
    Mt = cuda.shared.array({CH}, float32)
    Lv = cuda.shared.array({CH}, float32)
    Al = cuda.shared.array({CH}, float32)
    Be = cuda.shared.array({CH}, float32)
    Lt = cuda.shared.array(1, float32)
    m = ML[vg, 0, 0]
    l = ML[vg, 0, 1]
    dd = d if d < D else D - 1
    acc = A[vg, 0, dd]
    c0 = 1
    while c0 < ntl:
        c1 = min(c0 + {CH}, ntl)
        for t in range(c0 + tid, c1, {NT}):
            Mt[t - c0] = ML[vg, t, 0]
            Lv[t - c0] = ML[vg, t, 1]
        cuda.syncthreads()
        if tid == 0:
            i = 0
            while i + {MB} <= c1 - c0:
                m = mx_batch(m, Mt, Mo, Mn, i)
                i += {MB}
            while i < c1 - c0:
                mt = Mt[i]
                mn = m if m >= mt else mt
                Mo[i] = m
                Mn[i] = mn
                m = mn
                i += 1
        cuda.syncthreads()
        for t in range(tid, c1 - c0, {NT}):
            Al[t] = exp32(Mo[t] - Mn[t])
            Be[t] = exp32(Mt[t] - Mn[t])
        cuda.syncthreads()
        if tid == 0:
            i = 0
            while i + {MB} <= c1 - c0:
                l = l_batch(l, Lv, Al, Be, i)
                i += {MB}
            while i < c1 - c0:
                l = merge_acc(l, Al[i], Lv[i], Be[i])
                i += 1
        i = 0
        while i + {MB} <= c1 - c0:
            acc = acc_batch(acc, A, vg, c0 + i, dd, Al, Be, i)
            i += {MB}
        while i < c1 - c0:
            acc = merge_acc(acc, Al[i], A[vg, c0 + i, dd], Be[i])
            i += 1
        cuda.syncthreads()
        c0 = c1
    if tid == 0:
        Lt[0] = l
    cuda.syncthreads()
    if d < D:
        out[r, h * D + d] = acc / Lt[0]
""".splitlines()
    return KernelSource("attn_merge", "\n".join(L) + "\n", NT)


# ---- configurations and launches ------------------------------------------------------------------
def _group(rep, BQ):
    """Heads per block: the largest divisor of rep that is ≤ BQ."""
    for g in range(min(rep, BQ), 0, -1):
        if rep % g == 0:
            return g
    return 1


@generator
def prime_config(hq, hkv, D, variant="p64", vec=True, **kw):
    """The configuration ``attention_prime`` runs (heads per block: the variant's G if it divides
    the group, else the largest divisor of the group that fits). ValueError when none fits."""
    rep = hq // hkv
    p = dict(ATT_PRIME_VARIANTS[variant])
    G = kw.pop("G", p.pop("G"))
    if rep % G:
        G = _group(rep, p["BQ"])
    p.update(kw)
    return make_cfg("prime", D, G=G, name=variant, vec=vec and D % 4 == 0, **p)


@generator
def split_config(R, hq, hkv, D, variant=None, vec=True, **kw):
    """The configuration ``attention_split`` runs: by default the smallest block of
    ``SPLIT_BLOCKS`` that holds the R · hq / hkv query vectors of a KV head. ValueError when none
    fits."""
    rep = hq // hkv
    if variant is None:
        variant = next((v for v in SPLIT_BLOCKS if R * rep <= ATT_SPLIT_VARIANTS[v]["BQ"]), SPLIT_BLOCKS[-1])
    p = dict(ATT_SPLIT_VARIANTS[variant])
    p.update(kw)
    return make_cfg("split", D, G=_group(rep, ATT_SPLIT_VARIANTS[variant]["BQ"]), name=variant,
                    vec=vec and D % 4 == 0, **p)


@launcher(of="attention")
def attention_prime(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None, cfg=None):
    """Query tiles: a block owns 64 query vectors (rows × heads of one KV group), loops over its
    key tiles and merges in registers; longest blocks first. ``pos`` as in ``attention_tiled``.
    Returns False (did nothing) when no configuration fits the head dim's shared memory."""
    if cfg is None:
        try:
            cfg = prime_config(hq, hkv, D, vec=aligned(Q) and aligned(kc) and aligned(vc))
        except ValueError:
            return False
    if R > 0:
        k = generated(attention_source, cfg)
        launch(k, ((R + cfg.RB - 1) // cfg.RB, hq // cfg.G), cfg.NT, Q, kc, vc, out, np.int64(start),
               zero_pos() if pos is None else pos, np.int64(R), np.int64(hq), np.int64(hkv), F32(scale))
    return True


@launcher(of="attention")
def attention_split(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None, cfg=None):
    """Split-KV (few rows): one block per (64-key tile, KV head, chunk of the group's query vectors)
    writes each tile's statistics (mt, lt, a_t) for all heads of the group into kernel-owned
    buffers, then the merge folds them in tile order. With ``pos`` the grid covers the cache's
    capacity and tiles past a row's position exit at once. Returns False (did nothing) when the
    statistics would not fit ``SPLIT_MAX_STATS_BYTES`` or no configuration fits."""
    ntiles = (start + R - 1) // ATT_TILE + 1 if pos is None else (kc.shape[0] - 1) // ATT_TILE + 1
    need = R * hq * ntiles
    if 4 * need * (D + 2) > SPLIT_MAX_STATS_BYTES:
        return False
    if cfg is None:
        try:
            cfg = split_config(R, hq, hkv, D, vec=aligned(Q) and aligned(kc) and aligned(vc))
        except ValueError:
            return False
    if R <= 0:
        return True
    ML = scratch("attention.ml", 2 * need)[:2 * need].reshape(R * hq, ntiles, 2)
    A = scratch("attention.a", need * D)[:need * D].reshape(R * hq, ntiles, D)
    pb = zero_pos() if pos is None else pos
    k = generated(attention_source, cfg)
    launch(k, ((ntiles + cfg.TPB - 1) // cfg.TPB, hq // cfg.G, (R + cfg.RB - 1) // cfg.RB), cfg.NT, Q, kc, vc,
           np.int64(start), pb, np.int64(R), np.int64(hq), np.int64(hkv), F32(scale), ML, A)
    launch(generated(attention_merge_source, None), (R, hq, (D + ATT_MERGE_NT - 1) // ATT_MERGE_NT), ATT_MERGE_NT,
           ML, A, out, np.int64(start), pb, np.int64(D))
    return True


@launcher("attention")
def attention_cuda(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """Causal GQA attention (see the twin); the kernel is the dispatch table's pick: split-KV for
    few rows (falling back to query tiles when its statistics would not fit), query tiles
    otherwise, the tiled kernel for head dims whose tiles do not fit in shared memory. ``pos`` as
    in ``attention_tiled``."""
    if dispatch.pick("attention", R) == "attention_split" and attention_split(Q, kc, vc, out, start, R, hq, hkv, D,
                                                                              scale, pos):
        return
    if not attention_prime(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos):
        attention_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)


# ------------------------------------------------------------------------------------------------
# the K/V cache write
# ------------------------------------------------------------------------------------------------
@body
def kv_write_at(Kh, ko, Vh, vo, kc, vc, start, r, c):
    kc[start + r, c] = Kh[r, ko + c]
    vc[start + r, c] = Vh[r, vo + c]


@twin("kv_write")
def kv_write_cpu(Kh, ko, Vh, vo, kc, vc, start, R):
    """Copy R rows of K (Kh[:, ko:ko+N]) and V (Vh[:, vo:vo+N]) into the caches
    ([max_ctx, N], N = Hkv·D) at rows start.."""
    for r in range(R):
        for c in range(kc.shape[1]):
            kv_write_at(Kh, ko, Vh, vo, kc, vc, start, r, c)


@kernel
def kv_write_k(Kh, ko, Vh, vo, kc, vc, start, pb, R):
    i = cuda.grid(1)
    if i < R * kc.shape[1]:
        r, c = row_col(i, kc.shape[1])
        kv_write_at(Kh, ko, Vh, vo, kc, vc, start + pb[0], r, c)


@launcher("kv_write")
def kv_write_cuda(Kh, ko, Vh, vo, kc, vc, start, R, pos=None):
    """``pos`` as in ``attention_tiled``."""
    launch(kv_write_k, *grid1(R * kc.shape[1]), Kh, ko, Vh, vo, kc, vc, start, zero_pos() if pos is None else pos, R)
