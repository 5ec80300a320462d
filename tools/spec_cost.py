"""What one speculative round costs against plain decoding, and the acceptance it would need.

A speculative round with K drafts runs the MTP head K times (``mtp_draft``: the fill rows and a
chain of K drafts), verifies K + 1 rows in one ``target_step`` (per-row state captured) and rolls
back; it yields, on average, the mean acceptance length L tokens. Plain decoding yields one
token per ``decode_step``. Speculation pays only when L > (draft + verify) / decode: the
*break-even* length this script prints per K, beside the largest L possible, K + 1.

    python tools/spec_cost.py                                  # stdlib-small on the CPU twin
    python tools/spec_cost.py --model harness/models/tiny --k 1,2,3,4 --backend cuda
    python tools/spec_cost.py --draft-vocab 64                 # drafting among the ids 0..63

The README's "Speculative decoding is slower here" table comes from this script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness.engine.draft import read_draft_vocab  # noqa: E402
from harness.engine.model import Engine  # noqa: E402
from harness.engine.weights import load_checkpoint  # noqa: E402
from harness.models import model_path  # noqa: E402
from harness.walk.mtp_walker import run_prime  # noqa: E402
from harness.walk.warmup import warm_up  # noqa: E402


def timed(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=model_path("stdlib-small"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--k", default="1,2,3,4")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--draft-vocab", metavar="N|FILE", default=None,
                    help="draft among the ids 0..N-1 or those in FILE (README: drafting among a draft vocabulary)")
    args = ap.parse_args(argv)
    ck = load_checkpoint(args.model)
    dv = read_draft_vocab(args.draft_vocab, ck.config.vocab_size)
    eng = Engine(ck, args.backend, draft_vocab=dv)
    ks = [int(k) for k in args.k.split(",")]
    warm_up(eng, max(ks))
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, eng.cfg.vocab_size, args.prompt_len)]
    sess = eng.new_session(args.prompt_len + 64)
    prep = run_prime(eng, sess, prompt, max(ks)).prepared
    snap = sess.cache.snapshot()
    tok = prep.boundary

    def decode():
        sess.cache.restore(snap)
        eng.decode_step(sess, tok)
        eng.B.synchronize()

    restore_s = timed(lambda: sess.cache.restore(snap), args.repeat)
    decode_s = timed(decode, args.repeat) - restore_s
    threads = getattr(eng.B, "threads", None)
    print(f"model {os.path.basename(os.path.normpath(args.model))}, {args.backend}"
          + (f" ({threads} thread{'s' if threads != 1 else ''})" if threads else "")
          + f", context {args.prompt_len}" + ("" if dv is None else f", drafts among {dv.size} ids")
          + f": decode step {decode_s * 1e3:.2f} ms")
    print("  K   draft ms  verify ms  break-even L (round / decode)  max L (K + 1)")
    for k in ks:
        fill_tokens = [prep.boundary, prep.boundary]
        fill_h = np.concatenate([prep.hiddens[-1:], prep.init_h], axis=0)

        def draft():
            sess.cache.restore(snap)
            eng.mtp_draft(sess, fill_tokens, fill_h, k)
            eng.B.synchronize()

        def verify():
            sess.cache.restore(snap)
            eng.target_step(sess, [tok] * (k + 1), capture=True)
            eng.rollback(sess, 1)
            eng.B.synchronize()

        draft_s = timed(draft, args.repeat) - restore_s
        verify_s = timed(verify, args.repeat) - restore_s
        ratio = (draft_s + verify_s) / decode_s
        print(f"  {k}   {draft_s * 1e3:8.2f}  {verify_s * 1e3:9.2f}  {ratio:29.2f}  {k + 1:13d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
