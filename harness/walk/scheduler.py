"""A cooperative scheduler: several sessions on one engine, one unit of work per tick.

Single device, single thread, no wall-clock races. Sessions (:class:`Job`) arrive at given
times on the scheduler's clock; each *tick* gives the device to one *unit* of one ready session:

- ``prime``: one chunk of the session's MTP prime walker (one ``advance_chunk``; a prompt of at
  most ``fill_chunk`` rows is one chunk: trunk, setup and fill);
- ``decode``: one decode step (a session with K = 0 continues plainly);
- ``spec``: one speculative round (K chained drafts, one K+1-row verify, rollback).

The clock is the measured time of each unit: the backend is synchronised before and after a
unit and the wall time between is added to the clock (on the CPU, the wall time of the unit), so
the timeline is real. When no session is ready the clock jumps to the next arrival. Sessions
share the engine and its workspace; each owns its cache (``session_id`` = its job's index, the
key of the sampling counter RNG).

Policies (:class:`Policy`) decide only which session runs the next unit, never what a unit
computes, so every session's digests are the same under every policy and alone. Sessions are
ordered by (arrival, job index); the rotation starts over at the session after the last one
served, skipping those not ready:

- ``drain``: a prime runs to its end once started; otherwise the rotation goes on, one unit per
  session per turn.
- ``yield``: the rotation, one unit per session per turn: after each prime chunk every ready
  peer gets a unit before that prime's next chunk.
- ``interval`` (``steps = n``): service interval. Prime units (from sessions still priming, in
  their own rotation) alternate with up to ``n`` decode units (speculative rounds or decode
  steps of sessions past their prime, in theirs): after each prime chunk, n decode units of
  other sessions run before the next prime chunk, when that many are ready. With no decode work
  the primes run back to back; with no prime work the decode units do.

**Session pool** (optional, :class:`SessionPool`): a finished session's buffers are kept and
the next session of the same shape (capacity and K) gets them reset in place
(:func:`reset_session`) instead of new ones, so the decode, verify and draft steps captured on
them (CUDA graphs) replay at once instead of running eagerly and being captured again: what a
serving engine does with its cache blocks and graphs. :meth:`SessionPool.prepare` allocates what
a run will need before it starts. A reset session computes what a new one does (the fairness
verdict compares pooled runs with fresh ones, bitwise).

A session's *first event* is the end of the unit that produced its first generated token (the
boundary token, picked by the walker's setup right after its last trunk chunk); it *finishes*
at the end of the unit that committed its last token.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..engine.digests import capture_digest, continuation_digest, logits_digest
from ..errors import PrimewalkError
from .mtp_walker import MtpPrimeWalker
from .sampling import Sampling
from .speculative import PlainStream, SpecStream

POLICIES = ("drain", "yield", "interval")
PRIME, DECODE, SPEC = "prime", "decode", "spec"  # unit kinds


@dataclass(frozen=True)
class Job:
    """One session to run: its prompt, when it arrives, and how it continues.

    ``k`` = 0 continues with plain decode steps, ``k`` >= 1 with speculative rounds of K drafts.
    ``boundary``: a prompt row where the prime is split, checkpointed and captured (the seed's
    turn boundary), or None. ``session_id`` keys the sampling RNG; give a session the same id
    in every run that must reproduce it."""

    name: str
    prompt: tuple
    arrival_s: float
    max_new_tokens: int
    k: int
    sampling: Sampling
    session_id: int
    chunk_rows: int
    fill_chunk: int
    boundary: int | None = None

    def capacity(self) -> int:
        """Cache positions: the prompt, the continuation and room for a last verify."""
        return len(self.prompt) + self.max_new_tokens + 2 * (self.k + 1) + 16


@dataclass(frozen=True)
class Policy:
    """Which ready session gets the next unit (see the module docstring)."""

    name: str  # drain | yield | interval
    steps: int = 1  # interval: decode units per prime chunk

    def __post_init__(self):
        if self.name not in POLICIES:
            raise PrimewalkError(f"unknown scheduling policy {self.name!r} (one of: {', '.join(POLICIES)})")
        if self.name == "interval" and (not isinstance(self.steps, int) or self.steps < 1):
            raise PrimewalkError(f"policy interval needs steps >= 1, got {self.steps!r}")

    @property
    def label(self) -> str:
        return f"interval@{self.steps}" if self.name == "interval" else self.name


@dataclass
class Unit:
    """One tick: session ``session`` (job index) ran a unit of ``kind`` (``prime`` chunk with
    its walker ``phase``, ``decode`` step or ``spec`` round) of ``rows`` prompt rows or
    committed tokens, from ``start_s`` to ``end_s`` on the scheduler clock. ``waiting``: how
    many other unfinished sessions had arrived by its end (were kept waiting by it)."""

    session: int
    kind: str
    phase: str
    rows: int
    start_s: float
    end_s: float
    waiting: int = 0

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass
class Outcome:
    """What one session produced in one run: digests (``logits``, ``captures``,
    ``final_state``, ``continuation``), tokens, the prime's tape, acceptance, and its times on
    the scheduler clock."""

    job: Job
    tape: list
    logits: np.ndarray
    digests: dict
    tokens: list
    acceptance: dict
    arrival_s: float
    start_s: float
    first_event_s: float
    finish_s: float
    units: int
    busy_s: float  # the device time of its own units
    prime_s: float  # ... of its prime units

    @property
    def first_event_latency_s(self) -> float:
        return self.first_event_s - self.arrival_s

    @property
    def finish_latency_s(self) -> float:
        return self.finish_s - self.arrival_s


def zero_snapshot(engine):
    """A snapshot of a new cache of ``engine``: no rows, zero conv and recurrent state (what
    :func:`reset_session` restores)."""
    return engine.new_session(1).cache.snapshot()


def reset_session(sess, zero, session_id: int = 0) -> None:
    """``sess`` back to a new session's state, in place: ``zero`` (:func:`zero_snapshot` of its
    engine) restored into its cache -- no rows, zero conv and recurrent state, nothing poisoned --
    whose planes keep their buffers, so the steps captured on them (CUDA graphs) stay valid (K/V
    rows past the position are never read before a step writes them); nothing committed,
    captured or checkpointed (every other field back to its default, as the Session class
    declares it); no target step to roll back. The per-row DeltaNet capture buffers stay, with
    the steps captured on them."""
    sess.cache.restore(zero)
    for f in dataclasses.fields(sess):
        if f.name not in ("cache", "verify_caps"):
            setattr(sess, f.name, f.default if f.default_factory is dataclasses.MISSING else f.default_factory())
    sess.session_id = int(session_id)
    for key in ("start", "hidden"):
        sess.verify_caps.pop(key, None)


class SessionPool:
    """Sessions kept for reuse, by shape (see the module docstring)."""

    def __init__(self, engine):
        self.engine = engine
        self.free: dict = {}  # (capacity, K) -> [Session]
        self._zero = None  # zero_snapshot(engine), made on first reuse

    @staticmethod
    def shape(job: Job) -> tuple:
        return job.capacity(), job.k

    def take(self, job: Job):
        """A session for ``job``: a pooled one of its shape, reset, else a new one."""
        got = self.free.get(self.shape(job))
        if got:
            sess = got.pop()
            if self._zero is None:
                self._zero = zero_snapshot(self.engine)
            reset_session(sess, self._zero, job.session_id)
            return sess
        return self.engine.new_session(job.capacity(), session_id=job.session_id)

    def give(self, job: Job, sess) -> None:
        """``job`` is done with ``sess``: keep it for the next session of the same shape."""
        self.free.setdefault(self.shape(job), []).append(sess)

    def prepare(self, jobs: list) -> None:
        """Allocate, before a run, the sessions its jobs will take beyond those pooled."""
        for (cap, k), n in Counter(self.shape(j) for j in jobs).items():
            have = self.free.setdefault((cap, k), [])
            while len(have) < n:
                have.append(self.engine.new_session(cap))


class _Run:
    """One job's state in a schedule: waiting, priming (walker), continuing (stream), done."""

    def __init__(self, engine, index: int, job: Job, pool: SessionPool | None = None):
        self.engine, self.index, self.job, self.pool = engine, index, job, pool
        self.sess = self.walker = self.stream = self.prepared = None
        self.tape, self.units = [], []
        self.first_event_s = self.finish_s = None
        self.result = None

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def priming(self) -> bool:
        """Prime work left (not started counts)."""
        return self.prepared is None

    @property
    def mid_prime(self) -> bool:
        """Its prime has started and not ended."""
        return self.walker is not None and self.prepared is None

    def run_unit(self) -> tuple[str, str, int]:
        """Run this session's next unit; returns (kind, phase, rows)."""
        if self.prepared is None:
            return self._prime_unit()
        n = self.stream.step()
        return (SPEC if self.job.k >= 1 else DECODE), (SPEC if self.job.k >= 1 else DECODE), n

    def _prime_unit(self):
        j, eng = self.job, self.engine
        if self.walker is None:
            self.sess = (self.pool.take(j) if self.pool is not None
                         else eng.new_session(j.capacity(), session_id=j.session_id))
            self.walker = MtpPrimeWalker(eng, self.sess, list(j.prompt), max(j.k, 1), sampling=j.sampling,
                                         prime_split=j.boundary, chunk_rows=j.chunk_rows,
                                         fill_chunk=j.fill_chunk, capture_at=j.boundary, ckpt_at=j.boundary)
        chunk = self.walker.advance_chunk()
        self.tape.append([str(chunk.phase), int(chunk.rows)])
        if self.walker.remaining_chunks() == 0:
            self.prepared = self.walker.finish()
            self.walker = None
            if j.k >= 1:
                self.stream = SpecStream(eng, self.sess, self.prepared, j.max_new_tokens, j.k, j.sampling)
            else:
                self.stream = PlainStream(eng, self.sess, self.prepared, j.max_new_tokens, j.sampling)
        return PRIME, str(chunk.phase), int(chunk.rows)

    def first_token_ready(self) -> bool:
        """Whether the first generated token exists (the walker's setup has run)."""
        return self.prepared is not None or getattr(self.walker, "prepared", None) is not None

    def close(self) -> None:
        """After the unit that committed the last token: the digests, and nothing held."""
        gen = self.stream.finish()
        own = self.units
        logits = np.array(self.prepared.logits, np.float32)
        self.result = Outcome(
            job=self.job, tape=self.tape, logits=logits,
            digests={"logits": logits_digest(logits), "captures": capture_digest(self.sess.boundary_captures),
                     "final_state": self.sess.cache.digest(), "continuation": continuation_digest(gen.tokens)},
            tokens=[int(t) for t in gen.tokens], acceptance=dict(gen.metrics),
            arrival_s=self.job.arrival_s, start_s=own[0].start_s, first_event_s=self.first_event_s,
            finish_s=self.finish_s, units=len(own), busy_s=sum(u.seconds for u in own),
            prime_s=sum(u.seconds for u in own if u.kind == PRIME))
        if self.pool is not None:
            self.pool.give(self.job, self.sess)
        self.sess = self.stream = self.prepared = None


# ------------------------------------------------------------------------------------------------
# the clock
# ------------------------------------------------------------------------------------------------
def device_timer(engine) -> Callable:
    """The scheduler's clock source: runs a unit between two backend synchronisations and
    returns (its result, the seconds it took)."""
    sync = engine.B.synchronize

    def timed(fn):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        return out, time.perf_counter() - t0

    return timed


# ------------------------------------------------------------------------------------------------
# policies
# ------------------------------------------------------------------------------------------------
def _next_after(candidates: list, last: int | None, order: dict):
    """The first candidate after ``last`` in the rotation (by ``order`` rank, cyclic)."""
    ranked = sorted(candidates, key=lambda r: order[r.index])
    if last is None:
        return ranked[0]
    after = [r for r in ranked if order[r.index] > order[last]]
    return (after or ranked)[0]


class _Chooser:
    """The policy's state across ticks: the rotation cursors and, for ``interval``, the decode
    units still owed before the next prime chunk."""

    def __init__(self, policy: Policy, order: dict):
        self.policy, self.order = policy, order
        self.last = self.last_prime = self.last_decode = None
        self.owed = 0

    def pick(self, ready: list):
        p = self.policy.name
        if p == "drain":
            started = [r for r in ready if r.mid_prime]
            choice = started[0] if started else _next_after(ready, self.last, self.order)
        elif p == "yield":
            choice = _next_after(ready, self.last, self.order)
        else:
            primes = [r for r in ready if r.priming]
            decodes = [r for r in ready if not r.priming]
            if decodes and (self.owed > 0 or not primes):
                choice = _next_after(decodes, self.last_decode, self.order)
                self.last_decode = choice.index
                self.owed = max(self.owed - 1, 0)
            else:
                choice = _next_after(primes, self.last_prime, self.order)
                self.last_prime = choice.index
                self.owed = self.policy.steps
        self.last = choice.index
        return choice


# ------------------------------------------------------------------------------------------------
# the schedule
# ------------------------------------------------------------------------------------------------
@dataclass
class Schedule:
    """A finished run: the policy, every unit in order (the timeline) and each job's outcome."""

    policy: Policy
    units: list = field(default_factory=list)  # Unit, in tick order
    outcomes: list = field(default_factory=list)  # Outcome, in job order
    idle_s: float = 0.0  # clock time with no session ready

    @property
    def makespan_s(self) -> float:
        return self.units[-1].end_s if self.units else 0.0

    @property
    def longest_tick_s(self) -> float:
        """The longest single unit."""
        return max((u.seconds for u in self.units), default=0.0)

    @property
    def longest_hold_s(self) -> float:
        """The longest stretch of consecutive units of one session while another session was
        ready and waiting (what a drained prime costs the sessions queued behind it)."""
        best, cur, owner = 0.0, 0.0, None
        for u in self.units:
            if u.waiting and u.session == owner:
                cur += u.seconds
            elif u.waiting:
                cur, owner = u.seconds, u.session
            else:
                cur, owner = 0.0, None
            best = max(best, cur)
        return best


def run_schedule(engine, jobs: list, policy: Policy, timer: Callable | None = None,
                 pool: SessionPool | None = None) -> Schedule:
    """Run ``jobs`` on ``engine`` under ``policy`` until every job has committed its tokens.

    ``timer(fn) -> (fn(), seconds)`` measures each unit (default :func:`device_timer`: the
    backend synchronised around the unit). ``pool``: sessions come from it and go back to it
    (None: every session is new). Errors (a refused prompt, a capacity overflow) propagate as
    :class:`~harness.errors.PrimewalkError`."""
    timer = timer or device_timer(engine)
    runs = [_Run(engine, i, j, pool) for i, j in enumerate(jobs)]
    order = {r.index: rank for rank, r in enumerate(sorted(runs, key=lambda r: (r.job.arrival_s, r.index)))}
    chooser = _Chooser(policy, order)
    out = Schedule(policy)
    now = 0.0
    while True:
        pending = [r for r in runs if not r.done]
        if not pending:
            break
        ready = [r for r in pending if r.job.arrival_s <= now]
        if not ready:
            nxt = min(r.job.arrival_s for r in pending)
            out.idle_s += nxt - now
            now = nxt
            continue
        run = chooser.pick(ready)
        (kind, phase, rows), dt = timer(run.run_unit)
        end = now + dt
        waiting = sum(1 for r in pending if r is not run and r.job.arrival_s < end)
        unit = Unit(run.index, kind, phase, rows, now, end, waiting)
        now = end
        out.units.append(unit)
        run.units.append(unit)
        if run.first_event_s is None and run.first_token_ready():
            run.first_event_s = now
        if run.stream is not None and run.stream.done:
            run.finish_s = now
            run.close()
    out.outcomes = [r.result for r in runs]
    return out
