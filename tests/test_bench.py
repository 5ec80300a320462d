"""The CPU-testable parts of ``harness bench`` (the run itself needs a GPU and torch): chunked
primes, the memory bound at 131k, the curve's time box and out-of-memory path, the goals, the
figure and the table."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_factory import make_bench_result  # noqa: E402

from harness.engine.config import ModelConfig  # noqa: E402
from harness.engine.memory import plan  # noqa: E402
from harness.engine.model import Engine  # noqa: E402
from harness.engine.weights import load_checkpoint  # noqa: E402
from harness.gpu import bench_report as rep  # noqa: E402
from harness.gpu.bench import (BENCH_8L, OpProfile, _fill_random_context, attention_tflops, gemm_rates,  # noqa: E402
                               SPEC_STEP_REPS, profile_steps, spec_run, table)
from harness.models import default_model_path  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(ROOT, "receipts", "bench", "cuda-bench.json")
HISTORY_H200 = os.path.join(ROOT, "receipts", "bench", "history", "h200-bench-ada597a.json")


@pytest.fixture(scope="module")
def ck():
    return load_checkpoint(default_model_path())


@pytest.fixture(scope="module")
def eng(ck):
    return Engine(ck, "cpu")


def bench8l_config():
    d = dict(BENCH_8L, layer_types=list(BENCH_8L["layer_types"]), num_nextn_predict_layers=1)
    return ModelConfig.from_dict(d)


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def test_bench_model_is_the_issue_config():
    assert BENCH_8L["hidden_size"] == 2048 and BENCH_8L["num_hidden_layers"] == 8
    assert BENCH_8L["layer_types"].count("full_attention") == 2
    assert (BENCH_8L["linear_num_key_heads"], BENCH_8L["linear_num_value_heads"]) == (16, 32)
    assert (BENCH_8L["num_attention_heads"], BENCH_8L["num_key_value_heads"], BENCH_8L["head_dim"]) == (16, 2, 256)
    assert BENCH_8L["intermediate_size"] == 5632 and BENCH_8L["vocab_size"] == 151936


# ---- memory that does not grow with the prompt ------------------------------------------------
def test_chunked_prime_equals_the_unchunked_one_bitwise(ck):
    ids = np.random.default_rng(3).integers(0, ck.config.vocab_size, 150).tolist()
    whole, cut = Engine(ck, "cpu", chunk_rows=4096), Engine(ck, "cpu", chunk_rows=64)
    s1, s2, s3 = whole.new_session(160), cut.new_session(160), cut.new_session(160)
    l1, h1 = whole.prime_chunk(s1, ids)
    l2, h2 = cut.prime_chunk(s2, ids)  # three launches of 64, 64, 22 rows
    l3 = cut.prime(s3, ids)  # the same launches, no hidden rows kept
    assert np.array_equal(bits(l1), bits(l2)) and np.array_equal(bits(l1), bits(l3))
    assert np.array_equal(bits(whole.host(h1)), bits(cut.host(h2)))
    assert s1.cache.digest() == s2.cache.digest() == s3.cache.digest()
    assert np.array_equal(bits(cut.host(s3.last_h)), bits(whole.host(h1)[-1:]))
    assert max(a.shape[0] for a in cut._ws.values()) <= 64  # the workspace is bounded by the chunk
    la, _ = whole.decode_step(s1, 7)
    lb, _ = cut.decode_step(s3, 7)
    assert np.array_equal(bits(la), bits(lb))


def test_memory_plan_is_the_engines_workspace(ck):
    e = Engine(ck, "cpu", chunk_rows=48)
    s = e.new_session(200)
    e.prime(s, list(range(100)))
    p = plan(ck.config, 200, 48)
    assert {k: a.nbytes for k, a in e._ws.items()} == {k: p.workspace[k] for k in e._ws}  # trunk buffers
    assert set(p.workspace) - set(e._ws) == {"mtp_e", "mtp_cat"}  # the MTP head's own (the prime runs none)
    assert p.cache == sum(a.nbytes for a in [*s.cache.conv.values(), *s.cache.rec.values(), *s.cache.k.values(),
                                             *s.cache.v.values(), s.cache.mtp_k, s.cache.mtp_v])


def test_131k_prime_on_bench8l_fits_weights_plus_12_gb():
    cfg = bench8l_config()
    chunked = plan(cfg, 131072 + 64, 4096)
    assert chunked.above_weights <= rep.PEAK_ALLOWANCE_BYTES
    assert chunked.workspace == plan(cfg, 4096 + 64, 4096).workspace  # the workspace ignores the context
    assert 4.8e9 < chunked.weights < 5.0e9  # float32, MTP head included (the H200 run measured 4.91e9 on device)
    # no per-prompt-row buffer of vocab width: logits only for the rows a caller needs
    assert chunked.workspace["logits"] == 4 * cfg.vocab_size
    # without chunks the workspace alone would be tens of GB
    assert plan(cfg, 131072 + 64, 131072).workspace_bytes > 3 * rep.PEAK_ALLOWANCE_BYTES


# ---- bench measures on the CPU twin -----------------------------------------------------------
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


def test_profiles_attention_rate_and_gemm_rates(eng):
    ops = eng.ops
    out = profile_steps(eng, list(range(80)), list(range(40)), prime_lengths=(64, 80))
    assert eng.ops is ops
    assert set(out) == {"decode_40", "prime_64", "prime_80"} and out["decode_40"]["ops"]
    assert attention_tflops(eng, out, 80) > 0 and attention_tflops(eng, out, 4096) is None
    g = gemm_rates(eng, lambda fn, reps, warmup: (fn(), 1e-3)[1], rows=8)
    assert len(g["shapes"]) == 6 and g["tflops"] > 0


def test_spec_run_measures_steps_and_keeps_greedy_tokens(eng):
    r = spec_run(eng, list(range(1, 50)), 2, new_tokens=8)
    assert r["same_tokens"] and r["draft_step_ms"] > 0 and r["verify_step_ms"] > 0
    for what in ("draft", "verify"):  # the spread behind each median, over the timed steps
        rg = r[f"{what}_step_ms_range"]
        assert rg["n"] == SPEC_STEP_REPS and rg["min"] <= r[f"{what}_step_ms"] <= rg["max"]
    assert r["mean_acceptance_length"] >= 1.0 and r["draft_chained_equals_stepwise"] is True
    assert "draft_vocab" not in r and eng.draft_ids is None


def test_spec_run_times_the_draft_step_with_a_draft_vocabulary_too(eng):
    r = spec_run(eng, list(range(1, 50)), 3, new_tokens=8, draft_vocab=64, draft_vocab_curve=(32, 8))
    dv = r["draft_vocab"]
    assert dv["size"] == 64 and dv["draft_step_ms"] > 0 and dv["same_tokens"] and dv["draft_chained_equals_stepwise"]
    assert dv["draft_step_ms_range"]["min"] <= dv["draft_step_ms"] <= dv["draft_step_ms_range"]["max"]
    assert set(dv["draft_step_ms_by_size"]) == {"32", "8"} and min(dv["draft_step_ms_by_size"].values()) > 0
    assert eng.draft_ids is None  # the engine drafts over the whole vocabulary again
    assert "draft_vocab" not in spec_run(eng, list(range(1, 50)), 1, new_tokens=4, draft_vocab=eng.cfg.vocab_size)


def test_the_draft_vocabulary_goal_and_table():
    r = make_bench_result()
    r["primewalk"]["spec"]["k3"]["draft_vocab"] = {"size": 32768, "draft_step_ms": 0.5, "spec_tokens_per_s": 280.0,
                                                   "same_tokens": True, "draft_chained_equals_stepwise": True,
                                                   "draft_step_ms_by_size": {"8192": 0.3, "16384": 0.4}}
    g = rep.goals_block(r)
    assert g["draft_step_k3_draft_vocab_over_decode"]["value"] == pytest.approx(0.5 / 1.1)
    assert g["draft_step_k3_draft_vocab_over_decode"]["met"] and "32768 ids" in g["draft_step_k3_draft_vocab_over_decode"]["goal"]
    r["goals"] = g
    md = rep.readme_markdown(r)
    assert "| 3 | 32768 | 0.500 ms | 0.400 ms | 280 | yes |" in md
    assert "`draft_step_k3_draft_vocab_over_decode` | 0.455 × (0.500 ms)" in md
    assert "spec bench-8l k3: " in table(r) and "; among 32768 ids: draft step 0.50 ms" in table(r)
    assert "K = 3, N = 16,384: 0.400 ms; K = 3, N = 8,192: 0.300 ms." in md


def test_the_speculative_table_names_the_timed_run():
    """A bench records how many continuations ran before the timed one (``untimed_runs``: 2 from
    the commit after 9a49357); the table says which run its figures are, a bench without the
    field (one untimed run) the second."""
    r = make_bench_result()
    r["goals"] = rep.goals_block(r)
    assert "each timed on the second run of a reset session" in rep.readme_markdown(r)
    for s in r["primewalk"]["spec"].values():
        s["untimed_runs"] = 2
    assert "each timed on the third run of a reset session" in rep.readme_markdown(r)


def test_random_context_fill_sets_the_position(eng):
    s = eng.new_session(300)
    _fill_random_context(eng, s, 256, np.random.default_rng(0))
    assert s.cache.pos == 256
    logits, _ = eng.decode_step(s, 1)
    assert np.isfinite(logits).all() and s.cache.pos == 257


def test_causal_attention_flops():
    assert rep.causal_attention_flops(1, 1, 1, 1) == 4
    assert rep.causal_attention_flops(3, 2, 8, 1) == 4 * 8 * 2 * 6
    assert rep.causal_attention_flops(2, 1, 1, 1, start=10) == 4 * (11 + 12)


# ---- the curve: time box and out of memory ------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class OutOfMemoryError(RuntimeError):  # the name torch.cuda.OutOfMemoryError has
    pass


def test_curve_records_oom_frees_and_stops_growing():
    errors, freed, ran = {}, [], []

    def hf(n):
        ran.append(n)
        if n >= 32768:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 68.00 GiB")
        return n / 1e4

    curve = rep.new_curve(rep.CURVE_LENGTHS)
    rep.run_curve(curve, "hf_fp32", hf, None, errors, free=lambda: freed.append(1))
    assert [e["hf_fp32_s"] for e in curve] == [0.4096, 1.6384, "oom", "oom"]
    assert ran == [4096, 16384, 32768] and freed == [1]  # 131072 never runs after an oom
    assert errors["hf_fp32 prime 32768"].startswith("oom")
    assert all(e["primewalk_s"] == "skipped" for e in curve)


def test_curve_other_errors_are_recorded_not_raised():
    errors = {}
    curve = rep.new_curve([4096])
    rep.run_curve(curve, "primewalk", lambda n: 1 / 0, None, errors, free=lambda: None)
    assert curve[0]["primewalk_s"] == "error" and "ZeroDivisionError" in errors["primewalk prime 4096"]
    assert rep.is_oom(RuntimeError("CUDA_ERROR_OUT_OF_MEMORY")) and not rep.is_oom(ValueError("x"))


def test_curve_time_box_skips_what_would_not_fit():
    clock, errors = FakeClock(), {}
    budget = rep.Budget(100.0, clock)

    def run(n):  # quadratic: 1 s at 4096, 16 s at 16384, 64 s at 32768
        clock.t += (n / 4096) ** 2
        return (n / 4096) ** 2

    peaks = []
    curve = rep.new_curve(rep.CURVE_LENGTHS)
    rep.run_curve(curve, "primewalk", run, budget, errors, peak=lambda n: peaks.append(n) or n)
    assert [e["primewalk_s"] for e in curve] == [1.0, 16.0, 64.0, "skipped"]
    assert [e["peak_bytes"] for e in curve] == [4096, 16384, 32768, None]
    assert "time box" in errors["primewalk prime 131072"]


# ---- goals, figure, table ------------------------------------------------------------------------
def test_goals_block_has_every_goal_of_15_and_16():
    r = make_bench_result()
    g = r["goals"]
    assert set(g) == {"prime_4096_vs_hf_fp32", "prime_16384_vs_hf_fp32", "prime_32768_s", "prime_131072_s",
                      "prime_131072_peak_over_weights_bytes", "attention_tflops_32768", "gemm_tflops",
                      "decode_512_over_floor", "decode_32k_over_floor", "verify_step_over_decode",
                      "draft_step_k3_over_decode", "bf16_decode_512_over_bf16_floor", "mma_prime_4096_vs_hf_bf16",
                      "mma_prime_32768_s", "mma_decode_512_over_bf16_floor"}
    assert all(set(x) == {"value", "goal", "met"} for x in g.values())
    assert g["prime_4096_vs_hf_fp32"]["value"] == pytest.approx(0.2 / 0.3) and g["prime_4096_vs_hf_fp32"]["met"]
    assert g["prime_16384_vs_hf_fp32"]["met"] and g["prime_32768_s"]["met"] and g["prime_131072_s"]["met"]
    assert g["prime_131072_peak_over_weights_bytes"]["value"] == 4_100_000_000
    assert g["verify_step_over_decode"]["value"] == pytest.approx(1.2 / 1.1) and g["verify_step_over_decode"]["met"]
    assert g["draft_step_k3_over_decode"]["value"] == pytest.approx(0.4 / 1.1)
    assert g["bf16_decode_512_over_bf16_floor"] == {"value": "n/a", "goal": g["bf16_decode_512_over_bf16_floor"]["goal"],
                                                    "met": "n/a"}
    slow = make_bench_result()
    slow["prime_curve"][3]["primewalk_s"] = "skipped"
    slow["prime_curve"][2]["primewalk_s"] = 9.0
    g2 = rep.goals_block(slow)
    assert g2["prime_131072_s"]["met"] == "n/a" and g2["prime_32768_s"]["met"] is False


def test_verify_and_draft_steps_are_measured_against_the_stepwise_decode():
    """A verify or draft step is timed alone, the host waiting for it: its ratio's denominator
    is the decode step timed alike (stepwise) where the JSON has it, not the chained figure."""
    r = make_bench_result()
    r["primewalk"].update(decode_512_ms_per_token=0.8, decode_512_stepwise_ms_per_token=1.0)
    g = rep.goals_block(r)
    assert g["verify_step_over_decode"]["value"] == pytest.approx(1.2 / 1.0)
    assert g["draft_step_k3_over_decode"]["value"] == pytest.approx(0.4 / 1.0)
    assert g["decode_512_over_floor"]["value"] == pytest.approx(0.8 / 0.81)


def test_one_decode_step_is_the_median_of_the_stepwise_steps():
    """Where the JSON has the stepwise steps' spread, the verify and draft goals divide by their
    median -- one slow stretch moves the mean of 32 steps (a bench at ecb35dd: mean 2.066 ms,
    the same tree 1.40-1.46 ms in four other processes) -- and the mean stays the table's figure."""
    r = make_bench_result()
    r["primewalk"].update(decode_512_ms_per_token=0.8, decode_512_stepwise_ms_per_token=2.0,
                          decode_512_stepwise_step_ms={"median": 1.0, "min": 0.9, "max": 20.0, "steps": 32})
    g = rep.goals_block(r)
    assert g["verify_step_over_decode"]["value"] == pytest.approx(1.2 / 1.0)
    assert g["draft_step_k3_over_decode"]["value"] == pytest.approx(0.4 / 1.0)
    assert "2.000 ms" in rep.readme_markdown(r)


def test_stepwise_steps_are_the_decode_steps(eng):
    """bench.stepwise_steps_ms times the decode_step calls Engine._greedy_stepwise makes: the same
    tokens, so the same cache afterwards."""
    from harness.gpu import bench

    a, b = eng.new_session(64), eng.new_session(64)
    for s in (a, b):
        eng.target_step(s, [5, 17, 200, 3])
    times = bench.stepwise_steps_ms(eng, a, n=5, warmup=2)
    eng._greedy_stepwise(b, 1, 2 + 5, False)
    assert len(times) == 5 and all(t > 0 for t in times)
    assert a.cache.pos == b.cache.pos and a.cache.digest() == b.cache.digest()


def test_tables_of_a_run_that_skipped_stdlib_small():
    r = make_bench_result()
    r["stdlib_small"] = "skipped"
    md = rep.readme_markdown(r)
    assert "| bench-8l | 1 |" in md and "| stdlib-small |" not in md


def test_decode_table_shows_chained_and_stepwise():
    r = make_bench_result()
    old = rep.readme_markdown(r)
    assert "stepwise ms/token" not in old and "| primewalk exact, 512 context | 1.100 ms |" in old
    r["primewalk"].update(decode_512_ms_per_token=0.8, decode_512_stepwise_ms_per_token=1.0,
                          decode_chained_equals_stepwise=True)
    r["primewalk"]["mma"] = {"decode_512_ms_per_token": 0.7, "bf16_decode_floor_ms": 0.405,
                             "decode_512_stepwise_ms_per_token": 0.9, "decode_chained_equals_stepwise": False}
    md = rep.readme_markdown(r)
    assert "| primewalk exact, 512 context | 0.800 ms | 0.988 × | 1.000 ms (bitwise equal) |" in md
    assert "0.900 ms (**differ**)" in md and "| transformers fp32, 512 | 11.000 ms | | |" in md


def test_curve_figure_is_written_next_to_the_json_deterministically(tmp_path):
    r = make_bench_result()
    out = str(tmp_path / "cuda-bench.json")
    p1 = rep.write_curve_plot(r, out)
    assert p1 == str(tmp_path / "cuda-bench.prime_curve.png")
    b1 = open(p1, "rb").read()
    assert b1[:8] == b"\x89PNG\r\n\x1a\n"
    assert open(rep.write_curve_plot(r, out), "rb").read() == b1


def test_table_and_markdown_of_a_schema_2_result():
    r = json.loads(json.dumps(make_bench_result()))  # as read back from the JSON
    text = table(r)
    assert "prime curve" in text and "131072" in text and "oom" in text and "goal prime_131072_s" in text
    assert "spec stdlib-small k4" in text
    md = rep.goals_markdown(r)
    assert md.count("\n") == 1 + len(r["goals"]) and "| n/a |" in md
    assert "| 131,072 | 24.000 | oom | skipped |" in rep.curve_markdown(r)


@pytest.mark.parametrize("path", [COMMITTED, HISTORY_H200])
def test_committed_bench_result_reads(path):
    """The committed bench (the README's tables) and the H200 bench kept in history/ both read."""
    with open(path) as f:
        r = json.load(f)
    for key in ("device", "driver", "commit", "created", "hf", "sgemm", "copy_bandwidth_bytes_per_s",
                "decode_floor_ms", "primewalk", "ratios", "goals"):
        assert key in r, key
    assert r["device"].startswith("cuda: NVIDIA H") and r["commit"]
    if path == HISTORY_H200:
        assert "H200" in r["device"] and r["commit"].startswith("ada597a")
    assert set(r["hf"]) == {"fp32", "bf16"}
    assert {"k1", "k2", "k3"} <= set(r["primewalk"]["spec"])
    if r.get("schema_version", 1) >= 2:
        assert {e["tokens"] for e in r["prime_curve"]} >= {4096, 16384, 32768}
        assert set(rep.goals_block(r)) == set(r["goals"]) and r.get("code_fingerprint")
    text = table(r)
    assert "prime 4096" in text and "goal" in text and "decode floor" in text


def test_hf_prime_runner_on_a_tiny_model_on_the_cpu(ck):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from harness.gpu.bench import Timer, hf_prime_runner

    with open(os.path.join(default_model_path(), "config.json")) as f:
        cfg = transformers.Qwen3NextConfig(**{k: v for k, v in json.load(f).items() if k != "model_type"})
    m = transformers.Qwen3NextForCausalLM(cfg).eval()
    run = hf_prime_runner(m, list(range(200)), Timer(lambda: None), first=64, device="cpu")
    curve = rep.new_curve([64, 128])
    errors = {}
    rep.run_curve(curve, "hf_fp32", run, None, errors)
    assert not errors and all(isinstance(e["hf_fp32_s"], float) and e["hf_fp32_s"] > 0 for e in curve)
    del torch


def test_bench_table_tool_reads_a_schema_2_result(tmp_path, capsys):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import bench_table

    path = str(tmp_path / "b.json")
    with open(path, "w") as f:
        json.dump(make_bench_result(), f)
    assert bench_table.main([path]) == 0
    out = capsys.readouterr().out
    assert "| 4,096 |" in out and "| `prime_32768_s` |" in out and "| stdlib-small | 4 |" in out


def _bench_table():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import bench_table

    return bench_table


def test_bench_table_rewrites_only_the_readme_block_and_checks_it(tmp_path, capsys):
    bt = _bench_table()
    path = str(tmp_path / "b.json")
    with open(path, "w") as f:
        json.dump(make_bench_result(), f)
    readme = tmp_path / "README.md"
    before, after = "# x\n\nprose before\n\n", "\n\nprose after\n"
    readme.write_text(before + rep.README_BEGIN + "\nstale | 1.000 ×\n" + rep.README_END + after, encoding="utf-8")
    assert bt.main([path, "--check", str(readme)]) == 1
    assert bt.main([path, "--readme", str(readme)]) == 0
    text = readme.read_text(encoding="utf-8")
    assert text.startswith(before + rep.README_BEGIN + "\n") and text.endswith(rep.README_END + after)
    assert "stale" not in text and rep.readme_block(text) == rep.readme_markdown(make_bench_result(), path)
    assert bt.main([path, "--check", str(readme)]) == 0
    assert bt.main([path, "--readme", str(readme)]) == 0 and readme.read_text(encoding="utf-8") == text
    assert "unchanged" in capsys.readouterr().out


@pytest.mark.parametrize("readme_text, bench_text", [
    ("no markers here\n", None),
    (rep.README_END + "\n" + rep.README_BEGIN + "\n", None),  # out of order
    (rep.README_BEGIN + "\n" + rep.README_END + "\n" + rep.README_END + "\n", None),  # two ends
    (rep.README_BEGIN + "\n" + rep.README_END + "\n", "{not json"),
    (rep.README_BEGIN + "\n" + rep.README_END + "\n", "[1, 2]"),
])
def test_bench_table_bad_input_is_one_line_and_exit_2(tmp_path, capsys, readme_text, bench_text):
    bt = _bench_table()
    path = tmp_path / "b.json"
    path.write_text(bench_text if bench_text is not None else json.dumps(make_bench_result()), encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(readme_text, encoding="utf-8")
    assert bt.main([str(path), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_table: error: ") and err.count("\n") == 1
    assert readme.read_text(encoding="utf-8") == readme_text  # untouched
    assert bt.main([str(tmp_path / "missing.json")]) == 2


def test_readme_goal_rows_follow_the_goals_block():
    """Every goal of the JSON gets one row, in the issue order, with its unit; a goal the run
    could not measure shows n/a and no detail."""
    r = make_bench_result()
    md = rep.readme_markdown(r)
    rows = [ln for ln in md.splitlines() if ln.startswith("| #") or ln.startswith("|  |")]
    assert len(rows) == len(r["goals"])
    assert [ln.split("`")[1] for ln in rows] == [n for _, n in rep.GOAL_ORDER if n in r["goals"]] + \
        [n for n in r["goals"] if n not in {g for _, g in rep.GOAL_ORDER}]
    for ln in rows:
        name, measured = ln.split("`")[1], ln.split("|")[3].strip()
        g = r["goals"][name]
        if g["value"] == rep.NA:
            assert measured == "n/a" and ln.rstrip().endswith("| n/a |")
        else:
            assert measured.split()[1] in ("×", "s", "GiB", "TFLOP/s"), ln


def test_the_whole_bench_runs_on_the_cpu_with_a_tiny_model(tmp_path, monkeypatch):
    """run_bench end to end off the GPU: bench-8l swapped for the tiny config, torch and the
    engine on the CPU, the hardware anchors faked; the JSON has every block the README, the
    notebook and ``harness evidence`` read."""
    pytest.importorskip("transformers")
    from harness.gpu import bench
    from harness.gpu.evidence import receipt_facts

    with open(os.path.join(default_model_path(), "config.json")) as f:
        tiny = json.load(f)
    rope = tiny.pop("rope_parameters")
    tiny.pop("model_type")
    tiny.update(rope_theta=rope["rope_theta"], partial_rotary_factor=rope["partial_rotary_factor"])
    monkeypatch.setattr(bench, "BENCH_8L", tiny)
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "BACKEND", "cpu")
    monkeypatch.setattr(bench, "torch_anchors", lambda timer: ({"fake": {"s": 1.0, "tflops": 1.0}}, 1e11))
    out = str(tmp_path / "bench.json")
    # spec_run, profile_step and stdlib_spec have their own tests above and below
    r = bench.run_bench(out, commit="c0ffee", lengths=[48, 96], budget_s=3000,
                        skip=["decode-32k", "walker", "stdlib", "hf-bf16", "spec", "profile", "mma"])
    with open(out) as f:
        back = json.load(f)
    assert back["schema_version"] == 2 and back["commit"] == "c0ffee" and not back["errors"], back["errors"]
    assert [e["tokens"] for e in back["prime_curve"]] == [48, 96]
    assert all(isinstance(e[k], float) for e in back["prime_curve"] for k in ("primewalk_s", "hf_fp32_s"))
    assert all(e["hf_bf16_s"] == "skipped" for e in back["prime_curve"])
    assert back["primewalk"]["spec"] == {} and back["primewalk"]["logits_rel_err_vs_hf_fp32"] < 1e-4
    assert back["goals"]["prime_32768_s"]["met"] == "n/a" and back["goals"]["gemm_tflops"]["met"] in (True, False)
    assert back["goals"]["decode_512_over_floor"]["met"] in (True, False)
    bf = back["goals"]["bf16_decode_512_over_bf16_floor"]  # bench-8l rounded to bf16, resident as bf16 bits
    assert isinstance(bf["value"], float) and bf["value"] > 0 and bf["met"] in (True, False), bf
    assert back["primewalk"]["bf16"]["decode_bytes"] < 0.6 * back["weights_bytes_decode"]
    for part in (back["primewalk"], back["primewalk"]["bf16"]):  # the chained decode beside the stepwise one
        assert part["decode_chained_equals_stepwise"] is True and part["decode_512_stepwise_ms_per_token"] > 0
        st = part["decode_512_stepwise_step_ms"]  # ... and its steps' spread, the host's pace beside it
        assert st["steps"] == 32 and 0 < st["min"] <= st["median"] <= st["max"], st
        assert st["host_pace"]["argmax_us"] > 0 and st["host_pace"]["py_loop_us"] > 0, st
        assert st["min"] <= part["decode_512_stepwise_ms_per_token"] <= st["max"]
    assert receipt_facts(back)["fingerprint"] and os.path.exists(r["figure"])
    assert "goal prime_4096_vs_hf_fp32" in bench.table(back)


def test_stdlib_spec_on_the_cpu(monkeypatch):
    from harness.gpu import bench

    monkeypatch.setattr(bench, "BACKEND", "cpu")
    r = bench.stdlib_spec((2,), new_tokens=8, prompt_tokens=64)
    assert r["prompt_tokens"] == 64 and r["spec"]["k2"]["same_tokens"] and r["decode_ms_per_token"] > 0


def test_goals_of_failed_measures_are_n_a():
    r = make_bench_result()
    r["primewalk"].update(gemm="error", decode_512_ms_per_token="oom", spec={"k1": "error"})
    g = rep.goals_block(r)
    for key in ("gemm_tflops", "decode_512_over_floor", "verify_step_over_decode", "draft_step_k3_over_decode"):
        assert g[key]["met"] == "n/a", key


def test_curve_time_box_counts_every_run_of_a_point():
    clock, errors = FakeClock(), {}
    budget = rep.Budget(40.0, clock)

    def run(n):  # two runs per point
        t = (n / 4096) ** 2
        clock.t += 2 * t
        return t

    curve = rep.new_curve([4096, 16384])
    rep.run_curve(curve, "primewalk", run, budget, errors, runs=lambda n: 3)  # 3 x 16 = 48 s > 38 s left
    assert [e["primewalk_s"] for e in curve] == [1.0, "skipped"]


def test_mma_goals_and_table():
    """issue #19's goals (the exact-bf16 mode, ``primewalk.mma``) in the same goals block."""
    from harness.gpu import bench, bench_mma
    from harness.gpu.bench_report import goals_block

    r = {"hf": {"bf16": {"prime_4096_tokens_per_s": 1000.0}},
         "primewalk": {"mma": {"prime_4096_tokens_per_s": 1500.0, "prime_32768_s": "skipped",
                               "decode_512_ms_per_token": 0.6, "bf16_decode_floor_ms": 0.5}}}
    g = goals_block(r)
    assert g["mma_prime_4096_vs_hf_bf16"]["value"] == pytest.approx(1.5) and g["mma_prime_4096_vs_hf_bf16"]["met"]
    assert g["mma_prime_32768_s"]["met"] == "n/a"
    assert g["mma_decode_512_over_bf16_floor"]["value"] == pytest.approx(1.2) and g["mma_decode_512_over_bf16_floor"]["met"]
    assert "exact-bf16: prime 4096 1500.0 tok/s (hf bf16 1000.0)" in bench_mma.table_lines(r)[0]
    assert bench_mma.table_lines({"primewalk": {"mma": {"n/a": "skipped"}}}) == []
    r["primewalk"]["mma"].update(prime_32768_s=0.9, prime_32768_cold_s=1.5)
    assert "prime 32768 0.900 s (cold 1.500)" in bench_mma.table_lines(r)[0]
    assert "mma" in bench.SKIPPABLE


@pytest.mark.parametrize("left", [0.0, 1e9])
def test_mma_part_on_the_cpu_twin(left):
    """bench_mma.measure on the tiny model with the CPU backend (a dry run of the GPU path): the
    32k prime is skipped when it does not fit (said so), the rest is measured; the prime's per-op
    profile only when time is left for it."""
    from harness.gpu import bench, bench_mma

    ck = load_checkpoint(default_model_path())
    ids = [int(i) % ck.config.vocab_size for i in range(1, 33)]
    m = bench_mma.measure(ck, ids, ids[:16], bench.Timer(lambda: None), False, time_left=lambda: left,
                          floor_ms=0.5, backend="cpu")
    assert m["mode"] == "exact-bf16" and m["prime_4096_tokens_per_s"] > 0 and m["decode_512_ms_per_token"] > 0
    assert m["decode_chained_equals_stepwise"] is True and m["decode_512_stepwise_ms_per_token"] > 0
    assert m["prime_32768_s"] == "skipped" and "left" in m["prime_32768_skipped"]
    if left:
        prof = m["profile_prime_4096"]
        assert prof["total_s"] > 0 and prof["ops"]["linear"]["calls"] > 0 and "attention" in prof["ops"]
    else:
        assert "profile_prime_4096" not in m


@pytest.mark.parametrize("left", [0.0, 1e9])
def test_mma_long_prime_cold_then_warm(left):
    """The long prime (short here: 64 tokens after a 32-token one) runs cold, then warm when the
    time box allows or the cold run was short: ``prime_32768_s`` is the warm run, the cold one is
    kept; with no time left and a cold run past ``SMALL_32K_S`` only the cold run counts."""
    from harness.gpu import bench, bench_mma

    ck = load_checkpoint(default_model_path())
    ids = [int(i) % ck.config.vocab_size for i in range(1, 33)]
    times = iter([0.5, 20.0, 0.4])  # the short prime, the cold long one, the warm long one

    def timer(fn, reps=3, warmup=1):
        for _ in range(warmup + reps):
            fn()
        return next(times)

    m = bench_mma.measure(ck, ids, ids[:16], timer, False, time_left=lambda: left, floor_ms=0.5,
                          backend="cpu", long_tokens=64)
    assert m["prime_32768_cold_s"] == 20.0
    if left:
        assert m["prime_32768_s"] == 0.4 and m["prime_32768_runs"].startswith("cold, then warm")
    else:
        assert m["prime_32768_s"] == 20.0 and m["prime_32768_runs"].startswith("one cold run")


def test_bf16_decode_bytes_count_each_matrix_at_two_bytes():
    """The bf16 floor's numerator: every matrix at 2 bytes, norms / conv / A_log / dt_bias at 4, MTP
    head and embedding excluded."""
    from harness.engine import bf16
    from harness.models import model_path

    ck = load_checkpoint(model_path("tiny-q35"))
    f32, b16 = bf16.decode_bytes(ck.tensors, "f32"), bf16.decode_bytes(ck.tensors, "bf16")
    mats = sum(ck.tensors[k].size for k in bf16.matrix_names(ck.tensors)
               if not k.startswith("mtp.") and k != "model.embed_tokens.weight")
    assert f32 - b16 == 2 * mats and b16 < 0.6 * f32


def test_goals_on_another_gpu_than_the_issues_say_so():
    """The goals are stated for an H200: a bench from another GPU says, beside its goals, that
    `met` reads that run against the targets (README tables and the printed table); an H200's
    bench, or one that names no device, says nothing more."""
    r = json.loads(json.dumps(make_bench_result()))
    for device, says in (("cuda: NVIDIA H200 (cc 9.0)", False), ("", False),
                         ("cuda: NVIDIA H100 80GB HBM3 (cc 9.0)", True)):
        r["device"] = device
        note, md = rep.goals_device_note(r), rep.readme_markdown(r)
        assert bool(note) == says, device
        assert (note in md) if says else ("The goals (the JSON's `goals` block):" in md)
        assert ("note goals:" in table(r)) == says
    assert "NVIDIA H100 80GB HBM3 (cc 9.0)" in note and "cuda:" not in note and "H200" in note
