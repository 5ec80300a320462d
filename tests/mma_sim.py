"""The tensor-core kernels of ``numba_kernels/mma_tc.py`` under Numba's CUDA simulator.

Imported in a process started with ``NUMBA_ENABLE_CUDASIM=1``: :func:`load` returns the module
with its PTX primitives replaced by warp-collective Python ones, so the kernels' indexing, swizzles,
stage rings, tails and masks run on a CPU and their outputs can be compared bit for bit with the
CPU twin (``tests/test_sim_mma_tc.py``). The arithmetic of the MMA itself is the twin's
(``mma_steps``: the rule that matches every recorded H200 output, ``numba_kernels/MMA.md``), so
what this checks is that each kernel feeds every output the chain the twin defines; that the
H200 computes the rule is ``harness mma-check`` on the recorded vectors and ``harness
device-check`` on the GPU.

The simulator runs a block's threads as Python threads (one at a time: ``tests/cudasim_blocks.py``).
A warp-collective primitive (``mma.sync``, ``ldmatrix``) is emulated by the warp's 32 lanes
posting their operands at a gate of the 32, one lane computing every lane's result, and each lane
taking its own (``cudasim_blocks.warp_collective``; with ``PRIMEWALK_SIMSCHED=0``, a
``threading.Barrier`` of the 32): the
kernels call these under warp-uniform conditions only (as ``.sync.aligned`` requires on the
GPU), so all 32 lanes arrive. The primitives the module takes from ``numba_kernels.intrin`` that
the simulator branch there lacks (``ldg4u``) are supplied here too. Only tests import this file:
the harness changes nothing the kernels or the fingerprinted tree contain.
"""

from __future__ import annotations

import threading

import numpy as np

import cudasim_blocks

_LOCK = threading.Lock()
_WARPS: dict = {}
_TIMEOUT_S = 120.0  # a lane that never arrives (a kernel bug) fails the case instead of hanging it


class _Warp:
    def __init__(self):
        self.barrier = threading.Barrier(32, timeout=_TIMEOUT_S)
        self.slots = [None] * 32
        self.out = None


def _me():
    """(this warp's exchange, lane) of the calling simulator thread."""
    t = threading.current_thread()
    key = (id(t._manager), tuple(t.blockIdx), t.thread_id >> 5)
    with _LOCK:
        w = _WARPS.get(key)
        if w is None:
            w = _WARPS[key] = _Warp()
    return w, t.thread_id & 31


def _collective(value, compute):
    """Every lane posts value; lane 0 runs compute(the 32 values) -> 32 results; each lane gets its own."""
    if cudasim_blocks.active():  # one simulated thread at a time: the baton's warp gate
        return cudasim_blocks.warp_collective(value, compute)
    w, lane = _me()
    w.slots[lane] = value
    w.barrier.wait()
    if lane == 0:
        w.out = compute(list(w.slots))
    w.barrier.wait()
    r = w.out[lane]
    w.barrier.wait()  # every lane has its result before the slots are reused
    return r


def _mma(slots):
    """One m16n8k16 bf16 MMA of the warp's fragments (PTX ISA layout: lane = 4g + q; A (row g, k 2q),
    (row g+8, k 2q), (row g, k 2q+8), (row g+8, k 2q+8); B (k 2q, col g), (k 2q+8, col g); C/D (row
    g, col 2q, 2q+1), (row g+8, col 2q, 2q+1); a register's lower k in its low half) by the twin."""
    from numba_kernels import cpu

    A = np.zeros((16, 16), np.uint32)
    B = np.zeros((16, 8), np.uint32)
    C = np.zeros((16, 8), np.uint32)
    for lane, (a, b, c) in enumerate(slots):
        g, q = lane >> 2, lane & 3
        for reg, (row, k) in enumerate(((g, 2 * q), (g + 8, 2 * q), (g, 2 * q + 8), (g + 8, 2 * q + 8))):
            A[row, k] = int(a[reg]) & 0xFFFF
            A[row, k + 1] = int(a[reg]) >> 16
        for reg, k in enumerate((2 * q, 2 * q + 8)):
            B[k, g] = int(b[reg]) & 0xFFFF
            B[k + 1, g] = int(b[reg]) >> 16
        for reg, (row, col) in enumerate(((g, 2 * q), (g, 2 * q + 1), (g + 8, 2 * q), (g + 8, 2 * q + 1))):
            C[row, col] = int(c[reg])
    Af = (A << np.uint32(16)).view(np.float32).reshape(1, 16, 16)
    Bf = (B << np.uint32(16)).view(np.float32).reshape(1, 16, 8)
    D = np.zeros((1, 16, 8), np.uint32)
    cpu.mma_steps(Af, Bf, C.view(np.float32).reshape(1, 16, 8), D)
    out = []
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        out.append(tuple(np.uint32(D[0, row, col]) for row, col in
                         ((g, 2 * q), (g, 2 * q + 1), (g + 8, 2 * q), (g + 8, 2 * q + 1))))
    return out


def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _collective(((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3)), _mma)


def ldsm4(S, i):
    """``ldmatrix.x4``: lane L gives the address of row L & 7 of matrix L >> 3; lane (g, q) gets word
    q of row g of each matrix."""
    def compute(slots):
        arr = slots[0][0]
        addr = [int(s[1]) for s in slots]
        return [tuple(np.uint32(arr[addr[8 * m + (lane >> 2)] + (lane & 3)]) for m in range(4))
                for lane in range(32)]

    return _collective((S, i), compute)


def any_sync(mask, pred):
    """``__any_sync`` over the full warp (the kernels pass 0xFFFFFFFF)."""
    assert mask == 0xFFFFFFFF
    return _collective(bool(pred), lambda v: [any(v)] * 32)


def ldg4u(A, off, p):
    """4 uint32 words at flat element ``off`` of ``A``, or zeros where not ``p``."""
    from numba_kernels.intrin import _flat  # the simulator branch's flat addressing

    if not p:
        z = np.uint32(0)
        return z, z, z, z
    row, c = _flat(A, off)
    return tuple(np.uint32(row[c + k]) for k in range(4))


def f2u(x):
    """float32 → its bits (uint32)."""
    return np.float32(x).view(np.uint32)


def u2f(u):
    """bits (uint32) → float32."""
    return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


def load():
    """numba_kernels.mma_tc with the simulator's primitives (call once per process, simulator on)."""
    from numba.core import config

    assert config.ENABLE_CUDASIM, "tests/mma_sim.py needs NUMBA_ENABLE_CUDASIM=1 before numba is imported"
    from numba_kernels import cuda as kc
    from numba_kernels import intrin

    if not hasattr(intrin, "ldg4u"):
        intrin.ldg4u = ldg4u
    from numba import cuda

    jit = cuda.jit

    def sim_jit(*args, **kw):  # the simulator's jit takes no register budget
        kw.pop("max_registers", None)
        return jit(*args, **kw)

    from numba.cuda.simulator import kernelapi

    cudasim_blocks.install()  # the baton scheduler; shared arrays under a lock, alignment accepted
    if not hasattr(kernelapi.FakeCUDAModule, "any_sync"):  # the warp vote, absent from the simulator
        kernelapi.FakeCUDAModule.any_sync = lambda self, mask, pred: any_sync(mask, pred)
    cuda.jit = sim_jit
    try:
        from numba_kernels import mma_tc
    finally:
        cuda.jit = jit

    mma_tc.mma_bf16 = mma_bf16
    mma_tc.ldsm4 = ldsm4
    mma_tc.ldg4u = ldg4u
    mma_tc._f2u = f2u  # libdevice's bit casts are stubs under the simulator
    mma_tc._u2f = u2f
    mma_tc.bind(kc._NS)
    return mma_tc
