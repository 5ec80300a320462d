#!/usr/bin/env bash
# harness device-check as N processes side by side (compiling the kernels is CPU-bound and the
# device machine has many cores), their receipts merged into one:
#   [T=480] bash tools/dc_shards.sh DIR MERGED.json N [device-check options, e.g. --ops linear_mma]
# Each shard writes DIR/device-check-shard<i>.log (printed after, every case's line, then the
# merged verdict) and is bounded by T seconds. Exit 0 only when every shard and the merge passed.
set -uo pipefail
dir=${1:?usage: tools/dc_shards.sh DIR MERGED.json N [options]} merged=${2:?} n=${3:?}
shift 3
h="python -m harness.cli"
pids=() rc=0
for ((i = 0; i < n; i++)); do
  timeout "${T:-480}" $h device-check "$@" --shard "$i/$n" --out "$dir/dc-shard$i.json" > "$dir/device-check-shard$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$dir"/device-check-shard*.log
$h device-check --merge "$dir"/dc-shard*.json --out "$merged" && rm -f "$dir"/dc-shard*.json || rc=1
exit $rc
