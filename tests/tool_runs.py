"""Running a device tool (``tools/*.py``) in a subprocess that sees no GPU, on any machine: under
Numba's CUDA simulator, or without it (where the tool must stop with one line)."""

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
