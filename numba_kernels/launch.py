"""The CUDA target's primitives and launch machinery (imported by :mod:`numba_kernels.cuda` only).

- **Primitives** bound into every kernel and body: ``fma`` (``cuda.fma``), ``fmul``
  (``__fmul_rn``, never contracted), ``sqrt32``, ``bits_to_f32``, ``barrier`` (``syncthreads``),
  ``syncwarp``. Under Numba's simulator (``NUMBA_ENABLE_CUDASIM=1``, ``SIMULATED``) they round
  exactly like the GPU: ``fma`` is the CPU twin's ``llvm.fma.f32`` (one rounding), ``fmul`` and
  ``sqrt32`` round to float32 once and return numpy float32 scalars, so every other operation of
  a kernel is numpy float32 arithmetic (NEP 50: a Python int or float beside a float32 stays
  float32). So a simulated kernel computes the GPU's bits, and the CPU tests compare them with
  the twin's bitwise.
- **Launches**: every launch goes through :func:`launch`. Normally it runs at once on the default
  stream; inside :func:`capture` it is recorded into a CUDA graph (a ``cuda.core``
  GraphBuilder; under the simulator, a list) that :meth:`Graph.replay` runs again.
- **Kernel-owned buffers**: :func:`scratch` hands out device buffers that a kernel family owns
  (the split-KV statistics); :func:`capture` keeps every one of them, and the position zero of
  :func:`zero_pos`, alive with the graph.
"""

from __future__ import annotations

import collections
import math
import os
import warnings

import numpy as np

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")  # small grids are expected for decode

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still names np.row_stack
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402
from numba.core import config as _nb_config  # noqa: E402
from numba.core.errors import NumbaPerformanceWarning  # noqa: E402

from .exact import F32  # noqa: E402

warnings.simplefilter("ignore", NumbaPerformanceWarning)  # small grids are expected for decode

SIMULATED = bool(_nb_config.ENABLE_CUDASIM)
TPB = 128  # threads per block of the one-thread-per-output kernels
dev = cuda.jit(device=True)

if not SIMULATED:
    from numba.cuda import libdevice

    @dev
    def fma(a, b, c):
        return cuda.fma(F32(a), F32(b), F32(c))

    @dev
    def fmul(a, b):
        return libdevice.fmul_rn(F32(a), F32(b))

    @dev
    def bits_to_f32(i):
        return libdevice.int_as_float(np.int32(i))

    sqrt32 = math.sqrt  # IEEE (sqrt.rn.f32) on a float32 with fastmath off

    @dev
    def syncwarp():
        cuda.syncwarp(0xFFFFFFFF)
else:
    from . import cpu as _cpu

    def fma(a, b, c):  # the CPU twin's llvm.fma.f32: one rounding, as on the GPU
        return F32(_cpu.fma(F32(a), F32(b), F32(c)))

    def fmul(a, b):
        return F32(a) * F32(b)

    def sqrt32(x):
        return F32(math.sqrt(F32(x)))  # double sqrt, rounded once: the float32 sqrt exactly

    def bits_to_f32(i):
        return np.array([i], np.int32).view(np.float32)[0]

    @dev
    def syncwarp():  # the simulator has no warp barrier; a block barrier is a stronger one
        cuda.syncthreads()


@dev
def barrier():
    cuda.syncthreads()


def grid1(n, tpb=TPB):
    """(blocks, threads) covering n outputs one thread each."""
    return max(1, math.ceil(n / tpb)), tpb


# ------------------------------------------------------------------------------------------------
# launches and graphs
# ------------------------------------------------------------------------------------------------
class _Launch:
    """Where kernel launches go: ``None`` runs them now on the default stream; a list records
    them (graphs under the simulator); a ``cuda.core`` GraphBuilder captures them."""
    target = None


LAUNCHES: collections.Counter = collections.Counter()  # kernel name -> launches issued through launch()
_NAMES: dict = {}


def launch(kernel, grid, block, *args):
    """Every launch of this package goes through here (see :func:`capture`)."""
    name = _NAMES.get(id(kernel))
    if name is None:
        name = _NAMES[id(kernel)] = getattr(getattr(kernel, "py_func", kernel), "__name__", "?")
    LAUNCHES[name] += 1
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


_CORE: dict = {}


def _legacy_stream():
    s = _CORE.get("stream")
    if s is None:
        s = _CORE["stream"] = _core()[1].from_handle(0)
    return s


def capture(fn, keep=()):
    """Call ``fn()`` with this package's launches captured instead of run (nothing executes).
    Returns (:class:`Graph`, what ``fn`` returned). ``fn`` must only launch kernels of this
    package: no copies, no synchronisation. Buffers that ``fn`` allocates on a first call should
    be allocated by an ordinary (uncaptured) call first."""
    if _Launch.target is not None:
        raise RuntimeError("capture: already capturing")
    if SIMULATED:
        rec = []
        _Launch.target = rec
        try:
            res = fn()
        finally:
            _Launch.target = None
        return Graph(rec, list(keep) + list(_OWNED.values())), res
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
    return Graph(gb.complete(), list(keep) + list(_OWNED.values())), res


# ------------------------------------------------------------------------------------------------
# kernel-owned buffers
# ------------------------------------------------------------------------------------------------
_OWNED: dict = {}  # name -> device array; capture() keeps every one alive


def scratch(name, n, dtype=np.float32, least=1 << 20):
    """A device buffer of at least ``n`` elements that the kernels of ``name`` own: reused,
    grown (to at least ``least``) when too small, never shrunk. A graph captured while an
    older buffer was current keeps that one alive."""
    buf = _OWNED.get(name)
    if buf is None or buf.size < n:
        buf = _OWNED[name] = cuda.device_array(max(n, least), dtype)
    return buf


def zero_pos():
    """The int32 [1] zero that position-taking kernels add when no position buffer is given."""
    z = _OWNED.get("zero_pos")
    if z is None:
        z = _OWNED["zero_pos"] = cuda.to_device(np.zeros(1, np.int32))
    return z


def bindings() -> dict:
    """The names :mod:`numba_kernels.tags` leaves to the target, bound for CUDA."""
    return dict(fma=fma, fmul=fmul, sqrt32=sqrt32, bits_to_f32=bits_to_f32, barrier=barrier, syncwarp=syncwarp,
                cuda=cuda, launch=launch, grid1=grid1, zero_pos=zero_pos, scratch=scratch)
