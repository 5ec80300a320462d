#!/usr/bin/env python3
"""Decode-step kernels on the GPU, in isolation: the GEMV (``numba_kernels.linear.gemv``, its
configuration per (N, K, R) from ``gemv_pick``; float32 and bf16 weights) at the bench-8l decode
shapes and rmsnorm, each timed with CUDA events around a CUDA graph of repeated launches (the
device's time, not the host's launch rate); the GEMV and the GEMM
checked bit for bit against the CPU twin on ragged shapes (1-8 rows, the GEMM just above).
Writes JSON; exit 1 when a kernel differs.

    PYTHONPATH=. python tools/decode_kernels.py --out decode-kernels.json [--sweep]

``--sweep`` also times GEMV configurations other than ``gemv_pick``'s on the decode shapes whose
N is the hidden size (2,048 outputs: the DeltaNet's out projection, the MLP's down projection,
attention's o; the slowest GEMVs of a step per byte), each checked bit for bit against the CPU
twin first: the data for choosing their configuration. ``--sweep-bf16`` sweeps bf16 weights
instead (a wider grid, and the large-N shapes too: bf16 GEMVs stream fewer bytes per output).
``--sweep-search line`` searches the grid one parameter at a time from ``gemv_pick``'s
configuration (:func:`line_search`) instead of timing all of it: each configuration compiles its
own kernel, and the bf16 grid (144 points a shape before the invalid ones are dropped) finished
no shape within the time two device calls had left on the H200.
``--sweep-large`` adds the large-N shapes (gdn in, mlp gate+up, attention's qkv, the lm head) to a
float32 sweep: a verify step's 2-5 rows run those 6-37 % slower than one row (Nsight Compute at
6356ab9, ``receipts/probes/README.md``), e.g. ``--sweep --sweep-large --sweep-rows 1,2,4,5``.
``--sweep-attn`` times the split-KV decode attention's block variants (``ATT_SPLIT_VARIANTS``) on
bench-8l's attention (16 query heads, 2 KV heads, head_dim 256) at ``--attn-ctx`` keys for each
of ``--sweep-rows`` rows, each bitwise against the CPU twin first: the default block holds all
R · 8 query vectors of a KV head (5 rows: the 64-vector block, 48 µs for a step's two layers at
6356ab9 against 20 at one row), a smaller one takes the rows in several blocks.
"""

import argparse
import json
import sys

import numpy as np

from _cli import int_list
from _timing import graph_us
from harness.atomic import write_text_atomic


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--sweep", action="store_true", help="also time other GEMV configurations on the N = 2,048 shapes")
    ap.add_argument("--sweep-rows", default="1,5", type=int_list(1, 8, "row counts"),
                    help="the sweep's row counts (comma-separated, 1-8)")
    ap.add_argument("--sweep-bf16", action="store_true",
                    help="with --sweep: bf16 weights instead (the N = 2,048 shapes and the large-N ones, gdn in "
                         "and mlp gate+up)")
    ap.add_argument("--sweep-large", action="store_true",
                    help="with --sweep: also the large-N shapes (gdn in, mlp gate+up, attention qkv, the lm head)")
    ap.add_argument("--sweep-search", choices=("grid", "line"), default="grid",
                    help="with --sweep: every configuration of the grid, or a line search from gemv_pick's (one "
                         "parameter at a time over its values, the others at the best so far, until a pass changes "
                         "nothing; each configuration compiles its own kernel: the bf16 grid, 144 points a shape "
                         "before the invalid ones are dropped, finished no shape within two device calls' time)")
    ap.add_argument("--sweep-attn", action="store_true",
                    help="time the split-KV attention's block variants at --sweep-rows rows (bench-8l's attention)")
    ap.add_argument("--attn-ctx", type=int, default=512, help="--sweep-attn: keys in the cache before the rows")
    ap.add_argument("--cold-mb", type=float, default=256.0,
                    help="each timed launch reads a weight copy other than the previous launches' until this many MB "
                         "have been read (5x the H200's 50 MB L2: weights come from HBM, as in a decode step); 0: one "
                         "copy, L2-warm for weights that fit")
    args = ap.parse_args(argv)
    sweep_rows = args.sweep_rows
    if (args.sweep_large or args.sweep_bf16 or args.sweep_search != "grid") and not args.sweep:
        ap.error("--sweep-large, --sweep-bf16 and --sweep-search go with --sweep")
    if args.attn_ctx < 1:
        ap.error("--attn-ctx must be at least 1")
    if args.reps < 1 or args.cold_mb < 0:
        ap.error("--reps must be at least 1 and --cold-mb not negative")
    from numba import cuda

    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    from numba_kernels import dispatch

    default = "linear"  # the dispatch table's pick (gemv up to GEMV_MAX_ROWS rows, gemm above)
    VERSIONS = ("linear", "gemv", "gemm")
    gemv = {"linear": kc.linear, "gemv": kc.gemv, "gemm": kc.gemm}

    def bf16(W):
        return (W.view(np.uint32) >> 16).astype(np.uint16)

    rng = np.random.default_rng(0)
    res = {"device": cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes)
           else str(cuda.get_current_device().name), "bitwise": [], "timing": []}
    ok = True
    cases = [(1, 2048, 8448), (4, 5632, 2048), (2, 1100, 77), (3, 64, 260), (1, 4096, 300), (4, 33, 5),
             (5, 2048, 9000), (8, 2048, 40000), (8, 1101, 33), (dispatch.GEMV_MAX_ROWS + 1, 2048, 300)]
    for (R, K, N), half in [(c, False) for c in cases] + [(c, True) for c in cases[:4] + cases[6:8]]:
        X = rng.standard_normal((R, K)).astype(np.float32)
        W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        if half:
            W = bf16(W)
        want = np.zeros((R, N), np.float32)
        kp.linear(X, W, want, R)
        row = {"R": R, "K": K, "N": N, "bf16": half}
        for ver in VERSIONS:
            if ver == "gemv" and R > dispatch.GEMV_MAX_ROWS:
                continue
            d = cuda.device_array((R, N), np.float32)
            gemv[ver](cuda.to_device(X), cuda.to_device(W), d, R)
            row[ver] = bool(np.array_equal(d.copy_to_host().view(np.uint32), want.view(np.uint32)))
            ok &= row[ver]
        res["bitwise"].append(row)
        print("bitwise", row, flush=True)
    def timed(fn, Ws=(None,)):
        """µs of device time per call of ``fn`` (kernel launches only; ``fn(W)`` with the copies
        ``Ws`` of a weight in turn, see :func:`copies`): ``args.reps`` calls in one CUDA graph
        (:func:`_timing.graph_us`; eager timings of the small kernels measured the launches:
        every configuration ~92 µs in the sweep of c0b5f5b)."""
        fn(Ws[0])
        cuda.synchronize()
        return graph_us(lambda i: fn(Ws[i % len(Ws)]), args.reps)

    # bench-8l decode GEMVs (R = 1): qkvz+ba, out, gate+up, down, attention qkv, o, lm head
    for name, K, N in [("gdn in", 2048, 12288 + 64), ("gdn out", 4096, 2048), ("mlp gate+up", 2048, 11264),
                       ("mlp down", 5632, 2048), ("attn qkv", 2048, 8192 + 1024), ("attn o", 4096, 2048),
                       ("lm head", 2048, 151936)]:
        W32 = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        row = {"op": name, "K": K, "N": N, "bytes": 4 * K * N}
        for R in (1, 5):
            X = cuda.to_device(rng.standard_normal((R, K)).astype(np.float32))
            y = cuda.device_array((R, N), np.float32)
            for wname, Wh in (("f32", W32), ("bf16", bf16(W32))):
                Ws = copies(Wh, args.cold_mb)
                us = timed(lambda W: kc.gemv(X, W, y, R), Ws)
                row[f"gemv_{wname}_R{R}_us"] = us
                row[f"gemv_{wname}_R{R}_TBps"] = Wh.nbytes / us / 1e6
                row[f"gemv_{wname}_R{R}_copies"] = len(Ws)
                del Ws
        res["timing"].append(row)
        print("timing", row, flush=True)
    if args.sweep:
        large = SWEEP_LARGE + SWEEP_LARGE_F32 if args.sweep_large else SWEEP_LARGE if args.sweep_bf16 else ()
        # the large shapes first: a sweep cut short by a timeout still has them
        ok &= sweep(res, rng, timed, shapes=large + SWEEP_SHAPES,
                    row_counts=sweep_rows, cold_mb=args.cold_mb, bf16=args.sweep_bf16, search=args.sweep_search,
                    save=lambda: write_text_atomic(args.out, json.dumps(res, indent=1) + "\n"))
    if args.sweep_attn:
        ok &= sweep_attn(res, rng, timed, sweep_rows, args.attn_ctx)
    X = cuda.to_device(rng.standard_normal((1, 2048)).astype(np.float32))
    w = cuda.to_device(rng.standard_normal(2048).astype(np.float32))
    y = cuda.device_array((1, 2048), np.float32)
    res["rmsnorm_R1_N2048_us"] = timed(lambda _: kc.rmsnorm(X, w, np.float32(1e-6), y, 0, 1))
    print("rmsnorm R1 N2048 us", res["rmsnorm_R1_N2048_us"], flush=True)
    res["default"], res["default_bitwise"] = default, bool(ok)
    write_text_atomic(args.out, json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


SWEEP_SHAPES = (("gdn out", 4096, 2048), ("mlp down", 5632, 2048), ("attn o", 4096, 2048))
SWEEP_LARGE = (("gdn in", 2048, 12352), ("mlp gate+up", 2048, 11264))
SWEEP_LARGE_F32 = (("attn qkv", 2048, 9216), ("lm head", 2048, 151936))  # with --sweep-large


def copies(W, cold_mb):
    """Device copies of the host array ``W``, enough that cycling through them reads at least
    ``cold_mb`` MB before a copy comes round again (one when ``cold_mb`` is 0 or W is larger):
    in a step each layer's weights come from HBM once, while a weight that fits the L2 and is
    read launch after launch stays there (the sweep of 0fa0a4d ran at 4.7 TB/s, above the copy
    bandwidth, on 34-46 MB weights)."""
    from numba import cuda

    n = max(1, -(-int(cold_mb * 1e6) // max(W.nbytes, 1)))
    return [cuda.to_device(W) for _ in range(min(n, 64))]


def sweep(res, rng, timed, shapes=SWEEP_SHAPES, row_counts=(1, 5), cold_mb=0.0, bf16=False, search="grid",
          save=None) -> bool:
    """Time GEMV configurations on decode shapes (``row_counts`` rows, float32 weights or, with
    ``bf16``, bf16 bits, read from ``copies(W, cold_mb)``): each bitwise against the CPU twin, then
    timed; ``res["sweep"]`` gets one row per (shape, rows, configuration), the default's marked.
    The bf16 grid adds three chunks in flight and 4-8 output groups per block (half the bytes per
    output: more loads in flight per byte). ``search`` "line": :func:`line_search` over the same
    space instead of all of it. ``save()``, when given, runs after each (shape, rows): a sweep cut
    short by a timeout leaves what it measured."""
    import dataclasses
    import itertools

    from numba import cuda

    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    from numba_kernels.linear import GEMV_LARGE_N, gemv_pick

    ok, rows = True, res.setdefault("sweep", [])
    for R, (name, K, N) in itertools.product(row_counts, shapes):  # row count by row count: each compiles its grid once
        X = rng.standard_normal((R, K)).astype(np.float32)
        W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        if bf16:
            W = (W.view(np.uint32) >> 16).astype(np.uint16)
        want = np.zeros((R, N), np.float32)
        kp.linear(X, W, want, R)
        dX, Ws, d = cuda.to_device(X), copies(W, cold_mb), cuda.device_array((R, N), np.float32)
        dW = Ws[0]
        default = gemv_pick(N, K, R, bf16=bf16)
        space = ((4, 8), (1, 2, 4, 8), (1, 4, 8), (1, 2, 3), (1, 2)) if bf16 else \
            ((4, 8), (2, 4, 8), (1, 2), (1, 2), (1, 2)) if N >= GEMV_LARGE_N else \
            ((4, 8), (1, 2), (4, 8, 16), (1, 2), (1, 2))  # large N: the output-group family gemv_pick uses there
        tried = {}  # name -> µs (None: not valid, or not bitwise)

        def measure(fields):
            nonlocal ok
            cfg = dataclasses.replace(default, **dict(zip(SWEEP_FIELDS, fields)))
            try:
                cfg.check()
            except ValueError:
                return None
            if cfg.name() in tried:
                return tried[cfg.name()]
            kc.gemv(dX, dW, d, R, cfg=cfg)
            same = bool(np.array_equal(d.copy_to_host().view(np.uint32), want.view(np.uint32)))
            ok &= same
            us = timed(lambda W: kc.gemv(dX, W, d, R, cfg=cfg), Ws) if same else None
            rows.append({"op": name, "K": K, "N": N, "R": R, "bf16": bf16, "cfg": cfg.name(), "default": cfg == default,
                         "copies": len(Ws), "bitwise": same, "us": us, "search": search,
                         "TBps": None if us is None else W.nbytes / us / 1e6})
            tried[cfg.name()] = us
            return us

        start = tuple(getattr(default, f) for f in SWEEP_FIELDS)
        measure(start)
        if search == "line":
            line_search(measure, start, space)
        else:
            for fields in itertools.product(*space):
                measure(fields)
        best = min((r for r in rows if r["op"] == name and r["R"] == R and r["us"]), key=lambda r: r["us"])
        dflt = next(r for r in rows if r["op"] == name and r["R"] == R and r["default"])
        print(f"sweep {name} R{R}: default {dflt['cfg']} {dflt['us']:.1f} us; best {best['cfg']} {best['us']:.1f} us "
              f"({best['TBps']:.2f} TB/s)", flush=True)
        if save is not None:
            save()
    return ok


SWEEP_FIELDS = ("OW", "NOG", "NG", "PF", "MO")  # the GEMV configuration's fields a sweep varies, in its space's order


def line_search(measure, start, space, passes=3):
    """Coordinate descent over ``space`` (one tuple of values per field) from ``start``:
    each field in turn takes each of its values with the others at the best point so far, and
    the best point moves to the fastest; passes repeat until one moves nothing (at most
    ``passes``). ``measure(point)`` returns µs, or None for a point that is not valid (it is
    skipped). Returns the best point. ~sum(len(values)) points a pass instead of the grid's
    product; a point asked again (the best one, each pass) is ``measure``'s to cache."""
    best, best_us = tuple(start), measure(tuple(start))
    for _ in range(passes):
        moved = False
        for i, values in enumerate(space):
            for v in values:
                p = best[:i] + (v,) + best[i + 1:]
                if p == best:
                    continue
                us = measure(p)
                if us is not None and (best_us is None or us < best_us):
                    best, best_us, moved = p, us, True
        if not moved:
            break
    return best


def sweep_attn(res, rng, timed, row_counts, ctx, hq=16, hkv=2, D=256) -> bool:
    """The split-KV attention (``attention_split``) with each block variant of
    ``ATT_SPLIT_VARIANTS`` that fits, on R query rows at positions ctx .. ctx + R - 1 (a verify
    step's rows after a ctx-token context): bitwise against the CPU twin, then timed;
    ``res["sweep_attn"]`` gets one row per (rows, variant), the default's marked."""
    from numba import cuda

    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc
    from numba_kernels.attention import ATT_SPLIT_VARIANTS, split_config

    ok, rows = True, res.setdefault("sweep_attn", [])
    scale = np.float32(D ** -0.5)
    for R in row_counts:
        cap = ctx + R
        Q = rng.standard_normal((R, hq * D)).astype(np.float32)
        K = rng.standard_normal((cap, hkv * D)).astype(np.float32)
        V = rng.standard_normal((cap, hkv * D)).astype(np.float32)
        want = np.zeros((R, hq * D), np.float32)
        kp.attention(Q, K, V, want, ctx, R, hq, hkv, D, scale)
        dQ, dK, dV, d = cuda.to_device(Q), cuda.to_device(K), cuda.to_device(V), cuda.device_array((R, hq * D), np.float32)
        default = split_config(R, hq, hkv, D).name
        for v in ATT_SPLIT_VARIANTS:
            try:
                cfg = split_config(R, hq, hkv, D, variant=v)
            except ValueError:
                continue
            d.copy_to_device(np.zeros((R, hq * D), np.float32))
            ran = kc.attention_split(dQ, dK, dV, d, ctx, R, hq, hkv, D, scale, cfg=cfg)
            same = bool(ran) and bool(np.array_equal(d.copy_to_host().view(np.uint32), want.view(np.uint32)))
            ok &= same
            us = timed(lambda _: kc.attention_split(dQ, dK, dV, d, ctx, R, hq, hkv, D, scale, cfg=cfg)) if same else None
            rows.append({"R": R, "ctx": ctx, "variant": v, "default": v == default, "bitwise": same, "us": us})
        best = min((r for r in rows if r["R"] == R and r["us"]), key=lambda r: r["us"])
        dflt = next(r for r in rows if r["R"] == R and r["default"])
        print(f"sweep attn R{R} ctx {ctx}: default {dflt['variant']} {dflt['us']:.1f} us; "
              f"best {best['variant']} {best['us']:.1f} us", flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(main())
