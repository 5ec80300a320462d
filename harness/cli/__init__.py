"""The ``harness`` command line: ``main`` and ``build_parser``; one module per command group.

- :mod:`.matrix`: ``run-matrix``, ``diff``, ``merge``, ``plot`` (with :mod:`.progress`, the
  console display of a run);
- :mod:`.walk`: ``check``, ``generate``;
- :mod:`.logits`: ``logits``;
- :mod:`.gpu`: ``device-check``, ``device-walker``, ``bench``;
- :mod:`.fairness`: ``fairness``.
- :mod:`.bisect`: ``bisect``.
- :mod:`.oracle`: ``oracle`` (a checkpoint against transformers).

Every user error (bad ids, unreadable checkpoints, invalid configs, unusable specs) exits 2 with
one line on stderr; no traceback. Commands use the embedded tiny model unless ``--model`` is
given, and the CPU backend unless ``--backend``/``PRIMEWALK_BACKEND`` says ``cuda``.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import PrimewalkError
from . import bisect, draftvocab, fairness, gpu, logits, matrix, oracle, walk
from .common import stdout_gone

EPILOG = """examples:
  harness run-matrix                          # the default matrix on the trained stdlib-small model (CPU)
  harness run-matrix --spec harness/specs/tiny.toml   # the quick matrix on the random tiny model
  harness run-matrix --spec my.toml --model ckpt/ --update-golden --golden golden/my.json
  harness run-matrix --backend cuda --out receipts/device/cuda-default.json
  harness diff receipts/golden/default.json out/default.json
  harness check --prompt-len 257 --k 3
  harness generate --model stdlib-small --text "def main(" --max-new-tokens 64 --k 3
  harness logits --ids 1,2,3 --backend reference --out logits.npy
  harness device-check --out receipts/device/cuda-device-check.json
  harness fairness --spec harness/specs/fairness/tiny.toml
  harness oracle --model ~/ckpt/Qwen3.5-35B-A3B   # a checkpoint against transformers
"""

COMMAND_GROUPS = (matrix, walk, draftvocab, logits, gpu, fairness, bisect, oracle)  # each registers its subcommands, in this order


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="harness", description="primewalk: bitwise receipts for hybrid GDN + MTP models under every prefill schedule.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"harness (primewalk) {version()}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(sub)
    return ap


def version() -> str:
    """primewalk's installed version (package metadata), else the source tree's."""
    from importlib import metadata

    try:
        return metadata.version("primewalk")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except PrimewalkError as e:
        print(f"harness {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"harness {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (| head): stop quietly, as on SIGPIPE
        stdout_gone()
        return 141
