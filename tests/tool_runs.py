"""Running a device tool (``tools/*.py``) in a subprocess that sees no GPU, on any machine: under
Numba's CUDA simulator, or without it (where the tool must stop with one line); and a test's own
script under the simulator (:func:`sim_result`)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_without_gpu(tool: str, args, sim: bool, timeout: int = 600):
    """``python tools/<tool> <args>`` with ``CUDA_VISIBLE_DEVICES`` empty, ``NUMBA_ENABLE_CUDASIM``
    set when ``sim``; the repository on ``PYTHONPATH``. Returns the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["CUDA_VISIBLE_DEVICES"] = ""
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", tool), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def sim_result(code: str, timeout: int = 600, unset=()):
    """``python -c code`` under Numba's CUDA simulator (it must be on before numba is imported),
    the repository on ``PYTHONPATH``, the variables ``unset`` removed from its environment: the
    JSON after its last ``RESULT `` line. Fails the test, with the script's stderr, when it exits
    non-zero or prints no result."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for v in unset:
        env.pop(v, None)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"simulator run failed (rc {p.returncode}):\n{p.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])
