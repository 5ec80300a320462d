"""CUDA kernels of the exact mode (``@cuda.jit``), bit-identical to the CPU twins.

Import this module only when the CUDA backend is chosen: importing the package never touches
CUDA. Every kernel's threads compute their outputs with the same bodies from
:mod:`numba_kernels.exact` as :mod:`numba_kernels.cpu` (specialised with ``cuda.fma``,
``__fmul_rn`` and ``__int_as_float``), so the arithmetic is the same float32 operations in the
same order. Each public function here has the CPU twin's name and signature and launches its
kernel on the default stream.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")  # small grids are expected for decode

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still names np.row_stack
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402
from numba.cuda import libdevice  # noqa: E402

from numba.core.errors import NumbaPerformanceWarning  # noqa: E402

from . import exact  # noqa: E402

warnings.simplefilter("ignore", NumbaPerformanceWarning)  # small grids are expected for decode

F32 = np.float32
TILE = exact.ATT_TILE
dev = cuda.jit(device=True)


from numba.core import config as _nb_config  # noqa: E402

SIMULATED = bool(_nb_config.ENABLE_CUDASIM)

if not SIMULATED:
    @dev
    def fma(a, b, c):
        return cuda.fma(F32(a), F32(b), F32(c))

    @dev
    def fmul(a, b):
        return libdevice.fmul_rn(F32(a), F32(b))

    @dev
    def bits_to_f32(i):
        return libdevice.int_as_float(np.int32(i))
else:  # NUMBA_ENABLE_CUDASIM=1: libdevice is a stub there; the simulator is not exact anyway
    def fma(a, b, c):
        return F32(float(a) * float(b) + float(c))

    def fmul(a, b):
        return F32(a) * F32(b)

    def bits_to_f32(i):
        return np.array([i], np.int32).view(np.float32)[0]


_B = exact.specialise({"fma": fma, "fmul": fmul, "bits_to_f32": bits_to_f32}, dev)
exp32 = _B["exp32"]
sigmoid32 = _B["sigmoid32"]
silu32 = _B["silu32"]
softplus32 = _B["softplus32"]
dot_rows = _B["dot_rows"]
rms_inv = _B["rms_inv"]
rms_scale = _B["rms_scale"]
l2_inv = _B["l2_inv"]
conv_channel = _B["conv_channel"]
gdn_column = _B["gdn_column"]
rope_pair = _B["rope_pair"]
merge_scale = _B["merge_scale"]
merge_acc = _B["merge_acc"]
route_row = _B["route_row"]

TPB = 128


def _grid(n, tpb=TPB):
    return (max(1, math.ceil(n / tpb)), tpb)


# ------------------------------------------------------------------------------------------------
# launches, graphs and the device-side position
# ------------------------------------------------------------------------------------------------
class _Launch:
    """Where kernel launches go: ``None`` runs them now on the default stream; a list records
    them (graphs under the simulator); a ``cuda.core`` GraphBuilder captures them."""
    target = None


def _go(kernel, grid, block, *args):
    """Every launch of this package goes through here (see :func:`capture`)."""
    t = _Launch.target
    if t is None:
        kernel[grid, block](*args)
    elif isinstance(t, list):
        t.append((kernel, grid, block, args))
    else:
        kernel[grid, block, t](*args)


class Graph:
    """A captured sequence of launches: a CUDA graph (or, under the simulator, the recorded
    launches). :meth:`replay` runs them again with the same arguments (same buffers, same
    scalars) on the default stream, ordered with everything else issued there. ``keep`` holds
    the buffers the launches use, so that they outlive any reallocation by their owners."""

    def __init__(self, graph, keep):
        self.graph, self.keep = graph, keep

    def replay(self):
        if isinstance(self.graph, list):
            for kernel, grid, block, args in self.graph:
                kernel[grid, block](*args)
        else:
            self.graph.launch(_legacy_stream())


def _core():
    try:
        from cuda.core import Device, Stream
    except ImportError:  # cuda-core < 0.4
        from cuda.core.experimental import Device, Stream
    return Device, Stream


def _legacy_stream():
    s = _CORE.get("stream")
    if s is None:
        s = _CORE["stream"] = _core()[1].from_handle(0)
    return s


_CORE: dict = {}


def capture(fn, keep=()):
    """Call ``fn()`` with this package's launches captured instead of run (nothing executes).
    Returns (:class:`Graph`, what ``fn`` returned). ``fn`` must only launch kernels of this
    package: no copies, no synchronisation. Buffers that ``fn`` allocates on a first call should
    be allocated by an ordinary (uncaptured) call first."""
    if _Launch.target is not None:
        raise RuntimeError("capture: already capturing")
    internal = [b for b in _POS.values()] + [b for b in _attention_buffers()]
    if SIMULATED:
        rec = []
        _Launch.target = rec
        try:
            res = fn()
        finally:
            _Launch.target = None
        return Graph(rec, list(keep) + internal), res
    Device, _ = _core()
    d = Device()
    d.set_current()
    gb = d.create_graph_builder()
    gb.begin_building("relaxed")
    _Launch.target = gb
    try:
        res = fn()
    finally:
        _Launch.target = None
        gb.end_building()
    return Graph(gb.complete(), list(keep) + internal), res


def _attention_buffers():
    from .cuda_attention import _STATS

    return list(_STATS.values())


_POS: dict = {}


def zero_pos():
    """The int32 [1] zero that position-taking kernels add when no position buffer is given."""
    z = _POS.get("zero")
    if z is None:
        z = _POS["zero"] = cuda.to_device(np.zeros(1, np.int32))
    return z


# ------------------------------------------------------------------------------------------------
# elementwise maps (tests)
# ------------------------------------------------------------------------------------------------
@cuda.jit
def _map_k(x, out, which):
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        if which == 0:
            out[i] = exp32(v)
        elif which == 1:
            out[i] = sigmoid32(v)
        elif which == 2:
            out[i] = silu32(v)
        else:
            out[i] = softplus32(v)


def _map(which):
    def run(x, out):
        b, t = _grid(x.size)
        _go(_map_k, b, t, x, out, which)
    return run


map_exp, map_sigmoid, map_silu, map_softplus = (_map(i) for i in range(4))


# ------------------------------------------------------------------------------------------------
# ops
# ------------------------------------------------------------------------------------------------
@cuda.jit
def _linear_k(X, W, out, R):
    i = cuda.grid(1)
    N, K = W.shape
    if i < R * N:
        r = i // N
        o = i - r * N
        out[r, o] = dot_rows(X, r, 0, W, o, 0, K)


def linear_naive(X, W, out, R):
    """One thread per output (the reference launch; :func:`linear` is the fast path)."""
    b, t = _grid(R * W.shape[0])
    _go(_linear_k, b, t, X, W, out, R)


@cuda.jit
def _embed_k(ids, table, out, R):
    i = cuda.grid(1)
    H = table.shape[1]
    if i < R * H:
        r = i // H
        out[r, i - r * H] = table[ids[r], i - r * H]


def embed(ids, table, out):
    R = ids.shape[0]
    b, t = _grid(R * table.shape[1])
    _go(_embed_k, b, t, ids, table, out, R)


RMS_MAX_SLICES = 1024  # rows of up to 32768 get their slice partials in parallel


@cuda.jit
def _rmsnorm_k(X, w, eps, out, oo, R):
    """One block per row. The canonical dot of the row with itself: the block's threads compute
    the 32-element slice partials (each an fma chain from +0, as in ``dot_rows``), then one
    thread adds them left to right -- the same operations in the same order as one thread
    doing it all."""
    r = cuda.blockIdx.x
    inv_s = cuda.shared.array(1, np.float32)
    ps = cuda.shared.array(RMS_MAX_SLICES, np.float32)
    N = X.shape[1]
    nsl = (N + 31) // 32
    if nsl <= RMS_MAX_SLICES:
        for s in range(cuda.threadIdx.x, nsl, cuda.blockDim.x):
            k0 = s * 32
            k1 = min(k0 + 32, N)
            part = F32(0.0)
            if k1 - k0 == 32:  # a whole slice: eight loads in flight, then their eight fmas
                for b in range(k0, k1, 8):
                    a0, a1, a2, a3 = X[r, b], X[r, b + 1], X[r, b + 2], X[r, b + 3]
                    a4, a5, a6, a7 = X[r, b + 4], X[r, b + 5], X[r, b + 6], X[r, b + 7]
                    part = fma(a0, a0, part)
                    part = fma(a1, a1, part)
                    part = fma(a2, a2, part)
                    part = fma(a3, a3, part)
                    part = fma(a4, a4, part)
                    part = fma(a5, a5, part)
                    part = fma(a6, a6, part)
                    part = fma(a7, a7, part)
            else:
                for i in range(k0, k1):
                    part = fma(X[r, i], X[r, i], part)
            ps[s] = part
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            ss = F32(0.0)
            for s in range(nsl):
                ss = ss + ps[s]
            inv_s[0] = rms_scale(ss, N, eps)
    elif cuda.threadIdx.x == 0:
        inv_s[0] = rms_inv(X, r, 0, N, eps)
    cuda.syncthreads()
    inv = inv_s[0]
    for i in range(cuda.threadIdx.x, N, cuda.blockDim.x):
        out[r, oo + i] = fmul(fmul(X[r, i], inv), F32(1.0) + w[i])


def rmsnorm(X, w, eps, out, oo, R):
    _go(_rmsnorm_k, R, TPB, X, w, F32(eps), out, oo, R)


@cuda.jit
def _gated_rmsnorm_k(X, Z, zo, heads, D, w, eps, out, R):
    i = cuda.grid(1)
    if i < R * heads:
        r = i // heads
        h = i - r * heads
        inv = rms_inv(X, r, h * D, D, eps)
        for j in range(D):
            c = h * D + j
            out[r, c] = fmul(fmul(fmul(X[r, c], inv), w[j]), silu32(Z[r, zo + c]))


def gated_rmsnorm(X, Z, zo, heads, D, w, eps, out, R):
    b, t = _grid(R * heads, 32)
    _go(_gated_rmsnorm_k, b, t, X, Z, zo, heads, D, w, F32(eps), out, R)


@cuda.jit
def _add_k(X, Y, out, R):
    i = cuda.grid(1)
    N = X.shape[1]
    if i < R * N:
        r = i // N
        c = i - r * N
        out[r, c] = X[r, c] + Y[r, c]


def add(X, Y, out, R):
    b, t = _grid(R * X.shape[1])
    _go(_add_k, b, t, X, Y, out, R)


@cuda.jit
def _swiglu_k(GU, I, out, R):
    i = cuda.grid(1)
    if i < R * I:
        r = i // I
        c = i - r * I
        out[r, c] = fmul(silu32(GU[r, c]), GU[r, I + c])


def swiglu_act(GU, I, out, R):
    b, t = _grid(R * I)
    _go(_swiglu_k, b, t, GU, I, out, R)


@cuda.jit
def _conv_k(X, xo, W, state, out, R, cap, capture):
    c = cuda.grid(1)
    C, K = W.shape
    if c < C:
        conv_channel(X, xo, W, state, out, c, R, K, cap, capture)


def conv1d_silu(X, xo, W, state, out, R, cap, capture):
    b, t = _grid(W.shape[0])
    _go(_conv_k, b, t, X, xo, W, state, out, R, cap, capture)


@cuda.jit
def _gdn_prep_k(QKV, kd, hk, dk, BA, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R):
    i = cuda.grid(1)
    if i < R * hk:
        r = i // hk
        h = i - r * hk
        o = h * dk
        iq = l2_inv(QKV, r, o, dk)
        ik = l2_inv(QKV, r, kd + o, dk)
        for j in range(dk):
            Qn[r, o + j] = fmul(fmul(QKV[r, o + j], iq), qscale)
            Kn[r, o + j] = fmul(QKV[r, kd + o + j], ik)
    if i < R * nv:
        r = i // nv
        h = i - r * nv
        beta[r, h] = sigmoid32(BA[r, h])
        g[r, h] = fmul(-exp32(A_log[h]), softplus32(BA[r, nv + h] + dt_bias[h]))


def gdn_prep(QKV, kd, hk, dk, BA, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R):
    b, t = _grid(R * max(hk, nv))
    _go(_gdn_prep_k, b, t, QKV, kd, hk, dk, BA, nv, A_log, dt_bias, F32(qscale), Qn, Kn, beta, g, R)


@cuda.jit
def _gdn_k(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    i = cuda.grid(1)
    nv = S.shape[0]
    if i < nv * dv:
        h = i // dv
        j = i - h * dv
        gdn_column(Qn, Kn, V, vo, g, beta, S, out, h, j, h // vpk, dk, dv, R, cap, capture)


def gdn_recurrence_naive(Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture):
    """One thread per state column, state in global memory (the reference launch)."""
    b, t = _grid(S.shape[0] * dv, 64)
    _go(_gdn_k, b, t, Qn, Kn, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture)


@cuda.jit
def _head_rmsnorm_k(X, xo, heads, D, w, eps, out, R):
    i = cuda.grid(1)
    if i < R * heads:
        r = i // heads
        h = i - r * heads
        inv = rms_inv(X, r, xo + h * D, D, eps)
        for j in range(D):
            out[r, h * D + j] = fmul(fmul(X[r, xo + h * D + j], inv), F32(1.0) + w[j])


def head_rmsnorm(X, xo, heads, D, w, eps, out, R):
    b, t = _grid(R * heads, 32)
    _go(_head_rmsnorm_k, b, t, X, xo, heads, D, w, F32(eps), out, R)


@cuda.jit
def _rope_k(X, heads, D, half, cos, sin, start, pb, R):
    i = cuda.grid(1)
    if i < R * heads * half:
        start = start + pb[0]
        r = i // (heads * half)
        rem = i - r * heads * half
        h = rem // half
        j = rem - h * half
        p = start + r
        rope_pair(X, r, h * D + j, half, cos[p, j], sin[p, j])


def rope(X, heads, D, half, cos, sin, start, R, pos=None):
    """``pos``: an int32 [1] device array added to ``start`` (the device-side position of a
    captured step, :func:`capture`); None adds zero."""
    b, t = _grid(R * heads * half)
    _go(_rope_k, b, t, X, heads, D, half, cos, sin, start, zero_pos() if pos is None else pos, R)


@cuda.jit
def _kv_write_k(Kh, ko, Vh, vo, kc, vc, start, pb, R):
    i = cuda.grid(1)
    N = kc.shape[1]
    if i < R * N:
        start = start + pb[0]
        r = i // N
        c = i - r * N
        kc[start + r, c] = Kh[r, ko + c]
        vc[start + r, c] = Vh[r, vo + c]


def kv_write(Kh, ko, Vh, vo, kc, vc, start, R, pos=None):
    """``pos`` as in :func:`rope`."""
    b, t = _grid(R * kc.shape[1])
    _go(_kv_write_k, b, t, Kh, ko, Vh, vo, kc, vc, start, zero_pos() if pos is None else pos, R)


@cuda.jit
def _attn_k(Q, kc, vc, out, start, pb, hq, hkv, D, scale):
    r = cuda.blockIdx.x
    h = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    kvh = h // (hq // hkv)
    qo = h * D
    ko = kvh * D
    pos = start + pb[0] + r
    sc = cuda.shared.array(TILE, np.float32)
    acc = F32(0.0)
    m = F32(0.0)
    l = F32(0.0)
    ntiles = pos // TILE + 1
    for tix in range(ntiles):
        k0 = tix * TILE
        k1 = min(k0 + TILE, pos + 1)
        n = k1 - k0
        for j in range(tid, n, nt):
            sc[j] = fmul(dot_rows(Q, r, qo, kc, k0 + j, ko, D), scale)
        cuda.syncthreads()
        mt = sc[0]
        for j in range(1, n):
            if sc[j] > mt:
                mt = sc[j]
        cuda.syncthreads()
        for j in range(tid, n, nt):
            sc[j] = exp32(sc[j] - mt)
        cuda.syncthreads()
        lt = F32(0.0)
        for j in range(n):
            lt = lt + sc[j]
        a = F32(0.0)
        if tid < D:
            for j in range(n):
                a = fma(sc[j], vc[k0 + j, ko + tid], a)
        if tix == 0:
            m = mt
            l = lt
            acc = a
        else:
            m, alpha, beta = merge_scale(m, mt)
            l = merge_acc(l, alpha, lt, beta)
            acc = merge_acc(acc, alpha, a, beta)
        cuda.syncthreads()
    if tid < D:
        out[r, qo + tid] = acc / l


def attention_tiled(Q, kc, vc, out, start, R, hq, hkv, D, scale, pos=None):
    """One block per (row, head), tiles merged in order as they are computed. ``pos`` as in
    :func:`rope`."""
    nt = max(32, min(1024, ((D + 31) // 32) * 32))
    _go(_attn_k, (R, hq), nt, Q, kc, vc, out, start, zero_pos() if pos is None else pos, hq, hkv, D, F32(scale))


@cuda.jit
def _sigmoid_gate_k(O, G, go, out, R):
    i = cuda.grid(1)
    N = O.shape[1]
    if i < R * N:
        r = i // N
        c = i - r * N
        out[r, c] = fmul(O[r, c], sigmoid32(G[r, go + c]))


def sigmoid_gate(O, G, go, out, R):
    b, t = _grid(R * O.shape[1])
    _go(_sigmoid_gate_k, b, t, O, G, go, out, R)


@cuda.jit
def _route_k(L, topk, renorm, P, idx, wts, R):
    r = cuda.grid(1)
    if r < R:
        route_row(L, r, L.shape[1], topk, renorm, P, idx, wts)


def moe_route(L, topk, renorm, P, idx, wts, R):
    b, t = _grid(R, 32)
    _go(_route_k, b, t, L, topk, renorm, P, idx, wts, R)


@cuda.jit
def _moe_up_k(X, G2, U2, idx, I, act, R):
    i = cuda.grid(1)
    k = idx.shape[1]
    H = X.shape[1]
    if i < R * k * I:
        rq = i // I
        c = i - rq * I
        r = rq // k
        e = idx[r, rq - r * k]
        row = e * I + c
        act[rq, c] = fmul(silu32(dot_rows(X, r, 0, G2, row, 0, H)), dot_rows(X, r, 0, U2, row, 0, H))


def moe_up(X, G2, U2, idx, I, act, R):
    b, t = _grid(R * idx.shape[1] * I)
    _go(_moe_up_k, b, t, X, G2, U2, idx, I, act, R)


@cuda.jit
def _moe_down_k(act, D2, idx, H, y, R):
    i = cuda.grid(1)
    k = idx.shape[1]
    I = act.shape[1]
    if i < R * k * H:
        rq = i // H
        d = i - rq * H
        r = rq // k
        e = idx[r, rq - r * k]
        y[rq, d] = dot_rows(act, rq, 0, D2, e * H + d, 0, I)


def moe_down(act, D2, idx, H, y, R):
    b, t = _grid(R * idx.shape[1] * H)
    _go(_moe_down_k, b, t, act, D2, idx, H, y, R)


@cuda.jit
def _moe_combine_k(y, wts, SH, sgl, shared, out, R):
    i = cuda.grid(1)
    k = wts.shape[1]
    H = out.shape[1]
    if i < R * H:
        r = i // H
        d = i - r * H
        a = F32(0.0)
        for q in range(k):
            a = fma(wts[r, q], y[r * k + q, d], a)
        if shared:
            a = fma(sigmoid32(sgl[r, 0]), SH[r, d], a)
        out[r, d] = a


def moe_combine(y, wts, SH, sgl, shared, out, R):
    b, t = _grid(R * out.shape[1])
    _go(_moe_combine_k, b, t, y, wts, SH, sgl, shared, out, R)


@cuda.jit
def _nonfinite_k(X, R, flags, slot):
    i = cuda.grid(1)
    N = X.shape[1]
    if i < R * N:
        r = i // N
        v = X[r, i - r * N]
        if v != v or v == np.inf or v == -np.inf:
            flags[slot] = 1


def nonfinite_flag(X, R, flags, slot):
    b, t = _grid(R * X.shape[1])
    _go(_nonfinite_k, b, t, X, R, flags, slot)


from .cuda_linear import linear  # noqa: E402,F401  (fast GEMV/GEMM in the same order)
from .cuda_gdn import gdn_recurrence  # noqa: E402,F401  (state in registers, same order)
from .cuda_attention import attention  # noqa: E402,F401  (split-KV for few rows, same order)
