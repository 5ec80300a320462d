"""The draft step's cost on bench-8l, by draft vocabulary size (``harness.engine.draft``).

A K-draft step (``Engine.mtp_draft``: the fill rows, then K chained MTP passes) against one
stepwise decode step on the same engine, for the whole vocabulary and for draft vocabularies of
the first N ids; each timed as ``harness bench`` times it (``bench._time_draft_verify``). Also
checks, once per N, that the drafts are the argmax of the full head's logits over those ids.

    python tools/probe_draft.py --out receipts/probes/draft.json
    python tools/probe_draft.py --sizes 32768,16384 --ks 3 --backend cpu --model harness/models/tiny  # a dry run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _timing import sm_clocks  # noqa: E402

from harness.atomic import write_text_atomic  # noqa: E402
from harness.gpu import bench  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON to write")
    ap.add_argument("--sizes", default="65536,32768,16384,8192", help="draft vocabulary sizes N")
    ap.add_argument("--ks", default="1,2,3,4", help="draft lengths K")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--model", default=None, help="a checkpoint folder (default: bench-8l, built with transformers)")
    a = ap.parse_args(argv)
    from harness.engine.model import Engine
    from harness.engine.weights import load_checkpoint

    sizes = [int(x) for x in a.sizes.split(",") if x]
    ks = [int(x) for x in a.ks.split(",") if x]
    if a.model:
        ck = load_checkpoint(a.model)
    else:
        _, ck = bench.bench_checkpoint(tempfile.mkdtemp(prefix="bench8l-"))
    eng = Engine(ck, a.backend, check_finite=True)
    V = eng.cfg.vocab_size
    ids = np.random.default_rng(0).integers(0, V, 512).tolist()
    clocks_before = sm_clocks()
    dec = bench.decode_ms(eng, bench._primed(eng, ids), chained=False)
    sess = bench._primed(eng, ids)
    snap = sess.cache.snapshot()
    rows = []
    for n in [None] + [s for s in sizes if s < V]:
        eng.set_draft_vocab(n)
        for k in ks:
            t0 = time.perf_counter()
            d, _ = bench._time_draft_verify(eng, sess, snap, k)
            rows.append({"draft_vocab": n or V, "k": k, "draft_step_ms": bench._median(d) * 1e3,
                         "over_decode": bench._median(d) * 1e3 / dec, "wall_s": time.perf_counter() - t0})
            print(f"N={n or V:7d} K={k} draft step {rows[-1]['draft_step_ms']:.3f} ms = "
                  f"{rows[-1]['over_decode']:.3f} x decode", flush=True)
        if n is not None:  # the drafts are the full head's argmax over the draft vocabulary
            sess.cache.restore(snap)
            sess.cache.mtp_len = sess.cache.pos - 1
            hid = np.zeros((2, eng.cfg.hidden_size), np.float32)
            got = eng.mtp_draft(sess, [1, 2], hid, 1)[0]
            sess.cache.restore(snap)
            full, _ = eng.mtp_rows(sess, [1, 2], hid, sess.cache.pos - 1, logits_rows=1)
            sess.cache.restore(snap)
            want = int(eng.draft_ids[int(np.argmax(full[-1][eng.draft_ids]))])
            rows[-1]["first_draft_is_full_argmax_over_ids"] = got == want
    eng.set_draft_vocab(None)
    out = {"kind": "probe-draft", "device": eng.B.device_name(), "backend": a.backend, "vocab": V,
           "decode_512_stepwise_ms": dec, "rows": rows, "clocks_before": clocks_before, "clocks_after": sm_clocks(),
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": os.environ.get("PRIMEWALK_COMMIT")}
    write_text_atomic(a.out, json.dumps(out, indent=1) + "\n")
    return 0 if all(r.get("first_draft_is_full_argmax_over_ids", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
