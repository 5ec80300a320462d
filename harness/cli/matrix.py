"""``harness run-matrix``, ``harness diff``, ``harness merge`` and ``harness plot``: the
schedule matrix (:mod:`harness.matrix`) on the command line."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import PrimewalkError
from ..matrix import runner
from ..matrix.builtin import GOLDEN_DIR, REPO, SPECS_DIR
from ..matrix.diff import diff_receipts
from ..matrix.receipts import merge_receipts, write_receipt
from ..matrix.specfile import BACKENDS, MatrixSpec, load_spec
from .common import mode_arg
from .progress import Progress


# ------------------------------------------------------------------------------------------------
# run-matrix
# ------------------------------------------------------------------------------------------------
def parse_shard(text: str | None) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 0 <= I < N; None -> (0, 1)."""
    if text is None:
        return 0, 1
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise PrimewalkError(f"--shard: expected I/N (e.g. 0/4), got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise PrimewalkError(f"--shard: expected I/N with 0 <= I < N, got {text!r}")
    return i, n


def default_out(spec: MatrixSpec, shard: tuple) -> str:
    stem = spec.stem
    if shard != (0, 1):
        stem += f".shard{shard[0]}"
    return os.path.join("out", f"{stem}.json")


def summary_line(receipt: dict, path: str, plots: list | None) -> str:
    counts = {}
    for c in receipt["cells"]:
        s = c["verdict"]["status"]
        counts[s] = counts.get(s, 0) + 1
    parts = [f"{counts.get(s, 0)} {s}" for s in ("bitwise", "tolerance", "fail")
             if counts.get(s) or s != "tolerance"]
    shard = receipt["shard"]
    text = (f"matrix: {len(receipt['cells'])} cells" + (f" (shard {shard['index']}/{shard['count']})"
                                                          if shard["count"] > 1 else "")
            + f": {', '.join(parts)} in {receipt['wall_s']:.1f} s; receipt {path} (+ .csv)")
    if plots:
        text += f"; plots {os.path.splitext(path)[0]}.*.png ({len(plots)})"
    return text


def cmd_run_matrix(args) -> int:
    shard = parse_shard(args.shard)
    spec = load_spec(args.spec, backend=args.backend, model=args.model, mode=args.mode)
    if args.update_golden:
        if spec.golden is None:
            raise PrimewalkError(f"--update-golden: {spec.where} is not a built-in spec; only the specs under "
                                 f"{os.path.relpath(SPECS_DIR, REPO)}/ have a golden receipt "
                                 f"({os.path.relpath(GOLDEN_DIR, REPO)}/<stem>.json)")
        why = []
        if spec.backend != "cpu":
            why.append(f"the backend is {spec.backend}")
        if args.model is not None:
            why.append("--model is given")
        if args.mode is not None:
            why.append("--mode is given (a golden records its spec's own mode)")
        if shard != (0, 1):
            why.append("--shard is given")
        if args.out is not None:
            why.append("--out is given (the golden's path is fixed)")
        if why:
            raise PrimewalkError("--update-golden only records a built-in spec on the cpu backend "
                                 f"(unsharded, the spec's models) to {os.path.relpath(spec.golden)}; here "
                                 + ", ".join(why))
    out = spec.golden if args.update_golden else (args.out or default_out(spec, shard))
    receipt = runner.run_matrix(spec, shard, progress=Progress(args.quiet))
    failed = sum(1 for c in receipt["cells"] if c["verdict"]["status"] == "fail")
    if args.update_golden and failed:
        out = default_out(spec, shard)
        print(f"harness run-matrix: {failed} cell(s) failed; the golden is NOT updated (receipt "
              f"written to {out} instead)", file=sys.stderr)
    write_receipt(out, receipt)
    plots = None
    if not args.no_plots:
        from ..matrix.plots import plot_receipt  # matplotlib: only when drawing

        plots = plot_receipt(out, quiet=args.quiet)
    print(summary_line(receipt, out, plots))
    return 1 if failed else 0


def register(subparsers) -> None:
    """Add ``run-matrix``, ``diff``, ``merge`` and ``plot`` to an argparse ``subparsers``; the
    handlers return an exit code."""
    _register_run_matrix(subparsers)
    _register_diff_merge(subparsers)
    _register_plot(subparsers)


def _register_run_matrix(subparsers) -> None:
    p = subparsers.add_parser(
        "run-matrix", help="run the schedule matrix and write its receipt (exit 1 if any cell fails)",
        description="Prime every prompt under every schedule variant of a matrix spec, continue "
                    "speculatively, judge each cell against its unyielded oracle (bitwise or fail) and "
                    "write the receipt (JSON + CSV) and its figures.",
        epilog="examples:\n"
               "  harness run-matrix                                   # built-in default spec (stdlib-small), cpu\n"
               "  harness run-matrix --spec my.toml --out out/my.json\n"
               "  harness run-matrix --backend cuda --out receipts/device/h200-default.json\n"
               "  harness run-matrix --shard 0/2 --out out/s0.json && harness run-matrix --shard 1/2 "
               "--out out/s1.json\n"
               "  harness merge out/default.json out/s0.json out/s1.json\n"
               "  harness run-matrix --spec harness/specs/tiny.toml    # the quick matrix (random tiny model)\n"
               "  harness run-matrix --mode exact-bf16 --out out/default-bf16.json  # the bf16 tensor-core mode\n"
               "  harness run-matrix --update-golden                   # re-record receipts/golden/default.json\n"
               "  harness run-matrix --spec harness/specs/tiny.toml --update-golden  # ... receipts/golden/tiny.json\n"
               "  (--update-golden takes the built-in specs under harness/specs/ only, on the cpu backend)\n"
               "exit status: 0 all cells bitwise, 1 a cell failed, 2 unusable spec or input",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", metavar="FILE", default=None,
                   help="matrix spec (TOML); default: the built-in harness/specs/default.toml "
                        "(stdlib-small); harness/specs/tiny.toml is the quick one")
    p.add_argument("--model", metavar="DIR", default=None,
                   help="run every cell on this checkpoint folder instead of the spec's models")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="compute backend (default: the spec's, else $PRIMEWALK_BACKEND or cpu)")
    mode_arg(p, "the spec's")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="receipt path (default: out/<spec stem>.json; a .csv and figures go beside it)")
    p.add_argument("--shard", metavar="I/N", default=None,
                   help="run only cells i with i %% N == I (join shards with harness merge)")
    p.add_argument("--update-golden", action="store_true",
                   help="write the spec's golden receipt, receipts/golden/<stem>.json (built-in specs "
                        "under harness/specs/ only, cpu backend, no --out/--shard/--model)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no per-cell lines")
    p.add_argument("--no-plots", action="store_true", help="write the receipt only, no figures")
    p.set_defaults(func=cmd_run_matrix)


# ------------------------------------------------------------------------------------------------
# diff, merge, plot
# ------------------------------------------------------------------------------------------------
def _cmd_diff(args) -> int:
    try:
        result = diff_receipts(args.a, args.b, digests_only=args.digests_only,
                               timing_tolerance=args.timing_tolerance)
    except PrimewalkError as e:
        print(f"harness diff: error: {e}", file=sys.stderr)
        return 2
    if result.unusable:
        print(f"harness diff: error: {result.summary}", file=sys.stderr)
        return 2
    if result.rows:
        print(result.table())
    print(result.summary)
    return result.exit_code


def _cmd_merge(args) -> int:
    try:
        merged = merge_receipts(args.shards)
        write_receipt(args.out, merged)
    except PrimewalkError as e:
        print(f"harness merge: error: {str(e).removeprefix('merge: ')}", file=sys.stderr)
        return 2
    print(f"merge: {len(args.shards)} shard(s), {len(merged['cells'])} cells -> {args.out}")
    return 0


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"the tolerance must be >= 0, got {text!r}")
    return value


def _register_diff_merge(subparsers) -> None:
    p = subparsers.add_parser(
        "diff", help="compare two receipts; exit 0 equal, 1 drift, 2 unusable",
        description="Compare the compared fields (digests, verdicts, tapes, yields, continuations, "
                    "acceptance counts) of two receipts of the same matrix spec, cell by cell.",
        epilog="examples:\n"
               "  harness diff receipts/golden/default.json out/default.json\n"
               "  harness diff --digests-only receipts/golden/default.json \\\n"
               "                              receipts/device/h200-default.json\n"
               "  harness diff --timing-tolerance 10 out/before.json out/after.json\n"
               "exit status: 0 equal, 1 drift, 2 unusable input",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", metavar="A", help="reference receipt (.json, or the .csv beside it)")
    p.add_argument("b", metavar="B", help="receipt to check against A")
    p.add_argument("--digests-only", action="store_true",
                   help="compare only digests.* (receipts of two devices)")
    p.add_argument("--timing-tolerance", type=_percent, metavar="PCT", default=None,
                   help="also fail a cell whose prime/decode/spec tokens/s in B fell more than PCT%% below A")
    p.set_defaults(func=_cmd_diff)

    p = subparsers.add_parser(
        "merge", help="join shard receipts of one run into one receipt",
        description="Join the shard receipts of one matrix run; refuses receipts of another spec, "
                    "model or schema, a missing or repeated shard, and duplicate cells.",
        epilog="examples:\n"
               "  harness merge out/default.json out/default.shard0.json out/default.shard1.json\n"
               "  harness merge out/default.json out/default.shard*.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", metavar="OUT", help="merged receipt to write (a .csv is written beside it)")
    p.add_argument("shards", metavar="SHARD", nargs="+", help="shard receipts")
    p.set_defaults(func=_cmd_merge)


def _cmd_plot(args) -> int:
    from ..matrix.plots import plot_receipt  # matplotlib: only when drawing

    try:
        written = plot_receipt(args.receipt)
    except PrimewalkError as e:
        print(f"harness plot: error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _register_plot(subparsers) -> None:
    p = subparsers.add_parser(
        "plot", help="draw a receipt's figures as PNGs next to it",
        description="Draw the verdict grid, acceptance and throughput figures of a receipt as "
                    "<stem>.<figure>.png beside it; figures without data are skipped.",
        epilog="examples:\n"
               "  harness plot receipts/golden/default.json\n"
               "  harness plot out/default.json && ls out/default.*.png",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("receipt", metavar="RECEIPT", help="receipt .json (or the .csv beside it)")
    p.set_defaults(func=_cmd_plot)
