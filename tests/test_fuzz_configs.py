"""tools/fuzz_configs.py draws configurations the loader takes and specs the matrix takes (the
runs themselves -- transformers, the matrix in both modes, the simulator -- are the tool's, a
session's work, not CI's)."""

from __future__ import annotations

import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import fuzz_configs as fz  # noqa: E402


def test_every_drawn_config_loads_and_spans_the_space():
    """300 draws: each a config ModelConfig accepts (with an MTP layer); together they reach both
    families' variations (odd hidden sizes, conv kernels 2-6, MoE with and without
    renormalisation, tied embeddings, mrope sections, models of one layer type)."""
    from harness.engine.config import ModelConfig

    seen = {"conv": set(), "norm_topk": set(), "tied": set(), "types": set(), "odd_hidden": False, "one_kind": False}
    for seed in range(300):
        d = fz.rand_config(random.Random(seed))
        cfg = ModelConfig.from_dict(dict(d, num_nextn_predict_layers=1), f"draw {seed}")
        assert cfg.num_hidden_layers == len(d["layer_types"])
        seen["conv"].add(d["linear_conv_kernel_dim"])
        seen["norm_topk"].add(d.get("norm_topk_prob"))
        seen["tied"].add(d["tie_word_embeddings"])
        seen["types"].add(d.get("model_type", "qwen3_next"))
        seen["odd_hidden"] |= d["hidden_size"] % 4 != 0
        seen["one_kind"] |= len(set(d["layer_types"])) == 1
    assert seen["conv"] == {2, 3, 4, 5, 6}
    assert {True, False} <= seen["norm_topk"] and seen["tied"] == {True, False}
    assert seen["types"] == {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}
    assert seen["odd_hidden"] and seen["one_kind"]


def test_every_drawn_spec_loads(tmp_path):
    """100 draws of the random spec: each one the spec loader takes (its points leave 32 rows on
    each side, its keys are the documented ones) on the embedded tiny model, its cells listed."""
    from harness.matrix.cells import cell_listing
    from harness.matrix.specfile import load_spec

    for seed in range(100):
        p = tmp_path / f"s{seed}.toml"
        p.write_text(fz.rand_spec(random.Random(seed), "tiny"))
        listing = cell_listing(load_spec(str(p)))  # every point resolved against every prompt
        assert "split@" in listing and "/k" in listing, listing[:400]


def test_device_and_sim_flags_are_checked(monkeypatch, capsys):
    """--device without a visible GPU, and --device with --sim, stop with a one-line error (exit 2)
    before any configuration is drawn."""
    import pytest
    from numba import cuda

    monkeypatch.setattr(cuda, "is_available", lambda: False)
    for argv, msg in ((["--device", "--n", "1"], "--device needs a CUDA GPU"),
                      (["--device", "--sim", "--n", "1"], "--sim and --device are two runs of the same step")):
        with pytest.raises(SystemExit) as e:
            fz.main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


def test_wide_draws_load_and_cross_the_kernel_thresholds():
    """--wide's draws: configs the loader takes, reaching head dims past 256, 17 query heads a KV
    head, hidden sizes with K % 16 == 8; the small draws are not changed by the option (the same
    seeds give the configurations earlier runs recorded)."""
    from harness.engine.config import ModelConfig

    hds, reps, odd16 = set(), set(), False
    for seed in range(200):
        d = fz.rand_config(random.Random(seed), wide=True)
        ModelConfig.from_dict(dict(d, num_nextn_predict_layers=1), f"wide draw {seed}")
        hds.add(d["head_dim"])
        reps.add(d["num_attention_heads"] // d["num_key_value_heads"])
        odd16 |= d["hidden_size"] % 16 == 8
    assert 272 in hds and 17 in reps and odd16
    # the configurations a GPU run recorded before --wide existed (fuzz_configs at 4a4ef7a)
    rec = os.path.join(ROOT, "receipts", "probes", "h100-fuzz-device-4a4ef7a", "fuzz-9900.jsonl")
    with open(rec, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            assert dict(fz.rand_config(random.Random(r["seed"])), num_nextn_predict_layers=1) == r["config"], r["seed"]
