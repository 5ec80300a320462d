"""CPU twins of the exact-mode kernels (``@njit``, float32).

Each op loops over its independent outputs (rows, heads, channels, columns) and computes each
one with the same body from :mod:`numba_kernels.exact` that the CUDA kernel's thread runs, so a
twin and its kernel agree bit for bit. Outputs may be spread over threads (``prange``); no
reduction is ever split across threads.

Shapes: R rows; arrays are C-contiguous float32 unless noted (ids, expert indices: int32/int64).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import caching as _nb_caching
from numba.core import types
from numba.extending import intrinsic

from . import exact


# ------------------------------------------------------------------------------------------------
# on-disk cache: keyed on both source files
# ------------------------------------------------------------------------------------------------
# Numba keys a cached function on the file that defines it, but every twin here has the bodies of
# exact.py compiled into it (and the clones of those bodies have cpu.py's primitives compiled into
# them): an edit to exact.py alone would load stale kernels from __pycache__. The twins' locators
# therefore stamp both files' contents.
_SOURCES = tuple(os.path.abspath(p) for p in (exact.__file__, __file__))


def _sources_stamp() -> str:
    h = hashlib.sha256()
    for p in _SOURCES:
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _twin_locator(base):
    class TwinLocator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.abspath(py_file) not in _SOURCES:
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return _sources_stamp()

    TwinLocator.__name__ = TwinLocator.__qualname__ = "Twin" + base.__name__.lstrip("_")
    return TwinLocator


def _install_locators() -> None:
    impl = getattr(_nb_caching, "CacheImpl", None) or _nb_caching._CacheImpl  # numba ≥ 0.62 / older
    if any(getattr(c, "_primewalk_twin", False) for c in impl._locator_classes):
        return
    bases = [getattr(_nb_caching, n, None) or getattr(_nb_caching, "_" + n)
             for n in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")]
    mine = [_twin_locator(b) for b in bases]
    for c in mine:
        c._primewalk_twin = True
    impl._locator_classes = mine + list(impl._locator_classes)


_install_locators()


@intrinsic
def _fma(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def _bits_to_f32(typingctx, i):
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(inline="always")
def fma(a, b, c):
    return _fma(np.float32(a), np.float32(b), np.float32(c))


@njit(inline="always")
def fmul(a, b):
    return np.float32(a) * np.float32(b)


@njit(inline="always")
def bits_to_f32(i):
    return _bits_to_f32(np.int32(i))


_B = exact.specialise({"fma": fma, "fmul": fmul, "bits_to_f32": bits_to_f32}, njit(cache=True))
exp32 = _B["exp32"]
log1p_unit = _B["log1p_unit"]
sigmoid32 = _B["sigmoid32"]
silu32 = _B["silu32"]
softplus32 = _B["softplus32"]
dot_rows = _B["dot_rows"]
rms_inv = _B["rms_inv"]
l2_inv = _B["l2_inv"]
conv_channel = _B["conv_channel"]
gdn_column = _B["gdn_column"]
rope_pair = _B["rope_pair"]
merge_scale = _B["merge_scale"]
merge_acc = _B["merge_acc"]
route_row = _B["route_row"]

F32 = np.float32
TILE = exact.ATT_TILE


# ------------------------------------------------------------------------------------------------
# elementwise (vector forms used by tests and host code)
# ------------------------------------------------------------------------------------------------
@njit(cache=True)
def map_exp(x, out):
    for i in range(x.size):
        out[i] = exp32(x[i])


@njit(cache=True)
def map_sigmoid(x, out):
    for i in range(x.size):
        out[i] = sigmoid32(x[i])


@njit(cache=True)
def map_silu(x, out):
    for i in range(x.size):
        out[i] = silu32(x[i])


@njit(cache=True)
def map_softplus(x, out):
    for i in range(x.size):
        out[i] = softplus32(x[i])


# ------------------------------------------------------------------------------------------------
# ops
# ------------------------------------------------------------------------------------------------
@njit(parallel=True, cache=True)
def linear(X, W, out, R):
    """out[r, o] = dot(X[r, :K], W[o, :K]) for r < R. X: [≥R, K]; W: [N, K]; out: [≥R, N]."""
    N, K = W.shape
    for ro in prange(R * N):
        r = ro // N
        o = ro - r * N
        out[r, o] = dot_rows(X, r, 0, W, o, 0, K)


@njit(cache=True)
def embed(ids, table, out):
    """out[r] = table[ids[r]]."""
    for r in range(ids.shape[0]):
        out[r, :] = table[ids[r], :]


@njit(cache=True)
def rmsnorm(X, w, eps, out, oo, R):
    """Zero-centred RMSNorm over rows of X: [≥R, N]: out[r, oo + i] = x·inv·(1 + w)."""
    N = X.shape[1]
    for r in range(R):
        inv = rms_inv(X, r, 0, N, eps)
        for i in range(N):
            out[r, oo + i] = fmul(fmul(X[r, i], inv), F32(1.0) + w[i])


@njit(cache=True)
def gated_rmsnorm(X, Z, zo, heads, D, w, eps, out, R):
    """Per head h: out[r, h·D + i] = x·inv·w[i]·silu(Z[r, zo + h·D + i]) over X[r, h·D : (h+1)·D]."""
    for r in range(R):
        for h in range(heads):
            inv = rms_inv(X, r, h * D, D, eps)
            for i in range(D):
                c = h * D + i
                out[r, c] = fmul(fmul(fmul(X[r, c], inv), w[i]), silu32(Z[r, zo + c]))


@njit(cache=True)
def add(X, Y, out, R):
    """out = X + Y over R rows."""
    N = X.shape[1]
    for r in range(R):
        for i in range(N):
            out[r, i] = X[r, i] + Y[r, i]


@njit(cache=True)
def swiglu_act(GU, I, out, R):
    """out[r, i] = silu(GU[r, i]) · GU[r, I + i] (gate ‖ up in one row)."""
    for r in range(R):
        for i in range(I):
            out[r, i] = fmul(silu32(GU[r, i]), GU[r, I + i])


@njit(cache=True)
def conv1d_silu(X, xo, W, state, out, R, cap, capture):
    """Causal depthwise conv + SiLU over channels of X[:, xo:xo+C]; state [K-1, C] updated."""
    C, K = W.shape
    for c in range(C):
        conv_channel(X, xo, W, state, out, c, R, K, cap, capture)


@njit(cache=True)
def gdn_prep(QKV, kd, hk, dk, BA, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R):
    """L2-normalise q and k per key head (q also · qscale) from QKV[:, :2kd]; beta = sigmoid(b),
    g = −exp(A_log)·softplus(a + dt_bias) from BA = [b (nv) ‖ a (nv)]."""
    for r in range(R):
        for h in range(hk):
            o = h * dk
            iq = l2_inv(QKV, r, o, dk)
            ik = l2_inv(QKV, r, kd + o, dk)
            for i in range(dk):
                Qn[r, o + i] = fmul(fmul(QKV[r, o + i], iq), qscale)
                Kn[r, o + i] = fmul(QKV[r, kd + o + i], ik)
        for h in range(nv):
            beta[r, h] = sigmoid32(BA[r, h])
            g[r, h] = fmul(-exp32(A_log[h]), softplus32(BA[r, nv + h] + dt_bias[h]))


@njit(parallel=True, cache=True)
def gdn_recurrence(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    """Gated delta rule over R rows; value head h reads key head h // vpk. V[:, vo:] holds the
    values (a column window of the conv output)."""
    nv = S.shape[0]
    for hj in prange(nv * dv):
        h = hj // dv
        j = hj - h * dv
        gdn_column(Qn, Kn, V, vo, g, beta, S, out, h, j, h // vpk, dk, dv, R, cap, capture)


@njit(cache=True)
def head_rmsnorm(X, xo, heads, D, w, eps, out, R):
    """Zero-centred RMSNorm per head of X[:, xo + h·D : xo + (h+1)·D] into out[:, h·D : ...]."""
    for r in range(R):
        for h in range(heads):
            inv = rms_inv(X, r, xo + h * D, D, eps)
            for i in range(D):
                out[r, h * D + i] = fmul(fmul(X[r, xo + h * D + i], inv), F32(1.0) + w[i])


@njit(cache=True)
def rope(X, heads, D, half, cos, sin, start, R):
    """RoPE in place on X[:, h·D : h·D + 2·half] for rows at positions start + r."""
    for r in range(R):
        p = start + r
        for h in range(heads):
            for i in range(half):
                rope_pair(X, r, h * D + i, half, cos[p, i], sin[p, i])


@njit(cache=True)
def kv_write(Kh, ko, Vh, vo, kc, vc, start, R):
    """Copy R rows of K (Kh[:, ko:ko+N]) and V (Vh[:, vo:vo+N]) into the caches
    ([max_ctx, N], N = Hkv·D) at rows start.."""
    N = kc.shape[1]
    for r in range(R):
        for c in range(N):
            kc[start + r, c] = Kh[r, ko + c]
            vc[start + r, c] = Vh[r, vo + c]


@njit(parallel=True, cache=True)
def attention(Q, kc, vc, out, start, R, hq, hkv, D, scale):
    """Causal GQA attention; query row r at position start + r, head h reads KV head
    h // (hq / hkv). Q: [R, hq·D]; kc, vc: [max_ctx, hkv·D]; out: [R, hq·D]."""
    rep = hq // hkv
    for rh in prange(R * hq):
        r = rh // hq
        h = rh - r * hq
        _attend(Q, kc, vc, out, r, h, h // rep, start + r, D, scale)


@njit(cache=True)
def _attend(Q, kc, vc, out, r, h, kvh, pos, D, scale):
    qo = h * D
    ko = kvh * D
    sc = np.empty(TILE, np.float32)
    acc = np.zeros(D, np.float32)
    acc_t = np.empty(D, np.float32)
    m = F32(0.0)
    l = F32(0.0)
    ntiles = pos // TILE + 1
    for tix in range(ntiles):
        k0 = tix * TILE
        k1 = min(k0 + TILE, pos + 1)
        n = k1 - k0
        for j in range(n):
            sc[j] = fmul(dot_rows(Q, r, qo, kc, k0 + j, ko, D), scale)
        mt = sc[0]
        for j in range(1, n):
            if sc[j] > mt:
                mt = sc[j]
        lt = F32(0.0)
        for j in range(n):
            sc[j] = exp32(sc[j] - mt)
            lt = lt + sc[j]
        for d in range(D):
            a = F32(0.0)
            for j in range(n):
                a = fma(sc[j], vc[k0 + j, ko + d], a)
            acc_t[d] = a
        if tix == 0:
            m = mt
            l = lt
            for d in range(D):
                acc[d] = acc_t[d]
        else:
            m, alpha, beta = merge_scale(m, mt)
            l = merge_acc(l, alpha, lt, beta)
            for d in range(D):
                acc[d] = merge_acc(acc[d], alpha, acc_t[d], beta)
    for d in range(D):
        out[r, qo + d] = acc[d] / l


@njit(cache=True)
def sigmoid_gate(O, G, go, out, R):
    """out[r, i] = O[r, i] · sigmoid(G[r, go + i])."""
    N = O.shape[1]
    for r in range(R):
        for i in range(N):
            out[r, i] = fmul(O[r, i], sigmoid32(G[r, go + i]))


@njit(cache=True)
def moe_route(L, topk, renorm, P, idx, wts, R):
    E = L.shape[1]
    for r in range(R):
        route_row(L, r, E, topk, renorm, P, idx, wts)


@njit(parallel=True, cache=True)
def moe_up(X, G2, U2, idx, I, act, R):
    """act[r·k + q, i] = silu(dot(x_r, G[e, i])) · dot(x_r, U[e, i]) for e = idx[r, q];
    G2, U2: [E·I, H]."""
    k = idx.shape[1]
    H = X.shape[1]
    for rqi in prange(R * k * I):
        rq = rqi // I
        i = rqi - rq * I
        r = rq // k
        e = idx[r, rq - r * k]
        row = e * I + i
        act[rq, i] = fmul(silu32(dot_rows(X, r, 0, G2, row, 0, H)), dot_rows(X, r, 0, U2, row, 0, H))


@njit(parallel=True, cache=True)
def moe_down(act, D2, idx, H, y, R):
    """y[r·k + q, d] = dot(act[r·k + q], Dn[e, d]); D2: [E·H, I]."""
    k = idx.shape[1]
    I = act.shape[1]
    for rqd in prange(R * k * H):
        rq = rqd // H
        d = rqd - rq * H
        r = rq // k
        e = idx[r, rq - r * k]
        y[rq, d] = dot_rows(act, rq, 0, D2, e * H + d, 0, I)


@njit(cache=True)
def moe_combine(y, wts, SH, sgl, shared, out, R):
    """out[r] = Σ_q wts[r, q]·y[r·k + q] (rank order, fma) then + sigmoid(sgl[r, 0])·SH[r]."""
    k = wts.shape[1]
    H = out.shape[1]
    for r in range(R):
        sg = sigmoid32(sgl[r, 0]) if shared else F32(0.0)
        for d in range(H):
            a = F32(0.0)
            for q in range(k):
                a = fma(wts[r, q], y[r * k + q, d], a)
            if shared:
                a = fma(sg, SH[r, d], a)
            out[r, d] = a


@njit(cache=True)
def nonfinite_flag(X, R, flags, slot):
    """flags[slot] = 1 when X[:R] holds a NaN or Inf."""
    N = X.shape[1]
    for r in range(R):
        for i in range(N):
            v = X[r, i]
            if v != v or v == np.inf or v == -np.inf:
                flags[slot] = 1
                return


# ------------------------------------------------------------------------------------------------
# host-side sampling helpers (float32, index order)
# ------------------------------------------------------------------------------------------------
@njit(cache=True)
def normalise(e):
    """e / Σe with the sum taken in index order."""
    s = F32(0.0)
    for i in range(e.size):
        s = s + e[i]
    out = np.empty_like(e)
    for i in range(e.size):
        out[i] = e[i] / s
    return out


@njit(cache=True)
def draw_index(p, u):
    """The first i whose running sum of p (index order) exceeds u · Σp; the last nonzero
    index when rounding leaves the sum short."""
    t = F32(0.0)
    for i in range(p.size):
        t = t + p[i]
    target = fmul(u, t)
    c = F32(0.0)
    last = 0
    for i in range(p.size):
        if p[i] > F32(0.0):
            last = i
        c = c + p[i]
        if c > target:
            return i
    return last
