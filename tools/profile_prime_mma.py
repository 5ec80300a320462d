"""exact-bf16 prime on bench-8l, timed and profiled per op (issue #19), on a GPU:

    python tools/profile_prime_mma.py --out FILE.json [--lengths 4096,16384] [--attention-rows 4096] [--mode exact]
    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python tools/profile_prime_mma.py --out FILE.json --ncu-chunk 28672 > kernels.csv

Builds bench-8l as ``harness bench`` does (random weights, seeded; needs torch + transformers),
primes each length in the mode (default exact-bf16; after a warm-up prime, the best of two up to
8,192 tokens, one run past that), records
``bench.profile_step``'s per-op times of the first length, and times the exact-bf16 attention op
alone at ``--attention-rows`` rows from position 0 (the tensor-core kernel where the tree has one,
branch ``next/mma-tc``, else the op as dispatched; with ``--tiled`` also the one-block-per-(row,
head) kernel; each the best of its runs, the first of which compiles). With ``--mode exact``
the attention is not timed. ``--ncu-chunk START`` instead primes START tokens, then brackets the
next ``--ncu-rows`` (default 4,096: one chunk of a long prime) with cudaProfilerStart/Stop, for
Nsight Compute's per-kernel view of that chunk (``tools/ncu_summary.py``), and times nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.atomic import write_text_atomic  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--attention-rows", type=int, default=4096)
    ap.add_argument("--tiled", action="store_true", help="also time the one-block-per-(row, head) kernel")
    ap.add_argument("--mode", default="exact-bf16",
                    help="the engine's mode (exact: the float32 prime, no attention timing)")
    ap.add_argument("--ncu-chunk", type=int, default=-1,
                    help="prime this many tokens, then profile the next --ncu-rows (see above)")
    ap.add_argument("--ncu-rows", type=int, default=4096)
    a = ap.parse_args(argv)
    from harness.engine.model import Engine
    from harness.gpu.bench import bench_checkpoint, profile_step

    res = {"mode": a.mode, "lengths": {}}
    with tempfile.TemporaryDirectory() as tmp:
        _, ck = bench_checkpoint(tmp)
    eng = Engine(ck, "cuda", check_finite=True, mode=a.mode)
    lengths = [int(x) for x in a.lengths.split(",")]
    n_ids = max(lengths) if a.ncu_chunk < 0 else max(max(lengths), a.ncu_chunk + a.ncu_rows)
    ids = np.random.default_rng(0).integers(0, ck.config.vocab_size, n_ids).tolist()

    def prime(n):
        s = eng.new_session(n + 64)
        eng.B.synchronize()
        t0 = time.perf_counter()
        eng.prime(s, ids[:n])
        eng.B.synchronize()
        return time.perf_counter() - t0

    prime(lengths[0])  # compile
    if a.ncu_chunk >= 0:
        return ncu_chunk(eng, ids, a.ncu_chunk, a.ncu_rows)
    for n in lengths:
        ts = [prime(n) for _ in range(2 if n <= 8192 else 1)]
        res["lengths"][n] = {"s": min(ts), "tokens_per_s": n / min(ts)}
        print(f"prime {n}: {min(ts):.3f} s ({n / min(ts):,.0f} tok/s)", flush=True)
    res["profile"] = profile_step(eng, f"prime_{lengths[0]}", ids)
    for op, v in sorted(res["profile"]["ops"].items(), key=lambda kv: -kv[1]["s"]):
        print(f"  {op:16s} {v['calls']:4d} calls {v['s'] * 1e3:9.2f} ms", flush=True)

    if a.mode == "exact-bf16":
        res["attention"] = attention_times(ck.config, a.attention_rows, a.tiled)
    write_text_atomic(a.out, json.dumps(res, indent=1, default=str))
    return 0


def ncu_chunk(eng, ids, start, rows) -> int:
    """Prime ``start`` tokens unprofiled, then the next ``rows`` between cudaProfilerStart/Stop."""
    from numba import cuda

    s = eng.new_session(start + rows + 64)
    if start:
        eng.prime(s, ids[:start])
    eng.B.synchronize()
    cuda.profile_start()
    eng.prime(s, ids[start:start + rows])
    eng.B.synchronize()
    cuda.profile_stop()
    print(f"profiled the prime of tokens {start}..{start + rows}", flush=True)
    return 0


def attention_times(cfg, R, tiled) -> dict:
    """The exact-bf16 attention op alone on R random rows from position 0 (see the docstring)."""
    from numba import cuda

    from numba_kernels import cuda as kc

    hq, hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rng = np.random.default_rng(1)
    Q = cuda.to_device(rng.standard_normal((R, hq * D), dtype=np.float32))
    K = cuda.to_device(rng.standard_normal((R, hkv * D), dtype=np.float32))
    V = cuda.to_device(rng.standard_normal((R, hkv * D), dtype=np.float32))
    o = cuda.device_array((R, hq * D), np.float32)
    flops = 4.0 * hq * D * R * (R + 1) / 2
    res = {"rows": R}
    tc = ["attention_mma_tc"] if hasattr(kc, "attention_mma_tc") else ["attention_mma"]  # the op where no tc kernel
    for name in tc + (["attention_mma_tiled"] if tiled else []):
        fn = getattr(kc, name)
        ts = []
        for _ in range(2 if name.endswith("tiled") else 3):  # the slow kernel: one warm run
            cuda.synchronize()
            t0 = time.perf_counter()
            fn(Q, K, V, o, 0, R, hq, hkv, D, np.float32(D ** -0.5))
            cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        t = min(ts)
        res[name] = {"s": t, "tflops": flops / t / 1e12,
                     "out_sha": hashlib.sha256(o.copy_to_host().tobytes()).hexdigest()}
        print(f"{name}: R {R}: {t * 1e3:.2f} ms ({res[name]['tflops']:.2f} TFLOP/s)", flush=True)
    return res


if __name__ == "__main__":
    sys.exit(main())
