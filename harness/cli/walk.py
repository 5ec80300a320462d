"""``harness check`` (the seed's prime-walker check) and ``harness generate``."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ..engine.draft import read_draft_vocab
from ..engine.model import Engine
from ..errors import PrimewalkError
from ..walk.check import check_mtp_prime_walker
from ..walk.mtp_walker import DEFAULT_CHUNK_ROWS, DEFAULT_FILL_CHUNK
from ..walk.sampling import Sampling
from ..walk.speculative import generate
from ..walk.warmup import warm_up
from .common import backend_arg, backend_label, load_model, mode_arg, model_arg, model_tokenizer, prompt_args, prompt_ids
from .progress import StatusLine


def _engine(args, need_mtp: bool = True):
    ck = load_model(args.model)
    if need_mtp:
        ck.require_mtp(f"harness {args.command}" + (" (speculative; --plain decodes without drafts)"
                                                    if args.command == "generate" else ""))
    dv = getattr(args, "draft_vocab", None)
    if dv is not None and getattr(args, "plain", False):
        raise PrimewalkError("--draft-vocab is for speculative decoding; --plain drafts nothing")
    return Engine(ck, args.backend, weights=args.weights, mode=args.mode,
                  draft_vocab=read_draft_vocab(dv, ck.config.vocab_size))


def cmd_check(args) -> int:
    if args.prompt_len < 1:
        raise PrimewalkError(f"--prompt-len must be positive, got {args.prompt_len}")
    if args.k < 1:
        raise PrimewalkError(f"--k must be at least 1, got {args.k}")
    eng = _engine(args)
    prompt = np.random.default_rng(args.seed).integers(0, eng.cfg.vocab_size, args.prompt_len).tolist()
    status = StatusLine("check")  # on a terminal: what runs, and the walker's chunks with the time left
    try:
        r = check_mtp_prime_walker(eng, prompt, args.k, boundary=args.split, chunk_rows=args.chunk_rows,
                                   fill_chunk=args.fill_chunk, progress=status)
    finally:
        status.close()
    if r["ok"]:
        print(f"PASS rows={r['rows']} boundary={r['boundary']} k={r['k']} yields={r['yields']} "
              f"chunks={len(r['tape'])} backend={eng.B.name} target_logits={r['logits_digest']} "
              f"boundary_state={r['capture_digest']}")
        return 0
    print(f"FAIL rows={r['rows']} boundary={r['boundary']} k={r['k']} yields={r['yields']} backend={eng.B.name}: "
          + "; ".join(r["problems"]))
    return 1


def cmd_generate(args) -> int:
    if args.max_new_tokens < 1:
        raise PrimewalkError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if args.k < 1:
        raise PrimewalkError(f"--k must be at least 1, got {args.k}")
    if args.temperature < 0:
        raise PrimewalkError(f"--temperature must be >= 0, got {args.temperature}")
    eng = _engine(args, need_mtp=not args.plain)
    tok = model_tokenizer(eng.ckpt)
    ids = prompt_ids(args, eng.ckpt)
    s = Sampling(args.temperature, args.seed)
    warm = 0.0 if args.no_warmup else warm_up(eng, args.k)
    res, run = generate(eng, ids, args.max_new_tokens, args.k, s, speculative=not args.plain)
    text = tok.decode(res.tokens) if tok is not None else " ".join(map(str, res.tokens))
    sys.stdout.write(text + "\n")
    m = res.metrics
    tail = f"({backend_label(eng.B)}" + (f", warm-up {warm:.1f} s untimed)" if warm else ")")
    if args.plain:
        print(f"[generate] plain {s.label}: {len(res.tokens)} tokens, {res.tokens_per_s:.1f} tok/s, "
              f"prime {len(ids)} tokens in {run.wall_s * 1e3:.1f} ms {tail}", file=sys.stderr)
    else:
        dv = "" if eng.draft_ids is None else f" draft vocabulary {len(eng.draft_ids)} ids"
        print(f"[generate] K={args.k}{dv} {s.label}: {len(res.tokens)} tokens, {res.tokens_per_s:.1f} tok/s, "
              f"mean acceptance length {m['mean_acceptance_length']:.2f}, per-position "
              f"[{', '.join(f'{x:.2f}' for x in m['per_position'])}], drafts {m['drafts']}, "
              f"accepted {m['accepted']}, prime {len(ids)} tokens in {run.wall_s * 1e3:.1f} ms {tail}",
              file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("check", help="the prime-walker check: yielded walker prime vs unyielded oracle, bitwise",
                       description="The seed's prime-walker check on a synthetic prompt: prime it split and "
                                   "checkpointed at a boundary, one chunk per advance with a peer session "
                                   "decoding between chunks, and compare the logits and the boundary "
                                   "captures bit for bit with an unyielded prime of the same two segments. "
                                   "Exit 0 PASS, 1 FAIL, 2 bad input.",
                       epilog="examples:\n  harness check --prompt-len 257\n  harness check --prompt-len 2061 --split 1024 --k 4",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arg(p)
    p.add_argument("--prompt-len", type=int, required=True, help="synthetic prompt length")
    p.add_argument("--split", type=int, default=None,
                   help="boundary (default: half the prompt rounded down to the GDN grid of 64)")
    p.add_argument("--k", type=int, default=1, help="draft length K (default 1)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS, help="batched prime chunk rows")
    p.add_argument("--fill-chunk", type=int, default=DEFAULT_FILL_CHUNK, help="MTP fill chunk rows")
    backend_arg(p)
    mode_arg(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("generate", help="speculative (MTP) generation with acceptance metrics",
                       description="Prime a prompt and continue it with MTP speculative decoding (or "
                                   "plainly with --plain, which also runs a model without an MTP head). "
                                   "The continuation goes to stdout, decoded by the model's tokenizer (ids "
                                   "when it has none); throughput and acceptance go to stderr. Kernels are "
                                   "compiled by a warm-up before the clock starts.",
                       epilog="examples:\n  harness generate --model stdlib-small --text 'def main(' --max-new-tokens 64 --k 3\n"
                              "  harness generate --ids 1,2,3 --max-new-tokens 16 --k 2 --temperature 0.7 --seed 1\n"
                              "  harness generate --model stdlib-small --text 'import os' --k 3 --draft-vocab 128",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arg(p)
    prompt_args(p)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=2, help="draft length K")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (counter RNG)")
    p.add_argument("--plain", action="store_true", help="plain decoding (no drafts), for comparison")
    p.add_argument("--draft-vocab", metavar="N|FILE", default=None,
                   help="draft among the ids 0..N-1, or among the ids in FILE (a JSON list, or ids separated "
                        "by spaces, commas or newlines): the lm head's other rows are not read for drafts; "
                        "greedy output is unchanged, only acceptance moves")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the warm-up (the first timings then include compilation)")
    backend_arg(p)
    mode_arg(p)
    p.set_defaults(func=cmd_generate)
