"""A faster block scheduler for Numba's CUDA simulator (tests and ``tools/fuzz_configs.py --sim``).

The simulator runs each CUDA thread of a block as a Python thread, all started at once, and its
``BlockManager`` finds out that all live threads wait at ``syncthreads`` by polling them in a
busy loop. The loop and the runnable threads fight over the GIL (on 2 cores much of the time went
to the kernel's futex calls), and every block creates its threads anew.

:func:`install` swaps in a baton: a block's threads run one after another, each until it reaches
a barrier or returns, then it hands the baton to the next; when every thread of the block that has
not returned waits at the barrier, the barrier opens and the next phase runs them in the same
order. So one simulated thread runs at a time, with no polling. The threads come from a pool kept
for the process and are handed each block's indices. The rules are the simulator's: a barrier
opens when every thread that has not returned waits at it; ``syncthreads_count``/``_and``/``_or``
vote through the block's state array; a thread's exception aborts the others at their next
barrier and is raised from the launch, naming the thread and block. Only scheduling changes: what
each thread computes, and which barriers separate a block's work, stay the simulator's, so a
kernel without races computes the same bits (a race the threaded simulator would show only by
chance is the device checks' to find). ``PRIMEWALK_SIMSCHED=0`` keeps Numba's own scheduler (to
compare the two).
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
from collections import deque

import numpy as np


class _Block:
    """One block's run: whose turn it is, and who waits at the barrier."""

    __slots__ = ("pending", "arrived", "gates", "done", "exc", "abort")

    def __init__(self, workers):
        self.pending = deque(workers)  # still to run in this phase, in order
        self.arrived = []  # waiting at the barrier
        self.gates = {}  # warp -> _Gate: lanes waiting at a warp collective
        self.done = _thread.allocate_lock()
        self.done.acquire()
        self.exc = None
        self.abort = False

    def hand_on(self):
        """(Called by the baton's holder.) Wake the next thread of this phase; else open the
        barrier for those waiting at it; else the block is done. Lanes still waiting at a warp
        collective when nothing else can run wait for a lane that will never come: the block
        fails, and they are woken to stop."""
        if not self.pending and self.gates:
            stuck = [t for gate in self.gates.values() for t in gate.waiting]
            self.gates = {}
            if not self.abort:
                self.exc = (RuntimeError("a warp collective that not every lane of the warp reached"), None)
                self.abort = True
            self.pending = deque(stuck)
        elif not self.pending and self.arrived:
            self.pending, self.arrived = deque(self.arrived), []
        if self.pending:
            self.pending.popleft().wake.release()
        else:
            self.done.release()


class _Worker(threading.Thread):
    """A pooled simulated thread, with what the simulator reads from ``threading.current_thread()``."""

    def __init__(self):
        super().__init__(daemon=True)
        self.wake = _thread.allocate_lock()
        self.wake.acquire()
        self.block = self.func = self.threadIdx = self.blockIdx = self._manager = None
        self.args = ()
        self.thread_id = 0
        self.start()

    def run(self):
        while True:
            self.wake.acquire()
            block = self.block
            if not block.abort:
                try:
                    self.func(*self.args)
                except BaseException as e:  # noqa: BLE001 -- raised again by the launch
                    if not block.abort:
                        where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
                        try:
                            err = type(e)(f"{where}: {e}" if str(e) else where)
                        except Exception:  # noqa: BLE001 -- an exception type that takes other arguments
                            err = e
                        block.exc, block.abort = (err, sys.exc_info()[2]), True
            self.block = self.func = None
            self.args = ()
            block.hand_on()

    def syncthreads(self):
        block = self.block
        if block.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        block.arrived.append(self)
        block.hand_on()
        self.wake.acquire()
        if block.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def _vote(self, value, reduce):
        state = self._manager.block_state
        state[self.threadIdx.x, self.threadIdx.y, self.threadIdx.z] = value
        self.syncthreads()
        got = reduce(state)
        self.syncthreads()  # nobody votes again before all have read
        return got

    def syncthreads_count(self, value):
        return self._vote(value, lambda s: int(np.count_nonzero(s)))

    def syncthreads_and(self, value):
        return self._vote(value, lambda s: 1 if np.all(s) else 0)

    def syncthreads_or(self, value):
        return self._vote(value, lambda s: 1 if np.any(s) else 0)


class _Gate:
    __slots__ = ("slots", "waiting", "out")

    def __init__(self):
        self.slots = [None] * 32
        self.waiting = []
        self.out = None


def warp_collective(value, compute):
    """(In a kernel run by the baton.) Every lane of the calling thread's warp posts ``value``;
    when the 32nd arrives, ``compute(the 32 values in lane order)`` gives 32 results, and each
    lane returns its own (``tests/mma_sim.py``'s MMA and ``ldmatrix``)."""
    t = threading.current_thread()
    block = t.block
    warp, lane = t.thread_id >> 5, t.thread_id & 31
    gate = block.gates.get(warp)
    if gate is None:
        gate = block.gates[warp] = _Gate()
    gate.slots[lane] = value
    gate.waiting.append(t)
    if len(gate.waiting) < 32:
        block.hand_on()
        t.wake.acquire()
        if block.abort:
            raise RuntimeError("abort flag set on a warp collective")
        return gate.out[lane]
    gate.out = compute(list(gate.slots))  # if it raises, the gate stays: hand_on wakes its lanes to stop
    del block.gates[warp]
    block.pending.extendleft(reversed([w for w in gate.waiting if w is not t]))  # the warp goes on first
    return gate.out[lane]


def active():
    """Whether the calling thread is a simulated thread run by the baton."""
    return isinstance(threading.current_thread(), _Worker)


_POOL: list[_Worker] = []


def _run_block(self, grid_point, *args):
    """``BlockManager.run``: the block's threads, one at a time (see the module's docstring)."""
    from numba.cuda.simulator.kernelapi import Dim3

    points = list(np.ndindex(*self._block_dim))
    while len(_POOL) < len(points):
        _POOL.append(_Worker())
    workers = _POOL[: len(points)]
    bx, by, _ = self._block_dim
    block = _Block(workers)
    block_idx = Dim3(*grid_point)
    func = self._f
    if self._debug:
        def func(*a, _f=self._f):
            np.seterr(divide="raise")
            _f(*a)
    for w, (x, y, z) in zip(workers, points):
        w.block, w.func, w.args, w._manager = block, func, args, self
        w.blockIdx, w.threadIdx, w.thread_id = block_idx, Dim3(x, y, z), x + bx * (y + by * z)
    block.hand_on()
    block.done.acquire()
    if block.exc is not None:
        raise block.exc[0].with_traceback(block.exc[1])


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
    """The baton scheduler (unless ``PRIMEWALK_SIMSCHED=0``) and :func:`shared_array`, for every
    later launch of this process (the simulator must be on)."""
    install_shared()
    if os.environ.get("PRIMEWALK_SIMSCHED", "1") == "0":
        return
    from numba.cuda.simulator import kernel

    kernel.BlockManager.run = _run_block
