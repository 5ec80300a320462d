#!/usr/bin/env bash
# The GPU evidence in one device command, every check at once: each runs in its own process
# (compiling the kernels is CPU-bound and the device machine has many cores), on one GPU. Then the
# CPU-side comparisons with the committed CPU receipts. harness bench runs separately, alone on
# the GPU (its timings are the measurement): bash tools/device_run.sh OUTDIR bench.
#   PRIMEWALK_COMMIT=<sha> [MODE_BF16=1] [BISECT_8L=1] bash tools/device_evidence.sh OUTDIR
# MODE_BF16=1 adds the exact-bf16 tiny matrix on both targets and the default and stdlib matrices
# in the mode on CUDA (against the committed CPU runs in receipts/exact-bf16/, where there is one); BISECT_8L=1 then times harness bisect
# on a 4,096-token bench-8l prime on CUDA (issue #12's goal), alone on the GPU.
# Writes OUTDIR/results.tar: the receipts, one log per job, jobs.txt (exit code and seconds of
# each), diffs.txt (each CUDA receipt against its CPU golden). T (seconds, default 300) bounds
# each job (device-check: T_CHECK, default 480, for each of its DC_SHARDS (default 3) processes -- unsharded
# it took 356 s at e4fc9b4 and ran out of 480 at 927f759 --; device-walker: 380).
set -uo pipefail
out=${1:?usage: tools/device_evidence.sh OUTDIR}
T=${T:-300}
res="$out/results"
mkdir -p "$res"
# results.tar is written however the script ends: done, failed, or stopped by an outer `timeout`
# (TERM reaches every job of the process group; what finished comes back, the device tool's limit
# no longer loses a whole run)
trap 'exit 143' TERM
trap 'tar cf "$out/results.tar" -C "$out" results' EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MPLBACKEND=Agg
h="python -m harness.cli"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$res/nvidia-smi.txt"
job() {
  local name=$1; shift
  (
    s=$(date +%s)
    if [ "$(type -t "$1")" = function ]; then "$@"; else timeout "$T" "$@"; fi > "$res/$name.log" 2>&1
    echo "$name exit $? $(( $(date +%s) - s )) s" >> "$res/jobs.txt"
  ) &
}
own_spec() {  # a user's own checkpoint (tests/own_checkpoint.py) with its tokenizer, on text prompts
  python tools/own_spec.py "$out/own" &&
    timeout "$T" $h run-matrix --spec "$out/own/own.toml" --update-golden --golden "$res/own-cpu.json" --quiet --no-plots &&
    timeout "$T" $h run-matrix --spec "$out/own/own.toml" --backend cuda --out "$res/own-cuda.json" --quiet --no-plots
}
dc_shards() { bash tools/dc_shards.sh "$res" "$res/cuda-device-check.json" "${DC_SHARDS:-3}"; }
T=${T_CHECK:-480} job device-check dc_shards
T=380 job device-walker $h device-walker --out "$res/cuda-walker.json"
job default $h run-matrix --backend cuda --out "$res/cuda-default.json" --quiet --no-plots
job stdlib $h run-matrix --spec harness/specs/stdlib.toml --backend cuda --out "$res/cuda-stdlib.json" --quiet --no-plots
job tiny-q35-bf16 $h run-matrix --spec harness/specs/tiny-q35.toml --backend cuda --weights bf16 \
  --out "$res/cuda-tiny-q35-bf16.json" --quiet --no-plots
job tiny-q35-f32 $h run-matrix --spec harness/specs/tiny-q35.toml --backend cuda --weights f32 \
  --out "$res/cuda-tiny-q35-f32.json" --quiet --no-plots
job workers2 $h run-matrix --spec harness/specs/tiny.toml --backend cuda --workers 2 \
  --out "$res/cuda-tiny-w2.json" --quiet --no-plots
job bisect-cpu-cuda $h bisect --prompt-len 257 --a batched --b batched --k 2 --backend-a cpu --backend-b cuda \
  --out "$res/cuda-bisect-tiny-cpu-cuda.json"
job bisect-fault $h bisect --prompt-len 257 --a tokenwise --b yield:128 --k 2 --backend-a cpu --backend-b cuda \
  --fault 2:recurrence:200 --out "$res/cuda-bisect-tiny-fault.json"
job own own_spec
if [ "${MODE_BF16:-0}" = 1 ]; then
  job mma-tiny $h run-matrix --spec harness/specs/tiny.toml --backend cuda --mode exact-bf16 \
    --out "$res/cuda-tiny-exact-bf16.json" --quiet --no-plots
  job mma-tiny-cpu $h run-matrix --spec harness/specs/tiny.toml --mode exact-bf16 \
    --out "$res/cpu-tiny-exact-bf16.json" --quiet --no-plots
  # the default and stdlib matrices in the mode on CUDA, against the CPU twin's committed runs
  # (receipts/exact-bf16/cpu-{default,stdlib}.json: the twin takes minutes, the device's CPUs
  # are busy compiling)
  job mma-default $h run-matrix --backend cuda --mode exact-bf16 --out "$res/cuda-default-exact-bf16.json" \
    --quiet --no-plots
  job mma-stdlib $h run-matrix --spec harness/specs/stdlib.toml --backend cuda --mode exact-bf16 \
    --out "$res/cuda-stdlib-exact-bf16.json" --quiet --no-plots
fi
wait
sort "$res/jobs.txt"
if [ "${BISECT_8L:-0}" = 1 ]; then
  # issue #12's goal, alone on the GPU after the jobs above (tools/device_bisect8l.sh)
  bash tools/device_bisect8l.sh "$res"
fi
{
  d() { echo "== $*"; $h diff --digests-only "$@" 2>&1 | tail -2; }
  d receipts/golden/default.json "$res/cuda-default.json"
  d receipts/stdlib/cpu.json "$res/cuda-stdlib.json"
  d receipts/golden/tiny-q35.json "$res/cuda-tiny-q35-bf16.json"
  d receipts/golden/tiny-q35.json "$res/cuda-tiny-q35-f32.json"
  d receipts/golden/tiny.json "$res/cuda-tiny-w2.json"
  d "$res/own-cpu.json" "$res/own-cuda.json"
  [ -f "$res/cuda-tiny-exact-bf16.json" ] && d "$res/cpu-tiny-exact-bf16.json" "$res/cuda-tiny-exact-bf16.json"
  for m in default stdlib; do  # (stdlib: no CPU run committed yet, see the README's exact-bf16 section)
    [ -f "$res/cuda-$m-exact-bf16.json" ] && [ -f "receipts/exact-bf16/cpu-$m.json" ] &&
      d "receipts/exact-bf16/cpu-$m.json" "$res/cuda-$m-exact-bf16.json"
  done
} > "$res/diffs.txt" 2>&1
cat "$res/diffs.txt"
for f in device-check device-walker; do tail -2 "$res/$f.log"; done
tail -n 3 "$res/bisect-cpu-cuda.log" "$res/bisect-fault.log"
