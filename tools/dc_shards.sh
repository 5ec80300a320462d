#!/usr/bin/env bash
# harness device-check as N processes side by side (compiling the kernels is CPU-bound and the
# device machine has many cores), their receipts merged into one:
#   [T=480] bash tools/dc_shards.sh DIR MERGED.json N [device-check options, e.g. --ops linear_mma]
# Each shard writes DIR/device-check-shard<i>.log (printed after, every case's line, then the
# merged verdict) and is bounded by T seconds. Exit 0 only when every shard and the merge passed.
# A shard that ends writes its receipt DIR/dc-shard<i>.json, kept there until the merge passes, so a
# run stopped part-way keeps the shards that finished: DC_FROM=FOLDER copies such receipts (from an
# earlier run of the same check: the same N, options, code, commit and device; --merge refuses
# shards that differ) into DIR first, and a shard whose receipt is in DIR is not run again.
set -uo pipefail
dir=${1:?usage: tools/dc_shards.sh DIR MERGED.json N [options]} merged=${2:?} n=${3:?}
shift 3
h="python -m harness.cli"
mkdir -p "$dir"
pids=() rc=0
if [ -n "${DC_FROM:-}" ]; then
  ls "$DC_FROM"/dc-shard*.json > /dev/null 2>&1 || { echo "dc_shards: no dc-shard*.json in DC_FROM=$DC_FROM" >&2; exit 2; }
  [ "$(cd "$DC_FROM" && pwd)" = "$(cd "$dir" && pwd)" ] || cp "$DC_FROM"/dc-shard*.json "$dir/"
fi
for ((i = 0; i < n; i++)); do
  if [ -f "$dir/dc-shard$i.json" ]; then
    echo "dc_shards: shard $i/$n kept from an earlier run ($dir/dc-shard$i.json), not run again"
    continue
  fi
  timeout "${T:-480}" $h device-check "$@" --shard "$i/$n" --out "$dir/dc-shard$i.json" > "$dir/device-check-shard$i.log" 2>&1 &
  pids+=($!)
done
for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || rc=1; done
cat "$dir"/device-check-shard*.log 2> /dev/null
$h device-check --merge "$dir"/dc-shard*.json --out "$merged" && rm -f "$dir"/dc-shard*.json || rc=1
exit $rc
