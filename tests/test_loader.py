"""Checkpoint loading (harness/engine/weights.py, harness/engine/config.py): round trips, dtypes,
shards, and one clear one-line error for every way a checkpoint can be wrong. No torch needed."""

from __future__ import annotations

import importlib.util
import json
import os
import struct

import numpy as np
import pytest

from harness.engine.config import ModelConfig
from harness.engine.weights import (
    load_checkpoint, mtp_shapes, read_safetensors, save_checkpoint, to_file_tensors, trunk_shapes,
)
from harness.errors import CheckpointError, ConfigError, PrimewalkError
from harness.synth import random_tensors

pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_dict() -> dict:
    spec = importlib.util.spec_from_file_location("_make_tiny", os.path.join(_ROOT, "tools", "make_tiny.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return json.loads(json.dumps(mod.TINY))


TINY = _tiny_dict()

MOE = dict(
    vocab_size=50, hidden_size=16, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4, linear_value_head_dim=4,
    linear_conv_kernel_dim=4, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    intermediate_size=24, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
    shared_expert_intermediate_size=12, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
    tie_word_embeddings=False,
)


def write_raw(folder, cfg: dict, file_tensors: dict, name="model.safetensors", dtype=np.float32):
    """config.json + one safetensors file, with no checks (the loader must do them)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file({k: np.ascontiguousarray(v, dtype=dtype) for k, v in file_tensors.items()},
              os.path.join(folder, name), metadata={"format": "pt"})


def write_safetensors_bytes(path, entries: dict):
    """Our own safetensors writer: entries = {name: (dtype_str, shape, raw bytes)}."""
    header, body = {}, b""
    for k, (dt, shape, raw) in entries.items():
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + body)


def one_line(e):
    msg = str(e.value)
    assert "\n" not in msg and msg, msg
    assert isinstance(e.value, PrimewalkError)
    return msg


@pytest.fixture(scope="module")
def tiny():
    cfg = ModelConfig.from_dict(TINY)
    return cfg, random_tensors(cfg, seed=3)


@pytest.fixture(scope="module")
def moe():
    cfg = ModelConfig.from_dict(MOE)
    return cfg, random_tensors(cfg, seed=4)


@pytest.fixture()
def saved(tmp_path, tiny):
    cfg, t = tiny
    folder = str(tmp_path / "ck")
    save_checkpoint(folder, cfg, t)
    return folder


def assert_same_tensors(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == np.float32 and b[k].dtype == np.float32, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ------------------------------------------------------------------------------------------------
# round trips
# ------------------------------------------------------------------------------------------------
def test_roundtrip(saved, tiny):
    cfg, t = tiny
    ck = load_checkpoint(saved)
    assert ck.has_mtp and ck.config.has_mtp
    assert ck.config.to_dict() == cfg.to_dict()
    assert_same_tensors(ck.tensors, t)
    assert ck.tensors["model.layers.0.linear_attn.conv1d.weight"].shape == (cfg.conv_dim, cfg.linear_conv_kernel_dim)
    assert ck.files == ["model.safetensors"] and len(ck.sha256) == 64
    assert load_checkpoint(saved).sha256 == ck.sha256


def test_embedded_tiny_model_loads():
    ck = load_checkpoint(os.path.join(_ROOT, "harness", "models", "tiny"))
    assert ck.has_mtp
    assert ck.config.to_dict() == ModelConfig.from_dict(TINY).to_dict()


def test_trunk_only(tmp_path, tiny):
    cfg, t = tiny
    trunk = {k: v for k, v in t.items() if not k.startswith("mtp.")}
    save_checkpoint(str(tmp_path), cfg, trunk)
    ck = load_checkpoint(str(tmp_path))
    assert not ck.has_mtp and ck.config.num_nextn_predict_layers == 0
    with pytest.raises(CheckpointError) as e:
        ck.require_mtp("mtp-draft")
    assert "no MTP head" in one_line(e) and "mtp-draft needs one" in one_line(e)


def test_experts_per_expert_and_fused(tmp_path, moe):
    cfg, t = moe
    per = to_file_tensors(t, per_expert=True)
    fused = to_file_tensors(t, per_expert=False)
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in per
    assert fused["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 16, 16)  # [E, 2I, H]
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" not in fused
    # gate rows first, then up (HF's chunk(2, dim=-1) of the gate_up output)
    np.testing.assert_array_equal(fused["model.layers.1.mlp.experts.gate_up_proj"][2, :8],
                                  t["model.layers.1.mlp.experts.gate_proj"][2])
    write_raw(str(tmp_path / "per"), cfg.to_dict(), per)
    write_raw(str(tmp_path / "fused"), cfg.to_dict(), fused)
    assert_same_tensors(load_checkpoint(str(tmp_path / "per")).tensors, t)
    assert_same_tensors(load_checkpoint(str(tmp_path / "fused")).tensors, t)


def test_sharded_loads_like_unsharded(tmp_path, tiny):
    cfg, t = tiny
    save_checkpoint(str(tmp_path / "one"), cfg, t)
    save_checkpoint(str(tmp_path / "many"), cfg, t, max_shard_bytes=40_000)
    shards = sorted(n for n in os.listdir(tmp_path / "many") if n.endswith(".safetensors"))
    assert len(shards) >= 3 and "model.safetensors" not in shards
    with open(tmp_path / "many" / "model.safetensors.index.json") as f:
        wm = json.load(f)["weight_map"]
    assert sorted(set(wm.values())) == shards
    one, many = load_checkpoint(str(tmp_path / "one")), load_checkpoint(str(tmp_path / "many"))
    assert many.files == shards
    assert many.config.to_dict() == one.config.to_dict()
    assert_same_tensors(many.tensors, one.tensors)


def test_sharded_moe_splits_experts_across_shards(tmp_path, moe):
    cfg, t = moe
    save_checkpoint(str(tmp_path), cfg, t, max_shard_bytes=2_000)
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]) > 4
    assert_same_tensors(load_checkpoint(str(tmp_path)).tensors, t)


# ------------------------------------------------------------------------------------------------
# dtypes
# ------------------------------------------------------------------------------------------------
def test_fp16_loads_as_float32(tmp_path, tiny):
    cfg, t = tiny
    ft = {k: v.astype(np.float16) for k, v in to_file_tensors(t).items()}
    write_raw(str(tmp_path), cfg.to_dict(), ft, dtype=np.float16)
    assert read_safetensors(str(tmp_path / "model.safetensors"))[0]  # readable
    ck = load_checkpoint(str(tmp_path))
    want = {k: v.astype(np.float16).astype(np.float32) for k, v in t.items()}
    assert_same_tensors(ck.tensors, want)
    # save_checkpoint(dtype="float16") writes the same values
    save_checkpoint(str(tmp_path / "h"), cfg, t, dtype="float16")
    assert_same_tensors(load_checkpoint(str(tmp_path / "h")).tensors, want)


def _to_bf16_bits(a: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype("<u2")


def test_bf16_loads_as_float32(tmp_path, tiny):
    cfg, t = tiny
    ft = to_file_tensors(t)
    entries = {k: ("BF16", v.shape, _to_bf16_bits(v).tobytes()) for k, v in sorted(ft.items())}
    os.makedirs(tmp_path, exist_ok=True)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(cfg.to_dict(), f)
    write_safetensors_bytes(str(tmp_path / "model.safetensors"), entries)
    ck = load_checkpoint(str(tmp_path))
    want = {k: (_to_bf16_bits(v).astype(np.uint32) << 16).view(np.float32) for k, v in t.items()}
    assert_same_tensors(ck.tensors, want)
    np.testing.assert_allclose(ck.tensors["model.norm.weight"], t["model.norm.weight"], rtol=2 ** -7)


def test_bf16_known_bit_patterns(tmp_path):
    raw = np.array([0x3F80, 0xC000, 0x3EAB, 0x0000, 0x8000, 0x7F7F], dtype="<u2")
    path = str(tmp_path / "x.safetensors")
    write_safetensors_bytes(path, {"x": ("BF16", (2, 3), raw.tobytes())})
    x = read_safetensors(path)[0]["x"]
    assert x.dtype == np.float32 and x.shape == (2, 3)
    np.testing.assert_array_equal(x.ravel(), np.array(
        [1.0, -2.0, 0.333984375, 0.0, -0.0, 3.3895313892515355e38], dtype=np.float32))
    assert np.signbit(x.ravel()[4])


def test_f64_and_mixed_dtypes_in_one_file(tmp_path):
    path = str(tmp_path / "x.safetensors")
    a = np.arange(6, dtype=np.float64).reshape(2, 3) / 3
    b = np.arange(4, dtype=np.float16)
    write_safetensors_bytes(path, {"a": ("F64", a.shape, a.astype("<f8").tobytes()),
                                   "b": ("F16", b.shape, b.astype("<f2").tobytes())})
    out = read_safetensors(path)[0]
    np.testing.assert_array_equal(out["a"], a.astype(np.float32))
    np.testing.assert_array_equal(out["b"], b.astype(np.float32))


def test_unsupported_dtype(tmp_path):
    path = str(tmp_path / "x.safetensors")
    write_safetensors_bytes(path, {"x": ("I32", (2,), np.arange(2, dtype="<i4").tobytes())})
    with pytest.raises(CheckpointError) as e:
        read_safetensors(path)
    assert "unsupported dtype I32" in one_line(e)


# ------------------------------------------------------------------------------------------------
# wrong tensors: all problems in one error
# ------------------------------------------------------------------------------------------------
def test_missing_unexpected_misshaped_in_one_error(tmp_path, tiny):
    cfg, t = tiny
    ft = to_file_tensors(t)
    del ft["model.layers.0.input_layernorm.weight"]
    ft["model.layers.0.mystery.weight"] = np.zeros((3, 3), np.float32)
    ft["model.layers.1.linear_attn.out_proj.weight"] = np.zeros((64, 63), np.float32)
    write_raw(str(tmp_path), cfg.to_dict(), ft)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    msg = one_line(e)
    assert str(tmp_path) in msg
    assert "missing 1: model.layers.0.input_layernorm.weight" in msg
    assert "unexpected 1: model.layers.0.mystery.weight" in msg
    assert "mis-shaped 1: model.layers.1.linear_attn.out_proj.weight: (64, 63) != expected (64, 64)" in msg


def test_many_missing_are_summarised(tmp_path, tiny):
    cfg, t = tiny
    ft = {k: v for k, v in to_file_tensors(t).items() if not k.startswith("model.layers.")}
    write_raw(str(tmp_path), cfg.to_dict(), ft)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    n = sum(k.startswith("model.layers.") for k in trunk_shapes(cfg))
    assert f"missing {n}:" in one_line(e) and "…" in one_line(e)


def test_partial_mtp_head(tmp_path, tiny):
    cfg, t = tiny
    ft = to_file_tensors(t)
    del ft["mtp.norm.weight"]
    write_raw(str(tmp_path), cfg.to_dict(), ft)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    assert "missing 1: mtp.norm.weight" in one_line(e)
    assert set(mtp_shapes(cfg)) - {"mtp.norm.weight"} <= set(ft)


def test_expert_problems_in_one_error(tmp_path, moe):
    cfg, t = moe
    ft = to_file_tensors(t)
    del ft["model.layers.0.mlp.experts.2.up_proj.weight"]
    ft["model.layers.1.mlp.experts.4.down_proj.weight"] = ft["model.layers.1.mlp.experts.0.down_proj.weight"]
    ft["model.layers.1.mlp.experts.1.gate_proj.weight"] = np.zeros((8, 15), np.float32)
    ft["model.layers.0.self_attn.q_proj.weight"] = np.zeros((2, 2), np.float32)  # wrong layer kind
    write_raw(str(tmp_path), cfg.to_dict(), ft)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    msg = one_line(e)
    assert "missing model.layers.0.mlp.experts.{2}.up_proj.weight" in msg
    assert "unexpected model.layers.1.mlp.experts.{4}.down_proj.weight" in msg
    assert "model.layers.1.mlp.experts.*.gate_proj.weight: experts have different shapes" in msg
    assert "unexpected 1: model.layers.0.self_attn.q_proj.weight" in msg
    # the expert stacks that could not be built are reported missing as well
    assert "model.layers.0.mlp.experts.up_proj" in msg


def test_fused_experts_misshaped(tmp_path, moe):
    cfg, t = moe
    ft = to_file_tensors(t, per_expert=False)
    ft["model.layers.0.mlp.experts.gate_up_proj"] = np.zeros((4, 15, 16), np.float32)
    ft["model.layers.1.mlp.experts.down_proj"] = np.zeros((4, 16, 9), np.float32)
    write_raw(str(tmp_path), cfg.to_dict(), ft)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    msg = one_line(e)
    assert "model.layers.0.mlp.experts.gate_up_proj: shape (4, 15, 16) is not [E, 2I, H]" in msg
    assert "model.layers.1.mlp.experts.down_proj: (4, 16, 9) != expected (4, 16, 8)" in msg


def test_nan_weight_refused(tmp_path, tiny):
    cfg, t = tiny
    ft = to_file_tensors(t)
    ft["model.norm.weight"] = ft["model.norm.weight"].copy()
    ft["model.norm.weight"][5] = np.nan
    write_raw(str(tmp_path), cfg.to_dict(), ft)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    assert "model.norm.weight contains NaN or Inf" in one_line(e)
    assert np.isnan(load_checkpoint(str(tmp_path), check_finite=False).tensors["model.norm.weight"][5])


def test_tied_embeddings_accept_and_drop_lm_head(tmp_path, tiny):
    cfg, t = tiny
    d = dict(cfg.to_dict(), tie_word_embeddings=True)
    tied = ModelConfig.from_dict(d)
    ft = to_file_tensors(t)
    write_raw(str(tmp_path / "with"), d, ft)
    write_raw(str(tmp_path / "without"), d, {k: v for k, v in ft.items() if k != "lm_head.weight"})
    for sub in ("with", "without"):
        ck = load_checkpoint(str(tmp_path / sub))
        assert "lm_head.weight" not in ck.tensors
        assert ck.lm_head() is ck.tensors["model.embed_tokens.weight"]
    assert "lm_head.weight" not in trunk_shapes(tied)


# ------------------------------------------------------------------------------------------------
# broken files
# ------------------------------------------------------------------------------------------------
def _file(folder):
    return os.path.join(folder, "model.safetensors")


@pytest.mark.parametrize("cut", [1, 1000, "header", "tiny"])
def test_truncated_file(saved, cut):
    path = _file(saved)
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    keep = {"header": 8 + n // 2, "tiny": 5}.get(cut, len(data) - cut if isinstance(cut, int) else 0)
    with open(path, "wb") as f:
        f.write(data[:keep])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(saved)
    msg = one_line(e)
    assert "truncated" in msg and path in msg


def test_corrupt_header_not_json(saved):
    path = _file(saved)
    data = bytearray(open(path, "rb").read())
    data[8:40] = b"\xff" * 32
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(saved)
    assert "corrupt safetensors header" in one_line(e)


def test_corrupt_header_length(saved):
    path = _file(saved)
    data = bytearray(open(path, "rb").read())
    data[:8] = struct.pack("<Q", 2 ** 60)
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(saved)
    assert "corrupt" in one_line(e)


@pytest.mark.parametrize("header", [
    {"x": {"dtype": "F32", "shape": [2]}},  # no offsets
    {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},  # offsets disagree with shape
    ["not", "an", "object"],
])
def test_corrupt_header_entries(tmp_path, header):
    h = json.dumps(header).encode()
    path = str(tmp_path / "x.safetensors")
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"\0" * 8)
    with pytest.raises(CheckpointError) as e:
        read_safetensors(path)
    assert "corrupt" in one_line(e) or "inconsistent offsets" in one_line(e)


def test_missing_shard(tmp_path, tiny):
    cfg, t = tiny
    save_checkpoint(str(tmp_path), cfg, t, max_shard_bytes=40_000)
    victim = sorted(n for n in os.listdir(tmp_path) if n.endswith(".safetensors"))[1]
    os.remove(tmp_path / victim)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    assert f"shard(s) listed in the index are missing: {victim}" in one_line(e)


def test_tensor_in_two_shards(tmp_path, tiny):
    cfg, t = tiny
    save_checkpoint(str(tmp_path), cfg, t, max_shard_bytes=40_000)
    shards = sorted(n for n in os.listdir(tmp_path) if n.endswith(".safetensors"))
    first = read_safetensors(str(tmp_path / shards[0]))[0]
    second = read_safetensors(str(tmp_path / shards[1]))[0]
    dup = sorted(first)[0]
    second[dup] = first[dup]
    save_file({k: np.ascontiguousarray(v) for k, v in second.items()}, str(tmp_path / shards[1]))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    assert "already in another shard" in one_line(e) and dup in one_line(e)


def test_unreadable_index(saved):
    os.remove(_file(saved))
    open(os.path.join(saved, "model.safetensors.index.json"), "w").write("{ nope")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(saved)
    assert "unreadable shard index" in one_line(e)


def test_pickle_only_folder_refused(tmp_path, tiny):
    cfg, _ = tiny
    cfg.save(str(tmp_path / "config.json"))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04\x95 not really a pickle")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    assert "only pickle weights found (pytorch_model.bin)" in one_line(e)
    assert "safetensors only" in one_line(e)


def test_no_weights_and_not_a_folder(tmp_path, tiny):
    cfg, _ = tiny
    cfg.save(str(tmp_path / "config.json"))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path))
    assert "no model.safetensors" in one_line(e)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path / "nope"))
    assert "not a folder" in one_line(e)


# ------------------------------------------------------------------------------------------------
# configs
# ------------------------------------------------------------------------------------------------
def test_missing_config(saved):
    os.remove(os.path.join(saved, "config.json"))
    with pytest.raises(ConfigError) as e:
        load_checkpoint(saved)
    assert "config.json: no such file" in one_line(e)


def _cfg_with(**kw):
    d = json.loads(json.dumps(TINY))
    d.update(kw)
    return d


BAD_CONFIGS = {
    "value heads": (_cfg_with(linear_num_value_heads=3),
                    "linear_num_value_heads (3) is not a multiple of linear_num_key_heads (2)"),
    "layer type": (_cfg_with(layer_types=["linear_attention", "sliding_attention", "linear_attention",
                                          "full_attention"]),
                   "layer_types[1] is 'sliding_attention', expected 'linear_attention' or 'full_attention'"),
    "layer count": (_cfg_with(layer_types=["linear_attention", "full_attention"]),
                    "layer_types has 2 entries, num_hidden_layers is 4"),
    "odd rotary": (_cfg_with(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                              "partial_rotary_factor": 0.1875}),
                   "rotary dim int(head_dim * partial_rotary_factor) = 3 must be even"),
    "model type": (_cfg_with(model_type="qwen3_moe"),
                   "model_type is 'qwen3_moe', expected one of 'qwen3_next', 'qwen3_5_text', 'qwen3_5_moe_text'"),
    "qwen3.5 moe no renorm": (_cfg_with(model_type="qwen3_5_moe_text", num_experts=4, num_experts_per_tok=2,
                                        norm_topk_prob=False),
                              "norm_topk_prob is false, but transformers' Qwen3.5-MoE always renormalises"),
    "qwen3.5 moe no experts": (_cfg_with(model_type="qwen3_5_moe_text", num_experts=0),
                               "num_experts must be positive for model_type 'qwen3_5_moe_text'"),
    "mrope section": (_cfg_with(model_type="qwen3_5_text", rope_parameters={
        "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25, "mrope_section": [8, 8]}),
        "rope_parameters.mrope_section must be three non-negative integers (t, h, w), got [8, 8]"),
    "multimodal without text config": ({"model_type": "qwen3_5", "vision_config": {}},
                                       "model_type 'qwen3_5' nests the text model under text_config, which is missing"),
    "multimodal text type": ({"model_type": "qwen3_5", "text_config": _cfg_with(model_type="qwen3_5_moe_text")},
                             "text_config.model_type is 'qwen3_5_moe_text', expected 'qwen3_5_text'"),
    "multimodal tie": ({"model_type": "qwen3_5", "tie_word_embeddings": True,
                        "text_config": _cfg_with(model_type="qwen3_5_text", tie_word_embeddings=False)},
                       "tie_word_embeddings is True but text_config.tie_word_embeddings is False"),
    "mtp depths": (_cfg_with(model_type="qwen3_5_text", mtp_num_hidden_layers=1, num_nextn_predict_layers=0),
                   "mtp_num_hidden_layers (1) and num_nextn_predict_layers (0) disagree"),
    "mtp embeddings": (_cfg_with(model_type="qwen3_5_text", mtp_use_dedicated_embeddings=True),
                       "mtp_use_dedicated_embeddings is true"),
    "layer scale": (_cfg_with(model_type="qwen3_5_text", layer_scale=True), "layer_scale is true"),
    "attention bias": (_cfg_with(attention_bias=True), "attention_bias is true"),
    "rope type": (_cfg_with(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
                  "rope_type 'yarn' is not supported"),
    "attention heads": (_cfg_with(num_attention_heads=3), "num_attention_heads (3) is not a multiple"),
    "top-k": (_cfg_with(num_experts=4, num_experts_per_tok=5), "num_experts_per_tok (5) must be in 1..num_experts"),
    "not an object": ([1, 2, 3], "expected a JSON object"),
    "hidden size": (_cfg_with(hidden_size=0), "hidden_size must be a positive integer, got 0"),
}


@pytest.mark.parametrize("label", list(BAD_CONFIGS))
def test_invalid_config(saved, label):
    d, want = BAD_CONFIGS[label]
    with open(os.path.join(saved, "config.json"), "w") as f:
        json.dump(d, f)
    with pytest.raises(ConfigError) as e:
        load_checkpoint(saved)
    msg = one_line(e)
    assert want in msg, msg
    assert "config.json" in msg


def test_bad_json_config(saved):
    with open(os.path.join(saved, "config.json"), "w") as f:
        f.write('{"model_type": "qwen3_next",\n "hidden_size": 64,,}')
    with pytest.raises(ConfigError) as e:
        load_checkpoint(saved)
    assert "not valid JSON" in one_line(e) and "line 2" in one_line(e)


def test_legacy_rope_keys_and_interval(saved, tiny):
    cfg, t = tiny
    d = json.loads(json.dumps(TINY))
    d.pop("rope_parameters")
    d.pop("layer_types")
    d.update(rope_theta=10000.0, partial_rotary_factor=0.25, full_attention_interval=4)
    with open(os.path.join(saved, "config.json"), "w") as f:
        json.dump(d, f)
    ck = load_checkpoint(saved)
    assert ck.config.to_dict() == cfg.to_dict()
    assert_same_tensors(ck.tensors, t)
