"""tests/cudasim_blocks.py, the simulator's baton scheduler: the simulator's rules, kept.

Small kernels run under Numba's simulator twice in one subprocess (the simulator must be on before
numba is imported): with Numba's own threaded scheduler and with the baton. Every result must be
what the kernel defines and equal between the two: block barriers over shared memory (a tree
reduction), threads that return before a barrier, the barrier votes (``syncthreads_count`` /
``_and`` / ``_or``), 2-D and 3-D blocks (``threadIdx``, ``laneid``), a grid of many blocks. An
exception in one thread is raised from the launch naming the thread and block, and the next launch
runs normally (the pooled threads are all free again); the warp gate gives every lane its result,
fails a warp that a lane never reaches, and the next launch runs normally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(r'''
    import json, sys
    sys.path.insert(0, "tests")
    import numpy as np
    from numba import cuda
    from numba.core import config
    assert config.ENABLE_CUDASIM
    import cudasim_blocks
    from numba.cuda.simulator import kernel as simkernel

    @cuda.jit
    def tree_sum(x, out, early):
        s = cuda.shared.array(64, np.float64)
        t = cuda.threadIdx.x
        s[t] = x[cuda.blockIdx.x * 64 + t]
        cuda.syncthreads()
        if t >= early:  # these threads return: the barriers below must still open
            return
        step = 32
        while step >= 1:
            if t < step and t + step < early:
                s[t] += s[t + step]
            cuda.syncthreads()
            step //= 2
        if t == 0:
            out[cuda.blockIdx.x] = s[0]

    @cuda.jit
    def votes(flags, out):
        t = cuda.threadIdx.x
        out[0, t] = cuda.syncthreads_count(flags[t])
        out[1, t] = cuda.syncthreads_and(flags[t])
        out[2, t] = cuda.syncthreads_or(flags[t])

    @cuda.jit
    def where(out):
        tx, ty, tz = cuda.threadIdx.x, cuda.threadIdx.y, cuda.threadIdx.z
        i = tx + cuda.blockDim.x * (ty + cuda.blockDim.y * tz)
        b = cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.y
        out[b, i, 0] = tx * 100 + ty * 10 + tz
        out[b, i, 1] = cuda.laneid
        out[b, i, 2] = b

    @cuda.jit
    def boom(out):
        t = cuda.threadIdx.x
        out[t] = 1.0
        cuda.syncthreads()
        if t == 5 and cuda.blockIdx.x == 1:
            raise ValueError("lane five")
        cuda.syncthreads()
        out[t] = 2.0

    def run_all():
        rng = np.random.default_rng(3)
        x = rng.integers(-1000, 1000, 64 * 7).astype(np.float64)
        res = {}
        for early in (64, 40, 1):
            out = np.zeros(7)
            tree_sum[7, 64](x, out, early)
            res[f"sum{early}"] = out.tolist()
        for flags in ([1] * 48, [0] * 48, [0] * 47 + [1], [i % 3 == 0 for i in range(48)]):
            out = np.zeros((3, 48), np.int64)
            votes[1, 48](np.array(flags, np.int64), out)
            res[f"votes{sum(flags)}"] = out.tolist()
        out = np.zeros((6, 60, 3), np.int64)
        where[(3, 2), (5, 4, 3)](out)
        res["where"] = out.tolist()
        out = np.zeros(32)
        try:
            boom[3, 32](out)
            res["boom"] = "no error"
        except ValueError as e:
            res["boom"] = str(e)
        out = np.zeros(7)
        tree_sum[7, 64](x, out, 64)  # the next launch after a failed one
        res["after_boom"] = out.tolist()
        return res, x

    numba_run = simkernel.BlockManager.run
    mine, x = run_all()  # Numba's scheduler
    cudasim_blocks.install()
    assert simkernel.BlockManager.run is not numba_run
    baton, _ = run_all()
    print("INFO pool", len(cudasim_blocks._POOL))

    # the warp gate: each lane posts its lane id, the compute reverses the 32
    @cuda.jit
    def gate(out, skip):
        t = cuda.threadIdx.x
        if t == skip:
            return
        out[t] = cudasim_blocks.warp_collective(t * 3, lambda v: v[::-1])

    out = np.zeros(64, np.int64)
    gate[1, 64](out, -1)
    baton["gate"] = out.tolist()
    try:
        gate[1, 64](out, 37)
        baton["gate_missing"] = "no error"
    except RuntimeError as e:
        baton["gate_missing"] = str(e)
    out = np.zeros(7)
    tree_sum[7, 64](x, out, 64)
    baton["after_gate"] = out.tolist()
    print("RESULT " + json.dumps({"numba": mine, "baton": baton, "x": x.tolist()}))
''')


@pytest.fixture(scope="module")
def got():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PRIMEWALK_SIMSCHED", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"simulator run failed (rc {p.returncode}):\n{p.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_the_baton_computes_what_numbas_scheduler_computes(got):
    numba, baton = got["numba"], got["baton"]
    for key in numba:
        assert baton[key] == numba[key], key


def test_barriers_votes_and_indices_are_the_kernels_definitions(got):
    import numpy as np

    b, x = got["baton"], np.array(got["x"]).reshape(7, 64)
    assert b["sum64"] == x.sum(1).tolist()
    assert b["sum40"] == x[:, :40].sum(1).tolist()  # 24 threads returned before the barriers
    assert b["sum1"] == x[:, 0].tolist()
    assert b["after_boom"] == b["sum64"]
    for n, flags in ((48, [1] * 48), (0, [0] * 48), (1, [0] * 47 + [1]), (16, [i % 3 == 0 for i in range(48)])):
        count, all_, any_ = b[f"votes{n}"]
        assert count == [sum(flags)] * 48 and all_ == [int(all(flags))] * 48 and any_ == [int(any(flags))] * 48
    where = np.array(b["where"])
    for blk in range(6):
        for i in range(60):
            tx, ty, tz = i % 5, (i // 5) % 4, i // 20
            assert where[blk, i].tolist() == [tx * 100 + ty * 10 + tz, i % 32, blk]


def test_an_exception_names_its_thread_and_the_next_launch_runs(got):
    assert got["baton"]["boom"] == got["numba"]["boom"]
    assert "tid=[5, 0, 0]" in got["baton"]["boom"] and "ctaid=[1, 0, 0]" in got["baton"]["boom"]
    assert "lane five" in got["baton"]["boom"]


def test_the_warp_gate(got):
    b = got["baton"]
    assert b["gate"] == [3 * (31 - t) for t in range(32)] + [3 * (32 + 31 - t) for t in range(32)]
    assert "not every lane" in b["gate_missing"]
    assert b["after_gate"] == b["sum64"]
