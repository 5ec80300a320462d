"""How fast can one chain of dependent MMAs go? (issues #16 / #19), seconds on an H200:

    python tools/probe_mma_chain.py --out DIR [--steps 200000]

The exact-bf16 GEMV's 2,048-output shapes are 256 warps, each a serial chain of K/16
``mma.sync.m16n8k16`` steps whose order the contract fixes (each step's C is the previous step's
D). This probe times that chain with nothing else in the loop: one warp running ``chains``
independent chains interleaved (1, 2, 4, 8), and ``warps`` warps per block (1, 2, 4), one block
per SM (132 blocks: every SM busy, as in the GEMV). Each time is the best of three launches of
``--steps`` steps per chain (events around one launch; the launch overhead is ~10 µs against
milliseconds). It prints, per configuration, the cycles a step of one chain takes (the dependent
MMA's issue-to-issue latency when chains = warps = 1) and the MMAs an SM completes per cycle, and
writes DIR/probe-mma-chain.json. The GEMV at one row took ~77 cycles a step on gdn out (K 4,096,
2,048 outputs, 11 µs); if a lone chain here takes about that, the shape is at its floor under the
contract and only fewer instructions elsewhere (none are left in the stage loop) or a faster
clock help.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--steps", type=int, default=200_000)
    a = ap.parse_args()
    np.row_stack = getattr(np, "row_stack", np.vstack)
    from numba import cuda

    from numba_kernels.mma_tc import mma_bf16

    def build(chains):
        @cuda.jit
        def chain_k(out, steps, seed):
            lane = cuda.threadIdx.x & 31
            s = np.uint32(seed) + np.uint32(lane)
            a0 = s ^ np.uint32(0x3C003C00)  # small bf16 pairs: the sums stay finite
            a1 = s ^ np.uint32(0x3C103C10)
            a2 = s ^ np.uint32(0x3C203C20)
            a3 = s ^ np.uint32(0x3C303C30)
            b0 = s ^ np.uint32(0x3B003B00)
            b1 = s ^ np.uint32(0x3B103B10)
            d = cuda.local.array((8, 4), np.uint32)
            for c in range(chains):
                for e in range(4):
                    d[c, e] = np.uint32(0)
            for _ in range(steps):
                for c in range(chains):  # unrolled: chains independent chains, interleaved
                    d[c, 0], d[c, 1], d[c, 2], d[c, 3] = mma_bf16(a0, a1, a2, a3, b0, b1,
                                                                  d[c, 0], d[c, 1], d[c, 2], d[c, 3])
            acc = np.uint32(0)
            for c in range(chains):
                acc ^= d[c, 0] ^ d[c, 1] ^ d[c, 2] ^ d[c, 3]
            out[cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x] = acc
        return chain_k

    dev = cuda.get_current_device()
    sms = dev.MULTIPROCESSOR_COUNT
    rows = []
    t0 = time.perf_counter()
    for chains in (1, 2, 4, 8):
        k = build(chains)
        for warps in (1, 2, 4):
            out = cuda.device_array(sms * 32 * warps, np.uint32)
            k[sms, 32 * warps](out, 1000, 1)  # compile, warm
            cuda.synchronize()
            ts = []
            for rep in range(3):
                e0, e1 = cuda.event(), cuda.event()
                e0.record()
                k[sms, 32 * warps](out, a.steps, rep + 2)
                e1.record()
                e1.synchronize()
                ts.append(cuda.event_elapsed_time(e0, e1) / 1e3)
            t = min(ts)
            rows.append({"chains": chains, "warps_per_sm": warps, "steps": a.steps, "s": t,
                         "ns_per_step": t / a.steps * 1e9,
                         "mma_per_sm_per_ns": chains * warps * a.steps / t / 1e9})
            print(f"chains {chains} warps/SM {warps}: {t * 1e3:8.3f} ms, {t / a.steps * 1e9:6.2f} ns a step of "
                  f"one chain, {chains * warps * a.steps / t / 1e9:6.3f} MMA per SM and ns", flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        name = dev.name
        with open(os.path.join(a.out, "probe-mma-chain.json"), "w") as f:
            json.dump({"device": name.decode() if isinstance(name, bytes) else str(name), "sms": sms,
                       "commit": os.environ.get("PRIMEWALK_COMMIT"), "rows": rows,
                       "wall_s": time.perf_counter() - t0}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
