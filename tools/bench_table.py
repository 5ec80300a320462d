#!/usr/bin/env python3
"""The README's performance tables from a bench JSON (markdown): the prime length curve and the
goals of issues #15 and #16, every number read from the file.

    python tools/bench_table.py receipts/bench/h200-bench.json

Paste the output into the README's "Performance" section after a device run. A JSON from
before the length curve (schema 1) prints its goals only.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.gpu.bench_report import curve_markdown, goals_markdown  # noqa: E402


def tables(r: dict) -> str:
    head = (f"From `{r.get('_path', 'the bench JSON')}`: {r.get('model')} on {r.get('device')}, driver "
            f"{r.get('driver')}, commit {str(r.get('commit'))[:10]}, {r.get('created')}.")
    parts = [head]
    if r.get("prime_curve"):
        parts += ["", "Prime time (seconds) vs prompt length:", "", curve_markdown(r)]
    parts += ["", "Goals:", "", goals_markdown(r)]
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", nargs="?", default="receipts/bench/h200-bench.json")
    a = ap.parse_args(argv)
    with open(a.bench) as f:
        r = json.load(f)
    r["_path"] = a.bench
    print(tables(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
