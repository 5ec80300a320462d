"""A wider gated-DeltaNet recurrence, bit-identical to ``exact.gdn_column`` (the CPU twin
``numba_kernels.cpu.gdn_recurrence``).

Shapes (as the twin): ``Qn, Kn: [R+, Hk·dk]`` (normalised, q scaled), ``V[:, vo:]: [R+, Hv·dv]``,
``g, beta: [R+, Hv]``, ``S: [Hv, dk, dv]`` (updated in place), ``out: [R+, Hv·dv]``,
``cap: [R+, Hv, dk, dv]`` (the state after each row, written when ``capture``). Value head h reads
key head h // vpk.

Design (issue #15 item 3)
-------------------------
* A state column S[h, :, j] is split by the canonical dot slices (32 rows each, ``NSL`` of them).
  Thread (slice s, column j) keeps its 32 rows in registers for all R rows. The slices of a column
  live in ONE warp: lane = s·CW + c (CW = 32 / NSLP columns per warp, NSLP = NSL rounded up to a power
  of two; lanes of phantom slices s ≥ NSL compute nothing that is kept). The slice partials of Sᵀk
  and Sᵀq are gathered with ``shfl_sync`` and added in slice order from +0 by every lane — exactly
  ``dot_col`` — so no block barrier per row. A block holds ``WPB`` warps = CB = CW·WPB columns of one
  value head; grid (Hv, ⌈dv / CB⌉).
* Everything a row needs that does not depend on the state (k and q of the key head, v of the block's
  columns, eg = exp32(g) — the same function on the same input, so the same bits — and beta) is
  staged per chunk of ``TC`` rows in shared memory, double-buffered: the global loads of chunk n+1 are
  issued into registers when chunk n starts and stored to the other buffer when it ends, so their
  latency hides behind TC rows of work; one ``syncthreads`` per chunk.
* ``mode`` — how a row's four passes over the slice (scale by eg, Sᵀk chain, update, Sᵀq chain) are
  scheduled; all give the twin's bits:

  - ``plain``: in the twin's order, row by row.
  - ``pipe``: out[t−1] = S_{t−1}ᵀq_{t−1} is computed in row t, interleaved with row t's scale and Sᵀk
    chain (both read S_{t−1}), so the output dot leaves the recurrence's critical path.
  - ``fuse``: additionally the update of row t−1 (S = fma(k_{t−1}, δ_{t−1}, S)) runs element by
    element inside row t's chain: one pass per row, four dependent ops per element, and the next
    chain starts as soon as δ is known. Before row 0, fma(0, −0, s) = s exactly for every s. It
    reloads k_{t−1} from shared memory (24 LDS.128 a row).
  - ``rot`` (default): ``fuse`` with k_{t−1} and k_t rotating between two register arrays (rows in
    pairs), so a row loads only k_{t+1} and q_t (16 LDS.128, as ``pipe``).

* Every array index is unsigned (Numba then emits no negative-index wraparound) and S, out and cap
  are addressed through flat views with compile-time strides (dk, dv are baked into the kernel).

Under ``NUMBA_ENABLE_CUDASIM=1`` (no warp intrinsics there) the gather goes through a shared buffer and
two ``syncthreads``; the arithmetic is the same.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels_proto.prims import B, SIMULATED, fma, fmul

F32 = np.float32
I32 = np.int32
U = np.uint64  # array indices: unsigned, so Numba emits no negative-index wraparound
SLICE = 32
MAX_DK = 256
FULL = 0xFFFFFFFF
SMEM_MAX = 48 * 1024  # static shared memory per block
MODES = ("rot", "fuse", "pipe", "plain")
NEG0 = F32(-0.0)
exp32 = B["exp32"]
ALIGN = None if SIMULATED else 16  # the simulator refuses an alignment

if SIMULATED:
    def _xput(xb, w, lane, a, b):
        """Publish (a, b) of this lane (simulator: a shared buffer and a barrier)."""
        xb[0, w, lane] = a
        xb[1, w, lane] = b
        cuda.syncthreads()

    def _xget(xb, w, which, v, src):
        return xb[which, w, src]

    def _xdone(xb):
        cuda.syncthreads()
else:
    _dev = cuda.jit(device=True, forceinline=True)

    @_dev
    def _xput(xb, w, lane, a, b):
        pass

    @_dev
    def _xget(xb, w, which, v, src):
        return cuda.shfl_sync(FULL, v, src)

    @_dev
    def _xdone(xb):
        pass


def layout(dk):
    """(NSL, NSLP, CW): slices per column, that rounded up to a power of two, columns per warp."""
    nsl = (dk + SLICE - 1) // SLICE
    nslp = 1
    while nslp < nsl:
        nslp *= 2
    return nsl, nslp, 32 // nslp


def smem_bytes(dk, wpb, tc):
    nsl, _, cw = layout(dk)
    rows = 2 * tc + 1  # two chunk buffers and a pad row
    return 4 * (2 * rows * nsl * SLICE + rows * cw * wpb + 2 * rows + (2 * wpb * 32 if SIMULATED else 0))


def auto_tc(dk, wpb, tc_max=8):
    """The longest chunk (a power of two ≤ tc_max) whose buffers fit in 48 KB."""
    tc = tc_max
    while tc > 1 and smem_bytes(dk, wpb, tc) > SMEM_MAX:
        tc //= 2
    return tc


_CACHE = {}


def make_kernel(dk, dv, wpb=4, tc=None, mode="rot", cap=False):
    """The kernel for head dims ``dk`` (≤ 256) and ``dv``: ``wpb`` warps per block, chunks of ``tc`` rows
    (default: the longest that fits), ``mode`` one of MODES; ``cap``: the kernel writes the per-row
    state captures. Returns (kernel, spec)."""
    if not 1 <= dk <= MAX_DK:
        raise ValueError(f"dk={dk} not in 1..{MAX_DK}")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} not in {MODES}")
    tc = tc or auto_tc(dk, wpb)
    key = (dk, dv, wpb, tc, mode, cap)
    if key in _CACHE:
        return _CACHE[key]
    if smem_bytes(dk, wpb, tc) > SMEM_MAX:
        raise ValueError(f"dk={dk} wpb={wpb} tc={tc}: {smem_bytes(dk, wpb, tc)} B of shared memory > {SMEM_MAX}")
    NSL, NSLP, CW = layout(dk)
    DK, DV = dk, dv
    SL = SLICE
    DKP = NSL * SL  # shared row length (zero-padded)
    LAST = DK - (NSL - 1) * SL  # rows of the last slice
    RAGGED = LAST != SL
    WPB, TC = wpb, tc
    NT = 32 * WPB
    CB = CW * WPB  # columns per block
    DVFULL = DV % CB == 0  # every column of every block is real
    RPW = (TC + WPB - 1) // WPB  # chunk rows staged per warp
    NVU = (CB + 31) // 32  # v elements per lane and row
    CBW = CB % 32 == 0  # v rows are whole warps wide
    MKQ = RPW * NSL  # staged k (and q) elements per lane
    MV = RPW * NVU  # staged v elements per lane
    TR = 2 * TC + 1  # buffered rows + a pad row ("row tt+1" read at a chunk's end lands there)
    NK, NV = TR * DKP, TR * CB
    ROT, PIPE, CAP = mode == "rot", mode == "pipe", cap
    FUSE = mode == "fuse" or ROT
    assert TC <= NT and (TC % 2 == 0 or not ROT)
    inline = cuda.jit(device=True, forceinline=True) if not SIMULATED else (lambda f: f)

    @inline
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
        _xput(xb, w, lane, pk, pq)
        kv = F32(0.0)
        for s2 in range(NSL):
            kv = kv + _xget(xb, w, 0, pk, s2 * CW + c)
        o = F32(0.0)
        for s2 in range(NSL):
            o = o + _xget(xb, w, 1, pq, s2 * CW + c)
        _xdone(xb)
        if ow:
            out1[oip] = o
        dn = fmul(vv - kv, bt)
        if not first:
            oip += ost
            cip += cst
        return dn, egn, btn, vvn, oip, cip

    @inline
    def ffinish(st, kp, qp, cap1, xb, w, lane, c, live, full, dprev, cip):
        """fuse/rot: the last row's update (and capture); returns its Sᵀq."""
        pq = F32(0.0)
        for ii in range(SL):
            if ii < LAST or full:
                x = fma(kp[ii], dprev, st[ii])
                if CAP and live:
                    cap1[cip + U(ii * DV)] = x
                st[ii] = x
                pq = fma(x, qp[ii], pq)
        _xput(xb, w, lane, pq, pq)
        o = F32(0.0)
        for s2 in range(NSL):
            o = o + _xget(xb, w, 0, pq, s2 * CW + c)
        _xdone(xb)
        return o

    @inline
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

    @inline
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
        kp = cuda.local.array(SL, np.float32)  # fuse: k slice of the previous row
        qp = cuda.local.array(SL, np.float32)  # q slice of the previous row (plain: of this row)
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

        # ---- chunk 0 into buffer 0 (all its loads in flight together with the state's)
        gx, bx = stage_issue(Kn, Qn, V, g, beta, rk, rq, rv, I32(0), rlast, w, lane, tid, h, ko, uk, uv, jb)
        stage_store(ks, qs, vs, es, bs, rk, rq, rv, gx, bx, I32(0), I32(0), R32, w, lane, tid, jb)
        cuda.syncthreads()

        dprev = NEG0  # fuse: δ of the previous row (before row 0: fma(0, −0, s) = s exactly)
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
            elif FUSE:
                for ii in range(SL):
                    kc[ii] = ks[U(kb + ii)]
                eg = es[U(eb)]
                bt = bs[U(eb)]
                vv = vs[U(vb)]
                for tt in range(ntok):
                    # finish row t−1 (update, capture, Sᵀq chain) and run row t's scale and Sᵀk chain
                    pk = F32(0.0)
                    pq = F32(0.0)
                    for ii in range(SL):
                        if ii < LAST or full:
                            x = fma(kp[ii], dprev, st[ii])
                            if CAP and live:
                                cap1[cip + U(ii * DV)] = x  # row t−1 (before row 0: row 0, rewritten)
                            pq = fma(x, qp[ii], pq)
                            y = fmul(x, eg)
                            st[ii] = y
                            pk = fma(y, kc[ii], pk)
                    for ii in range(SL):
                        kp[ii] = ks[U(kb + ii)]
                        qp[ii] = qs[U(kb + ii)]
                        kc[ii] = ks[U(kb + DKP + ii)]
                    egn = es[U(eb + 1)]
                    btn = bs[U(eb + 1)]
                    vvn = vs[U(vb + CB)]
                    _xput(xb, w, lane, pk, pq)
                    kv = F32(0.0)
                    for s2 in range(NSL):
                        kv = kv + _xget(xb, w, 0, pk, s2 * CW + c)
                    o = F32(0.0)
                    for s2 in range(NSL):
                        o = o + _xget(xb, w, 1, pq, s2 * CW + c)
                    _xdone(xb)
                    if ow:
                        out1[oip] = o  # row t−1 (before row 0: row 0, rewritten)
                    dprev = fmul(vv - kv, bt)
                    eg = egn
                    bt = btn
                    vv = vvn
                    if t0 + tt > 0:
                        oip += ost
                        cip += cst
                    kb = I32(kb + DKP)
                    eb = I32(eb + 1)
                    vb = I32(vb + CB)
            elif PIPE:
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
                    _xput(xb, w, lane, pk, pq)
                    kv = F32(0.0)
                    for s2 in range(NSL):
                        kv = kv + _xget(xb, w, 0, pk, s2 * CW + c)
                    o = F32(0.0)
                    for s2 in range(NSL):
                        o = o + _xget(xb, w, 1, pq, s2 * CW + c)
                    _xdone(xb)
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
            else:
                for ii in range(SL):
                    kc[ii] = ks[U(kb + ii)]
                for tt in range(ntok):
                    eg = es[U(eb)]
                    bt = bs[U(eb)]
                    vv = vs[U(vb)]
                    pk = F32(0.0)
                    for ii in range(SL):
                        if ii < LAST or full:
                            y = fmul(st[ii], eg)
                            st[ii] = y
                            pk = fma(y, kc[ii], pk)
                    _xput(xb, w, lane, pk, pk)
                    kv = F32(0.0)
                    for s2 in range(NSL):
                        kv = kv + _xget(xb, w, 0, pk, s2 * CW + c)
                    _xdone(xb)
                    delta = fmul(vv - kv, bt)
                    for ii in range(SL):
                        qp[ii] = qs[U(kb + ii)]
                    for ii in range(SL):
                        if ii < LAST or full:
                            st[ii] = fma(kc[ii], delta, st[ii])
                        kc[ii] = ks[U(kb + DKP + ii)]
                    pq = F32(0.0)
                    for ii in range(SL):
                        if ii < LAST or full:
                            pq = fma(st[ii], qp[ii], pq)
                    _xput(xb, w, lane, pq, pq)
                    o = F32(0.0)
                    for s2 in range(NSL):
                        o = o + _xget(xb, w, 0, pq, s2 * CW + c)
                    _xdone(xb)
                    if ow:
                        out1[oip] = o
                    oip += ost
                    if CAP and live:
                        for ii in range(SL):
                            if ii < LAST or full:
                                cap1[cip + U(ii * DV)] = st[ii]
                    cip += cst
                    kb = I32(kb + DKP)
                    eb = I32(eb + 1)
                    vb = I32(vb + CB)

            # ---- chunk n+1 into the other buffer
            if nxt:
                stage_store(ks, qs, vs, es, bs, rk, rq, rv, gx, bx, I32(1 - b), t1, R32, w, lane, tid, jb)
                cuda.syncthreads()

        # ---- finish the last row (fuse: its update; fuse and pipe: its output), the state back
        if ROT:
            if (R32 - 1) & 1:
                o = ffinish(st, kp, qp, cap1, xb, w, lane, c, live, full, dprev, cip)  # last row odd: its k in kp
            else:
                o = ffinish(st, kc, qp, cap1, xb, w, lane, c, live, full, dprev, cip)
            if ow:
                out1[oip] = o
        elif FUSE or PIPE:
            pq = F32(0.0)
            for ii in range(SL):
                if ii < LAST or full:
                    x = st[ii]
                    if FUSE:
                        x = fma(kp[ii], dprev, x)
                        if CAP and live:
                            cap1[cip + U(ii * DV)] = x
                        st[ii] = x
                    pq = fma(x, qp[ii], pq)
            _xput(xb, w, lane, pq, pq)
            o = F32(0.0)
            for s2 in range(NSL):
                o = o + _xget(xb, w, 0, pq, s2 * CW + c)
            _xdone(xb)
            if ow:
                out1[oip] = o
        if live:
            for ii in range(SL):
                if ii < LAST or full:
                    S1[sb + U(ii * DV)] = st[ii]

    kern.__name__ = f"gdn_{mode}_dk{dk}_dv{dv}_w{wpb}_t{tc}{'_cap' if cap else ''}"
    k = cuda.jit(kern)
    spec = dict(dk=dk, dv=dv, wpb=wpb, tc=tc, mode=mode, cap=cap, nsl=NSL, nslp=NSLP, cw=CW, cb=CB, nt=NT,
                grid_y=(DV + CB - 1) // CB, smem_bytes=smem_bytes(dk, wpb, tc))
    _CACHE[key] = (k, spec)
    return k, spec


def _flat(a):
    return a.reshape(a.size)


def gdn_recurrence(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture, wpb=4, tc=None, mode="rot",
                   stream=0):
    """Same contract and arguments as the CPU twin's ``gdn_recurrence`` (plus the variant: ``wpb``,
    ``tc``, ``mode``; see :func:`make_kernel`). All arrays C-contiguous on the device."""
    if R <= 0:
        return
    capture = bool(capture)
    k, spec = make_kernel(dk, dv, wpb, tc, mode, capture)
    nv = S.shape[0]
    assert S.shape == (nv, dk, dv) and out.shape[1] >= nv * dv
    cstride = nv * dk * dv
    if capture:
        assert cap.shape[0] >= R and cap.shape[1:] == (nv, dk, dv)
    capf = _flat(cap)
    k[(nv, spec["grid_y"]), spec["nt"], stream](Qn, Kn, V, vo, g, beta, _flat(S), _flat(out), out.shape[1], R, vpk,
                                                capf, cstride)
