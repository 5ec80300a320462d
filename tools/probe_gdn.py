#!/usr/bin/env python3
"""Device probe for the wider GDN recurrence (kernels_proto/gdn.py) against today's ``_gdn_fast_k``.

    PYTHONPATH=. python tools/probe_gdn.py --out DIR          # on the GPU (bench-8l GDN shapes)
    PYTHONPATH=. python tools/probe_gdn.py --out DIR --sim    # here: CUDA simulator, tiny shapes

Every variant is first checked bit for bit against the CPU twin (``numba_kernels.cpu.gdn_recurrence``):
the full bench shape at 300 rows and at 8 rows with capture, heads 0-3 of a 4096-row run (heads are
independent, so the twin runs on that slice), and odd shapes (dk 96 = a phantom slice, dv 80 = a
partial column block, vpk 3, chunk edges; dk 256). Then each is timed with CUDA events on the bench
shape (Hk 16, Hv 32, dk = dv = 128, vpk 2) at T = 1, 4, 8 rows (with and without capture) and 4096,
16384 rows. Small T: a spin kernel holds the stream while 20 launches are queued behind it (so Numba's
Python launch cost is not timed), each launch on another of 40 state copies (80 MB > L2: the states
come from HBM as in a real step), median of 3. Large T: median of 3 single launches after a warm-up.
Writes DIR/probe_gdn.json; prints a table. A failing variant is reported in one line and skipped.
A time budget (--budget seconds) skips the least important work when exceeded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, mode, warps per block, chunk rows, also with capture); the first is the proposed default
VARIANTS = [
    ("rot-w4-t8", "rot", 4, 8, True),
    ("pipe-w4-t8", "pipe", 4, 8, True),
    ("rot-w2-t16", "rot", 2, 16, False),
    ("rot-w4-t16", "rot", 4, 16, False),
    ("rot-w1-t8", "rot", 1, 8, False),
    ("fuse-w4-t8", "fuse", 4, 8, False),
    ("plain-w4-t8", "plain", 4, 8, False),
]
OLD = "old(_gdn_fast_k)"
# µs per row per layer predicted from the SASS (tools/sass_gdn.py: ptxas stall counts + scoreboard waits,
# one warp per SM sub-partition, 1.9 GHz; the per-chunk staging and barrier add ~5-10 %)
PREDICTED_US_PER_ROW_4096 = {"rot-w4-t8": 0.13, "pipe-w4-t8": 0.16, "rot-w2-t16": 0.13, "rot-w4-t16": 0.16,
                             "rot-w1-t8": 0.13, "fuse-w4-t8": 0.17, "plain-w4-t8": 0.23, OLD: 4.5}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for probe_gdn.json")
    ap.add_argument("--sim", action="store_true", help="CUDA simulator, tiny shapes (no GPU)")
    ap.add_argument("--budget", type=float, default=80.0, help="seconds; later work is skipped past it")
    ap.add_argument("--variants", nargs="*", default=None, help="names from VARIANTS (default: all)")
    args = ap.parse_args(argv)
    if args.sim:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        args.budget = float("inf")  # the simulator is slow; the budget is for the GPU
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
    sys.path.insert(0, ROOT)
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    t_start = time.time()

    from numba import cuda

    from kernels_proto import gdn
    from numba_kernels import cpu as kp
    from numba_kernels import cuda as kc  # today's fast kernel: kc.gdn_recurrence (cuda_gdn._gdn_fast_k)

    F32 = np.float32
    sim = args.sim
    variants = [v for v in VARIANTS if args.variants is None or v[0] in args.variants]
    try:
        dev = cuda.get_current_device()
        devname = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    except Exception:  # noqa: BLE001
        devname = "?"
    res = {"device": devname, "sim": sim, "variants": {}, "bitwise": [], "timing": [], "failures": [],
           "predicted_us_per_row_4096": PREDICTED_US_PER_ROW_4096}
    left = lambda: args.budget - (time.time() - t_start)  # noqa: E731

    def fail(what, e):
        line = f"FAIL {what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(line, flush=True)
        res["failures"].append(line)
        if os.environ.get("PROBE_TRACEBACK"):
            traceback.print_exc()

    # ---- shapes
    if sim:
        HK, NV, DK, DV = 1, 2, 64, 16
        T_SMALL, T_LARGE, T_CHECK, T_SLICE = (1, 3), (20,), 20, 20
        NROT = 2
        variants = [v for v in variants if v[0] in ("rot-w4-t8", "pipe-w4-t8", "fuse-w4-t8")]
    else:
        HK, NV, DK, DV = 16, 32, 128, 128
        T_SMALL, T_LARGE, T_CHECK, T_SLICE = (1, 4, 8), (4096, 16384), 300, 4096
        NROT = 40  # 80 MB of states: more than the 60 MB L2
    VPK, KD = NV // HK, HK * DK
    VO = 2 * KD  # v columns start after q and k in the conv output, as in the engine
    rng = np.random.default_rng(0)

    def inputs(T, hk, nv, dk, dv, vo, seed):
        r = np.random.default_rng(seed)
        kd = hk * dk

        def l2(x, scale=1.0):
            x = x.reshape(T, hk, dk)
            x = x / np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)
            return (scale * x).reshape(T, kd).astype(F32)

        q = l2(r.standard_normal((T, kd)), dk ** -0.5)
        k = l2(r.standard_normal((T, kd)))
        V = np.zeros((T, vo + nv * dv), F32)
        V[:, vo:] = r.standard_normal((T, nv * dv))
        g = (-r.uniform(0.02, 1.0, (T, nv))).astype(F32)
        beta = r.uniform(0.05, 1.0, (T, nv)).astype(F32)
        S = (0.1 * r.standard_normal((nv, dk, dv))).astype(F32)
        return q, k, V, g, beta, S

    def run_variant(name, a):
        """a = twin-style args (device arrays where arrays)."""
        if name == OLD:
            kc.gdn_recurrence(*a)
        else:
            _, mode, wpb, tc, _ = next(v for v in variants if v[0] == name)
            gdn.gdn_recurrence(*a, wpb=wpb, tc=tc, mode=mode)

    def twin(a):
        host = [x.copy() if isinstance(x, np.ndarray) else x for x in a]
        kp.gdn_recurrence(*host)
        return host

    def same(x, y):
        return bool(np.array_equal(np.ascontiguousarray(x).view(np.uint32), np.ascontiguousarray(y).view(np.uint32)))

    names = [v[0] for v in variants]
    capnames = [v[0] for v in variants if v[4]]

    def check(cname, a, name, outs, want):
        """Run variant ``name`` on twin-style host args ``a``; compare args ``outs`` with ``want``."""
        d = [cuda.to_device(x) if isinstance(x, np.ndarray) else x for x in a]
        if isinstance(name, tuple):
            _, mode, tc = name
            gdn.gdn_recurrence(*d, wpb=4, tc=tc, mode=mode)
            name = f"{mode}-w4-tc{tc or 'auto'}"
        else:
            run_variant(name, d)
        cuda.synchronize()
        got = {i: d[i].copy_to_host() for i in outs}
        nbad = {i: int((got[i].view(np.uint32) != want[i].view(np.uint32)).sum()) for i in outs}
        ok = not any(nbad.values())
        res["bitwise"].append(dict(check=cname, variant=name, ok=ok, mismatches=nbad))
        print(f"bitwise {cname} {name}: {'OK' if ok else 'DIFF ' + str(nbad)}", flush=True)
        return ok

    # ---- the check problems (twin results computed once, on first use)
    T8 = T_SMALL[-1]
    probs = {}

    def prob(key):
        if key not in probs:
            t0 = time.time()
            if key == "T300":
                q, k, V, g, beta, S0 = inputs(T_CHECK, HK, NV, DK, DV, VO, 1)
                a = [q, k, V, VO, g, beta, S0, np.zeros((T_CHECK, NV * DV), F32), T_CHECK, DK, DV, VPK,
                     np.zeros((1, 1, 1, 1), F32), False]
                probs[key] = (f"bench T{T_CHECK}", a, (6, 7), twin(a))
            elif key == "T8cap":
                q, k, V, g, beta, S0 = inputs(T8, HK, NV, DK, DV, VO, 2)
                a = [q, k, V, VO, g, beta, S0, np.zeros((T8, NV * DV), F32), T8, DK, DV, VPK,
                     np.zeros((T8, NV, DK, DV), F32), True]
                probs[key] = (f"bench T{T8} capture", a, (6, 7, 12), twin(a))
            else:  # ("odd", hk, nv, dk, dv, T, vo)
                _, hk, nv, dk, dv, T, vo = key
                q, k, V, g, beta, S0 = inputs(T, hk, nv, dk, dv, vo, 3)
                a = [q, k, V, vo, g, beta, S0, np.zeros((T, nv * dv), F32), T, dk, dv, nv // hk,
                     np.zeros((T, nv, dk, dv), F32), True]
                probs[key] = (f"odd hk{hk} nv{nv} dk{dk} dv{dv} T{T} capture", a, (6, 7, 12), twin(a))
            print(f"twin {probs[key][0]}: {time.time() - t0:.1f} s", flush=True)
        return probs[key]

    # ---- the timing data (bench shape)
    TMAX = max(T_LARGE)
    base = min(TMAX, T_SLICE)
    q, k, V, g, beta, S0 = inputs(base, HK, NV, DK, DV, VO, 4)
    reps = TMAX // base
    dq = cuda.to_device(np.tile(q, (reps, 1)))
    dk_ = cuda.to_device(np.tile(k, (reps, 1)))
    dV = cuda.to_device(np.tile(V, (reps, 1)))
    dg = cuda.to_device(np.tile(g, (reps, 1)))
    dbeta = cuda.to_device(np.tile(beta, (reps, 1)))
    dout = cuda.device_array((TMAX, NV * DV), F32)
    dummy = cuda.to_device(np.zeros((1, 1, 1, 1), F32))
    dS = [cuda.to_device(S0) for _ in range(NROT)]
    dcap = [cuda.device_array((T8, NV, DK, DV), F32) for _ in range(4 if not sim else 1)]
    print(f"data ready: {time.time() - t_start:.1f} s", flush=True)

    # heads 0..hs-1 of a T_SLICE-row run on the timing data, against the twin on that slice
    hs = 4 if not sim else NV
    ks = hs // VPK
    a_slice = [q[:, :ks * DK].copy(), k[:, :ks * DK].copy(), V[:, VO:VO + hs * DV].copy(), 0, g[:, :hs].copy(),
               beta[:, :hs].copy(), S0[:hs].copy(), np.zeros((base, hs * DV), F32), base, DK, DV, VPK,
               np.zeros((1, 1, 1, 1), F32), False]
    want_slice = []

    def check_slice(name):
        if not want_slice:
            t0 = time.time()
            want_slice.append(twin(a_slice))
            print(f"twin heads 0-{hs - 1} T{base}: {time.time() - t0:.1f} s", flush=True)
        S = cuda.to_device(S0)
        run_variant(name, [dq, dk_, dV, VO, dg, dbeta, S, dout, base, DK, DV, VPK, dummy, False])
        cuda.synchronize()
        o = dout[:base].copy_to_host()[:, :hs * DV]
        ok = same(o, want_slice[0][7]) and same(S.copy_to_host()[:hs], want_slice[0][6])
        res["bitwise"].append(dict(check=f"bench T{base} heads 0-{hs - 1}", variant=name, ok=ok))
        print(f"bitwise bench T{base} heads 0-{hs - 1} {name}: {'OK' if ok else 'DIFF'}", flush=True)
        return ok

    # ---- timing
    spin_n = 3_000_000 if not sim else 10

    @cuda.jit
    def spin(x, n):
        acc = x[0]
        for _ in range(n):
            acc = acc * F32(0.9999999) + F32(1e-7)
        x[0] = acc

    spin_buf = cuda.to_device(np.ones(1, F32))
    start, stop = cuda.event(), cuda.event()

    def time_small(name, T, capture, n=20 if not sim else 2, trials=3 if not sim else 1):
        def args_for(i):
            cap = dcap[i % len(dcap)] if capture else dummy
            return [dq, dk_, dV, VO, dg, dbeta, dS[i % NROT], dout, T, DK, DV, VPK, cap, capture]
        run_variant(name, args_for(0))  # compile / warm
        cuda.synchronize()
        ts = []
        for tr in range(trials):
            spin[1, 1](spin_buf, spin_n)
            start.record()
            for i in range(n):
                run_variant(name, args_for(tr * n + i + 1))
            stop.record()
            stop.synchronize()
            ts.append(start.elapsed_time(stop) / n)
        return float(np.median(ts)), ts

    def time_large(name, T, trials=3 if not sim else 1):
        a = [dq, dk_, dV, VO, dg, dbeta, dS[0], dout, T, DK, DV, VPK, dummy, False]
        run_variant(name, a)
        cuda.synchronize()
        ts = []
        for _ in range(trials):
            start.record()
            run_variant(name, a)
            stop.record()
            stop.synchronize()
            ts.append(start.elapsed_time(stop))
        return float(np.median(ts)), ts

    cases = [(T, c) for T in T_SMALL for c in (False, True)] + [(T, False) for T in T_LARGE]
    old_ms = {}

    def time_all(name):
        for T, capture in cases:
            if capture and name != OLD and name not in capnames:
                continue
            if left() < 0:
                res["timing"].append(dict(variant=name, T=T, capture=capture, skipped="budget"))
                continue
            try:
                ms, ts = time_large(name, T) if T > max(T_SMALL) else time_small(name, T, capture)
                row = dict(variant=name, T=T, capture=capture, ms=ms, trials_ms=ts, us_per_row=1e3 * ms / T)
                if T > max(T_SMALL):
                    row["bench8l_prime_ms"] = 6 * ms  # 6 GDN layers of bench-8l
                if name == OLD:
                    old_ms[(T, capture)] = ms
                elif old_ms.get((T, capture), 0) > 0 and ms > 0:
                    row["speedup_vs_old"] = old_ms[(T, capture)] / ms
                res["timing"].append(row)
                print(f"time {name} T{T}{' cap' if capture else ''}: {ms:.4f} ms = {row['us_per_row']:.3f} µs/row"
                      + (f"  x{row['speedup_vs_old']:.2f}" if "speedup_vs_old" in row else ""), flush=True)
            except Exception as e:  # noqa: BLE001
                fail(f"timing {name} T{T} cap{capture}", e)
                return

    # ---- one unit per variant, most important first: check bit for bit, then time; the budget
    # cuts from the end (odd-shape checks come after the two main modes)
    odd = ([("odd", 3, 9, 96, 80, 37, 5), ("odd", 1, 2, 256, 64, 21, 0)] if not sim
           else [("odd", 1, 3, 96, 10, 7, 5)])
    units = [("variant", OLD)] + [("variant", n) for n in names[:2]]  # the anchor first: speed-ups need it
    units += [("odd", (key, ("odd", "rot", 4 if i == 0 else None))) for i, key in enumerate(odd)]
    units += [("odd", (odd[0], ("odd", "pipe", None)))] if "pipe-w4-t8" in names else []
    units += [("variant", n) for n in names[2:]]
    for kind, what in units:
        if left() < 0:
            res["failures"].append(f"skipped (budget): {kind} {what}")
            print(f"skipped (budget): {kind} {what}", flush=True)
            continue
        t0 = time.time()
        try:
            if kind == "odd":
                key, who = what
                cname, a, outs, want = prob(key)
                check(cname, a, who, outs, want)
                continue
            name = what
            ok = True
            cname, a, outs, want = prob("T300")
            ok &= check(cname, a, name, outs, want)
            if name == OLD or name in capnames:
                cname, a, outs, want = prob("T8cap")
                ok &= check(cname, a, name, outs, want)
            if name != OLD:
                ok &= check_slice(name)
            res.setdefault("compile_and_check_s", {})[name] = round(time.time() - t0, 2)
            if not ok:
                res["timing"].append(dict(variant=name, skipped="failed the bitwise check"))
                continue
            time_all(name)
        except Exception as e:  # noqa: BLE001
            fail(f"{kind} {what}", e)

    # ---- static facts of the compiled kernels
    for name, mode, wpb, tc, withcap in variants:
        for cap in ((False, True) if withcap else (False,)):
            try:
                kern, spec = gdn.make_kernel(DK, DV, wpb, tc, mode, cap)
                info = dict(spec)
                if not sim:
                    for attr in ("get_regs_per_thread", "get_shared_mem_per_block", "get_local_mem_per_thread"):
                        v = getattr(kern, attr)()
                        info[attr[4:]] = list(v.values())[0] if isinstance(v, dict) and v else v
                res["variants"][name + ("+cap" if cap else "")] = info
            except Exception as e:  # noqa: BLE001
                fail(f"static {name}", e)

    res["elapsed_s"] = time.time() - t_start
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "probe_gdn.json")
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=1, default=str)
    os.replace(path + ".tmp", path)

    # ---- table
    print(f"\n{'variant':<18}{'T':>7}{'cap':>5}{'ms':>11}{'µs/row':>9}{'x old':>8}  bitwise")
    bw = {}
    for b in res["bitwise"]:
        bw.setdefault(b["variant"], []).append(b["ok"])
    for row in res["timing"]:
        if "ms" not in row:
            print(f"{row['variant']:<18}{row.get('T', ''):>7}{'':>5}  skipped: {row['skipped']}")
            continue
        oks = bw.get(row["variant"], [])
        tag = "OK" if oks and all(oks) else ("DIFF" if any(o is False for o in oks) else "-")
        print(f"{row['variant']:<18}{row['T']:>7}{'y' if row['capture'] else '':>5}{row['ms']:>11.4f}"
              f"{row['us_per_row']:>9.3f}{row.get('speedup_vs_old', float('nan')):>8.2f}  {tag}")
    nbad = sum(1 for b in res["bitwise"] if b["ok"] is False)
    print(f"bitwise: {sum(1 for b in res['bitwise'] if b['ok'])} OK, {nbad} DIFF; failures: {len(res['failures'])}; "
          f"{res['elapsed_s']:.1f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
