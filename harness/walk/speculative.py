"""Speculative decoding with the MTP head, and plain decoding to compare it with.

After a prime (:class:`~harness.walk.mtp_walker.PreparedPrime`) the trunk has processed the prompt and
the boundary token ``x_T``; the next token ``x_{T+1}`` is picked from the boundary's logits. Each
round then:

1. ``mtp_draft``: one MTP pass over the rows not yet in the head's cache (row at position p pairs
   the token at p with the trunk hidden row at p − 1; the last row is the pending token), then
   ``K`` greedy drafts chained on the head's own output hidden;
2. one ``target_step`` verifies the K + 1 rows ``[pending, d_1 … d_K]`` and captures per-row
   DeltaNet state;
3. accept the longest prefix where each draft equals the target's pick at that row (greedy), or
   for temperature > 0 accept draft d with probability p(d) and otherwise draw from p with d
   removed (standard speculative sampling for a point-mass draft), then the bonus token;
4. roll the trunk back to the last accepted row (GDN state from the capture, K/V length).

:class:`SpecStream` / :class:`PlainStream` run one round / one decode step per ``step()`` (the
scheduler's units); :func:`continue_spec` / :func:`continue_plain` loop over them.

Greedy speculative output equals plain greedy decoding token for token: verify rows are bitwise
the decode steps (exact mode), and argmax is a function of those bits.

Metrics follow vLLM: ``drafts`` = speculation rounds, ``draft_tokens`` = rounds × K,
``accepted`` = accepted draft tokens, mean acceptance length = 1 + accepted / drafts,
per-position acceptance rate = fraction of rounds whose i-th draft was accepted, histogram of
accepted counts (0..K).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, PrimewalkError
from .mtp_walker import DEFAULT_CHUNK_ROWS, PreparedPrime, PrimeRun, run_prime
from .sampling import Sampling, counter_uniform, draw, pick, probs

STREAM_ACCEPT, STREAM_RESAMPLE = 1, 2


@dataclass
class GenResult:
    tokens: list
    metrics: dict = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s if self.wall_s > 0 else 0.0


def acceptance_metrics(k: int, rounds: list, drafted: list | None = None) -> dict:
    """rounds: accepted count per speculation round; drafted: drafts proposed per round (K,
    fewer only near the cache capacity). Position i's rate counts the rounds that drafted it."""
    n = len(rounds)
    drafted = drafted if drafted is not None else [k] * n
    acc = int(sum(rounds))
    hist = [int(sum(1 for r in rounds if r == j)) for j in range(k + 1)]
    per_pos = []
    for i in range(k):
        tried = sum(1 for d in drafted if d > i)
        per_pos.append(float(sum(1 for r in rounds if r > i) / tried) if tried else 0.0)
    return {"drafts": n, "draft_tokens": int(sum(drafted)), "accepted": acc,
            "mean_acceptance_length": float(1.0 + acc / n) if n else 1.0,
            "per_position": per_pos, "histogram": hist}


def _verify(verify_logits, drafts, s: Sampling, session: int, pos0: int):
    """Accepted count j and the bonus token, from the K+1 verify rows (row i at position pos0+i
    picks the token at pos0 + i + 1)."""
    k = len(drafts)
    for i in range(k):
        lg, d = verify_logits[i], drafts[i]
        if s.greedy:
            if int(np.argmax(lg)) != d:
                return i, int(np.argmax(lg))
            continue
        p = probs(lg, s.temperature)
        if counter_uniform(s.seed, session, pos0 + i + 1, STREAM_ACCEPT) < float(p[d]):
            continue
        p = p.copy()
        p[d] = 0.0
        if p.sum() <= 0:
            return i, d
        return i, draw(p, counter_uniform(s.seed, session, pos0 + i + 1, STREAM_RESAMPLE))
    return k, pick(verify_logits[k], s, session, pos0 + k + 1)


class _Stream:
    """A continuation after a prime, advanced one unit of work per :meth:`step` (a speculative
    round, or a decode step) so a scheduler can interleave sessions between units.

    The first token (the boundary token, picked by the prime's setup) and the one picked from
    the boundary's logits are committed without engine work; every :meth:`step` runs one unit
    and commits at least one more token, until ``max_new_tokens`` are committed (:attr:`done`).
    :meth:`finish` hands back the :class:`GenResult` and commits the tokens to the session.
    Stepping in one loop (:func:`continue_spec`, :func:`continue_plain`) or unit by unit with
    other sessions' work in between gives the same tokens and the same final cache."""

    def __init__(self, engine, sess, prepared, max_new_tokens: int, sampling: Sampling = None):
        self.engine, self.sess, self.max_new_tokens = engine, sess, int(max_new_tokens)
        self.s = sampling or prepared.sampling
        self.out = [prepared.boundary]
        # the token after the boundary, at the position after the prime
        self.pending = pick(prepared.init_logits, self.s, sess.session_id, sess.cache.pos)
        self._commit_pending()

    def _commit_pending(self) -> None:
        if len(self.out) < self.max_new_tokens:
            self.out.append(self.pending)

    @property
    def done(self) -> bool:
        return len(self.out) >= self.max_new_tokens

    def step(self) -> int:
        """Run one unit; returns the number of tokens it committed (>= 1)."""
        if self.done:
            raise PrimewalkError(f"the continuation already has its {self.max_new_tokens} tokens")
        n0 = len(self.out)
        self._unit()
        self._commit_pending()
        return len(self.out) - n0

    def _unit(self) -> None:
        raise NotImplementedError

    def metrics(self) -> dict:
        return {}

    def finish(self, wall_s: float = 0.0) -> GenResult:
        res = GenResult(self.out[: self.max_new_tokens], self.metrics(), wall_s)
        self.sess.committed.extend(res.tokens)
        return res


class SpecStream(_Stream):
    """Speculative continuation, one round (K chained drafts, one K+1-row verify, rollback) per
    :meth:`step` (see :class:`_Stream` and the module docstring)."""

    def __init__(self, engine, sess, prepared, max_new_tokens: int, k: int, sampling: Sampling = None):
        super().__init__(engine, sess, prepared, max_new_tokens, sampling)
        self.k = k
        # rows the head still needs: (boundary, h_{T-1}) and (pending, h_T)
        self.fill_tokens = [prepared.boundary, self.pending]
        self.fill_h = np.concatenate([prepared.hiddens[-1:], prepared.init_h], axis=0)
        self.rounds, self.drafted = [], []

    def _unit(self) -> None:
        engine, sess, c = self.engine, self.sess, self.sess.cache
        kk = min(self.k, c.max_ctx - c.pos - 1)
        if kk < 1:
            raise engine_capacity_error(c)
        drafts = engine.mtp_draft(sess, self.fill_tokens, self.fill_h, kk)
        pos0 = c.pos
        logits, hidden = engine.target_step(sess, [self.pending] + drafts, capture=True)
        j, bonus = _verify(logits, drafts, self.s, sess.session_id, pos0)
        engine.rollback(sess, j + 1)
        self.rounds.append(j)
        self.drafted.append(kk)
        self.out.extend(drafts[:j])
        self.fill_tokens = drafts[:j] + [bonus]
        self.fill_h = engine.host(hidden)[: j + 1]
        self.pending = bonus

    def metrics(self) -> dict:
        return acceptance_metrics(self.k, self.rounds, self.drafted)


class PlainStream(_Stream):
    """Plain continuation, one decode step per :meth:`step` (see :class:`_Stream`)."""

    def _unit(self) -> None:
        c = self.sess.cache
        if c.pos >= c.max_ctx:
            raise engine_capacity_error(c)
        logits, _ = self.engine.decode_step(self.sess, self.pending)
        self.pending = pick(logits, self.s, self.sess.session_id, c.pos)


def _run(stream: _Stream) -> GenResult:
    t0 = time.perf_counter()
    while not stream.done:
        stream.step()
    stream.engine.B.synchronize()
    return stream.finish(time.perf_counter() - t0)


def continue_spec(engine, sess, prepared, max_new_tokens: int, k: int, sampling: Sampling = None) -> GenResult:
    """Speculative continuation after a prime: returns ``max_new_tokens`` tokens starting with the
    boundary token."""
    return _run(SpecStream(engine, sess, prepared, max_new_tokens, k, sampling))


def engine_capacity_error(cache):
    return InputError(f"generation reached the cache capacity ({cache.max_ctx} positions)")


def continue_plain(engine, sess, prepared, max_new_tokens: int, sampling: Sampling = None) -> GenResult:
    """Plain decoding after a prime: one decode step per token."""
    return _run(PlainStream(engine, sess, prepared, max_new_tokens, sampling))


def prime_trunk(engine, sess, prompt, sampling: Sampling, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> PrimeRun:
    """Prime the trunk alone (a model without an MTP head): the prompt in batched chunks of
    ``chunk_rows``, then the boundary token and one target step on it, which is all plain
    decoding needs. In exact mode these are the walker's bits (rows do not depend on how they are
    batched), so plain decoding gives the same tokens either way."""
    t0 = time.perf_counter()
    prompt = [int(t) for t in prompt]
    engine.check_ids(prompt)
    base, run = sess.cache.pos, PrimeRun(None)
    logits = None
    for lo in range(0, len(prompt), chunk_rows):
        t1 = time.perf_counter()
        logits, _ = engine.prime_chunk(sess, prompt[lo:lo + chunk_rows])
        run.tape.append(("trunk", len(prompt[lo:lo + chunk_rows])))
        run.chunk_wall_s.append(time.perf_counter() - t1)
    boundary = pick(logits, sampling, sess.session_id, base + len(prompt))
    init_logits, init_h = engine.target_step(sess, [boundary])
    engine.B.synchronize()
    run.wall_s = time.perf_counter() - t0
    run.prepared = PreparedPrime(prompt, base, np.array(logits, np.float32), boundary, init_logits[0],
                                 np.array(engine.host(init_h), np.float32), None, 0, sampling, run.wall_s)
    return run


def generate(engine, prompt, max_new_tokens: int, k: int, sampling: Sampling = None, speculative=True,
             max_ctx=None, **walker_kw):
    """Prime ``prompt`` on a new session, then continue (speculatively with K drafts, or
    plainly). The prime is the MTP walker's; plain decoding on a model without an MTP head primes
    the trunk alone (:func:`prime_trunk`). Returns (GenResult, PrimeRun)."""
    s = sampling or Sampling()
    sess = engine.new_session(max_ctx or (len(prompt) + max_new_tokens + k + 8))
    if not speculative and not engine.has_mtp:
        run = prime_trunk(engine, sess, prompt, s, walker_kw.get("chunk_rows", DEFAULT_CHUNK_ROWS))
        return continue_plain(engine, sess, run.prepared, max_new_tokens, s), run
    run = run_prime(engine, sess, prompt, k, sampling=s, **walker_kw)
    if speculative:
        res = continue_spec(engine, sess, run.prepared, max_new_tokens, k, s)
    else:
        res = continue_plain(engine, sess, run.prepared, max_new_tokens, s)
    return res, run
