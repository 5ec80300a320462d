"""The default matrix against its golden receipt (CPU), and the device receipt against the golden.

The golden, ``receipts/golden/default.json``, is re-recorded on purpose only, with
``harness run-matrix --update-golden``; a missing golden is a failure, not a skip.
"""

import os

import pytest

from harness.diff import diff_receipts
from harness.matrix import GOLDEN_PATH, REPO, load_spec, run_matrix
from harness.receipts import read_receipt

DEVICE_PATH = os.path.join(REPO, "receipts", "device", "h200-default.json")
REGENERATE = "run `harness run-matrix --update-golden` (default spec, cpu backend) and commit the result"


def _golden() -> dict:
    if not os.path.exists(GOLDEN_PATH):
        pytest.fail(f"{os.path.relpath(GOLDEN_PATH, REPO)} is missing: {REGENERATE}", pytrace=False)
    return read_receipt(GOLDEN_PATH)


def _explain(result) -> str:
    if result.unusable:
        return f"{result.summary} — if the default spec or the model changed on purpose, {REGENERATE}"
    return f"{result.summary}\n{result.table()}"


def test_default_matrix_matches_the_golden():
    golden = _golden()
    receipt = run_matrix(load_spec(None, backend="cpu"), quiet=True)
    failed = [c["id"] for c in receipt["cells"] if c["verdict"]["status"] != "bitwise"]
    assert not failed, f"cells not bitwise: {failed[:10]}"
    result = diff_receipts(golden, receipt)
    assert result.exit_code == 0, _explain(result)


def test_device_receipt_matches_the_golden_digests():
    if not os.path.exists(DEVICE_PATH):
        pytest.skip(f"no device receipt at {os.path.relpath(DEVICE_PATH, REPO)} (record one on the GPU "
                    "with `harness run-matrix --backend cuda --out receipts/device/h200-default.json`)")
    golden = _golden()
    device = read_receipt(DEVICE_PATH)
    assert device["env"]["backend"] == "cuda", "the device receipt was not recorded on the cuda backend"
    result = diff_receipts(golden, device, digests_only=True)
    assert result.exit_code == 0, _explain(result)


STDLIB_CPU = os.path.join(REPO, "receipts", "stdlib", "cpu.json")
STDLIB_CUDA = os.path.join(REPO, "receipts", "device", "h200-stdlib.json")


def test_stdlib_acceptance_receipts_agree_across_devices():
    """The trained model's acceptance matrix: the H200 run and the CPU-twin run of the same spec
    and weights have equal digests in every cell (the receipts are committed; no compute here)."""
    for path in (STDLIB_CPU, STDLIB_CUDA):
        assert os.path.exists(path), f"{os.path.relpath(path, REPO)} is missing (harness run-matrix --spec harness/specs/stdlib.toml)"
    cpu, cuda = read_receipt(STDLIB_CPU), read_receipt(STDLIB_CUDA)
    assert cpu["env"]["backend"] == "cpu" and cuda["env"]["backend"] == "cuda"
    assert all(c["verdict"]["status"] == "bitwise" for c in cpu["cells"] + cuda["cells"])
    result = diff_receipts(cpu, cuda, digests_only=True)
    assert result.exit_code == 0, _explain(result)
