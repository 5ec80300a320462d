"""The console display of a matrix run (:class:`Progress`) and its one line per cell."""

from __future__ import annotations

import sys
import time

from ..matrix.bisect import headline
from ..matrix.runner import SilentProgress
from .common import stdout_gone


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


def clock(seconds: float) -> str:
    """``1:05`` (minutes:seconds), ``1:02:03`` past an hour."""
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress(SilentProgress):
    """Notes on stderr; one :func:`cell_line` per finished cell on stdout, prefixed ``[n/N]`` and
    followed by the elapsed time and an estimate of the time left (the mean time of the cells so
    far times the cells to go); on a terminal, also a status line on stderr that names the cell
    running now. ``quiet``: nothing at all. Needs nothing beyond the standard library."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.err = stream or sys.stderr
        self.tty = self.err.isatty()
        self.total, self.finished, self.t0 = 0, 0, None
        self.status = False  # a status line is on the terminal

    def notes(self, notes: list) -> None:
        if not self.quiet:
            for n in notes:
                print(f"note: {n}", file=self.err)

    def begin(self, total: int) -> None:
        self.total, self.finished, self.t0 = total, 0, time.perf_counter()

    def timing(self) -> str:
        """``0:12 elapsed, ~0:48 left`` after the cells finished so far."""
        elapsed = time.perf_counter() - (self.t0 or time.perf_counter())
        text = f"{clock(elapsed)} elapsed"
        if 0 < self.finished < self.total:
            text += f", ~{clock(elapsed / self.finished * (self.total - self.finished))} left"
        return text

    def _clear(self) -> None:
        if self.status:
            self.err.write("\r\033[K")
            self.err.flush()
            self.status = False

    def start(self, i: int, total: int, cell_id: str) -> None:
        if self.quiet or not self.tty:
            return
        self._clear()
        self.err.write(f"[{i + 1}/{total}] {self.timing()} · running {cell_id}")
        self.err.flush()
        self.status = True

    def done(self, entry: dict) -> None:
        self.finished += 1
        if self.quiet:
            return
        self._clear()
        try:
            print(f"[{self.finished}/{self.total}] {cell_line(entry)} ({self.timing()})", flush=True)
        except BrokenPipeError:  # run-matrix ... | head: the run goes on, the receipt is written
            stdout_gone()

    def warning(self, text: str) -> None:
        """A worker died (see harness.matrix.pool): said on stderr even with ``quiet``."""
        if not self.quiet:
            self._clear()  # the status line, if any, comes back with the next cell
        print(f"warning: {text}", file=self.err, flush=True)

    def close(self) -> None:
        if not self.quiet:
            self._clear()


class StatusLine:
    """A one-shot command's progress on a terminal: one status line on stderr, rewritten at most
    every ``every`` seconds, ``[check] walker chunk 12/177 (0:08 elapsed, ~1:50 left)``; the
    time left is estimated from the counted steps (``done`` of ``total``) since the first one.
    Nothing at all when stderr is not a terminal (logs and pipes stay clean); :meth:`close`
    erases the line before the command prints its result."""

    def __init__(self, prefix: str, stream=None, every: float = 0.25):
        self.prefix, self.err, self.every = prefix, stream or sys.stderr, every
        self.tty = self.err.isatty()
        self.t0 = time.perf_counter()
        self.last = -every
        self.count0 = None  # (time, done) of the first counted step
        self.shown = False

    def __call__(self, text: str, done: int | None = None, total: int | None = None) -> None:
        """Show ``text``: a phase's line (no count) at once, a counted step's at most every
        ``every`` seconds."""
        if not self.tty:
            return
        now = time.perf_counter()
        if done is not None and self.count0 is None:
            self.count0 = (now, done)
        if done is not None and now - self.last < self.every:
            return
        timing = f"{clock(now - self.t0)} elapsed"
        if done is not None and total:
            t1, d1 = self.count0
            if d1 < done < total:
                timing += f", ~{clock((now - t1) / (done - d1) * (total - done))} left"
        self.last = now
        self.err.write(f"\r\033[K[{self.prefix}] {text} ({timing})")
        self.err.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.err.write("\r\033[K")
            self.err.flush()
            self.shown = False
