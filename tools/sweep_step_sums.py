#!/usr/bin/env python3
"""A GEMV sweep's times (``tools/decode_kernels.py --sweep`` JSON) summed over the GEMV launches of
one bench-8l decode or verify step: for each row count, the configuration that was the default
when the sweep ran against the one ``gemv_pick`` picks now (both timed in that sweep), over the
large-N shapes with the lm head, the large-N shapes alone and the 2,048-output shapes.

    python tools/sweep_step_sums.py receipts/probes/h200-decode-kernels-sweep-rows-20d605d.json
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from harness.gpu.bench import BENCH_8L  # noqa: E402
from numba_kernels.linear import gemv_pick  # noqa: E402


def launches():
    """GEMV launches per step by sweep shape name: each DeltaNet layer runs gdn in and gdn out,
    each attention layer attn qkv and attn o, every layer its MLP, and the step one lm head."""
    types = BENCH_8L["layer_types"]
    gdn = sum(t == "linear_attention" for t in types)
    att = len(types) - gdn
    return {"gdn in": gdn, "gdn out": gdn, "attn qkv": att, "attn o": att,
            "mlp gate+up": len(types), "mlp down": len(types), "lm head": 1}


GROUPS = {"large N + lm head": ("gdn in", "mlp gate+up", "attn qkv", "lm head"),
          "large N": ("gdn in", "mlp gate+up", "attn qkv"),
          "2,048 outputs": ("gdn out", "attn o", "mlp down")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="the JSON tools/decode_kernels.py --sweep wrote")
    args = ap.parse_args(argv)
    try:
        with open(args.sweep) as f:
            rows = json.load(f)["sweep"]
    except (OSError, ValueError, KeyError) as e:
        ap.error(f"{args.sweep}: not a sweep JSON ({e})")
    n = launches()
    for R in sorted({r["R"] for r in rows}):
        out = []
        for group, ops in GROUPS.items():
            was = now = 0.0
            for op in ops:
                mine = [r for r in rows if r["R"] == R and r["op"] == op and r["us"]]
                if not mine:
                    break
                pick = gemv_pick(mine[0]["N"], mine[0]["K"], R, bf16=mine[0]["bf16"]).name()
                dflt = [r["us"] for r in mine if r["default"]]
                cur = [r["us"] for r in mine if r["cfg"] == pick]
                if not dflt or not cur:
                    break
                was += n[op] * dflt[0]
                now += n[op] * cur[0]
            else:
                out.append(f"{group} {was:.0f} -> {now:.0f} us ({100 * (1 - now / was):.0f} % less)")
        print(f"R{R}: " + "; ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
