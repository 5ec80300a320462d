"""Captured steps: how the kernel launches of one engine step are issued.

A step is a body of kernel launches only (no copies, no synchronisation) over named inputs.
Steps of at most :data:`GRAPH_MAX_ROWS` rows (decode, verify, MTP drafts) are captured once per
cache and replayed (CUDA graphs): one graph launch instead of ~15 launches per layer from
Python. The position then lives on the device (int32, beside the step's token ids: the host
writes both into mapped memory and the graph's first kernel copies them in), so one capture
serves every position. Larger steps, and every step on a backend that
cannot capture (cpu), run eagerly with the position as a scalar. A replay launches the same
kernels on the same inputs as the eager run: the same bits.

``PRIMEWALK_GRAPHS=0`` or ``Engine(..., graphs=False)`` turns capture off.
"""

from __future__ import annotations

import os

import numpy as np

from .backend import host_view

GRAPH_MAX_ROWS = 8  # steps of at most this many rows are captured and replayed


def graphs_wanted(ops, graphs: bool | None) -> bool:
    """Whether steps are captured: ``graphs`` (None: ``$PRIMEWALK_GRAPHS`` is not ``0``), on an
    op set that can capture."""
    if graphs is None:
        graphs = os.environ.get("PRIMEWALK_GRAPHS", "1") != "0"
    return bool(graphs) and hasattr(ops, "capture")


def graph_key(what: str, rows: int, *more):
    """The capture key of a step of ``rows`` rows (None: too large to capture)."""
    return None if rows > GRAPH_MAX_ROWS else (what, rows) + more


class StepRunner:
    """Issues engine steps eagerly, or captured and replayed (see the module docstring)."""

    def __init__(self, B, ops, graphs: bool):
        self.B, self.ops = B, ops
        self.pos = B.zeros((1,), np.int32) if graphs else None  # the device-side position
        self._ids = None  # token ids buffer of eager steps, reused across calls

    def run(self, cache, key, body, inputs: dict, start: int, keep):
        """Run ``body(inputs, start, pos)`` and return its outputs.

        ``inputs``: {name: host or backend array}. ``key`` None: the body runs eagerly with the
        inputs on the backend and ``start`` as a scalar. Otherwise the first call of ``key`` on
        ``cache`` runs eagerly with the position on the device (:attr:`pos`; compiling and
        allocating what it needs); the second captures the body with its own copies of the
        inputs; every later call copies the new inputs into those copies and replays. A
        capture's position, its token ids (input ``ids``) and its other inputs given as host
        arrays of 4-byte items (an MTP pass's hidden rows) share one int32 buffer, ``[pos,
        ids..., rows...]`` (each input from a 16-byte boundary), which the graph's first kernel
        (``copy_i32``) fills from a twin in mapped host memory: a replay writes the host side
        and launches, no copy call (a driver copy of a host array waits for the device and
        costs the host ~10 µs; the caller synchronises before the next replay). Inputs given
        as device arrays are copied into the capture's own arrays; the capture key records
        which inputs came from the host (a step called both ways has a capture of each).
        ``keep()``: the buffers a capture reads or writes besides its inputs, kept alive as
        long as the graph."""
        if key is None:
            return body({n: self._upload(n, v) for n, v in inputs.items()}, start, None)
        B = self.B
        mapped = tuple(n for n, v in inputs.items() if n != "ids" and isinstance(v, np.ndarray) and v.dtype.itemsize == 4)
        if mapped:
            key = key + (("mapped",) + mapped,)
        nids = len(inputs["ids"]) if "ids" in inputs else 0

        def eager():
            B.copy_into(self.pos, np.array([start], np.int32))
            return body({n: self._upload(n, v) for n, v in inputs.items()}, 0, self.pos)

        def capture():
            offs, words = {}, 1 + nids
            for n in mapped:
                offs[n] = words = -(-words // 4) * 4
                words += inputs[n].size
            io = B.empty((words,), np.int32)
            head = B.mapped_zeros((words,), np.int32)
            own, rows = {}, {}
            for n, v in inputs.items():
                if n == "ids":
                    own[n] = io[1:1 + nids]
                elif n in offs:
                    own[n] = io[offs[n]:offs[n] + v.size].view(v.dtype).reshape(v.shape)
                    rows[n] = host_view(head)[offs[n]:offs[n] + v.size].view(v.dtype).reshape(v.shape)
                else:
                    own[n] = B.empty(v.shape, v.dtype)

            def step():
                self.ops.copy_i32(head, io, words)
                return body(own, 0, io[0:1])
            graph, out = self.ops.capture(step, [io, head, *keep(), *own.values()])
            return graph, out, own, head, rows

        g, out = self._graph(cache, key, eager, capture)
        if g is None:
            return out
        graph, out, own, head, rows = g
        head[0] = start  # mapped: the previous replay read it before that step's download returned
        for n, v in inputs.items():
            if n == "ids":
                head[1:1 + nids] = v
            elif n in rows:
                rows[n][...] = v
            else:
                B.copy_into(own[n], v)
        graph.replay()
        return out

    def run_chained(self, cache, key, body, start, pos, keep):
        """Run ``body(start, pos)`` -- a chained step: its inputs are on the device already (the
        previous step's last kernel wrote its token, and its position into ``pos``) -- and return
        its outputs. ``key`` None: eagerly, ``start`` a scalar and ``pos`` not read. Otherwise as
        :meth:`run`: the first call of ``key`` on ``cache`` runs eagerly reading the position
        from ``pos``, the second captures the body and replays it, later calls replay; nothing
        is written from the host (a replay may be issued while the step before it still runs)."""
        if key is None:
            return body(start, None)
        g, out = self._graph(cache, key, lambda: body(0, pos),
                             lambda: (*self.ops.capture(lambda: body(0, pos), keep()), None, None))
        if g is None:
            return out
        g[0].replay()
        return g[1]

    @staticmethod
    def _graph(cache, key, eager, capture):
        """The capture life of ``key`` on ``cache``, shared by :meth:`run` and :meth:`run_chained`:
        the first call runs ``eager()`` and returns ``(None, its outputs)`` (compiling and
        allocating what the step needs); the second stores ``capture()`` -- ``(graph, outputs,
        ...)`` -- as the key's graph; that call and every later one return ``(the graph entry,
        None)``, for the caller to replay."""
        g = cache.graphs.get(key)
        if g is None:
            if key not in cache.graph_seen:
                cache.graph_seen.add(key)
                return None, eager()
            g = cache.graphs[key] = capture()
        return g, None

    def _upload(self, name, v):
        """An input of an eager step on the backend: token ids (``ids``) through the reused ids
        buffer, backend arrays as they are, host arrays uploaded."""
        if name == "ids":
            return self._upload_ids(v)
        return v if not isinstance(v, np.ndarray) else self.B.upload(v)

    def _upload_ids(self, ids):
        buf = self._ids
        if buf is None or buf.shape[0] < len(ids):
            buf = self._ids = self.B.empty((max(len(ids), 256),), np.int32)
        view = buf[: len(ids)]
        self.B.copy_into(view, np.ascontiguousarray(ids, np.int32))
        return view
