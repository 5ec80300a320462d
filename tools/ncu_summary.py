#!/usr/bin/env python3
"""Sum Nsight Compute's per-kernel durations by kernel name (the CSV of
``ncu --csv --metrics gpu__time_duration.sum``, e.g. from tools/decode_profile.py --ncu-step).
Where the CSV also has ``smsp__inst_executed.sum`` and ``dram__bytes_read.sum`` /
``dram__bytes_write.sum`` (tools/dev_check.sh's NCU_PRIME step), each kernel's line adds its
warp instructions and the DRAM bytes it moved, and the rate those bytes make over its time.
A details page (``ncu --csv --page details --section SpeedOfLight ...``) has no such metric:
each kernel's time is then its Speed Of Light section's "Duration".

    python tools/ncu_summary.py kernels.csv [more.csv ...]
"""

import argparse
import csv
import io
import os
import sys

_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
          "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "inst": 1.0}
_EXTRA = ("smsp__inst_executed.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")
_TIME = "gpu__time_duration.sum"
_SOL_TIME = ("GPU Speed Of Light Throughput", "Duration")  # a details page's (section, metric)


def summary(path: str) -> tuple[int, float, dict]:
    """(kernels, total µs, {kernel name: [launches, µs, {extra metric: sum}]}) of one ncu CSV."""
    lines = open(path, encoding="utf-8").read().splitlines()
    head = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if head is None:
        raise SystemExit(f"ncu_summary: {path}: no kernel rows (did the profiled run fail? see its stderr)")
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[head:]))))
    details = not any(r.get("Metric Name") == _TIME for r in rows)
    by_name: dict = {}
    total = 0.0
    for r in rows:
        metric = r.get("Metric Name")
        if details and (r.get("Section Name"), metric) == _SOL_TIME:
            metric = _TIME
        elif metric != _TIME and metric not in _EXTRA:
            continue
        name = r["Kernel Name"].split("[")[0].split("(")[0]
        if r["Metric Unit"] not in _SCALE:
            raise SystemExit(f"ncu_summary: {path}: unknown unit {r['Metric Unit']!r} of {metric}")
        v = float(r["Metric Value"].replace(",", "")) * _SCALE[r["Metric Unit"]]
        n = by_name.setdefault(name, [0, 0.0, {}])
        if metric == _TIME:
            n[0] += 1
            n[1] += v
            total += v
        else:
            n[2][metric] = n[2].get(metric, 0.0) + v
    return sum(n[0] for n in by_name.values()), total, by_name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Sum Nsight Compute's per-kernel durations by kernel name.")
    ap.add_argument("csv", nargs="+", help="ncu --csv output (a raw metrics page or a details page)")
    args = ap.parse_args(argv)
    for path in args.csv:
        if not os.path.isfile(path):
            raise SystemExit(f"ncu_summary: {path}: no such file")
        n, total, by_name = summary(path)
        print(f"{path}: {n} kernels, {total:.1f} µs")
        for name, (k, us, extra) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
            line = f"  {k:4d} {us:9.1f}  {name}"
            if extra:
                inst = extra.get("smsp__inst_executed.sum", 0.0)
                dram = extra.get("dram__bytes_read.sum", 0.0) + extra.get("dram__bytes_write.sum", 0.0)
                line += f"  [{inst / 1e6:8.1f} M warp-inst, {dram / 1e6:8.1f} MB DRAM, {dram / us / 1e6 if us else 0:5.2f} TB/s]"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
