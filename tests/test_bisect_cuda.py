"""Trace mode on the CUDA backend, under Numba's simulator (``tests/cudasim_trace.py`` in a
subprocess with ``NUMBA_ENABLE_CUDASIM=1``): a small MoE model primed and continued
speculatively on both backends.

- tracing changes nothing: digests, tokens and logits traced on CUDA equal the untraced CPU
  run's, bitwise (the simulator is slow: ``tools/device_run.sh bisect`` checks CUDA traced
  against CUDA untraced on the GPU);
- the CUDA ``row_hash`` op gives the CPU twin's hashes: the CPU and CUDA traces have the same
  entries and the same hash at each, so ``harness bisect --backend-a cpu --backend-b cuda``
  compares hashes, not activations;
- so bisect of a CPU run against a CUDA run finds no divergence.

(The ``flip_low_bit`` kernel is checked bitwise with the other ops by tests/test_cudasim.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_trace_on_the_simulator():
    env = {k: v for k, v in os.environ.items() if k not in ("PRIMEWALK_BACKEND", "PRIMEWALK_LINEAR")}
    env.update(NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "cudasim_trace.py")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"simulator run failed (rc {p.returncode}):\n{p.stderr[-4000:]}"
    res = json.loads(lines[-1][len("RESULT "):])
    assert res["cpu_traced_equals_untraced"] and res["cuda_traced_equals_cpu_untraced"], res
    assert res["same_entries"] and res["same_hashes"] and res["entries"] > 300, res
    assert res["first_divergence"] is None, res
