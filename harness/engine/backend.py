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

    def clone(self, a):
        return a.copy()

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
        anchor = _anchor(out)
        try:
            held = weakref.ref(anchor)
        except TypeError:
            held = None
        entry[1] = held if held is not None and anchor is not _anchor(buf) else (lambda: True)
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

    def clone(self, a):
        out = self.cuda.device_array(a.shape, a.dtype)
        if a.size:  # an empty plane (no MTP rows yet): nothing to copy (the simulator refuses its strides)
            self.copy_into(out, a)
        return out

    def synchronize(self):
        self.cuda.synchronize()


PINNED_MIN_BYTES = 1 << 16  # downloads from this size on go through pinned memory
POOL_BUFFERS = 4  # per host thread: pinned buffers handed out by downloads
POOL_MIN_BYTES = 1 << 20  # a pooled buffer's least size
POOL_MAX_BYTES = 1 << 23  # larger downloads go through the staging buffer (no pinned memory kept for them)


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
