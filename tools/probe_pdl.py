#!/usr/bin/env python3
"""Does programmatic dependent launch (PDL) shorten a chain of small dependent kernels on this GPU?

A decode step is ~90 kernels in one CUDA graph, ~60 of them small (3-6 µs each in Nsight
Compute, one to a few blocks: latency, not bandwidth). With PDL (sm_90: a launch attribute,
``griddepcontrol.wait`` in the kernel) a kernel may be launched while its predecessor still
runs: its blocks get resident and run up to the wait, which returns once the predecessor has
completed and its writes are visible. This probe times a graph of ``--chain`` dependent
launches of one small kernel (``--blocks`` blocks of ``--threads`` threads; each block reads the
previous kernel's whole output, 2,048 floats, sums it in a fixed order and writes its slice of
the next output: every kernel depends on all of its predecessor's blocks, as a norm after a
GEMV does) three ways:

- ``plain``: numba's launches, captured (what the engine does now; no griddepcontrol at all);
- ``pdl``: the same kernel with ``griddepcontrol.wait`` first, each launch carrying the
  programmatic-stream-serialization attribute;
- ``pdl+trigger``: also ``griddepcontrol.launch_dependents`` right after the wait, so the next
  kernel may be launched as soon as every block of this one has passed it.

The three final outputs must be bitwise equal (the wait orders the reads after the
predecessor's writes; a missing wait would race). Prints µs per kernel of each (CUDA events
around ``--reps`` graph replays) and writes JSON. CUDA only (sm_90).

    PYTHONPATH=. python tools/probe_pdl.py --out pdl.json [--chain 64] [--blocks 1,8,64]
"""

import argparse
import functools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _cli import int_list  # noqa: E402
from harness.atomic import write_text_atomic  # noqa: E402

N = 2048  # floats a kernel writes (a hidden row of bench-8l)


def _kernels():
    """(plain, pdl, pdl+trigger) kernels: each block sums the first ``nsum`` floats of ``src`` in
    index order (one thread), then writes its slice of ``dst`` (``dst[i] = src[i] * 0.5 + s * 1e-6``, as written: no contraction matters,
    every variant runs the same code)."""
    from llvmlite import ir
    from numba import cuda, types
    from numba.cuda.extending import intrinsic

    def _asm(text):
        @intrinsic
        def op(typingctx):
            def codegen(context, builder, sig, args):
                fn = ir.FunctionType(ir.VoidType(), [])
                builder.call(ir.InlineAsm(fn, text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()
            return types.void(), codegen
        return op

    wait, trigger = _asm("griddepcontrol.wait;"), _asm("griddepcontrol.launch_dependents;")

    def make(pdl, trig):
        @cuda.jit
        def step(src, dst, nsum):
            if pdl:
                wait()
            if trig:
                trigger()
            sh = cuda.shared.array(1, np.float32)
            t = cuda.threadIdx.x
            if t == 0:
                s = np.float32(0.0)
                for i in range(min(nsum, src.shape[0])):
                    s += src[i]
                sh[0] = s
            cuda.syncthreads()
            per = (dst.shape[0] + cuda.gridDim.x - 1) // cuda.gridDim.x
            i0 = cuda.blockIdx.x * per
            i = i0 + t
            while i < min(i0 + per, dst.shape[0]):
                dst[i] = src[i] * np.float32(0.5) + sh[0] * np.float32(1e-6)
                i += cuda.blockDim.x
        return step

    return make(False, False), make(True, False), make(True, True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--chain", type=int, default=64, help="dependent launches in the graph")
    ap.add_argument("--blocks", default="1,8,64", type=int_list(1, None, "block counts"),
                    help="blocks a launch (comma-separated)")
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20, help="graph replays timed")
    ap.add_argument("--sum", type=int, default=32,
                    help="inputs a block's first thread sums in order before the writes: the kernel's length (2,048 "
                         "until 3ab78f7: ~65 us a kernel on the H200, a decode step's small kernels run 3-6 us)")
    args = ap.parse_args(argv)
    blocks = args.blocks
    if args.chain < 2 or args.reps < 1 or not 32 <= args.threads <= 1024 or not 1 <= args.sum <= N:
        ap.error(f"--chain at least 2; --reps at least 1; --threads 32-1024; --sum 1-{N}")

    from numba import cuda
    from numba.cuda import dispatcher

    from numba_kernels import launch

    if launch.SIMULATED:
        ap.error("a GPU is needed (griddepcontrol is sm_90 PTX)")
    plain, pdl, trig = _kernels()
    base_cfg = dispatcher.LaunchConfig
    try:
        pdl_cfg = functools.partial(base_cfg, programmatic_stream_serialization=True)
        pdl_cfg(grid=1, block=32)
    except TypeError as e:
        print(f"this cuda.core's LaunchConfig has no programmatic_stream_serialization: {e}")
        write_text_atomic(args.out, json.dumps({"error": str(e)}))
        return 1
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(N).astype(np.float32)
    res = {"chain": args.chain, "threads": args.threads, "n": N, "sum": args.sum, "runs": []}
    ok = True
    start, stop = cuda.event(), cuda.event()
    for nb in blocks:
        bufs = [cuda.to_device(x0), cuda.device_array(N, np.float32)]
        outs, row = {}, {"blocks": nb}
        for name, k, cfg in (("plain", plain, base_cfg), ("pdl", pdl, pdl_cfg), ("pdl+trigger", trig, pdl_cfg)):
            def chain():
                for i in range(args.chain):
                    launch.launch(k, nb, args.threads, bufs[i % 2], bufs[(i + 1) % 2], np.int64(args.sum))
            dispatcher.LaunchConfig = cfg  # numba's launches build their config through this name
            try:
                bufs[0].copy_to_device(x0)
                chain()  # compile, eagerly
                cuda.synchronize()
                graph, _ = launch.capture(chain)
            finally:
                dispatcher.LaunchConfig = base_cfg
            bufs[0].copy_to_device(x0)
            graph.replay()
            cuda.synchronize()
            outs[name] = bufs[args.chain % 2].copy_to_host()
            start.record()
            for _ in range(args.reps):
                graph.replay()
            stop.record()
            stop.synchronize()
            row[f"{name}_us_per_kernel"] = cuda.event_elapsed_time(start, stop) * 1e3 / (args.reps * args.chain)
        row["bitwise"] = all(np.array_equal(outs["plain"].view(np.uint32), o.view(np.uint32)) for o in outs.values())
        ok &= row["bitwise"]
        res["runs"].append(row)
        print(f"{nb} blocks: " + ", ".join(f"{n} {row[f'{n}_us_per_kernel']:.2f} us"
                                           for n in ("plain", "pdl", "pdl+trigger"))
              + f" a kernel; bitwise {row['bitwise']}", flush=True)
    write_text_atomic(args.out, json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
