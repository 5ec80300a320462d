#!/usr/bin/env bash
# A/B of a captured decode step in one device call: a base tree (another commit's code) and this
# tree, the same tools/decode_profile.py options, one after the other on the same GPU -- figures
# from two calls are not comparable (each call may start another machine).
#   here:   bash tools/ab_decode.sh --pack REV          # writes ab-base.tgz (REV's code, small)
#   device: bash tools/ab_decode.sh OUTDIR [decode_profile options, e.g. --mode exact-bf16 --rows 1,5]
#           TOOL=probe_draft bash tools/ab_decode.sh OUTDIR [probe_draft options, e.g. --sizes 32768 --ks 1,3]
# (TOOL=probe_draft: the draft step of tools/probe_draft.py instead, --out given here; it prints
# both trees' draft steps per vocabulary and K, and exits 0 when this tree's are all faster.
# TOOL=bench_spec: the bench's speculative-decoding part alone, where #16's draft and verify goals
# are taken -- harness bench --lengths 4096 --skip every other part, plus the options given --
# printing both trees' stepwise decode, draft and verify steps; exit 0 when every draft step of
# this tree is faster.)
# BASE_ENV="VAR=value ..." instead of ab-base.tgz: the base side is this tree run with that environment
# (a setting A/B'd against this side's THIS_ENV, e.g. BASE_ENV=PRIMEWALK_L2_PREFETCH=0).
# ab-base.tgz is git-ignored: the device call carries it (the run tool's carry: ["ab-base.tgz"]). Writes
# OUTDIR/{base,this}.{json,log} and prints, per row count, both whole-step times. Exit 0 when this
# tree's step is faster at every row count and each captured step equals the same step run eagerly
# (decode_profile.py's captured_equals_eager, where it reports it); 1 when not; 2 on an error.
set -uo pipefail
if [ "${1:-}" = --pack ]; then
  rev=${2:?usage: tools/ab_decode.sh --pack REV}
  # the code decode_profile.py runs; the trained models (harness/models/stdlib-small) are not needed
  git archive --format=tar "$rev" numba_kernels harness tools pyproject.toml |
    tar --delete --wildcards 'harness/models/stdlib-small/*' | gzip > ab-base.tgz || exit 2
  echo "ab-base.tgz: $(git rev-parse --short "$rev") ($(du -h ab-base.tgz | cut -f1))"
  exit 0
fi
out=${1:?usage: tools/ab_decode.sh OUTDIR [decode_profile options] | --pack REV}
shift
[ -n "${BASE_ENV:-}" ] || [ -f ab-base.tgz ] || { echo "tools/ab_decode.sh: no ab-base.tgz here (make it with --pack REV, or set BASE_ENV)" >&2; exit 2; }
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/nbcache}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2  # absolute: the base side runs in another directory
here=$PWD
if [ -n "${BASE_ENV:-}" ]; then base=$here; else base=$(mktemp -d) && tar xzf ab-base.tgz -C "$base" || exit 2; fi
tool=${TOOL:-decode_profile}
case $tool in decode_profile|probe_draft|bench_spec) ;; *) echo "tools/ab_decode.sh: TOOL must be decode_profile, probe_draft or bench_spec, not $tool" >&2; exit 2;; esac
for side in base this; do
  dir=$here; [ $side = base ] && dir=$base
  envs=${THIS_ENV:-}; [ $side = base ] && envs=${BASE_ENV:-}
  if [ $tool = bench_spec ]; then
    cmd=(python -m harness.cli bench --lengths 4096 --skip hf,hf-bf16,profile,stdlib,walker,decode-32k,bf16,mma --budget-s 170)
  else
    cmd=(python tools/$tool.py)
  fi
  (cd "$dir" && env $envs PYTHONPATH=. timeout "${T:-200}" "${cmd[@]}" --out "$out/$side.json" "$@" > "$out/$side.log" 2>&1)
  rc=$?
  echo "$side: $tool exit $rc"
  [ $rc = 0 ] || { tail -n 3 "$out/$side.log"; exit 2; }
done
if [ $tool = bench_spec ]; then
python3 - "$out/base.json" "$out/this.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"device: {b.get('device', 'not recorded')}")
pa, pb = a["primewalk"], b["primewalk"]
print(f"stepwise decode step {pa['decode_512_stepwise_step_ms']['median']:.3f} / {pb['decode_512_stepwise_step_ms']['median']:.3f} ms")
ok = True
for k in sorted(pa["spec"]):
    sa, sb = pa["spec"][k], pb["spec"][k]
    pairs = [("draft", sa["draft_step_ms"], sb["draft_step_ms"])]
    if "draft_vocab" in sa and "draft_vocab" in sb:
        pairs.append((f"draft among {sa['draft_vocab']['size']}", sa["draft_vocab"]["draft_step_ms"], sb["draft_vocab"]["draft_step_ms"]))
    ok = ok and all(y < x for _, x, y in pairs)
    print(f"{k}: " + ", ".join(f"{n} {x:.3f} / {y:.3f} ms" for n, x, y in pairs)
          + f", verify {sa['verify_step_ms']:.3f} / {sb['verify_step_ms']:.3f} ms")
for g in ("verify_step_over_decode", "draft_step_k3_draft_vocab_over_decode"):
    va, vb = (d["goals"].get(g, {}).get("value") for d in (a, b))
    if va is not None and vb is not None:
        print(f"{g}: {va:.3f} / {vb:.3f}")
sys.exit(0 if ok else 1)
PY
exit $?
fi
if [ $tool = probe_draft ]; then
python3 - "$out/base.json" "$out/this.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"device: {b.get('device', 'not recorded')}; stepwise decode {a['decode_512_stepwise_ms']:.3f} / {b['decode_512_stepwise_ms']:.3f} ms")
ok = True
for ra, rb in zip(a["rows"], b["rows"]):
    ok = ok and rb["draft_step_ms"] < ra["draft_step_ms"]
    print(f"N={ra['draft_vocab']} K={ra['k']}: base {ra['draft_step_ms']:.3f} ms ({ra['over_decode']:.3f} x), "
          f"this {rb['draft_step_ms']:.3f} ms ({rb['over_decode']:.3f} x); issued after {ra['issue_ms'] or float('nan'):.3f} / {rb['issue_ms'] or float('nan'):.3f} ms")
sys.exit(0 if ok else 1)
PY
exit $?
fi
python3 - "$out/base.json" "$out/this.json" <<'PY'
import json, sys
docs = [json.load(open(p)) for p in sys.argv[1:3]]
a, b = (d["steps"] for d in docs)
print(f"device: {docs[1].get('device', 'not recorded')}")
ok = True
for r in a:
    eq = b[r].get("captured_equals_eager", True) and a[r].get("captured_equals_eager", True)
    faster = b[r]["whole_us"] < a[r]["whole_us"]
    ok = ok and eq and faster
    print(f"rows {r}: base {a[r]['whole_us']:.1f} us, this {b[r]['whole_us']:.1f} us "
          f"(device {a[r]['replay_device_us']:.1f} / {b[r]['replay_device_us']:.1f}"
          + (f"; chained {a[r]['chained_us']:.1f} / {b[r]['chained_us']:.1f}" if "chained_us" in a[r] and "chained_us" in b[r] else "")
          + ")"
          f"{'' if eq else '; captured != eager'}")
sys.exit(0 if ok else 1)
PY
