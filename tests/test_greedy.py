"""Engine.decode_greedy -- chained greedy decode steps, the pick on the device -- against the
decode_step calls it stands for, bit for bit (logits, picks, cache digest, last hidden row), and
the greedy_pick op against numpy.argmax. The simulated CUDA engine's chained steps (eager,
captured, replayed) are in tests/test_cudasim.py."""

from __future__ import annotations

import numpy as np
import pytest

from harness.engine.model import Engine
from harness.engine.weights import load_checkpoint
from harness.errors import InputError, NumericError
from harness.models import default_model_path
from numba_kernels import cpu

IDS = np.array([5, 17, 200, 3, 99, 1, 2, 42, 7, 250])


@pytest.fixture(scope="module")
def ck():
    return load_checkpoint(default_model_path())


def _stepwise(eng, sess, tok, n):
    picks, rows = [], []
    for _ in range(n):
        lg, _ = eng.decode_step(sess, tok)
        tok = int(np.argmax(lg))
        picks.append(tok)
        rows.append(np.array(lg, copy=True))
    return picks, np.stack(rows)


@pytest.mark.parametrize("mode", ["exact", "exact-bf16"])
def test_greedy_is_the_decode_steps_bitwise(ck, mode):
    eng = Engine(ck, "cpu", mode=mode)
    a, b = eng.new_session(40), eng.new_session(40)
    for s in (a, b):
        eng.target_step(s, IDS[:-1])
    want_p, want_l = _stepwise(eng, a, int(IDS[-1]), 9)
    p1, l1 = eng.decode_greedy(b, int(IDS[-1]), 4, keep_logits=True)  # two calls: the second goes on
    p2, l2 = eng.decode_greedy(b, p1[-1], 5, keep_logits=True)
    assert p1 + p2 == want_p
    np.testing.assert_array_equal(np.concatenate([l1, l2]).view(np.uint32), want_l.view(np.uint32))
    assert b.cache.pos == a.cache.pos == len(IDS) - 1 + 9
    assert b.cache.digest() == a.cache.digest()
    np.testing.assert_array_equal(eng.host(b.cache.last_h).view(np.uint32), eng.host(a.cache.last_h).view(np.uint32))
    # without the logits: the same picks
    c = eng.new_session(40)
    eng.target_step(c, IDS[:-1])
    picks, none = eng.decode_greedy(c, int(IDS[-1]), 9)
    assert none is None and picks == want_p and c.cache.digest() == a.cache.digest()


def test_the_traced_path_is_the_same_steps(ck):
    """What a recording trace (bisect) runs instead: the decode_step calls."""
    eng = Engine(ck, "cpu")
    a, b = eng.new_session(20), eng.new_session(20)
    got = eng._greedy_stepwise(a, 7, 5, True)
    want = eng.decode_greedy(b, 7, 5, keep_logits=True)
    assert got[0] == want[0] and np.array_equal(got[1].view(np.uint32), want[1].view(np.uint32))
    assert a.cache.digest() == b.cache.digest()


@pytest.mark.parametrize("n", [0, -2, 2.0, "3", True, None])
def test_bad_step_counts(ck, n):
    eng = Engine(ck, "cpu")
    s = eng.new_session(8)
    with pytest.raises(InputError, match="decode_greedy: n must be a positive integer"):
        eng.decode_greedy(s, 1, n)
    assert s.cache.pos == 0


def test_bad_token_and_capacity(ck):
    eng = Engine(ck, "cpu")
    s = eng.new_session(8)
    with pytest.raises(InputError, match="out of range"):
        eng.decode_greedy(s, ck.config.vocab_size, 2)
    eng.target_step(s, IDS[:5])
    with pytest.raises(InputError, match="exceed the cache capacity 8"):
        eng.decode_greedy(s, 1, 4)
    assert s.cache.pos == 5
    assert len(eng.decode_greedy(s, 1, 3)[0]) == 3


def test_nonfinite_raises_and_poisons(ck):
    eng = Engine(load_checkpoint(default_model_path()), "cpu")
    s = eng.new_session(16)
    eng.target_step(s, IDS[:3])
    a = eng.final_norm
    old = a.copy()
    a[...] = 3e38  # the logits overflow: the lm head's flag
    try:
        with pytest.raises(NumericError, match="^lm_head produced NaN or Inf"):
            eng.decode_greedy(s, 1, 4)
    finally:
        a[...] = old
    with pytest.raises(InputError, match="session unusable: lm_head produced NaN or Inf"):
        eng.decode_greedy(s, 1, 1)


def _pick(lg):
    io, picked = np.array([41, -1], np.int32), np.full(3, -1, np.int32)
    cpu.greedy_pick(lg[None, :], io, picked, 2)
    assert io[0] == 42 and io[1] == picked[2]
    return int(picked[2])


def test_greedy_pick_is_numpy_argmax():
    rng = np.random.default_rng(5)
    cases = [rng.standard_normal(V).astype(np.float32) for V in (1, 2, 2048, 2049, 6000)]
    ties = rng.standard_normal(5000).astype(np.float32)
    ties[[7, 2100, 4999]] = 50.0
    nans = rng.standard_normal(5000).astype(np.float32)
    nans[[3000, 10]] = np.nan
    zeros = np.zeros(100, np.float32)
    zeros[[0, 60]] = -0.0
    late = np.full(300, -np.inf, np.float32)
    late[299] = np.inf
    cases += [ties, nans, zeros, np.full(300, -np.inf, np.float32), late, np.full(9, np.inf, np.float32)]
    for lg in cases:
        assert _pick(lg) == int(np.argmax(lg))


def test_device_check_greedy_schedules_on_the_cpu(ck):
    """The device-check's greedy schedules (run on CUDA against these CPU rows): chained and
    stepwise bitwise alike on the CPU twin; the op cases include the pick's."""
    from harness.gpu import devicecheck

    r = devicecheck.greedy_runs(Engine(ck, "cpu"), IDS)
    (lg, dg), (ls, ds) = r["greedy"], r["greedy-stepwise"]
    assert lg.shape == (devicecheck.GREEDY_STEPS, ck.config.vocab_size) and dg == ds
    np.testing.assert_array_equal(lg.view(np.uint32), ls.view(np.uint32))
    cases = [c for c in devicecheck.op_cases(np.random.default_rng(0), False) if c[0] == "greedy_pick"]
    assert len(cases) >= 6
    for _, cid, args, outs in cases:
        io, picked = args[1].copy(), args[2].copy()
        cpu.greedy_pick(args[0], io, picked, args[3])
        assert io[1] == picked[args[3]] == int(np.argmax(args[0][0])), cid


def test_an_interrupted_call_leaves_the_session_refusing(ck, monkeypatch):
    """Steps ran that no caller saw (their picks lost): the session refuses until restored."""
    eng = Engine(ck, "cpu")
    s = eng.new_session(16)
    eng.target_step(s, IDS[:3])
    snap = s.cache.snapshot()
    calls = []
    real = eng.ops.greedy_pick

    def pick(*a):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(eng.ops, "greedy_pick", pick)
    with pytest.raises(KeyboardInterrupt):
        eng.decode_greedy(s, 1, 5)
    monkeypatch.undo()
    assert s.cache.pos == 6
    with pytest.raises(InputError, match="session unusable: decode_greedy stopped after 3 of 5 steps"):
        eng.decode_greedy(s, 1, 1)
    s.cache.restore(snap)
    ref = eng.new_session(16)
    eng.target_step(ref, IDS[:3])
    assert eng.decode_greedy(s, 1, 2)[0] == eng._greedy_stepwise(ref, 1, 2, False)[0]
    assert s.cache.digest() == ref.cache.digest()


def test_an_interrupted_call_is_poisoned_even_when_the_device_wait_fails(ck, monkeypatch):
    """A failed launch can leave a context whose every later call raises, the wait for the steps
    issued included: the session is still marked unusable and the first error is the one raised."""
    eng = Engine(ck, "cpu")
    s = eng.new_session(16)
    eng.target_step(s, IDS[:3])
    real = eng.ops.greedy_pick
    calls = []

    def pick(*a):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("launch failed")
        return real(*a)

    def dead():
        raise RuntimeError("context is dead")

    monkeypatch.setattr(eng.ops, "greedy_pick", pick)
    monkeypatch.setattr(eng.B, "synchronize", dead)
    with pytest.raises(RuntimeError, match="launch failed"):
        eng.decode_greedy(s, 1, 4)
    monkeypatch.undo()
    assert s.cache.pos == 5
    with pytest.raises(InputError, match="session unusable: decode_greedy stopped after 2 of 4 steps"):
        eng.decode_greedy(s, 1, 1)
