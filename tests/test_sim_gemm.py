"""The GEMM (``numba_kernels.linear``: ``gemm_source``, ``GemmCfg``, ``gemm``) under Numba's CUDA simulator,
bitwise against the CPU twin ``numba_kernels.cpu.linear``.

The simulator must be on before numba is imported, so the checks run in a subprocess. There,
``numba_kernels.launch.fma`` is a true fused multiply-add, so a simulated kernel performs the
GPU's float32 operations and must equal the twin bit for bit (no tolerance). Covered: register prefetch with BK = 8/16/32 (static and, for the 128×128×32 default, dynamic shared
memory), vector and scalar loaders, float32 and bf16 weights (the bf16 kernels must equal the
float32 ones on the widened weights), R = 1 and rows/columns not multiples of the tile, K not a
multiple of 32 (short last slice) or of 4, signed zeros from underflowing products, rows past R
left untouched, every ``GEMM_VARIANTS`` entry and ``gemm()``'s own choice of loaders. Small tiles (one warp: 32×64) exercise the same
generator cheaply; the production tiles run on a few small shapes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(r'''
    import sys
    sys.path.insert(0, "tests")
    import cudasim_blocks
    cudasim_blocks.install()  # one simulated thread at a time
    import json, sys
    import numpy as np
    from numba import cuda
    from numba.core import config
    assert config.ENABLE_CUDASIM, "the simulator is not on"
    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    from numba_kernels import linear as L
    from numba_kernels.launch import launch as launch_
    assert kc.SIMULATED

    def kernel(BM, BN, BK, SUBN=2, xv=True, wkind="v"):
        k = kc.generated(L.gemm_source, L.GemmCfg(BM=BM, BN=BN, BK=BK, SUBN=SUBN, xv=xv, wkind=wkind))
        return lambda X, W, o, R: launch_(k, ((W.shape[0] + BN - 1) // BN, (R + BM - 1) // BM), k.threads,
                                             X, W, o, R)

    rng = np.random.default_rng(7)
    out = {}

    def bf16(N, K):
        w = (0.5 * rng.standard_normal((N, K))).astype(np.float32)
        h = (w.view(np.uint32) >> 16).astype(np.uint16)
        return h, (h.astype(np.uint32) << 16).view(np.float32)

    def case(tag, launch, R, K, N, half=False, special=False):
        X = rng.standard_normal((R + 2, K)).astype(np.float32)
        W16, W32 = bf16(N, K)
        if special:  # -0 inputs and products that underflow to -0 (chains that are -0)
            X[0, :] = np.float32(-0.0)
            X[min(1, R - 1), :] = np.float32(1e-30)
            W16[0, :] = (np.array([-1e-30], np.float32).view(np.uint32) >> 16).astype(np.uint16)
            W32[0, :] = (W16[0].astype(np.uint32) << 16).view(np.float32)
        want = np.zeros((R + 2, N), np.float32)
        kp.linear(X, W32, want, R)
        o = cuda.to_device(np.full((R + 2, N), 7.0, np.float32))
        launch(cuda.to_device(X), cuda.to_device(W16 if half else W32), o, R)
        got = o.copy_to_host()
        ok = bool(np.array_equal(got[:R].view(np.uint32), want[:R].view(np.uint32)) and (got[R:] == 7.0).all())
        out[f"{tag} R={R} K={K} N={N}{' bf16' if half else ''}{' special' if special else ''}"] = ok

    # one-warp tiles (32x64, 8x8 per thread), every loader and stage depth
    for BK in (8, 16, 32):
        combos = ((True, "v"), (False, "s"), (True, "hv"), (False, "hs"))
        if BK == 16:  # mixed loaders (an unaligned X with an aligned W and the reverse)
            combos += ((False, "v"), (True, "s"))
        for xv, wk in combos:
            k = kernel(32, 64, BK, xv=xv, wkind=wk)
            half = wk[0] == "h"
            vec = xv or wk in ("v", "hv")
            shapes = [(33, 100, 65), (1, 8, 3)] if vec else [(33, 37, 65), (5, 5, 70)]
            for R, K, N in shapes:
                case(f"rp32x64 BK={BK} xv={xv} w={wk}", k, R, K, N, half=half)
    k = kernel(32, 64, 16)
    case("rp32x64 BK=16", k, 6, 68, 64, special=True)
    # 8x4 per thread (SUBN=1): a 32x32 tile of one warp
    k = kernel(32, 32, 16, SUBN=1)
    case("rp32x32 8x4", k, 40, 72, 33)
    # production tiles
    for name in L.GEMM_VARIANTS:
        launch = lambda X, W, o, R, _n=name: kc.gemm(X, W, o, R, cfg=_n)
        case(name, launch, 7, 36, 20)
    launch = lambda X, W, o, R: kc.gemm(X, W, o, R)
    case("gemm() default", launch, 130, 40, 20)  # two row tiles
    case("gemm() default", launch, 5, 41, 20, special=True)
    case("gemm() default", launch, 5, 40, 20, half=True)
    case("gemm() default", launch, 5, 41, 20, half=True)
    case("gemm() default", launch, 3, 0, 5)  # K = 0: +0 everywhere, nothing read
    print("RESULT " + json.dumps(out))
''')


def test_gemm_cudasim_bitwise():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    res = json.loads(line[len("RESULT "):])
    bad = [k for k, v in res.items() if not v]
    assert not bad, f"not bitwise equal to the CPU twin: {bad}"
    assert len(res) >= 30
