"""Check the stdlib-small export with primewalk's own stack, without torch.

    python tools/check_stdlib.py [--model harness/models/stdlib-small] [--windows 8] [--out F.json]

On ``heldout_eval.bin`` (windows of 1024 bytes, each from an empty state) computes trunk
bits/byte (rows 0..1022 predicting bytes 1..1023) and MTP bits/byte and top-1 (rows 1..1022:
the byte at p with the trunk hidden at p-1, predicting byte p+1; row 0 pairs byte 0 with zeros
and is context only) with the float64 reference (``RefModel``) and with the CPU backend
(float32 exact mode), and compares them with the torch numbers in ``train_log.json``.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from harness.atomic import write_text_atomic  # noqa: E402
from harness.engine.model import Engine  # noqa: E402
from harness.engine.weights import load_checkpoint  # noqa: E402
from numba_kernels.reference import RefModel  # noqa: E402

WIN = 1024


def nll_bits(logits, targets):
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1))
    return float((lse - z[np.arange(len(targets)), targets]).sum() / math.log(2.0))


def evaluate(windows, trunk_and_mtp):
    tb = mb = 0.0
    tn = mn = top = 0
    for w in windows:
        logits, mlogits = trunk_and_mtp(w)
        tb += nll_bits(logits[:-1], w[1:])
        tn += len(w) - 1
        rows, tgt = mlogits[1:], w[2:]
        mb += nll_bits(rows, tgt)
        mn += len(tgt)
        top += int((np.argmax(rows, axis=-1) == tgt).sum())
    return {"trunk_bits_per_byte": tb / tn, "mtp_bits_per_byte": mb / mn, "mtp_top1": top / mn}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join("harness", "models", "stdlib-small"))
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--out", default=None, help="write the numbers as JSON here")
    args = ap.parse_args()
    ck = load_checkpoint(args.model)
    raw = np.fromfile(os.path.join(args.model, "heldout_eval.bin"), dtype=np.uint8).astype(np.int64)
    windows = [raw[i * WIN:(i + 1) * WIN] for i in range(min(args.windows, len(raw) // WIN))]
    H = ck.config.hidden_size

    ref = RefModel(ck.config, ck.tensors)

    def ref_run(w):
        logits, hid = ref.forward(w)
        st = ref.new_state(len(w))
        mlog, _ = ref.mtp_rows(w[:-1], np.concatenate([np.zeros((1, H)), hid[:-2]]), st, 0)
        return logits, mlog

    eng = Engine(ck, "cpu")

    def cpu_run(w):
        s = eng.new_session(len(w) + 1)
        logits, hid = eng.target_step(s, w)
        mlog, _ = eng.mtp_rows(s, w[:-1], np.concatenate([np.zeros((1, H), np.float32), hid[:-2]]), 0)
        return logits, mlog

    res = {"windows": len(windows), "reference_float64": evaluate(windows, ref_run),
           "cpu_float32": evaluate(windows, cpu_run)}
    log_path = os.path.join(args.model, "train_log.json")
    if os.path.exists(log_path):
        with open(log_path) as f:
            log = json.load(f)
        t = log.get("results", {})
        res["torch"] = {k: {m: t[k][m] for m in ("bits_per_byte", "mtp_bits_per_byte", "mtp_top1")}
                        for k in ("sample_float32", "sample_float64") if k in t}
    t = res.get("torch") or {}
    for name in ("reference_float64", "cpu_float32"):
        r = res[name]
        print(f"{name:18s} trunk {r['trunk_bits_per_byte']:.6f} bits/byte, MTP {r['mtp_bits_per_byte']:.6f} "
              f"bits/byte, MTP top-1 {r['mtp_top1']:.4f}")
    for k, v in t.items():
        print(f"torch {k:12s} trunk {v['bits_per_byte']:.6f} bits/byte, MTP {v['mtp_bits_per_byte']:.6f} "
              f"bits/byte, MTP top-1 {v['mtp_top1']:.4f}")
        for name in ("reference_float64", "cpu_float32"):
            d = abs(res[name]["trunk_bits_per_byte"] - v["bits_per_byte"])
            print(f"  |{name} - torch {k}| trunk = {d:.2e} bits/byte (bound 1e-3: {'ok' if d <= 1e-3 else 'EXCEEDED'})")
    if args.out:
        write_text_atomic(args.out, json.dumps(res, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
