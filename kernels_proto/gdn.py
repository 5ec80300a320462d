"""A wider gated-DeltaNet recurrence, bit-identical to ``exact.gdn_column`` (the CPU twin
``numba_kernels.cpu.gdn_recurrence``).

Shapes (as the twin): ``Qn, Kn: [R+, Hk·dk]`` (normalised, q scaled), ``V[:, vo:]: [R+, Hv·dv]``,
``g, beta: [R+, Hv]``, ``S: [Hv, dk, dv]`` (updated in place), ``out: [R+, Hv·dv]``,
``cap: [R+, Hv, dk, dv]`` (state after each row, written when ``capture``). Value head h reads key
head h // vpk.

Design (issue #15 item 3)
-------------------------
* A state column S[h, :, j] is split by the canonical dot slices (32 rows each, ``NSL`` of them).
  Thread (slice s, column j) keeps its 32 rows in registers for all R rows. The ``NSL`` slices of a
  column live in ONE warp: lane = s·CW + c (CW = 32 / NSLP columns per warp, NSLP = NSL rounded up to
  a power of two; lanes of phantom slices s ≥ NSL compute nothing that is kept). Slice partials of
  Sᵀk and Sᵀq are gathered with ``shfl_sync`` and added in slice order from +0 by every lane — exactly
  ``dot_col``; no block barrier per token.
* Everything a row needs that does not depend on the state (k, q of the key head, v of the block's
  columns, eg = exp32(g) — the same function on the same input, so the same bits — and beta) is
  staged per chunk of ``TC`` rows in shared memory, double-buffered: the global loads of chunk n+1 are
  issued into registers when chunk n starts and stored to the other buffer when it ends, so their
  latency hides behind TC rows of work; one ``syncthreads`` per chunk.
* Software pipelining (``PIPE``): in row t the fma chain of out[t−1] = S_{t−1}ᵀq_{t−1} and the chain of
  Sᵀk_t (over S_{t−1}·eg_t) read the same registers and run interleaved, so the output dot is off the
  recurrence's critical path (one 32-long chain + the gather + delta + the update per row). Without
  ``PIPE`` out[t] is computed after the update in the same row.
* ``PREK``: the next row's k slice is loaded from shared memory right after each element's last use in
  the update, so the next chain does not wait for it.

Under ``NUMBA_ENABLE_CUDASIM=1`` (no warp intrinsics there) the gather goes through a shared buffer and
two ``syncthreads``; the arithmetic is the same.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from kernels_proto.prims import B, SIMULATED, fma, fmul

F32 = np.float32
I32 = np.int32
U = np.uint64  # array indices: unsigned, so Numba emits no negative-index wraparound
SLICE = 32
MAX_DK = 256
FULL = 0xFFFFFFFF
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


_CACHE = {}


def make_kernel(dk, wpb=4, tc=16, pipe=True, prek=True, cap=False):
    """The kernel for key head dim ``dk`` (≤ 256): ``wpb`` warps per block, chunks of ``tc`` rows;
    ``cap``: writes the per-row state captures (the kernel without it ignores ``capture``)."""
    key = (dk, wpb, tc, pipe, prek, cap)
    if key in _CACHE:
        return _CACHE[key]
    if not 1 <= dk <= MAX_DK:
        raise ValueError(f"dk={dk} not in 1..{MAX_DK}")
    NSL, NSLP, CW = layout(dk)
    DK = dk
    DKP = NSL * SLICE  # shared row length (zero-padded)
    LAST = DK - (NSL - 1) * SLICE  # rows of the last slice
    RAGGED = LAST != SLICE
    WPB, TC = wpb, tc
    NT = 32 * WPB
    CB = CW * WPB  # columns per block
    RPW = (TC + WPB - 1) // WPB  # chunk rows staged per warp
    NVU = (CB + 31) // 32  # v elements per lane and row
    MKQ = RPW * NSL  # staged k (and q) elements per lane
    MV = RPW * NVU  # staged v elements per lane
    SL = SLICE
    PIPE, PREK, CAP = pipe, prek, cap
    NK, NV, NE = 2 * TC * DKP, 2 * TC * CB, 2 * TC
    assert TC <= NT

    def kern(Qn, Kn, V, vo, g, beta, S, out, R, dv, vpk, cap, capture):
        # shared (flat): k and q rows [2][TC][DKP], v [2][TC][CB], eg and beta [2][TC]
        ks = cuda.shared.array(NK, np.float32, alignment=ALIGN)
        qs = cuda.shared.array(NK, np.float32, alignment=ALIGN)
        vs = cuda.shared.array(NV, np.float32, alignment=ALIGN)
        es = cuda.shared.array(NE, np.float32, alignment=ALIGN)
        bs = cuda.shared.array(NE, np.float32, alignment=ALIGN)
        xb = cuda.shared.array((2, WPB, 32), np.float32, alignment=ALIGN)  # the simulator's gather only
        st = cuda.local.array(SL, np.float32)  # b_s: the state slice
        kr = cuda.local.array(SL, np.float32)  # b_k: k slice of this row
        qr = cuda.local.array(SL, np.float32)  # b_q: q slice of the previous row (PIPE) / this row
        rk = cuda.local.array(MKQ, np.float32)  # chunk n+1 in flight
        rq = cuda.local.array(MKQ, np.float32)
        rv = cuda.local.array(MV, np.float32)

        h = I32(cuda.blockIdx.x)
        tid = I32(cuda.threadIdx.x)
        w = tid >> 5
        lane = tid & 31
        s = lane // CW
        c = lane % CW
        cl = w * CW + c
        jb = I32(cuda.blockIdx.y) * CB
        j = jb + cl
        R32 = I32(R)
        dv32 = I32(dv)
        ko = (h // I32(vpk)) * DK
        vh = I32(vo) + h * dv32
        oh = h * dv32 + j
        real = s < NSL
        live = real and j < dv32
        i0 = (s if real else I32(0)) * SL
        full = s < NSL - 1  # all 32 rows of the slice are real (only read when RAGGED)
        rlast = max(R32 - 1, I32(0))
        # 64-bit unsigned column indices of this lane's staged elements (constant offsets fold)
        uk = U(ko) + U(lane)
        uv = U(vh)
        vmax = dv32 - 1

        for ii in range(SL):
            st[ii] = F32(0.0)
            kr[ii] = F32(0.0)
            qr[ii] = F32(0.0)
        if live:
            for ii in range(SL):
                if ii < LAST or full:
                    st[ii] = S[U(h), U(i0) + U(ii), U(j)]

        # ---- chunk 0 straight into buffer 0 (rows of a chunk round-robin over warps, lanes along a row)
        for r in range(RPW):
            tl = w + r * WPB
            tg = U(min(tl, rlast))
            for u in range(NSL):
                i = lane + u * 32
                ui = U(ko) + U(min(i, DK - 1)) if RAGGED else uk + U(u * 32)
                x = Kn[tg, ui]
                y = Qn[tg, ui]
                if tl < TC:
                    ok = tl < R32 and i < DK
                    ks[U(tl * DKP + i)] = x if ok else F32(0.0)
                    qs[U(tl * DKP + i)] = y if ok else F32(0.0)
            for u in range(NVU):
                cc = lane + u * 32
                x = V[tg, uv + U(min(jb + cc, vmax))]
                if tl < TC and cc < CB:
                    vs[U(tl * CB + cc)] = x if tl < R32 and jb + cc < dv32 else F32(0.0)
        if tid < TC:
            tg = U(min(tid, rlast))
            x = exp32(g[tg, U(h)])
            y = beta[tg, U(h)]
            es[U(tid)] = x if tid < R32 else F32(0.0)
            bs[U(tid)] = y if tid < R32 else F32(0.0)
        cuda.syncthreads()

        nch = (R32 + TC - 1) // TC
        for n in range(nch):
            b = n & 1
            t0 = n * TC
            t1 = t0 + TC
            # ---- issue the loads of chunk n+1 (clamped addresses, no branches)
            for r in range(RPW):
                tg = U(min(t1 + w + r * WPB, rlast))
                for u in range(NSL):
                    ui = U(ko) + U(min(lane + u * 32, DK - 1)) if RAGGED else uk + U(u * 32)
                    rk[r * NSL + u] = Kn[tg, ui]
                    rq[r * NSL + u] = Qn[tg, ui]
                for u in range(NVU):
                    rv[r * NVU + u] = V[tg, uv + U(min(jb + lane + u * 32, vmax))]
            tg = U(min(t1 + tid, rlast))
            gx = g[tg, U(h)]
            bx = beta[tg, U(h)]

            # ---- the rows of chunk n
            ntok = min(TC, R32 - t0)
            kb0 = b * (TC * DKP) + i0
            vb0 = b * (TC * CB) + cl
            eb0 = b * TC
            if PREK:
                for ii in range(SL):
                    kr[ii] = ks[U(kb0 + ii)]
            for tt in range(ntok):
                t = t0 + tt
                kb = kb0 + tt * DKP
                eg = es[U(eb0 + tt)]
                bt = bs[U(eb0 + tt)]
                vv = vs[U(vb0 + tt * CB)]
                if not PREK:
                    for ii in range(SL):
                        kr[ii] = ks[U(kb + ii)]
                pk = F32(0.0)
                pq = F32(0.0)
                if PIPE:
                    for ii in range(SL):
                        if ii < LAST or full:
                            x = st[ii]
                            pq = fma(x, qr[ii], pq)
                            y = fmul(x, eg)
                            st[ii] = y
                            pk = fma(y, kr[ii], pk)
                    for ii in range(SL):
                        qr[ii] = qs[U(kb + ii)]
                else:
                    for ii in range(SL):
                        if ii < LAST or full:
                            y = fmul(st[ii], eg)
                            st[ii] = y
                            pk = fma(y, kr[ii], pk)
                _xput(xb, w, lane, pk, pq)
                kv = F32(0.0)
                for s2 in range(NSL):
                    kv = kv + _xget(xb, w, 0, pk, s2 * CW + c)
                o = F32(0.0)
                if PIPE:
                    for s2 in range(NSL):
                        o = o + _xget(xb, w, 1, pq, s2 * CW + c)
                _xdone(xb)
                if PIPE and s == 0 and t > 0 and j < dv32:
                    out[U(t - 1), U(oh)] = o
                delta = fmul(vv - kv, bt)
                kn = kb + DKP if tt + 1 < TC else kb
                for ii in range(SL):
                    if ii < LAST or full:
                        st[ii] = fma(kr[ii], delta, st[ii])
                    if PREK:
                        kr[ii] = ks[U(kn + ii)]
                if not PIPE:
                    for ii in range(SL):
                        qr[ii] = qs[U(kb + ii)]
                    pq = F32(0.0)
                    for ii in range(SL):
                        if ii < LAST or full:
                            pq = fma(st[ii], qr[ii], pq)
                    _xput(xb, w, lane, pq, pq)
                    o = F32(0.0)
                    for s2 in range(NSL):
                        o = o + _xget(xb, w, 0, pq, s2 * CW + c)
                    _xdone(xb)
                    if s == 0 and j < dv32:
                        out[U(t), U(oh)] = o
                if CAP and live:
                    for ii in range(SL):
                        if ii < LAST or full:
                            cap[U(t), U(h), U(i0) + U(ii), U(j)] = st[ii]

            # ---- chunk n+1 into the other buffer (zeros past R, past dk, past dv)
            kb1 = (1 - b) * (TC * DKP)
            vb1 = (1 - b) * (TC * CB)
            for r in range(RPW):
                tl = w + r * WPB
                if tl < TC:
                    okr = t1 + tl < R32
                    for u in range(NSL):
                        i = lane + u * 32
                        ok = okr and i < DK
                        ks[U(kb1 + tl * DKP + i)] = rk[r * NSL + u] if ok else F32(0.0)
                        qs[U(kb1 + tl * DKP + i)] = rq[r * NSL + u] if ok else F32(0.0)
                    for u in range(NVU):
                        cc = lane + u * 32
                        if cc < CB:
                            ok = okr and jb + cc < dv32
                            vs[U(vb1 + tl * CB + cc)] = rv[r * NVU + u] if ok else F32(0.0)
            if tid < TC:
                ok = t1 + tid < R32
                es[U((1 - b) * TC + tid)] = exp32(gx) if ok else F32(0.0)
                bs[U((1 - b) * TC + tid)] = bx if ok else F32(0.0)
            cuda.syncthreads()

        # ---- out of the last row, the state back
        if PIPE:
            pq = F32(0.0)
            for ii in range(SL):
                if ii < LAST or full:
                    pq = fma(st[ii], qr[ii], pq)
            _xput(xb, w, lane, pq, pq)
            o = F32(0.0)
            for s2 in range(NSL):
                o = o + _xget(xb, w, 0, pq, s2 * CW + c)
            _xdone(xb)
            if s == 0 and j < dv32 and R32 > 0:
                out[U(R32 - 1), U(oh)] = o
        if live:
            for ii in range(SL):
                if ii < LAST or full:
                    S[U(h), U(i0) + U(ii), U(j)] = st[ii]

    kern.__name__ = f"gdn_warp_dk{dk}_w{wpb}_t{tc}{'_pipe' if pipe else ''}{'_prek' if prek else ''}{'_cap' if cap else ''}"
    k = cuda.jit(kern)
    spec = dict(dk=dk, wpb=wpb, tc=tc, pipe=pipe, prek=prek, cap=cap, nsl=NSL, nslp=NSLP, cw=CW, cb=CB, nt=NT,
                smem_bytes=4 * (2 * 2 * TC * DKP + 2 * TC * CB + 4 * TC + 2 * WPB * 32))
    _CACHE[key] = (k, spec)
    return k, spec


def gdn_recurrence(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture, wpb=4, tc=16, pipe=True,
                   prek=True, stream=0):
    """Same contract and arguments as the CPU twin's ``gdn_recurrence`` (plus the variant)."""
    k, spec = make_kernel(dk, wpb, tc, pipe, prek, bool(capture))
    nv = S.shape[0]
    grid = (nv, (dv + spec["cb"] - 1) // spec["cb"])
    k[grid, spec["nt"], stream](Qn, Kn, V, vo, g, beta, S, out, R, dv, vpk, cap, capture)
