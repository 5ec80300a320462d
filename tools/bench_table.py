#!/usr/bin/env python3
"""The README's performance tables from a bench JSON (markdown): the run and its anchors, the
prime length curve, decode, speculative decoding and the goals of issues #15, #16 and #19, every
number read from the file.

    python tools/bench_table.py [receipts/bench/cuda-bench.json]            # print the tables
    python tools/bench_table.py --readme README.md                          # rewrite the README's block
    python tools/bench_table.py --check README.md                           # exit 1 if the block differs

The README's Performance section holds the tables between two markers
(``harness.gpu.bench_report.README_BEGIN`` / ``README_END``); ``--readme`` replaces what is
between them (an atomic write; nothing else in the file changes) and ``tests/test_readme.py``
checks that it equals the committed JSON's tables. Run it after importing a new bench
(``tools/import_evidence.sh``), then read the diff. A JSON from before the length curve
(schema 1) prints its goals only.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness.gpu.bench_report import (curve_markdown, goals_markdown, readme_block,  # noqa: E402
                                      readme_markdown, replace_readme_block)


def tables(r: dict) -> str:
    """The plain tables (schema 1 results too): the curve and the goals as the JSON has them."""
    head = (f"From `{r.get('_path', 'the bench JSON')}`: {r.get('model')} on {r.get('device')}, driver "
            f"{r.get('driver')}, commit {str(r.get('commit'))[:10]}, {r.get('created')}.")
    parts = [head]
    if r.get("prime_curve"):
        parts += ["", "Prime time (seconds) vs prompt length:", "", curve_markdown(r)]
    parts += ["", "Goals:", "", goals_markdown(r)]
    return "\n".join(parts)


def _rel(path: str) -> str:
    """``path`` as the README names it: relative to the repository when inside it."""
    p = os.path.relpath(os.path.abspath(path), ROOT)
    return path if p.startswith("..") else p.replace(os.sep, "/")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", nargs="?", default=os.path.join(ROOT, "receipts/bench/cuda-bench.json"))
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--readme", metavar="README", help="rewrite the block between the markers in this file")
    g.add_argument("--check", metavar="README", help="exit 1 if this file's block differs from the JSON's tables")
    a = ap.parse_args(argv)
    prog = "bench_table"
    try:
        with open(a.bench, encoding="utf-8") as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{prog}: error: {a.bench}: cannot read the bench JSON ({e})", file=sys.stderr)
        return 2
    if not isinstance(r, dict):
        print(f"{prog}: error: {a.bench}: not a bench result (a JSON object)", file=sys.stderr)
        return 2
    if not (a.readme or a.check):
        r["_path"] = a.bench
        print(tables(r) if r.get("schema_version", 1) < 2 else readme_markdown(r, _rel(a.bench)))
        return 0
    readme = a.readme or a.check
    try:
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        old = readme_block(text)
    except (OSError, ValueError) as e:
        print(f"{prog}: error: {readme}: {e}", file=sys.stderr)
        return 2
    new = readme_markdown(r, _rel(a.bench))
    if a.check:
        if old == new:
            print(f"{readme}: the performance tables match {a.bench}")
            return 0
        print(f"{readme}: the performance tables differ from {a.bench} "
              f"(python tools/bench_table.py --readme {readme} rewrites them)", file=sys.stderr)
        return 1
    if old == new:
        print(f"{readme}: unchanged")
        return 0
    from harness.atomic import write_text_atomic

    write_text_atomic(readme, replace_readme_block(text, new))
    print(f"{readme}: performance tables rewritten from {a.bench} (read the diff before committing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
