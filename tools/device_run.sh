#!/usr/bin/env bash
# The GPU evidence, run on the device machine from the repository root:
#   PRIMEWALK_COMMIT=<sha> bash tools/device_run.sh OUTDIR [check|bench|all]
# check: harness device-check (every op, CUDA vs CPU twin), harness device-walker (walker check
#        and speculative decoding on both backends), the default matrix with --backend cuda.
# (plots of the matrix receipt: harness plot receipts/device/h200-default.json, on any machine)
# bench: harness bench (bench-8l vs transformers and hardware anchors).
set -euo pipefail
out=${1:?usage: tools/device_run.sh OUTDIR [check|bench|all]}
what=${2:-all}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MPLBACKEND=Agg
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.txt"
if [ "$what" = check ] || [ "$what" = all ]; then
  python -m harness.cli device-check --out "$out/h200-device-check.json" || echo "device-check exit $?"
  python -m harness.cli device-walker --out "$out/h200-walker.json" || echo "device-walker exit $?"
  t0=$(date +%s%N)
  python -m harness.cli run-matrix --backend cuda --out "$out/h200-default.json" --quiet --no-plots || echo "run-matrix exit $?"
  t1=$(date +%s%N)
  echo "run-matrix --backend cuda wall (process, compilation included): $(( (t1 - t0) / 1000000 )) ms" | tee "$out/matrix-wall.txt"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python -m harness.cli bench --out "$out/h200-bench.json" || echo "bench exit $?"
fi
