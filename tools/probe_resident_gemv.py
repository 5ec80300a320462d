"""A one-row GEMV written for a resident grid, in the canonical order, timed against the engine's
``gemv`` on a draft pass's six shapes: the gate before any persistent MTP pass is built on it.

``tools/probe_resident_stream.py`` found one block an SM streaming a pass's bytes as fast as a
many-block read. This probe puts the arithmetic on such a stream: one block an SM
(``--warps`` warps), block b owning the output rows ``[b·N/G, (b+1)·N/G)`` (a contiguous run
of W) and warp w of it the rows ``r0 + w, r0 + w + warps, ...`` (``--rows turns``: the grid's
warps take the rows in turn instead, the whole grid reading one window of W at a time, as the
engine's many-block GEMV does). A warp walks its rows in **steps** of 32 slices (4 KiB of
float32): each step's 16-byte units are copied with ``cp.async`` into the warp's own ring slot
(``--stages`` slots, the newest ``stages - 1`` steps in flight; slices padded to 36 words, so
that lane L reading slice L hits no bank twice), and after the step has landed lane L runs slice
L's fma chain from +0 against X (staged once in shared memory, padded alike); the 32 partials go
through shared memory and every lane adds them (loaded four at a time) to the row's accumulator
in slice order (from +0), the row's output stored after its last step. ``--load ldg`` keeps the
next ``stages - 1`` steps in registers instead (16-byte ``ld.global.nc`` loads, as ``gemv``
reads its weights), each step stored to the warp's one tile before its slices are read. That is
:func:`numba_kernels.exact.dot`, the contract every linear kernel keeps, so each output is
checked bitwise against ``gemv``'s. The first ``stages - 1`` steps' weights are requested before
X is staged (in a persistent pass, while the previous phase ends). K must be a multiple of 32
(every bench-8l shape is; the zero fill a partial slice needs is left out).

Prints and writes (JSON), for each ring depth: each shape's µs (its launch replayed in a CUDA
graph, ``--reps`` times) against ``gemv``'s, and the six shapes as one graph against the six
``gemv`` launches as one graph (what a draft pass's GEMVs cost the engine: ~192 µs on an H100).

    PYTHONPATH=. python tools/probe_resident_gemv.py --out receipts/probes/resident-gemv.json

Needs a CUDA GPU (or Numba's simulator, with small shapes: ``tests/test_probe_resident_gemv.py``).
Exit 0 when every output is bitwise ``gemv``'s, 1 when one is not or a configuration could not be
launched (its row says why: e.g. registers x threads past an SM's), 2 on bad input.
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
from _timing import device_name, graph_us  # noqa: E402
from probe_persistent import add_shape_args, check_shape_args, shapes  # noqa: E402
from harness.atomic import write_text_atomic  # noqa: E402

F32 = np.float32
PAD = 36  # words a slice takes in shared memory (32 + one 16-byte unit)
SLOT = 32 * PAD  # words a ring slot takes (a step's 32 slices)


def smem_words(NW, S, KMAX):
    """Shared memory (float32 words): the warps' rings, X, the warps' partials."""
    return NW * S * SLOT + (KMAX // 32) * PAD + NW * 32


def rgemv_source(NW, S, KMAX, inter=False, ldg=False):
    """The kernel ``kern(X, W, out, N, K)``: out[0, o] = dot(X[0], W[o]) for o < N, K ≤ KMAX.
    Rows: block b's contiguous run, warp w every NW-th row of it from its w-th; ``inter``: the
    grid's warps dealt the rows in turn (global warp g = b·NW + w takes g, g + G·NW, ...), so that
    the whole grid reads one window of W at a time, as the engine's many-block GEMV does.
    ``ldg``: :func:`ldg_source`'s kernel instead (registers, not ``cp.async``)."""
    if ldg:
        return ldg_source(NW, S, KMAX, inter)
    XS0, PW0 = NW * S * SLOT, NW * S * SLOT + (KMAX // 32) * PAD
    L = [f"cpw = cp_wait_group({S - 1})", "", *_head(NW, inter, "X, W, out, N, K")]
    a = L.append

    def issue(p, m):  # step m's copies into its slot, then one commit (empty past the warp's rows)
        _locate(a, p, m)
        a(f"{p}if mi < M and row < r1:")
        a(f"{p}    sb = (w * {S} + mi % {S}) * {SLOT}")
        for i in range(8):  # unit i·32 + ln of the step: slice 4i + ln // 8, unit ln % 8 of it
            a(f"{p}    j = c * 32 + {4 * i} + s8")
            a(f"{p}    if j < KS:")
            a(f"{p}        cp16f(sm, sb + ({4 * i} + s8) * {PAD} + e4, W, row * K + j * 32 + e4, K)")
        a(f"{p}cp_commit()")

    for m in range(S - 1):
        issue("    ", str(m))
    _stage_x(a, NW, XS0)
    a("    m = 0")
    a("    while m < M:")
    issue("        ", f"m + {S - 1}")
    a("        cpw()")  # every group but the newest S - 1: step m has landed (this lane's copies)
    a("        syncwarp()")  # ... and every lane's
    _consume(a, "        ", "m", f"(w * {S} + m % {S}) * {SLOT}", XS0, PW0)
    a("        m += 1")
    return "\n".join(L) + "\n"


def _head(NW, inter, params):
    """The kernel's first lines: its indices and the rows of this warp (``r0``, stride ``RS``,
    below ``r1``), ``M`` steps for every warp of the block."""
    rows = ([f"    r0 = b * {NW} + w", f"    RS = G * {NW}", "    r1 = N",
             "    M = ((N + RS - 1) // RS) * nck"] if inter else  # every warp of the grid walks M steps
            ["    rb = (b * N) // G", "    r0 = rb + w", f"    RS = {NW}", "    r1 = ((b + 1) * N) // G",
             f"    M = ((r1 - rb + {NW - 1}) // {NW}) * nck"])  # every warp of the block walks M steps
    return [f"def kern({params}):", "    sm = cuda.shared.array(0, float32, alignment=ALIGN)",
            "    t = cuda.threadIdx.x", "    w = t // 32", "    ln = t % 32", "    b = cuda.blockIdx.x",
            "    G = cuda.gridDim.x", "    KS = K // 32", "    nck = (KS + 31) // 32", *rows,
            "    s8 = ln // 8", "    e4 = (ln % 8) * 4"]


def _locate(a, p, m):
    """Step ``m`` of this warp (``mi``): its row's index among the warp's (``ri``), its chunk of
    32 slices in the row (``c``) and the row (``row``; past the warp's rows where ``row >= r1``)."""
    a(f"{p}mi = {m}")
    a(f"{p}ri = mi // nck")
    a(f"{p}c = mi - ri * nck")
    a(f"{p}row = r0 + ri * RS")


def _stage_x(a, NW, XS0):
    """X into shared memory, slice j at j·PAD (the first weights are in flight), then acc = +0."""
    a("    u = t")
    a("    while u < KS * 8:")
    a("        x0, x1, x2, x3 = ld4gf(X, u * 4, K)")
    a(f"        sts4(sm, {XS0} + (u // 8) * {PAD} + (u % 8) * 4, x0, x1, x2, x3)")
    a(f"        u += {32 * NW}")
    a("    barrier()")
    a("    acc = ZERO")


def _consume(a, p, m, slot, XS0, PW0):
    """Step ``m`` from the warp's tile at word ``slot``: lane L's slice chain, the partials in
    shared memory, every lane adding them to ``acc`` in slice order; a row's last step stores it."""
    _locate(a, p, m)
    a(f"{p}j = c * 32 + ln")
    a(f"{p}p = ZERO")
    a(f"{p}if mi < M and row < r1 and j < KS:")
    a(f"{p}    sb = {slot} + ln * {PAD}")
    a(f"{p}    xb = {XS0} + j * {PAD}")
    for u in range(8):
        a(f"{p}    w0, w1, w2, w3 = lds4(sm, sb + {4 * u})")
        a(f"{p}    x0, x1, x2, x3 = lds4(sm, xb + {4 * u})")
        for e in range(4):
            a(f"{p}    p = fma(x{e}, w{e}, p)")
    a(f"{p}sm[{PW0} + w * 32 + ln] = p")
    a(f"{p}syncwarp()")
    a(f"{p}if mi < M and row < r1:")
    a(f"{p}    n = KS - c * 32")  # the step's slices (all 32 but in a row's last step)
    for g in range(8):  # four partials a load, each added in slice order while it is one of the n
        a(f"{p}    q0, q1, q2, q3 = lds4(sm, {PW0} + w * 32 + {4 * g})")
        for e in range(4):
            a(f"{p}    if {4 * g + e} < n:")
            a(f"{p}        acc = acc + q{e}")
    a(f"{p}    if c == nck - 1:")
    a(f"{p}        if ln == 0:")
    a(f"{p}            out[0, row] = acc")
    a(f"{p}        acc = ZERO")


def ldg_source(NW, S, KMAX, inter=False):
    """The resident GEMV with the weights in registers, as ``gemv`` holds them: each lane keeps
    the next ``S - 1`` steps' eight 16-byte units (``ld.global.nc``, zeros past the rows) in
    registers (the loop unrolled S - 1 times, so that every register slot is named); a step's
    units are stored to the warp's one shared tile, re-read a slice a lane, and the slot is
    refilled with the step S - 1 ahead. ``kern(X, W, out, N, K, Z)``: W flat, Z 16 zero bytes."""
    PF = S - 1
    XS0, PW0 = NW * SLOT, NW * SLOT + (KMAX // 32) * PAD
    L = _head(NW, inter, "X, W, out, N, K, Z")
    a = L.append

    def load(p, k, m):  # step m's units into register slot k (zeros past the warp's rows)
        _locate(a, p, m)
        a(f"{p}ok = mi < M and row < r1")
        for i in range(8):
            a(f"{p}j = c * 32 + {4 * i} + s8")
            a(f"{p}r{k}_{i}_0, r{k}_{i}_1, r{k}_{i}_2, r{k}_{i}_3 = ldgz4(W, row * K + j * 32 + e4, Z, ok and j < KS)")

    for k in range(PF):
        load("    ", k, str(k))
    _stage_x(a, NW, XS0)
    a("    m = 0")
    a("    while m < M:")
    for k in range(PF):
        for i in range(8):  # step m + k into the tile: slice 4i + ln // 8, unit ln % 8
            a(f"        sts4(sm, w * {SLOT} + ({4 * i} + s8) * {PAD} + e4, "
              f"r{k}_{i}_0, r{k}_{i}_1, r{k}_{i}_2, r{k}_{i}_3)")
        load("        ", k, f"m + {k + PF}")
        a("        syncwarp()")
        _consume(a, "        ", f"m + {k}", f"w * {SLOT}", XS0, PW0)
        a("        syncwarp()")  # every lane has read the tile before the next step is stored
    a(f"        m += {PF}")
    return "\n".join(L) + "\n"


def _variants(ap, flag, value, allowed):
    """``value`` split at commas, each one of the two ``allowed`` (else one line, ``ap.error``)."""
    got = value.split(",")
    if any(v not in allowed for v in got):
        ap.error(f"{flag} {value!r}: {allowed[0]}, {allowed[1]} or both (comma-separated)")
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="write the JSON here")
    ap.add_argument("--reps", type=int, default=20, help="graph replays timed (0: the bitwise check alone)")
    ap.add_argument("--warps", type=int, default=8, help="warps a block (one block an SM)")
    ap.add_argument("--stages", default="3,4", help="ring depths to time (comma-separated)")
    ap.add_argument("--blocks", type=int, default=0, help="blocks (0: one an SM)")
    ap.add_argument("--load", default="cp", help="how weights arrive (comma-separated to time both): cp "
                    "(cp.async into a ring in shared memory), ldg (16-byte loads into registers, stored to one tile)")
    ap.add_argument("--rows", default="run", help="how rows are dealt (comma-separated to time both): run (a "
                    "block's contiguous run), turns (the grid's warps in turn: one window of W at a time)")
    add_shape_args(ap)
    args = ap.parse_args(argv)
    try:
        stages = [int(s) for s in args.stages.split(",")]
    except ValueError:
        ap.error(f"--stages {args.stages!r}: comma-separated integers")
    deals = _variants(ap, "--rows", args.rows, ("run", "turns"))
    loads = _variants(ap, "--load", args.load, ("cp", "ldg"))
    if args.reps < 0 or not 1 <= args.warps <= 32 or min(stages) < 2 or args.blocks < 0:
        ap.error("--reps and --blocks >= 0, --warps 1 to 32, --stages >= 2")
    check_shape_args(ap, args)
    sh = shapes(args)
    if any(K % 32 for _, _, K in sh):
        ap.error("every shape's K must be a multiple of 32 (the partial slice's zero fill is not built): "
                 + ", ".join(f"{n} K={K}" for n, _, K in sh))
    KMAX = max(K for _, _, K in sh)
    for S in stages if "cp" in loads else ():
        if 4 * smem_words(args.warps, S, KMAX) > 227 * 1024:
            ap.error(f"--stages {S} with {args.warps} warps: {4 * smem_words(args.warps, S, KMAX)} bytes of shared "
                     "memory, past an SM's 227 KiB")
    if not cuda.is_available():
        ap.error("needs a CUDA GPU (none is visible here)")

    from numba_kernels import cuda as kc
    from numba_kernels import intrin
    from numba_kernels import launch as kl
    from numba_kernels.tags import KernelSource

    dev = cuda.get_current_device()
    sms = getattr(dev, "MULTIPROCESSOR_COUNT", 1)
    G = args.blocks or sms
    rng = np.random.default_rng(0)
    Ws = [cuda.to_device((rng.standard_normal((N, K)) / np.sqrt(K)).astype(F32)) for _, N, K in sh]
    Wf = [w.reshape(w.shape[0] * w.shape[1]) for w in Ws]  # the ldg kernel's flat view
    Z = cuda.to_device(np.zeros(8, F32))
    Xs = [cuda.to_device(rng.standard_normal((1, K)).astype(F32)) for _, _, K in sh]
    want = []
    for i, (_, N, _) in enumerate(sh):
        o = cuda.device_array((1, N), F32)
        kc.gemv(Xs[i], Ws[i], o, 1)
        want.append(o)
    nbytes = sum(4 * N * K for _, N, K in sh)
    T = 32 * args.warps

    def per_shape(launch):
        return [graph_us(lambda _, i=i: launch(i), 1, replays=args.reps) for i in range(len(sh))]

    def six(launch):
        return len(sh) * graph_us(launch, len(sh), replays=args.reps)

    res_rows, ok = [], True
    gemv_row = None
    if args.reps:
        gl = lambda i: kc.gemv(Xs[i], Ws[i], want[i], 1)  # noqa: E731
        gemv_row = {"kernel": "gemv", "shape_us": per_shape(gl), "six_us": six(gl)}
    for load, deal, S in [(v, d, S) for v in loads for d in deals for S in stages]:
        ldg = load == "ldg"
        src = KernelSource(f"resident_gemv_{load}_{deal}_w{args.warps}_s{S}_k{KMAX}",
                           rgemv_source(args.warps, S, KMAX, deal == "turns", ldg), T,
                           smem=4 * smem_words(args.warps, 1 if ldg else S, KMAX))
        k = kl.Kernel(src, {**kl._GEN_NS, "cp_wait_group": intrin.cp_wait_group})
        outs = [cuda.device_array((1, N), F32) for _, N, _ in sh]

        def rl(i, k=k, outs=outs, ldg=ldg):
            n, kk = np.int32(sh[i][1]), np.int32(sh[i][2])
            kl.launch(k, G, T, *((Xs[i], Wf[i], outs[i], n, kk, Z) if ldg else (Xs[i], Ws[i], outs[i], n, kk)))

        bitwise = {}
        row = {"kernel": "resident", "load": load, "rows": deal, "stages": S, "warps": args.warps, "blocks": G,
               "smem_bytes": src.smem, "in_flight_kb_per_sm": (S - 1) * args.warps * 4}
        try:  # a configuration the SM cannot hold (registers x threads) is reported, not fatal
            rl(0)
            cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (the driver's launch error)
            regs = getattr(k.disp, "get_regs_per_thread", lambda: None)()
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]} (registers a thread: {regs})"
            ok = False
            res_rows.append(row)
            continue
        for i, (name, N, _) in enumerate(sh):
            outs[i].copy_to_device(np.full((1, N), np.nan, F32))  # poisoned: every output must be written
            rl(i)
            cuda.synchronize()
            bitwise[name] = bool(np.array_equal(outs[i].copy_to_host().view(np.uint32),
                                                want[i].copy_to_host().view(np.uint32)))
        ok &= all(bitwise.values())
        row["bitwise"] = bitwise
        if args.reps:
            row.update(shape_us=per_shape(rl), six_us=six(rl))
        res_rows.append(row)
    res = {"kind": "probe-resident-gemv", "device": device_name(), "sms": sms,
           "commit": os.environ.get("PRIMEWALK_COMMIT"), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "args": vars(args), "shapes": [{"name": s[0], "N": s[1], "K": s[2]} for s in sh], "bytes": nbytes,
           "gemv": gemv_row, "rows": res_rows}
    names = [s[0] for s in sh]
    print(f"{res['device']}: {len(sh)} GEMVs, {nbytes / 1e6:.1f} MB")
    for r in ([gemv_row] if gemv_row else []) + res_rows:
        what = ("gemv" if r["kernel"] == "gemv" else
                f"resident ({r['load']}, {r['rows']}), {r['warps']} warps, {r['stages']} stages")
        line = f"{what}: "
        if "six_us" in r:
            line += (f"six as one graph {r['six_us']:.1f} us ({nbytes / r['six_us'] / 1e3:.0f} GB/s); "
                     + ", ".join(f"{n} {u:.1f}" for n, u in zip(names, r["shape_us"])))
        if "error" in r:
            line += "not run: " + r["error"]
        if "bitwise" in r:
            line += " bitwise against gemv: " + ", ".join(f"{n} {'yes' if v else 'NO'}" for n, v in r["bitwise"].items())
        print(line)
    write_text_atomic(args.out, json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
