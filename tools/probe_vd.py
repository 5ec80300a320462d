"""exact-bf16 decode GEMV probe (issues #16 / #19), about a minute on an H200:

    python tools/probe_vd.py --out DIR [--rows 1,4] [--ncu] [--production] [--shapes ...]

The bf16-resident GEMV (``mma_tc.VD_KERNELS``: one warp per 8 W rows, the whole K chain of
MMAs, ``cp.async`` stages, fragments by ``ldmatrix``) at the bench-8l decode shapes, in variants
built by ``mma_tc._vd_kernel(xrows, kt, stages)`` (every stage count that fits 48 KB; timed
without the ``mma_pack_x_k`` launch before them). Every variant's output is compared bitwise with the
production configuration's (the same MMA chain in the same order: they must be equal), and the
production one with the CPU twin on the first shape. Each time is the mean of a burst of launches
queued behind a sleeping kernel (no launch gaps), each launch reading its own copy of W from a
ring larger than the L2 (as a decode step reads each layer's weights from HBM). Writes
DIR/probe-vd.json and prints one line per (shape, rows, variant) with its TB/s of W.

``--ncu``: run each shape once with the production configuration only, no timing (for
``ncu --kernel-name regex:linear_mma_vd ...``); ``--production``: time that configuration only;
``--shapes``: only the named shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import sm_clocks  # noqa: E402

# (name, K, N): bench-8l's decode GEMVs (the lm head last)
SHAPES = [("gdn in", 2048, 12352), ("gdn out", 4096, 2048), ("mlp gate+up", 2048, 11264),
          ("mlp down", 5632, 2048), ("attn qkv", 2048, 9216), ("lm head", 2048, 151936)]
# (kt, stages) tried, where the stages fit the 48 KB of static shared memory
VARIANTS = [(256, 3), (256, 4), (256, 6), (256, 8), (256, 10), (512, 3), (512, 4)]
RING_BYTES = 256 << 20
BURST = 16
WARM_S = 0.25  # untimed calls before a variant's bursts (see timed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows", default="1,4,5")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--production", action="store_true", help="time the production configuration only")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: all), e.g. 'gdn out,mlp down'")
    a = ap.parse_args()
    np.row_stack = getattr(np, "row_stack", np.vstack)
    from numba import cuda

    from harness.engine.bf16 import narrow
    from harness.engine.modes import round_bf16
    from numba_kernels import cpu, mma_tc

    @cuda.jit
    def sleep_k(n):
        for _ in range(n):
            cuda.nanosleep(1000)

    def timed(run):
        """Seconds a call of run(i) takes: the least of three bursts' means, each burst of BURST
        calls queued behind a 2 ms sleeping kernel (no launch gaps). First the calls run for
        WARM_S without timing: a GPU idle before the probe starts at a low SM clock (345 MHz
        read on an H100 before a probe whose one-row 2,048-output rows then took twice their
        usual time, receipts/probes/h100-probe-vd-ws-3df58be/)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < WARM_S:
            for i in range(BURST):
                run(i)
            cuda.synchronize()
        ts = []
        for _ in range(3):
            sleep_k[1, 1](2000)
            e0, e1 = cuda.event(), cuda.event()
            e0.record()
            for i in range(BURST):
                run(i)
            e1.record()
            e1.synchronize()
            ts.append(cuda.event_elapsed_time(e0, e1) / 1e3 / BURST)
        return min(ts)

    kernels = {}
    rng = np.random.default_rng(0)
    rows, ok = [], True
    t_all = time.perf_counter()
    clocks_before = sm_clocks()
    pick = [x.strip() for x in a.shapes.split(",") if x.strip()]
    unknown = [x for x in pick if x not in [sh[0] for sh in SHAPES]]
    if unknown:
        ap.error(f"unknown shape(s) {unknown}; known: {[sh[0] for sh in SHAPES]}")
    for name, K, N in SHAPES:
        if pick and name not in pick:
            continue
        W = round_bf16(rng.standard_normal((N, K)).astype(np.float32) * np.float32(K ** -0.5))
        Wb = narrow(W)
        nring = 1 if a.ncu else max(1, -(-RING_BYTES // Wb.nbytes))
        ring = [cuda.to_device(Wb) for _ in range(nring)]
        for R in (int(r) for r in a.rows.split(",")):
            X = rng.standard_normal((R, K)).astype(np.float32)
            dX = cuda.to_device(X)
            ref = None
            xrows = mma_tc.vd_rows(R)
            wide = mma_tc.vd_wide(R, N)  # as _linear_w16
            prod = (mma_tc.VD_WIDE_KT if wide else mma_tc.V16_KT, mma_tc.V16_STAGES)
            Xp = cuda.device_array((R, K // 2), np.uint32)  # packed once for every variant
            mma_tc.mma_pack_x_k[(R * (K // 4) + 255) // 256, 256](dX.view(np.uint32), Xp, R)
            fits = [v for v in VARIANTS if v[1] * (xrows + 8) * v[0] * 2 <= 48 * 1024]
            for kt, stages in [prod] + ([] if a.ncu or a.production else [v for v in fits if v != prod]):
                key = (xrows, kt, stages)
                if key not in kernels:
                    table = mma_tc.VD_WIDE if wide else mma_tc.VD_KERNELS
                    kernels[key] = table[xrows] if (kt, stages) == prod else \
                        mma_tc._vd_kernel(xrows, kt, stages)
                kern = kernels[key]
                out = cuda.device_array((R, N), np.float32)
                grid = ((N + 7) // 8, (R + 15) // 16)
                kern[grid, 32](Xp, ring[0].view(np.uint32), out.view(np.uint32), R, None, -1)  # flags None: the plain GEMV
                cuda.synchronize()
                got = out.copy_to_host()
                if ref is None:
                    ref = got
                    if name == (pick or [SHAPES[0][0]])[0]:  # the production kernel against the CPU twin
                        want = np.empty((R, N), np.float32)
                        cpu.linear_mma(X, W, want, R)
                        same_cpu = bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))
                        ok &= same_cpu
                        print(f"{name} R{R}: production kernel vs CPU twin: {'bitwise' if same_cpu else 'DIFFERS'}",
                              flush=True)
                same = bool(np.array_equal(got.view(np.uint32), ref.view(np.uint32)))
                ok &= same
                if a.ncu:
                    continue
                t = timed(lambda i: kern[grid, 32](Xp, ring[i % nring].view(np.uint32), out.view(np.uint32), R, None, -1))
                row = {"shape": name, "K": K, "N": N, "R": R, "xrows": xrows, "kt": kt, "stages": stages,
                       "production": (kt, stages) == prod, "bitwise_vs_production": same, "s": t,
                       "w_tb_s": 2 * N * K / t / 1e12}
                rows.append(row)
                print(f"{name:12s} K{K:5d} N{N:6d} R{R}: kt {kt} stages {stages}: "
                      f"{t * 1e6:8.1f} us  {row['w_tb_s']:5.2f} TB/s  {'bitwise' if same else 'DIFFERS'}", flush=True)
        del ring
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        dev = cuda.get_current_device().name
        with open(os.path.join(a.out, "probe-vd.json"), "w") as f:
            json.dump({"device": dev.decode() if isinstance(dev, bytes) else str(dev),
                       "commit": os.environ.get("PRIMEWALK_COMMIT"), "rows": rows,
                       "clocks_before": clocks_before, "clocks_after": sm_clocks(),
                       "wall_s": time.perf_counter() - t_all}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
