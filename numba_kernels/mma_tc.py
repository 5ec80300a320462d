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

``linear_mma_tc4_k`` (rows of K % 4 == 0, 16-byte aligned): the same tiles, with each lane reading
a step's four k in one 16-byte load (the step's k permuted alike in A and B; see the comment above
it) and the next four steps' loads issued before the current four MMAs.

``linear_mma_gemm_k`` (K % 4 == 0, aligned, from ``GEMM_MIN_ROWS`` rows: primes): 128 × 128 block
tiles, K tiles of 32 staged in shared memory as bf16 pairs, each warp 4 × 4 MMA tiles whose chains
are the one-warp kernels' chains. ``linear_mma_tc`` picks it, else ``linear_mma_tc4_k``, else
``linear_mma_tc_k``.

``attention_mma_tc_k`` (more rows than split-KV takes; head_dim a multiple of 4 up to
``ATT_TC_MAX_D``): one warp per (16 query rows, head), QKᵀ and P·V on the MMA, the twin's tiles
and its per-row loops (see the comment above it). ``attention_mma_gpu`` is the op on a GPU:
split-KV, this kernel, or the one-block-per-(row, head) kernel.

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

from .dispatch import SPLIT_MAX_ROWS
from .exact import ATT_TILE, ZERO
from .intrin import ldg4u
from .launch import aligned, fmul, launch, scratch, syncwarp, zero_pos

BODIES = ("exp32", "merge_stats", "merge_value", "attn_out", "mma_dot", "mma_f32", "attention_mma_split",
          "attention_mma_tiled")


def bind(ns) -> None:
    """Take the family bodies and launchers this module's attention uses (``BODIES``), as
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
                for i in range(4):
                    for j in range(4):
                        e = 4 * (4 * i + j)
                        acc[e], acc[e + 1], acc[e + 2], acc[e + 3] = mma_bf16(
                            a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3], b[2 * j], b[2 * j + 1],
                            acc[e], acc[e + 1], acc[e + 2], acc[e + 3])
        cuda.syncthreads()
        k0 += GB_K
    for i in range(4):
        for j in range(4):
            e = 4 * (4 * i + j)
            _store(outu, m0 + wm + 16 * i + g, n0 + wn + 8 * j + 2 * q, R, N, acc[e], acc[e + 1], acc[e + 2],
                   acc[e + 3])


TC_WARPS = 4  # warps (output tiles) per block
TC_SPREAD_TILES = 4096  # fewer output tiles than this: one warp per block, spread over the SMs


def linear_mma_tc(X, W, out, R):
    """exact-bf16 linear on the tensor cores (see the module docstring); the twin's signature. Rows
    of 16-byte-aligned length (K % 4 == 0, C-contiguous) take the vectorised kernel."""
    N, K = W.shape
    tiles = ((R + 15) // 16) * ((N + 7) // 8)
    vec = K % 4 == 0 and X.is_c_contiguous() and W.is_c_contiguous() and X.shape[1] == K and aligned(X) and aligned(W)
    if vec and R >= GEMM_MIN_ROWS:
        launch(linear_mma_gemm_k, ((N + GB_N - 1) // GB_N, (R + GB_M - 1) // GB_M), 256, X.view(np.uint32),
               W.view(np.uint32), out.view(np.uint32), R)
        return
    wpb = 1 if vec and tiles < TC_SPREAD_TILES else TC_WARPS
    launch(linear_mma_tc4_k if vec else linear_mma_tc_k, (tiles + wpb - 1) // wpb, 32 * wpb, X.view(np.uint32),
           W.view(np.uint32), out.view(np.uint32), R)


def compile_ptx_sm90(kernel=None) -> str:
    """A kernel's PTX for sm_90 (no GPU needed; default ``linear_mma_tc_k``): for ``ptxas
    -arch=sm_90`` and the SASS check."""
    sig = (types.uint32[:, ::1], types.uint32[:, ::1], types.uint32[:, ::1], types.int64)
    ptx, _ = cuda.compile_ptx((kernel or linear_mma_tc_k).py_func, sig, cc=(9, 0))
    return ptx


# ---- exact-bf16 attention on the tensor cores (prime: more rows than split-KV takes) -----------
# One warp per (16 query rows, head): the twin's tiles of ATT_TILE keys in order, each tile
#   1. S = QKᵀ on the MMA: eight 16×8 output tiles (keys k0 + 8t + g as B's columns), each a chain of
#      D/16 MMA steps from +0 (16-byte loads, the step's k permuted alike in A and B, as in
#      linear_mma_tc4_k); then s = fmul(S, scale) into the warp's score tile in shared memory;
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
ATT_TC_WARPS = 4  # warps per block: four heads of the same 16 rows
ATT_TC_MAX_D = 256  # the per-lane accumulators (4 per 8 columns) live in a local array of this / 2
_SST = ATT_TILE + 4  # the score tile's row stride (floats)
NEG_INF = np.float32(-np.inf)
_ACC_N = ATT_TC_MAX_D // 2


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
def _lmax(best, bi, v, j, n):
    """The leftmost-max scan's step: score v of key j (keys ≥ n and NaN past key 0 are no
    candidates; a NaN key 0 is settled by the caller)."""
    if j < n and v == v and v > best:
        return v, np.int32(j)
    return best, bi


@cuda.jit(device=True, inline=True)
def _lmax_xor(best, bi, m):
    """Leftmost max of this lane's and lane ^ m's candidates (equal values: the lower key; the
    same answer in both lanes)."""
    ob = cuda.shfl_xor_sync(0xFFFFFFFF, best, m)
    oi = cuda.shfl_xor_sync(0xFFFFFFFF, bi, m)
    if ob > best or (ob == best and oi < bi):
        return ob, oi
    return best, bi


def _attention_tc_kernel(prefetch, regpass, vhoist):
    """``attention_mma_tc_k`` with its three schedule choices (each the same arithmetic; the
    variants exist so that ``tools/probe_att_tc.py`` can time them against each other):
    ``prefetch``: each QKᵀ step's Q/K loads issued one step ahead; ``regpass``: the tile max from
    the QKᵀ fragments in registers (a leftmost-max scan per lane, two shuffles: the twin's scan,
    see below) and Σp over the full tile (+0 past a row's keys adds nothing to a sum that is never
    −0); ``vhoist``: a column group's four key steps of V loaded before its MMAs."""

    @cuda.jit
    def kern(Qu, Ku, Vu, out, start, pb, R, hq, hkv, D, scale, Pg, Pgu):
        w = cuda.threadIdx.x >> 5
        lane = cuda.threadIdx.x & 31
        g = lane >> 2
        q = lane & 3
        h = cuda.blockIdx.y * ATT_TC_WARPS + w
        sS = cuda.shared.array((ATT_TC_WARPS, 16, _SST), np.float32)
        sT = cuda.shared.array((ATT_TC_WARPS, 4, 16), np.float32)  # mt, alpha, beta, l per row
        if h >= hq:  # uniform over the warp; the block has no block-wide barrier
            return
        r0 = cuda.blockIdx.x * 16
        kvh = h // (hq // hkv)
        qo = h * D
        ko = kvh * D
        QS = hq * D
        KS = hkv * D
        cap = Ku.shape[0]
        base = start + pb[0]
        rlast = min(r0 + 15, R - 1)
        ntile = (base + rlast) // ATT_TILE + 1
        ngrp = (D + 31) >> 5  # groups of 32 output columns: 4 n-tiles (see _att_col)
        rg = r0 + g
        rg8 = rg + 8
        kq = 4 * q
        S = cuda.local.array(32, np.uint32)
        P = cuda.local.array(16, np.uint32)
        acc = cuda.local.array(_ACC_N, np.float32)
        C4 = cuda.local.array(16, np.uint32)
        Kr = cuda.local.array(32, np.uint32)
        Kn = cuda.local.array(32, np.uint32)
        Vb = cuda.local.array(32, np.uint32)
        m = ZERO
        l = ZERO
        wid = cuda.blockIdx.x * cuda.gridDim.y * ATT_TC_WARPS + cuda.blockIdx.y * ATT_TC_WARPS + w
        for tix in range(ntile):
            k0 = tix * ATT_TILE
            n0 = _row_n(base, r0, g, R, k0)
            n8 = _row_n(base, r0, g + 8, R, k0)
            # 1. S = QKᵀ, eight 16×8 tiles, D/16 chained steps each
            for e in range(32):
                S[e] = np.uint32(0)
            if prefetch:
                qa = ldg4u(Qu, rg * QS + qo + kq, (rg < R) & (kq < D))
                qb = ldg4u(Qu, rg8 * QS + qo + kq, (rg8 < R) & (kq < D))
                for t in range(8):
                    key = k0 + 8 * t + g
                    Kr[4 * t], Kr[4 * t + 1], Kr[4 * t + 2], Kr[4 * t + 3] = ldg4u(
                        Ku, key * KS + ko + kq, (key < cap) & (kq < D))
                for ks in range(0, D, 16):
                    kn = ks + 16 + kq
                    qa2 = ldg4u(Qu, rg * QS + qo + kn, (rg < R) & (kn < D))
                    qb2 = ldg4u(Qu, rg8 * QS + qo + kn, (rg8 < R) & (kn < D))
                    for t in range(8):
                        key = k0 + 8 * t + g
                        Kn[4 * t], Kn[4 * t + 1], Kn[4 * t + 2], Kn[4 * t + 3] = ldg4u(
                            Ku, key * KS + ko + kn, (key < cap) & (kn < D))
                    a0 = _pack(qa[0], qa[1])
                    a1 = _pack(qb[0], qb[1])
                    a2 = _pack(qa[2], qa[3])
                    a3 = _pack(qb[2], qb[3])
                    for t in range(8):
                        S[4 * t], S[4 * t + 1], S[4 * t + 2], S[4 * t + 3] = mma_bf16(
                            a0, a1, a2, a3, _pack(Kr[4 * t], Kr[4 * t + 1]), _pack(Kr[4 * t + 2], Kr[4 * t + 3]),
                            S[4 * t], S[4 * t + 1], S[4 * t + 2], S[4 * t + 3])
                    qa = qa2
                    qb = qb2
                    for e in range(32):
                        Kr[e] = Kn[e]
            else:
                for ks in range(0, D, 16):
                    kk = ks + kq
                    x0, x1, x2, x3 = ldg4u(Qu, rg * QS + qo + kk, (rg < R) & (kk < D))
                    y0, y1, y2, y3 = ldg4u(Qu, rg8 * QS + qo + kk, (rg8 < R) & (kk < D))
                    a0 = _pack(x0, x1)
                    a1 = _pack(y0, y1)
                    a2 = _pack(x2, x3)
                    a3 = _pack(y2, y3)
                    for t in range(8):
                        key = k0 + 8 * t + g
                        w0, w1, w2, w3 = ldg4u(Ku, key * KS + ko + kk, (key < cap) & (kk < D))
                        S[4 * t], S[4 * t + 1], S[4 * t + 2], S[4 * t + 3] = mma_bf16(
                            a0, a1, a2, a3, _pack(w0, w1), _pack(w2, w3), S[4 * t], S[4 * t + 1], S[4 * t + 2],
                            S[4 * t + 3])
            ni = _row_n(base, r0, lane, R, k0)
            if regpass:
                # 2. the tile max of rows g, g + 8: this lane's keys (8t + 2q, 8t + 2q + 1: ascending),
                #    then the row's four lanes; = the twin's scan (first score, then strictly
                #    greater ones: the leftmost max of the non-NaN scores, or a NaN first score)
                b0 = NEG_INF
                i0 = np.int32(ATT_TILE)
                b8 = NEG_INF
                i8 = np.int32(ATT_TILE)
                for t in range(8):
                    j = 8 * t + 2 * q
                    b0, i0 = _lmax(b0, i0, fmul(_u2f(S[4 * t]), scale), j, n0)
                    b0, i0 = _lmax(b0, i0, fmul(_u2f(S[4 * t + 1]), scale), j + 1, n0)
                    b8, i8 = _lmax(b8, i8, fmul(_u2f(S[4 * t + 2]), scale), j, n8)
                    b8, i8 = _lmax(b8, i8, fmul(_u2f(S[4 * t + 3]), scale), j + 1, n8)
                b0, i0 = _lmax_xor(b0, i0, 1)
                b8, i8 = _lmax_xor(b8, i8, 1)
                b0, i0 = _lmax_xor(b0, i0, 2)
                b8, i8 = _lmax_xor(b8, i8, 2)
                f0 = cuda.shfl_sync(0xFFFFFFFF, fmul(_u2f(S[0]), scale), lane & 28)
                f8 = cuda.shfl_sync(0xFFFFFFFF, fmul(_u2f(S[2]), scale), lane & 28)
                m0 = f0 if f0 != f0 else b0
                m8 = f8 if f8 != f8 else b8
                if q == 0:
                    sT[w, 0, g] = m0
                    sT[w, 0, g + 8] = m8
            else:
                for t in range(8):
                    j = 8 * t + 2 * q
                    sS[w, g, j] = fmul(_u2f(S[4 * t]), scale)
                    sS[w, g, j + 1] = fmul(_u2f(S[4 * t + 1]), scale)
                    sS[w, g + 8, j] = fmul(_u2f(S[4 * t + 2]), scale)
                    sS[w, g + 8, j + 1] = fmul(_u2f(S[4 * t + 3]), scale)
                syncwarp()
                # 2. the row's tile max, in key order
                if lane < 16 and ni > 0:
                    mt = sS[w, lane, 0]
                    for j in range(1, ni):
                        if sS[w, lane, j] > mt:
                            mt = sS[w, lane, j]
                    sT[w, 0, lane] = mt
                syncwarp()
                m0 = sT[w, 0, g]
                m8 = sT[w, 0, g + 8]
            # 3. p = exp32(s − mt) (+0 past the row's keys); P's A fragments, bf16
            for t in range(8):
                j = 8 * t + 2 * q
                if regpass:
                    s00 = fmul(_u2f(S[4 * t]), scale)
                    s01 = fmul(_u2f(S[4 * t + 1]), scale)
                    s80 = fmul(_u2f(S[4 * t + 2]), scale)
                    s81 = fmul(_u2f(S[4 * t + 3]), scale)
                else:
                    s00 = sS[w, g, j]
                    s01 = sS[w, g, j + 1]
                    s80 = sS[w, g + 8, j]
                    s81 = sS[w, g + 8, j + 1]
                p00 = exp32(s00 - m0) if j < n0 else ZERO
                p01 = exp32(s01 - m0) if j + 1 < n0 else ZERO
                p80 = exp32(s80 - m8) if j < n8 else ZERO
                p81 = exp32(s81 - m8) if j + 1 < n8 else ZERO
                sS[w, g, j] = p00
                sS[w, g, j + 1] = p01
                sS[w, g + 8, j] = p80
                sS[w, g + 8, j + 1] = p81
                # n-tile t = 2s + (t & 1): a0/a1 (keys 2q, 2q+1 of step s) from even t, a2/a3 from odd t
                P[4 * (t >> 1) + 2 * (t & 1)] = _pack(_f2u(p00), _f2u(p01))
                P[4 * (t >> 1) + 2 * (t & 1) + 1] = _pack(_f2u(p80), _f2u(p81))
            syncwarp()
            # 4. Σp in key order, the running (m, l), this tile's (alpha, beta)
            if lane < 16 and ni > 0:
                lt = ZERO
                if regpass:
                    for jb in range(0, ATT_TILE, 8):
                        x0 = sS[w, lane, jb]
                        x1 = sS[w, lane, jb + 1]
                        x2 = sS[w, lane, jb + 2]
                        x3 = sS[w, lane, jb + 3]
                        x4 = sS[w, lane, jb + 4]
                        x5 = sS[w, lane, jb + 5]
                        x6 = sS[w, lane, jb + 6]
                        x7 = sS[w, lane, jb + 7]
                        lt = lt + x0
                        lt = lt + x1
                        lt = lt + x2
                        lt = lt + x3
                        lt = lt + x4
                        lt = lt + x5
                        lt = lt + x6
                        lt = lt + x7
                else:
                    for j in range(ni):
                        lt = lt + sS[w, lane, j]
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
                bad |= _vbad(Vu[k0 + nlo + kx, ko + x - kx * D])
            if cuda.any_sync(0xFFFFFFFF, bad):
                # the twin's dot for this tile: each lane its own fragment's outputs
                for x in range(lane, 16 * ATT_TILE, 32):
                    Pg[wid, x // ATT_TILE, x % ATT_TILE] = sS[w, x // ATT_TILE, x % ATT_TILE]
                syncwarp()
                for u in range(4 * ngrp):
                    for e in range(4):
                        rr = g + 8 * (e >> 1)
                        cc = _att_col(u, 2 * q + (e & 1))
                        nr = _row_n(base, r0, rr, R, k0)
                        if nr > 0 and cc < D:
                            pv = mma_f32(mma_dot(Pgu[wid], rr, 0, Vu, k0, ko + cc, 1, 0, nr))
                            acc[4 * u + e] = merge_value(tix, acc[4 * u + e], al0 if e < 2 else al8, pv,
                                                         be0 if e < 2 else be8)
                syncwarp()
            else:
                nsteps = (nhi + 15) >> 4  # key steps with a key some row reads (all-zero steps: no term)
                klim = k0 + nhi
                for grp in range(ngrp):
                    vo = ko + 32 * grp + 4 * g  # this lane's 4 columns: B column g of the group's 4 n-tiles
                    cok = 32 * grp + 4 * g < D
                    for e in range(16):
                        C4[e] = np.uint32(0)
                    if vhoist:
                        for s in range(4):
                            kb = k0 + 16 * s + 2 * q
                            v0 = ldg4u(Vu, kb * KS + vo, cok & (kb < klim))
                            v1 = ldg4u(Vu, (kb + 1) * KS + vo, cok & (kb + 1 < klim))
                            v8 = ldg4u(Vu, (kb + 8) * KS + vo, cok & (kb + 8 < klim))
                            v9 = ldg4u(Vu, (kb + 9) * KS + vo, cok & (kb + 9 < klim))
                            for j in range(4):
                                Vb[8 * s + 2 * j] = _pack(v0[j], v1[j])
                                Vb[8 * s + 2 * j + 1] = _pack(v8[j], v9[j])
                        for s in range(4):
                            if s < nsteps:  # uniform
                                for j in range(4):
                                    C4[4 * j], C4[4 * j + 1], C4[4 * j + 2], C4[4 * j + 3] = mma_bf16(
                                        P[4 * s], P[4 * s + 1], P[4 * s + 2], P[4 * s + 3], Vb[8 * s + 2 * j],
                                        Vb[8 * s + 2 * j + 1], C4[4 * j], C4[4 * j + 1], C4[4 * j + 2], C4[4 * j + 3])
                    else:
                        for s in range(4):
                            if s < nsteps:  # uniform
                                kb = k0 + 16 * s + 2 * q
                                v0 = ldg4u(Vu, kb * KS + vo, cok & (kb < klim))
                                v1 = ldg4u(Vu, (kb + 1) * KS + vo, cok & (kb + 1 < klim))
                                v8 = ldg4u(Vu, (kb + 8) * KS + vo, cok & (kb + 8 < klim))
                                v9 = ldg4u(Vu, (kb + 9) * KS + vo, cok & (kb + 9 < klim))
                                for j in range(4):
                                    C4[4 * j], C4[4 * j + 1], C4[4 * j + 2], C4[4 * j + 3] = mma_bf16(
                                        P[4 * s], P[4 * s + 1], P[4 * s + 2], P[4 * s + 3], _pack(v0[j], v1[j]),
                                        _pack(v8[j], v9[j]), C4[4 * j], C4[4 * j + 1], C4[4 * j + 2], C4[4 * j + 3])
                    for j in range(4):
                        u = 4 * (4 * grp + j)
                        if n0 > 0:
                            acc[u] = merge_value(tix, acc[u], al0, _u2f(C4[4 * j]), be0)
                            acc[u + 1] = merge_value(tix, acc[u + 1], al0, _u2f(C4[4 * j + 1]), be0)
                        if n8 > 0:
                            acc[u + 2] = merge_value(tix, acc[u + 2], al8, _u2f(C4[4 * j + 2]), be8)
                            acc[u + 3] = merge_value(tix, acc[u + 3], al8, _u2f(C4[4 * j + 3]), be8)
        if lane < 16:
            sT[w, 3, lane] = l
        syncwarp()
        l0 = sT[w, 3, g]
        l8 = sT[w, 3, g + 8]
        for u in range(4 * ngrp):
            for e in range(4):
                rr = rg + 8 * (e >> 1)
                cc = _att_col(u, 2 * q + (e & 1))
                if rr < R and cc < D:
                    out[rr, qo + cc] = attn_out(acc[4 * u + e], l0 if e < 2 else l8)

    return kern


ATT_TC_VARIANTS = {(a, b, c): None for a in (False, True) for b in (False, True) for c in (False, True)}
ATT_TC_SCHEDULE = (False, False, False)  # (prefetch, regpass, vhoist) of attention_mma_tc_k: tools/probe_att_tc.py


def attention_tc_variant(schedule):
    """The tensor-core attention kernel with the schedule (prefetch, regpass, vhoist), compiled on
    first launch and kept."""
    k = ATT_TC_VARIANTS.get(tuple(schedule))
    if k is None:
        k = ATT_TC_VARIANTS[tuple(schedule)] = _attention_tc_kernel(*schedule)
    return k


attention_mma_tc_k = attention_tc_variant(ATT_TC_SCHEDULE)


def attention_mma_tc(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None, schedule=None):
    """exact-bf16 attention of R rows on the tensor cores (:func:`attention_mma_tc_k`); the twin's
    signature, ``pos`` as in ``attention_mma_split``. Returns False (did nothing) where it does
    not apply: head_dim past ``ATT_TC_MAX_D`` or not a multiple of 4 (16-byte rows), or operands
    not C-contiguous and 16-byte aligned. Kernel-owned scratch: 4 KB per (16 rows, head), where
    a warp's emulated tile (the rare non-finite V case) reads P. ``schedule``: a kernel variant of
    :func:`attention_tc_variant` (default ``ATT_TC_SCHEDULE``; for ``tools/probe_att_tc.py``)."""
    if D > ATT_TC_MAX_D or D % 4 or not all(a.is_c_contiguous() and aligned(a) for a in (Q, kc, vc)):
        return False
    if R <= 0:
        return True
    _bind()
    nb, hb = (R + 15) // 16, (hq + ATT_TC_WARPS - 1) // ATT_TC_WARPS
    n = nb * hb * ATT_TC_WARPS
    Pg = scratch("attention_mma.tc_p", n * 16 * ATT_TILE)[:n * 16 * ATT_TILE].reshape(n, 16, ATT_TILE)
    kern = attention_mma_tc_k if schedule is None else attention_tc_variant(schedule)
    launch(kern, (nb, hb), 32 * ATT_TC_WARPS, Q.view(np.uint32), kc.view(np.uint32),
           vc.view(np.uint32), out, np.int64(start), zero_pos() if pos is None else pos, np.int64(R), np.int64(hq),
           np.int64(hkv), np.int64(D), np.float32(scale), Pg, Pg.view(np.uint32))
    return True


def attention_mma_gpu(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """exact-bf16 attention on a GPU: split-KV up to ``SPLIT_MAX_ROWS`` rows (when its buffers
    fit), the tensor-core kernel past that (when it applies), else one block per (row, head)."""
    _bind()
    if R <= SPLIT_MAX_ROWS and attention_mma_split(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos):
        return
    if attention_mma_tc(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos):
        return
    attention_mma_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos)
