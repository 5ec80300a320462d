"""Query-tiled prime attention and GQA split-KV decode attention, bit-identical to the CPU twin.

The twin (``numba_kernels.cpu.attention`` / ``_attend``) fixes, per (query row r, head h) at
position ``pos = start + pb[0] + r``: keys in tiles of 64 absolute positions ``[64t, 64t+64)``,
cut at ``pos``; per tile the scores ``s_j = fmul(dot_rows(q, k_j, D), scale)`` (canonical dot:
32-term fma chains from +0, slice partials added left to right), the tile max ``mt`` (first score,
then strictly greater ones in key order), ``p_j = exp32(s_j − mt)``, ``lt = Σ p_j`` left to right
from +0 and ``a_t[d] = Σ_j fma(p_j, v_j[d], ·)`` in key order from +0; the first tile sets
(m, l, acc), later ones are merged in tile order with ``merge_scale`` / ``merge_acc``; finally
``out = acc / l``. Every kernel here performs exactly those float32 operations in that order.

**Blocks own BQ query vectors of one KV head.** A vector v of a block is (row ``r0 + v // G``,
head ``hb + v % G``): G = 1 gives BQ consecutive rows of one head, G = 8 (bench-8l: hq = 16,
hkv = 2) gives BQ/8 rows × the 8 heads of a KV head's query group. Each 64-key tile of K and V
is staged in shared memory once for all BQ vectors, and the two products of a tile are small
register-tiled GEMMs whose per-element orders are the twin's:

- ``S = Q·Kᵀ`` (BQ × 64): a thread owns TMS × TNS scores; for each 32-wide slice of d it runs
  the fma chains from +0 (4 d per 128-bit shared load) and then adds the slice partial to its
  total (the total starts at +0). ``D % 4 != 0`` zero-pads q and k to the next multiple of 4:
  ``fma(0, 0, p)`` only changes the sign of a zero partial at the very end of the last slice, and
  ``total + ±0 == total`` since a total that starts at +0 is never −0.
- row pass (scores in shared memory, [key][vector]): NT / BQ threads per vector each scan a
  segment of keys for its first maximum that is not NaN; the segments are combined in order, and
  a NaN first score is the answer (exactly the twin's scan: strict ``>`` keeps the earliest of equal
  maxima, a NaN never replaces a number, a NaN first score is never replaced). ``p = exp32(s −
  mt)`` in place, then one thread per vector sums ``lt`` left to right and does the merge scalars.
- ``A_t = P·V`` (BQ × D): a thread owns TMO × TNO outputs, each an fma chain over keys in order;
  in a tile that is partial for some vector the chain of that vector stops at its last key
  (a select keeps the old value; nothing is added for masked keys). Columns past D are computed
  on padding and never stored.

``prime`` kernels loop over a block's tiles and merge in registers (grid: query tiles, longest
first × head chunks); K_{t+1} streams in (``cp.async``) during the row pass and P·V of tile t,
V_{t+1} during Q·Kᵀ of tile t+1. ``split`` kernels compute TPB (default 1) consecutive tiles per
block and write each tile's statistics (mt, lt, a_t); the grid covers the cache's capacity and
blocks past the position exit at once; ``_merge_k`` folds the statistics in tile order with the
twin's expressions (the running max is a sequential scan, the exps of a chunk of tiles run in
parallel, the l / acc chains are sequential per output, their loads issued 16 at a time). Every
K/V tile is read once per KV head for all heads of its group.

The kernels are generated Python (``source(cfg)``), one per configuration (``Cfg``): register
tiles are tuples of row tuples built by small force-inlined device functions, so Numba types a
short text and NVVM sees fully unrolled straight-line code; every shared-memory index is one base
plus a constant (``ld1`` / ``st1`` / ``ld4``: no negative-index wraparound). On the GPU the
generated text calls ``cuda.fma`` and ``libdevice.fmul_rn`` (what ``prims.fma`` / ``prims.fmul``
wrap); under the simulator it calls the prims themselves (a true fma).

Launch: the prime and most split configurations need more than 48 KB of dynamic shared memory
(217 KB for 64 vectors at D = 256): ``_launch`` sets the kernel's opt-in attribute once and
launches ``kernel[grid, block, 0, smem]``. Integration into ``numba_kernels`` needs ``_go`` to pass
the dynamic shared memory size (and the stream when capturing).

Shapes: Q [R, hq·D] (row stride free), kc / vc [capacity, hkv·D], out [R, hq·D]; pb: int32 [1]
on the device, added to ``start`` (captured decode steps). Prototype: not imported by the
package (``kernels_proto/__init__.py``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from kernels_proto.prims import B, SIMULATED, fma, fmul  # noqa: F401  (fma/fmul: generated code)

from numba import cuda, float32, int32  # noqa: E402

F32 = np.float32
TILE = 64
SLICE = 32
MAX_SMEM = 227 * 1024  # per block, opt-in (H100 / H200)

exp32 = B["exp32"]
merge_scale = B["merge_scale"]
merge_acc = B["merge_acc"]


# ------------------------------------------------------------------------------------------------
# memory primitives: 128-bit shared loads, cp.async (global → shared), plain-Python under the simulator
# ------------------------------------------------------------------------------------------------
if not SIMULATED:
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda import types as _t
    from numba.cuda.extending import intrinsic

    def _ptr(context, builder, arrty, arr, inds):
        a = context.make_array(arrty)(context, builder, value=arr)
        i64 = ir.IntType(64)
        idx = [builder.sext(i, i64) if i.type.width < 64 else i for i in inds]
        return cgutils.get_item_pointer(context, builder, arrty, a, idx)

    def _vec_load(n):
        def ld(typingctx, arr, idx):
            sig = _t.UniTuple(_t.float32, n)(arr, idx)

            def codegen(context, builder, signature, args):
                p = _ptr(context, builder, signature.args[0], args[0], [args[1]])
                vt = ir.VectorType(ir.FloatType(), n)
                v = builder.load(builder.bitcast(p, vt.as_pointer()), align=4 * n)
                return context.make_tuple(builder, signature.return_type,
                                          [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(n)])

            return sig, codegen
        return intrinsic(ld)

    ld4 = _vec_load(4)
    ld2 = _vec_load(2)

    @intrinsic
    def ld1(typingctx, arr, idx):
        """arr[idx] without Python's negative-index wraparound (so base + constant folds)."""
        sig = arr.dtype(arr, idx)

        def codegen(context, builder, signature, args):
            return builder.load(_ptr(context, builder, signature.args[0], args[0], [args[1]]))

        return sig, codegen

    @intrinsic
    def st1(typingctx, arr, idx, val):
        """arr[idx] = val without wraparound."""
        sig = _t.void(arr, idx, val)

        def codegen(context, builder, signature, args):
            x = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
            builder.store(x, _ptr(context, builder, signature.args[0], args[0], [args[1]]))
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def sel(typingctx, cond, a, b):
        """a if cond else b, branch-free (an LLVM select)."""
        sig = a(cond, a, b)

        def codegen(context, builder, signature, args):
            c = context.cast(builder, args[0], signature.args[0], _t.boolean)
            y = context.cast(builder, args[2], signature.args[2], signature.args[1])
            return builder.select(c, args[1], y)

        return sig, codegen

    devf = cuda.jit(device=True, forceinline=True)

    @intrinsic
    def ld4g(typingctx, arr, row, col):
        """(arr[row, col], …, arr[row, col + 3]) in one 128-bit load (16-byte aligned)."""
        sig = _t.UniTuple(_t.float32, 4)(arr, row, col)

        def codegen(context, builder, signature, args):
            p = _ptr(context, builder, signature.args[0], args[0], [args[1], args[2]])
            vt = ir.VectorType(ir.FloatType(), 4)
            v = builder.load(builder.bitcast(p, vt.as_pointer()), align=16)
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(4)])

        return sig, codegen

    @intrinsic
    def st4(typingctx, arr, idx, a, b, c, d):
        """arr[idx : idx + 4] = (a, b, c, d) in one 128-bit store (idx % 4 == 0)."""
        sig = _t.void(arr, idx, a, b, c, d)

        def codegen(context, builder, signature, args):
            p = _ptr(context, builder, signature.args[0], args[0], [args[1]])
            vt = ir.VectorType(ir.FloatType(), 4)
            v = ir.Constant(vt, ir.Undefined)
            for k in range(4):
                x = context.cast(builder, args[2 + k], signature.args[2 + k], _t.float32)
                v = builder.insert_element(v, x, ir.Constant(ir.IntType(32), k))
            builder.store(v, builder.bitcast(p, vt.as_pointer()), align=16)
            return context.get_dummy_value()

        return sig, codegen

    def _cp_async(nbytes):
        kind = "cg" if nbytes == 16 else "ca"

        def cp(typingctx, dst, di, src, row, col):
            sig = _t.void(dst, di, src, row, col)

            def codegen(context, builder, signature, args):
                d = _ptr(context, builder, signature.args[0], args[0], [args[1]])
                s = _ptr(context, builder, signature.args[2], args[2], [args[3], args[4]])
                d32 = builder.ptrtoint(builder.addrspacecast(d, ir.PointerType(ir.FloatType(), 3)), ir.IntType(32))
                s64 = builder.ptrtoint(builder.addrspacecast(s, ir.PointerType(ir.FloatType(), 1)), ir.IntType(64))
                fn = ir.FunctionType(ir.VoidType(), [ir.IntType(32), ir.IntType(64)])
                asm = ir.InlineAsm(fn, f"cp.async.{kind}.shared.global [$0], [$1], {nbytes};", "r,l,~{memory}",
                                   side_effect=True)
                builder.call(asm, [d32, s64])
                return context.get_dummy_value()

            return sig, codegen
        return intrinsic(cp)

    cp16 = _cp_async(16)
    cp4 = _cp_async(4)

    def _cp_async_flat(nbytes):
        kind = "cg" if nbytes == 16 else "ca"

        def cp(typingctx, dst, di, src, soff, rs):
            sig = _t.void(dst, di, src, soff, rs)

            def codegen(context, builder, signature, args):
                d = _ptr(context, builder, signature.args[0], args[0], [args[1]])
                a = context.make_array(signature.args[2])(context, builder, value=args[2])
                so = args[3] if args[3].type.width == 64 else builder.sext(args[3], ir.IntType(64))
                s = builder.gep(a.data, [so])
                d32 = builder.ptrtoint(builder.addrspacecast(d, ir.PointerType(ir.FloatType(), 3)), ir.IntType(32))
                s64 = builder.ptrtoint(builder.addrspacecast(s, ir.PointerType(ir.FloatType(), 1)), ir.IntType(64))
                fn = ir.FunctionType(ir.VoidType(), [ir.IntType(32), ir.IntType(64)])
                asm = ir.InlineAsm(fn, f"cp.async.{kind}.shared.global [$0], [$1], {nbytes};", "r,l,~{memory}",
                                   side_effect=True)
                builder.call(asm, [d32, s64])
                return context.get_dummy_value()

            return sig, codegen
        return intrinsic(cp)

    cp16f = _cp_async_flat(16)  # (dst, di, src, element offset from src's data, row stride: unused)
    cp4f = _cp_async_flat(4)

    @intrinsic
    def ld4gf(typingctx, arr, soff, rs):
        """Four floats at element offset soff from arr's data, one 128-bit load."""
        sig = _t.UniTuple(_t.float32, 4)(arr, soff, rs)

        def codegen(context, builder, signature, args):
            a = context.make_array(signature.args[0])(context, builder, value=args[0])
            so = args[1] if args[1].type.width == 64 else builder.sext(args[1], ir.IntType(64))
            p = builder.gep(a.data, [so])
            vt = ir.VectorType(ir.FloatType(), 4)
            v = builder.load(builder.bitcast(p, vt.as_pointer()), align=16)
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(4)])

        return sig, codegen

    def _asm0(text):
        def f(typingctx):
            sig = _t.void()

            def codegen(context, builder, signature, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()

            return sig, codegen
        return intrinsic(f)

    cp_commit = _asm0("cp.async.commit_group;")
    cp_wait1 = _asm0("cp.async.wait_group 1;")
    cp_wait0 = _asm0("cp.async.wait_group 0;")
else:
    # The simulator runs each thread in Python: the same loads and stores, done at once.
    def ld4(a, i):
        return a[i], a[i + 1], a[i + 2], a[i + 3]

    def ld2(a, i):
        return a[i], a[i + 1]

    def ld1(a, i):
        return a[i]

    def sel(c, a, b):
        return a if c else b

    devf = cuda.jit(device=True)

    def st1(a, i, x):
        a[i] = x

    def ld4g(a, r, c):
        return a[r, c], a[r, c + 1], a[r, c + 2], a[r, c + 3]

    def st4(a, i, x, y, z, w):
        a[i] = x
        a[i + 1] = y
        a[i + 2] = z
        a[i + 3] = w

    def cp16(d, i, s, r, c):
        for k in range(4):
            d[i + k] = s[r, c + k]

    def cp4(d, i, s, r, c):
        d[i] = s[r, c]

    def cp16f(d, i, s, off, rs):
        r, c = divmod(off, rs)
        for k in range(4):
            d[i + k] = s[r, c + k]

    def cp4f(d, i, s, off, rs):
        r, c = divmod(off, rs)
        d[i] = s[r, c]

    def ld4gf(s, off, rs):
        r, c = divmod(off, rs)
        return s[r, c], s[r, c + 1], s[r, c + 2], s[r, c + 3]

    def cp_commit():
        pass

    def cp_wait1():
        pass

    def cp_wait0():
        pass


# ------------------------------------------------------------------------------------------------
# configurations
# ------------------------------------------------------------------------------------------------
def _ru(x, m):
    return (x + m - 1) // m * m


@dataclass(frozen=True)
class Cfg:
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
    SEG = property(lambda s: TILE // s.NQT)  # keys per row-pass thread
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
            ss = ks + TILE * max(self.DP, self.VP)
        else:
            vs = ks + TILE * self.DP
            ss = vs + TILE * self.VP
        return qs, ks, vs, ss, 4 * (ss + TILE * self.PS)

    def check(self):
        assert self.mode in ("prime", "split")
        assert self.G <= self.BQ and self.NT % 32 == 0
        nw = self.NT // 32
        wr, wk = self.WSY * self.TMS, self.WSX * self.TNS
        assert self.BQ % wr == 0 and TILE % wk == 0 and (self.BQ // wr) * (TILE // wk) == nw, self
        orow = self.WOY * self.TMO
        assert self.BQ % orow == 0 and nw % (self.BQ // orow) == 0, self
        assert self.TMO in (1, 2) or self.TMO % 4 == 0
        assert self.TNO in (1, 2) or self.TNO % 4 == 0
        assert self.DPV >= self.D, (self, self.DPV)
        assert self.NT % self.BQ == 0 and TILE % self.NQT == 0  # row pass: NQT threads per vector
        assert not (self.kv_shared and (self.mode == "prime" or self.TPB != 1))
        assert not (self.vec and self.D % 4)
        assert self.layout()[4] + 5 * 4 * self.BQ * max(1, self.NQT) <= MAX_SMEM, "shared memory"
        return self


def _pv_tno(D, BQ, NT, TMO, WOY):
    """TNO so that the P·V grid covers D columns."""
    wr = BQ // (WOY * TMO)  # warps along vectors
    per = (NT // 32) // wr * (32 // WOY)  # column groups
    tno = -(-D // per)
    return _ru(tno, 4) if tno > 2 else tno


def make_cfg(mode, D, BQ, NT, G, TMS, TNS, WSY, TMO, WOY, **kw):
    return Cfg(mode, D, BQ, NT, G, TMS, TNS, WSY, TMO, _pv_tno(D, BQ, NT, TMO, WOY), WOY, **kw).check()


# The menu. Prime: 64 vectors × 256 threads (Q·Kᵀ 4×4 and P·V 8×8 per thread at D = 256).
PRIME = {
    "p64": dict(BQ=64, NT=256, G=1, TMS=4, TNS=4, WSY=4, TMO=8, WOY=4),
    "p64g8": dict(BQ=64, NT=256, G=8, TMS=4, TNS=4, WSY=4, TMO=8, WOY=4),
    "p64w2": dict(BQ=64, NT=256, G=1, TMS=4, TNS=4, WSY=2, TMO=8, WOY=4),  # Q·Kᵀ lanes 2 × 16
    "p32": dict(BQ=32, NT=128, G=1, TMS=4, TNS=4, WSY=4, TMO=8, WOY=4),
    # 512 threads: 16 warps hide latency; ≤ 128 registers (Q·Kᵀ 4×2, P·V 8×4 per thread)
    "p64t512": dict(BQ=64, NT=512, G=1, TMS=4, TNS=2, WSY=4, TMO=8, WOY=4),
    "p64t512g8": dict(BQ=64, NT=512, G=8, TMS=4, TNS=2, WSY=4, TMO=8, WOY=4),
}
# Split (decode / verify), chosen by the vectors per KV head (R · hq / hkv).
SPLIT = {
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
        return [f"x0, x1, x2, x3 = ld4g({arr}, {row}, {col})", f"st4(sm, {dst}, x0, x1, x2, x3)"]
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
            op = (f"x0, x1, x2, x3 = ld4gf({arr}, ls_, {rs})\nst4(sm, ld_, x0, x1, x2, x3)" if w == 4
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
    zero = f"st4(sm, {QS} + v * {c.DP} + cc, F0, F0, F0, F0)" if w == 4 else f"sm[{QS} + v * {c.DP} + cc] = F0"
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
        L += [f"for e in range(tid, {(c.BQ + TILE) * npad}, {c.NT}):",
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
    ld = {4: "ld4", 2: "ld2"}
    F = []
    # Q·Kᵀ: the chain of (vector, key) continues over 4 more d, in d order
    F += ["@devf", "def dot4(q, k, p):",
          "    return fma(q[3], k[3], fma(q[2], k[2], fma(q[1], k[1], fma(q[0], k[0], p))))"]
    F += ["@devf", "def qkrow(q, ks, pr):", "    return " + _tup(f"dot4(q, ks[{b}], pr[{b}])" for b in range(TNS))]
    F += ["@devf", "def qk4(sm, qa, ka, p):"]
    F += [f"    k{b} = ld4(sm, ka + {koff[b]})" for b in range(TNS)]
    F += ["    ks = " + _tup(f"k{b}" for b in range(TNS))]
    F += ["    return " + _tup(f"qkrow(ld4(sm, qa + {qoff[a]}), ks, p[{a}])" for a in range(TMS))]
    F += ["@devf", "def addrow(t, p):", "    return " + _tup(f"t[{b}] + p[{b}]" for b in range(TNS))]
    F += ["@devf", "def tadd(t, p):", "    return " + _tup(f"addrow(t[{a}], p[{a}])" for a in range(TMS))]
    F += ["@devf", "def sstore(sm, sb, t, scale):"]
    F += [f"    st1(sm, sb + {c.WSX * b * c.PS + c.WSY * a}, fmul(t[{a}][{b}], scale))"
          for a in range(TMS) for b in range(TNS)]

    # P·V: one key for every (vector, column)
    def pvloads():
        L = []
        for g in range(TMO // gp):
            names = ", ".join(f"pp{g * gp + e}" for e in range(gp))
            L.append(f"    {names} = {ld[gp]}(sm, pa + {g * c.WOY * gp})" if gp > 1 else f"    {names} = ld1(sm, pa + {g * c.WOY})")
        for g in range(TNO // gv):
            names = ", ".join(f"vv{g * gv + e}" for e in range(gv))
            L.append(f"    {names} = {ld[gv]}(sm, va + {g * c.WOX * gv})" if gv > 1 else f"    {names} = ld1(sm, va + {g * c.WOX})")
        return L + ["    vv = " + _tup(f"vv{b}" for b in range(TNO))]
    F += ["@devf", "def fmarow(x, v, o):", "    return " + _tup(f"fma(x, v[{b}], o[{b}])" for b in range(TNO))]
    F += ["@devf", "def fmarowm(ok, x, v, o):", "    return " + _tup(f"sel(ok, fma(x, v[{b}], o[{b}]), o[{b}])" for b in range(TNO))]
    F += ["@devf", "def pv1(sm, pa, va, o):"] + pvloads()
    F += ["    return " + _tup(f"fmarow(pp{a}, vv, o[{a}])" for a in range(TMO))]
    F += ["@devf", "def pv1m(sm, pa, va, o, j, n):"] + pvloads()
    F += ["    return " + _tup(f"fmarowm(j < n[{a}], pp{a}, vv, o[{a}])" for a in range(TMO))]
    F += ["@devf", "def nrows(Nv, oy):", "    return " + _tup(f"ld1(Nv, oy + {roff[a]})" for a in range(TMO))]
    # merge of tile t into the running accumulators (prime): the first tile sets, later ones merge
    F += ["@devf", "def mrow(n, first, al, be, c, o):",
          "    return " + _tup(f"sel(n, sel(first, o[{b}], fma(c[{b}], al, fmul(o[{b}], be))), c[{b}])" for b in range(TNO))]
    F += ["@devf", "def merge(c, o, first, Nv, Al, Be, oy):",
          "    return " + _tup(f"mrow(ld1(Nv, oy + {roff[a]}) > 0, first, ld1(Al, oy + {roff[a]}), ld1(Be, oy + {roff[a]}), c[{a}], o[{a}])"
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
              f"ld1(Ls, oy + {roff[a]}), ox)"]
    F += ["@devf", "def srow(A, vg, t, o, ox):"]
    for b in range(TNO):
        if c.DPV > c.D:
            F += [f"    if ox + {coff[b]} < {c.D}:", f"        A[vg, t, ox + {coff[b]}] = o[{b}]"]
        else:
            F += [f"    A[vg, t, ox + {coff[b]}] = o[{b}]"]
    F += ["@devf", "def store_stats(A, o, t, Nv, oy, ox, r0, hb, hq):"]
    for a in range(TMO):
        F += [f"    if ld1(Nv, oy + {roff[a]}) > 0:",
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
        f"    for j in range(0, {TILE}, {unroll}):",
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
         f"rn = min({TILE}, p0 + r0 + rv // {c.G} + 1 - k0) if rv < nv else 0",
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
         f"    if rn == {TILE}:",
         f"        for j0 in range(0, {TILE * PS}, {16 * PS}):"]  # 16 loads in flight, then their adds in order
    C += [f"            y{j} = sm[{SS} + j0 + {j * PS} + rv]" for j in range(16)]
    C += [f"            lt = lt + y{j}" for j in range(16)]
    C += ["    else:",
          "        for j in range(rn):",
          f"            lt = lt + sm[{SS} + j * {PS} + rv]"]
    return A + B + C + _ind(1, tail)


def source(c: Cfg) -> str:
    """The kernel's Python source for configuration c (every constant folded in)."""
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
    loadK = lambda t: _loader(c, KS, c.DP, "kc", f"({t}) * {TILE}", f"min({TILE}, pmax + 1 - ({t}) * {TILE})")  # noqa: E731
    loadV = lambda t: _loader(c, VS, c.VP, "vc", f"({t}) * {TILE}", f"min({TILE}, pmax + 1 - ({t}) * {TILE})")  # noqa: E731
    shared = ["sm = cuda.shared.array(0, float32)",
              f"Ms = cuda.shared.array({c.BQ}, float32)",
              f"Mq = cuda.shared.array({c.BQ * c.NQT}, float32)",
              f"Al = cuda.shared.array({c.BQ}, float32)",
              f"Be = cuda.shared.array({c.BQ}, float32)",
              f"Nv = cuda.shared.array({c.BQ}, int32)"]
    pv_head = [f"full = k0 + {TILE - 1} <= pmin", f"jmax = min({TILE}, pmax + 1 - k0)"]
    if c.mode == "prime":
        sig = "def kernel(Q, kc, vc, out, start, pb, R, hq, hkv, scale):"
        where = ["qt = cuda.gridDim.x - 1 - cuda.blockIdx.x",  # longest blocks first
                 f"hb = cuda.blockIdx.y * {c.G}",
                 f"r0 = qt * {c.RB}",
                 "p0 = start + pb[0]",
                 f"nr = min({c.RB}, R - r0)",
                 "pmin = p0 + r0",
                 "pmax = pmin + nr - 1",
                 "t0 = 0",
                 f"t1 = pmax // {TILE} + 1"]
        tail = ["if t == 0:", "    m = Ms[rv]", "    l = lt",
                "else:", "    m, alpha, beta = merge_scale(m, Ms[rv])", "    l = merge_acc(l, alpha, lt, beta)",
                "    Al[rv] = alpha", "    Be[rv] = beta"]
        use = ["c = merge(c, o, t == 0, Nv, Al, Be, oy)"]
        init = ["m = F0", "l = F0", f"c = {_zeros(c.TMO, c.TNO)}"]
        fin = ["cp_wait0()", "cuda.syncthreads()",  # the last Al reads are done: Al holds l now
               f"if tid < {c.BQ}:", "    Al[tid] = l", "cuda.syncthreads()",
               "store_out(out, c, Al, oy, ox, r0, hb, nv)"]
    else:
        sig = "def kernel(Q, kc, vc, start, pb, R, hq, hkv, scale, ML, A):"
        where = [f"hb = cuda.blockIdx.y * {c.G}",
                 f"r0 = cuda.blockIdx.z * {c.RB}",
                 "p0 = start + pb[0]",
                 f"nr = min({c.RB}, R - r0)",
                 "pmin = p0 + r0",
                 "pmax = pmin + nr - 1",
                 f"t0 = cuda.blockIdx.x * {c.TPB}",
                 f"t1 = min(t0 + {c.TPB}, pmax // {TILE} + 1)",
                 "if t0 >= t1:",  # past the position: exit at once
                 "    return"]
        tail = [f"vg = (r0 + rv // {c.G}) * hq + hb + rv % {c.G}",
                "ML[vg, t, 0] = Ms[rv]",
                "ML[vg, t, 1] = lt"]
        use = ["store_stats(A, o, t, Nv, oy, ox, r0, hb, hq)"]
        init, fin = [], ["cp_wait0()"]

    if c.kv_shared:  # one tile; V goes into K's buffer once Q·Kᵀ is done
        prologue = _flat(_qload(c, QS), loadK("t0"), "cp_commit()")
        loop = _flat("t = t0", f"k0 = t * {TILE}", "cp_wait0()", "cuda.syncthreads()",
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
                 f"k0 = t * {TILE}",
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
    body = _flat(_devfuncs(c), sig, _ind(1, where, shared, setup, prologue, init, loop, fin))
    return _lower_shared("\n".join(body) + "\n")


def _lower_shared(src):
    """Shared-memory subscripts → ld1 / st1 (Numba's negative-index wraparound would otherwise make
    every constant offset its own register)."""
    names = "sm|Ms|Mq|Al|Be|Nv"
    src = re.sub(rf"^(\s*)({names})\[([^\[\]]*)\] = (.*)$", r"\1st1(\2, \3, \4)", src, flags=re.M)
    return re.sub(rf"\b({names})\[([^\[\]]*)\]", r"ld1(\1, \2)", src)


_NS = dict(cuda=cuda, float32=float32, int32=int32, F0=F32(0.0), NAN=F32(np.nan), fma=fma, fmul=fmul,
           exp32=exp32, merge_scale=merge_scale, merge_acc=merge_acc, ld4=ld4, ld2=ld2, ld1=ld1, st1=st1, sel=sel, devf=devf, ld4g=ld4g, st4=st4,
           cp16=cp16, cp4=cp4, cp16f=cp16f, cp4f=cp4f, ld4gf=ld4gf, cp_commit=cp_commit, cp_wait1=cp_wait1, cp_wait0=cp_wait0, min=min)


if not SIMULATED:  # the primitives themselves (builtins type faster than device-function calls)
    from numba.cuda import libdevice as _libdevice

    _NS.update(libdevice=_libdevice)


def _primitives(src):
    """On the GPU, call cuda.fma / libdevice.fmul_rn (what prims.fma / prims.fmul wrap) directly:
    Numba types a builtin call much faster than a device-function call."""
    if SIMULATED:
        return src
    src = re.sub(r"(?<![.\w])fma\(", "cuda.fma(", src)
    return re.sub(r"(?<![.\w])fmul\(", "libdevice.fmul_rn(", src)


def pyfunc(c: Cfg):
    ns = dict(_NS)
    exec(compile(_primitives(source(c)), f"<attn {c.mode} {c.name} D{c.D}>", "exec"), ns)
    return ns["kernel"]


_KERNELS: dict = {}


def kernel(c: Cfg):
    """The compiled kernel (``cuda.jit`` dispatcher) and its dynamic shared memory bytes."""
    k = _KERNELS.get(c)
    if k is None:
        jit = cuda.jit if SIMULATED else (lambda f: cuda.jit(f, launch_bounds=c.NT))
        k = _KERNELS[c] = (jit(pyfunc(c)), c.layout()[4])
    return k


# ------------------------------------------------------------------------------------------------
# the ordered merge of split statistics
# ------------------------------------------------------------------------------------------------
MERGE_NT = 64  # threads per merge block: 64 consecutive d
MERGE_CH = 128  # tiles staged in shared memory at a time
_MB = 16  # sequential steps whose loads are issued together


def _merge_helpers():
    """Batches of _MB steps of the merge's three sequential chains, loads first (a rolled loop
    would wait for each load: ~500 cycles × 512 tiles at 32k)."""
    ks = range(_MB)
    src = ["@devf", "def mx_batch(m, Mt, Mo, Mn, i):"]
    src += [f"    x{k} = Mt[i + {k}]" for k in ks]
    for k in ks:
        src += [f"    mn = m if m >= x{k} else x{k}", f"    Mo[i + {k}] = m", f"    Mn[i + {k}] = mn", "    m = mn"]
    src += ["    return m"]
    src += ["@devf", "def l_batch(l, Lv, Al, Be, i):"]
    src += [f"    x{k} = Lv[i + {k}]" for k in ks]
    src += [f"    l = merge_acc(l, Al[i + {k}], x{k}, Be[i + {k}])" for k in ks]
    src += ["    return l"]
    src += ["@devf", "def acc_batch(acc, A, vg, t, dd, Al, Be, i):"]
    src += [f"    x{k} = A[vg, t + {k}, dd]" for k in ks]
    src += [f"    acc = merge_acc(acc, Al[i + {k}], x{k}, Be[i + {k}])" for k in ks]
    src += ["    return acc"]
    ns = dict(devf=devf, merge_acc=merge_acc)
    exec(compile("\n".join(src) + "\n", "<attn merge helpers>", "exec"), ns)
    return ns["mx_batch"], ns["l_batch"], ns["acc_batch"]


_mx_batch, _l_batch, _acc_batch = _merge_helpers()


@cuda.jit
def _merge_k(ML, A, out, start, pb, D):
    """Fold tiles 0 .. pos // 64 of (row r, head h) in order, exactly as the twin: the running max
    m_new = m_old if m_old >= m_tile else m_tile (sequential, thread 0), alpha = exp32(m_old − m_new)
    and beta = exp32(m_tile − m_new) (in parallel), then l and acc ← merge_acc(·, alpha, ·, beta)
    in tile order. Block z covers d = 64z .. 64z + 63. ML [R·hq, tiles, 2] (mt, lt),
    A [R·hq, tiles, D] (a_t); out [R, hq·D]."""
    r = cuda.blockIdx.x
    h = cuda.blockIdx.y
    hq = cuda.gridDim.y
    d = cuda.blockIdx.z * MERGE_NT + cuda.threadIdx.x
    tid = cuda.threadIdx.x
    vg = r * hq + h
    ntl = (start + pb[0] + r) // TILE + 1
    Mo = cuda.shared.array(MERGE_CH, float32)
    Mn = cuda.shared.array(MERGE_CH, float32)
    Mt = cuda.shared.array(MERGE_CH, float32)
    Lv = cuda.shared.array(MERGE_CH, float32)
    Al = cuda.shared.array(MERGE_CH, float32)
    Be = cuda.shared.array(MERGE_CH, float32)
    Lt = cuda.shared.array(1, float32)
    m = ML[vg, 0, 0]
    l = ML[vg, 0, 1]
    dd = d if d < D else D - 1
    acc = A[vg, 0, dd]
    c0 = 1
    while c0 < ntl:
        c1 = min(c0 + MERGE_CH, ntl)
        for t in range(c0 + tid, c1, MERGE_NT):
            Mt[t - c0] = ML[vg, t, 0]
            Lv[t - c0] = ML[vg, t, 1]
        cuda.syncthreads()
        if tid == 0:
            i = 0
            while i + _MB <= c1 - c0:
                m = _mx_batch(m, Mt, Mo, Mn, i)
                i += _MB
            while i < c1 - c0:
                mt = Mt[i]
                mn = m if m >= mt else mt
                Mo[i] = m
                Mn[i] = mn
                m = mn
                i += 1
        cuda.syncthreads()
        for t in range(tid, c1 - c0, MERGE_NT):
            Al[t] = exp32(Mo[t] - Mn[t])
            Be[t] = exp32(Mt[t] - Mn[t])
        cuda.syncthreads()
        if tid == 0:
            i = 0
            while i + _MB <= c1 - c0:
                l = _l_batch(l, Lv, Al, Be, i)
                i += _MB
            while i < c1 - c0:
                l = merge_acc(l, Al[i], Lv[i], Be[i])
                i += 1
        i = 0
        while i + _MB <= c1 - c0:
            acc = _acc_batch(acc, A, vg, c0 + i, dd, Al, Be, i)
            i += _MB
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


# ------------------------------------------------------------------------------------------------
# host side
# ------------------------------------------------------------------------------------------------
_POS: dict = {}
_STATS: dict = {}
_OPTED: set = set()


def zero_pos():
    z = _POS.get("zero")
    if z is None:
        z = _POS["zero"] = cuda.to_device(np.zeros(1, np.int32))
    return z


def _aligned(*arrs):
    """Every row of every array starts on 16 bytes (vector loads / 16-byte cp.async)."""
    if SIMULATED:
        return True
    for a in arrs:
        ptr = a.__cuda_array_interface__["data"][0]
        if ptr % 16 or (a.strides[0] % 16):
            return False
    return True


class _Sized:
    """A kernel with its dynamic shared memory size, indexable like a dispatcher: what a recorded
    launch (``numba_kernels.cuda.capture`` under the simulator) replays as ``k[grid, block](*args)``."""

    def __init__(self, disp, smem):
        self.disp, self.smem = disp, smem

    def __getitem__(self, cfg):
        grid, block = cfg[:2]
        stream = cfg[2] if len(cfg) > 2 else 0
        return self.disp[grid, block, stream, self.smem]


def _target():
    """Where ``numba_kernels.cuda`` sends launches now (None: run; a list or a GraphBuilder:
    ``capture``), so the prototype can be captured into a CUDA graph like the package's kernels."""
    import sys
    m = sys.modules.get("numba_kernels.launch")
    return None if m is None else m._Launch.target


def _launch(disp, smem, grid, block, args):
    """Launch with ``smem`` bytes of dynamic shared memory (opting in above 48 KB once), on the
    default stream or into the graph being captured."""
    if not SIMULATED and smem > 48 * 1024:
        types_ = tuple(disp.typeof_pyval(a) for a in args)
        key = (id(disp), smem, types_)
        if key not in _OPTED:
            ov = disp.compile(types_)
            _opt_in(ov._codelibrary.get_cufunc(), smem)
            _OPTED.add(key)
    t = _target()
    if t is None:
        disp[grid, block, 0, smem](*args)
    elif isinstance(t, list):
        t.append((_Sized(disp, smem), grid, block, args))
    else:
        disp[grid, block, t, smem](*args)


def _opt_in(f, smem):
    """Allow ``smem`` bytes of dynamic shared memory (above the 48 KB default) for kernel f, as
    numba's own ``set_shared_memory_carveout`` sets an attribute."""
    from numba.cuda.cudadrv.driver import binding, driver
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    try:
        driver.cuKernelSetAttribute(attr, smem, f.handle, f.device.id)
    except Exception:  # noqa: BLE001  (a CUfunction handle: the older API)
        fn = f.handle
        if not isinstance(fn, binding.CUfunction):
            fn = driver.cuKernelGetFunction(f.handle)
        driver.cuFuncSetAttribute(fn, attr, smem)


def prime_cfg(D, variant="p64", **kw):
    p = dict(PRIME[variant])
    p.update(kw)
    return make_cfg("prime", D, name=variant, **p)


def split_cfg(D, variant, G, **kw):
    p = dict(SPLIT[variant])
    p.update(kw)
    return make_cfg("split", D, G=G, name=variant, **p)


def _group(rep, BQ):
    """Heads per block: the largest divisor of rep that is ≤ BQ."""
    for g in range(min(rep, BQ), 0, -1):
        if rep % g == 0:
            return g
    return 1


def prime_config(hq, hkv, D, variant="p64", vec=True, **kw):
    """The configuration attention_prime runs (heads per block: the variant's G if it divides the
    group, else the largest divisor of the group that fits)."""
    rep = hq // hkv
    G = kw.pop("G", PRIME[variant]["G"])
    if rep % G:
        G = _group(rep, PRIME[variant]["BQ"])
    return prime_cfg(D, variant, G=G, vec=vec and D % 4 == 0, **kw)


def attention_prime(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None, variant="p64", **kw):
    """Causal GQA attention for R query rows at positions start (+ pos[0]) .. by query tiles.
    Q [R, hq·D]; kc, vc [capacity, hkv·D]; out [R, hq·D]."""
    c = prime_config(hq, hkv, D, variant, vec=_aligned(Q, kc, vc), **kw)
    G = c.G
    disp, smem = kernel(c)
    grid = ((R + c.RB - 1) // c.RB, hq // G)
    _launch(disp, smem, grid, c.NT, (Q, kc, vc, out, np.int64(start), zero_pos() if pos is None else pos,
                                     np.int64(R), np.int64(hq), np.int64(hkv), F32(scale)))


def split_variant(R, rep):
    nq = R * rep
    for v in ("s8", "s16", "s32", "s64"):
        if nq <= SPLIT[v]["BQ"]:
            return v
    return "s64"


def split_config(R, hq, hkv, D, variant=None, vec=True, **kw):
    """The configuration attention_split runs: by default the smallest block that holds the
    R · hq / hkv vectors of a KV head."""
    rep = hq // hkv
    variant = variant or split_variant(R, rep)
    return split_cfg(D, variant, _group(rep, SPLIT[variant]["BQ"]), vec=vec and D % 4 == 0, **kw)


def stats_buffers(R, hq, ntiles, D):
    need = R * hq * ntiles
    ml, a = _STATS.get("ml"), _STATS.get("a")
    if ml is None or ml.size < need * 2 or a.size < need * D:
        ml = _STATS["ml"] = cuda.device_array(max(need * 2, 1 << 12), np.float32)
        a = _STATS["a"] = cuda.device_array(max(need * D, 1 << 16), np.float32)
    return ml[: need * 2].reshape(R * hq, ntiles, 2), a[: need * D].reshape(R * hq, ntiles, D)


def attention_split(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None, variant=None, **kw):
    """Few rows (decode, verify): one block per (64-key tile, KV head, chunk of the vectors) writes
    the tile's statistics for all heads of the group, then ``_merge_k`` folds them in tile order.
    With ``pos`` the grid covers the cache's capacity; tiles past the position exit at once."""
    c = split_config(R, hq, hkv, D, variant, vec=_aligned(Q, kc, vc), **kw)
    G = c.G
    disp, smem = kernel(c)
    ntiles = (start + R - 1) // TILE + 1 if pos is None else (kc.shape[0] - 1) // TILE + 1
    ML, A = stats_buffers(R, hq, ntiles, D)
    pb = zero_pos() if pos is None else pos
    grid = ((ntiles + c.TPB - 1) // c.TPB, hq // G, (R + c.RB - 1) // c.RB)
    _launch(disp, smem, grid, c.NT, (Q, kc, vc, np.int64(start), pb, np.int64(R), np.int64(hq), np.int64(hkv),
                                     F32(scale), ML, A))
    _launch(_merge_k, 0, (R, hq, (D + MERGE_NT - 1) // MERGE_NT), MERGE_NT, (ML, A, out, np.int64(start), pb, np.int64(D)))


SPLIT_MAX_ROWS = 16


def attention(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """Few rows: split-KV; many rows: query tiles."""
    if R <= SPLIT_MAX_ROWS:
        attention_split(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)
    else:
        attention_prime(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)
