"""The CUDA target's primitives and launch machinery (imported by :mod:`numba_kernels.cuda` only).

- **Primitives** bound into every kernel and body: ``fma`` (``cuda.fma``), ``fmul``
  (``__fmul_rn``, never contracted), ``sqrt32``, ``bits_to_f32``, ``widen`` (bf16 bits → float32,
  exactly), ``barrier`` (``syncthreads``), ``syncwarp``. Under Numba's simulator
  (``NUMBA_ENABLE_CUDASIM=1``, ``SIMULATED``) they round exactly like the GPU: ``fma`` is the CPU
  twin's ``llvm.fma.f32`` (one rounding), ``fmul`` and ``sqrt32`` round to float32 once and return
  numpy float32 scalars, so every other operation of a kernel is numpy float32 arithmetic (NEP 50:
  a Python int or float beside a float32 stays float32). So a simulated kernel computes the GPU's
  bits, and the CPU tests compare them with the twin's bitwise.
- **Generated kernels** (:func:`generated`): a family's ``@generator`` writes the source of one
  configuration (a :class:`~numba_kernels.tags.KernelSource`); it is compiled once per process in
  the CUDA namespace (every body, constant and primitive) plus the memory primitives of
  :mod:`numba_kernels.intrin`, ``devf`` (a force-inlined device function; a plain function under
  the simulator) and ``ALIGN`` (16, or None under the simulator, which refuses alignments). On
  the GPU its ``fma(`` / ``fmul(`` calls become the builtins ``cuda.fma`` / ``libdevice.fmul_rn``
  (the same instructions; Numba types a builtin faster than a device function).
- **Launches**: every launch goes through :func:`launch`, with the kernel's dynamic shared memory
  (a :class:`Kernel`'s ``smem``). Normally it runs at once on the default stream; inside
  :func:`capture` it is recorded into a CUDA graph (a ``cuda.core`` GraphBuilder; under the
  simulator, a list) that :meth:`Graph.replay` runs again. A kernel that needs more than
  ``STATIC_SMEM`` bytes has its limit raised once per compiled overload, at its first launch.
- **Programmatic dependent launch** (:func:`pdl_on`: sm_90 and newer, ``PRIMEWALK_PDL`` not
  ``0``): ``launch(..., pdl=True)`` inside :func:`capture` records a kernel with the
  programmatic-serialization attribute, so that its blocks may start while the kernel before it still runs (from that
  kernel's ``pdl_trigger()``) -- the kernel must ``pdl_wait()`` before it reads anything an
  earlier kernel wrote or writes anything at all (the GEMVs stream their weights before it).
  The attribute goes into a captured graph as a programmatic edge. Scheduling only: the
  kernels' arithmetic and so their bits are the same with PDL on or off.
- **Nothing is built, allocated or set during a capture**: building a generated kernel, growing a
  kernel-owned buffer (:func:`scratch`, :func:`zero_buffer`) or raising a shared-memory limit
  inside :func:`capture` raises instead. The engine runs every step once uncaptured before it
  captures it (``harness.engine.graphs``), which does all three.
- **Kernel-owned buffers**: :func:`scratch` hands out device buffers that a kernel family owns
  (the split-KV statistics); :func:`capture` keeps every one of them, and the zero buffers of
  :func:`zero_pos` / :func:`zero_buffer`, alive with the graph.
"""

from __future__ import annotations

import collections
import math
import os
import re
import threading
import warnings

import numpy as np

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")  # small grids are expected for decode

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still names np.row_stack
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402
from numba.core.errors import NumbaPerformanceWarning  # noqa: E402

from . import intrin  # noqa: E402
from .exact import F32  # noqa: E402
from .tags import STATIC_SMEM  # noqa: E402

warnings.simplefilter("ignore", NumbaPerformanceWarning)  # small grids are expected for decode

from .intrin import SIMULATED  # noqa: E402
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

    from numba.cuda.extending import intrinsic as _intrinsic

    from .cpu import wbits_intrinsic, widen_intrinsic

    widen = _intrinsic(widen_intrinsic)  # the CPU twin's typing and code
    wbits = _intrinsic(wbits_intrinsic)

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

    def widen(x):
        if isinstance(x, np.uint16):
            return np.array([int(x) << 16], np.uint32).view(np.float32)[0]
        return F32(x)

    def wbits(x):
        if isinstance(x, np.uint16):
            return np.uint32(int(x) << 16)
        if isinstance(x, (np.float32, float)):
            return np.array([x], np.float32).view(np.uint32)[0]
        return np.uint32(x)

    @dev
    def syncwarp():  # the simulator has no warp barrier; a block barrier is a stronger one
        cuda.syncthreads()


@dev
def barrier():
    cuda.syncthreads()


def grid1(n, tpb=TPB):
    """(blocks, threads) covering n outputs one thread each."""
    return max(1, math.ceil(n / tpb)), tpb


def block_size(n):
    """The threads per block of a kernel whose arithmetic does not depend on them: ``n`` on a GPU,
    at most one warp under the simulator (which runs every thread of a block as a Python thread)."""
    return min(n, 32) if SIMULATED else n


# ------------------------------------------------------------------------------------------------
# launches and graphs
# ------------------------------------------------------------------------------------------------
class _Launch:
    """Where kernel launches go: ``None`` runs them now on the default stream; a list records
    them (graphs under the simulator); a ``cuda.core`` GraphBuilder captures them."""
    target = None


LAUNCHES: collections.Counter = collections.Counter()  # kernel name -> launches issued through launch()
_NAMES: dict = {}


def launch(kernel, grid, block, *args, pdl=False):
    """Every launch of this package goes through here (see :func:`capture`). ``kernel``: a
    ``cuda.jit`` kernel, or a generated :class:`Kernel` (launched with its dynamic shared
    memory, its limit raised first where it needs more than ``STATIC_SMEM``). ``pdl``: captured
    with the programmatic-serialization attribute where :func:`pdl_on` (the kernel waits with
    ``pdl_wait()`` before it touches what earlier kernels wrote); launches that run at once stay
    plain (a captured step is what replays every token)."""
    if isinstance(kernel, Kernel):
        name, disp, smem = kernel.name, kernel.disp, kernel.smem
        if smem > STATIC_SMEM:
            kernel.opt_in(args)
    else:
        name = _NAMES.get(id(kernel))
        if name is None:
            name = _NAMES[id(kernel)] = getattr(getattr(kernel, "py_func", kernel), "__name__", "?")
        disp, smem = kernel, 0
    LAUNCHES[name] += 1
    t = _Launch.target
    if isinstance(t, list):
        t.append((disp, grid, block, smem, args))
        return
    if t is None:
        disp[grid, block, 0, smem](*args)
    elif pdl and pdl_on():
        _PDL_TLS.on = True
        try:
            disp[grid, block, t, smem](*args)
        finally:
            _PDL_TLS.on = False
    else:
        disp[grid, block, t, smem](*args)


_PDL_TLS = threading.local()  # .on: this thread's launch in progress carries the PDL attribute
_PDL_STATE: dict = {}


def pdl_on() -> bool:
    """Whether ``launch(..., pdl=True)`` launches with programmatic dependent launch: the kernels'
    ``pdl_trigger`` / ``pdl_wait`` are emitted (:func:`numba_kernels.intrin.pdl_emit`: sm_90 or
    newer, ``PRIMEWALK_PDL`` not ``0``) and this numba-cuda's launch configuration takes the
    attribute. numba-cuda builds each launch's ``cuda.core`` LaunchConfig through its dispatcher
    module's name ``LaunchConfig``; that name is replaced, once, by a function that adds
    ``programmatic_stream_serialization=True`` while this thread's :func:`launch` asks for it
    (a thread-local flag: the launches of other host threads are untouched)."""
    v = _PDL_STATE.get("on")
    if v is None:
        v = False
        if intrin.pdl_emit() and not SIMULATED:
            try:
                from numba.cuda import dispatcher

                base = dispatcher.LaunchConfig
                base(grid=1, block=32, programmatic_stream_serialization=True)

                def config(*a, **kw):
                    if getattr(_PDL_TLS, "on", False):
                        kw["programmatic_stream_serialization"] = True
                    return base(*a, **kw)

                dispatcher.LaunchConfig = config
                v = True
            except Exception:  # noqa: BLE001  (an older cuda.core or numba-cuda: launches stay plain)
                v = False
        _PDL_STATE["on"] = v
    return v


def pass_none_args(kernel_cls=None):
    """Let a launch pass ``None`` for a kernel argument. Kernels here take an optional array as
    ``None`` -- typed ``none``, its branch compiled out (``if xp is not None``: the norms' and
    gates' packed bf16 output, the bf16 GEMV's NaN/Inf flags) -- and numba-cuda 0.30.4 compiles
    such a kernel (a ``none`` parameter is one pointer-sized ``.param``, never read) but its launch
    refuses to marshal the value (``NotImplementedError: (none, None)``). Its ``_Kernel``'s
    argument marshalling is wrapped, once, to pass a null pointer there; every other argument goes
    through numba-cuda's own. Returns whether the wrapper is in place."""
    if kernel_cls is None:
        from numba.cuda import dispatcher

        kernel_cls = getattr(dispatcher, "_Kernel", None)
    base = getattr(kernel_cls, "_prepare_args", None)
    if base is None:
        return False
    if getattr(base, "_passes_none", False):
        return True
    from numba import types as nbtypes

    def prepare(self, ty, val, stream, retr, kernelargs):
        if isinstance(ty, nbtypes.NoneType):
            kernelargs.append(0)  # the parameter's 8 bytes (a pointer-sized integer, as numba-cuda passes pointers)
            return None
        return base(self, ty, val, stream, retr, kernelargs)

    prepare._passes_none = True
    kernel_cls._prepare_args = prepare
    return True


if not SIMULATED:
    pass_none_args()


class Graph:
    """A captured sequence of launches: a CUDA graph (or, under the simulator, the recorded
    launches). :meth:`replay` runs them again with the same arguments (same buffers, same
    scalars) on the default stream, ordered with everything else issued there. ``keep`` holds
    the buffers the launches use, so that they outlive any reallocation by their owners."""

    def __init__(self, graph, keep):
        self.graph, self.keep = graph, keep

    def replay(self):
        if isinstance(self.graph, list):
            for kernel, grid, block, smem, args in self.graph:
                kernel[grid, block, 0, smem](*args)
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


def _not_capturing(what):
    if _Launch.target is not None:
        raise RuntimeError(f"{what} during a capture: run the step once uncaptured first")


def scratch(name, n, dtype=np.float32, least=1 << 20):
    """A device buffer of at least ``n`` elements that the kernels of ``name`` own: reused,
    grown (to at least ``least``) when too small, never shrunk. A graph captured while an
    older buffer was current keeps that one alive."""
    buf = _OWNED.get(name)
    if buf is None or buf.size < n:
        _not_capturing(f"scratch {name!r}: allocating {n} elements")
        buf = _OWNED[name] = cuda.device_array(max(n, least), dtype)
    return buf


def zero_buffer(name, n, dtype=np.float32):
    """A device buffer of ``n`` zeros that the kernels of ``name`` read, or write and leave zero
    again before they end (``greedy_pick``'s done-counter)."""
    z = _OWNED.get(name)
    if z is None or z.size < n:
        _not_capturing(f"zero buffer {name!r}")
        z = _OWNED[name] = cuda.to_device(np.zeros(n, dtype))
    return z


def zero_pos():
    """The int32 [1] zero that position-taking kernels add when no position buffer is given."""
    return zero_buffer("zero_pos", 1, np.int32)


def aligned(a, nbytes=16):
    """The device array's base address and row stride are multiples of ``nbytes`` (vector loads
    may read its rows). Under the simulator only the stride counts: its loads are per element."""
    if a.strides[0] % nbytes:
        return False
    if SIMULATED:
        return True
    return a.__cuda_array_interface__["data"][0] % nbytes == 0


# ------------------------------------------------------------------------------------------------
# generated kernels
# ------------------------------------------------------------------------------------------------
class Kernel:
    """A compiled generated kernel: the ``cuda.jit`` dispatcher ``disp``, its ``name``,
    ``threads`` per block and ``smem`` bytes of dynamic shared memory."""

    def __init__(self, src, ns):
        self.name, self.threads, self.smem, self.source = src.name, src.threads, src.smem, src.text
        text = src.text if SIMULATED else _builtins(src.text)
        ns = dict(ns)
        exec(compile(text, f"<{src.name}>", "exec"), ns)
        fn = ns["kern"]
        fn.__name__ = fn.__qualname__ = src.name
        self.disp = cuda.jit(fn) if SIMULATED else cuda.jit(fn, **dict(src.jit))
        self._opted: set = set()

    def _key(self, args):
        if SIMULATED:
            return tuple((type(a).__name__, str(getattr(a, "dtype", "")), getattr(a, "ndim", None)) for a in args)
        return tuple(self.disp.typeof_pyval(a) for a in args)

    def opt_in(self, args):
        """Raise the overload's dynamic shared-memory limit to ``smem`` (once; never during a
        capture)."""
        key = self._key(args)
        if key in self._opted:
            return
        _not_capturing(f"{self.name}: raising the shared-memory limit to {self.smem} bytes")
        if not SIMULATED:
            _set_max_dynamic_smem(self.disp.compile(key)._codelibrary.get_cufunc(), self.smem)
        self._opted.add(key)


def _set_max_dynamic_smem(f, smem):
    """Allow ``smem`` bytes of dynamic shared memory for the loaded function ``f`` (the driver
    call numba-cuda uses for the carveout)."""
    from numba.cuda.cudadrv.driver import binding, driver

    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    try:  # a CUkernel handle (cuda.core >= 0.6 loads libraries)
        driver.cuKernelSetAttribute(attr, smem, f.handle, f.device.id)
    except Exception:  # noqa: BLE001  (a CUfunction handle: the older API)
        fn = f.handle
        if not isinstance(fn, binding.CUfunction):
            fn = driver.cuKernelGetFunction(f.handle)
        driver.cuFuncSetAttribute(fn, attr, smem)


def _builtins(text):
    """``fma(`` / ``fmul(`` → ``cuda.fma(`` / ``libdevice.fmul_rn(`` (the instructions ``fma`` and
    ``fmul`` wrap; a generated source passes them float32 operands)."""
    text = re.sub(r"(?<![.\w])fma\(", "cuda.fma(", text)
    return re.sub(r"(?<![.\w])fmul\(", "libdevice.fmul_rn(", text)


_GEN_NS: dict = {}  # the namespace generated sources are compiled in (set by numba_kernels.cuda)
_GENERATED: dict = {}  # (generator, configuration) -> Kernel


def set_namespace(ns) -> None:
    """Called once by :mod:`numba_kernels.cuda`: generated sources see its namespace (every body,
    constant and primitive), the memory primitives of :mod:`numba_kernels.intrin`, ``devf`` and
    ``ALIGN``."""
    from numba import float32, int32

    _GEN_NS.clear()
    _GEN_NS.update(ns)
    _GEN_NS.update(intrin.bindings(), float32=float32, int32=int32, min=min, max=max,
                   devf=(lambda f: f) if SIMULATED else cuda.jit(device=True, forceinline=True),
                   ALIGN=None if SIMULATED else 16)
    if not SIMULATED:
        _GEN_NS["libdevice"] = libdevice


def generated(gen, cfg) -> Kernel:
    """The kernel the ``@generator`` ``gen`` writes for configuration ``cfg`` (hashable), compiled
    once per process (never during a capture)."""
    k = _GENERATED.get((gen, cfg))
    if k is None:
        _not_capturing(f"building {gen.__name__}({cfg!r})")
        k = _GENERATED[(gen, cfg)] = Kernel(gen(cfg), _GEN_NS)
    return k


def bindings() -> dict:
    """The names :mod:`numba_kernels.tags` leaves to the target, bound for CUDA."""
    return dict(fma=fma, fmul=fmul, sqrt32=sqrt32, bits_to_f32=bits_to_f32, widen=widen, wbits=wbits,
                barrier=barrier, syncwarp=syncwarp, pdl_trigger=intrin.pdl_trigger, cuda=cuda, launch=launch, pdl_on=pdl_on, grid1=grid1, block_size=block_size, zero_pos=zero_pos,
                scratch=scratch, zero_buffer=zero_buffer, generated=generated, aligned=aligned)
