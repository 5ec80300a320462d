"""The console display of a matrix run (:class:`Progress`) and its one line per cell."""

from __future__ import annotations

import sys

from ..matrix.bisect import headline
from ..matrix.runner import SilentProgress


def _rate(x) -> str:
    if x is None:
        return "—"
    return f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def cell_line(c: dict) -> str:
    """``cell tiny/p130/split@64/k2/greedy bitwise prime 12.3k tok/s accept 1.4``"""
    v = c["verdict"]
    text = f"cell {c['id']} {v['status']} prime {_rate(c['timings'].get('prime_tokens_per_s'))} tok/s"
    mal = (c.get("acceptance") or {}).get("mean_acceptance_length")
    text += f" accept {mal:.2f}" if mal is not None else " accept —"
    if v["status"] != "bitwise":
        extra = []
        if v.get("max_abs") is not None:
            extra.append(f"max |Δ| {v['max_abs']:.3g}")
        if v.get("max_ulp") is not None:
            extra.append(f"{v['max_ulp']} ulp")
        text += f" — {v['detail']}" + (f" ({', '.join(extra)})" if extra else "")
    if c.get("bisect"):
        text += f"; bisect: {headline(c['bisect'])}"
    return text


class Progress(SilentProgress):
    """Notes on stderr; tqdm over the cells when it is importable (quiet off a terminal), else a
    stderr line per cell on a terminal; a :func:`cell_line` per finished cell on stdout, without
    tearing the bar. ``quiet``: nothing at all."""

    def __init__(self, quiet: bool = False):
        self.bar = None
        self.quiet = quiet
        self.tty = sys.stderr.isatty()

    def notes(self, notes: list) -> None:
        if not self.quiet:
            for n in notes:
                print(f"note: {n}", file=sys.stderr)

    def begin(self, total: int) -> None:
        if self.quiet:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, unit="cell", disable=None, file=sys.stderr, dynamic_ncols=True,
                        leave=False)

    def start(self, i: int, total: int, cell_id: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.set_description_str(cell_id, refresh=False)
        elif self.tty:
            print(f"[{i + 1}/{total}] {cell_id}", file=sys.stderr, flush=True)

    def done(self, entry: dict) -> None:
        if self.bar is not None:
            self.bar.update(1)
        if self.quiet:
            return
        line = cell_line(entry)
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
