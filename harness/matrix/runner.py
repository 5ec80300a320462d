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

from ..engine.digests import capture_digest, continuation_digest, logits_digest, prompt_digest
from ..engine.draft import digest as draft_digest
from ..engine.draft import read_draft_vocab
from ..engine.model import Engine
from ..engine.threads import machine_load
from ..engine.tokenizer import describe as describe_tokenizer
from ..engine.tokenizer import load_tokenizer
from ..engine.weights import load_checkpoint
from ..errors import PrimewalkError
from ..walk.check import Peer, oracle_prime
from ..walk.mtp_walker import DEFAULT_CHUNK_ROWS, run_prime
from ..walk.speculative import continue_plain, continue_spec
from ..walk.warmup import warm_up
from .cells import Cell, expand_all, note_of
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


def prime_cell(engine, cell: Cell, ids: list, max_new: int, trace=None) -> tuple:
    """A new session primed with ``ids`` under the cell's schedule: (session, PrimeRun).
    ``trace``: a :class:`~harness.engine.trace.Trace` recording the session from here on."""
    sess = engine.new_session(capacity(len(ids), max_new, cell.k))
    sess.trace = trace
    hook = None
    if cell.yielded:
        hook = Peer(engine, prompt_len=PEER_PROMPT_LEN, seed=PEER_SEED).step
    return sess, run_prime(engine, sess, ids, cell.k, sampling=cell.sampling, yield_hook=hook,
                           prime_split=cell.split, chunk_rows=cell.chunk_rows or DEFAULT_CHUNK_ROWS,
                           fill_chunk=cell.fill_chunk, tokenwise=cell.tokenwise, capture_at=cell.split,
                           ckpt_at=cell.checkpoint)


def run_cell(engine, cell: Cell, ids: list, max_new: int, trace=None) -> Raw:
    """Prime ``ids`` under the cell's schedule, continue speculatively, then plainly from a
    snapshot of the primed cache on a second session (so the digests are untouched). ``trace``:
    a Trace recording the cell's session (prime and speculative continuation)."""
    tp = len(ids)
    cap = capacity(tp, max_new, cell.k)
    sess, run = prime_cell(engine, cell, ids, max_new, trace)
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
    tokenizer: dict = field(default_factory=dict)  # what produced the text prompts' ids (receipt)


def load_models(spec: MatrixSpec, weights: str | None = None, draft_vocab: str | None = None) -> dict:
    """One engine per model (every cell of a model shares it), prompts checked against its vocab.
    ``weights``: the engines' resident weights (``Engine``'s ``weights``; None: auto);
    ``draft_vocab``: ``--draft-vocab`` as given (a count or a file of ids), read against each
    model's vocabulary (:mod:`harness.engine.draft`)."""
    out = {}
    for name, folder in spec.model_dirs.items():
        ck = load_checkpoint(folder)
        ck.require_mtp("the schedule matrix")
        eng = Engine(ck, spec.backend, weights=weights, mode=spec.mode,
                     draft_vocab=read_draft_vocab(draft_vocab, ck.config.vocab_size))
        tok = spec.tokenizers[name] if name in spec.tokenizers else load_tokenizer(folder, ck.config.vocab_size)
        m = _Model(name, folder, ck, eng, tokenizer=describe_tokenizer(tok))
        V = ck.config.vocab_size
        for ps in spec.prompts:
            ids = spec.prompt_ids(name, ps, V)
            bad = [t for t in ids if not 0 <= t < V]
            if bad:
                raise PrimewalkError(f"{spec.where}: {ps.key}: token id {bad[0]} is out of range for "
                                     f"model {name} (vocab_size {V})")
            m.ids[ps.name] = ids
        out[name] = m
    return out


def model_block(models: dict) -> dict:
    blocks = {n: {"name": n, "path": m.path, "weights_sha256": m.ckpt.sha256,
                  "config": m.ckpt.config.to_dict(), "tokenizer": m.tokenizer} for n, m in models.items()}
    if len(blocks) == 1:
        return next(iter(blocks.values()))
    joined = "".join(f"{n}={b['weights_sha256']}\n" for n, b in blocks.items())
    return {"name": "+".join(blocks), "path": None,
            "weights_sha256": hashlib.sha256(joined.encode()).hexdigest(), "config": None,
            "models": blocks}


class SilentProgress:
    """What :func:`run_matrix` tells about its progress, and the silent default: ``notes`` (the
    cells left out, before anything loads), ``begin`` (the number of cells to run, once the
    models are loaded), ``start`` (cell i of total begins), ``done`` (its receipt entry),
    ``warning`` (a worker of a parallel run died; its cells run again elsewhere), and ``close``
    (always, also on an error). ``harness.cli.progress.Progress`` is the console display."""

    def notes(self, notes: list) -> None:
        pass

    def begin(self, total: int) -> None:
        pass

    def start(self, i: int, total: int, cell_id: str) -> None:
        pass

    def done(self, entry: dict) -> None:
        pass

    def warning(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def in_shard(cells: list, shard: tuple) -> list:
    """The cells of shard (I, N): those whose spec order i has i % N == I."""
    index, count = shard
    return [c for c in cells if c.order % count == index]


def indep_key(cell: Cell) -> tuple:
    """The key of the independent unyielded prime a cell is judged by: its group and its points."""
    return cell.group + (cell.points,)


def warm_models(spec: MatrixSpec, models: dict) -> float:
    """Run every engine's code paths once (:func:`~harness.walk.warmup.warm_up`) so no cell's
    timings include Numba compiling a kernel; returns the seconds it took (``warmup_s``)."""
    return sum(warm_up(m.engine, max(spec.k)) for m in models.values())


def run_matrix(spec: MatrixSpec, shard: tuple = (0, 1), models: dict | None = None,
               progress: SilentProgress | None = None, warmup: bool = True,
               bisect_failures: bool = False, weights: str | None = None, draft_vocab: str | None = None) -> dict:
    """Run the cells of ``spec`` in shard ``shard`` = (I, N) (cells i with i % N == I) and return
    the receipt (not written). Oracle cells outside the shard are run, not recorded. ``models``:
    :func:`load_models`' result, if already loaded; ``progress``: told what happens (see
    :class:`SilentProgress`, the default); ``warmup``: run every engine's code paths once before
    the first cell (:func:`warm_models`), so no cell's timings include Numba compiling a kernel
    (``warmup_s`` records how long it took). :mod:`.pool` runs the same cells in worker
    processes or on Ray, with the same receipt. ``bisect_failures``: bisect every failed cell
    against its oracle (:mod:`harness.matrix.bisect`) into its entry's ``bisect`` field. ``weights``: the engines'
    resident weights (auto, f32, bf16: the same bits, recorded in ``env.weights``); ``draft_vocab``:
    the engines draft among a draft vocabulary (recorded in ``env.draft_vocab``)."""
    progress = progress or SilentProgress()
    t0 = time.perf_counter()
    load_start = machine_load()
    cells, skipped = expand_all(spec)
    notes = [note_of(x) for x in skipped]
    progress.notes(notes)
    models = models if models is not None else load_models(spec, weights, draft_vocab)
    progress.notes([f"model {n}: {note}" for n, m in models.items() for note in m.ckpt.notes])
    warm_s = warm_models(spec, models) if warmup else 0.0
    mine = in_shard(cells, shard)
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
            key = indep_key(cell)
            if key not in indep:
                indep[key] = oracle_prime(m.engine, ids, cell.k, list(cell.points), cell.sampling)
            ilogits, icaps = indep[key]
            entry = cell_entry(spec, cell, raw, oracles[cell.oracle], ilogits, icaps, prompt_digest(ids))
            if bisect_failures and entry["verdict"]["status"] == "fail":
                from .bisect import bisect_failure  # bisect runs cells through this module

                entry["bisect"] = bisect_failure(m.engine, cell, by_id[cell.oracle], ids, spec.max_new_tokens)
            out.append(entry)
            progress.done(entry)
    finally:
        progress.close()
    first = next(iter(models.values()))
    return make_receipt(spec, model_block(models), engine_env(spec, first.engine, load_start), shard,
                        time.perf_counter() - t0, warm_s, skipped, out)


def cell_entry(spec: MatrixSpec, cell: Cell, raw: Raw, oracle: Raw, indep_logits, indep_captures: str,
               prompt_sha: str) -> dict:
    """The receipt entry of ``cell``: its schedule (as written and as its points resolved for
    this model's prompt length), what its run produced and its verdict against ``oracle`` (the Raw
    of ``cell.oracle``) and the independent prime of its group and points. ``prompt_sha``:
    :func:`~harness.engine.digests.prompt_digest` of the ids the cell's model was fed (its own
    tokenizer's, for a text prompt). The single-process runner and :mod:`.tasks` both build
    entries here, so a parallel run's receipt equals the single-process one."""
    return {
        "id": cell.id, "order": cell.order, "model": cell.model, "prompt": cell.prompt.name,
        "prompt_len": cell.prompt_len, "schedule": cell.schedule,
        "resolved_points": [{"what": w, "given": g, "row": r, "rule": rule}
                            for w, g, r, rule in cell.resolved],
        "variant": cell.variant,
        "variant_args": dict(cell.variant_args), "chunk_rows": cell.chunk_rows,
        "fill_chunk": cell.fill_chunk, "boundary_points": list(cell.points), "k": cell.k,
        "sampling": cell.sampling_label, "temperature": float(cell.sampling.temperature),
        "seed": int(cell.sampling.seed), "mode": spec.mode, "oracle": cell.oracle,
        "tape": raw.tape, "yields": raw.yields,
        "digests": dict(raw.digests, prompt=prompt_sha),
        "verdict": verdict(cell, raw, oracle, np.asarray(indep_logits), indep_captures),
        "continuation": {"tokens": list(raw.tokens)},
        "acceptance": dict(raw.acceptance), "timings": dict(raw.timings),
    }


def engine_env(spec: MatrixSpec, engine, load_start: dict | None = None) -> dict:
    """The receipt's ``env`` block for a run on ``engine``'s backend: the versions and device, the
    backend's thread count (and why), and -- given ``load_start``, :func:`machine_load` at the
    run's start -- the usable cores and the load averages at the start and now (the end)."""
    B = engine.B
    env = env_info(spec.backend, device=None if spec.backend == "cpu" else B.device_name(),
                   driver=None if spec.backend == "cpu" else B.driver())
    env.update(threads=getattr(B, "threads", None), threads_why=getattr(B, "threads_why", None),
               weights=getattr(engine, "weights", "f32"))  # informational
    ids = getattr(engine, "draft_ids", None)
    if ids is not None:  # drafts among a draft vocabulary: every digest as without, acceptance aside
        env["draft_vocab"] = {"size": int(ids.size), "ids_sha256": draft_digest(ids)}
    if load_start is not None:
        env.update(cores=load_start["cores"],
                   load={"start": load_start["loadavg"], "end": machine_load()["loadavg"]})
    return env


def make_receipt(spec: MatrixSpec, model: dict, env: dict, shard: tuple, wall_s: float, warmup_s: float,
                 skipped: list, entries: list) -> dict:
    """The receipt of a run of ``spec`` (shard (I, N)) whose cell entries are ``entries``:
    ``skipped`` are :func:`~.cells.expand_all`'s skipped schedules (the notes say them in words).
    Both the single-process runner and :mod:`.pool` build their receipt here."""
    index, count = shard
    data = dict(spec.data)
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "created": utc_now(), "env": env,
            "model": model, "spec": data, "spec_hash": spec_hash(data),
            "shard": {"index": index, "count": count}, "wall_s": wall_s,
            "warmup_s": warmup_s, "notes": [note_of(x) for x in skipped], "skipped": list(skipped),
            "cells": entries}
