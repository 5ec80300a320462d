"""Backend selection: ``cpu`` (the Numba CPU twin, default) or ``cuda``.

A backend bundles the op set (:mod:`numba_kernels.cpu` or :mod:`numba_kernels.cuda`, same names
and signatures) with array helpers (allocate, upload, download, copy). It is chosen once, by
argument or by ``PRIMEWALK_BACKEND``; importing primewalk never imports CUDA.
"""

from __future__ import annotations

import os
import platform
import threading
import weakref

import numpy as np

from ..errors import PrimewalkError

BACKENDS = ("cpu", "cuda")


class CpuBackend:
    name = "cpu"

    def __init__(self):
        from numba_kernels import cpu

        from .threads import configure

        self.ops = cpu
        self.threads, self.threads_why = configure()  # how many Numba threads (.threads says why)

    def device_name(self) -> str:
        proc = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        proc = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        return f"cpu: {proc}"

    def pdl(self) -> bool:  # programmatic dependent launch is a CUDA launch attribute
        return False

    def driver(self):
        return None

    def empty(self, shape, dtype=np.float32):
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def upload(self, a):
        return np.ascontiguousarray(a)

    def mapped_zeros(self, shape, dtype=np.int32):
        return np.zeros(shape, dtype)

    def download(self, a):
        return np.array(a, copy=True)

    def copy_into(self, dst, src):
        dst[...] = src

    def clone(self, a, step=False):
        return a.copy()

    def copy_plan(self, pairs):
        """A reusable list of copies (``dst``, ``src`` arrays of one shape and dtype) for
        :meth:`run_copies`."""
        return [(_same_layout(dst, src), src) for dst, src in pairs]

    def run_copies(self, plan):
        for dst, src in plan:
            dst[...] = src

    def mapped_target(self, shape, dtype=np.float32):
        return None  # logits are host arrays already

    def pinned_empty(self, shape, dtype=np.float32):
        return np.empty(shape, dtype)

    def download_async(self, dst, src, done=None):
        dst[...] = src  # the CPU's launches ran already

    def event(self):
        return None

    def record(self, ev):
        pass

    def wait(self, ev):
        pass

    def synchronize(self):
        pass


class CudaBackend:
    name = "cuda"

    def __init__(self):
        try:
            from numba import cuda
        except Exception as e:  # pragma: no cover - depends on the install
            raise PrimewalkError(f"backend cuda: numba-cuda is not importable ({e})") from None
        try:
            ok = cuda.is_available()
        except Exception:  # pragma: no cover
            ok = False
        if not ok:
            raise PrimewalkError("backend cuda: no CUDA GPU or driver is available on this machine "
                                 "(use --backend cpu)")
        try:
            from numba_kernels import cuda as kcuda
        except ValueError as e:  # a bad PRIMEWALK_* setting of the kernels
            raise PrimewalkError(f"backend cuda: {e}") from None

        self.cuda = cuda
        self.ops = kcuda
        self.threads, self.threads_why = None, "cuda"  # host threads do not run kernels here
        # the copies of a step go straight to the driver (one call each) on a GPU; under the
        # simulator through numba's device arrays
        self._drv = None if kcuda.SIMULATED else _raw_driver()
        self._pin = threading.local()  # per host thread: a pinned staging buffer for downloads

    def device_name(self) -> str:
        d = self.cuda.get_current_device()
        name = getattr(d, "name", "simulator")
        name = name.decode() if isinstance(name, bytes) else str(name)
        cc = getattr(d, "compute_capability", None)
        return f"cuda: {name}" + (f" (cc {cc[0]}.{cc[1]})" if cc else "")

    def pdl(self) -> bool:
        """Whether captured steps launch their GEMVs with programmatic dependent launch
        (``numba_kernels.launch.pdl_on``: sm_90 on, ``PRIMEWALK_PDL`` not 0); the bits are the
        same either way."""
        return bool(self.ops.launch.pdl_on())

    def driver(self):
        try:
            v = self.cuda.driver.driver.get_version()
            return f"{v[0]}.{v[1]}" if isinstance(v, tuple) else str(v)
        except Exception:  # pragma: no cover
            return None

    def empty(self, shape, dtype=np.float32):
        return self.cuda.device_array(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return self.cuda.to_device(np.zeros(shape, dtype))

    def upload(self, a):
        return self.cuda.to_device(np.ascontiguousarray(a))

    def mapped_zeros(self, shape, dtype=np.int32):
        """Zeros in host memory the kernels address directly (pinned and mapped): the host reads
        it after a synchronising call and writes it between steps, with no driver copy."""
        a = self.cuda.mapped_array(shape, dtype)
        a[...] = 0
        return a

    def download(self, a):
        """``a`` on the host, in memory the caller owns. A contiguous array of PINNED_MIN_BYTES to
        POOL_MAX_BYTES comes back in one of this thread's pooled pinned buffers: one driver copy
        at pinned speed, no host copy (a 3 MB verify step's logits: ~0.27 ms of host copy saved
        on the H200's host). A pooled buffer is written again only once nothing outside the pool
        refers to it (:meth:`_pooled`), so an array the caller keeps is never overwritten. Larger
        arrays, and any while every pooled buffer is held, go through this thread's pinned
        staging buffer (one driver copy, then a host copy into a new array); others through
        numba."""
        if self._drv is None or not _contiguous(a) or a.nbytes < PINNED_MIN_BYTES:
            if self._drv is not None and _contiguous(a) and a.size:
                out = np.empty(a.shape, a.dtype)
                self._drv.device_to_host(out, a, a.nbytes)
                return out
            return a.copy_to_host()
        entry = self._pooled(a.nbytes) if a.nbytes <= POOL_MAX_BYTES else None
        if entry is not None:
            return self._hand_out(entry, a)
        pin = getattr(self._pin, "buf", None)
        if pin is None or pin.size < a.nbytes:
            pin = self._pin.buf = self.cuda.pinned_array(max(a.nbytes, 2 * (0 if pin is None else pin.size)), np.uint8)
        self._drv.device_to_host(pin, a, a.nbytes)
        return pin[:a.nbytes].view(a.dtype).reshape(a.shape).copy()

    def _pooled(self, nbytes):
        """A pooled entry ``[pinned uint8 buffer, weak reference]`` of this thread with at least
        ``nbytes`` that nothing handed out refers to any more (its weak reference to the last
        handout's anchor, :func:`_anchor`, is dead): the smallest such (best fit, so a small
        download does not hold the buffer a large one needs); else a new one, added while the
        pool has fewer than POOL_BUFFERS, or replacing a free buffer too small; else None."""
        pool = self._pin.__dict__.setdefault("pool", [])
        best = small = None
        for i, entry in enumerate(pool):
            if entry[1] is None or entry[1]() is None:
                if entry[0].nbytes >= nbytes:
                    if best is None or entry[0].nbytes < best[0].nbytes:
                        best = entry
                else:
                    small = i
        if best is not None:
            return best
        if len(pool) >= POOL_BUFFERS and small is None:
            return None
        entry = [self.cuda.pinned_array(max(nbytes, POOL_MIN_BYTES), np.uint8), None]
        if len(pool) < POOL_BUFFERS:
            pool.append(entry)
        else:
            pool[small] = entry  # free but too small: replaced by a larger one
        return entry

    def _hand_out(self, entry, a):
        """Download ``a`` into the pooled ``entry`` and return it as a new array over that
        memory; the entry stays held while anything of it is alive (an anchor that cannot be
        watched keeps it held for good: the staging path serves from then on)."""
        buf = entry[0]
        self._drv.device_to_host(buf, a, a.nbytes)
        out = np.frombuffer(memoryview(buf), a.dtype, a.size).reshape(a.shape)
        entry[1] = _holder(out, buf)
        return out

    def copy_into(self, dst, src):
        on_device = getattr(src, "__cuda_memory__", False)
        if not on_device and isinstance(src, np.ndarray):
            src = np.ascontiguousarray(src)
        fast = (self._drv is not None and (on_device or isinstance(src, np.ndarray)) and _contiguous(dst)
                and _contiguous(src) and src.dtype == dst.dtype and src.shape == dst.shape)
        if not fast:
            dst.copy_to_device(src)
        elif src.size:
            (self._drv.device_to_device if on_device else self._drv.host_to_device)(dst, src, src.nbytes)

    def copy_plan(self, pairs):
        """The device-to-device copies ``pairs`` (``(dst, src)`` device arrays of one shape and
        dtype, each one C-contiguous run), checked once, for :meth:`run_copies` to issue again
        and again. A DeltaNet rollback's two copies a layer, each making its views, checking
        them and copying synchronously, took ~0.71 ms of host time a rollback on an H100
        (``tools/probe_spec_round.py``, ``receipts/probes/h100-probe-spec-round-1acdcce/``)."""
        plan = []
        for dst, src in pairs:
            _same_layout(dst, src)
            if self._drv is not None and not (_contiguous(dst) and _contiguous(src)):
                raise PrimewalkError("copy_plan: a copy between arrays that are not one contiguous run each")
            plan.append((dst, src))
        return plan

    def run_copies(self, plan):
        """Queue :meth:`copy_plan`'s copies, in order, on the stream every launch goes to (the
        host does not wait for them; the next launches and copies there come after them)."""
        if self._drv is None:
            for dst, src in plan:
                self.copy_into(dst, src)
            return
        stream, copy = self._legacy(), self._drv.device_to_device
        for dst, src in plan:
            if dst.nbytes:
                copy(dst, src, dst.nbytes, stream=stream)

    def clone(self, a, step=False):
        """An owned device copy of ``a``. ``step``: a step's hidden rows, made every decode,
        verify and MTP step -- on a GPU they come from this thread's pool of device buffers
        (:meth:`_step_buffer`) instead of a new allocation, whose ``cuMemAlloc`` and later
        ``cuMemFree`` (numba frees in batches, once more than ten are pending) cost a step's
        host ~80 µs at one row on the H200 (``tools/decode_profile.py --api-times``)."""
        out = self._step_buffer(a.shape, a.dtype) if step else None
        if out is None:
            out = self.cuda.device_array(a.shape, a.dtype)
        if a.size:  # an empty plane (no MTP rows yet): nothing to copy (the simulator refuses its strides)
            self.copy_into(out, a)
        return out

    def mapped_target(self, shape, dtype=np.float32):
        """A buffer a captured step's lm head stores its logits into, for the host to hand out
        with no download: pinned host memory mapped into the device (``dev``, a device array of
        ``shape`` over it; ``host``, numpy's array over the same bytes). None under the
        simulator's stand-ins that lack it, and None once the process's live targets would pass
        MAPPED_MAX_BYTES (pinned memory is the host's to share: a session's ring buffers live as
        long as its cache, and a run with many sessions would otherwise pin ~3 × rows × vocab ×
        4 bytes per step kind and session; the step then downloads its logits as before). Free
        (:meth:`mapped_free`) until handed out (:meth:`hand_out_mapped`), then held while
        anything of the hand-out is alive."""
        dtype = np.dtype(dtype)
        nbytes = -(-max(int(np.prod(shape)) * dtype.itemsize, 1) // 16) * 16
        if not _mapped_take(nbytes):
            return None
        try:
            buf = self.cuda.mapped_array(nbytes, np.uint8)
            t = MappedTarget(buf, mapped_device_view(buf, dtype, shape), tuple(shape), dtype)
        except BaseException:
            _mapped_give(nbytes)
            raise
        weakref.finalize(t, _mapped_give, nbytes)
        return t

    @staticmethod
    def mapped_free(t) -> bool:
        """Whether nothing of ``t``'s last hand-out is alive (a kernel may store into it again)."""
        return t.held is None or t.held() is None

    def hand_out_mapped(self, t):
        """The logits a kernel stored into ``t.dev`` (call after the step's synchronise), as a new
        host array over ``t``'s memory; ``t`` is held while anything of that array is alive (an
        anchor that cannot be watched holds it for good)."""
        buf = host_view(t.buf)
        out = np.frombuffer(memoryview(buf), t.dtype, int(np.prod(t.shape))).reshape(t.shape)
        t.held = _holder(out, buf)
        return out

    def _step_buffer(self, shape, dtype):
        """A C-contiguous device array of ``shape`` over a pooled device buffer of this thread
        that nothing handed out uses any more, or None (the simulator; past STEP_POOL_MAX_BYTES;
        STEP_POOL_PER_SIZE buffers of that size all in use). Each hand-out is a new array whose
        memory pointer is owned by a fresh token: numba's views and slices of the array refer to
        their pointer's owner, so the token lives exactly as long as anything of the hand-out, and
        the buffer is free again once the pool's weak reference to it is dead. Reuse needs no
        synchronisation: every launch and copy goes to the one legacy default stream in issue
        order, so whatever read the buffer's last contents was issued, and runs, before the copy
        that refills it."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if self._drv is None or not 0 < nbytes <= STEP_POOL_MAX_BYTES:
            return None
        pool = self._pin.__dict__.setdefault("step_pool", {}).setdefault(nbytes, [])
        entry = next((e for e in pool if e[1] is None or e[1]() is None), None)
        if entry is None:
            if len(pool) >= STEP_POOL_PER_SIZE:
                return None
            entry = [self.cuda.device_array((nbytes,), np.uint8), None]
            if getattr(entry[0], "gpu_data", None) is None:  # not numba's device array (a test's stand-in)
                return None
            pool.append(entry)
        token = _StepToken()
        entry[1] = weakref.ref(token)
        return pooled_device_array(entry[0].gpu_data, shape, dtype, token)

    # ---- chained steps (Engine.decode_greedy): the host waits for one step, not for all -------
    def pinned_empty(self, shape, dtype=np.float32):
        """Host memory a :meth:`download_async` lands in (pinned: the copy runs on the stream)."""
        return self.cuda.pinned_array(shape, dtype)

    def download_async(self, dst, src, done):
        """Queue the copy of device array ``src`` into pinned host array ``dst`` behind every
        launch issued so far, and record event ``done`` behind the copy: :meth:`wait` on ``done``
        tells when ``dst`` holds it (under the simulator: copied at once). The copy runs on this
        host thread's copy stream (non-blocking: it does not hold back the launch stream), which
        waits for an event recorded on the launch stream -- so launches issued after this call
        run beside the copy. Copied on the launch stream, between two steps, a chained decode
        step's logits (608 KB on bench-8l) made each step 10.6 µs (exact-bf16) and 14.0 µs
        (exact) longer on an H100 (``tools/ab_decode.sh``,
        ``receipts/probes/h100-ab-logits-stream-6e110eb/``). The caller must not let a later
        launch write ``src`` before ``done``."""
        if self._drv is None:
            dst[...] = src.copy_to_host()
            return
        cs, after = self._copy_stream()
        after.record(stream=self._legacy())
        after.wait(stream=cs)
        self._drv.device_to_host(dst, src, src.nbytes, stream=cs)
        done.record(stream=cs)

    def _copy_stream(self):
        """This host thread's (copy stream, event): a stream created non-blocking (it does not
        synchronise with the legacy default stream the launches go to) and the event that orders
        a copy on it after the launches before it."""
        got = getattr(self._pin, "copy_stream", None)
        if got is None:
            from numba.cuda.cudadrv.driver import binding, driver

            handle = driver.cuStreamCreate(binding.CUstream_flags.CU_STREAM_NON_BLOCKING.value)
            # held for the process's life (one per host thread that copies this way)
            got = self._pin.copy_stream = (self.cuda.external_stream(int(handle)), self.cuda.event(timing=False))
            self._pin.copy_stream_handle = handle
        return got

    def event(self):
        """An event for :meth:`record` / :meth:`wait` (None under the simulator: it runs each
        launch at once)."""
        return None if self._drv is None else self.cuda.event(timing=False)

    def record(self, ev):
        """Mark the stream's current end in ``ev``."""
        if ev is not None:
            ev.record(stream=self._legacy())

    def wait(self, ev):
        """Block the host until the work issued before ``ev``'s :meth:`record` is done (later
        work may still run)."""
        if ev is not None:
            ev.synchronize()

    def _legacy(self):
        s = self.__dict__.get("_legacy_stream")
        if s is None:
            s = self._legacy_stream = self.cuda.legacy_default_stream()
        return s

    def synchronize(self):
        self.cuda.synchronize()


STEP_POOL_MAX_BYTES = 1 << 20  # a step's hidden rows up to here come from the pool (bench-8l: 8 KB a row)
STEP_POOL_PER_SIZE = 8  # per host thread and size: more in use at once are allocated as before
PINNED_MIN_BYTES = 1 << 16  # downloads from this size on go through pinned memory
POOL_BUFFERS = 4  # per host thread: pinned buffers handed out by downloads
POOL_MIN_BYTES = 1 << 20  # a pooled buffer's least size
POOL_MAX_BYTES = 1 << 23  # larger downloads go through the staging buffer (no pinned memory kept for them)
MAPPED_MAX_BYTES = 1 << 29  # the process's live logits ring buffers (mapped_target), all sessions together

_mapped_lock = threading.Lock()
_mapped_bytes = [0]  # the live mapped targets' bytes (mapped_target takes, a target's finalizer gives back)


def _mapped_take(nbytes) -> bool:
    """Count ``nbytes`` more of live mapped targets, unless that would pass MAPPED_MAX_BYTES."""
    with _mapped_lock:
        if _mapped_bytes[0] + nbytes > MAPPED_MAX_BYTES:
            return False
        _mapped_bytes[0] += nbytes
        return True


def _mapped_give(nbytes):
    with _mapped_lock:
        _mapped_bytes[0] -= nbytes


def _holder(out, buf):
    """What keeps ``buf`` held while anything of the array ``out`` handed out over it is alive: a
    weak reference to ``out``'s anchor (:func:`_anchor`), dead once nothing of it is; an anchor
    that cannot be watched (no weak reference, or ``buf``'s own) holds it for good."""
    anchor = _anchor(out)
    try:
        held = weakref.ref(anchor)
    except TypeError:
        held = None
    return held if held is not None and anchor is not _anchor(buf) else (lambda: True)


def _anchor(handout):
    """The first object of ``handout``'s ``base`` chain that is not an array: every array, view
    or memoryview of the handed-out memory refers to it (numpy points a view's ``base`` at the
    first array of the chain that owns its data or whose base is no array, and a memoryview at
    its exporter), so while anything of it is alive, so is the anchor."""
    o = handout
    while isinstance(o, np.ndarray) and o.base is not None:
        o = o.base
    return o


def host_view(a) -> np.ndarray:
    """Mapped host memory (:meth:`CudaBackend.mapped_zeros`) as a plain ndarray over the same
    memory: numpy's own view of numba's mapped array (an ndarray subclass whose ``view`` is the
    device array's), or the array the simulator's FakeCUDAArray wraps."""
    return np.ndarray.view(a, np.ndarray) if isinstance(a, np.ndarray) else np.asarray(a)


class MappedTarget:
    """A :meth:`CudaBackend.mapped_target`: the mapped host buffer ``buf``, the device array
    ``dev`` of ``shape`` and ``dtype`` over it, and ``held``: a weak reference to the anchor of
    its last hand-out (None: never handed out)."""

    __slots__ = ("buf", "dev", "shape", "dtype", "held", "__weakref__")

    def __init__(self, buf, dev, shape, dtype):
        self.buf, self.dev, self.shape, self.dtype, self.held = buf, dev, shape, dtype, None


def mapped_device_view(buf, dtype, shape):
    """A C-contiguous device array of ``shape`` and ``dtype`` over the first bytes of the mapped
    buffer ``buf``, for a kernel to store into. numba's mapped array is an ndarray subclass whose
    ``view`` is the device array's, which fails on it on a GPU (it asks for a method only
    DeviceNDArray has: the H200 run of patches/next-mapped-logits.patch), so the array is built
    over the buffer's device memory; the simulator's mapped arrays are device arrays with a
    working ``view``."""
    dtype = np.dtype(dtype)
    gpu_data = getattr(buf, "gpu_data", None)
    if not isinstance(buf, np.ndarray) or gpu_data is None:
        return buf.view(dtype)[:int(np.prod(shape))].reshape(shape)
    if int(np.prod(shape)) * dtype.itemsize > buf.nbytes:
        raise ValueError(f"mapped_device_view: {tuple(shape)} {dtype} is larger than the {buf.nbytes}-byte buffer")
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return DeviceNDArray(tuple(shape), _c_strides(shape, dtype.itemsize), dtype, gpu_data=gpu_data)


class _StepToken:
    """The owner of one hand-out of a pooled step buffer (:meth:`CudaBackend._step_buffer`)."""

    __slots__ = ("__weakref__",)


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def pooled_device_array(mem, shape, dtype, owner):
    """A C-contiguous numba device array of ``shape`` and ``dtype`` over the start of the device
    memory ``mem`` (a numba memory pointer that stays allocated: the pool holds it), through a new
    pointer owned by ``owner``: numba's views and slices of the array point their memory at
    ``owner`` too, so ``owner`` stays alive exactly as long as anything of the array does."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import MemoryPointer

    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    if size > mem.size:
        raise ValueError(f"pooled_device_array: {tuple(shape)} {dtype} is larger than the {mem.size}-byte buffer")
    ptr = MemoryPointer(mem.context, mem.device_pointer, size, owner=owner)
    return DeviceNDArray(tuple(shape), _c_strides(shape, dtype.itemsize), dtype, gpu_data=ptr)


def _same_layout(dst, src):
    """``dst``, after checking that ``src`` has its shape and dtype (a copy plan's pair)."""
    if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
        raise PrimewalkError(f"copy_plan: {tuple(src.shape)} {src.dtype} into {tuple(dst.shape)} {dst.dtype}")
    return dst


def _contiguous(a) -> bool:
    """A numba device array (or view) whose elements are one C-contiguous run."""
    return bool(a.flags["C_CONTIGUOUS"])


def _raw_driver():
    """numba-cuda's driver-level copies (``host_to_device``, ``device_to_host``,
    ``device_to_device``: one driver call each, synchronous on the legacy default stream, like
    the device arrays' own copies), or None where this numba-cuda lacks them."""
    try:
        from numba.cuda.cudadrv import driver
    except ImportError:  # pragma: no cover
        return None
    if all(hasattr(driver, n) for n in ("host_to_device", "device_to_host", "device_to_device")):
        return driver
    return None  # pragma: no cover


_CACHE: dict = {}


def get_backend(name: str | None = None):
    """The backend named ``name`` (or ``$PRIMEWALK_BACKEND``, default ``cpu``), created once."""
    name = (name or os.environ.get("PRIMEWALK_BACKEND") or "cpu").lower()
    if name not in BACKENDS:
        raise PrimewalkError(f"unknown backend {name!r} (choose one of: {', '.join(BACKENDS)})")
    if name not in _CACHE:
        _CACHE[name] = CpuBackend() if name == "cpu" else CudaBackend()
    return _CACHE[name]
