"""Decode GEMV at copy speed (issue #16), fp32 or bf16 weights (issue #14), 1-8 rows, canonical order.

    out[r, o] = dot(X[r, :K], W[o, :K])   for r < R ≤ RB, o < N
    X: [≥R, ≥K] float32 (C-contiguous); W: [N, K] float32, or uint16 bf16 bit patterns; out: [≥R, N]

The order is ``exact.dot_rows``: K in slices of 32, an fma chain from +0 inside a slice, slice
partials added left to right into an accumulator that starts at +0. Bit-identical to
``numba_kernels.cpu.linear`` (bf16: on the widened weights; widening is exact).

Layout of the work (one configuration = :class:`Cfg`):

- A **warp step** is a tile of MO·OW weight rows × SP = 32/OW consecutive slices (MO·4 KiB of
  fp32, MO·2 KiB of bf16). The warp reads it with fully coalesced 128-bit loads (``LDG.E.128``:
  each instruction reads 512 contiguous bytes), stores it into its own shared tile and reads it
  back transposed, so that each lane holds whole slices: lane L runs slice L // OW of rows
  L % OW + m·OW (m < MO). Its fma chains cover all RB rows of X at once: the weight is read once
  per step for every row, and each X quad (LDS.128) serves MO rows of W. X comes from shared
  memory; adjacent lanes share a slice, so X reads pair up (lanes n, n^1 on one address: the
  LDS.128 returns in 2 cycles, not 4). Tile and X rows are padded by 16 bytes: no bank conflicts.
- A **block** is NOG × NG warps: NOG groups of MO·OW outputs (OB outputs per block) and NG warps
  splitting each K chunk. A **chunk** is CS = NG·SP consecutive slices (KC = 32·CS elements);
  every warp does one step per chunk. The block stages the chunk's X (RB rows) in shared memory,
  each lane writes its RB·MO slice partials to a shared P[slice][row][output], and after a barrier
  the OB·RB accumulator threads add the chunk's CS partials in slice order. Chunks are visited in
  order, so every accumulator sees every slice partial left to right, whatever the split.
- Weight loads are issued PF chunks ahead (registers: 128·MO·PF bytes per lane in flight while
  the current chunk is computed); the next chunk's X is loaded during the current one. A chunk
  that crosses K loads from a 16-byte zero buffer past K (a pointer select, no branch): a zero
  term fma(0, 0, p) and a +0 partial leave the sums' bits unchanged (an accumulator is never -0).
- bf16: the same with 64-byte slices; each lane widens its weights exactly in registers
  (``bits_to_f32(u << 16)`` / ``bits_to_f32(u & 0xFFFF0000)``: one integer op per weight).

Vector loads need K % 4 == 0 (bf16: K % 8 == 0), a row stride of X that is a multiple of 4 and
16-byte aligned X and W; otherwise the same kernel is built with scalar, guarded loads
(``VEC=False``; :func:`launch` and :func:`prepare` choose it, or refuse a VEC configuration).

Kernels are generated from source (full unrolling, static register names; the repeated pieces are
force-inlined device functions, which keeps numba's compile time at ~2 s a kernel) and compiled
per configuration; :func:`pick` chooses one from (N, K, R) and the row bucket (1, 2, 4, 5, 8).
Under ``NUMBA_ENABLE_CUDASIM=1`` the same source runs with Python fallbacks (its ``fma`` is a true
fused multiply-add; no warp barrier there: a block barrier instead).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import numpy as np
from numba import cuda, types

from kernels_proto.prims import SIMULATED, bits_to_f32, fma  # noqa: F401 (globals of the generated source)

F32 = np.float32
ZERO = F32(0.0)
SLICE = 32

# ------------------------------------------------------------------------------------------------
# 128-bit loads and stores (GPU: LLVM vector loads; simulator: four scalar accesses)
# ------------------------------------------------------------------------------------------------
if not SIMULATED:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    def _vptr(context, builder, aryty, ary, idx, idxty, space, elt):
        a = context.make_array(aryty)(context, builder, value=ary)
        i = context.cast(builder, idx, idxty, types.intp)
        p = builder.gep(a.data, [i])
        vt = ir.VectorType(elt, 4)
        return builder.bitcast(builder.addrspacecast(p, ir.PointerType(p.type.pointee, space)),
                               ir.PointerType(vt, space))

    def _make_load(space, elt_ir, elt_nb, invariant):
        @intrinsic
        def load4(typingctx, arr, idx):
            sig = types.UniTuple(elt_nb, 4)(arr, idx)

            def codegen(context, builder, sig, args):
                vp = _vptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], space, elt_ir)
                v = builder.load(vp, align=16)
                if invariant:  # read-only for the kernel's lifetime: ld.global.nc
                    v.set_metadata("invariant.load", builder.module.add_metadata([]))
                el = [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(4)]
                return context.make_tuple(builder, sig.return_type, el)

            return sig, codegen

        return load4

    def _make_loadz(elt_ir, elt_nb):
        """load4 of arr[i:i+4] if ok else of Z[0:4] (a zero buffer): a select of the pointer, no
        branch, no predicated registers; arr[i] is never touched when not ok."""
        @intrinsic
        def loadz4(typingctx, arr, idx, zarr, ok):
            sig = types.UniTuple(elt_nb, 4)(arr, idx, zarr, ok)

            def codegen(context, builder, sig, args):
                a = context.make_array(sig.args[0])(context, builder, value=args[0])
                i = context.cast(builder, args[1], sig.args[1], types.intp)
                p = builder.gep(a.data, [i])
                z = context.make_array(sig.args[2])(context, builder, value=args[2])
                zp = builder.bitcast(z.data, p.type)
                c = context.cast(builder, args[3], sig.args[3], types.boolean)
                q = builder.select(c, p, zp)
                vp = builder.bitcast(builder.addrspacecast(q, ir.PointerType(p.type.pointee, 1)),
                                     ir.PointerType(ir.VectorType(elt_ir, 4), 1))
                v = builder.load(vp, align=16)
                v.set_metadata("invariant.load", builder.module.add_metadata([]))
                el = [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(4)]
                return context.make_tuple(builder, sig.return_type, el)

            return sig, codegen

        return loadz4

    def _make_store(elt_ir, elt_nb):
        @intrinsic
        def store4(typingctx, arr, idx, a, b, c, d):
            sig = types.void(arr, idx, a, b, c, d)

            def codegen(context, builder, sig, args):
                vp = _vptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], 3, elt_ir)
                v = ir.Constant(ir.VectorType(elt_ir, 4), ir.Undefined)
                for k in range(4):
                    x = context.cast(builder, args[2 + k], sig.args[2 + k], elt_nb)
                    v = builder.insert_element(v, x, ir.Constant(ir.IntType(32), k))
                builder.store(v, vp, align=16)
                return context.get_dummy_value()

            return sig, codegen

        return store4

    def _make_sload1():
        @intrinsic
        def load1(typingctx, arr, idx):
            sig = types.float32(arr, idx)

            def codegen(context, builder, sig, args):
                a = context.make_array(sig.args[0])(context, builder, value=args[0])
                i = context.cast(builder, args[1], sig.args[1], types.intp)
                p = builder.gep(a.data, [i])
                return builder.load(builder.addrspacecast(p, ir.PointerType(p.type.pointee, 3)), align=4)

            return sig, codegen

        return load1

    def _make_sstore1():
        @intrinsic
        def store1(typingctx, arr, idx, v):
            sig = types.void(arr, idx, v)

            def codegen(context, builder, sig, args):
                a = context.make_array(sig.args[0])(context, builder, value=args[0])
                i = context.cast(builder, args[1], sig.args[1], types.intp)
                p = builder.gep(a.data, [i])
                x = context.cast(builder, args[2], sig.args[2], types.float32)
                builder.store(x, builder.addrspacecast(p, ir.PointerType(p.type.pointee, 3)), align=4)
                return context.get_dummy_value()

            return sig, codegen

        return store1

    # shared scalars without numba's negative-index wraparound (an index is never negative here)
    lds1f = _make_sload1()
    sts1f = _make_sstore1()
    # global (X: float32; W: float32 or uint16 → four int32 words = eight bf16)
    ldg4f = _make_load(1, ir.FloatType(), types.float32, True)
    ldg4i = _make_load(1, ir.IntType(32), types.int32, True)
    ldz4f = _make_loadz(ir.FloatType(), types.float32)
    ldz4i = _make_loadz(ir.IntType(32), types.int32)
    lds4f = _make_load(3, ir.FloatType(), types.float32, False)
    lds4i = _make_load(3, ir.IntType(32), types.int32, False)
    sts4f = _make_store(ir.FloatType(), types.float32)
    sts4i = _make_store(ir.IntType(32), types.int32)
else:
    def ldg4f(a, i):
        return a[i], a[i + 1], a[i + 2], a[i + 3]

    def ldg4i(a, i):  # a: uint16 bf16 bits; eight elements as four little-endian words
        u = np.array([a[i + k] for k in range(8)], np.uint16).view(np.int32)
        return u[0], u[1], u[2], u[3]

    lds4f = lds4i = ldg4f

    def ldz4f(a, i, z, ok):
        return ldg4f(a, i) if ok else (ZERO, ZERO, ZERO, ZERO)

    def ldz4i(a, i, z, ok):
        return ldg4i(a, i) if ok else (np.int32(0),) * 4

    def lds1f(a, i):
        return a[i]

    def sts1f(a, i, v):
        a[i] = v

    def sts4f(a, i, x0, x1, x2, x3):
        a[i], a[i + 1], a[i + 2], a[i + 3] = x0, x1, x2, x3

    sts4i = sts4f


# ------------------------------------------------------------------------------------------------
# configurations
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cfg:
    RB: int = 1      # rows of X the kernel is built for (R ≤ RB at run time; extra rows are zeros)
    OW: int = 4      # outputs per warp step (SP = 32 // OW slices each)
    NOG: int = 8     # output groups (warps along N) per block
    NG: int = 1      # warps along K per block (each chunk has NG·SP slices)
    PF: int = 1      # chunks of weights in flight ahead of the one computed
    MO: int = 1      # tile slices per lane: MO output rows share each X load (MO·OW rows per warp)
    BF16: bool = False
    VEC: bool = True  # 128-bit loads (needs K % 4 == 0, bf16 K % 8 == 0, 16-byte aligned rows)
    HOT: bool = False  # static analysis only: omit the partial-chunk path (wrong unless KC | K)

    @property
    def SP(self):
        return 32 // self.OW

    @property
    def NW(self):
        return self.NOG * self.NG

    @property
    def NT(self):
        return 32 * self.NW

    @property
    def OB(self):
        return self.NOG * self.OW * self.MO

    @property
    def CS(self):
        return self.NG * self.SP

    @property
    def KC(self):
        return self.CS * SLICE

    @property
    def NI(self):  # 16-byte units per slice = weight loads per lane per chunk
        return 4 if self.BF16 else 8

    @property
    def SW(self):  # 32-bit words per tile slice, padded by one unit: conflict-free, linear addresses
        return 4 * (self.NI + 1)

    @property
    def PSTR(self):  # P row stride ≡ OW (mod 32): a warp's 32 partial stores hit 32 banks
        n = self.RB * self.OB
        return n + (self.OW - n) % 32

    @property
    def smem_bytes(self):
        return 4 * (self.NW * 32 * self.MO * self.SW + self.RB * self.CS * 36 + self.CS * self.PSTR)

    def name(self):
        return (f"{'bf16' if self.BF16 else 'f32'}-R{self.RB}-ow{self.OW}-og{self.NOG}-ng{self.NG}"
                f"-pf{self.PF}{'-mo%d' % self.MO if self.MO > 1 else ''}{'' if self.VEC else '-scalar'}{'-hot' if self.HOT else ''}")

    def check(self):
        assert self.OW in (2, 4, 8, 16) and self.RB >= 1 and self.NOG >= 1 and self.NG >= 1
        assert self.PF in (1, 2, 3) and self.MO in (1, 2) and self.NT <= 1024
        assert self.smem_bytes <= 48 * 1024, (self.name(), self.smem_bytes)


# ------------------------------------------------------------------------------------------------
# source generation
# ------------------------------------------------------------------------------------------------
# The kernel is generated as Python source: full unrolling with static register names keeps the
# weights, partials and addresses in registers. The repeated pieces are force-inlined device
# functions (typed once by numba, inlined by NVVM), which keeps numba's compile time down.
def _devices(c: Cfg) -> str:
    RB, CS, NI, BF, PSTR, MO, SW = c.RB, c.CS, c.NI, c.BF16, c.PSTR, c.MO, c.SW
    ld, lds = ("ldg4i", "lds4i") if BF else ("ldg4f", "lds4f")
    zero = "I0" if BF else "ZERO"
    # On the GPU the chains call cuda.fma directly: the operands are float32 already, and
    # prims.fma's float32 casts only cost numba typing time (the same fma.rn.f32 either way).
    FMA = "fma" if SIMULATED else "cuda.fma"
    L = []
    a = L.append
    # guarded 16-byte weight load: zeros past K (kk: the unit's first column)
    a("def ldwf(W, i):")
    a(f"    return {ld}(W, i)")
    a("def ldw(W, i, kk, K, Z):")
    a(f"    return {'ldz4i' if BF else 'ldz4f'}(W, i, Z, kk < K)")
    a("def ldx(X, i, ok, Z):")
    a("    return ldz4f(X, i, Z, ok)")
    if not c.VEC:
        a("def ldw(W, i, kk, K, Z):")  # scalar: every element guarded
        if BF:
            for e in range(4):
                a(f"    lo{e} = np.int32(W[i + {2 * e}]) if kk + {2 * e} < K else I0")
                a(f"    hi{e} = np.int32(W[i + {2 * e + 1}]) if kk + {2 * e + 1} < K else I0")
            a("    return (" + ", ".join(f"np.int32(lo{e} | (hi{e} << 16))" for e in range(4)) + ")")
        else:
            for e in range(4):
                a(f"    w{e} = W[i + {e}] if kk + {e} < K else ZERO")
            a("    return w0, w1, w2, w3")
        a("def ldxs(X, i, ok, kk, K):")
        for e in range(4):
            a(f"    x{e} = X[i + {e}] if ok and kk + {e} < K else ZERO")
        a("    return x0, x1, x2, x3")
    # the lane's slice of MO rows: RB·MO fma chains from +0 over 32 weights each (shared tile at
    # lw + 32·m·SW); each X quad is loaded once for the MO rows
    a("def dot(Ts, lw, Xs, xb):")
    for m in range(MO):
        for r in range(RB):
            a(f"    p{m}_{r} = ZERO")
    for j in range(NI):
        wq = {}
        for m in range(MO):
            a(f"    u{m}_0, u{m}_1, u{m}_2, u{m}_3 = {lds}(Ts, lw + {32 * m * SW + 4 * j})")
            if BF:
                ws = []
                for e in range(4):
                    a(f"    v{m}_{2 * e} = bits_to_f32(u{m}_{e} << 16)")
                    a(f"    v{m}_{2 * e + 1} = bits_to_f32(u{m}_{e} & -65536)")
                    ws += [f"v{m}_{2 * e}", f"v{m}_{2 * e + 1}"]
                wq[m] = [(2 * j, ws[:4]), (2 * j + 1, ws[4:])]
            else:
                wq[m] = [(j, [f"u{m}_{e}" for e in range(4)])]
        for h in range(len(wq[0])):
            q = wq[0][h][0]
            for r in range(RB):
                a(f"    z0, z1, z2, z3 = lds4f(Xs, xb + {r * CS * 36 + 4 * q})")
                for m in range(MO):
                    for e in range(4):
                        a(f"    p{m}_{r} = {FMA}(z{e}, {wq[m][h][1][e]}, p{m}_{r})")
    a("    return (" + ", ".join(f"p{m}_{r}" for m in range(MO) for r in range(RB)) + ",)")
    # the chunk's CS slice partials of one accumulator, added in slice order
    a("def merge(Ps, i, acc):")
    for sidx in range(CS):
        a(f"    acc = acc + lds1f(Ps, i + {sidx * PSTR})")
    a("    return acc")
    return "\n".join(L) + "\n"


def _source(c: Cfg) -> str:
    RB, OW, SP, NG, NW, NT, OB, CS, KC, PSTR, PF, NI, SW, MO = (
        c.RB, c.OW, c.SP, c.NG, c.NW, c.NT, c.OB, c.CS, c.KC, c.PSTR, c.PF, c.NI, c.SW, c.MO)
    BF = c.BF16
    OWT = OW * MO                 # weight rows per warp step
    NL = NI * MO                  # 16-byte loads per lane per chunk
    EPQ = 8 if BF else 4          # weight elements per 16-byte unit
    UR = SP * NI                  # units per weight row in one warp step
    NACC = -(-(RB * OB) // NT)    # accumulators per thread
    XQ = RB * CS * 8              # X quads per chunk
    NXQ = -(-XQ // NT)            # ... per thread
    sts = "sts4i" if BF else "sts4f"
    zero = "I0" if BF else "ZERO"
    sets = ["wa", "wb", "wc"][:PF]
    L = []
    a = L.append

    a("def kern(X, XS, W, K, N, out, R, Z):")
    for s in sets:  # numba wants every register defined on every path
        for i in range(NL):
            a(f"    {s}{i}_0 = {s}{i}_1 = {s}{i}_2 = {s}{i}_3 = {zero}")
    for m in range(NXQ):
        a(f"    y{m}_0 = y{m}_1 = y{m}_2 = y{m}_3 = ZERO")
    a("    tid = cuda.threadIdx.x")
    a("    ln = tid & 31")
    a("    w = tid >> 5")
    a(f"    og = w // {NG}")
    a(f"    g = w - og * {NG}")
    a("    blk = cuda.blockIdx.x")
    a(f"    o0w = blk * {OB} + og * {OWT}")
    a(f"    nch = (K + {KC - 1}) // {KC}")
    al = "" if SIMULATED else ", alignment=16"  # (the simulator refuses an alignment)
    a(f"    Ts = cuda.shared.array({NW * 32 * MO * SW}, {'np.int32' if BF else 'np.float32'}{al})")
    a(f"    Xs = cuda.shared.array({RB * CS * 36}, np.float32{al})")
    a(f"    Ps = cuda.shared.array({CS * PSTR}, np.float32{al})")
    a(f"    tb = w * {32 * MO * SW}")
    # weight rows: per coalesced instruction i the warp reads 32 consecutive units of the tile
    # (row-major: OWT rows × UR units); lane ln gets unit 32 i + ln = slice (32 i + ln) // NI
    wsrc = []  # per i: (pointer variable, constant element offset)
    if UR >= 32:
        for m in range(OWT):
            a(f"    wr{m} = min(o0w + {m}, N - 1) * K + g * {SP * 32} + ln * {EPQ}")
        a(f"    kq = g * {SP * 32} + ln * {EPQ}")
        for i in range(NL):
            u0 = 32 * i
            wsrc.append((f"wr{u0 // UR}", (u0 % UR) * EPQ))
    else:
        rpi = 32 // UR
        for i in range(NL):
            a(f"    wr{i} = min(o0w + {i * rpi} + ln // {UR}, N - 1) * K + g * {SP * 32} + (ln % {UR}) * {EPQ}")
            wsrc.append((f"wr{i}", 0))
        a(f"    kq = g * {SP * 32} + (ln % {UR}) * {EPQ}")
    # The tile is stored in reading order: lane ln reads tile slices ln + 32 m (m < MO), which hold
    # weight row (ln % OW) + m·OW, slice ln // OW. So the lanes of one slice are adjacent: their X
    # reads share addresses pairwise (T_n, T_n^1), which halves the shared-memory return cycles
    # of an LDS.128 (4 → 2); the 36-word (fp32) / 20-word (bf16) stride keeps reads conflict-free.
    def pos(t):  # storage position of tile slice t (row-major index t = row·SP + slice)
        row, sli = divmod(t, SP)
        return (row // OW) * 32 + sli * OW + row % OW

    def spos(i, ln):  # storage word of load i's 16-byte unit for lane ln
        t, j = divmod(32 * i + ln, NI)
        return pos(t) * SW + 4 * j
    sep = all(spos(i, ln) - spos(0, ln) == spos(i, 0) - spos(0, 0) for i in range(NL) for ln in range(32))
    lni = NI.bit_length() - 1
    if sep:  # store address = one per-lane base + an immediate per load
        qb = 32 // NI
        g0 = [spos(0, q * NI) // SW for q in range(qb)]  # position of lane group q (j = 0) at load 0
        if all(g0[q] == g0[0] + q * (g0[1] - g0[0] if qb > 1 else 0) for q in range(qb)):
            a(f"    sa = tb + (ln >> {lni}) * {(g0[1] - g0[0] if qb > 1 else 0) * SW} + (ln & {NI - 1}) * 4")
            soff = [spos(i, 0) - spos(0, 0) + g0[0] * SW for i in range(NL)]
        else:
            sep = False
    if not sep:
        for i in range(NL):
            t = f"(({32 * i} + ln) >> {lni})"
            a(f"    sa{i} = tb + ((({t} // {SP}) // {OW}) * 32 + ({t} % {SP}) * {OW} + ({t} // {SP}) % {OW}) * {SW}"
              f" + (ln & {NI - 1}) * 4")
    a(f"    lw = tb + ln * {SW}")
    a(f"    sl = g * {SP} + ln // {OW}")  # the lane's slice within the chunk
    a("    xb = sl * 36")
    a(f"    pa = sl * {PSTR} + og * {OWT} + ln % {OW}")
    for m in range(NXQ):  # X staging: quad e = tid + m NT = (row·CS + slice)·8 + quad
        a(f"    xe{m} = tid + {m * NT}")
        a(f"    xr{m} = xe{m} // {CS * 8}")
        a(f"    xk{m} = (xe{m} % {CS * 8}) * 4")
        a(f"    xs{m} = (xe{m} >> 3) * 36 + (xe{m} & 7) * 4")
    for m in range(NACC):
        a(f"    acc{m} = ZERO")

    def wload(p, s, cc):
        """Issue the W loads of chunk cc into register set s."""
        a(f"{p}kc = {cc} * {KC}")
        if c.HOT:
            for i in range(NL):
                v, off = wsrc[i]
                a(f"{p}{s}{i}_0, {s}{i}_1, {s}{i}_2, {s}{i}_3 = ldwf(W, {v} + kc + {off})")
            return
        if c.VEC:  # full chunks (all but the last, usually all) load without guards
            a(f"{p}if kc + {KC} <= K:")
            for i in range(NL):
                v, off = wsrc[i]
                a(f"{p}    {s}{i}_0, {s}{i}_1, {s}{i}_2, {s}{i}_3 = ldwf(W, {v} + kc + {off})")
            a(f"{p}else:")
            p = p + "    "
        for i in range(NL):
            v, off = wsrc[i]
            a(f"{p}{s}{i}_0, {s}{i}_1, {s}{i}_2, {s}{i}_3 = ldw(W, {v} + kc + {off}, kc + kq + {off}, K, Z)")

    def xload(p, cc):
        a(f"{p}kc = {cc} * {KC}")
        for m in range(NXQ):
            ok = f"{'xe%d < %d and ' % (m, XQ) if NXQ * NT > XQ else ''}xr{m} < R and kc + xk{m} < K"
            if c.VEC:
                a(f"{p}y{m}_0, y{m}_1, y{m}_2, y{m}_3 = ldx(X, xr{m} * XS + kc + xk{m}, {ok}, Z)")
            else:
                ok = f"{'xe%d < %d and ' % (m, XQ) if NXQ * NT > XQ else ''}xr{m} < R"
                a(f"{p}y{m}_0, y{m}_1, y{m}_2, y{m}_3 = ldxs(X, xr{m} * XS + kc + xk{m}, {ok}, kc + xk{m}, K)")

    def xstore(p):
        for m in range(NXQ):
            if NXQ * NT > XQ:
                a(f"{p}if xe{m} < {XQ}:")
                a(f"{p}    sts4f(Xs, xs{m}, y{m}_0, y{m}_1, y{m}_2, y{m}_3)")
            else:
                a(f"{p}sts4f(Xs, xs{m}, y{m}_0, y{m}_1, y{m}_2, y{m}_3)")

    def body(p, s, cc):
        for i in range(NL):
            addr = f"sa + {soff[i]}" if sep else f"sa{i}"
            a(f"{p}{sts}(Ts, {addr}, {s}{i}_0, {s}{i}_1, {s}{i}_2, {s}{i}_3)")
        a(f"{p}syncwarp()")
        a(f"{p}if {cc} + {PF} < nch:")
        wload(p + "    ", s, f"({cc} + {PF})")
        a(f"{p}" + ", ".join(f"p{m}_{r}" for m in range(MO) for r in range(RB)) + ", = dot(Ts, lw, Xs, xb)")
        for m in range(MO):
            for r in range(RB):
                a(f"{p}sts1f(Ps, pa + {r * OB + m * OW}, p{m}_{r})")
        a(f"{p}cuda.syncthreads()")
        a(f"{p}if {cc} + 1 < nch:")
        xstore(p + "    ")
        a(f"{p}    if {cc} + 2 < nch:")
        xload(p + "        ", f"({cc} + 2)")
        for m in range(NACC):
            if (m + 1) * NT > RB * OB:
                a(f"{p}if tid + {m * NT} < {RB * OB}:")
                a(f"{p}    acc{m} = merge(Ps, tid + {m * NT}, acc{m})")
            else:
                a(f"{p}acc{m} = merge(Ps, tid + {m * NT}, acc{m})")
        a(f"{p}cuda.syncthreads()")

    # prologue: weight chunks 0..PF-1 in flight, X chunk 0 staged, X chunk 1 in registers
    for k, s in enumerate(sets):
        a(f"    if {k} < nch:")
        wload("        ", s, f"{k}")
    a("    if 0 < nch:")
    xload("        ", "0")
    xstore("        ")
    a("        if 1 < nch:")
    xload("            ", "1")
    a("    cuda.syncthreads()")
    a("    c = 0")
    a("    while c < nch:")
    for k, s in enumerate(sets):
        if k == 0:
            body("        ", s, "c")
        else:
            a(f"        if c + {k} < nch:")
            body("            ", s, f"(c + {k})")
    a(f"        c += {PF}")
    for m in range(NACC):
        a(f"    e = tid + {m * NT}")
        a(f"    r = e // {OB}")
        a(f"    o = blk * {OB} + e % {OB}")
        a(f"    if e < {RB * OB} and r < R and o < N:")
        a(f"        out[r, o] = acc{m}")
    return "\n".join(L) + "\n"


_PRELUDE_SIM = """
def syncwarp():
    cuda.syncthreads()   # the simulator has no warp barrier; a block barrier is a stronger one
"""
_PRELUDE_GPU = """
def syncwarp():
    cuda.syncwarp(0xFFFFFFFF)
"""
_DEVICE_FNS = ("syncwarp", "ldwf", "ldw", "ldx", "ldxs", "dot", "merge")

_KERNELS: dict = {}


def source(c: Cfg) -> str:
    return (_PRELUDE_SIM if SIMULATED else _PRELUDE_GPU) + _devices(c) + _source(c)


_NS = ("cuda", "np", "ZERO", "I0", "fma", "bits_to_f32", "ldg4f", "ldg4i", "lds4f", "lds4i", "sts4f",
       "sts4i", "lds1f", "sts1f", "ldz4f", "ldz4i")
I0 = np.int32(0)


def module_source(c: Cfg) -> str:
    """The kernel as a stand-alone module (``cache=True``: numba caches it beside the file, so
    worker processes can compile configurations in parallel for a later process to load)."""
    head = ["# generated by kernels_proto/gemv.py: " + repr(c), "import numpy as np",
            "from numba import cuda", "from kernels_proto.gemv import " + ", ".join(_NS[2:])]
    body = source(c)
    if not SIMULATED:
        for f in _DEVICE_FNS:
            body = body.replace(f"\ndef {f}(", f"\n@cuda.jit(device=True, forceinline=True)\ndef {f}(")
        body = body.replace("\ndef kern(", "\n@cuda.jit(cache=True)\ndef kern(")
    else:
        body = body.replace("\ndef kern(", "\n@cuda.jit\ndef kern(")
    return "\n".join(head) + "\n" + body


def kernel(c: Cfg, gen_dir: str | None = None):
    """The compiled (lazily, per signature) kernel for configuration ``c``. With ``gen_dir`` the
    kernel is written there as a module and imported (numba's on-disk cache applies)."""
    k = _KERNELS.get(c)
    if k is not None:
        return k
    c.check()
    if gen_dir is not None:
        import hashlib
        import importlib.util
        import os

        src = module_source(c)
        tag = hashlib.sha1(src.encode()).hexdigest()[:12]
        os.makedirs(gen_dir, exist_ok=True)
        path = os.path.join(gen_dir, f"gemv_{tag}.py")
        if not os.path.exists(path):
            with open(path + ".tmp", "w") as f:
                f.write(src)
            os.replace(path + ".tmp", path)
        name = f"_gemv_gen_{tag}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # (importable by name, as pickled cache entries may expect)
        spec.loader.exec_module(mod)
        k = _KERNELS[c] = mod.kern
        return k
    ns = {n: globals()[n] for n in _NS}
    ns["__name__"] = __name__
    src = source(c)
    exec(compile(src, f"<gemv {c.name()}>", "exec"), ns)
    if not SIMULATED:
        for f in _DEVICE_FNS:
            if f in ns:
                ns[f] = cuda.jit(device=True, forceinline=True)(ns[f])
    k = _KERNELS[c] = cuda.jit(ns["kern"])
    k._gemv_source = src
    return k


_ZEROS: dict = {}


def zeros():
    """16 zero bytes on the device: what a load past K reads instead (see ``ldz4f``)."""
    z = _ZEROS.get("z")
    if z is None:
        z = _ZEROS["z"] = cuda.to_device(np.zeros(8, np.float32))
    return z


def prepare(X, W, out, R: int, cfg: Cfg | None = None):
    """A launcher with everything but the launch done: ``f()`` runs the GEMV on the default
    stream, ``f(go=numba_kernels.cuda._go)`` through ``go`` (graph capture)."""
    N, K = W.shape
    bf16 = W.dtype == np.uint16
    if cfg is None:
        cfg = pick(N, K, R, bf16, vec_ok(X, W, K, bf16))
    _validate(cfg, X, W, K, R, bf16)
    k = kernel(cfg)
    grid = (N + cfg.OB - 1) // cfg.OB
    args = (X.reshape(X.shape[0] * X.shape[1]), X.shape[1], W.reshape(N * K), K, N, out, R, zeros())
    kk = k[grid, cfg.NT]

    def f(go=None):
        if N == 0 or R == 0:
            return
        if go is None:
            kk(*args)
        else:
            go(k, grid, cfg.NT, *args)
    f.cfg = cfg
    return f


def signature(c: Cfg) -> str:
    w = "uint16" if c.BF16 else "float32"
    return f"(float32[::1], int64, {w}[::1], int64, int64, float32[:, ::1], int64, float32[::1])"


# ------------------------------------------------------------------------------------------------
# dispatch and launch
# ------------------------------------------------------------------------------------------------
ROW_BUCKETS = (1, 2, 4, 5, 8)  # R = 3 runs the 4-row kernel, R = 6, 7 the 8-row one
LARGE_N = 8192                 # from here on output groups alone give every SM several blocks
TINY_N = 1024                  # below, one row bucket gets 8 warps per 4 outputs


def bucket(R: int) -> int:
    for b in ROW_BUCKETS:
        if R <= b:
            return b
    raise ValueError(f"gemv serves at most {ROW_BUCKETS[-1]} rows, got {R}")


def pick(N: int, K: int, R: int, bf16: bool = False, vec: bool = True) -> Cfg:
    """The default configuration of an (N, K, R) GEMV (see the module docstring).

    Large N: warps own 4 outputs each and walk K alone (NG = 1), 8 or 4 warps per block share the X
    chunk. Small N (the 2048-output projections): the K of each chunk is split over 4 warps, so
    N = 2048 still gives 256 blocks; with 8 rows, 2 output groups share the X chunk. Tiny N, one
    row: 8 warps split each chunk of 4 outputs (K = 2048 is a single chunk)."""
    RB = bucket(R)
    if N < TINY_N and RB == 1:  # (ba: 64 outputs) latency-bound: the most warps on few outputs
        c = Cfg(RB=1, OW=4, NOG=1, NG=8, PF=1)
    elif N >= LARGE_N:
        if RB <= 2:
            c = Cfg(RB=RB, OW=4, NOG=8, NG=1, PF=2)
        elif RB <= 5:  # two rows of W per lane share each X load (X reads: half the return cycles)
            c = Cfg(RB=RB, OW=4, NOG=4, NG=1, PF=1, MO=2)
        else:
            c = Cfg(RB=RB, OW=4, NOG=4, NG=1, PF=1)
    elif RB <= 5:
        c = Cfg(RB=RB, OW=8, NOG=1, NG=4, PF=2)
    else:
        c = Cfg(RB=RB, OW=8, NOG=2, NG=2, PF=1)
    if bf16 and RB >= 4 and c.MO == 1:  # half the bytes per weight: X reads weigh twice as much
        c = dataclasses.replace(c, MO=2)
    return dataclasses.replace(c, BF16=bf16, VEC=vec)


def vec_ok(X, W, K: int, bf16: bool) -> bool:
    def addr(a):
        return a.__cuda_array_interface__["data"][0] if hasattr(a, "__cuda_array_interface__") else \
            a.ctypes.data
    q = 8 if bf16 else 4
    try:
        return K % q == 0 and X.shape[1] % 4 == 0 and addr(X) % 16 == 0 and addr(W) % 16 == 0
    except Exception:  # noqa: BLE001 (simulator arrays: alignment is numpy's)
        return K % q == 0 and X.shape[1] % 4 == 0


def _validate(cfg, X, W, K, R, bf16):
    if cfg.BF16 != bf16 or not 0 <= R <= cfg.RB or X.shape[1] < K:
        raise ValueError(f"gemv: {cfg.name()} cannot run W {W.dtype} [.., {K}], X {X.shape}, R = {R}")
    if cfg.VEC and not vec_ok(X, W, K, bf16):
        raise ValueError(f"gemv: {cfg.name()} needs K % {8 if bf16 else 4} == 0 and 16-byte aligned rows "
                         f"(K = {K}, X row stride {X.shape[1]}); use VEC=False")


def launch(X, W, out, R: int, cfg: Cfg | None = None, stream=0, go=None):
    """out[r, o] = dot(X[r, :K], W[o, :K]) for r < R (1 ≤ R ≤ 8), canonical order.
    X: [≥R, ≥K] float32 C-contiguous; W: [N, K] float32 or uint16 (bf16 bits); out: [≥R, N].
    ``go(kernel, grid, block, *args)`` launches instead when given (``numba_kernels.cuda._go``:
    graph capture). Returns the configuration used."""
    N, K = W.shape
    bf16 = W.dtype == np.uint16
    if cfg is None:
        cfg = pick(N, K, R, bf16, vec_ok(X, W, K, bf16))
    _validate(cfg, X, W, K, R, bf16)
    if N == 0 or R == 0:
        return cfg
    k = kernel(cfg)
    grid = (N + cfg.OB - 1) // cfg.OB
    Xf = X.reshape(X.shape[0] * X.shape[1])
    Wf = W.reshape(N * K)
    if go is not None:
        go(k, grid, cfg.NT, Xf, X.shape[1], Wf, K, N, out, R, zeros())
    else:
        k[grid, cfg.NT, stream](Xf, X.shape[1], Wf, K, N, out, R, zeros())
    return cfg
