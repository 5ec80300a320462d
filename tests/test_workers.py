"""Parallel matrix runs (``harness run-matrix --workers N`` and ``--executor ray``): the plan of
tasks, the worker environments, receipts equal to the single-process golden, a worker killed
mid-run, Ctrl-C, and the one-line errors.

The equality runs use the built-in tiny matrix (99 cells, a few seconds with two workers) and
compare with its golden ``receipts/golden/tiny.json``: a single-process receipt, which
``tests/test_golden.py`` checks against a fresh single-process run. The default and stdlib
matrices take minutes on two cores; the README says how they were compared once.
"""

import contextlib
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from harness import cli
from harness.matrix import tasks
from harness.matrix.builtin import REPO, SPECS_DIR, golden_path
from harness.matrix.cells import expand
from harness.matrix.diff import diff_receipts
from harness.matrix.local_workers import worker_envs
from harness.matrix.receipts import merge_receipts, read_receipt
from harness.matrix.runner import indep_key
from harness.matrix.specfile import load_spec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import own_checkpoint as oc  # noqa: E402

TINY = os.path.join(SPECS_DIR, "tiny.toml")
GOLDEN = golden_path("tiny")


def _run(argv):
    """cli.main(argv) -> (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


CELL_LINE = re.compile(r"^\[\d+/\d+\] cell (\S+) ")  # the progress display's line per finished cell


def _equal_to_golden(path):
    rc, stdout, _ = _run(["diff", GOLDEN, str(path)])
    assert rc == 0 and "diff: equal (99 cells compared)" in stdout, stdout


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------
def test_plan_is_what_the_single_process_run_computes_longest_first():
    spec = load_spec(TINY)
    cells, _ = expand(spec)
    p = tasks.plan(spec)
    kinds = [(t.kind, t.cell_id) for t in p.tasks]
    assert len(kinds) == len(set(kinds))
    # every cell once (each oracle once, not once per worker) and one prime per (group, points)
    assert sorted(cid for kind, cid in kinds if kind == "cell") == sorted(c.id for c in cells)
    by_id = {c.id: c for c in cells}
    primes = [indep_key(by_id[cid]) for kind, cid in kinds if kind == "prime"]
    assert len(primes) == len(set(primes)) == len({indep_key(c) for c in cells})
    costs = [t.cost for t in p.tasks]
    assert costs == sorted(costs, reverse=True)
    # prompt length x schedule: longer prompts first, token by token dearer than batched
    cost = {cid: t.cost for t in p.tasks for cid in [t.cell_id] if t.kind == "cell"}
    assert cost["tiny/p257/tokenwise/k1/greedy"] > cost["tiny/p257/unyielded/k1/greedy"] > \
        cost["tiny/p130/unyielded/k1/greedy"] > cost["tiny/p40/unyielded/k1/greedy"]
    assert p.tasks[0].cell_id.startswith("tiny/p257/tokenwise/")
    # a shard records its own cells but runs the oracles they are judged by
    s = tasks.plan(spec, (1, 3))
    assert [c.id for c in s.mine] == [c.id for c in cells if c.order % 3 == 1]
    run = {t.cell_id for t in s.tasks if t.kind == "cell"}
    assert run == {c.id for c in s.mine} | {c.oracle for c in s.mine}
    assert any(by_id[o].order % 3 != 1 for o in run)


def test_worker_envs_pin_one_gpu_each_or_divide_the_cpu_threads(monkeypatch):
    assert worker_envs("cuda", 3, ["0", "1"]) == [{"CUDA_VISIBLE_DEVICES": g} for g in ("0", "1", "0")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert worker_envs("cuda", None) == [{"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "3"}]
    assert worker_envs("cuda", 2, ["5"]) == [{"CUDA_VISIBLE_DEVICES": "5"}] * 2  # two workers on one GPU
    monkeypatch.setenv("NUMBA_NUM_THREADS", "8")
    assert worker_envs("cpu", 3) == [{"NUMBA_NUM_THREADS": "2"}] * 3
    assert worker_envs("cpu", 16) == [{"NUMBA_NUM_THREADS": "1"}] * 16


# ------------------------------------------------------------------------------------------------
# local workers
# ------------------------------------------------------------------------------------------------
def test_two_workers_give_the_single_process_receipt(tmp_path):
    out = tmp_path / "w2.json"
    rc, stdout, err = _run(["run-matrix", "--spec", TINY, "--workers", "2", "--out", str(out), "--no-plots"])
    assert rc == 0, err
    _equal_to_golden(out)
    receipt = read_receipt(str(out))
    ex = receipt["executor"]
    assert ex["kind"] == "workers" and ex["incidents"] == [] and len(ex["workers"]) == 2
    assert all(w["tasks"] > 0 and w["alive"] for w in ex["workers"])  # both took work
    assert sum(w["tasks"] for w in ex["workers"]) == ex["tasks"]
    assert len({w["pid"] for w in ex["workers"]} | {os.getpid()}) == 3  # two processes, not us
    threads = max(1, int(os.environ.get("NUMBA_NUM_THREADS") or len(os.sched_getaffinity(0))) // 2)
    assert all(w["threads"] == threads for w in ex["workers"])
    assert [c["order"] for c in receipt["cells"]] == list(range(99))  # spec order, whoever ran them
    # one progress display: a line per cell (in the order they finished), then the summary
    lines = stdout.strip().splitlines()
    finished = [m.group(1) for m in map(CELL_LINE.match, lines) if m]
    assert sorted(finished) == sorted(c["id"] for c in receipt["cells"])
    assert lines[-1].startswith("matrix: 99 cells: 99 bitwise, 0 fail in ")


# Two models with different tokenizers (a user's BPE checkpoint and the byte-level tiny model) on
# text prompts: each worker must feed each model its own tokenizer's ids, as the single process does.
OWN_SPEC = """\
max_new_tokens = 4
k = [1]
variants = ["unyielded", {{ name = "split", at = [0.5] }}, "tokenwise"]
[models]
own = "{model}"
tiny = "tiny"
[[prompts]]
kind = "text"
name = "long"
text = {text}
[[prompts]]
kind = "text"
name = "short"
text = "Hello there, prime walker."
"""
INFORMATIONAL_CELL_KEYS = ("timings",)


def _comparable(receipt: dict) -> dict:
    """A receipt without what is measured or depends on how and when it ran."""
    drop = ("created", "wall_s", "warmup_s", "env", "executor")
    out = {k: v for k, v in receipt.items() if k not in drop}
    out["cells"] = [{k: v for k, v in c.items() if k not in INFORMATIONAL_CELL_KEYS} for c in receipt["cells"]]
    return out


def test_workers_tokenize_per_model_and_keep_list_golden_and_schema_2(tmp_path):
    own = str(tmp_path / "own")
    oc.build(own)
    spec = tmp_path / "own.toml"
    spec.write_text(OWN_SPEC.format(model=own, text=json.dumps(oc.LONG_TEXT)), encoding="utf-8")
    # --list: the same cells and skipped schedules, nothing run
    rc, listed, err = _run(["run-matrix", "--spec", str(spec), "--list"])
    assert rc == 0, err
    assert _run(["run-matrix", "--spec", str(spec), "--list", "--workers", "2"])[:2] == (0, listed)
    # --update-golden --golden PATH with workers records the golden ...
    golden = tmp_path / "golden.json"
    rc, _, err = _run(["run-matrix", "--spec", str(spec), "--workers", "2", "--update-golden", "--golden",
                       str(golden), "--no-plots", "--quiet"])
    assert rc == 0, err
    # ... which the single-process run equals (the --golden gate, schema 2 on both sides: digests.prompt
    # compared), and field for field
    single = tmp_path / "single.json"
    rc, stdout, err = _run(["run-matrix", "--spec", str(spec), "--golden", str(golden), "--out", str(single),
                            "--no-plots", "--quiet"])
    assert rc == 0 and f"golden {golden}: diff: equal" in stdout, stdout + err
    w, s = read_receipt(str(golden)), read_receipt(str(single))
    assert w["schema_version"] == s["schema_version"] == 2
    assert _comparable(w) == _comparable(s)
    assert "executor" in w and "executor" not in s
    assert set(w["env"]) == set(s["env"]) >= {"threads", "threads_why", "cores", "load"}
    # every worker that took a task warmed up first (one still starting when the last task ended
    # took none and has no warm-up to report: on a loaded 2-core machine that happens)
    workers = w["executor"]["workers"]
    assert w["warmup_s"] > 0 and any(x["tasks"] for x in workers)
    assert all(x["warmup_s"] > 0 for x in workers if x["tasks"])
    assert all(x["warmup_s"] is None for x in workers if not x["tasks"] and "host" not in x)
    # text prompts: each model's own tokenizer (BPE for own, bytes for tiny): other lengths, other ids
    lens = {(c["model"], c["prompt"]): c["prompt_len"] for c in w["cells"]}
    assert lens[("tiny", "short")] == len(b"Hello there, prime walker.") != lens[("own", "short")]
    assert lens[("tiny", "long")] == len(oc.LONG_TEXT.encode()) != lens[("own", "long")]
    assert w["skipped"] and w["notes"] and len(w["notes"]) == len(w["skipped"])  # short: cannot be split
    assert all(c["schedule"] and "prompt" in c["digests"] for c in w["cells"])
    assert any(c["resolved_points"] for c in w["cells"])
    # the gate with workers: the parallel receipt equals the single-process one
    rc, stdout, _ = _run(["run-matrix", "--spec", str(spec), "--workers", "2", "--golden", str(single),
                          "--out", str(tmp_path / "w2.json"), "--no-plots", "--quiet"])
    assert rc == 0 and f"golden {single}: diff: equal" in stdout, stdout
    # --update-golden's rules hold with workers too (refused before any worker starts)
    rc, _, err = _run(["run-matrix", "--spec", TINY, "--workers", "2", "--update-golden", "--out",
                       str(tmp_path / "x.json")])
    assert rc == 2 and "--out is given" in err and len(err.strip().splitlines()) == 1, err


def test_a_worker_that_dies_is_reported_and_its_cell_runs_on_the_other(tmp_path, monkeypatch):
    monkeypatch.setenv(tasks.DIE_ENV, "1:1")  # worker 1 exits on receiving its second task
    out = tmp_path / "dead.json"
    rc, _, err = _run(["run-matrix", "--spec", TINY, "--workers", "2", "--out", str(out), "--no-plots", "--quiet"])
    assert rc == 0, err
    _equal_to_golden(out)
    ex = read_receipt(str(out))["executor"]
    w0, w1 = ex["workers"]
    assert w1["tasks"] == 1 and not w1["alive"] and w0["alive"] and w0["tasks"] == ex["tasks"] - 1
    assert len(ex["incidents"]) == 1
    text = ex["incidents"][0]
    assert text.startswith(f"worker 1 (pid {w1['pid']}) died (exit status {tasks.DIE_STATUS}) running ")
    assert text.endswith("; re-run on the other 1 worker(s)")
    assert f"warning: {text}" in err  # said even with --quiet


def test_every_worker_dying_ends_the_run_with_one_line_and_no_receipt(tmp_path, monkeypatch):
    monkeypatch.setenv(tasks.DIE_ENV, "0:0")
    out = tmp_path / "none.json"
    rc, _, err = _run(["run-matrix", "--spec", TINY, "--workers", "1", "--out", str(out), "--no-plots", "--quiet"])
    assert rc == 2
    assert err.strip().splitlines()[-1].startswith("harness run-matrix: error: all 1 workers died (last: worker 0 ")
    assert not out.exists()


def _as_from_a_terminal():
    """In the child before exec: SIGINT delivered and handled by default, as for a command a shell
    runs in the foreground (the test process may hold SIGINT blocked or ignored -- a test runner's
    worker, a background job -- and a child inherits both)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_the_workers_and_writes_nothing(tmp_path):
    out = tmp_path / "out" / "r.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", "run-matrix", "--spec", TINY, "--workers", "2",
                          "--out", str(out), "--no-plots"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal)
    try:
        assert CELL_LINE.match(p.stdout.readline()), "no cell finished"
        children = _children(p.pid)
        assert len(children) >= 2
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and stderr.strip().endswith("harness run-matrix: interrupted"), stderr
    assert "Traceback" not in stderr
    assert not out.exists() and not (tmp_path / "out").exists()
    deadline = time.time() + 10
    while any(os.path.exists(f"/proc/{c}") for c in children) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{c}") for c in children), "a worker outlived the run"


def _children(pid: int) -> list:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(x) for x in f.read().split()]
    return found


def test_merge_keeps_each_shards_executor_out_of_the_merged_top(tmp_path):
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f"s{i}.json"))
        rc, _, err = _run(["run-matrix", "--spec", TINY, "--shard", f"{i}/2", "--workers", "2", "--out", paths[-1],
                           "--no-plots", "--quiet"])
        assert rc == 0, err
    merged = merge_receipts(paths)
    assert "executor" not in merged and all(m["executor"]["kind"] == "workers" for m in merged["merged_from"])
    assert diff_receipts(GOLDEN, merged).exit_code == 0


BAD_FLAGS = [
    (["--workers", "0"], "--workers: expected a positive integer, got '0'"),
    (["--workers", "two"], "--workers: expected a positive integer, got 'two'"),
    (["--executor", "local"], "--executor local on the cpu backend: give the number of workers (--workers N)"),
    (["--workers", "2", "--address", "10.0.0.1:6379"], "--address names a Ray cluster; it needs --executor ray"),
    (["--gpus", "all", "--backend", "cpu"], "--gpus runs one worker per GPU on the cuda backend; --backend says cpu"),
    (["--gpus", "0,x"], "--gpus: expected all or distinct GPU indices like 0,1, got '0,x'"),
    (["--executor", "ray", "--gpus", "all"], "--gpus places local workers; with --executor ray"),
]


@pytest.mark.parametrize("argv,message", BAD_FLAGS, ids=[f"bad{i}" for i in range(len(BAD_FLAGS))])
def test_bad_parallel_flags_exit_2_in_one_line(tmp_path, argv, message):
    out = tmp_path / "x.json"
    rc, _, err = _run(["run-matrix", "--spec", TINY, "--out", str(out), "--no-plots", *argv])
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("harness run-matrix: error: ") and message in err, err
    assert not out.exists()


def test_no_gpu_and_a_worker_error_are_one_line(tmp_path, monkeypatch):
    out = tmp_path / "x.json"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    rc, _, err = _run(["run-matrix", "--spec", TINY, "--gpus", "all", "--out", str(out), "--no-plots"])
    assert rc == 2 and "cuda workers: no GPU is visible" in err and len(err.strip().splitlines()) == 1, err
    # a GPU named but none there: the worker's own error (raised while it loads) comes back as one line
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    rc, _, err = _run(["run-matrix", "--spec", TINY, "--gpus", "all", "--out", str(out), "--no-plots", "--quiet"])
    assert rc == 2, err
    assert err.strip().splitlines()[-1].startswith("harness run-matrix: error: backend cuda: "), err
    assert "Traceback" not in err and not out.exists()


# ------------------------------------------------------------------------------------------------
# Ray
# ------------------------------------------------------------------------------------------------
def test_without_ray_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    rc, _, err = _run(["run-matrix", "--spec", TINY, "--executor", "ray", "--out", str(tmp_path / "x.json")])
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--executor ray needs Ray, an optional extra: pip install 'primewalk[cluster]'" in err


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance with two CPUs, started once for the Ray tests."""
    try:
        import ray
    except ImportError:
        pytest.fail("Ray is not installed: the Ray tests need the cluster extra (pip install -e '.[cluster]'; "
                    "the README's test command installs it)", pytrace=False)
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    assert ray.cluster_resources().get("CPU") == 2
    yield ray
    ray.shutdown()


def _ray_run(tmp_path, name) -> dict:
    """``run-matrix --executor ray`` on the tiny spec: its receipt equals the golden; its
    executor block and stderr come back."""
    out = tmp_path / f"{name}.json"
    rc, _, err = _run(["run-matrix", "--spec", TINY, "--executor", "ray", "--out", str(out), "--no-plots",
                       "--quiet"])
    assert rc == 0, err
    _equal_to_golden(out)
    return read_receipt(str(out))["executor"], err


def test_ray_gives_the_single_process_receipt_even_when_an_actor_dies(ray_local, tmp_path, monkeypatch):
    ex, _ = _ray_run(tmp_path, "ray")
    assert ex["kind"] == "ray" and ex["cluster"]["CPU"] == 2 and len(ex["workers"]) == 2
    assert all(w["threads"] == 1 and w["tasks"] > 0 for w in ex["workers"]) and ex["incidents"] == []
    assert ray_local.is_initialized()  # a Ray it did not start is left running
    # actor 1 dies on its second task: reported, the task re-run on actor 0, the receipt unchanged
    monkeypatch.setenv(tasks.DIE_ENV, "1:1")
    ex, err = _ray_run(tmp_path, "ray-dead")
    assert len(ex["incidents"]) == 1 and ex["incidents"][0].startswith("worker 1 (Ray actor) died")
    assert not ex["workers"][1]["alive"] and ex["workers"][1]["tasks"] == 1
    assert f"warning: {ex['incidents'][0]}" in err
