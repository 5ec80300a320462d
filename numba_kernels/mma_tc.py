"""exact-bf16 on the tensor cores: ``linear_mma`` issuing ``mma.sync.aligned.m16n8k16`` (CUDA only).

Imported by :mod:`numba_kernels.cuda` on a real GPU only (the family modules stay free of CUDA
imports; this file holds the one thing a family module cannot: an ``@intrinsic`` emitting inline
PTX, the route measured on the H200 in ``tools/mma_vectors.py``). The simulator cannot run inline
PTX, so there ``linear_mma`` stays the naive kernel, which runs the twin's per-output emulation:
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

``linear_mma_tc4_k`` (rows of K % 4 == 0, 16-byte aligned): the same tiles, with each lane reading
a step's four k in one 16-byte load (the step's k permuted alike in A and B; see the comment above
it) and the next four steps' loads issued before the current four MMAs. ``linear_mma_tc`` picks it
when it applies and ``linear_mma_tc_k`` otherwise.

Fragments come straight from global memory: no shared-memory staging, no ``ldmatrix`` yet.
``harness device-check`` compares both kernels bitwise with the twin at every row count;
``tools/probe_mma_gemm.py`` times them against torch bf16.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from .intrin import ldg4u
from .launch import aligned, launch

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


@cuda.jit(device=True, inline=True)
def _bf16(u):
    """bf16 bits (uint32) of float32 bits u, nearest even; NaN → quiet NaN with its sign. A select,
    not a branch, so that a kernel's loads stay in one basic block and issue together."""
    rne = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    qnan = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
    return qnan if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else rne


@cuda.jit(device=True, inline=True)
def _a2(Xu, r, k, R, K):
    """Two A elements (row r, k and k+1) packed, +0 outside."""
    lo = np.uint32(0)
    hi = np.uint32(0)
    if r < R:
        if k < K:
            lo = _bf16(Xu[r, k])
        if k + 1 < K:
            hi = _bf16(Xu[r, k + 1])
    return lo | (hi << np.uint32(16))


@cuda.jit(device=True, inline=True)
def _b2(Wu, o, k, N, K):
    lo = np.uint32(0)
    hi = np.uint32(0)
    if o < N:
        if k < K:
            lo = Wu[o, k] >> np.uint32(16)
        if k + 1 < K:
            hi = Wu[o, k + 1] >> np.uint32(16)
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
        a0 = _a2(Xu, r0 + g, k0 + 2 * q, R, K)
        a1 = _a2(Xu, r0 + g + 8, k0 + 2 * q, R, K)
        a2 = _a2(Xu, r0 + g, k0 + 2 * q + 8, R, K)
        a3 = _a2(Xu, r0 + g + 8, k0 + 2 * q + 8, R, K)
        b0 = _b2(Wu, o0 + g, k0 + 2 * q, N, K)
        b1 = _b2(Wu, o0 + g, k0 + 2 * q + 8, N, K)
        d0, d1, d2, d3 = mma_bf16(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3)
    _store(outu, r0 + g, o0 + 2 * q, R, N, d0, d1, d2, d3)


# ---- the vectorised kernel: one 16-byte load per lane per K step ------------------------------
# Within one MMA step the rule sums all 16 products exactly after one alignment to the largest
# term (numba_kernels/MMA.md §2: emax, the truncation grid and the single rounding are properties
# of the set of terms), so the 16 k of a step may sit in any fragment position, as long as A and B
# use the same one. Here lane (g, q) holds the step's k = 4q … 4q+3: fragment k 2q, 2q+1 ← 4q,
# 4q+1 and 2q+8, 2q+9 ← 4q+2, 4q+3, so each lane reads W[o, k0+4q : k0+4q+4] and
# X[r, k0+4q : k0+4q+4] in one 16-byte load each (rows 16-byte aligned: K % 4 == 0).
@cuda.jit(device=True, inline=True)
def _raw4(Xu, Wu, rg, o, k, R, N, K):
    """One step's raw words for lane (g, q) at k = k0 + 4q, as loaded (16 bytes each): X rows rg
    and rg + 8 (float32 bits) and W row o (float32 arrays of bf16 values); zeros outside. The
    conversion to fragments (:func:`_frag4`) waits until the MMA, so that a group's loads are all
    in flight before any of their results is needed."""
    x0, x1, x2, x3 = ldg4u(Xu, rg * K + k, (rg < R) & (k < K))  # & not `and`: no branch
    y0, y1, y2, y3 = ldg4u(Xu, (rg + 8) * K + k, (rg + 8 < R) & (k < K))
    w0, w1, w2, w3 = ldg4u(Wu, o * K + k, (o < N) & (k < K))
    return x0, x1, x2, x3, y0, y1, y2, y3, w0, w1, w2, w3


@cuda.jit(device=True, inline=True)
def _frag4(f):
    """The fragments (a0, a1, a2, a3, b0, b1) of :func:`_raw4`'s words: X rounded to bf16 and W's
    high halves, packed (k, k+1) and (k+2, k+3); a1, a3 are row g + 8."""
    return (_bf16(f[0]) | (_bf16(f[1]) << np.uint32(16)), _bf16(f[4]) | (_bf16(f[5]) << np.uint32(16)),
            _bf16(f[2]) | (_bf16(f[3]) << np.uint32(16)), _bf16(f[6]) | (_bf16(f[7]) << np.uint32(16)),
            (f[8] >> np.uint32(16)) | (f[9] & np.uint32(0xFFFF0000)),
            (f[10] >> np.uint32(16)) | (f[11] & np.uint32(0xFFFF0000)))


@cuda.jit(device=True, inline=True)
def _mma6(f, d0, d1, d2, d3):
    a0, a1, a2, a3, b0, b1 = _frag4(f)
    return mma_bf16(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3)


@cuda.jit
def linear_mma_tc4_k(Xu, Wu, outu, R):
    """As linear_mma_tc_k with 16-byte fragment loads (K % 4 == 0) and the loads of the next four
    K steps issued before the MMAs of the current four."""
    N, K = Wu.shape
    r0, o0, g, q = _tile(N)
    if r0 >= R:  # uniform over the warp
        return
    rg = r0 + g
    og = o0 + g
    kq = 4 * q
    d0 = np.uint32(0)
    d1 = np.uint32(0)
    d2 = np.uint32(0)
    d3 = np.uint32(0)
    f0 = _raw4(Xu, Wu, rg, og, kq, R, N, K)
    f1 = _raw4(Xu, Wu, rg, og, kq + 16, R, N, K)
    f2 = _raw4(Xu, Wu, rg, og, kq + 32, R, N, K)
    f3 = _raw4(Xu, Wu, rg, og, kq + 48, R, N, K)
    k0 = 0
    while k0 < K:  # steps k0, k0+16, k0+32, k0+48 (those < K, a uniform test) in order
        n0 = _raw4(Xu, Wu, rg, og, k0 + 64 + kq, R, N, K)
        n1 = _raw4(Xu, Wu, rg, og, k0 + 80 + kq, R, N, K)
        n2 = _raw4(Xu, Wu, rg, og, k0 + 96 + kq, R, N, K)
        n3 = _raw4(Xu, Wu, rg, og, k0 + 112 + kq, R, N, K)
        d0, d1, d2, d3 = _mma6(f0, d0, d1, d2, d3)
        if k0 + 16 < K:
            d0, d1, d2, d3 = _mma6(f1, d0, d1, d2, d3)
        if k0 + 32 < K:
            d0, d1, d2, d3 = _mma6(f2, d0, d1, d2, d3)
        if k0 + 48 < K:
            d0, d1, d2, d3 = _mma6(f3, d0, d1, d2, d3)
        f0 = n0
        f1 = n1
        f2 = n2
        f3 = n3
        k0 += 64
    _store(outu, rg, o0 + 2 * q, R, N, d0, d1, d2, d3)


TC_WARPS = 4  # warps (output tiles) per block
TC_SPREAD_TILES = 4096  # fewer output tiles than this: one warp per block, spread over the SMs


def linear_mma_tc(X, W, out, R):
    """exact-bf16 linear on the tensor cores (see the module docstring); the twin's signature. Rows
    of 16-byte-aligned length (K % 4 == 0, C-contiguous) take the vectorised kernel."""
    N, K = W.shape
    tiles = ((R + 15) // 16) * ((N + 7) // 8)
    vec = K % 4 == 0 and X.is_c_contiguous() and W.is_c_contiguous() and X.shape[1] == K and aligned(X) and aligned(W)
    wpb = 1 if vec and tiles < TC_SPREAD_TILES else TC_WARPS
    launch(linear_mma_tc4_k if vec else linear_mma_tc_k, (tiles + wpb - 1) // wpb, 32 * wpb, X.view(np.uint32),
           W.view(np.uint32), out.view(np.uint32), R)


def compile_ptx_sm90(kernel=None) -> str:
    """A kernel's PTX for sm_90 (no GPU needed; default ``linear_mma_tc_k``): for ``ptxas
    -arch=sm_90`` and the SASS check."""
    sig = (types.uint32[:, ::1], types.uint32[:, ::1], types.uint32[:, ::1], types.int64)
    ptx, _ = cuda.compile_ptx((kernel or linear_mma_tc_k).py_func, sig, cc=(9, 0))
    return ptx
