"""Linear layers: out[r, o] = dot(X[r, :K], W[o, :K]) for r < R, in the canonical dot order.

Shapes: X [≥R, K] float32; W [N, K] float32, or bf16 bit patterns (uint16) widened exactly in
registers (DESIGN.md §8: the same bits as the float32 path on the widened weights); out [≥R, N];
rows past R are neither read nor written.

The order (:func:`numba_kernels.exact.dot`): K in slices of 32; an fma chain from +0 inside a
slice (``fma_chain``); slice partials added left to right into an accumulator that starts at
+0 (``add_partial``). Every version keeps it:

- ``linear_cpu`` (the twin) and ``linear_naive`` (CUDA, one thread per output) call ``dot_rows``
  (``widen`` reads a bf16 weight);
- ``gemv`` (R ≤ ``GEMV_MAX_ROWS`` = 8: decode, verify, MTP drafts), a generated kernel
  (:func:`gemv_source`, configuration :class:`GemvCfg` chosen per (N, K, R) by
  :func:`gemv_pick`): a warp reads a tile of weight rows × 32-element slices with 128-bit loads,
  re-reads it transposed from shared memory so that each lane holds whole slices and runs their
  fma chains for every row of X at once (the weight is read once per step for all rows); the
  slices of a K chunk may be split over several warps; each chunk's slice partials go through
  shared memory and are added to the accumulators in slice order; weight loads are issued one or
  more chunks ahead;
- ``gemm`` (more rows: prime), a generated kernel (:func:`gemm_source`, :class:`GemmCfg`;
  default 128×128 output tiles, K stages of 32): each of 256 threads keeps an 8×8 register tile of
  slice chains and accumulators, the next K stage waits in registers while the current one is
  computed from shared memory, and at each 32-column slice boundary the chains are added to the
  accumulators (``C += P``). A K stage past K is zero-filled: ``fma(+0, +0, p)`` changes ``p`` only
  from −0 to +0, and an accumulator that starts at +0 is never −0, so adding a −0 or a +0 partial
  gives the same bits.

``linear_flag`` is ``linear`` then ``nonfinite_flag`` of its output (the lm head): up to 8 rows
the GEMV checks each output as it stores it (``GemvCfg.EP`` "flag"), past 8 rows the GEMM and the
flag kernel.

Which one runs is :mod:`numba_kernels.dispatch`'s table. Both generated kernels were timed on an
H200 (``receipts/probes/``): the GEMM at 38-39 TFLOP/s on the bench shapes (cuBLAS SGEMM 46-51),
the GEMVs of a bench-8l decode step at 1.12× the copy-bandwidth floor.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import dispatch
from .dispatch import GEMV_BUCKETS, GEMV_MAX_ROWS
from .exact import SLICE, dot_rows
from .elementwise import nonfinite_flag_cpu, nonfinite_flag_cuda, swiglu_act_cpu, swiglu_act_cuda
from .mma_gemm import linear_mma_cpu, linear_mma_naive
from .tags import (STATIC_SMEM, KernelSource, aligned, body, cuda, generated, generator, grid1, kernel, launch, launcher,
                   pdl_on,
                   prange, twin, zero_buffer)


@body
def linear_at(X, W, out, r, o):
    out[r, o] = dot_rows(X, r, 0, W, o, 0, W.shape[1])


@twin("linear", parallel=True)
def linear_cpu(X, W, out, R):
    """out[r, o] = dot(X[r, :K], W[o, :K]) for r < R. X: [≥R, K]; W: [N, K] float32 or uint16 (bf16
    bit patterns, widened exactly); out: [≥R, N]."""
    N = W.shape[0]
    for ro in prange(R * N):
        r = ro // N
        linear_at(X, W, out, r, ro - r * N)


@kernel
def linear_naive_k(X, W, out, R):
    i = cuda.grid(1)
    N = W.shape[0]
    if i < R * N:
        r = i // N
        linear_at(X, W, out, r, i - r * N)


@launcher(of="linear")
def linear_naive(X, W, out, R):
    """One thread per output (the reference launch; :func:`linear` is the fast path)."""
    launch(linear_naive_k, *grid1(R * W.shape[0]), X, W, out, R)




# ------------------------------------------------------------------------------------------------
# the GEMV (R ≤ GEMV_MAX_ROWS)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemvCfg:
    """One GEMV configuration.

    A **warp step** is a tile of MO·OW weight rows × SP = 32/OW consecutive slices (MO·4 KiB of
    float32, MO·2 KiB of bf16), read with coalesced 128-bit loads, stored into the warp's own
    shared tile and read back so that lane L holds slice L // OW of rows L % OW + m·OW (m < MO);
    its fma chains cover all RB rows of X (staged in shared memory) at once. A **block** is NOG ×
    NG warps: NOG groups of MO·OW outputs (OB per block), NG warps splitting each K **chunk** of
    CS = NG·SP slices (KC = 32·CS elements). Each lane writes its slice partials to a shared
    P[slice][row][output]; after a barrier the OB·RB accumulator threads add the chunk's CS
    partials in slice order, chunk after chunk. Weight loads are issued PF chunks ahead; the next
    chunk's X is loaded during the current one. A chunk that crosses K reads a 16-byte zero buffer
    past K (a pointer select): a zero term fma(0, 0, p) and a +0 partial leave the bits unchanged.
    Tile and X rows are padded by 16 bytes (no bank conflicts)."""
    RB: int = 1      # rows of X the kernel is built for (R ≤ RB at run time)
    OW: int = 4      # outputs per warp step (SP = 32 // OW slices each)
    NOG: int = 8     # output groups (warps along N) per block
    NG: int = 1      # warps along K per block (each chunk has NG·SP slices)
    PF: int = 1      # chunks of weights in flight ahead of the one computed
    MO: int = 1      # tile slices per lane: MO output rows share each X load
    BF16: bool = False  # W holds bf16 bit patterns (uint16)
    VEC: bool = True  # 128-bit loads (K % 4 == 0, bf16 K % 8 == 0, 16-byte aligned rows); else scalar
    EP: str = ""  # the epilogue (GEMV_EPILOGUES): "flag" (linear_flag)
    PDL: bool = False  # the weight chunks in flight before pdl_wait(), X after (launched with PDL: gemv)

    SP = property(lambda c: 32 // c.OW)
    NW = property(lambda c: c.NOG * c.NG)
    NT = property(lambda c: 32 * c.NW)
    OB = property(lambda c: c.NOG * c.OW * c.MO)
    CS = property(lambda c: c.NG * c.SP)
    KC = property(lambda c: c.CS * SLICE)
    NI = property(lambda c: 4 if c.BF16 else 8)  # 16-byte units per slice: weight loads per lane per chunk
    SW = property(lambda c: 4 * (c.NI + 1))  # 32-bit words per tile slice, padded by one unit

    @property
    def PSTR(self):  # P row stride ≡ OW (mod 32): a warp's 32 partial stores hit 32 banks
        n = self.RB * self.OB
        return n + (self.OW - n) % 32

    @property
    def smem_bytes(self):
        return 4 * (self.NW * 32 * self.MO * self.SW + self.RB * self.CS * 36 + self.CS * self.PSTR)

    def name(self):
        return (f"gemv_{'bf16' if self.BF16 else 'f32'}_R{self.RB}_ow{self.OW}_og{self.NOG}_ng{self.NG}_pf{self.PF}"
                f"_mo{self.MO}{'' if self.VEC else '_scalar'}{'_' + self.EP if self.EP else ''}{'_pdl' if self.PDL else ''}")

    def check(self):
        if not (self.OW in (2, 4, 8, 16) and self.RB >= 1 and self.NOG >= 1 and self.NG >= 1 and self.PF in (1, 2, 3)
                and self.MO in (1, 2) and self.NT <= 1024 and self.smem_bytes <= STATIC_SMEM
                and self.EP in GEMV_EPILOGUES):
            raise ValueError(f"{self.name()}: not a valid GEMV configuration ({self.smem_bytes} B of shared memory)")
        return self

    def with_pdl(self):
        """This configuration launched with PDL (a method: the launcher runs in the CUDA build's
        namespace, which holds no ``dataclasses``)."""
        return dataclasses.replace(self, PDL=True)


# "flag": each output checked for NaN/Inf as it is stored (linear_flag)
GEMV_EPILOGUES = ("", "flag")
GEMV_LARGE_N = 8192  # from here on, output groups alone give every SM several blocks
GEMV_TINY_N = 1024  # below, one row gets 8 warps splitting each chunk of 4 outputs
GEMV_HUGE_N = 32768  # (the lm head) 8 rows: two W rows per lane, two output groups per block


def gemv_bucket(R: int) -> int:
    """The rows a GEMV kernel is built for: R = 3 runs the 4-row kernel, R = 6, 7 the 8-row one."""
    for b in GEMV_BUCKETS:
        if R <= b:
            return b
    raise ValueError(f"gemv serves at most {GEMV_MAX_ROWS} rows, got {R}")


def gemv_pick(N: int, K: int, R: int, bf16: bool = False, vec: bool = True) -> GemvCfg:
    """The configuration of an (N, K, R) GEMV: the fastest measured on the H200 for the bench-8l
    decode shapes (``receipts/probes/h200-probe-gemv.log``: 891 µs for the 39 GEMVs of a decode
    step, copy-bandwidth floor 794 µs).

    float32 weights: one row → 8 warps split each chunk of 4 (tiny N) or 8 outputs; 2-5 rows,
    large N → 4 warps a block own their outputs and walk K alone: 4 outputs and two W rows per
    lane (2 rows), 8 outputs (3-5 rows; the lm head two W rows per lane); small N → 4 warps split
    each chunk of 8 outputs, one chunk in flight ahead up to K = 4,096 at 2-4 rows, two otherwise;
    8 rows, small N → 4 warps split each chunk; large N → 4 warps of 4 outputs, the lm head two W
    rows per lane. The 2-5-row picks: `tools/decode_kernels.py --sweep --sweep-large --sweep-rows
    4,2,5` on the H200 (`receipts/probes/h200-decode-kernels-sweep-rows-20d605d.json`; a 4-row step's
    16 large-N GEMVs of bench-8l 13 % faster, 2 rows 22 %). bf16 weights: the same families with two W rows per lane from 4 rows
    (half the bytes per weight: the X reads weigh twice as much); one row below the lm head's N,
    4 outputs a lane and no chunk in flight ahead -- 4 output groups a block (large N) or 4 warps
    splitting each chunk (small N) -- the fastest of a line search from the earlier pick on the
    bench-8l shapes (`tools/decode_kernels.py --sweep --sweep-bf16 --sweep-search line
    --sweep-rows 1`, `receipts/probes/h200-decode-kernels-line-bf16-18bfe83.json`: gdn in
    19.1 → 13.5 µs, mlp gate+up 18.7 → 12.6, the 2,048-output shapes 8.0-10.1 → 6.3-8.0); two
    rows the same way (`--sweep-rows 5,2`, `receipts/probes/h200-decode-kernels-line-bf16-r5r2-0c5a857.json`):
    8 output groups a block, no chunk ahead (large N: gdn in 21.4 → 13.8 µs) and 8 warps
    splitting each chunk (small N: 8.4-10.5 → 7.0-9.3)."""
    RB = gemv_bucket(R)
    large = N >= GEMV_LARGE_N
    if N < GEMV_TINY_N and RB == 1:
        c = GemvCfg(RB=1, OW=4, NOG=1, NG=8, PF=1)
    elif bf16:
        if RB == 1 and N < GEMV_HUGE_N:
            c = GemvCfg(RB=1, OW=4, NOG=4, NG=1, PF=1) if large else GemvCfg(RB=1, OW=4, NOG=1, NG=4, PF=1)
        elif RB == 2 and N < GEMV_HUGE_N:
            c = GemvCfg(RB=2, OW=4, NOG=8, NG=1, PF=1) if large else GemvCfg(RB=2, OW=8, NOG=1, NG=8, PF=1)
        elif large:
            c = (GemvCfg(RB=RB, OW=4, NOG=8, NG=1, PF=2) if RB <= 2 else
                 GemvCfg(RB=RB, OW=4, NOG=4, NG=1, PF=1, MO=2))
        else:
            c = GemvCfg(RB=RB, OW=8, NOG=1, NG=4, PF=2, MO=2 if RB >= 4 else 1) if RB <= 5 else \
                GemvCfg(RB=RB, OW=8, NOG=2, NG=2, PF=1, MO=2)
    elif RB == 1:
        c = GemvCfg(RB=1, OW=8, NOG=1, NG=8, PF=1)
    elif large:
        if RB == 2:
            c = GemvCfg(RB=2, OW=4, NOG=4, NG=1, PF=1, MO=2)
        elif RB in (4, 5):
            c = GemvCfg(RB=RB, OW=8, NOG=4, NG=1, PF=1, MO=2 if N >= GEMV_HUGE_N else 1)
        elif RB == 8 and N >= GEMV_HUGE_N:
            c = GemvCfg(RB=8, OW=4, NOG=2, NG=1, PF=1, MO=2)
        else:
            c = GemvCfg(RB=RB, OW=4, NOG=4, NG=1, PF=1)
    elif RB <= 5:
        c = GemvCfg(RB=RB, OW=8, NOG=1, NG=4, PF=1 if RB < 5 and K <= 4096 else 2)
    else:
        c = GemvCfg(RB=RB, OW=8, NOG=1, NG=4, PF=1)
    return dataclasses.replace(c, BF16=bf16, VEC=vec).check()


@generator
def gemv_config(N, K, R, bf16, vec_ok, ep=""):
    """The configuration ``gemv`` runs: :func:`gemv_pick`, with 128-bit loads where ``vec_ok`` (16-byte
    aligned rows) and K allows them, and the epilogue ``ep``."""
    return dataclasses.replace(gemv_pick(N, K, R, bf16, vec_ok and K % (8 if bf16 else 4) == 0), EP=ep).check()


def _gemv_devices(c: GemvCfg) -> str:
    """The kernel's force-inlined device functions: guarded loads, the lane's slice chains
    (``dot``) and the ordered add of a chunk's partials (``merge``)."""
    RB, CS, NI, BF, PSTR, MO, SW = c.RB, c.CS, c.NI, c.BF16, c.PSTR, c.MO, c.SW
    L = ["I0 = np.int32(0)"]
    a = L.append
    a("@devf")
    a("def ldwf(W, i):")
    a("    return ldg4(W, i)")
    if c.VEC:
        a("@devf")
        a("def ldw(W, i, kk, K, Z):")  # a 16-byte unit of weights: zeros past K
        a("    return ldgz4(W, i, Z, kk < K)")
    else:
        a("@devf")
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
        a("@devf")
        a("def ldxs(X, i, ok, kk, K):")
        for e in range(4):
            a(f"    x{e} = X[i + {e}] if ok and kk + {e} < K else ZERO")
        a("    return x0, x1, x2, x3")
    a("@devf")
    a("def ldx(X, i, ok, Z):")
    a("    return ldgz4(X, i, Z, ok)")
    # the lane's slices of MO rows: RB·MO fma chains from +0 over 32 weights each (shared tile at
    # lw + 32·m·SW); each X quad is loaded once for the MO rows
    a("@devf")
    a("def dot(Ts, lw, Xs, xb):")
    for m in range(MO):
        for r in range(RB):
            a(f"    p{m}_{r} = ZERO")
    for j in range(NI):
        wq = {}
        for m in range(MO):
            a(f"    u{m}_0, u{m}_1, u{m}_2, u{m}_3 = lds4(Ts, lw + {32 * m * SW + 4 * j})")
            if BF:  # two bf16 per word, widened exactly
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
                a(f"    z0, z1, z2, z3 = lds4(Xs, xb + {r * CS * 36 + 4 * q})")
                for m in range(MO):
                    for e in range(4):
                        a(f"    p{m}_{r} = fma(z{e}, {wq[m][h][1][e]}, p{m}_{r})")
    a("    return (" + ", ".join(f"p{m}_{r}" for m in range(MO) for r in range(RB)) + ",)")
    # the chunk's CS slice partials of one accumulator, added in slice order
    a("@devf")
    a("def merge(Ps, i, acc):")
    for sidx in range(CS):
        a(f"    acc = acc + lds1(Ps, i + {sidx * PSTR})")
    a("    return acc")
    return "\n".join(L) + "\n"


def _gemv_kernel(c: GemvCfg) -> str:
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
    zero = "I0" if BF else "ZERO"
    sets = ["wa", "wb", "wc"][:PF]
    L = []
    a = L.append

    a("def kern(X, XS, W, K, N, out, R, Z, flags, slot):" if c.EP == "flag" else "def kern(X, XS, W, K, N, out, R, Z):")
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
    a(f"    Ts = cuda.shared.array({NW * 32 * MO * SW}, {'np.int32' if BF else 'np.float32'}, alignment=ALIGN)")
    a(f"    Xs = cuda.shared.array({RB * CS * 36}, np.float32, alignment=ALIGN)")
    a(f"    Ps = cuda.shared.array({CS * PSTR}, np.float32, alignment=ALIGN)")
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
    # reads share addresses pairwise, which halves the shared-memory return cycles of an LDS.128;
    # the 36-word (float32) / 20-word (bf16) stride keeps reads conflict-free.
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
    NACC_ = NACC
    for m in range(NACC_):
        a(f"    acc{m} = ZERO")

    def wload(p, s, cc):
        """Issue the W loads of chunk cc into register set s."""
        a(f"{p}kc = {cc} * {KC}")
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
            if c.VEC:
                ok = f"{'xe%d < %d and ' % (m, XQ) if NXQ * NT > XQ else ''}xr{m} < R and kc + xk{m} < K"
                a(f"{p}y{m}_0, y{m}_1, y{m}_2, y{m}_3 = ldx(X, xr{m} * XS + kc + xk{m}, {ok}, Z)")
            else:
                ok = f"{'xe%d < %d and ' % (m, XQ) if NXQ * NT > XQ else ''}xr{m} < R"
                a(f"{p}y{m}_0, y{m}_1, y{m}_2, y{m}_3 = ldxs(X, xr{m} * XS + kc + xk{m}, {ok}, kc + xk{m}, K)")

    def xstore(p):
        for m in range(NXQ):
            if NXQ * NT > XQ:
                a(f"{p}if xe{m} < {XQ}:")
                a(f"{p}    sts4(Xs, xs{m}, y{m}_0, y{m}_1, y{m}_2, y{m}_3)")
            else:
                a(f"{p}sts4(Xs, xs{m}, y{m}_0, y{m}_1, y{m}_2, y{m}_3)")

    def chunk(p, s, cc):
        for i in range(NL):
            addr = f"sa + {soff[i]}" if sep else f"sa{i}"
            a(f"{p}sts4(Ts, {addr}, {s}{i}_0, {s}{i}_1, {s}{i}_2, {s}{i}_3)")
        a(f"{p}syncwarp()")
        a(f"{p}if {cc} + {PF} < nch:")
        wload(p + "    ", s, f"({cc} + {PF})")
        a(f"{p}" + ", ".join(f"p{m}_{r}" for m in range(MO) for r in range(RB)) + ", = dot(Ts, lw, Xs, xb)")
        for m in range(MO):
            for r in range(RB):
                a(f"{p}sts1(Ps, pa + {r * OB + m * OW}, p{m}_{r})")
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

    # prologue: weight chunks 0..PF-1 in flight, X chunk 0 staged, X chunk 1 in registers (PDL:
    # the weights are no earlier kernel's output, so their loads go before pdl_wait, X's after)
    for k, s in enumerate(sets):
        a(f"    if {k} < nch:")
        wload("        ", s, f"{k}")
    if c.PDL:
        a("    pdl_wait()")
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
            chunk("        ", s, "c")
        else:
            a(f"        if c + {k} < nch:")
            chunk("            ", s, f"(c + {k})")
    a(f"        c += {PF}")
    for m in range(NACC):
        a(f"    e = tid + {m * NT}")
        a(f"    r = e // {OB}")
        a(f"    o = blk * {OB} + e % {OB}")
        a(f"    if e < {RB * OB} and r < R and o < N:")
        a(f"        out[r, o] = acc{m}")
        if c.EP == "flag":
            a(f"        if nonfinite(acc{m}):")
            a("            flags[slot] = 1")
    return "\n".join(L) + "\n"


@generator
def gemv_source(c: GemvCfg) -> KernelSource:
    """The GEMV kernel of configuration ``c``: ``kern(X, XS, W, K, N, out, R, Z)`` with X and W
    flattened (row strides XS and K), Z 16 zero bytes (full unrolling, static register names; the
    repeated pieces are force-inlined device functions, which keeps Numba's compile time at ~2 s)."""
    c.check()
    return KernelSource(c.name(), _gemv_devices(c) + _gemv_kernel(c), c.NT)


@launcher(of="linear")
def gemv(X, W, out, R, cfg=None, flag=()):
    """R ≤ GEMV_MAX_ROWS rows (``cfg``: a :class:`GemvCfg`, default :func:`gemv_pick`'s). X C-contiguous;
    W [N, K] float32 or uint16 (bf16 bits), C-contiguous. ``flag``: (flags, slot) for the epilogue
    that raises flags[slot] on a non-finite output (``linear_flag``)."""
    N, K = W.shape
    if R <= 0 or N == 0:
        return
    bf16 = W.dtype == np.uint16
    vec_ok = X.shape[1] % 4 == 0 and aligned(X) and aligned(W)
    ep = "flag" if flag else ""
    if cfg is None:
        cfg = gemv_config(N, K, R, bf16, vec_ok, ep)
        if pdl_on():  # a captured step launches it with PDL (launch.launch); a given cfg runs as given
            cfg = cfg.with_pdl()
    elif (cfg.BF16 != bf16 or cfg.EP != ep or R > cfg.RB
          or (cfg.VEC and not (vec_ok and K % (8 if bf16 else 4) == 0))):
        raise ValueError(f"gemv: {cfg.name()} cannot run W {W.dtype} [.., {K}], X {X.shape}, R = {R}"
                         f"{', epilogue ' + ep if ep else ''}")
    k = generated(gemv_source, cfg)
    launch(k, (N + cfg.OB - 1) // cfg.OB, k.threads, X.reshape(X.shape[0] * X.shape[1]), X.shape[1],
           W.reshape(N * K), K, N, out, R, zero_buffer("gemv.zeros", 8), *flag, pdl=cfg.PDL)


# ------------------------------------------------------------------------------------------------
# the lm head: a linear layer that checks its outputs for NaN/Inf
# ------------------------------------------------------------------------------------------------
@twin("linear_flag")
def linear_flag_cpu(X, W, out, R, flags, slot):
    """``linear(X, W, out, R)``, then ``nonfinite_flag(out, R, flags, slot)``: flags[slot] = 1 when
    an output is NaN or ±inf (the lm head and its logits)."""
    linear_cpu(X, W, out, R)
    nonfinite_flag_cpu(out, R, flags, slot)


@launcher("linear_flag")
def linear_flag_cuda(X, W, out, R, flags, slot):
    """Up to GEMV_MAX_ROWS rows the GEMV checking each output as it stores it (``GemvCfg.EP``
    "flag"); more rows the GEMM, then ``nonfinite_flag``."""
    if dispatch.pick("linear", R) == "gemv":
        gemv(X, W, out, R, None, (flags, slot))
    elif R > 0:
        gemm(X, W, out, R)
        nonfinite_flag_cuda(out, R, flags, slot)


@twin("linear_flag_mma")
def linear_flag_mma_cpu(X, W, out, R, flags, slot, xp=None):
    """exact-bf16 ``linear_flag`` (the lm head): ``linear_mma(X, W, out, R, xp)``, then
    ``nonfinite_flag(out, R, flags, slot)``."""
    linear_mma_cpu(X, W, out, R, xp)
    nonfinite_flag_cpu(out, R, flags, slot)


@launcher("linear_flag_mma")
def linear_flag_mma_cuda(X, W, out, R, flags, slot, xp=None):
    """The naive exact-bf16 linear, then the flag kernel (on a GPU ``mma_tc.linear_flag_mma_tc``
    serves the op: the bf16 GEMV checks each output as it stores it)."""
    linear_mma_naive(X, W, out, R, xp)
    nonfinite_flag_cuda(out, R, flags, slot)


# ------------------------------------------------------------------------------------------------
# the MLP's input: the gate‖up projection and its SwiGLU
# ------------------------------------------------------------------------------------------------
GLU_ERROR = "linear_swiglu_mma: W must be [2I, K], out [>= R, >= I] and gu [>= R, >= 2I]"


@twin("linear_swiglu_mma")
def linear_swiglu_mma_cpu(X, W, I, out, R, gu, xp=None, ox=None):
    """exact-bf16: ``linear_mma(X, W, gu, R, xp)``, then ``swiglu_act(gu, I, out, R, ox)`` -- the
    MLP's gate‖up projection (W [2I, K]: the gate rows, then the up rows) and its SwiGLU. ``gu``
    [≥R, ≥2I]: scratch the op may use (its contents afterwards are not part of the op: on a GPU
    the fused GEMV stores silu(gate)·up straight from its chains and leaves it alone)."""
    if W.shape[0] != 2 * I or out.shape[0] < R or out.shape[1] < I or gu.shape[0] < R or gu.shape[1] < 2 * I:
        raise ValueError(GLU_ERROR)
    linear_mma_cpu(X, W, gu, R, xp)
    swiglu_act_cpu(gu, I, out, R, ox)


@launcher("linear_swiglu_mma")
def linear_swiglu_mma_cuda(X, W, I, out, R, gu, xp=None, ox=None):
    """The naive exact-bf16 linear into ``gu``, then ``swiglu_act`` (on a GPU
    ``mma_tc.linear_swiglu_mma_tc`` serves the op: one launch for bf16-resident W and few rows)."""
    linear_mma_naive(X, W, gu, R, xp)
    swiglu_act_cuda(gu, I, out, R, ox)


# ------------------------------------------------------------------------------------------------
# the GEMM (more rows)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmCfg:
    """One GEMM configuration: BM×BN output tiles; K stages of BK columns (BK | 32) through two
    shared buffers (stored transposed, rows padded by 4); a thread owns a (4·SUBM)×(4·SUBN)
    register tile made of 4×4 sub-tiles BM/SUBM rows / BN/SUBN columns apart (a warp is 4×8
    threads: conflict-free, broadcast ``LDS.128``). ``xv``: 128-bit X loads (K % 4 == 0, aligned
    rows), else scalar; ``wkind``: "v" / "s" float32 W (vector / scalar loads), "hv" / "hs" bf16 W
    (widened at the load: the shared tiles and chains are the float32 kernel's)."""
    BM: int = 128
    BN: int = 128
    BK: int = 32
    SUBM: int = 2
    SUBN: int = 2
    xv: bool = True
    wkind: str = "v"

    def layout(self):
        """(HM, HN, TY, TX, threads, warps along N)."""
        HM, HN = self.BM // self.SUBM, self.BN // self.SUBN
        TY, TX = HM // 4, HN // 4
        if HM % 4 or HN % 4 or TX % 8 or TY % 4:
            raise ValueError(f"gemm tile {self.BM}x{self.BN} / {self.SUBM}x{self.SUBN} sub-tiles: need warps of 4x8")
        return HM, HN, TY, TX, TX * TY, TX // 8

    @property
    def smem_bytes(self):
        return 4 * 2 * self.BK * (self.BM + 4 + self.BN + 4)

    def name(self):
        return (f"gemm_{self.BM}x{self.BN}x{self.BK}_t{4 * self.SUBM}x{4 * self.SUBN}_x{'v' if self.xv else 's'}"
                f"_w{self.wkind}")


# the explored variants (the H200 probes of receipts/probes/); the default serves the dispatch table
GEMM_VARIANTS = {
    "rp128x128k32": GemmCfg(BK=32),
    "rp128x128k16": GemmCfg(BK=16),
    "rp128x128k8": GemmCfg(BK=8),
    "rp128x128k16t84": GemmCfg(BK=16, SUBN=1),  # 8x4 per thread, 512 threads
    "rp128x64k16": GemmCfg(BN=64, BK=16, SUBN=1),  # 8x4 per thread, 2 blocks per SM
}
GEMM_DEFAULT = "rp128x128k32"


@generator
def gemm_config(cfg, K, bf16, x_ok, w_ok):
    """``cfg`` (a :class:`GemmCfg` or a name of ``GEMM_VARIANTS``, None: the default) with the loaders
    this call can use: 128-bit X loads when X's rows are 16-byte aligned (``x_ok``) and K % 4 == 0;
    W the same (bf16: 8-byte aligned rows)."""
    cfg = GEMM_VARIANTS[cfg or GEMM_DEFAULT] if isinstance(cfg, str) or cfg is None else cfg
    xv = K % 4 == 0 and x_ok
    wv = K % 4 == 0 and w_ok
    return dataclasses.replace(cfg, xv=xv, wkind=("h" if bf16 else "") + ("v" if wv else "s"))


def _gemm_helpers(c: GemmCfg, HM, HN) -> list:
    """Device functions (inlined) on the thread's tile as a tuple of float32: ``frag`` (the
    4·SUBM + 4·SUBN operands of one k-step by ``LDS.128``), ``outer`` (one fma per output), ``fold``
    (``C + P``) and ``store_tile``. A statement per fma in the kernel body would take Numba's
    front end minutes."""
    SUBM, SUBN = c.SUBM, c.SUBN
    TMv, TNv = 4 * SUBM, 4 * SUBN
    n = TMv * TNv
    L = ["@devf", "def frag(As, Bs, oa, ob):"]
    L += [f"    a{4*sm}, a{4*sm+1}, a{4*sm+2}, a{4*sm+3} = lds4(As, oa + {sm * HM})" for sm in range(SUBM)]
    L += [f"    b{4*sn}, b{4*sn+1}, b{4*sn+2}, b{4*sn+3} = lds4(Bs, ob + {sn * HN})" for sn in range(SUBN)]
    L += ["    return (" + ", ".join([f"a{i}" for i in range(TMv)] + [f"b{j}" for j in range(TNv)]) + ")"]
    L += ["@devf", "def outer(F, P):",
          "    return (" + ", ".join(f"fma(F[{q // TNv}], F[{TMv + q % TNv}], P[{q}])" for q in range(n)) + ")"]
    L += ["@devf", "def fold(C, P):", "    return (" + ", ".join(f"C[{q}] + P[{q}]" for q in range(n)) + ")"]
    L += ["@devf", "def store_tile(out, C, r0, c0, R, N):"]
    for i in range(TMv):
        L += [f"    r = r0 + {(i // 4) * HM + i % 4}", "    if r < R:"]
        for j in range(TNv):
            L += [f"        c = c0 + {(j // 4) * HN + j % 4}", "        if c < N:",
                  f"            out[r, c] = C[{i * TNv + j}]"]
    L += ["ZT = (" + ", ".join(["F32(0.0)"] * n) + ",)"]
    return L


@generator
def gemm_source(c: GemmCfg) -> KernelSource:
    """The GEMM kernel of configuration ``c``: ``kern(X, W, out, R)``. Stage s+1 sits in registers
    while stage s is computed: its loads are issued at the end of iteration s−1, just before the
    barrier (ptxas does not move loads across a barrier, so they are in flight during the whole
    compute of a stage), and stored into the other buffer after it; the operands of k-step kk+1
    are loaded before the fmas of k-step kk; one barrier per stage; at each 32-column slice
    boundary (and after the last stage) ``C += P; P = +0``. Rows past R and columns past N load a
    clamped valid row and are not stored; K past the end loads +0."""
    HM, HN, TY, TX, NT, WN = c.layout()
    BM, BN, BK = c.BM, c.BN, c.BK
    PM, PN = BM + 4, BN + 4
    KQ = BK // 4
    LA, LB = BM * KQ // NT, BN * KQ // NT
    if LA * NT != BM * KQ or LB * NT != BN * KQ or LA == 0 or LB == 0 or SLICE % BK:
        raise ValueError(f"{c.name()}: the tiles do not split into whole float4 per thread")
    SPS = SLICE // BK
    dyn = c.smem_bytes > STATIC_SMEM
    L = _gemm_helpers(c, HM, HN)

    def e(ind, text):
        L.append("    " * ind + text)

    e(0, "def kern(X, W, out, R):")
    e(1, "N = W.shape[0]")
    e(1, "K = W.shape[1]")
    e(1, "tid = cuda.threadIdx.x")
    e(1, "lane = tid % 32")
    e(1, "wid = tid // 32")
    e(1, f"aoff = ((wid // {WN}) * 4 + lane // 8) * 4")  # the thread's first row in the tile
    e(1, f"boff = ((wid % {WN}) * 8 + lane % 8) * 4")  # its first column
    e(1, f"row0 = cuda.blockIdx.y * {BM}")
    e(1, f"col0 = cuda.blockIdx.x * {BN}")
    e(1, "sx = X.strides[0] // 4")
    e(1, "sw = W.strides[0] // W.itemsize")
    if dyn:
        e(1, "As = cuda.shared.array(0, float32, alignment=ALIGN)")
        e(1, f"Bs = As[{2 * BK * PM}:]")
    else:
        e(1, f"As = cuda.shared.array({2 * BK * PM}, np.float32, alignment=ALIGN)")
        e(1, f"Bs = cuda.shared.array({2 * BK * PN}, np.float32, alignment=ALIGN)")
    for l in range(LA):  # this thread's float4 of the X tile: row ia // KQ, columns 4·(ia % KQ)…
        e(1, f"ia = tid + {l * NT}")
        e(1, f"xk{l} = (ia % {KQ}) * 4")
        e(1, f"xo{l} = min(row0 + ia // {KQ}, R - 1) * sx + xk{l}")
        e(1, f"xs{l} = (ia % {KQ}) * {4 * PM} + ia // {KQ}")
    for l in range(LB):
        e(1, f"ib = tid + {l * NT}")
        e(1, f"wk{l} = (ib % {KQ}) * 4")
        e(1, f"wo{l} = min(col0 + ib // {KQ}, N - 1) * sw + wk{l}")
        e(1, f"ws{l} = (ib % {KQ}) * {4 * PN} + ib // {KQ}")
    e(1, "C = ZT")
    e(1, "P = ZT")
    e(1, f"nst = (K + {BK - 1}) // {BK}")

    def load4(ind, arr, g, off, k, vec, half):
        if vec:
            e(ind, f"{g}_0, {g}_1, {g}_2, {g}_3 = {'ldgh4p' if half else 'ldg4p'}({arr}, {off}, {k} < K)")
        else:
            for q in range(4):
                e(ind, f"{g}_{q} = {'ldgh1p' if half else 'ldg1p'}({arr}, {off} + {q}, {k} + {q} < K)")

    def loads(ind, kexpr):
        for l in range(LA):
            load4(ind, "X", f"gx{l}", f"xo{l} + {kexpr}", f"xk{l} + {kexpr}", c.xv, False)
        for l in range(LB):
            load4(ind, "W", f"gw{l}", f"wo{l} + {kexpr}", f"wk{l} + {kexpr}", c.wkind in ("v", "hv"),
                  c.wkind[0] == "h")

    def stores(ind, ba, bb):
        for l in range(LA):
            for q in range(4):
                e(ind, f"sts1(As, {ba}xs{l} + {q * PM}, gx{l}_{q})")
        for l in range(LB):
            for q in range(4):
                e(ind, f"sts1(Bs, {bb}ws{l} + {q * PN}, gw{l}_{q})")

    loads(1, "0")
    stores(1, "", "")
    e(1, f"kn = min(1, max(nst - 1, 0)) * {BK}")
    loads(1, "kn")
    e(1, "cuda.syncthreads()")
    e(1, "for s in range(nst):")
    e(2, f"ba = (s & 1) * {BK * PM} + aoff")
    e(2, f"bb = (s & 1) * {BK * PN} + boff")
    e(2, "F0 = frag(As, Bs, ba, bb)")
    for kk in range(BK):
        if kk + 1 < BK:
            e(2, f"F{(kk + 1) % 2} = frag(As, Bs, ba + {(kk + 1) * PM}, bb + {(kk + 1) * PN})")
        e(2, f"P = outer(F{kk % 2}, P)")
    if SPS > 1:
        e(2, f"if (s + 1) % {SPS} == 0 or s + 1 == nst:")
        e(3, "C = fold(C, P)")
        e(3, "P = ZT")
    else:
        e(2, "C = fold(C, P)")
        e(2, "P = ZT")
    e(2, "nb = (s + 1) & 1")
    stores(2, f"nb * {BK * PM} + ", f"nb * {BK * PN} + ")  # stage s+1 (past the end: unread)
    e(2, f"kn = min(s + 2, nst - 1) * {BK}")  # stage s+2 (past the end: reloads the last)
    loads(2, "kn")
    e(2, "cuda.syncthreads()")
    e(1, "store_tile(out, C, row0 + aoff, col0 + boff, R, N)")
    jit = (("max_registers", 65536 // NT),) if NT > 256 else ()
    return KernelSource(c.name(), "\n".join(L) + "\n", NT, c.smem_bytes if dyn else 0, jit)


@launcher(of="linear")
def gemm(X, W, out, R, cfg=None):
    """Any R (``cfg``: a :class:`GemmCfg` or a ``GEMM_VARIANTS`` name; default ``GEMM_DEFAULT``).
    W [N, K] float32 or uint16 (bf16 bits)."""
    N, K = W.shape
    if R <= 0 or N == 0:
        return
    bf16 = W.dtype == np.uint16
    c = gemm_config(cfg, K, bf16, aligned(X), aligned(W, 8 if bf16 else 16))
    k = generated(gemm_source, c)
    launch(k, ((N + c.BN - 1) // c.BN, (R + c.BM - 1) // c.BM), k.threads, X, W, out, R)


@launcher("linear")
def linear_cuda(X, W, out, R):
    """out[r, o] = dot(X[r, :K], W[o, :K]) for r < R, canonical order; W float32 or uint16 (bf16
    bits). The kernel is the dispatch table's: the GEMV up to ``GEMV_MAX_ROWS`` rows, the GEMM
    above."""
    if dispatch.pick("linear", R) == "gemv":
        gemv(X, W, out, R)
    else:
        gemm(X, W, out, R)
