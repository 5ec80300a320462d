"""Speculative decoding with the MTP head on the tiny model (CPU): greedy output equals plain
greedy token for token — also with acceptance forced — the trunk cache matches plain decoding,
metrics match what was forced, rollback, sampling, and the context limit."""

import hashlib

import numpy as np
import pytest

from harness.engine.model import Engine
from harness.engine.weights import load_checkpoint
from harness.errors import InputError, PrimewalkError
from harness.models import default_model_path
from harness.walk import sampling as smp
from harness.walk.mtp_walker import run_prime
from harness.walk.sampling import Sampling
from harness.walk.speculative import (
    STREAM_ACCEPT,
    _verify,
    acceptance_metrics,
    continue_plain,
    continue_spec,
    generate,
)

V = 260
N = 20  # tokens generated per run
PROMPT_LENS = (1, 5, 70, 130)


@pytest.fixture(scope="module")
def eng():
    return Engine(load_checkpoint(default_model_path()), "cpu")


def prompt_of(n, seed=None):
    return np.random.default_rng(1000 + n if seed is None else seed).integers(0, V, n).tolist()


def bits(a):
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def trunk_digest(cache) -> str:
    """SHA-256 over pos and the trunk planes only (the MTP planes differ between plain and
    speculative runs: plain decoding never fills the head)."""
    h = hashlib.sha256(np.array([cache.pos], "<i8").tobytes())
    for name, a in cache.planes():
        if name.startswith("mtp."):
            continue
        host = np.ascontiguousarray(cache.B.download(a), dtype="<f4")
        h.update(name.encode() + b"\0" + np.array(host.shape, "<i8").tobytes() + host.tobytes())
    return h.hexdigest()


_PLAIN = {}


def plain_ref(eng, prompt, n=N + 8):
    """Plain greedy decoding step by step: (tokens [n], {cache position: trunk digest})."""
    key = tuple(prompt)
    if key in _PLAIN and len(_PLAIN[key][0]) >= n:
        return _PLAIN[key]
    sess = eng.new_session(len(prompt) + n + 8)
    prep = run_prime(eng, sess, prompt, 1).prepared
    toks = [prep.boundary, int(np.argmax(prep.init_logits))]
    digests = {sess.cache.pos: trunk_digest(sess.cache)}
    while len(toks) < n:
        logits, _ = eng.decode_step(sess, toks[-1])
        digests[sess.cache.pos] = trunk_digest(sess.cache)
        toks.append(int(np.argmax(logits)))
    # the library's own plain loop agrees
    assert generate(eng, prompt, n, 1, speculative=False)[0].tokens == toks
    _PLAIN[key] = (toks, digests)
    return _PLAIN[key]


def spec_run(eng, prompt, n, k, sampling=None, max_ctx=None):
    s = sampling or Sampling()
    sess = eng.new_session(max_ctx or len(prompt) + n + k + 8)
    prep = run_prime(eng, sess, prompt, k, sampling=s).prepared
    return continue_spec(eng, sess, prep, n, k, s), sess


def direct_mtp_k(eng, seq, L):
    """MTP K rows [0:L] from one direct mtp_rows over seq[:L] (token p with trunk hidden p - 1)."""
    s = eng.new_session(L + 4)
    _, h = eng.prime_chunk(s, seq[:L])
    phs = np.zeros((L, eng.cfg.hidden_size), np.float32)
    phs[1:] = eng.B.download(h)[:-1]
    fresh = eng.new_session(L + 4)
    eng.mtp_rows(fresh, seq[:L], phs, 0)
    return eng.B.download(fresh.cache.mtp_k)[:L]


# ------------------------------------------------------------------------------------------------
# greedy: speculative == plain
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp", PROMPT_LENS)
def test_greedy_spec_equals_plain(eng, tp):
    prompt = prompt_of(tp)
    ref, digests = plain_ref(eng, prompt)
    for k in (1, 2, 3, 4):
        res, sess = spec_run(eng, prompt, N, k)
        assert res.tokens == ref[:N], f"K={k}"
        assert sess.committed == res.tokens
        assert trunk_digest(sess.cache) == digests[sess.cache.pos], f"K={k}"
        m = res.metrics
        assert m["drafts"] >= 1 and sum(m["histogram"]) == m["drafts"]
        assert m["draft_tokens"] == m["drafts"] * k


def _forcing_draft(eng, monkeypatch, prompt, plain, k, pattern):
    """Wrap engine.mtp_draft: run the real one (the head's cache bookkeeping still happens), then
    return the true plain-greedy future for the first i drafts and wrong tokens after, with i
    taken from ``pattern`` round by round. Returns the list of forced i."""
    real = eng.mtp_draft
    forced = []

    def draft(sess, tokens, hiddens, chain):
        real_drafts = real(sess, tokens, hiddens, chain)
        assert len(real_drafts) == chain
        m = sess.cache.pos - len(prompt)  # the pending token is plain[m]
        true = plain[m + 1:m + 1 + chain]
        assert len(true) == chain, "plain reference too short"
        i = min(pattern[len(forced) % len(pattern)], chain)
        forced.append(i)
        return true[:i] + [(t + 1) % V for t in true[i:]]

    monkeypatch.setattr(eng, "mtp_draft", draft)
    return forced


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("tp", PROMPT_LENS)
def test_forced_acceptance_greedy(eng, monkeypatch, k, tp):
    prompt = prompt_of(tp)
    n = 24
    plain, digests = plain_ref(eng, prompt, n + k + 8)
    pattern = [k, 0, 1, k, k - 1, 2, 0, k]
    forced = _forcing_draft(eng, monkeypatch, prompt, plain, k, pattern)
    res, sess = spec_run(eng, prompt, n, k)
    assert res.tokens == plain[:n]
    assert sum(forced) > 0 and len(forced) < n - 2  # acceptance really happened
    # the trunk state after generation is the plain run's at the same position
    assert trunk_digest(sess.cache) == digests[sess.cache.pos]
    assert sess.cache.pos >= tp + n - 1
    # metrics are exactly what was forced
    m = res.metrics
    assert m == acceptance_metrics(k, forced)
    assert m["drafts"] == len(forced) and m["draft_tokens"] == len(forced) * k
    assert m["accepted"] == sum(forced)
    assert m["histogram"] == [forced.count(j) for j in range(k + 1)]
    assert m["per_position"] == pytest.approx([sum(f > i for f in forced) / len(forced) for i in range(k)])
    assert m["mean_acceptance_length"] == pytest.approx(1 + sum(forced) / len(forced))
    # the head's cache holds the committed rows, as one direct pass over them would write it
    L = sess.cache.mtp_len
    assert len(prompt) < L <= sess.cache.pos
    seq = prompt + plain
    assert np.array_equal(bits(eng.B.download(sess.cache.mtp_k)[:L]), bits(direct_mtp_k(eng, seq, L)))


def test_acceptance_metrics_definitions():
    m = acceptance_metrics(3, [0, 3, 1, 3])
    assert m == {"drafts": 4, "draft_tokens": 12, "accepted": 7, "mean_acceptance_length": 2.75,
                 "per_position": [0.75, 0.5, 0.5], "histogram": [1, 1, 0, 2]}
    assert acceptance_metrics(2, [])["mean_acceptance_length"] == 1.0


# ------------------------------------------------------------------------------------------------
# rollback
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_rollback_keeps_exact_prefix(eng, k):
    prompt = prompt_of(70)
    plain, _ = plain_ref(eng, prompt)
    base = eng.new_session(120)
    eng.prime_chunk(base, prompt)
    snap = base.cache.snapshot()
    rows = plain[:k + 1]
    # sequential reference: decode the rows one by one
    seq = eng.new_session(120)
    seq.cache.restore(snap)
    seq_logits, seq_digest = [], [trunk_digest(seq.cache)]
    for t in rows + [plain[k + 1]]:
        lg, _ = eng.decode_step(seq, t)
        seq_logits.append(lg)
        seq_digest.append(trunk_digest(seq.cache))
    for keep in range(1, k + 2):
        s = eng.new_session(120)
        s.cache.restore(snap)
        logits, hidden = eng.target_step(s, rows, capture=True)
        for i in range(k + 1):  # verify rows are bitwise the decode steps
            assert np.array_equal(bits(logits[i]), bits(seq_logits[i]))
        eng.rollback(s, keep)
        assert s.cache.pos == 70 + keep
        assert trunk_digest(s.cache) == seq_digest[keep]
        # decoding on from the rolled-back state continues exactly
        lg, _ = eng.decode_step(s, plain[keep])
        assert np.array_equal(bits(lg), bits(seq_logits[keep]))
        with pytest.raises(PrimewalkError, match="rollback"):
            eng.rollback(s, keep)  # no captured step left


def test_rollback_reuses_its_copy_plans(eng):
    """One session, many rounds: a rollback's copies are resolved once per keep and capture
    buffers (``Engine._rollback_plan``) and reused; every round -- the same keep again, another
    keep, after a snapshot restore, after the capture buffers changed with the row count --
    leaves the state of decoding its kept rows one by one."""
    prompt = prompt_of(40)
    plain, _ = plain_ref(eng, prompt)
    s = eng.new_session(120)
    eng.prime_chunk(s, prompt)
    snap = s.cache.snapshot()
    seq = eng.new_session(120)
    seq.cache.restore(snap)
    want = [trunk_digest(seq.cache)]
    for t in plain[:6]:
        eng.decode_step(seq, t)
        want.append(trunk_digest(seq.cache))
    plans = []
    for rows, keep in ((4, 2), (4, 2), (4, 1), (4, 3), (3, 1), (4, 2)):
        s.cache.restore(snap)
        eng.target_step(s, plain[:rows], capture=True)
        eng.rollback(s, keep)
        assert s.cache.pos == 40 + keep and trunk_digest(s.cache) == want[keep], (rows, keep)
        plans.append(s.verify_caps["plans"][keep][2])
    assert plans[1] is plans[0]  # the same keep on the same buffers: the same plan
    assert plans[5] is not plans[0]  # the buffers were made anew for 3 rows, then for 4 again


def test_copy_plan_refuses_mismatched_arrays(eng):
    with pytest.raises(PrimewalkError, match="copy_plan"):
        eng.B.copy_plan([(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))])
    with pytest.raises(PrimewalkError, match="copy_plan"):
        eng.B.copy_plan([(np.zeros(4, np.float32), np.zeros(4, np.float64))])
    dst, src = np.zeros(4, np.float32), np.arange(4, dtype=np.float32)
    eng.B.run_copies(eng.B.copy_plan([(dst, src)]))
    assert np.array_equal(dst, src)


def test_step_last_hidden_row_is_its_own_copy(eng):
    """A step's last hidden row (``cache.last_h``, what the next MTP fill pairs with) and an MTP
    pass's ``last_hidden``: the last row of the step's hidden rows, bit for bit, in memory of
    its own (the next step leaves it as it was)."""
    s = eng.new_session(60)
    eng.prime_chunk(s, prompt_of(5))
    for rows in ([7], [1, 2, 3]):
        _, hidden = eng.target_step(s, rows, capture=True)
        kept = s.cache.last_h
        last = eng.host(kept)
        assert last.shape == (1, eng.cfg.hidden_size)
        assert np.array_equal(bits(last), bits(eng.host(hidden)[-1:]))
        eng.target_step(s, [9, 9])  # overwrites the engine's buffers, not the row kept
        assert np.array_equal(bits(eng.host(kept)), bits(last))
        assert not np.array_equal(bits(eng.host(s.cache.last_h)), bits(last))
    h = np.random.default_rng(3).standard_normal((3, eng.cfg.hidden_size)).astype(np.float32)
    fresh = [eng.new_session(60) for _ in range(2)]
    _, all_rows = eng.mtp_rows(fresh[0], [4, 5, 6], h, 0)
    _, last_row = eng.mtp_rows(fresh[1], [4, 5, 6], h, 0, last_hidden=True)
    assert last_row.shape == (1, eng.cfg.hidden_size)
    assert np.array_equal(bits(eng.host(last_row)), bits(eng.host(all_rows)[-1:]))


def test_rollback_rejects_bad_keep(eng):
    s = eng.new_session(40)
    eng.prime_chunk(s, prompt_of(5))
    with pytest.raises(PrimewalkError, match="without a captured"):
        eng.rollback(s, 1)
    eng.target_step(s, [1, 2, 3], capture=True)
    for keep in (0, 4):
        with pytest.raises(PrimewalkError, match="not possible"):
            eng.rollback(s, keep)
    eng.rollback(s, 3)
    assert s.cache.pos == 8


# ------------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------------
def test_sampled_generation_is_reproducible(eng):
    prompt = prompt_of(70)
    s1, s1b, s2 = Sampling(1.0, 7), Sampling(1.0, 7), Sampling(1.0, 8)
    a, _ = spec_run(eng, prompt, N, 2, s1)
    b, _ = spec_run(eng, prompt, N, 2, s1b)
    c, _ = spec_run(eng, prompt, N, 2, s2)
    assert a.tokens == b.tokens and a.metrics == b.metrics
    assert a.tokens != c.tokens
    assert all(0 <= t < V for t in a.tokens + c.tokens)
    pa, _ = generate(eng, prompt, N, 2, s1, speculative=False)
    pb, _ = generate(eng, prompt, N, 2, s1b, speculative=False)
    pc, _ = generate(eng, prompt, N, 2, s2, speculative=False)
    assert pa.tokens == pb.tokens and pa.tokens != pc.tokens
    # another session id draws other numbers
    sess = eng.new_session(len(prompt) + N + 8, session_id=5)
    prep = run_prime(eng, sess, prompt, 2, sampling=s1).prepared
    other = continue_plain(eng, sess, prep, N, s1)
    assert other.tokens != pa.tokens


def test_counter_uniform_and_draw_distribution():
    us = np.array([smp.counter_uniform(3, 0, p) for p in range(4000)])
    assert us.min() >= 0.0 and us.max() < 1.0
    assert abs(us.mean() - 0.5) < 0.02 and len(set(us.tolist())) > 3990
    assert smp.counter_uniform(3, 0, 5) == smp.counter_uniform(3, 0, 5)
    assert smp.counter_uniform(3, 0, 5) != smp.counter_uniform(3, 1, 5)
    assert smp.counter_uniform(3, 0, 5, 0) != smp.counter_uniform(3, 0, 5, STREAM_ACCEPT)
    logits = np.array([2.0, 0.5, -1.0, 1.5, 0.0, -3.0, 1.0, 0.2], np.float32)
    p = smp.probs(logits, 0.9)
    assert p.dtype == np.float32 and abs(float(p.sum()) - 1.0) < 1e-5
    n = 4000
    draws = np.array([smp.draw(p, smp.counter_uniform(11, 0, i)) for i in range(n)])
    freq = np.bincount(draws, minlength=len(p)) / n
    assert np.max(np.abs(freq - p)) < 0.03
    # draw is the inverse CDF
    assert smp.draw(p, 0.0) == 0 and smp.draw(p, 0.999999) == len(p) - 1
    assert smp.pick(logits, Sampling(), 0, 0) == 0  # greedy = argmax


def test_speculative_sampling_preserves_distribution():
    """With a point-mass draft, accept-with-p(d)-else-resample-without-d emits tokens ~ p."""
    logits = np.array([[1.0, 0.3, -0.5, 0.8, 0.0], [0.0] * 5], np.float32)
    s = Sampling(1.0, 21)
    p = smp.probs(logits[0], 1.0)
    n = 3000
    for d in (0, 2):
        first, acc = [], 0
        for pos in range(n):
            j, bonus = _verify(logits, [d], s, 0, pos)
            acc += j
            first.append(d if j == 1 else bonus)
        freq = np.bincount(first, minlength=5) / n
        assert np.max(np.abs(freq - p)) < 0.04, (d, freq, p)
        assert abs(acc / n - float(p[d])) < 0.04


def test_speculative_sampling_with_forced_drafts(eng, monkeypatch):
    prompt = prompt_of(70)
    k, n = 3, 24
    s = Sampling(0.05, 3)  # nearly greedy: the true greedy future is usually accepted
    plain, _ = plain_ref(eng, prompt, n + k + 8)
    real = eng.mtp_draft

    def draft(sess, tokens, hiddens, chain):
        real(sess, tokens, hiddens, chain)
        m = sess.cache.pos - len(prompt)
        return plain[m + 1:m + 1 + chain]

    monkeypatch.setattr(eng, "mtp_draft", draft)
    a, sa = spec_run(eng, prompt, n, k, s)
    b, _ = spec_run(eng, prompt, n, k, s)
    assert a.tokens == b.tokens and a.metrics == b.metrics
    assert len(a.tokens) == n and all(isinstance(t, int) and 0 <= t < V for t in a.tokens)
    m = a.metrics
    assert sum(m["histogram"]) == m["drafts"] > 0
    assert m["accepted"] == sum(j * c for j, c in enumerate(m["histogram"])) > 0
    assert m["per_position"] == sorted(m["per_position"], reverse=True)
    assert len(prompt) < sa.cache.mtp_len <= sa.cache.pos


# ------------------------------------------------------------------------------------------------
# the context limit
# ------------------------------------------------------------------------------------------------
def test_mtp_draft_beyond_context_raises(eng):
    prompt = prompt_of(20)
    sess = eng.new_session(23)
    prep = run_prime(eng, sess, prompt, 4).prepared  # pos 21 (prompt + boundary), mtp_len 20
    c = sess.cache
    pending = int(np.argmax(prep.init_logits))
    fill_h = np.concatenate([prep.hiddens[-1:], eng.B.download(prep.init_h)], axis=0)
    before = (c.pos, c.mtp_len, c.digest())
    with pytest.raises(InputError, match="context limit 23") as ei:
        eng.mtp_draft(sess, [prep.boundary, pending], fill_h, 3)  # 21 + 3 > 23
    assert "\n" not in str(ei.value)
    assert (c.pos, c.mtp_len, c.digest()) == before  # nothing done
    drafts = eng.mtp_draft(sess, [prep.boundary, pending], fill_h, 2)  # 21 + 2 fits
    assert len(drafts) == 2 and c.mtp_len == 22
    with pytest.raises(PrimewalkError, match="out of step"):
        eng.mtp_draft(sess, [pending], fill_h[:1], 1)


@pytest.mark.parametrize("speculative", [True, False])
def test_generation_stops_at_cache_capacity(eng, speculative):
    prompt = prompt_of(5)
    with pytest.raises(InputError, match="capacity"):
        generate(eng, prompt, 40, 2, speculative=speculative, max_ctx=20)
    # exactly enough room: no error (the last token is never processed)
    res, _ = generate(eng, prompt, 16, 2, speculative=speculative, max_ctx=5 + 16)
    assert res.tokens == plain_ref(eng, prompt)[0][:16]
