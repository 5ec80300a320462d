"""A matrix run spread over workers: local processes (:mod:`.local_workers`) or Ray actors
(:mod:`.ray_workers`), with the receipt of the single-process run.

:func:`run_parallel` plans the run (:func:`.tasks.plan`: every cell and independent prime as a
task, longest first), starts the executor's workers (each loads the models once and warms them up
before its first task, as the single-process runner does before its first cell), hands one task
at a time to each idle worker, builds the entries as their inputs arrive (:class:`.tasks.Assembly`)
and tells one progress display about them, and returns the receipt (not written; the caller
writes it atomically, so an interrupted run leaves none). The receipt equals the single-process
one under ``harness diff`` (one :func:`.runner.make_receipt` builds both, from entries built by one
:func:`.runner.cell_entry`); its informational ``executor`` block says how the run was spread.
Informational fields that a parallel run measures differently: ``env`` is worker 0's (its
``threads`` are one worker's) with the host's ``cores`` and ``load`` measured here, and
``warmup_s`` is the longest worker's warm-up (they warm up side by side; each worker's is in
``executor.workers``, None for a worker that was still starting when the last task finished: it
took no task and never reported).

A worker that dies (its process exits, its Ray actor is lost) is reported (``progress.warning``
and ``executor.incidents``) and the task it held goes back to the queue for the others. A task
that kills :data:`MAX_TASK_DEATHS` workers, or the death of every worker, ends the run with a
one-line error. A :class:`~harness.errors.PrimewalkError` inside a worker (an unreadable model,
no GPU) ends the run with that error.

An executor is any object with this protocol (both built-in ones follow it):

- ``kind``: ``"workers"`` or ``"ray"``; ``start(spec, count, warmup)``: start ``count`` workers,
  numbered 0..count-1, without waiting for them (each a :class:`.tasks.Worker`; ``warmup``: warm
  its models up before it says ready); ``submit(w, task)``: give worker ``w`` a task;
- ``poll(timeout)``: the events since the last poll, ``[(w, what, payload)]`` with ``what`` one of
  ``"ready"`` (payload: :meth:`.tasks.Worker.meta`), ``"result"`` (the task's result),
  ``"error"`` (a one-line message) and ``"died"`` (a one-line description); an empty list after
  ``timeout`` seconds;
- ``default_workers(spec)``: how many workers to start when the caller does not say;
- ``info()``: the executor's own record for the receipt; ``close(abort)``: stop every worker
  (``abort``: at once, also the busy ones, after an error or Ctrl-C).
"""

from __future__ import annotations

import time

from ..engine.threads import machine_load
from ..errors import PrimewalkError
from .runner import SilentProgress, make_receipt
from .specfile import MatrixSpec
from .tasks import Assembly, plan

MAX_TASK_DEATHS = 2  # a task that killed this many workers is not handed out again
POLL_S = 1.0


def run_parallel(spec: MatrixSpec, shard: tuple, executor, workers: int | None = None,
                 progress: SilentProgress | None = None, warmup: bool = True) -> dict:
    """Run shard ``shard`` of ``spec`` on ``executor`` with ``workers`` workers (None: the
    executor's default, see its ``default_workers``) and return the receipt. ``warmup``: each
    worker warms its models up before its first task (``--no-warmup``: not)."""
    progress = progress or SilentProgress()
    t0 = time.perf_counter()
    load_start = machine_load()
    p = plan(spec, shard)
    progress.notes(p.notes)
    pending = list(p.tasks)  # longest first
    assembly = Assembly(spec, p)
    finished = False
    try:
        count = workers if workers is not None else executor.default_workers(spec)
        count = max(1, min(count, len(pending)))
        executor.start(spec, count, warmup)
        progress.begin(len(p.mine))
        alive, idle, busy = set(range(count)), [], {}  # busy: worker -> task
        deaths: dict = {}  # task -> deaths it caused
        metas: dict = {}  # worker -> meta
        stats = {w: {"tasks": 0, "busy_s": 0.0} for w in range(count)}
        incidents: list = []
        shown = 0  # cells shown as started
        while not (assembly.complete and metas):
            while idle and pending:
                w, task = idle.pop(0), pending.pop(0)
                executor.submit(w, task)
                busy[w] = (task, time.perf_counter())
                if task.kind == "cell":
                    progress.start(min(shown, len(p.mine) - 1), len(p.mine), f"{task.cell_id} [worker {w}]")
                    shown += 1
            for w, what, payload in executor.poll(POLL_S):
                if what == "ready":
                    _check_same_model(metas, w, payload)
                    metas[w] = payload
                    idle.append(w)
                elif what == "result":
                    task, started = busy.pop(w)
                    stats[w]["tasks"] += 1
                    stats[w]["busy_s"] += time.perf_counter() - started
                    for entry in assembly.add(task, payload):
                        progress.done(entry)
                    idle.append(w)
                elif what == "error":
                    raise PrimewalkError(payload)
                elif what == "died":
                    alive.discard(w)
                    held = busy.pop(w, None)
                    text = f"worker {w} {payload}"
                    if held is None:
                        text += " before it took a task" if w not in metas else " while idle"
                    else:
                        task = held[0]
                        deaths[task] = deaths.get(task, 0) + 1
                        text += f" running {task.label}"
                        if deaths[task] >= MAX_TASK_DEATHS:
                            raise PrimewalkError(f"{task.label} killed {deaths[task]} workers (last: {text}); "
                                                 "not handing it out again")
                        pending.append(task)
                        pending.sort(key=lambda t: (-t.cost, t.seq))
                        text += f"; re-run on the other {len(alive)} worker(s)" if alive else ""
                    incidents.append(text)
                    progress.warning(text)
                    if not alive:
                        raise PrimewalkError(f"all {count} workers died (last: {text})")
        first = metas[min(metas)]
        env = dict(first["env"], cores=load_start["cores"],
                   load={"start": load_start["loadavg"], "end": machine_load()["loadavg"]})
        warm_s = max((m["worker"].get("warmup_s") or 0.0) for m in metas.values())
        receipt = make_receipt(spec, first["model"], env, shard, time.perf_counter() - t0, warm_s,
                               p.skipped, assembly.cells())
        receipt["executor"] = dict(executor.info(), workers=[
            dict({"warmup_s": None}, **metas.get(w, {}).get("worker", {}), index=w, tasks=stats[w]["tasks"],
                 busy_s=round(stats[w]["busy_s"], 3), alive=w in alive) for w in range(count)],
            tasks=len(p.tasks), incidents=incidents)
        finished = True
        return receipt
    finally:
        executor.close(abort=not finished)
        progress.close()


def _check_same_model(metas: dict, w: int, meta: dict) -> None:
    """Every worker must have loaded the same weights (on a cluster, a model folder may differ
    between machines)."""
    if not metas:
        return
    w0 = min(metas)
    a, b = metas[w0]["model"]["weights_sha256"], meta["model"]["weights_sha256"]
    if a != b:
        host0, host = metas[w0]["worker"].get("host"), meta["worker"].get("host")
        raise PrimewalkError(f"worker {w} (on {host}) loaded other weights than worker {w0} (on {host0}): "
                             f"weights_sha256 {b[:12]}… vs {a[:12]}…; the model folders differ between machines")
