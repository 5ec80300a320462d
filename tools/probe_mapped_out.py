#!/usr/bin/env python3
"""Can the lm head's GEMV store its logits straight into mapped (pinned, device-addressed) host
memory, and what does that cost? For R rows of bench-8l's lm head (151,936 × 2,048, float32
weights): the GEMV into device memory and then a copy to a pinned host buffer (what a step does
now), against the GEMV writing into a mapped host buffer (no copy after). Bits compared; times are
wall times of the synchronised sequence, median of ``--reps``.

    PYTHONPATH=. python tools/probe_mapped_out.py --out mapped.json [--rows 1,5]
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _cli import int_list  # noqa: E402
from harness.atomic import write_text_atomic  # noqa: E402
from harness.engine.backend import host_view  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,5", type=int_list(1, 8, "row counts"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--vocab", type=int, default=151936)
    args = ap.parse_args(argv)
    rows = args.rows
    if args.reps < 1 or args.vocab < 1:
        ap.error("--reps and --vocab must be at least 1")
    from numba import cuda

    from numba_kernels import cuda as kc

    V, H = args.vocab, 2048
    rng = np.random.default_rng(0)
    W = cuda.to_device((rng.standard_normal((V, H)) / np.sqrt(H)).astype(np.float32))
    flags = cuda.to_device(np.zeros(4, np.int32))
    res = {"vocab": V, "hidden": H, "rows": {}}
    ok = True
    for R in rows:
        X = cuda.to_device(rng.standard_normal((R, H)).astype(np.float32))
        dev = cuda.device_array((R, V), np.float32)
        pinned = cuda.pinned_array((R, V), np.float32)
        mapped = cuda.mapped_array((R, V), np.float32)

        def now_way():
            kc.linear_flag(X, W, dev, R, flags, 0)
            dev.copy_to_host(pinned)

        def mapped_way():
            kc.linear_flag(X, W, mapped, R, flags, 0)
            cuda.synchronize()

        def gemv_only():
            kc.linear_flag(X, W, dev, R, flags, 0)
            cuda.synchronize()

        times = {}
        for name, fn in (("gemv+copy", now_way), ("gemv->mapped", mapped_way), ("gemv", gemv_only)):
            fn()
            ts = []
            for _ in range(args.reps):
                cuda.synchronize()
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            times[name] = float(np.median(ts)) * 1e6
        same = bool(np.array_equal(host_view(pinned).view(np.uint32), host_view(mapped).view(np.uint32)))
        ok &= same
        res["rows"][R] = {"us": times, "bitwise": same}
        print(f"R {R}: " + ", ".join(f"{k} {v:.1f} us" for k, v in times.items()) + f"; bitwise {same}", flush=True)
    write_text_atomic(args.out, json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
