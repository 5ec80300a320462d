"""The query-tiled prime attention and the split-KV decode (``numba_kernels.attention``:
``attention_source``, ``attention_merge_source``, ``AttnCfg``, ``prime_config``, ``split_config``) under Numba's CUDA simulator, bit for bit against the CPU twin.

The simulator must be switched on before numba is imported, so the cases run in a subprocess (the
script below prints one JSON line per case). ``numba_kernels.launch.fma`` is a true fused
multiply-add under the simulator, so the comparison is bitwise (``uint32`` views), no tolerance.

Covered: every prime variant's code paths (query tiles of 64 rows × 1 head and of rows × the heads
of a GQA group; 256 and 512 threads; cp.async and synchronous staging), D not a multiple of 32
(partial last slice), D not a multiple of 4 (zero padded q / k, scalar copies), odd head counts
(hq = 3, hkv = 1; hq = 6, hkv = 3), a chunk that starts mid-tile (start > 0: the cache holds earlier
rows), R not a multiple of the query tile, the device-side position, NaN / ±inf scores (the tile
max's NaN rule); split-KV decode for 1, 4, 5, 16 rows (every split variant, 2 row chunks, several
tiles per block, V in K's buffer), the grid sized by the cache capacity with tiles past the position, the ordered merge over more
tiles than one batch of its loads, a captured launch (``numba_kernels.cuda.capture``) replayed at
several device-side positions.
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
    import json, sys, time
    import numpy as np
    from numba import cuda
    from numba.core import config
    assert config.ENABLE_CUDASIM, "the simulator is not on"
    from numba_kernels import cpu as kp
    from numba_kernels import attention as A
    from numba_kernels import cuda as kc
    assert kc.SIMULATED

    F32 = np.float32
    rng = np.random.default_rng(0)

    def case(kind, name, R, start, hq, hkv, D, pos=None, cap=None, poison=False, **kw):
        cap = cap or start + (pos or 0) + R + 3
        Q = rng.standard_normal((R, hq * D)).astype(F32)
        kc_ = rng.standard_normal((cap, hkv * D)).astype(F32)
        vc = rng.standard_normal((cap, hkv * D)).astype(F32)
        if poison:  # scores of +inf, -inf and NaN; a NaN query; NaN as the first key of a tile
            kc_[3, :D] = np.inf
            kc_[5, D - 1] = -np.inf
            kc_[64, 0] = np.nan
            kc_[7, 1] = np.nan
            Q[min(2, R - 1), 0] = np.nan
            vc[9, 2] = np.inf
        scale = F32(D ** -0.5)
        want = np.full((R, hq * D), 7.0, F32)
        kp.attention(Q, kc_, vc, want, start + (pos or 0), R, hq, hkv, D, scale)
        out = cuda.to_device(np.full((R, hq * D), 7.0, F32))
        pb = None if pos is None else cuda.to_device(np.array([pos], np.int32))
        t = time.time()
        if kind == "prime":
            fn, cfg = kc.attention_prime, A.prime_config(hq, hkv, D, variant=name, **kw)
        else:
            fn, cfg = kc.attention_split, A.split_config(R, hq, hkv, D, variant=name, **kw)
        assert fn(cuda.to_device(Q), cuda.to_device(kc_), cuda.to_device(vc), out, start, R, hq, hkv, D, scale,
                  pos=pb, cfg=cfg)
        got = out.copy_to_host()
        same = bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))
        print(json.dumps(dict(case=f"{kind} {name} {kw} R{R} start{start} hq{hq} hkv{hkv} D{D} pos{pos} cap{cap}"
                              + (" poison" if poison else ""), bitwise=same, s=round(time.time() - t, 1))), flush=True)

    which = sys.argv[1]
    if which == "prime":
        case("prime", "p64", 70, 0, 2, 1, 40)                      # 2 query tiles (64 + 6 rows), D % 32 != 0
        case("prime", "p64t512", 20, 50, 3, 1, 33)                 # mid-tile start, D % 4 != 0, hq = 3
        case("prime", "p64g8", 9, 60, 16, 2, 8)                    # 8 rows × 8 heads per block, 2 row tiles
        case("prime", "p64g8", 40, 3, 6, 3, 12)                    # rep = 2: blocks of 32 rows × 2 heads
        case("prime", "p32", 33, 70, 2, 2, 36, cpa=False)          # synchronous staging
        case("prime", "p64", 66, 0, 2, 1, 16, poison=True)         # NaN / inf
        case("prime", "p64t512", 10, 0, 2, 1, 8, pos=100)          # device-side position
    else:
        case("split", None, 1, 100, 16, 2, 8)                      # s8: one row × 8 heads
        case("split", None, 4, 70, 16, 2, 12)                      # s32
        case("split", None, 5, 60, 16, 2, 8)                       # s64: 5 of 8 rows
        case("split", None, 16, 10, 8, 1, 8)                       # s64: 2 row chunks of 8 rows × 8 heads
        case("split", "s8", 3, 70, 3, 1, 33, kv_shared=True)       # V in K's buffer; D % 4 != 0; rep = 3
        case("split", None, 2, 0, 6, 3, 20, pos=140, cap=300)      # grid by capacity, tiles past pos exit
        case("split", "s32", 4, 190, 8, 1, 8, TPB=2)               # 2 tiles per block, the last block has 1
        case("split", "s16", 5, 90, 4, 2, 16, cpa=False)           # synchronous staging
        case("split", None, 2, 64, 2, 1, 16, poison=True)          # NaN / inf
        case("split", "s8", 1, 1100, 2, 1, 4)                      # 18 tiles: the merge's batches of 16
        # one captured launch shape (numba_kernels.cuda.capture) replayed at three device positions
        R, hq, hkv, D, cap = 2, 4, 2, 8, 200
        Q = rng.standard_normal((R, hq * D)).astype(F32)
        kcache, vcache = (rng.standard_normal((cap, hkv * D)).astype(F32) for _ in range(2))
        dQ, dk, dv = cuda.to_device(Q), cuda.to_device(kcache), cuda.to_device(vcache)
        out, pos, scale = cuda.to_device(np.zeros((R, hq * D), F32)), cuda.to_device(np.array([100], np.int32)), F32(0.35)
        kc.attention_split(dQ, dk, dv, out, 0, R, hq, hkv, D, scale, pos=pos)  # allocates the statistics
        g, _ = kc.capture(lambda: kc.attention_split(dQ, dk, dv, out, 0, R, hq, hkv, D, scale, pos=pos))
        for p in (10, 150, 190):
            pos.copy_to_device(np.array([p], np.int32))
            g.replay()
            want = np.zeros((R, hq * D), F32)
            kp.attention(Q, kcache, vcache, want, p, R, hq, hkv, D, scale)
            print(json.dumps(dict(case=f"split captured, replayed at pos {p}", s=0,
                                  bitwise=bool(np.array_equal(out.copy_to_host().view(np.uint32), want.view(np.uint32))))))
''')


def _run(which):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", SCRIPT, which], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert rows
    for row in rows:
        print(row)
    bad = [row["case"] for row in rows if not row["bitwise"]]
    assert not bad, bad


def test_prime_bitwise_under_simulator():
    _run("prime")


def test_split_bitwise_under_simulator():
    _run("split")
