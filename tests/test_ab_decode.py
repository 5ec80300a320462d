"""tools/ab_decode.sh without a GPU: --pack writes the base tree decode_profile.py needs (and not
the trained models), and the device side refuses to start without one."""

from __future__ import annotations

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
    assert "harness/models/tiny/config.json" in names or any(n.startswith("harness/models/tiny/") for n in names)
    ignored = subprocess.run(["git", "check-ignore", "-q", "ab-base.tgz"], cwd=c)
    assert ignored.returncode == 0  # never committed by accident


def test_device_side_needs_the_base(tmp_path):
    p = subprocess.run(["bash", os.path.join(ROOT, "tools/ab_decode.sh"), str(tmp_path / "o")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no ab-base.tgz here" in p.stderr
