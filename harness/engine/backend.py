"""Backend selection: ``cpu`` (the Numba CPU twin, default) or ``cuda``.

A backend bundles the op set (:mod:`numba_kernels.cpu` or :mod:`numba_kernels.cuda`, same names
and signatures) with array helpers (allocate, upload, download, copy). It is chosen once, by
argument or by ``PRIMEWALK_BACKEND``; importing primewalk never imports CUDA.
"""

from __future__ import annotations

import os
import platform

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
        return a.copy_to_host()

    def copy_into(self, dst, src):
        if isinstance(src, np.ndarray):
            dst.copy_to_device(np.ascontiguousarray(src))
        else:
            dst.copy_to_device(src)

    def clone(self, a):
        out = self.cuda.device_array(a.shape, a.dtype)
        if a.size:  # an empty plane (no MTP rows yet): nothing to copy (the simulator refuses its strides)
            out.copy_to_device(a)
        return out

    def synchronize(self):
        self.cuda.synchronize()


_CACHE: dict = {}


def get_backend(name: str | None = None):
    """The backend named ``name`` (or ``$PRIMEWALK_BACKEND``, default ``cpu``), created once."""
    name = (name or os.environ.get("PRIMEWALK_BACKEND") or "cpu").lower()
    if name not in BACKENDS:
        raise PrimewalkError(f"unknown backend {name!r} (choose one of: {', '.join(BACKENDS)})")
    if name not in _CACHE:
        _CACHE[name] = CpuBackend() if name == "cpu" else CudaBackend()
    return _CACHE[name]
