"""The README's quickstart and CI stay in step."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _quickstart():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", text, re.S).group(1)
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_quickstart_is_two_commands_main_job_and_tests():
    cmds = _quickstart()
    assert len(cmds) == 2, cmds
    assert "harness run-matrix" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert _quickstart()[1] in ci
