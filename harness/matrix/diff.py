"""Compare two receipts cell by cell (``harness diff``; joining shards is
:func:`~harness.matrix.receipts.merge_receipts`).

Only the compared fields of :data:`harness.matrix.receipts.FIELD_ROLES` are compared. Two
receipts are comparable when they share spec hash and model weights and this harness reads both
schemas; otherwise the diff is unusable (exit 2). Receipts of two schemas are compared on the
fields both have (:data:`~harness.matrix.receipts.FIELD_SINCE`). ``--digests-only`` compares
``digests.*`` alone, which is what two devices must agree on.

``--timing-tolerance PCT`` also fails cells whose throughput in B fell more than PCT percent,
comparing like with like only: when the receipts ran on different backends, devices or thread
counts, or when either one's timings are unreliable (the machine's 1-minute load average was
above its cores when it was recorded, or is unknown), timings are not compared and a note says
why (:func:`timing_notes`).

Exit codes: 0 equal, 1 drift, 2 unusable input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import PrimewalkError
from .receipts import READABLE_SCHEMAS, compared_fields, read_receipt

# Throughputs checked by --timing-tolerance (higher is better).
TIMED_FIELDS = ("prime_tokens_per_s", "decode_tokens_per_s", "spec_tokens_per_s")
MAX_ROWS = 40
DIGEST_CHARS = 16


@dataclass
class DiffRow:
    cell: str  # cell id
    field: str  # dotted field name, or "cell" when the cell is in one receipt only
    a: object
    b: object
    note: str = ""


@dataclass
class DiffResult:
    rows: list = field(default_factory=list)  # DiffRow, in cell order then field order
    cells: int = 0  # cells looked at (the union of both receipts' ids)
    digests_only: bool = False
    timing_tolerance: float | None = None
    unusable: str | None = None  # why the receipts cannot be compared
    notes: list = field(default_factory=list)  # what was not compared, and why
    timings_compared: bool = False

    @property
    def drifted_cells(self) -> int:
        return len({r.cell for r in self.rows})

    @property
    def exit_code(self) -> int:
        return 2 if self.unusable else (1 if self.rows else 0)

    @property
    def summary(self) -> str:
        if self.unusable:
            return f"diff: unusable: {self.unusable}"
        if self.rows:
            text = f"diff: {len(self.rows)} drift(s) in {self.drifted_cells} of {self.cells} cells"
            slow = sum(1 for r in self.rows if r.field.startswith("timings."))
            if slow:
                text += f" ({slow} throughput drop(s) beyond {self.timing_tolerance:g}%)"
            return text
        scope = ["digests only"] if self.digests_only else []
        if self.timing_tolerance is not None:
            scope.append(f"throughput within {self.timing_tolerance:g}%" if self.timings_compared
                         else "throughput not compared")
        return f"diff: equal ({', '.join([f'{self.cells} cells compared'] + scope)})"

    def table(self, max_rows: int | None = MAX_ROWS) -> str:
        """What changed, as aligned text: cell, field, A, B (and a note where there is one); the
        first ``max_rows`` rows (None: all)."""
        if not self.rows:
            return ""
        shown = self.rows if max_rows is None else self.rows[:max_rows]
        lines = [("cell", "field", "A", "B", "")]
        for r in shown:
            start = _first_difference(r.a, r.b) if isinstance(r.a, list) and isinstance(r.b, list) else 0
            lines.append((r.cell, r.field, _show(r.a, start), _show(r.b, start), r.note))
        widths = [max(len(line[i]) for line in lines) for i in range(4)]
        out = []
        for line in lines:
            text = "  ".join(v.ljust(w) for v, w in zip(line, widths))
            out.append((text + "  " + line[4]).rstrip())
        if len(shown) < len(self.rows):
            out.append(f"… {len(self.rows) - len(shown)} more (--all shows every row)")
        return "\n".join(out)


def _show(value, start: int = 0, width: int = 40) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        hexish = len(value) > DIGEST_CHARS and all(c in "0123456789abcdef" for c in value)
        if hexish:
            return value[:DIGEST_CHARS] + "…"
        return value if len(value) <= width else value[:width - 1] + "…"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list) and start > 2:  # show the lists from just before they differ
        text = "…," + json.dumps(value[start - 2:], separators=(",", ":"))[1:]
        return text if len(text) <= width else text[:width - 1] + "…"
    text = json.dumps(value, separators=(",", ":")) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def _first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _list_row(cid: str, name: str, a: list, b: list) -> DiffRow:
    """A row for two lists (a tape, a continuation), noting where they first differ."""
    i = _first_difference(a, b)
    note = f"first differs at [{i}]" + (f", lengths {len(a)} vs {len(b)}" if len(a) != len(b) else "")
    return DiffRow(cid, name, a, b, note)


def _receipt(source) -> dict:
    return source if isinstance(source, dict) else read_receipt(source)


def diff_receipts(a, b, digests_only: bool = False, timing_tolerance: float | None = None) -> DiffResult:
    """Compare receipt ``a`` (the reference) with ``b``; both are dicts or paths.

    An unreadable path raises :class:`PrimewalkError`; receipts that cannot be compared (schema,
    spec hash, kind or model weights differ) give a result with ``unusable`` set (exit 2).
    """
    ra, rb = _receipt(a), _receipt(b)
    result = DiffResult(digests_only=digests_only, timing_tolerance=timing_tolerance)
    for name, r in (("A", ra), ("B", rb)):
        if r.get("schema_version") not in READABLE_SCHEMAS:
            result.unusable = (f"{name} has receipt schema {_show(r.get('schema_version'))}; this harness "
                               f"reads {', '.join(map(str, READABLE_SCHEMAS))}")
            return result
    schema = min(ra["schema_version"], rb["schema_version"])
    if ra["schema_version"] != rb["schema_version"]:
        result.notes.append(f"schemas {ra['schema_version']} and {rb['schema_version']}: compared on the "
                            f"fields of schema {schema}")
    for what, get, why in (
            ("spec_hash", lambda r: r.get("spec_hash"), "different matrix specs"),
            ("kind", lambda r: r.get("kind"), "different kinds of receipt"),
            ("model weights_sha256", lambda r: (r.get("model") or {}).get("weights_sha256"),
             "different model weights")):
        va, vb = get(ra), get(rb)
        if va != vb:
            result.unusable = f"{what} differs (A {_show(va)}, B {_show(vb)}): {why}"
            return result
    if timing_tolerance is not None:
        result.notes += timing_notes(ra, rb)
        result.timings_compared = not any(n.startswith("timings not compared") for n in result.notes)
    cells_a = {c["id"]: c for c in ra["cells"]}
    cells_b = {c["id"]: c for c in rb["cells"]}
    ids = list(cells_a) + [i for i in cells_b if i not in cells_a]
    result.cells = len(ids)
    for cid in ids:
        ca, cb = cells_a.get(cid), cells_b.get(cid)
        if ca is None or cb is None:
            result.rows.append(DiffRow(cid, "cell", "present" if ca else None, "present" if cb else None,
                                       "only in " + ("A" if ca else "B")))
            continue
        fa, fb = compared_fields(ca, digests_only, schema), compared_fields(cb, digests_only, schema)
        for name in list(fa) + [n for n in fb if n not in fa]:
            va, vb = fa.get(name), fb.get(name)
            if va != vb:
                lists = isinstance(va, list) and isinstance(vb, list)
                result.rows.append(_list_row(cid, name, va, vb) if lists else DiffRow(cid, name, va, vb))
        if result.timings_compared:
            ta, tb = ca.get("timings") or {}, cb.get("timings") or {}
            for name in TIMED_FIELDS:
                va, vb = ta.get(name), tb.get(name)
                if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va > 0:
                    drop = (va - vb) / va * 100.0
                    if drop > timing_tolerance:
                        result.rows.append(DiffRow(cid, f"timings.{name}", va, vb, f"-{drop:.1f}%"))
    return result


# the environment that must match for two receipts' timings to be compared
TIMING_ENV = ("backend", "device", "threads")


def unreliable_timings(receipt: dict) -> str | None:
    """Why ``receipt``'s timings are unreliable, or None: the 1-minute load average above the
    machine's cores when it was recorded (at the start or the end of the run), or no record of
    the load (a schema-1 receipt)."""
    env = receipt.get("env") or {}
    load, cores = env.get("load") or {}, env.get("cores")
    peaks = [v[0] for v in (load.get("start"), load.get("end")) if isinstance(v, list) and v]
    if not peaks or not isinstance(cores, int):
        return "the machine's load when it was recorded is unknown"
    if max(peaks) > cores:
        return f"load {max(peaks):.2f} on {cores} cores when it was recorded"
    return None


def timing_notes(ra: dict, rb: dict) -> list:
    """Why the timings of ``ra`` and ``rb`` cannot be compared (each note starts with "timings
    not compared"), or [] when they can: like with like (:data:`TIMING_ENV`) and both reliable
    (:func:`unreliable_timings`)."""
    ea, eb = ra.get("env") or {}, rb.get("env") or {}
    notes = [f"timings not compared: {key} differs (A {_show(ea.get(key))}, B {_show(eb.get(key))})"
             for key in TIMING_ENV if ea.get(key) != eb.get(key)]
    for name, r in (("A", ra), ("B", rb)):
        why = unreliable_timings(r)
        if why:
            notes.append(f"timings not compared: {name}'s timings are unreliable ({why})")
    return notes
