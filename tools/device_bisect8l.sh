#!/usr/bin/env bash
# Issue #12's goal on the device machine, from the repository root, alone on the GPU: harness bisect
# of a 4,096-token bench-8l prime on CUDA (batched vs split at 2048, with a fault and without),
# each whole command timed (process start, model load and compilation included). The model is
# written to out/bench-8l first (tools/make_bench8l.py) and kept there for later runs.
#   bash tools/device_bisect8l.sh RESULTSDIR
# Writes RESULTSDIR/cuda-bisect-bench8l-4096-{fault,nofault}.json, their logs, and one line per run
# to RESULTSDIR/jobs.txt.
set -uo pipefail
res=${1:?usage: tools/device_bisect8l.sh RESULTSDIR}
mkdir -p "$res"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
[ -f out/bench-8l/config.json ] || python tools/make_bench8l.py --out out/bench-8l > "$res/make-bench8l.log" 2>&1
for f in fault nofault; do
  extra=()
  [ "$f" = fault ] && extra=(--fault 5:recurrence:3000)
  s=$(date +%s%N)
  python -m harness.cli bisect --model out/bench-8l --prompt-len 4096 --a batched --b split:2048 --backend cuda \
    "${extra[@]}" --out "$res/cuda-bisect-bench8l-4096-$f.json" > "$res/bisect-bench8l-$f.log" 2>&1
  rc=$?
  echo "bisect bench-8l 4096 $f exit $rc wall $(( ($(date +%s%N) - s) / 1000000 )) ms (whole command)" | tee -a "$res/jobs.txt"
  head -4 "$res/bisect-bench8l-$f.log"
done
