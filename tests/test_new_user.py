"""What a new user ran into on a fresh clone (issue #13), one test per defect: words that were
wrong or missing, small CLI defects, the split-point rule and the skipped cells, specs that are
missing several keys, config/tensor mismatches, and the figures' labels."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import own_checkpoint as oc  # noqa: E402
from receipt_factory import make_receipt  # noqa: E402

from harness.cli import build_parser, main  # noqa: E402
from harness.matrix.builtin import REPO, SPECS_DIR  # noqa: E402
from harness.matrix.specfile import Point, parse_spec  # noqa: E402

HARNESS = [sys.executable, "-c", "import sys; from harness.cli import main; sys.exit(main(sys.argv[1:]))"]


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def subcommand(name):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices[name]


# ------------------------------------------------------------------------------------------------
# words
# ------------------------------------------------------------------------------------------------
def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert re.fullmatch(r"harness \(primewalk\) \S+\n", capsys.readouterr().out)


@pytest.mark.parametrize("name", ["check", "generate", "logits", "run-matrix", "diff", "merge", "plot"])
def test_every_command_has_a_description(name):
    assert len(subcommand(name).description or "") > 40


def test_top_level_help_names_the_default_model():
    text = build_parser().format_help()
    assert "default matrix on the trained stdlib-small model" in text
    assert "on the tiny model (CPU)" not in text


def test_builtin_spec_headers_show_runnable_commands():
    for path in sorted(os.listdir(SPECS_DIR)):
        if not path.endswith(".toml"):  # specs/fairness/: the fairness specs, not matrix specs
            continue
        text = open(os.path.join(SPECS_DIR, path), encoding="utf-8").read()
        for cmd in re.findall(r"`(harness run-matrix[^`]*)`", text):
            if "harness/specs/" in cmd:
                assert "--spec harness/specs/" in cmd, f"{path}: {cmd}"


def test_readme_links_resolve():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert "docs/specs.md" in local and "docs/DESIGN.md" in local
    for link in local:
        assert os.path.exists(os.path.join(REPO, link)), link
    for ref in re.findall(r"\b([\w/]+\.md)\b", text):  # every file the README names exists
        assert os.path.exists(os.path.join(REPO, ref)) or ref.startswith("MMA") or "/" not in ref \
            or os.path.exists(os.path.join(REPO, "harness", ref)), ref


def test_logits_defaults_to_the_cpu_twin_and_follows_primewalk_backend(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PRIMEWALK_BACKEND", raising=False)
    rc, out, err = run(capsys, "logits", "--ids", "1,2,3", "--out", tmp_path / "a.npy")
    assert rc == 0 and "(cpu)" in out and np.load(tmp_path / "a.npy").dtype == np.float32
    monkeypatch.setenv("PRIMEWALK_BACKEND", "reference")
    rc, out, err = run(capsys, "logits", "--ids", "1,2,3", "--out", tmp_path / "b.npy")
    assert rc == 0 and "(reference)" in out and np.load(tmp_path / "b.npy").dtype == np.float64
    assert "$PRIMEWALK_BACKEND or cpu" in subcommand("logits").format_help().replace("\n", " ").replace("  ", " ")


def test_gpu_commands_without_a_gpu_name_no_missing_option(capsys):
    pytest.importorskip("numba.cuda")
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a GPU is present: nothing to refuse")
    for command in ("device-check", "device-walker"):
        rc, out, err = run(capsys, command, "--out", "/nonexistent/x.json")
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "needs a CUDA GPU; none is available on this machine" in err and "--backend" not in err


# ------------------------------------------------------------------------------------------------
# small defects
# ------------------------------------------------------------------------------------------------
def test_diff_into_a_closed_pipe_has_no_traceback(tmp_path):
    a, b = make_receipt(), make_receipt()
    for cell in b["cells"]:
        cell["digests"]["logits"] = "f" * 64
    from harness.matrix.receipts import write_receipt

    write_receipt(str(tmp_path / "a.json"), a)
    write_receipt(str(tmp_path / "b.json"), b)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = " ".join(HARNESS[:2]) + f" '{HARNESS[2]}' diff --all {tmp_path / 'a.json'} {tmp_path / 'b.json'}"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd + " | head -1"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert done.stdout.split() == ["cell", "field", "A", "B"]
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 1  # the diff's own status: drift


@pytest.mark.parametrize("ids, message", [
    ("1,,2", "item 2 of '1,,2' is empty"),
    (",1", "item 1 of ',1' is empty"),
    ("1,2,,", "item 3 of '1,2,,' is empty"),
    ("1;2", "expected comma-separated integers, got '1;2'"),
    (",", "the prompt is empty"),
])
def test_ids_with_empty_items_are_refused(tmp_path, capsys, ids, message):
    rc, out, err = run(capsys, "logits", "--ids", ids, "--out", tmp_path / "x.npy")
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    rc, out, err = run(capsys, "logits", "--ids", "1,2,", "--out", tmp_path / "x.npy")
    assert rc == 0, err  # one trailing comma is fine


def test_generate_plain_runs_without_an_mtp_head(tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    with_mtp, trunk = tmp_path / "mtp", tmp_path / "trunk"
    oc.build(str(with_mtp))
    shutil.copytree(with_mtp, trunk)
    tensors = {k: v for k, v in load_file(str(trunk / "model.safetensors")).items() if not k.startswith("mtp.")}
    save_file(tensors, str(trunk / "model.safetensors"))
    argv = ["generate", "--text", oc.LONG_TEXT, "--max-new-tokens", 12, "--plain", "--temperature", 0.8, "--seed", 3]
    rc, plain_mtp, err = run(capsys, *argv, "--model", with_mtp)
    assert rc == 0, err
    rc, plain_trunk, err = run(capsys, *argv, "--model", trunk)
    assert rc == 0, err
    assert plain_trunk == plain_mtp  # the trunk's prime gives the walker's bits, so the same tokens
    rc, out, err = run(capsys, "generate", "--text", "hi", "--model", trunk)  # speculative needs the head
    assert rc == 2 and "no MTP head" in err and "--plain decodes without drafts" in err


def test_progress_shows_n_of_n_and_time_left_without_tqdm(capsys):
    import harness.cli.progress as progress

    assert "tqdm" not in open(progress.__file__, encoding="utf-8").read()
    p = progress.Progress()
    p.begin(3)
    entry = {"id": "tiny/p9/unyielded/k1/greedy", "verdict": {"status": "bitwise"},
             "timings": {"prime_tokens_per_s": 1234.0}, "acceptance": {"mean_acceptance_length": 1.5}}
    for i in range(3):
        p.start(i, 3, entry["id"])
        p.done(entry)
    p.close()
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == ["[1/3]", "[2/3]", "[3/3]"]
    assert "left)" in lines[0] and lines[2].endswith("elapsed)")
    assert progress.clock(65) == "1:05" and progress.clock(3723) == "1:02:03"


def test_config_that_disagrees_with_its_tensors_names_the_dimension(tmp_path, capsys):
    folder = tmp_path / "bad"
    oc.build(str(folder))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["hidden_size"] = 64
    (folder / "config.json").write_text(json.dumps(cfg))
    rc, out, err = run(capsys, "logits", "--model", folder, "--ids", "1,2", "--out", tmp_path / "x.npy")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and len(err) < 300, err
    assert "hidden_size is 64 in config.json, 48 in the tensors (model.embed_tokens.weight [320, 48])" in err


# ------------------------------------------------------------------------------------------------
# specs: all missing keys at once, the point rule, --list, skipped cells
# ------------------------------------------------------------------------------------------------
def test_every_missing_required_key_is_reported_at_once(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('variants = ["unyielded", { name = "split" }]\n[[prompts]]\nkind = "text"\n'
                    '[[prompts]]\nlengths = [3]\n')
    rc, out, err = run(capsys, "run-matrix", "--spec", spec, "--no-plots")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    for key in ("k (e.g. k = [1, 2])", "prompts[0].text", "prompts[1].kind", "variants[1].at"):
        assert key in err, err
    assert "missing required keys:" in err


@pytest.mark.parametrize("fraction, tp, row, how", [
    (0.5, 130, 64, "down to the grid of 64"),
    (0.5, 465, 192, "down to the grid of 64"),
    (0.75, 257, 192, "down to the grid of 64"),
    (0.5, 100, 50, "nearest row leaving 32 on each side"),
    (0.5, 72, 36, "nearest row leaving 32 on each side"),
    (0.9, 100, 64, "down to the grid of 64"),
    (0.95, 90, 58, "nearest row leaving 32 on each side"),  # 86 clamped to T - 32
    (0.1, 70, 32, "nearest row leaving 32 on each side"),  # 7 clamped to 32
    (0.5, 40, None, "cannot be split"),
    (0.5, 63, None, "cannot be split"),
])
def test_fraction_rule(fraction, tp, row, how):
    got, rule = Point(fraction).resolution(tp)
    assert got == row and how in rule
    if row is not None:
        assert 32 <= row <= tp - 32


def test_list_shows_the_cells_and_how_points_resolved(capsys):
    rc, out, err = run(capsys, "run-matrix", "--spec", os.path.join(SPECS_DIR, "tiny.toml"), "--list")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert "tiny/p130/split@64/k1/greedy" in lines[lines.index(next(ln for ln in lines if "split@64/k1" in ln))]
    assert any("split 0.5 × 130 = 65 → 64 (down to the grid of 64)" in ln for ln in lines)
    assert any(ln.startswith("99 cells; 6 schedule(s) skipped:") for ln in lines)
    assert any("tiny/p40 (40 tokens): split 0.5 × 40 = 20: a 40-token prompt cannot be split" in ln for ln in lines)


def test_short_prompts_get_split_cells_now():
    spec = parse_spec({"k": [1], "variants": ["unyielded", {"name": "split", "at": [0.5]}],
                       "prompts": [{"kind": "synthetic", "lengths": [80, 100, 127]}]})
    from harness.matrix.cells import expand_all

    cells, skipped = expand_all(spec)
    assert [c.id for c in cells if c.variant == "split"] == [
        "tiny/p80/split@40/k1/greedy", "tiny/p100/split@50/k1/greedy", "tiny/p127/split@64/k1/greedy"]
    assert skipped == [] and {c.schedule for c in cells if c.variant == "split"} == {"split@0.5"}


# ------------------------------------------------------------------------------------------------
# figures
# ------------------------------------------------------------------------------------------------
def test_verdict_grid_columns_follow_the_spec_and_absent_cells_are_not_applicable():
    from harness.matrix.plots import STATUS_COLOURS, _verdict_text, schedule_labels, spec_schedule

    golden = json.load(open(os.path.join(REPO, "receipts", "golden", "default.json"), encoding="utf-8"))
    labels = set(schedule_labels(golden["cells"], golden["spec"]).values())  # a schema-1 receipt
    assert {"split@0.5", "checkpoint@0.5", "split+checkpoint@0.5,0.75", "yielded-with-peer@0.5,0.5"} <= labels
    assert not any(re.search(r"@\d{3}", lab) for lab in labels)  # no column per resolved row
    assert spec_schedule({"schedule": "split@0.25", "variant_args": {"split": 64}}, None) == "split@0.25"
    assert "n/a" in STATUS_COLOURS and "missing" not in STATUS_COLOURS
    fail = {"id": "x", "oracle": "o", "variant_args": {"split": 192},
            "verdict": {"status": "fail", "max_ulp": 3, "max_abs": 2.5e-06}}
    assert _verdict_text(fail, "split@0.5") == "fail @192\n3 ulp\n|Δ| 2.5e-06"


def test_decode_figure_title_says_speed_up_or_slow_down():
    from harness.matrix.plots import decode_verdict

    assert "speculation is slower here (×0.74–0.87 of plain)" in decode_verdict([0.74, 0.87, 0.8])
    assert "a speed-up of ×1.20–1.50" in decode_verdict([1.2, 1.5])
    assert "× < 1: slower than plain, > 1: faster" in decode_verdict([0.9, 1.1])


# ------------------------------------------------------------------------------------------------
# the embedded models by name
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny", "tiny-q35", "stdlib-small"])
def test_model_takes_an_embedded_models_name(tmp_path, capsys, monkeypatch, name):
    """``--model NAME`` is the embedded model of that name, whatever the working directory: the
    logits equal those of the model's folder given as a path."""
    from harness.models import model_path

    monkeypatch.delenv("PRIMEWALK_BACKEND", raising=False)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "logits", "--model", name, "--ids", "1,2,3", "--out", tmp_path / "n.npy")
    assert rc == 0, err
    rc, out, err = run(capsys, "logits", "--model", model_path(name), "--ids", "1,2,3", "--out", tmp_path / "p.npy")
    assert rc == 0, err
    assert np.load(tmp_path / "n.npy").tobytes() == np.load(tmp_path / "p.npy").tobytes()


def test_a_folder_named_like_an_embedded_model_is_given_as_a_path(tmp_path, capsys, monkeypatch):
    """A bare name is the embedded model even beside a folder of that name; ``./name`` is the folder."""
    from harness.models import model_path

    monkeypatch.chdir(tmp_path)
    shutil.copytree(model_path("stdlib-small"), tmp_path / "tiny")  # a folder called tiny holding stdlib-small
    outs = {}
    for arg in ("tiny", "./tiny"):
        rc, out, err = run(capsys, "logits", "--model", arg, "--ids", "1,2,3", "--out", tmp_path / "x.npy")
        assert rc == 0, err
        outs[arg] = np.load(tmp_path / "x.npy")
    ref = {}
    for name in ("tiny", "stdlib-small"):
        run(capsys, "logits", "--model", model_path(name), "--ids", "1,2,3", "--out", tmp_path / "r.npy")
        ref[name] = np.load(tmp_path / "r.npy")
    assert outs["tiny"].tobytes() == ref["tiny"].tobytes()
    assert outs["./tiny"].tobytes() == ref["stdlib-small"].tobytes()
    rc, out, err = run(capsys, "logits", "--model", "stdlib-smal", "--ids", "1", "--out", tmp_path / "y.npy")
    assert rc == 2 and err.count("\n") == 1 and "stdlib-smal" in err  # a typo stays a clear error


def test_a_spec_names_an_embedded_model(tmp_path):
    """A spec's model may be an embedded model's name; ``./name`` is a folder beside the spec."""
    from harness.errors import PrimewalkError
    from harness.models import model_path

    def spec(models):
        return parse_spec({"models": models, "prompts": [{"kind": "synthetic", "lengths": [8], "seed": 0}],
                           "variants": ["unyielded"], "k": [1]}, where="t.toml", base_dir=str(tmp_path))

    got = spec({"q": "tiny-q35", "s": "stdlib-small", "t": "tiny"}).model_dirs
    assert got == {"q": model_path("tiny-q35"), "s": model_path("stdlib-small"), "t": model_path("tiny")}
    with pytest.raises(PrimewalkError, match=r"models\.p: \./tiny-q35: not a checkpoint folder"):
        spec({"p": "./tiny-q35"})
