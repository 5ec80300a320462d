"""Running a fairness spec: every session alone, then all of them under each policy; the verdict
and the receipt.

:func:`run_fairness` loads the model once, warms up (a short multi-chunk prime of the long prompt
beside every other session as it is, so compilation and graph capture are in no timing), then:

1. runs each session **alone** on the engine, in a new session (its reference); with ``arrival_unit =
   "long_prime"`` the long prompt's alone time to first token becomes the unit of every arrival;
2. with ``independent_check``, checks each alone run's prime logits and boundary captures against
   an independent unyielded prime (:func:`~harness.walk.check.oracle_prime`: one batched prime
   per segment, no walker);
3. runs all sessions together under each policy (:func:`~harness.walk.scheduler.run_schedule`),
   their sessions from a :class:`~harness.walk.scheduler.SessionPool` that the warm-up filled
   (its sessions reset and reused, their captured steps with them; what a run needs beyond them
   allocated before it starts), so the verdict also proves reused sessions equal new ones;
4. judges every (run, session) cell: ``bitwise`` when its prime logits, boundary captures, final
   cache, continuation, tape and acceptance counts equal its alone run's, else ``fail`` naming the
   fields (and max |Δ| / max ulp of the logits);
5. summarises each policy (peers' first-event latency p50 / p95 / max, the long prompt's time to
   first token, the longest tick and hold) and evaluates the spec's goals.

The receipt (:mod:`.receipt`) has one cell per (run, session), shaped like a matrix cell, so
``harness diff`` compares fairness receipts field by field.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np

from ..engine.digests import logits_digest
from ..engine.model import Engine
from ..engine.weights import load_checkpoint
from ..errors import PrimewalkError
from ..matrix.receipts import SCHEMA_VERSION, env_info, spec_hash, utc_now
from ..matrix.runner import _compare
from ..walk.check import oracle_prime
from ..walk.sampling import Sampling
from ..walk.scheduler import Job, Policy, SessionPool, run_schedule
from .receipt import KIND
from .specfile import FairnessSpec

ALONE = "alone"
WARMUP_NEW_TOKENS = 4
WARMUP_EXTRA_ROWS = 3  # rows beyond one chunk in the warm-up prime: a ragged last trunk chunk


def _jobs(spec: FairnessSpec, ids: list, scale: float) -> list:
    return [Job(s.name, tuple(ids[i]), s.arrival * scale, s.max_new_tokens, s.k, s.sampling, i, spec.chunk_rows,
                spec.fill_chunk, s.boundary) for i, s in enumerate(spec.sessions)]


def warm_up(engine, jobs: list, timer=None, pool=None) -> None:
    """Compile before timing: a prime of the long prompt's first rows long enough for trunk and
    fill chunks, beside every other job as it is (so every kernel and every captured step the
    runs use exists; with ``pool``, their sessions, steps captured, stay in it for the runs)."""
    long = jobs[0]
    fill, chunk = long.fill_chunk, long.chunk_rows
    rows = min(len(long.prompt), max(fill, chunk) + WARMUP_EXTRA_ROWS)
    first = replace(long, name="warm-up", prompt=long.prompt[:rows], arrival_s=0.0, boundary=None,
                    max_new_tokens=WARMUP_NEW_TOKENS, k=max(long.k, 1), sampling=Sampling())
    others = [replace(j, name="warm-up", arrival_s=0.0) for j in jobs[1:]]
    run_schedule(engine, [first] + others, Policy("yield"), timer, pool)


def _pct(values: list) -> dict:
    if not values:
        return {"p50": None, "p95": None, "max": None, "values": []}
    a = np.asarray(values, np.float64)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)), "max": float(a.max()),
            "values": [float(v) for v in values]}


# ------------------------------------------------------------------------------------------------
# cells and verdicts
# ------------------------------------------------------------------------------------------------
def _acceptance(m: dict) -> dict:
    return {"drafts": int(m.get("drafts", 0)), "draft_tokens": int(m.get("draft_tokens", 0)),
            "accepted": int(m.get("accepted", 0)),
            "mean_acceptance_length": float(m["mean_acceptance_length"]) if "mean_acceptance_length" in m else None,
            "per_position": [float(x) for x in m.get("per_position", [])],
            "histogram": [int(x) for x in m.get("histogram", [])]}


def _first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def judge(got, ref) -> dict:
    """The verdict of outcome ``got`` against the alone outcome ``ref`` of the same session."""
    differ = [f for f in ("logits", "captures", "final_state") if got.digests[f] != ref.digests[f]]
    if got.digests["continuation"] != ref.digests["continuation"]:
        differ.append(f"continuation (from token {_first_difference(got.tokens, ref.tokens)})")
    if got.tape != ref.tape:
        differ.append("tape")
    ga, ra = _acceptance(got.acceptance), _acceptance(ref.acceptance)
    if any(ga[f] != ra[f] for f in ("drafts", "accepted", "histogram")):
        differ.append("acceptance")
    if not differ:
        return {"status": "bitwise", "max_abs": 0.0, "max_ulp": 0, "bound": None,
                "detail": "logits, captures, final state, continuation and tape bitwise equal to the session alone"}
    max_abs, max_ulp = _compare(got.logits, ref.logits)
    return {"status": "fail", "max_abs": max_abs, "max_ulp": max_ulp, "bound": None,
            "detail": "differs from the session alone: " + "; ".join(differ)}


def judge_alone(ref, indep) -> dict:
    """The verdict of an alone run: against an independent unyielded prime (``indep`` = its
    (logits, capture digest)), or, without one, the reference as it stands."""
    if indep is None:
        return {"status": "bitwise", "max_abs": 0.0, "max_ulp": 0, "bound": None,
                "detail": "the reference: this session alone on the engine (independent_check = false)"}
    logits, caps = indep
    differ = []
    if ref.digests["logits"] != logits_digest(logits):
        differ.append("logits")
    if ref.digests["captures"] != caps:
        differ.append("captures")
    if not differ:
        return {"status": "bitwise", "max_abs": 0.0, "max_ulp": 0, "bound": None,
                "detail": "the reference: logits and captures bitwise equal to an independent unyielded prime"}
    max_abs, max_ulp = _compare(ref.logits, np.asarray(logits, np.float32))
    return {"status": "fail", "max_abs": max_abs, "max_ulp": max_ulp, "bound": None,
            "detail": "differs from an independent unyielded prime: " + "; ".join(differ)}


def _cell(order: int, run: str, policy: Policy | None, s, o, spec: FairnessSpec, model: str, verdict: dict) -> dict:
    args = {"steps": policy.steps} if policy is not None and policy.name == "interval" else {}
    return {
        "id": f"{run}/{s.name}", "order": order, "run": run, "session": s.name, "role": s.role, "model": model,
        "prompt": s.name, "prompt_len": s.length, "variant": run, "variant_args": args,
        "chunk_rows": spec.chunk_rows, "fill_chunk": spec.fill_chunk, "boundary_points":
            [s.boundary] if s.boundary else [], "k": s.k, "sampling": s.sampling.label,
        "temperature": float(s.sampling.temperature), "seed": int(s.sampling.seed), "mode": "exact",
        "oracle": f"{ALONE}/{s.name}", "max_new_tokens": s.max_new_tokens,
        "tape": [list(t) for t in o.tape],
        # every run drives the walker one chunk per unit: it hands the device back after each chunk
        "yields": len(o.tape) - 1,
        "digests": dict(o.digests), "verdict": verdict, "continuation": {"tokens": list(o.tokens)},
        "acceptance": _acceptance(o.acceptance),
        "timings": {"arrival_s": o.arrival_s, "start_s": o.start_s, "first_event_s": o.first_event_s,
                    "finish_s": o.finish_s, "first_event_latency_s": o.first_event_latency_s,
                    "finish_latency_s": o.finish_latency_s, "busy_s": o.busy_s, "prime_s": o.prime_s,
                    "units": o.units},
    }


def summarise(schedule, sessions: list, alone_long_ttft: float | None) -> dict:
    """A policy's measures: peers' first-event latency (p50, p95 by numpy's linear
    interpolation, max), the long prompt's time to first token (and over its alone time), the
    longest tick and hold, the makespan, and the timeline."""
    peers = [o.first_event_latency_s for o, s in zip(schedule.outcomes, sessions) if s.role == "peer"]
    long = next(o for o, s in zip(schedule.outcomes, sessions) if s.role == "long")
    pct = _pct(peers)
    pol = schedule.policy
    return {
        "label": pol.label, "name": pol.name, "steps": pol.steps if pol.name == "interval" else None,
        "peers_first_event_latency_s": pct, "peers_p50_s": pct["p50"], "peers_p95_s": pct["p95"],
        "peers_max_s": pct["max"], "long_ttft_s": long.first_event_latency_s,
        "long_ttft_over_alone": (long.first_event_latency_s / alone_long_ttft) if alone_long_ttft else None,
        "longest_tick_s": schedule.longest_tick_s, "longest_hold_s": schedule.longest_hold_s,
        "makespan_s": schedule.makespan_s, "idle_s": schedule.idle_s, "units": len(schedule.units),
        # [session index, kind, phase, rows, start_s, end_s] per unit, in tick order
        "timeline": [[u.session, u.kind, u.phase, u.rows, u.start_s, u.end_s] for u in schedule.units],
    }


def evaluate_goals(goals: list, summaries: dict) -> list:
    out = []
    for g in goals:
        v, b = summaries[g.policy].get(g.metric), summaries[g.baseline].get(g.metric)
        ratio = v / b if isinstance(v, float) and isinstance(b, float) and b > 0 else None
        out.append({"metric": g.metric, "policy": g.policy, "baseline": g.baseline, "max_ratio": g.max_ratio,
                    "value": v, "baseline_value": b, "ratio": ratio,
                    "met": None if ratio is None else bool(ratio <= g.max_ratio)})
    return out


# ------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------
def _say(log, text):
    if log is not None:
        log(text)


def run_fairness(spec: FairnessSpec, timer=None, log=None, engine=None) -> dict:
    """Run ``spec`` (see the module docstring) and return the receipt (not written).

    ``timer``: the scheduler's clock source (default: the device timer); ``log(text)``: told
    what runs; ``engine``: an already loaded engine of the spec's model and backend."""
    t0 = time.perf_counter()
    if engine is None:
        ck = load_checkpoint(spec.model_dir)
        ck.require_mtp("harness fairness")
        engine = Engine(ck, spec.backend)
    ck = engine.ckpt
    V = engine.cfg.vocab_size
    sessions = spec.sessions
    ids = []
    for s in sessions:
        got = s.ids(V)
        bad = [t for t in got if not 0 <= t < V]
        if bad:
            raise PrimewalkError(f"{spec.where}: {s.name}: token id {bad[0]} is out of range for the model "
                                 f"(vocab_size {V})")
        ids.append(got)
    _say(log, f"warm-up ({len(sessions)} sessions, backend {spec.backend})")
    pool = SessionPool(engine)  # the policies' sessions (the alone runs take new ones)
    warm_up(engine, _jobs(spec, ids, 1.0), timer, pool)

    # 1. every session alone (the long prompt first: it may set the arrival unit)
    alone = []
    for job in _jobs(spec, ids, 0.0):
        alone.append(run_schedule(engine, [job], Policy("drain"), timer).outcomes[0])
    alone_ttft = alone[0].first_event_latency_s
    scale = alone_ttft if spec.arrival_unit == "long_prime" else 1.0
    _say(log, f"{ALONE}: {len(sessions)} sessions; the long prompt's time to first token {alone_ttft:.3f} s")
    # 2. the alone runs against independent unyielded primes
    indep = [None] * len(sessions)
    if spec.independent_check:
        for i, s in enumerate(sessions):
            indep[i] = oracle_prime(engine, ids[i], max(s.k, 1), [s.boundary] if s.boundary else [])
    # 3. all sessions under each policy
    jobs = _jobs(spec, ids, scale)
    schedules = []
    for pol in spec.policies:
        pool.prepare(jobs)
        sch = run_schedule(engine, jobs, pol, timer, pool)
        schedules.append(sch)
        summary = summarise(sch, sessions, alone_ttft)
        _say(log, f"{pol.label}: peers' first event p95 {_fmt(summary['peers_p95_s'])}, long time to first token "
                  f"{summary['long_ttft_s']:.3f} s, longest hold {summary['longest_hold_s']:.3f} s")

    # 4. cells and verdicts
    model = _model_name(spec)
    cells = []
    for i, (s, o) in enumerate(zip(sessions, alone)):
        cells.append(_cell(len(cells), ALONE, None, s, o, spec, model, judge_alone(o, indep[i])))
    for sch in schedules:
        for s, o, ref in zip(sessions, sch.outcomes, alone):
            cells.append(_cell(len(cells), sch.policy.label, sch.policy, s, o, spec, model, judge(o, ref)))
    # 5. summaries and goals
    summaries = {sch.policy.label: summarise(sch, sessions, alone_ttft) for sch in schedules}
    failed = [c["id"] for c in cells if c["verdict"]["status"] != "bitwise"]
    env = env_info(spec.backend, device=None if spec.backend == "cpu" else engine.B.device_name(),
                   driver=None if spec.backend == "cpu" else engine.B.driver())
    data = dict(spec.data)
    return {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "created": utc_now(), "env": env,
        "model": {"name": model, "path": spec.model_dir if spec.model != "tiny" else "tiny",
                  "weights_sha256": ck.sha256, "config": ck.config.to_dict()},
        "spec": data, "spec_hash": spec_hash(data), "shard": {"index": 0, "count": 1},
        "wall_s": time.perf_counter() - t0,
        "sessions": [{"index": i, "name": s.name, "role": s.role, "prompt_len": s.length,
                      "arrival_s": j.arrival_s, "max_new_tokens": s.max_new_tokens, "k": s.k,
                      "sampling": s.sampling.label} for i, (s, j) in enumerate(zip(sessions, jobs))],
        "alone": {"long_ttft_s": alone_ttft, "arrival_unit": spec.arrival_unit, "arrival_scale_s": scale,
                  "independent_check": spec.independent_check},
        "policies": [summaries[p.label] for p in spec.policies],
        "goals": evaluate_goals(spec.goals, summaries),
        "verdict": {"status": "fail" if failed else "bitwise", "cells": len(cells), "sessions": len(sessions),
                    "failed": failed},
        "cells": cells,
    }


def _model_name(spec: FairnessSpec) -> str:
    return "tiny" if spec.model == "tiny" else (os.path.basename(os.path.normpath(spec.model)) or "model")


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.3f} s"
