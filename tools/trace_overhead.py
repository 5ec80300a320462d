"""What tracing costs on the CPU: a cell's prime and speculative continuation with and without a
trace on its session (harness bisect's first pass), CPU time, best of N.

    python tools/trace_overhead.py [--model DIR] [--prompt-len 130] [--k 2] [--max-new-tokens 16]
                                   [--repeats 5] [SCHEDULE ...]        # default: unyielded tokenwise

The goal (issue #12) is at most 2x on the tiny model; tests/test_bisect.py checks it.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from harness.matrix.bisect import schedule_sides, trace_overhead  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schedules", nargs="*", default=["unyielded", "tokenwise"])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-len", type=int, default=130)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    for s in args.schedules:
        side, _, _ = schedule_sides(args.model, args.prompt_len, s, s, k=args.k, max_new=args.max_new_tokens)
        plain, traced = trace_overhead(side, args.repeats)
        print(f"{s:>12}: untraced {plain * 1e3:7.1f} ms  traced {traced * 1e3:7.1f} ms  ratio {traced / plain:.2f} "
              f"(CPU time, best of {args.repeats})")


if __name__ == "__main__":
    main()
