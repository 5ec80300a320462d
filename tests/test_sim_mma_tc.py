"""The tensor-core kernels (numba_kernels/mma_tc.py) under Numba's CUDA simulator, bit for bit
against the CPU twin.

``tests/mma_sim.py`` replaces the kernels' PTX (``mma.sync``, ``ldmatrix``) with warp-collective
Python that computes the MMA by the twin's rule, so these cases check what only the device could
check before: that every kernel hands each output the twin's chain -- the fragment layouts, the
shared-memory swizzles, the ``cp.async`` stage ring, whole and part-filled stages and pairs of
steps, rows and columns past the shapes, the split-KV tile and head-group mapping, the packed
attention's fragment order and its emulated tile for non-finite V, and the captured step's
device-side position. (That the H200 computes the rule itself is ``harness
mma-check`` on the recorded vectors.) The simulator runs a block's threads as Python threads, so
the shapes are small; the cases run in one subprocess, the simulator being chosen before numba is
imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(r'''
    import json
    import sys
    import time
    sys.setswitchinterval(1e-4)  # the simulator's threads meet at barriers: hand the GIL on quickly
    import numpy as np
    from numba import cuda
    sys.path.insert(0, "tests")
    import mma_sim
    mt = mma_sim.load()
    from numba_kernels import cpu
    from numba_kernels.launch import LAUNCHES

    rng = np.random.default_rng(0)
    res = []

    def same(a, b):
        return bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))

    def linear(R, K, N, kernel):
        X = rng.standard_normal((R, K)).astype(np.float32)
        if R >= 3:  # non-finite activations reach their rows only
            X[1, 5] = np.inf
            X[R - 1, K - 1] = np.nan
        Wb = ((rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        Wb[min(3, N - 1), 7] = 0x7F80  # +inf
        W = (Wb.astype(np.uint32) << 16).view(np.float32)
        want = np.zeros((R, N), np.float32)
        cpu.linear_mma(X, W, want, R)
        out = cuda.to_device(np.full((R, N), 7.0, np.float32))
        t = time.perf_counter()
        mt.linear_mma_tc(cuda.to_device(X), cuda.to_device(Wb), out, R)
        res.append({"case": f"linear R{R} K{K} N{N} ({kernel})", "same": same(out.copy_to_host(), want),
                    "s": round(time.perf_counter() - t, 1)})

    def attention(R, hq, hkv, D, start, pos=False, nonfinite=False):
        ctx = start + R
        cap = ctx + (40 if pos else 0)
        Q = rng.standard_normal((R, hq * D)).astype(np.float32)
        K = rng.standard_normal((cap, hkv * D)).astype(np.float32)
        V = rng.standard_normal((cap, hkv * D)).astype(np.float32)
        if nonfinite:  # a NaN query, an ∞ key, V ±∞ and a value that rounds to a bf16 ∞ at keys
            # some rows of a 16-row warp read and others do not (the packed kernel's emulated tile)
            Q[3, 5], K[10, 2], V[7, 3], V[12, D - 1] = np.nan, np.inf, -np.inf, np.float32(3.4e38)
        if pos:  # the cache past the position is never read: NaN there must not reach the output
            K[ctx:] = np.nan
            V[ctx:] = np.nan
        scale = np.float32(D ** -0.5)
        want = np.zeros((R, hq * D), np.float32)
        cpu.attention_mma(Q, K, V, want, start, R, hq, hkv, D, scale)
        out = cuda.to_device(np.full((R, hq * D), 7.0, np.float32))
        t = time.perf_counter()
        LAUNCHES.clear()
        if pos:
            mt.attention_mma_gpu(cuda.to_device(Q), cuda.to_device(K), cuda.to_device(V), out, 0, R, hq, hkv, D,
                                 scale, pos=cuda.to_device(np.array([start], np.int32)))
        else:
            mt.attention_mma_gpu(cuda.to_device(Q), cuda.to_device(K), cuda.to_device(V), out, start, R, hq, hkv,
                                 D, scale)
        res.append({"case": f"attention R{R} Hq{hq} Hkv{hkv} D{D} p{start}{' @pos' if pos else ''}"
                            f"{' nonfinite' if nonfinite else ''}",
                    "same": same(out.copy_to_host(), want), "s": round(time.perf_counter() - t, 1),
                    "kernels": sorted(LAUNCHES)})

    # the bf16-resident GEMV, one kernel per X rows staged (1, 2, 4, 8, 16): a whole stage then a
    # last step of 8 terms (264); four stages of the ring and a fifth that reuses the first, then a
    # last pair of one step (1288); only the tail path (40: two steps and 8 terms; 24; 16); rows
    # past R in a staged block (3 of 4, 6 of 8); a second 16-row block of one row (17) and a
    # whole one (12: rows g + 8 read); N not a multiple of 8 (9, 17)
    # up to 4 rows on at most VD_WIDE_MAX_N outputs: 512-k stages (vd*w); 1544: three whole
    # stages and a part-filled fourth
    linear(1, 264, 9, "vd1w")
    linear(2, 40, 17, "vd2w")
    linear(4, 1544, 9, "vd4w")
    mt.VD_WIDE_MAX_N = 8  # past it the 256-k ring
    linear(1, 264, 9, "vd1")
    linear(1, 1288, 8, "vd1")
    linear(2, 40, 17, "vd2")
    linear(3, 264, 9, "vd4")
    mt.VD_WIDE_MAX_N = 4096
    linear(6, 40, 8, "vd8")
    linear(12, 16, 8, "vd16")
    linear(17, 24, 8, "vd16")
    # the packed-X GEMM from 33 rows: one 8-term step (a single tile); three whole 32-k tiles and a
    # fourth (the first stage again) of a step and a half, rows past R and columns past N (a second
    # block of 8 of its 128) copies of the last row
    linear(33, 8, 8, "g16")
    linear(33, 120, 136, "g16")
    # K % 8 != 0: the one-warp kernel on element loads (_pair)
    linear(2, 20, 9, "tc")
    # split-KV attention on the MMA: two tiles, the second part-filled; head_dim not a multiple
    # of 16 (24: dims past it +0 in Q and K, columns past it not stored); 17 query heads on one KV
    # head (two head groups); rows at 3 positions; the captured step's position with NaN K/V past it
    attention(1, 4, 2, 16, 69)
    attention(3, 17, 1, 24, 60)
    attention(2, 4, 2, 16, 66, pos=True)
    # head_dim 144: QKᵀ's grouped loads over three groups of steps, the last part-filled; P·V's
    # 18 n-tiles, two a time per warp, the second of a pair past head_dim
    attention(1, 2, 1, 144, 70)
    # the query rows staged in shared memory (sQ) at the largest head_dim it holds (256), with a
    # NaN query and non-finite K/V in split-KV, and past it (264: the other kernels)
    attention(1, 3, 1, 256, 70)
    attention(4, 4, 2, 16, 20, nonfinite=True)
    attention(2, 2, 1, 264, 10)
    # past 16 rows the packed tensor-core attention: a second 16-row warp of one row, a query tile
    # starting mid-tile; head_dim 12 (a last n-tile of 4 columns); non-finite inputs
    attention(17, 2, 1, 16, 50)
    attention(20, 3, 3, 12, 0)
    attention(20, 2, 1, 16, 0, nonfinite=True)
    # the packed kernel at head_dim 144: its running sums' columns past 128 in shared memory, 18
    # n-tiles of P·V two at a time
    attention(17, 2, 1, 144, 70)
    print("RESULT " + json.dumps(res))
''')


def test_mma_tc_kernels_under_the_simulator_bitwise():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=1500)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert p.returncode == 0 and line, (p.stdout[-2000:], p.stderr[-4000:])
    res = json.loads(line[len("RESULT "):])
    assert len(res) == 24
    bad = [r["case"] for r in res if not r["same"]]
    assert not bad, f"differ from the twin: {bad}"
    ran = {r["case"]: r.get("kernels", []) for r in res}
    assert "attention_mma_sk_k" in ran["attention R1 Hq3 Hkv1 D256 p70"]  # sQ at its largest head_dim
    assert "attention_mma_sk_k" in ran["attention R4 Hq4 Hkv2 D16 p20 nonfinite"]
    assert "attention_mma_sk_k" not in ran["attention R2 Hq2 Hkv1 D264 p10"]  # past SK_Q_MAX_D: another kernel
