"""``harness logits``: logits for every position of a prompt, as ``.npy`` [T, vocab]."""

from __future__ import annotations

import argparse
import io

import numpy as np

from ..errors import PrimewalkError
from .common import backend_arg, load_model, mode_arg, model_arg, prompt_args, prompt_ids


def cmd_logits(args) -> int:
    from ..atomic import write_bytes_atomic

    ck = load_model(args.model)
    ids = prompt_ids(args)
    V = ck.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise PrimewalkError(f"token id {bad[0]} is out of range for vocab_size {V}")
    if args.backend in (None, "reference") and args.mode not in (None, "exact"):
        raise PrimewalkError(f"--mode {args.mode} needs --backend cpu or cuda (the reference is float64)")
    if args.backend in (None, "reference"):
        from numba_kernels.reference import RefModel

        logits, _ = RefModel(ck.config, ck.tensors).forward(ids)
    else:
        from ..engine.model import Engine

        eng = Engine(ck, args.backend, mode=args.mode)
        logits, _ = eng.target_step(eng.new_session(len(ids)), np.asarray(ids))
    buf = io.BytesIO()
    np.save(buf, logits, allow_pickle=False)
    write_bytes_atomic(args.out, buf.getvalue())
    print(f"wrote {args.out}: logits [{logits.shape[0]}, {logits.shape[1]}] {logits.dtype} "
          f"({args.backend or 'reference'}), argmax of last row {int(np.argmax(logits[-1]))}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("logits", help="logits for every position of a prompt, as .npy [T, vocab]",
                       epilog="example: harness logits --text 'hello' --backend cpu --out logits.npy",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arg(p)
    prompt_args(p)
    backend_arg(p, ("reference", "cpu", "cuda"))
    mode_arg(p)
    p.add_argument("--out", required=True, metavar="F.npy", help="output file (float64 for reference, float32 otherwise)")
    p.set_defaults(func=cmd_logits)
