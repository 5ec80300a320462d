"""What the command groups share: the ``--model`` / ``--backend`` arguments and the prompt."""

from __future__ import annotations

from ..errors import PrimewalkError


def model_arg(p):
    p.add_argument("--model", metavar="DIR", default=None,
                   help="checkpoint folder (config.json + safetensors); default: embedded tiny model")


def backend_arg(p, choices=("cpu", "cuda")):
    p.add_argument("--backend", choices=choices, default=None,
                   help="compute backend (default: $PRIMEWALK_BACKEND or cpu)")


def mode_arg(p, default="exact"):
    from ..engine.modes import MODES

    p.add_argument("--mode", choices=MODES, default=None,
                   help=f"arithmetic: exact (float32 FMA) or exact-bf16 (the bf16 tensor-core MMA, "
                        f"reproduced bit for bit on the CPU); default: {default}")


def prompt_args(p):
    """``--ids`` or ``--text``, one of them required; :func:`prompt_ids` reads them."""
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--ids", help="comma-separated token ids, e.g. 1,2,3")
    g.add_argument("--text", help="prompt text, tokenised as UTF-8 bytes")


def load_model(path):
    """The checkpoint at ``path``, or the embedded tiny model."""
    from ..engine.weights import load_checkpoint
    from ..models import default_model_path

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
    """The prompt of ``--ids`` or ``--text`` (UTF-8 bytes)."""
    from .. import tokenizer

    if getattr(args, "ids", None) is not None:
        return parse_ids(args.ids)
    text = getattr(args, "text", None)
    if text is None or text == "":
        raise PrimewalkError("the prompt is empty (give --ids or --text)")
    return tokenizer.encode(text)
