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
    import numpy as np
    from numba import cuda
    sys.path.insert(0, "tests")
    import mma_sim
    mt = mma_sim.load()
    from numba_kernels import cpu, mma
    from numba_kernels.launch import LAUNCHES
    launch_pdl_on = mt.pdl_on

    rng = np.random.default_rng(0)
    res = []

    def same(a, b):
        return bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))

    def linear(R, K, N, kernel, packed=False):
        X = rng.standard_normal((R, K)).astype(np.float32)
        if R >= 3:  # non-finite activations reach their rows only
            X[1, 5] = np.inf
            X[R - 1, K - 1] = np.nan
        Wb = ((rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        Wb[min(3, N - 1), 7] = 0x7F80  # +inf
        W = (Wb.astype(np.uint32) << 16).view(np.float32)
        want = np.zeros((R, N), np.float32)
        xp = None
        if packed:  # X packed by its producer (xp=): the kernels read it, not X (here noise: a kernel
            # packing X itself would differ from the twin, which reads xp too)
            b = mma.f32_to_bf16(X).astype(np.uint32)
            xp = np.ascontiguousarray(b[:, 0::2] | (b[:, 1::2] << 16))
            X = rng.standard_normal((R, K)).astype(np.float32)
            cpu.linear_mma(X, W, want, R, xp)
        else:
            cpu.linear_mma(X, W, want, R)
        out = cuda.to_device(np.full((R, N), 7.0, np.float32))
        t = time.perf_counter()
        LAUNCHES.clear()
        if packed:
            mt.linear_mma_tc(cuda.to_device(X), cuda.to_device(Wb), out, R, cuda.to_device(xp))
        else:
            mt.linear_mma_tc(cuda.to_device(X), cuda.to_device(Wb), out, R)
        res.append({"case": f"linear R{R} K{K} N{N} ({kernel}){' xp' if packed else ''}",
                    "same": same(out.copy_to_host(), want), "s": round(time.perf_counter() - t, 1),
                    "kernels": sorted(LAUNCHES)})

    def linear_flag(R, K, N, kernel, bad):
        """The lm head's exact-bf16 linear_flag: the outputs and flags[1] (set when an output
        stored is NaN or ±inf) as the twin's; ``bad``: a NaN in the last row of X (else every
        output finite: the flag must stay 0); a row past R with a NaN (never stored: no flag)."""
        X = rng.standard_normal((R + 1, K)).astype(np.float32)
        X[R, 3] = np.nan  # past R
        if bad:
            X[R - 1, K - 2] = np.nan
        Wb = ((rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        W = (Wb.astype(np.uint32) << 16).view(np.float32)
        want, wf = np.zeros((R + 1, N), np.float32), np.zeros(3, np.int32)
        cpu.linear_flag_mma(X, W, want, R, wf, 1)
        out = cuda.to_device(np.zeros((R + 1, N), np.float32))
        flags = cuda.to_device(np.zeros(3, np.int32))
        t = time.perf_counter()
        LAUNCHES.clear()
        mt.linear_flag_mma_tc(cuda.to_device(X), cuda.to_device(Wb), out, R, flags, 1)
        got, gf = out.copy_to_host(), flags.copy_to_host()
        res.append({"case": f"linear_flag R{R} K{K} N{N} ({kernel}){' nan' if bad else ''}",
                    "same": same(got[:R], want[:R]) and bool((gf == wf).all()) and int(gf[1]) == int(bad),
                    "s": round(time.perf_counter() - t, 1), "kernels": sorted(LAUNCHES)})

    def glu(R, K, I, kernel, packed=False, pairs=False, f32w=False):
        """linear_swiglu_mma (the MLP's gate‖up projection and its SwiGLU): the SwiGLU's outputs
        (and, with ``pairs``, their bf16 pairs; I even) as the twin's. Non-finite activations
        and an ∞ weight reach some gates and ups; gates from about -40 to 40 (silu's tails)."""
        X = (4 * rng.standard_normal((R, K))).astype(np.float32)
        if R >= 3:
            X[1, 5] = np.inf
            X[R - 1, K - 1] = np.nan
        Wb = ((rng.standard_normal((2 * I, K)) / np.sqrt(K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        Wb[min(3, I - 1), 7] = 0x7F80  # +inf: a gate
        Wb[I + min(2, I - 1), 9] = 0xFF80  # -inf: an up
        W = (Wb.astype(np.uint32) << 16).view(np.float32)
        xp = None
        if packed:
            b = mma.f32_to_bf16(X).astype(np.uint32)
            xp = np.ascontiguousarray(b[:, 0::2] | (b[:, 1::2] << 16))
        want, wgu = np.zeros((R, I), np.float32), np.zeros((R, 2 * I), np.float32)
        wox = np.zeros((R, I // 2), np.uint32) if pairs else None
        cpu.linear_swiglu_mma(X, W, I, want, R, wgu, xp, wox)
        out = cuda.to_device(np.full((R, I), 7.0, np.float32))
        ox = cuda.to_device(np.full((R, I // 2), 7, np.uint32)) if pairs else None
        t = time.perf_counter()
        LAUNCHES.clear()
        mt.linear_swiglu_mma_tc(cuda.to_device(X), cuda.to_device(W if f32w else Wb), I, out, R,
                                cuda.to_device(np.zeros((R, 2 * I), np.float32)),
                                None if xp is None else cuda.to_device(xp), ox)
        ok = same(out.copy_to_host(), want) and (not pairs or bool((ox.copy_to_host() == wox).all()))
        res.append({"case": f"linear_swiglu R{R} K{K} I{I} ({kernel}){' xp' if packed else ''}"
                            f"{' pairs' if pairs else ''}{' f32w' if f32w else ''}",
                    "same": ok, "s": round(time.perf_counter() - t, 1), "kernels": sorted(LAUNCHES)})

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
                            f"{' nonfinite' if nonfinite else ''}{f' vs{mt.SK_VSPLIT}' if mt.SK_VSPLIT != 1 else ''}",
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
    # a later whole slice's copies spread over the MMA pairs of a stage (issue_part; 18 copies over
    # 16 pairs: two in the first two), then the last, part-filled slice's copies before them
    linear(1, 2568, 9, "vd1w")
    mt.VD_WIDE_MAX_N = 8  # past it the 256-k ring
    linear(1, 264, 9, "vd1")
    linear(1, 1288, 8, "vd1")
    linear(2, 40, 17, "vd2")
    linear(3, 264, 9, "vd4")
    mt.VD_WIDE_MAX_N = 4096
    linear(6, 40, 8, "vd8")
    linear(12, 16, 8, "vd16")
    linear(17, 24, 8, "vd16")
    linear(17, 1288, 8, "vd16")  # 24 copies a stage over 8 pairs: three a pair (issue_part)
    # the packed-X GEMM from 33 rows: one 8-term step (a single tile); three whole 32-k tiles and a
    # fourth (the first stage again) of a step and a half, rows past R and columns past N (a second
    # block of 8 of its 128) copies of the last row
    linear(33, 8, 8, "g16")
    linear(33, 120, 136, "g16")
    # K % 8 != 0: the one-warp kernel on element loads (_pair)
    linear(2, 20, 9, "tc")
    # X packed by its producer (exact-bf16's engine: xp=), no mma_pack_x_k: the 512-k and 256-k
    # GEMV rings and the packed-X GEMM
    linear(1, 264, 9, "vd1w", packed=True)
    linear(6, 40, 8, "vd8", packed=True)
    linear(33, 8, 8, "g16", packed=True)
    # the lm head's flag: the bf16 GEMV checks each output as it stores it (no second kernel),
    # a NaN row and a finite one, 512-k and 256-k rings, a second 16-row block; from 33 rows the
    # GEMM, then nonfinite_flag
    linear_flag(1, 264, 9, "vd1w", True)
    linear_flag(2, 264, 9, "vd2w", False)
    mt.VD_WIDE_MAX_N = 8
    linear_flag(5, 40, 17, "vd8", True)
    mt.VD_WIDE_MAX_N = 4096
    linear_flag(17, 24, 8, "vd16", True)
    linear_flag(33, 8, 8, "g16", True)
    # programmatic dependent launch (what a captured step on sm_90 launches): the GEMVs that copy
    # their first stages of W before pdl_wait() and X's after it -- fewer slices than the ring
    # prefetches (40, 264), more (1288, 2568: whole slices spread over the pairs, a part-filled
    # last), 16-row blocks, X packed by its producer, the lm head's flag
    mt.pdl_on = lambda: True
    linear(1, 264, 9, "vd1w_pdl")
    linear(1, 2568, 9, "vd1w_pdl")
    linear(4, 40, 9, "vd4w_pdl")
    mt.VD_WIDE_MAX_N = 8
    linear(1, 1288, 8, "vd1_pdl")
    linear(6, 40, 8, "vd8_pdl", packed=True)
    mt.VD_WIDE_MAX_N = 4096
    linear(17, 1288, 8, "vd16_pdl")
    linear_flag(1, 264, 9, "vd1w_pdl", True)
    glu(1, 2568, 12, "vd1g_pdl", packed=True, pairs=True)  # the fused MLP input (below)
    mt.pdl_on = launch_pdl_on
    # the gate‖up GEMV with its SwiGLU as the epilogue (VD_GLU; 16 W rows a warp): I odd (a gate
    # row past I clamped, its outputs not stored) and even with the packed pairs; whole slices
    # spread over the pairs (1288: 24 copies a stage over 8 pairs) and the tail path; 16-row
    # blocks on 3 stages; X packed by its producer; with PDL above
    glu(1, 264, 9, "vd1g")
    glu(2, 40, 12, "vd2g", pairs=True)
    glu(6, 1288, 8, "vd8g", packed=True, pairs=True)
    glu(17, 24, 10, "vd16g", pairs=True)
    # ... and where the fused GEMV does not run: from 33 rows (the GEMM, then swiglu_act), float32
    # weights
    glu(33, 40, 8, "g16", pairs=True)
    glu(3, 40, 8, "tc", f32w=True)
    # split-KV attention on the MMA: two tiles, the second part-filled; head_dim not a multiple
    # of 16 (24: dims past it +0 in Q and K, columns past it not stored); 17 query heads on one KV
    # head (two head groups); rows at 3 positions; the captured step's position with NaN K/V past it
    attention(1, 4, 2, 16, 69)
    attention(3, 17, 1, 24, 60)
    attention(2, 4, 2, 16, 66, pos=True)
    # head_dim 144: QKᵀ's nine steps from the staged rows (words past head_dim unstaged); P·V's
    # 18 n-tiles over the block's 16 warps, two for the first two
    attention(1, 2, 1, 144, 70)
    # the query and key rows staged in shared memory at the largest head_dim they hold (256), with a
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
    # P·V's n-tiles split over blocks (SK_VSPLIT): 18 n-tiles in 4 shares (5, 5, 5, 3: a warp's
    # second tile past its share), 2 n-tiles asked into 4 (2 shares: one n-tile each), non-finite
    # V, the position on the device, 3 n-tiles in 3 with 17 heads on one KV head (two groups)
    mt.SK_VSPLIT = 4
    attention(1, 2, 1, 144, 70)
    attention(4, 4, 2, 16, 20, nonfinite=True)
    attention(2, 4, 2, 16, 66, pos=True)
    mt.SK_VSPLIT = 3
    attention(3, 17, 1, 24, 60)
    mt.SK_VSPLIT = 1
    print("RESULT " + json.dumps(res))
''')


def test_mma_tc_kernels_under_the_simulator_bitwise():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=1500)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert p.returncode == 0 and line, (p.stdout[-2000:], p.stderr[-4000:])
    res = json.loads(line[len("RESULT "):])
    assert len(res) == 52
    bad = [r["case"] for r in res if not r["same"]]
    assert not bad, f"differ from the twin: {bad}"
    ran = {r["case"]: r.get("kernels", []) for r in res}
    for case, kern in (("linear_flag R1 K264 N9 (vd1w) nan", "linear_mma_vd1w_k"), ("linear_flag R5 K40 N17 (vd8) nan",
                       "linear_mma_vd8_k"), ("linear_flag R17 K24 N8 (vd16) nan", "linear_mma_vd16_k")):
        assert kern in ran[case] and "nonfinite_flag_k" not in ran[case], (case, ran[case])  # checked as stored
    assert "nonfinite_flag_k" in ran["linear_flag R33 K8 N8 (g16) nan"]
    for case in ("linear R1 K264 N9 (vd1w)", "linear R6 K40 N8 (vd8)", "linear R33 K8 N8 (g16)"):
        assert "mma_pack_x_k" in ran[case] and "mma_pack_x_k" not in ran[case + " xp"], (case, ran[case + " xp"])
    for case, r in ran.items():  # the PDL cases ran the PDL kernels, the others the plain ones
        vd = [k for k in r if k.startswith(("linear_mma_vd", "linear_swiglu_mma_vd"))]
        assert all(k.endswith("_pdl_k") == ("_pdl)" in case) for k in vd), (case, r)
    assert sum("_pdl)" in c for c in ran) == 8
    assert "mma_pack_x_k" not in ran["linear R6 K40 N8 (vd8_pdl) xp"]
    for case, r in ran.items():  # the fused GEMV stores the SwiGLU itself; elsewhere the two kernels
        if case.startswith("linear_swiglu"):
            fused = "g)" in case or "g_pdl)" in case
            assert any(k.startswith("linear_swiglu_mma_vd") for k in r) == fused, (case, r)
            assert any(k.startswith("swiglu_act") for k in r) != fused, (case, r)
    assert "nonfinite_flag_k" not in ran["linear_flag R1 K264 N9 (vd1w_pdl) nan"]
    assert "attention_mma_sk_k" in ran["attention R1 Hq3 Hkv1 D256 p70"]  # sQ at its largest head_dim
    assert "attention_mma_sk_k" in ran["attention R4 Hq4 Hkv2 D16 p20 nonfinite"]
    assert "attention_mma_sk_k" not in ran["attention R2 Hq2 Hkv1 D264 p10"]  # past SK_Q_MAX_D: another kernel
    for c, r in ran.items():  # the split builds ran where SK_VSPLIT asked for them (at most one share an n-tile)
        if " vs" in c:
            nt = (int(c.split(" D")[1].split()[0]) + 7) // 8
            assert f"attention_mma_sk_v{min(int(c.split(' vs')[1]), nt)}_k" in r, (c, r)
    assert sum(" vs" in c for c in ran) == 4
