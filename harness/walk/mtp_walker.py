"""The MTP prime walker: a prompt primed one chunk per advance, for the trunk and the MTP head.

Phases (seed ``MtpPrimeWalker``):

1. ``mtp-trunk`` chunks, as :func:`~harness.walk.schedule.trunk_schedule` plans them: batched
   chunks through ``Engine.prime_chunk``; token-by-token segments through decode steps (or
   target steps when the prime is unsegmented). The prompt's hidden rows are collected. At the
   end of a segment that is a capture point (``capture_at``) a :class:`BoundaryCapture` is
   pushed (snapshot, position, logits, last hidden row); at the checkpoint (``ckpt_at``) the turn
   checkpoint is taken (or at the end of the prompt when there is none).
2. Setup, right after the last trunk chunk: the boundary token (greedy, or drawn with the counter
   RNG), one target step on it, the draft state.
3. ``mtp-draft-fill`` chunks of ``fill_chunk`` rows fill the MTP head's K/V: the row at prompt
   position i pairs token i with the hidden row of position i - 1 (the first row with the
   session's last hidden row from before the prime, or zeros).

A prompt of at most ``fill_chunk`` rows is *short*: trunk, setup and fill run in one advance.
``capture_at`` / ``ckpt_at`` are absolute positions (cache positions), arguments of the walker
(and of :func:`run_prime`); the captures and the checkpoint land on the session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .protocol import GuardedWalker, PrimeChunk, PrimeError, advance_prime, finish_prime
from .sampling import Sampling, pick
from .schedule import PRIME_MIN_T, chunk_ranges, trunk_schedule

DEFAULT_CHUNK_ROWS = 256
DEFAULT_FILL_CHUNK = 64


@dataclass
class BoundaryCapture:
    snap: object  # harness.engine.cache.Snapshot
    pos: int
    logits: np.ndarray  # [V] float32: logits of the row before pos
    last_h: np.ndarray  # [H] float32: hidden row of position pos - 1


@dataclass
class TurnCheckpoint:
    snap: object
    pos: int
    last_h: np.ndarray


@dataclass
class PreparedPrime:
    prompt: list
    base: int
    logits: np.ndarray  # [V]: logits of the last prompt row
    boundary: int  # the token after the prompt (greedy or sampled)
    init_logits: np.ndarray  # [V]: logits after the target step on the boundary token
    init_h: np.ndarray  # [1, H] float32: hidden row of the boundary token
    hiddens: np.ndarray  # [T, H] float32: hidden rows of the prompt
    k: int
    sampling: Sampling
    wall_s: float = 0.0


class MtpPrimeWalker(GuardedWalker):
    """The resumable MTP prime of ``prompt`` into ``sess`` (see the module docstring).

    ``prime_split``: the prompt row the trunk is split at; ``capture_at`` / ``ckpt_at``: the
    absolute positions of a boundary capture and of the turn checkpoint (None: no capture; the
    checkpoint at the end of the prompt). Nothing runs, and the session is untouched, until the
    first :meth:`advance_chunk`; a refused walker leaves the session as it was."""

    def __init__(self, engine, sess, prompt, k, sampling=None, prime_split=None,
                 chunk_rows=DEFAULT_CHUNK_ROWS, fill_chunk=DEFAULT_FILL_CHUNK, tokenwise=False,
                 capture_at=None, ckpt_at=None):
        super().__init__()
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise InputError("MTP prime needs a nonempty prompt")
        if k < 1:
            raise InputError(f"MTP prime needs K > 0, got {k}")
        engine.require_mtp("the MTP prime walker")
        if sess.prime_ready is not None:
            raise InputError("MTP prime already prepared for this session")
        engine.check_ids(prompt)
        c = sess.cache
        base, tp = c.pos, len(prompt)
        if tp + 1 > c.max_ctx - base:
            raise InputError(f"MTP prime of {tp} tokens (+1 boundary token) at position {base} exceeds "
                             f"the cache capacity {c.max_ctx}")
        split = prime_split if prime_split is not None and 0 < prime_split < tp else None
        ckpt = ckpt_at - base if ckpt_at is not None else None
        ckpt = ckpt if ckpt is not None and 0 < ckpt < tp else None
        first = min([b for b in (split, ckpt) if b is not None], default=None)
        if split is not None and first == split and split < PRIME_MIN_T:
            raise InputError(f"MTP prime split {split} is below PRIME_MIN_T ({PRIME_MIN_T})")
        self.engine, self.sess, self.prompt, self.k = engine, sess, prompt, k
        self.sampling = sampling or Sampling()
        self.base, self.split, self.ckpt_rel = base, split, ckpt
        self.chunks = trunk_schedule(tp, split, ckpt, tokenwise, lambda n: chunk_ranges(n, chunk_rows))
        self.fill_chunk = tp if not fill_chunk or fill_chunk <= 0 else int(fill_chunk)
        self.short = tp <= self.fill_chunk
        self.capture_rel = capture_at - base if capture_at is not None else None
        self.prev_h = None if sess.last_h is None else np.asarray(engine.host(sess.last_h), np.float32).reshape(-1)
        self.hiddens = np.zeros((tp, engine.cfg.hidden_size), np.float32)
        self.cursor = 0
        self.fill_cursor = 0
        self.logits = None
        self.prepared = None
        self.wall_s = 0.0

    # ---- protocol ----------------------------------------------------------------------------
    def remaining_chunks(self) -> int:
        if self.short:
            return int(self.fill_cursor < len(self.prompt))
        return len(self.chunks) - self.cursor + -(-(len(self.prompt) - self.fill_cursor) // self.fill_chunk)

    def next_chunk(self):
        if self.remaining_chunks() == 0:
            return None
        if self.cursor < len(self.chunks):
            rows = len(self.prompt) if self.short else self.chunks[self.cursor].rows
            return PrimeChunk("mtp-trunk", rows)
        return PrimeChunk("mtp-draft-fill", min(self.fill_chunk, len(self.prompt) - self.fill_cursor))

    def tape(self) -> list:
        """The planned (phase, rows) tape, frozen at creation."""
        if self.short:
            return [("mtp-trunk", len(self.prompt))]
        tp = len(self.prompt)
        return ([("mtp-trunk", ch.rows) for ch in self.chunks]
                + [("mtp-draft-fill", min(self.fill_chunk, tp - s)) for s in range(0, tp, self.fill_chunk)])

    def _advance(self) -> PrimeChunk:
        t0 = time.perf_counter()
        try:
            if self.cursor < len(self.chunks):
                rows = 0
                while True:
                    ch = self.chunks[self.cursor]
                    self._trunk(ch)
                    rows += ch.rows
                    self.cursor += 1
                    if not self.short or self.cursor == len(self.chunks):
                        break
                if self.cursor == len(self.chunks):
                    self._setup()
                    if self.short:
                        self._fill()
                self.engine.B.synchronize()
                return PrimeChunk("mtp-trunk", rows)
            rows = self._fill()
            self.engine.B.synchronize()
            return PrimeChunk("mtp-draft-fill", rows)
        finally:
            self.wall_s += time.perf_counter() - t0

    def _finish(self) -> PreparedPrime:
        if self.prepared is None:
            raise PrimeError("MTP setup incomplete")
        self.prepared.wall_s = self.wall_s
        self.sess.prime_ready = self.prepared
        return self.prepared

    # ---- phases ------------------------------------------------------------------------------
    def _trunk(self, ch) -> None:
        eng, sess = self.engine, self.sess
        if ch.batched:
            logits, h = eng.prime_chunk(sess, self.prompt[ch.start:ch.end])
            self.hiddens[ch.start:ch.end] = eng.host(h)
            self.logits = logits
        else:
            step = eng.target_step if ch.target_step else None
            for i in range(ch.start, ch.end):
                if step is not None:
                    lg, h = step(sess, [self.prompt[i]])
                    lg = lg[0]
                else:
                    lg, h = eng.decode_step(sess, self.prompt[i])
                self.hiddens[i] = eng.host(h)[0]
                self.logits = lg
        end, tp = ch.end, len(self.prompt)
        if ch.end == ch.segment_end and end < tp:
            if (self.base == 0 or self.capture_rel is not None) and end in (self.capture_rel, self.ckpt_rel):
                self._push_capture(end)
            if self.ckpt_rel == end:
                self.sess.turn_ckpt = TurnCheckpoint(sess.cache.snapshot(), self.base + end,
                                                     self.hiddens[end - 1].copy())

    def _push_capture(self, end) -> None:
        self.sess.boundary_captures.append(BoundaryCapture(
            self.sess.cache.snapshot(), self.base + end, np.array(self.logits, np.float32),
            self.hiddens[end - 1].copy()))

    def _setup(self) -> None:
        eng, sess, tp = self.engine, self.sess, len(self.prompt)
        if self.capture_rel == tp and not sess.boundary_captures:
            self._push_capture(tp)
        if self.ckpt_rel is None:
            sess.turn_ckpt = TurnCheckpoint(sess.cache.snapshot(), self.base + tp, self.hiddens[tp - 1].copy())
        boundary = pick(self.logits, self.sampling, sess.session_id, self.base + tp)
        init_logits, init_h = eng.target_step(sess, [boundary])
        init_h = np.array(eng.host(init_h), np.float32)
        self.prepared = PreparedPrime(list(self.prompt), self.base, np.array(self.logits, np.float32), boundary,
                                      init_logits[0], init_h, self.hiddens, self.k, self.sampling)

    def _fill(self) -> int:
        eng, sess = self.engine, self.sess
        start = self.fill_cursor
        end = min(start + self.fill_chunk, len(self.prompt))
        H = eng.cfg.hidden_size
        phs = np.zeros((end - start, H), np.float32)
        if start == 0:
            if self.prev_h is not None:
                phs[0] = self.prev_h
            phs[1:] = self.hiddens[0:end - 1]
            sess.cache.mtp_len = self.base  # re-sync the head's cache with the trunk at the prime start
        else:
            phs[:] = self.hiddens[start - 1:end - 1]
        eng.mtp_fill(sess, self.prompt[start:end], phs)
        self.fill_cursor = end
        return end - start


# ------------------------------------------------------------------------------------------------
# drivers
# ------------------------------------------------------------------------------------------------
@dataclass
class PrimeRun:
    prepared: PreparedPrime
    tape: list = field(default_factory=list)
    yields: int = 0
    chunk_wall_s: list = field(default_factory=list)
    wall_s: float = 0.0


def run_prime(engine, sess, prompt, k, *, sampling=None, yield_hook=None, on_chunk=None, **walker_kw) -> PrimeRun:
    """Prime ``prompt`` with the walker (``walker_kw``: :class:`MtpPrimeWalker`'s schedule
    arguments, ``prime_split`` … ``capture_at``, ``ckpt_at``). With ``yield_hook``, advance one
    chunk at a time and call the hook between chunks (a yield); otherwise drain in one call.
    ``on_chunk(done, remaining)``, if given, is called after each advance with the chunks done
    so far and those left (a progress display; it must not touch the engine)."""
    t0 = time.perf_counter()
    w = MtpPrimeWalker(engine, sess, prompt, k, sampling=sampling, **walker_kw)
    run = PrimeRun(None)
    last = [time.perf_counter()]

    def observe(chunk):
        now = time.perf_counter()
        run.tape.append((chunk.phase, chunk.rows))
        run.chunk_wall_s.append(now - last[0])
        last[0] = now

    while w.remaining_chunks() > 0:
        progress = advance_prime(w, yield_hook is not None, observe)
        if on_chunk is not None:
            on_chunk(len(run.tape), progress.remaining_chunks)
        if yield_hook is not None and progress.remaining_chunks > 0:
            yield_hook()
            run.yields += 1
            last[0] = time.perf_counter()
    run.prepared = finish_prime(w)
    run.wall_s = time.perf_counter() - t0
    return run
