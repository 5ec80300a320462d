"""tools/probe_resident_stream.py without a GPU: under Numba's simulator (one SM, small sizes, no
timing) the ring and register kernels at two depths and the grid-stride kernel stream the array
and their sums check against numpy's; without the simulator it stops with one line."""

import json

from tool_runs import run_without_gpu

SMALL = ["--mb", "0.05", "--threads", "32", "--units", "2", "--stages", "2,3", "--reps", "0"]


def _run(tmp_path, sim, extra=()):
    out = tmp_path / "r.json"
    return run_without_gpu("probe_resident_stream.py", ["--out", str(out), *SMALL, *extra], sim, timeout=300), out


def test_under_the_simulator_the_streams_sum_what_they_read(tmp_path):
    p, out = _run(tmp_path, sim=True)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [(r["kernel"], r.get("stages")) for r in res["rows"]] == [("ring", 2), ("ring", 3), ("regs", 2), ("regs", 3),
                                                                     ("many_blocks", None)]
    assert all(r["sums_ok"] for r in res["rows"])
    assert res["bytes"] == 12 * 1024 * 4  # 0.05 MB: 12 rows of 1,024 floats


def test_without_a_gpu_it_says_so_and_bad_input_is_one_line(tmp_path):
    p, out = _run(tmp_path, sim=False)
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr and not out.exists()
    p, _ = _run(tmp_path, sim=False, extra=["--stages", "1"])
    assert p.returncode == 2 and "--stages >= 2" in p.stderr.strip().splitlines()[-1]
    p, _ = _run(tmp_path, sim=False, extra=["--stages", "40", "--threads", "256"])
    assert p.returncode == 2 and "past 48 KiB" in p.stderr
    p, _ = _run(tmp_path, sim=False, extra=["--kernels", "ring,tma"])
    assert p.returncode == 2 and "--kernels 'ring,tma'" in p.stderr.strip().splitlines()[-1]
