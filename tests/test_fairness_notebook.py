"""notebooks/fairness_analysis.py executes: on a fresh fairness receipt (PRIMEWALK_FAIRNESS_RECEIPT),
showing its verdict, measures and figures, and without one (it falls back to the committed CPU
receipt)."""

import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_fairness import SMALL, fixed_clock  # noqa: E402
from test_notebooks import execute, text_of  # noqa: E402

from harness.fairness.receipt import write_fairness_receipt  # noqa: E402
from harness.fairness.runner import run_fairness  # noqa: E402
from harness.fairness.specfile import parse_spec  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "fairness_analysis.py")


def test_reads_a_fairness_receipt(tmp_path, monkeypatch):
    receipt = run_fairness(parse_spec(copy.deepcopy(SMALL)), timer=fixed_clock)
    receipt["cells"][5]["verdict"] = {"status": "fail", "max_abs": 1.0, "max_ulp": 3, "bound": None,
                                      "detail": "differs from the session alone: final_state"}
    receipt["verdict"].update(status="fail", failed=[receipt["cells"][5]["id"]])
    path = tmp_path / "f.json"
    write_fairness_receipt(str(path), receipt)
    monkeypatch.setenv("PRIMEWALK_FAIRNESS_RECEIPT", str(path))
    nb = execute(NOTEBOOK)
    text = text_of(nb)
    assert "note: no receipt" not in text
    assert "verdict: fail" in text and "differs from the session alone: final_state" in text
    assert "peers_p95_s" in text and "interval@2" in text
    figures = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(figures) == 2


def test_falls_back_to_the_committed_cpu_receipt(tmp_path, monkeypatch):
    if not os.path.exists(os.path.join(ROOT, "receipts", "fairness", "tiny.json")):
        pytest.fail("receipts/fairness/tiny.json is missing (harness fairness --spec "
                    "harness/specs/fairness/tiny.toml --update-golden)")
    monkeypatch.setenv("PRIMEWALK_FAIRNESS_RECEIPT", str(tmp_path / "not-yet.json"))
    text = text_of(execute(NOTEBOOK))
    assert "note: no receipt at" in text and "receipts/fairness/tiny.json" in text
