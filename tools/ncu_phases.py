#!/usr/bin/env python3
"""Where a kernel's warps spend their instructions, phase by phase, from Nsight Compute's source
page (``ncu --section SourceCounters --section WarpStateStats --page source --print-source sass
--csv``, gzipped or not; e.g. ``receipts/probes/h100-ncu-attn-sk-4925165/ncu-sk-source.csv.gz``).

    python tools/ncu_phases.py SOURCE.csv[.gz]

The SASS is cut after each block barrier (``BAR.SYNC``) and each ``EXIT``: one phase a stretch.
Per phase it prints the instructions executed per warp (the phase's warp-level instructions over
the executions of its first instruction: the warps that reached it), the warp-level
instructions in all, and the stall samples (all, and ``long_sb``: waiting on a global or local
load). Exit 0; 2 on a file with no source page."""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import sys

_INST = "Instructions Executed"
_SAMPLES = "Warp Stall Sampling (All Samples)"
_LONG_SB = "stall_long_sb"


def _num(s) -> int:
    try:
        return int(float(str(s).replace(",", "") or 0))
    except ValueError:
        return 0


def phases(text: str) -> list[dict]:
    """The phases of one source page's CSV text: dicts with ``first``/``last`` (SASS line
    indices), ``warps``, ``per_warp``, ``instructions``, ``samples``, ``long_sb``."""
    lines = text.splitlines()
    head = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if head is None:
        raise ValueError("no source page (a row starting with \"Address\")")
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[head:]))))
    out, start = [], 0
    for i, r in enumerate(rows):
        src = r.get("Source", "")
        if "BAR.SYNC" in src or src.strip().endswith("EXIT") or i == len(rows) - 1:
            seg = rows[start:i + 1]
            warps = _num(seg[0].get(_INST))
            inst = sum(_num(x.get(_INST)) for x in seg)
            out.append({"first": start, "last": i, "warps": warps, "per_warp": inst / warps if warps else 0.0,
                        "instructions": inst, "samples": sum(_num(x.get(_SAMPLES)) for x in seg),
                        "long_sb": sum(_num(x.get(_LONG_SB)) for x in seg)})
            start = i + 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="Nsight Compute source-page CSV (.csv or .csv.gz)")
    a = ap.parse_args(argv)
    try:
        opener = gzip.open if a.source.endswith(".gz") else open
        with opener(a.source, "rt", encoding="utf-8") as f:
            ph = phases(f.read())
    except (OSError, ValueError) as e:
        print(f"ncu_phases: {a.source}: {e}", file=sys.stderr)
        return 2
    total = sum(p["instructions"] for p in ph)
    print(f"{'SASS lines':>12s} {'warps':>6s} {'per warp':>9s} {'warp instr':>11s} {'samples':>8s} {'long_sb':>8s}")
    for p in ph:
        print(f"{p['first']:5d}-{p['last']:<6d} {p['warps']:6d} {p['per_warp']:9.0f} {p['instructions']:11d} "
              f"{p['samples']:8d} {p['long_sb']:8d}")
    print(f"total: {total} warp instructions, {sum(p['samples'] for p in ph)} stall samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
