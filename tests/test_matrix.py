"""The schedule matrix: spec validation, cell expansion, an end-to-end run of a tiny spec, shards
and merge, drift detection by ``harness diff``, and interrupted runs."""

import contextlib
import io
import json
import os

import numpy as np
import pytest

from harness import cli
from harness.engine.digests import capture_digest, continuation_digest, logits_digest
from harness.errors import PrimewalkError
from harness.matrix import builtin, runner, specfile
from harness.matrix.cells import Cell, expand
from harness.matrix.diff import diff_receipts
from harness.matrix.receipts import csv_path, merge_receipts, read_receipt
from harness.matrix.runner import Raw
from harness.matrix.specfile import load_spec, parse_spec
from harness.walk.sampling import Sampling
from harness.walk.schedule import PRIME_MIN_T

# Short prompts so the run is fast: p30 and p72 (synthetic), a text prompt of 11 tokens (short).
TINY_SPEC = """\
backend = "cpu"
max_new_tokens = 8
chunk_rows = 16
fill_chunk = 32
k = [1, 2]
sampling = [{ temperature = 0.0, seed = 0 }, { temperature = 0.9, seed = 3 }]
variants = [
    "unyielded",
    "tokenwise",
    { name = "batched", chunk_rows = [24] },
    { name = "split", at = [36, 0.5] },
    { name = "checkpoint", at = 40 },
    { name = "split+checkpoint", split = 32, checkpoint = 40 },
    "short",
    { name = "yielded-with-peer", split = 36, checkpoint = 36 },
]

[models]
tiny = "tiny"

[[prompts]]
kind = "synthetic"
lengths = [30, 72]
seed = 3
sampling = ["greedy"]

[[prompts]]
kind = "text"
text = "hello world"
name = "hello"
k = [2]
"""


def _run(argv):
    """cli.main(argv) -> (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def _write(tmp_path, text, name="spec.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny spec run once, unsharded: (spec path, receipt path, receipt, stdout)."""
    d = tmp_path_factory.mktemp("matrix")
    spec = _write(d, TINY_SPEC)
    out = str(d / "out" / "full.json")
    rc, stdout, stderr = _run(["run-matrix", "--spec", spec, "--out", out, "--no-plots"])
    assert rc == 0, stdout + stderr
    return spec, out, read_receipt(out), stdout


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
BAD_SPECS = [
    # (what the spec says, the key and text the one-line error names)
    (TINY_SPEC.replace('name = "hello"', 'name = "hello"\n\n[[prompts]]\nkind = "synthetic"\nlengths = "abc"'),
     'prompts[2].lengths: expected a list of positive integers, got "abc"'),
    (TINY_SPEC.replace("lengths = [30, 72]", "lengths = [30, 0]"),
     "prompts[0].lengths: expected a list of positive integers, got [30, 0]"),
    ("colour = 1\n" + TINY_SPEC, "colour: unknown key"),
    (TINY_SPEC.replace('"tokenwise",', '{ name = "tokenwise", chunk_rows = 8 },'),
     "variants[1].chunk_rows: unknown key (tokenwise takes no arguments)"),
    (TINY_SPEC.replace('"tokenwise",', '"tokenwize",'), "variants[1]: expected one of unyielded,"),
    (TINY_SPEC.replace('backend = "cpu"', 'backend = "cpu"\nmode = "chunked"'),
     'mode: "chunked" is not implemented yet'),
    (TINY_SPEC.replace('backend = "cpu"', 'backend = "tpu"'), 'backend: expected one of "cpu", "cuda", got "tpu"'),
    (TINY_SPEC.replace("k = [1, 2]", "k = [1, true]"), "k: expected a list of positive integers, got [1, true]"),
    (TINY_SPEC.replace("temperature = 0.9", "temperature = -1.0"),
     "sampling[1].temperature: expected a finite number >= 0, got -1.0"),
    (TINY_SPEC.replace("temperature = 0.9", "temperature = inf"),
     "sampling[1].temperature: expected a finite number >= 0"),
    (TINY_SPEC.replace('sampling = ["greedy"]', 'sampling = ["t0.5"]'),
     'prompts[0].sampling: expected labels among "greedy", "t0.9", got "t0.5"'),
    (TINY_SPEC.replace("at = [36, 0.5]", "at = [36, 1.5]"),
     "variants[3].at[1]: expected a row (positive integer) or a fraction of the prompt"),
    (TINY_SPEC.replace("at = [36, 0.5]", "at = [20]"),
     f"variants[3].at: split point 20 leaves a first segment of 20 rows (< PRIME_MIN_T = {PRIME_MIN_T})"),
    (TINY_SPEC.replace("at = [36, 0.5]", "at = [50]"),
     "variants[3].at: split point 50 leaves a last segment of 22 rows in prompt p72"),
    (TINY_SPEC.replace('    "unyielded",\n', ""), 'variants: expected "unyielded" among the variants'),
    (TINY_SPEC.replace("[[prompts]]", "[[prompts]]\nkind = \"file\"\npath = \"nope.txt\"\n\n[[prompts]]", 1),
     "prompts[0].path: cannot read nope.txt"),
    (TINY_SPEC.replace('tiny = "tiny"', 'tiny = "no/such/folder"'),
     "models.tiny: no/such/folder: not a checkpoint folder"),
    (TINY_SPEC.replace('name = "hello"', 'name = "p30"'), "prompts[1].text: prompt name 'p30' is already used"),
    (TINY_SPEC.replace("max_new_tokens = 8", "max_new_tokens = 8\nmax_new_tokens = 9"), "not valid TOML"),
    ("k = [1]\nvariants = [\"unyielded\"]\n", "missing required key: prompts"),
]


@pytest.mark.parametrize("text,message", BAD_SPECS, ids=[f"bad{i}" for i in range(len(BAD_SPECS))])
def test_bad_spec_is_refused_in_one_line_before_anything_runs(tmp_path, monkeypatch, text, message):
    def must_not_run(*a, **k):
        raise AssertionError("a cell ran for a bad spec")

    monkeypatch.setattr(runner, "load_models", must_not_run)
    spec = _write(tmp_path, text)
    out = tmp_path / "out" / "x.json"
    rc, stdout, stderr = _run(["run-matrix", "--spec", spec, "--out", str(out), "--no-plots"])
    assert rc == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"harness run-matrix: error: {spec}: "), lines[0]
    assert message in lines[0], lines[0]
    assert not out.exists() and not (tmp_path / "out").exists()


def test_unreadable_spec_and_bad_flags_exit_2(tmp_path):
    rc, _, err = _run(["run-matrix", "--spec", str(tmp_path / "missing.toml"), "--no-plots"])
    assert rc == 2 and "missing.toml: cannot read the spec" in err and len(err.strip().splitlines()) == 1
    spec = _write(tmp_path, TINY_SPEC)
    rc, _, err = _run(["run-matrix", "--spec", spec, "--shard", "2/2", "--no-plots"])
    assert rc == 2 and "--shard: expected I/N with 0 <= I < N, got '2/2'" in err


def test_update_golden_takes_built_in_specs_only_each_to_its_own_golden(tmp_path, monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("a cell ran for a refused --update-golden")

    monkeypatch.setattr(runner, "run_matrix", must_not_run)
    # a spec outside harness/specs/ (even a copy of a built-in one) has no golden
    copy = _write(tmp_path, open(os.path.join(builtin.SPECS_DIR, "tiny.toml")).read(), name="tiny.toml")
    for spec in (_write(tmp_path, TINY_SPEC), copy):
        rc, _, err = _run(["run-matrix", "--spec", spec, "--update-golden", "--no-plots"])
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{spec} is not a built-in spec; give the golden's path with --golden PATH" in err
    tiny = os.path.join("harness", "specs", "tiny.toml")
    for argv, why in ((["--backend", "cuda"], "the backend is cuda"),
                      (["--spec", tiny, "--out", str(tmp_path / "x.json")], "--out is given"),
                      (["--spec", tiny, "--shard", "0/2"], "--shard is given"),
                      (["--spec", tiny, "--model", specfile.EMBEDDED], "--model is given")):
        rc, _, err = _run(["run-matrix", "--update-golden", "--no-plots", *argv])
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "--update-golden only records a built-in spec on the cpu backend" in err and why in err, err
    assert not (tmp_path / "x.json").exists()
    # each built-in spec's golden is receipts/golden/<stem>.json, however the spec's path is written
    assert builtin.GOLDEN_PATH == builtin.golden_path("default") == load_spec(None).golden
    assert set(builtin.builtin_specs()) >= {"default", "tiny", "stdlib"}
    monkeypatch.chdir(builtin.REPO)
    for path in (tiny, os.path.join(builtin.REPO, tiny), os.path.join("harness", "..", tiny)):
        spec = load_spec(path)
        assert spec.builtin == spec.stem == "tiny" and spec.source == tiny.replace(os.sep, "/")
        assert spec.golden == os.path.join(builtin.REPO, "receipts", "golden", "tiny.json")
    spec = load_spec(os.path.join("harness", "specs", "default.toml"))
    assert spec.is_default and spec.source == "default" and spec.golden == builtin.GOLDEN_PATH
    assert load_spec(copy).golden is None and load_spec(copy).stem == "tiny"


def test_default_spec_is_the_trained_model():
    spec = load_spec(None)
    assert spec.is_default and spec.builtin == "default" and spec.backend == "cpu" and spec.mode == "exact"
    assert list(spec.models) == ["stdlib"]
    assert os.path.samefile(spec.model_dirs["stdlib"], os.path.join(builtin.HARNESS, "models", "stdlib-small"))
    cells, notes = expand(spec)
    ids = [c.id for c in cells]
    assert len(ids) == len(set(ids)) == 99
    oracles = {c.id for c in cells if c.variant == "unyielded"}
    assert all(c.oracle in oracles for c in cells)
    assert {c.variant for c in cells} == set(specfile.VARIANTS)
    assert all(c.prompt.length <= spec.fill_chunk for c in cells if c.variant == "short")
    assert "stdlib/heldout2/split@192/k2/t0.7" in ids and "stdlib/short/short/k3/greedy" in ids
    assert [c.id for c in expand(load_spec("default"))[0]] == ids


def test_tiny_spec_expands_to_unique_ids_with_their_oracles():
    spec = load_spec(os.path.join(builtin.SPECS_DIR, "tiny.toml"))
    assert spec.builtin == "tiny" and spec.backend == "cpu" and spec.mode == "exact"
    assert list(spec.models) == ["tiny"]
    cells, notes = expand(spec)
    ids = [c.id for c in cells]
    assert len(ids) == len(set(ids))
    assert [c.order for c in cells] == list(range(len(cells)))
    oracles = {c.id for c in cells if c.variant == "unyielded"}
    assert all(c.oracle in oracles for c in cells)
    assert {c.variant for c in cells} == set(specfile.VARIANTS)
    # p40 is short: split/checkpoint at 0.5 round down to row 0 and are skipped, with notes
    assert not any(c.prompt.name == "p40" and c.points for c in cells)
    assert any("p40" in n and "PRIME_MIN_T" in n for n in notes)
    assert all(c.prompt.length <= spec.fill_chunk for c in cells if c.variant == "short")
    # expansion is stable: the same spec gives the same ids in the same order
    assert [c.id for c in expand(load_spec(os.path.join(builtin.SPECS_DIR, "tiny.toml")))[0]] == ids
    assert "tiny/p130/split@64/k2/greedy" in ids
    assert "tiny/p257/batched@c32/k1/greedy" in ids


def test_points_round_down_to_the_gdn_grid_and_short_uses_the_prompt_length(tmp_path):
    spec = parse_spec({"k": [1], "variants": ["unyielded", {"name": "split", "at": [0.5, 0.9]}, "short"],
                       "prompts": [{"kind": "synthetic", "lengths": [300, 20]}]}, where="s.toml")
    cells, notes = expand(spec)
    by = {c.id: c for c in cells}
    assert by["tiny/p300/split@128/k1/greedy"].split == 128  # 150 -> 128
    assert by["tiny/p300/split@256/k1/greedy"].split == 256  # 270 -> 256 leaves 44 >= 32
    assert by["tiny/p20/short/k1/greedy"].fill_chunk == 20
    assert "tiny/p300/short/k1/greedy" not in by
    assert any("short" in n and "p300" in n for n in notes)


def test_verdict_names_what_differs_with_max_abs_and_ulp():
    logits = np.linspace(-1, 1, 16, dtype=np.float32)

    def raw(lg, tokens=(1, 2, 3), state="s"):
        return Raw(tape=[], yields=0, logits=lg,
                   digests={"logits": logits_digest(lg), "captures": capture_digest([]), "final_state": state,
                            "continuation": continuation_digest(tokens)},
                   tokens=list(tokens), plain_tokens=list(tokens), acceptance={}, timings={})

    spec = parse_spec({"k": [1], "variants": ["unyielded", "tokenwise"],
                       "prompts": [{"kind": "synthetic", "lengths": [40]}]}, where="s.toml")
    oracle_cell, cell = expand(spec)[0]
    oracle = raw(logits)
    assert runner.verdict(oracle_cell, oracle, oracle, logits, capture_digest([]))["status"] == "bitwise"
    assert runner.verdict(cell, raw(logits.copy()), oracle, logits, capture_digest([]))["status"] == "bitwise"
    bumped = logits.copy()
    bumped[3] = np.nextafter(bumped[3], np.float32(2), dtype=np.float32)
    bumped[3] = np.nextafter(bumped[3], np.float32(2), dtype=np.float32)
    v = runner.verdict(cell, raw(bumped, tokens=(1, 2, 4), state="t"), oracle, logits, capture_digest([]))
    assert v["status"] == "fail" and v["max_ulp"] == 2 and 0 < v["max_abs"] < 1e-6
    assert "logits" in v["detail"] and "final_state" in v["detail"]
    assert "continuation (from token 2)" in v["detail"]
    # the oracle itself is checked against the independent prime
    v = runner.verdict(oracle_cell, oracle, oracle, bumped, capture_digest([]))
    assert v["status"] == "fail" and "independent" in v["detail"]
    assert runner.ulp_distance(np.float32([-0.0]), np.float32([0.0])) == 0
    assert runner.ulp_distance(np.float32([-1e-45]), np.float32([1e-45])) == 2


def test_greedy_speculative_must_equal_plain_decoding():
    spec = parse_spec({"k": [1], "variants": ["unyielded"], "prompts": [{"kind": "synthetic", "lengths": [40]}]},
                      where="s.toml")
    (cell,) = expand(spec)[0]
    lg = np.zeros(4, np.float32)
    r = Raw([], 0, lg, {"logits": logits_digest(lg), "captures": capture_digest([]), "final_state": "s",
                        "continuation": "c"}, [1, 2], [1, 3], {}, {})
    v = runner.verdict(cell, r, r, lg, capture_digest([]))
    assert v["status"] == "fail" and "plain greedy" in v["detail"]
    sampled = Cell(**{**cell.__dict__, "sampling": Sampling(0.7, 1), "sampling_label": "t0.7"})
    assert runner.verdict(sampled, r, r, lg, capture_digest([]))["status"] == "bitwise"


# ------------------------------------------------------------------------------------------------
# runs
# ------------------------------------------------------------------------------------------------
def test_tiny_spec_end_to_end(tiny):
    spec_path, out, receipt, stdout = tiny
    cells = receipt["cells"]
    ids = [c["id"] for c in cells]
    assert len(ids) == len(set(ids)) and len(ids) > 20
    assert all(c["verdict"]["status"] == "bitwise" for c in cells), [c["id"] for c in cells
                                                                      if c["verdict"]["status"] != "bitwise"]
    assert [c["order"] for c in cells] == list(range(len(cells)))
    assert receipt["shard"] == {"index": 0, "count": 1}
    assert receipt["spec"]["source"] == spec_path and receipt["env"]["backend"] == "cpu"
    assert os.path.exists(csv_path(out))
    by = {c["id"]: c for c in cells}
    assert all(by[c["oracle"]]["variant"] == "unyielded" for c in cells)
    # the cells expected of the spec, with their schedules
    y = by["tiny/p72/yielded-with-peer@36,36/k2/greedy"]
    assert y["yields"] == len(y["tape"]) - 1 > 0 and y["boundary_points"] == [36]
    assert by["tiny/p72/split+checkpoint@32,40/k1/greedy"]["boundary_points"] == [32, 40]
    assert by["tiny/p72/batched@c24/k1/greedy"]["tape"][:3] == [["mtp-trunk", 24]] * 3
    assert by["tiny/p72/tokenwise/k1/greedy"]["tape"][0] == ["mtp-trunk", 72]  # one token-by-token chunk
    assert "tiny/hello/short/k2/greedy" in by and by["tiny/hello/short/k2/greedy"]["tape"] == [["mtp-trunk", 11]]
    assert "tiny/p72/short/k1/greedy" not in by  # 72 > fill_chunk 32
    assert by["tiny/p30/unyielded/k1/greedy"]["tape"] == [["mtp-trunk", 30]]  # < PRIME_MIN_T: target steps
    assert "tiny/hello/unyielded/k2/t0.9" in by and "tiny/p72/unyielded/k1/t0.9" not in by
    assert not any(c["prompt"] == "p72" and c["variant"] == "split" and c["variant_args"]["split"] == 0
                   for c in cells)
    # 0.5 of 72 -> row 36 (the grid row 0 leaves no first segment), the cell of the explicit 36
    assert any("variants[3]" in n and "p72" in n and "same cell" in n for n in receipt["notes"])
    assert {"model": "tiny", "prompt": "p72", "prompt_len": 72, "variant": "split", "entry": "variants[3]",
            "schedule": "split@0.5", "reason": "gives the same cell as variants[3] (split@36)"} in receipt["skipped"]
    for c in cells:
        trunk = sum(r for ph, r in c["tape"] if ph == "mtp-trunk")
        assert trunk == c["prompt_len"]
        assert len(c["continuation"]["tokens"]) == 8
        assert len(c["acceptance"]["histogram"]) == c["k"] + 1
        assert c["timings"]["prime_tokens_per_s"] > 0 and len(c["timings"]["chunk_wall_s"]) == len(c["tape"])
    # one line per cell, then the summary
    lines = stdout.strip().splitlines()
    cell_lines = [line for line in lines if " cell " in line]
    assert [line.split()[0] for line in cell_lines] == [f"[{i + 1}/{len(ids)}]" for i in range(len(ids))]
    assert [line.split()[2] for line in cell_lines] == ids
    assert lines[-1].startswith(f"matrix: {len(cells)} cells: {len(cells)} bitwise, 0 fail in ")
    assert out in lines[-1]


def test_shards_merge_to_the_full_run(tiny, tmp_path):
    spec_path, out, full, _ = tiny
    parts = []
    for i in range(2):
        p = str(tmp_path / f"s{i}.json")
        rc, _, err = _run(["run-matrix", "--spec", spec_path, "--shard", f"{i}/2", "--out", p, "--no-plots",
                           "--quiet"])
        assert rc == 0, err
        r = read_receipt(p)
        assert r["shard"] == {"index": i, "count": 2}
        assert all(c["order"] % 2 == i for c in r["cells"])
        parts.append(p)
    merged = merge_receipts(parts)
    assert [c["id"] for c in merged["cells"]] == [c["id"] for c in full["cells"]]
    result = diff_receipts(full, merged)
    assert result.exit_code == 0 and not result.rows, result.table()
    rc, stdout, _ = _run(["merge", str(tmp_path / "m.json")] + parts)
    assert rc == 0
    rc, stdout, _ = _run(["diff", out, str(tmp_path / "m.json")])
    assert rc == 0 and "diff: equal" in stdout


def test_a_changed_digest_makes_diff_exit_1_naming_the_cell(tiny, tmp_path):
    _, out, receipt, _ = tiny
    changed = json.loads(json.dumps(receipt))
    victim = changed["cells"][5]
    victim["digests"]["final_state"] = "0" * 64
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(changed))
    rc, stdout, _ = _run(["diff", out, str(path)])
    assert rc == 1
    assert victim["id"] in stdout and "digests.final_state" in stdout
    other = [c["id"] for c in receipt["cells"] if c["id"] != victim["id"]]
    assert not any(cid + " " in stdout for cid in other)


def test_interrupted_run_leaves_no_receipt(tmp_path, monkeypatch):
    spec = _write(tmp_path, TINY_SPEC)
    real, calls = runner.run_cell, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner, "run_cell", flaky)
    out = tmp_path / "out" / "r.json"
    rc, _, err = _run(["run-matrix", "--spec", spec, "--out", str(out)])
    assert rc == 130 and "interrupted" in err
    assert len(calls) == 4
    assert not out.exists() and not os.path.exists(csv_path(str(out)))
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_model_override_and_backend_are_recorded(tmp_path):
    from harness.models import default_model_path

    spec = load_spec(_write(tmp_path, TINY_SPEC), model=default_model_path())
    assert list(spec.models) == ["tiny"] and spec.data["models"] == {"tiny": default_model_path()}
    with pytest.raises(PrimewalkError, match="--model: .*not a checkpoint folder"):
        load_spec(_write(tmp_path, TINY_SPEC), model=str(tmp_path))


def test_figures_are_drawn_beside_the_receipt(tmp_path):
    spec = _write(tmp_path, 'k = [1, 2]\nvariants = ["unyielded", "tokenwise"]\n'
                            '[[prompts]]\nkind = "synthetic"\nlengths = [40]\n')
    out = tmp_path / "r.json"
    rc, stdout, _ = _run(["run-matrix", "--spec", spec, "--out", str(out), "--quiet"])
    assert rc == 0
    pngs = sorted(p.name for p in tmp_path.glob("r.*.png"))
    assert "r.verdicts.png" in pngs and len(pngs) >= 3
    assert stdout.count("\n") == 1 and "plots" in stdout  # --quiet: the summary line only


def test_a_failing_cell_is_recorded_and_exits_1(tmp_path, monkeypatch):
    spec = _write(tmp_path, 'k = [1]\nvariants = ["unyielded", "tokenwise", { name = "batched", chunk_rows = 16 }]\n'
                            '[[prompts]]\nkind = "synthetic"\nlengths = [40]\n')
    real = runner.run_cell

    def drift(engine, cell, ids, max_new):
        raw = real(engine, cell, ids, max_new)
        if cell.variant == "tokenwise":  # one logit one ulp off, as a broken schedule would give
            raw.logits = raw.logits.copy()
            raw.logits[7] = np.nextafter(raw.logits[7], np.float32(np.inf), dtype=np.float32)
            raw.digests["logits"] = logits_digest(raw.logits)
        return raw

    monkeypatch.setattr(runner, "run_cell", drift)
    out = tmp_path / "r.json"
    rc, stdout, _ = _run(["run-matrix", "--spec", spec, "--out", str(out), "--no-plots"])
    assert rc == 1
    cells = {c["id"]: c for c in read_receipt(str(out))["cells"]}
    v = cells["tiny/p40/tokenwise/k1/greedy"]["verdict"]
    assert v["status"] == "fail" and v["max_ulp"] == 1 and v["max_abs"] > 0 and v["detail"] == "differs: logits"
    assert cells["tiny/p40/batched@c16/k1/greedy"]["verdict"]["status"] == "bitwise"
    assert "cell tiny/p40/tokenwise/k1/greedy fail" in stdout and "1 ulp" in stdout
    assert "3 cells: 2 bitwise, 1 fail" in stdout
