"""The cells of a matrix spec: one per (model, prompt, schedule, K, sampling), in spec order.

A cell's id names it (``tiny/p130/split@64/k2/greedy``, with the rows its points resolve to); its
``schedule`` is the variant as the spec writes it (``split@0.5``); its oracle is the
``unyielded`` cell of the same model, prompt, K and sampling. :func:`expand_all` leaves out the
cells that cannot run, each with its reason: a fraction that resolves to no row (a prompt under
64 tokens, see :meth:`~harness.matrix.specfile.Point.resolve`), ``short`` on a prompt longer than
``fill_chunk``, an explicit point at or past a prompt's end, and a second entry that gives the
same cell. The receipt lists them under ``skipped``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .specfile import ORACLE, MatrixSpec, PromptSpec, usable_point


@dataclass(frozen=True)
class Cell:
    id: str
    order: int
    model: str
    prompt: PromptSpec
    variant: str
    variant_args: dict
    chunk_rows: int | None  # None: not batched (tokenwise)
    fill_chunk: int
    k: int
    sampling: object  # Sampling
    sampling_label: str
    oracle: str
    split: int | None = None
    checkpoint: int | None = None
    prompt_len: int = 0  # the prompt's tokens for this cell's model
    schedule: str = ""  # the variant as the spec writes it (split@0.5)
    resolved: tuple = field(default=(), compare=False)  # how each point resolved: ((what, given, row, rule), ...)

    @property
    def tokenwise(self) -> bool:
        return self.variant == "tokenwise"

    @property
    def yielded(self) -> bool:
        return self.variant == "yielded-with-peer"

    @property
    def points(self) -> tuple:
        """Boundary positions the walker captures at (split and checkpoint)."""
        return tuple(sorted({p for p in (self.split, self.checkpoint) if p is not None}))

    @property
    def group(self) -> tuple:
        return (self.model, self.prompt.name, self.k, self.sampling_label)


def schedule_label(variant: str, args: dict, chunk_rows) -> str:
    """``split@64``, ``split+checkpoint@64,96``, ``batched@c32``: a cell's schedule in its id."""
    text = variant
    if args:
        text += "@" + ",".join(str(v) for v in args.values())
    if variant == "batched":
        text += f"@c{chunk_rows}"
    return text


def cell_id(model: str, prompt: str, label: str, k: int, sampling: str) -> str:
    return f"{model}/{prompt}/{label}/k{k}/{sampling}"


def _skip(model, ps, tp, case, reason) -> dict:
    return {"model": model, "prompt": ps.name, "prompt_len": tp, "variant": case.variant,
            "entry": case.key, "schedule": case.label, "reason": reason}


def note_of(s: dict) -> str:
    """One line for a skipped cell group: ``variants[3] (split@0.5) skipped for tiny/p40 (40
    tokens): ...``."""
    return (f"{s['entry']} ({s['schedule']}) skipped for {s['model']}/{s['prompt']} "
            f"({s['prompt_len']} tokens): {s['reason']}")


def _runs(spec: MatrixSpec, model: str, ps: PromptSpec, skipped: list) -> list:
    """The schedules of one (model, prompt): (case, label, args, chunk_rows, fill, split, ckpt,
    points) each, the cases that cannot run added to ``skipped``."""
    tp = spec.prompt_len(model, ps)
    runs = []
    for c in spec.cases:
        resolved, why = {}, None
        for what, pt in (("split", c.split), ("checkpoint", c.checkpoint)):
            if pt is None:
                continue
            row, rule = pt.resolution(tp)
            if row is None:
                why = f"{what} {rule}"
            elif not usable_point(row, tp):
                why = (f"{what} {pt} is at or past the end" if row >= tp else
                       f"{what} {rule} leaves a segment under PRIME_MIN_T")
            resolved[what] = (pt.value, row, rule)
            if why:
                break
        if why is None and c.variant == "short" and tp > spec.fill_chunk:
            why = f"{tp} tokens > fill_chunk {spec.fill_chunk} (short applies to prompts of at most fill_chunk)"
        if why:
            skipped.append(_skip(model, ps, tp, c, why))
            continue
        args = {what: row for what, (_, row, _) in resolved.items()}
        chunk_rows = (c.chunk_rows if c.variant == "batched" else
                      None if c.variant == "tokenwise" else spec.chunk_rows)
        fill = tp if c.variant == "short" else spec.fill_chunk
        label = schedule_label(c.variant, args, chunk_rows)
        first = next((r[0] for r in runs if r[1] == label), None)
        if first is not None:
            skipped.append(_skip(model, ps, tp, c, f"gives the same cell as {first.key} ({label})"))
            continue
        points = tuple((what, given, row, rule) for what, (given, row, rule) in resolved.items())
        runs.append((c, label, args, chunk_rows, fill, args.get("split"), args.get("checkpoint"), points))
    return runs


def expand_all(spec: MatrixSpec) -> tuple[list, list]:
    """The cells of ``spec`` in spec order (model, prompt, K, sampling, variant), and the skipped
    schedules (dicts: model, prompt, prompt_len, variant, entry, schedule, reason), one per
    (model, prompt, variant entry) -- a skipped schedule is skipped for every K and sampling."""
    cells, skipped, seen = [], [], set()
    for model in spec.models:
        for ps in spec.prompts:
            tp = spec.prompt_len(model, ps)
            runs = _runs(spec, model, ps, skipped)
            for k in ps.k or spec.k:
                for s, slabel in zip(spec.sampling, spec.labels):
                    if ps.sampling is not None and slabel not in ps.sampling:
                        continue
                    oracle = cell_id(model, ps.name, ORACLE, k, slabel)
                    for c, label, args, chunk_rows, fill, split, ckpt, points in runs:
                        cid = cell_id(model, ps.name, label, k, slabel)
                        assert cid not in seen, cid
                        seen.add(cid)
                        cells.append(Cell(cid, len(cells), model, ps, c.variant, dict(args), chunk_rows,
                                          fill, k, s, slabel, oracle, split, ckpt, tp, c.label, points))
    return cells, skipped


def expand(spec: MatrixSpec) -> tuple[list, list]:
    """The cells of ``spec`` and one note per skipped schedule (:func:`expand_all`)."""
    cells, skipped = expand_all(spec)
    return cells, [note_of(s) for s in skipped]


def cell_listing(spec: MatrixSpec) -> str:
    """The cells of ``spec`` as text, one per line, with how each point resolved, then the
    skipped schedules: what ``harness run-matrix --list`` prints."""
    cells, skipped = expand_all(spec)
    width = max((len(c.id) for c in cells), default=0)
    lines = []
    for c in cells:
        rules = "; ".join(f"{what} {rule}" for what, _, _, rule in c.resolved)
        lines.append(f"{c.id.ljust(width)}  {c.prompt_len} tokens" + (f"  {rules}" if rules else ""))
    lines.append(f"{len(cells)} cells" + (f"; {len(skipped)} schedule(s) skipped:" if skipped else ""))
    lines += [f"  skipped: {note_of(s)}" for s in skipped]
    return "\n".join(lines)
