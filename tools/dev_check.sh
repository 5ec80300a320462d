#!/usr/bin/env bash
# A kernel-work check on the device machine (not the evidence): the named ops' device-check cases,
# the default matrix on CUDA diffed with the golden CPU digests, then (alone on the GPU) the decode
# profile with driver-call times and Nsight Compute's per-kernel times of one captured step.
#   [OPS=add_rmsnorm,rmsnorm [DC_SHARDS=N]] [NCU=0] [ROWS=1,5] [PROFILE_ARGS="--api-times --cprofile"] [SWEEP=1] bash tools/dev_check.sh OUTDIR
# SWEEP=1 then times GEMV configurations on the N = 2,048 decode shapes (tools/decode_kernels.py --sweep, L2-cold, ~3-5 min;
# bounded by T_SWEEP, default 200 s; SWEEP_ARGS adds options, e.g. "--sweep-large --sweep-rows 1,2,4,5"). AB="--weights bf16" runs the decode profile again with those options.
# MODE=exact-bf16: the decode profile and the Nsight step in that mode (PROFILE_ARGS gets --mode). MATRIX=0 skips
# the default matrix, PROFILE=0 the decode profile. VD=1 then runs tools/probe_vd.py (the exact-bf16 GEMV's variants, timed and
# bitwise; VD_ARGS adds options, e.g. --production) and Nsight Compute's memory, occupancy, warp-state, instruction and
# source-counter (stall reasons by instruction) sections and the stall metrics on its production kernel (NCU_VD_ARGS, e.g.
# --shapes "gdn out"); NCU_ATTN=1 the same on one 4,096-row launch of the packed attention (tools/probe_attn_pk.py).
# NCU_PRIME=1: Nsight Compute's per-kernel time, warp instructions and DRAM bytes of one 4,096-token chunk of the
# bench-8l prime in MODE (default exact-bf16) at each start of NCU_PRIME_STARTS (default "0 28672": the first and the
# last chunk of a 32 k prime; tools/profile_prime_mma.py --ncu-chunk, tools/ncu_summary.py).
# GEMM=1 runs tools/probe_mma_gemm.py (bf16 weights, bench-8l's prime shapes; GEMM_ARGS adds options, e.g. --g16 NAMES
# with patches/next-g16-tiles.patch), ATTN=1 tools/probe_attn_pk.py (ATTN_ARGS, e.g. --configs), PRIME=1
# tools/profile_prime_mma.py --lengths 4096,32768 (the exact-bf16 bench-8l prime, per op); each bounded by T_PROBE (150 s).
# The device call's own limit kills everything unfinished: run it as `timeout 560 bash tools/dev_check.sh D; tar ...`
# so that what finished comes back.
set -uo pipefail
out=${1:?usage: tools/dev_check.sh OUTDIR}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MPLBACKEND=Agg NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/nbcache}
h="python -m harness.cli"
# Nsight Compute's sections for the kernel steps below, with the stall reasons per issued instruction
NCU_SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/nvidia-smi.txt"
s=$(date +%s)
ops_check() {  # the OPS cases, in DC_SHARDS processes side by side, merged (tools/dc_shards.sh)
  T=${T_CHECK:-480} bash tools/dc_shards.sh "$out" "$out/dc.json" "${DC_SHARDS:-1}" --ops "$OPS" > "$out/dc.log" 2>&1
}
[ -n "${OPS:-}" ] && ( ops_check; echo "device-check exit $?" >> "$out/jobs.txt" ) &
[ "${MATRIX:-1}" = 1 ] && ( $h run-matrix --backend cuda --out "$out/default.json" --quiet --no-plots > "$out/default.log" 2>&1
  echo "default exit $?" >> "$out/jobs.txt"
  $h diff --digests-only receipts/golden/default.json "$out/default.json" > "$out/diff.txt" 2>&1
  echo "diff exit $?" >> "$out/jobs.txt" ) &
wait
echo "parallel part $(( $(date +%s) - s )) s" >> "$out/jobs.txt"
cat "$out/jobs.txt"; tail -n 3 "$out"/dc.log "$out/diff.txt" 2>/dev/null
mode=${MODE:+--mode $MODE}
[ "${PROFILE:-1}" = 1 ] && python tools/decode_profile.py --out "$out/profile.json" --rows ${ROWS:-1,5} ${PROFILE_ARGS:---api-times} $mode > "$out/profile.log" 2>&1
echo "profile exit $?" >> "$out/jobs.txt"; cut -c1-1500 "$out/profile.log"
if [ -n "${AB:-}" ]; then  # the same profile with other options (an A/B of one setting, e.g. --weights bf16)
  python tools/decode_profile.py --out "$out/profile-ab.json" --rows ${ROWS:-1,5} ${PROFILE_ARGS:---api-times} $AB \
    > "$out/profile-ab.log" 2>&1
  echo "profile-ab exit $?" >> "$out/jobs.txt"; cut -c1-300 "$out/profile-ab.log"
fi
if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
  ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    python tools/decode_profile.py --out "$out/x.json" --rows 1 --ncu-step 1 $mode > "$out/ncu-R1.csv" 2> "$out/ncu.log"
  python tools/ncu_summary.py "$out/ncu-R1.csv"
fi
if [ "${SWEEP:-0}" = 1 ]; then
  timeout "${T_SWEEP:-200}" python tools/decode_kernels.py --out "$out/kernels.json" --sweep ${SWEEP_ARGS:-} > "$out/kernels.log" 2>&1
  echo "kernels exit $?" >> "$out/jobs.txt"; grep "^sweep" "$out/kernels.log"
fi
if [ "${VD:-0}" = 1 ]; then
  python tools/probe_vd.py --out "$out" ${VD_ARGS:-} > "$out/probe-vd.log" 2>&1
  echo "probe-vd exit $?" >> "$out/jobs.txt"; cat "$out/probe-vd.log"
  if [ "${NCU_VD:-1}" = 1 ] && command -v ncu > /dev/null; then
    ncu --clock-control none --kernel-name regex:linear_mma_vd $NCU_SECTIONS --csv --page details \
      python tools/probe_vd.py --ncu --rows 1 ${NCU_VD_ARGS:-} > "$out/ncu-vd.csv" 2> "$out/ncu-vd.log"
    echo "ncu-vd exit $?" >> "$out/jobs.txt"
  fi
fi
if [ "${NCU_ATTN:-0}" = 1 ] && command -v ncu > /dev/null; then  # the packed attention, one 4,096-row launch
  ncu --clock-control none --kernel-name regex:attention_mma_pk_k --launch-count 1 $NCU_SECTIONS --csv --page details \
    python tools/probe_attn_pk.py --out "$out/ncu-attn" --configs 4,2,128 --starts 0 > "$out/ncu-attn.csv" 2> "$out/ncu-attn.log"
  echo "ncu-attn exit $?" >> "$out/jobs.txt"
fi
if [ "${NCU_PRIME:-0}" = 1 ] && command -v ncu > /dev/null; then
  for st in ${NCU_PRIME_STARTS:-0 28672}; do
    ncu --clock-control none --profile-from-start off --csv \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum \
      python tools/profile_prime_mma.py --out "$out/x.json" --ncu-chunk "$st" $mode > "$out/ncu-prime-$st.csv" \
      2> "$out/ncu-prime-$st.log"
    echo "ncu-prime-$st exit $?" >> "$out/jobs.txt"; python tools/ncu_summary.py "$out/ncu-prime-$st.csv" | head -n 30
  done
fi
probe() {  # name, then the command: bounded, its output in $out/NAME.log, its exit in jobs.txt
  local name=$1; shift
  timeout "${T_PROBE:-150}" "$@" > "$out/$name.log" 2>&1
  echo "$name exit $?" >> "$out/jobs.txt"; grep -v "Writing model" "$out/$name.log" | tail -n 25 | cut -c1-300
}
[ "${GEMM:-0}" = 1 ] && probe gemm python tools/probe_mma_gemm.py --out "$out" --weights bf16 --shapes prime ${GEMM_ARGS:-}
[ "${ATTN:-0}" = 1 ] && probe attn python tools/probe_attn_pk.py --out "$out" ${ATTN_ARGS:-}
[ "${PRIME:-0}" = 1 ] && probe prime python tools/profile_prime_mma.py --out "$out/prime.json" --lengths 4096,32768
echo "total $(( $(date +%s) - s )) s"
