"""The CPU-testable parts of ``harness bench`` (the run itself needs a GPU and torch)."""

import json
import os

import numpy as np
import pytest

from harness.engine.model import Engine
from harness.engine.weights import load_checkpoint
from harness.gpu.bench import BENCH_8L, OpProfile, _fill_random_context, profile_steps, table
from harness.models import default_model_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(ROOT, "receipts", "bench", "h200-bench.json")


@pytest.fixture(scope="module")
def eng():
    return Engine(load_checkpoint(default_model_path()), "cpu")


def test_bench_model_is_the_issue_config():
    assert BENCH_8L["hidden_size"] == 2048 and BENCH_8L["num_hidden_layers"] == 8
    assert BENCH_8L["layer_types"].count("full_attention") == 2
    assert (BENCH_8L["linear_num_key_heads"], BENCH_8L["linear_num_value_heads"]) == (16, 32)
    assert (BENCH_8L["num_attention_heads"], BENCH_8L["num_key_value_heads"], BENCH_8L["head_dim"]) == (16, 2, 256)
    assert BENCH_8L["intermediate_size"] == 5632 and BENCH_8L["vocab_size"] == 151936


def test_op_profile_times_every_op_without_changing_results(eng):
    ids = list(range(40))
    s1 = eng.new_session(64)
    plain, _ = eng.target_step(s1, ids)
    prof = OpProfile(eng.ops, eng.B.synchronize)
    eng.ops = prof
    try:
        s2 = eng.new_session(64)
        profiled, _ = eng.target_step(s2, ids)
    finally:
        eng.ops = prof._ops
    assert np.array_equal(plain.view(np.uint32), profiled.view(np.uint32))
    assert s1.cache.digest() == s2.cache.digest()
    assert prof.calls["linear"] > 0 and prof.times["linear"] > 0
    report = prof.report(1.0)
    assert list(report["ops"]) == sorted(report["ops"], key=lambda k: -report["ops"][k]["s"])


def test_profile_steps_restores_the_ops(eng):
    ops = eng.ops
    out = profile_steps(eng, list(range(80)), list(range(40)))
    assert eng.ops is ops
    assert set(out) == {"decode_512", "prime_4096"} and out["decode_512"]["ops"]


def test_random_context_fill_sets_the_position(eng):
    s = eng.new_session(300)
    _fill_random_context(eng, s, 256, np.random.default_rng(0))
    assert s.cache.pos == 256
    logits, _ = eng.decode_step(s, 1)
    assert np.isfinite(logits).all() and s.cache.pos == 257


def test_committed_bench_result_reports_every_measure_against_its_goal():
    with open(COMMITTED) as f:
        r = json.load(f)
    for key in ("device", "driver", "commit", "created", "hf", "sgemm", "copy_bandwidth_bytes_per_s",
                "decode_floor_ms", "primewalk", "ratios", "goals"):
        assert key in r, key
    assert "H200" in r["device"] and r["commit"]
    assert set(r["hf"]) == {"fp32", "bf16"}
    assert {"k1", "k2", "k3"} <= set(r["primewalk"]["spec"])
    assert len(r["goals"]) == 5
    text = table(r)
    assert "prime 4096" in text and "goal" in text and "decode floor" in text


def test_bf16_variant_on_the_cpu_twin():
    """bench_bf16 on the embedded bf16 model with the CPU backend (a dry run of the GPU path):
    the bitwise check holds, the timings are there, and the bf16 floor's bytes count each matrix
    at 2 bytes."""
    from harness.engine import bf16
    from harness.gpu import bench_bf16
    from harness.models import model_path

    ck = load_checkpoint(model_path("tiny-q35"))
    r = bench_bf16.ours_bf16(ck, list(range(1, 41)), quick=True, backend="cpu")
    assert r["logits_bitwise_vs_widened_f32"] is True
    assert r["context_32k"] == 4096 and r["decode_512_ms_per_token"] > 0 and r["decode_32k_ms_per_token"] > 0
    f32, b16 = bench_bf16.decode_bytes(ck.tensors, "f32"), bench_bf16.decode_bytes(ck.tensors, "bf16")
    mats = sum(ck.tensors[k].size for k in bf16.matrix_names(ck.tensors)
               if not k.startswith("mtp.") and k != "model.embed_tokens.weight")
    assert f32 - b16 == 2 * mats and b16 < 0.6 * f32
    res = {"primewalk_bf16": r, "hf": {"bf16": {"decode_ms_per_token": 1.0}}, "decode_floor_bf16_ms": 0.5,
           "weights_bytes_decode_bf16": b16}
    lines = bench_bf16.table_lines(res)
    assert len(lines) == 3 and "bf16 decode floor 0.500" in lines[2]
    ratios, goals = bench_bf16.ratios_goals(r, res["hf"]["bf16"], 0.5)
    assert goals["bf16 logits bitwise = widened f32"] is True
    assert ratios["decode_bf16_speedup_vs_hf_bf16"] == 1.0 / r["decode_512_ms_per_token"]
