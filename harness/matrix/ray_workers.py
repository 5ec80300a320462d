"""Ray actors as the workers of :func:`.pool.run_parallel` (``harness run-matrix --executor ray
[--address ADDR]``): the same tasks, the same receipt, on a Ray cluster.

Ray is an optional extra (``pip install 'primewalk[cluster]'``); without it the run stops with a
one-line error naming the extra. Each worker is an actor that loads (and warms up) the models
once and then runs one task per call, the parent keeping one call in flight per actor (so tasks
still go out longest first across the whole cluster, and a lost actor's task is known and
re-queued):

- cuda: one GPU per actor (``num_gpus=1``; Ray sets its ``CUDA_VISIBLE_DEVICES``); by default one
  actor per GPU in the cluster;
- cpu: by default one actor per CPU of the cluster; each reserves the cluster's CPUs divided by
  the number of actors and runs that many Numba threads (``NUMBA_NUM_THREADS``).

Actors get our ``PRIMEWALK_*`` environment variables. On a cluster, every machine needs the same
primewalk installed and the spec's model folders at the same paths (a worker whose weights hash
differently stops the run). Without ``--address`` Ray connects where ``$RAY_ADDRESS`` says, else
starts a local instance for the run and stops it afterwards.
"""

from __future__ import annotations

import logging
import os
import socket
import sys

from ..errors import PrimewalkError

EXTRA = "pip install 'primewalk[cluster]'"


def import_ray():
    """The ``ray`` module, or a one-line error naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise PrimewalkError(f"--executor ray needs Ray, an optional extra: {EXTRA}") from None
    return ray


class RayWorker:
    """The actor: a :class:`.tasks.Worker` built by :meth:`ready` (so an error loading the models
    comes back as that call's error) and one task per :meth:`run`."""

    def __init__(self, spec, index: int, warmup: bool = True):
        self.spec, self.index, self.warmup, self.worker = spec, index, warmup, None

    def ready(self) -> dict:
        from .tasks import Worker

        self.worker = Worker(self.spec, self.index, self.warmup)
        return self.worker.meta()

    def run(self, task):
        return self.worker.run(task)


class RayExecutor:
    kind = "ray"

    def __init__(self, address: str | None = None):
        self.address = address
        self.ray = None
        self.owns = False  # we started Ray (and stop it in close)
        self.actors, self.refs = [], {}  # ObjectRef -> (worker, what)
        self.resources: dict = {}

    def _connect(self):
        if self.ray is None:
            ray = import_ray()
            if not ray.is_initialized():
                _reachable(self.address)
                try:
                    ray.init(address=self.address, include_dashboard=False, logging_level=logging.ERROR)
                except Exception as e:  # Ray raises plain Exceptions too (a raylet that does not start)
                    where = self.address or os.environ.get("RAY_ADDRESS") or "a local instance"
                    raise PrimewalkError(f"--executor ray: cannot start or reach Ray at {where} "
                                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
                self.owns = True
            self.ray = ray
            self.resources = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        return self.ray

    def default_workers(self, spec) -> int:
        self._connect()
        return int(self.resources.get("GPU" if spec.backend == "cuda" else "CPU", 0)) or 1

    def start(self, spec, count: int, warmup: bool = True) -> None:
        ray = self._connect()
        env = {k: v for k, v in os.environ.items() if k.startswith("PRIMEWALK_")}
        if spec.backend == "cuda":
            gpus = int(self.resources.get("GPU", 0))
            if count > gpus:
                raise PrimewalkError(f"--executor ray: {count} cuda worker(s) need a GPU each; the Ray cluster has "
                                     f"{gpus}")
            opts = {"num_gpus": 1, "num_cpus": 1}
        else:
            cpus = max(1, int(self.resources.get("CPU", 1)) // count)
            env["NUMBA_NUM_THREADS"] = str(cpus)
            opts = {"num_gpus": 0, "num_cpus": cpus}
        actor = ray.remote(RayWorker)
        for i in range(count):
            a = actor.options(max_restarts=0, runtime_env={"env_vars": env}, **opts).remote(spec, i, warmup)
            self.actors.append(a)
            self.refs[a.ready.remote()] = (i, "ready")

    def submit(self, w: int, task) -> None:
        self.refs[self.actors[w].run.remote(task)] = (w, "result")

    def poll(self, timeout: float) -> list:
        ray = self.ray
        if not self.refs:
            return []
        done, _ = ray.wait(list(self.refs), num_returns=1, timeout=timeout)
        if done:
            done, _ = ray.wait(list(self.refs), num_returns=len(self.refs), timeout=0)
        events = []
        for ref in done:
            w, what = self.refs.pop(ref)
            try:
                events.append((w, what, ray.get(ref)))
            except ray.exceptions.RayTaskError as e:  # raised inside the actor's method
                cause = getattr(e, "cause", None)
                if isinstance(cause, PrimewalkError):
                    events.append((w, "error", str(cause)))
                else:
                    print(str(e), file=sys.stderr)
                    events.append((w, "error", f"worker {w} failed: {type(cause).__name__ if cause else 'error'}: "
                                               f"{str(cause or e).splitlines()[0]} (its traceback is above)"))
            except ray.exceptions.RayActorError as e:
                events.append((w, "died", f"(Ray actor) died ({_first_line(e)})"))
        return events

    def info(self) -> dict:
        out = {"kind": self.kind, "cluster": {k: float(v) for k, v in self.resources.items()}}
        if self.address:
            out["address"] = self.address
        return out

    def close(self, abort: bool = False) -> None:
        if self.ray is None:
            return
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # already gone
                pass
        self.actors, self.refs = [], {}
        if self.owns:
            self.ray.shutdown()
            self.owns = False


def _reachable(address: str | None, timeout: float = 10.0) -> None:
    """A one-line error when nothing answers at a ``HOST:PORT`` address (Ray itself would retry
    for minutes); ``auto``, ``ray://`` and other forms are left to Ray."""
    if not address or "://" in address or address.count(":") != 1:
        return
    host, port = address.rsplit(":", 1)
    if not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise PrimewalkError(f"--address {address}: no Ray cluster answers there ({e.strerror or e})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:200]
    return type(e).__name__
