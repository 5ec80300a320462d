"""The fast GDN recurrence (``numba_kernels.deltanet``: ``gdn_source``, ``GdnCfg``, ``gdn_recurrence_fast``) under Numba's CUDA simulator against the CPU twin,
bit for bit; and its PTX (no GPU needed) for the properties its speed rests on.

The simulator must be on before numba is imported, so the bitwise cases run in a subprocess. numba_kernels.launch
gives the simulator a true fused multiply-add, so the comparison is exact (uint32 views), no tolerance.
Cases cover: both modes (``pipe``, the default, and ``rot``); ragged dk (40, 16, 200), a phantom slice (dk 96: 3 slices in a 4-slice lane
layout), 1, 5, 7 and 8 slices (32, 160, 200, 256); dv not a multiple of the block's columns (dead
lanes) and several column blocks; vpk 1, 2, 3; row counts around the chunk length (1 row, a partial
chunk, exactly a chunk, a chunk + 1); capture on and off; −0 and exact zeros in S, k, v, g, beta.
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
    import json, time
    import numpy as np
    from numba import cuda
    from numba.core import config
    assert config.ENABLE_CUDASIM, "the simulator is not on"
    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    from numba_kernels import deltanet as D

    F32 = np.float32
    rng = np.random.default_rng(0)
    res = {}

    def r(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(F32)

    def check(name, q, k, V, vo, g, beta, S, R, dk, dv, vpk, capture, **kw):
        nv = S.shape[0]
        out = np.full((R + 1, nv * dv), 7.0, F32)  # one row more than R: must stay untouched
        cap = np.full((R + 1, nv, dk, dv), 5.0, F32)
        args = [q, k, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, capture]
        host = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        kp.gdn_recurrence(*host)
        dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
        t0 = time.time()
        kc.gdn_recurrence_fast(*dev, cfg=D.GdnCfg(dk, dv, cap=bool(capture), **kw) if kw else None)
        got = {i: dev[i].copy_to_host() for i in (6, 7, 12)}
        same = {i: bool(np.array_equal(got[i].view(np.uint32), host[i].view(np.uint32))) for i in got}
        written = bool((got[7][:R] != 7.0).any()) and (not capture or bool((got[12][:R] != 5.0).any()))
        res[name] = dict(state=same[6], out=same[7], cap=same[12], written=written, s=round(time.time() - t0, 2))

    def case(name, hk, nv, dk, dv, R, capture, vo=3, **kw):
        kd = hk * dk
        q, k = r(R + 1, kd, scale=dk ** -0.5), r(R + 1, kd, scale=dk ** -0.5)
        V = r(R + 1, vo + nv * dv)
        g = -np.abs(r(R + 1, nv, scale=0.5))
        beta = rng.uniform(0, 1, (R + 1, nv)).astype(F32)
        check(name, q, k, V, vo, g, beta, r(nv, dk, dv, scale=0.1), R, dk, dv, nv // hk, capture, **kw)

    case("rot dk40-ragged dv20-dead w2 vpk2 R9-tc4 cap", 2, 4, 40, 20, 9, True, wpb=2, tc=4, mode="rot")
    case("pipe dk40-ragged dv20-dead w2 vpk2 R9-tc4", 2, 4, 40, 20, 9, False, wpb=2, tc=4, mode="pipe")
    case("pipe dk40-ragged dv20-dead w2 vpk2 R8-tc4 cap", 2, 4, 40, 20, 8, True, wpb=2, tc=4, mode="pipe")
    case("default dk40-ragged dv20 vpk2 R3", 2, 4, 40, 20, 3, True)
    for mode in D.GDN_MODES:
        case(f"{mode} dk96-phantom dv10-2blocks R5-tc2 cap", 2, 2, 96, 10, 5, True, wpb=1, tc=2, mode=mode)
    case("rot dk32 vpk3 R1 (decode)", 1, 3, 32, 5, 1, False, wpb=1, tc=4, mode="rot")
    case("rot dk32 vpk3 R1 cap", 1, 3, 32, 5, 1, True, wpb=1, tc=4, mode="rot")
    for R in (2, 3, 4, 5):
        case(f"rot dk32 R{R}-tc4 cap", 1, 3, 32, 5, R, True, wpb=1, tc=4, mode="rot")
    case("pipe dk32 R3-tc4 cap", 1, 3, 32, 5, 3, True, wpb=1, tc=4, mode="pipe")
    case("rot dk16-ragged R4", 1, 2, 16, 7, 4, False, wpb=1, tc=4, mode="rot")
    case("rot dk160-8lane R3-tc2 cap", 1, 2, 160, 6, 3, True, wpb=1, tc=2, mode="rot")
    case("rot dk128 R17-tc16", 1, 2, 128, 8, 17, False, wpb=1, tc=16, mode="rot")
    case("rot dk200-ragged R2 cap", 1, 1, 200, 4, 2, True, wpb=1, tc=2, mode="rot")
    case("rot dk256 w2 R3 auto-tc", 1, 2, 256, 5, 3, False, wpb=2, mode="rot")

    # programmatic dependent launch (a captured step on sm_90): the state slices loaded before
    # pdl_wait(), k, q, v, g and beta after -- one row, a verify step with captures, both modes
    case("pipe dk40-ragged dv20 vpk2 R1 pdl", 2, 4, 40, 20, 1, False, pdl=True)
    case("pipe dk40-ragged dv20 vpk2 R5 cap pdl", 2, 4, 40, 20, 5, True, pdl=True)
    case("rot dk32 R3-tc4 cap pdl", 1, 3, 32, 5, 3, True, wpb=1, tc=4, mode="rot", pdl=True)

    # −0 and exact zeros: rot's row −1 update fma(0, −0, s) must give s for s = −0 too
    dk, dv, nv = 64, 8, 2
    for R in (1, 3):
        for mode in D.GDN_MODES:
            q = r(R, dk, scale=0.1)
            k = 0.5 * q
            k[:, 5:9] = 0.0
            k[:, 10] = -0.0
            S = np.where(rng.uniform(size=(nv, dk, dv)) < 0.5, F32(-0.0), F32(0.0)).astype(F32)
            S[:, 3, :] = 1e-30
            V = np.zeros((R, nv * dv), F32)
            V[:, 1] = -0.0
            g = np.zeros((R, nv), F32)
            g[:, 1] = -3.0
            beta = np.ones((R, nv), F32)
            beta[0, 0] = 0.0
            check(f"{mode} zeros R{R} cap", q, k, V, 0, g, beta, S, R, dk, dv, 2, True, wpb=1, tc=2, mode=mode)
    print("RESULT " + json.dumps(res))
''')


@pytest.fixture(scope="module")
def sim():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"simulator run failed (rc {p.returncode}):\n{p.stderr[-4000:]}"
    res = json.loads(lines[-1][len("RESULT "):])
    for k, v in res.items():
        print(f"CUDASIM gdn {k}: {v}")
    return res


def test_bitwise_equal_to_cpu_twin(sim):
    assert len(sim) >= 20
    bad = {k: v for k, v in sim.items() if not (v["state"] and v["out"] and v["cap"] and v["written"])}
    assert not bad, f"differs from the CPU twin (or wrote nothing): {bad}"


def test_ptx_registers_only_and_vectorised():
    """The hot kernel keeps its state in registers (no local memory), gathers with shuffles and loads
    k/q from shared memory 128 bits at a time. Needs no GPU (compute capability 9.0 is given)."""
    code = textwrap.dedent('''
        import types, numpy as np
        np.row_stack = np.vstack
        import numba.cuda.dispatcher as d
        d.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
        from numba import cuda
        from numba_kernels import cuda as kc
        from numba_kernels import deltanet as D
        sig = ("(float32[:, ::1], float32[:, ::1], float32[:, ::1], int64, float32[:, ::1], float32[:, ::1], "
               "float32[::1], float32[::1], int64, int64, int64, float32[::1], int64)")
        k = kc.generated(D.gdn_source, D.GdnCfg(128, 128, mode="rot"))
        ptx, _ = cuda.compile_ptx(k.disp.py_func, sig, cc=(9, 0))
        print("LOCAL", ".local" in ptx, "SHFL", ptx.count("shfl.sync.idx"), "V4", ptx.count("ld.shared.v4.f32"),
              "FMA", ptx.count("fma.rn.f32"), "MUL", ptx.count("mul.rn.f32"))
    ''')
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and "NVVM" in p.stderr:
        pytest.skip("no NVVM here")
    assert p.returncode == 0, p.stderr[-3000:]
    f = p.stdout.split()
    stats = dict(zip(f[::2], f[1::2]))
    assert stats["LOCAL"] == "False", stats
    assert int(stats["SHFL"]) >= 16 and int(stats["V4"]) >= 32, stats
