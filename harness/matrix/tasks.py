"""A matrix run cut into independent tasks, and its receipt put back together from their results.

The single-process runner (:func:`.runner.run_matrix`) walks the cells in spec order and runs a
cell's oracle and its independent prime when it first needs them. A parallel run (:mod:`.pool`)
needs the same computations as units that any worker may run, in any order:

- a **cell task** runs one cell (:func:`.runner.run_cell`) on the ids its model is fed (a text
  prompt as the model's own tokenizer encodes it, :func:`.runner.load_models`) and returns its
  :class:`~.runner.Raw` and the digest of those ids (the entry's ``digests.prompt``). Every oracle a recorded cell is judged by is a cell task too (one outside ``--shard`` is run,
  not recorded), so each oracle runs once in the whole run, not once per worker;
- a **prime task** runs the independent unyielded prime of one (model, prompt, K, sampling,
  boundary points) (:func:`~harness.walk.check.oracle_prime`) and returns (logits, capture
  digest).

Nothing a task computes depends on what ran before it on the same engine: sessions own their
caches, the sampling counter is keyed by (seed, session id, position) and every cell's sessions
have id 0 (DESIGN §4, §8 "Scheduler"; ``--shard`` + ``harness merge`` rely on the same). So the
results, and the entries :class:`Assembly` builds from them with the single-process runner's own
:func:`.runner.cell_entry`, are those of the single-process run: the receipt does not depend on
how the work was split, and ``harness diff`` between the two exits 0.

Tasks are handed out longest first (:func:`estimate_cost`), so the last tasks to finish are short.
:class:`Worker` is what every worker process (local or Ray) holds: the spec and its models,
loaded once and warmed up (:func:`.runner.warm_models`) before its first timed task, as the
single-process runner does before its first cell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..engine.digests import prompt_digest
from ..errors import PrimewalkError
from . import runner
from .cells import Cell, expand_all, note_of
from .specfile import MatrixSpec

# The cost model behind longest-first. Units: one batched prompt row at a short context. Only the
# order of the estimates matters (it decides which tasks go first), so these are round numbers
# read off committed receipts, not fitted constants.
TOKENWISE_ROW = 4.0  # a token-by-token prompt row costs ~4 batched rows (1.3x on 2 CPU cores,
#                      6x on an H200: receipts/golden/default.json and the CUDA receipt of that time,
#                      now receipts/device/cuda-default.json)
DECODE_ROW = 4.0  # one continuation token (speculative, then plain) costs ~4 batched rows
#                   (1.2x on 2 CPU cores, 8x on an H200, same receipts)
ATTENTION_ROWS = 4096  # attention doubles a row's cost about every 4096 positions of context
#                        (H200: 442 ms of a 944 ms 4096-token prime; README, "Performance")

# Fault injection for the tests: "W:N" makes worker W exit (status DIE_STATUS) when it receives
# its (N+1)-th task, after N tasks done, with that task in flight. Read inside the worker.
DIE_ENV = "PRIMEWALK_TEST_WORKER_DIES"
DIE_STATUS = 70


def prime_cost(tp: int) -> float:
    """Estimated cost of one batched prime of ``tp`` rows (attention grows with the context)."""
    return tp * (1.0 + tp / (2.0 * ATTENTION_ROWS))


def estimate_cost(cell: Cell, max_new: int) -> float:
    """Estimated cost of running ``cell``: prompt length (its model's tokens) x schedule, plus the
    continuation."""
    tp = cell.prompt_len
    prime = prime_cost(tp) * (TOKENWISE_ROW if cell.tokenwise else 1.0)
    return prime + 2 * max_new * DECODE_ROW * (1.0 + tp / ATTENTION_ROWS)


@dataclass(frozen=True)
class Task:
    """One unit of a parallel run: ``kind`` "cell" runs cell ``cell_id``; "prime" runs the
    independent prime of that cell's group and boundary points (:func:`.runner.indep_key`)."""

    kind: str  # "cell" | "prime"
    cell_id: str
    cost: float
    seq: int  # position in the plan before sorting (spec order): breaks ties between costs

    @property
    def label(self) -> str:
        return self.cell_id if self.kind == "cell" else f"independent prime for {self.cell_id}"


@dataclass
class Plan:
    """What a (possibly sharded) run must compute: ``mine`` the cells it records, ``tasks`` every
    cell and prime task they need, longest first."""

    cells: list  # every cell of the spec, in spec order
    skipped: list  # the schedules left out (expand_all's skipped dicts)
    mine: list  # the cells of this shard (recorded)
    tasks: list  # Task, longest first

    @property
    def notes(self) -> list:
        """The skipped schedules in words (the receipt's ``notes``)."""
        return [note_of(x) for x in self.skipped]


def plan(spec: MatrixSpec, shard: tuple = (0, 1)) -> Plan:
    """The tasks of ``spec``'s shard (I, N): the recorded cells, the oracle cells they are judged
    by, and one prime task per (group, points); sorted by :func:`estimate_cost`, longest first."""
    cells, skipped = expand_all(spec)
    by_id = {c.id: c for c in cells}
    mine = runner.in_shard(cells, shard)
    tasks, seen = [], set()

    def add(kind, cell, key, cost):
        if key not in seen:
            seen.add(key)
            tasks.append(Task(kind, cell.id, cost, len(tasks)))

    for cell in mine:
        for c in (by_id[cell.oracle], cell):
            add("cell", c, ("cell", c.id), estimate_cost(c, spec.max_new_tokens))
        add("prime", cell, ("prime",) + runner.indep_key(cell), prime_cost(cell.prompt_len))
    tasks.sort(key=lambda t: (-t.cost, t.seq))
    return Plan(cells, skipped, mine, tasks)


class Assembly:
    """Collects task results and builds each recorded cell's entry once its own run, its oracle's
    run and its independent prime are all in (:func:`.runner.cell_entry`, the single-process
    runner's)."""

    def __init__(self, spec: MatrixSpec, p: Plan):
        self.spec = spec
        self.by_id = {c.id: c for c in p.cells}
        self.raw: dict = {}  # cell id -> Raw
        self.prompt_sha: dict = {}  # cell id -> digest of the ids its model was fed
        self.primes: dict = {}  # indep key -> (logits, capture digest)
        self.waiting = {c.id: c for c in p.mine}
        self.entries: dict = {}  # cell id -> receipt entry
        self.order = [c.id for c in p.mine]

    def add(self, task: Task, result) -> list:
        """Store ``task``'s result; return the entries it completed, in spec order."""
        if task.kind == "cell":
            self.raw[task.cell_id], self.prompt_sha[task.cell_id] = result
        else:
            logits, caps = result
            self.primes[runner.indep_key(self.by_id[task.cell_id])] = (logits, caps)
        done = []
        for cid, cell in list(self.waiting.items()):
            key = runner.indep_key(cell)
            if cid in self.raw and cell.oracle in self.raw and key in self.primes:
                ilogits, icaps = self.primes[key]
                entry = runner.cell_entry(self.spec, cell, self.raw[cid], self.raw[cell.oracle], ilogits, icaps,
                                          self.prompt_sha[cid])
                self.entries[cid] = entry
                del self.waiting[cid]
                done.append(entry)
        return done

    @property
    def complete(self) -> bool:
        return not self.waiting

    def cells(self) -> list:
        """The entries in spec order (every recorded cell; call when :attr:`complete`)."""
        return [self.entries[cid] for cid in self.order]


class Worker:
    """What one worker process holds: the spec, its cells and its models, loaded once
    (:func:`.runner.load_models`: text prompts encoded by each model's own tokenizer) and, with
    ``warmup``, warmed up before its first task (:func:`.runner.warm_models`; ``warmup_s``);
    :meth:`run` runs one task on them."""

    def __init__(self, spec: MatrixSpec, index: int, warmup: bool = True):
        self.spec, self.index, self.done = spec, index, 0
        cells, _ = expand_all(spec)
        self.by_id = {c.id: c for c in cells}
        self.models = runner.load_models(spec)
        self.warmup_s = runner.warm_models(spec, self.models) if warmup else 0.0
        self.die_after = die_after(index)

    def meta(self) -> dict:
        """What the parent records about this worker: the model block and env of the receipt,
        and where the worker runs."""
        import socket

        first = next(iter(self.models.values()))
        env = runner.engine_env(self.spec, first.engine)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "device": env["device"],
                "warmup_s": self.warmup_s}
        if self.spec.backend == "cpu":
            info["threads"], info["threads_why"] = env["threads"], env["threads_why"]
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            info["cuda_visible_devices"] = os.environ["CUDA_VISIBLE_DEVICES"]
        return {"model": runner.model_block(self.models), "env": env, "worker": info}

    def run(self, task: Task):
        """A cell task's (Raw, digest of the prompt ids), or a prime task's (logits, capture
        digest)."""
        if self.die_after is not None and self.done >= self.die_after:
            os._exit(DIE_STATUS)
        cell = self.by_id[task.cell_id]
        m = self.models[cell.model]
        ids = m.ids[cell.prompt.name]
        if task.kind == "cell":
            out = (runner.run_cell(m.engine, cell, ids, self.spec.max_new_tokens), prompt_digest(ids))
        else:
            logits, caps = runner.oracle_prime(m.engine, ids, cell.k, list(cell.points), cell.sampling)
            out = (np.array(logits, copy=True), caps)
        self.done += 1
        return out


def die_after(index: int) -> int | None:
    """The test hook's task count for worker ``index`` (see :data:`DIE_ENV`), or None."""
    text = os.environ.get(DIE_ENV)
    if not text:
        return None
    try:
        w, n = (int(x) for x in text.split(":"))
    except ValueError:
        raise PrimewalkError(f"{DIE_ENV}: expected WORKER:TASKS, got {text!r}") from None
    return n if w == index else None
