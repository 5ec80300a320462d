"""Elementwise ops: ``embed``, ``add``, ``swiglu_act``, ``sigmoid_gate``, ``nonfinite_flag``,
``copy_i32`` and the scalar maps (``map_exp`` … ``map_softplus``: tests and host-side sampling).

Each output element is one body call: the CPU twin loops over rows and columns, the CUDA kernel
runs one thread per element (``row_col`` splits its index).
"""

from __future__ import annotations

import numpy as np

from .exact import exp32, row_col, sigmoid32, silu32, softplus32
from .mma_gemm import PACK_ERROR, bf16_pair, pack_span
from .tags import body, cuda, fmul, grid1, kernel, launch, launcher, pdl_trigger, twin, widen

MAPS = {"map_exp": 0, "map_sigmoid": 1, "map_silu": 2, "map_softplus": 3}  # map op: ``which``


# ------------------------------------------------------------------------------------------------
# scalar maps
# ------------------------------------------------------------------------------------------------
@body
def scalar_map(v, which):
    if which == 0:
        return exp32(v)
    if which == 1:
        return sigmoid32(v)
    if which == 2:
        return silu32(v)
    return softplus32(v)


@twin(bound=MAPS)
def map_cpu(x, out, which):
    """out[i] = f(x[i]) over a 1-D array, f picked by ``which`` (MAPS)."""
    for i in range(x.size):
        out[i] = scalar_map(x[i], which)


@kernel
def map_k(x, out, which):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = scalar_map(x[i], which)


@launcher(bound=MAPS)
def map_cuda(x, out, which):
    launch(map_k, *grid1(x.size), x, out, which)


# ------------------------------------------------------------------------------------------------
# embed
# ------------------------------------------------------------------------------------------------
@body
def embed_at(ids, table, out, r, c):
    out[r, c] = widen(table[ids[r], c])


@twin("embed")
def embed_cpu(ids, table, out):
    """out[r] = table[ids[r]] for every id (table float32, or bf16 bit patterns widened exactly)."""
    for r in range(ids.shape[0]):
        for c in range(table.shape[1]):
            embed_at(ids, table, out, r, c)


@kernel
def embed_k(ids, table, out, R):
    i = cuda.grid(1)
    if i < R * table.shape[1]:
        r, c = row_col(i, table.shape[1])
        embed_at(ids, table, out, r, c)


@launcher("embed")
def embed_cuda(ids, table, out):
    R = ids.shape[0]
    launch(embed_k, *grid1(R * table.shape[1]), ids, table, out, R)


# ------------------------------------------------------------------------------------------------
# add, swiglu_act, sigmoid_gate
# ------------------------------------------------------------------------------------------------
@body
def add_at(X, Y, out, r, c):
    out[r, c] = X[r, c] + Y[r, c]


@twin("add")
def add_cpu(X, Y, out, R):
    """out = X + Y over R rows."""
    for r in range(R):
        for c in range(X.shape[1]):
            add_at(X, Y, out, r, c)


@kernel
def add_k(X, Y, out, R):
    i = cuda.grid(1)
    if i < R * X.shape[1]:
        r, c = row_col(i, X.shape[1])
        add_at(X, Y, out, r, c)


@launcher("add")
def add_cuda(X, Y, out, R):
    launch(add_k, *grid1(R * X.shape[1]), X, Y, out, R)


@body
def swiglu_val(GU, I, r, c):
    ru, cu = np.uint64(r), np.uint64(c)  # unsigned: no negative-index wrap code
    return fmul(silu32(GU[ru, cu]), GU[ru, np.uint64(I + c)])


@body
def swiglu_at(GU, I, out, r, c):
    out[np.uint64(r), np.uint64(c)] = swiglu_val(GU, I, r, c)


@twin("swiglu_act")
def swiglu_act_cpu(GU, I, out, R, xp=None):
    """out[r, i] = silu(GU[r, i]) · GU[r, I + i] (gate ‖ up in one row). ``xp`` (optional, uint32
    [≥R, ≥I/2]; I even): each output pair's bf16 bits packed there too (``pack_span``)."""
    if xp is not None:
        if I % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < I:
            raise ValueError(PACK_ERROR)
    for r in range(R):
        for c in range(I):
            swiglu_at(GU, I, out, r, c)
        if xp is not None:
            pack_span(out, r, 0, I, xp, 0, 1)


@kernel
def swiglu_act_k(GU, I, out, R):
    pdl_trigger()  # a GEMV launched with PDL after this kernel may start now (launch.launch)
    i = cuda.grid(1)
    if i < R * I:
        r, c = row_col(i, I)
        swiglu_at(GU, I, out, r, c)


@kernel
def swiglu_act_pk_k(GU, I, out, R, xp):
    """One thread per output pair: both outputs stored and packed from registers."""
    pdl_trigger()  # a GEMV launched with PDL after this kernel may start now (launch.launch)
    h = I >> 1
    i = cuda.grid(1)
    if i < R * h:
        r, j = row_col(i, h)
        v0, v1 = swiglu_val(GU, I, r, 2 * j), swiglu_val(GU, I, r, 2 * j + 1)
        ru, k = np.uint64(r), np.uint64(2 * j)  # unsigned: no negative-index wrap code
        out[ru, k] = v0
        out[ru, k + np.uint64(1)] = v1
        xp[ru, np.uint64(j)] = bf16_pair(v0, v1)


@launcher("swiglu_act")
def swiglu_act_cuda(GU, I, out, R, xp=None):
    if xp is None:
        launch(swiglu_act_k, *grid1(R * I), GU, I, out, R)
        return
    if I % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < I:
        raise ValueError(PACK_ERROR)
    launch(swiglu_act_pk_k, *grid1(R * (I >> 1)), GU, I, out, R, xp)


@body
def gate_val(O, G, go, r, c):
    ru, cu = np.uint64(r), np.uint64(c)  # unsigned: no negative-index wrap code
    return fmul(O[ru, cu], sigmoid32(G[ru, np.uint64(go + c)]))


@body
def gate_at(O, G, go, out, r, c):
    out[np.uint64(r), np.uint64(c)] = gate_val(O, G, go, r, c)


@twin("sigmoid_gate")
def sigmoid_gate_cpu(O, G, go, out, R, xp=None):
    """out[r, i] = O[r, i] · sigmoid(G[r, go + i]). ``xp``: as swiglu_act's (O's width even)."""
    n = O.shape[1]
    if xp is not None:
        if n % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < n:
            raise ValueError(PACK_ERROR)
    for r in range(R):
        for c in range(n):
            gate_at(O, G, go, out, r, c)
        if xp is not None:
            pack_span(out, r, 0, n, xp, 0, 1)


@kernel
def sigmoid_gate_k(O, G, go, out, R):
    pdl_trigger()  # a GEMV launched with PDL after this kernel may start now (launch.launch)
    i = cuda.grid(1)
    if i < R * O.shape[1]:
        r, c = row_col(i, O.shape[1])
        gate_at(O, G, go, out, r, c)


@kernel
def sigmoid_gate_pk_k(O, G, go, out, R, xp):
    """One thread per output pair: both outputs stored and packed from registers."""
    pdl_trigger()  # a GEMV launched with PDL after this kernel may start now (launch.launch)
    h = O.shape[1] >> 1
    i = cuda.grid(1)
    if i < R * h:
        r, j = row_col(i, h)
        v0, v1 = gate_val(O, G, go, r, 2 * j), gate_val(O, G, go, r, 2 * j + 1)
        ru, k = np.uint64(r), np.uint64(2 * j)  # unsigned: no negative-index wrap code
        out[ru, k] = v0
        out[ru, k + np.uint64(1)] = v1
        xp[ru, np.uint64(j)] = bf16_pair(v0, v1)


@launcher("sigmoid_gate")
def sigmoid_gate_cuda(O, G, go, out, R, xp=None):
    n = O.shape[1]
    if xp is None:
        launch(sigmoid_gate_k, *grid1(R * n), O, G, go, out, R)
        return
    if n % 2 != 0 or xp.shape[0] < R or 2 * xp.shape[1] < n:
        raise ValueError(PACK_ERROR)
    launch(sigmoid_gate_pk_k, *grid1(R * (n >> 1)), O, G, go, out, R, xp)


# ------------------------------------------------------------------------------------------------
# the non-finite flag
# ------------------------------------------------------------------------------------------------
@body
def nonfinite(v):
    return v != v or v == np.inf or v == -np.inf


@twin("nonfinite_flag")
def nonfinite_flag_cpu(X, R, flags, slot):
    """flags[slot] = 1 when X[:R] holds a NaN or Inf."""
    for r in range(R):
        for c in range(X.shape[1]):
            if nonfinite(X[r, c]):
                flags[slot] = 1
                return


@kernel
def nonfinite_flag_k(X, R, flags, slot):
    i = cuda.grid(1)
    if i < R * X.shape[1]:
        r, c = row_col(i, X.shape[1])
        if nonfinite(X[r, c]):
            flags[slot] = 1


@launcher("nonfinite_flag")
def nonfinite_flag_cuda(X, R, flags, slot):
    launch(nonfinite_flag_k, *grid1(R * X.shape[1]), X, R, flags, slot)


# ------------------------------------------------------------------------------------------------
# a step's inputs
# ------------------------------------------------------------------------------------------------
@twin("copy_i32")
def copy_i32_cpu(src, dst, n):
    """dst[i] = src[i] for i < n (int32, 1-D). A captured step starts with it: its position and
    token ids, written by the host into mapped memory, copied into device memory."""
    for i in range(n):
        dst[i] = src[i]


@kernel
def copy_i32_k(src, dst, n):
    i = cuda.grid(1)
    if i < n:
        dst[i] = src[i]


@launcher("copy_i32")
def copy_i32_cuda(src, dst, n):
    launch(copy_i32_k, *grid1(n), src, dst, n)
