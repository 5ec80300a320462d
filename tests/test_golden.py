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
