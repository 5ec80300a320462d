"""``harness oracle``: one's own checkpoint against transformers (an optional extra).

Loads the folder twice -- with primewalk (its float64 reference and the float32 engine on
``--backend``) and with transformers' own class for its ``model_type`` in float32 (eager
attention and experts) -- runs one prompt through both and compares the logits at every
position. PASS when primewalk's float64 reference is within ``--rtol`` × max |logit| of HF's
float32 logits and every position's argmax agrees (HF float32 carries float32 rounding through
every layer: ~1e-6 relative on the 4-layer oracle models, growing with depth; the default 1e-4
leaves room for a 48-64 layer checkpoint). The engine's float32 error against the reference is
printed too. The MTP head is not compared here (transformers has none): tests/test_oracle.py
checks it against a torch MTP built from HF parts.
"""

from __future__ import annotations

import argparse

import numpy as np

from ..errors import PrimewalkError
from .common import backend_arg, load_model, model_arg, prompt_ids

HF_CLASSES = {  # model_type -> transformers class
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
}


def hf_logits(folder: str, ids) -> np.ndarray:
    """transformers' float32 logits [T, V] for ``ids`` from the checkpoint folder."""
    import json
    import os

    try:
        import torch
        import transformers
    except ImportError:
        raise PrimewalkError("harness oracle needs torch and transformers (pip install -e '.[oracle]')") from None
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        mt = json.load(f).get("model_type")
    cls = getattr(transformers, HF_CLASSES.get(mt, ""), None)
    if cls is None:
        raise PrimewalkError(f"model_type {mt!r}: transformers {transformers.__version__} has no class for it")
    model = cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    for c in {id(model.config): model.config, id(model.config.get_text_config()): model.config.get_text_config()}.values():
        c._experts_implementation = "eager"
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(np.asarray(ids, dtype=np.int64))[None], use_cache=False)
    return out.logits[0].double().numpy()


def cmd_oracle(args) -> int:
    from numba_kernels.reference import RefModel

    from ..engine.model import Engine

    ck = load_model(args.model)
    V = ck.config.vocab_size
    if args.ids is None and args.text is None:
        ids = np.random.default_rng(args.seed).integers(0, V, args.prompt_len)
    else:
        ids = np.asarray(prompt_ids(args))
    if ids.size == 0 or ids.min() < 0 or ids.max() >= V:
        raise PrimewalkError(f"the prompt must be non-empty token ids in [0, {V})")
    ref = RefModel(ck.config, ck.tensors).forward(ids)[0]
    eng = Engine(ck, args.backend, weights=args.weights)
    ours = np.asarray(eng.target_step(eng.new_session(len(ids)), ids)[0], dtype=np.float64)
    hf = hf_logits(ck.path, ids)
    scale = float(np.abs(hf).max())
    rel_ref = float(np.abs(ref - hf).max()) / scale
    rel_eng = float(np.abs(ours - ref).max()) / scale
    agree = float((ref.argmax(-1) == hf.argmax(-1)).mean())
    ok = rel_ref <= args.rtol and agree == 1.0
    print(f"{'PASS' if ok else 'FAIL'} model={ck.path} model_type={ck.config.model_type} tokens={len(ids)} "
          f"reference_vs_hf_f32={rel_ref:.3e} rtol={args.rtol:g} argmax_agree={agree:.3f} "
          f"engine_{eng.B.name}_{eng.weights}_vs_reference={rel_eng:.3e}")
    return 0 if ok else 1


def register(sub) -> None:
    p = sub.add_parser("oracle", help="check a checkpoint against transformers (needs the oracle extra)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example: harness oracle --model ~/ckpt/Qwen3.5-27B --prompt-len 32")
    model_arg(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ids", help="comma-separated token ids (default: --prompt-len random ids)")
    g.add_argument("--text", help="prompt text, tokenised as UTF-8 bytes")
    g.add_argument("--prompt-len", type=int, default=32, help="random prompt length (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt (default 0)")
    backend_arg(p)
    p.add_argument("--rtol", type=float, default=1e-4,
                   help="largest |reference - HF float32| / max |logit| that passes (default 1e-4)")
    p.set_defaults(func=cmd_oracle)
