"""Schedule invariance of the exact mode on the CPU backend, bit for bit (DESIGN.md §3–4).

For prompts of lengths 1, 2, 3, 63, 64, 65, 130 and 257 on the tiny model (and a subset on a
random MoE config: 8 experts top-2 with a shared expert, odd head counts, conv kernel 3), every
schedule below gives the same float32 bits (compared as ``.view(np.uint32)``) as the
token-by-token run — last-row logits, per-row logits and hidden rows, and cache digests after
every chunk:

- one batched ``target_step`` / ``prime_chunk``;
- the prompt cut in two at every split point (a dense sample for 130 and 257: every 7th point,
  the points around 32, 64 and 128, and both ends), and in three at a sample of cut pairs;
- snapshot → restore into the same session after more work, and into a fresh session of the same
  engine (another ``max_ctx``) → continue;
- ``target_step(capture=True)`` of R rows then ``rollback(keep)`` for every keep in 1..R: the
  digest of a run of only the first ``keep`` rows, then the same decode logits and a batched
  continuation.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.engine.config import ModelConfig
from harness.engine.model import Engine
from harness.engine.weights import Checkpoint, load_checkpoint
from harness.models import default_model_path
from harness.synth import random_tensors

TINY_LENGTHS = [1, 2, 3, 63, 64, 65, 130, 257]
MOE_LENGTHS = [1, 3, 65, 130]
CASES = [("tiny", T) for T in TINY_LENGTHS] + [("moe", T) for T in MOE_LENGTHS]
IDS = [f"{m}-T{T}" for m, T in CASES]

MOE_CFG = dict(
    vocab_size=101, hidden_size=36, num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_num_key_heads=3, linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=8,
    linear_conv_kernel_dim=3, num_attention_heads=3, num_key_value_heads=1, head_dim=12,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    rms_norm_eps=1e-6, intermediate_size=44, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=12, shared_expert_intermediate_size=20, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[2], tie_word_embeddings=False,
)


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engines():
    tiny = Engine(load_checkpoint(default_model_path()), "cpu")
    cfg = ModelConfig.from_dict(MOE_CFG, "moe config")
    moe = Engine(Checkpoint(cfg, random_tensors(cfg, seed=11)), "cpu")
    assert moe.has_mtp and any(L["moe"] for L in moe.layers) and not all(L["moe"] for L in moe.layers)
    return {"tiny": tiny, "moe": moe}


_BASE: dict = {}


def baseline(eng, name, T):
    """Token by token: logits [T, V], hidden [T, H], digests after 0..T tokens, the prompt."""
    key = (name, T)
    if key not in _BASE:
        ids = np.random.default_rng(1000 + T + len(name)).integers(0, eng.cfg.vocab_size, T)
        sess = eng.new_session(T + 8)
        digs = [sess.cache.digest()]
        logits, hidden = [], []
        for t in ids:
            lg, h = eng.decode_step(sess, int(t))
            logits.append(lg)
            hidden.append(np.asarray(h)[0])
            digs.append(sess.cache.digest())
        _BASE[key] = dict(ids=ids, logits=np.stack(logits), hidden=np.stack(hidden), digs=digs)
    return _BASE[key]


def bits_equal(got, want, what):
    got, want = np.ascontiguousarray(got, np.float32), np.ascontiguousarray(want, np.float32)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = got.view(np.uint32) != want.view(np.uint32)
    if diff.any():
        first = np.argwhere(diff)[0]
        rel = float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))
        raise AssertionError(f"{what}: {int(diff.sum())} of {diff.size} values differ in their bits "
                             f"(first at {tuple(int(i) for i in first)}, max rel diff {rel:.3e})")


def split_points(T):
    if T <= 70:
        return list(range(1, T))
    pts = set(range(1, T, 7)) | {1, 2, T - 2, T - 1}
    for c in (32, 64, 128):
        pts |= {c - 1, c, c + 1}
    return sorted(p for p in pts if 1 <= p < T)


def cut_pairs(T):
    if T < 3:
        return []
    rng = np.random.default_rng(T)
    pairs = {(1, 2), (T - 2, T - 1), (1, T - 1), (T // 3, 2 * T // 3), (31, 33), (32, 64), (63, 65),
             (64, 128), (127, 129), (100, 200)}
    for _ in range(6):
        a, b = sorted(rng.choice(np.arange(1, T), 2, replace=False))
        pairs.add((int(a), int(b)))
    return sorted((a, b) for a, b in pairs if 1 <= a < b < T)


# ------------------------------------------------------------------------------------------------
# schedules
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model,T", CASES, ids=IDS)
def test_one_batch_equals_token_by_token(engines, model, T):
    eng = engines[model]
    b = baseline(eng, model, T)
    sess = eng.new_session(T)
    logits, hidden = eng.target_step(sess, b["ids"])
    bits_equal(logits, b["logits"], "target_step rows vs decode steps")
    bits_equal(hidden, b["hidden"], "target_step hidden rows vs decode steps")
    assert sess.cache.digest() == b["digs"][T], "digest after one target_step"
    sess = eng.new_session(T + 3)
    last, hidden = eng.prime_chunk(sess, b["ids"])
    bits_equal(last, b["logits"][-1], "prime_chunk last-row logits")
    bits_equal(hidden, b["hidden"], "prime_chunk hidden rows")
    assert sess.cache.digest() == b["digs"][T], "digest after one prime_chunk"
    # capture=True computes the same rows
    sess = eng.new_session(T)
    logits, _ = eng.target_step(sess, b["ids"], capture=True)
    bits_equal(logits, b["logits"], "target_step(capture=True) rows")
    assert sess.cache.digest() == b["digs"][T]


@pytest.mark.parametrize("model,T", CASES, ids=IDS)
def test_two_chunks_every_split(engines, model, T):
    eng = engines[model]
    b = baseline(eng, model, T)
    ids = b["ids"]
    for s in split_points(T):
        sess = eng.new_session(T)
        last, _ = eng.prime_chunk(sess, ids[:s])
        bits_equal(last, b["logits"][s - 1], f"split {s}: first chunk's last row")
        assert sess.cache.digest() == b["digs"][s], f"split {s}: digest after the first chunk"
        rows, hidden = eng.target_step(sess, ids[s:])
        bits_equal(rows, b["logits"][s:], f"split {s}: second chunk's rows")
        bits_equal(hidden, b["hidden"][s:], f"split {s}: second chunk's hidden rows")
        assert sess.cache.digest() == b["digs"][T], f"split {s}: final digest"


@pytest.mark.parametrize("model,T", CASES, ids=IDS)
def test_three_chunks(engines, model, T):
    eng = engines[model]
    b = baseline(eng, model, T)
    ids = b["ids"]
    pairs = cut_pairs(T)
    if T >= 3:
        assert pairs
    for a, c in pairs:
        sess = eng.new_session(T + 1)
        eng.prime_chunk(sess, ids[:a])
        last, _ = eng.prime_chunk(sess, ids[a:c])
        bits_equal(last, b["logits"][c - 1], f"cuts {a},{c}: middle chunk's last row")
        assert sess.cache.digest() == b["digs"][c], f"cuts {a},{c}: digest after two chunks"
        rows, _ = eng.target_step(sess, ids[c:])
        bits_equal(rows, b["logits"][c:], f"cuts {a},{c}: last chunk's rows")
        assert sess.cache.digest() == b["digs"][T], f"cuts {a},{c}: final digest"
    # a mixed schedule: decode, batch, decode, batch
    if T >= 4:
        sess = eng.new_session(T)
        eng.decode_step(sess, int(ids[0]))
        eng.prime_chunk(sess, ids[1:T // 2])
        lg, _ = eng.decode_step(sess, int(ids[T // 2]))
        bits_equal(lg, b["logits"][T // 2], "mixed schedule: decode after a batch")
        rows, _ = eng.target_step(sess, ids[T // 2 + 1:])
        bits_equal(rows, b["logits"][T // 2 + 1:], "mixed schedule: final batch")
        assert sess.cache.digest() == b["digs"][T]


# ------------------------------------------------------------------------------------------------
# snapshot / restore
# ------------------------------------------------------------------------------------------------
def _snap_points(T):
    pts = {T // 2} | ({63, 64, 65} if T > 66 else set())
    return sorted(p for p in pts if 1 <= p < T)


@pytest.mark.parametrize("model,T", [c for c in CASES if c[1] >= 2], ids=[i for c, i in zip(CASES, IDS) if c[1] >= 2])
def test_snapshot_restore(engines, model, T):
    eng = engines[model]
    b = baseline(eng, model, T)
    ids, V = b["ids"], eng.cfg.vocab_size
    junk = np.random.default_rng(T).integers(0, V, 5)
    for s in _snap_points(T):
        sess = eng.new_session(T + 8)
        eng.prime_chunk(sess, ids[:s])
        snap = sess.cache.snapshot()
        assert snap.digest() == sess.cache.digest() == b["digs"][s], f"s={s}: snapshot digest"
        # the unbroken run
        rows, _ = eng.target_step(sess, ids[s:])
        bits_equal(rows, b["logits"][s:], f"s={s}: unbroken continuation")
        assert snap.digest() == b["digs"][s], f"s={s}: the snapshot changed when the session went on"
        # more work on the same session (past the snapshot, into other K/V rows), then restore
        eng.target_step(sess, junk[:3])
        eng.decode_step(sess, int(junk[3]))
        assert sess.cache.pos == T + 4
        sess.cache.restore(snap)
        assert sess.cache.pos == s and sess.cache.digest() == b["digs"][s], f"s={s}: restored digest"
        rows, _ = eng.target_step(sess, ids[s:])
        bits_equal(rows, b["logits"][s:], f"s={s}: continuation after restore into the same session")
        assert sess.cache.digest() == b["digs"][T]
        # into a fresh session (another capacity) of the same engine, token by token this time
        fresh = eng.new_session(T + 40)
        fresh.cache.restore(snap)
        assert fresh.cache.digest() == b["digs"][s]
        for t in range(s, T):
            lg, _ = eng.decode_step(fresh, int(ids[t]))
            bits_equal(lg, b["logits"][t], f"s={s}: fresh session, decode at {t}")
        assert fresh.cache.digest() == b["digs"][T], f"s={s}: fresh session final digest"
        # a snapshot can be restored more than once
        again = eng.new_session(T)
        again.cache.restore(snap)
        rows, _ = eng.target_step(again, ids[s:])
        bits_equal(rows, b["logits"][s:], f"s={s}: second restore of the same snapshot")


# ------------------------------------------------------------------------------------------------
# rollback after a captured target step
# ------------------------------------------------------------------------------------------------
def _rollback_cases(T):
    """(prefix length s, verify rows R) with s + R < T (a next token exists to decode)."""
    if T < 2:
        return []
    out = {(0, min(4, T - 1))}
    if T > 4:
        out.add((T // 2, min(5, T - 1 - T // 2)))
    if T > 70:
        out |= {(61, 5), (64, 3)}  # the verify rows cross / start at an attention tile boundary
    return sorted((s, R) for s, R in out if R >= 1 and s + R < T)


@pytest.mark.parametrize("model,T", [c for c in CASES if c[1] >= 2], ids=[i for c, i in zip(CASES, IDS) if c[1] >= 2])
def test_rollback_equals_running_only_the_kept_rows(engines, model, T):
    eng = engines[model]
    b = baseline(eng, model, T)
    ids = b["ids"]
    cases = _rollback_cases(T)
    assert cases
    for s, R in cases:
        prefix = eng.new_session(T + 8)
        if s:
            eng.prime_chunk(prefix, ids[:s])
        snap = prefix.cache.snapshot()
        for keep in range(1, R + 1):
            sess = eng.new_session(T + 8)
            sess.cache.restore(snap)
            rows, _ = eng.target_step(sess, ids[s:s + R], capture=True)
            bits_equal(rows, b["logits"][s:s + R], f"s={s} R={R}: captured verify rows")
            eng.rollback(sess, keep)
            what = f"s={s} R={R} keep={keep}"
            assert sess.cache.pos == s + keep, what
            assert sess.cache.digest() == b["digs"][s + keep], f"{what}: digest after rollback"
            lg, _ = eng.decode_step(sess, int(ids[s + keep]))
            bits_equal(lg, b["logits"][s + keep], f"{what}: decode after rollback")
            assert sess.cache.digest() == b["digs"][s + keep + 1], f"{what}: digest after the decode"
            if s + keep + 1 < T:
                rows, _ = eng.target_step(sess, ids[s + keep + 1:])
                bits_equal(rows, b["logits"][s + keep + 1:], f"{what}: batched continuation")
                assert sess.cache.digest() == b["digs"][T], f"{what}: final digest"
        # a second rollback without a new captured step is refused
        sess = eng.new_session(T + 8)
        sess.cache.restore(snap)
        eng.target_step(sess, ids[s:s + R], capture=True)
        eng.rollback(sess, R)
        with pytest.raises(Exception, match="rollback"):
            eng.rollback(sess, 1)
