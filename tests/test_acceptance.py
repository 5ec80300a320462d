"""``harness.matrix.receipts.acceptance_by_k``: acceptance pooled by drafts, the one aggregation the plots,
the acceptance notebook and ``tools/acceptance_table.py`` use."""

import os
import subprocess
import sys

import pytest

from harness.matrix.receipts import acceptance_by_k

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cell(k, sampling, drafts, accepted, per_position, histogram):
    return {"k": k, "sampling": sampling, "variant": "unyielded",
            "acceptance": {"drafts": drafts, "accepted": accepted, "per_position": per_position,
                           "histogram": histogram},
            "timings": {"spec_tokens_per_s": 10.0, "decode_tokens_per_s": 20.0}}


def test_pooled_by_drafts():
    cells = [_cell(2, "greedy", 10, 12, [0.8, 0.4], [2, 4, 4]),
             _cell(2, "greedy", 30, 18, [0.5, 0.1], [15, 12, 3]),
             _cell(1, "greedy", 4, 3, [0.75], [1, 3]),
             _cell(1, "t0.7", 0, 0, [0.0], [0, 0]),  # no drafts: left out
             {"k": 1, "sampling": "greedy"}]  # no acceptance block: left out
    got = acceptance_by_k(cells)
    assert set(got) == {(2, "greedy"), (1, "greedy")}
    g = got[(2, "greedy")]
    assert (g["cells"], g["drafts"], g["accepted"]) == (2, 40, 30)
    assert g["mean_acceptance_length"] == pytest.approx(1 + 30 / 40)
    assert g["per_position"] == pytest.approx([(0.8 * 10 + 0.5 * 30) / 40, (0.4 * 10 + 0.1 * 30) / 40])
    assert g["histogram"] == [17, 16, 7]
    assert got[(1, "greedy")]["mean_acceptance_length"] == pytest.approx(1.75)


def test_acceptance_table_tool(tmp_path):
    import json

    receipt = {"cells": [_cell(2, "greedy", 10, 12, [0.8, 0.4], [2, 4, 4]),
                         _cell(2, "greedy", 30, 18, [0.5, 0.1], [15, 12, 3])]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(receipt))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "acceptance_table.py"), str(path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "| 2 | greedy | 2 | 1.75 | 0.57, 0.17 | 10 | 20 |"


def test_spec_round_probe(tmp_path):
    """tools/probe_spec_round.py on the CPU twin: every round runs one draft step, one verify
    step, one rollback, one hidden-row download and one acceptance test; the timed phases lie
    inside the continuation's wall time; the engine's methods are its class's again after."""
    import importlib.util
    import json

    from harness.engine.model import Engine

    spec = importlib.util.spec_from_file_location("probe_spec_round", os.path.join(ROOT, "tools", "probe_spec_round.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "sr.json"
    assert mod.main(["--out", str(out), "--k", "2", "--prompt-len", "24", "--new-tokens", "16"]) == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["k_asked"] == [2]
    (row,) = doc["rows"]
    n = row["rounds"]
    assert n >= 1 and all(row["phases"][p]["calls"] == n for p in mod.PHASES), row
    assert 0 <= row["copying_rollbacks"] <= n
    assert row["untimed_runs"] == 2 and row["captured_in_timed_run"] == 0  # (no graphs on the CPU)
    assert sum(v["s"] for v in row["phases"].values()) <= row["wall_s"]
    assert row["tokens"] == 16 and 1.0 <= row["mean_acceptance_length"] <= 3.0

    eng = Engine.__new__(Engine)
    acc = {"rollback": [0, 0.0]}
    mod._wrap(eng, "rollback", acc, "rollback")
    assert "rollback" in vars(eng)  # the wrap is an instance attribute, the class untouched
    assert Engine.rollback is not vars(eng)["rollback"]

    # A run stopped part-way (its time box) keeps the Ks it finished: the JSON is written after each K.
    real, calls = mod.round_costs, []

    def stopped_after_first(eng, prompt, k, *a):
        calls.append(k)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(eng, prompt, k, *a)

    mod.round_costs = stopped_after_first
    part = tmp_path / "part.json"
    with pytest.raises(KeyboardInterrupt):
        mod.main(["--out", str(part), "--k", "1,3", "--prompt-len", "24", "--new-tokens", "8"])
    doc = json.loads(part.read_text())
    assert calls == [1, 3] and not doc["complete"] and doc["k_asked"] == [1, 3]
    assert [r["k"] for r in doc["rows"]] == [1] and doc["rows"][0]["tokens"] == 8
