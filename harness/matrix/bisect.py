"""``harness bisect``: the first layer, op, row and column where two runs that should be
bit-identical part, and how far the difference spreads.

Two *sides* (a and b) each run one matrix cell (a prime under its schedule and the speculative
continuation, :func:`~harness.matrix.runner.run_cell`) or the independent unyielded prime a
matrix oracle is checked against, on one engine (cpu or cuda), with a
:class:`~harness.engine.trace.Trace` on the session. :func:`bisect` then

1. runs both sides hashing every op's output row (side b with the fault, if one is asked for)
   and compares the hashes in the trace's comparison order (row, pass, occurrence, op; see
   :mod:`harness.engine.trace` for why that order puts a fault first);
2. re-runs both sides up to the first differing entry only, keeping that row in full, for the
   first differing column, both values and their ulp distance;
3. counts the spread: every differing entry, the rows and ops they touch, per op.

A side is built from a matrix spec's cell (:func:`cell_sides`) or from a schedule written in the
compact form :func:`parse_schedule` reads (:func:`schedule_sides`).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass

import numpy as np

from ..engine.draft import read_draft_vocab
from ..engine.model import Engine
from ..engine.trace import PASSES, StopTrace, Trace, first_divergence, op_list, parse_fault, place_name
from ..engine.weights import load_checkpoint
from ..errors import PrimewalkError
from ..walk.check import oracle_prime
from ..walk.speculative import continue_spec
from .cells import expand
from .receipts import env_info, utc_now
from .runner import prime_cell, run_cell, ulp_distance
from .specfile import EMBEDDED, MatrixSpec, parse_spec

KIND = "bisect"
SCHEMA_VERSION = 1
INDEPENDENT = "independent unyielded prime"

SCHEDULE_FORMS = ("unyielded", "tokenwise", "batched[:C]", "split:P", "checkpoint:P", "split+checkpoint:S,C",
                  "short", "yield[:S[,C]]", "or a cell id's label (split@64, batched@c32)")


# ------------------------------------------------------------------------------------------------
# sides
# ------------------------------------------------------------------------------------------------
@dataclass
class Side:
    """One run of a bisection: ``cell`` on ``engine`` (``cell`` None with ``oracle_of``: the
    independent unyielded prime of that cell's segments)."""

    name: str  # "a" | "b"
    engine: Engine
    ids: list
    max_new: int
    cell: object = None
    oracle_of: object = None
    label: str = ""

    def run(self, trace: Trace) -> None:
        try:
            if self.cell is not None:
                run_cell(self.engine, self.cell, self.ids, self.max_new, trace=trace)
            else:
                c = self.oracle_of
                oracle_prime(self.engine, self.ids, c.k, list(c.points), c.sampling, trace=trace)
        except StopTrace:
            pass

    def describe(self) -> dict:
        return {"run": self.label, "backend": self.engine.B.name, "device": self.engine.B.device_name(),
                "cell": None if self.cell is None else self.cell.id}


def engines_for(ckpt, backends, draft_vocab=None) -> dict:
    """One engine per distinct backend (sides on one backend share it, and its workspace, as
    the cells of a matrix do), each drafting among ``draft_vocab`` (``--draft-vocab`` as given,
    :mod:`harness.engine.draft`) when it is not None."""
    dv = read_draft_vocab(draft_vocab, ckpt.config.vocab_size)
    return {b: Engine(ckpt, b, draft_vocab=dv) for b in dict.fromkeys(backends)}


def cell_sides(spec: MatrixSpec, cell_id: str, backend_a=None, backend_b=None, draft_vocab=None) -> tuple:
    """Side a = the cell's oracle (for the oracle cell itself: the independent unyielded prime
    it is judged against), side b = the cell; each on its backend (default the spec's), drafting
    among ``draft_vocab`` when given (a receipt's ``env.draft_vocab`` run)."""
    cells, _ = expand(spec)
    by_id = {c.id: c for c in cells}
    cell = by_id.get(cell_id)
    if cell is None:
        near = [c.id for c in cells if c.id.split("/")[:2] == cell_id.split("/")[:2]] or [c.id for c in cells]
        raise PrimewalkError(f"--cell {cell_id}: no such cell in {spec.where} (its cells look like "
                             f"{near[0]}; {len(cells)} in all)")
    ckpt = load_checkpoint(spec.model_dirs[cell.model])
    ckpt.require_mtp("harness bisect")
    ba, bb = backend_a or spec.backend, backend_b or spec.backend
    eng = engines_for(ckpt, (ba, bb), draft_vocab)
    ids = _prompt_ids(cell.prompt, ckpt.config.vocab_size)
    a, _ = matrix_sides(eng[ba], cell, by_id[cell.oracle], ids, spec.max_new_tokens)
    _, b = matrix_sides(eng[bb], cell, by_id[cell.oracle], ids, spec.max_new_tokens)
    return a, b, ckpt


def _prompt_ids(ps, vocab_size):
    ids = ps.ids(vocab_size)
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise PrimewalkError(f"prompt {ps.name}: token id {bad[0]} is out of range (vocab_size {vocab_size})")
    return ids


def matrix_sides(engine, cell, oracle, ids, max_new) -> tuple:
    """The sides of a matrix cell that failed in a run (both on the run's engine): its oracle
    cell (for the oracle itself, the independent prime) and the cell."""
    if cell.id == cell.oracle:
        a = Side("a", engine, ids, max_new, oracle_of=cell, label=f"{INDEPENDENT} of {cell.id}")
    else:
        a = Side("a", engine, ids, max_new, cell=oracle, label=oracle.id)
    return a, Side("b", engine, ids, max_new, cell=cell, label=cell.id)


def parse_schedule(text: str, chunk_rows: int) -> object:
    """A schedule in the compact form ``name[:args]`` as a matrix spec variant entry:
    ``unyielded``, ``tokenwise``, ``batched[:C]`` (C rows per chunk, default ``chunk_rows``),
    ``split:P``, ``checkpoint:P``, ``split+checkpoint:S,C``, ``short``, ``yield[:S[,C]]`` (or
    ``yielded-with-peer[:S[,C]]``: yielded to a peer session after every chunk, optionally split
    at S and checkpointed at C). A point is a row (integer) or a fraction of the prompt (0 < x < 1,
    rounded down to the GDN grid of 64), as in a spec. A cell id's label of the schedule reads the
    same (``split@64``, ``batched@c32``, ``yielded-with-peer@64,64``: ``@`` for ``:``, a chunk
    size's ``c``), so a schedule can be copied from a receipt."""
    text = str(text).strip()
    if "@" in text and ":" not in text:  # a cell label: name@args
        name, _, args = text.partition("@")
        if name == "batched" and args.startswith("c"):
            args = args[1:]
    else:
        name, _, args = text.partition(":")
    vals = []
    for a in filter(None, args.split(",")):
        try:
            vals.append(float(a) if "." in a else int(a))
        except ValueError:
            raise PrimewalkError(f"schedule {text!r}: {a!r} is not a row or a fraction") from None
    takes = {"unyielded": (0, 0), "tokenwise": (0, 0), "short": (0, 0), "batched": (0, 1), "split": (1, 1),
             "checkpoint": (1, 1), "split+checkpoint": (2, 2), "yield": (0, 2), "yielded-with-peer": (0, 2)}
    if name not in takes:
        raise PrimewalkError(f"schedule {text!r}: expected one of {', '.join(SCHEDULE_FORMS)}")
    lo, hi = takes[name]
    if not lo <= len(vals) <= hi or (args and not vals):
        raise PrimewalkError(f"schedule {text!r}: {name} takes "
                             + ("no arguments" if hi == 0 else f"{lo}..{hi} comma-separated values"))
    if name in ("unyielded", "tokenwise", "short"):
        return name
    if name == "batched":
        return {"name": "batched", "chunk_rows": vals or [chunk_rows]}
    if name in ("split", "checkpoint"):
        return {"name": name, "at": vals}
    if name == "split+checkpoint":
        return {"name": name, "split": vals[0], "checkpoint": vals[1]}
    return {"name": "yielded-with-peer", **dict(zip(("split", "checkpoint"), vals))}


def schedule_sides(model, prompt_len, sched_a, sched_b, backend_a="cpu", backend_b="cpu", k=1, seed=0,
                   max_new=8, chunk_rows=256, fill_chunk=64, temperature=0.0, draft_vocab=None) -> tuple:
    """Side a runs schedule ``sched_a``, side b ``sched_b`` (compact form, :func:`parse_schedule`)
    on a synthetic prompt of ``prompt_len`` tokens (seed ``seed``) of ``model`` (a folder, or None
    for the embedded tiny model), each then continuing ``max_new`` tokens with K drafts."""
    if prompt_len is None or prompt_len < 1:
        raise PrimewalkError(f"--prompt-len must be a positive integer, got {prompt_len}")
    sides = []
    for name, text, backend in (("a", sched_a, backend_a), ("b", sched_b, backend_b)):
        variant = parse_schedule(text, chunk_rows)
        data = {"models": {"m": model or EMBEDDED},
                "prompts": [{"kind": "synthetic", "lengths": [int(prompt_len)], "seed": int(seed)}],
                "variants": ["unyielded"] + ([] if variant == "unyielded" else [variant]),
                "k": [int(k)], "sampling": [{"temperature": float(temperature), "seed": int(seed)}],
                "max_new_tokens": int(max_new), "chunk_rows": int(chunk_rows), "fill_chunk": int(fill_chunk),
                "backend": backend}
        try:
            spec = parse_spec(data, where=f"--{name} {text}")
        except PrimewalkError as e:  # name the schedule, not the spec key it became
            raise PrimewalkError(re.sub(r" variants\[1\](\.\w+)?:", "", str(e))) from None
        cells, notes = expand(spec)
        if variant != "unyielded" and len(cells) < 2:
            why = notes[-1].split(": ", 1)[-1] if notes else "no cell"
            raise PrimewalkError(f"--{name} {text}: {why} (a {prompt_len}-token prompt)")
        sides.append((name, text, backend, cells[-1], spec))
    ckpt = load_checkpoint(sides[0][4].model_dirs["m"])
    ckpt.require_mtp("harness bisect")
    eng = engines_for(ckpt, (backend_a, backend_b), draft_vocab)
    ids = _prompt_ids(sides[0][3].prompt, ckpt.config.vocab_size)
    a, b = (Side(n, eng[be], ids, int(max_new), cell=c, label=t) for n, t, be, c, _ in sides)
    return a, b, ckpt


# ------------------------------------------------------------------------------------------------
# the bisection
# ------------------------------------------------------------------------------------------------
def traced(side: Side, **kw) -> Trace:
    """Run ``side`` under a new Trace (``kw``: Trace's options) and return it."""
    tr = Trace(side.engine, **kw)
    side.run(tr)
    return tr


def bisect(a: Side, b: Side, fault: str | None = None, model: dict | None = None) -> dict:
    """Bisect side a against side b (``fault``: ``LAYER:OP:ROW`` flipped in b) and return the
    result as data (:func:`summary_lines` prints it). Raises a one-line PrimewalkError when the
    fault names no op of the model, or a place b never computes or a does not."""
    t0 = time.perf_counter()
    names = op_list(b.engine.cfg, b.engine.mtp is not None)
    flt = parse_fault(fault, names) if fault else None
    ta = traced(a)
    tb = traced(b, fault=flt)
    fault_info = None
    if flt is not None:
        pazz, row, slot = flt
        layer, op = names[pazz][slot]
        fault_info = {"pass": pazz, "layer": layer, "op": op, "row": row, "occurrence": 0, "col": 0}
        where = f"{place_name(layer, op)} at row {row}"
        if not tb.fault_applied:
            raise PrimewalkError(f"--fault {fault}: run b never computes {where}" + _logits_hint(op))
        ka, _ = ta.table()
        if not np.isin(Trace.key(pazz, row, 0, slot), ka):
            raise PrimewalkError(f"--fault {fault}: run a computes no {where}, so the runs cannot be "
                                 "compared there" + _logits_hint(op))
    cmp = first_divergence(ta, tb)
    out = {"schema_version": SCHEMA_VERSION, "kind": KIND, "created": utc_now(),
           "env": env_info(a.engine.B.name), "model": model or {}, "a": a.describe(), "b": b.describe(),
           "fault": fault_info, "compared": cmp["compared"], "only_a": cmp["only_a"], "only_b": cmp["only_b"],
           "divergence": None, "spread": None,
           "ops": {p: [place_name(*n) for n in names[p]] for p in PASSES if p in names}}
    if cmp["first"] is not None:
        key = cmp["first"]
        out["divergence"] = _first_values(a, b, flt, ta, key)
        out["spread"] = _spread(ta, np.concatenate([[key], cmp["later"]]).astype(np.int64))
    out["wall_s"] = time.perf_counter() - t0
    return out


def trace_overhead(side: Side, repeats: int = 5) -> tuple:
    """(untraced, traced) CPU seconds of one run of ``side``, the best of ``repeats`` each after a
    warm-up of both. CPU time on one Numba thread, not wall time: the ratio then measures the
    work a trace adds, also on a shared machine (idle worker threads would count as busy)."""
    import numba
    def once(trace):  # what a trace records: the cell's prime and speculative continuation
        t0 = time.process_time()
        sess, run = prime_cell(side.engine, side.cell, side.ids, side.max_new, trace)
        continue_spec(side.engine, sess, run.prepared, side.max_new, side.cell.k, side.cell.sampling)
        return time.process_time() - t0

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        once(None), once(Trace(side.engine))
        return (min(once(None) for _ in range(repeats)),
                min(once(Trace(side.engine)) for _ in range(repeats)))
    finally:
        numba.set_num_threads(threads)


def bisect_failure(engine, cell, oracle, ids, max_new) -> dict:
    """``run-matrix --bisect-failures``: bisect a failed cell against its oracle on the run's
    engine; the receipt entry's informational ``bisect`` field (where the runs first part, the
    spread, what was compared)."""
    res = bisect(*matrix_sides(engine, cell, oracle, ids, max_new))
    keep = ("divergence", "spread", "compared", "only_a", "only_b", "wall_s")
    return {"a": res["a"]["run"], "b": res["b"]["run"], **{k: res[k] for k in keep}}


def _logits_hint(op):
    return (" (a step computes logits only for the rows it needs: the last row of a prime chunk, every "
            "token-by-token and verify row)" if op == "logits" else "")


def _first_values(a, b, flt, ta, key) -> dict:
    """The first differing column of entry ``key`` and both values, from re-runs that keep that
    row and stop there (hashing nothing: the first pass found the entry)."""
    place = ta.place(key)
    keep = {(place["pass"], place["row"], place["occurrence"])}
    ra = traced(a, keep=keep, stop_after=key, hashes=False).kept.get(key)
    rb = traced(b, keep=keep, stop_after=key, fault=flt, hashes=False).kept.get(key)
    out = dict(place, col=None, a=None, b=None, a_bits=None, b_bits=None, ulp=None, dtype=None)
    if ra is None or rb is None or ra[0].shape != rb[0].shape:
        out["note"] = "the re-runs did not reach this entry the same way: the runs are not deterministic"
        return out
    cols = np.flatnonzero(ra[0] != rb[0])
    if cols.size == 0:
        out["note"] = "the re-runs computed equal rows here: the runs are not deterministic"
        return out
    col = int(cols[0])
    dtype, base = None, 0
    for name, n in ra[1]:
        if col < base + n:
            dtype = name
            break
        base += n
    av, bv = (np.array([r[0][col]], np.uint32).view(dtype)[0] for r in (ra, rb))
    if dtype == "float32":
        ulp = ulp_distance(np.float32(av), np.float32(bv))
        av, bv = (float(v) if math.isfinite(v) else str(v) for v in (av, bv))
    else:
        av, bv = int(av), int(bv)
        ulp = abs(av - bv)
    out.update(col=col, a=av, b=bv, a_bits=f"0x{int(ra[0][col]):08x}", b_bits=f"0x{int(rb[0][col]):08x}",
               ulp=int(ulp), dtype=dtype, columns_differing=int(cols.size))
    return out


def _spread(ta: Trace, keys: np.ndarray) -> dict:
    """Every differing entry (the first included): how many, in how many rows and ops, per op."""
    rows, pazz, _, slot = Trace.split_keys(keys)
    by_op = []
    for p, name in enumerate(PASSES):
        for s in np.unique(slot[pazz == p]):
            sel = (pazz == p) & (slot == s)
            layer, op = ta.names[name][int(s)]
            by_op.append({"pass": name, "layer": layer, "op": op, "slot": int(s), "entries": int(sel.sum()),
                          "rows": int(np.unique(rows[sel]).size)})
    return {"entries": int(keys.size), "rows": int(np.unique(rows).size),
            "ops": len(by_op), "first_row": int(rows.min()), "last_row": int(rows.max()), "by_op": by_op}


# ------------------------------------------------------------------------------------------------
# presenting it
# ------------------------------------------------------------------------------------------------
def to_json(res: dict) -> str:
    """The result as JSON text (sorted keys; non-finite values were stored as text)."""
    return json.dumps(res, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def _value(v):
    return "?" if v is None else (repr(np.float32(v)) .removeprefix("np.float32(").removesuffix(")")
                                  if isinstance(v, float) else str(v))


def headline(res: dict) -> str:
    """``first divergence: layer=L op=OP row=R col=C a=… b=… ulp=U`` or ``no divergence``."""
    d = res.get("divergence")
    if d is None:
        return "no divergence"
    return (f"first divergence: layer={d['layer']} op={d['op']} row={d['row']} col={d['col']} "
            f"a={_value(d['a'])} b={_value(d['b'])} ulp={d['ulp']}")


def summary_lines(res: dict) -> list:
    """The human report: the headline, then where it ran and how the difference spreads."""
    lines = [headline(res)]
    d, s = res.get("divergence"), res.get("spread")
    runs = (f"a: {res['a']['run']} ({res['a']['backend']}); b: {res['b']['run']} ({res['b']['backend']})"
            + (f"; fault {res['fault']['layer']}:{res['fault']['op']}:{res['fault']['row']} in b"
               if res.get("fault") else ""))
    if d is not None:
        extra = f"pass {d['pass']}" + (f", occurrence {d['occurrence']}" if d["occurrence"] else "")
        if d.get("note"):
            extra += f"; {d['note']}"
        elif d.get("columns_differing", 1) > 1:
            extra += f"; {d['columns_differing']} columns of the row differ"
        lines.append(f"  {extra}; {runs}")
        lines.append(f"spread: {s['entries']} entries differ (this one and {s['entries'] - 1} later) in "
                     f"{s['rows']} rows ({s['first_row']}..{s['last_row']}) and {s['ops']} ops")
    else:
        lines.append(f"  {runs}")
    only = "".join(f", {res[k]} only in {k[-1]}" for k in ("only_a", "only_b") if res.get(k))
    lines.append(f"compared {res['compared']} entries (op output rows){only}; {res['wall_s']:.1f} s")
    return lines
