"""``harness fairness``: a long prime beside peer sessions under each scheduling policy, proven
bitwise and measured (:mod:`harness.fairness`)."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import PrimewalkError
from ..fairness.specfile import BACKENDS, GOLDEN_DIR, SPECS_DIR, load_spec
from ..matrix.builtin import REPO
from .common import write_and_plot


def default_out(spec) -> str:
    return os.path.join("out", "fairness", f"{spec.stem}.json")


def _rel(path: str) -> str:
    return os.path.relpath(path, REPO)


def _update_golden_problems(spec, args) -> list:
    if spec.golden is None:
        raise PrimewalkError(f"--update-golden: {spec.where} is not a built-in fairness spec; only the specs "
                             f"under {_rel(SPECS_DIR)}/ have a committed receipt ({_rel(GOLDEN_DIR)}/<stem>.json)")
    why = []
    if spec.backend != "cpu":
        why.append(f"the backend is {spec.backend} (record a device receipt with --out)")
    if args.model is not None:
        why.append("--model is given")
    if args.out is not None:
        why.append("--out is given (the golden's path is fixed)")
    return why


def _fmt(v, unit=" s") -> str:
    return "—" if v is None else f"{v:.3g}{unit}"


def report(receipt: dict, path: str, plots) -> str:
    """What a run printed: one line per policy, the goals, failing cells, the verdict."""
    lines = []
    for p in receipt["policies"]:
        lines.append(f"{p['label']:>12}: peers' first event p50 {_fmt(p['peers_p50_s'])} p95 {_fmt(p['peers_p95_s'])} "
                     f"max {_fmt(p['peers_max_s'])}; long prompt's first token {_fmt(p['long_ttft_s'])} "
                     + (f"(x{p['long_ttft_over_alone']:.3f} alone)" if p["long_ttft_over_alone"] is not None else "")
                     + f"; longest tick {_fmt(p['longest_tick_s'])}, "
                     f"hold {_fmt(p['longest_hold_s'])}")
    for g in receipt["goals"]:
        state = {True: "met", False: "NOT met", None: "not measurable"}[g["met"]]
        lines.append(f"goal {g['metric']}({g['policy']}) <= {g['max_ratio']:g} x {g['metric']}({g['baseline']}): "
                     f"{state}" + (f" (ratio {g['ratio']:.4g})" if g["ratio"] is not None else ""))
    for c in receipt["cells"]:
        if c["verdict"]["status"] != "bitwise":
            lines.append(f"FAIL {c['id']}: {c['verdict']['detail']}")
    v = receipt["verdict"]
    text = (f"fairness: {v['sessions']} sessions x {len(receipt['policies'])} policies + alone: "
            + ("every session bitwise equal across policies and alone" if v["status"] == "bitwise"
               else f"{len(v['failed'])} of {v['cells']} cells differ")
            + f" in {receipt['wall_s']:.1f} s; receipt {path} (+ .csv)")
    if plots:
        text += f"; plots {os.path.splitext(path)[0]}.*.png ({len(plots)})"
    return "\n".join(lines + [text])


def cmd_fairness(args) -> int:
    from ..fairness.receipt import write_fairness_receipt
    from ..fairness.runner import run_fairness

    spec = load_spec(args.spec, backend=args.backend, model=args.model)
    if args.update_golden:
        why = _update_golden_problems(spec, args)
        if why:
            raise PrimewalkError(f"--update-golden only records a built-in fairness spec on the cpu backend to "
                                 f"{_rel(spec.golden)}; here " + ", ".join(why))
    out = os.path.relpath(spec.golden) if args.update_golden else (args.out or default_out(spec))
    log = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    receipt = run_fairness(spec, log=log)
    failed = receipt["verdict"]["status"] != "bitwise"
    if args.update_golden and failed:
        out = default_out(spec)
        print(f"harness fairness: a session differs; the golden is NOT updated (receipt written to {out})",
              file=sys.stderr)
    plots = write_and_plot(out, receipt, write_fairness_receipt, "harness.fairness.plots:plot_fairness", args)
    print(report(receipt, out, plots))
    return 1 if failed else 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fairness", help="a long prime beside peer sessions, per scheduling policy: latency measured, digests proven",
        description="Run every session of a fairness spec alone, then all of them together under each "
                    "scheduling policy (drain, yield, interval) with the cooperative scheduler; prove every "
                    "session's digests bitwise equal across policies and alone, measure the peers' "
                    "first-event latency and the long prompt's time to first token, and write the receipt "
                    "(JSON + CSV) and its figures.",
        epilog="examples:\n"
               "  harness fairness --spec harness/specs/fairness/tiny.toml           # the CPU spec (tiny model)\n"
               "  harness fairness --spec harness/specs/fairness/tiny.toml --update-golden  # re-record receipts/fairness/tiny.json\n"
               "  harness fairness --spec harness/specs/fairness/bench-8l.toml --backend cuda \\\n"
               "                   --out receipts/fairness/h200-bench-8l.json          # the H200 experiment\n"
               "  harness diff receipts/fairness/tiny.json out/fairness/tiny.json\n"
               "exit status: 0 every session bitwise, 1 a session differs, 2 unusable spec or input",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", metavar="FILE", required=True, help="fairness spec (TOML)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="compute backend (default: the spec's, else $PRIMEWALK_BACKEND or cpu)")
    p.add_argument("--model", metavar="DIR", default=None, help="checkpoint folder (or embedded model: tiny, tiny-q35, "
                   "stdlib-small) instead of the spec's model")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="receipt path (default: out/fairness/<spec stem>.json; a .csv and figures go beside it)")
    p.add_argument("--update-golden", action="store_true",
                   help="write the committed receipt of a built-in spec, receipts/fairness/<stem>.json (specs "
                        "under harness/specs/fairness/ only, cpu backend, no --out/--model)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--no-plots", action="store_true", help="write the receipt only, no figures")
    p.set_defaults(func=cmd_fairness)
