"""Every way a user can misuse the engine ends in one clear :class:`PrimewalkError`, and the CLI
turns it into exit code 2 with one stderr line and no traceback.

- token ids out of range (the id and its index named), empty prompts, prompts longer than the
  cache: ``InputError``, and the session is left as it was (still usable);
- NaN / Inf in activations (injected through the engine's prepared weights): ``NumericError``
  naming the layer; the session then refuses with a clear message while a new session on the same
  engine works (bit for bit like a healthy engine);
- a snapshot restored into an engine with another config: ``InputError``;
- ``get_backend('cuda')`` on this machine (no CUDA driver): a clear ``PrimewalkError``;
- ``harness logits``: ``--backend cpu`` and ``--backend reference`` agree to 1e-4 relative and
  exit 0; bad ids, an empty prompt, a missing model folder, an invalid config exit 2.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from harness import cli
from harness.engine.backend import get_backend
from harness.engine.config import ModelConfig
from harness.engine.model import Engine
from harness.engine.weights import Checkpoint, load_checkpoint
from harness.errors import InputError, NumericError, PrimewalkError
from harness.models import default_model_path
from harness.synth import random_tensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def eng():
    return Engine(load_checkpoint(default_model_path()), "cpu")


@pytest.fixture(scope="module")
def sick():
    """An engine over its own copy of the weights, for injecting NaN / Inf."""
    return Engine(load_checkpoint(default_model_path()), "cpu")


IDS = np.array([5, 17, 200, 3, 99, 1, 2, 42, 7, 250])


# ------------------------------------------------------------------------------------------------
# input errors
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad,tid,index", [([1, 260, 3], 260, 1), ([-1, 2], -1, 0), ([4, 5, 6, 100000], 100000, 3)])
def test_token_id_out_of_range(eng, bad, tid, index):
    sess = eng.new_session(16)
    eng.prime_chunk(sess, IDS[:2])
    digest = sess.cache.digest()
    for call in (lambda: eng.target_step(sess, bad), lambda: eng.prime_chunk(sess, bad)):
        with pytest.raises(InputError, match=rf"token id {tid} at index {index} is out of range for vocab_size 260"):
            call()
    with pytest.raises(InputError, match=rf"token id {tid} at index 0 is out of range"):
        eng.decode_step(sess, tid)
    assert sess.cache.pos == 2 and sess.cache.digest() == digest and not sess.poisoned
    eng.decode_step(sess, 3)  # still usable


def test_check_ids_short_lists_as_arrays(eng):
    """A short list of Python ints takes the fast check: the same ids and the same errors as the
    numpy path (arrays, longer lists, other element types)."""
    for ids in ([0], [259, 1, 7], list(range(64)), list(range(65)), [np.int64(4), 5]):
        got = eng.check_ids(ids)
        assert got.dtype == np.int32 and got.tolist() == eng.check_ids(np.array(ids)).tolist() == [int(t) for t in ids]
    for bad, msg in (([3, 2 ** 40], "token id 1099511627776 at index 1 is out of range"),
                     ([1.0], "token ids must be integers"),
                     ([[1, 2]], "expected a flat list")):
        for form in (bad, np.array(bad)):
            with pytest.raises(InputError, match=msg):
                eng.check_ids(form)


def test_empty_prompt(eng):
    sess = eng.new_session(8)
    for empty in ([], np.array([], dtype=np.int64)):
        for call in (eng.target_step, eng.prime_chunk):
            with pytest.raises(InputError, match="prompt is empty"):
                call(sess, empty)
    assert sess.cache.pos == 0 and not sess.poisoned


def test_non_integer_ids(eng):
    with pytest.raises(InputError, match="token ids must be integers"):
        eng.target_step(eng.new_session(4), [1.5, 2.0])


def test_non_1d_prompt_is_not_called_empty(eng):
    """A 2-D prompt is not empty; the message should say what is wrong with it."""
    with pytest.raises(InputError) as ei:
        eng.target_step(eng.new_session(4), [[1, 2]])
    assert "empty" not in str(ei.value), (
        f"harness/engine/model.py Engine.check_ids reports a non-empty 2-D prompt as empty: {ei.value!r} "
        "(ids.ndim != 1 and ids.size == 0 share one message)")


def test_prompt_longer_than_the_cache(eng):
    sess = eng.new_session(6)
    with pytest.raises(InputError, match=r"7 rows at position 0 exceed the cache capacity 6"):
        eng.target_step(sess, np.arange(7))
    eng.prime_chunk(sess, IDS[:4])
    with pytest.raises(InputError, match=r"3 rows at position 4 exceed the cache capacity 6"):
        eng.prime_chunk(sess, IDS[:3])
    eng.target_step(sess, IDS[:2])  # exactly full is fine
    with pytest.raises(InputError, match="exceed the cache capacity 6"):
        eng.decode_step(sess, 1)
    assert sess.cache.pos == 6 and not sess.poisoned
    with pytest.raises(InputError, match="max_ctx must be a positive integer"):
        eng.new_session(0)


# ------------------------------------------------------------------------------------------------
# numeric errors
# ------------------------------------------------------------------------------------------------
def _inject(engine, where):
    """Poison one prepared weight in place; returns an undo callable."""
    if where == "nan-layer2":
        a = engine.layers[2]["down"]
        idx, val = (0, 0), np.nan
    elif where == "inf-layer1":  # a huge norm weight: h overflows to ±inf, the MLP turns it into NaN/Inf
        a = engine.layers[1]["post_norm"]
        idx, val = slice(None), 3e38
    else:  # "inf-lm_head": the final norm blows up, the logits overflow
        a = engine.final_norm
        idx, val = slice(None), 3e38
    old = a.copy()
    a[idx] = val

    def undo():
        a[...] = old

    return undo


@pytest.mark.parametrize("where,name", [("nan-layer2", "model.layers.2"), ("inf-layer1", "model.layers.1"),
                                        ("inf-lm_head", "lm_head")])
def test_nonfinite_activations(eng, sick, where, name):
    sess = sick.new_session(16)
    sick.prime_chunk(sess, IDS[:3])
    peer = sick.new_session(16)  # a healthy session on the same engine, before the fault
    sick.prime_chunk(peer, IDS[:3])
    undo = _inject(sick, where)
    try:
        with pytest.raises(NumericError, match=rf"^{name} produced NaN or Inf"):
            sick.target_step(sess, IDS[3:7])
    finally:
        undo()
    # the session refuses, clearly, every entry point
    for call in (lambda: sick.decode_step(sess, 1), lambda: sick.target_step(sess, IDS[:2]),
                 lambda: sick.prime_chunk(sess, IDS[:2])):
        with pytest.raises(InputError, match=rf"session unusable: {name} produced NaN or Inf"):
            call()
    # a new session on the same engine works, bit for bit like a healthy engine
    fresh = sick.new_session(16)
    got, _ = sick.target_step(fresh, IDS)
    healthy = eng.new_session(16)
    want, _ = eng.target_step(healthy, IDS)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert fresh.cache.digest() == healthy.cache.digest()
    # and so does the session that existed before the fault
    lg, _ = sick.target_step(peer, IDS[3:])
    np.testing.assert_array_equal(lg.view(np.uint32), want[3:].view(np.uint32))


def test_restore_after_numeric_error_makes_the_session_usable(sick):
    """The refusal says "restore a snapshot or start a new session": restoring must then work."""
    sess = sick.new_session(16)
    sick.prime_chunk(sess, IDS[:3])
    snap = sess.cache.snapshot()
    undo = _inject(sick, "nan-layer2")
    try:
        with pytest.raises(NumericError):
            sick.target_step(sess, IDS[3:7])
    finally:
        undo()
    sess.cache.restore(snap)
    try:
        lg, _ = sick.target_step(sess, IDS[3:])
    except InputError as e:
        raise AssertionError(
            "harness/engine/cache.py: after a NumericError, Cache.restore(snapshot) does not clear "
            "Session.poisoned (the flag lives on the Session, restore on the Cache), so the "
            f"advice in the refusal cannot be followed: {e}") from None
    ref = sick.new_session(16)
    want, _ = sick.target_step(ref, IDS)
    np.testing.assert_array_equal(lg.view(np.uint32), want[3:].view(np.uint32))


# ------------------------------------------------------------------------------------------------
# snapshots across configs, backends
# ------------------------------------------------------------------------------------------------
def test_snapshot_into_another_config(eng):
    cfg = ModelConfig.from_json(os.path.join(default_model_path(), "config.json"))
    cfg.rms_norm_eps = 1e-5  # same shapes, another config
    other = Engine(Checkpoint(cfg, random_tensors(cfg, seed=3)), "cpu")
    sess = eng.new_session(8)
    eng.prime_chunk(sess, IDS[:4])
    snap = sess.cache.snapshot()
    target = other.new_session(8)
    with pytest.raises(InputError, match="another config"):
        target.cache.restore(snap)
    assert target.cache.pos == 0
    with pytest.raises(InputError, match="not a cache snapshot"):
        target.cache.restore({"pos": 4})
    small = eng.new_session(3)
    with pytest.raises(InputError, match="holds 4 positions, this cache only 3"):
        small.cache.restore(snap)
    # a session of the other engine is refused by this engine, too
    with pytest.raises(InputError, match="another config"):
        eng.decode_step(target, 1)


def test_cuda_backend_without_a_gpu():
    from numba import cuda

    if cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    for _ in range(2):  # not cached as a half-made backend
        with pytest.raises(PrimewalkError, match=r"^backend cuda: no CUDA GPU or driver is available on this machine \(use --backend cpu\)$"):
            get_backend("cuda")
    with pytest.raises(PrimewalkError, match="backend cuda"):
        Engine(load_checkpoint(default_model_path()), "cuda")
    with pytest.raises(PrimewalkError, match=r"unknown backend 'tpu' \(choose one of: cpu, cuda\)"):
        get_backend("tpu")


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------
def test_cli_logits_cpu_agrees_with_reference(tmp_path, capsys):
    a, b = str(tmp_path / "cpu.npy"), str(tmp_path / "ref.npy")
    ids = ",".join(str(int(i)) for i in np.random.default_rng(9).integers(0, 260, 70))
    assert cli.main(["logits", "--ids", ids, "--backend", "cpu", "--out", a]) == 0
    assert cli.main(["logits", "--ids", ids, "--backend", "reference", "--out", b]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    assert "wrote" in out.out and "(cpu)" in out.out and "(reference)" in out.out
    got, want = np.load(a), np.load(b)
    assert got.dtype == np.float32 and want.dtype == np.float64 and got.shape == want.shape == (70, 260)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= 1e-4, err
    assert cli.main(["logits", "--text", "hi", "--backend", "cpu", "--out", str(tmp_path / "t.npy")]) == 0


def _invalid_config_dir(tmp_path):
    d = tmp_path / "badcfg"
    shutil.copytree(default_model_path(), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"] = 3  # 4 attention heads are not a multiple of 3
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _bad_cases(tmp_path):
    out = str(tmp_path / "x.npy")
    return {
        "id out of range": (["logits", "--ids", "1,2,999", "--out", out], r"token id 999 is out of range for vocab_size 260"),
        "not integers": (["logits", "--ids", "1,x", "--out", out], r"expected comma-separated integers"),
        "empty ids": (["logits", "--ids", "", "--out", out], r"the prompt is empty"),
        "empty ids (commas)": (["logits", "--ids", ",,", "--out", out], r"the prompt is empty"),
        "empty text": (["logits", "--text", "", "--out", out], r"the prompt is empty"),
        "missing model": (["logits", "--model", str(tmp_path / "nope"), "--ids", "1", "--out", out], r"nope: not a folder"),
        "invalid config": (["logits", "--model", _invalid_config_dir(tmp_path), "--ids", "1", "--out", out],
                           r"num_attention_heads \(4\) is not a multiple of num_key_value_heads \(3\)"),
    }


@pytest.mark.parametrize("case", ["id out of range", "not integers", "empty ids", "empty ids (commas)",
                                  "empty text", "missing model", "invalid config"])
def test_cli_errors_exit_2_with_one_line(case, tmp_path, capsys):
    argv, pattern = _bad_cases(tmp_path)[case]
    for backend in ("cpu", "reference"):
        rc = cli.main(argv + ["--backend", backend])
        out = capsys.readouterr()
        assert rc == 2, (case, backend, rc)
        lines = out.err.strip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("harness logits: error: "), out.err
        assert "Traceback" not in out.err + out.out
        assert re.search(pattern, lines[0]), lines[0]
    assert not os.path.exists(tmp_path / "x.npy")


def test_cli_errors_in_a_real_process(tmp_path):
    """The same through ``python -m harness.cli``: exit status 2, one stderr line, no traceback."""
    out = str(tmp_path / "x.npy")
    for argv, pattern in [(["logits", "--ids", "3,-4", "--out", out], "token id -4 is out of range"),
                          (["logits", "--model", str(tmp_path / "missing"), "--ids", "1", "--out", out], "not a folder"),
                          (["logits", "--model", _invalid_config_dir(tmp_path), "--ids", "1", "--out", out], "not a multiple")]:
        p = subprocess.run([sys.executable, "-m", "harness.cli"] + argv, cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2, (argv, p.returncode, p.stderr)
        assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1 and pattern in p.stderr, p.stderr
