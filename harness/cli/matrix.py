"""``harness run-matrix``, ``harness diff``, ``harness merge`` and ``harness plot``: the
schedule matrix (:mod:`harness.matrix`) on the command line."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import PrimewalkError
from ..matrix import runner
from ..matrix.builtin import GOLDEN_DIR, REPO, SPECS_DIR
from ..matrix.cells import cell_listing
from ..matrix.diff import MAX_ROWS, diff_receipts
from ..matrix.receipts import merge_receipts, read_receipt, write_receipt
from ..matrix.specfile import BACKENDS, MatrixSpec, load_spec
from . import workers as parallel
from .common import mode_arg, stdout_gone, weights_arg, write_and_plot
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


def _golden_target(args, spec: MatrixSpec, shard: tuple) -> str | None:
    """Where ``--update-golden`` writes (None without it): ``--golden PATH`` for any spec, else the
    built-in spec's ``receipts/golden/<stem>.json`` (cpu, unsharded, the spec's models)."""
    if not args.update_golden:
        return None
    why = []
    if shard != (0, 1):
        why.append("--shard is given")
    if args.out is not None:
        why.append("--out is given (the golden's path is fixed)")
    if args.golden is not None:
        if why:
            raise PrimewalkError("--update-golden --golden records one whole run at PATH; here " + ", ".join(why))
        return args.golden
    if spec.golden is None:
        raise PrimewalkError(f"--update-golden: {spec.where} is not a built-in spec; give the golden's path "
                             f"with --golden PATH (built-in specs under {os.path.relpath(SPECS_DIR, REPO)}/ "
                             f"record to {os.path.relpath(GOLDEN_DIR, REPO)}/<stem>.json)")
    if spec.backend != "cpu":
        why.append(f"the backend is {spec.backend}")
    if args.model is not None:
        why.append("--model is given")
    if args.mode is not None:
        why.append("--mode is given (a golden records its spec's own mode)")
    if why:
        raise PrimewalkError("--update-golden only records a built-in spec on the cpu backend "
                             f"(unsharded, the spec's models) to {os.path.relpath(spec.golden)}; here "
                             + ", ".join(why) + " (record your own golden with --golden PATH)")
    return spec.golden


def _gate(golden: str, receipt: dict) -> int:
    """``run-matrix --golden PATH`` without --update-golden: diff the fresh receipt with the
    golden (as ``harness diff``); 0 equal, 1 drift, 2 unusable."""
    result = diff_receipts(golden, receipt)
    if result.unusable:
        print(f"harness run-matrix: error: golden {golden}: {result.summary}", file=sys.stderr)
        return 2
    for note in result.notes:
        print(f"note: {note}")
    if result.rows:
        print(result.table())
    print(f"golden {golden}: {result.summary}")
    return result.exit_code


def cmd_run_matrix(args) -> int:
    shard = parse_shard(args.shard)
    spec = load_spec(args.spec, backend=parallel.backend_for(args), model=args.model, mode=args.mode)
    # the parallel flags are checked (not started) first: a combination that cannot run is refused
    # in one line, also with --list
    executor = parallel.executor_from_args(args, spec) if parallel.parallel_requested(args) else None
    if executor is not None and args.bisect_failures:
        raise PrimewalkError("--bisect-failures runs in one process: drop --workers / --gpus / --executor, "
                             "or bisect a failed cell afterwards with harness bisect --cell")
    if executor is not None and args.weights not in (None, "auto"):
        raise PrimewalkError("--weights applies to one process for now: drop --workers / --gpus / --executor "
                             "(the workers load each model with --weights auto)")
    if executor is not None and args.draft_vocab is not None:
        raise PrimewalkError("--draft-vocab applies to one process for now: drop --workers / --gpus / --executor")
    if args.list:
        print(cell_listing(spec))
        return 0
    golden = _golden_target(args, spec, shard)
    if args.golden is not None and not args.update_golden:
        try:  # before the run: a golden that is missing or unreadable stops it
            read_receipt(args.golden)
        except PrimewalkError as e:
            raise PrimewalkError(f"--golden: {e} (record one with --update-golden --golden "
                                 f"{args.golden})") from None
    out = golden or args.out or default_out(spec, shard)
    warmup = not args.no_warmup
    if executor is None:
        receipt = runner.run_matrix(spec, shard, progress=Progress(args.quiet), warmup=warmup,
                                     bisect_failures=args.bisect_failures, weights=args.weights,
                                     draft_vocab=args.draft_vocab)
    else:
        from ..matrix.pool import run_parallel

        receipt = run_parallel(spec, shard, executor[0], executor[1], progress=Progress(args.quiet),
                               warmup=warmup)
    failed = sum(1 for c in receipt["cells"] if c["verdict"]["status"] == "fail")
    if golden and failed:
        out = default_out(spec, shard)
        print(f"harness run-matrix: {failed} cell(s) failed; the golden is NOT updated (receipt "
              f"written to {out} instead)", file=sys.stderr)
    plots = write_and_plot(out, receipt, write_receipt, "harness.matrix.plots:plot_receipt", args)
    print(summary_line(receipt, out, plots))
    code = 1 if failed else 0
    if args.golden is not None and not args.update_golden:
        code = max(code, _gate(args.golden, receipt))
    return code


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
               "  harness run-matrix --backend cuda --out receipts/device/cuda-default.json\n"
               "  harness run-matrix --shard 0/2 --out out/s0.json && harness run-matrix --shard 1/2 "
               "--out out/s1.json\n"
               "  harness merge out/default.json out/s0.json out/s1.json\n"
               "  harness run-matrix --workers 2                       # two worker processes, one receipt\n"
               "  harness run-matrix --gpus all --out out/gpus.json    # one worker per GPU (cuda)\n"
               "  harness run-matrix --executor ray --address auto     # Ray actors, one GPU/CPU share each\n"
               "  harness run-matrix --spec harness/specs/tiny.toml    # the quick matrix (random tiny model)\n"
               "  harness run-matrix --mode exact-bf16 --out out/default-bf16.json  # the bf16 tensor-core mode\n"
               "  harness run-matrix --update-golden                   # re-record receipts/golden/default.json\n"
               "  harness run-matrix --spec harness/specs/tiny.toml --update-golden  # ... receipts/golden/tiny.json\n"
               "  harness run-matrix --spec my.toml --update-golden --golden golden/my.json   # your own golden\n"
               "  harness run-matrix --spec my.toml --golden golden/my.json   # run, then diff with it (CI gate)\n"
               "  harness run-matrix --spec my.toml --list                    # the cells, nothing run\n"
               "spec format: docs/specs.md\n"
               "exit status: 0 all cells bitwise (and equal to --golden), 1 a cell failed or drifted from\n"
               "--golden, 2 unusable spec or input",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", metavar="FILE", default=None,
                   help="matrix spec (TOML); default: the built-in harness/specs/default.toml "
                        "(stdlib-small); harness/specs/tiny.toml is the quick one")
    p.add_argument("--model", metavar="DIR", default=None,
                   help="run every cell on this checkpoint folder (or embedded model: tiny, tiny-q35, "
                        "stdlib-small) instead of the spec's models")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="compute backend (default: the spec's, else $PRIMEWALK_BACKEND or cpu)")
    weights_arg(p)
    p.add_argument("--draft-vocab", metavar="N|FILE", default=None,
                   help="the cells draft among the ids 0..N-1, or the ids in FILE (README: drafting among a "
                        "draft vocabulary): greedy cells keep every digest, only acceptance moves; sampled "
                        "cells' draws change with the drafts (recorded in env.draft_vocab; compare with "
                        "harness diff --digests-only)")
    mode_arg(p, "the spec's")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="receipt path (default: out/<spec stem>.json; a .csv and figures go beside it)")
    p.add_argument("--shard", metavar="I/N", default=None,
                   help="run only cells i with i %% N == I (join shards with harness merge)")
    p.add_argument("--update-golden", action="store_true",
                   help="write the spec's golden receipt: --golden PATH, or for a built-in spec "
                        "receipts/golden/<stem>.json (cpu backend, no --model); no --out/--shard; a "
                        "failing cell leaves the golden as it was")
    p.add_argument("--golden", metavar="PATH", default=None,
                   help="the golden receipt of your own spec: recorded there with --update-golden; "
                        "without it, the fresh receipt is diffed with PATH after the run (exit 1 on drift)")
    p.add_argument("--list", action="store_true",
                   help="print the cells (and how each split/checkpoint point resolved) and the skipped "
                        "schedules, then exit without running")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the warm-up that compiles every kernel before the first timed cell")
    p.add_argument("--quiet", action="store_true", help="no progress display, no per-cell lines")
    p.add_argument("--bisect-failures", action="store_true",
                   help="bisect each failed cell against its oracle (harness bisect) into its receipt entry")
    p.add_argument("--no-plots", action="store_true", help="write the receipt only, no figures")
    parallel.add_args(p)
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
    try:
        for note in result.notes:
            print(f"note: {note}")
        if result.rows:
            print(result.table(None if args.all else MAX_ROWS))
        print(result.summary)
        sys.stdout.flush()
    except BrokenPipeError:  # harness diff ... | head: the exit status is still the diff's
        stdout_gone()
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
               "                              receipts/device/cuda-default.json\n"
               "  harness diff --timing-tolerance 10 out/before.json out/after.json\n"
               "exit status: 0 equal, 1 drift, 2 unusable input",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", metavar="A", help="reference receipt (.json, or the .csv beside it)")
    p.add_argument("b", metavar="B", help="receipt to check against A")
    p.add_argument("--digests-only", action="store_true",
                   help="compare only digests.* (receipts of two devices)")
    p.add_argument("--timing-tolerance", type=_percent, metavar="PCT", default=None,
                   help="also fail a cell whose prime/decode/spec tokens/s in B fell more than PCT%% below "
                        "A; only like with like (same backend, device and threads, neither recorded "
                        "with the load above the cores), else a note says why not")
    p.add_argument("--all", action="store_true", help=f"print every drifted field (default: the first {MAX_ROWS})")
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
    from ..matrix.receipts import read_receipt

    try:
        if read_receipt(args.receipt).get("kind") == "fairness":
            from ..fairness.plots import plot_fairness

            written = plot_fairness(args.receipt)
        else:
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
        description="Draw the verdict grid, acceptance and throughput figures of a receipt (the timeline "
                    "and first-event figures of a fairness receipt) as <stem>.<figure>.png beside it; "
                    "figures without data are skipped.",
        epilog="examples:\n"
               "  harness plot receipts/golden/default.json\n"
               "  harness plot out/default.json && ls out/default.*.png",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("receipt", metavar="RECEIPT", help="receipt .json (or the .csv beside it)")
    p.set_defaults(func=_cmd_plot)
