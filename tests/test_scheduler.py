"""The cooperative scheduler (harness/walk/scheduler.py) on the tiny model (CPU): policies decide
only the order of units — every session's digests are bitwise equal under every policy and alone,
for random arrival patterns, peers before / during / after the prime, no peers, K = 0..3 and
sampling — and each policy orders units as it says. A fixed-cost clock makes the orders exact."""

import numpy as np
import pytest

from harness.engine.model import Engine
from harness.engine.weights import load_checkpoint
from harness.errors import InputError, PrimewalkError
from harness.models import default_model_path
from harness.walk.mtp_walker import run_prime
from harness.walk.sampling import Sampling
from harness.walk.scheduler import (DECODE, PRIME, SPEC, Job, Policy, SessionPool, reset_session, run_schedule,
                                    zero_snapshot)
from harness.walk.speculative import PlainStream, SpecStream, continue_plain, continue_spec

V = 260
POLICIES = (Policy("drain"), Policy("yield"), Policy("interval", 1), Policy("interval", 3))


@pytest.fixture(scope="module")
def eng():
    return Engine(load_checkpoint(default_model_path()), "cpu")


def fixed_clock(prime_row_s=1e-3, step_s=2e-3):
    """A deterministic clock: a prime chunk costs its rows, a decode unit a fixed time."""

    def timer(fn):
        kind, phase, rows = out = fn()
        return out, (rows * prime_row_s if kind == PRIME else step_s)

    return timer


def job(i, n, arrival, k=1, new=6, sampling=None, chunk=32, fill=32, boundary=None, seed=0):
    prompt = tuple(np.random.default_rng([seed, i, n]).integers(0, V, n).tolist())
    return Job(f"s{i}", prompt, arrival, new, k, sampling or Sampling(), i, chunk, fill, boundary)


_ALONE = {}


def alone(eng, j):
    """The job's outcome run alone (cached: a job is a frozen value)."""
    key = j.__class__(**{**j.__dict__, "arrival_s": 0.0})
    if key not in _ALONE:
        _ALONE[key] = run_schedule(eng, [key], Policy("drain")).outcomes[0]
    return _ALONE[key]


def assert_bitwise_everywhere(eng, jobs, policies=POLICIES, timer=None):
    refs = [alone(eng, j) for j in jobs]
    out = {}
    for pol in policies:
        sch = run_schedule(eng, jobs, pol, timer)
        for j, o, ref in zip(jobs, sch.outcomes, refs):
            assert o.digests == ref.digests, f"{pol.label}: {j.name} differs from alone"
            assert o.tokens == ref.tokens and o.tape == ref.tape
            assert o.acceptance == ref.acceptance
        out[pol.label] = sch
    return out


# ------------------------------------------------------------------------------------------------
# the verdict: digests independent of the policy
# ------------------------------------------------------------------------------------------------
def _random_pattern(seed):
    rng = np.random.default_rng(seed)
    jobs = [job(0, int(rng.integers(80, 170)), float(rng.uniform(0, 0.05)), k=int(rng.integers(0, 4)),
                boundary=64 if seed % 2 else None, chunk=int(rng.choice([16, 32, 50])))]
    for i in range(1, int(rng.integers(2, 4))):
        t = float(rng.uniform(0, 0.3))
        s = Sampling(0.8, int(rng.integers(0, 9))) if rng.random() < 0.4 else Sampling()
        jobs.append(job(i, int(rng.integers(1, 70)), t, k=int(rng.integers(0, 4)), new=int(rng.integers(1, 9)),
                        sampling=s, chunk=jobs[0].chunk_rows))
    return jobs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_arrival_patterns_are_bitwise_under_every_policy(eng, seed):
    assert_bitwise_everywhere(eng, _random_pattern(seed), timer=fixed_clock())


def test_measured_clock_too(eng):
    """The same with the real clock (the device timer): the order varies, the bits do not."""
    jobs = [job(0, 160, 0.0, k=2), job(1, 20, 0.0005, k=3), job(2, 40, 0.001, k=0, sampling=Sampling(0.7, 1))]
    assert_bitwise_everywhere(eng, jobs)


@pytest.mark.parametrize("case", ["before", "after", "same-time", "no-peers"])
def test_peers_before_after_or_with_the_prime(eng, case):
    long = job(0, 150, 0.05, k=2, boundary=64)
    peers = {"before": [job(1, 30, 0.0, k=1), job(2, 45, 0.01, k=3, sampling=Sampling(0.9, 4))],
             "after": [job(1, 30, 10.0, k=1), job(2, 12, 12.0, k=0)],
             "same-time": [job(1, 30, 0.05, k=2), job(2, 33, 0.05, k=1), job(3, 8, 0.05, k=0)],
             "no-peers": []}[case]
    schedules = assert_bitwise_everywhere(eng, [long] + peers, timer=fixed_clock())
    if case == "after":  # the clock jumps over idle time to each arrival
        for sch in schedules.values():
            assert sch.idle_s > 0
            assert [u.session for u in sch.units[:1]] == [0]


# ------------------------------------------------------------------------------------------------
# what each policy does (fixed-cost clock: exact orders)
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def busy(eng):
    """A long prime (8 trunk + 8 fill chunks) with three peers arriving during it."""
    jobs = [job(0, 256, 0.0, k=2), job(1, 20, 0.01, k=1, new=12), job(2, 30, 0.02, k=3, new=12),
            job(3, 10, 0.03, k=0, new=12)]
    return jobs, {p.label: run_schedule(eng, jobs, p, fixed_clock()) for p in POLICIES}


def _prime_ticks(sch, s):
    return [i for i, u in enumerate(sch.units) if u.session == s and u.kind == PRIME]


def test_drain_runs_a_started_prime_to_its_end(busy):
    jobs, runs = busy
    sch = runs["drain"]
    for s in range(len(jobs)):
        ticks = _prime_ticks(sch, s)
        assert ticks == list(range(ticks[0], ticks[-1] + 1)), f"session {s}'s prime was interrupted"
    # the peers arrived during the long prime, so they wait for all of it (trunk and fill)
    long_end = sch.units[_prime_ticks(sch, 0)[-1]].end_s
    assert all(sch.outcomes[s].start_s >= long_end for s in (1, 2, 3))
    # the first peer arrived during the first chunk: the whole prime held the device from it
    assert sch.longest_hold_s == pytest.approx(long_end)


def test_yield_gives_every_ready_peer_a_unit_after_each_prime_chunk(busy):
    jobs, runs = busy
    sch = runs["yield"]
    ticks = _prime_ticks(sch, 0)
    for a, b in zip(ticks, ticks[1:]):
        between = [u.session for u in sch.units[a + 1:b]]
        ready = [s for s in (1, 2, 3) if jobs[s].arrival_s < sch.units[a].end_s
                 and sch.outcomes[s].finish_s > sch.units[a].end_s]
        assert sorted(between) == ready, (a, b, between, ready)
    assert sch.longest_hold_s <= max(u.seconds for u in sch.units) + 1e-12


@pytest.mark.parametrize("steps", [1, 3])
def test_interval_serves_n_decode_units_per_prime_chunk(busy, steps):
    jobs, runs = busy
    sch = runs[f"interval@{steps}"]
    kinds = [u.kind for u in sch.units]
    primes = [i for i, k in enumerate(kinds) if k == PRIME]
    for a, b in zip(primes, primes[1:]):
        assert b - a - 1 <= steps
    # while the peers are decoding and the long prompt still primes, exactly `steps` decode units
    # separate two of its chunks
    last_peer_prime = max(_prime_ticks(sch, s)[-1] for s in (1, 2, 3))
    long_ticks = [i for i in _prime_ticks(sch, 0) if i > last_peer_prime]
    busy_gaps = [b - a - 1 for a, b in zip(long_ticks, long_ticks[1:])
                 if all(sch.outcomes[s].finish_s > sch.units[b].start_s for s in (1, 2, 3))]
    assert busy_gaps and all(g == steps for g in busy_gaps)


def test_clock_arrivals_and_first_events(busy):
    jobs, runs = busy
    for sch in runs.values():
        for prev, u in zip(sch.units, sch.units[1:]):
            assert u.start_s == prev.end_s  # no idle time: someone was always ready
            assert u.start_s >= jobs[u.session].arrival_s or u.session == 0
        for s, o in enumerate(sch.outcomes):
            own = [u for u in sch.units if u.session == s]
            assert own[0].start_s >= jobs[s].arrival_s
            trunk_end = [u for u in own if u.phase == "mtp-trunk"][-1].end_s
            assert o.first_event_s == trunk_end  # the boundary token: after the last trunk chunk
            assert o.finish_s == own[-1].end_s and o.units == len(own)
            assert o.busy_s == pytest.approx(sum(u.seconds for u in own))
            assert {u.kind for u in own if u.kind != PRIME} <= ({SPEC} if jobs[s].k else {DECODE})
            assert len(o.tokens) == jobs[s].max_new_tokens


def test_one_and_two_token_continuations_need_no_decode_unit(eng):
    jobs = [job(0, 30, 0.0, k=2, new=1), job(1, 32, 0.0, k=0, new=2)]
    sch = assert_bitwise_everywhere(eng, jobs, (Policy("yield"),), fixed_clock())["yield"]
    assert [u.kind for u in sch.units] == [PRIME, PRIME]


def test_bad_input_is_a_one_line_error(eng):
    with pytest.raises(PrimewalkError):
        Policy("round-robin")
    with pytest.raises(PrimewalkError):
        Policy("interval", 0)
    bad = Job("bad", (1, 2, V + 5), 0.0, 4, 1, Sampling(), 0, 32, 32)
    with pytest.raises(InputError):
        run_schedule(eng, [bad], Policy("yield"))


# ------------------------------------------------------------------------------------------------
# the session pool: reused sessions compute what new ones do
# ------------------------------------------------------------------------------------------------
def test_a_reset_session_is_a_new_one(eng):
    """Primed, continued with rollbacks, checkpointed: reset, its digest is a new cache's and a
    second session on it equals the same session on a new one."""
    a, b = job(0, 90, 0.0, k=2, boundary=40, seed=3), job(1, 60, 0.0, k=3, sampling=Sampling(0.8, 2), seed=4)
    sess = eng.new_session(max(a.capacity(), b.capacity()), session_id=0)
    run = run_prime(eng, sess, list(a.prompt), 2, prime_split=40, capture_at=40, ckpt_at=40)
    continue_spec(eng, sess, run.prepared, 9, 2)
    assert sess.committed and sess.boundary_captures and sess.turn_ckpt is not None
    reset_session(sess, zero_snapshot(eng), session_id=1)
    fresh = eng.new_session(sess.cache.max_ctx, session_id=1)
    assert sess.cache.digest() == fresh.cache.digest()
    assert (sess.committed, sess.boundary_captures, sess.turn_ckpt, sess.prime_ready) == ([], [], None, None)
    assert "start" not in sess.verify_caps
    with pytest.raises(PrimewalkError):  # no captured target step to roll back to
        eng.rollback(sess, 1)
    outs = []
    for s in (sess, fresh):
        prepared = run_prime(eng, s, list(b.prompt), 3, sampling=b.sampling).prepared
        res = continue_spec(eng, s, prepared, 11, 3, b.sampling)
        outs.append((np.asarray(prepared.logits).tobytes(), res.tokens, res.metrics, s.cache.digest()))
    assert outs[0] == outs[1]


def test_a_pool_reuses_sessions_and_changes_no_bit(eng):
    jobs = _random_pattern(5) + [job(7, 25, 0.02, k=1), job(8, 25, 0.03, k=1)]  # two of one shape
    pool = SessionPool(eng)
    pool.prepare(jobs)
    assert sum(len(v) for v in pool.free.values()) == len(jobs)
    assert len(pool.free[SessionPool.shape(jobs[-1])]) == 2
    first = {id(s) for v in pool.free.values() for s in v}
    for pol in (Policy("yield"), Policy("drain")):
        pool.prepare(jobs)
        sch = run_schedule(eng, jobs, pol, fixed_clock(), pool)
        for j, o in zip(jobs, sch.outcomes):
            ref = alone(eng, j)
            assert (o.digests, o.tokens, o.tape, o.acceptance) == (ref.digests, ref.tokens, ref.tape, ref.acceptance)
        assert {id(s) for v in pool.free.values() for s in v} == first  # the same sessions, back in the pool
    pool.give(jobs[0], eng.new_session(jobs[0].capacity()))
    assert len(pool.free[SessionPool.shape(jobs[0])]) == 2


# ------------------------------------------------------------------------------------------------
# the continuation streams the scheduler steps
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k,sampling", [(0, Sampling()), (2, Sampling()), (3, Sampling(0.7, 2))])
def test_streams_step_to_the_looped_continuation(eng, k, sampling):
    prompt = job(0, 70, 0.0).prompt
    results = []
    for stepped in (False, True):
        sess = eng.new_session(120, session_id=5)
        prepared = run_prime(eng, sess, list(prompt), max(k, 1), sampling=sampling).prepared
        if not stepped:
            res = (continue_spec(eng, sess, prepared, 17, k, sampling) if k else
                   continue_plain(eng, sess, prepared, 17, sampling))
        else:
            stream = (SpecStream(eng, sess, prepared, 17, k, sampling) if k else
                      PlainStream(eng, sess, prepared, 17, sampling))
            while not stream.done:
                assert stream.step() >= 1
            with pytest.raises(PrimewalkError):
                stream.step()
            res = stream.finish()
        results.append((res.tokens, res.metrics, sess.cache.digest(), sess.committed))
    assert results[0] == results[1]
    assert len(results[0][0]) == 17
