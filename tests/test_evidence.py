"""The code fingerprint that ties GPU receipts to the code they ran (``harness evidence``)."""

import json
import os
import shutil

import pytest

from harness.gpu import evidence as ev

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_normalisation_ignores_comments_docstrings_and_layout():
    a = 'def f(x, y):\n    """Add."""\n    # the sum\n    return x + y  # done\n'
    b = "def f(x,y):\n    return (x+y)\n"
    assert ev.normalised_source(a) == ev.normalised_source(b)


@pytest.mark.parametrize("change", ["return x - y", "return y + x", "return x + y + 0"])
def test_normalisation_sees_code_changes(change):
    a = "def f(x, y):\n    return x + y\n"
    assert ev.normalised_source(a) != ev.normalised_source(f"def f(x, y):\n    {change}\n")


def test_fstring_forms_normalise_alike():
    # Python 3.12 parses nested format specs with an extra empty constant; the fingerprint must
    # not depend on the Python version that computed it
    assert ev.normalised_source('f"{a:<{w}}x"') == ev.normalised_source('f"{a:<{w}}" "x"')


def _tree(tmp_path):
    root = tmp_path / "repo"
    for rel in ev.fingerprint_files(ROOT):
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), dst)
    (root / "numba_kernels" / "reference.py").write_text("X = 1\n")
    return root


def test_fingerprint_covers_kernels_and_engine_not_reference(tmp_path):
    files = ev.fingerprint_files(ROOT)
    assert any(f.startswith("numba_kernels/") for f in files)
    assert "numba_kernels/reference.py" not in files
    root = _tree(tmp_path)
    base = ev.code_fingerprint(str(root))
    (root / "numba_kernels" / "reference.py").write_text("X = 2\n")  # not covered
    assert ev.code_fingerprint(str(root)) == base
    kern = root / files[-1]
    kern.write_text(kern.read_text() + "\n# a comment only\n")
    assert ev.code_fingerprint(str(root)) == base
    kern.write_text(kern.read_text() + "\n_EXTRA = 1\n")
    assert ev.code_fingerprint(str(root)) != base


def test_check_evidence_statuses(tmp_path, capsys):
    root = _tree(tmp_path)
    fp = ev.code_fingerprint(str(root))
    dev = root / "receipts" / "device"
    dev.mkdir(parents=True)
    (dev / "a.json").write_text(json.dumps({"commit": "abc", "device": "cuda: X", "code_fingerprint": fp}))
    (dev / "b.json").write_text(json.dumps({"env": {"git_sha": "def", "code_fingerprint": "0" * 64}}))
    rows = {r["path"]: r for r in ev.check_evidence(str(root))}
    assert rows["receipts/device/a.json"]["status"] == "current"
    assert rows["receipts/device/b.json"]["status"] == "stale"

    class A:
        pass

    args = A()
    args.root = str(root)
    assert ev.main(args) == 1
    out = capsys.readouterr().out
    assert "1 of 2 GPU receipts do not match" in out and "tools/device_run.sh" in out
    (dev / "b.json").unlink()
    assert ev.main(args) == 0
    (dev / "c.json").write_text(json.dumps({"commit": "x"}))
    assert [r["status"] for r in ev.check_evidence(str(root)) if r["path"].endswith("c.json")] == ["unstamped"]
    # a device-check of some ops only (device-check --ops) is not the check, even at this fingerprint
    (dev / "c.json").write_text(json.dumps({"commit": "x", "code_fingerprint": fp, "ops_filter": ["rmsnorm"]}))
    assert [r["status"] for r in ev.check_evidence(str(root)) if r["path"].endswith("c.json")] == ["partial"]
    assert ev.main(args) == 1


def test_device_check_ops_filter_names_unknown_ops():
    """``device-check --ops`` refuses an op that has no cases, in one line, before touching a GPU."""
    from harness.errors import InputError
    from harness.gpu import devicecheck

    with pytest.raises(InputError, match=r"no cases for nope \(ops with cases: .*rmsnorm"):
        devicecheck.device_check("unused.json", ops=["rmsnorm", "nope"])


def test_device_receipts_record_the_fingerprint():
    """The writers of device evidence stamp this checkout's fingerprint where ``harness evidence``
    reads it: matrix receipts on cuda in ``env`` (CPU receipts do not carry it), device-check /
    device-walker / bench at the top level (``evidence_block(REPO)``)."""
    import inspect

    from harness.gpu import bench, devicecheck
    from harness.matrix.receipts import env_info

    want = ev.code_fingerprint(ev.REPO)
    env = env_info("cuda", device="cuda: X", driver="1")
    assert env["code_fingerprint"] == want and ev.receipt_facts({"env": env})["fingerprint"] == want
    assert "code_fingerprint" not in env_info("cpu")
    for mod, n in ((devicecheck, 2), (bench, 1)):
        assert inspect.getsource(mod).count("**evidence_block(REPO)") == n, mod.__name__


# ------------------------------------------------------------------------------------------------
# device-check in shards (--shard I/N, --merge)
# ------------------------------------------------------------------------------------------------
def _shard_doc(i, n, units, fp="f" * 64, failing=4):
    """What ``device_check(shard=(i, n))`` writes for ``units`` units: units 0..units-3 op cases,
    the last two model runs with two schedule rows each (rows made up; a failing one at unit
    ``failing``, none when it is None)."""
    from harness.gpu.devicecheck import _mine, _summary

    ops_rows, models = [], []
    for u in range(units):
        if not _mine(u, (i, n)):
            continue
        if u < units - 2:
            ops_rows.append({"op": f"op{u}", "case": "c", "verdict": "differs" if u == failing else "bitwise",
                             "max_ulp": 0, "cpu_s": 0.0, "cuda_s": 0.0, "unit": u})
        else:
            for sched in ("tokenwise", "batched"):
                models.append({"model": f"m{u}", "schedule": sched, "cpu_vs_cuda": "bitwise",
                               "vs_tokenwise": "bitwise", "unit": u})
    return {"kind": "device-check", "schema_version": 1, "created": f"2026-12-02T00:00:0{i}Z", "device": "cuda: X",
            "driver": "1", "commit": "abc", "full": True, "seed": 0, "shard": {"index": i, "count": n}, "units": units,
            "code_fingerprint": fp, "fingerprint_files": [], "ops": ops_rows, "schedules": models,
            "wall_s": 10.0 + i, "summary": _summary(ops_rows, models)}


def test_shards_cover_every_unit_once():
    from harness.gpu.devicecheck import _mine

    for n in (1, 2, 3, 7):
        for u in range(50):
            assert sum(_mine(u, (i, n)) for i in range(n)) == 1
        assert all(_mine(u, None) for u in range(50))


@pytest.mark.parametrize("text,msg", [("3/3", "needs 0 <= I < N"), ("-1/2", "needs 0 <= I < N"),
                                      ("0/0", "needs 0 <= I < N"), ("a/b", "expected I/N"), ("1", "expected I/N")])
def test_shard_argument_errors_are_one_line(text, msg):
    from harness.errors import InputError
    from harness.gpu.devicecheck import parse_shard

    with pytest.raises(InputError, match=msg):
        parse_shard(text)
    assert parse_shard("2/3") == (2, 3)


def test_merge_shards_is_the_unsharded_receipt(tmp_path):
    """Rows back in unit order (a model run's schedule rows kept together, in their order), the
    summary recounted over all shards, wall time the longest shard's; no shard marks left, so
    ``harness evidence`` takes the merged receipt and not a shard."""
    from harness.gpu.devicecheck import merge_shards

    paths = []
    for i in (2, 0, 1):  # any order on the command line
        p = tmp_path / f"s{i}.json"
        p.write_text(json.dumps(_shard_doc(i, 3, 11)))
        paths.append(str(p))
    r = merge_shards(paths, str(tmp_path / "all.json"))
    assert [x["unit"] for x in r["ops"]] == list(range(9))
    assert [(x["unit"], x["schedule"]) for x in r["schedules"]] == [(9, "tokenwise"), (9, "batched"),
                                                                    (10, "tokenwise"), (10, "batched")]
    assert r["summary"] == {"ops": 9, "ops_bitwise": 8, "schedules": 4, "schedules_bitwise": 4}
    assert r["wall_s"] == 12.0 and r["shards"] == 3 and "shard" not in r and "units" not in r
    assert json.loads((tmp_path / "all.json").read_text()) == r
    # evidence: a shard is partial, the merged receipt is the check
    root = tmp_path / "repo"
    _tree(root)
    fp = ev.code_fingerprint(str(root))
    dev = root / "receipts" / "device"
    dev.mkdir(parents=True)
    (dev / "s.json").write_text(json.dumps(_shard_doc(0, 3, 11, fp)))
    assert [r["status"] for r in ev.check_evidence(str(root))] == ["partial"]
    (dev / "s.json").write_text(json.dumps({**r, "code_fingerprint": fp}))
    assert [r["status"] for r in ev.check_evidence(str(root))] == ["current"]
    # a matrix receipt names its shard the same way: the whole matrix (one shard of one) is evidence
    (dev / "m.json").write_text(json.dumps({"kind": "matrix", "env": {"code_fingerprint": fp},
                                            "shard": {"index": 0, "count": 1}}))
    assert [r["status"] for r in ev.check_evidence(str(root))] == ["current", "current"]
    (dev / "m.json").write_text(json.dumps({"kind": "matrix", "env": {"code_fingerprint": fp},
                                            "shard": {"index": 1, "count": 2}}))
    assert [r["status"] for r in ev.check_evidence(str(root))] == ["partial", "current"]


def _dc_shards(tmp_path, n, kept, env_from=True):
    """Run tools/dc_shards.sh into tmp_path/run with shard receipts ``kept`` in DC_FROM; a shard
    it does run is a device-check process, which fails here (no GPU, or a bad option)."""
    import subprocess
    import sys

    src = tmp_path / "from"
    src.mkdir(parents=True)
    for i in kept:
        # a passing check: the merge's verdict is the script's exit code
        (src / f"dc-shard{i}.json").write_text(json.dumps(_shard_doc(i, n, 11, failing=None)))
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], "T": "60",
           "PYTHONPATH": ROOT, **({"DC_FROM": str(src)} if env_from else {})}
    run = tmp_path / "run"
    return run, subprocess.run(["bash", os.path.join(ROOT, "tools", "dc_shards.sh"), str(run), str(run / "all.json"),
                                str(n), "--no-such-option"], env=env, capture_output=True, text=True, timeout=120)


def test_dc_shards_keeps_the_shards_an_earlier_stopped_run_finished(tmp_path):
    """A device-check stopped part-way keeps the shard receipts that were written; given them
    (DC_FROM), dc_shards.sh runs only the missing shards, then merges all."""
    from harness.gpu.devicecheck import merge_shards

    run, p = _dc_shards(tmp_path / "a", 3, kept=(0, 1, 2))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("kept from an earlier run") == 3
    assert not list(run.glob("device-check-shard*.log")) and not list(run.glob("dc-shard*.json"))
    want = merge_shards([str(tmp_path / "a" / "from" / f"dc-shard{i}.json") for i in range(3)], str(tmp_path / "w.json"))
    assert json.loads((run / "all.json").read_text()) == want
    # one missing: only that shard runs (and fails here), the kept ones stay for the next try
    run, p = _dc_shards(tmp_path / "b", 3, kept=(0, 2))
    assert p.returncode == 1 and p.stdout.count("kept from an earlier run") == 2
    assert sorted(x.name for x in run.glob("device-check-shard*.log")) == ["device-check-shard1.log"]
    assert sorted(x.name for x in run.glob("dc-shard*.json")) == ["dc-shard0.json", "dc-shard2.json"]
    assert not (run / "all.json").exists()
    _, p = _dc_shards(tmp_path / "c", 3, kept=())
    assert p.returncode == 2 and "no dc-shard*.json in DC_FROM" in p.stderr


def test_merge_shards_refuses_what_is_not_one_whole_check(tmp_path):
    from harness.errors import InputError
    from harness.gpu.devicecheck import merge_shards

    def put(name, doc):
        p = tmp_path / name
        p.write_text(json.dumps(doc) if isinstance(doc, dict) else doc)
        return str(p)

    s0, s1, s2 = (put(f"s{i}.json", _shard_doc(i, 3, 11)) for i in range(3))
    out = str(tmp_path / "out.json")
    with pytest.raises(InputError, match=r"needs shards 0/3 \.\. 2/3 once each, got 0/3, 1/3"):
        merge_shards([s0, s1], out)
    with pytest.raises(InputError, match="once each, got 0/3, 1/3, 1/3"):
        merge_shards([s0, s1, s1], out)
    other = put("o.json", _shard_doc(2, 3, 11, fp="0" * 64))
    with pytest.raises(InputError, match="differ in 'code_fingerprint'"):
        merge_shards([s0, s1, other], out)
    whole = put("w.json", {k: v for k, v in _shard_doc(0, 1, 11).items() if k != "shard"})
    with pytest.raises(InputError, match="is not a shard"):
        merge_shards([whole], out)
    with pytest.raises(InputError, match="is not a device-check receipt"):
        merge_shards([put("m.json", {"kind": "matrix"})], out)
    with pytest.raises(InputError, match="cannot read"):
        merge_shards([put("bad.json", "{")], out)
    assert not os.path.exists(out)  # nothing written on a refusal


def test_device_check_shard_and_merge_from_the_command_line(tmp_path, capsys):
    """--merge needs no GPU and prints the verdict (exit 1 when a case differs); a bad --shard and
    --merge mixed with a run's options are one-line errors."""
    from harness.cli import main

    paths = []
    for i in range(2):
        p = tmp_path / f"s{i}.json"
        p.write_text(json.dumps(_shard_doc(i, 2, 8)))
        paths.append(str(p))
    out = tmp_path / "all.json"
    assert main(["device-check", "--merge", *paths, "--out", str(out)]) == 1  # unit 4 differs
    o, e = capsys.readouterr()
    assert "device-check FAIL: 5/6 ops bitwise, 4/4 schedules bitwise" in o and out.exists()
    for argv in (["--shard", "3/3"], ["--merge", paths[0], "--shard", "0/2"]):
        assert main(["device-check", *argv, "--out", str(tmp_path / "x.json")]) == 2
        o, e = capsys.readouterr()
        assert len(e.strip().splitlines()) == 1 and ("needs 0 <= I < N" in e or "joins finished shards" in e), e
