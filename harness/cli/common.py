"""What the command groups share: the ``--model`` / ``--backend`` / ``--weights`` arguments and the
prompt."""

from __future__ import annotations

import importlib
import os
import re
import sys

from ..errors import PrimewalkError


def stdout_gone() -> None:
    """The reader of stdout went away (``harness diff ... | head``): send the rest of the output
    to /dev/null, so the command finishes with its own exit status and no BrokenPipe traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def model_arg(p):
    p.add_argument("--model", metavar="DIR", default=None,
                   help="checkpoint folder (config.json + safetensors), or an embedded model: tiny (the "
                        "default: random weights), tiny-q35, stdlib-small (trained on Python sources)")


def backend_arg(p, choices=("cpu", "cuda")):
    p.add_argument("--backend", choices=choices, default=None,
                   help="compute backend (default: $PRIMEWALK_BACKEND or cpu)")
    weights_arg(p)


def weights_arg(p):
    p.add_argument("--weights", choices=("auto", "f32", "bf16"), default=None,
                   help="resident weights: bf16 keeps linear/MoE weights bf16 and widens them in registers "
                        "(same bits as f32); default $PRIMEWALK_WEIGHTS or auto (bf16 for a bf16 checkpoint "
                        "on cuda; with --mode exact-bf16, bf16 on cuda and f32 on cpu)")


def mode_arg(p, default="exact"):
    from ..engine.modes import MODES

    p.add_argument("--mode", choices=MODES, default=None,
                   help=f"arithmetic: exact (float32 FMA) or exact-bf16 (the bf16 tensor-core MMA, "
                        f"reproduced bit for bit on the CPU); default: {default}")


def prompt_args(p):
    """``--ids`` or ``--text``, one of them required; :func:`prompt_ids` reads them."""
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--ids", help="comma-separated token ids, e.g. 1,2,3")
    g.add_argument("--text", help="prompt text, encoded by the model's tokenizer (its tokenizer.json, or "
                                  "UTF-8 bytes for a byte-vocabulary model)")


def backend_label(B) -> str:
    """``cpu, 2 threads`` or ``cuda``: a backend as the commands' timing lines name it."""
    n = getattr(B, "threads", None)
    return f"{B.name}, {n} thread{'s' if n != 1 else ''}" if n else B.name


def load_model(path):
    """The checkpoint at ``path`` (a folder, or an embedded model's name: ``harness.models``), or
    the embedded tiny model."""
    import sys

    from ..engine.weights import load_checkpoint
    from ..models import default_model_path, resolve

    ck = load_checkpoint(resolve(path) if path else default_model_path())
    for note in ck.notes:
        print(f"note: {note}", file=sys.stderr)
    return ck


def parse_ids(text: str) -> list:
    """``"1,2,3"`` -> [1, 2, 3]; an empty item (``1,,2``) or a non-integer is refused (one
    trailing comma is allowed; the model's vocabulary bounds the values)."""
    items = text.replace(" ", "").split(",")
    if items and items[-1] == "" and len(items) > 1:
        items = items[:-1]
    if not any(items):
        raise PrimewalkError("--ids: the prompt is empty")
    for i, t in enumerate(items):
        if t == "":
            raise PrimewalkError(f"--ids: item {i + 1} of {text!r} is empty (expected comma-separated "
                                 "integers such as 1,2,3)")
        if not re.fullmatch(r"[+-]?[0-9]+", t):
            raise PrimewalkError(f"--ids: expected comma-separated integers, got {t!r} in {text!r}")
    return [int(t) for t in items]


def model_tokenizer(ck):
    """The tokenizer of checkpoint ``ck`` (:func:`harness.engine.tokenizer.load_tokenizer`), or
    None."""
    from ..engine.tokenizer import load_tokenizer

    return load_tokenizer(ck.path, ck.config.vocab_size)


def prompt_ids(args, ck) -> list:
    """The prompt of ``--ids`` or ``--text`` (encoded by the tokenizer of checkpoint ``ck``; a
    model without one refuses ``--text``)."""
    from ..engine.tokenizer import encode_text

    if getattr(args, "ids", None) is not None:
        return parse_ids(args.ids)
    text = getattr(args, "text", None)
    if text is None or text == "":
        raise PrimewalkError("the prompt is empty (give --ids or --text)")
    return encode_text(model_tokenizer(ck), text, ck.path, ck.config.vocab_size, "--text")


def write_and_plot(out: str, receipt: dict, write, plot: str, args):
    """Write ``receipt`` to ``out`` with ``write(out, receipt)``, then, unless ``--no-plots``, its
    figures with the function ``plot`` names (``"module:function"``, imported only then: it
    imports matplotlib), called as ``function(out, quiet=args.quiet)``. Returns the figure paths,
    or None."""
    write(out, receipt)
    if args.no_plots:
        return None
    module, name = plot.split(":")
    return getattr(importlib.import_module(module), name)(out, quiet=args.quiet)
