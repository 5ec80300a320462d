"""The DeltaNet's causal depthwise conv1d + SiLU, with its rolling state.

Shapes: X[:, xo : xo + C] the R input rows; W [C, K] the taps (oldest first); state [K−1, C] the
previous K−1 inputs (oldest first; updated); out [R, C]. With ``capture``, cap[t, :, c] receives
channel c's state after row t (for rollback). Per channel and row: the taps over the state as an
fma chain from +0, then the new input's tap, then ``silu`` (:func:`conv_channel`). The twin loops
over channels; the CUDA kernel runs one thread per channel.
"""

from __future__ import annotations

from .exact import fma_chain, silu32
from .tags import body, cuda, fma, grid1, kernel, launch, launcher, twin


@body
def conv_channel(X, xo, W, state, out, c, T, K, cap, capture):
    """Channel c over T rows (see the module docstring)."""
    for t in range(T):
        x = X[t, xo + c]
        out[t, c] = silu32(fma(W[c, K - 1], x, fma_chain(W[c], state[:, c], K - 1, 0)))
        for j in range(K - 2):
            state[j, c] = state[j + 1, c]
        if K > 1:
            state[K - 2, c] = x
        if capture:
            for j in range(K - 1):
                cap[t, j, c] = state[j, c]


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


@launcher("conv1d_silu")
def conv1d_silu_cuda(X, xo, W, state, out, R, cap, capture):
    """One thread per channel."""
    launch(conv1d_silu_k, *grid1(W.shape[0]), X, xo, W, state, out, R, cap, capture)
