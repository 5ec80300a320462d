"""The ``harness`` command line.

Every user error (bad ids, unreadable checkpoints, invalid configs, unusable specs) exits 2 with
one line on stderr; no traceback. Commands use the embedded tiny model unless ``--model`` is
given, and the CPU backend unless ``--backend``/``PRIMEWALK_BACKEND`` says ``cuda``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from .errors import PrimewalkError

EPILOG = """examples:
  harness run-matrix                          # default schedule matrix on the tiny model (CPU)
  harness run-matrix --backend cuda --out receipts/device/h200-default.json
  harness diff receipts/golden/default.json out/default.json
  harness check --prompt-len 257 --k 3
  harness generate --text "def main(" --max-new-tokens 64 --k 3
  harness logits --ids 1,2,3 --backend reference --out logits.npy
  harness device-check --out receipts/device/h200-device-check.json
"""


def _model_arg(p):
    p.add_argument("--model", metavar="DIR", default=None,
                   help="checkpoint folder (config.json + safetensors); default: embedded tiny model")


def _backend_arg(p, choices=("cpu", "cuda")):
    p.add_argument("--backend", choices=choices, default=None,
                   help="compute backend (default: $PRIMEWALK_BACKEND or cpu)")


def load_model(path):
    from .models import default_model_path
    from .weights import load_checkpoint

    return load_checkpoint(path or default_model_path())


def parse_ids(text: str) -> list:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise PrimewalkError(f"--ids: expected comma-separated integers, got {text!r}") from None
    if not ids:
        raise PrimewalkError("--ids: the prompt is empty")
    return ids


def prompt_ids(args) -> list:
    from . import tokenizer

    if getattr(args, "ids", None) is not None:
        return parse_ids(args.ids)
    text = getattr(args, "text", None)
    if text is None or text == "":
        raise PrimewalkError("the prompt is empty (give --ids or --text)")
    return tokenizer.encode(text)


# ------------------------------------------------------------------------------------------------
def cmd_logits(args) -> int:
    from .atomic import write_bytes_atomic

    ck = load_model(args.model)
    ids = prompt_ids(args)
    V = ck.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise PrimewalkError(f"token id {bad[0]} is out of range for vocab_size {V}")
    if args.backend in (None, "reference"):
        from numba_kernels.reference import RefModel

        logits, _ = RefModel(ck.config, ck.tensors).forward(ids)
    else:
        from .model import Engine

        eng = Engine(ck, args.backend)
        logits, _ = eng.target_step(eng.new_session(len(ids)), np.asarray(ids))
    import io

    buf = io.BytesIO()
    np.save(buf, logits, allow_pickle=False)
    write_bytes_atomic(args.out, buf.getvalue())
    print(f"wrote {args.out}: logits [{logits.shape[0]}, {logits.shape[1]}] {logits.dtype} "
          f"({args.backend or 'reference'}), argmax of last row {int(np.argmax(logits[-1]))}")
    return 0


def cmd_device_check(args) -> int:
    from .devicecheck import main

    return main(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="harness", description="primewalk: bitwise receipts for hybrid GDN + MTP models under every prefill schedule.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("logits", help="logits for every position of a prompt, as .npy [T, vocab]",
                       epilog="example: harness logits --text 'hello' --backend cpu --out logits.npy",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_arg(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--ids", help="comma-separated token ids, e.g. 1,2,3")
    g.add_argument("--text", help="text, tokenised as UTF-8 bytes")
    _backend_arg(p, ("reference", "cpu", "cuda"))
    p.add_argument("--out", required=True, metavar="F.npy", help="output file (float64 for reference, float32 otherwise)")
    p.set_defaults(func=cmd_logits)

    p = sub.add_parser("device-check", help="every kernel and schedule on CUDA vs the CPU twin, bitwise")
    p.add_argument("--out", default="receipts/device/h200-device-check.json", help="receipt path")
    p.add_argument("--commit", default=os.environ.get("PRIMEWALK_COMMIT"), help="commit the tree is at (recorded)")
    p.add_argument("--quick", action="store_true", help="small shapes only")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_device_check)

    p = sub.add_parser("device-walker", help="prime-walker check and speculative decoding on CUDA vs CPU, digests")
    p.add_argument("--out", default="receipts/device/h200-walker.json", help="receipt path")
    p.add_argument("--commit", default=os.environ.get("PRIMEWALK_COMMIT"), help="commit the tree is at (recorded)")
    p.set_defaults(func=lambda a: __import__("harness.devicecheck", fromlist=["x"]).main_walker(a))

    for mod in ("walkcli", "matrix", "diff", "plots", "bench", "mmacheck"):
        try:
            m = __import__(f"harness.{mod}", fromlist=["register"])
        except ImportError as e:
            if e.name and e.name.startswith("harness"):
                continue
            raise
        if hasattr(m, "register"):
            m.register(sub)
    return ap


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


if __name__ == "__main__":
    sys.exit(main())
