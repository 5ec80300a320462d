"""tools/probe_gridsync.py without a GPU: under Numba's simulator (a one-block cooperative grid,
timings meaningless) its kernels run and its copy is checked element for element; without the
simulator on a machine with no GPU it stops with one line."""

import json

from tool_runs import run_without_gpu


def _run(tmp_path, sim):
    out = tmp_path / "g.json"
    p = run_without_gpu("probe_gridsync.py", ["--out", str(out), "--mb", "0.01", "--chunk-kb", "4", "--reps", "1",
                                              "--barriers", "3"], sim, timeout=300)
    return p, out


def test_under_the_simulator_every_grid_shape_runs_and_the_json_is_written(tmp_path):
    p, out = _run(tmp_path, sim=True)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [(r["blocks"], r["threads"]) for r in res["rows"]] == [(1, 128), (1, 256), (1, 512)]
    assert res["rows"][0]["barriers_in_stream"] == 3  # 2,621 float32 words, a barrier every 1,024
    assert not (tmp_path / "g.json.tmp").exists()


def test_without_a_gpu_it_says_so(tmp_path):
    p, out = _run(tmp_path, sim=False)
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr and not out.exists()
