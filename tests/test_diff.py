"""`harness diff` / `harness merge`: equal receipts exit 0, drift in a compared field exits 1 and
names the cell, unusable input exits 2 with one line on stderr."""

from __future__ import annotations

import argparse
import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from receipt_factory import find_cell, make_receipt  # noqa: E402

from harness.cli import matrix as matrix_cli  # noqa: E402
from harness.errors import PrimewalkError  # noqa: E402
from harness.matrix import diff  # noqa: E402
from harness.matrix.diff import diff_receipts  # noqa: E402
from harness.matrix.receipts import read_receipt, spec_hash, write_receipt  # noqa: E402

CELL = "tiny/p130/split@64/k2/greedy"
N = len(make_receipt()["cells"])


@pytest.fixture
def pair():
    return make_receipt(), make_receipt()


def cli(*argv) -> int:
    parser = argparse.ArgumentParser(prog="harness")
    sub = parser.add_subparsers(dest="command", required=True)
    matrix_cli.register(sub)
    args = parser.parse_args([str(a) for a in argv])
    return args.func(args)


def write(tmp_path, name, receipt) -> str:
    path = str(tmp_path / name)
    write_receipt(path, receipt)
    return path


# --- diff_receipts ------------------------------------------------------------------------


def test_equal(pair):
    result = diff_receipts(*pair)
    assert result.exit_code == 0 and result.rows == []
    assert result.summary == f"diff: equal ({N} cells compared)"


def test_one_digest_changed(pair):
    a, b = pair
    find_cell(b, CELL)["digests"]["final_state"] = "ab" * 32
    result = diff_receipts(a, b)
    assert result.exit_code == 1
    assert [(r.cell, r.field) for r in result.rows] == [(CELL, "digests.final_state")]
    assert result.rows[0].b == "ab" * 32
    assert result.summary == f"diff: 1 drift(s) in 1 of {N} cells"


@pytest.mark.parametrize("field, change", [
    ("verdict.status", lambda c: c["verdict"].update(status="tolerance")),
    ("tape", lambda c: c["tape"].insert(0, ["mtp-trunk", 1])),
    ("yields", lambda c: c.update(yields=7)),
    ("continuation.tokens", lambda c: c["continuation"]["tokens"].append(5)),
    ("acceptance.accepted", lambda c: c["acceptance"].update(accepted=0)),
    ("acceptance.histogram", lambda c: c["acceptance"]["histogram"].reverse()),
])
def test_every_compared_field_is_compared(pair, field, change):
    a, b = pair
    change(find_cell(b, CELL))
    assert [(r.cell, r.field) for r in diff_receipts(a, b).rows] == [(CELL, field)]


def test_informational_fields_are_not_compared(pair):
    a, b = pair
    b["env"]["device"], b["created"], b["wall_s"] = "other", "2030-01-01T00:00:00Z", 1.0
    b["model"]["path"] = "/elsewhere/tiny"
    cell = find_cell(b, CELL)
    cell["timings"]["prime_tokens_per_s"] = 1.0
    cell["verdict"]["detail"] = "reworded"
    assert diff_receipts(a, b).exit_code == 0


def test_digests_only_ignores_verdicts_and_timings(pair):
    a, b = pair
    cell = find_cell(b, CELL)
    cell["verdict"]["status"] = "fail"
    cell["acceptance"]["accepted"] += 1
    cell["timings"]["decode_tokens_per_s"] /= 10
    assert diff_receipts(a, b).exit_code == 1
    result = diff_receipts(a, b, digests_only=True)
    assert result.exit_code == 0
    assert result.summary == f"diff: equal ({N} cells compared, digests only)"
    cell["digests"]["captures"] = "0" * 64
    result = diff_receipts(a, b, digests_only=True)
    assert [(r.cell, r.field) for r in result.rows] == [(CELL, "digests.captures")]


def test_two_devices_compare_on_digests():
    cpu, cuda = make_receipt(), make_receipt(backend="cuda", speed=40.0)
    assert cpu["spec_hash"] == cuda["spec_hash"]
    assert diff_receipts(cpu, cuda, digests_only=True).exit_code == 0


def test_timing_tolerance(pair):
    a, b = pair
    cell = find_cell(b, CELL)
    cell["timings"]["prime_tokens_per_s"] *= 0.8  # 20 % slower
    find_cell(b, "tiny/p17/tokenwise/k1/greedy")["timings"]["spec_tokens_per_s"] *= 3  # faster: fine
    assert diff_receipts(a, b).exit_code == 0
    assert diff_receipts(a, b, timing_tolerance=30).exit_code == 0
    result = diff_receipts(a, b, timing_tolerance=10)
    assert result.exit_code == 1
    [row] = result.rows
    assert (row.cell, row.field, row.note) == (CELL, "timings.prime_tokens_per_s", "-20.0%")
    assert "1 throughput drop(s) beyond 10%" in result.summary
    assert diff_receipts(a, a, timing_tolerance=0).summary.endswith("throughput within 0%)")


def test_cells_in_one_receipt_only(pair):
    a, b = pair
    b["cells"] = [c for c in b["cells"] if c["id"] != CELL]
    result = diff_receipts(a, b)
    assert [(r.cell, r.field, r.note) for r in result.rows] == [(CELL, "cell", "only in A")]
    result = diff_receipts(b, a)
    assert [(r.cell, r.note) for r in result.rows] == [(CELL, "only in B")]
    assert result.cells == N


@pytest.mark.parametrize("what, change", [
    ("spec_hash", lambda r: (r["spec"].update(k=[1]), r.update(spec_hash=spec_hash(r["spec"])))),
    ("schema", lambda r: r.update(schema_version=99)),
    ("weights_sha256", lambda r: r["model"].update(weights_sha256="e" * 64)),
])
def test_unusable(pair, what, change):
    a, b = pair
    change(b)
    result = diff_receipts(a, b)
    assert result.exit_code == 2
    assert what in result.unusable and "\n" not in result.summary


def test_unreadable_path_raises(tmp_path, pair):
    with pytest.raises(PrimewalkError):
        diff_receipts(str(tmp_path / "nope.json"), pair[1])


# --- CLI ----------------------------------------------------------------------------------


def test_cli_equal(tmp_path, pair, capsys):
    pa, pb = write(tmp_path, "a.json", pair[0]), write(tmp_path, "b.json", pair[1])
    assert cli("diff", pa, pb) == 0
    assert capsys.readouterr().out == f"diff: equal ({N} cells compared)\n"
    assert cli("diff", "--digests-only", pa, pb) == 0
    assert "digests only" in capsys.readouterr().out


def test_cli_drift_names_the_cell(tmp_path, pair, capsys):
    a, b = pair
    find_cell(b, CELL)["digests"]["logits"] = "f" * 64
    pa, pb = write(tmp_path, "a.json", a), write(tmp_path, "b.json", b)
    assert cli("diff", pa, pb) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["cell", "field", "A", "B"]
    assert out[1].split() == [CELL, "digests.logits", find_cell(a, CELL)["digests"]["logits"][:16] + "…",
                              "f" * 16 + "…"]
    assert out[-1] == f"diff: 1 drift(s) in 1 of {N} cells"


def test_cli_long_tables_are_cut(tmp_path, pair, capsys):
    a, b = pair
    for cell in b["cells"]:
        cell["digests"]["logits"] = "f" * 64
    assert cli("diff", write(tmp_path, "a.json", a), write(tmp_path, "b.json", b)) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 + diff.MAX_ROWS + 2
    assert out[-2] == f"… {N - diff.MAX_ROWS} more (--all shows every row)"
    assert out[-1] == f"diff: {N} drift(s) in {N} of {N} cells"
    # --all: every row, no cut
    assert cli("diff", "--all", str(tmp_path / "a.json"), str(tmp_path / "b.json")) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 + N + 1 and not any(line.startswith("…") for line in out)


def test_cli_timing_tolerance(tmp_path, pair, capsys):
    a, b = pair
    find_cell(b, CELL)["timings"]["decode_tokens_per_s"] *= 0.5
    pa, pb = write(tmp_path, "a.json", a), write(tmp_path, "b.json", b)
    assert cli("diff", pa, pb, "--timing-tolerance", "25") == 1
    out = capsys.readouterr().out
    assert CELL in out and "timings.decode_tokens_per_s" in out and "-50.0%" in out
    assert cli("diff", pa, pb, "--timing-tolerance", "60%") == 0


def test_cli_spec_mismatch_exits_2(tmp_path, pair, capsys):
    a, b = pair
    b["spec"]["fill_chunk"] = 128
    b["spec_hash"] = spec_hash(b["spec"])
    assert cli("diff", write(tmp_path, "a.json", a), write(tmp_path, "b.json", b)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "spec_hash differs" in captured.err


def test_cli_unreadable_exits_2(tmp_path, pair, capsys):
    pa = write(tmp_path, "a.json", pair[0])
    assert cli("diff", pa, tmp_path / "missing.json") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read receipt" in err
    (tmp_path / "junk.json").write_text("nope")
    assert cli("diff", tmp_path / "junk.json", pa) == 2
    assert "is not JSON" in capsys.readouterr().err


def test_cli_merge(tmp_path, capsys):
    paths = [write(tmp_path, f"s{i}.json", make_receipt(shard=(i, 2))) for i in range(2)]
    out = tmp_path / "merged.json"
    assert cli("merge", out, *paths) == 0
    assert capsys.readouterr().out.strip() == f"merge: 2 shard(s), {N} cells -> {out}"
    assert read_receipt(str(out))["cells"] == make_receipt()["cells"]
    assert (tmp_path / "merged.csv").exists()
    assert cli("diff", out, write(tmp_path, "whole.json", make_receipt())) == 0


def test_cli_merge_refusal_exits_2(tmp_path, capsys):
    s0 = make_receipt(shard=(0, 2))
    s1 = make_receipt(shard=(1, 2))
    s1["cells"].append(copy.deepcopy(s0["cells"][0]))
    paths = [write(tmp_path, "s0.json", s0), write(tmp_path, "s1.json", s1)]
    assert cli("merge", tmp_path / "merged.json", *paths) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is in shard 0 and shard 1" in err
    assert not (tmp_path / "merged.json").exists()


def test_cli_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        cli("diff", "--help")
    out = capsys.readouterr().out
    assert "--digests-only" in out and "--timing-tolerance" in out and "harness diff " in out


def test_lists_are_shown_from_their_first_difference(pair):
    a, b = pair
    find_cell(b, CELL)["continuation"]["tokens"][10] = -1
    result = diff_receipts(a, b)
    [row] = result.rows
    assert (row.field, row.note) == ("continuation.tokens", "first differs at [10]")
    tokens = find_cell(a, CELL)["continuation"]["tokens"]
    shown_b = result.table().splitlines()[1].split()[3]
    assert shown_b.startswith(f"…,{tokens[8]},{tokens[9]},-1,{tokens[11]},")
