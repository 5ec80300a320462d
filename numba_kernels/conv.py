"""The DeltaNet's causal depthwise conv1d + SiLU, with its rolling state.

Shapes: X[:, xo : xo + C] the R input rows; W [C, K] the taps (oldest first); state [K−1, C] the
previous K−1 inputs (oldest first; updated); out [R, C]. With ``capture``, cap[t, :, c] receives
channel c's state after row t (for rollback). Per channel and row: the taps over the state as an
fma chain from +0, then the new input's tap, then ``silu`` (:func:`conv_channel`). The twin loops
over channels. On CUDA, up to ``CONV_SEQ_MAX_ROWS`` rows (decode, verify) run one thread per
channel (:func:`conv_channel`, one launch); more rows (primes) one thread per (row, channel)
(:func:`conv_at`: a row's window is the K−1 inputs before it, read from X, or from the state for
the first K−1 rows; the same values in the same fma chain), then one thread per channel writes the
new state (:func:`conv_state`). An output never depends on an earlier output, only on inputs, so
the rows need no order.
"""

from __future__ import annotations

import numpy as np

from .dispatch import CONV_SEQ_MAX_ROWS
from .exact import ZERO, silu32
from .tags import body, cuda, fma, grid1, kernel, launch, launcher, twin


@body
def conv_channel(X, xo, W, state, out, c, T, K, cap, capture):
    """Channel c over T rows (see the module docstring): the state's taps as an fma chain from +0
    in tap order (``fma_chain(W[c], state[:, c], K − 1, 0)`` written out), then the new input's
    tap. Unsigned indices and counters: no negative-index wrap code, no range-iterator bookkeeping."""
    cu = np.uint64(c)
    xc = np.uint64(xo + c)
    k1 = np.uint64(K - 1)
    one = np.uint64(1)
    t = np.uint64(0)
    while t < np.uint64(T):
        x = X[t, xc]
        part = ZERO
        j = np.uint64(0)
        while j < k1:
            part = fma(W[cu, j], state[j, cu], part)
            j += one
        out[t, cu] = silu32(fma(W[cu, k1], x, part))
        j = np.uint64(0)
        while j + one < k1:
            state[j, cu] = state[j + one, cu]
            j += one
        if K > 1:
            state[k1 - one, cu] = x
        if capture:
            j = np.uint64(0)
            while j < k1:
                cap[t, j, cu] = state[j, cu]
                j += one
        t += one


@twin("conv1d_silu")
def conv1d_silu_cpu(X, xo, W, state, out, R, cap, capture):
    """Causal depthwise conv + SiLU over channels of X[:, xo:xo+C]; state [K-1, C] updated."""
    C, K = W.shape
    for c in range(C):
        conv_channel(X, xo, W, state, out, c, R, K, cap, capture)


@kernel
def conv1d_silu_k(X, xo, W, state, out, R, cap, capture):
    c = cuda.grid(1)
    C, K = W.shape
    if c < C:
        conv_channel(X, xo, W, state, out, c, R, K, cap, capture)


@body
def conv_in(X, xo, state, c, s, K):
    """Channel c's input at row s ≥ −(K−1) of this launch: X's row s, or (s < 0) the state's
    slot K−1+s as it was before the launch."""
    if s >= 0:
        return X[s, xo + c]
    return state[K - 1 + s, c]


@body
def conv_at(X, xo, W, state, out, c, t, K, cap, capture):
    """Row t of channel c: :func:`conv_channel`'s arithmetic on the row's window of inputs. Where
    the window lies in X (every row from K−1 on) the taps are read at unsigned indices by an
    unsigned counter: the same fma chain, without the signed indices' negative-index wrap code
    and the range iterator's bookkeeping (a branch and 64-bit index arithmetic a tap before; the
    prime's conv instruction-bound at 0.57 TB/s: receipts/probes/README.md)."""
    part = ZERO
    cu = np.uint64(c)
    xc = np.uint64(xo + c)
    if t >= K - 1:
        r = np.uint64(t - (K - 1))
        k1 = np.uint64(K - 1)
        j = np.uint64(0)
        while j < k1:
            part = fma(W[cu, j], X[r + j, xc], part)
            j += np.uint64(1)
    else:
        for j in range(K - 1):
            part = fma(W[c, j], conv_in(X, xo, state, c, t - (K - 1) + j, K), part)
    out[np.uint64(t), cu] = silu32(fma(W[cu, np.uint64(K - 1)], X[np.uint64(t), xc], part))
    if capture:
        for j in range(K - 1):
            cap[t, j, c] = conv_in(X, xo, state, c, t - (K - 2) + j, K)


@body
def conv_state(X, xo, state, c, T, K):
    """Channel c's state after T rows: the last K−1 inputs (slot j reads slot T + j of the old
    state when that is still a state slot: a later slot, not yet overwritten)."""
    for j in range(K - 1):
        state[j, c] = conv_in(X, xo, state, c, T - (K - 1) + j, K)


@kernel
def conv1d_silu_rows_k(X, xo, W, state, out, R, cap, capture):
    i = cuda.grid(1)
    C, K = W.shape
    if i < R * C:
        t = i // C
        conv_at(X, xo, W, state, out, i - t * C, t, K, cap, capture)


@kernel
def conv1d_silu_state_k(X, xo, W, state, R):
    c = cuda.grid(1)
    C, K = W.shape
    if c < C:
        conv_state(X, xo, state, c, R, K)


@launcher("conv1d_silu")
def conv1d_silu_cuda(X, xo, W, state, out, R, cap, capture):
    """One thread per channel up to ``CONV_SEQ_MAX_ROWS`` rows; past that one per (row, channel),
    then the state (see the module docstring)."""
    C = W.shape[0]
    if R <= CONV_SEQ_MAX_ROWS:
        launch(conv1d_silu_k, *grid1(C), X, xo, W, state, out, R, cap, capture)
        return
    launch(conv1d_silu_rows_k, *grid1(R * C), X, xo, W, state, out, R, cap, capture)
    launch(conv1d_silu_state_k, *grid1(C), X, xo, W, state, R)
