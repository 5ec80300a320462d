#!/usr/bin/env python3
"""Sum Nsight Compute's per-kernel durations by kernel name (the CSV of
``ncu --csv --metrics gpu__time_duration.sum``, e.g. from tools/decode_profile.py --ncu-step).

    python tools/ncu_summary.py kernels.csv [more.csv ...]
"""

import csv
import io
import sys


def summary(path: str) -> tuple[int, float, dict]:
    """(kernels, total µs, {kernel name: [launches, µs]}) of one ncu CSV."""
    lines = open(path, encoding="utf-8").read().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    by_name: dict = {}
    total = 0.0
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[head:]))))
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("[")[0].split("(")[0]
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
        us = float(r["Metric Value"].replace(",", "")) * scale
        n = by_name.setdefault(name, [0, 0.0])
        n[0] += 1
        n[1] += us
        total += us
    return sum(n for n, _ in by_name.values()), total, by_name


def main(argv=None) -> int:
    for path in argv if argv is not None else sys.argv[1:]:
        n, total, by_name = summary(path)
        print(f"{path}: {n} kernels, {total:.1f} µs")
        for name, (k, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
            print(f"  {k:4d} {us:9.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
