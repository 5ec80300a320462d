"""Honest timings (issue #13): every kernel is compiled by the warm-up before any timed region;
receipts record the thread count and the machine's load; the CPU backend's thread rule; and
``--timing-tolerance`` compares like with like, saying when it does not. Also: schema-1
receipts still load and diff against schema-2 ones."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from receipt_factory import find_cell, make_receipt  # noqa: E402

CELL = "tiny/p130/split@64/k2/greedy"

from harness.engine.threads import choose_threads, machine_load  # noqa: E402
from harness.errors import PrimewalkError  # noqa: E402
from harness.matrix.builtin import REPO, golden_path  # noqa: E402
from harness.matrix.diff import diff_receipts, unreliable_timings  # noqa: E402
from harness.matrix.receipts import read_receipt  # noqa: E402

# In a fresh process: warm up, count every Numba dispatcher's compiled overloads, then run every
# schedule of a small spec (greedy and sampled, split, checkpoint, yielded, short, tokenwise,
# batched) and plain/speculative generation; no kernel may compile after the warm-up.
PROBE = r"""
import json, sys
from numba.core.dispatcher import Dispatcher
from harness.matrix.specfile import parse_spec
from harness.matrix import runner
from harness.walk.sampling import Sampling
from harness.walk.speculative import generate
from harness.walk.warmup import warm_up

def overloads():
    return {f"{m}.{n}": len(v.overloads) for m, mod in list(sys.modules.items())
            if m.startswith("numba_kernels") for n, v in vars(mod).items() if isinstance(v, Dispatcher)}

spec = parse_spec({"k": [1, 3], "max_new_tokens": 6, "chunk_rows": 16, "fill_chunk": 32,
                   "sampling": [{"temperature": 0.0}, {"temperature": 0.8, "seed": 2}],
                   "variants": ["unyielded", "tokenwise", {"name": "batched", "chunk_rows": [24]},
                                {"name": "split", "at": [0.5]}, {"name": "checkpoint", "at": [40]},
                                {"name": "split+checkpoint", "split": 32, "checkpoint": 48}, "short",
                                "yielded-with-peer", {"name": "yielded-with-peer", "split": 0.5, "checkpoint": 0.5}],
                   "prompts": [{"kind": "synthetic", "lengths": [20, 90], "seed": 1}]})
models = runner.load_models(spec)
eng = models["tiny"].engine
compiled_before = sum(overloads().values())
warm_up(eng, 3)
before = overloads()
receipt = runner.run_matrix(spec, models=models, warmup=False)
generate(eng, list(range(1, 50)), 8, 2, Sampling(0.5, 3))
generate(eng, list(range(1, 50)), 8, 2, Sampling(), speculative=False)
after = overloads()
print(json.dumps({"warm_compiled": sum(before.values()) - compiled_before, "cells": len(receipt["cells"]),
                  "new": {k: [before.get(k, 0), v] for k, v in after.items() if before.get(k, 0) != v}}))
"""


def test_warm_up_compiles_every_kernel_the_timed_regions_use():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["warm_compiled"] > 10  # the warm-up did compile (or load) the kernels
    assert r["cells"] > 40
    assert r["new"] == {}, f"kernels compiled after the warm-up: {r['new']}"


# ------------------------------------------------------------------------------------------------
# threads and load
# ------------------------------------------------------------------------------------------------
def test_thread_rule():
    assert choose_threads({"PRIMEWALK_THREADS": "1"}, maximum=8) == (1, "PRIMEWALK_THREADS")
    assert choose_threads({"PRIMEWALK_THREADS": "64"}, maximum=8) == (8, "PRIMEWALK_THREADS")
    for bad in ("0", "two", "-1"):
        with pytest.raises(PrimewalkError, match="PRIMEWALK_THREADS: expected a positive integer"):
            choose_threads({"PRIMEWALK_THREADS": bad}, maximum=8)
    assert choose_threads({"NUMBA_NUM_THREADS": "3"}, maximum=3) == (3, "NUMBA_NUM_THREADS")
    cores = machine_load()["cores"]
    assert choose_threads({}, maximum=64, busy=0.0)[0] == cores  # idle: every core
    assert choose_threads({}, maximum=64, busy=None) == (cores, "auto (load unknown)")
    assert choose_threads({}, maximum=64, busy=float(cores))[0] == 1  # all busy: one thread
    assert choose_threads({}, maximum=64, busy=cores - 1.2)[0] == max(1, cores - int(cores - 1.2 + 0.5))
    n, why = choose_threads({}, maximum=1, busy=0.0)
    assert n == 1 and why.startswith("auto (0.0 of")


def test_receipt_records_threads_load_and_warm_up(tmp_path):
    from harness.matrix import runner
    from harness.matrix.specfile import parse_spec

    spec = parse_spec({"k": [1], "max_new_tokens": 3, "variants": ["unyielded"],
                       "prompts": [{"kind": "synthetic", "lengths": [9]}]})
    r = runner.run_matrix(spec)
    env = r["env"]
    assert isinstance(env["threads"], int) and env["threads"] >= 1 and env["threads_why"]
    assert env["cores"] == machine_load()["cores"]
    assert len(env["load"]["start"]) == 3 and len(env["load"]["end"]) == 3
    assert r["warmup_s"] > 0 and r["skipped"] == []
    assert r["schema_version"] == 2


# ------------------------------------------------------------------------------------------------
# --timing-tolerance: like with like
# ------------------------------------------------------------------------------------------------
def _slow_pair():
    a, b = make_receipt(), make_receipt()
    find_cell(b, CELL)["timings"]["prime_tokens_per_s"] *= 0.5
    return a, b


def test_timings_compared_when_like_with_like():
    a, b = _slow_pair()
    result = diff_receipts(a, b, timing_tolerance=10)
    assert result.exit_code == 1 and result.timings_compared and result.notes == []


@pytest.mark.parametrize("change, note", [
    (lambda r: r["env"].update(threads=1), "timings not compared: threads differs (A 2, B 1)"),
    (lambda r: r["env"].update(device="another cpu"), "timings not compared: device differs"),
    (lambda r: r["env"].update(backend="cuda"), "timings not compared: backend differs"),
    (lambda r: r["env"]["load"].update(end=[3.5, 1.0, 0.5]),
     "timings not compared: B's timings are unreliable (load 3.50 on 2 cores when it was recorded)"),
    (lambda r: r["env"].pop("load"), "B's timings are unreliable (the machine's load when it was recorded is unknown)"),
])
def test_timings_not_compared_say_why(change, note):
    a, b = _slow_pair()
    change(b)
    result = diff_receipts(a, b, timing_tolerance=10)
    assert result.exit_code == 0 and not result.timings_compared
    assert any(note in n for n in result.notes), result.notes
    assert result.summary.endswith("throughput not compared)")


def test_cli_prints_the_notes(tmp_path, capsys):
    from harness.cli import main
    from harness.matrix.receipts import write_receipt

    a, b = _slow_pair()
    b["env"]["threads"] = 1
    write_receipt(str(tmp_path / "a.json"), a)
    write_receipt(str(tmp_path / "b.json"), b)
    assert main(["diff", "--timing-tolerance", "10", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "note: timings not compared: threads differs (A 2, B 1)" in out


def test_unreliable_timings():
    r = make_receipt()
    assert unreliable_timings(r) is None
    r["env"]["load"]["start"] = [2.5, 1, 1]
    assert unreliable_timings(r) == "load 2.50 on 2 cores when it was recorded"


# ------------------------------------------------------------------------------------------------
# schema 1 and schema 2
# ------------------------------------------------------------------------------------------------
def test_schema_1_receipts_load_and_diff_against_schema_2():
    old = read_receipt(golden_path("tiny"))  # committed at schema 1
    assert old["schema_version"] == 1
    new = copy.deepcopy(old)
    new["schema_version"] = 2
    for c in new["cells"]:
        c["digests"]["prompt"] = "a" * 64
    result = diff_receipts(old, new)
    assert result.exit_code == 0, result.table()
    assert result.notes == ["schemas 1 and 2: compared on the fields of schema 1"]
    # between two schema-2 receipts digests.prompt is compared
    other = copy.deepcopy(new)
    other["cells"][0]["digests"]["prompt"] = "b" * 64
    result = diff_receipts(new, other)
    assert [(r.cell, r.field) for r in result.rows] == [(other["cells"][0]["id"], "digests.prompt")]
    assert diff_receipts(new, other, digests_only=True).exit_code == 1
