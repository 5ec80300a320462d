"""The gated DeltaNet: ``gdn_prep`` (q/k L2 norms, q scale, beta, g) and ``gdn_recurrence`` (the
gated delta rule, token by token for every schedule, DESIGN.md §3.6).

``gdn_prep`` shapes: QKV[:, :2·kd] = q ‖ k (kd = hk·dk); BA = b (nv) ‖ a (nv); out Qn, Kn [R, kd],
beta, g [R, nv]. ``q ← q/‖q‖·qscale``, ``k ← k/‖k‖`` (``1/sqrt(Σx² + 1e-6)``, the dot in the
canonical order), ``beta = sigmoid(b)``, ``g = −exp(A_log)·softplus(a + dt_bias)``.

``gdn_recurrence`` shapes: Qn, Kn [R, hk·dk]; V[:, vo:] [R, nv·dv]; g, beta [R, nv]; S [nv, dk, dv]
(updated); out [R, nv·dv]; value head h reads key head h // vpk. Per value head h and state
column j, per token: ``S[:, j] ← S[:, j]·exp(g)`` (:func:`gdn_decay`); ``δ = (v − S[:, j]·k)·β``
(:func:`gdn_delta`); ``S[:, j] ← S[:, j] + k·δ`` (:func:`gdn_update`, fma); ``o = S[:, j]·q``.
Both dots are the canonical one. With ``capture``, cap[t, h, :, j] receives the column after
token t.

- ``gdn_recurrence_cpu`` (twin) and ``gdn_recurrence_naive`` (CUDA, one thread per column, state
  in global memory) run :func:`gdn_column`;
- ``gdn_recurrence`` on CUDA, the fast kernel: thread (s, j) keeps rows
  s·32 … s·32+31 of column j -- dot slice s -- in registers for all tokens, computes that slice's
  partials (``fma_chain``) and every thread of the column adds the partials in slice order
  (``add_partials``): exactly the canonical dot. Grid (value head, group of ``COLS`` columns);
  block (slices, ``COLS``).
"""

from __future__ import annotations

import numpy as np

from .exact import (F32, L2_EPS, ONE, SLICE, ZERO, add_partials, dot, dot_rows, exp32, fma_chain, row_col, sigmoid32,
                    softplus32)
from .tags import barrier, body, cuda, fma, fmul, grid1, kernel, launch, launcher, prange, sqrt32, twin

COLS = 32  # state columns per block of the fast recurrence
MAX_DK = 256  # key head dim of the fast recurrence (its slices live in a block)
MAX_SLICES = MAX_DK // SLICE


# ------------------------------------------------------------------------------------------------
# gdn_prep
# ------------------------------------------------------------------------------------------------
@body
def l2_inv(X, r, off, n):
    """1 / sqrt(Σ x² + 1e-6) over X[r, off:off+n] (FLA's l2norm)."""
    return ONE / sqrt32(dot_rows(X, r, off, X, r, off, n) + L2_EPS)


@body
def qk_norm_head(QKV, kd, dk, qscale, Qn, Kn, r, h):
    """Key head h of row r: q·inv_q·qscale into Qn, k·inv_k into Kn."""
    o = h * dk
    iq = l2_inv(QKV, r, o, dk)
    ik = l2_inv(QKV, r, kd + o, dk)
    for i in range(dk):
        Qn[r, o + i] = fmul(fmul(QKV[r, o + i], iq), qscale)
        Kn[r, o + i] = fmul(QKV[r, kd + o + i], ik)


@body
def beta_g_at(BA, nv, A_log, dt_bias, beta, g, r, h):
    """Value head h of row r: beta = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias)."""
    beta[r, h] = sigmoid32(BA[r, h])
    g[r, h] = fmul(-exp32(A_log[h]), softplus32(BA[r, nv + h] + dt_bias[h]))


@twin("gdn_prep")
def gdn_prep_cpu(QKV, kd, hk, dk, BA, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R):
    """L2-normalise q and k per key head (q also · qscale) from QKV[:, :2kd]; beta = sigmoid(b),
    g = −exp(A_log)·softplus(a + dt_bias) from BA = [b (nv) ‖ a (nv)]."""
    for r in range(R):
        for h in range(hk):
            qk_norm_head(QKV, kd, dk, qscale, Qn, Kn, r, h)
        for h in range(nv):
            beta_g_at(BA, nv, A_log, dt_bias, beta, g, r, h)


@kernel
def gdn_prep_k(QKV, kd, hk, dk, BA, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R):
    i = cuda.grid(1)
    if i < R * hk:
        r, h = row_col(i, hk)
        qk_norm_head(QKV, kd, dk, qscale, Qn, Kn, r, h)
    if i < R * nv:
        r, h = row_col(i, nv)
        beta_g_at(BA, nv, A_log, dt_bias, beta, g, r, h)


@launcher("gdn_prep")
def gdn_prep_cuda(QKV, kd, hk, dk, BA, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R):
    """One thread per (row, key head) and per (row, value head)."""
    launch(gdn_prep_k, *grid1(R * max(hk, nv)), QKV, kd, hk, dk, BA, nv, A_log, dt_bias, F32(qscale), Qn, Kn, beta,
           g, R)


# ------------------------------------------------------------------------------------------------
# the recurrence
# ------------------------------------------------------------------------------------------------
@body
def gdn_decay(col, n, eg):
    """col[i] ← col[i]·exp(g) for i < n (a state column, or one slice of it)."""
    for i in range(n):
        col[i] = fmul(col[i], eg)


@body
def gdn_delta(v, kv, b):
    """δ = (v − Sᵀk)·β."""
    return fmul(v - kv, b)


@body
def gdn_update(col, k, n, delta):
    """col[i] ← col[i] + k[i]·δ (fma) for i < n."""
    for i in range(n):
        col[i] = fma(k[i], delta, col[i])


@body
def gdn_column(Q, K_, V, vo, G, Beta, S, out, h, j, hk, dk, dv, T, cap, capture):
    """The gated delta rule for value head h, state column j, over T rows (key head hk)."""
    ko = hk * dk
    col = S[h, :, j]
    for t in range(T):
        gdn_decay(col, dk, exp32(G[t, h]))
        delta = gdn_delta(V[t, vo + h * dv + j], dot(col, K_[t, ko:], dk), Beta[t, h])
        gdn_update(col, K_[t, ko:], dk, delta)
        out[t, h * dv + j] = dot(col, Q[t, ko:], dk)
        if capture:
            for i in range(dk):
                cap[t, h, i, j] = col[i]


@twin("gdn_recurrence", parallel=True)
def gdn_recurrence_cpu(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    """Gated delta rule over R rows; value head h reads key head h // vpk. V[:, vo:] holds the
    values (a column window of the conv output)."""
    nv = S.shape[0]
    for hj in prange(nv * dv):
        h = hj // dv
        j = hj - h * dv
        gdn_column(Qn, Kn, V, vo, g, beta, S, out, h, j, h // vpk, dk, dv, R, cap, capture)


@kernel
def gdn_recurrence_naive_k(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    i = cuda.grid(1)
    if i < S.shape[0] * dv:
        h, j = row_col(i, dv)
        gdn_column(Qn, Kn, V, vo, g, beta, S, out, h, j, h // vpk, dk, dv, R, cap, capture)


@kernel
def gdn_recurrence_fast_k(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    h = cuda.blockIdx.x
    s = cuda.threadIdx.x  # slice
    jl = cuda.threadIdx.y
    j = cuda.blockIdx.y * COLS + jl
    nsl = cuda.blockDim.x
    ko = (h // vpk) * dk
    ks = cuda.shared.array(MAX_DK, np.float32)
    qs = cuda.shared.array(MAX_DK, np.float32)
    ps = cuda.shared.array((MAX_SLICES, COLS), np.float32)
    st = cuda.local.array(SLICE, np.float32)
    i0 = s * SLICE
    n = min(SLICE, dk - i0)
    live = j < dv
    if live:
        for ii in range(n):
            st[ii] = S[h, i0 + ii, j]
    tid = jl * nsl + s
    for t in range(R):
        for i in range(tid, dk, nsl * COLS):
            ks[i] = Kn[t, ko + i]
            qs[i] = Qn[t, ko + i]
        barrier()
        part = ZERO
        if live:
            gdn_decay(st, n, exp32(g[t, h]))
            part = fma_chain(st, ks[i0:], n, 0)
        ps[s, jl] = part
        barrier()
        kv = add_partials(ZERO, ps[:, jl], nsl)
        barrier()
        part = ZERO
        if live:
            gdn_update(st, ks[i0:], n, gdn_delta(V[t, vo + h * dv + j], kv, beta[t, h]))
            part = fma_chain(st, qs[i0:], n, 0)
            if capture:
                for ii in range(n):
                    cap[t, h, i0 + ii, j] = st[ii]
        ps[s, jl] = part
        barrier()
        if live and s == 0:
            out[t, h * dv + j] = add_partials(ZERO, ps[:, jl], nsl)
        barrier()
    if live:
        for ii in range(n):
            S[h, i0 + ii, j] = st[ii]


@launcher(of="gdn_recurrence")
def gdn_recurrence_naive(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    """One thread per state column, state in global memory (the reference launch)."""
    launch(gdn_recurrence_naive_k, *grid1(S.shape[0] * dv, 64), Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap,
           capture)


@launcher("gdn_recurrence")
def gdn_recurrence_cuda(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    """Same contract as the twin: the fast kernel, state columns in registers, one thread per
    (column, dot slice)."""
    if dk > MAX_DK:
        raise ValueError(f"linear_key_head_dim {dk} > {MAX_DK} is not supported by the CUDA recurrence")
    grid = (S.shape[0], (dv + COLS - 1) // COLS)
    launch(gdn_recurrence_fast_k, grid, ((dk + SLICE - 1) // SLICE, COLS), Qn, Kn, V, vo, g, beta, S, out, R, dk, dv,
           vpk, cap, capture)
