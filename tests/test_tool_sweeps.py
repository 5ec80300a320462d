"""tools/decode_kernels.py's line search (``--sweep-search line``): the GPU sweep's configuration
search, checked here on made-up timing functions (no GPU)."""

import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

from decode_kernels import SWEEP_FIELDS, line_search  # noqa: E402

SPACE = ((4, 8), (1, 2, 4, 8), (1, 4, 8), (1, 2, 3), (1, 2))  # the bf16 sweep's space


def counted(f):
    """``f`` with a cache (as the sweep's ``measure``) and the list of points it timed."""
    seen = {}

    def measure(p):
        if p not in seen:
            seen[p] = f(p)
        return seen[p]

    return measure, seen


def test_line_search_finds_a_separable_minimum_with_fewer_points_than_the_grid():
    want = (8, 4, 1, 3, 2)
    cost = lambda p: sum((a - b) ** 2 for a, b in zip(p, want)) + 10.0  # noqa: E731
    measure, seen = counted(cost)
    assert line_search(measure, (4, 1, 8, 1, 1), SPACE) == want
    grid = len(list(itertools.product(*SPACE)))
    assert len(seen) < grid // 4, (len(seen), grid)
    assert len(SWEEP_FIELDS) == len(SPACE)


def test_line_search_skips_invalid_points_and_keeps_a_best_start():
    # invalid (None) wherever the second field is 8; the start is already the fastest valid point
    cost = lambda p: None if p[1] == 8 else 1.0 + sum(p) / 100 + (0 if p == (4, 2, 4, 2, 1) else 1)  # noqa: E731
    measure, seen = counted(cost)
    assert line_search(measure, (4, 2, 4, 2, 1), SPACE) == (4, 2, 4, 2, 1)
    assert any(p[1] == 8 for p in seen)  # asked, and passed over


def test_line_search_moves_across_coupled_fields_in_later_passes():
    """A minimum that one pass cannot reach: at the start's third field the first field's other
    value is slower, so the first pass leaves it; once the third field has moved, the second
    pass finds the first field's other value faster."""
    table = {(4, 1): 5, (8, 1): 6, (4, 4): 7, (8, 4): 7, (4, 8): 4, (8, 8): 1}
    measure, _ = counted(lambda p: table[p[0], p[2]] + p[1] + p[3] + p[4])
    assert line_search(measure, (4, 1, 1, 1, 1), SPACE) == (8, 1, 8, 1, 1)
    measure, _ = counted(lambda p: table[p[0], p[2]] + p[1] + p[3] + p[4])
    assert line_search(measure, (4, 1, 1, 1, 1), SPACE, passes=1) == (4, 1, 8, 1, 1)


def test_ncu_summary_counts_every_kernel_row_of_a_committed_profile():
    """tools/ncu_summary.py on a committed Nsight Compute CSV (one captured exact-mode decode step
    on the H200): its kernel count and total are those of the CSV's duration rows, read here
    with the csv module on its own; a file with no kernel rows (the profiled run failed) is a
    one-line error, not a traceback."""
    import csv
    import io

    import pytest
    from ncu_summary import summary

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "receipts", "probes", "h200-ncu-decode-exact-f32-0c5a857.csv")
    text = open(path, encoding="utf-8").read()
    rows = [r for r in csv.DictReader(io.StringIO(text[text.index('"ID"'):]))
            if r["Metric Name"] == "gpu__time_duration.sum"]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    n, total, by_name = summary(path)
    assert n == len(rows) > 0
    assert total == pytest.approx(sum(float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]]
                                      for r in rows), rel=1e-12)
    assert sum(v[0] for v in by_name.values()) == n
    with pytest.raises(SystemExit, match="no kernel rows"):
        summary(os.path.abspath(__file__))  # a text file without kernel rows


def test_ncu_summary_reads_a_details_page_by_its_speed_of_light_duration(capsys):
    """A details page (``--page details``: sections, no gpu__time_duration.sum) counts each
    profiled launch once, by its Speed Of Light "Duration" (ns), checked against the committed
    CSV's own Duration rows read with the csv module; a missing file or no argument is a
    one-line usage error."""
    import csv
    import io

    import pytest
    from ncu_summary import main, summary

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "receipts", "probes", "h200-ncu-vd-sk-details-ada597a.csv")
    text = open(path, encoding="utf-8").read()
    rows = [r for r in csv.DictReader(io.StringIO(text[text.index('"ID"'):]))
            if (r["Section Name"], r["Metric Name"]) == ("GPU Speed Of Light Throughput", "Duration")]
    assert {r["Metric Unit"] for r in rows} == {"ns"}
    ids = {r["ID"] for r in rows}
    n, total, by_name = summary(path)
    assert n == len(rows) == len(ids) == 14
    assert total == pytest.approx(sum(float(r["Metric Value"].replace(",", "")) for r in rows) / 1e3, rel=1e-12)
    assert by_name["attention_mma_sk_k"][0] == 1
    with pytest.raises(SystemExit, match="no such file"):
        main([path + ".missing"])
    with pytest.raises(SystemExit):
        main([])
    assert main([path]) == 0
    assert "14 kernels" in capsys.readouterr().out


def test_decode_profile_rounds_its_random_weights_for_bf16_residency():
    """tools/decode_profile.py ``--weights bf16``: the random bench-8l-shaped checkpoint's matrices
    rounded to bf16 (``bench.bf16_checkpoint``), so the engine's exactness check accepts them;
    the other tensors untouched (the check failed on the unrounded lm head on the H200)."""
    import numpy as np
    import pytest

    from harness.engine import bf16
    from harness.engine.config import ModelConfig
    from harness.engine.weights import Checkpoint
    from harness.errors import CheckpointError
    from harness.gpu.bench import bf16_checkpoint
    from harness.synth import random_tensors
    from tests.test_bf16 import DENSE

    cfg = ModelConfig.from_dict(DENSE)
    ck = Checkpoint(cfg, random_tensors(cfg, 0))
    with pytest.raises(CheckpointError):
        bf16.check_exact(ck.tensors)
    ck16 = bf16_checkpoint(ck)
    bf16.check_exact(ck16.tensors)
    names = set(bf16.matrix_names(ck.tensors))
    for k, v in ck.tensors.items():
        if k not in names:
            assert ck16.tensors[k] is v
        else:
            assert np.max(np.abs(ck16.tensors[k] - v)) <= np.max(np.abs(v)) * 2.0 ** -8  # bf16 keeps 8 bits


def test_probe_attn_sk_refuses_a_cache_shorter_than_the_step():
    """tools/probe_attn_sk.py (GPU only): its arguments are checked before anything compiles."""
    import pytest
    from probe_attn_sk import main

    with pytest.raises(SystemExit) as e:
        main(["--out", os.devnull, "--ctx", "512", "--cap", "100"])
    assert e.value.code == 2


def test_ncu_phases_cuts_at_barriers_and_exits_and_keeps_every_instruction(tmp_path, capsys):
    """tools/ncu_phases.py: a made-up source page of seven SASS lines (an early exit, a barrier,
    the end): its phases end at the EXIT and BAR.SYNC lines, every line's executions land in one
    phase, a phase's per-warp figure divides by its first line's executions; then the committed
    split-KV attention page (H100) sums to the instructions of its rows; no source page: exit 2."""
    import gzip

    from ncu_phases import main, phases

    head = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb"\n'
    rows = [("a0", "LDC R1", 1, 8, 0), ("a1", "@P0 EXIT", 0, 8, 0), ("a2", "LDG R2", 3, 6, 2),
            ("a3", "BAR.SYNC.DEFER_BLOCKING 0x0", 1, 6, 0), ("a4", "HMMA R4", 2, 12, 0),
            ("a5", "STG R4", 0, 6, 1), ("a6", "EXIT", 0, 6, 0)]
    text = "noise line\n" + head + "".join(f'"{a}","{s}","{n}","{i}","{lb}"\n' for a, s, n, i, lb in rows)
    ph = phases(text)
    assert [(p["first"], p["last"]) for p in ph] == [(0, 1), (2, 3), (4, 6)]
    assert [p["warps"] for p in ph] == [8, 6, 12]
    assert [p["instructions"] for p in ph] == [16, 12, 24]
    assert ph[1]["per_warp"] == 2.0 and [p["samples"] for p in ph] == [1, 4, 2] and ph[1]["long_sb"] == 2
    assert sum(p["instructions"] for p in ph) == sum(r[3] for r in rows)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "receipts", "probes", "h100-ncu-attn-sk-4925165", "ncu-sk-source.csv.gz")
    text = gzip.open(path, "rt", encoding="utf-8").read()
    import csv
    import io
    src = list(csv.DictReader(io.StringIO(text[text.index('"Address"'):])))
    got = phases(text)
    assert sum(p["instructions"] for p in got) == sum(int(r["Instructions Executed"] or 0) for r in src) > 0
    assert main([path]) == 0 and "total:" in capsys.readouterr().out
    bad = tmp_path / "x.csv"
    bad.write_text("no page here\n")
    assert main([str(bad)]) == 2 and "no source page" in capsys.readouterr().err
