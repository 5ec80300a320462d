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
