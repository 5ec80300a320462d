"""The cells of a matrix spec: one per (model, prompt, schedule, K, sampling), in spec order.

A cell's id names it (``tiny/p130/split@64/k2/greedy``); its oracle is the ``unyielded`` cell of
the same model, prompt, K and sampling. :func:`expand` leaves out, with a note, the cells that
cannot run: a fractional point that leaves a segment shorter than ``PRIME_MIN_T``, ``short`` on a
prompt longer than ``fill_chunk``, an explicit point at or past a prompt's end, and a second
entry that gives the same cell.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..walk.schedule import PRIME_MIN_T
from .specfile import ORACLE, MatrixSpec, PromptSpec


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


def _usable(p: int, tp: int) -> bool:
    return PRIME_MIN_T <= p and tp - p >= PRIME_MIN_T


def expand(spec: MatrixSpec) -> tuple[list, list]:
    """The cells of ``spec`` in spec order (model, prompt, K, sampling, variant), and notes on the
    cells left out (a fractional point that leaves a short segment, ``short`` on a long prompt,
    an explicit point past a prompt's end, two entries giving the same cell)."""
    cells, notes, seen = [], [], {}
    for model in spec.models:
        for ps in spec.prompts:
            tp = ps.length
            runs = []  # (case, label, args, chunk_rows, fill_chunk, split, ckpt) for this prompt
            for c in spec.cases:
                split = c.split.resolve(tp) if c.split is not None else None
                ckpt = c.checkpoint.resolve(tp) if c.checkpoint is not None else None
                bad = [(w, pt, r) for w, pt, r in (("split", c.split, split), ("checkpoint", c.checkpoint, ckpt))
                       if pt is not None and not _usable(r, tp)]
                if bad:
                    w_, pt, r = bad[0]
                    why = (f"{w_} {pt} is at or past the end" if not pt.fraction and r >= tp else
                           f"{w_} {pt} -> row {r} leaves a segment < PRIME_MIN_T = {PRIME_MIN_T}")
                    notes.append(f"{c.key} ({c.variant}) skipped for {model}/{ps.name} ({tp} tokens): {why}")
                    continue
                if c.variant == "short" and tp > spec.fill_chunk:
                    if model == next(iter(spec.models)):
                        notes.append(f"{c.key} (short) skipped for {ps.name}: {tp} tokens > fill_chunk "
                                     f"{spec.fill_chunk}")
                    continue
                args = {}
                if split is not None:
                    args["split"] = split
                if ckpt is not None:
                    args["checkpoint"] = ckpt
                chunk_rows = (c.chunk_rows if c.variant == "batched" else
                              None if c.variant == "tokenwise" else spec.chunk_rows)
                fill = tp if c.variant == "short" else spec.fill_chunk
                label = schedule_label(c.variant, args, chunk_rows)
                if any(r[1] == label for r in runs):
                    first = next(r[0] for r in runs if r[1] == label)
                    notes.append(f"{c.key} gives the same cell as {first.key} for {model}/{ps.name} "
                                 f"({label}); skipped")
                    continue
                runs.append((c, label, args, chunk_rows, fill, split, ckpt))
            ks = ps.k or spec.k
            for k in ks:
                for s, slabel in zip(spec.sampling, spec.labels):
                    if ps.sampling is not None and slabel not in ps.sampling:
                        continue
                    oracle = cell_id(model, ps.name, ORACLE, k, slabel)
                    for c, label, args, chunk_rows, fill, split, ckpt in runs:
                        cid = cell_id(model, ps.name, label, k, slabel)
                        assert cid not in seen, cid
                        seen[cid] = True
                        cells.append(Cell(cid, len(cells), model, ps, c.variant, dict(args), chunk_rows,
                                          fill, k, s, slabel, oracle, split, ckpt))
    return cells, notes
