"""A faster block scheduler for Numba's CUDA simulator (tests only).

The simulator runs each CUDA thread of a block as a Python thread; its ``BlockManager`` finds out
that all live threads wait at ``syncthreads`` by polling them in a busy loop, which competes for
the GIL with the threads it waits for. :func:`install` swaps in a condition-variable barrier with
the same rule -- a barrier opens when every thread of the block that has not returned waits at
it -- and the same error handling (a thread's exception aborts the block and is re-raised).
Only scheduling changes: what each thread computes, and in which order the block's barriers
separate its work, stay the simulator's.
"""

from __future__ import annotations

import sys
import threading

import numpy as np


class _Block:
    def __init__(self):
        self.cv = threading.Condition()
        self.alive = 0
        self.waiting = 0
        self.generation = 0
        self.abort = False

    def _open_if_all_wait(self):
        if self.alive and self.waiting == self.alive:
            self.waiting = 0
            self.generation += 1
            self.cv.notify_all()

    def wait(self):
        with self.cv:
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            self.waiting += 1
            g = self.generation
            self._open_if_all_wait()
            while self.generation == g and not self.abort:
                self.cv.wait()
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads clear")

    def leave(self):
        with self.cv:
            self.alive -= 1
            self._open_if_all_wait()

    def stop(self):
        with self.cv:
            self.abort = True
            self.cv.notify_all()


_SHARED_LOCK = threading.Lock()


def shared_array(self, shape, dtype, alignment=None):
    """The simulator's ``cuda.shared.array`` (one array per block and calling line, dynamic
    shared memory for shape 0), with two changes: the array is looked up and created under a lock
    -- the simulator's own get-then-set races, so two threads of a block could each get an array
    of their own and one's writes never reach the others (a rare wrong output, seen in CI) -- and
    ``alignment`` is accepted (numpy arrays need none)."""
    from numba.core import types
    from numba.np import numpy_support

    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=self._dynshared_size // dtype.itemsize)
    f = sys._getframe(1)  # the kernel line that asks
    caller = (f.f_code.co_filename, f.f_lineno)
    with _SHARED_LOCK:
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations[caller] = np.empty(shape, dtype)
    return res


def install_shared():
    """Swap :func:`shared_array` in for the simulator's ``cuda.shared.array``."""
    from numba.cuda.simulator import kernelapi

    kernelapi.FakeCUDAShared.array = shared_array


def install():
    install_shared()
    from numba.cuda.simulator import kernel as k

    def syncthreads(self):
        self._block.wait()

    def run(self, grid_point, *args):
        block = _Block()

        def target():
            try:
                self._f(*args)
            finally:
                block.leave()

        threads = [k.BlockThread(target, self, grid_point, p, self._debug) for p in np.ndindex(*self._block_dim)]
        block.alive = len(threads)
        for t in threads:
            t._block = block
            t.start()
        for t in threads:
            t.join()
            if t.exception:
                block.stop()
        for t in threads:
            t.join()
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    k.BlockThread.syncthreads = syncthreads
    k.BlockManager.run = run
