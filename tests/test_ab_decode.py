"""tools/ab_decode.sh without a GPU: --pack writes the base tree decode_profile.py needs (and not
the trained models), the device side refuses to start without one, and -- with a stand-in for
decode_profile.py's GPU run -- it runs both trees, writes both receipts where asked (a relative
OUTDIR too) and exits 0 only when this tree is faster at every row count."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pack_holds_the_profile_code_and_not_the_models(tmp_path):
    subprocess.run(["git", "clone", "-q", ROOT, str(tmp_path / "c")], check=True)
    c = tmp_path / "c"
    p = subprocess.run(["bash", os.path.join(ROOT, "tools/ab_decode.sh"), "--pack", "HEAD"], cwd=c,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    with tarfile.open(c / "ab-base.tgz") as t:
        names = set(t.getnames())
    assert {"tools/decode_profile.py", "harness/engine/model.py", "numba_kernels/mma_tc.py"} <= names
    assert not any(n.startswith("harness/models/stdlib-small/") for n in names)
    assert any(n.startswith("harness/models/tiny/") for n in names)
    ignored = subprocess.run(["git", "check-ignore", "-q", "ab-base.tgz"], cwd=c)
    assert ignored.returncode == 0  # never committed by accident


def test_device_side_needs_the_base(tmp_path):
    p = subprocess.run(["bash", os.path.join(ROOT, "tools/ab_decode.sh"), str(tmp_path / "o")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no ab-base.tgz here" in p.stderr


_FAKE_PROFILE = """#!/bin/sh
# stands for `python tools/decode_profile.py --out F ...`: the base tree (it has ab-base.tgz's
# marker) takes BASE_US a step, this tree THIS_US
out=$(echo "$@" | sed 's/.*--out \\([^ ]*\\).*/\\1/')
us=$THIS_US; [ -f BASE_MARKER ] && us=$BASE_US
printf '{"device": "cuda: FAKE GPU", "steps": {"1": {"whole_us": %s, "replay_device_us": %s, "captured_equals_eager": true}}}' $us $us > "$out"
"""


def _ab(tmp_path, base_us, this_us):
    here = tmp_path / "tree"
    (here / "tools").mkdir(parents=True)
    src = tmp_path / "src"
    src.mkdir()
    (src / "BASE_MARKER").write_text("")
    subprocess.run(["tar", "czf", str(here / "ab-base.tgz"), "-C", str(src), "."], check=True)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text(_FAKE_PROFILE)
    (bindir / "python").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", BASE_US=str(base_us), THIS_US=str(this_us))
    p = subprocess.run(["bash", os.path.join(ROOT, "tools/ab_decode.sh"), "out", "--rows", "1"], cwd=here,
                       capture_output=True, text=True, timeout=60, env=env)
    got = {s: json.loads((here / "out" / f"{s}.json").read_text())["steps"]["1"]["whole_us"] for s in ("base", "this")}
    return p.returncode, got, p.stdout


def test_runs_both_trees_into_a_relative_outdir_and_says_which_is_faster(tmp_path):
    rc, got, out = _ab(tmp_path / "a", 900.0, 820.0)
    assert rc == 0 and got == {"base": 900.0, "this": 820.0}, out
    assert "rows 1: base 900.0 us, this 820.0 us" in out
    assert "device: cuda: FAKE GPU" in out  # the device this tree's profile names
    rc, got, _ = _ab(tmp_path / "b", 800.0, 820.0)
    assert rc == 1 and got == {"base": 800.0, "this": 820.0}
