"""The GEMV (numba_kernels.linear: gemv_source, GemvCfg, gemv_pick) under Numba's CUDA simulator, bit for bit against the CPU twin.

The simulator must be on before numba is imported, so the cases run in a subprocess. Its ``fma``
(numba_kernels.launch) is a true fused multiply-add, so the comparison is bitwise, no tolerance.
The cases walk every edge of the kernel's tiling: each warp shape (OW = 2, 4, 8, 16 outputs per
warp, 1 or 2 rows of W per lane), K split over 1, 2, 3 and 4 warps, 1-3 chunks of weights in flight with odd and even chunk
counts, a partial last chunk, a partial last slice (K % 32 != 0), K % 4 != 0 and bf16 K % 8 != 0
(the scalar path), N not a multiple of the block's outputs and N smaller than it, R below the
row bucket (rows past R are not written), X with a row stride > K, the default configuration of
every row bucket (``pick``), products that underflow to -0, and bf16 weights equal to the fp32
kernel on the widened weights. 
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
    import sys
    sys.path.insert(0, "tests")
    import cudasim_blocks
    cudasim_blocks.install()  # one simulated thread at a time
    import json
    import numpy as np
    from numba import cuda
    from numba.core import config
    assert config.ENABLE_CUDASIM
    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    from numba_kernels import linear as L

    def launch(X, W, out, R, cfg):
        kc.LAUNCHES.clear()
        kc.gemv(X, W, out, R, cfg=cfg)
        (name,) = kc.LAUNCHES
        return name

    rng = np.random.default_rng(0)
    res = []

    def case(cfg, R, K, N, XS=None, bf16=False, tiny=False):
        XS = XS or K
        bf16 = bf16 or (cfg is not None and cfg.BF16)
        X = rng.standard_normal((R + 1, XS)).astype(np.float32)
        Wf = (rng.standard_normal((N, K)) / np.sqrt(max(K, 1))).astype(np.float32)
        if tiny:  # products underflow: slice partials are -0 on the CPU
            X[0] = 1e-30
            Wf[0] = -1e-30
        if N > 2:
            Wf[1, : K // 2] = 0.0
        if bf16:
            Wb = (Wf.view(np.uint32) >> 16).astype(np.uint16)
            Wf = (Wb.astype(np.uint32) << 16).view(np.float32)
        want = np.full((R + 1, N), 7.0, np.float32)
        kp.linear(np.ascontiguousarray(X[:, :K]), Wf, want, R)
        got = cuda.to_device(np.full((R + 1, N), 7.0, np.float32))
        used = launch(cuda.to_device(X), cuda.to_device(Wb if bf16 else Wf), got, R, cfg)
        got = got.copy_to_host()
        ok = bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))
        res.append(dict(cfg=used, R=R, K=K, N=N, XS=XS, ok=ok))

    C = L.GemvCfg
    # warp shapes, K splits, prefetch depths; chunk counts odd / even / partial
    case(C(RB=2, OW=4, NOG=2, NG=1, PF=1), 2, 8 * 32 * 3, 8)               # 3 full chunks
    case(C(RB=2, OW=4, NOG=2, NG=1, PF=1), 1, 8 * 32 * 3 + 64, 9)          # partial last chunk
    case(C(RB=2, OW=4, NOG=2, NG=1, PF=2), 2, 8 * 32 * 5 + 36, 9, XS=1400)  # odd count, K % 32 = 4
    case(C(RB=4, OW=8, NOG=1, NG=2, PF=2), 3, 8 * 32 * 4 + 100, 13)
    case(C(RB=4, OW=8, NOG=1, NG=2, PF=1), 4, 1100, 5)
    case(C(RB=8, OW=4, NOG=1, NG=2, PF=2), 5, 1100, 6, tiny=True)
    case(C(RB=8, OW=8, NOG=1, NG=4, PF=1), 8, 520, 3)                     # N < OB, one partial chunk
    case(C(RB=5, OW=8, NOG=1, NG=3, PF=1, MO=2), 5, 1100, 21)             # 3 K warps, 2 rows per lane
    case(C(RB=4, OW=4, NOG=2, NG=1, PF=2, MO=2, BF16=True), 3, 1000, 19)
    case(C(RB=2, OW=16, NOG=1, NG=1, PF=1, MO=2), 2, 300, 37)             # per-load store addresses
    case(C(RB=2, OW=16, NOG=1, NG=2, PF=1), 2, 300, 17)
    case(C(RB=2, OW=2, NOG=1, NG=1, PF=2), 2, 1100, 3)
    case(C(RB=1, OW=4, NOG=2, NG=1, PF=3), 1, 8 * 32 * 7 + 4, 8, XS=1800)
    case(C(RB=1, OW=4, NOG=2, NG=1, PF=2), 1, 32, 2)                      # one slice
    # bf16 weights (bitwise equal to the fp32 twin on the widened weights)
    case(C(RB=2, OW=4, NOG=2, NG=1, PF=2, BF16=True), 2, 8 * 32 * 3 + 64, 9)
    case(C(RB=4, OW=8, NOG=1, NG=2, PF=1, BF16=True), 3, 1104, 13, bf16=True)
    case(C(RB=8, OW=4, NOG=1, NG=2, PF=2, BF16=True), 8, 1000, 6, bf16=True, tiny=True)
    case(C(RB=2, OW=16, NOG=1, NG=2, PF=1, BF16=True), 2, 296, 17, bf16=True)
    # the scalar path: K % 4 != 0 (fp32), K % 8 != 0 (bf16), X rows not 16-byte aligned
    case(C(RB=2, OW=4, NOG=2, NG=1, PF=1, VEC=False), 2, 333, 9, XS=335)
    case(C(RB=4, OW=8, NOG=1, NG=2, PF=2, VEC=False), 3, 1101, 10)
    case(C(RB=2, OW=4, NOG=2, NG=1, PF=2, BF16=True, VEC=False), 2, 333, 9, bf16=True)
    case(C(RB=4, OW=8, NOG=1, NG=2, PF=1, BF16=True, VEC=False), 4, 1101, 10, bf16=True)
    # the default configuration of every row bucket, large- and small-N families (run on small N)
    for R in (1, 3, 5, 8):
        case(L.gemv_pick(9000, 600, R), R, 600, 40)
        case(None, R, 600 if R in (1, 5) else 300, 9)     # cfg=None: launch() picks (tiny N at R = 1)
    for R in (2, 4, 5):  # the large- and huge-N (lm head) picks of a verify step's rows, run on small N
        case(L.gemv_pick(9000, 600, R), R, 600, 40)
        case(L.gemv_pick(40000, 600, R), R, 600, 40)
    case(L.gemv_pick(2048, 600, 2), 2, 600, 9)
    case(L.gemv_pick(9000, 600, 1, bf16=True), 1, 600, 40, bf16=True)  # bf16 one row, large and small N
    case(L.gemv_pick(2048, 600, 1, bf16=True), 1, 600, 9, bf16=True)
    case(L.gemv_pick(9000, 333, 1, bf16=True, vec=False), 1, 333, 40, bf16=True)  # their scalar paths (K % 8 != 0)
    case(L.gemv_pick(2048, 333, 1, bf16=True, vec=False), 1, 333, 9, bf16=True)
    case(L.gemv_pick(9000, 600, 2, bf16=True), 2, 600, 40, bf16=True)  # bf16 two rows, large and small N
    case(L.gemv_pick(2048, 600, 2, bf16=True), 2, 600, 9, bf16=True)
    case(L.gemv_pick(9000, 333, 2, bf16=True, vec=False), 2, 333, 40, bf16=True)
    case(L.gemv_pick(2048, 333, 2, bf16=True, vec=False), 2, 333, 9, bf16=True)
    case(L.gemv_pick(2048, 5000, 4), 4, 5000, 9)          # small N past K = 4,096: two chunks in flight
    case(None, 2, 333, 11)                   # K % 4 != 0 → scalar path chosen by launch()
    case(None, 3, 600, 21, bf16=True)
    # programmatic dependent launch (a captured step on sm_90): the weight chunks in flight are
    # loaded before pdl_wait(), X after -- 1-3 chunks ahead, fewer chunks than that, bf16, scalar
    import dataclasses
    P = lambda c: dataclasses.replace(c, PDL=True)
    case(P(C(RB=1, OW=4, NOG=2, NG=1, PF=3)), 1, 8 * 32 * 7 + 4, 8, XS=1800)
    case(P(C(RB=2, OW=4, NOG=2, NG=1, PF=2)), 2, 8 * 32 + 36, 9)           # one chunk, two ahead
    case(P(L.gemv_pick(9000, 600, 1, bf16=True)), 1, 600, 40, bf16=True)
    case(P(L.gemv_pick(2048, 5000, 5)), 5, 5000, 9)
    case(P(C(RB=4, OW=8, NOG=1, NG=2, PF=1, BF16=True, VEC=False)), 4, 1101, 10, bf16=True)
    print("RESULT " + json.dumps(res))
''')


def _run(code: str, timeout: int = 600):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def sim():
    p = _run(SCRIPT)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"simulator run failed (rc {p.returncode}):\n{p.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_gemv_bitwise_under_simulator(sim):
    bad = [r for r in sim if not r["ok"]]
    assert len(sim) >= 30
    assert not bad, bad
    assert sum(r["cfg"].endswith("_pdl") for r in sim) == 5  # the PDL builds ran (and only they)

