"""The MTP prime walker on the embedded tiny model (CPU backend): tapes, yielded vs drained runs,
errors, boundary captures, the turn checkpoint and the MTP fill — all bitwise."""

import numpy as np
import pytest

from harness.engine.digests import capture_digest
from harness.engine.model import Engine
from harness.engine.weights import load_checkpoint, save_checkpoint
from harness.errors import InputError, PrimewalkError
from harness.models import default_model_path
from harness.walk.check import Peer
from harness.walk.mtp_walker import BoundaryCapture, MtpPrimeWalker, PreparedPrime, run_prime
from harness.walk.protocol import PrimeChunk, PrimeError, advance_prime
from harness.walk.schedule import PRIME_MIN_T

V = 260


@pytest.fixture(scope="module")
def ckpt():
    return load_checkpoint(default_model_path())


@pytest.fixture(scope="module")
def eng(ckpt):
    return Engine(ckpt, "cpu")


def prompt_of(n, seed=0):
    return np.random.default_rng(seed).integers(0, V, n).tolist()


def bits(a):
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def same_bits(a, b):
    a, b = bits(a), bits(b)
    return a.shape == b.shape and np.array_equal(a, b)


def drain(walker):
    """Advance one chunk at a time, checking next_chunk peeks and each advance consumes one."""
    tape = []
    while walker.remaining_chunks() > 0:
        before = walker.remaining_chunks()
        peek = walker.next_chunk()
        assert walker.next_chunk() == peek  # peeking does not move anything
        assert walker.remaining_chunks() == before
        got = walker.advance_chunk()
        assert got == peek
        assert walker.remaining_chunks() == before - 1
        tape.append(tuple(got))
    assert walker.next_chunk() is None
    return tape


def session_state(sess):
    """Everything a failed walker construction must leave untouched."""
    return (sess.cache.digest(), sess.cache.pos, sess.cache.mtp_len,
            len(sess.boundary_captures), id(sess.turn_ckpt), id(sess.prime_ready))


def oracle_capture(eng, prompt, b):
    """Independent oracle: prime prompt[:b] in one batch on a fresh session and snapshot it."""
    s = eng.new_session(len(prompt) + 8)
    logits, h = eng.prime_chunk(s, prompt[:b])
    return BoundaryCapture(s.cache.snapshot(), b, np.array(logits, np.float32),
                           eng.B.download(h)[b - 1].copy())


# ------------------------------------------------------------------------------------------------
# tapes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp,kw", [
    (1, {}),
    (40, {}),
    (64, {}),  # exactly fill_chunk rows is still short
    (60, {"prime_split": 32}),  # split trunk (batched + tokenwise), still one advance
    (50, {"chunk_rows": 16}),
    (100, {"fill_chunk": 128}),
])
def test_short_prompt_is_one_advance(eng, tp, kw):
    prompt = prompt_of(tp, tp)
    sess = eng.new_session(tp + 8)
    w = MtpPrimeWalker(eng, sess, prompt, 2, **kw)
    assert w.short
    assert w.tape() == [("mtp-trunk", tp)]
    assert w.remaining_chunks() == 1
    assert w.next_chunk() == PrimeChunk("mtp-trunk", tp)
    assert sess.cache.pos == 0  # nothing runs at creation
    assert w.advance_chunk() == PrimeChunk("mtp-trunk", tp)
    # trunk + setup (target step on the boundary token) + fill, all in that one advance
    assert w.remaining_chunks() == 0 and w.next_chunk() is None
    assert sess.cache.pos == tp + 1 and sess.cache.mtp_len == tp
    assert sess.prime_ready is None
    with pytest.raises(PrimeError):
        w.advance_chunk()
    prep = w.finish()
    assert isinstance(prep, PreparedPrime) and sess.prime_ready is prep
    assert prep.prompt == prompt and prep.base == 0 and prep.k == 2
    assert prep.boundary == int(np.argmax(prep.logits))
    assert prep.hiddens.shape == (tp, eng.cfg.hidden_size)
    with pytest.raises(PrimeError, match="already finished"):
        w.finish()


@pytest.mark.parametrize("tp,kw,ckpt_at,want", [
    (130, {"prime_split": 64}, None,
     [("mtp-trunk", 64), ("mtp-trunk", 66), ("mtp-draft-fill", 64), ("mtp-draft-fill", 64), ("mtp-draft-fill", 2)]),
    (130, {"prime_split": 64, "chunk_rows": 40}, None,
     [("mtp-trunk", 40), ("mtp-trunk", 24), ("mtp-trunk", 40), ("mtp-trunk", 26),
      ("mtp-draft-fill", 64), ("mtp-draft-fill", 64), ("mtp-draft-fill", 2)]),
    # split and checkpoint: three segments; the 12-row tail runs token by token (decode steps)
    (140, {"prime_split": 64, "fill_chunk": 50}, 128,
     [("mtp-trunk", 64), ("mtp-trunk", 64), ("mtp-trunk", 12),
      ("mtp-draft-fill", 50), ("mtp-draft-fill", 50), ("mtp-draft-fill", 40)]),
    # unsegmented, cut by chunk_rows
    (100, {"chunk_rows": 32, "fill_chunk": 30}, None,
     [("mtp-trunk", 32), ("mtp-trunk", 32), ("mtp-trunk", 32), ("mtp-trunk", 4),
      ("mtp-draft-fill", 30), ("mtp-draft-fill", 30), ("mtp-draft-fill", 30), ("mtp-draft-fill", 10)]),
])
def test_segmented_tapes_one_chunk_per_advance(eng, monkeypatch, tp, kw, ckpt_at, want):
    calls = {"prime_chunk": [], "decode_step": 0, "target_step": []}
    real_pc, real_ds, real_ts = eng.prime_chunk, eng.decode_step, eng.target_step

    def pc(sess, ids):
        calls["prime_chunk"].append(len(ids))
        return real_pc(sess, ids)

    def ds(sess, tok):
        calls["decode_step"] += 1
        return real_ds(sess, tok)

    def ts(sess, ids, capture=False):
        calls["target_step"].append(len(ids))
        return real_ts(sess, ids, capture)

    monkeypatch.setattr(eng, "prime_chunk", pc)
    monkeypatch.setattr(eng, "decode_step", ds)
    monkeypatch.setattr(eng, "target_step", ts)
    prompt = prompt_of(tp, 3)
    sess = eng.new_session(tp + 8)
    w = MtpPrimeWalker(eng, sess, prompt, 3, ckpt_at=ckpt_at, **kw)
    assert not w.short
    assert w.tape() == want
    n_trunk = sum(1 for ph, _ in want if ph == "mtp-trunk")
    tape, fill_rows = [], []
    while w.remaining_chunks():
        peek = w.next_chunk()
        got = w.advance_chunk()
        assert got == peek
        tape.append(tuple(got))
        if len(tape) < n_trunk:  # trunk only, no setup yet
            assert sess.cache.pos == sum(r for _, r in tape) and w.prepared is None
        elif len(tape) == n_trunk:  # the last trunk chunk also runs the setup
            assert sess.cache.pos == tp + 1 and w.prepared is not None and sess.cache.mtp_len == 0
        else:
            fill_rows.append(got.rows)
            assert sess.cache.mtp_len == sum(fill_rows)
    assert tape == want
    assert sess.cache.mtp_len == tp
    batched = [r for ph, r in want if ph == "mtp-trunk"]
    if ckpt_at is not None:
        batched = batched[:-1]  # the short tail ran token by token
        assert calls["decode_step"] == tp - ckpt_at
    else:
        assert calls["decode_step"] == 0
    assert calls["prime_chunk"] == batched
    assert calls["target_step"] == [1]  # the setup's step on the boundary token
    w.finish()


def test_tokenwise_schedules(eng, monkeypatch):
    counts = {"decode": 0, "target": 0, "prime": 0}

    def counting(key, real):
        def wrapped(*args, **kw):
            counts[key] += 1
            return real(*args, **kw)
        return wrapped

    monkeypatch.setattr(eng, "prime_chunk", counting("prime", eng.prime_chunk))
    monkeypatch.setattr(eng, "decode_step", counting("decode", eng.decode_step))
    monkeypatch.setattr(eng, "target_step", counting("target", eng.target_step))
    prompt = prompt_of(130, 5)
    ref = run_prime(eng, eng.new_session(200), prompt, 2).prepared

    # unsegmented tokenwise: the whole prompt as target steps, one chunk
    sess = eng.new_session(200)
    counts.update(decode=0, target=0, prime=0)
    w = MtpPrimeWalker(eng, sess, prompt, 2, tokenwise=True)
    assert w.tape() == [("mtp-trunk", 130), ("mtp-draft-fill", 64), ("mtp-draft-fill", 64), ("mtp-draft-fill", 2)]
    drain(w)
    a = w.finish()
    assert counts == {"decode": 0, "target": 131, "prime": 0}

    # segmented tokenwise: the first segment batched, the last token by token (decode steps)
    sess2 = eng.new_session(200)
    counts.update(decode=0, target=0, prime=0)
    w = MtpPrimeWalker(eng, sess2, prompt, 2, prime_split=64, tokenwise=True)
    assert w.tape()[:2] == [("mtp-trunk", 64), ("mtp-trunk", 66)]
    drain(w)
    b = w.finish()
    assert counts == {"decode": 66, "target": 1, "prime": 1}

    # every schedule gives the same bits
    for p in (a, b):
        assert same_bits(p.logits, ref.logits) and same_bits(p.init_logits, ref.init_logits)
        assert same_bits(p.hiddens, ref.hiddens) and p.boundary == ref.boundary
    assert sess.cache.digest() == sess2.cache.digest()


# ------------------------------------------------------------------------------------------------
# yielded vs drained
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp,kw,cap,ckpt_at", [
    (130, {"prime_split": 64}, 64, 64),
    (300, {"prime_split": 128, "chunk_rows": 100, "fill_chunk": 90}, 128, 256),
    (200, {"chunk_rows": 48, "fill_chunk": 200}, None, None),  # short (one advance)
    (150, {"prime_split": 64, "tokenwise": True, "fill_chunk": 40}, 64, None),
    (257, {}, 257, None),  # capture at the end of the prompt
])
def test_yielded_equals_drained(eng, tp, kw, cap, ckpt_at):
    prompt = prompt_of(tp, tp)
    out = []
    for yielded in (False, True):
        sess = eng.new_session(tp + 16)
        peer = Peer(eng) if yielded else None
        peer_pos0 = peer.sess.cache.pos if yielded else 0
        run = run_prime(eng, sess, prompt, 2, yield_hook=peer.step if yielded else None,
                        capture_at=cap, ckpt_at=ckpt_at, **kw)
        if yielded:
            assert run.yields == len(run.tape) - 1
            assert peer.sess.cache.pos == peer_pos0 + run.yields  # the peer really decoded in between
        else:
            assert run.yields == 0
        out.append((run, sess))
    (ra, sa), (rb, sb) = out
    assert ra.tape == rb.tape
    pa, pb = ra.prepared, rb.prepared
    assert same_bits(pa.logits, pb.logits) and same_bits(pa.init_logits, pb.init_logits)
    assert same_bits(pa.hiddens, pb.hiddens) and pa.boundary == pb.boundary
    assert same_bits(eng.B.download(pa.init_h), eng.B.download(pb.init_h))
    assert capture_digest(sa.boundary_captures) == capture_digest(sb.boundary_captures)
    assert len(sa.boundary_captures) == (0 if cap is None else 1) + (ckpt_at is not None and ckpt_at != cap)
    assert sa.cache.digest() == sb.cache.digest()
    assert sa.turn_ckpt.snap.digest() == sb.turn_ckpt.snap.digest()


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trunk_only_engine(ckpt, tmp_path_factory):
    folder = tmp_path_factory.mktemp("trunk_only")
    cfg = ckpt.config
    tensors = {k: v for k, v in ckpt.tensors.items() if not k.startswith("mtp.")}
    save_checkpoint(str(folder), cfg, tensors)
    ck = load_checkpoint(str(folder))
    assert not ck.has_mtp
    return Engine(ck, "cpu")


def _primed_session(eng):
    sess = eng.new_session(100)
    run_prime(eng, sess, prompt_of(10, 9), 1)
    return sess


@pytest.mark.parametrize("case,err,match", [
    ("empty", InputError, "nonempty prompt"),
    ("k0", InputError, "K > 0"),
    ("prepared", InputError, "already prepared"),
    ("capacity", InputError, "capacity"),
    ("split", InputError, "PRIME_MIN_T"),
    ("bad-id", InputError, "out of range"),
])
def test_walker_errors_leave_session_untouched(eng, case, err, match):
    prompt, k, kw = prompt_of(130, 1), 2, {}
    sess = eng.new_session(200)
    if case == "empty":
        prompt = []
    elif case == "k0":
        k = 0
    elif case == "prepared":
        sess = _primed_session(eng)
    elif case == "capacity":
        sess = eng.new_session(130)  # the boundary token needs one more position
    elif case == "split":
        kw = {"prime_split": PRIME_MIN_T - 1}
    elif case == "bad-id":
        prompt[7] = V
    before = session_state(sess)
    with pytest.raises(err, match=match) as ei:
        MtpPrimeWalker(eng, sess, prompt, k, capture_at=100, ckpt_at=100, **kw)
    assert "\n" not in str(ei.value)
    assert session_state(sess) == before


def test_capacity_edge_fits(eng):
    sess = eng.new_session(131)
    run_prime(eng, sess, prompt_of(130, 1), 1)
    assert sess.cache.pos == 131


def test_split_below_min_t_allowed_after_an_earlier_checkpoint(eng):
    # the split is not the first stop: the segment before it is the checkpoint's, which may be short
    sess = eng.new_session(200)
    w = MtpPrimeWalker(eng, sess, prompt_of(130, 1), 1, prime_split=20, ckpt_at=8)
    assert w.tape()[:3] == [("mtp-trunk", 8), ("mtp-trunk", 12), ("mtp-trunk", 110)]


def test_model_without_mtp_head(trunk_only_engine):
    eng = trunk_only_engine
    sess = eng.new_session(100)
    before = session_state(sess)
    with pytest.raises(PrimewalkError, match="no MTP head"):
        MtpPrimeWalker(eng, sess, prompt_of(40), 1)
    with pytest.raises(PrimewalkError, match="no MTP head"):
        run_prime(eng, sess, prompt_of(40), 1)
    assert session_state(sess) == before


@pytest.mark.parametrize("tp,kw", [(130, {"prime_split": 64}), (60, {"chunk_rows": 32})])
def test_failing_chunk_poisons_walker(eng, monkeypatch, tp, kw):
    real = eng.prime_chunk
    n = {"calls": 0}

    def flaky(sess, ids):
        n["calls"] += 1
        if n["calls"] == 2:
            raise RuntimeError("device fault in chunk 2")
        return real(sess, ids)

    monkeypatch.setattr(eng, "prime_chunk", flaky)
    sess = eng.new_session(tp + 8)
    w = MtpPrimeWalker(eng, sess, prompt_of(tp, 2), 2, **kw)
    if not w.short:
        w.advance_chunk()
    remaining = w.remaining_chunks()
    with pytest.raises(RuntimeError, match="device fault"):
        w.advance_chunk()
    assert w.remaining_chunks() == remaining or w.short
    with pytest.raises(PrimeError, match="poisoned.*device fault"):
        w.advance_chunk()
    with pytest.raises(PrimeError, match="poisoned"):
        w.finish()
    with pytest.raises(PrimeError, match="poisoned"):
        advance_prime(w, True)
    assert sess.prime_ready is None
    # the drivers propagate the same failure
    n["calls"] = 0
    with pytest.raises(RuntimeError, match="device fault"):
        run_prime(eng, eng.new_session(tp + 8), prompt_of(tp, 2), 2, **kw)


def test_finish_rejects_incomplete_prime(eng):
    sess = eng.new_session(200)
    w = MtpPrimeWalker(eng, sess, prompt_of(130, 4), 1, prime_split=64)
    w.advance_chunk()
    with pytest.raises(PrimeError, match="incomplete"):
        w.finish()
    assert sess.prime_ready is None
    drain(w)  # still usable: finish() rejecting early is not a chunk failure
    assert w.finish() is sess.prime_ready


# ------------------------------------------------------------------------------------------------
# boundary captures and the turn checkpoint
# ------------------------------------------------------------------------------------------------
def _check_capture(got, want):
    assert got.pos == want.pos
    assert same_bits(got.logits, want.logits)
    assert same_bits(got.last_h, want.last_h)
    assert got.snap.digest() == want.snap.digest()


@pytest.mark.parametrize("tp,b,kw", [
    (200, 96, {"prime_split": 96, "chunk_rows": 40}),
    (130, 64, {"prime_split": 64}),
    (130, 98, {"prime_split": 98, "tokenwise": True}),
    (150, 100, {"prime_split": 100, "chunk_rows": 33, "fill_chunk": 150}),  # short
])
def test_boundary_capture_matches_oracle(eng, tp, b, kw):
    prompt = prompt_of(tp, b)
    sess = eng.new_session(tp + 8)
    run_prime(eng, sess, prompt, 2, capture_at=b, **kw)
    want = oracle_capture(eng, prompt, b)
    assert len(sess.boundary_captures) == 1
    _check_capture(sess.boundary_captures[0], want)
    assert capture_digest(sess.boundary_captures) == capture_digest([want])
    # no checkpoint asked for: the turn checkpoint is at the end of the prompt
    end = oracle_capture(eng, prompt, tp)
    assert sess.turn_ckpt.pos == tp
    assert sess.turn_ckpt.snap.digest() == end.snap.digest()
    assert same_bits(sess.turn_ckpt.last_h, end.last_h)


def test_checkpoint_and_capture_at_different_rows(eng):
    tp, b1, b2 = 220, 64, 160
    prompt = prompt_of(tp, 11)
    sess = eng.new_session(tp + 8)
    run = run_prime(eng, sess, prompt, 3, prime_split=b1, chunk_rows=50, capture_at=b1, ckpt_at=b2)
    assert [r for ph, r in run.tape if ph == "mtp-trunk"] == [50, 14, 50, 46, 50, 10]
    w1, w2 = oracle_capture(eng, prompt, b1), oracle_capture(eng, prompt, b2)
    # at base 0 the checkpoint row is a capture point too
    assert [c.pos for c in sess.boundary_captures] == [b1, b2]
    _check_capture(sess.boundary_captures[0], w1)
    _check_capture(sess.boundary_captures[1], w2)
    assert sess.turn_ckpt.pos == b2
    assert sess.turn_ckpt.snap.digest() == w2.snap.digest()
    assert same_bits(sess.turn_ckpt.last_h, w2.last_h)


def test_checkpoint_alone_and_capture_at_prompt_end(eng):
    tp = 140
    prompt = prompt_of(tp, 12)
    sess = eng.new_session(tp + 8)
    run = run_prime(eng, sess, prompt, 1, ckpt_at=70)  # no split: the checkpoint alone segments the prime
    assert run.tape[:2] == [("mtp-trunk", 70), ("mtp-trunk", 70)]
    want = oracle_capture(eng, prompt, 70)
    assert len(sess.boundary_captures) == 1
    _check_capture(sess.boundary_captures[0], want)
    assert sess.turn_ckpt.pos == 70 and sess.turn_ckpt.snap.digest() == want.snap.digest()

    sess = eng.new_session(tp + 8)
    run_prime(eng, sess, prompt, 1, capture_at=tp)
    want = oracle_capture(eng, prompt, tp)
    assert len(sess.boundary_captures) == 1
    _check_capture(sess.boundary_captures[0], want)
    # restoring the capture and replaying the boundary step reproduces the prepared init logits
    s2 = eng.new_session(tp + 8)
    s2.cache.restore(sess.boundary_captures[0].snap)
    lg, _ = eng.target_step(s2, [sess.prime_ready.boundary])
    assert same_bits(lg[0], sess.prime_ready.init_logits)


# ------------------------------------------------------------------------------------------------
# MTP fill
# ------------------------------------------------------------------------------------------------
def _direct_mtp_kv(eng, prompt, prev_h=None, prefix=()):
    """MTP K/V written by one direct mtp_rows over the prompt: row p pairs tokens[p] with the
    trunk hidden of p - 1 (prev_h, or zeros, for p = 0)."""
    T, H = len(prompt), eng.cfg.hidden_size
    s = eng.new_session(len(prefix) + T + 8)
    if prefix:
        eng.prime_chunk(s, list(prefix))
    _, h = eng.prime_chunk(s, prompt)
    h = eng.B.download(h)
    phs = np.zeros((T, H), np.float32)
    if prev_h is not None:
        phs[0] = prev_h
    phs[1:] = h[:-1]
    fresh = eng.new_session(len(prefix) + T + 8)
    eng.mtp_rows(fresh, prompt, phs, len(prefix))
    n = len(prefix) + T
    return eng.B.download(fresh.cache.mtp_k)[:n], eng.B.download(fresh.cache.mtp_v)[:n]


@pytest.mark.parametrize("fill_chunk", [7, 64, 130])
@pytest.mark.parametrize("split", [None, 64])
def test_mtp_fill_matches_direct_rows(eng, fill_chunk, split):
    T = 130
    prompt = prompt_of(T, 21)
    sess = eng.new_session(T + 8)
    run = run_prime(eng, sess, prompt, 2, fill_chunk=fill_chunk, prime_split=split)
    fills = [r for ph, r in run.tape if ph == "mtp-draft-fill"]
    if fill_chunk >= T:
        assert run.tape == [("mtp-trunk", T)]
    else:
        assert fills == [min(fill_chunk, T - s) for s in range(0, T, fill_chunk)]
    assert sess.cache.mtp_len == T
    k, v = _direct_mtp_kv(eng, prompt)
    assert same_bits(eng.B.download(sess.cache.mtp_k)[:T], k)
    assert same_bits(eng.B.download(sess.cache.mtp_v)[:T], v)
    assert not np.any(eng.B.download(sess.cache.mtp_k)[T:])  # nothing beyond the prompt


def test_mtp_fill_after_earlier_rows_uses_last_hidden(eng):
    pre, prompt = prompt_of(40, 30), prompt_of(70, 31)
    sess = eng.new_session(120)
    _, h = eng.prime_chunk(sess, pre)
    prev = eng.B.download(h)[-1].copy()
    run = run_prime(eng, sess, prompt, 1, fill_chunk=16)
    assert run.prepared.base == 40 and sess.cache.mtp_len == 110
    k, v = _direct_mtp_kv(eng, prompt, prev_h=prev, prefix=pre)
    assert same_bits(eng.B.download(sess.cache.mtp_k)[40:110], k[40:110])
    assert same_bits(eng.B.download(sess.cache.mtp_v)[40:110], v[40:110])
