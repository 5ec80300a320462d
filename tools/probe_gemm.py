"""Probe: the fixed-order GEMM prototypes (``kernels_proto/gemm.py``) on a GPU.

    python tools/probe_gemm.py --out DIR          # on the GPU host (< 90 s)
    python tools/probe_gemm.py --out DIR --sim    # under Numba's CUDA simulator, tiny shapes

For each variant (``kernels_proto.gemm.VARIANTS``, float32 weights; then bf16 weights for the
``rp`` family) on the four bench shapes M×K×N (4096×2048×11264, 4096×5632×2048,
4096×2048×12288, 4096×2048×5632):

- correctness: the output must equal the CPU twin ``numba_kernels.cpu.linear`` bit for bit on a
  subset of rows (tile edges + random rows, all N columns), and the whole output must equal the
  first checked variant's bit for bit (so every tiling gives the same bits everywhere). The
  weights are bf16 values widened to float32, so the bf16-weight kernels share the reference.
  Then small ragged shapes (R, K, N not multiples of the tiles; K % 32 ≠ 0; odd K → scalar
  loads) are checked in full against the CPU twin.
- time: CUDA events, 2 warm-up launches, median of ``--reps``; TFLOP/s = 2·M·N·K / time.

Anchors in the same run: torch cuBLAS SGEMM (``allow_tf32 = False``, ``X @ W.T``) and today's
``numba_kernels.cuda_linear._gemm_k``. Each variant is wrapped: a failure is one line in the
table and ``error`` in the JSON. Results: ``DIR/probe_gemm.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

if "--sim" in sys.argv:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numpy as np  # noqa: E402

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still names np.row_stack
    np.row_stack = np.vstack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from numba import cuda  # noqa: E402

from kernels_proto import gemm as G  # noqa: E402
from numba_kernels import cpu as kp  # noqa: E402

BENCH = [(4096, 2048, 11264), (4096, 5632, 2048), (4096, 2048, 12288), (4096, 2048, 5632)]
SIM_SHAPES = [(40, 64, 136), (9, 100, 130)]
# (R, K, N): ragged tiles, a short last slice, odd K (scalar loads), tiny R
EDGES = [(133, 2052, 517), (5, 96, 129), (1, 64, 64), (260, 1037, 131)]
SIM_EDGES = [(5, 37, 33), (1, 8, 5)]
BF16_VARIANTS = ["rp128x128k16", "rp128x128k32", "rp128x128k8"]
# most informative first (a slow host compiles ~3 s per kernel; the rest is skipped past --budget)
PRIORITY = ["rp128x128k16", "ca128x128k32s3", "rp128x128k32", "ca128x128k16s3", "rp128x128k8",
            "rp128x128k16t84", "rp128x64k16", "ca128x128k16s4", "ca128x128k16s3t84"]
T0 = time.perf_counter()


def log(*a):
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def bits_equal(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def bf16_weights(rng, N, K, scale=0.05):
    w = (scale * rng.standard_normal((N, K))).astype(np.float32)
    w16 = (w.view(np.uint32) >> 16).astype(np.uint16)  # truncate to bf16 bit patterns
    return w16, (w16.astype(np.uint32) << 16).view(np.float32)


def check_rows(M, rng):
    rows = {0, 1, 2, 3, 4, 63, 64, 127, 128, 129, 255, 256, M - 129, M - 128, M - 2, M - 1}
    rows |= set(int(r) for r in rng.integers(0, M, 16))
    return np.array(sorted(r for r in rows if 0 <= r < M), np.int64)


class Timer:
    def __init__(self, sim):
        self.sim = sim

    def __call__(self, fn, reps, warm=2):
        for _ in range(0 if self.sim else warm):
            fn()
        cuda.synchronize()
        ts = []
        for _ in range(reps):
            if self.sim:
                t = time.perf_counter()
                fn()
                ts.append(1e3 * (time.perf_counter() - t))
            else:
                e0, e1 = cuda.event(), cuda.event()
                e0.record()
                fn()
                e1.record()
                e1.synchronize()
                ts.append(cuda.event_elapsed_time(e0, e1))
        return float(np.median(ts)), [float(t) for t in ts]


@cuda.jit
def _fill_k(out, v):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = v


def fill(out, v=np.float32(np.nan)):
    _fill_k[((out.shape[0] + 15) // 16, (out.shape[1] + 15) // 16), (16, 16)](out, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sim", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds (default 75, 900 under --sim); later variants are skipped past it")
    ap.add_argument("--variants", default=None, help="comma-separated subset of VARIANTS")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sim = args.sim
    if args.budget is None:
        args.budget = 900.0 if sim else 75.0
    reps = args.reps or (1 if sim else 10)
    shapes = SIM_SHAPES if sim else BENCH
    edges = SIM_EDGES if sim else EDGES
    timer = Timer(sim)
    rng = np.random.default_rng(1234)
    res = dict(host=platform.node(), sim=sim, python=sys.version.split()[0], numpy=np.__version__,
               shapes=[dict(M=M, K=K, N=N) for M, K, N in shapes], reps=reps, variants={}, anchors={},
               edges={}, notes=["inputs are not rotated: every bench shape's X + W exceeds the 60 MB L2 "
                                "(and the GEMMs are compute-bound)",
                                "rows_bitwise: the subset of rows vs the CPU twin; full_equal: the whole "
                                "output vs the first variant that passed (full_equal_to)"])
    try:
        import numba
        import numba_cuda
        res["numba"], res["numba_cuda"] = numba.__version__, getattr(numba_cuda, "__version__", "?")
    except Exception:  # noqa: BLE001
        pass
    if not sim:
        try:
            dev = cuda.get_current_device()
            res["device"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        except Exception as ex:  # noqa: BLE001
            res["device"] = f"? ({ex})"

    # ---- data and CPU references ---------------------------------------------------------------
    data = []
    for M, K, N in shapes:
        X = rng.standard_normal((M, K)).astype(np.float32)
        W16, W32 = bf16_weights(rng, N, K)
        rows = check_rows(M, rng)
        t = time.perf_counter()
        ref = np.zeros((len(rows), N), np.float32)
        kp.linear(np.ascontiguousarray(X[rows]), W32, ref, len(rows))
        d = dict(M=M, K=K, N=N, X=X, W16=W16, W32=W32, rows=rows, ref=ref,
                 dX=cuda.to_device(X), dW32=cuda.to_device(W32), dW16=cuda.to_device(W16),
                 dO=cuda.device_array((M, N), np.float32), full=None)
        data.append(d)
        log(f"shape {M}x{K}x{N}: CPU reference on {len(rows)} rows in {time.perf_counter() - t:.1f}s")
    edge_data = []
    for R, K, N in edges:
        X = rng.standard_normal((R + 3, K)).astype(np.float32)
        W16, W32 = bf16_weights(rng, N, K)
        X[0, : min(K, 40)] = np.float32(-0.0)  # -0 and underflowing products: signs of zero
        X[min(1, R - 1), : min(K, 40)] = np.float32(1e-30)
        W32[0, :] = np.float32(-1e-30)
        W16[0, :] = (W32[0].view(np.uint32) >> 16).astype(np.uint16)
        W32[0, :] = (W16[0].astype(np.uint32) << 16).view(np.float32)
        ref = np.zeros((R + 3, N), np.float32)
        kp.linear(X, W32, ref, R)
        edge_data.append(dict(R=R, K=K, N=N, X=X, W16=W16, W32=W32, ref=ref[:R]))

    def check_edges(name, fn, wkey, odd_k=True):
        out = {}
        for e in edge_data:
            if not odd_k and e["K"] % 4:  # scalar-load kernels: compiled for the default only
                continue
            key = f"{e['R']}x{e['K']}x{e['N']}"
            try:
                o = cuda.to_device(np.full((e["R"] + 3, e["N"]), 7.0, np.float32))
                fn(cuda.to_device(e["X"]), cuda.to_device(e[wkey[1:]]), o, e["R"])
                got = o.copy_to_host()
                out[key] = bool(bits_equal(got[: e["R"]], e["ref"]) and (got[e["R"]:] == 7.0).all())
            except Exception as ex:  # noqa: BLE001
                out[key] = f"error: {type(ex).__name__}: {ex}"[:300]
        res["edges"][name] = out
        return all(v is True for v in out.values())

    def run_variant(name, launch, wkey, edge_fn=None, info=None, odd_k=True):
        entry = dict(shapes={}, info=info or {})
        res["variants"][name] = entry
        if time.perf_counter() - T0 > args.budget:
            entry["error"] = "skipped: time budget"
            log(f"{name}: skipped (budget)")
            return
        try:
            for d in data:
                key = f"{d['M']}x{d['K']}x{d['N']}"
                s = dict()
                entry["shapes"][key] = s
                W = d[wkey]
                fill(d["dO"])  # a NaN sentinel: an output not written cannot pass as the last one's
                t = time.perf_counter()
                launch(d["dX"], W, d["dO"], d["M"])
                cuda.synchronize()
                s["first_call_s"] = round(time.perf_counter() - t, 2)
                full = d["dO"].copy_to_host()
                s["rows_bitwise"] = bool(bits_equal(full[d["rows"]], d["ref"]))
                if d["full"] is None and s["rows_bitwise"]:
                    d["full"], d["full_from"] = full, name
                s["full_equal"] = bool(d["full"] is not None and bits_equal(full, d["full"]))
                s["full_equal_to"] = d.get("full_from")
                ms, all_ms = timer(lambda: launch(d["dX"], W, d["dO"], d["M"]), reps)
                s["ms"], s["all_ms"] = ms, all_ms
                s["tflops"] = 2.0 * d["M"] * d["N"] * d["K"] / (ms * 1e-3) / 1e12
            if edge_fn is not None:
                entry["edges_bitwise"] = check_edges(name, edge_fn, wkey, odd_k)
            log(f"{name}: " + " ".join(f"{v.get('tflops', 0):.1f}" for v in entry["shapes"].values()) + " TFLOP/s")
        except Exception as ex:  # noqa: BLE001
            entry["error"] = f"{type(ex).__name__}: {ex}"[:500]
            entry["traceback"] = traceback.format_exc()[-3000:]
            log(f"{name}: FAILED {entry['error'][:200]}")

    # ---- anchors ----------------------------------------------------------------------------------
    try:
        import numba_kernels.cuda  # noqa: F401  (cuda_linear imports from it)
        from numba_kernels.cuda_linear import BM as OBM, BN as OBN, _gemm_k

        def old(X, W, out, R):
            N = W.shape[0]
            _gemm_k[((N + OBN - 1) // OBN, (R + OBM - 1) // OBM), (16, 16)](X, W, out, R)

        run_variant("anchor:_gemm_k", old, "dW32", edge_fn=None)
        res["anchors"]["_gemm_k"] = res["variants"].pop("anchor:_gemm_k")
    except Exception as ex:  # noqa: BLE001
        res["anchors"]["_gemm_k"] = dict(error=f"{type(ex).__name__}: {ex}"[:300])
    if not sim:
        try:
            import torch
            torch.backends.cuda.matmul.allow_tf32 = False
            a = res["anchors"]["cublas_sgemm"] = dict(shapes={}, torch=torch.__version__, allow_tf32=False)
            for d in data:
                Xt = torch.from_numpy(d["X"]).cuda()
                Wt = torch.from_numpy(d["W32"]).cuda()
                for _ in range(2):
                    Ot = Xt @ Wt.T
                torch.cuda.synchronize()
                ts = []
                for _ in range(reps):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    Ot = Xt @ Wt.T
                    e1.record()
                    e1.synchronize()
                    ts.append(e0.elapsed_time(e1))
                ms = float(np.median(ts))
                a["shapes"][f"{d['M']}x{d['K']}x{d['N']}"] = dict(
                    ms=ms, all_ms=ts, tflops=2.0 * d["M"] * d["N"] * d["K"] / (ms * 1e-3) / 1e12)
                del Xt, Wt, Ot
            torch.cuda.empty_cache()
            log("cublas: " + " ".join(f"{v['tflops']:.1f}" for v in a["shapes"].values()) + " TFLOP/s")
        except Exception as ex:  # noqa: BLE001
            res["anchors"]["cublas_sgemm"] = dict(error=f"{type(ex).__name__}: {ex}"[:300])
            log(f"cublas anchor failed: {ex}")

    # ---- variants ---------------------------------------------------------------------------------
    def run_bf16(name):
        fam, cfg = G.VARIANTS[name]

        def launch(X, W, out, R, _n=name):
            G.gemm(X, W, out, R, variant=_n)

        run_variant(name + "/bf16w", launch, "dW16", edge_fn=launch,
                    info=dict(family=fam, weights="bf16", **cfg), odd_k=name == G.DEFAULT)

    names = list(G.VARIANTS) if not args.variants else args.variants.split(",")
    names.sort(key=lambda n: PRIORITY.index(n) if n in PRIORITY else len(PRIORITY))
    bf16_done = False
    for name in names:
        if not bf16_done and name not in PRIORITY[:3]:  # the default's bf16 run early
            run_bf16(G.DEFAULT)
            bf16_done = True
        fam, cfg = G.VARIANTS[name]

        def launch(X, W, out, R, _n=name):
            G.gemm(X, W, out, R, variant=_n)

        info = dict(family=fam, **cfg)
        try:
            k = G.pick(name, data[0]["dX"], data[0]["dW32"])
            info.update(threads=k.threads, smem=k.smem, tile=[k.BM, k.BN])
        except Exception as ex:  # noqa: BLE001
            info["pick_error"] = str(ex)
        run_variant(name, launch, "dW32", edge_fn=launch, info=info,
                    odd_k=name == G.DEFAULT or fam == "ca")
        try:
            if not sim:
                info["regs"] = G.pick(name, data[0]["dX"], data[0]["dW32"]).cufunc(
                    data[0]["dX"], data[0]["dW32"], data[0]["dO"], data[0]["M"]).attrs.regs
        except Exception as ex:  # noqa: BLE001
            info["regs"] = f"? {ex}"[:100]
    for name in BF16_VARIANTS:
        if (args.variants and name not in names) or (name == G.DEFAULT and bf16_done):
            continue
        run_bf16(name)

    # ---- report -----------------------------------------------------------------------------------
    res["elapsed_s"] = round(time.perf_counter() - T0, 1)
    path = os.path.join(args.out, "probe_gemm.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    keys = [f"{M}x{K}x{N}" for M, K, N in shapes]
    print("\nTFLOP/s (2·M·N·K / median time); ok = rows bitwise vs CPU twin and full output equal across variants")
    print(f"{'variant':<28}" + "".join(f"{k:>18}" for k in keys) + "   ok  edges")

    def row(name, e):
        if "error" in e and not e.get("shapes"):
            print(f"{name:<28} FAILED: {e['error'][:120]}")
            return
        cells = []
        ok = True
        for k in keys:
            s = e.get("shapes", {}).get(k)
            if not s or "tflops" not in s:
                cells.append(f"{'-':>18}")
                ok = False
                continue
            cells.append(f"{s['tflops']:>18.2f}")
            ok &= s.get("rows_bitwise", True) and s.get("full_equal", True)
        edges_ok = e.get("edges_bitwise", "")
        print(f"{name:<28}" + "".join(cells) + f"   {'yes' if ok else 'NO':>3}  {edges_ok}"
              + (f"  ERROR {e['error'][:80]}" if "error" in e else ""))

    for n, e in res["anchors"].items():
        row("anchor " + n, e)
    for n, e in res["variants"].items():
        row(n, e)
    print(f"\nwrote {path} ({res['elapsed_s']} s)")


if __name__ == "__main__":
    main()
