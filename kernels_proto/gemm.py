"""A fast GEMM in the canonical dot order (issue #15 item 2), with float32 or bf16 weights.

``out[r, o] = dot(X[r, :K], W[o, :K])`` for ``r < R`` (X ``[≥R, K]``, W ``[N, K]``, both
K-contiguous; out ``[≥R, N]``). Every output is its canonical dot (``exact.dot_rows``): K in
slices of 32; inside a slice an fma chain from +0 in index order; slice partials added left to
right into an accumulator from +0. So the result of a row depends neither on R nor on the tile it
lands in, and equals the CPU twin ``numba_kernels.cpu.linear`` bit for bit.

Why zero padding is exact: a K tile past K (a short last slice) is filled with +0.0 in both
operands, so the chain continues with ``fma(+0, +0, p)``, which is ``p`` for every ``p`` except
``-0``, which it turns into ``+0``. That difference never reaches the output: the accumulator
starts at +0 and ``+0 + ±0 = +0``, ``acc + ±0 = acc`` for ``acc ≠ 0``, and ``x + (-x) = +0``, so
the accumulator is never ``-0`` and adding a ``-0`` or a ``+0`` partial gives the same bits.
(Rows past R and columns past N load a clamped, valid row; their outputs are not stored.)

The kernels are generated Python source compiled by Numba-CUDA. The per-thread tile is a tuple
of float32 (64 partial chains ``P``, 64 accumulators ``C``) passed through small device helpers
(``frag``: the 4·SUBM + 4·SUBN operands of one k-step by ``LDS.128``; ``outer``: one fma per
output; ``fold``; ``store_tile``) that NVVM inlines (``forceinline``), so after SROA the tile lives
in registers — never ``cuda.local.array`` — and the k-steps of a stage are unrolled in the
source with the operands of k-step kk+1 loaded before the fmas of kk. Loads and stores go through
``kernels_proto.gemm_intrin``: flat offsets added to the data pointer (no wraparound test, no
64-bit index arithmetic in the loop: every shared-memory offset is an address immediate),
``ld.global.nc.v4``, ``ld.shared.v4``, ``cp.async``. Two families:

- ``rp`` (register prefetch): a block computes a BM×BN tile with BM·BN/64 threads (BM·BN/32 for
  8×4), each an 8×8 (or 8×4) register tile made of 4×4 sub-tiles ``HM = BM/SUBM`` rows / ``HN =
  BN/SUBN`` columns apart (a warp is 4×8 threads: conflict-free, broadcast ``LDS.128``). K is
  walked in stages of BK ∈ {8, 16, 32} columns through two shared buffers, stored transposed
  (``As[k][m]``, rows padded by 4): while stage s is computed from one buffer, stage s+1 waits
  in registers (loaded at the end of the previous stage, just before its barrier — ptxas does
  not move loads across a barrier, so they are in flight during a whole stage; 128-bit loads
  when K % 4 == 0 and the operands are 16-byte aligned, else scalar), then is stored into the
  other buffer; one barrier per stage. At each 32-column slice boundary (every 32/BK stages, and
  after the last stage) ``C += P; P = +0``. W may be bf16 bit patterns (uint16): widened exactly
  at the load (bits ``w << 16``), so the shared tiles and the fma chains are the float32
  kernel's on the widened weights.
- ``ca`` (cp.async pipeline): the same thread tiles and fma order, but the tiles are copied
  global→shared by ``cp.async`` (4-byte copies, zero fill past K: any K, any alignment; no
  registers) into ``STAGES`` buffers of BK columns, transposed with an XOR swizzle
  (``As[k][m ^ 4·(k%8)]``, conflict-free stores and ``LDS.128`` reads); ``cp.async.wait_group``
  + one barrier per stage. float32 weights only. Above 48 KB the buffers are dynamic shared
  memory (the kernel's attribute is raised once per compiled overload).

``VARIANTS`` names the configurations the probe (``tools/probe_gemm.py``) times; ``gemm()``
launches one, picking the vector or scalar loader for the operands' K and alignment.
``tools/sass_gemm.py`` prints each variant's registers, spills and main-loop instruction mix
(sm_90, no GPU needed). Static analysis (ptxas 13.0, sm_90), per 32-column slice per thread:

    variant            thr  smem KB  regs spill  instrs/slice  FFMA share  LDS.128
    rp128x128k16       256     33.0   255    0       2468        83.0 %       128
    rp128x128k8        256     16.5   251    0       2559        80.0 %       128
    rp128x128k32       256     66.0   255    0       2358        86.9 %       128
    rp128x128k16t84    512     33.0   128    0       2644        77.5 %       192
    rp128x64k16        256     25.0   127    0       2696        76.0 %       192
    ca128x128k16s3     256     48.0   233    0       2574        79.6 %       128
    ca128x128k32s3     256     96.0   243    0       2368        86.5 %       128
    ca128x128k16s4     256     64.0   235    0       2571        79.7 %       128
    ca128x128k16s3t84  512     48.0   128    0       2786        73.5 %       192

(t84 / 128x64 rows per 2048 FFMA, i.e. two threads' slices.) The rest of a slice is the 128
``LDS.128`` (or 192), 64 ``FADD`` (the fold), the stage's global loads/stores or ``cp.async``
and ~60–130 integer instructions; no local memory anywhere.
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.core import types as numba_types

from .gemm_intrin import cpa4, cpa_commit, cpa_wait, ldg1p, ldg4p, ldgh1p, ldgh4p, lds4, sts1
from .prims import SIMULATED, fma

F32 = np.float32
SLICE = 32
ALIGN = None if SIMULATED else 16
STATIC_SMEM_MAX = 48 * 1024


# ------------------------------------------------------------------------------------------------
# source generation
# ------------------------------------------------------------------------------------------------
class _Src:
    def __init__(self):
        self.lines = []

    def __call__(self, indent, text):
        self.lines.append("    " * indent + text)

    def text(self):
        return "\n".join(self.lines) + "\n"


def _layout(BM, BN, SUBM, SUBN):
    HM, HN = BM // SUBM, BN // SUBN
    TY, TX = HM // 4, HN // 4
    if HM % 4 or HN % 4 or TX % 8 or TY % 4:
        raise ValueError(f"tile {BM}x{BN} / {SUBM}x{SUBN} sub-tiles: need warps of 4x8 threads")
    return HM, HN, TY, TX, TX * TY, TX // 8


def _thread_header(e, BM, BN, SUBM, SUBN, WN):
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


def _helpers(e, SUBM, SUBN, HM, HN):
    """Device functions (inlined by NVVM) holding the per-thread tile as a tuple of float32:
    ``kstep`` (one k-step: 4·SUBM + 4·SUBN operands by ``LDS.128``, then one fma per output),
    ``fold`` (``C + P`` elementwise) and ``store_tile``. One generated statement per fma in the
    kernel body makes Numba's front end (SSA, typing, lowering) take minutes; here it compiles
    each body once per kernel."""
    TMv, TNv = 4 * SUBM, 4 * SUBN
    n = TMv * TNv
    e(0, "@dev")
    e(0, "def kstep(As, Bs, oa, ob, P):")
    for sm in range(SUBM):
        e(1, f"a{4*sm}, a{4*sm+1}, a{4*sm+2}, a{4*sm+3} = lds4(As, oa + {sm * HM})")
    for sn in range(SUBN):
        e(1, f"b{4*sn}, b{4*sn+1}, b{4*sn+2}, b{4*sn+3} = lds4(Bs, ob + {sn * HN})")
    e(1, "return (" + ", ".join(f"fma(a{q // TNv}, b{q % TNv}, P[{q}])" for q in range(n)) + ")")
    # the same k-step split in two, for explicit fragment double buffering in the stage body
    e(0, "@dev")
    e(0, "def frag(As, Bs, oa, ob):")
    for sm in range(SUBM):
        e(1, f"a{4*sm}, a{4*sm+1}, a{4*sm+2}, a{4*sm+3} = lds4(As, oa + {sm * HM})")
    for sn in range(SUBN):
        e(1, f"b{4*sn}, b{4*sn+1}, b{4*sn+2}, b{4*sn+3} = lds4(Bs, ob + {sn * HN})")
    e(1, "return (" + ", ".join([f"a{i}" for i in range(TMv)] + [f"b{j}" for j in range(TNv)]) + ")")
    e(0, "@dev")
    e(0, "def outer(F, P):")
    e(1, "return (" + ", ".join(f"fma(F[{q // TNv}], F[{TMv + q % TNv}], P[{q}])" for q in range(n)) + ")")
    e(0, "@dev")
    e(0, "def fold(C, P):")
    e(1, "return (" + ", ".join(f"C[{q}] + P[{q}]" for q in range(n)) + ")")
    e(0, "@dev")
    e(0, "def store_tile(out, C, r0, c0, R, N):")
    for i in range(TMv):
        e(1, f"r = r0 + {(i // 4) * HM + i % 4}")
        e(1, "if r < R:")
        for j in range(TNv):
            e(2, f"c = c0 + {(j // 4) * HN + j % 4}")
            e(2, "if c < N:")
            e(3, f"out[r, c] = C[{i * TNv + j}]")
    e(0, "ZT = (" + ", ".join(["F32(0.0)"] * n) + ",)")


def _zero_regs(e, TMv, TNv):
    e(1, "C = ZT")
    e(1, "P = ZT")


def _compute_stage(e, ind, BK, PM, PN, HM, HN, SUBM, SUBN, bexpr_a, bexpr_b, swz=False, dbuf=False):
    """BK k-steps of the outer product from shared buffers (a stage); offsets from ``ba``/``bb``
    (``ba{k%8}``/``bb{k%8}`` with the XOR swizzle). ``dbuf``: the operands of k-step kk+1 are
    loaded (in program order) before the fmas of k-step kk."""
    def offs(kk):
        if swz:
            return f"ba{kk % 8} + {(kk - kk % 8) * PM}, bb{kk % 8} + {(kk - kk % 8) * PN}"
        return f"ba + {kk * PM}, bb + {kk * PN}"

    if not dbuf:
        for kk in range(BK):
            e(ind, f"P = kstep(As, Bs, {offs(kk)}, P)")
        return
    e(ind, f"F0 = frag(As, Bs, {offs(0)})")
    for kk in range(BK):
        if kk + 1 < BK:
            e(ind, f"F{(kk + 1) % 2} = frag(As, Bs, {offs(kk + 1)})")
        e(ind, f"P = outer(F{kk % 2}, P)")


def _fold(e, ind, TMv, TNv):
    e(ind, "C = fold(C, P)")
    e(ind, "P = ZT")


def _epilogue(e, TMv, TNv, HM, HN):
    e(1, "store_tile(out, C, row0 + aoff, col0 + boff, R, N)")


def src_rp(BM=128, BN=128, BK=16, SUBM=2, SUBN=2, xv=True, wkind="v", dyn=False, dbuf=True):
    """Source of an ``rp`` kernel. ``xv``: 128-bit X loads (else scalar); ``wkind``: "v"/"s"
    float32 W (vector/scalar loads), "hv"/"hs" bf16 W."""
    HM, HN, TY, TX, NT, WN = _layout(BM, BN, SUBM, SUBN)
    PM, PN = BM + 4, BN + 4
    KQ = BK // 4
    LA, LB = BM * KQ // NT, BN * KQ // NT
    if LA * NT != BM * KQ or LB * NT != BN * KQ or LA == 0 or LB == 0 or SLICE % BK:
        raise ValueError(f"rp {BM}x{BN}x{BK}: the tiles do not split into whole float4 per thread")
    SPS = SLICE // BK
    TMv, TNv = 4 * SUBM, 4 * SUBN
    e = _Src()
    e(0, "def kern(X, W, out, R):")
    _thread_header(e, BM, BN, SUBM, SUBN, WN)
    if dyn:
        e(1, "As = cuda.shared.array(0, f32t, alignment=ALIGN)")
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
    _zero_regs(e, TMv, TNv)
    e(1, f"nst = (K + {BK - 1}) // {BK}")

    def load4(ind, arr, g, off, k, vec, half):
        if vec:
            fn = "ldgh4p" if half else "ldg4p"
            e(ind, f"{g}_0, {g}_1, {g}_2, {g}_3 = {fn}({arr}, {off}, {k} < K)")
        else:
            fn = "ldgh1p" if half else "ldg1p"
            for q in range(4):
                e(ind, f"{g}_{q} = {fn}({arr}, {off} + {q}, {k} + {q} < K)")

    def loads(ind, kexpr):
        for l in range(LA):
            load4(ind, "X", f"gx{l}", f"xo{l} + {kexpr}", f"xk{l} + {kexpr}", xv, False)
        for l in range(LB):
            load4(ind, "W", f"gw{l}", f"wo{l} + {kexpr}", f"wk{l} + {kexpr}", wkind in ("v", "hv"), wkind[0] == "h")

    def stores(ind, ba, bb):
        for l in range(LA):
            for q in range(4):
                e(ind, f"sts1(As, {ba}xs{l} + {q * PM}, gx{l}_{q})")
        for l in range(LB):
            for q in range(4):
                e(ind, f"sts1(Bs, {bb}ws{l} + {q * PN}, gw{l}_{q})")

    # Stage s+1 sits in registers while stage s is computed. Its loads are issued at the end of
    # iteration s-1, just before the barrier: ptxas does not move loads across a barrier, so
    # they are in flight during the whole compute of stage s (issued at the top of the
    # iteration instead, ptxas sinks them to a few dozen instructions before their stores).
    loads(1, "0")
    stores(1, "", "")
    e(1, f"kn = min(1, max(nst - 1, 0)) * {BK}")
    loads(1, "kn")
    e(1, "cuda.syncthreads()")
    e(1, "for s in range(nst):")
    e(2, f"ba = (s & 1) * {BK * PM} + aoff")
    e(2, f"bb = (s & 1) * {BK * PN} + boff")
    _compute_stage(e, 2, BK, PM, PN, HM, HN, SUBM, SUBN, "ba", "bb", dbuf=dbuf)
    if SPS > 1:
        e(2, f"if (s + 1) % {SPS} == 0 or s + 1 == nst:")
        _fold(e, 3, TMv, TNv)
    else:
        _fold(e, 2, TMv, TNv)
    e(2, "nb = (s + 1) & 1")
    stores(2, f"nb * {BK * PM} + ", f"nb * {BK * PN} + ")  # stage s+1 (past the end: unread)
    e(2, f"kn = min(s + 2, nst - 1) * {BK}")  # stage s+2 (past the end: reloads the last)
    loads(2, "kn")
    e(2, "cuda.syncthreads()")
    _epilogue(e, TMv, TNv, HM, HN)
    smem = 4 * 2 * BK * (PM + PN)
    return e.text(), NT, smem, (SUBM, SUBN, HM, HN)


def src_ca(BM=128, BN=128, BK=32, STAGES=3, SUBM=2, SUBN=2, dbuf=True):
    """Source of a ``ca`` kernel (cp.async, BK ∈ {8, 16, 32}, STAGES shared buffers; dynamic
    shared memory above 48 KB).

    Copy mapping: thread t copies columns k = t%8 + 8·jk (jk < BK/8) of rows m = (t//8)%4 +
    4·(t//32) + RPW·jm (RPW = threads/8, a multiple of 32) of a BK-column tile (a warp: 8 columns
    × 4 rows, one 32-byte sector per row), to
    ``T[k][m ^ 4·(k%8)]`` (no row padding): 32 distinct banks per store, and a 4-aligned group
    of 4 rows stays contiguous, so ``LDS.128`` reads (fixed k) are conflict-free too."""
    HM, HN, TY, TX, NT, WN = _layout(BM, BN, SUBM, SUBN)
    RPW = NT // 8  # rows covered by one jm step: 4 rows per warp × NT/32 warps
    if BM % RPW or BN % RPW or RPW % 32 or BK % 8 or SLICE % BK:
        raise ValueError(f"ca {BM}x{BN}x{BK}: rows do not split over the copy mapping")
    SPS = SLICE // BK
    dyn = 4 * STAGES * BK * (BM + BN) > STATIC_SMEM_MAX
    JA, JB = BM // RPW, BN // RPW
    TMv, TNv = 4 * SUBM, 4 * SUBN
    SA, SB = BK * BM, BK * BN  # floats per stage
    e = _Src()
    e(0, "def kern(X, W, out, R):")
    _thread_header(e, BM, BN, SUBM, SUBN, WN)
    if dyn:
        e(1, "As = cuda.shared.array(0, f32t, alignment=ALIGN)")
        e(1, f"Bs = As[{STAGES * SA}:]")
    else:
        e(1, f"As = cuda.shared.array({STAGES * SA}, np.float32, alignment=ALIGN)")
        e(1, f"Bs = cuda.shared.array({STAGES * SB}, np.float32, alignment=ALIGN)")
    e(1, "ck = tid % 8")
    e(1, f"cm = (tid // 8) % 4 + 4 * (tid // 32)")
    e(1, "swz = 4 * ck")
    for j in range(JA):
        e(1, f"xo{j} = min(row0 + cm + {j * RPW}, R - 1) * sx + ck")
    for j in range(JB):
        e(1, f"wo{j} = min(col0 + cm + {j * RPW}, N - 1) * sw + ck")
    e(1, f"sa = ck * {BM} + (cm ^ swz)")  # + 8·jk·BM + jm·RPW (RPW is a multiple of 32)
    e(1, f"sb = ck * {BN} + (cm ^ swz)")
    # the reads: row base aoff (a multiple of 4) of k-step kk lives at column aoff ^ 4·(kk%8)
    for q in range(8):
        e(1, f"ra{q} = {q * BM} + (aoff ^ {4 * q})")
        e(1, f"rb{q} = {q * BN} + (boff ^ {4 * q})")
    _zero_regs(e, TMv, TNv)
    e(1, f"nst = (K + {BK - 1}) // {BK}")

    def issue(ind, stage_expr, kexpr):
        e(ind, f"oa = {stage_expr} * {SA} + sa")
        e(ind, f"ob = {stage_expr} * {SB} + sb")
        for j in range(JA):
            e(ind, f"gx{j} = xo{j} + {kexpr}")
        for j in range(JB):
            e(ind, f"gw{j} = wo{j} + {kexpr}")
        for jk in range(BK // 8):
            e(ind, f"pk = ck + {kexpr} + {8 * jk} < K")
            for j in range(JA):
                e(ind, f"cpa4(As, oa, {8 * jk * BM + j * RPW}, X, gx{j}, {8 * jk}, pk)")
            for j in range(JB):
                e(ind, f"cpa4(Bs, ob, {8 * jk * BN + j * RPW}, W, gw{j}, {8 * jk}, pk)")
        e(ind, "cpa_commit()")

    # prologue: stages 0..STAGES-2 in flight (past the end: zero-filled, never read)
    for st in range(STAGES - 1):
        issue(1, f"{st}", f"{st * BK}")
    e(1, "rd = 0")
    e(1, f"wr = {STAGES - 1}")
    e(1, "for s in range(nst):")
    e(2, f"cpa_wait({STAGES - 2})")  # stage s has landed (this thread's copies) …
    e(2, "cuda.syncthreads()")  # … everyone's; and stage s-1's buffer is free
    e(2, f"issue_k = (s + {STAGES - 1}) * {BK}")
    issue(2, "wr", "issue_k")
    for q in range(8):
        e(2, f"ba{q} = rd * {SA} + ra{q}")
        e(2, f"bb{q} = rd * {SB} + rb{q}")
    _compute_stage(e, 2, BK, BM, BN, HM, HN, SUBM, SUBN, "ba", "bb", swz=True, dbuf=dbuf)
    if SPS > 1:
        e(2, f"if (s + 1) % {SPS} == 0 or s + 1 == nst:")
        _fold(e, 3, TMv, TNv)
    else:
        _fold(e, 2, TMv, TNv)
    e(2, f"rd = 0 if rd == {STAGES - 1} else rd + 1")
    e(2, f"wr = 0 if wr == {STAGES - 1} else wr + 1")
    e(1, "cpa_wait(0)")
    _epilogue(e, TMv, TNv, HM, HN)
    smem = 4 * STAGES * BK * (BM + BN)
    return e.text(), NT, smem, dyn, (SUBM, SUBN, HM, HN)


# ------------------------------------------------------------------------------------------------
# compiled variants
# ------------------------------------------------------------------------------------------------
_NS = dict(cuda=cuda, np=np, F32=F32, f32t=numba_types.float32, fma=fma, lds4=lds4, sts1=sts1, ldg4p=ldg4p, ldg1p=ldg1p,
           ldgh4p=ldgh4p, ldgh1p=ldgh1p, cpa4=cpa4, cpa_commit=cpa_commit, cpa_wait=cpa_wait,
           ALIGN=ALIGN, min=min,
           dev=cuda.jit(device=True) if SIMULATED else cuda.jit(device=True, forceinline=True))


_HELPERS: dict = {}


def _helper_ns(key):
    """The device helpers for one thread-tile geometry, compiled once per process and shared by
    every kernel with that geometry."""
    if key not in _HELPERS:
        e = _Src()
        _helpers(e, *key)
        ns = dict(_NS)
        exec(compile(e.text(), f"<gemm_helpers_{'_'.join(map(str, key))}>", "exec"), ns)
        _HELPERS[key] = ({k: ns[k] for k in ("kstep", "frag", "outer", "fold", "store_tile", "ZT")}, e.text())
    return _HELPERS[key]


class Kernel:
    """One generated kernel: ``fn`` (the Python function), ``kern`` (the CUDA dispatcher),
    ``threads``, tile ``BM``×``BN``, ``smem`` bytes and whether it is dynamic."""

    def __init__(self, name, src, threads, smem, BM, BN, dyn, hkey):
        self.threads, self.smem, self.BM, self.BN, self.dyn = threads, smem, BM, BN, dyn
        helpers, hsrc = _helper_ns(hkey)
        self.name, self.src = name, hsrc + src
        ns = dict(_NS)
        ns.update(helpers)
        exec(compile(src, f"<gemm_{name}>", "exec"), ns)
        self.fn = ns["kern"]
        # a block must fit the register file: 64 K registers
        self.kern = cuda.jit(self.fn) if threads <= 256 or SIMULATED else cuda.jit(
            self.fn, max_registers=65536 // threads)
        self._opted = set()

    def grid(self, N, R):
        return ((N + self.BN - 1) // self.BN, (R + self.BM - 1) // self.BM)

    def _opt_in(self, args):
        """Dynamic shared memory above 48 KB needs the function attribute set once per compiled
        overload (on a GPU; the same driver call numba-cuda uses for the carveout)."""
        if SIMULATED or self.smem <= STATIC_SMEM_MAX:
            return
        from numba.cuda.cudadrv.driver import binding, driver
        sig = tuple(self.kern.typeof_pyval(a) for a in args)
        if sig in self._opted:
            return
        cufunc = self.kern.compile(sig)._codelibrary.get_cufunc()
        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        try:  # a CUkernel handle (cuda.core ≥ 0.6 loads libraries), as for the carveout
            driver.cuKernelSetAttribute(attr, self.smem, cufunc.handle, cufunc.device.id)
        except Exception:  # noqa: BLE001  (a CUfunction handle)
            driver.cuFuncSetAttribute(cufunc.handle, attr, self.smem)
        self._opted.add(sig)

    def cufunc(self, X, W, out, R):
        """The loaded function of the overload for these arguments (registers: ``.attrs.regs``)."""
        sig = tuple(self.kern.typeof_pyval(a) for a in (X, W, out, R))
        return self.kern.compile(sig)._codelibrary.get_cufunc()

    def __call__(self, X, W, out, R, stream=0):
        N = W.shape[0]
        if R <= 0 or N <= 0:
            return
        if self.dyn:
            self._opt_in((X, W, out, R))
            self.kern[self.grid(N, R), self.threads, stream, self.smem](X, W, out, R)
        else:
            self.kern[self.grid(N, R), self.threads, stream](X, W, out, R)


_CACHE: dict = {}


def kernel(family="rp", **cfg) -> Kernel:
    """The generated kernel for one configuration (built once per process)."""
    key = (family, tuple(sorted(cfg.items())))
    if key not in _CACHE:
        if family == "rp":
            src, nt, smem, hkey = src_rp(**cfg)
            dyn = cfg.get("dyn", False)
            if smem > STATIC_SMEM_MAX and not dyn:
                raise ValueError(f"rp {cfg}: {smem} B of shared memory needs dyn=True")
        elif family == "ca":
            src, nt, smem, dyn, hkey = src_ca(**cfg)
        else:
            raise ValueError(family)
        BM, BN = cfg.get("BM", 128), cfg.get("BN", 128)
        name = family + "_" + "_".join(f"{k}{v}" for k, v in sorted(cfg.items()))
        _CACHE[key] = Kernel(name, src, nt, smem, BM, BN, dyn, hkey)
    return _CACHE[key]


# name -> (family, config without the loader choice). The probe times each; "rp_*" variants pick
# vector or scalar loaders per call (see ``gemm``).
VARIANTS = {
    "rp128x128k16": ("rp", dict(BM=128, BN=128, BK=16)),
    "rp128x128k8": ("rp", dict(BM=128, BN=128, BK=8)),
    "rp128x128k32": ("rp", dict(BM=128, BN=128, BK=32, dyn=True)),
    "rp128x128k16t84": ("rp", dict(BM=128, BN=128, BK=16, SUBN=1)),  # 8x4 per thread, 512 threads
    "rp128x64k16": ("rp", dict(BM=128, BN=64, BK=16, SUBN=1)),  # 8x4 per thread, 2 blocks per SM
    "ca128x128k16s3": ("ca", dict(BM=128, BN=128, BK=16, STAGES=3)),  # 48 KB static
    "ca128x128k32s3": ("ca", dict(BM=128, BN=128, BK=32, STAGES=3)),  # 96 KB dynamic
    "ca128x128k16s4": ("ca", dict(BM=128, BN=128, BK=16, STAGES=4)),  # 64 KB dynamic
    "ca128x128k16s3t84": ("ca", dict(BM=128, BN=128, BK=16, STAGES=3, SUBN=1)),  # 512 threads
}
DEFAULT = "rp128x128k16"


def _addr(a):
    try:
        return a.__cuda_array_interface__["data"][0]
    except AttributeError:  # the simulator's arrays: alignment is moot there
        return 0


def _row_stride_bytes(a):
    return a.strides[0]


def aligned(a, nbytes):
    """Base address and row stride of ``a`` are multiples of ``nbytes``."""
    return _addr(a) % nbytes == 0 and _row_stride_bytes(a) % nbytes == 0


def pick(variant, X, W):
    """The kernel of ``variant`` with the loaders this call can use: 128-bit X loads when X is
    16-byte aligned with K % 4 == 0; W the same for float32 (16 bytes) or bf16 (8 bytes)."""
    family, cfg = VARIANTS[variant] if isinstance(variant, str) else variant
    bf16 = W.dtype == np.uint16
    K = W.shape[1]
    if family == "ca":
        if bf16:
            raise ValueError("the cp.async family takes float32 weights only")
        return kernel(family, **cfg)
    xv = K % 4 == 0 and aligned(X, 16)
    wv = K % 4 == 0 and aligned(W, 8 if bf16 else 16)
    wkind = ("h" if bf16 else "") + ("v" if wv else "s")
    return kernel(family, xv=xv, wkind=wkind, **cfg)


def gemm(X, W, out, R, variant=DEFAULT, stream=0):
    """out[r, o] = dot(X[r, :K], W[o, :K]) for r < R in the canonical order. W: float32, or
    uint16 bf16 bit patterns."""
    pick(variant, X, W)(X, W, out, R, stream)
