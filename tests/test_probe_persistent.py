"""tools/probe_persistent.py without a GPU: under Numba's simulator (a one-block cooperative grid,
small shapes, a 32-thread GEMV configuration, no timing) the persistent pass kernel runs -- its
small phases' stand-ins once, then its six GEMV phases, each checked bitwise against the
engine's ``gemv`` on the same input (outputs poisoned with NaN first), with the barrier before a
GEMV phase after its first weight loads and without; without the simulator it stops with one line."""

import json

from tool_runs import run_without_gpu

SMALL = ["--hidden", "16", "--heads", "2", "--kv-heads", "1", "--head-dim", "8", "--inter", "24",
         "--draft-vocab", "40", "--ctx", "70", "--cfg", "2,1,1,1", "--reps", "0", "--max-registers", "128"]


def _run(tmp_path, sim, extra=()):
    out = tmp_path / "p.json"
    return run_without_gpu("probe_persistent.py", ["--out", str(out), *SMALL, *extra], sim), out


def test_under_the_simulator_every_gemv_phase_is_the_engines_gemv(tmp_path):
    p, out = _run(tmp_path, sim=True)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["bitwise"] == {f"{v}:{n}": True for v in ("plain", "prefetch")
                              for n in ("fc", "qkv", "o", "gate_up", "down", "lm_head")}
    assert res["barriers"] == 16  # a grid barrier after each of the 10 small and 6 GEMV phases
    assert [s["N"] for s in res["shapes"]] == [16, 48, 16, 48, 16, 40]
    assert res["gemv_cfg"] == "gemv_f32_R1_ow2_og1_ng1_pf1_mo1" and res["rows"] == []
    assert "bitwise against gemv: plain:fc yes" in p.stdout and not (tmp_path / "p.json.tmp").exists()


def test_without_a_gpu_it_says_so(tmp_path):
    p, out = _run(tmp_path, sim=False)
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr and not out.exists()


def test_bad_input_is_one_line(tmp_path):
    p, out = _run(tmp_path, sim=False, extra=["--kv-heads", "3"])
    assert p.returncode == 2 and "--heads must be a multiple of --kv-heads" in p.stderr.strip().splitlines()[-1]
