"""A draft vocabulary: the MTP head's greedy drafts picked among a subset of the vocabulary.

A draft step runs the MTP head K times, and each pass ends in the lm head: on a large vocabulary
(151,936 rows × 2,048 on Qwen3-Next) that one matrix is most of a pass's bytes, read K times a
round. Engines shrink it for drafts (SGLang's ``--speculative-token-map`` after FR-Spec, EAGLE-3's
32k draft vocabulary): the drafts are picked among the N ids of a *draft vocabulary*, through a
copy of those N rows of the lm head, and the verify step -- the full model -- decides as before.

What stays exact, and how it is tested (``tests/test_draft_vocab.py``):

- the draft logits are the full head's logits at those ids, bit for bit (each output row of the
  GEMV is computed alone, in the canonical order, whatever the matrix's height);
- a draft is the id of the largest of them, the lowest id on a tie (the ids are kept sorted);
- greedy speculative output equals plain greedy decoding token for token, with any draft
  vocabulary: only the acceptance changes.

A draft vocabulary is given as a count N (the ids 0..N-1: a BPE vocabulary's first ids are its
earliest, most frequent merges) or as a list of ids (a frequency-ranked list, e.g. counted on a
corpus). Order and repeats in a list do not matter: it is a set.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..errors import InputError


def draft_ids(spec, vocab_size: int) -> np.ndarray:
    """The draft vocabulary ``spec`` -- a count N (ids 0..N-1) or a sequence of ids -- as sorted,
    unique int64 ids in [0, vocab_size); :class:`InputError` on anything else."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        n = int(spec)
        if not 1 <= n <= vocab_size:
            raise InputError(f"draft vocabulary size {n} is outside 1..{vocab_size} (the model's vocabulary)")
        return np.arange(n, dtype=np.int64)
    try:
        a = np.asarray(spec)
    except (TypeError, ValueError) as e:
        raise InputError(f"draft vocabulary: not a list of token ids ({e})") from None
    if a.ndim != 1 or a.size == 0 or not (np.issubdtype(a.dtype, np.integer) or a.dtype == object and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in a)):
        raise InputError("draft vocabulary: give a count or a non-empty flat list of integer token ids")
    a = a.astype(np.int64)
    bad = a[(a < 0) | (a >= vocab_size)]
    if bad.size:
        raise InputError(f"draft vocabulary: token id {int(bad[0])} is outside the model's vocabulary 0..{vocab_size - 1}")
    return np.unique(a)


def read_draft_vocab(arg: str | None, vocab_size: int) -> np.ndarray | None:
    """``--draft-vocab`` as given on a command line: a count N, or a file of token ids (a JSON
    list, or ids separated by whitespace or commas; ``#`` starts a comment line); None (the
    option not given) stays None, the whole vocabulary."""
    if arg is None:
        return None
    s = str(arg).strip()
    if s.isdigit():
        return draft_ids(int(s), vocab_size)
    if not os.path.isfile(s):
        raise InputError(f"--draft-vocab {arg!r}: neither a count nor a file")
    try:
        with open(s, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--draft-vocab {s}: cannot read it ({e})") from None
    if text.lstrip().startswith("["):
        try:
            ids = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"--draft-vocab {s}: not valid JSON ({e})") from None
    else:
        words = " ".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")).replace(",", " ").split()
        try:
            ids = [int(w) for w in words]
        except ValueError:
            bad = next(w for w in words if not w.lstrip("-").isdigit())
            raise InputError(f"--draft-vocab {s}: {bad!r} is not a token id") from None
    return draft_ids(ids, vocab_size)


def digest(ids: np.ndarray) -> str:
    """The SHA-256 of the ids (as little-endian int64), for receipts and reports."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(ids, "<i8").tobytes()).hexdigest()
