"""``harness device-check``, ``harness device-walker``, ``harness bench``: the GPU evidence
(:mod:`harness.gpu`); each needs a CUDA GPU, ``bench`` also torch and transformers.
``harness evidence`` (does the committed GPU evidence match this code?) and ``harness mma-check``
(the CPU emulation of the tensor-core MMA against recorded hardware vectors) run anywhere."""

from __future__ import annotations

import os

from ..errors import PrimewalkError
from ..gpu import bench, devicecheck, evidence, mmacheck


def require_gpu(command: str, what: str) -> None:
    """Refuse, in one line, a GPU-only command on a machine without a CUDA GPU (before anything
    loads; these commands have no --backend to fall back on)."""
    try:
        from numba import cuda

        ok = cuda.is_available()
    except Exception:  # numba-cuda missing or broken: no GPU for us either way
        ok = False
    if not ok:
        raise PrimewalkError(f"{command} {what} and needs a CUDA GPU; none is available on this machine "
                             "(the CPU-only evidence checks are harness evidence and harness mma-check)")


def cmd_device_check(args) -> int:
    if args.merge:
        if args.shard or args.ops:
            raise PrimewalkError("device-check --merge joins finished shards; --shard and --ops belong to the runs")
        r = devicecheck.merge_shards(args.merge, args.out)
    else:
        shard = devicecheck.parse_shard(args.shard) if args.shard else None
        require_gpu("device-check", "runs every kernel on CUDA against the CPU twin")
        ops = [x for x in (args.ops or "").split(",") if x] or None
        r = devicecheck.device_check(args.out, commit=args.commit, full=not args.quick, seed=args.seed, ops=ops,
                                     shard=shard)
    s = r["summary"]
    ok = s["ops"] == s["ops_bitwise"] and s["schedules"] == s["schedules_bitwise"]
    print(f"device-check {'PASS' if ok else 'FAIL'}: {s['ops_bitwise']}/{s['ops']} ops bitwise, "
          f"{s['schedules_bitwise']}/{s['schedules']} schedules bitwise; receipt {args.out}")
    return 0 if ok else 1


def cmd_device_walker(args) -> int:
    require_gpu("device-walker", "runs the walker check on CUDA against the CPU twin")
    r = devicecheck.device_walker(args.out, commit=args.commit)
    s = r["summary"]
    ok = s["all_pass"] and s["digests_equal"]
    print(f"device-walker {'PASS' if ok else 'FAIL'}: {s['cases']} cases, all pass {s['all_pass']}, "
          f"CPU/CUDA digests equal {s['digests_equal']}; receipt {args.out}")
    return 0 if ok else 1


def cmd_bench(args) -> int:
    require_gpu("bench", "times the CUDA kernels")
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else None
    skip = [x for x in (args.skip or "").split(",") if x]
    r = bench.run_bench(args.out, commit=args.commit, quick=args.quick, lengths=lengths, skip=skip,
                        budget_s=args.budget_s)
    print(bench.table(r))
    print(f"wrote {args.out}")
    return 0


def register(sub) -> None:
    commit = os.environ.get("PRIMEWALK_COMMIT")
    p = sub.add_parser("device-check", help="every kernel and schedule on CUDA vs the CPU twin, bitwise")
    p.add_argument("--out", default="receipts/device/cuda-device-check.json", help="receipt path")
    p.add_argument("--commit", default=commit, help="commit the tree is at (recorded)")
    p.add_argument("--quick", action="store_true", help="small shapes only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ops", help="only these ops' cases, comma-separated, and no schedules (a partial receipt, "
                                 "for kernel work; harness evidence does not accept it)")
    p.add_argument("--shard", metavar="I/N", help="every N-th op case and model run from the I-th: N of these "
                                                  "side by side on one GPU, then --merge (a partial receipt)")
    p.add_argument("--merge", nargs="+", metavar="SHARD.json",
                   help="join the N shard receipts of one check into the receipt at --out (no GPU needed)")
    p.set_defaults(func=cmd_device_check)

    p = sub.add_parser("device-walker", help="prime-walker check and speculative decoding on CUDA vs CPU, digests")
    p.add_argument("--out", default="receipts/device/cuda-walker.json", help="receipt path")
    p.add_argument("--commit", default=commit, help="commit the tree is at (recorded)")
    p.set_defaults(func=cmd_device_walker)

    p = sub.add_parser("bench", help="bench-8l on CUDA vs transformers and hardware anchors (needs a GPU, torch)")
    p.add_argument("--out", default="receipts/bench/cuda-bench.json")
    p.add_argument("--commit", default=commit)
    p.add_argument("--quick", action="store_true", help="prime curve at 4096 and 16384 only, for a fast run")
    p.add_argument("--lengths", help="prime curve lengths, comma-separated (default 4096,16384,32768,131072)")
    p.add_argument("--skip", help=f"comma-separated parts to leave out: {', '.join(bench.SKIPPABLE)}")
    p.add_argument("--budget-s", type=float, default=bench.DEFAULT_BUDGET_S,
                   help="time box of the whole run in seconds: curve points predicted not to fit are recorded "
                        "'skipped' (default %(default)s; the device command allows 600)")
    p.set_defaults(func=cmd_bench)

    evidence.register(sub)
    mmacheck.register(sub)
