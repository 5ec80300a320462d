"""Linear layers: out[r, o] = dot(X[r, :K], W[o, :K]) for r < R, in the canonical dot order.

Shapes: X [≥R, K]; W [N, K]; out [≥R, N]; rows past R are neither read nor written.

The order (:func:`numba_kernels.exact.dot`): K in slices of 32; an fma chain from +0 inside a
slice (``fma_chain``); slice partials added left to right into an accumulator that starts at
+0 (``add_partial``). Every version keeps it:

- ``linear_cpu`` (the twin) and ``linear_naive`` (CUDA, one thread per output) call ``dot_rows``;
- ``gemv_v1`` / ``gemv_v3`` (R ≤ ``GEMV_MAX_ROWS``, decode): one warp per output column. K is
  walked 1024 elements (32 slices) at a time: the input rows and the warp's weights are staged
  in shared memory, lane l computes slice l's partial, and the 32 partials are added in slice
  order. v1 pads its tiles and stores each loaded weight before the next load; v3 keeps 16 loads
  in flight per warp and XOR-swizzles its tiles (element e of slice s at e ^ s);
- ``gemm`` (more rows, prime): 64×64 output tiles, 256 threads with 4×4 outputs each; K is
  staged through shared memory one slice at a time; each thread keeps its 16 slice chains in
  registers (``fma_chain``'s chain, interleaved for register reuse) and adds them to its
  accumulators in slice order.

Which one runs is :mod:`numba_kernels.dispatch`'s table.

``linear_bf16`` is the same op with W held as bf16 bits (uint16 [N, K]), widened in registers
(:func:`numba_kernels.exact.widen_bf16`) with the same order, so its bits are ``linear``'s on the
widened weights. Its CUDA launcher is deliberately simple: R ≤ ``GEMV_MAX_ROWS`` runs
``gemv_bf16_k`` (``gemv_v1``'s staging, widening as it stages: decode reads half the bytes);
more rows widen W into a float32 scratch, at most ``WIDEN_ELEMS`` elements at a time, and run
``gemm`` on each block of output columns.
"""

from __future__ import annotations

import numpy as np

from . import dispatch
from .dispatch import GEMV_MAX_ROWS
from .exact import SLICE, ZERO, add_partial, add_partials, dot_rows, dot_rows_w16, fma_chain, row_col, widen_bf16
from .tags import body, cuda, fma, grid1, kernel, launch, launcher, prange, scratch, syncwarp, twin

BM = BN = 64  # GEMM output tile
TM = TN = 4  # GEMM outputs per thread
BM_PAD = BM + 1  # shared-memory shapes must be compile-time constants
BN_PAD = BN + 1
GEMV_WARPS = 4  # v1: output columns per block
GEMV3_WARPS = 8  # v3: 256 threads; its input staging assumes it
WIDEN_ELEMS = 1 << 24  # linear_bf16, more than GEMV_MAX_ROWS rows: weights widened per block (64 MiB)


@body
def linear_at(X, W, out, r, o):
    out[r, o] = dot_rows(X, r, 0, W, o, 0, W.shape[1])


@body
def gemv_add_partials(acc, parts, R, m):
    """A GEMV warp's accumulators: acc[r] += parts[r, 0] + … + parts[r, m−1] (its column's slice
    partials of row r, in slice order) for r < R."""
    for r in range(R):
        acc[r] = add_partials(acc[r], parts[r], m)


@body
def gemv_store(acc, out, o, R):
    for r in range(R):
        out[r, o] = acc[r]


@twin("linear", parallel=True)
def linear_cpu(X, W, out, R):
    """out[r, o] = dot(X[r, :K], W[o, :K]) for r < R. X: [≥R, K]; W: [N, K]; out: [≥R, N]."""
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


@kernel
def gemv_v1_k(X, W, out, R):
    tid = cuda.threadIdx.x
    lane = tid & 31
    w = tid >> 5
    o = cuda.blockIdx.x * GEMV_WARPS + w
    N, K = W.shape
    Ws = cuda.shared.array((GEMV_WARPS, 32, 33), np.float32)  # [warp, slice, element], padded
    Xs = cuda.shared.array((GEMV_MAX_ROWS, 32, 33), np.float32)
    ps = cuda.shared.array((GEMV_WARPS, GEMV_MAX_ROWS, 32), np.float32)
    acc = cuda.local.array(GEMV_MAX_ROWS, np.float32)
    for r in range(GEMV_MAX_ROWS):
        acc[r] = ZERO
    nsl = (K + SLICE - 1) // SLICE
    for base in range(0, nsl, 32):
        k_base = base * SLICE
        for idx in range(tid, R * 1024, 32 * GEMV_WARPS):
            r = idx >> 10
            rem = idx & 1023
            gk = k_base + rem
            Xs[r, rem >> 5, rem & 31] = X[r, gk] if gk < K else ZERO
        for j in range(32):
            gk = k_base + j * 32 + lane
            Ws[w, j, lane] = W[o, gk] if o < N and gk < K else ZERO
        cuda.syncthreads()
        n_in = min(SLICE, K - (k_base + lane * SLICE))
        for r in range(R):
            ps[w, r, lane] = fma_chain(Xs[r, lane], Ws[w, lane], n_in, 0)
        cuda.syncthreads()
        gemv_add_partials(acc, ps[w], R, min(32, nsl - base))
        cuda.syncthreads()
    if lane == 0 and o < N:
        gemv_store(acc, out, o, R)


@kernel
def gemv_v3_k(X, W, out, R):
    """The same order as ``gemv_v1_k`` with fewer stalls (block of 256 threads): a warp stages its
    column's 1024-element chunk through its own XOR-swizzled shared tile (no padding, no bank
    conflicts), issuing 16 loads before storing any of them (a GPU waits for a load only where
    its value is used; v1 stores each value before the next load), and adds the 32 slice
    partials in slice order from its own tile (warp barriers only)."""
    tid = cuda.threadIdx.x
    lane = tid & 31
    w = tid >> 5
    o = cuda.blockIdx.x * GEMV3_WARPS + w
    N, K = W.shape
    oc = min(o, N - 1)  # a warp past the last column repeats it and stores nothing
    Ws = cuda.shared.array((GEMV3_WARPS, 32, 32), np.float32)  # [warp, slice, element ^ slice]
    Xs = cuda.shared.array((GEMV_MAX_ROWS, 32, 32), np.float32)  # [row, slice, element ^ slice]
    acc = cuda.local.array(GEMV_MAX_ROWS, np.float32)
    parts = cuda.local.array(GEMV_MAX_ROWS, np.float32)
    for r in range(GEMV_MAX_ROWS):
        acc[r] = ZERO
    nsl = (K + SLICE - 1) // SLICE
    for base in range(0, nsl, 32):
        k_base = base * SLICE
        for r in range(R):  # 1024 inputs of row r: 4 per thread, loaded before stored
            i1, i2, i3 = tid + 256, tid + 512, tid + 768
            g0 = k_base + tid
            x0 = X[r, g0] if g0 < K else ZERO
            x1 = X[r, g0 + 256] if g0 + 256 < K else ZERO
            x2 = X[r, g0 + 512] if g0 + 512 < K else ZERO
            x3 = X[r, g0 + 768] if g0 + 768 < K else ZERO
            Xs[r, tid >> 5, (tid & 31) ^ (tid >> 5)] = x0
            Xs[r, i1 >> 5, (i1 & 31) ^ (i1 >> 5)] = x1
            Xs[r, i2 >> 5, (i2 & 31) ^ (i2 >> 5)] = x2
            Xs[r, i3 >> 5, (i3 & 31) ^ (i3 >> 5)] = x3
        if k_base + 1024 <= K:
            for j0 in range(0, 32, 16):
                kk = k_base + j0 * 32 + lane
                v0 = W[oc, kk + 0]
                v1 = W[oc, kk + 32]
                v2 = W[oc, kk + 64]
                v3 = W[oc, kk + 96]
                v4 = W[oc, kk + 128]
                v5 = W[oc, kk + 160]
                v6 = W[oc, kk + 192]
                v7 = W[oc, kk + 224]
                v8 = W[oc, kk + 256]
                v9 = W[oc, kk + 288]
                v10 = W[oc, kk + 320]
                v11 = W[oc, kk + 352]
                v12 = W[oc, kk + 384]
                v13 = W[oc, kk + 416]
                v14 = W[oc, kk + 448]
                v15 = W[oc, kk + 480]
                Ws[w, j0 + 0, lane ^ (j0 + 0)] = v0
                Ws[w, j0 + 1, lane ^ (j0 + 1)] = v1
                Ws[w, j0 + 2, lane ^ (j0 + 2)] = v2
                Ws[w, j0 + 3, lane ^ (j0 + 3)] = v3
                Ws[w, j0 + 4, lane ^ (j0 + 4)] = v4
                Ws[w, j0 + 5, lane ^ (j0 + 5)] = v5
                Ws[w, j0 + 6, lane ^ (j0 + 6)] = v6
                Ws[w, j0 + 7, lane ^ (j0 + 7)] = v7
                Ws[w, j0 + 8, lane ^ (j0 + 8)] = v8
                Ws[w, j0 + 9, lane ^ (j0 + 9)] = v9
                Ws[w, j0 + 10, lane ^ (j0 + 10)] = v10
                Ws[w, j0 + 11, lane ^ (j0 + 11)] = v11
                Ws[w, j0 + 12, lane ^ (j0 + 12)] = v12
                Ws[w, j0 + 13, lane ^ (j0 + 13)] = v13
                Ws[w, j0 + 14, lane ^ (j0 + 14)] = v14
                Ws[w, j0 + 15, lane ^ (j0 + 15)] = v15
        else:
            for j in range(32):
                gk = k_base + j * 32 + lane
                Ws[w, j, lane ^ j] = W[oc, gk] if gk < K else ZERO
        cuda.syncthreads()
        n_in = min(SLICE, K - (k_base + lane * SLICE))
        m = min(32, nsl - base)
        for r in range(R):
            parts[r] = fma_chain(Xs[r, lane], Ws[w, lane], n_in, lane)
        syncwarp()  # the warp's tile is read: its first rows take the partials
        for r in range(R):
            Ws[w, r, lane] = parts[r]
        syncwarp()
        gemv_add_partials(acc, Ws[w], R, m)
        cuda.syncthreads()
    if lane == 0 and o < N:
        gemv_store(acc, out, o, R)


@kernel
def gemm_k(X, W, out, R):
    N, K = W.shape
    As = cuda.shared.array((SLICE, BM_PAD), np.float32)  # padded: no bank conflicts on stores
    Bs = cuda.shared.array((SLICE, BN_PAD), np.float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * 16 + tx
    row0 = cuda.blockIdx.y * BM
    col0 = cuda.blockIdx.x * BN
    acc = cuda.local.array((TM, TN), np.float32)
    part = cuda.local.array((TM, TN), np.float32)
    a = cuda.local.array(TM, np.float32)
    b = cuda.local.array(TN, np.float32)
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = ZERO
    for k0 in range(0, K, SLICE):
        kl = min(SLICE, K - k0)
        for e in range(8):
            idx = tid + e * 256
            m = idx >> 5
            kk = idx & 31
            gk = k0 + kk
            gr = row0 + m
            gc = col0 + m
            As[kk, m] = X[gr, gk] if gr < R and gk < K else ZERO
            Bs[kk, m] = W[gc, gk] if gc < N and gk < K else ZERO
        cuda.syncthreads()
        for i in range(TM):
            for j in range(TN):
                part[i, j] = ZERO
        for kk in range(kl):
            for i in range(TM):
                a[i] = As[kk, ty * TM + i]
            for j in range(TN):
                b[j] = Bs[kk, tx * TN + j]
            for i in range(TM):
                for j in range(TN):
                    part[i, j] = fma(a[i], b[j], part[i, j])
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = add_partial(acc[i, j], part[i, j])
        cuda.syncthreads()
    for i in range(TM):
        r = row0 + ty * TM + i
        if r < R:
            for j in range(TN):
                c = col0 + tx * TN + j
                if c < N:
                    out[r, c] = acc[i, j]


@launcher(of="linear")
def linear_naive(X, W, out, R):
    """One thread per output (the reference launch; :func:`linear` is the fast path)."""
    launch(linear_naive_k, *grid1(R * W.shape[0]), X, W, out, R)


@launcher(of="linear")
def gemv_v1(X, W, out, R):
    """R ≤ GEMV_MAX_ROWS rows; one warp per output column, 4 columns per block."""
    launch(gemv_v1_k, (W.shape[0] + GEMV_WARPS - 1) // GEMV_WARPS, 32 * GEMV_WARPS, X, W, out, R)


@launcher(of="linear")
def gemv_v3(X, W, out, R):
    """R ≤ GEMV_MAX_ROWS rows; one warp per output column, 8 columns per block."""
    launch(gemv_v3_k, (W.shape[0] + GEMV3_WARPS - 1) // GEMV3_WARPS, 32 * GEMV3_WARPS, X, W, out, R)


@launcher(of="linear")
def gemm(X, W, out, R):
    """Any R; 64×64 output tiles."""
    N = W.shape[0]
    launch(gemm_k, ((N + BN - 1) // BN, (R + BM - 1) // BM), (16, 16), X, W, out, R)


@launcher("linear")
def linear_cuda(X, W, out, R):
    """out[r, o] = dot(X[r, :K], W[o, :K]) for r < R, canonical order (kernel: dispatch table)."""
    if dispatch.pick("linear", R) == "gemv":
        if dispatch.GEMV_VERSION == "v1":
            gemv_v1(X, W, out, R)
        else:
            gemv_v3(X, W, out, R)
    else:
        gemm(X, W, out, R)


# ------------------------------------------------------------------------------------------------
# linear_bf16: W as bf16 bits, widened in registers, the same order
# ------------------------------------------------------------------------------------------------
@body
def linear_at_w16(X, W, out, r, o):
    out[r, o] = dot_rows_w16(X, r, 0, W, o, 0, W.shape[1])


@twin("linear_bf16", parallel=True)
def linear_bf16_cpu(X, W, out, R):
    """``linear`` with W [N, K] bf16 bits (uint16): out[r, o] = dot(X[r], widen(W[o])), the
    float32 ``linear``'s bits on the widened weights."""
    N = W.shape[0]
    for ro in prange(R * N):
        r = ro // N
        linear_at_w16(X, W, out, r, ro - r * N)


@kernel
def gemv_bf16_k(X, W, out, R):
    """``gemv_v1_k`` with W as bf16 bits, widened as each warp stages its column's slices."""
    tid = cuda.threadIdx.x
    lane = tid & 31
    w = tid >> 5
    o = cuda.blockIdx.x * GEMV_WARPS + w
    N, K = W.shape
    Ws = cuda.shared.array((GEMV_WARPS, 32, 33), np.float32)  # [warp, slice, element], padded
    Xs = cuda.shared.array((GEMV_MAX_ROWS, 32, 33), np.float32)
    ps = cuda.shared.array((GEMV_WARPS, GEMV_MAX_ROWS, 32), np.float32)
    acc = cuda.local.array(GEMV_MAX_ROWS, np.float32)
    for r in range(GEMV_MAX_ROWS):
        acc[r] = ZERO
    nsl = (K + SLICE - 1) // SLICE
    for base in range(0, nsl, 32):
        k_base = base * SLICE
        for idx in range(tid, R * 1024, 32 * GEMV_WARPS):
            gk = k_base + (idx & 1023)
            Xs[idx >> 10, (idx & 1023) >> 5, idx & 31] = X[idx >> 10, gk] if gk < K else ZERO
        for j in range(32):
            gk = k_base + j * 32 + lane
            Ws[w, j, lane] = widen_bf16(W[o, gk]) if o < N and gk < K else ZERO
        cuda.syncthreads()
        for r in range(R):
            ps[w, r, lane] = fma_chain(Xs[r, lane], Ws[w, lane], min(SLICE, K - (k_base + lane * SLICE)), 0)
        cuda.syncthreads()
        gemv_add_partials(acc, ps[w], R, min(32, nsl - base))
        cuda.syncthreads()
    if lane == 0 and o < N:
        gemv_store(acc, out, o, R)


@kernel
def widen_bf16_k(W, n0, Wf, n):
    """Wf[i, k] = widen(W[n0 + i, k]) for i < n."""
    i = cuda.grid(1)
    if i < n * W.shape[1]:
        r, k = row_col(i, W.shape[1])
        Wf[r, k] = widen_bf16(W[n0 + r, k])


@launcher("linear_bf16")
def linear_bf16_cuda(X, W, out, R):
    """``linear`` with W as bf16 bits; the same bits as ``linear`` on the widened weights."""
    N, K = W.shape
    if dispatch.pick("linear", R) == "gemv":
        launch(gemv_bf16_k, (N + GEMV_WARPS - 1) // GEMV_WARPS, 32 * GEMV_WARPS, X, W, out, R)
        return
    rows = max(1, min(N, WIDEN_ELEMS // K))
    buf = scratch("linear_bf16.widened", rows * K)
    for n0 in range(0, N, rows):
        n = min(rows, N - n0)
        Wf = buf[:n * K].reshape(n, K)
        launch(widen_bf16_k, *grid1(n * K), W, n0, Wf, n)
        gemm(X, Wf, out[:, n0:n0 + n], R)
