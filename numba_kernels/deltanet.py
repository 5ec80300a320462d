"""The gated DeltaNet: ``gdn_prep`` (q/k L2 norms, q scale, beta, g) and ``gdn_recurrence`` (the
gated delta rule, token by token for every schedule, DESIGN.md §3.6).

``gdn_prep`` shapes: QKV[:, :2·kd] = q ‖ k (kd = hk·dk); BA[:, bo:] = b (nv) ‖ a (nv); out Qn, Kn [R, kd],
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
- ``gdn_recurrence_fast`` (CUDA, every row count), generated per head dims (:func:`gdn_source`,
  :class:`GdnCfg`): thread (slice s, column j) keeps rows s·32 … s·32+31 of column j -- dot slice
  s -- in registers for all tokens and computes that slice's chain; the slices of a column live
  in one warp, which gathers the partials by shuffles and adds them in slice order: exactly the
  canonical dot. The inputs of a chunk of rows are staged in shared memory while the previous
  chunk runs. H200: 0.285 µs per token and layer at 4096 rows of bench-8l, 22.8× the previous
  kernel (``receipts/probes/h200-probe-gdn.log``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from . import dispatch
from .exact import F32, L2_EPS, ONE, SLICE, dot, dot_rows, exp32, row_col, sigmoid32, softplus32
from .norms import NORM_THREADS, PS_WORDS, block_sumsq2
from .tags import (STATIC_SMEM, KernelSource, block_size, body, cuda, fma, fmul, generated, generator, grid1, kernel,
                   launch, launcher, pdl_on, pdl_trigger, prange, sqrt32, twin)

MAX_DK = 256  # key head dim of the fast recurrence (a column's slices live in one warp)


# ------------------------------------------------------------------------------------------------
# gdn_prep
# ------------------------------------------------------------------------------------------------
@body
def l2_scale(ss):
    """1 / sqrt(ss + 1e-6) (FLA's l2norm; ``ss``: the canonical dot of a head with itself)."""
    return ONE / sqrt32(ss + L2_EPS)


@body
def l2_inv(X, r, off, n):
    """1 / sqrt(Σ x² + 1e-6) over X[r, off:off+n]."""
    return l2_scale(dot_rows(X, r, off, X, r, off, n))


@body
def qk_norm_span(QKV, kd, dk, qscale, Qn, Kn, r, h, iq, ik, i0, step):
    """Key head h of row r, elements i in range(i0, dk, step): q·iq·qscale into Qn, k·ik into Kn."""
    ru = np.uint64(r)
    o = np.uint64(h * dk)
    ko = np.uint64(kd + h * dk)
    i = np.uint64(i0)
    while i < np.uint64(dk):  # unsigned: no negative-index wrap code
        Qn[ru, o + i] = fmul(fmul(QKV[ru, o + i], iq), qscale)
        Kn[ru, o + i] = fmul(QKV[ru, ko + i], ik)
        i += np.uint64(step)


@body
def qk_norm_head(QKV, kd, dk, qscale, Qn, Kn, r, h):
    """Key head h of row r: q·inv_q·qscale into Qn, k·inv_k into Kn."""
    o = h * dk
    qk_norm_span(QKV, kd, dk, qscale, Qn, Kn, r, h, l2_inv(QKV, r, o, dk), l2_inv(QKV, r, kd + o, dk), 0, 1)


@body
def beta_g_at(BA, bo, nv, A_log, dt_bias, beta, g, r, h):
    """Value head h of row r: beta = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias)."""
    beta[r, h] = sigmoid32(BA[r, bo + h])
    g[r, h] = fmul(-exp32(A_log[h]), softplus32(BA[r, bo + nv + h] + dt_bias[h]))


@twin("gdn_prep")
def gdn_prep_cpu(QKV, kd, hk, dk, BA, bo, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R):
    """L2-normalise q and k per key head (q also · qscale) from QKV[:, :2kd]; beta = sigmoid(b),
    g = −exp(A_log)·softplus(a + dt_bias) from BA[:, bo:] = [b (nv) ‖ a (nv)]."""
    for r in range(R):
        for h in range(hk):
            qk_norm_head(QKV, kd, dk, qscale, Qn, Kn, r, h)
        for h in range(nv):
            beta_g_at(BA, bo, nv, A_log, dt_bias, beta, g, r, h)


@kernel
def gdn_prep_k(QKV, kd, hk, dk, BA, bo, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R):
    """One block per (row, key head): the value heads v ≡ h (mod hk) of the row's beta and g by
    the block's last threads while its first run the slice chains of the two L2 norms, side by
    side (:func:`block_sumsq2`: on a decode step, whose one row makes few blocks, the latency of
    those serial chains and of beta's and g's exp and log is the kernel's), then q and k
    normalised. Each output the twin's arithmetic; only independent work moved."""
    pdl_trigger()  # the recurrence, launched with PDL after this kernel, may load its state now
    b = cuda.blockIdx.x
    r = b // hk
    h = b - r * hk
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    ps = cuda.shared.array(PS_WORDS, np.float32)
    for v in range(h + (nt - 1 - tid) * hk, nv, nt * hk):
        beta_g_at(BA, bo, nv, A_log, dt_bias, beta, g, r, v)
    sq, sk = block_sumsq2(QKV, r, h * dk, kd + h * dk, dk, ps, tid, nt)
    qk_norm_span(QKV, kd, dk, qscale, Qn, Kn, r, h, l2_scale(sq), l2_scale(sk), tid, nt)


@launcher("gdn_prep")
def gdn_prep_cuda(QKV, kd, hk, dk, BA, bo, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R):
    """One block per (row, key head)."""
    if R * hk:
        launch(gdn_prep_k, R * hk, block_size(NORM_THREADS), QKV, kd, hk, dk, BA, bo, nv, A_log, dt_bias, F32(qscale),
               Qn, Kn, beta, g, R)


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


@launcher(of="gdn_recurrence")
def gdn_recurrence_naive(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    """One thread per state column, state in global memory (the reference launch)."""
    launch(gdn_recurrence_naive_k, *grid1(S.shape[0] * dv, 64), Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap,
           capture)


# ------------------------------------------------------------------------------------------------
# the fast recurrence (generated per head dims)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GdnCfg:
    """One configuration of the fast recurrence: head dims ``dk`` (≤ ``MAX_DK``), ``dv``; ``wpb``
    warps per block; chunks of ``tc`` rows staged in shared memory (None: the longest power of two
    ≤ 8 that fits ``STATIC_SMEM``); ``mode`` "pipe" or "rot" (:func:`gdn_source`); ``cap``: the
    kernel writes the per-row state captures; ``pdl``: the state slices are loaded before
    ``pdl_wait()``, everything else after (launched with PDL: :func:`gdn_recurrence_fast`)."""
    dk: int
    dv: int
    wpb: int = 4
    tc: int | None = None
    mode: str = "pipe"
    cap: bool = False
    pdl: bool = False

    @property
    def nsl(self):  # dot slices of a state column
        return (self.dk + SLICE - 1) // SLICE

    @property
    def nslp(self):  # that, rounded up to a power of two: the lanes of a column
        n = 1
        while n < self.nsl:
            n *= 2
        return n

    def with_pdl(self):
        """This configuration launched with PDL (a method: the launcher runs in the CUDA build's
        namespace, which holds no ``dataclasses``)."""
        return dataclasses.replace(self, pdl=True)

    cw = property(lambda c: 32 // c.nslp)  # columns per warp
    cb = property(lambda c: c.cw * c.wpb)  # columns per block
    nt = property(lambda c: 32 * c.wpb)
    grid_y = property(lambda c: (c.dv + c.cb - 1) // c.cb)

    def smem_bytes(self, tc):
        rows = 2 * tc + 1  # two chunk buffers and a pad row
        return 4 * (2 * rows * self.nsl * SLICE + rows * self.cb + 2 * rows + 2 * self.wpb * 32)

    def chunk(self):
        """The chunk length this configuration runs."""
        tc = self.tc or 8
        while self.tc is None and tc > 1 and self.smem_bytes(tc) > STATIC_SMEM:
            tc //= 2
        return tc

    def name(self):
        return (f"gdn_{self.mode}_dk{self.dk}_dv{self.dv}_w{self.wpb}_t{self.chunk()}{'_cap' if self.cap else ''}"
                f"{'_pdl' if self.pdl else ''}")

    def check(self):
        tc = self.chunk()
        if not (1 <= self.dk <= MAX_DK and self.dv >= 1 and self.mode in GDN_MODES and 1 <= self.wpb <= 32
                and tc <= self.nt and (tc % 2 == 0 or self.mode != "rot") and self.smem_bytes(tc) <= STATIC_SMEM):
            raise ValueError(f"{self}: not a valid recurrence configuration ({self.smem_bytes(tc)} B of shared memory)")
        return self


GDN_MODES = ("pipe", "rot")


@generator
def gdn_config(dk, dv, capture):
    """The configuration ``gdn_recurrence`` runs for every row count: ``pipe``, 4 warps per block,
    chunks of 8 rows (H200: 0.285 µs per token and layer at 4096 rows of bench-8l, 22.8× the
    previous kernel; 3-9× for 1-8 rows, captures included: ``receipts/probes/h200-probe-gdn.log``)."""
    return GdnCfg(dk, dv, cap=bool(capture))


_GDN_KERNEL = '''
@devf
def frow(st, kp, kc, qp, ks, qs, es, bs, vs, cap1, out1, xb, w, lane, c, live, full, ow,
         dprev, eg, bt, vv, kb, eb, vb, oip, cip, ost, cst, first):
    """rot: one row t (kp: k_{t−1}, kc: k_t; on return kp holds k_{t+1}, qp q_t)."""
    pk = F32(0.0)
    pq = F32(0.0)
    for ii in range(SL):
        if ii < LAST or full:
            x = fma(kp[ii], dprev, st[ii])
            if CAP and live:
                cap1[cip + U(ii * DV)] = x
            pq = fma(x, qp[ii], pq)
            y = fmul(x, eg)
            st[ii] = y
            pk = fma(y, kc[ii], pk)
    for ii in range(SL):
        qp[ii] = qs[U(kb + ii)]
        kp[ii] = ks[U(kb + DKP + ii)]
    egn = es[U(eb + 1)]
    btn = bs[U(eb + 1)]
    vvn = vs[U(vb + CB)]
    xput(xb, w, lane, pk, pq)
    kv = F32(0.0)
    for s2 in range(NSL):
        kv = kv + xget(xb, w, 0, pk, s2 * CW + c)
    o = F32(0.0)
    for s2 in range(NSL):
        o = o + xget(xb, w, 1, pq, s2 * CW + c)
    xdone(xb)
    if ow:
        out1[oip] = o
    dn = fmul(vv - kv, bt)
    if not first:
        oip += ost
        cip += cst
    return dn, egn, btn, vvn, oip, cip


@devf
def ffinish(st, kp, qp, cap1, xb, w, lane, c, live, full, dprev, cip):
    """rot: the last row's update (and capture); returns its Sᵀq."""
    pq = F32(0.0)
    for ii in range(SL):
        if ii < LAST or full:
            x = fma(kp[ii], dprev, st[ii])
            if CAP and live:
                cap1[cip + U(ii * DV)] = x
            st[ii] = x
            pq = fma(x, qp[ii], pq)
    xput(xb, w, lane, pq, pq)
    o = F32(0.0)
    for s2 in range(NSL):
        o = o + xget(xb, w, 0, pq, s2 * CW + c)
    xdone(xb)
    return o


@devf
def stage_issue(Kn, Qn, V, g, beta, rk, rq, rv, t1, rlast, w, lane, tid, h, ko, uk, uv, jb):
    """Load rows t1 … t1+TC−1 (clamped to the last row) of k, q (key head), v (the block's columns),
    g and beta (value head h) into registers; rows of a chunk round-robin over warps, lanes along a
    row. Returns (g, beta) of row t1 + tid."""
    for r in range(RPW):
        tg = U(min(t1 + w + r * WPB, rlast))
        for u in range(NSL):
            ui = U(ko) + U(min(lane + u * 32, DK - 1)) if RAGGED else uk + U(u * 32)
            rk[r * NSL + u] = Kn[tg, ui]
            rq[r * NSL + u] = Qn[tg, ui]
        for u in range(NVU):
            rv[r * NVU + u] = V[tg, uv + U(min(jb + lane + u * 32, DV - 1))]
    tg = U(min(t1 + min(tid, TC - 1), rlast))
    return g[tg, U(h)], beta[tg, U(h)]


@devf
def stage_store(ks, qs, vs, es, bs, rk, rq, rv, gx, bx, buf, t1, R32, w, lane, tid, jb):
    """Store what stage_issue loaded into chunk buffer ``buf`` (zeros past R, dk, dv; eg = exp32(g))."""
    kb1 = buf * (TC * DKP)
    vb1 = buf * (TC * CB)
    for r in range(RPW):
        tl = w + r * WPB
        if tl < TC:
            okr = t1 + tl < R32
            for u in range(NSL):
                i = lane + u * 32
                ok = okr and (i < DK or not RAGGED)
                ks[U(kb1 + tl * DKP + i)] = rk[r * NSL + u] if ok else F32(0.0)
                qs[U(kb1 + tl * DKP + i)] = rq[r * NSL + u] if ok else F32(0.0)
            for u in range(NVU):
                cc = lane + u * 32
                if CBW or cc < CB:
                    ok = okr and jb + cc < DV
                    vs[U(vb1 + tl * CB + cc)] = rv[r * NVU + u] if ok else F32(0.0)
    if tid < TC:
        ok = t1 + tid < R32
        es[U(buf * TC + tid)] = exp32(gx) if ok else F32(0.0)
        bs[U(buf * TC + tid)] = bx if ok else F32(0.0)


def kern(Qn, Kn, V, vo, g, beta, S1, out1, ostride, R, vpk, cap1, cstride):
    ks = cuda.shared.array(NK, np.float32, alignment=ALIGN)  # k rows [2·TC+1][DKP]
    qs = cuda.shared.array(NK, np.float32, alignment=ALIGN)  # q rows
    vs = cuda.shared.array(NV, np.float32, alignment=ALIGN)  # v [2·TC+1][CB]
    es = cuda.shared.array(TR, np.float32, alignment=ALIGN)  # exp32(g)
    bs = cuda.shared.array(TR, np.float32, alignment=ALIGN)  # beta
    xb = cuda.shared.array((2, WPB, 32), np.float32, alignment=ALIGN)  # the simulator's gather only
    st = cuda.local.array(SL, np.float32)  # b_s: the state slice
    kc = cuda.local.array(SL, np.float32)  # b_k: k slice of this row
    kp = cuda.local.array(SL, np.float32)  # rot: k slice of the previous row
    qp = cuda.local.array(SL, np.float32)  # q slice of the previous row
    rk = cuda.local.array(MKQ, np.float32)  # chunk n+1 in flight
    rq = cuda.local.array(MKQ, np.float32)
    rv = cuda.local.array(MV, np.float32)

    h = I32(cuda.blockIdx.x)
    tid = I32(cuda.threadIdx.x)
    w = tid >> 5
    lane = tid & 31
    s = lane // CW
    c = lane & (CW - 1)
    cl = w * CW + c
    jb = I32(cuda.blockIdx.y) * CB
    j = jb + cl
    R32 = I32(R)
    rlast = R32 - 1
    ko = (h // I32(vpk)) * DK
    vh = I32(vo) + h * DV
    real = s < NSL
    live = real and (DVFULL or j < DV)
    i0 = (s if real else I32(0)) * SL
    full = s < NSL - 1  # all 32 rows of the slice are real (read only when RAGGED)
    ow = s == 0 and (DVFULL or j < DV)  # this lane writes out[:, h·dv + j]
    uk = U(ko) + U(lane)
    uv = U(vh)
    sb = U(h * DK + i0) * U(DV) + U(j)  # flat index of S[h, i0, j] (= cap[0, h, i0, j])
    oip = U(h * DV + j)  # flat index of out[0, h·dv + j]
    cip = sb
    ost = U(ostride)
    cst = U(cstride)

    for ii in range(SL):
        st[ii] = F32(0.0)
        kc[ii] = F32(0.0)
        kp[ii] = F32(0.0)
        qp[ii] = F32(0.0)
    if live:
        for ii in range(SL):
            if ii < LAST or full:
                st[ii] = S1[sb + U(ii * DV)]
    if PDL:  # the state is no output of the kernel before (gdn_prep): its loads go first
        pdl_wait()

    # ---- chunk 0 into buffer 0 (all its loads in flight together with the state's)
    gx, bx = stage_issue(Kn, Qn, V, g, beta, rk, rq, rv, I32(0), rlast, w, lane, tid, h, ko, uk, uv, jb)
    stage_store(ks, qs, vs, es, bs, rk, rq, rv, gx, bx, I32(0), I32(0), R32, w, lane, tid, jb)
    cuda.syncthreads()

    dprev = NEG0  # rot: δ of the previous row (before row 0: fma(0, −0, s) = s exactly)
    nch = (R32 + (TC - 1)) // TC
    for n in range(nch):
        b = I32(n & 1)
        t0 = I32(n * TC)
        t1 = I32(t0 + TC)
        nxt = t1 < R32
        # ---- issue the loads of chunk n+1 (clamped addresses, no branches)
        gx = F32(0.0)
        bx = F32(0.0)
        if nxt:
            gx, bx = stage_issue(Kn, Qn, V, g, beta, rk, rq, rv, t1, rlast, w, lane, tid, h, ko, uk, uv, jb)

        # ---- the rows of chunk n
        ntok = I32(min(TC, R32 - t0))
        kb = I32(b * (TC * DKP) + i0)
        vb = I32(b * (TC * CB) + cl)
        eb = I32(b * TC)
        if ROT:
            # k_{t−1} and k_t alternate between kp and kc: rows with even t use (kp, kc), odd (kc, kp)
            for ii in range(SL):
                kc[ii] = ks[U(kb + ii)]
            eg = es[U(eb)]
            bt = bs[U(eb)]
            vv = vs[U(vb)]
            for pr in range(ntok >> 1):
                dprev, eg, bt, vv, oip, cip = frow(st, kp, kc, qp, ks, qs, es, bs, vs, cap1, out1, xb, w, lane, c,
                                                   live, full, ow, dprev, eg, bt, vv, kb, eb, vb, oip, cip,
                                                   ost, cst, t0 + 2 * pr == 0)
                kb = I32(kb + DKP)
                eb = I32(eb + 1)
                vb = I32(vb + CB)
                dprev, eg, bt, vv, oip, cip = frow(st, kc, kp, qp, ks, qs, es, bs, vs, cap1, out1, xb, w, lane, c,
                                                   live, full, ow, dprev, eg, bt, vv, kb, eb, vb, oip, cip,
                                                   ost, cst, False)
                kb = I32(kb + DKP)
                eb = I32(eb + 1)
                vb = I32(vb + CB)
            if ntok & 1:
                dprev, eg, bt, vv, oip, cip = frow(st, kp, kc, qp, ks, qs, es, bs, vs, cap1, out1, xb, w, lane, c,
                                                   live, full, ow, dprev, eg, bt, vv, kb, eb, vb, oip, cip,
                                                   ost, cst, t0 + ntok - 1 == 0)
        else:  # pipe
            for tt in range(ntok):
                eg = es[U(eb)]
                bt = bs[U(eb)]
                vv = vs[U(vb)]
                for ii in range(SL):
                    kc[ii] = ks[U(kb + ii)]
                pk = F32(0.0)
                pq = F32(0.0)
                for ii in range(SL):
                    if ii < LAST or full:
                        x = st[ii]
                        pq = fma(x, qp[ii], pq)
                        y = fmul(x, eg)
                        st[ii] = y
                        pk = fma(y, kc[ii], pk)
                for ii in range(SL):
                    qp[ii] = qs[U(kb + ii)]
                xput(xb, w, lane, pk, pq)
                kv = F32(0.0)
                for s2 in range(NSL):
                    kv = kv + xget(xb, w, 0, pk, s2 * CW + c)
                o = F32(0.0)
                for s2 in range(NSL):
                    o = o + xget(xb, w, 1, pq, s2 * CW + c)
                xdone(xb)
                if ow:
                    out1[oip] = o  # row t−1 (before row 0: row 0, rewritten)
                delta = fmul(vv - kv, bt)
                for ii in range(SL):
                    if ii < LAST or full:
                        st[ii] = fma(kc[ii], delta, st[ii])
                if CAP and live:
                    for ii in range(SL):
                        if ii < LAST or full:
                            cap1[cip + U(ii * DV)] = st[ii]
                cip += cst
                if t0 + tt > 0:
                    oip += ost
                kb = I32(kb + DKP)
                eb = I32(eb + 1)
                vb = I32(vb + CB)

        # ---- chunk n+1 into the other buffer
        if nxt:
            stage_store(ks, qs, vs, es, bs, rk, rq, rv, gx, bx, I32(1 - b), t1, R32, w, lane, tid, jb)
            cuda.syncthreads()

    # ---- finish the last row (rot: its update; both: its output), the state back
    if ROT:
        if (R32 - 1) & 1:
            o = ffinish(st, kp, qp, cap1, xb, w, lane, c, live, full, dprev, cip)  # last row odd: its k in kp
        else:
            o = ffinish(st, kc, qp, cap1, xb, w, lane, c, live, full, dprev, cip)
        if ow:
            out1[oip] = o
    else:
        pq = F32(0.0)
        for ii in range(SL):
            if ii < LAST or full:
                pq = fma(st[ii], qp[ii], pq)
        xput(xb, w, lane, pq, pq)
        o = F32(0.0)
        for s2 in range(NSL):
            o = o + xget(xb, w, 0, pq, s2 * CW + c)
        xdone(xb)
        if ow:
            out1[oip] = o
    if live:
        for ii in range(SL):
            if ii < LAST or full:
                S1[sb + U(ii * DV)] = st[ii]
'''


@generator
def gdn_source(c: GdnCfg) -> KernelSource:
    """The recurrence kernel of configuration ``c``:
    ``kern(Qn, Kn, V, vo, g, beta, S1, out1, ostride, R, vpk, cap1, cstride)`` with S, out and cap
    flattened (``ostride``: out's row stride; ``cstride``: one capture's size).

    - A state column S[h, :, j] is split by the canonical dot slices (32 rows each, NSL of them).
      Thread (slice s, column j) keeps its 32 rows in registers for all R rows. The slices of a
      column live in ONE warp: lane = s·CW + c (CW = 32 / NSLP columns per warp, NSLP = NSL rounded
      up to a power of two; lanes of phantom slices s ≥ NSL compute nothing that is kept). The slice
      partials of Sᵀk and Sᵀq are gathered with ``shfl_sync`` (``xget``) and added in slice order
      from +0 by every lane -- exactly the canonical dot -- so no block barrier per row. A block
      holds WPB warps = CB = CW·WPB columns of one value head; grid (Hv, ⌈dv / CB⌉).
    - What a row needs that does not depend on the state (k and q of the key head, v of the block's
      columns, eg = exp32(g) -- the same function on the same input, so the same bits -- and beta)
      is staged per chunk of TC rows in shared memory, double-buffered: the loads of chunk n+1 are
      issued into registers when chunk n starts and stored to the other buffer when it ends; one
      ``syncthreads`` per chunk.
    - ``mode``, how a row's four passes over the slice (scale by eg, Sᵀk chain, update, Sᵀq chain)
      are scheduled; both give the twin's bits. ``pipe``: out[t−1] = S_{t−1}ᵀq_{t−1} is computed
      in row t, interleaved with row t's scale and Sᵀk chain (both read S_{t−1}), so the output
      dot leaves the recurrence's critical path. ``rot``: also the update of row t−1
      (S = fma(k_{t−1}, δ_{t−1}, S)) runs element by element inside row t's chain (one pass per
      row; before row 0, fma(0, −0, s) = s exactly for every s), k_{t−1} and k_t rotating between
      two register arrays.
    - Every array index is unsigned (no negative-index wraparound) and dk, dv are baked in."""
    c.check()
    tc = c.chunk()
    NSL, CW, CB, DK, DV = c.nsl, c.cw, c.cb, c.dk, c.dv
    RPW = (tc + c.wpb - 1) // c.wpb  # chunk rows staged per warp
    NVU = (CB + 31) // 32  # v elements per lane and row
    consts = dict(DK=DK, DV=DV, SL=SLICE, NSL=NSL, CW=CW, DKP=NSL * SLICE, LAST=DK - (NSL - 1) * SLICE,
                  RAGGED=DK % SLICE != 0, WPB=c.wpb, TC=tc, CB=CB, DVFULL=DV % CB == 0, RPW=RPW, NVU=NVU,
                  CBW=CB % 32 == 0, MKQ=RPW * NSL, MV=RPW * NVU, TR=2 * tc + 1, NK=(2 * tc + 1) * NSL * SLICE,
                  NV=(2 * tc + 1) * CB, ROT=c.mode == "rot", CAP=c.cap, PDL=c.pdl)
    prelude = ["U = np.uint64  # array indices: unsigned, so Numba emits no negative-index wraparound",
               "I32 = np.int32", "NEG0 = F32(-0.0)"] + [f"{k} = {v!r}" for k, v in consts.items()]
    return KernelSource(c.name(), "\n".join(prelude) + "\n" + _GDN_KERNEL, c.nt)


@launcher(of="gdn_recurrence")
def gdn_recurrence_fast(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture, cfg=None):
    """The fast recurrence (``cfg``: a :class:`GdnCfg`, default :func:`gdn_config`'s). S, out and
    cap C-contiguous."""
    if R <= 0:
        return
    nv = S.shape[0]
    c = cfg or gdn_config(dk, dv, capture)
    if c.cap != bool(capture) or (c.dk, c.dv) != (dk, dv) or S.shape[1:] != (dk, dv):
        raise ValueError(f"gdn_recurrence_fast: {c} cannot run S {S.shape}, capture={capture}")
    if cfg is None and pdl_on():  # a captured step launches it with PDL (launch.launch); a given cfg runs as given
        c = c.with_pdl()
    k = generated(gdn_source, c)
    launch(k, (nv, c.grid_y), k.threads, Qn, Kn, V, vo, g, beta, S.reshape(S.size), out.reshape(out.size),
           out.shape[1], R, vpk, cap.reshape(cap.size), nv * dk * dv, pdl=c.pdl)


@launcher("gdn_recurrence")
def gdn_recurrence_cuda(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    """Same contract as the twin; the kernel is the dispatch table's (the fast recurrence for
    every row count)."""
    if dk > MAX_DK:
        raise ValueError(f"linear_key_head_dim {dk} > {MAX_DK} is not supported by the CUDA recurrence")
    if dispatch.pick("gdn_recurrence", R) == "gdn_recurrence_fast":
        gdn_recurrence_fast(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture)
    else:
        gdn_recurrence_naive(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture)
