#!/usr/bin/env python3
"""The exact-bf16 split-KV attention of a decode or verify step on the GPU, alone: bitwise against
the CPU twin, then timed.

    PYTHONPATH=. python tools/probe_attn_sk.py --out sk.json [--ctx 512] [--cap 768] [--rows 1,5] [--vsplit 1,2,4]

bench-8l's attention shape (16 query heads, 2 KV heads, head_dim 256), a captured step's way: the
position on the device, the grid over the cache's ``--cap`` positions (tiles past the position
exit at once). Each row count: the CPU twin's output against the kernel's (every bit), then
µs per call of the whole op (``attention_mma_sk``: the kernel and the ordered merge), each a CUDA
graph of ``--reps`` launches replayed between two events; with ``--vsplit``, once per split of
P·V's n-tiles over blocks (``mma_tc.SK_VSPLIT``). Prints one line a (row count, split) and
writes the JSON.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _cli import int_list  # noqa: E402
from _timing import graph_us, sm_clocks  # noqa: E402
from harness.atomic import write_text_atomic  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctx", type=int, default=512, help="keys before the step's first row")
    ap.add_argument("--cap", type=int, default=768, help="the cache's positions (the grid's reach)")
    ap.add_argument("--rows", default=(1, 5), type=int_list(1, 16, "row counts"),
                    help="row counts, comma-separated (split-KV serves up to 16)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--hq", type=int, default=16)
    ap.add_argument("--hkv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--vsplit", default=None, type=int_list(1, 32, "split counts"),
                    help="P·V's n-tiles split over this many blocks, comma-separated (mma_tc.SK_VSPLIT; "
                         "default: production's alone)")
    args = ap.parse_args(argv)
    rows = args.rows
    if args.ctx < 0 or args.reps < 1 or args.cap < args.ctx + max(rows):
        ap.error("--ctx ≥ 0, --reps ≥ 1 and --cap ≥ ctx + the largest row count")
    from numba import cuda

    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    from numba_kernels import mma_tc

    hq, hkv, D = args.hq, args.hkv, args.head_dim
    rng = np.random.default_rng(0)
    scale = np.float32(D ** -0.5)
    K = rng.standard_normal((args.cap, hkv * D)).astype(np.float32)
    V = rng.standard_normal((args.cap, hkv * D)).astype(np.float32)
    dK, dV = cuda.to_device(K), cuda.to_device(V)
    res = {"ctx": args.ctx, "cap": args.cap, "hq": hq, "hkv": hkv, "D": D, "reps": args.reps,
           "production_vsplit": mma_tc.SK_VSPLIT, "clocks_before": sm_clocks(), "steps": []}
    ok = True
    production = mma_tc.SK_VSPLIT
    for R, vs in [(R, vs) for vs in (args.vsplit or (production,)) for R in rows]:
        mma_tc.SK_VSPLIT = vs
        Q = rng.standard_normal((R, hq * D)).astype(np.float32)
        want = np.zeros((R, hq * D), np.float32)
        kp.attention_mma(Q, K, V, want, args.ctx, R, hq, hkv, D, scale)
        dQ, d = cuda.to_device(Q), cuda.device_array((R, hq * D), np.float32)
        pos = cuda.to_device(np.array([args.ctx], np.int32))

        def call():
            return mma_tc.attention_mma_sk(dQ, dK, dV, d, 0, R, hq, hkv, D, scale, pos=pos)

        kc.LAUNCHES.clear()
        ran = call()
        same = bool(ran) and bool(np.array_equal(d.copy_to_host().view(np.uint32), want.view(np.uint32)))
        ok &= same
        row = {"R": R, "vsplit": vs, "ran": bool(ran), "bitwise": same, "kernels": sorted(kc.LAUNCHES)}
        if same:
            row["us"] = graph_us(lambda _: call(), args.reps)
        res["steps"].append(row)
        print(f"R{R} vsplit {vs}: bitwise {same}, {row.get('us', float('nan')):.1f} us a call "
              f"({', '.join(row['kernels'])})", flush=True)
    mma_tc.SK_VSPLIT = production
    res["bitwise"] = ok
    res["clocks_after"] = sm_clocks()
    write_text_atomic(args.out, json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
