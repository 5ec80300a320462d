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
        self._leases = PinnedLeases(lambda n: cuda.pinned_array(n, np.uint8))

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

    def download(self, a):
        """``a`` on the host (a new array, the caller's). A contiguous array of 64 KB or more lands
        in pinned memory at pinned speed: a pinned buffer lent to the returned array (back to the
        pool when the array and every view of it are gone), or, past the pool's cap, this
        thread's staging buffer and a host copy. Others go through numba."""
        if self._drv is None or not _contiguous(a) or a.nbytes < PINNED_MIN_BYTES:
            if self._drv is not None and _contiguous(a) and a.size:
                out = np.empty(a.shape, a.dtype)
                self._drv.device_to_host(out, a, a.nbytes)
                return out
            return a.copy_to_host()
        lent = self._leases.take(a.nbytes)
        if lent is not None:
            self._drv.device_to_host(lent, a, a.nbytes)
            return self._leases.lend(lent, a.dtype, a.shape)
        pin = getattr(self._pin, "buf", None)
        if pin is None or pin.size < a.nbytes:
            pin = self._pin.buf = self.cuda.pinned_array(max(a.nbytes, 2 * (0 if pin is None else pin.size)), np.uint8)
        self._drv.device_to_host(pin, a, a.nbytes)
        return pin[:a.nbytes].view(a.dtype).reshape(a.shape).copy()

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
PINNED_LEASE_CAP = 256 << 20  # pinned bytes the download pool may hold, lent and free together


class PinnedLeases:
    """Pinned host buffers lent to the arrays that downloads return, so a download needs no host
    copy. A buffer goes back to the pool only when the array lent it and every view taken of it
    are gone (the array's base is a holder object that all views keep alive, and the holder's
    finalizer returns the buffer), so nothing a caller still holds is ever overwritten. The
    pool's pinned bytes stay under ``cap``; past it :meth:`take` answers None (the caller
    copies instead)."""

    def __init__(self, alloc, cap=PINNED_LEASE_CAP):
        self._alloc, self.cap = alloc, cap
        self._free: list = []
        self.held = 0  # pinned bytes allocated, lent or free
        self._lock = threading.Lock()

    def take(self, nbytes):
        """A pinned uint8 buffer of at least ``nbytes`` (the smallest free one that fits, else a
        new one), or None past the cap."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.size >= nbytes]
            if fits:  # (by index: list.remove would compare arrays elementwise)
                return self._free.pop(min(fits, key=lambda i: self._free[i].size))
            size = -(-nbytes // PINNED_MIN_BYTES) * PINNED_MIN_BYTES
            while self._free and self.held + size > self.cap:  # make room: drop free buffers
                self.held -= self._free.pop(0).size
            if self.held + size > self.cap:
                return None
            self.held += size
        try:
            return self._alloc(size)
        except BaseException:
            with self._lock:
                self.held -= size
            raise

    def lend(self, buf, dtype, shape):
        """``buf``'s first bytes as an array of ``dtype``/``shape``, lent until it dies."""
        dtype = np.dtype(dtype)
        holder = _Lease(buf, dtype, tuple(shape))
        weakref.finalize(holder, self._give_back, buf)
        return np.asarray(holder)

    def _give_back(self, buf):
        with self._lock:
            self._free.append(buf)


class _Lease:
    """The base object of a lent array: it exposes the buffer's first bytes as the array."""

    __slots__ = ("buf", "__array_interface__", "__weakref__")

    def __init__(self, buf, dtype, shape):
        self.buf = buf
        self.__array_interface__ = {"data": (buf.__array_interface__["data"][0], False), "shape": shape,
                                    "typestr": dtype.str, "descr": dtype.descr, "strides": None,
                                    "version": 3}


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
