"""``harness logits``: logits for every position of a prompt, as ``.npy`` [T, vocab]."""

from __future__ import annotations

import argparse
import io
import os

import numpy as np

from ..errors import PrimewalkError
from .common import load_model, mode_arg, model_arg, prompt_args, prompt_ids, weights_arg

BACKENDS = ("reference", "cpu", "cuda")


def logits_backend(arg: str | None) -> str:
    """``--backend``, else ``$PRIMEWALK_BACKEND``, else cpu (``reference`` only when asked)."""
    name = arg or os.environ.get("PRIMEWALK_BACKEND") or "cpu"
    if name not in BACKENDS:
        raise PrimewalkError(f"PRIMEWALK_BACKEND: expected one of {', '.join(BACKENDS)}, got {name!r}")
    return name


def cmd_logits(args) -> int:
    from ..atomic import write_bytes_atomic

    backend = logits_backend(args.backend)
    ck = load_model(args.model)
    ids = prompt_ids(args, ck)
    V = ck.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise PrimewalkError(f"token id {bad[0]} is out of range for vocab_size {V}")
    if backend == "reference":
        if args.weights not in (None, "auto"):
            raise PrimewalkError(f"--weights {args.weights} needs --backend cpu or cuda (the reference is float64)")
        if args.mode not in (None, "exact"):
            raise PrimewalkError(f"--mode {args.mode} needs --backend cpu or cuda (the reference is float64)")
        from numba_kernels.reference import RefModel

        logits, _ = RefModel(ck.config, ck.tensors).forward(ids)
    else:
        from ..engine.model import Engine

        eng = Engine(ck, backend, weights=args.weights, mode=args.mode)
        logits, _ = eng.target_step(eng.new_session(len(ids)), np.asarray(ids))
    buf = io.BytesIO()
    np.save(buf, logits, allow_pickle=False)
    write_bytes_atomic(args.out, buf.getvalue())
    print(f"wrote {args.out}: logits [{logits.shape[0]}, {logits.shape[1]}] {logits.dtype} "
          f"({backend}), argmax of last row {int(np.argmax(logits[-1]))}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("logits", help="logits for every position of a prompt, as .npy [T, vocab]",
                       description="Run one prompt through the model and write the logits of every "
                                   "position as a .npy array [T, vocab]: float32 from the cpu twin or "
                                   "the cuda kernels, float64 from the numpy reference. --text is "
                                   "encoded by the model's tokenizer.",
                       epilog="examples:\n  harness logits --text 'hello' --out logits.npy\n"
                              "  harness logits --model ckpt/ --ids 1,2,3 --backend reference --out ref.npy",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arg(p)
    prompt_args(p)
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="cpu (the Numba twin), cuda, or reference (numpy float64); default: "
                        "$PRIMEWALK_BACKEND or cpu")
    weights_arg(p)
    mode_arg(p)
    p.add_argument("--out", required=True, metavar="F.npy", help="output file (float64 for reference, float32 otherwise)")
    p.set_defaults(func=cmd_logits)
