#!/usr/bin/env python3
"""The acceptance table of a matrix receipt (markdown), as in the stdlib-small model card.

    python tools/acceptance_table.py receipts/device/cuda-stdlib.json [--variant unyielded]

One row per (K, sampling) over the cells of one variant (default: the unyielded oracle cells):
mean acceptance length and per-position acceptance pooled over the prompts by drafts
(``harness.matrix.receipts.acceptance_by_k``, as the plots and notebooks count them), speculative and
plain decode tokens/s as the median over the prompts (the first cell of a process also pays for
compilation, and every session for its first captured steps).
"""

import argparse
import json
import sys
import os

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.matrix.receipts import acceptance_by_k  # noqa: E402


def table(receipt: dict, variant: str = "unyielded") -> str:
    cells = [c for c in receipt["cells"] if c.get("variant") == variant]
    pooled = acceptance_by_k(cells)
    if not pooled:
        raise SystemExit(f"no {variant} cells with acceptance metrics in this receipt")
    out = ["| K | sampling | prompts | mean acceptance length | per-position acceptance | spec tok/s | plain tok/s |",
           "|---|---|---|---|---|---|---|"]
    for (k, samp), p in sorted(pooled.items(), key=lambda kv: (kv[0][1] != "greedy", kv[0][1], kv[0][0])):
        group = [c for c in cells if (c["k"], c["sampling"]) == (k, samp)]
        spec = float(np.median([c["timings"]["spec_tokens_per_s"] for c in group]))
        plain = float(np.median([c["timings"]["decode_tokens_per_s"] for c in group]))
        out.append(f"| {k} | {samp} | {p['cells']} | {p['mean_acceptance_length']:.2f} | "
                   f"{', '.join(f'{r:.2f}' for r in p['per_position'])} | {spec:.0f} | {plain:.0f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("receipt")
    ap.add_argument("--variant", default="unyielded")
    a = ap.parse_args(argv)
    try:
        with open(a.receipt, encoding="utf-8") as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        print(f"acceptance_table: {a.receipt}: {e}", file=sys.stderr)
        return 2
    print(table(r, a.variant))
    return 0


if __name__ == "__main__":
    sys.exit(main())
