"""`harness plot`: the five figures land next to the receipt, byte for byte the same on a second
run, and a figure without data is skipped with a note rather than failing."""

from __future__ import annotations

import argparse
import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from receipt_factory import make_receipt  # noqa: E402

from harness.cli import matrix as matrix_cli  # noqa: E402
from harness.matrix.plots import plot_receipt, render, schedule_labels, variant_label  # noqa: E402
from harness.matrix.receipts import write_receipt  # noqa: E402

NAMES = ("verdicts", "acceptance", "acceptance_len", "prime_throughput", "decode")
STATUSES = {"tiny/p130/checkpoint@96/k2/greedy": "tolerance", "tiny/p300/tokenwise/k3/greedy": "fail"}


@pytest.fixture
def receipt_path(tmp_path):
    path = tmp_path / "golden.json"
    write_receipt(str(path), make_receipt(statuses=STATUSES))
    return path


def test_all_figures_written_next_to_the_receipt(receipt_path):
    written = plot_receipt(str(receipt_path))
    stem = str(receipt_path)[:-len(".json")]
    assert written == [f"{stem}.{name}.png" for name in NAMES]
    for path in written:
        data = open(path, "rb").read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"Software" not in data and b"matplotlib" not in data


def test_figures_are_byte_stable(receipt_path, tmp_path):
    first = {p: open(p, "rb").read() for p in plot_receipt(str(receipt_path))}
    second = {p: open(p, "rb").read() for p in plot_receipt(str(receipt_path))}
    assert first == second
    # the dict a runner holds (keys in insertion order) draws the same as the file read back
    written, skipped = render(make_receipt(statuses=STATUSES), str(tmp_path / "fresh"))
    assert skipped == []
    assert [open(p, "rb").read() for p in written] == list(first.values())


def test_figures_follow_the_data(receipt_path, tmp_path):
    before = open(plot_receipt(str(receipt_path))[0], "rb").read()
    other = tmp_path / "other.json"
    write_receipt(str(other), make_receipt())  # no tolerance / fail cells
    assert open(plot_receipt(str(other))[0], "rb").read() != before


def test_missing_data_is_skipped_with_a_note(tmp_path, capsys):
    receipt = make_receipt()
    for cell in receipt["cells"]:
        del cell["acceptance"], cell["timings"]
    path = tmp_path / "bare.json"
    write_receipt(str(path), receipt)
    written = plot_receipt(str(path))
    assert written == [str(tmp_path / "bare.verdicts.png")]
    err = capsys.readouterr().err
    for name in NAMES[1:]:
        assert f"plot: skipped {name}:" in err
    assert sorted(os.listdir(tmp_path)) == ["bare.csv", "bare.json", "bare.verdicts.png"]


def test_empty_receipt_plots_nothing(tmp_path):
    receipt = make_receipt()
    receipt["cells"] = []
    written, skipped = render(receipt, str(tmp_path / "empty"))
    assert written == [] and [name for name, _ in skipped] == list(NAMES)


def test_partial_timings(tmp_path):
    receipt = make_receipt()
    for cell in receipt["cells"]:
        del cell["timings"]["spec_tokens_per_s"]
    written, skipped = render(receipt, str(tmp_path / "partial"))
    assert len(written) == len(NAMES) and skipped == []


def test_labels():
    cells = make_receipt()["cells"]
    labels = schedule_labels(cells)
    assert labels["tiny/p130/split@64/k2/greedy"] == "split@64"
    assert labels["tiny/p130/split+checkpoint@64,96/k2/greedy"] == "split+checkpoint@64,96"
    assert labels["tiny/p130/batched@c16/k2/greedy"] == "batched c16"
    assert labels["tiny/p130/unyielded/k2/greedy"] == "unyielded"
    swapped = copy.deepcopy(cells[0])
    swapped["variant_args"] = {"checkpoint": 96, "split": 64}
    assert variant_label(swapped) == f"{swapped['variant']}@64,96"


def test_cli_prints_the_paths(receipt_path, capsys):
    parser = argparse.ArgumentParser(prog="harness")
    sub = parser.add_subparsers(dest="command", required=True)
    matrix_cli.register(sub)
    args = parser.parse_args(["plot", str(receipt_path)])
    assert args.func(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(NAMES) and all(os.path.exists(p) for p in out)
    args = parser.parse_args(["plot", str(receipt_path.parent / "missing.json")])
    assert args.func(args) == 2
    assert "cannot read receipt" in capsys.readouterr().err
