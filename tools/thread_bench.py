"""How the CPU twin's matrix time depends on its thread count, idle and under load.

Runs ``harness run-matrix --spec SPEC`` in a subprocess for each thread setting, once on the
machine as it is and once beside a competing CPU-bound job (``python -c 'while 1: pass'``,
started and stopped by this script), and prints one row per run: threads, wait policy, the
competitor, the matrix wall time (warm-up excluded, as the receipt records it), the warm-up time,
and the 1-minute load average before and after. The receipts go to a temporary folder.

    python tools/thread_bench.py                                  # the tiny matrix, 1 and 2 threads
    python tools/thread_bench.py --spec harness/specs/default.toml --threads 1,2 --repeat 2
    python tools/thread_bench.py --policy active,passive          # also OpenMP's wait policy

``--threads auto`` runs the harness's own choice (``PRIMEWALK_THREADS`` unset). The README's
thread-count table comes from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(spec: str, threads: str, policy: str, out: str) -> dict:
    env = dict(os.environ)
    env.pop("PRIMEWALK_THREADS", None)
    env.pop("NUMBA_NUM_THREADS", None)
    if threads != "auto":
        env["PRIMEWALK_THREADS"] = threads
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy.upper()
    else:
        env.pop("OMP_WAIT_POLICY", None)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    cmd = [sys.executable, "-c", "import sys; from harness.cli import main; sys.exit(main(sys.argv[1:]))",
           "run-matrix", "--spec", spec, "--out", out, "--quiet", "--no-plots"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"run-matrix failed: {done.stderr.strip()}")
    with open(out, encoding="utf-8") as f:
        receipt = json.load(f)
    env_block = receipt.get("env") or {}
    return {"threads": env_block.get("threads"), "why": env_block.get("threads_why"), "policy": policy,
            "matrix_s": receipt["wall_s"] - (receipt.get("warmup_s") or 0.0), "warmup_s": receipt.get("warmup_s"), "process_s": wall,
            "load_before": load0, "load_after": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="harness/specs/tiny.toml")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts, or auto")
    ap.add_argument("--policy", default="default", help="OpenMP wait policies: default, active, passive")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--competitors", default="0,1", help="competing busy loops, e.g. 0,1,2")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        for n_comp in [int(x) for x in args.competitors.split(",")]:
            comps = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n_comp)]
            try:
                time.sleep(2 if comps else 0)
                for _ in range(args.repeat):
                    for policy in args.policy.split(","):
                        for threads in args.threads.split(","):
                            r = run_once(args.spec, threads, policy, out)
                            r["competitors"] = n_comp
                            rows.append(r)
                            print(f"threads {r['threads']} ({r['why']}) policy {policy:8s} competitors "
                                  f"{n_comp}: matrix {r['matrix_s']:.1f} s, warm-up {r['warmup_s'] or 0:.1f} s, "
                                  f"load {r['load_before']:.2f} -> {r['load_after']:.2f}", flush=True)
            finally:
                for c in comps:
                    c.kill()
                    c.wait()
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
