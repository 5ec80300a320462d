"""``harness bisect``: where two runs that should be bit-identical first part
(:mod:`harness.matrix.bisect`)."""

from __future__ import annotations

import argparse
import json
import os

from ..atomic import write_text_atomic
from ..engine.trace import PASSES, op_list, place_name
from ..errors import PrimewalkError
from ..matrix import bisect as bs
from ..matrix.specfile import BACKENDS, load_spec
from ..walk.mtp_walker import DEFAULT_CHUNK_ROWS, DEFAULT_FILL_CHUNK
from .common import load_model, model_arg

# the options of the --prompt-len form, and their defaults
SCHEDULE_OPTIONS = {"k": 1, "seed": 0, "max_new_tokens": 8, "chunk_rows": DEFAULT_CHUNK_ROWS,
                    "fill_chunk": DEFAULT_FILL_CHUNK, "temperature": 0.0}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _form(args) -> str:
    """Which form the arguments ask for; a one-line error when they mix or miss some."""
    given = {n for n in ("spec", "cell", "prompt_len", "a", "b", *SCHEDULE_OPTIONS) if getattr(args, n) is not None}
    if args.list_ops:
        extra = given | ({"fault"} if args.fault else set()) | ({"draft_vocab"} if args.draft_vocab else set())
        if extra:
            raise PrimewalkError(f"--list-ops takes only --model (and --json), not {_flag(sorted(extra)[0])}")
        return "list-ops"
    if args.spec is not None or args.cell is not None:
        if args.spec is None or args.cell is None:
            raise PrimewalkError("--spec and --cell go together: harness bisect --spec FILE --cell ID")
        other = given - {"spec", "cell"}
        if other:
            raise PrimewalkError(f"{_flag(sorted(other)[0])} belongs to the --prompt-len form; a cell has its own "
                                 "prompt and schedule")
        return "cell"
    if args.prompt_len is None or args.a is None or args.b is None:
        raise PrimewalkError("give --spec FILE --cell ID, or --prompt-len N --a SCHEDULE --b SCHEDULE, or "
                             "--list-ops")
    return "schedules"


def _model_block(ckpt, name=None) -> dict:
    path = ckpt.path or ""
    return {"name": name or os.path.basename(os.path.normpath(path)) or "model", "path": path,
            "weights_sha256": ckpt.sha256}


def cmd_bisect(args) -> int:
    form = _form(args)
    if form == "list-ops":
        ck = load_model(args.model)
        names = op_list(ck.config, ck.has_mtp)
        lines = [place_name(*n) for p in PASSES if p in names for n in names[p]]
        print(json.dumps(lines) if args.json else "\n".join(lines))
        return 0
    backend_a = args.backend_a or args.backend
    backend_b = args.backend_b or args.backend
    if form == "cell":
        spec = load_spec(args.spec, model=args.model)
        a, b, ck = bs.cell_sides(spec, args.cell, backend_a, backend_b, args.draft_vocab)
        model = _model_block(ck, args.cell.split("/")[0])
    else:
        opts = {n: getattr(args, n) if getattr(args, n) is not None else d for n, d in SCHEDULE_OPTIONS.items()}
        for n in ("k", "max_new_tokens", "chunk_rows", "fill_chunk"):
            if opts[n] < (2 if n == "max_new_tokens" else 1):
                raise PrimewalkError(f"{_flag(n)} must be at least {2 if n == 'max_new_tokens' else 1}, "
                                     f"got {opts[n]}")
        if opts["temperature"] < 0 or opts["seed"] < 0:
            raise PrimewalkError("--temperature and --seed must be >= 0")
        default = os.environ.get("PRIMEWALK_BACKEND") or "cpu"
        a, b, ck = bs.schedule_sides(args.model, args.prompt_len, args.a, args.b, backend_a or default,
                                     backend_b or default, max_new=opts.pop("max_new_tokens"),
                                     draft_vocab=args.draft_vocab, **opts)
        model = _model_block(ck, None if args.model else "tiny")
    res = bs.bisect(a, b, fault=args.fault, model=model)
    if args.out:
        try:
            write_text_atomic(args.out, bs.to_json(res))
        except OSError as e:
            raise PrimewalkError(f"cannot write {args.out}: {e.strerror or e}") from None
    print(bs.to_json(res).rstrip("\n") if args.json else "\n".join(bs.summary_lines(res)))
    return 0 if res["divergence"] is None else 1


def register(sub) -> None:
    p = sub.add_parser(
        "bisect", help="the first layer, op, row and column where two runs part (exit 1 if they do)",
        description="Run two prefills that should be bit-identical with every op's output rows hashed, "
                    "and print the first place they differ -- in the order row, pass (trunk, then the "
                    "MTP head), occurrence, op -- with both values and their ulp distance, then how far "
                    "the difference spreads.",
        epilog="examples:\n"
               "  harness bisect --prompt-len 130 --a batched --b split:64\n"
               "  harness bisect --prompt-len 130 --a tokenwise --b yield:64 --k 2 --fault 2:recurrence:70\n"
               "  harness bisect --prompt-len 257 --a batched --b batched --backend-a cpu --backend-b cuda\n"
               "  harness bisect --spec harness/specs/tiny.toml --cell tiny/p130/split@64/k2/greedy\n"
               "  harness bisect --list-ops [--model DIR]          # the LAYER:OP names --fault takes\n"
               "schedules: " + ", ".join(bs.SCHEDULE_FORMS) + " (points: rows, or fractions of the "
               "prompt as in a spec)\n"
               "exit status: 0 no divergence, 1 divergence found, 2 bad input",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("a matrix cell against its oracle cell")
    g.add_argument("--spec", metavar="FILE", default=None, help="matrix spec (TOML)")
    g.add_argument("--cell", metavar="ID", default=None, help="cell id, e.g. tiny/p130/split@64/k2/greedy")
    g = p.add_argument_group("two schedules of one synthetic prompt")
    g.add_argument("--prompt-len", type=int, default=None, metavar="N", help="prompt length (seeded ids)")
    g.add_argument("--a", metavar="SCHEDULE", default=None, help="schedule of run a, e.g. batched, split:200")
    g.add_argument("--b", metavar="SCHEDULE", default=None, help="schedule of run b, e.g. tokenwise, yield:64")
    g.add_argument("--k", type=int, default=None, help="draft length K (default 1)")
    g.add_argument("--seed", type=int, default=None, help="prompt and sampling seed (default 0)")
    g.add_argument("--max-new-tokens", type=int, default=None,
                   help="speculative continuation after the prime (default 8)")
    g.add_argument("--chunk-rows", type=int, default=None, help=f"batched chunk rows (default {DEFAULT_CHUNK_ROWS})")
    g.add_argument("--fill-chunk", type=int, default=None, help=f"MTP fill chunk rows (default {DEFAULT_FILL_CHUNK})")
    g.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 0: greedy)")
    model_arg(p)
    p.add_argument("--backend", choices=BACKENDS, default=None, help="backend of both runs")
    p.add_argument("--backend-a", choices=BACKENDS, default=None, help="backend of run a")
    p.add_argument("--backend-b", choices=BACKENDS, default=None, help="backend of run b")
    p.add_argument("--fault", metavar="LAYER:OP:ROW", default=None,
                   help="flip the lowest bit of that op's output at that row (column 0) in run b")
    p.add_argument("--draft-vocab", metavar="N|FILE", default=None,
                   help="both runs draft among a draft vocabulary (as run-matrix --draft-vocab ran the cell)")
    p.add_argument("--list-ops", action="store_true", help="print the LAYER:OP names, in execution order")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", metavar="PATH", default=None, help="also write the JSON result to PATH")
    p.set_defaults(func=cmd_bisect)
