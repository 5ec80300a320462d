#!/usr/bin/env bash
# The GPU evidence, run on the device machine from the repository root:
#   PRIMEWALK_COMMIT=<sha> bash tools/device_run.sh OUTDIR [check|bench|bf16|all]
# check: a smoke test of captured steps (CUDA graphs; if it fails, the rest runs with
#        PRIMEWALK_GRAPHS=0 and says so), harness device-check (every op, CUDA vs CPU twin),
#        harness device-walker (walker check and speculative decoding on both backends), the
#        default matrix and the stdlib-small acceptance matrix with --backend cuda.
# bench: harness bench (bench-8l vs transformers and hardware anchors).
# bf16: exact-bf16 (issue #19): tools/probe_mma_gemm.py, then the default and stdlib matrices with
#       --backend cuda --mode exact-bf16 (device-check in "check" covers the MMA ops and the mode).
# Everything lands in OUTDIR/results.tar (the device tool returns at most 8 files); unpack it and
# plot the matrix receipts on any machine (harness plot receipts/device/h200-default.json).
set -euo pipefail
out=${1:?usage: tools/device_run.sh OUTDIR [check|bench|bf16|all]}
what=${2:-all}
res="$out/results"
mkdir -p "$res"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MPLBACKEND=Agg
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$res/nvidia-smi.txt"
ms() { date +%s%N | cut -c1-13; }
if [ "$what" = check ] || [ "$what" = all ]; then
  if ! python tools/decode_kernels.py --out "$res/decode-kernels.json" > "$res/decode-kernels.log" 2>&1; then
    echo "GEMV v3 differs from the CPU twin (or failed): the rest runs with PRIMEWALK_LINEAR=v1" | tee -a "$res/decode-kernels.log"
    export PRIMEWALK_LINEAR=v1
  fi
  grep -E "^(bitwise|timing|rmsnorm)" "$res/decode-kernels.log" | cut -c1-200
  if ! python - > "$res/graph-smoke.txt" 2>&1 <<'PY'
import time
import numpy as np
from harness.engine.model import Engine
from harness.models import default_model_path
from harness.engine.weights import load_checkpoint
ck = load_checkpoint(default_model_path())
ec, eg = Engine(ck, "cpu"), Engine(ck, "cuda")
assert eg.graphs, "the cuda engine has no captured steps"
sc, sg = ec.new_session(64), eg.new_session(64)
ids = np.random.default_rng(0).integers(0, ck.config.vocab_size, 40)
for i, t in enumerate(ids):
    t0 = time.perf_counter()
    lg, _ = eg.decode_step(sg, int(t))
    dt = time.perf_counter() - t0
    lc, _ = ec.decode_step(sc, int(t))
    assert np.array_equal(lg.view(np.uint32), lc.view(np.uint32)), f"step {i}: captured decode differs from the CPU twin"
    print(f"step {i}: {dt * 1e3:.3f} ms, bitwise")
assert sg.cache.digest() == sc.cache.digest()
print("graph smoke: ok, graphs", len(sg.cache.graphs))
PY
  then
    echo "graph smoke FAILED: the rest runs with PRIMEWALK_GRAPHS=0" | tee -a "$res/graph-smoke.txt"
    export PRIMEWALK_GRAPHS=0
  fi
  tail -3 "$res/graph-smoke.txt"
  python -m harness.cli device-check --out "$res/h200-device-check.json" > "$res/device-check.log" 2>&1 || echo "device-check exit $?"
  tail -4 "$res/device-check.log"
  python -m harness.cli device-walker --out "$res/h200-walker.json" > "$res/device-walker.log" 2>&1 || echo "device-walker exit $?"
  tail -4 "$res/device-walker.log"
  t0=$(ms)
  python -m harness.cli run-matrix --backend cuda --out "$res/h200-default.json" --quiet --no-plots || echo "run-matrix exit $?"
  t1=$(ms)
  echo "default matrix, run-matrix --backend cuda wall (process, compilation included): $((t1 - t0)) ms" | tee -a "$res/walls.txt"
  python -m harness.cli run-matrix --spec harness/specs/stdlib.toml --backend cuda --out "$res/h200-stdlib.json" --quiet --no-plots || echo "run-matrix stdlib exit $?"
  t2=$(ms)
  echo "stdlib matrix, run-matrix --backend cuda wall (process, compilation included): $((t2 - t1)) ms" | tee -a "$res/walls.txt"
fi
if [ "$what" = bf16 ] || [ "$what" = all ]; then
  # exact-bf16 (issue #19): the tensor-core GEMM probe (bitwise vs the CPU twin, timed vs torch bf16),
  # then the default and stdlib matrices in the mode on the GPU (diff them against the CPU receipts)
  python tools/probe_mma_gemm.py --out "$res/mma-gemm" > "$res/probe-mma-gemm.log" 2>&1 || echo "probe_mma_gemm exit $?"
  tail -12 "$res/probe-mma-gemm.log"
  t0=$(ms)
  python -m harness.cli run-matrix --backend cuda --mode exact-bf16 --out "$res/h200-default-bf16.json" --quiet --no-plots || echo "run-matrix bf16 exit $?"
  t1=$(ms)
  echo "default matrix exact-bf16, --backend cuda wall: $((t1 - t0)) ms" | tee -a "$res/walls.txt"
  python -m harness.cli run-matrix --spec harness/specs/stdlib.toml --backend cuda --mode exact-bf16 --out "$res/h200-stdlib-bf16.json" --quiet --no-plots || echo "run-matrix stdlib bf16 exit $?"
  t2=$(ms)
  echo "stdlib matrix exact-bf16, --backend cuda wall: $((t2 - t1)) ms" | tee -a "$res/walls.txt"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python -m harness.cli bench --out "$res/h200-bench.json" 2>&1 | tee "$res/bench.log" | tail -30 || echo "bench exit $?"
fi
tar cf "$out/results.tar" -C "$out" results
