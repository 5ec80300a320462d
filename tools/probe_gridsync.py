"""What a grid-wide barrier costs on this GPU: the measurement a persistent MTP-pass kernel needs.

Issue #16's K = 3 draft goal (among 32,768 ids) needs the small phases of an MTP pass (norms,
attention over the head's few keys, RoPE, the greedy pick: ~49 µs a pass as 13 kernels, a chain
of launch latencies) to overlap the next GEMV's weight stream. One persistent kernel a pass, its
phases separated by ``cuda.cg.this_grid().sync()``, would do that if a grid barrier costs much
less than a kernel boundary. This probe measures, for cooperative grids of 1-4 blocks an SM and
128-512 threads a block:

- ``sync_us``: one grid barrier, from a kernel that runs ``n`` barriers (``--barriers`` n, default 2,000, and
  0; the difference over n), timed with CUDA events, the median of ``--reps``;
- ``launch_us``: one empty kernel of the same grid in a stream of n launches (the host's
  launch rate bounds it: a lower bound on what a kernel boundary costs is the graph-replayed
  probe in ``tools/probe_marginal.py``);
- ``stream_gbs``: a grid-stride copy of ``--mb`` MB (one float32 a thread a step: not a bandwidth
  measurement) with a grid barrier every ``--chunk-kb`` KB, against the same copy with none: what
  a barrier between phases costs a stream.

    python tools/probe_gridsync.py --out receipts/probes/gridsync.json

Needs a CUDA GPU; numba-cuda launches a kernel that calls ``this_grid().sync()`` cooperatively.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still names np.row_stack
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402  (a global: the simulator swaps it in the kernels)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import device_name, events_us  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.atomic import write_text_atomic  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="write the JSON here")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions of each case (median)")
    ap.add_argument("--mb", type=float, default=512, help="the copy's size in MB")
    ap.add_argument("--chunk-kb", type=int, default=2048, help="bytes copied between two barriers (KB)")
    ap.add_argument("--barriers", type=int, default=2000, help="barriers (and launches) a timed kernel runs")
    args = ap.parse_args(argv)
    if not cuda.is_available():
        ap.error("needs a CUDA GPU (none is visible here)")
    dev = cuda.get_current_device()
    sms = getattr(dev, "MULTIPROCESSOR_COUNT", 1)  # 1 under the simulator (a one-block cooperative grid)

    @cuda.jit
    def barriers(n, out):
        g = cuda.cg.this_grid()
        for _ in range(n):
            g.sync()
        if cuda.grid(1) == 0:
            out[0] = n

    @cuda.jit
    def empty(out):
        if cuda.grid(1) == 0:
            out[0] = 1

    @cuda.jit
    def copy(src, dst, per_sync, sync):
        g = cuda.cg.this_grid()
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        n = src.shape[0]
        done = 0
        while done < n:
            end = min(n, done + per_sync)
            j = done + i
            while j < end:
                dst[j] = src[j]
                j += stride
            done = end
            if sync:
                g.sync()

    out = cuda.device_array(1, np.int32)

    def timed(fn):
        return events_us(fn, args.reps)

    rows = []
    n = int(args.mb * (1 << 20)) // 4  # float32 words
    src = cuda.to_device(np.arange(n, dtype=np.float32))
    dst = cuda.device_array_like(src)
    per_sync = max(1, args.chunk_kb * 1024 // 4)
    barriers[1, 32](np.int32(0), out)  # compile both cooperative kernels
    copy[1, 32](src[:64], dst[:64], np.int64(64), True)
    cap = {k: k.overloads[next(iter(k.overloads), None)].max_cooperative_grid_blocks for k in (barriers, copy)}
    reps = args.barriers
    for threads in (128, 256, 512):
        for per_sm in (1, 2, 4):
            blocks = sms * per_sm
            if blocks > min(cap[barriers](threads), cap[copy](threads)):
                continue
            t_n = timed(lambda: barriers[blocks, threads](np.int32(reps), out))
            t_0 = timed(lambda: barriers[blocks, threads](np.int32(0), out))

            def launches():
                for _ in range(reps):
                    empty[blocks, threads](out)

            t_l = timed(launches)
            t_copy = timed(lambda: copy[blocks, threads](src, dst, np.int64(per_sync), False))
            t_copy_s = timed(lambda: copy[blocks, threads](src, dst, np.int64(per_sync), True))
            nbytes = 2 * n * 4
            rows.append({"blocks": blocks, "blocks_per_sm": per_sm, "threads": threads,
                         "sync_us": (t_n - t_0) / reps, "kernel_of_barriers_us": t_n, "empty_kernel_us": t_0,
                         "launch_us": t_l / reps, "stream_gbs": nbytes / t_copy / 1e3,
                         "stream_with_barriers_gbs": nbytes / t_copy_s / 1e3,
                         "barriers_in_stream": -(-n // per_sync)})
            r = rows[-1]
            print(f"{blocks:4d} blocks x {threads:3d}: grid sync {r['sync_us']:.2f} us, launch {r['launch_us']:.2f} us, "
                  f"copy {r['stream_gbs']:.0f} GB/s, with a barrier every {args.chunk_kb} KB "
                  f"{r['stream_with_barriers_gbs']:.0f} GB/s", flush=True)
    if not np.array_equal(dst.copy_to_host(), src.copy_to_host()):
        raise SystemExit("probe_gridsync: the copy kernel's output differs from its input")
    res = {"device": device_name(), "sms": sms,
           "cc": list(getattr(dev, "compute_capability", ())),
           "commit": os.environ.get("PRIMEWALK_COMMIT"), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "args": vars(args), "rows": rows}
    write_text_atomic(args.out, json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
