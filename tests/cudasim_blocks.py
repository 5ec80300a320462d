"""A faster block scheduler for Numba's CUDA simulator (tests only).

The simulator runs each CUDA thread of a block as a Python thread; its ``BlockManager`` finds out
that all live threads wait at ``syncthreads`` by polling them in a busy loop, which competes for
the GIL with the threads it waits for. :func:`install` swaps in a condition-variable barrier with
the same rule -- a barrier opens when every thread of the block that has not returned waits at
it -- and the same error handling (a thread's exception aborts the block and is re-raised).
Only scheduling changes: what each thread computes, and in which order the block's barriers
separate its work, stay the simulator's. It also gives the simulator's mapped arrays the type
they have on a GPU (:func:`_mapped_as_ndarray`).
"""

from __future__ import annotations

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


def install():
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
    _mapped_as_ndarray()


def _mapped_as_ndarray():
    """Mapped host memory as numba has it on a GPU. There ``cuda.mapped_array`` returns a
    MappedNDArray, an ``np.ndarray`` subclass the host reads and writes as memory and kernels
    address directly (the engine's NaN/Inf flags and a captured step's position and ids live in
    it, and the engine reads the flags with ``np.ndarray.view``); the simulator returns a
    FakeCUDAArray, which is no ndarray. Here its mapped arrays are zeroed host ndarrays: its
    kernels read and write them (it copies ndarray arguments in before a launch and back after),
    so what the host sees between launches is what it sees on a GPU.

    The engine at 23576c4 fails on the unpatched simulator's mapped arrays (a TypeError at
    its first step's flag read); the fix belongs in the engine and lands with the next GPU
    evidence refresh (it changes fingerprinted code)."""
    from numba import cuda

    def mapped_array(shape, dtype=np.float64, strides=None, order="C", stream=0, portable=False, wc=False):
        return np.zeros(shape, dtype, order=order)

    cuda.mapped_array = mapped_array
