"""Every notebook in notebooks/ executes: its jupytext source is run by nbclient against synthetic
receipts (PRIMEWALK_RECEIPT / PRIMEWALK_RECEIPT_B), without a device receipt (it falls back to
comparing A with itself), and against the committed receipts when they exist."""

from __future__ import annotations

import copy
import json
import glob
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from receipt_factory import make_receipt  # noqa: E402

from harness.matrix.receipts import read_receipt, write_receipt  # noqa: E402

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the notebooks of matrix receipts (fairness_analysis.py reads a fairness receipt: tests/test_fairness_notebook.py)
NOTEBOOKS = sorted(p for p in glob.glob(os.path.join(ROOT, "notebooks", "*.py")) if "fairness" not in os.path.basename(p))
GOLDEN = os.path.join(ROOT, "receipts", "golden", "default.json")
TIMEOUT_S = 180


def execute(path: str):
    nb = jupytext.read(path)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    client.execute()
    return nb


def text_of(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out["text"])
            elif "data" in out:
                parts.append(out["data"].get("text/plain", ""))
    return "\n".join(parts)


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    a = make_receipt(statuses={"tiny/p300/tokenwise/k3/greedy": "tolerance"})
    b = make_receipt(backend="cuda", speed=40.0)
    b["cells"][5]["digests"]["logits"] = "f" * 64
    pa, pb = str(tmp_path / "golden.json"), str(tmp_path / "device.json")
    write_receipt(pa, a)
    write_receipt(pb, b)
    monkeypatch.setenv("PRIMEWALK_RECEIPT", pa)
    monkeypatch.setenv("PRIMEWALK_RECEIPT_B", pb)
    return pa, pb, b["cells"][5]["id"]


def test_there_are_notebooks():
    names = {os.path.basename(p) for p in NOTEBOOKS}
    assert {"receipts_overview.py", "acceptance_analysis.py", "throughput_analysis.py"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_one_parameters_cell(path):
    nb = jupytext.read(path)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    assert "PRIMEWALK_RECEIPT" in tagged[0].source
    if os.path.basename(path) == "acceptance_analysis.py":  # the trained model: acceptance means something
        assert "receipts/device/cuda-stdlib.json" in tagged[0].source
        assert "receipts/stdlib/cpu.json" in tagged[0].source
    else:
        assert "receipts/golden/default.json" in tagged[0].source
        assert "receipts/device/cuda-default.json" in tagged[0].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_runs_on_synthetic_receipts(path, synthetic):
    nb = execute(path)
    text = text_of(nb)
    assert "note: no receipt" not in text
    if os.path.basename(path) == "receipts_overview.py":
        _, _, drifted = synthetic
        assert "diff: 1 drift(s) in 1 of" in text and drifted in text
    figures = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert figures, "the notebook shows its figures"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_falls_back_without_a_device_receipt(path, synthetic, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMEWALK_RECEIPT_B", str(tmp_path / "not-yet.json"))
    text = text_of(execute(path))
    assert "note: no receipt at" in text and "with itself" in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_runs_on_committed_receipts(path, monkeypatch):
    if not os.path.exists(GOLDEN):
        pytest.skip("no committed golden receipt yet (receipts/golden/default.json)")
    monkeypatch.delenv("PRIMEWALK_RECEIPT", raising=False)
    monkeypatch.delenv("PRIMEWALK_RECEIPT_B", raising=False)
    execute(path)


def test_a_receipt_without_acceptance_or_timings(tmp_path, monkeypatch):
    bare = make_receipt()
    for cell in bare["cells"]:
        del cell["acceptance"], cell["timings"]
    path = str(tmp_path / "bare.json")
    write_receipt(path, copy.deepcopy(bare))
    monkeypatch.setenv("PRIMEWALK_RECEIPT", path)
    monkeypatch.setenv("PRIMEWALK_RECEIPT_B", path)
    for nb in NOTEBOOKS:
        execute(nb)


def test_throughput_notebook_shows_the_bench_curve_and_goals(synthetic, tmp_path, monkeypatch):
    from bench_factory import make_bench_result

    path = str(tmp_path / "bench.json")
    with open(path, "w") as f:
        json.dump(make_bench_result(), f)
    monkeypatch.setenv("PRIMEWALK_BENCH", path)
    nb = execute(os.path.join(ROOT, "notebooks", "throughput_analysis.py"))
    text = text_of(nb)
    assert "131072" in text and "oom" in text and "prime_131072_s" in text and "note: " not in text
    cells = [c for c in nb.cells if "prime_curve_figure" in c.source]
    assert any("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", []))


def test_acceptance_notebook_names_a_draft_vocabulary(synthetic, tmp_path, monkeypatch):
    """A receipt run with --draft-vocab: the notebook says so, and does not compare its acceptance
    with a receipt that drafted among another vocabulary."""
    pa, _, _ = synthetic
    r = read_receipt(pa)
    r["env"]["draft_vocab"] = {"size": 32, "ids_sha256": "ab" * 32}
    path = str(tmp_path / "dv.json")
    write_receipt(path, r)
    monkeypatch.setenv("PRIMEWALK_RECEIPT", path)
    monkeypatch.setenv("PRIMEWALK_RECEIPT_B", pa)
    text = text_of(execute(os.path.join(ROOT, "notebooks", "acceptance_analysis.py")))
    assert "A drafted among a draft vocabulary of 32 ids" in text
    assert "drafted among different draft vocabularies" in text
