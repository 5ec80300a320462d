"""Warm-up: every code path a timed region uses, run once on throwaway prompts before any clock
starts, so Numba compiles (or loads from its on-disk cache) every kernel outside the timings.

Numba compiles a kernel per argument *type* (dtype, dimensions, layout), not per shape, so one
pass over each entry point with the engine's own buffers compiles what every later prompt
length, chunk size and K needs: batched prime chunks, token-by-token segments (decode steps and
target steps), boundary captures and checkpoints (snapshot, restore, digest), the MTP fill and
chained drafts, verify with per-row capture and rollback, plain and sampled decoding, and the
peer session of the yielded schedules. A model without an MTP head warms the trunk paths only.

What is left outside the warm-up is per-session work that no warm-up can do once for all: on
CUDA, capturing the graphs of a new session's small steps (:mod:`harness.engine.graphs`).
"""

from __future__ import annotations

import time

import numpy as np

from .check import Peer, oracle_prime
from .mtp_walker import run_prime
from .sampling import Sampling
from .schedule import PRIME_MIN_T
from .speculative import continue_plain, continue_spec, prime_trunk

WARM_TOKENS = 4  # continuation tokens per warm-up decode
SAMPLED = Sampling(0.7, 1)


def _prompt(engine, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, engine.cfg.vocab_size, n)]


def warm_up(engine, k: int = 2) -> float:
    """Run every timed code path of ``engine`` once (module docstring); returns the seconds it
    took. The engine's sessions are throwaway; nothing it holds changes."""
    t0 = time.perf_counter()
    greedy = Sampling()
    tp = 2 * PRIME_MIN_T + 8  # two segments of >= PRIME_MIN_T rows, a short one token by token
    long_prompt, short_prompt = _prompt(engine, tp, 1), _prompt(engine, 8, 2)
    cap = tp + 2 * (k + 1) + WARM_TOKENS + 16
    if not engine.has_mtp:
        sess = engine.new_session(cap)
        run = prime_trunk(engine, sess, long_prompt, greedy, chunk_rows=PRIME_MIN_T)
        continue_plain(engine, sess, run.prepared, WARM_TOKENS, greedy)
        engine.B.synchronize()
        return time.perf_counter() - t0
    split = PRIME_MIN_T
    peer = Peer(engine, prompt_len=8, max_ctx=64)
    for sampling in (greedy, SAMPLED):
        # a split + checkpoint prime, yielded to a peer, batched in chunks, then spec + plain decode
        sess = engine.new_session(cap)
        run = run_prime(engine, sess, long_prompt, k, sampling=sampling, yield_hook=peer.step,
                        prime_split=split, chunk_rows=PRIME_MIN_T // 2, fill_chunk=PRIME_MIN_T,
                        capture_at=split, ckpt_at=tp - 8)
        snap = sess.cache.snapshot()
        continue_spec(engine, sess, run.prepared, WARM_TOKENS, k, sampling)
        sess.cache.digest()
        plain = engine.new_session(cap, session_id=sess.session_id)
        plain.cache.restore(snap)
        continue_plain(engine, plain, run.prepared, WARM_TOKENS, sampling)
    # an unsegmented token-by-token prime (target steps) and a short one (one advance)
    for tokenwise in (True, False):
        sess = engine.new_session(cap)
        run_prime(engine, sess, short_prompt, k, tokenwise=tokenwise, fill_chunk=len(short_prompt))
    oracle_prime(engine, long_prompt, k, [split])
    engine.B.synchronize()
    return time.perf_counter() - t0
