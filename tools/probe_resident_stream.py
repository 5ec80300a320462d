"""How fast a resident grid can stream weights: the upper bound of a GEMV written for a
persistent pass.

``tools/probe_persistent.py`` found the engine's GEMV code, run by a cooperative grid of one or
two blocks an SM, streaming a draft pass's 549.5 MB at half the rate of the same GEMVs launched
as kernels (~380 µs against ~192 on an H100): each block walks its output blocks one after
another, each with its own ramp. A GEMV for a resident grid would instead stream each SM's share
of W as one continuous run. This probe measures what such a stream can reach before any GEMV is
written on it: ``--blocks-per-sm`` blocks an SM of ``--threads`` threads, block b reading the
b-th contiguous share of a ``--mb`` MB float32 array through a ring of ``--stages`` stages in
shared memory (``cp.async``, 16 bytes a thread a copy, ``--units`` copies a thread a stage, every
stage but the newest ``stages - 1`` awaited before it is read); each thread reads back only what
it copied (no barrier) and sums it, so the kernel streams and does a little arithmetic, as a GEMV
would. ``--kernels regs`` times the same stream without shared memory, each thread holding its
next ``stages - 1`` stages' loads in registers. The median of ``--reps`` runs (CUDA events) for
each depth in ``--stages``, against a plain grid-stride kernel of many blocks reading the same
bytes (``many_blocks``: 16-byte loads, eight blocks an SM) -- the rate the engine's launches get
-- and each sum is checked against numpy's (float64 sums of the shares, to a tolerance: the
order of a thread's additions is not the contract here).

    PYTHONPATH=. python tools/probe_resident_stream.py --out receipts/probes/resident-stream.json

Needs a CUDA GPU (or Numba's simulator, with small sizes: ``tests/test_probe_resident_stream.py``).
Exit 0 when every run's sums check, 1 when one does not, 2 on bad input.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from numba import cuda  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import device_name, events_us  # noqa: E402
from harness.atomic import write_text_atomic  # noqa: E402

F32 = np.float32
ROW = 1024  # floats a row of the streamed array (cp16f addresses a 2-D array)


def ring_source(T, V, S):
    """The resident kernel: block b streams 16-byte units [lo, hi) of W (flat), T threads, V units
    a thread a stage, a ring of S stages; out[b·T + t] the thread's sum."""
    per = T * V
    L = [f"cpw = cp_wait_group({S - 1})", "", "def kern(W, units, out):",
         f"    ring = cuda.shared.array({S * per * 4}, np.float32, alignment=ALIGN)",
         "    t = cuda.threadIdx.x", "    b = cuda.blockIdx.x", "    G = cuda.gridDim.x",
         "    share = (units + G - 1) // G", "    lo = b * share", "    hi = min(units, lo + share)",
         f"    nst = (hi - lo + {per - 1}) // {per}", "    acc = float32(0.0)"]
    a = L.append

    def issue(p, st):  # stage st's copies into its ring slot, then one commit (empty past the end)
        a(f"{p}if {st} < nst:")
        for v in range(V):
            a(f"{p}    u = lo + {st} * {per} + {v * T} + t")
            a(f"{p}    if u < hi:")
            a(f"{p}        cp16f(ring, ((({st}) % {S}) * {per} + {v * T} + t) * 4, W, u * 4, {ROW})")
        a(f"{p}cp_commit()")

    for s in range(S - 1):
        issue("    ", str(s))
    a("    s = 0")
    a("    while s < nst:")
    issue("        ", f"(s + {S - 1})")
    a("        cpw()")  # every group but the newest S - 1: stage s has landed (this thread's copies)
    for v in range(V):
        a(f"        u = lo + s * {per} + {v * T} + t")
        a("        if u < hi:")
        a(f"            x0, x1, x2, x3 = lds4(ring, ((s % {S}) * {per} + {v * T} + t) * 4)")
        a("            acc += (x0 + x1) + (x2 + x3)")
    a("        s += 1")
    a("    out[b * cuda.blockDim.x + t] = acc")
    return "\n".join(L) + "\n"


def regs_source(T, V, S):
    """The same resident stream with no shared memory: each thread keeps its next S - 1 stages'
    loads in registers (slot k of S, the loop unrolled S times so that every slot is named)."""
    per = T * V
    L = ["def kern(W, units, out):", "    t = cuda.threadIdx.x", "    b = cuda.blockIdx.x", "    G = cuda.gridDim.x",
         "    share = (units + G - 1) // G", "    lo = b * share", "    hi = min(units, lo + share)",
         f"    nst = (hi - lo + {per - 1}) // {per}", "    acc = float32(0.0)"]
    a = L.append

    def load(p, k, st):  # stage st's units into slot k (zeros past the end)
        for v in range(V):
            a(f"{p}u = lo + ({st}) * {per} + {v * T} + t")
            a(f"{p}if ({st}) < nst and u < hi:")
            a(f"{p}    r{k}_{v}_0, r{k}_{v}_1, r{k}_{v}_2, r{k}_{v}_3 = ld4gf(W, u * 4, {ROW})")
            a(f"{p}else:")
            a(f"{p}    r{k}_{v}_0 = r{k}_{v}_1 = r{k}_{v}_2 = r{k}_{v}_3 = float32(0.0)")

    for k in range(S - 1):
        load("    ", k, str(k))
    a("    s = 0")
    a("    while s < nst:")
    for k in range(S):
        load("        ", (k + S - 1) % S, f"s + {k + S - 1}")
        for v in range(V):
            a(f"        acc += (r{k}_{v}_0 + r{k}_{v}_1) + (r{k}_{v}_2 + r{k}_{v}_3)")
    a(f"        s += {S}")
    a("    out[b * cuda.blockDim.x + t] = acc")
    return "\n".join(L) + "\n"


PLAIN = '''
def kern(W, units, out):
    t = cuda.threadIdx.x
    g = cuda.blockIdx.x * cuda.blockDim.x + t
    n = cuda.gridDim.x * cuda.blockDim.x
    acc = float32(0.0)
    u = g
    while u < units:
        x0, x1, x2, x3 = ld4gf(W, u * 4, ROW_)
        acc += (x0 + x1) + (x2 + x3)
        u += n
    out[g] = acc
'''


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="write the JSON here")
    ap.add_argument("--mb", type=float, default=549.5, help="MB streamed (a draft pass's weights: 549.5)")
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--units", type=int, default=2, help="16-byte copies a thread a stage")
    ap.add_argument("--stages", default="2,4,6", help="ring depths to time (comma-separated)")
    ap.add_argument("--blocks-per-sm", type=int, default=1)
    ap.add_argument("--kernels", default="ring,regs",
                    help="resident kernels to time at each depth: ring (cp.async into shared memory), regs (loads "
                         "held in registers)")
    ap.add_argument("--reps", type=int, default=20, help="timed runs of each case (median; 0: the sums alone)")
    args = ap.parse_args(argv)
    try:
        stages = [int(s) for s in args.stages.split(",")]
    except ValueError:
        ap.error(f"--stages {args.stages!r}: comma-separated integers")
    if min(stages) < 2 or args.threads < 32 or args.threads % 32 or args.units < 1 or args.blocks_per_sm < 1 \
            or args.mb <= 0 or args.reps < 0:
        ap.error("--stages >= 2, --threads a multiple of 32, --units and --blocks-per-sm >= 1, --mb > 0, --reps >= 0")
    kinds = args.kernels.split(",")
    if not kinds or any(k not in ("ring", "regs") for k in kinds):
        ap.error(f"--kernels {args.kernels!r}: ring, regs or both (comma-separated)")
    for S in stages if "ring" in kinds else ():
        if S * args.threads * args.units * 16 > 48 * 1024:
            ap.error(f"--stages {S}: {S * args.threads * args.units * 16} bytes of ring, past 48 KiB of static shared memory")
    if not cuda.is_available():
        ap.error("needs a CUDA GPU (none is visible here)")

    from numba_kernels import cuda as _kc  # noqa: F401  (binds the generated sources' namespace)
    from numba_kernels import intrin
    from numba_kernels import launch as kl
    from numba_kernels.tags import KernelSource

    dev = cuda.get_current_device()
    sms = getattr(dev, "MULTIPROCESSOR_COUNT", 1)
    rows = max(1, int(args.mb * 1e6) // (4 * ROW))
    rng = np.random.default_rng(0)
    Wh = rng.standard_normal((rows, ROW)).astype(F32)
    W = cuda.to_device(Wh)
    units = rows * ROW // 4
    T = args.threads
    res_rows, ok = [], True

    flat = Wh.reshape(-1, 4).astype(np.float64).sum(axis=1)  # each 16-byte unit's sum

    def check(name, blocks, out, per_block):
        """Each block's (or the plain kernel's total) sum against numpy's, to 1e-3 of the absolute sum."""
        got = out.copy_to_host().astype(np.float64)
        if per_block:
            share = -(-units // blocks)
            want = np.array([flat[b * share:(b + 1) * share].sum() for b in range(blocks)])
            have = got.reshape(blocks, T).sum(axis=1)
        else:
            want, have = np.array([flat.sum()]), np.array([got.sum()])
        tol = 1e-3 * (np.abs(flat).sum() / max(1, len(want))) + 1e-3
        good = bool(np.all(np.abs(have - want) <= tol))
        if not good:
            print(f"{name}: sums differ from numpy's by up to {np.abs(have - want).max():.3g}", file=sys.stderr)
        return good

    nbytes = units * 16
    blocks = sms * args.blocks_per_sm
    for kind, S in [(kind, S) for kind in kinds for S in stages]:
        # the generated kernels' namespace and cp.async's wait for all but the newest S - 1 groups
        # (numba_kernels binds only the fixed depths it uses)
        src = (ring_source if kind == "ring" else regs_source)(T, args.units, S)
        k = kl.Kernel(KernelSource(f"resident_{kind}_t{T}_v{args.units}_s{S}", src, T),
                      {**kl._GEN_NS, "cp_wait_group": intrin.cp_wait_group})
        out = cuda.device_array(blocks * T, F32)
        k.disp[blocks, T, 0, 0](W, np.int64(units), out)
        cuda.synchronize()
        good = check(f"{kind} {S}", blocks, out, True)
        ok &= good
        row = {"kernel": kind, "stages": S, "blocks": blocks, "threads": T, "units": args.units,
               "in_flight_kb_per_sm": (S - 1) * T * args.units * 16 * args.blocks_per_sm / 1024, "sums_ok": good}
        if args.reps:
            us = events_us(lambda: k.disp[blocks, T, 0, 0](W, np.int64(units), out), args.reps)
            row.update(us=us, gbs=nbytes / us / 1e3)
        res_rows.append(row)
    kp = kl.Kernel(KernelSource("plain_stream", PLAIN.replace("ROW_", str(ROW)), 256), kl._GEN_NS)
    pb = sms * 8
    out = cuda.device_array(pb * 256, F32)
    kp.disp[pb, 256, 0, 0](W, np.int64(units), out)
    cuda.synchronize()
    good = check("many_blocks", pb, out, False)
    ok &= good
    row = {"kernel": "many_blocks", "blocks": pb, "threads": 256, "sums_ok": good}
    if args.reps:
        us = events_us(lambda: kp.disp[pb, 256, 0, 0](W, np.int64(units), out), args.reps)
        row.update(us=us, gbs=nbytes / us / 1e3)
    res_rows.append(row)
    res = {"kind": "probe-resident-stream", "device": device_name(),
           "sms": sms, "commit": os.environ.get("PRIMEWALK_COMMIT"), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "args": vars(args), "bytes": nbytes, "rows": res_rows}
    for r in res_rows:
        what = (f"{r['blocks']} blocks x {r['threads']}, {r['kernel']} of {r['stages']} stages "
                f"({r['in_flight_kb_per_sm']:.0f} KB in flight an SM)" if "stages" in r
                else f"{r['blocks']} blocks x 256, grid-stride")
        print(f"{what}: " + (f"{r['us']:.1f} us, {r['gbs']:.0f} GB/s" if "us" in r else "not timed")
              + ("" if r["sums_ok"] else " SUMS WRONG"))
    write_text_atomic(args.out, json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
