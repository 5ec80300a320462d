"""The seed's prime-walker check (``harness check``): a yielded walker prime must equal an
unyielded prime bit for bit.

:func:`oracle_prime` primes the segments between boundary points in one batch each on a fresh
session and captures at each point; :class:`Peer` is another session on the same engine (and
workspace) that decodes a token whenever the walker yields; :func:`check_mtp_prime_walker`
compares the two (DESIGN §5).
"""

from __future__ import annotations

import numpy as np

from ..engine.digests import capture_digest, logits_digest
from ..errors import InputError
from .mtp_walker import DEFAULT_CHUNK_ROWS, DEFAULT_FILL_CHUNK, BoundaryCapture, run_prime
from .schedule import GDN_GRID, PRIME_MIN_T


class Peer:
    """Another session on the same engine and workspace that decodes one token per :meth:`step`."""

    def __init__(self, engine, prompt_len=GDN_GRID, seed=1234, max_ctx=1024):
        self.engine, self.max_ctx = engine, max_ctx
        self.prompt = list(np.random.default_rng(seed).integers(0, engine.cfg.vocab_size, prompt_len))
        self._reset()

    def _reset(self):
        self.sess = self.engine.new_session(self.max_ctx, session_id=-1)
        logits, _ = self.engine.prime_chunk(self.sess, self.prompt)
        self.token = int(np.argmax(logits))

    def step(self):
        if self.sess.cache.pos + 1 >= self.sess.cache.max_ctx:
            self._reset()
        logits, _ = self.engine.decode_step(self.sess, self.token)
        self.token = int(np.argmax(logits))


def oracle_prime(engine, prompt, k, boundary_points=(), sampling=None, trace=None):
    """Unyielded prime of the segments between ``boundary_points`` (one batched prime per
    segment on a fresh session), with a capture at each point. Returns (logits of the last
    prompt row [V], capture digest). ``trace``: a Trace recording the session."""
    prompt = [int(t) for t in prompt]
    sess = engine.new_session(len(prompt) + k + 128)
    sess.trace = trace
    caps, lo, logits, hid = [], 0, None, None
    for hi in sorted(set(int(b) for b in boundary_points if 0 < b < len(prompt))) + [len(prompt)]:
        logits, hid = engine.prime_chunk(sess, prompt[lo:hi])
        if hi < len(prompt):
            caps.append(BoundaryCapture(sess.cache.snapshot(), hi, np.array(logits, np.float32),
                                        engine.host(hid)[hi - lo - 1].copy()))
        lo = hi
    return logits, capture_digest(caps)


def check_mtp_prime_walker(engine, prompt, k, boundary=None, chunk_rows=DEFAULT_CHUNK_ROWS,
                           fill_chunk=DEFAULT_FILL_CHUNK, sampling=None, progress=None):
    """The seed's check: a yielded walker prime (split and checkpoint at the boundary, a peer
    session decoding between chunks) must equal the unyielded prime of the two segments —
    logits bit for bit, capture digests equal — and must have yielded.

    Returns a dict with ``ok``, ``yields``, digests and what differed. Raises InputError for a
    boundary that leaves a segment shorter than PRIME_MIN_T. ``progress(text)``, if given, is
    told what runs: the oracle prime, then each walker chunk (``walker chunk d/n``)."""
    prompt = [int(t) for t in prompt]
    tp = len(prompt)
    if boundary is None:
        boundary = (tp // 2 // GDN_GRID) * GDN_GRID
    if boundary < PRIME_MIN_T or tp - boundary < PRIME_MIN_T:
        raise InputError(f"the prime walker check needs two segments of at least PRIME_MIN_T = {PRIME_MIN_T} "
                         f"rows; boundary {boundary} of a {tp}-token prompt leaves "
                         f"{min(boundary, tp - boundary)}")
    if progress is not None:
        progress(f"unyielded oracle prime of {tp:,} rows")
    expected, expected_cap = oracle_prime(engine, prompt, k, [boundary], sampling)
    sess = engine.new_session(tp + k + 128)
    peer = Peer(engine)
    on_chunk = None if progress is None else (lambda d, r: progress(f"walker chunk {d}/{d + r}", d, d + r))
    run = run_prime(engine, sess, prompt, k, sampling=sampling, yield_hook=peer.step, prime_split=boundary,
                    chunk_rows=chunk_rows, fill_chunk=fill_chunk, capture_at=boundary, ckpt_at=boundary,
                    on_chunk=on_chunk)
    got = run.prepared.logits
    actual_cap = capture_digest(sess.boundary_captures)
    same_logits = got.shape == expected.shape and np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    problems = []
    if not same_logits:
        problems.append("resumed MTP prime logits differ from the unyielded trunk")
    if actual_cap != expected_cap:
        problems.append(f"capture digest {actual_cap[:16]} != expected {expected_cap[:16]}")
    if run.yields == 0:
        problems.append("the walker never yielded")
    return {"ok": not problems, "problems": problems, "rows": tp, "boundary": boundary, "k": k,
            "yields": run.yields, "tape": run.tape, "logits_digest": logits_digest(expected),
            "capture_digest": actual_cap, "expected_capture_digest": expected_cap,
            "prepared": run.prepared, "session": sess}
