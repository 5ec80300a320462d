"""The README's quickstart and CI stay in step, and its performance tables are the committed
bench JSON's."""

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


def test_performance_tables_are_the_committed_bench_json():
    """The block between the markers is exactly what ``tools/bench_table.py --readme`` writes
    from ``receipts/bench/cuda-bench.json``: a new bench without its tables, or a hand edit of a
    number, fails here (the fix: ``python tools/bench_table.py --readme README.md``)."""
    import json
    import sys

    sys.path.insert(0, ROOT)
    from harness.gpu.bench_report import readme_block, readme_markdown

    with open(os.path.join(ROOT, "receipts", "bench", "cuda-bench.json"), encoding="utf-8") as f:
        r = json.load(f)
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert readme_block(text) == readme_markdown(r, "receipts/bench/cuda-bench.json")
