#!/usr/bin/env python3
"""The bench's draft- and verify-step timing (``harness.gpu.bench.spec_run``) on bench-8l with
random weights, for several K and prompt lengths, in a chosen order: is a slow K a property of its
row count, of its session's capacity (prompt + 2·64 + K + 8 positions), or of when it runs?

    PYTHONPATH=. python tools/probe_spec_steps.py --out spec-steps.json [--ks 3,4,1,2,3] [--lens 512,513]

Prints one line per (prompt length, K): the draft step's and the verify step's median ms, and
one decode step's ms on the same engine for the ratio (``decode_ms`` on a 512-token session).
The bench's model and backend (``harness.gpu.bench.BENCH_8L``, ``BACKEND``): a GPU with ~6 GB free.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _cli import int_list  # noqa: E402
from harness.atomic import write_text_atomic  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ks", default="3,4,1,2,3", type=int_list(1, 4, "draft counts K (a verify step of at most 5 rows)"),
                    help="draft counts K, in the order run (1-4)")
    ap.add_argument("--lens", default="512,513", type=int_list(1, None, "prompt lengths"), help="prompt lengths")
    args = ap.parse_args(argv)
    ks, lens = args.ks, args.lens

    from harness.engine.config import ModelConfig
    from harness.engine.model import Engine
    from harness.engine.weights import Checkpoint
    from harness.gpu import bench
    from harness.gpu.bench import decode_ms, spec_run
    from harness.synth import random_tensors

    cfg = ModelConfig.from_dict(dict(bench.BENCH_8L, num_nextn_predict_layers=1))
    eng = Engine(Checkpoint(cfg, random_tensors(cfg, 0)), bench.BACKEND, check_finite=True)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, cfg.vocab_size, max(lens))]

    def decode():
        sess = eng.new_session(512 + 64)
        eng.prime(sess, ids[:512] if len(ids) >= 512 else ids)
        return decode_ms(eng, sess)

    res = {"ks": ks, "lens": lens, "decode_ms": [decode()], "runs": []}
    for L in lens:
        for k in ks:
            r = spec_run(eng, ids[:L], k)
            row = {"prompt": L, "k": k, "cap": L + 2 * 64 + k + 8,
                   "draft_step_ms": r["draft_step_ms"], "verify_step_ms": r["verify_step_ms"]}
            res["runs"].append(row)
            print(f"prompt {L} (cap {row['cap']}) K={k}: draft {row['draft_step_ms']:.3f} ms, "
                  f"verify {row['verify_step_ms']:.3f} ms", flush=True)
    res["decode_ms"].append(decode())
    d = float(np.median(res["decode_ms"]))
    print(f"decode step {', '.join(f'{x:.3f}' for x in res['decode_ms'])} ms; worst verify / decode "
          f"{max(r['verify_step_ms'] for r in res['runs']) / d:.3f}")
    write_text_atomic(args.out, json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
