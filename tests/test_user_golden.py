"""A user's own spec gets its own golden receipt (``--update-golden --golden PATH``) and gates on
it: green while nothing changed, red when the model's tokenizer changes the ids it is fed --
with ``run-matrix --golden`` and with ``harness diff``."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import own_checkpoint as oc  # noqa: E402

from harness.cli import main  # noqa: E402

SPEC = """\
description = "my model, my prompts"
max_new_tokens = 4
k = [1]
variants = ["unyielded", {{ name = "split", at = [0.5] }}]
[models]
mine = "ckpt"
[[prompts]]
kind = "text"
name = "mine"
text = {text}
"""


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_user_spec_golden_green_then_red(tmp_path, capsys):
    oc.build(str(tmp_path / "ckpt"))
    spec = tmp_path / "mine.toml"
    spec.write_text(SPEC.format(text=json.dumps(oc.LONG_TEXT)), encoding="utf-8")
    golden = tmp_path / "golden" / "mine.json"

    # record
    rc, out, err = run(capsys, "run-matrix", "--spec", spec, "--update-golden", "--golden", golden, "--no-plots")
    assert rc == 0, err
    assert golden.exists() and golden.with_suffix(".csv").exists()
    recorded = json.loads(golden.read_text())
    assert len(recorded["cells"]) == 2 and recorded["spec"]["source"] == str(spec)

    # green: a fresh run equals the golden, gated in one command and with harness diff
    fresh = tmp_path / "fresh.json"
    rc, out, err = run(capsys, "run-matrix", "--spec", spec, "--golden", golden, "--out", fresh, "--no-plots")
    assert rc == 0, out + err
    assert f"golden {golden}: diff: equal (2 cells compared)" in out
    rc, out, err = run(capsys, "diff", golden, fresh)
    assert rc == 0 and out.strip().endswith("diff: equal (2 cells compared)"), out + err

    # red: the checkpoint's tokenizer is replaced by another one; the same text becomes other ids
    oc.write_tokenizer(str(tmp_path / "ckpt"), oc.train_tokenizer(280))
    drifted = tmp_path / "drifted.json"
    rc, out, err = run(capsys, "run-matrix", "--spec", spec, "--golden", golden, "--out", drifted, "--no-plots")
    assert rc == 1, out + err
    assert "digests.prompt" in out and f"golden {golden}: diff:" in out and "drift(s)" in out
    rc, out, err = run(capsys, "diff", golden, drifted)
    assert rc == 1 and "digests.prompt" in out
    # the golden itself is untouched by gating runs
    assert json.loads(golden.read_text()) == recorded


def test_golden_flag_errors(tmp_path, capsys):
    oc.build(str(tmp_path / "ckpt"))
    spec = tmp_path / "mine.toml"
    spec.write_text(SPEC.format(text=json.dumps(oc.LONG_TEXT)), encoding="utf-8")
    # a user spec without --golden has nowhere to record
    rc, out, err = run(capsys, "run-matrix", "--spec", spec, "--update-golden", "--no-plots")
    assert rc == 2 and "give the golden's path with --golden PATH" in err and len(err.strip().splitlines()) == 1
    rc, out, err = run(capsys, "run-matrix", "--spec", spec, "--update-golden", "--golden", tmp_path / "g.json",
                       "--shard", "0/2", "--no-plots")
    assert rc == 2 and "--shard is given" in err
    # gating on a golden that does not exist
    rc, out, err = run(capsys, "run-matrix", "--spec", spec, "--golden", tmp_path / "none.json",
                       "--out", tmp_path / "o.json", "--no-plots")
    assert rc == 2 and "cannot read receipt" in err and "none.json" in err
    assert not (tmp_path / "o.json").exists()  # refused before the run
