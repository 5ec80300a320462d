"""The CUDA backend under Numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) against the CPU twins.

The simulator must be switched on before numba is imported, so everything runs in a subprocess
(the script below). It exercises the kernels' launch logic on tiny shapes — grids that do not
divide the block size, column offsets (``xo``, ``zo``, ``oo``, ``go``, ``ko``/``vo``), the capture
path, the GQA head mapping, attention over two tiles with a start position past 64, top-k ties —
and one short run of the tiny model: a CPU-primed 70-token cache restored into a CUDA session,
a captured 3-row ``target_step``, ``rollback``, a ``decode_step``. The fast linear
(``cuda_linear.py``: GEMV / tiled GEMM) is checked on its own; the model run uses
``linear_naive``, as the simulator spends seconds per fast-linear launch. The simulator runs Python arithmetic on numpy scalars, not the GPU's, so the comparison is
a tolerance (relative 1e-5 of the array's max |value|), not bits; the number of bit-identical
arrays is reported (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-5

SCRIPT = textwrap.dedent(r'''
    import json, math, sys, time
    import numpy as np
    from numba import cuda
    from numba.core import config
    assert config.ENABLE_CUDASIM, "the simulator is not on"
    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    assert kc.SIMULATED

    F32 = np.float32
    rng = np.random.default_rng(0)
    out = {}

    def r(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(F32)

    def both(name, fn_name, args, outs, dev_fn=None):
        """Run op fn_name on the CPU twin and on the simulator (or dev_fn there); compare args[i]
        for i in outs."""
        host = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        getattr(kp, fn_name)(*host)
        dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
        (dev_fn or getattr(kc, fn_name))(*dev)
        for i in outs:
            got, want = dev[i].copy_to_host(), host[i]
            scale = float(np.nanmax(np.abs(want))) if want.size else 0.0
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            same_nan = bool((np.isnan(got) == np.isnan(want)).all())
            rel = float(np.nanmax(diff) / scale) if scale > 0 else float(np.nanmax(diff))
            out[f"{name}[{i}]"] = dict(rel=rel if same_nan else float("inf"),
                                       bitwise=bool(np.array_equal(got.view(np.uint32) if got.dtype == F32 else got,
                                                                   want.view(np.uint32) if want.dtype == F32 else want)))

    t0 = time.time()
    # scalar maps: the tails too (sigmoid / silu below -88.7, softplus both ways)
    x = np.array([0.0, -0.0, 1.0, -1.0, 20.0, -20.0, 88.0, -90.0, -100.0, 1e-8, np.inf, -np.inf, 3.5, -7.25], F32)
    for op in ("map_exp", "map_sigmoid", "map_silu", "map_softplus"):
        both(op, op, (x, np.zeros_like(x)), [1])
    # linear, one thread per output: 3·130 = 390 threads → 4 blocks, the last partial; row R untouched
    X, W = r(4, 33), r(130, 33, scale=33 ** -0.5)
    y = np.full((4, 130), 7.0, F32)
    both("linear_naive R3-K33-N130", "linear", (X, W, y, 3), [2], dev_fn=kc.linear_naive)
    # the fast linear (numba_kernels/cuda_linear.py): GEMV for R <= 4, tiled GEMM above; K not a
    # multiple of the slice, N and R not multiples of the warp group / 64-tile, two tiles each way
    for R_, K_, N_ in [(3, 70, 9), (1, 33, 5), (5, 33, 9), (70, 40, 70)]:
        X, W = r(R_ + 1, K_), r(N_, K_, scale=K_ ** -0.5)
        both(f"linear R{R_}-K{K_}-N{N_}", "linear", (X, W, np.full((R_ + 1, N_), 7.0, F32), R_), [2])
    both("embed", "embed", (rng.integers(0, 50, 3).astype(np.int32), r(50, 8), np.zeros((3, 8), F32)), [2])
    both("rmsnorm oo", "rmsnorm", (r(3, 20), r(20, scale=0.1), F32(1e-6), np.zeros((3, 40), F32), 20, 3), [3])
    both("gated_rmsnorm zo", "gated_rmsnorm", (r(3, 12), r(3, 40), 28, 3, 4, r(4), F32(1e-6), np.zeros((3, 12), F32), 3), [7])
    both("head_rmsnorm xo", "head_rmsnorm", (r(3, 50), 9, 3, 8, r(8, scale=0.1), F32(1e-6), np.zeros((3, 24), F32), 3), [6])
    both("add", "add", (r(3, 9), r(3, 9), np.zeros((3, 9), F32), 3), [2])
    both("swiglu_act", "swiglu_act", (r(3, 14), 7, np.zeros((3, 7), F32), 3), [2])
    both("sigmoid_gate go", "sigmoid_gate", (r(3, 6), r(3, 13), 6, np.zeros((3, 6), F32), 3), [3])
    both("conv1d_silu xo+capture", "conv1d_silu",
         (r(3, 25), 5, r(20, 3, scale=0.5), r(2, 20), np.zeros((3, 20), F32), 3, np.zeros((3, 2, 20), F32), True), [3, 4, 6])
    both("gdn_prep Hk2-Hv4", "gdn_prep",
         (r(3, 2 * 16 + 16), 16, 2, 8, r(3, 8), 4, np.log(rng.uniform(1, 16, 4)).astype(F32), r(4), F32(8 ** -0.5),
          np.zeros((3, 16), F32), np.zeros((3, 16), F32), np.zeros((3, 4), F32), np.zeros((3, 4), F32), 3), [9, 10, 11, 12])
    both("gdn_recurrence vpk2+capture", "gdn_recurrence",
         (r(3, 16, scale=0.3), r(3, 16, scale=0.3), r(3, 3 + 16), 3, -np.abs(r(3, 4, scale=0.5)),
          rng.uniform(0, 1, (3, 4)).astype(F32), r(4, 8, 4, scale=0.1), np.zeros((3, 16), F32), 3, 8, 4, 2,
          np.zeros((3, 4, 8, 4), F32), True), [6, 7, 12])
    ang = np.outer(np.arange(80), 10000.0 ** (-np.arange(2) / 2.0))
    both("rope p70", "rope", (r(2, 3 * 8), 3, 8, 2, np.cos(ang).astype(F32), np.sin(ang).astype(F32), 70, 2), [0])
    both("kv_write p70", "kv_write", (r(2, 20), 3, r(2, 30), 11, np.zeros((75, 8), F32), np.zeros((75, 8), F32), 70, 2), [4, 5])
    # attention: GQA 4/2, start 70 (two tiles, the second partial), keys past the last query NaN
    kc_, vc_ = r(80, 2 * 8), r(80, 2 * 8)
    kc_[72:] = np.nan
    vc_[72:] = np.nan
    both("attention Hq4-Hkv2-p70", "attention", (r(2, 4 * 8), kc_, vc_, np.zeros((2, 32), F32), 70, 2, 4, 2, 8, F32(8 ** -0.5)), [3])
    both("attention Hq3-Hkv1-p0", "attention", (r(3, 36), r(3, 12), r(3, 12), np.zeros((3, 36), F32), 0, 3, 3, 1, 12, F32(12 ** -0.5)), [3])
    L = r(3, 8)
    L[0, 2] = L[0, 6] = L[0].max() + 1  # a tie: lowest index first
    both("moe_route tie", "moe_route", (L, 2, True, np.zeros((3, 8), F32), np.zeros((3, 2), np.int32), np.zeros((3, 2), F32), 3), [3, 4, 5])
    idx = np.array([[1, 5], [7, 0], [3, 3 - 1]], np.int32)
    both("moe_up", "moe_up", (r(3, 8), r(8 * 6, 8), r(8 * 6, 8), idx, 6, np.zeros((6, 6), F32), 3), [5])
    both("moe_down", "moe_down", (r(6, 6), r(8 * 8, 6), idx, 8, np.zeros((6, 8), F32), 3), [4])
    both("moe_combine shared", "moe_combine", (r(6, 8), rng.uniform(0, 1, (3, 2)).astype(F32), r(3, 8), r(3, 1), True, np.zeros((3, 8), F32), 3), [5])
    bad = r(3, 5)
    bad[1, 3] = np.inf
    both("nonfinite_flag", "nonfinite_flag", (bad, 3, np.zeros(2, np.int32), 1), [2])
    ops_s = time.time() - t0

    # ---- the tiny model ------------------------------------------------------------------------
    from harness.engine.model import Engine
    from harness.models import default_model_path
    from harness.engine.weights import load_checkpoint

    # The fast linear runs 128-256 simulated threads per block with barriers: ~6 s a call here, so
    # the model runs on the one-thread-per-output launch (checked above, like the fast one).
    kc.linear = kc.linear_naive
    ck = load_checkpoint(default_model_path())
    ec, eg = Engine(ck, "cpu"), Engine(ck, "cuda")
    assert eg.B.name == "cuda"
    ids = np.random.default_rng(1).integers(0, ck.config.vocab_size, 75)
    sc = ec.new_session(96)
    ec.prime_chunk(sc, ids[:70])
    snap = sc.cache.snapshot()
    sg = eg.new_session(96)
    sg.cache.restore(snap)  # host planes into device planes
    model = {}

    def cmp(name, got, want):
        got, want = np.asarray(got), np.asarray(want)
        model[name] = dict(rel=float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()),
                           bitwise=bool(np.array_equal(got.view(np.uint32), want.view(np.uint32))))

    t1 = time.time()
    model["restored digest"] = dict(rel=0.0 if sg.cache.digest() == sc.cache.digest() else float("inf"), bitwise=True)
    lc, hc = ec.target_step(sc, ids[70:73], capture=True)
    lg, hg = eg.target_step(sg, ids[70:73], capture=True)
    cmp("target_step p70 R3 logits", lg, lc)
    cmp("target_step p70 R3 hidden", eg.B.download(hg), hc)
    ec.rollback(sc, 2)
    eg.rollback(sg, 2)
    for (n, a), (_, b) in zip(sg.cache.planes(), sc.cache.planes()):
        if b.size and np.abs(b).max() > 0:
            cmp(f"after rollback {n}", eg.B.download(a), b)
    assert sg.cache.pos == sc.cache.pos == 72
    lc, _ = ec.decode_step(sc, int(ids[72]))
    lg, _ = eg.decode_step(sg, int(ids[72]))
    cmp("decode after rollback p72", lg, lc)
    model["final digest"] = dict(rel=0.0 if sg.cache.digest() == sc.cache.digest() else float("inf"), bitwise=True)
    # captured steps (Engine._step): each key runs eagerly once with the position on the device,
    # then is captured (recorded launches under the simulator) and replayed with new inputs and
    # positions; and the MTP rows, whose hidden input is copied into the capture's own buffer
    assert eg.graphs and not ec.graphs
    more = np.random.default_rng(2).integers(0, ck.config.vocab_size, 8)
    for i in range(3):
        lc, hc = ec.decode_step(sc, int(more[i]))
        lg, hg = eg.decode_step(sg, int(more[i]))
        cmp(f"captured decode p{73 + i}", lg, lc)
    for i in range(3):
        lc, hc2 = ec.target_step(sc, more[3 + i:5 + i], capture=True)
        lg, hg2 = eg.target_step(sg, more[3 + i:5 + i], capture=True)
        cmp(f"captured target_step p{76 + i} R2", lg, lc)
        ec.rollback(sc, 1)
        eg.rollback(sg, 1)
    for i in range(3):
        h_in = r(1, ck.config.hidden_size)
        lc, oc = ec.mtp_rows(sc, [int(more[i])], h_in, i, logits_rows=1)
        lg, og = eg.mtp_rows(sg, [int(more[i])], eg.B.upload(h_in), i, logits_rows=1)
        cmp(f"captured mtp row p{i}", lg, lc)
        cmp(f"captured mtp row p{i} hidden", eg.B.download(og), oc)
    n_graphs = len(sg.cache.graphs)
    model["captured steps"] = dict(rel=0.0 if n_graphs == 3 else float("inf"), bitwise=True)
    model["captured final digest"] = dict(rel=0.0 if sg.cache.digest() == sc.cache.digest() else float("inf"),
                                          bitwise=True)
    model_s = time.time() - t1
    print("RESULT " + json.dumps(dict(ops=out, model=model, ops_s=ops_s, model_s=model_s)))
''')


@pytest.fixture(scope="module")
def sim():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PRIMEWALK_BACKEND", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"simulator run failed (rc {p.returncode}):\n{p.stderr[-4000:]}"
    res = json.loads(lines[-1][len("RESULT "):])
    print(f"\nCUDASIM ops {res['ops_s']:.1f}s model {res['model_s']:.1f}s")
    for group in ("ops", "model"):
        for k, v in res[group].items():
            print(f"CUDASIM {group} {k}: rel {v['rel']:.2e} bitwise {v['bitwise']}")
    return res


def test_ops_match_cpu(sim):
    ops = sim["ops"]
    assert len(ops) >= 30
    bad = {k: v["rel"] for k, v in ops.items() if not v["rel"] <= TOL}
    assert not bad, f"simulated CUDA ops differ from the CPU twins beyond {TOL}: {bad}"


def test_tiny_model_matches_cpu(sim):
    m = sim["model"]
    for k in ("restored digest", "target_step p70 R3 logits", "target_step p70 R3 hidden",
              "decode after rollback p72", "final digest", "captured decode p75", "captured target_step p78 R2",
              "captured mtp row p2", "captured steps", "captured final digest"):
        assert k in m, k
    assert any(k.startswith("after rollback layers.") for k in m)
    bad = {k: v["rel"] for k, v in m.items() if not v["rel"] <= TOL}
    assert not bad, f"simulated CUDA model differs from the CPU backend beyond {TOL}: {bad}"


def test_bad_kernel_setting_is_one_line():
    # PRIMEWALK_LINEAR picks the decode GEMV (v1 or v3); anything else is refused in one line
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PRIMEWALK_LINEAR="v9",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "harness.cli", "logits", "--ids", "1,2,3", "--backend", "cuda",
                        "--out", os.devnull], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == ["harness logits: error: backend cuda: PRIMEWALK_LINEAR='v9': "
                                             "expected v1 or v3"], p.stderr
