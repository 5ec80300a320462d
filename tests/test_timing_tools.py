"""tools/_timing.py's clock reader, which the device probes record before and after they time
(a GPU idle before a probe may start at a fraction of its SM clock): checked on made-up
``nvidia-smi`` outputs (no GPU)."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

from _timing import sm_clocks  # noqa: E402


def fake(stdout=None, exc=None):
    def run(cmd, **kw):
        assert cmd[0] == "nvidia-smi" and "--query-gpu=clocks.sm,clocks.max.sm" in cmd
        if exc is not None:
            raise exc
        return subprocess.CompletedProcess(cmd, 0, stdout=stdout, stderr="")
    return run


def test_reads_the_first_gpus_clocks():
    assert sm_clocks(fake("345, 1980\n1980, 1980\n")) == {"sm_mhz": 345, "max_sm_mhz": 1980}


def test_none_where_the_clock_cannot_be_read():
    assert sm_clocks(fake(exc=FileNotFoundError("nvidia-smi"))) is None
    assert sm_clocks(fake(exc=subprocess.TimeoutExpired("nvidia-smi", 20))) is None
    assert sm_clocks(fake("")) is None
    assert sm_clocks(fake("[N/A], 1980\n")) is None
    assert sm_clocks(fake("1980\n")) is None
