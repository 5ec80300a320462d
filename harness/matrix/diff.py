"""Compare two receipts cell by cell (``harness diff``; joining shards is
:func:`~harness.matrix.receipts.merge_receipts`).

Only the compared fields of :data:`harness.matrix.receipts.FIELD_ROLES` are compared. Two
receipts are comparable when they share schema, spec hash and model weights; otherwise the diff
is unusable (exit 2). ``--digests-only`` compares ``digests.*`` alone, which is what two devices
must agree on. ``--timing-tolerance PCT`` also fails cells whose throughput in B fell more than
PCT percent.

Exit codes: 0 equal, 1 drift, 2 unusable input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import PrimewalkError
from .receipts import compared_fields, read_receipt

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
            scope.append(f"throughput within {self.timing_tolerance:g}%")
        return f"diff: equal ({', '.join([f'{self.cells} cells compared'] + scope)})"

    def table(self, max_rows: int = MAX_ROWS) -> str:
        """What changed, as aligned text: cell, field, A, B (and a note where there is one)."""
        if not self.rows:
            return ""
        shown = self.rows[:max_rows]
        lines = [("cell", "field", "A", "B", "")]
        for r in shown:
            start = _first_difference(r.a, r.b) if isinstance(r.a, list) and isinstance(r.b, list) else 0
            lines.append((r.cell, r.field, _show(r.a, start), _show(r.b, start), r.note))
        widths = [max(len(line[i]) for line in lines) for i in range(4)]
        out = []
        for line in lines:
            text = "  ".join(v.ljust(w) for v, w in zip(line, widths))
            out.append((text + "  " + line[4]).rstrip())
        if len(self.rows) > max_rows:
            out.append(f"… {len(self.rows) - max_rows} more")
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
    for what, get, why in (
            ("schema_version", lambda r: r.get("schema_version"), "different receipt schemas"),
            ("spec_hash", lambda r: r.get("spec_hash"), "different matrix specs"),
            ("kind", lambda r: r.get("kind"), "different kinds of receipt"),
            ("model weights_sha256", lambda r: (r.get("model") or {}).get("weights_sha256"),
             "different model weights")):
        va, vb = get(ra), get(rb)
        if va != vb:
            result.unusable = f"{what} differs (A {_show(va)}, B {_show(vb)}): {why}"
            return result
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
        fa, fb = compared_fields(ca, digests_only), compared_fields(cb, digests_only)
        for name in list(fa) + [n for n in fb if n not in fa]:
            va, vb = fa.get(name), fb.get(name)
            if va != vb:
                lists = isinstance(va, list) and isinstance(vb, list)
                result.rows.append(_list_row(cid, name, va, vb) if lists else DiffRow(cid, name, va, vb))
        if timing_tolerance is not None:
            ta, tb = ca.get("timings") or {}, cb.get("timings") or {}
            for name in TIMED_FIELDS:
                va, vb = ta.get(name), tb.get(name)
                if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va > 0:
                    drop = (va - vb) / va * 100.0
                    if drop > timing_tolerance:
                        result.rows.append(DiffRow(cid, f"timings.{name}", va, vb, f"-{drop:.1f}%"))
    return result
