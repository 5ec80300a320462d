"""The built-in matrices against their golden receipts (CPU), and the device receipt against the
default golden.

Every built-in spec ``harness/specs/<stem>.toml`` has its golden at ``receipts/golden/<stem>.json``,
re-recorded on purpose only, with ``harness run-matrix [--spec harness/specs/<stem>.toml]
--update-golden``. Two are re-run here: ``default`` (the README's main job, on the trained
stdlib-small model; the only place the full default matrix runs in the test suite) and ``tiny``
(the random tiny model). A missing golden is a failure, not a skip.
"""

import os

import pytest

from harness.matrix.builtin import GOLDEN_PATH, REPO, SPECS_DIR, golden_path
from harness.matrix.diff import diff_receipts
from harness.matrix.receipts import read_receipt
from harness.matrix.runner import run_matrix
from harness.matrix.specfile import load_spec

DEVICE_PATH = os.path.join(REPO, "receipts", "device", "cuda-default.json")
GOLDEN_SPECS = ("tiny", "tiny-q35", "default")  # the tiny ones first: they fail fast


def _regenerate(stem: str) -> str:
    spec = "" if stem == "default" else f" --spec harness/specs/{stem}.toml"
    return f"run `harness run-matrix{spec} --update-golden` (cpu backend) and commit the result"


def _golden(stem: str = "default") -> dict:
    path = golden_path(stem)
    if not os.path.exists(path):
        pytest.fail(f"{os.path.relpath(path, REPO)} is missing: {_regenerate(stem)}", pytrace=False)
    return read_receipt(path)


def _explain(result, stem: str = "default") -> str:
    if result.unusable:
        return f"{result.summary} — if the {stem} spec or its model changed on purpose, {_regenerate(stem)}"
    return f"{result.summary}\n{result.table()}"


def test_default_golden_is_the_default_spec_golden():
    assert GOLDEN_PATH == golden_path("default") == load_spec(None).golden


@pytest.mark.parametrize("stem", GOLDEN_SPECS)
def test_builtin_matrix_matches_its_golden(stem):
    golden = _golden(stem)
    spec = load_spec(None if stem == "default" else os.path.join(SPECS_DIR, f"{stem}.toml"), backend="cpu")
    assert spec.golden == golden_path(stem)
    receipt = run_matrix(spec)  # no progress display
    failed = [c["id"] for c in receipt["cells"] if c["verdict"]["status"] != "bitwise"]
    assert not failed, f"cells not bitwise: {failed[:10]}"
    result = diff_receipts(golden, receipt)
    assert result.exit_code == 0, _explain(result, stem)


def test_device_receipt_matches_the_golden_digests():
    if not os.path.exists(DEVICE_PATH):
        pytest.skip(f"no device receipt at {os.path.relpath(DEVICE_PATH, REPO)} (record one on the GPU "
                    "with `harness run-matrix --backend cuda --out receipts/device/cuda-default.json`)")
    golden = _golden()
    device = read_receipt(DEVICE_PATH)
    assert device["env"]["backend"] == "cuda", "the device receipt was not recorded on the cuda backend"
    result = diff_receipts(golden, device, digests_only=True)
    assert result.exit_code == 0, _explain(result)


STDLIB_CPU = os.path.join(REPO, "receipts", "stdlib", "cpu.json")
STDLIB_CUDA = os.path.join(REPO, "receipts", "device", "cuda-stdlib.json")


def test_stdlib_acceptance_receipts_agree_across_devices():
    """The trained model's acceptance matrix: the H200 run and the CPU-twin run of the same spec
    and weights have equal digests in every cell (the receipts are committed; no compute here)."""
    for path in (STDLIB_CPU, STDLIB_CUDA):
        assert os.path.exists(path), (f"{os.path.relpath(path, REPO)} is missing "
                                      "(harness run-matrix --spec harness/specs/stdlib.toml)")
    cpu, cuda = read_receipt(STDLIB_CPU), read_receipt(STDLIB_CUDA)
    assert cpu["env"]["backend"] == "cpu" and cuda["env"]["backend"] == "cuda"
    assert all(c["verdict"]["status"] == "bitwise" for c in cpu["cells"] + cuda["cells"])
    result = diff_receipts(cpu, cuda, digests_only=True)
    assert result.exit_code == 0, _explain(result)
