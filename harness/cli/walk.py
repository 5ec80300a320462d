"""``harness check`` (the seed's prime-walker check) and ``harness generate``."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .. import tokenizer
from ..engine.model import Engine
from ..errors import PrimewalkError
from ..walk.check import check_mtp_prime_walker
from ..walk.mtp_walker import DEFAULT_CHUNK_ROWS, DEFAULT_FILL_CHUNK
from ..walk.sampling import Sampling
from ..walk.speculative import generate
from .common import backend_arg, load_model, mode_arg, model_arg, prompt_args, prompt_ids


def _engine(args):
    ck = load_model(args.model)
    ck.require_mtp(f"harness {args.command}")
    return Engine(ck, args.backend, mode=args.mode)


def cmd_check(args) -> int:
    if args.prompt_len < 1:
        raise PrimewalkError(f"--prompt-len must be positive, got {args.prompt_len}")
    if args.k < 1:
        raise PrimewalkError(f"--k must be at least 1, got {args.k}")
    eng = _engine(args)
    prompt = np.random.default_rng(args.seed).integers(0, eng.cfg.vocab_size, args.prompt_len).tolist()
    r = check_mtp_prime_walker(eng, prompt, args.k, boundary=args.split, chunk_rows=args.chunk_rows,
                               fill_chunk=args.fill_chunk)
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
    eng = _engine(args)
    ids = prompt_ids(args)
    s = Sampling(args.temperature, args.seed)
    res, run = generate(eng, ids, args.max_new_tokens, args.k, s, speculative=not args.plain)
    text = tokenizer.decode(res.tokens) if eng.cfg.vocab_size <= tokenizer.VOCAB_SIZE else " ".join(map(str, res.tokens))
    sys.stdout.write(text + "\n")
    m = res.metrics
    if args.plain:
        print(f"[generate] plain {s.label}: {len(res.tokens)} tokens, {res.tokens_per_s:.1f} tok/s, "
              f"prime {len(ids)} tokens in {run.wall_s * 1e3:.1f} ms ({eng.B.name})", file=sys.stderr)
    else:
        print(f"[generate] K={args.k} {s.label}: {len(res.tokens)} tokens, {res.tokens_per_s:.1f} tok/s, "
              f"mean acceptance length {m['mean_acceptance_length']:.2f}, per-position "
              f"[{', '.join(f'{x:.2f}' for x in m['per_position'])}], drafts {m['drafts']}, "
              f"accepted {m['accepted']}, prime {len(ids)} tokens in {run.wall_s * 1e3:.1f} ms ({eng.B.name})",
              file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("check", help="the prime-walker check: yielded walker prime vs unyielded oracle, bitwise",
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
                       epilog="examples:\n  harness generate --text 'def main(' --max-new-tokens 64 --k 3\n"
                              "  harness generate --ids 1,2,3 --max-new-tokens 16 --k 2 --temperature 0.7 --seed 1",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arg(p)
    prompt_args(p)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=2, help="draft length K")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (counter RNG)")
    p.add_argument("--plain", action="store_true", help="plain decoding (no drafts), for comparison")
    backend_arg(p)
    mode_arg(p)
    p.set_defaults(func=cmd_generate)
