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
import math
import os

import numpy as np
from numba import njit, prange

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


# the certified pick (numba_kernels.sampling.bound_pick): a draft pass's greedy pick from the bf16
# copy of the head's rows, then the exact dot of the few rows that can still be the largest
BOUND_MAX_K = 1 << 20  # bound_pick's xn margin assumes K ≤ 2**20


def _up32(v: np.ndarray) -> np.ndarray:
    """float64 values rounded up to float32 (the next float32 ≥ each; NaN stays NaN, inf inf)."""
    f = v.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        low = f.astype(np.float64) < v
    return np.where(low, np.nextafter(f, np.float32(np.inf)), f)


def bound_tables(W: np.ndarray):
    """The tables of ``bound_pick`` for a float32 head ``W`` [N, K]: (bf16 bits of W [N, K] uint16,
    rounded to nearest even -- the approximate head whose GEMV gives A; Rc [N]; Mc [N]; xf), so
    that for every x and row j: |L_j − A_j| ≤ Rc_j·‖x‖ + 2**-120 whenever Mc_j·‖x‖ < 2**125,
    L_j the canonical dot of x and W_j, A_j that of x and the bf16 row W̃_j (any summation order).

    Why: with T = Σ w·x and S = Σ w̃·x (real numbers), |T − S| ≤ ‖w − w̃‖·‖x‖ (Cauchy–Schwarz),
    and a float32 sum of K fma'd products, in any order, is within γ·Σ|terms| + (K+1)·2**-150 of
    its real value, γ = (K+1)u/(1 − (K+1)u), u = 2**-24 (each term passes through at most K + 1
    roundings; the absolute part is underflow), Σ|w·x| ≤ ‖w‖·‖x‖. So
    |L − A| ≤ (‖w − w̃‖ + γ(‖w‖ + ‖w̃‖))·‖x‖ + 2(K+1)·2**-150, and 2(K+1)·2**-150 < 2**-120. The
    norms are taken in float64 (relative error below K·2**-53) and the results rounded up by
    2**-20 and then to float32. Mc = max(‖w‖, ‖w̃‖)(1 + 2**-20) bounds every partial sum of both
    dots by Mc·‖x‖(1 + γ): below 2**125·1.001 nothing overflows. A weight that is not finite
    (or rounds to a bf16 inf) makes Mc inf or NaN: that row's block computes every row.
    xf: sqrt(dot(x, x))·xf + 2**-60 ≥ ‖x‖ (the dot's rounding γ, sqrt's and the multiply's,
    and ≤ K·2**-150 of underflowed squares). The bf16 bits are ``numba_kernels.mma.f32_to_bf16``'s (what
    ``round_bf16`` gives), made with the norms in one parallel pass over the rows."""
    W = np.asarray(W)
    if W.ndim != 2 or W.dtype != np.float32:
        raise ValueError(f"bound_tables: a float32 matrix, not {W.dtype} {W.shape}")
    N, K = W.shape
    if K > BOUND_MAX_K:
        raise ValueError(f"bound_tables: K = {K} is over {BOUND_MAX_K}")
    u = 2.0 ** -24
    g = (K + 1) * u / (1 - (K + 1) * u)
    W = np.ascontiguousarray(W)
    w16 = np.empty((N, K), np.uint16)
    norms = np.empty((N, 3), np.float64)
    _bf16_norms(W, W.view(np.uint32), w16, _bf16_values(), norms)
    nw, nt, nd = norms[:, 0], norms[:, 1], norms[:, 2]
    slack = 1 + 2.0 ** -20
    with np.errstate(invalid="ignore", over="ignore"):
        rc = _up32((nd + g * (nw + nt)) * slack)
        mc = _up32(np.maximum(nw, nt) * slack)
    xf = _up32(np.array([1 + 2 * g + 2.0 ** -20]))[0]
    return w16, rc, mc, np.float32(xf)


def _bf16_values():
    """Every bf16 bit pattern's value, float64 [65536] (``numba_kernels.mma.bf16_to_f32``)."""
    from numba_kernels.mma import bf16_to_f32

    with np.errstate(invalid="ignore"):  # signalling NaNs: NaN either way
        return bf16_to_f32(np.arange(1 << 16, dtype=np.uint16)).astype(np.float64)


@njit(parallel=True, cache=True)
def _bf16_norms(W, Wu, w16, value, out):
    """Row j of W [N, K] (``Wu`` its bits): its bf16 bits into w16[j] by ``numba_kernels.mma.
    f32_to_bf16``'s rule (nearest even; a NaN becomes 0x7fc0 with its sign), and sqrt(Σw²),
    sqrt(Σw̃²), sqrt(Σ(w − w̃)²) in float64 into out[j] (w̃ = value[bits]); rows in parallel."""
    for j in prange(W.shape[0]):
        a = b = c = 0.0
        for i in range(W.shape[1]):
            x = np.uint64(Wu[j, i])
            if (x & 0x7FFFFFFF) > 0x7F800000:
                h = ((x >> 16) & 0x8000) | 0x7FC0
            else:
                h = (x + 0x7FFF + ((x >> 16) & 1)) >> 16
            w16[j, i] = h
            w = np.float64(W[j, i])
            t = value[h]
            a += w * w
            b += t * t
            c += (w - t) * (w - t)
        out[j, 0] = math.sqrt(a)
        out[j, 1] = math.sqrt(b)
        out[j, 2] = math.sqrt(c)


def bound_wanted(backend: str, mode: str, weights: str) -> bool:
    """Whether an engine's draft passes pick through ``bound_pick``: in exact mode with float32
    weights (a bf16-resident head already reads half the bytes), on CUDA by default (on the CPU
    the approximate GEMV costs what the exact one does); ``PRIMEWALK_DRAFT_BOUND=0`` turns it off,
    ``=1`` on wherever it applies (the CPU included). The drafts are the same either way."""
    env = os.environ.get("PRIMEWALK_DRAFT_BOUND", "").strip()
    if env not in ("", "0", "1"):
        raise InputError(f"PRIMEWALK_DRAFT_BOUND={env!r}: give 0 or 1")
    if mode != "exact" or weights != "f32" or env == "0":
        return False
    return env == "1" or backend == "cuda"
