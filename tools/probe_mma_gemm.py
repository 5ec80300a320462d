"""exact-bf16 tensor-core GEMM probe (issue #19), < 90 s on an H200:

    python tools/probe_mma_gemm.py --out DIR [--weights bf16] [--shapes prime | "R,K,N;..."] [--g16 NAME,...]

For each shape (decode rows, a prime chunk, bench-8l-like widths) and each resident form of W
(``--weights``: float32 of bf16 values, bf16 bits): ``linear_mma`` on the GPU
(``mma_tc.linear_mma_tc``: mma.sync via inline PTX) against the CPU twin on sampled outputs,
bitwise (the sampled rows run on the CPU in full, every column), and its time against torch bf16
``X @ W.T`` (cuBLAS, tensor cores) and the bf16 weight-read floor (bytes of W at 4.8 TB/s).
Writes DIR/probe-mma-gemm.json and prints one line per shape. Also ``--check-compile``: compile the
kernels (scalar and 16-byte loads) for sm_90 without a GPU and count HMMA instructions (needs ptxas / cuobjdump on PATH or
/usr/local/sass).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [(1, 2048, 5632), (1, 5632, 2048), (4, 2048, 2048), (17, 2048, 2048), (512, 2048, 5632),
          (4096, 2048, 5632)]
# bench-8l's linear shapes in a 4,096-row prime chunk: qkvz, gdn out (= attention o), qkv, mlp gate+up, down
PRIME_SHAPES = [(4096, 2048, 12352), (4096, 4096, 2048), (4096, 2048, 9216), (4096, 2048, 11264), (4096, 5632, 2048)]
HBM_BPS = 4.8e12


def check_compile() -> int:
    from numba_kernels import mma_tc

    ok = True
    for kernel in (mma_tc.linear_mma_tc_k, mma_tc.linear_mma_gemv_k, mma_tc.linear_mma_vd_k):
        ptx = mma_tc.compile_ptx_sm90(kernel)
        d = tempfile.mkdtemp()
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as f:
            f.write(ptx)
        ptxas = shutil.which("ptxas") or "ptxas"
        cuobj = shutil.which("cuobjdump") or "/usr/local/sass/cuobjdump"
        info = subprocess.run([ptxas, "-arch=sm_90", "-v", p, "-o", p + ".cubin"], capture_output=True, text=True)
        sass = subprocess.run([cuobj, "-sass", p + ".cubin"], capture_output=True, text=True).stdout
        lines = [ln for ln in sass.splitlines() if ln.strip().startswith("/*") and "*/" in ln[4:]]
        print(f"{kernel.__name__}: ptx mma.sync: {ptx.count('mma.sync')}; ptxas: {info.stderr.strip().splitlines()[-2:]}")
        print(f"  sass: {sum('HMMA' in ln for ln in lines)} HMMA of {len(lines)} instructions")
        ok &= "HMMA" in sass
    return 0 if ok else 1


def _g16_configs(names, dX, dW, want, R, K, N, reps):
    """Each packed-X GEMM configuration's time (GEMM launches only, X packed once before) and
    whether its output equals ``want`` (the production kernel's, checked against the twin)."""
    from numba import cuda

    from numba_kernels import mma_tc
    from numba_kernels.launch import launch

    Xp = mma_tc._packed_x(dX, R, K)
    res = {}
    for name in names:
        bm, bn = mma_tc.G16_CONFIGS[name][:2]
        k = mma_tc.g16_kernel(name)
        out = cuda.device_array((R, N), np.float32)

        def run():
            launch(k, ((N + bn - 1) // bn, (R + bm - 1) // bm), k.threads, Xp, dW.view(np.uint32), out.view(np.uint32), R)

        run()
        cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        cuda.synchronize()
        t = (time.perf_counter() - t0) / reps
        same = bool(np.array_equal(out.copy_to_host().view(np.uint32), want.view(np.uint32)))
        res[name] = {"s": t, "tflops": 2 * R * N * K / t / 1e12, "same_as_production": same}
        print(f"    g16 {name:12s}: {t * 1e3:8.3f} ms ({res[name]['tflops']:6.1f} TFLOP/s) "
              f"{'same bits' if same else 'DIFFERS from production'}", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for probe-mma-gemm.json")
    ap.add_argument("--weights", default="f32,bf16",
                    help="W resident as f32 (float32 of bf16 values) and/or bf16 (uint16 bits), comma-separated")
    ap.add_argument("--check-compile", action="store_true", help="compile for sm_90 and count HMMA (no GPU)")
    ap.add_argument("--shapes", default=None,
                    help='R,K,N;R,K,N... instead of the default shapes ("prime": bench-8l\'s at 4,096 rows)')
    ap.add_argument("--g16", default=None,
                    help="also time these packed-X GEMM configurations (mma_tc.G16_CONFIGS names, comma-separated; "
                         "bf16 weights, from W16_MIN_ROWS rows), each bitwise against the production one")
    a = ap.parse_args()
    shapes = SHAPES if not a.shapes else PRIME_SHAPES if a.shapes == "prime" else [
        tuple(int(v) for v in sh.split(",")) for sh in a.shapes.split(";")]
    if any(len(sh) != 3 or min(sh) < 1 for sh in shapes):
        ap.error(f"--shapes: each shape is R,K,N of positive integers, got {a.shapes!r}")
    if a.check_compile:
        return check_compile()
    if not a.out:
        ap.error("--out is required")
    import torch
    from numba import cuda

    from harness.engine.bf16 import narrow
    from harness.engine.modes import round_bf16
    from numba_kernels import cpu, cuda as kc
    from numba_kernels import mma_tc

    bad = [n for n in (a.g16.split(",") if a.g16 else []) if n not in mma_tc.G16_CONFIGS]
    if bad:
        ap.error(f"--g16: unknown configuration(s) {bad}; known: {', '.join(mma_tc.G16_CONFIGS)}")

    rng = np.random.default_rng(0)
    rows = []
    t_start = time.perf_counter()
    for (R, K, N), wt in [(sh, w) for sh in shapes for w in a.weights.split(",")]:
        X = rng.standard_normal((R, K)).astype(np.float32)
        W = round_bf16(rng.standard_normal((N, K)).astype(np.float32) * np.float32(K ** -0.5))
        dX, dO = cuda.to_device(X), cuda.device_array((R, N), np.float32)
        dW = cuda.to_device(narrow(W) if wt == "bf16" else W)  # bf16: resident as its bits (uint16)
        kc.linear_mma(dX, dW, dO, R)
        cuda.synchronize()
        reps = 20 if R * N * K < 1e10 else 5
        t0 = time.perf_counter()
        for _ in range(reps):
            kc.linear_mma(dX, dW, dO, R)
        cuda.synchronize()
        t_ours = (time.perf_counter() - t0) / reps
        got = dO.copy_to_host()
        pick = sorted(set(rng.integers(0, R, min(R, 8)).tolist()))
        want = np.empty((len(pick), N), np.float32)
        cpu.linear_mma(np.ascontiguousarray(X[pick]), W, want, len(pick))
        same = np.array_equal(got[pick].view(np.uint32), want.view(np.uint32))
        tX = torch.tensor(X, device="cuda").to(torch.bfloat16)
        tW = torch.tensor(W, device="cuda").to(torch.bfloat16)
        torch.matmul(tX, tW.T)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.matmul(tX, tW.T)
        torch.cuda.synchronize()
        t_torch = (time.perf_counter() - t0) / reps
        floor = 2 * N * K / HBM_BPS
        row = {"R": R, "K": K, "N": N, "weights": wt, "bitwise_sampled_rows": same, "rows_checked": len(pick),
               "ours_s": t_ours, "torch_bf16_s": t_torch, "bf16_weight_floor_s": floor,
               "ours_tflops": 2 * R * N * K / t_ours / 1e12, "torch_tflops": 2 * R * N * K / t_torch / 1e12}
        if a.g16 and wt == "bf16" and R >= mma_tc.W16_MIN_ROWS:
            row["g16"] = _g16_configs(a.g16.split(","), dX, dW, got, R, K, N, reps)
            same &= all(v["same_as_production"] for v in row["g16"].values())
            row["bitwise_sampled_rows"] = same
        rows.append(row)
        print(f"R{R:5d} K{K:5d} N{N:5d} W {wt:4s}: {'bitwise' if same else 'DIFFERS'} ({len(pick)} rows); ours "
              f"{t_ours * 1e3:8.3f} ms ({row['ours_tflops']:6.1f} TFLOP/s), torch bf16 {t_torch * 1e3:8.3f} ms, "
              f"x{t_ours / t_torch:6.2f}; floor {floor * 1e3:.3f} ms (x{t_ours / floor:6.2f})", flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "probe-mma-gemm.json"), "w") as f:
        json.dump({"device": cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes)
                   else str(cuda.get_current_device().name), "rows": rows,
                   "wall_s": time.perf_counter() - t_start}, f, indent=1)
    return 0 if all(r["bitwise_sampled_rows"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
