#!/usr/bin/env python3
"""Decode-step kernels on the GPU, in isolation: the GEMV (``PRIMEWALK_LINEAR`` v1 and v3) at the
bench-8l decode shapes and rmsnorm, each timed with CUDA events over repeated launches, every
version checked bit for bit against the CPU twin on ragged shapes. Writes JSON; exit 1 when the
default version (v3) differs.

    PYTHONPATH=. python tools/decode_kernels.py --out decode-kernels.json
"""

import argparse
import json
import sys

import numpy as np

from harness.atomic import write_text_atomic


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args(argv)
    from numba import cuda

    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    from numba_kernels import dispatch

    default = dispatch.GEMV_VERSION
    VERSIONS = dispatch.GEMV_VERSIONS  # the last is the default; exit 1 when it differs from the twin
    gemv = {ver: getattr(kc, "gemv_" + ver) for ver in VERSIONS}

    rng = np.random.default_rng(0)
    res = {"device": cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes)
           else str(cuda.get_current_device().name), "bitwise": [], "timing": []}
    ok = True
    for R, K, N in [(1, 2048, 8448), (4, 5632, 2048), (2, 1100, 77), (3, 64, 260), (1, 4096, 300), (4, 33, 5)]:
        X = rng.standard_normal((R, K)).astype(np.float32)
        W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        want = np.zeros((R, N), np.float32)
        kp.linear(X, W, want, R)
        row = {"R": R, "K": K, "N": N}
        for ver in VERSIONS:
            d = cuda.device_array((R, N), np.float32)
            gemv[ver](cuda.to_device(X), cuda.to_device(W), d, R)
            row[ver] = bool(np.array_equal(d.copy_to_host().view(np.uint32), want.view(np.uint32)))
        ok &= row[VERSIONS[-1]]
        res["bitwise"].append(row)
        print("bitwise", row, flush=True)
    start, stop = cuda.event(), cuda.event()

    def timed(fn):
        fn()
        cuda.synchronize()
        start.record()
        for _ in range(args.reps):
            fn()
        stop.record()
        stop.synchronize()
        return cuda.event_elapsed_time(start, stop) / args.reps * 1e3  # µs

    # bench-8l decode GEMVs (R = 1): qkvz+ba, out, gate+up, down, attention qkv, o, lm head
    for name, K, N in [("gdn in", 2048, 12288 + 64), ("gdn out", 4096, 2048), ("mlp gate+up", 2048, 11264),
                       ("mlp down", 5632, 2048), ("attn qkv", 2048, 8192 + 1024), ("attn o", 4096, 2048),
                       ("lm head", 2048, 151936)]:
        X = cuda.to_device(rng.standard_normal((1, K)).astype(np.float32))
        W = cuda.to_device((rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32))
        y = cuda.device_array((1, N), np.float32)
        row = {"op": name, "K": K, "N": N, "bytes": 4 * K * N}
        for ver in VERSIONS:
            us = timed(lambda: gemv[ver](X, W, y, 1))
            row[f"{ver}_us"] = us
            row[f"{ver}_TBps"] = 4 * K * N / us / 1e6
        res["timing"].append(row)
        print("timing", row, flush=True)
    X = cuda.to_device(rng.standard_normal((1, 2048)).astype(np.float32))
    w = cuda.to_device(rng.standard_normal(2048).astype(np.float32))
    y = cuda.device_array((1, 2048), np.float32)
    res["rmsnorm_R1_N2048_us"] = timed(lambda: kc.rmsnorm(X, w, np.float32(1e-6), y, 0, 1))
    print("rmsnorm R1 N2048 us", res["rmsnorm_R1_N2048_us"], flush=True)
    res["default"], res["default_bitwise"] = default, bool(ok)
    write_text_atomic(args.out, json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
