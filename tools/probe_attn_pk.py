"""The packed tensor-core attention's load grouping and register budget, swept on a GPU (issue #19):

    python tools/probe_attn_pk.py --out DIR [--configs "4,2,128;8,4,168,1"] [--starts 0,28672] [--rows 4096]

``attention_mma_pk_k`` (numba_kernels/mma_tc.py) loads PK_KT K rows (n-tiles of QKᵀ) together
from the packed K and PK_GROUP n-tiles of the packed V together, under a budget of PK_MAX_REGS
registers, ATT_TC_WARPS warps (heads of the same 16 rows) a block; every load comes from L2 in
each warp of a KV head's query heads. For each configuration "PK_KT,PK_GROUP,PK_MAX_REGS[,ATT_TC_WARPS]"
(the last as in the tree when left out) a subprocess binds the module with those constants
(set before the kernel first compiles; the budget by re-jitting its Python function), runs
``attention_mma_pk`` on bench-8l's attention shape (16 query heads on 2 KV heads, head_dim 256)
for ``--rows`` rows at each start (a 32 k prime's first and last 4,096-row chunk by default; the
same random Q, K, V in every subprocess) and records each output's SHA-256 and the best of three
timed calls. The first configuration is the production one, and its rows r0 .. r0 + 15 at the
first start (r0 = 0 and rows - 16) are also checked against the CPU twin (``cpu.attention_mma``
on those 16 rows: a row's result depends on its position only); every other configuration must
give the production digests. Writes DIR/probe-attn-pk.json, prints one line per configuration,
exits 1 if anything differs. Nothing here changes the production constants.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

HQ, HKV, D = 16, 2, 256  # bench-8l's attention


def _inputs(rows, starts):
    rng = np.random.default_rng(0)
    cap = max(starts) + rows
    Q = rng.standard_normal((rows, HQ * D)).astype(np.float32)
    K = rng.standard_normal((cap, HKV * D)).astype(np.float32)
    V = rng.standard_normal((cap, HKV * D)).astype(np.float32)
    return Q, K, V


def _one(cfg, rows, starts, twin):
    """In the subprocess: bind the constants, run, time; returns the record."""
    from numba import cuda

    from numba_kernels import cuda as kc  # noqa: F401  (binds mma_tc's CUDA bodies)
    from numba_kernels import cpu, mma_tc

    kt, grp, regs = cfg[:3]
    mma_tc.PK_KT, mma_tc.PK_GROUP, mma_tc.PK_MAX_REGS = kt, grp, regs
    if len(cfg) > 3:
        mma_tc.ATT_TC_WARPS = cfg[3]
    mma_tc.attention_mma_pk_k = cuda.jit(max_registers=regs)(mma_tc.attention_mma_pk_k.py_func)
    Q, K, V = _inputs(rows, starts)
    dQ, dK, dV = cuda.to_device(Q), cuda.to_device(K), cuda.to_device(V)
    scale = np.float32(D ** -0.5)
    out = cuda.device_array((rows, HQ * D), np.float32)
    rec = {"pk_kt": kt, "pk_group": grp, "pk_max_regs": regs, "att_tc_warps": mma_tc.ATT_TC_WARPS, "starts": {}}
    for start in starts:
        t0 = time.perf_counter()
        assert mma_tc.attention_mma_pk(dQ, dK, dV, out, start, rows, HQ, HKV, D, scale)
        cuda.synchronize()
        first = time.perf_counter() - t0
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            mma_tc.attention_mma_pk(dQ, dK, dV, out, start, rows, HQ, HKV, D, scale)
            cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        got = out.copy_to_host()
        causal = 2 * 2 * HQ * D * sum(start + r + 1 for r in range(rows))  # QKᵀ and P·V, the keys each row reads
        rec["starts"][str(start)] = {"sha256": hashlib.sha256(got.tobytes()).hexdigest(), "best_s": best,
                                     "first_s": first, "tflops": causal / best / 1e12}
        if twin and start == starts[0]:
            same = []
            for r0 in sorted({0, rows - 16}):
                want = np.zeros((16, HQ * D), np.float32)
                cpu.attention_mma(np.ascontiguousarray(Q[r0:r0 + 16]), K, V, want, start + r0, 16, HQ, HKV, D, scale)
                same.append(bool(np.array_equal(got[r0:r0 + 16].view(np.uint32), want.view(np.uint32))))
            rec["twin_rows_bitwise"] = all(same)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for probe-attn-pk.json")
    ap.add_argument("--configs", default="4,2,128;8,2,128;4,4,128;8,4,128;4,2,168;8,4,168;4,4,168",
                    help="PK_KT,PK_GROUP,PK_MAX_REGS[,ATT_TC_WARPS];... (the first: production's)")
    ap.add_argument("--starts", default="0,28672")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a subprocess's configuration
    ap.add_argument("--twin", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        configs = [tuple(int(v) for v in c.split(",")) for c in a.configs.split(";")]
        starts = [int(s) for s in a.starts.split(",")]
        assert all(len(c) in (3, 4) and 8 % c[0] == 0 and c[1] >= 1 and 64 <= c[2] <= 255 and
                   (len(c) == 3 or 1 <= c[3] <= 8) for c in configs)
        assert all(s >= 0 for s in starts) and 16 <= a.rows
    except (ValueError, AssertionError):
        ap.error("--configs: PK_KT (1, 2, 4, 8),PK_GROUP (≥ 1),PK_MAX_REGS (64-255)[,ATT_TC_WARPS (1-8)];...; --starts: "
                 "non-negative integers; --rows: at least 16")
    if a.one:
        rec = _one(tuple(int(v) for v in a.one.split(",")), a.rows, starts, a.twin)
        print("RECORD " + json.dumps(rec))
        return 0
    np.row_stack = getattr(np, "row_stack", np.vstack)
    recs = []
    t_all = time.perf_counter()
    for i, cfg in enumerate(configs):
        cmd = [sys.executable, os.path.abspath(__file__), "--out", a.out, "--one", ",".join(map(str, cfg)),
               "--starts", a.starts, "--rows", str(a.rows)] + (["--twin"] if i == 0 else [])
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RECORD ")), None)
        if p.returncode or not line:
            rec = {"config": cfg, "error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        else:
            rec = json.loads(line[len("RECORD "):])
        rec["wall_s"] = round(time.perf_counter() - t0, 1)
        recs.append(rec)
        if "error" in rec:
            print(f"{cfg}: ERROR {rec['error']}", flush=True)
            continue
        base = recs[0].get("starts", {})
        same = all(base.get(s, {}).get("sha256") == v["sha256"] for s, v in rec["starts"].items())
        rec["same_as_production"] = same
        parts = [f"start {s}: {v['best_s'] * 1e3:7.2f} ms ({v['tflops']:5.1f} TFLOP/s)" for s, v in rec["starts"].items()]
        tw = f"; twin rows {'bitwise' if rec['twin_rows_bitwise'] else 'DIFFER'}" if "twin_rows_bitwise" in rec else ""
        print(f"PK_KT {cfg[0]} PK_GROUP {cfg[1]} regs {cfg[2]:3d} warps {rec['att_tc_warps']}: {', '.join(parts)}; "
              f"{'same digests' if same else 'DIGESTS DIFFER'}{tw} ({rec['wall_s']} s)", flush=True)
    os.makedirs(a.out, exist_ok=True)
    from numba import cuda

    dev = cuda.get_current_device().name
    with open(os.path.join(a.out, "probe-attn-pk.json"), "w") as f:
        json.dump({"device": dev.decode() if isinstance(dev, bytes) else str(dev), "rows": a.rows, "starts": starts,
                   "shape": {"hq": HQ, "hkv": HKV, "head_dim": D}, "configs": recs,
                   "wall_s": round(time.perf_counter() - t_all, 1)}, f, indent=1)
    ok = all("error" not in r and r.get("same_as_production") for r in recs) and recs[0].get("twin_rows_bitwise", False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
