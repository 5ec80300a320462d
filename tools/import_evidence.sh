#!/usr/bin/env bash
# Bring a device run's evidence into receipts/ (run here, from the repository root, after the
# device tool returned the results): the unpacked results/ of tools/device_evidence.sh (with
# MODE_BF16=1) and, optionally, that of `tools/device_run.sh OUTDIR bench`.
#   bash tools/import_evidence.sh EVIDENCE_RESULTS_DIR [BENCH_RESULTS_DIR]
# The CPU receipts recorded in the same run (the own-checkpoint golden, the exact-bf16 tiny CPU
# matrix) replace the committed ones only when their digests equal them (harness diff); then the
# plots of the default and stdlib receipts are drawn here. With a bench, the README's performance
# tables are rewritten from its JSON (tools/bench_table.py --readme README.md). Update
# receipts/device/PROVENANCE.md, the README's GPU-evidence section and the performance prose by
# hand, read `git diff README.md`, then run `harness evidence`.
set -euo pipefail
ev=${1:?usage: tools/import_evidence.sh EVIDENCE_RESULTS_DIR [BENCH_RESULTS_DIR]}
bench=${2:-}
py=.venv/bin/python
[ -x "$py" ] || py=python3
h="$py -m harness.cli"
dev=receipts/device
for m in default stdlib tiny-q35-bf16 tiny-q35-f32 tiny-w2 tiny-exact-bf16; do
  cp "$ev/cuda-$m.json" "$ev/cuda-$m.csv" "$dev/"
done
cp "$ev/own-cuda.json" "$dev/cuda-own.json"
cp "$ev/own-cuda.csv" "$dev/cuda-own.csv"
cp "$ev/cuda-device-check.json" "$ev/cuda-walker.json" "$dev/"
cp "$ev/device-check.log" "$ev/device-walker.log" "$ev/diffs.txt" "$ev/nvidia-smi.txt" "$dev/logs/"
sort "$ev/jobs.txt" > "$dev/logs/jobs.txt"
cp "$ev"/cuda-bisect-tiny-*.json receipts/bisect/
same() {  # a CPU receipt of the run replaces the committed one only with equal digests
  $h diff --digests-only "$2" "$1" > /dev/null || { echo "import_evidence: $1 differs from $2: not copied" >&2; return 1; }
  cp "$1" "$2"
  cp "${1%.json}.csv" "${2%.json}.csv"
}
same "$ev/own-cpu.json" receipts/own/cpu.json
same "$ev/cpu-tiny-exact-bf16.json" receipts/exact-bf16/cpu-tiny.json
for m in default stdlib; do  # the mode's big matrices on CUDA (device_evidence.sh MODE_BF16=1), when run
  if [ -f "$ev/cuda-$m-exact-bf16.json" ]; then
    if [ ! -f "receipts/exact-bf16/cpu-$m.json" ]; then
      echo "import_evidence: no receipts/exact-bf16/cpu-$m.json to compare cuda-$m-exact-bf16.json with (copied)" >&2
    elif ! $h diff --digests-only "receipts/exact-bf16/cpu-$m.json" "$ev/cuda-$m-exact-bf16.json" > /dev/null; then
      echo "import_evidence: cuda-$m-exact-bf16.json differs from receipts/exact-bf16/cpu-$m.json (copied: read the diff)" >&2
    fi
    cp "$ev/cuda-$m-exact-bf16.json" "$ev/cuda-$m-exact-bf16.csv" "$dev/"
  fi
done
MPLBACKEND=Agg $h plot "$dev/cuda-default.json" > /dev/null
MPLBACKEND=Agg $h plot "$dev/cuda-stdlib.json" > /dev/null
if [ -n "$bench" ]; then
  cp "$bench/cuda-bench.json" receipts/bench/
  cp "$bench/bench.log" receipts/bench/cuda-bench.log
  [ -f "$bench/cuda-bench.prime_curve.png" ] && cp "$bench/cuda-bench.prime_curve.png" receipts/bench/
  $py tools/bench_table.py receipts/bench/cuda-bench.json --readme README.md
fi
git status --short receipts
