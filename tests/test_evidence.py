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
