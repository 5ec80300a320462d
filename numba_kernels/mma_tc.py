"""exact-bf16 on the tensor cores: ``linear_mma`` and ``attention_mma`` issuing
``mma.sync.aligned.m16n8k16`` (CUDA only).

Imported by :mod:`numba_kernels.cuda` on a real GPU only (the family modules stay free of CUDA
imports; this file holds the one thing a family module cannot: an ``@intrinsic`` emitting inline
PTX, the route measured on the H200 in ``tools/mma_vectors.py``). The simulator cannot run inline
PTX, so there ``linear_mma`` and ``attention_mma`` stay the kernels that run the twin's emulation:
the same bits by the rule (``numba_kernels/MMA.md`` §4), tested bitwise in ``tests/test_cudasim.py``.

``linear_mma_tc_k``: one warp per 16×8 output tile (rows r0.., columns o0..). K is walked in
steps of 16 in order; each step packs the warp's A fragment (X rounded float32 → bf16, nearest
even, exactly as ``mma_gemm.bf16_of``) and B fragment (W already bf16 values: its high 16 bits)
and issues one MMA whose C is the previous step's D. Rows ≥ R, columns ≥ N and k ≥ K are fed as
+0 (a zero product is no term: the same bits as the unpadded chain); the output is stored for
rows < R and columns < N only. The branch around the MMA is uniform over the warp (the grid has
one warp per tile), as ``.sync.aligned`` requires.

Fragment layout (PTX ISA, m16n8k16 .bf16): lane = 4g + q; A regs (row g, k 2q..2q+1),
(row g+8, k 2q..), (row g, k 2q+8..), (row g+8, k 2q+8..), lower k in the low half; B regs
(k 2q..2q+1, col g), (k 2q+8..2q+9, col g); C/D (row g, col 2q, 2q+1), (row g+8, col 2q, 2q+1).

``linear_mma_gemv_k`` (K % 4 == 0, aligned, up to ``GV_MAX_ROWS`` rows: decode, verify, drafts):
one warp per 16×8 tile streaming its 8 W rows and its X rows through shared memory with
cp.async, a step's k permuted alike in A and B (the rule depends on the set of a step's terms
only; see the comment above it).

``linear_mma_gemm_k`` (K % 4 == 0, aligned, from ``GEMM_MIN_ROWS`` rows: primes): 128 × 128 block
tiles, K tiles of 32 staged in shared memory as bf16 pairs, each warp 4 × 4 MMA tiles whose chains
are the one-warp kernels' chains. ``linear_mma_tc`` picks it, else ``linear_mma_gemv_k``, else
``linear_mma_tc_k``. (These three read float32 W of bf16 values, ``--weights f32``.)

``attention_mma_pk`` (what ``attention_mma_tc`` runs: more rows than split-KV takes; head_dim a
multiple of 4 up to ``ATT_TC_MAX_D``): Q, K and V packed to bf16 once per call in fragment order,
then one warp per (16 query rows, head), QKᵀ and P·V on the MMA, the twin's tiles and its per-row
loops (see the comment above it). ``attention_mma_sk`` (up to ``SPLIT_MAX_ROWS`` rows: decode,
verify, drafts): split-KV, one block per (64-key tile, KV head, up to 16 of its query heads as
the MMA's rows, row), then the fp32 mode's ordered merge. ``attention_mma_gpu`` is the op on a
GPU: split-KV, the packed kernel, or the one-block-per-(row, head) kernel.

Weights resident as bf16 bits (uint16, the default on CUDA): ``linear_mma_g16_k`` (from
``W16_MIN_ROWS`` rows; X packed to bf16 first by ``mma_pack_x_k``, or by its producer: ``xp``) and the GEMV
``VD_KERNELS[vd_rows(R)]`` (``linear_mma_vd{1,2,4,8,16}_k``, fewer rows: decode, verify, drafts;
fragments by ``ldmatrix``) for K % 8 == 0, else ``linear_mma_tc_k`` on element loads (see the
comments above ``G16_M`` and ``V16_KT``).

``harness device-check`` compares every kernel bitwise with the twin at every dispatch threshold;
``tools/probe_mma_gemm.py`` times the linear against torch bf16, ``tools/profile_prime_mma.py``
a bench-8l prime in the mode.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from numba.cuda import libdevice

from .dispatch import SPLIT_MAX_ROWS, SPLIT_MAX_STATS_BYTES
from .exact import ATT_TILE, ZERO
from .intrin import SIMULATED, cp16, cp16b, cp16f, cp_commit, cp_wait1, cp_wait_group, ldg4u, pdl_trigger, pdl_wait, sts4
from .attention import ATT_MERGE_NT, attention_merge_source
from .linear import GLU_ERROR
from .mma_gemm import PACK_ERROR
from .launch import aligned, fmul, generated, launch, pdl_on, scratch, syncwarp, wbits, zero_pos

BODIES = ("exp32", "merge_stats", "merge_value", "attn_out", "mma_dot", "mma_f32",
          "attention_mma_tiled", "nonfinite_flag_cuda", "silu32", "bf16_pair", "swiglu_act_cuda")


def bind(ns) -> None:
    """Take the family bodies and launchers this module uses (``BODIES``: attention's, the flag
    kernel's launcher for the lm head's other shapes, the SwiGLU's for the fused MLP input's), as
    compiled for CUDA, from :mod:`numba_kernels.cuda`'s namespace ``ns``: that module imports this
    one and binds it (this module never imports it: no import cycle); kernels here resolve these
    names when they first compile."""
    globals().update({n: ns[n] for n in BODIES})


def _bind():
    if "exp32" not in globals():
        raise RuntimeError("numba_kernels.mma_tc: import numba_kernels.cuda first (it binds the CUDA bodies)")

# LLVM inline-asm operands: the outputs first ($0..$3 = d), then a ($4..$7), b ($8, $9), c ($10..$13);
# C and D move through .f32 registers as raw bits (mov.b32), so NaN payloads reach the instruction
_ASM = ("{\n\t.reg .f32 fc<4>, fd<4>;\n\t"
        "mov.b32 fc0, $10;\n\tmov.b32 fc1, $11;\n\tmov.b32 fc2, $12;\n\tmov.b32 fc3, $13;\n\t"
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{fd0, fd1, fd2, fd3}, {$4, $5, $6, $7}, {$8, $9}, {fc0, fc1, fc2, fc3};\n\t"
        "mov.b32 $0, fd0;\n\tmov.b32 $1, fd1;\n\tmov.b32 $2, fd2;\n\tmov.b32 $3, fd3;\n\t}\n")

_U32 = types.uint32
_SIG = types.UniTuple(_U32, 4)(*([_U32] * 10))


@intrinsic
def mma_bf16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """(d0, d1, d2, d3) = one m16n8k16 bf16 MMA of this lane's fragments (uint32 bit patterns)."""
    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32] * 10)
        asm = ir.InlineAsm(fnty, _ASM, "=r,=r,=r,=r," + ",".join(["r"] * 10), side_effect=True)
        res = builder.call(asm, list(args))
        return context.make_tuple(builder, signature.return_type, [builder.extract_value(res, i) for i in range(4)])

    return _SIG, codegen


@intrinsic
def ldsm4(typingctx, S, i):
    """``ldmatrix.sync.aligned.m8n8.x4.shared.b16``: four 8 × 8 matrices of 16-bit elements from
    shared memory, lane L giving the address of row L & 7 of matrix L >> 3 (16 bytes at flat
    element ``i`` of the uint32 shared array ``S``, 16-byte aligned); returns this lane's word of
    each matrix: row lane >> 2, elements 2 (lane & 3) and 2 (lane & 3) + 1 (an MMA fragment
    register). Data movement only: the bits are the stored bits."""
    sig = types.UniTuple(_U32, 4)(S, i)

    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        data = context.make_array(signature.args[0])(context, builder, value=args[0]).data
        idx = args[1] if args[1].type.width == 64 else builder.sext(args[1], i64)
        p = builder.gep(data, [idx], inbounds=True)
        a32 = builder.ptrtoint(builder.addrspacecast(p, ir.PointerType(p.type.pointee, 3)), i32)
        fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
        asm = ir.InlineAsm(fnty, "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
                           "=r,=r,=r,=r,r,~{memory}", side_effect=True)
        res = builder.call(asm, [a32])
        return context.make_tuple(builder, signature.return_type, [builder.extract_value(res, k) for k in range(4)])

    return sig, codegen


@cuda.jit(device=True, inline=True)
def _bf16(u):
    """bf16 bits (uint32) of float32 bits u, nearest even; NaN → quiet NaN with its sign. A select,
    not a branch, so that a kernel's loads stay in one basic block and issue together."""
    rne = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    qnan = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
    return qnan if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else rne


@cuda.jit(device=True, inline=True)
def _pair(Xu, row, c, ok, d, D):
    """Xu[row, c] and Xu[row, c + 1] as a bf16 pair (an A or B fragment register): the elements
    d and d + 1 of a length-D run; +0 where not ok or past D. Both loads are issued whatever the
    flags (from element (0, 0) where not ok, from the run's last element past D: addresses that
    exist) and the +0 chosen after, by selects: no branch, so a kernel's loads issue together
    instead of one latency after another."""
    rr = row if ok else 0
    cl = (c if d < D else c - d + D - 1) if ok else 0  # not ok: (row 0, column 0)
    ch = c + 1 if ok and d + 1 < D else cl
    return _word(Xu[rr, cl], Xu[rr, ch], ok and d < D, ok and d + 1 < D)


@cuda.jit(device=True, inline=True)
def _word(ulo, uhi, oklo, okhi):
    """The bf16 pair of float32 bits ulo (low half) and uhi, each +0 where its flag is false (by
    selects: the loads that produced them were issued whatever the flags)."""
    lo = _bf16(ulo) if oklo else np.uint32(0)
    hi = _bf16(uhi) if okhi else np.uint32(0)
    return lo | (hi << np.uint32(16))


@cuda.jit(device=True, inline=True)
def _b2(Wu, o, k, N, K):
    lo = np.uint32(0)
    hi = np.uint32(0)
    if o < N:
        if k < K:
            lo = wbits(Wu[o, k]) >> np.uint32(16)
        if k + 1 < K:
            hi = wbits(Wu[o, k + 1]) >> np.uint32(16)
    return lo | (hi << np.uint32(16))


@cuda.jit(device=True, inline=True)
def _tile(N):
    """This warp's 16×8 output tile and this lane's place in it: (r0, o0, g, q), the tile's first
    row and column, lane = 4g + q. One warp per tile, row tiles outermost."""
    warp = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) >> 5
    lane = cuda.threadIdx.x & 31
    ntn = (N + 7) >> 3
    tm = warp // ntn
    return tm * 16, (warp - tm * ntn) * 8, lane >> 2, lane & 3


@cuda.jit(device=True, inline=True)
def _nonfinite_bits(d):
    """Whether float32 bits d are NaN or ±inf."""
    return (d & np.uint32(0x7F800000)) == np.uint32(0x7F800000)


@cuda.jit(device=True, inline=True)
def _stored_nonfinite(r, c, R, N, d0, d1, d2, d3):
    """Whether one of the outputs :func:`_store` stores (those inside R × N) is NaN or ±inf."""
    bad = False
    if r < R:
        if c < N and _nonfinite_bits(d0):
            bad = True
        if c + 1 < N and _nonfinite_bits(d1):
            bad = True
    if r + 8 < R:
        if c < N and _nonfinite_bits(d2):
            bad = True
        if c + 1 < N and _nonfinite_bits(d3):
            bad = True
    return bad


@cuda.jit(device=True, inline=True)
def _store(outu, r, c, R, N, d0, d1, d2, d3):
    """This lane's outputs: (r, c), (r, c+1), (r+8, c), (r+8, c+1), those inside R × N."""
    if r < R:
        if c < N:
            outu[r, c] = d0
        if c + 1 < N:
            outu[r, c + 1] = d1
    if r + 8 < R:
        if c < N:
            outu[r + 8, c] = d2
        if c + 1 < N:
            outu[r + 8, c + 1] = d3


@cuda.jit(device=True, inline=True)
def _glu_row(outu, ox, r, c, I, g0, g1, v0, v1):
    """Row r's SwiGLU outputs at columns c, c + 1 (c even; those below I) from the gate and up
    projections' float32 bits (g0, g1; v0, v1): silu(gate)·up, the twin's ``swiglu_val``; with
    ``ox`` the pair's bf16 bits too (``bf16_pair``, as ``pack_span``; I even when given)."""
    if c < I:
        a0 = fmul(silu32(_u2f(g0)), _u2f(v0))
        outu[r, c] = _f2u(a0)
        if c + 1 < I:
            a1 = fmul(silu32(_u2f(g1)), _u2f(v1))
            outu[r, c + 1] = _f2u(a1)
            if ox is not None:
                ox[r, c >> 1] = bf16_pair(a0, a1)


@cuda.jit(device=True, inline=True)
def _glu_store(outu, ox, r, c, R, I, d0, d1, d2, d3, u0, u1, u2, u3):
    """The fused gate‖up GEMV's outputs (:func:`_glu_row`) of rows r and r + 8 (those below R)."""
    if r < R:
        _glu_row(outu, ox, r, c, I, d0, d1, u0, u1)
    if r + 8 < R:
        _glu_row(outu, ox, r + 8, c, I, d2, d3, u2, u3)


@cuda.jit
def linear_mma_tc_k(Xu, Wu, outu, R):
    N, K = Wu.shape
    r0, o0, g, q = _tile(N)
    if r0 >= R:  # uniform over the warp
        return
    d0 = np.uint32(0)
    d1 = np.uint32(0)
    d2 = np.uint32(0)
    d3 = np.uint32(0)
    for k0 in range(0, K, 16):
        a0 = _pair(Xu, r0 + g, k0 + 2 * q, r0 + g < R, k0 + 2 * q, K)
        a1 = _pair(Xu, r0 + g + 8, k0 + 2 * q, r0 + g + 8 < R, k0 + 2 * q, K)
        a2 = _pair(Xu, r0 + g, k0 + 2 * q + 8, r0 + g < R, k0 + 2 * q + 8, K)
        a3 = _pair(Xu, r0 + g + 8, k0 + 2 * q + 8, r0 + g + 8 < R, k0 + 2 * q + 8, K)
        b0 = _b2(Wu, o0 + g, k0 + 2 * q, N, K)
        b1 = _b2(Wu, o0 + g, k0 + 2 * q + 8, N, K)
        d0, d1, d2, d3 = mma_bf16(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3)
    _store(outu, r0 + g, o0 + 2 * q, R, N, d0, d1, d2, d3)


# ---- the GEMV (few rows: decode, verify, drafts): W streamed through shared memory --------------
# One warp per 16 × 8 output tile (one per block) copies GV_KT k of its 8 W rows (512 contiguous
# bytes a row per copy instruction) and of the tile's X rows (rows < R only) into shared memory
# with cp.async, the next stage in flight while the current one's GV_KT / 16 MMA steps run. Lane
# (g, q) holds a step's k 4q … 4q+3 (fragment k 2q, 2q+1 ← 4q, 4q+1 and 2q+8, 2q+9 ← 4q+2, 4q+3),
# in A and in B alike. Each output is the chain of K/16 MMAs from +0 (X rounded to bf16 as it is
# packed, W's high halves), so the bits are linear_mma_tc_k's; a lane's 16 bytes past K (the last
# step's tail) are fed as +0, steps past K are not issued. Rows ≥ R and columns ≥ N read zeros
# (set once) and are not stored. (It replaced linear_mma_tc4_k, which read W straight from global
# memory with four steps in flight: h200-probe-mma-gemm-05bc542.log.)
GV_KT = 128  # k per stage
_GVS = GV_KT + 4  # words per shared row (a fragment load over 8 rows touches 32 banks)
_GV_SX = 2 * 16 * _GVS  # shared words: two stages of 16 X rows
_GV_SW = 2 * 8 * _GVS  # and of 8 W rows
GV_MAX_ROWS = 32  # at most this many rows take linear_mma_gemv_k (more: the block-tiled GEMM)


@cuda.jit(device=True, inline=True)
def _gv_issue(sX, sW, Xu, Wu, buf, k, r0, o0, R, N, K, lane):
    """Stage buf: X rows r0 … r0+15 (those < R) and W rows o0 … o0+7 (those < N), k … k+GV_KT."""
    kk = k + 4 * lane
    if kk < K:
        for r in range(16):
            if r0 + r < R:
                cp16(sX, (buf * 16 + r) * _GVS + 4 * lane, Xu, r0 + r, kk)
        for r in range(8):
            if o0 + r < N:
                cp16(sW, (buf * 8 + r) * _GVS + 4 * lane, Wu, o0 + r, kk)


@cuda.jit(device=True, inline=True)
def _gv_place():
    """A one-warp GEMV block's lane, its (g, q) = (lane >> 2, lane & 3), and the block's first W row
    (8 a block along x) and X row (16 a block along y)."""
    lane = cuda.threadIdx.x
    return lane, lane >> 2, lane & 3, cuda.blockIdx.x * 8, cuda.blockIdx.y * 16


@cuda.jit
def linear_mma_gemv_k(Xu, Wu, outu, R):
    """exact-bf16 linear of up to GV_MAX_ROWS rows (K % 4 == 0, aligned): see the comment above."""
    N, K = Wu.shape
    sX = cuda.shared.array(_GV_SX, np.uint32, alignment=16)  # cp.async: 16-byte destinations
    sW = cuda.shared.array(_GV_SW, np.uint32, alignment=16)
    lane, g, q, o0, r0 = _gv_place()
    for i in range(lane, _GV_SX, 32):  # rows past R / N, and the tail past K: zeros
        sX[i] = np.uint32(0)
    for i in range(lane, _GV_SW, 32):
        sW[i] = np.uint32(0)
    syncwarp()
    d0 = np.uint32(0)
    d1 = np.uint32(0)
    d2 = np.uint32(0)
    d3 = np.uint32(0)
    nst = (K + GV_KT - 1) // GV_KT
    _gv_issue(sX, sW, Xu, Wu, 0, 0, r0, o0, R, N, K, lane)
    cp_commit()
    for st in range(nst):
        if st + 1 < nst:
            _gv_issue(sX, sW, Xu, Wu, (st + 1) & 1, (st + 1) * GV_KT, r0, o0, R, N, K, lane)
        cp_commit()  # (an empty group past the last stage: the wait below counts groups)
        cp_wait1()  # every group but the newest: stage st has landed
        syncwarp()
        buf = st & 1
        xa = (buf * 16 + g) * _GVS + 4 * q
        xb = xa + 8 * _GVS
        wb = (buf * 8 + g) * _GVS + 4 * q
        for j in range(GV_KT // 16):
            k0 = st * GV_KT + 16 * j
            if k0 < K:  # uniform: a step past K is not issued
                ok = k0 + 4 * q < K  # this lane's 16 bytes of the last step: +0 past K
                e = 16 * j
                a0 = _pack(sX[xa + e], sX[xa + e + 1]) if ok else np.uint32(0)
                a2 = _pack(sX[xa + e + 2], sX[xa + e + 3]) if ok else np.uint32(0)
                a1 = _pack(sX[xb + e], sX[xb + e + 1]) if ok else np.uint32(0)
                a3 = _pack(sX[xb + e + 2], sX[xb + e + 3]) if ok else np.uint32(0)
                b0 = ((sW[wb + e] >> np.uint32(16)) | (sW[wb + e + 1] & np.uint32(0xFFFF0000))) if ok else np.uint32(0)
                b1 = ((sW[wb + e + 2] >> np.uint32(16)) | (sW[wb + e + 3] & np.uint32(0xFFFF0000))) if ok else np.uint32(0)
                d0, d1, d2, d3 = mma_bf16(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3)
        syncwarp()  # stage st is read: the next iteration's copies may overwrite it
    _store(outu, r0 + g, o0 + 2 * q, R, N, d0, d1, d2, d3)


# ---- the GEMM (many rows): block tiles staged in shared memory as bf16 -------------------------
# A block of 256 threads computes a GB_M × GB_N tile of out: K is walked in GB_K tiles, each tile of
# X (rounded to bf16) and of W (its high halves) stored in shared memory as packed bf16 pairs (k,
# k+1) in natural k order, the next tile's 16-byte global loads issued before the current tile's
# MMAs. Each of the 8 warps holds a 64 × 32 sub-tile: 4 × 4 MMA tiles of 16 × 8, whose chains over
# the K steps are the one-warp kernels' chains (the same fragments, step after step from +0), so
# the output bits are the same; a step past K is not issued. Shared rows are GB_K / 2 + 4 words
# apart, so a fragment load (8 rows × 4 words) touches 32 banks.
GB_M = 128
GB_N = 128
GB_K = 32
_GS = GB_K // 2 + 4  # words per shared row
GEMM_MIN_ROWS = 33  # more rows than this take linear_mma_gemm_k (fewer: one warp per 16 × 8 tile)


@cuda.jit(device=True, inline=True)
def _gload(Xu, Wu, R, N, K, m0, n0, k0, t):
    """This thread's share of one K tile: quads i = t + 256·j (j < 4) of the X and W tiles (row
    i // 8, k 4·(i % 8)), as 16-byte loads; zeros outside."""
    r = m0 + (t >> 3)
    o = n0 + (t >> 3)
    k = k0 + 4 * (t & 7)
    kin = k < K
    x0 = ldg4u(Xu, r * K + k, (r < R) & kin)
    x1 = ldg4u(Xu, (r + 32) * K + k, (r + 32 < R) & kin)
    x2 = ldg4u(Xu, (r + 64) * K + k, (r + 64 < R) & kin)
    x3 = ldg4u(Xu, (r + 96) * K + k, (r + 96 < R) & kin)
    w0 = ldg4u(Wu, o * K + k, (o < N) & kin)
    w1 = ldg4u(Wu, (o + 32) * K + k, (o + 32 < N) & kin)
    w2 = ldg4u(Wu, (o + 64) * K + k, (o + 64 < N) & kin)
    w3 = ldg4u(Wu, (o + 96) * K + k, (o + 96 < N) & kin)
    return x0, x1, x2, x3, w0, w1, w2, w3


@cuda.jit(device=True, inline=True)
def _sstore(sA, sB, t, f):
    """:func:`_gload`'s words into the shared tiles: X rounded to bf16, W's high halves, packed."""
    r = t >> 3
    c = 2 * (t & 7)
    for j in range(4):
        x = f[j]
        sA[r + 32 * j, c] = _pack(x[0], x[1])
        sA[r + 32 * j, c + 1] = _pack(x[2], x[3])
        w = f[4 + j]
        sB[r + 32 * j, c] = (w[0] >> np.uint32(16)) | (w[1] & np.uint32(0xFFFF0000))
        sB[r + 32 * j, c + 1] = (w[2] >> np.uint32(16)) | (w[3] & np.uint32(0xFFFF0000))


@cuda.jit(device=True, inline=True)
def _mma44(a, b, acc):
    """One K step of a warp's 4 × 4 MMA tiles: A fragments a[4i ..] of row tile i, B fragments
    b[2j ..] of column tile j, tile (i, j)'s accumulators acc[4(4i + j) ..] (its chain's c and d)."""
    for i in range(4):
        for j in range(4):
            e = 4 * (4 * i + j)
            acc[e], acc[e + 1], acc[e + 2], acc[e + 3] = mma_bf16(
                a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3], b[2 * j], b[2 * j + 1],
                acc[e], acc[e + 1], acc[e + 2], acc[e + 3])


@cuda.jit(device=True, inline=True)
def _store44(outu, r, c, R, N, acc):
    """The 4 × 4 tiles' outputs of this lane: tile (i, j) at row r + 16i, column c + 8j."""
    for i in range(4):
        for j in range(4):
            e = 4 * (4 * i + j)
            _store(outu, r + 16 * i, c + 8 * j, R, N, acc[e], acc[e + 1], acc[e + 2], acc[e + 3])


@cuda.jit
def linear_mma_gemm_k(Xu, Wu, outu, R):
    N, K = Wu.shape
    t = cuda.threadIdx.x
    lane = t & 31
    g = lane >> 2
    q = lane & 3
    warp = t >> 5
    wm = (warp >> 2) * 64
    wn = (warp & 3) * 32
    m0 = cuda.blockIdx.y * GB_M
    n0 = cuda.blockIdx.x * GB_N
    sA = cuda.shared.array((GB_M, _GS), np.uint32)
    sB = cuda.shared.array((GB_N, _GS), np.uint32)
    acc = cuda.local.array(64, np.uint32)
    for e in range(64):
        acc[e] = np.uint32(0)
    a = cuda.local.array(16, np.uint32)
    b = cuda.local.array(8, np.uint32)
    f = _gload(Xu, Wu, R, N, K, m0, n0, 0, t)
    k0 = 0
    while k0 < K:
        _sstore(sA, sB, t, f)
        cuda.syncthreads()
        if k0 + GB_K < K:
            f = _gload(Xu, Wu, R, N, K, m0, n0, k0 + GB_K, t)
        for s in range(2):
            if k0 + 16 * s < K:  # uniform
                c = 8 * s + q
                for i in range(4):
                    ra = wm + 16 * i + g
                    a[4 * i] = sA[ra, c]
                    a[4 * i + 1] = sA[ra + 8, c]
                    a[4 * i + 2] = sA[ra, c + 4]
                    a[4 * i + 3] = sA[ra + 8, c + 4]
                for j in range(4):
                    rb = wn + 8 * j + g
                    b[2 * j] = sB[rb, c]
                    b[2 * j + 1] = sB[rb, c + 4]
                _mma44(a, b, acc)
        cuda.syncthreads()
        k0 += GB_K
    _store44(outu, m0 + wm + g, n0 + wn + 2 * q, R, N, acc)


# ---- bf16-resident weights (uint16: the default on CUDA) ----------------------------------------
# W arrives as its bf16 bits, uint16 [N, K]; viewed as uint32 [N, K/2] each word is the pair (k,
# k+1), lower k in the low half: exactly an MMA fragment register, so W is copied, never converted.
# The block-tiled GEMM (W16_MIN_ROWS rows and more, K % 8 == 0) first packs X the same way
# (:func:`mma_pack_x_k`, rounded to bf16 as every kernel here rounds it, into kernel-owned scratch),
# then streams both through shared memory with cp.async: three stages of a 32-k tile (128 rows of X
# and 128 of W, 16 words a row, 48 KB), the 16-byte chunks of a row placed at chunk c ^ ((row >> 1)
# & 3) so that the 8 rows an ldmatrix matrix reads (rows ≡ 0..7 mod 8) sit in distinct banks; each
# of the 8 warps holds a 64 × 32 sub-tile (4 × 4 MMA tiles), each output the chain of its K/16
# steps in order from +0: the bits of every kernel here. A step's fragments come by ldmatrix
# (ldsm4: the A registers of one 16 × 16 tile, or the B registers of two 8-column tiles, in one
# instruction), both steps of a tile loaded before their 32 MMAs, from per-lane word offsets
# computed once. (Scalar fragment loads with Numba's 64-bit index arithmetic cost ~6 instructions
# each, 24 loads a step: the kernel issued ~10 instructions per MMA and ran at ~120 TFLOP/s;
# receipts/probes/h200-probe-mma-gemm-w16.log.) A thread's four 16-byte copies a tile come from row
# offsets computed once, rows past R or N clamped to the last row (their copies reach only outputs
# that are not stored: MMA rows and columns are independent); chunks past K are zeros (stored, not
# copied). The tile, stage count and warp grid are parameters (_g16_kernel; G16_CONFIGS names the
# ones tools/probe_mma_gemm.py --g16 times against production, G16 the one that runs): every
# configuration hands each output the same chain.
W16_MIN_ROWS = 33  # from this many rows the packed-X GEMM; fewer: linear_mma_vd_k / linear_mma_vd8_k


@cuda.jit
def mma_pack_x_k(Xu, Xp, R):
    """Xp[r, j] = bf16(X[r, 2j]) | bf16(X[r, 2j+1]) << 16 for r < R (K % 8 == 0, rows aligned):
    one thread per 4 k (one 16-byte load, two words stored)."""
    pdl_trigger()  # a GEMV launched with PDL after this kernel may start now (launch.launch)
    K = Xu.shape[1]
    kq = K >> 2
    i = cuda.grid(1)
    if i < R * kq:
        r = i // kq
        k = 4 * (i - r * kq)
        x0, x1, x2, x3 = ldg4u(Xu, r * K + k, True)
        Xp[r, k >> 1] = _pack(x0, x1)
        Xp[r, (k >> 1) + 1] = _pack(x2, x3)


def _g16_kernel(bm=128, bn=128, stages=3, wmn=2, wnn=4):
    """The packed-X GEMM with bm × bn block tiles (bm rows of X, bn of W), ``stages`` 32-k stages,
    wmn × wnn warps, each a (bm / wmn) × (bn / wnn) sub-tile of 16 × 8 MMA tiles (see above; G16
    names the production configuration). Every configuration gives each output the same chain,
    so the same bits; it must fit 48 KB of static shared memory."""
    threads = 32 * wmn * wnn
    ti, tj = bm // wmn // 16, bn // wnn // 8  # MMA tiles of a warp: row tiles, column tiles
    rows = bm + bn  # shared rows a stage: X then W, 16 words (32 k) each
    tq = threads // 4  # rows a thread pass copies (4 threads, one 16-byte chunk each, a row)
    assert ti >= 1 and tj >= 2 and tj % 2 == 0 and bm % (16 * wmn) == 0 and bn % (8 * wnn) == 0
    assert tq % 8 == 0 and bm % tq == 0 and bn % tq == 0 and stages >= 2
    words = stages * rows * 16
    assert words * 4 <= 48 * 1024, "past 48 KB of static shared memory"
    cx, cw = bm // tq, bn // tq  # a thread's X rows and W rows a stage
    wait = cp_wait_group(stages - 2)  # all but the newest stages - 2 groups
    noffs, nacc, nfa, nfb = cx + cw, 4 * ti * tj, 8 * ti, 4 * tj  # local array sizes (named constants)

    @cuda.jit(device=True, inline=True)
    def issue(sm, Xp, Wp, st, kt, dst, offs, K2, XW, kc):
        """Stage st ← the 32-k tile kt: this thread's chunk kc of rows (t >> 2) + tq·j (X rows
        first, then W rows) from the rows' flat word offsets offs; chunks past K are zeros."""
        kw = kt * 16 + 4 * kc
        d = st * (rows * 16) + dst
        if kw < K2:
            for j in range(cx):
                cp16f(sm, d + tq * 16 * j, Xp, offs[j] + kw, XW)
            for j in range(cw):
                cp16f(sm, d + tq * 16 * (cx + j), Wp, offs[cx + j] + kw, K2)
        else:
            z = np.uint32(0)
            for j in range(cx + cw):
                sts4(sm, d + tq * 16 * j, z, z, z, z)

    @cuda.jit(device=True, inline=True)
    def frags(sm, fa, fb, o, ob, xa, xb):
        """One step's fragments by ldmatrix into fa[o ..] (A of row tile i at 4i) and fb[ob ..] (B
        of column tile j at 2j): xa, xb are the lane's word offsets of the step in the stage."""
        for i in range(ti):
            fa[o + 4 * i], fa[o + 4 * i + 1], fa[o + 4 * i + 2], fa[o + 4 * i + 3] = ldsm4(sm, xa + 256 * i)
        for p in range(tj // 2):
            fb[ob + 4 * p], fb[ob + 4 * p + 1], fb[ob + 4 * p + 2], fb[ob + 4 * p + 3] = ldsm4(sm, xb + 256 * p)

    @cuda.jit(device=True, inline=True)
    def mmas(fa, fb, o, ob, acc):
        """One K step of the warp's ti × tj MMA tiles from fa[o ..], fb[ob ..] (see frags)."""
        for i in range(ti):
            for j in range(tj):
                e = 4 * (tj * i + j)
                acc[e], acc[e + 1], acc[e + 2], acc[e + 3] = mma_bf16(
                    fa[o + 4 * i], fa[o + 4 * i + 1], fa[o + 4 * i + 2], fa[o + 4 * i + 3],
                    fb[ob + 2 * j], fb[ob + 2 * j + 1], acc[e], acc[e + 1], acc[e + 2], acc[e + 3])

    @cuda.jit
    def linear_mma_g16_k(Xp, Wp, outu, R):
        """exact-bf16 linear of packed X [R, K/2] and bf16 W [N, K/2] (uint32 views): see above."""
        N, K2 = Wp.shape
        K = 2 * K2
        XW = Xp.shape[1]
        t = cuda.threadIdx.x
        lane = t & 31
        g = lane >> 2
        q = lane & 3
        warp = t >> 5
        wm = (warp // wnn) * (16 * ti)
        wn = bm + (warp % wnn) * (8 * tj)
        m0 = cuda.blockIdx.y * bm
        n0 = cuda.blockIdx.x * bn
        sm = cuda.shared.array(words, np.uint32, alignment=16)
        # the copies: this thread's rows (t >> 2) + tq·j, chunk t & 3, swizzled by ((row >> 1) & 3)
        kc = t & 3
        dst = (t >> 2) * 16 + ((kc ^ ((t >> 3) & 3)) << 2)
        offs = cuda.local.array(noffs, np.int64)
        for j in range(cx):
            offs[j] = min(m0 + tq * j + (t >> 2), R - 1) * XW
        for j in range(cw):
            offs[cx + j] = min(n0 + tq * j + (t >> 2), N - 1) * K2
        # ldmatrix: lane L addresses row lr = L & 7 of matrix lm = L >> 3; every row it reads is ≡ lr
        # (mod 8), so its swizzle is (lr >> 1) & 3. A (row tile i): matrices (rows 0-7, k 0-7), (8-15,
        # 0-7), (0-7, 8-15), (8-15, 8-15) = a0..a3; B (column tiles 2p, 2p + 1): (tile 2p, k 0-7),
        # (2p, 8-15), (2p + 1, 0-7), (2p + 1, 8-15) = its b0, b1 and the next tile's.
        lr = lane & 7
        lm = lane >> 3
        sw = (lr >> 1) & 3
        la = (wm + 8 * (lm & 1) + lr) * 16
        lb = (wn + 8 * (lm >> 1) + lr) * 16
        xa0 = la + (((lm >> 1) ^ sw) << 2)  # step 0 of a tile: chunks 0, 1; step 1: chunks 2, 3
        xa1 = la + (((2 + (lm >> 1)) ^ sw) << 2)
        xb0 = lb + (((lm & 1) ^ sw) << 2)
        xb1 = lb + (((2 + (lm & 1)) ^ sw) << 2)
        acc = cuda.local.array(nacc, np.uint32)
        for e in range(nacc):
            acc[e] = np.uint32(0)
        fa = cuda.local.array(nfa, np.uint32)
        fb = cuda.local.array(nfb, np.uint32)
        nt = (K2 + 15) // 16
        for p in range(stages - 1):
            if p < nt:
                issue(sm, Xp, Wp, p, p, dst, offs, K2, XW, kc)
            cp_commit()
        cb = 0  # the stage of tile kt (kt % stages) and of tile kt + stages - 1, kept as counters
        ib = stages - 1
        for kt in range(nt):
            wait()  # every group but the newest stages - 2: tile kt has landed (this thread's copies)
            cuda.syncthreads()  # ... and every thread's; and stage (kt - 1) % stages is no longer read
            if kt + stages - 1 < nt:
                issue(sm, Xp, Wp, ib, kt + stages - 1, dst, offs, K2, XW, kc)
            cp_commit()
            base = cb * (rows * 16)
            cb = cb + 1 if cb + 1 < stages else 0
            ib = ib + 1 if ib + 1 < stages else 0
            if kt * 32 + 16 < K:  # uniform: both steps (a step past K is not issued)
                frags(sm, fa, fb, 0, 0, base + xa0, base + xb0)
                frags(sm, fa, fb, 4 * ti, 2 * tj, base + xa1, base + xb1)
                mmas(fa, fb, 0, 0, acc)
                mmas(fa, fb, 4 * ti, 2 * tj, acc)
            else:
                frags(sm, fa, fb, 0, 0, base + xa0, base + xb0)
                mmas(fa, fb, 0, 0, acc)
        r = m0 + wm + g
        c = n0 + wn - bm + 2 * q
        for i in range(ti):
            for j in range(tj):
                e = 4 * (tj * i + j)
                _store(outu, r + 16 * i, c + 8 * j, R, N, acc[e], acc[e + 1], acc[e + 2], acc[e + 3])

    linear_mma_g16_k.threads = threads
    return linear_mma_g16_k


# (bm, bn, stages, warps down, warps across), each bitwise the same by construction;
# tools/probe_mma_gemm.py --g16 times them against production (G16). On the H200 at e85c484, over
# bench-8l's five prime shapes at 4,096 rows: 128x128x3w4 (4 warps of 64 × 64) 2.43 ms, 128x128x3
# (8 warps of 64 × 32) 2.52, 64x128x4 2.68, 128x256x2 and 256x128x2 3.36
# (receipts/probes/h200-probe-mma-gemm-g16-e85c484.log).
G16_CONFIGS = {"128x128x3": (128, 128, 3, 2, 4), "128x256x2": (128, 256, 2, 2, 8), "256x128x2": (256, 128, 2, 4, 4),
               "64x128x4": (64, 128, 4, 1, 4), "128x128x3w4": (128, 128, 3, 2, 2)}
G16 = "128x128x3w4"
G16_M, G16_N = G16_CONFIGS[G16][:2]
G16_KERNELS = {}


def g16_kernel(name=G16):
    """The packed-X GEMM of configuration ``name`` (G16_CONFIGS), built once."""
    if name not in G16_KERNELS:
        k = _g16_kernel(*G16_CONFIGS[name])
        if name != G16:
            k.py_func.__name__ = k.py_func.__qualname__ = f"linear_mma_g16_{name}_k"
        G16_KERNELS[name] = k
    return G16_KERNELS[name]


linear_mma_g16_k = g16_kernel()


# The GEMV of bf16 W (what _linear_w16 runs below W16_MIN_ROWS rows, K % 8 == 0): X packed to
# bf16 first (mma_pack_x_k), then per warp 8 W rows × 16 X rows streamed through shared memory in
# V16_STAGES stages of V16_KT k (three stages in flight while one is multiplied: 12 KB of W per
# warp, enough to stream at copy speed with only N / 8 warps on the GPU); a row's 16-byte chunk c
# sits at chunk c ^ (row & 7). The fragments come from shared memory by ldmatrix (ldsm4: four 8 × 8
# matrices, i.e. the A or B registers of two MMA steps, in one instruction; its 8 rows of 16 bytes
# per matrix sit in distinct banks by the swizzle): a step costs about two instructions besides
# its MMA. (Scalar fragment loads with Numba's index arithmetic cost ~80 instructions a step and
# left the kernel issue-bound at ~1.1 TB/s: tools/probe_vd.py, receipts/probes/README.md.) The
# copies of a stage are one cp.async a row from offsets computed once, no branch a row: rows of X
# past R and of W past N are copies of the last row (they reach only outputs that are not stored).
# (With a branch and Numba's 64-bit index arithmetic a row, a stage's copies cost ~170 PTX
# instructions, the stage's 16 MMA steps ~100: 86 cycles a step at 4.2 cycles an instruction on
# the 2,048-output shapes, Nsight Compute at b7fc84c.) A copy's addresses are one add each from
# byte offsets computed once per row (cp16b: the flat-offset copy carried 64-bit index
# arithmetic a copy; Nsight Compute at cbb2621 counted ~15 instructions a step on gdn out at one
# row, the stage's copies more than half of them). Up to 8 rows the
# kernel built with xrows = 8 runs: rows g + 8 are neither staged nor read (their A registers are
# +0), so a block takes 32 KB of shared memory, not 48.
V16_KT = 256  # k per stage
V16_STAGES = 4  # stages of the ring (every X row count: ≤ 48 KB of shared memory)


def _vd_kernel(xrows, kt=V16_KT, stages=V16_STAGES, pdl=False, glu=False):
    """The GEMV kernel staging xrows X rows (1, 2, 4, 8: up to that many rows; 16: up to 16) and a
    warp's 8 W rows, kt k per stage, stages stages (stages - 1 in flight). ``pdl``: the first
    stages' W copies are issued before ``pdl_wait()``, X's after it (launched with PDL: see
    VD_PDL). ``glu``: the gate‖up GEMV with its SwiGLU as the epilogue (VD_GLU): W is [2I, K],
    the warp stages gate rows o0 .. o0 + 7 and up rows I + o0 .. as its 16 W rows and runs their
    two chains, each output's chain the plain kernel's; it stores silu(gate)·up (and the pairs'
    bf16 bits), not the projection."""
    assert xrows in (1, 2, 4, 8, 16) and stages >= 2 and kt % 256 == 0
    wrows = 16 if glu else 8  # W rows a warp stages: its 8 outputs' (glu: their gate and up rows)
    rows = xrows + wrows  # X rows then W rows, per stage
    rw = kt // 2  # words per shared row
    words = stages * rows * rw
    wait = cp_wait_group(stages - 2)  # all but the newest stages - 2 groups
    xm = min(xrows, 8) - 1  # ldsm4's lane row lr reads X row lr & xm (rows past xrows: a copy, not stored)
    npairs = kt // 32  # MMA step pairs a stage
    ncopies = (rw // 128) * rows  # a lane's 16-byte copies a stage (issue)
    per_pair = (ncopies + npairs - 1) // npairs  # issue_part: copies a pair of steps carries

    @cuda.jit(device=True, inline=True)
    def copy(sm, Xp, Wp, st, kt_, sx, gx, sw, gw, K2, h, r):
        """Row r's chunk of half h of slice kt_ into stage st's buffer (rows X first, then the
        warp's W rows), from the byte offsets computed once (sx, sw: a row's chunk in stage
        0's buffer; gx, gw: in the array, at k 0; rows past R or N clamped to the last one, whose
        copy reaches only outputs that are not stored; no branch a row). Half h of a row's slice
        (chunks 32h + lane) sits 128h words further on both sides: the swizzle (chunk ^ (row & 7))
        does not reach bit 5."""
        so = 4 * (st * rows * rw + 128 * h)  # bytes: the stage's buffer and the half
        go = 4 * (kt_ * rw + 128 * h)
        if r < xrows:
            cp16b(sm, sx[r] + so, Xp, gx[r] + go, K2)
        else:
            cp16b(sm, sw[r - xrows] + so, Wp, gw[r - xrows] + go, K2)

    @cuda.jit(device=True, inline=True)
    def issue(sm, Xp, Wp, st, kt_, sx, gx, sw, gw, K2, lane):
        """Stage st ← slice kt_: this lane's 16-byte chunks of the block's X rows and of the warp's
        W rows (:func:`copy`), chunks past K not copied."""
        for h in range(rw // 128):
            if kt_ * rw + 128 * h + 4 * lane < K2:
                for r in range(rows):
                    copy(sm, Xp, Wp, st, kt_, sx, gx, sw, gw, K2, h, r)

    @cuda.jit(device=True, inline=True)
    def issue_rows(sm, Xp, Wp, st, kt_, sx, gx, sw, gw, K2, lane, lo, hi):
        """:func:`issue`'s copies of rows lo .. hi - 1 only (X rows first, then the W rows)."""
        for h in range(rw // 128):
            if kt_ * rw + 128 * h + 4 * lane < K2:
                for r in range(lo, hi):
                    copy(sm, Xp, Wp, st, kt_, sx, gx, sw, gw, K2, h, r)

    @cuda.jit(device=True, inline=True)
    def issue_part(sm, Xp, Wp, st, kt_, sx, gx, sw, gw, K2, jj):
        """The copies of :func:`issue` of a whole slice kt_ (every chunk below K: no check)
        that pair jj of a stage carries: copy c (half c // rows, row c % rows) for c ≡ jj (mod
        npairs). Spread over the stage's MMA pairs, a copy's address arithmetic (dependent integer
        instructions) issues in the shadow of the MMA chain instead of in one block before it,
        where the warp -- one a scheduler on the 2,048-output shapes -- had nothing else to
        issue."""
        for t in range(per_pair):
            c = jj + t * npairs
            if c < ncopies:  # constant once the stage's pairs unroll
                h = c // rows
                copy(sm, Xp, Wp, st, kt_, sx, gx, sw, gw, K2, h, c - h * rows)

    @cuda.jit(device=True, inline=True)
    def frags(sm, xe, xo, we, wo, jj, two, e1, e3, f1, f3):
        """Pair jj's fragments by ldmatrix (chunks 4jj .. 4jj + 3 of the rows: k 0-7, 8-15 of
        steps 2jj, 2jj + 1): A registers (e0..e3 of the first step, f0..f3 of the second; rows
        g + 8's e1, e3, f1, f3 only when two, else those passed in) and B (b0, b1; c0, c1).
        The lane's swizzled chunk (4jj + lc) ^ l (l < 8, lc < 4) is 4 (jj ± (l >> 2)) +
        ((lc ^ l) & 3), + for even jj: xe, xo (we, wo) are the row's word addresses with the
        lane's part for even and odd jj, so that a constant jj adds a constant."""
        xa = (xe if jj % 2 == 0 else xo) + 16 * jj
        e0, e2, f0, f2 = ldsm4(sm, xa)
        b0, b1, c0, c1 = ldsm4(sm, (we if jj % 2 == 0 else wo) + 16 * jj)
        if two:
            e1, e3, f1, f3 = ldsm4(sm, xa + 8 * rw)
        return e0, e1, e2, e3, f0, f1, f2, f3, b0, b1, c0, c1

    @cuda.jit(device=True, inline=True)
    def ufrags(sm, we, wo, jj):
        """Pair jj's B registers of the up rows (glu: W rows 8 .. 15 of the warp, 8 shared rows
        past the gate rows; row r & 7 swizzled as row r)."""
        if glu:
            return ldsm4(sm, (we if jj % 2 == 0 else wo) + 8 * rw + 16 * jj)
        z = np.uint32(0)
        return z, z, z, z

    @cuda.jit(device=True, inline=True)
    def step(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3, k0, K):
        """One MMA step at k0 of a stage's last (part-filled) pair: not issued past K; its k 8..15
        fed as +0 past K (K % 16 == 8: the shared words there were not copied)."""
        if k0 < K:  # uniform
            if k0 + 8 >= K:  # uniform
                a2 = np.uint32(0)
                a3 = np.uint32(0)
                b1 = np.uint32(0)
            d0, d1, d2, d3 = mma_bf16(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3)
        return d0, d1, d2, d3

    @cuda.jit
    def linear_mma_vd_k(Xp, Wp, outu, R, flags, slot, ox):
        """Xp: packed X [R, K/2]; Wp: bf16 W [N, K/2]. ``flags`` (None: the plain GEMV, its
        check compiled out): flags[slot] = 1 when an output stored is NaN or ±inf (``slot``
        ≥ 0; the lm head's ``linear_flag``). glu: outu is the SwiGLU's output [R, N/2] (as
        uint32 bits), ``ox`` (None: not) its pairs' bf16 bits [R, N/4], flags None."""
        N, K2 = Wp.shape
        K = 2 * K2
        I = N >> 1  # glu: the SwiGLU's width (W's rows: gate ‖ up)
        sm = cuda.shared.array(words, np.uint32, alignment=16)
        lane, g, q, o0, r0 = _gv_place()
        two = xrows == 16 and r0 + 8 < R  # uniform: rows g + 8 are read
        lr = lane & 7  # the row this lane addresses in ldsm4, of matrix (16-byte chunk) lane >> 3
        lc = lane >> 3
        lx = lr & xm  # the X row it addresses
        lxe = lx * rw + 4 * ((lc ^ lx) & 3) + 16 * (lx >> 2)  # its word in a buffer, even / odd pairs (frags)
        lxo = lx * rw + 4 * ((lc ^ lx) & 3) - 16 * (lx >> 2)
        lwe = (xrows + lr) * rw + 4 * ((lc ^ lr) & 3) + 16 * (lr >> 2)
        lwo = (xrows + lr) * rw + 4 * ((lc ^ lr) & 3) - 16 * (lr >> 2)
        d0 = np.uint32(0)
        d1 = np.uint32(0)
        d2 = np.uint32(0)
        d3 = np.uint32(0)
        z = np.uint32(0)
        u0 = z  # glu: the up rows' chains
        u1 = z
        u2 = z
        u3 = z
        nu0 = z
        nu1 = z
        nu2 = z
        nu3 = z
        e1 = z
        e3 = z
        f1 = z
        f3 = z
        ne1 = z
        ne3 = z
        nf1 = z
        nf3 = z
        sx = cuda.local.array(xrows, np.int32)  # the rows' byte offsets, computed once (see issue)
        gx = cuda.local.array(xrows, np.int64)
        sw = cuda.local.array(wrows, np.int32)
        gw = cuda.local.array(wrows, np.int64)
        for r in range(xrows):
            sx[r] = 4 * (r * rw + 4 * (lane ^ (r & 7)))
            gx[r] = 4 * (min(r0 + r, R - 1) * K2 + 4 * lane)
        for r in range(wrows):
            sw[r] = 4 * ((xrows + r) * rw + 4 * (lane ^ (r & 7)))
            if glu:  # gate row o0 + (r & 7), then its up row I further (past I: the last ones)
                gw[r] = 4 * ((min(o0 + (r & 7), I - 1) + (I if r >= 8 else 0)) * K2 + 4 * lane)
            else:
                gw[r] = 4 * (min(o0 + r, N - 1) * K2 + 4 * lane)
        nst = (K2 + rw - 1) // rw
        if pdl:
            # the weights are no earlier kernel's output: the first stages' W rows are copied
            # while the kernel before this one (X's producer) may still run, X's rows once it is
            # done. The groups: the first holds slice 0's X and every prefetched W row, slice p's
            # X is group p -- so the loop's wait for group st finds slice st whole, as below.
            for p in range(stages - 1):
                if p < nst:
                    issue_rows(sm, Xp, Wp, p, p, sx, gx, sw, gw, K2, lane, xrows, rows)
            pdl_wait()
            for p in range(stages - 1):
                if p < nst:
                    issue_rows(sm, Xp, Wp, p, p, sx, gx, sw, gw, K2, lane, 0, xrows)
                cp_commit()
        else:
            for p in range(stages - 1):
                if p < nst:
                    issue(sm, Xp, Wp, p, p, sx, gx, sw, gw, K2, lane)
                cp_commit()
        cb = 0  # the buffer of slice st (st % stages) and of slice st + stages - 1, kept as counters
        ib = stages - 1
        for st in range(nst):
            wait()  # every group but the newest stages - 2: slice st has landed
            syncwarp()  # ... for every lane; and buffer (st - 1) % stages is no longer read
            nxt = st + stages - 1  # the slice this stage's copies bring, into buffer ibn
            more = nxt < nst
            inl = more and (nxt + 1) * kt <= K  # a whole slice: its copies go between the MMA pairs
            ibn = ib
            base = cb * rows
            cb = cb + 1 if cb + 1 < stages else 0
            ib = ib + 1 if ib + 1 < stages else 0
            xe = base * rw + lxe  # the lane's ldmatrix addresses in this buffer (frags)
            xo = base * rw + lxo
            we = base * rw + lwe
            wo = base * rw + lwo
            k0 = st * kt
            # pairs of steps: chunks 4jj .. 4jj + 3 of the rows = (k 0-7, 8-15) of steps 2jj, 2jj + 1
            if k0 + kt <= K:  # uniform: a whole stage, no step past K
                if more and not inl:  # the last slice, part-filled: its copies first, checked
                    issue(sm, Xp, Wp, ibn, nxt, sx, gx, sw, gw, K2, lane)
                # software-pipelined: pair jj + 1's fragments are loaded before pair jj's MMAs, so
                # the ldmatrix latency overlaps the MMA chain instead of adding to it
                ne0, ne1, ne2, ne3, nf0, nf1, nf2, nf3, nb0, nb1, nc0, nc1 = frags(sm, xe, xo, we, wo, 0, two,
                                                                                    ne1, ne3, nf1, nf3)
                nu0, nu1, nu2, nu3 = ufrags(sm, we, wo, 0)
                for jj in range(kt // 32):
                    e0, e1, e2, e3, f0, f1, f2, f3 = ne0, ne1, ne2, ne3, nf0, nf1, nf2, nf3
                    b0, b1, c0, c1 = nb0, nb1, nc0, nc1
                    ub0, ub1, uc0, uc1 = nu0, nu1, nu2, nu3
                    if jj + 1 < kt // 32:
                        ne0, ne1, ne2, ne3, nf0, nf1, nf2, nf3, nb0, nb1, nc0, nc1 = frags(
                            sm, xe, xo, we, wo, jj + 1, two, ne1, ne3, nf1, nf3)
                        nu0, nu1, nu2, nu3 = ufrags(sm, we, wo, jj + 1)
                    if inl:  # uniform
                        issue_part(sm, Xp, Wp, ibn, nxt, sx, gx, sw, gw, K2, jj)
                    d0, d1, d2, d3 = mma_bf16(e0, e1, e2, e3, b0, b1, d0, d1, d2, d3)
                    if glu:
                        u0, u1, u2, u3 = mma_bf16(e0, e1, e2, e3, ub0, ub1, u0, u1, u2, u3)
                    d0, d1, d2, d3 = mma_bf16(f0, f1, f2, f3, c0, c1, d0, d1, d2, d3)
                    if glu:
                        u0, u1, u2, u3 = mma_bf16(f0, f1, f2, f3, uc0, uc1, u0, u1, u2, u3)
            else:
                if more:  # (a part-filled stage is the last: nothing after it to bring)
                    issue(sm, Xp, Wp, ibn, nxt, sx, gx, sw, gw, K2, lane)
                for jj in range(kt // 32):
                    if k0 + 32 * jj < K:  # uniform
                        e0, e1, e2, e3, f0, f1, f2, f3, b0, b1, c0, c1 = frags(sm, xe, xo, we, wo, jj, two,
                                                                               e1, e3, f1, f3)
                        d0, d1, d2, d3 = step(e0, e1, e2, e3, b0, b1, d0, d1, d2, d3, k0 + 32 * jj, K)
                        d0, d1, d2, d3 = step(f0, f1, f2, f3, c0, c1, d0, d1, d2, d3, k0 + 32 * jj + 16, K)
                        if glu:
                            ub0, ub1, uc0, uc1 = ufrags(sm, we, wo, jj)
                            u0, u1, u2, u3 = step(e0, e1, e2, e3, ub0, ub1, u0, u1, u2, u3, k0 + 32 * jj, K)
                            u0, u1, u2, u3 = step(f0, f1, f2, f3, uc0, uc1, u0, u1, u2, u3, k0 + 32 * jj + 16, K)
            cp_commit()  # slice nxt's group (empty past the last slice: the wait above counts groups)
        if glu:
            _glu_store(outu, ox, r0 + g, o0 + 2 * q, R, I, d0, d1, d2, d3, u0, u1, u2, u3)
            return
        _store(outu, r0 + g, o0 + 2 * q, R, N, d0, d1, d2, d3)
        if flags is not None:
            if slot >= 0 and _stored_nonfinite(r0 + g, o0 + 2 * q, R, N, d0, d1, d2, d3):
                flags[slot] = 1

    return linear_mma_vd_k


def _vd_named(xrows, kt=V16_KT, stages=V16_STAGES, pdl=False, glu=False):
    k = _vd_kernel(xrows, kt, stages, pdl, glu)
    name = f"linear_{'swiglu_' if glu else ''}mma_vd{xrows}{'w' if kt != V16_KT else ''}{'_pdl' if pdl else ''}_k"
    k.py_func.__name__ = k.py_func.__qualname__ = name  # in launch counts and profiles
    return k


# by the X rows a block stages. (A variant that rounded float32 X to bf16 in its own stages, no
# mma_pack_x_k launch, measured slower than packing first on every bench-8l decode shape but one
# -- receipts/probes/README.md, decodemma-v1/v2 -- and was taken out.)
VD_KERNELS = {x: _vd_named(x) for x in (1, 2, 4, 8, 16)}
# Up to 4 X rows on at most VD_WIDE_MAX_N outputs (the few-warp shapes: at most 512 warps, so
# the larger ring costs no occupancy) stages of VD_WIDE_KT k: half the stages' bookkeeping per k.
# Measured on the H200 at fc8d42f (receipts/probes/h200-probe-vd-stages-fc8d42f.json): one row,
# gdn out 11.2 → 10.3 µs, mlp down 14.1 → 12.7 (the 256-k ring with 3-10 stages: within 4 %).
VD_WIDE_KT = 512
VD_WIDE_MAX_ROWS = 4  # 4 rows: 12 rows a stage, 4 stages of 12 KB = the 48 KB static limit
VD_WIDE_MAX_N = 4096
VD_WIDE = {x: _vd_named(x, kt=VD_WIDE_KT) for x in (1, 2, 4) if x <= VD_WIDE_MAX_ROWS}
# With programmatic dependent launch (launch.pdl_on(): sm_90 on): the same GEMVs, launched with
# the PDL attribute in a captured step, copy their first stages of W while X's producer -- which
# calls pdl_trigger() first thing -- still runs (a decode step's producers are single- or
# few-block kernels of 3-6 µs on bench-8l, each GEMV's first bytes ~1-2 µs away at its start).
# The arithmetic is the plain kernels' (the same chain from the same shared words): the same bits.
VD_PDL = {(x, kt): _vd_named(x, kt=kt, pdl=True) for x, kt in
          [(x, V16_KT) for x in VD_KERNELS] + [(x, VD_WIDE_KT) for x in VD_WIDE]}
# The MLP's gate‖up projection with its SwiGLU as the epilogue (``linear_swiglu_mma``): a warp
# stages 16 W rows (its 8 outputs' gate and up rows), so its stages hold xrows + 16 rows; 256 k a
# stage keeps 4 stages within the 48 KB static limit up to 8 X rows (16 rows: 3 stages).
VD_GLU = {(x, pdl): _vd_named(x, stages=V16_STAGES if x <= 8 else 3, pdl=pdl, glu=True)
          for x in VD_KERNELS for pdl in (False, True)}
linear_mma_vd8_k = VD_KERNELS[8]
linear_mma_vd_k = VD_KERNELS[16]


def vd_wide(R, N):
    """Whether the GEMV of R rows on N outputs takes the 512-k stages (VD_WIDE; else VD_KERNELS):
    _linear_w16's choice, which tools/probe_vd.py times as production."""
    return vd_rows(R) <= VD_WIDE_MAX_ROWS and N <= VD_WIDE_MAX_N


def vd_rows(R):
    """The X rows a GEMV block of R rows stages: R rounded up to 1, 2, 4, 8; past 8, 16 (per
    16-row block)."""
    return 16 if R > 8 else 1 << (R - 1).bit_length()


def _packed_x(X, R, K):
    """X's rows packed to bf16 pairs (mma_pack_x_k) into kernel-owned scratch."""
    Xp = scratch("linear_mma.xp", R * (K // 2), np.uint32)[:R * (K // 2)].reshape(R, K // 2)
    launch(mma_pack_x_k, (R * (K // 4) + 255) // 256, 256, X.view(np.uint32), Xp, R)
    return Xp


def _w16_xp(X, W, R, xp):
    """X packed for the kernels of bf16-resident W that read it packed: its producer's ``xp``
    (uint32 [≥R, K/2], C-contiguous: no mma_pack_x_k launch; rows past R are never read: the
    kernels clamp or skip them), or packed here; None where they cannot run (K % 8 != 0, W not
    C-contiguous or unaligned, X neither packed nor packable)."""
    K = W.shape[1]
    if K % 8 == 0 and W.is_c_contiguous() and aligned(W):
        if xp is not None and xp.is_c_contiguous() and xp.shape[1] * 2 == K and aligned(xp):
            return xp
        if X.is_c_contiguous() and X.shape[1] == K and aligned(X):
            return _packed_x(X, R, K)
    return None


def _linear_w16(X, W, out, R, xp=None, flags=None, slot=-1):
    """linear_mma_tc of bf16-resident W (uint16 [N, K]). ``xp``: X already packed by its producer
    (see :func:`_w16_xp`), or None. ``flags``: the GEMV checks each output it stores for NaN/Inf
    (flags[slot] = 1; the lm head's linear_flag). Returns whether it did (the GEMV's shapes; the
    others leave the check to the caller)."""
    N, K = W.shape
    Xp = _w16_xp(X, W, R, xp)
    if Xp is not None and R >= W16_MIN_ROWS:
        launch(linear_mma_g16_k, ((N + G16_N - 1) // G16_N, (R + G16_M - 1) // G16_M), linear_mma_g16_k.threads,
               Xp, W.view(np.uint32), out.view(np.uint32), R)
    elif Xp is not None:
        wide, x = vd_wide(R, N), vd_rows(R)
        pdl = pdl_on()
        k = VD_PDL[(x, VD_WIDE_KT if wide else V16_KT)] if pdl else (VD_WIDE if wide else VD_KERNELS)[x]
        launch(k, ((N + 7) // 8, (R + 15) // 16), 32, Xp, W.view(np.uint32), out.view(np.uint32), R, flags, slot,
               None, pdl=pdl)
        return flags is not None
    else:  # K % 8 != 0 or unaligned: one warp per 16 × 8 tile, element loads
        tiles = ((R + 15) // 16) * ((N + 7) // 8)
        wpb = 1 if tiles < TC_SPREAD_TILES else TC_WARPS
        launch(linear_mma_tc_k, (tiles + wpb - 1) // wpb, 32 * wpb, X.view(np.uint32), W, out.view(np.uint32), R)
    return False


TC_WARPS = 4  # warps (output tiles) per block
TC_SPREAD_TILES = 4096  # fewer output tiles than this: one warp per block, spread over the SMs


def linear_mma_tc(X, W, out, R, xp=None):
    """exact-bf16 linear on the tensor cores (see the module docstring); the twin's signature. Rows
    of 16-byte-aligned length (K % 4 == 0, C-contiguous) take the vectorised kernel. ``xp``: X's
    bf16 pairs as its producer packed them (the twin's contract: the same values as X's), read
    by the kernels of bf16-resident W that take X packed; the others read X."""
    if W.dtype == np.uint16:
        _linear_w16(X, W, out, R, xp)
        return
    N, K = W.shape
    tiles = ((R + 15) // 16) * ((N + 7) // 8)
    vec = K % 4 == 0 and X.is_c_contiguous() and W.is_c_contiguous() and X.shape[1] == K and aligned(X) and aligned(W)
    if vec and R >= GEMM_MIN_ROWS:
        launch(linear_mma_gemm_k, ((N + GB_N - 1) // GB_N, (R + GB_M - 1) // GB_M), 256, X.view(np.uint32),
               W.view(np.uint32), out.view(np.uint32), R)
        return
    if vec and R <= GV_MAX_ROWS:
        launch(linear_mma_gemv_k, ((N + 7) // 8, (R + 15) // 16), 32, X.view(np.uint32), W.view(np.uint32),
               out.view(np.uint32), R)
        return
    wpb = 1 if vec and tiles < TC_SPREAD_TILES else TC_WARPS
    launch(linear_mma_tc_k, (tiles + wpb - 1) // wpb, 32 * wpb, X.view(np.uint32),
           W.view(np.uint32), out.view(np.uint32), R)


def linear_flag_mma_tc(X, W, out, R, flags, slot, xp=None):
    """exact-bf16 ``linear_flag`` (the lm head): :func:`linear_mma_tc`, and flags[slot] = 1 when
    an output is NaN or ±inf -- checked by the bf16 GEMV as it stores each output (one launch:
    what lets a captured step's lm head store its logits straight into mapped host memory, read
    back by no kernel), else by ``nonfinite_flag`` after the GEMM (the other shapes and kernels)."""
    if W.dtype == np.uint16:
        checked = _linear_w16(X, W, out, R, xp, flags, slot)
    else:
        checked = False
        linear_mma_tc(X, W, out, R, xp)
    if not checked and R > 0:
        nonfinite_flag_cuda(out, R, flags, slot)


def linear_swiglu_mma_tc(X, W, I, out, R, gu, xp=None, ox=None):
    """exact-bf16 ``linear_swiglu_mma`` (the twin's signature): with bf16-resident W and fewer than
    W16_MIN_ROWS rows one launch, the gate‖up GEMV storing silu(gate)·up (VD_GLU; ``gu`` not
    written); otherwise ``linear_mma_tc`` into ``gu``, then ``swiglu_act``."""
    if W.shape[0] != 2 * I or out.shape[0] < R or out.shape[1] < I or gu.shape[0] < R or gu.shape[1] < 2 * I:
        raise ValueError(GLU_ERROR)
    if ox is not None and (I % 2 != 0 or ox.shape[0] < R or 2 * ox.shape[1] < I):
        raise ValueError(PACK_ERROR)  # as swiglu_act's
    if R <= 0 or I == 0:
        return
    Xp = _w16_xp(X, W, R, xp) if W.dtype == np.uint16 and R < W16_MIN_ROWS else None
    if Xp is None:
        linear_mma_tc(X, W, gu, R, xp)
        swiglu_act_cuda(gu, I, out, R, ox)
        return
    pdl = pdl_on()
    launch(VD_GLU[(vd_rows(R), pdl)], ((I + 7) // 8, (R + 15) // 16), 32, Xp, W.view(np.uint32),
           out.view(np.uint32), R, None, -1, ox, pdl=pdl)


def compile_ptx_sm90(kernel=None) -> str:
    """A kernel's PTX for sm_90 (no GPU needed; default ``linear_mma_tc_k``): for ``ptxas
    -arch=sm_90`` and the SASS check (the GEMV kernels' plain form: flags None)."""
    fn = (kernel or linear_mma_tc_k).py_func
    sig = (types.uint32[:, ::1], types.uint32[:, ::1], types.uint32[:, ::1], types.int64)
    if fn.__code__.co_argcount == 6:  # linear_mma_vd*_k: flags, slot
        sig += (types.none, types.int64)
    ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
    return ptx


# ---- exact-bf16 attention on the tensor cores (prime: more rows than split-KV takes) -----------
# One warp per (16 query rows, head): the twin's tiles of ATT_TILE keys in order, each tile
#   1. S = QKᵀ on the MMA: eight 16×8 output tiles (keys k0 + 8t + g as B's columns), each a chain of
#      D/16 MMA steps from +0 (16-byte loads, the step's k permuted alike in A and B, as in
#      linear_mma_gemv_k); then s = fmul(S, scale) into the warp's score tile in shared memory;
#   2. per row (lanes 0–15, row = lane): the tile max mt over the row's n keys, in key order, the
#      twin's loop;
#   3. per element (every lane, its fragment): p = exp32(s − mt) for keys < n, +0 past them;
#   4. per row: Σp in key order (the twin's loop), then merge_stats;
#   5. Σ p·v on the MMA: the QKᵀ fragments of n-tiles 2s, 2s+1 are P's A fragment of key step s
#      (bf16 nearest even), B = V (keys 2q, 2q+1, 2q+8, 2q+9 of the step: four 16-byte loads, one
#      column of each of 4 n-tiles, see _att_col); each output a chain over the tile's key steps
#      from +0, merged into the running value (merge_value).
# A key past one row's n but not past another's shares the MMA: its P is +0 in the shorter row, a
# zero product, no term -- unless V there is ±∞ or NaN after rounding (0·∞ is NaN). A warp whose
# tile holds such a V in those keys takes the twin's emulated dot for that tile (exact, slow, rare).
# The running Σ p·v of a warp's 16 rows (its lane's 4 per n-tile of 8 columns) lives in shared
# memory, sO[warp, row, column], each word touched by its one lane only. (Held in a local array,
# 128 floats a lane at head_dim 256, it did not fit the L1 beside the resident warps: Nsight
# Compute at cbb2621 showed the kernel stalled on long scoreboard 10 of its 14 cycles per issued
# instruction, L1 hit rate 33 %, 0.24 instructions issued per scheduler cycle, and loading more
# K or V words together changed nothing: tools/probe_attn_pk.py, receipts/probes/README.md.)
ATT_TC_WARPS = 2  # warps per block: heads of the same 16 rows (the block's shared memory: 43 KB)
ATT_TC_MAX_D = 256  # head_dim at most this (sO's columns)
_SST = ATT_TILE + 4  # the score tile's row stride (floats)
_SOS = ATT_TC_MAX_D + 8  # sO's row stride (floats: rows g and g + 4 of a fragment meet in a bank, no more)
# attention_mma_pk_k holds its score tiles and running Σ p·v as flat arrays, [warp, row, column]
# in C order, read and written at unsigned offsets computed once per lane: indexed as 3-D arrays by
# Numba's signed 64-bit indices, each access carried 64-bit address arithmetic and Numba's
# negative-index wrap code (PTX), and a 64-key tile at head_dim 256 makes 128 merges and 96
# score accesses a lane.
_SS_WORDS = ATT_TC_WARPS * 16 * _SST
_SO_WORDS = ATT_TC_WARPS * 16 * _SOS
_U1 = np.uint64(1)
_S8 = np.uint64(8 * _SST)
_O8 = np.uint64(8 * _SOS)


@cuda.jit(device=True, inline=True)
def _f2u(x):
    return np.uint32(libdevice.float_as_int(x) & 0xFFFFFFFF)


@cuda.jit(device=True, inline=True)
def _u2f(u):
    return libdevice.int_as_float(np.int32(u))


@cuda.jit(device=True, inline=True)
def _pack(lo, hi):
    return _bf16(lo) | (_bf16(hi) << np.uint32(16))


@cuda.jit(device=True, inline=True)
def _row_n(base, r0, i, R, k0):
    """Keys of the tile at k0 that row r0 + i reads (≤ 0: none; rows ≥ R: none)."""
    if r0 + i >= R:
        return 0
    return min(ATT_TILE, base + r0 + i + 1 - k0)


@cuda.jit(device=True, inline=True)
def _att_col(u, n):
    """The V column of n-tile u's column n: n-tiles go in groups of 4 over 32 columns, column n of
    the group's j-th n-tile is 4n + j, so that lane g's 16-byte load of V[key, 4g : 4g+4] is its
    B value in each of the group's 4 n-tiles."""
    return 32 * (u >> 2) + 4 * n + (u & 3)


@cuda.jit(device=True, inline=True)
def _vbad(u):
    """V's float32 bits u round to a bf16 ±∞ or NaN."""
    return (_bf16(u) & np.uint32(0x7F80)) == np.uint32(0x7F80)


@cuda.jit(device=True, inline=True)
def _row_max(srow, n):
    """The max of srow[0 .. n-1] (n ≥ 1) in key order: the first of tied values, a NaN only if
    srow[0] is one (the twin's loop). An unsigned counter walks the row: no negative-index wrap
    code and no range-iterator bookkeeping a key (read in the PTX)."""
    nu = np.uint64(n)
    mt = srow[0]
    j = np.uint64(1)
    while j < nu:
        if srow[j] > mt:
            mt = srow[j]
        j += np.uint64(1)
    return mt


@cuda.jit(device=True, inline=True)
def _row_sum(srow, n):
    """+0 + srow[0] + … + srow[n-1], in key order (the twin's loop; see _row_max)."""
    nu = np.uint64(n)
    lt = ZERO
    j = np.uint64(0)
    while j < nu:
        lt = lt + srow[j]
        j += np.uint64(1)
    return lt


# ---- the packed variant: Q, K, V rounded to bf16 once per call, in fragment order --------------
# Rounding every float32 Q/K/V element to bf16 as it is read would repeat the work in every warp
# that reads it (a KV head's K and V in each of its query heads' warps). Here three small kernels
# first write them as packed bf16 pairs (the same _bf16: nearest even, NaN quieted with its sign)
# laid out in the order a lane's fragments take them, then attention_mma_pk_k runs the twin's
# tiles, chains, row passes and merges with 16-byte loads and no conversion:
# - Q and K rows (att_pack_rows_k): per head, head_dim zero-padded to a multiple of 32, each 32-k
#   block's 16 words ordered (q, step σ, i): word 4q + 2σ + i holds k = 32b + 16σ + 4q + 2i and
#   the k after it, so one 16-byte load gives lane q its four k (4q … 4q+3: a step's k permuted alike in A
#   and B, which the rule allows) of two consecutive MMA steps. Rows past R (and keys past the packed
#   context) are zeros.
# - V (att_pack_v_k): per KV head, 64-key tile and n-tile of 8 columns, two halves (key steps 0-1,
#   2-3) of 32 lanes × 4 words: lane (g, q)'s B words (b0, b1) of its steps, keys 16s + 2q (+1) and
#   16s + 8 + 2q (+1) of column 8u + g. Keys past the packed context are zeros.
# The output column of n-tile u is 8u + n (not _att_col's grouping). Keys the diagonal tile's last
# row does not read are masked to +0 in the B words (+0 products: no term); the non-finite-V
# fallback reads the float32 V.
PK_BLOCK = 256  # threads per block of the packing kernels
PK_KT = 4  # K rows (n-tiles of QKᵀ) loaded together in attention_mma_pk_k
PK_MAX_REGS = 168  # ≤ 204 costs no occupancy: shared memory (43 KB a block) holds an SM to 5 blocks of 2 warps
PK_GROUP = 2  # n-tiles of V per group in attention_mma_pk_k's P·V (their loads issued together)


@cuda.jit
def att_pack_rows_k(Xu, out, rows, H, D, DW):
    """out[(r·H + h)·DW + p] for every row r < out.size / (H·DW): Xu's row r, head h, packed."""
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    p = i % DW
    rh = i // DW
    hh = rh % H
    r = rh // H
    pos = p & 15
    k = 32 * (p >> 4) + 16 * ((pos >> 1) & 1) + 4 * (pos >> 2) + 2 * (pos & 1)
    out[i] = _pair(Xu, r, hh * D + k, r < rows, k, D)


@cuda.jit
def att_pack_v_k(Vu, out, keys, D, NU, NT):
    """out[((kvh·NT + T)·NU + u)·256 + half·128 + lane·4 + j]: V's B words (see above)."""
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    j = i & 3
    lane = (i >> 2) & 31
    hf = (i >> 7) & 1
    rest = i >> 8
    u = rest % NU
    rest = rest // NU
    T = rest % NT
    kvh = rest // NT
    key = 64 * T + 16 * (2 * hf + (j >> 1)) + 8 * (j & 1) + 2 * (lane & 3)
    col = 8 * u + (lane >> 2)
    lo = np.uint32(0)
    hi = np.uint32(0)
    if col < D:
        if key < keys:
            lo = _bf16(Vu[key, kvh * D + col])
        if key + 1 < keys:
            hi = _bf16(Vu[key + 1, kvh * D + col])
    out[i] = lo | (hi << np.uint32(16))


@cuda.jit(device=True, inline=True)
def _kmask(w, key, klim):
    """B word w of keys key, key + 1 with the keys ≥ klim set to +0."""
    if key >= klim:
        return np.uint32(0)
    if key + 1 >= klim:
        return w & np.uint32(0xFFFF)
    return w


@cuda.jit(max_registers=PK_MAX_REGS)
def attention_mma_pk_k(Qp, Kp, Vp, Vu, out, start, pb, R, hq, hkv, D, scale, Pg, Pgu, DW, NU, NT):
    w = cuda.threadIdx.x >> 5
    lane = cuda.threadIdx.x & 31
    g = lane >> 2
    q = lane & 3
    h = cuda.blockIdx.y * ATT_TC_WARPS + w
    sS = cuda.shared.array(_SS_WORDS, np.float32)  # [warp, row, key] flat (see _SS_WORDS)
    sT = cuda.shared.array((ATT_TC_WARPS, 4, 16), np.float32)  # mt, alpha, beta, l per row
    sO = cuda.shared.array(_SO_WORDS, np.float32)  # the running Σ p·v, [warp, row, column] flat
    if h >= hq:  # uniform over the warp; the block has no block-wide barrier
        return
    r0 = cuda.blockIdx.x * 16
    kvh = h // (hq // hkv)
    base = start + pb[0]
    rlast = min(r0 + 15, R - 1)
    ntile = (base + rlast) // ATT_TILE + 1
    nst = (D + 15) >> 4  # MMA steps over head_dim
    rg = r0 + g
    qrow0 = (rg * hq + h) * DW + 4 * q
    qrow8 = ((rg + 8) * hq + h) * DW + 4 * q
    S = cuda.local.array(32, np.uint32)
    Kr = cuda.local.array(32, np.uint32)
    P = cuda.local.array(16, np.uint32)
    C4 = cuda.local.array(16, np.uint32)
    Vb = cuda.local.array(32, np.uint32)
    m = ZERO
    l = ZERO
    wid = cuda.blockIdx.x * cuda.gridDim.y * ATT_TC_WARPS + cuda.blockIdx.y * ATT_TC_WARPS + w
    for tix in range(ntile):
        k0 = tix * ATT_TILE
        n0 = _row_n(base, r0, g, R, k0)
        n8 = _row_n(base, r0, g + 8, R, k0)
        # 1. S = QKᵀ: two MMA steps per 16-byte load of Q's and K's packed rows
        for e in range(32):
            S[e] = np.uint32(0)
        for st in range(0, nst, 2):
            wo = 8 * st
            qa = ldg4u(Qp, qrow0 + wo, True)
            qb = ldg4u(Qp, qrow8 + wo, True)
            for th in range(0, 8, PK_KT):  # PK_KT n-tiles' K loads in flight at a time
                for tt in range(PK_KT):
                    Kr[4 * tt], Kr[4 * tt + 1], Kr[4 * tt + 2], Kr[4 * tt + 3] = ldg4u(
                        Kp, ((k0 + 8 * (th + tt) + g) * hkv + kvh) * DW + wo + 4 * q, True)
                for tt in range(PK_KT):
                    t = th + tt
                    S[4 * t], S[4 * t + 1], S[4 * t + 2], S[4 * t + 3] = mma_bf16(
                        qa[0], qb[0], qa[1], qb[1], Kr[4 * tt], Kr[4 * tt + 1], S[4 * t], S[4 * t + 1],
                        S[4 * t + 2], S[4 * t + 3])
                if st + 1 < nst:  # uniform; a step past head_dim is not issued
                    for tt in range(PK_KT):
                        t = th + tt
                        S[4 * t], S[4 * t + 1], S[4 * t + 2], S[4 * t + 3] = mma_bf16(
                            qa[2], qb[2], qa[3], qb[3], Kr[4 * tt + 2], Kr[4 * tt + 3], S[4 * t], S[4 * t + 1],
                            S[4 * t + 2], S[4 * t + 3])
        sg = np.uint64((w * 16 + g) * _SST + 2 * q)  # sS[w, g, 2q]; sg + _S8: sS[w, g + 8, 2q]
        for t in range(8):
            u = np.uint64(8 * t)  # column j = 8t + 2q of rows g, g + 8
            sS[sg + u] = fmul(_u2f(S[4 * t]), scale)
            sS[sg + u + _U1] = fmul(_u2f(S[4 * t + 1]), scale)
            sS[sg + _S8 + u] = fmul(_u2f(S[4 * t + 2]), scale)
            sS[sg + _S8 + u + _U1] = fmul(_u2f(S[4 * t + 3]), scale)
        syncwarp()
        # 2. the row's tile max, in key order
        ni = _row_n(base, r0, lane, R, k0)
        if lane < 16 and ni > 0:
            sl = np.uint64((w * 16 + lane) * _SST)  # sS[w, lane, 0]
            sT[w, 0, lane] = _row_max(sS[sl:sl + np.uint64(ATT_TILE)], ni)
        syncwarp()
        # 3. p = exp32(s − mt) (+0 past the row's keys); P's A fragments, bf16
        m0 = sT[w, 0, g]
        m8 = sT[w, 0, g + 8]
        for t in range(8):
            j = 8 * t + 2 * q
            u = np.uint64(8 * t)
            p00 = exp32(sS[sg + u] - m0) if j < n0 else ZERO
            p01 = exp32(sS[sg + u + _U1] - m0) if j + 1 < n0 else ZERO
            p80 = exp32(sS[sg + _S8 + u] - m8) if j < n8 else ZERO
            p81 = exp32(sS[sg + _S8 + u + _U1] - m8) if j + 1 < n8 else ZERO
            sS[sg + u] = p00
            sS[sg + u + _U1] = p01
            sS[sg + _S8 + u] = p80
            sS[sg + _S8 + u + _U1] = p81
            P[4 * (t >> 1) + 2 * (t & 1)] = _pack(_f2u(p00), _f2u(p01))
            P[4 * (t >> 1) + 2 * (t & 1) + 1] = _pack(_f2u(p80), _f2u(p81))
        syncwarp()
        # 4. Σp in key order, the running (m, l), this tile's (alpha, beta)
        if lane < 16 and ni > 0:
            sl = np.uint64((w * 16 + lane) * _SST)
            lt = _row_sum(sS[sl:sl + np.uint64(ATT_TILE)], ni)
            m, l, alpha, beta = merge_stats(tix, m, l, sT[w, 0, lane], lt)
            sT[w, 1, lane] = alpha
            sT[w, 2, lane] = beta
        syncwarp()
        al0 = sT[w, 1, g]
        be0 = sT[w, 2, g]
        al8 = sT[w, 1, g + 8]
        be8 = sT[w, 2, g + 8]
        # keys read by some of this warp's rows but not by all: V there must round to finite
        nlo = max(_row_n(base, r0, 0, R, k0), 1)
        nhi = _row_n(base, r0, rlast - r0, R, k0)
        bad = False
        for x in range(lane, (nhi - nlo) * D, 32):
            kx = x // D
            bad |= _vbad(Vu[k0 + nlo + kx, kvh * D + x - kx * D])
        if cuda.any_sync(0xFFFFFFFF, bad):
            for x in range(lane, 16 * ATT_TILE, 32):
                Pg[wid, x // ATT_TILE, x % ATT_TILE] = sS[(w * 16 + x // ATT_TILE) * _SST + x % ATT_TILE]
            syncwarp()
            for u in range(NU):
                for e in range(4):
                    rr = g + 8 * (e >> 1)
                    cc = 8 * u + 2 * q + (e & 1)
                    nr = _row_n(base, r0, rr, R, k0)
                    if nr > 0 and cc < D:
                        pv = mma_f32(mma_dot(Pgu[wid], rr, 0, Vu, k0, kvh * D + cc, 1, 0, nr))
                        oi = (w * 16 + rr) * _SOS + cc
                        sO[oi] = merge_value(tix, sO[oi], al0 if e < 2 else al8, pv,
                                                    be0 if e < 2 else be8)
            syncwarp()
        else:
            nsteps = (nhi + 15) >> 4  # key steps with a key some row reads (all-zero steps: no term)
            klim = k0 + nhi
            vt = (kvh * NT + tix) * NU * 256 + 4 * lane
            og = np.uint64((w * 16 + g) * _SOS + 2 * q)  # sO[w, g, 2q]; og + _O8: sO[w, g + 8, 2q]
            for u0 in range(0, NU, PK_GROUP):
                for jj in range(PK_GROUP):
                    if u0 + jj < NU:  # uniform
                        o = vt + (u0 + jj) * 256
                        Vb[8 * jj], Vb[8 * jj + 1], Vb[8 * jj + 2], Vb[8 * jj + 3] = ldg4u(Vp, o, True)
                        Vb[8 * jj + 4], Vb[8 * jj + 5], Vb[8 * jj + 6], Vb[8 * jj + 7] = ldg4u(Vp, o + 128, True)
                if klim < k0 + ATT_TILE:  # uniform: the diagonal tile
                    for jj in range(PK_GROUP):
                        for e in range(8):
                            Vb[8 * jj + e] = _kmask(Vb[8 * jj + e], k0 + 16 * (e >> 1) + 8 * (e & 1) + 2 * q, klim)
                for e in range(4 * PK_GROUP):
                    C4[e] = np.uint32(0)
                for s in range(4):
                    if s < nsteps:  # uniform
                        for jj in range(PK_GROUP):
                            if u0 + jj < NU:  # uniform
                                C4[4 * jj], C4[4 * jj + 1], C4[4 * jj + 2], C4[4 * jj + 3] = mma_bf16(
                                    P[4 * s], P[4 * s + 1], P[4 * s + 2], P[4 * s + 3], Vb[8 * jj + 2 * s],
                                    Vb[8 * jj + 2 * s + 1], C4[4 * jj], C4[4 * jj + 1], C4[4 * jj + 2],
                                    C4[4 * jj + 3])
                for jj in range(PK_GROUP):
                    if u0 + jj < NU:
                        cu = np.uint64(8 * (u0 + jj))  # this lane's columns 2q, 2q + 1 of the n-tile
                        if n0 > 0:
                            a0 = og + cu
                            sO[a0] = merge_value(tix, sO[a0], al0, _u2f(C4[4 * jj]), be0)
                            sO[a0 + _U1] = merge_value(tix, sO[a0 + _U1], al0, _u2f(C4[4 * jj + 1]), be0)
                        if n8 > 0:
                            a8 = og + _O8 + cu
                            sO[a8] = merge_value(tix, sO[a8], al8, _u2f(C4[4 * jj + 2]), be8)
                            sO[a8 + _U1] = merge_value(tix, sO[a8 + _U1], al8, _u2f(C4[4 * jj + 3]), be8)
    if lane < 16:
        sT[w, 3, lane] = l
    syncwarp()
    l0 = sT[w, 3, g]
    l8 = sT[w, 3, g + 8]
    qo = h * D
    og = np.uint64((w * 16 + g) * _SOS + 2 * q)
    for u in range(NU):
        for e in range(4):
            rr = rg + 8 * (e >> 1)
            cc = 8 * u + 2 * q + (e & 1)
            if rr < R and cc < D:
                out[rr, qo + cc] = attn_out(sO[og + (_O8 if e >= 2 else np.uint64(0)) + np.uint64(8 * u + (e & 1))],
                                            l0 if e < 2 else l8)


def attention_mma_pk(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """The packed variant of :func:`attention_mma_tc` (same conditions, same bits): pack, then
    :func:`attention_mma_pk_k`. Packs the keys up to start + R (the whole cache with ``pos``:
    the position is on the device). Kernel-owned scratch: the packed Q, K and V (2 bytes an
    element, head_dim padded to 32) besides attention_mma_tc's."""
    if D > ATT_TC_MAX_D or D % 4 or not all(a.is_c_contiguous() and aligned(a) for a in (Q, kc, vc)):
        return False
    if R <= 0:
        return True
    _bind()
    cap = kc.shape[0]
    keys = cap if pos is not None else min(cap, start + R)
    NT = (keys + ATT_TILE - 1) // ATT_TILE
    DW = 16 * ((D + 31) // 32)
    NU = (D + 7) // 8
    nb, hb = (R + 15) // 16, (hq + ATT_TC_WARPS - 1) // ATT_TC_WARPS
    nq, nk, nv = 16 * nb * hq * DW, NT * ATT_TILE * hkv * DW, hkv * NT * NU * 256
    Qp = scratch("attention_mma.pk_q", nq, np.uint32)[:nq]
    Kp = scratch("attention_mma.pk_k", nk, np.uint32)[:nk]
    Vp = scratch("attention_mma.pk_v", nv, np.uint32)[:nv]
    Qu, Ku, Vu = Q.view(np.uint32), kc.view(np.uint32), vc.view(np.uint32)
    launch(att_pack_rows_k, ((nq + PK_BLOCK - 1) // PK_BLOCK,), PK_BLOCK, Qu, Qp, np.int64(R), np.int64(hq),
           np.int64(D), np.int64(DW))
    launch(att_pack_rows_k, ((nk + PK_BLOCK - 1) // PK_BLOCK,), PK_BLOCK, Ku, Kp, np.int64(keys), np.int64(hkv),
           np.int64(D), np.int64(DW))
    launch(att_pack_v_k, ((nv + PK_BLOCK - 1) // PK_BLOCK,), PK_BLOCK, Vu, Vp, np.int64(keys), np.int64(D),
           np.int64(NU), np.int64(NT))
    n = nb * hb * ATT_TC_WARPS
    Pg = scratch("attention_mma.tc_p", n * 16 * ATT_TILE)[:n * 16 * ATT_TILE].reshape(n, 16, ATT_TILE)
    launch(attention_mma_pk_k, (nb, hb), 32 * ATT_TC_WARPS, Qp, Kp, Vp, Vu, out, np.int64(start),
           zero_pos() if pos is None else pos, np.int64(R), np.int64(hq), np.int64(hkv), np.int64(D),
           np.float32(scale), Pg, Pg.view(np.uint32), np.int64(DW), np.int64(NU), np.int64(NT))
    return True


# ---- split-KV on the tensor cores (decode, verify, drafts: up to SPLIT_MAX_ROWS rows) -----------
# attention_mma_split's job -- (mt, lt) and Σ p·v of every (row, head, 64-key tile), folded in tile
# order by the fp32 mode's merge -- with the MMA itself instead of its emulation. One block of
# SK_NW warps per (tile, KV head, group of up to 16 of its query heads, row): the group's heads
# are the 16 rows of the MMA's A (GQA: they share the tile's K and V; rows past the group's heads
# are +0).
# - staging: the block's threads round the group's query rows and the tile's K rows from float32
#   to bf16 pairs (nearest even, _word) into shared memory (sQ, sK: word j of a row = dims 2j,
#   2j + 1; +0 past head_dim and for keys past the cache), every thread's loads issued before its
#   stores;
# - QKᵀ: warp w < SK_WARPS takes keys 8w … 8w+7 (one n-tile), each key's chain over head_dim in
#   steps of 16 from +0, its A and B fragments read from sQ and sK;
# - scores ×scale into shared memory; the row max, p = exp32(s − mt) and Σp in key order (the
#   twin's tile_stats_mma, one thread per head row); meanwhile the tile's V columns are loaded
#   and stored, rounded, into the buffer sK and sQ leave (sV: word kp of column c = keys 2kp,
#   2kp + 1 of the tile; keys past the row's position +0, as P is there);
# - P·V: warp w takes the n-tiles u ≡ w (mod SK_NW) of 8 columns, each column's chain over the
#   tile's ceil(n / 16) key steps from +0, its B fragments read from sV.
# The words are those the twin's MMA rounds, and each chain is the twin's, so the bits are the
# twin's. Before the staging (each warp rounding its own fragments from global memory as it went,
# 4-byte loads under 2-D signed indexing and clamps) a warp ran ~6,600 instructions a call at
# ~10 cycles apart: 28 µs a bench-8l decode call on an H100, against ~13 for the float32 mode's
# split-KV (tools/ncu_phases.py on Nsight Compute's source page,
# receipts/probes/h100-ncu-attn-sk-4925165/; 17.8 µs staged). Head dims past SK_Q_MAX_D
# take the other exact-bf16 kernels (attention_mma_gpu).
# P·V's n-tiles may be split over SK_VSPLIT blocks per (tile, KV head, group, row): each runs the
# same QKᵀ and tile statistics (the same bits; the first writes (mt, lt)) and the P·V chains of
# its share of the columns -- more, shorter blocks for a decode row's few tiles, the same chain
# for every output. tools/probe_attn_sk.py --vsplit times each split count.
SK_VSPLIT = 1
SK_WARPS = ATT_TILE // 8  # QKᵀ: a warp per 8-key n-tile
SK_NW = 2 * SK_WARPS  # warps a block: the staging and P·V use them all
SK_NT = 32 * SK_NW
SK_Q_MAX_D = 256  # head_dim up to this: a staged row holds D rounded up to 16, in pairs
_SK_RW = SK_Q_MAX_D // 2  # words of a staged Q or K row (in the staging's flat index)
_SK_KW = _SK_RW + 4  # sK / sQ row stride (words): rows g and g + 1 four banks apart
_SK_VW = ATT_TILE // 2 + 4  # sV row stride (words): columns g and g + 1 four banks apart
_SK_QO = ATT_TILE * _SK_KW  # sQ's offset in the stage buffer, after sK (sV overlays both)
_SK_WORDS = max(_SK_QO + 16 * _SK_KW, SK_Q_MAX_D * _SK_VW)
_SK_KP = ATT_TILE * _SK_RW // SK_NT  # K words a thread stages
_SK_QP = 16 * _SK_RW // SK_NT  # Q words a thread stages
_SK_VP = (ATT_TILE // 2) * SK_Q_MAX_D // SK_NT  # V words a thread stages
assert _SK_KP * SK_NT == ATT_TILE * _SK_RW and _SK_QP * SK_NT == 16 * _SK_RW
assert _SK_VP * SK_NT == (ATT_TILE // 2) * SK_Q_MAX_D
SK_MAX_REGS = 65536 // SK_NT  # a block of SK_NT threads must fit one SM's registers
_SK_JIT = {} if SIMULATED else {"max_registers": SK_MAX_REGS}  # the simulator's jit takes no register budget
_U4 = np.uint64(4)
_URW = np.uint64(_SK_RW)
_UVC = np.uint64(SK_Q_MAX_D)  # V columns in the staging's flat index


def _sk_kernel(vs):
    """attention_mma_sk_k with P·V's n-tiles split over ``vs`` blocks (a constant of the build:
    vs = 1 is the one-block kernel, with no share arithmetic left in it)."""
    @cuda.jit(**_SK_JIT)
    def attention_mma_sk_k(Qu, Ku, Vu, start, pb, hq, hkv, D, scale, ML, A):
        t = cuda.blockIdx.x
        r = cuda.blockIdx.z
        rep = hq // hkv
        hg = (rep + 15) >> 4  # head groups per KV head
        yg = cuda.blockIdx.y // vs  # (KV head, group); the block's share of P·V's n-tiles: sp of vs
        sp = cuda.blockIdx.y - yg * vs
        kvh = yg // hg
        h0 = (yg - kvh * hg) * 16  # the group's first head, relative to the KV head's
        pos = start + pb[0] + r
        k0 = t * ATT_TILE
        if k0 > pos:  # uniform over the block: a tile past the row's position
            return
        n = min(ATT_TILE, pos + 1 - k0)
        klim = k0 + n
        tid = cuda.threadIdx.x
        w = tid >> 5
        lane = tid & 31
        g = lane >> 2
        q = lane & 3
        sbuf = cuda.shared.array(_SK_WORDS, np.uint32)
        sS = cuda.shared.array((16, _SST), np.float32)
        sM = cuda.shared.array(16, np.float32)
        # the staging's index arithmetic, unsigned (no negative-index wrap code, no mixed types)
        ut = np.uint64(tid)
        uD = np.uint64(D)
        uDm = uD - _U1
        uko = np.uint64(kvh * D)
        uk0 = np.uint64(k0)
        ulast = np.uint64(Ku.shape[0] - 1)
        jw = np.uint64(((D + 15) >> 4) << 3)  # words a staged row holds: the QKᵀ steps' reach
        ur = np.uint64(r)
        uh0 = np.uint64(h0)
        urep = np.uint64(rep)
        uqh = np.uint64(kvh * rep + h0)
        # 0. loads: the tile's K rows and the group's query rows (clamped addresses that exist)
        ka = cuda.local.array(_SK_KP, np.uint32)
        kb = cuda.local.array(_SK_KP, np.uint32)
        for i in range(_SK_KP):
            x = ut + np.uint64(SK_NT * i)
            key = min(uk0 + x // _URW, ulast)
            d = (x % _URW) << _U1
            ka[i] = Ku[key, uko + min(d, uDm)]
            kb[i] = Ku[key, uko + min(d + _U1, uDm)]
        qa = cuda.local.array(_SK_QP, np.uint32)
        qb = cuda.local.array(_SK_QP, np.uint32)
        for i in range(_SK_QP):
            x = ut + np.uint64(SK_NT * i)
            m = x // _URW
            d = (x % _URW) << _U1
            hh = uqh + (m if uh0 + m < urep else np.uint64(0))
            qa[i] = Qu[ur, hh * uD + min(d, uDm)]
            qb[i] = Qu[ur, hh * uD + min(d + _U1, uDm)]
        # ... then their bf16 pairs (+0 past head_dim, for keys past the cache, for rows past the group)
        for i in range(_SK_KP):
            x = ut + np.uint64(SK_NT * i)
            kk = x // _URW
            j = x % _URW
            d = j << _U1
            ok = uk0 + kk <= ulast
            if j < jw:
                sbuf[kk * np.uint64(_SK_KW) + j] = _word(ka[i], kb[i], ok and d < uD, ok and d + _U1 < uD)
        for i in range(_SK_QP):
            x = ut + np.uint64(SK_NT * i)
            m = x // _URW
            j = x % _URW
            d = j << _U1
            ok = uh0 + m < urep
            if j < jw:
                sbuf[np.uint64(_SK_QO) + m * np.uint64(_SK_KW) + j] = _word(qa[i], qb[i], ok and d < uD,
                                                                             ok and d + _U1 < uD)
        cuda.syncthreads()
        # 1. S = QKᵀ for keys 8w … 8w + 7 (uniform: a warp whose keys are all past n skips it)
        if w < SK_WARPS and 8 * w < n:
            s0 = np.uint32(0)
            s1 = np.uint32(0)
            s2 = np.uint32(0)
            s3 = np.uint32(0)
            ug = np.uint64(g)
            kr = (np.uint64(8 * w) + ug) * np.uint64(_SK_KW) + np.uint64(q)
            qr = np.uint64(_SK_QO) + ug * np.uint64(_SK_KW) + np.uint64(q)
            q8 = np.uint64(8 * _SK_KW)
            ns = (D + 15) >> 4
            for s in range(SK_Q_MAX_D // 16):
                if s < ns:  # uniform: no step past head_dim
                    o = np.uint64(8 * s)
                    s0, s1, s2, s3 = mma_bf16(sbuf[qr + o], sbuf[qr + q8 + o], sbuf[qr + o + _U4],
                                              sbuf[qr + q8 + o + _U4], sbuf[kr + o], sbuf[kr + o + _U4],
                                              s0, s1, s2, s3)
            j = 8 * w + 2 * q
            sS[g, j] = fmul(_u2f(s0), scale)
            sS[g, j + 1] = fmul(_u2f(s1), scale)
            sS[g + 8, j] = fmul(_u2f(s2), scale)
            sS[g + 8, j + 1] = fmul(_u2f(s3), scale)
        cuda.syncthreads()  # sK and sQ read: the buffer is sV's from here
        # 2. this block's V columns c_lo … c_hi − 1: loads (rounded and stored after the statistics)
        nt = (D + 7) >> 3
        per = (nt + vs - 1) // vs  # this block's n-tiles: ulo .. uhi - 1
        ulo = sp * per
        uhi = min(nt, ulo + per)
        clo = np.uint64(8 * ulo)
        chi = np.uint64(min(D, 8 * uhi))
        ukl = np.uint64(klim)
        va = cuda.local.array(_SK_VP, np.uint32)
        vb = cuda.local.array(_SK_VP, np.uint32)
        for i in range(_SK_VP):
            x = ut + np.uint64(SK_NT * i)
            key = uk0 + ((x // _UVC) << _U1)
            cc = uko + min(clo + x % _UVC, uDm)
            va[i] = Vu[min(key, ukl - _U1), cc]
            vb[i] = Vu[min(key + _U1, ukl - _U1), cc]
        # 3. each head row's tile max, in key order
        if tid < 16:
            sM[tid] = _row_max(sS[tid], n)
        cuda.syncthreads()
        # 4. p = exp32(s − mt), +0 past the row's keys
        for x in range(tid, 16 * ATT_TILE, SK_NT):
            m = x // ATT_TILE
            j = x - m * ATT_TILE
            sS[m, j] = exp32(sS[m, j] - sM[m]) if j < n else ZERO
        cuda.syncthreads()
        # 5. Σp in key order and (mt, lt) out, one thread per head row (of the first share's block)
        if tid < 16 and h0 + tid < rep and sp == 0:
            lt = _row_sum(sS[tid], n)
            vg = r * hq + kvh * rep + h0 + tid
            ML[vg, t, 0] = sM[tid]
            ML[vg, t, 1] = lt
        # 6. sV: the V words, bf16 (+0 for keys past the row's position)
        for i in range(_SK_VP):
            x = ut + np.uint64(SK_NT * i)
            kp = x // _UVC
            c = clo + x % _UVC
            key = uk0 + (kp << _U1)
            if c < chi:
                sbuf[c * np.uint64(_SK_VW) + kp] = _word(va[i], vb[i], key < ukl, key + _U1 < ukl)
        cuda.syncthreads()
        # 7. P·V: P's A fragments (bf16 of p), then warp w's n-tiles of 8 columns
        nsteps = (n + 15) >> 4
        P = cuda.local.array(16, np.uint32)  # key step s: P[4s .. 4s+3] = its (a0, a1, a2, a3)
        for s4 in range(4):
            for hh in range(2):  # keys 16s + 8hh + 2q (+1) of head rows g and g + 8
                j = 16 * s4 + 8 * hh + 2 * q
                P[4 * s4 + 2 * hh] = _pack(_f2u(sS[g, j]), _f2u(sS[g, j + 1]))
                P[4 * s4 + 2 * hh + 1] = _pack(_f2u(sS[g + 8, j]), _f2u(sS[g + 8, j + 1]))
        vga = r * hq + kvh * rep + h0 + g
        oka = h0 + g < rep
        okb = h0 + g + 8 < rep
        for u in range(ulo + w, uhi, SK_NW):
            cb = np.uint64(8 * u + g) * np.uint64(_SK_VW) + np.uint64(q)  # this lane's B column (past D: not stored)
            c0 = np.uint32(0)
            c1 = np.uint32(0)
            c2 = np.uint32(0)
            c3 = np.uint32(0)
            for s4 in range(4):
                if s4 < nsteps:  # uniform
                    o = np.uint64(8 * s4)
                    c0, c1, c2, c3 = mma_bf16(P[4 * s4], P[4 * s4 + 1], P[4 * s4 + 2], P[4 * s4 + 3],
                                              sbuf[cb + o], sbuf[cb + o + _U4], c0, c1, c2, c3)
            cc = 8 * u + 2 * q  # this lane's output columns cc, cc + 1 of head rows g, g + 8
            if oka:
                if cc < D:
                    A[vga, t, cc] = _u2f(c0)
                if cc + 1 < D:
                    A[vga, t, cc + 1] = _u2f(c1)
            if okb:
                if cc < D:
                    A[vga + 8, t, cc] = _u2f(c2)
                if cc + 1 < D:
                    A[vga + 8, t, cc + 1] = _u2f(c3)

    if vs != 1:
        attention_mma_sk_k.py_func.__name__ = attention_mma_sk_k.py_func.__qualname__ = f"attention_mma_sk_v{vs}_k"
    return attention_mma_sk_k


SK_KERNELS: dict = {}


def sk_kernel(vs):
    """The split-KV kernel of ``vs`` P·V shares (built once)."""
    k = SK_KERNELS.get(vs)
    if k is None:
        k = SK_KERNELS[vs] = _sk_kernel(vs)
    return k


attention_mma_sk_k = sk_kernel(1)


def attention_mma_sk(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """Split-KV exact-bf16 attention of up to ``SPLIT_MAX_ROWS`` rows on the tensor cores
    (:func:`attention_mma_sk_k`, then the fp32 mode's ordered merge): the buffers, conditions and
    bits of ``attention_mma_split``. Returns False (did nothing) when its buffers would not fit
    or head_dim passes ``SK_Q_MAX_D``."""
    ntiles = (start + R - 1) // ATT_TILE + 1 if pos is None else (kc.shape[0] - 1) // ATT_TILE + 1
    need = R * hq * ntiles
    if (4 * need * (D + 2 + ATT_TILE) > SPLIT_MAX_STATS_BYTES or D > SK_Q_MAX_D
            or not all(a.is_c_contiguous() for a in (Q, kc, vc))):
        return False
    if R <= 0:
        return True
    _bind()
    rep = hq // hkv
    ML = scratch("attention_mma.ml", 2 * need)[:2 * need].reshape(R * hq, ntiles, 2)
    A = scratch("attention_mma.a", need * D)[:need * D].reshape(R * hq, ntiles, D)
    pb = zero_pos() if pos is None else pos
    vs = max(1, min(int(SK_VSPLIT), (D + 7) >> 3))
    launch(sk_kernel(vs), (ntiles, hkv * ((rep + 15) // 16) * vs, R), SK_NT, Q.view(np.uint32),
           kc.view(np.uint32), vc.view(np.uint32), np.int64(start), pb, np.int64(hq), np.int64(hkv), np.int64(D),
           np.float32(scale), ML, A)
    launch(generated(attention_merge_source, None), (R, hq, (D + ATT_MERGE_NT - 1) // ATT_MERGE_NT), ATT_MERGE_NT,
           ML, A, out, np.int64(start), pb, np.int64(D))
    return True


def attention_mma_tc(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """exact-bf16 attention of R rows on the tensor cores (:func:`attention_mma_pk`); the twin's
    signature, ``pos`` as in ``attention_mma_split``. Returns False (did nothing) where it does
    not apply."""
    return attention_mma_pk(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)


def attention_mma_gpu(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """exact-bf16 attention on a GPU: split-KV on the MMA up to ``SPLIT_MAX_ROWS`` rows (when its
    buffers fit), the packed tensor-core kernel past that (when it applies), else one block per (row, head)."""
    _bind()
    if R <= SPLIT_MAX_ROWS and attention_mma_sk(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos):
        return
    if attention_mma_tc(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos):
        return
    attention_mma_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)
