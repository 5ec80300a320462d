#!/usr/bin/env bash
# The GPU evidence, run on the device machine from the repository root:
#   PRIMEWALK_COMMIT=<sha> bash tools/device_run.sh OUTDIR [check|bench|bf16|own|fairness|bisect|all|workers]
# check: a smoke test of captured steps (CUDA graphs; if it fails, the rest runs with
#        PRIMEWALK_GRAPHS=0 and says so), harness device-check (every op, CUDA vs CPU twin),
#        harness device-walker (walker check and speculative decoding on both backends), the
#        default matrix, the stdlib-small acceptance matrix and the Qwen3.5-layout bf16 tiny-q35
#        matrix (bf16-resident and widened weights) with --backend cuda.
# bench: harness bench (bench-8l vs transformers and hardware anchors: prime length curve to 131k,
#        decode vs floor, speculative decoding, the bf16 variant; time-boxed to fit one device command of 10 min).
#        BENCH_ARGS adds flags, e.g. BENCH_ARGS="--lengths 4096,32768 --skip stdlib".
# bf16:  exact-bf16 (issue #19): tools/probe_mma_gemm.py, then the default and stdlib matrices with
#        --backend cuda --mode exact-bf16 (device-check in "check" covers the MMA ops and the mode).
# own:   a user's own checkpoint (tests/own_checkpoint.py: random Qwen3-Next with MoE, tied
#        embeddings, conv kernel 3, its own tokenizer.json) on text prompts: its golden recorded
#        on the CPU twin, the same spec on CUDA, digests compared; and whether the first timed
#        chunk of the default matrix still carries compilation (it must not: warm-up).
# fairness: harness fairness on bench-8l (a 131,072-token prime beside 8 peers, drain vs yield;
#        tools/make_bench8l.py writes the model to out/bench-8l first): receipt and figures.
# workers (not part of all; issue #18): parallel matrix runs. The default matrix with two workers on
#        the GPU(s) (round-robin: on one GPU both share it), diffed with the golden CPU digests and
#        with the single-process cuda receipt; then the long-prompt matrix tools/specs/long.toml
#        with one worker and with two (one per GPU when there are two, else sharing one), diffed
#        with each other, and the speed-up (walls in walls.txt, receipts' wall_s).
# bisect: harness bisect (issue #12): tracing on vs off on CUDA (bitwise); the tiny model CPU vs
#         CUDA (no divergence expected) and with a fault on CUDA; then tools/device_bisect8l.sh:
#         bench-8l primed 4096 tokens on CUDA, batched vs split, with a fault and without (goal:
#         under a minute, compilation included; the model is kept in out/bench-8l).
# Everything lands in OUTDIR/results.tar (the device tool returns at most 8 files); unpack it and
# plot the matrix receipts on any machine (harness plot receipts/device/cuda-default.json).
set -euo pipefail
out=${1:?usage: tools/device_run.sh OUTDIR [check|bench|bf16|own|fairness|bisect|all|workers]}
what=${2:-all}  # check | bench | bf16 | own | fairness | bisect | all | workers
res="$out/results"
mkdir -p "$res"
# results.tar is written however the script ends: done, failed, or stopped by an outer `timeout`
# (TERM reaches every job of the process group; what finished comes back, the device tool's limit
# no longer loses a whole run)
trap 'exit 143' TERM
trap 'tar cf "$out/results.tar" -C "$out" results' EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MPLBACKEND=Agg
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$res/nvidia-smi.txt"
ms() { date +%s%N | cut -c1-13; }
if [ "$what" = check ] || [ "$what" = all ]; then
  if ! python tools/decode_kernels.py --out "$res/decode-kernels.json" > "$res/decode-kernels.log" 2>&1; then
    echo "decode kernels: a GEMV / GEMM differs from the CPU twin (or failed): see decode-kernels.log" | tee -a "$res/decode-kernels.log"
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
  python -m harness.cli device-check --out "$res/cuda-device-check.json" > "$res/device-check.log" 2>&1 || echo "device-check exit $?"
  tail -4 "$res/device-check.log"
  python -m harness.cli device-walker --out "$res/cuda-walker.json" > "$res/device-walker.log" 2>&1 || echo "device-walker exit $?"
  tail -4 "$res/device-walker.log"
  t0=$(ms)
  python -m harness.cli run-matrix --backend cuda --out "$res/cuda-default.json" --quiet --no-plots || echo "run-matrix exit $?"
  t1=$(ms)
  echo "default matrix, run-matrix --backend cuda wall (process, compilation included): $((t1 - t0)) ms" | tee -a "$res/walls.txt"
  python -m harness.cli run-matrix --spec harness/specs/stdlib.toml --backend cuda --out "$res/cuda-stdlib.json" --quiet --no-plots || echo "run-matrix stdlib exit $?"
  t2=$(ms)
  echo "stdlib matrix, run-matrix --backend cuda wall (process, compilation included): $((t2 - t1)) ms" | tee -a "$res/walls.txt"
  # the Qwen3.5-layout bf16 model: every schedule on CUDA with bf16-resident weights (the default
  # for a bf16 checkpoint) and widened to float32; both must equal the CPU golden's digests
  for w in bf16 f32; do
    python -m harness.cli run-matrix --spec harness/specs/tiny-q35.toml --backend cuda --weights "$w" \
      --out "$res/cuda-tiny-q35-$w.json" --quiet --no-plots || echo "run-matrix tiny-q35 $w exit $?"
    python -m harness.cli diff receipts/golden/tiny-q35.json "$res/cuda-tiny-q35-$w.json" --digests-only \
      | tee "$res/tiny-q35-$w-diff.txt" | tail -2 || echo "tiny-q35 $w diff exit $?"
  done
fi
if [ "$what" = own ] || [ "$what" = all ]; then
  own="$out/own"
  mkdir -p "$own"
  python tools/own_spec.py "$own"
  python -m harness.cli run-matrix --spec "$own/own.toml" --update-golden --golden "$res/own-cpu.json" --quiet --no-plots \
    || echo "own cpu exit $?"
  python -m harness.cli run-matrix --spec "$own/own.toml" --backend cuda --out "$res/own-cuda.json" --quiet --no-plots \
    || echo "own cuda exit $?"
  python -m harness.cli diff --digests-only "$res/own-cpu.json" "$res/own-cuda.json" | tee "$res/own-diff.txt" | tail -3
  if [ -f "$res/cuda-default.json" ]; then
    python - "$res/cuda-default.json" <<'PY' | tee -a "$res/walls.txt"
import json, statistics, sys
r = json.load(open(sys.argv[1]))
chunks = [c["timings"]["chunk_wall_s"][0] for c in r["cells"] if c["timings"].get("chunk_wall_s")]
print(f"default matrix on cuda: warm-up {r.get('warmup_s', 0):.1f} s; first timed chunk {chunks[0] * 1e3:.1f} ms, "
      f"median first chunk {statistics.median(chunks) * 1e3:.1f} ms, max {max(chunks) * 1e3:.1f} ms")
PY
  fi
fi
if [ "$what" = bf16 ] || [ "$what" = all ]; then
  # exact-bf16 (issue #19): the tensor-core GEMM probe (bitwise vs the CPU twin, timed vs torch bf16),
  # then the default and stdlib matrices in the mode on the GPU (diff them against the CPU receipts)
  python tools/probe_mma_gemm.py --out "$res/mma-gemm" > "$res/probe-mma-gemm.log" 2>&1 || echo "probe_mma_gemm exit $?"
  tail -12 "$res/probe-mma-gemm.log"
  t0=$(ms)
  python -m harness.cli run-matrix --backend cuda --mode exact-bf16 --out "$res/cuda-default-bf16.json" --quiet --no-plots || echo "run-matrix bf16 exit $?"
  t1=$(ms)
  echo "default matrix exact-bf16, --backend cuda wall: $((t1 - t0)) ms" | tee -a "$res/walls.txt"
  python -m harness.cli run-matrix --spec harness/specs/stdlib.toml --backend cuda --mode exact-bf16 --out "$res/cuda-stdlib-bf16.json" --quiet --no-plots || echo "run-matrix stdlib bf16 exit $?"
  t2=$(ms)
  echo "stdlib matrix exact-bf16, --backend cuda wall: $((t2 - t1)) ms" | tee -a "$res/walls.txt"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  # shellcheck disable=SC2086
  python -m harness.cli bench --out "$res/cuda-bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$res/bench.log" | tail -60 || echo "bench exit $?"
fi
if [ "$what" = fairness ] || [ "$what" = all ]; then
  [ -f out/bench-8l/config.json ] || python tools/make_bench8l.py --out out/bench-8l > "$res/make-bench8l.log" 2>&1 || echo "make_bench8l exit $?"
  python -m harness.cli fairness --spec harness/specs/fairness/bench-8l.toml --backend cuda \
    --out "$res/cuda-bench-8l.json" > "$res/fairness.log" 2>&1 || echo "fairness exit $?"
  tail -8 "$res/fairness.log"
fi
if [ "$what" = workers ]; then
  ngpu=$(nvidia-smi -L | wc -l)
  h="python -m harness.cli"
  t0=$(ms)
  $h run-matrix --backend cuda --out "$res/cuda-default.json" --quiet --no-plots || echo "run-matrix exit $?"
  t1=$(ms)
  $h run-matrix --backend cuda --workers 2 --out "$res/cuda-default-w2.json" --quiet --no-plots 2> "$res/default-w2.err" || echo "run-matrix --workers 2 exit $?"
  t2=$(ms)
  echo "default matrix, cuda, single process: $((t1 - t0)) ms; --workers 2 on $ngpu GPU(s): $((t2 - t1)) ms (processes, compilation included)" | tee -a "$res/walls.txt"
  $h diff --digests-only receipts/golden/default.json "$res/cuda-default-w2.json" | tail -1 | tee -a "$res/walls.txt"
  $h diff "$res/cuda-default.json" "$res/cuda-default-w2.json" | tail -1 | tee -a "$res/walls.txt"
  two="--workers 2"
  [ "$ngpu" -ge 2 ] && two="--gpus 0,1"
  t0=$(ms)
  $h run-matrix --spec tools/specs/long.toml --workers 1 --out "$res/cuda-long-w1.json" --quiet --no-plots || echo "long w1 exit $?"
  t1=$(ms)
  $h run-matrix --spec tools/specs/long.toml $two --out "$res/cuda-long-w2.json" --quiet --no-plots 2> "$res/long-w2.err" || echo "long w2 exit $?"
  t2=$(ms)
  echo "long matrix, one worker: $((t1 - t0)) ms; $two on $ngpu GPU(s): $((t2 - t1)) ms (processes, compilation included)" | tee -a "$res/walls.txt"
  $h diff "$res/cuda-long-w1.json" "$res/cuda-long-w2.json" | tail -1 | tee -a "$res/walls.txt"
  python - "$res/cuda-long-w1.json" "$res/cuda-long-w2.json" <<'PY' | tee -a "$res/walls.txt"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
busy = lambda r: sum(w["busy_s"] for w in r["executor"]["workers"])
print(f"long matrix: one worker {a['wall_s']:.1f} s, two {b['wall_s']:.1f} s: speed-up {a['wall_s'] / b['wall_s']:.2f}x "
      f"(worker busy time {busy(a):.1f} s vs {busy(b):.1f} s; cells {len(b['cells'])})")
PY
fi
if [ "$what" = bisect ] || [ "$what" = all ]; then
  bis() {  # exit 1 (a divergence) is the expected result with a fault
    local name=$1 rc=0 t0; shift; t0=$(ms)
    python -m harness.cli bisect "$@" --out "$res/cuda-bisect-$name.json" > "$res/bisect-$name.log" 2>&1 || rc=$?
    echo "bisect $name exit $rc wall $(( $(ms) - t0 )) ms: $*" | tee -a "$res/walls.txt"
    head -4 "$res/bisect-$name.log"
  }
  python - > "$res/trace-on-off.txt" 2>&1 <<'PY' || echo "trace on/off check FAILED" | tee -a "$res/trace-on-off.txt"
from harness.engine.trace import Trace
from harness.matrix import bisect as bs, runner
for sched in ("unyielded", "tokenwise", "split:128", "yield:64"):  # CUDA: traced vs untraced (graphs on)
    a, _, _ = bs.schedule_sides(None, 257, sched, sched, "cuda", "cuda", k=2, max_new=16)
    plain = runner.run_cell(a.engine, a.cell, a.ids, 16)
    traced = runner.run_cell(a.engine, a.cell, a.ids, 16, trace=Trace(a.engine))
    same = traced.digests == plain.digests and traced.tokens == plain.tokens
    print(f"trace on/off {sched}: {'bitwise' if same else 'DIFFERS'}")
    assert same, sched
PY
  cat "$res/trace-on-off.txt"
  bis tiny-cpu-cuda --prompt-len 257 --a batched --b batched --k 2 --backend-a cpu --backend-b cuda
  bis tiny-cpu-cuda-fault --prompt-len 257 --a tokenwise --b yield:128 --k 2 --backend-a cpu --backend-b cuda \
      --fault 2:recurrence:200
  bash tools/device_bisect8l.sh "$res"  # bench-8l primed 4,096 tokens, with a fault and without
fi
