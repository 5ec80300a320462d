"""bf16-resident weights on the CPU twin (``Engine(weights="bf16")``, ``--weights``).

A bf16 weight widened to float32 is exact and the ``*_bf16`` ops widen in registers with the
float32 ops' fma order, so an engine keeping its matrices bf16 must give the float32 engine's bits
on the same (widened) checkpoint: every step's logits bitwise, cache digests equal. The simulated
CUDA side of the same claim is tests/test_cudasim.py (``test_bf16_weights_match_widened_float32_bitwise``).
"""

import os

import numpy as np
import pytest

from harness.cli import main
from harness.engine import bf16
from harness.engine.config import ModelConfig
from harness.engine.model import Engine
from harness.engine.weights import load_checkpoint, save_checkpoint
from harness.errors import CheckpointError, PrimewalkError
from harness.models import default_model_path, model_path
from harness.synth import random_tensors

# Qwen3.5 dense with tied embeddings, odd heads, conv kernel 5 (the MoE side is the embedded
# tiny-q35: per-expert weights, shared expert, untied)
DENSE = dict(
    model_type="qwen3_5_text", vocab_size=50, hidden_size=40, num_hidden_layers=3,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=12,
    linear_conv_kernel_dim=5, num_attention_heads=3, num_key_value_heads=1, head_dim=8,
    rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
                     "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    rms_norm_eps=1e-6, intermediate_size=36, tie_word_embeddings=True, mtp_num_hidden_layers=1,
)


@pytest.fixture(scope="module")
def dense_bf16(tmp_path_factory):
    cfg = ModelConfig.from_dict(DENSE)
    folder = str(tmp_path_factory.mktemp("bf16") / "dense")
    save_checkpoint(folder, cfg, random_tensors(cfg, 11), dtype="bfloat16")
    return load_checkpoint(folder)


def _steps(ck):
    """prime 37 rows (two chunks), verify 4, decode 2, MTP rows: logits and digests per step, for
    the float32 engine and the bf16 one."""
    out = {}
    for mode in ("f32", "bf16"):
        e = Engine(ck, "cpu", weights=mode)
        assert e.weights == mode
        ids = np.random.default_rng(5).integers(0, ck.config.vocab_size, 48)
        s = e.new_session(48)
        got = [e.prime_chunk(s, ids[:20])[0], e.prime_chunk(s, ids[20:37])[0]]
        got.append(e.target_step(s, ids[37:41])[0])
        got += [e.decode_step(s, int(ids[41 + i]))[0] for i in range(2)]
        h = np.random.default_rng(6).standard_normal((2, ck.config.hidden_size)).astype(np.float32)
        got.append(e.mtp_rows(s, [int(ids[43]), int(ids[44])], h, 0)[0])
        out[mode] = ([np.asarray(g).copy() for g in got], s.cache.digest())
    return out


@pytest.mark.parametrize("which", ["dense", "tiny-q35"])
def test_bf16_resident_equals_widened_float32_bitwise(which, dense_bf16):
    ck = dense_bf16 if which == "dense" else load_checkpoint(model_path("tiny-q35"))
    assert ck.stored_as(bf16.matrix_names(ck.tensors)) == {"BF16"}
    res = _steps(ck)
    (l32, d32), (l16, d16) = res["f32"], res["bf16"]
    for i, (a, b) in enumerate(zip(l32, l16)):
        assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"step {i}"
    assert d32 == d16


def test_bf16_engine_keeps_matrices_as_bf16_bits(dense_bf16):
    e = Engine(dense_bf16, "cpu", weights="bf16")
    assert e.embed.dtype == np.uint16 and e.lm_head is e.embed  # tied: one bf16 table
    mats = {"qkvzba", "out", "qkv", "o", "gu", "down"}
    for L in e.layers:
        assert {k for k, v in L.items() if getattr(v, "dtype", None) == np.uint16} == mats & set(L), sorted(L)
        assert all(v.dtype == np.float32 for k, v in L.items() if isinstance(v, np.ndarray) and k not in mats)
    # halves the bytes the matrices take
    f = Engine(dense_bf16, "cpu", weights="f32")
    assert e.lm_head.nbytes * 2 == f.lm_head.nbytes


def test_narrow_widen_exact():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    b = bf16.widen(bf16.narrow(x))  # truncation: bf16 values
    assert np.array_equal(bf16.widen(bf16.narrow(b)).view(np.uint32), b.view(np.uint32))
    # independent: a bf16 value is a float32 whose low 16 bits are zero, and its high half is the bits
    assert not (b.view(np.uint32) & 0xFFFF).any()
    assert np.array_equal(bf16.narrow(b), (b.view(np.uint32) >> 16).astype(np.uint16))
    for v in (1.0, -2.5, 3.140625, 0.0, -0.0, float("inf")):
        assert float(bf16.widen(bf16.narrow(np.array([v], np.float32)))[0]) == v


def test_auto_mode(dense_bf16):
    tiny = load_checkpoint(default_model_path())  # float32 checkpoint
    assert bf16.resolve(None, "cpu", dense_bf16) == "f32"  # auto: bf16 only on CUDA
    assert bf16.resolve(None, "cuda", dense_bf16) == "bf16"
    assert bf16.resolve("auto", "cuda", tiny) == "f32"
    assert bf16.resolve("bf16", "cpu", tiny) == "bf16"
    with pytest.raises(PrimewalkError, match="unknown weights mode 'bf8'"):
        bf16.resolve("bf8", "cpu", tiny)


def test_bf16_on_a_float32_checkpoint_is_refused():
    tiny = load_checkpoint(default_model_path())
    with pytest.raises(CheckpointError, match=r"--weights bf16: .* holds values that are not bf16"):
        Engine(tiny, "cpu", weights="bf16")


def test_cli_weights_bf16_one_line_error(capsys):
    for argv, msg in ((["--backend", "cpu"], "--weights bf16: "), (["--backend", "reference"], "--weights bf16 needs --backend cpu or cuda")):
        rc = main(["logits", "--ids", "1,2,3", "--weights", "bf16", "--out", os.devnull, *argv])
        out, err = capsys.readouterr()
        assert rc == 2 and "Traceback" not in err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("harness logits: error: " + msg), err


def test_cli_logits_bf16_equal_f32(tmp_path, capsys):
    outs = {}
    for mode in ("f32", "bf16"):
        p = str(tmp_path / f"{mode}.npy")
        assert main(["logits", "--model", model_path("tiny-q35"), "--ids", "5,6,7,8", "--backend", "cpu", "--weights", mode,
                     "--out", p]) == 0
        outs[mode] = np.load(p)
    capsys.readouterr()
    assert np.array_equal(outs["f32"].view(np.uint32), outs["bf16"].view(np.uint32))
