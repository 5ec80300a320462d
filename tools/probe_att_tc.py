#!/usr/bin/env python3
"""The exact-bf16 tensor-core attention, checked and timed on a GPU (issue #19):

    python tools/probe_att_tc.py --out FILE.json [--rows 4096,32768] [--hq 16 --hkv 2 --d 256]

``numba_kernels.mma_tc.attention_mma_tc`` (Q, K and V packed to bf16 once per call, then the
twin's tiles and chains on the MMA). This tool

1. runs the check cases (odd heads, head dims 8-256, starts on and off a 64-key tile, rows
   straddling a tile; all-zero queries: tied +0 scores; scores that overflow to ±∞; NaN keys at
   a tile's first key and inside it; ∞ and bf16-∞ values) and compares each output bit for bit
   (every NaN as the canonical NaN) with the CPU twin's ``attention_mma``;
2. times the kernel on random rows of the given shape (bench-8l's attention by default) from
   position 0: the best of three after a compiling run.

Writes the JSON (device, commit from ``$PRIMEWALK_COMMIT``, the check verdicts and the times) and
prints one line. Exits 1 if any case differs from the twin. (Until 2026-12-03 the tree also had
an unpacked kernel with schedule variants, compared here: ``receipts/probes/``.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.atomic import write_text_atomic  # noqa: E402

F32 = np.float32


def check_cases(rng):
    """(name, Q, K, V, start, R, hq, hkv, D) — K and V hold start + R keys."""
    cases = []

    def r(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(F32)

    for hq, hkv, D, start, R in [(16, 2, 256, 0, 70), (7, 7, 40, 64, 33), (5, 1, 8, 23, 100), (3, 3, 12, 130, 40),
                                 (8, 2, 128, 1, 17), (6, 3, 64, 500, 90)]:
        n = start + R
        cases.append((f"R{R}-Hq{hq}-Hkv{hkv}-D{D}-p{start}", r(R, hq * D), r(n, hkv * D), r(n, hkv * D), start, R, hq,
                      hkv, D))
    hq, hkv, D, start, R = 4, 2, 64, 10, 120
    n = start + R
    Q, K, V = r(R, hq * D), r(n, hkv * D), r(n, hkv * D)
    Q[5:9] = 0  # rows of +0 scores: every key ties
    Q[20, :] = -0.0
    K[30, :64] = -0.0
    cases.append(("zero-scores", Q, K, V, start, R, hq, hkv, D))
    Q, K, V = r(R, hq * D), r(n, hkv * D), r(n, hkv * D)
    Q[40:44] *= F32(1e19)  # scores past float32: ±∞, ∞ − ∞ = NaN in exp
    K[70:75] *= F32(1e19)
    Q[60, 3] = np.inf
    cases.append(("overflow", Q, K, V, start, R, hq, hkv, D))
    Q, K, V = r(R, hq * D), r(n, hkv * D), r(n, hkv * D)
    K[64, 5] = np.nan  # a tile's first key: the tile max is NaN for every row reading it
    K[100, 70] = np.nan  # inside a tile (KV head 1)
    K[3, 0] = -np.inf
    V[77, 4], V[125, 9], V[128, 60] = np.inf, F32(3.4e38), -np.inf
    cases.append(("nonfinite", Q, K, V, start, R, hq, hkv, D))
    return cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="4096,32768")
    ap.add_argument("--hq", type=int, default=16)
    ap.add_argument("--hkv", type=int, default=2)
    ap.add_argument("--d", type=int, default=256)
    np.row_stack = getattr(np, "row_stack", np.vstack)  # numba-cuda 0.30.4 with numpy 2.5
    from numba import cuda

    from harness.engine import backend as bk
    from harness.engine.digests import canonical_f32
    from numba_kernels import mma_tc

    cpu = bk.get_backend("cpu").ops
    bk.get_backend("cuda")  # binds mma_tc's CUDA bodies
    cases = check_cases(np.random.default_rng(0))
    want = {}
    for name, Q, K, V, start, R, hq, hkv, D in cases:
        o = np.zeros((R, hq * D), F32)
        cpu.attention_mma(Q, K, V, o, start, R, hq, hkv, D, F32(D ** -0.5))
        want[name] = canonical_f32(o)
    dev = cuda.get_current_device()
    res = {"device": dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
           "commit": os.environ.get("PRIMEWALK_COMMIT", ""), "date": time.strftime("%Y-%m-%d"),
           "shape": {"hq": a.hq, "hkv": a.hkv, "D": a.d}}
    rows = [int(x) for x in a.rows.split(",")]
    big = {}
    rng = np.random.default_rng(1)
    for R in rows:
        big[R] = [cuda.to_device(rng.standard_normal((R, h * a.d), dtype=F32)) for h in (a.hq, a.hkv, a.hkv)]
    ok = True
    v = {"variant": "packed", "checks": {}, "times": {}}
    for name, Q, K, V, start, R, hq, hkv, D in cases:
        o = cuda.to_device(np.zeros((R, hq * D), F32))
        assert mma_tc.attention_mma_tc(cuda.to_device(Q), cuda.to_device(K), cuda.to_device(V), o, start, R, hq,
                                       hkv, D, F32(D ** -0.5))
        same = np.array_equal(canonical_f32(o.copy_to_host()).view(np.uint32), want[name].view(np.uint32))
        v["checks"][name] = "bitwise" if same else "DIFFERS"
        ok &= same
    for R in rows:
        Q, K, V = big[R]
        o = cuda.device_array((R, a.hq * a.d), F32)
        ts = []
        for _ in range(4):
            cuda.synchronize()
            t0 = time.perf_counter()
            mma_tc.attention_mma_tc(Q, K, V, o, 0, R, a.hq, a.hkv, a.d, F32(a.d ** -0.5))
            cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        t = min(ts[1:])
        flops = 4.0 * a.hq * a.d * R * (R + 1) / 2
        v["times"][str(R)] = {"s": t, "tflops": flops / t / 1e12}
    res.update(checks=v["checks"], times=v["times"])
    bad = [k for k, x in v["checks"].items() if x != "bitwise"]
    print("packed: " + ", ".join(f"R {R} {v['times'][str(R)]['s'] * 1e3:.2f} ms "
                                 f"({v['times'][str(R)]['tflops']:.1f} TFLOP/s)" for R in rows)
          + (f"; DIFFERS: {', '.join(bad)}" if bad else "; checks bitwise"), flush=True)
    write_text_atomic(a.out, json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
