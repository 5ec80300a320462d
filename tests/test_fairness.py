"""``harness fairness``: the spec (every problem reported at once), the runner's bitwise verdict
(and that it fails, naming the session and field, when a session's state is disturbed), the
receipt (``harness diff``, CSV, figures), the CLI, the committed CPU receipt as a golden, and the
H200 spec's code path scaled down to the tiny model."""

import copy
import json
import os
import tomllib

import numpy as np
import pytest

from harness.cli import main
from harness.engine.model import Engine
from harness.engine.weights import load_checkpoint
from harness.errors import PrimewalkError
from harness.fairness import runner
from harness.fairness.plots import FIGURES, plot_fairness
from harness.fairness.receipt import read_fairness_receipt, write_fairness_receipt
from harness.fairness.runner import run_fairness
from harness.fairness.specfile import METRICS, SPECS_DIR, builtin_specs, load_spec, parse_spec
from harness.matrix.diff import diff_receipts
from harness.matrix.plots import png_bytes
from harness.matrix.receipts import load
from harness.models import default_model_path
from harness.walk.scheduler import PRIME

TINY_SPEC = os.path.join(SPECS_DIR, "tiny.toml")
GPU_SPEC = os.path.join(SPECS_DIR, "bench-8l.toml")

SMALL = {  # a quick spec: 3 peers around a 200-token prime
    "chunk_rows": 32, "fill_chunk": 32, "arrival_unit": "long_prime",
    "policies": ["drain", "yield", {"name": "interval", "steps": 2}],
    "long": {"length": 200, "max_new_tokens": 6, "k": 2, "boundary": 96},
    "peers": {"count": 3, "arrival_interval": 0.2, "prompt_lengths": [12, 30, 45], "k": [1, 0, 3],
              "max_new_tokens": [5, 7], "sampling": [{"temperature": 0.0}, {"temperature": 0.7, "seed": 2}]},
    "goals": [{"metric": "peers_p95_s", "policy": "yield", "baseline": "drain", "max_ratio": 0.5}],
}


def fixed_clock(fn):
    kind, phase, rows = out = fn()
    return out, (rows * 1e-3 if kind == PRIME else 2e-3)


@pytest.fixture(scope="module")
def eng():
    return Engine(load_checkpoint(default_model_path()), "cpu")


@pytest.fixture(scope="module")
def small_receipt(eng):
    return run_fairness(parse_spec(copy.deepcopy(SMALL)), timer=fixed_clock, engine=eng)


def one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------------------------------------
# the spec
# ------------------------------------------------------------------------------------------------
def test_every_problem_is_reported_at_once():
    bad = {"chunk_rows": 0, "policies": ["drain", "fifo"], "surprise": 1,
           "long": {"length": 100, "text": "x", "k": -1},
           "peers": {"count": 2, "arrivals": [0.1], "k": ["a"], "sampling": {"temperature": -1}},
           "goals": [{"metric": "speed", "policy": "yield", "baseline": "drain", "max_ratio": 0}]}
    with pytest.raises(PrimewalkError) as e:
        parse_spec(bad, where="f.toml")
    text = one_line(e)
    assert text.startswith("f.toml: ") and " problems: " in text
    for key in ("surprise: unknown key", "chunk_rows: expected a positive integer, got 0", "policies[1]",
                "long: give exactly one of length", "long.k: expected an integer >= 0",
                "peers.arrivals: expected a list of 2 times", "peers.k[0]", "peers.sampling.temperature",
                "goals[0].metric", "goals[0].policy", "goals[0].max_ratio"):
        assert key in text, key


@pytest.mark.parametrize("change,message", [
    ({"long": None}, "long: missing"),
    ({"policies": None}, "policies: missing"),
    ({"policies": ["yield", "yield"]}, "policies[1]: yield is already policies[0]"),
    ({"policies": [{"name": "interval"}]}, "policies[0].steps: missing"),
    ({"policies": [{"name": "interval", "steps": 2, "x": 1}]}, "policies[0].x: unknown key"),
    ({"long": {"length": 100, "boundary": 80}}, "long.boundary: row 80 of a 100-token prompt leaves a segment"),
    ({"long": {"text": "hello", "seed": 3}}, "long.seed: only a synthetic prompt"),
    ({"peers": {"count": 2}}, "peers: give exactly one of arrivals"),
    ({"peers": {"arrival_interval": 0.1}}, "peers.count: missing"),
    ({"peers": {"count": 1, "arrival_interval": 0.1, "arrival_seed": 3}}, "peers.arrival_seed: only poisson"),
    ({"peers": {"count": 1, "arrival_interval": -1}}, "peers.arrival_interval: expected a number > 0"),
    ({"arrival_unit": "ms"}, 'arrival_unit: expected "s" or "long_prime"'),
    ({"model": "no/such/folder"}, "model: no/such/folder: not a checkpoint folder"),
    ({"goals": [{"metric": "long_ttft_s", "policy": "drain", "baseline": "nope", "max_ratio": 1}]},
     "goals[0].baseline: expected a policy of this spec"),
])
def test_one_problem_one_line(change, message):
    data = copy.deepcopy(SMALL)
    for key, value in change.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    with pytest.raises(PrimewalkError) as e:
        parse_spec(data, where="f.toml")
    assert message in one_line(e)


def test_arrival_patterns():
    def arrivals(peers):
        return [p.arrival for p in parse_spec(dict(copy.deepcopy(SMALL), peers=peers)).peers]

    assert arrivals({"count": 3, "arrival_interval": 0.5}) == [0.5, 1.0, 1.5]
    assert arrivals({"count": 3, "arrival_interval": 0.5, "first_arrival": 0.0}) == [0.0, 0.5, 1.0]
    assert arrivals({"count": 2, "arrivals": [3, 0.25]}) == [3.0, 0.25]
    pois = arrivals({"count": 5, "poisson_interval": 0.1, "arrival_seed": 4})
    assert pois == sorted(pois) and pois[0] > 0 and pois == arrivals({"count": 5, "poisson_interval": 0.1,
                                                                      "arrival_seed": 4})
    assert pois != arrivals({"count": 5, "poisson_interval": 0.1, "arrival_seed": 5})
    assert arrivals({"count": 0}) == []
    spec = parse_spec(dict(copy.deepcopy(SMALL), peers={"count": 5, "arrival_interval": 1, "k": [1, 2],
                                                         "prompt_lengths": [10, 20, 30]}))
    assert [(p.name, p.k, p.length) for p in spec.peers] == [
        ("peer1", 1, 10), ("peer2", 2, 20), ("peer3", 1, 30), ("peer4", 2, 10), ("peer5", 1, 20)]


def test_builtin_specs_load():
    assert set(builtin_specs()) == {"tiny", "bench-8l"}
    tiny = load_spec(TINY_SPEC)
    assert tiny.builtin == "tiny" and tiny.golden.endswith(os.path.join("receipts", "fairness", "tiny.json"))
    gpu = load_spec(GPU_SPEC, model="tiny")  # the bench-8l folder exists only on the GPU box
    assert gpu.backend == "cuda" and gpu.long.length == 131072 and len(gpu.peers) == 8
    assert [g.metric for g in gpu.goals] == ["peers_p95_s", "long_ttft_s"] and set(METRICS) >= {"peers_p95_s"}
    with pytest.raises(PrimewalkError) as e:
        load_spec(GPU_SPEC)
    assert "out/bench-8l: not a checkpoint folder" in one_line(e)


# ------------------------------------------------------------------------------------------------
# the runner and its verdict
# ------------------------------------------------------------------------------------------------
def test_every_session_is_bitwise_across_policies_and_alone(small_receipt):
    r = small_receipt
    assert r["kind"] == "fairness" and r["verdict"]["status"] == "bitwise" and not r["verdict"]["failed"]
    runs = ["alone", "drain", "yield", "interval@2"]
    assert [c["id"] for c in r["cells"]] == [f"{run}/{s}" for run in runs for s in ("long", "peer1", "peer2", "peer3")]
    by_session = {}
    for c in r["cells"]:
        assert c["verdict"]["status"] == "bitwise", c["id"]
        by_session.setdefault(c["session"], set()).add(json.dumps([c["digests"], c["tape"], c["continuation"]]))
    assert all(len(v) == 1 for v in by_session.values())
    alone = [c for c in r["cells"] if c["run"] == "alone"]
    assert all("independent unyielded prime" in c["verdict"]["detail"] for c in alone)
    long = alone[0]
    assert long["boundary_points"] == [96] and long["yields"] == len(long["tape"]) - 1


def test_policy_measures_on_a_fixed_clock(small_receipt):
    r = small_receipt
    pols = {p["label"]: p for p in r["policies"]}
    # alone, the long prompt's first token comes after its trunk: 200 rows at 1 ms
    assert r["alone"]["long_ttft_s"] == pytest.approx(0.2)
    assert [s["arrival_s"] for s in r["sessions"]] == pytest.approx([0.0, 0.04, 0.08, 0.12])
    drain, yld = pols["drain"], pols["yield"]
    assert drain["long_ttft_s"] == pytest.approx(0.2)  # nothing runs before it ends
    assert drain["longest_hold_s"] > yld["longest_hold_s"]
    assert yld["peers_p95_s"] < drain["peers_p95_s"]
    assert len(drain["peers_first_event_latency_s"]["values"]) == 3
    g = r["goals"][0]
    assert g["ratio"] == pytest.approx(yld["peers_p95_s"] / drain["peers_p95_s"]) and g["met"] is True
    for p in r["policies"]:
        assert p["units"] == len(p["timeline"]) and p["makespan_s"] == p["timeline"][-1][5]


def test_a_disturbed_session_fails_naming_the_session_and_the_fields(eng, monkeypatch):
    """A peer's unit that writes into the long prime's recurrent state (the hazard of a shared
    workspace done wrong) under one policy: that cell fails, the others stay bitwise."""
    real = runner.run_schedule

    def clobbering(fn):
        out = fn()
        run = fn.__self__
        long = clobbering.long
        if run.index == 1 and long.sess is not None and long.walker is not None:
            long.sess.cache.rec[0][0, 0, 0] += np.float32(0.5)  # the long prime's state, disturbed
        return fixed_clock(lambda: out)

    def schedule(engine, jobs, policy, timer=None, pool=None):
        if policy.label != "yield" or len(jobs) == 1:
            return real(engine, jobs, policy, timer, pool)
        import harness.walk.scheduler as sched

        orig = sched._Run.__init__

        def init(self, *a, **k):
            orig(self, *a, **k)
            if self.index == 0:
                clobbering.long = self

        monkeypatch.setattr(sched._Run, "__init__", init)
        try:
            return real(engine, jobs, policy, clobbering, pool)
        finally:
            monkeypatch.setattr(sched._Run, "__init__", orig)

    monkeypatch.setattr(runner, "run_schedule", schedule)
    r = run_fairness(parse_spec(copy.deepcopy(SMALL)), timer=fixed_clock, engine=eng)
    assert r["verdict"]["status"] == "fail" and r["verdict"]["failed"] == ["yield/long"]
    cell = next(c for c in r["cells"] if c["id"] == "yield/long")
    assert cell["verdict"]["detail"].startswith("differs from the session alone: ")
    assert "final_state" in cell["verdict"]["detail"] and "logits" in cell["verdict"]["detail"]
    assert cell["verdict"]["max_ulp"] > 0


def test_zero_peers_and_seconds(eng):
    spec = parse_spec(dict(copy.deepcopy(SMALL), arrival_unit="s", peers={"count": 0}, goals=[]))
    r = run_fairness(spec, timer=fixed_clock, engine=eng)
    assert r["verdict"]["status"] == "bitwise" and len(r["sessions"]) == 1
    assert all(p["peers_p95_s"] is None for p in r["policies"])
    assert r["alone"]["arrival_scale_s"] == 1.0


def test_out_of_vocab_text_is_refused(eng):
    spec = parse_spec(dict(copy.deepcopy(SMALL), long={"text": "é" * 40}))
    small = Engine(load_checkpoint(default_model_path()), "cpu")
    small.cfg.vocab_size = 100  # a model whose vocabulary lacks the bytes of 'é'
    with pytest.raises(PrimewalkError) as e:
        run_fairness(spec, engine=small)
    assert "long: token id 195 is out of range" in one_line(e)


# ------------------------------------------------------------------------------------------------
# receipts, diff, figures
# ------------------------------------------------------------------------------------------------
def test_receipt_round_trip_diff_and_table(small_receipt, tmp_path):
    path = str(tmp_path / "f.json")
    write_fairness_receipt(path, small_receipt)
    back = read_fairness_receipt(path)
    assert back["cells"] == json.loads(json.dumps(small_receipt["cells"]))
    assert diff_receipts(path, path).exit_code == 0
    changed = copy.deepcopy(back)
    cell = next(c for c in changed["cells"] if c["id"] == "yield/peer2")
    cell["digests"]["final_state"] = "0" * 64
    cell["timings"]["first_event_s"] += 5  # informational
    result = diff_receipts(back, changed)
    assert result.exit_code == 1
    assert [(r.cell, r.field) for r in result.rows] == [("yield/peer2", "digests.final_state")]
    df = load(path.replace(".json", ".csv"))
    assert len(df) == 16 and set(df["run"]) == {"alone", "drain", "yield", "interval@2"}


def test_figures_are_written_and_reproducible(small_receipt, tmp_path):
    path = str(tmp_path / "f.json")
    write_fairness_receipt(path, small_receipt)
    written = plot_fairness(path)
    assert [os.path.basename(p) for p in written] == ["f.timeline.png", "f.first_event.png"]
    again = {name: png_bytes(build(small_receipt)) for name, build in FIGURES}
    for p, (name, _) in zip(written, FIGURES):
        assert open(p, "rb").read() == again[name]


def test_cli_run_diff_plot(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('chunk_rows = 32\nfill_chunk = 32\npolicies = ["drain", "yield"]\n'
                    '[long]\nlength = 100\nmax_new_tokens = 4\n'
                    '[peers]\ncount = 2\narrival_interval = 0.001\nprompt_lengths = [10, 20]\nmax_new_tokens = 3\n')
    out = tmp_path / "o" / "r.json"
    assert main(["fairness", "--spec", str(spec), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "every session bitwise equal across policies and alone" in text and "yield:" in text
    assert sorted(os.listdir(out.parent)) == ["r.csv", "r.first_event.png", "r.json", "r.timeline.png"]
    assert main(["diff", str(out), str(out)]) == 0
    for png in out.parent.glob("*.png"):
        png.unlink()
    assert main(["plot", str(out)]) == 0
    assert len(list(out.parent.glob("*.png"))) == 2


@pytest.mark.parametrize("argv,message", [
    (["fairness", "--spec", "no-such.toml"], "no-such.toml: cannot read the spec"),
    (["fairness", "--spec", TINY_SPEC, "--update-golden", "--out", "x.json"], "--out is given"),
    (["fairness", "--spec", TINY_SPEC, "--update-golden", "--backend", "cuda"], "the backend is cuda"),
    (["fairness", "--spec", TINY_SPEC, "--model", "nowhere"], "--model: nowhere: not a checkpoint folder"),
])
def test_cli_errors_are_one_line(argv, message, capsys, tmp_path):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_update_golden_refuses_other_specs(tmp_path, capsys):
    spec = tmp_path / "mine.toml"
    spec.write_text(open(TINY_SPEC).read())
    assert main(["fairness", "--spec", str(spec), "--update-golden"]) == 2
    assert "is not a built-in fairness spec" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# the committed receipts
# ------------------------------------------------------------------------------------------------
def test_cpu_spec_matches_its_committed_receipt(eng):
    """The CI gate: the CPU spec re-run here equals receipts/fairness/tiny.json in every compared
    field (digests, verdicts, tapes, continuations, acceptance counts; timings are informational)."""
    spec = load_spec(TINY_SPEC)
    if not os.path.exists(spec.golden):
        pytest.fail("receipts/fairness/tiny.json is missing: run `harness fairness --spec "
                    "harness/specs/fairness/tiny.toml --update-golden` and commit it", pytrace=False)
    golden = read_fairness_receipt(spec.golden)
    fresh = run_fairness(spec, engine=eng)
    assert fresh["verdict"]["status"] == "bitwise", fresh["verdict"]["failed"]
    result = diff_receipts(golden, fresh)
    assert result.exit_code == 0, f"{result.summary}\n{result.table()}"
    # the peers arrive while the long prompt primes (arrivals are fractions of its time alone)
    ttft = golden["alone"]["long_ttft_s"]
    assert all(0 < s["arrival_s"] < ttft for s in golden["sessions"] if s["role"] == "peer")


def test_gpu_spec_runs_scaled_down_on_the_cpu(eng):
    """bench-8l.toml's code path (8 peers arriving during the prime in units of it, drain vs yield,
    its goals) on the tiny model with a shorter long prompt and smaller chunks."""
    with open(GPU_SPEC, "rb") as f:
        data = tomllib.load(f)
    data.update(model="tiny", backend="cpu", chunk_rows=64, fill_chunk=64)
    data["long"]["length"] = 768
    data["peers"]["prompt_lengths"] = [16, 32, 64]
    r = run_fairness(parse_spec(data), timer=fixed_clock, engine=eng)
    assert r["verdict"]["status"] == "bitwise" and len(r["sessions"]) == 9
    assert [p["label"] for p in r["policies"]] == ["drain", "yield"]
    assert [g["met"] is not None for g in r["goals"]] == [True, True]
    drain = r["policies"][0]
    assert drain["long_ttft_s"] < min(c["timings"]["first_event_s"] for c in r["cells"]
                                      if c["run"] == "drain" and c["role"] == "peer")
