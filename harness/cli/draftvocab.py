"""``harness draft-vocab``: a frequency-ranked draft vocabulary counted on a corpus (FR-Spec's
recipe), written as the file ``--draft-vocab FILE`` reads (``harness.engine.draft``)."""

from __future__ import annotations

import argparse
import collections
import os

from ..atomic import write_text_atomic
from ..engine.config import ModelConfig
from ..errors import PrimewalkError
from .common import model_arg


def count_tokens(tok, paths, vocab_size: int) -> collections.Counter:
    """Token counts of the UTF-8 files ``paths`` encoded by ``tok`` (each file on its own)."""
    counts = collections.Counter()
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise PrimewalkError(f"--corpus {p}: cannot read it as UTF-8 text ({e})") from None
        ids = tok.encode(text) if text else []
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise PrimewalkError(f"--corpus {p}: the tokenizer gives id {bad[0]}, outside the model's vocabulary")
        counts.update(ids)
    return counts


def ranked(counts: collections.Counter, size: int) -> list:
    """The ``size`` most frequent ids (ties: the lower id first), then, if the corpus saw fewer,
    the lowest unseen ids, so the vocabulary has ``size`` ids."""
    top = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    seen, i = set(top), 0
    while len(top) < size:
        if i not in seen:
            top.append(i)
        i += 1
    return top


def cmd_draft_vocab(args) -> int:
    from ..engine.tokenizer import load_tokenizer, no_tokenizer_error
    from ..models import default_model_path, resolve

    folder = resolve(args.model) if args.model else default_model_path()
    cfg = ModelConfig.from_json(os.path.join(folder, "config.json"))
    V = cfg.vocab_size
    if not 1 <= args.size <= V:
        raise PrimewalkError(f"--size {args.size} is outside 1..{V} (the model's vocabulary)")
    tok = load_tokenizer(folder, V)
    if tok is None:
        raise no_tokenizer_error(folder, V, "a corpus")
    files = []
    for p in args.corpus:
        if os.path.isdir(p):
            files += sorted(os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs if f.endswith(tuple(args.ext)))
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise PrimewalkError(f"--corpus {p}: no such file or folder")
    if not files:
        raise PrimewalkError("--corpus: no files (a folder is searched for " + ", ".join(args.ext) + ")")
    counts = count_tokens(tok, files, V)
    ids = ranked(counts, args.size)
    seen = sum(1 for t in ids if counts[t])
    total = sum(counts.values())
    covered = sum(counts[t] for t in ids) / max(1, total)
    head = [f"# draft vocabulary: the {args.size} most frequent of {V} ids in {len(files)} file(s), "
            f"{total} tokens (harness draft-vocab)",
            f"# they cover {covered:.1%} of the corpus's tokens; {args.size - seen} never seen there (the lowest unseen ids)",
            "# most frequent first; harness generate / run-matrix --draft-vocab read it as a set"]
    write_text_atomic(args.out, "\n".join(head + [" ".join(map(str, ids[i:i + 16])) for i in range(0, len(ids), 16)])
                      + "\n")
    print(f"draft-vocab: {args.size} ids covering {covered:.1%} of {total} corpus tokens -> {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("draft-vocab", help="a frequency-ranked draft vocabulary counted on a corpus",
                       description="Count the tokens of a corpus with the model's tokenizer and write its SIZE "
                                   "most frequent ids (ties: the lower id), the file that generate and "
                                   "run-matrix --draft-vocab FILE read (README: drafting among a draft "
                                   "vocabulary). Exit 2 on bad input.",
                       epilog="examples:\n  harness draft-vocab --model ckpt/ --corpus data/ --size 32768 --out top32k.txt\n"
                              "  harness draft-vocab --model stdlib-small --corpus notes.md --size 64 --out dv.txt",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arg(p)
    p.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                   help="UTF-8 text files, or folders searched for files ending in --ext")
    p.add_argument("--ext", nargs="+", default=[".txt", ".md", ".py", ".json", ".jsonl"],
                   help="file endings a corpus folder is searched for")
    p.add_argument("--size", type=int, required=True, help="how many ids (N)")
    p.add_argument("--out", required=True, help="the file to write")
    p.set_defaults(func=cmd_draft_vocab)
