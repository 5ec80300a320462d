"""Mixture of experts: ``moe_route`` (softmax router, top-k), ``moe_up`` / ``moe_down`` (the
routed experts' SwiGLU) and ``moe_combine`` (the weighted sum, then the gated shared expert).

Shapes: L [R, E] router logits → P [R, E] (scratch), idx [R, k] (int32), wts [R, k];
X [R, H]; G2, U2 [E·I, H] (expert e's rows e·I …); act [R·k, I]; D2 [E·H, I]; y [R·k, H];
SH [R, H] the shared expert's output, sgl [R, 1] its gate logit; out [R, H].

Routing: softmax in float32, then top-k with ties to the lowest index, optionally renormalised
(:func:`route_row`). Experts: ``act = silu(x·g)·(x·u)``, ``y = act·d`` with canonical dots.
Combine: ``Σ_q wts[q]·y[q]`` as an fma chain in rank order, then ``+ sigmoid(sgl)·SH`` (fma). The
twins loop over outputs; the CUDA kernels run one thread per output (one per row for routing).

``moe_up_bf16`` / ``moe_down_bf16``: the same with the expert matrices as bf16 bits (uint16),
widened in registers (:func:`numba_kernels.exact.dot_rows_w16`): the float32 ops' bits on the
widened weights.
"""

from __future__ import annotations

from .exact import ONE, ZERO, dot_rows, dot_rows_w16, exp32, fma_chain, row_col, sigmoid32, silu32
from .tags import body, cuda, fma, fmul, grid1, kernel, launch, launcher, prange, twin


@body
def route_row(L, r, E, topk, renorm, P, idx, wts):
    """Softmax over L[r, :E] into P[r], then top-k (ties to the lowest index) into idx[r], wts[r]
    in descending order, renormalised over the k when ``renorm``."""
    m = L[r, 0]
    for e in range(1, E):
        if L[r, e] > m:
            m = L[r, e]
    s = ZERO
    for e in range(E):
        p = exp32(L[r, e] - m)
        P[r, e] = p
        s = s + p
    for e in range(E):
        P[r, e] = P[r, e] / s
    for q in range(topk):
        best = -1
        for e in range(E):
            if P[r, e] >= ZERO and (best < 0 or P[r, e] > P[r, best]):
                best = e
        idx[r, q] = best
        wts[r, q] = P[r, best]
        P[r, best] = -ONE
    if renorm:
        t = ZERO
        for q in range(topk):
            t = t + wts[r, q]
        for q in range(topk):
            wts[r, q] = wts[r, q] / t


@twin("moe_route")
def moe_route_cpu(L, topk, renorm, P, idx, wts, R):
    for r in range(R):
        route_row(L, r, L.shape[1], topk, renorm, P, idx, wts)


@kernel
def moe_route_k(L, topk, renorm, P, idx, wts, R):
    r = cuda.grid(1)
    if r < R:
        route_row(L, r, L.shape[1], topk, renorm, P, idx, wts)


@launcher("moe_route")
def moe_route_cuda(L, topk, renorm, P, idx, wts, R):
    """One thread per row."""
    launch(moe_route_k, *grid1(R, 32), L, topk, renorm, P, idx, wts, R)


@body
def moe_up_at(X, G2, U2, idx, I, act, rq, i):
    """act[rq, i] for rank q of row r (rq = r·k + q): silu(dot(x_r, G[e, i]))·dot(x_r, U[e, i])."""
    k = idx.shape[1]
    r = rq // k
    row = idx[r, rq - r * k] * I + i
    H = X.shape[1]
    act[rq, i] = fmul(silu32(dot_rows(X, r, 0, G2, row, 0, H)), dot_rows(X, r, 0, U2, row, 0, H))


@twin("moe_up", parallel=True)
def moe_up_cpu(X, G2, U2, idx, I, act, R):
    """act[r·k + q, i] = silu(dot(x_r, G[e, i])) · dot(x_r, U[e, i]) for e = idx[r, q];
    G2, U2: [E·I, H]."""
    for rqi in prange(R * idx.shape[1] * I):
        rq = rqi // I
        moe_up_at(X, G2, U2, idx, I, act, rq, rqi - rq * I)


@kernel
def moe_up_k(X, G2, U2, idx, I, act, R):
    i = cuda.grid(1)
    if i < R * idx.shape[1] * I:
        rq, c = row_col(i, I)
        moe_up_at(X, G2, U2, idx, I, act, rq, c)


@launcher("moe_up")
def moe_up_cuda(X, G2, U2, idx, I, act, R):
    launch(moe_up_k, *grid1(R * idx.shape[1] * I), X, G2, U2, idx, I, act, R)


@body
def moe_down_at(act, D2, idx, H, y, rq, d):
    """y[rq, d] = dot(act[rq], Dn[e, d]) for the expert e of rank q of row r (rq = r·k + q)."""
    k = idx.shape[1]
    r = rq // k
    y[rq, d] = dot_rows(act, rq, 0, D2, idx[r, rq - r * k] * H + d, 0, act.shape[1])


@twin("moe_down", parallel=True)
def moe_down_cpu(act, D2, idx, H, y, R):
    """y[r·k + q, d] = dot(act[r·k + q], Dn[e, d]); D2: [E·H, I]."""
    for rqd in prange(R * idx.shape[1] * H):
        rq = rqd // H
        moe_down_at(act, D2, idx, H, y, rq, rqd - rq * H)


@kernel
def moe_down_k(act, D2, idx, H, y, R):
    i = cuda.grid(1)
    if i < R * idx.shape[1] * H:
        rq, d = row_col(i, H)
        moe_down_at(act, D2, idx, H, y, rq, d)


@launcher("moe_down")
def moe_down_cuda(act, D2, idx, H, y, R):
    launch(moe_down_k, *grid1(R * idx.shape[1] * H), act, D2, idx, H, y, R)


@body
def shared_gate(sgl, r, shared):
    """sigmoid(sgl[r, 0]), the shared expert's gate of row r (0 without a shared expert)."""
    return sigmoid32(sgl[r, 0]) if shared else ZERO


@body
def combine_at(y, wts, SH, sg, shared, out, r, d):
    """out[r, d] = Σ_q wts[r, q]·y[r·k + q, d] (fma chain in rank order) + sg·SH[r, d] (fma)."""
    k = wts.shape[1]
    a = fma_chain(wts[r], y[r * k:, d], k, 0)
    if shared:
        a = fma(sg, SH[r, d], a)
    out[r, d] = a


@twin("moe_combine")
def moe_combine_cpu(y, wts, SH, sgl, shared, out, R):
    """out[r] = Σ_q wts[r, q]·y[r·k + q] (rank order, fma) then + sigmoid(sgl[r, 0])·SH[r]."""
    for r in range(R):
        sg = shared_gate(sgl, r, shared)
        for d in range(out.shape[1]):
            combine_at(y, wts, SH, sg, shared, out, r, d)


@kernel
def moe_combine_k(y, wts, SH, sgl, shared, out, R):
    i = cuda.grid(1)
    if i < R * out.shape[1]:
        r, d = row_col(i, out.shape[1])
        combine_at(y, wts, SH, shared_gate(sgl, r, shared), shared, out, r, d)


@launcher("moe_combine")
def moe_combine_cuda(y, wts, SH, sgl, shared, out, R):
    launch(moe_combine_k, *grid1(R * out.shape[1]), y, wts, SH, sgl, shared, out, R)


# ------------------------------------------------------------------------------------------------
# experts as bf16 bits
# ------------------------------------------------------------------------------------------------
@body
def moe_up_at_w16(X, G2, U2, idx, I, act, rq, i):
    """:func:`moe_up_at` with G2, U2 as bf16 bits."""
    k = idx.shape[1]
    r = rq // k
    row = idx[r, rq - r * k] * I + i
    H = X.shape[1]
    act[rq, i] = fmul(silu32(dot_rows_w16(X, r, 0, G2, row, 0, H)), dot_rows_w16(X, r, 0, U2, row, 0, H))


@body
def moe_down_at_w16(act, D2, idx, H, y, rq, d):
    """:func:`moe_down_at` with D2 as bf16 bits."""
    k = idx.shape[1]
    r = rq // k
    y[rq, d] = dot_rows_w16(act, rq, 0, D2, idx[r, rq - r * k] * H + d, 0, act.shape[1])


@twin("moe_up_bf16", parallel=True)
def moe_up_bf16_cpu(X, G2, U2, idx, I, act, R):
    """``moe_up`` with G2, U2 [E·I, H] as bf16 bits."""
    for rqi in prange(R * idx.shape[1] * I):
        rq = rqi // I
        moe_up_at_w16(X, G2, U2, idx, I, act, rq, rqi - rq * I)


@kernel
def moe_up_bf16_k(X, G2, U2, idx, I, act, R):
    i = cuda.grid(1)
    if i < R * idx.shape[1] * I:
        rq, c = row_col(i, I)
        moe_up_at_w16(X, G2, U2, idx, I, act, rq, c)


@launcher("moe_up_bf16")
def moe_up_bf16_cuda(X, G2, U2, idx, I, act, R):
    launch(moe_up_bf16_k, *grid1(R * idx.shape[1] * I), X, G2, U2, idx, I, act, R)


@twin("moe_down_bf16", parallel=True)
def moe_down_bf16_cpu(act, D2, idx, H, y, R):
    """``moe_down`` with D2 [E·H, I] as bf16 bits."""
    for rqd in prange(R * idx.shape[1] * H):
        rq = rqd // H
        moe_down_at_w16(act, D2, idx, H, y, rq, rqd - rq * H)


@kernel
def moe_down_bf16_k(act, D2, idx, H, y, R):
    i = cuda.grid(1)
    if i < R * idx.shape[1] * H:
        rq, d = row_col(i, H)
        moe_down_at_w16(act, D2, idx, H, y, rq, d)


@launcher("moe_down_bf16")
def moe_down_bf16_cuda(act, D2, idx, H, y, R):
    launch(moe_down_bf16_k, *grid1(R * idx.shape[1] * H), act, D2, idx, H, y, R)
