"""tools/probe_resident_gemv.py without a GPU: under Numba's simulator (small shapes, no timing)
the resident GEMV's every output is bitwise the engine's ``gemv`` (three stages: the ring wraps,
the register slots take turns), with more rows than warps, blocks owning uneven row runs and
rows dealt to the grid's warps in turn, the weights through cp.async and through registers; bad
input is one line."""

import json

from tool_runs import run_without_gpu

# K: fc 64, qkv 32, o 32, gate_up 32, down 64, lm head 32; three blocks of two warps over N = 32..128
SMALL = ["--hidden", "32", "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--inter", "64",
         "--draft-vocab", "40", "--warps", "2", "--stages", "3", "--blocks", "3", "--rows", "run,turns",
         "--load", "cp,ldg", "--reps", "0"]


def _run(tmp_path, sim, extra=()):
    out = tmp_path / "g.json"
    return run_without_gpu("probe_resident_gemv.py", ["--out", str(out), *SMALL, *extra], sim, timeout=600), out


def test_under_the_simulator_every_output_is_gemvs(tmp_path):
    p, out = _run(tmp_path, sim=True)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    names = ["fc", "qkv", "o", "gate_up", "down", "lm_head"]
    assert [s["name"] for s in res["shapes"]] == names and res["gemv"] is None
    assert [(r["load"], r["rows"], r["stages"], r["blocks"], r["bitwise"]) for r in res["rows"]] == [
        (v, d, S, 3, {n: True for n in names}) for v in ("cp", "ldg") for d in ("run", "turns") for S in (3,)]
    assert "bitwise against gemv: fc yes" in p.stdout and not (tmp_path / "g.json.tmp").exists()


def test_without_a_gpu_or_with_bad_input_it_stops_with_one_line(tmp_path):
    p, out = _run(tmp_path, sim=False)
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr and not out.exists()
    p, _ = _run(tmp_path, sim=False, extra=["--hidden", "48"])
    assert p.returncode == 2 and "K must be a multiple of 32" in p.stderr.strip().splitlines()[-1]
    p, _ = _run(tmp_path, sim=False, extra=["--load", "tma"])
    assert p.returncode == 2 and "--load 'tma'" in p.stderr.strip().splitlines()[-1]
    p, _ = _run(tmp_path, sim=False, extra=["--rows", "run,zigzag"])
    assert p.returncode == 2 and "--rows 'run,zigzag'" in p.stderr.strip().splitlines()[-1]
    p, _ = _run(tmp_path, sim=False, extra=["--warps", "32", "--stages", "9"])
    assert p.returncode == 2 and "past an SM's 227 KiB" in p.stderr.strip().splitlines()[-1]
