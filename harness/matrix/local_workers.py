"""Worker processes on this host for :func:`.pool.run_parallel` (``harness run-matrix --workers N``
/ ``--gpus all``).

Workers are started with multiprocessing's ``spawn`` method (Numba's threads and CUDA contexts do
not survive ``fork``) and each gets its own environment from the first instruction on, before
anything imports Numba (:func:`worker_envs`):

- cuda: ``CUDA_VISIBLE_DEVICES`` names one GPU per worker, round-robin over the GPUs asked for
  (``--gpus all`` = every visible GPU: ``$CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi``), so
  ``--workers 2`` on one GPU puts both workers on it;
- cpu: ``NUMBA_NUM_THREADS`` is the host's threads (``$NUMBA_NUM_THREADS``, else the CPUs this
  process may run on) divided by the number of workers, at least 1.

A worker loads the models once and warms them up (:class:`.tasks.Worker`), says it is ready,
then runs one task per message until it is told to stop. It ignores SIGINT: on Ctrl-C the parent stops the workers and
writes nothing.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import wait

from ..errors import PrimewalkError

CTX = mp.get_context("spawn")
STOP_S = 10.0  # how long close() waits for a worker to exit before terminating it


def visible_gpus() -> list:
    """The GPUs this host lets us use, as ``CUDA_VISIBLE_DEVICES`` entries: ``$CUDA_VISIBLE_DEVICES``
    when it is set, else the indices ``nvidia-smi`` lists, else none. Never initialises CUDA here."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def host_threads() -> int:
    """The CPU threads a run on this host may use: ``$NUMBA_NUM_THREADS``, else this process's CPUs."""
    text = os.environ.get("NUMBA_NUM_THREADS")
    if text and text.strip().isdigit() and int(text) > 0:
        return int(text)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def worker_envs(backend: str, workers: int | None, gpus: list | None = None) -> list:
    """The environment each worker starts with (only what differs from ours), one dict per
    worker. cuda: one GPU each, round-robin over ``gpus`` (default :func:`visible_gpus`); the
    number of workers defaults to the number of GPUs. cpu: ``workers`` is required, and the
    host's threads are divided among them."""
    if backend == "cuda":
        gpus = list(gpus) if gpus else visible_gpus()
        if not gpus:
            if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":  # the CUDA simulator: no devices to pin
                return [{} for _ in range(workers or 1)]
            raise PrimewalkError("cuda workers: no GPU is visible (CUDA_VISIBLE_DEVICES is empty or nvidia-smi "
                                 "lists none)")
        n = workers or len(gpus)
        return [{"CUDA_VISIBLE_DEVICES": str(gpus[i % len(gpus)])} for i in range(n)]
    if not workers:
        raise PrimewalkError("cpu workers: give their number (--workers N)")
    threads = max(1, host_threads() // workers)
    return [{"NUMBA_NUM_THREADS": str(threads)} for _ in range(workers)]


@contextlib.contextmanager
def _spawning(overrides: dict):
    """``os.environ`` with ``overrides`` while a worker is spawned (it copies our environment at
    start, before it imports anything), and SIGINT ignored (a disposition the worker inherits, so
    Ctrl-C in the terminal reaches only the parent, which stops the workers); then as they were."""
    saved = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    main = threading.current_thread() is threading.main_thread()
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, handler)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _serve(conn, index: int, spec, warmup: bool = True) -> None:
    """A worker's main loop: load the models (and warm them up), say ready, then run tasks until
    told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited already; kept for other start paths
    from .tasks import Worker

    try:
        worker = Worker(spec, index, warmup)
        conn.send(("ready", worker.meta()))
        while True:
            try:
                task = conn.recv()
            except EOFError:  # the parent is gone
                return
            if task is None:
                return
            conn.send(("result", worker.run(task)))
    except PrimewalkError as e:
        conn.send(("error", str(e)))
    except Exception as e:  # a bug: the traceback on our stderr, one line to the parent
        traceback.print_exc(file=sys.stderr)
        conn.send(("error", f"worker {index} failed: {type(e).__name__}: {e} (its traceback is above)"))


class LocalExecutor:
    """Workers as spawned processes on this host, each with its own environment (see the module
    docstring); ``envs`` are :func:`worker_envs`' result, one per worker."""

    kind = "workers"

    def __init__(self, envs: list):
        self.envs = envs
        self.procs, self.conns = [], []
        self.gone: set = set()

    def default_workers(self, spec) -> int:
        return len(self.envs)

    def start(self, spec, count: int, warmup: bool = True) -> None:
        for i in range(count):
            parent, child = CTX.Pipe()
            p = CTX.Process(target=_serve, args=(child, i, spec, warmup), name=f"primewalk-worker-{i}", daemon=True)
            with _spawning(self.envs[i]):
                p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)

    def submit(self, w: int, task) -> None:
        self.conns[w].send(task)

    def poll(self, timeout: float) -> list:
        live = [w for w in range(len(self.procs)) if w not in self.gone]
        handles = {self.conns[w]: w for w in live}
        handles.update({self.procs[w].sentinel: w for w in live})
        events, dead = [], []
        for h in wait(list(handles), timeout):
            w = handles[h]
            if w in dead:
                continue
            if h is self.conns[w]:
                try:
                    events.append((w,) + tuple(self.conns[w].recv()))
                    continue
                except (EOFError, OSError):
                    pass
            dead.append(w)
        for w in dead:
            while True:  # what it sent before it exited still counts
                try:
                    if not self.conns[w].poll():
                        break
                    events.append((w,) + tuple(self.conns[w].recv()))
                except (EOFError, OSError):
                    break
            p = self.procs[w]
            p.join(STOP_S)
            self.gone.add(w)
            if not any(e[0] == w and e[1] == "error" for e in events):
                events.append((w, "died", f"(pid {p.pid}) died ({_exit_text(p.exitcode)})"))
        return events

    def info(self) -> dict:
        return {"kind": self.kind, "start_method": "spawn"}

    def close(self, abort: bool = False) -> None:
        for w, p in enumerate(self.procs):
            if abort and p.is_alive():
                p.terminate()
            elif w not in self.gone and p.is_alive():
                try:
                    self.conns[w].send(None)
                except (OSError, ValueError):
                    pass
        for p in self.procs:
            p.join(STOP_S if p.is_alive() else 0)
            if p.is_alive():
                p.terminate()
                p.join(STOP_S)
        for c in self.conns:
            c.close()


def _exit_text(code) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
