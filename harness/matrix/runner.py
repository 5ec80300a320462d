"""Running the matrix: each cell primed, continued, judged against its oracle; the receipt.

:func:`run_cell` primes a cell's prompt under its schedule with the MTP prime walker, continues
``max_new_tokens`` tokens speculatively, then plainly from a snapshot of the primed cache on a
second session (so the digests are untouched). :func:`verdict` judges it: a cell is ``bitwise``
when its prime logits, final cache state and continuation equal its oracle's bit for bit (the
oracle is the ``unyielded`` cell of the same model, prompt, K and sampling) and its boundary
captures equal an independent unyielded prime of the same segments (``oracle_prime``); the
oracle cell itself is checked against that independent prime. Greedy cells also check that the
speculative continuation equals plain decoding token for token (DESIGN §6). Otherwise the
verdict is ``fail``, with max |Δ| and max ulp of the prime logits and what differed.
:func:`run_matrix` runs the cells of a spec (one engine per model) and returns the receipt.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..engine.digests import capture_digest, continuation_digest, logits_digest
from ..engine.model import Engine
from ..engine.weights import load_checkpoint
from ..errors import PrimewalkError
from ..walk.check import Peer, oracle_prime
from ..walk.mtp_walker import DEFAULT_CHUNK_ROWS, run_prime
from ..walk.speculative import continue_plain, continue_spec
from .cells import Cell, expand
from .receipts import KIND, SCHEMA_VERSION, env_info, spec_hash, utc_now
from .specfile import MatrixSpec

PEER_PROMPT_LEN = 64
PEER_SEED = 1234


# ------------------------------------------------------------------------------------------------
# one cell
# ------------------------------------------------------------------------------------------------
@dataclass
class Raw:
    """What one cell's run produced (before the verdict)."""

    tape: list
    yields: int
    logits: np.ndarray
    digests: dict
    tokens: list
    plain_tokens: list
    acceptance: dict
    timings: dict


def capacity(tp: int, max_new: int, k: int) -> int:
    """Cache positions of a cell's session: the same for every schedule of one (prompt, K), since
    the speculative loop caps its drafts by the room left."""
    return tp + max_new + 2 * (k + 1) + 16


def _finite(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def run_cell(engine, cell: Cell, ids: list, max_new: int) -> Raw:
    """Prime ``ids`` under the cell's schedule, continue speculatively, then plainly from a
    snapshot of the primed cache on a second session (so the digests are untouched)."""
    tp = len(ids)
    cap = capacity(tp, max_new, cell.k)
    sess = engine.new_session(cap)
    hook = None
    if cell.yielded:
        hook = Peer(engine, prompt_len=PEER_PROMPT_LEN, seed=PEER_SEED).step
    run = run_prime(engine, sess, ids, cell.k, sampling=cell.sampling, yield_hook=hook,
                    prime_split=cell.split, chunk_rows=cell.chunk_rows or DEFAULT_CHUNK_ROWS,
                    fill_chunk=cell.fill_chunk, tokenwise=cell.tokenwise, capture_at=cell.split,
                    ckpt_at=cell.checkpoint)
    prepared = run.prepared
    logits = np.array(prepared.logits, dtype=np.float32)
    captures = capture_digest(sess.boundary_captures)
    snap = sess.cache.snapshot()
    gen = continue_spec(engine, sess, prepared, max_new, cell.k, cell.sampling)
    final = sess.cache.digest()
    plain_sess = engine.new_session(cap, session_id=sess.session_id)
    plain_sess.cache.restore(snap)
    plain = continue_plain(engine, plain_sess, prepared, max_new, cell.sampling)
    prime_s = prepared.wall_s if getattr(prepared, "wall_s", 0.0) else run.wall_s
    m = gen.metrics
    acceptance = {"drafts": int(m.get("drafts", 0)), "draft_tokens": int(m.get("draft_tokens", 0)),
                  "accepted": int(m.get("accepted", 0)),
                  "mean_acceptance_length": _finite(m.get("mean_acceptance_length")),
                  "per_position": [_finite(x) for x in m.get("per_position", [])],
                  "histogram": [int(x) for x in m.get("histogram", [])]}
    timings = {"prime_s": _finite(prime_s),
               "prime_tokens_per_s": _finite(tp / prime_s) if prime_s > 0 else None,
               "chunk_wall_s": [_finite(x) for x in run.chunk_wall_s],
               "decode_tokens_per_s": _finite(plain.tokens_per_s) or None,
               "spec_tokens_per_s": _finite(gen.tokens_per_s) or None}
    return Raw(tape=[[str(ph), int(r)] for ph, r in run.tape], yields=int(run.yields), logits=logits,
               digests={"logits": logits_digest(logits), "captures": captures, "final_state": final,
                        "continuation": continuation_digest(gen.tokens)},
               tokens=[int(t) for t in gen.tokens], plain_tokens=[int(t) for t in plain.tokens],
               acceptance=acceptance, timings=timings)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance in float32 units in the last place between ``a`` and ``b``."""
    ia = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
    ib = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
    oa = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ob = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.max(np.abs(oa - ob))) if oa.size else 0


def _compare(a: np.ndarray, b: np.ndarray) -> tuple:
    if a.shape != b.shape:
        return None, None
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return _finite(np.max(d)) if d.size else 0.0, ulp_distance(a, b)


def verdict(cell: Cell, raw: Raw, oracle: Raw, indep_logits: np.ndarray, indep_captures: str) -> dict:
    """The cell's verdict against its oracle (see the module docstring)."""
    is_oracle = cell.id == cell.oracle
    ref = np.asarray(indep_logits, np.float32) if is_oracle else oracle.logits
    differ = []
    if is_oracle:
        if raw.digests["logits"] != logits_digest(indep_logits):
            differ.append("logits (vs an independent unyielded prime)")
    elif raw.digests["logits"] != oracle.digests["logits"]:
        differ.append("logits")
    want_caps = indep_captures if (cell.points or is_oracle) else oracle.digests["captures"]
    if raw.digests["captures"] != want_caps:
        differ.append("captures" + (f" at {','.join(map(str, cell.points))}" if cell.points else ""))
    if not is_oracle:
        if raw.digests["final_state"] != oracle.digests["final_state"]:
            differ.append("final_state")
        if raw.tokens != oracle.tokens:
            i = next((j for j, (x, y) in enumerate(zip(raw.tokens, oracle.tokens)) if x != y),
                     min(len(raw.tokens), len(oracle.tokens)))
            differ.append(f"continuation (from token {i})")
    if cell.sampling.greedy and raw.tokens != raw.plain_tokens:
        i = next((j for j, (x, y) in enumerate(zip(raw.tokens, raw.plain_tokens)) if x != y),
                 min(len(raw.tokens), len(raw.plain_tokens)))
        differ.append(f"speculative vs plain greedy decoding (from token {i})")
    if not differ:
        detail = ("the oracle: logits and captures bitwise equal to an independent unyielded prime"
                  if is_oracle else "logits, captures, final state and continuation bitwise equal to the oracle")
        return {"status": "bitwise", "max_abs": 0.0, "max_ulp": 0, "bound": None, "detail": detail}
    max_abs, max_ulp = _compare(raw.logits, ref)
    return {"status": "fail", "max_abs": max_abs, "max_ulp": max_ulp, "bound": None,
            "detail": "differs: " + "; ".join(differ)}


# ------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------
@dataclass
class _Model:
    name: str
    path: str
    ckpt: object
    engine: object
    ids: dict = field(default_factory=dict)  # prompt name -> ids


def load_models(spec: MatrixSpec) -> dict:
    """One engine per model (every cell of a model shares it), prompts checked against its vocab."""
    out = {}
    for name, folder in spec.model_dirs.items():
        ck = load_checkpoint(folder)
        ck.require_mtp("the schedule matrix")
        eng = Engine(ck, spec.backend, mode=spec.mode)
        m = _Model(name, folder, ck, eng)
        V = ck.config.vocab_size
        for ps in spec.prompts:
            ids = ps.ids(V)
            bad = [t for t in ids if not 0 <= t < V]
            if bad:
                raise PrimewalkError(f"{spec.where}: {ps.key}: token id {bad[0]} is out of range for "
                                     f"model {name} (vocab_size {V})")
            m.ids[ps.name] = ids
        out[name] = m
    return out


def model_block(models: dict) -> dict:
    blocks = {n: {"name": n, "path": m.path, "weights_sha256": m.ckpt.sha256,
                  "config": m.ckpt.config.to_dict()} for n, m in models.items()}
    if len(blocks) == 1:
        return next(iter(blocks.values()))
    joined = "".join(f"{n}={b['weights_sha256']}\n" for n, b in blocks.items())
    return {"name": "+".join(blocks), "path": None,
            "weights_sha256": hashlib.sha256(joined.encode()).hexdigest(), "config": None,
            "models": blocks}


class SilentProgress:
    """What :func:`run_matrix` tells about its progress, and the silent default: ``notes`` (the
    cells left out, before anything loads), ``begin`` (the number of cells to run, once the
    models are loaded), ``start`` (cell i of total begins), ``done`` (its receipt entry), and
    ``close`` (always, also on an error). ``harness.cli.progress.Progress`` is the console
    display."""

    def notes(self, notes: list) -> None:
        pass

    def begin(self, total: int) -> None:
        pass

    def start(self, i: int, total: int, cell_id: str) -> None:
        pass

    def done(self, entry: dict) -> None:
        pass

    def close(self) -> None:
        pass


def run_matrix(spec: MatrixSpec, shard: tuple = (0, 1), models: dict | None = None,
               progress: SilentProgress | None = None) -> dict:
    """Run the cells of ``spec`` in shard ``shard`` = (I, N) (cells i with i % N == I) and return
    the receipt (not written). Oracle cells outside the shard are run, not recorded. ``models``:
    :func:`load_models`' result, if already loaded; ``progress``: told what happens (see
    :class:`SilentProgress`, the default)."""
    progress = progress or SilentProgress()
    t0 = time.perf_counter()
    cells, notes = expand(spec)
    progress.notes(notes)
    models = models if models is not None else load_models(spec)
    index, count = shard
    mine = [c for c in cells if c.order % count == index]
    by_id = {c.id: c for c in cells}
    oracles: dict = {}  # oracle cell id -> Raw
    indep: dict = {}  # (cell group, points) -> (logits, capture digest)
    out = []
    progress.begin(len(mine))
    try:
        for i, cell in enumerate(mine):
            progress.start(i, len(mine), cell.id)
            m = models[cell.model]
            ids = m.ids[cell.prompt.name]
            if cell.oracle not in oracles:
                ocell = by_id[cell.oracle]
                oracles[cell.oracle] = run_cell(m.engine, ocell, ids, spec.max_new_tokens)
            if cell.id == cell.oracle:
                raw = oracles[cell.oracle]
            else:
                raw = run_cell(m.engine, cell, ids, spec.max_new_tokens)
            key = cell.group + (cell.points,)
            if key not in indep:
                indep[key] = oracle_prime(m.engine, ids, cell.k, list(cell.points), cell.sampling)
            ilogits, icaps = indep[key]
            entry = {
                "id": cell.id, "order": cell.order, "model": cell.model, "prompt": cell.prompt.name,
                "prompt_len": cell.prompt.length, "variant": cell.variant,
                "variant_args": dict(cell.variant_args), "chunk_rows": cell.chunk_rows,
                "fill_chunk": cell.fill_chunk, "boundary_points": list(cell.points), "k": cell.k,
                "sampling": cell.sampling_label, "temperature": float(cell.sampling.temperature),
                "seed": int(cell.sampling.seed), "mode": spec.mode, "oracle": cell.oracle,
                "tape": raw.tape, "yields": raw.yields, "digests": dict(raw.digests),
                "verdict": verdict(cell, raw, oracles[cell.oracle], np.asarray(ilogits), icaps),
                "continuation": {"tokens": list(raw.tokens)},
                "acceptance": dict(raw.acceptance), "timings": dict(raw.timings),
            }
            out.append(entry)
            progress.done(entry)
    finally:
        progress.close()
    first = next(iter(models.values()))
    B = first.engine.B
    env = env_info(spec.backend, device=None if spec.backend == "cpu" else B.device_name(),
                   driver=None if spec.backend == "cpu" else B.driver())
    data = dict(spec.data)
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "created": utc_now(), "env": env,
            "model": model_block(models), "spec": data, "spec_hash": spec_hash(data),
            "shard": {"index": index, "count": count}, "wall_s": time.perf_counter() - t0,
            "notes": list(notes), "cells": out}
