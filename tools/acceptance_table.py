#!/usr/bin/env python3
"""The acceptance table of a matrix receipt (markdown), as in the stdlib-small model card.

    python tools/acceptance_table.py receipts/device/h200-stdlib.json [--variant unyielded]

One row per (K, sampling) over the cells of one variant (default: the unyielded oracle cells):
mean acceptance length and per-position acceptance averaged over the prompts, speculative and
plain decode tokens/s as the median over the prompts (the first cell of a process also pays for
compilation, and every session for its first captured steps).
"""

import argparse
import json
import sys
from collections import defaultdict

import numpy as np


def table(receipt: dict, variant: str = "unyielded") -> str:
    groups = defaultdict(list)
    for c in receipt["cells"]:
        if c.get("variant") == variant and c.get("acceptance"):
            groups[(c["k"], c["sampling"])].append(c)
    if not groups:
        raise SystemExit(f"no {variant} cells with acceptance metrics in this receipt")
    out = ["| K | sampling | prompts | mean acceptance length | per-position acceptance | spec tok/s | plain tok/s |",
           "|---|---|---|---|---|---|---|"]
    for (k, samp), cells in sorted(groups.items(), key=lambda kv: (kv[0][1] != "greedy", kv[0][1], kv[0][0])):
        mal = float(np.mean([c["acceptance"]["mean_acceptance_length"] for c in cells]))
        pp = np.mean([c["acceptance"]["per_position"] for c in cells], axis=0)
        spec = float(np.median([c["timings"]["spec_tokens_per_s"] for c in cells]))
        plain = float(np.median([c["timings"]["decode_tokens_per_s"] for c in cells]))
        out.append(f"| {k} | {samp} | {len(cells)} | {mal:.2f} | {', '.join(f'{p:.2f}' for p in pp)} | "
                   f"{spec:.0f} | {plain:.0f} |")
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
