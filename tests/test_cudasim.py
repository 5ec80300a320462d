"""The CUDA kernels, under Numba's simulator, against the CPU twins: bit for bit, on a CPU.

``tests/cudasim_run.py`` runs in two subprocesses at once (its op cases and its model steps) with
``NUMBA_ENABLE_CUDASIM=1`` (the simulator must be on before numba is imported). Its primitives round like the GPU's (a true fused multiply-add,
float32 rounding everywhere else: ``numba_kernels.launch``), so a CUDA kernel whose order differs
from its twin's -- partial sums added in another order, tiles merged in another order -- gives
other bits and fails here. It runs:

- every op on tiny ragged shapes, column offsets, captures and device-side positions; the
  dispatch table crossed at every threshold (1 row, then both sides of each, and the row counts
  1, 4, 5, 8, 9, 16, 17, 63, 64, 65); bf16 weights; every version of an op on its own (GEMV of
  each shape class, GEMM, the one-thread-per-output launches, split-KV, query-tiled prime and
  tiled attention, the naive recurrence beside the fast one). The generated kernels' own variants
  are tests/test_sim_{gemv,gemm,attn,gdn}.py;
- a small random model on the engine (``harness.engine.model.Engine``, cuda backend) against the CPU
  engine: prime, verify + rollback, decode (eager, captured, replayed), MTP rows --
  the fast kernels inside the model, logits and cache digests compared after every step.

``pytest -s`` prints one line per case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

from numba_kernels import dispatch, tags
from numba_kernels.cpu import FAMILIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# dispatch table entry -> the name prefixes of the (generated) kernels it launches
KERNELS = {"gemv": {"gemv_"}, "gemm": {"gemm_"}, "attention_split": {"attn_split_", "attn_merge"},
           "attention_prime": {"attn_prime_"}, "gdn_recurrence_fast": {"gdn_pipe_"}}
FAST = set().union(*KERNELS.values())


def _kinds(kernels):
    """The KERNELS prefixes of launched kernel names (an unknown name stands for itself)."""
    return {next((p for p in FAST if k.startswith(p)), k) for k in kernels}


def _env(**more):
    env = {k: v for k, v in os.environ.items() if k != "PRIMEWALK_BACKEND"}
    env.update(NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **more)
    return env


@pytest.fixture(scope="module")
def sim():
    # the op cases and the model steps as two processes at once (each is one core's work; the
    # model's steps take the longer, ~6 min on a 2-core machine beside another test file: they
    # run every simulated thread in Python); the limit leaves room for a slower machine
    script = os.path.join(ROOT, "tests", "cudasim_run.py")
    files = {part: (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for part in ("ops", "model")}
    procs = {part: subprocess.Popen([sys.executable, script, part], cwd=ROOT, env=_env(), stdout=out, stderr=err,
                                    text=True) for part, (out, err) in files.items()}  # files, not pipes: no stalls
    got = {}
    try:
        for part, p in procs.items():
            rc = p.wait(timeout=1200)
            out, err = files[part]
            out.seek(0)
            err.seek(0)
            lines = [ln for ln in out.read().splitlines() if ln.startswith("RESULT ")]
            assert rc == 0 and lines, f"simulator run ({part}) failed (rc {rc}):\n{err.read()[-4000:]}"
            got[part] = json.loads(lines[-1][len("RESULT "):])
    finally:
        for part, p in procs.items():
            if p.poll() is None:
                p.kill()
            for f in files[part]:
                f.close()
    res = dict(got["ops"], model=got["model"]["model"], model_s=got["model"]["model_s"])
    print(f"\nCUDASIM ops {res['ops_s']}s model {res['model_s']}s")
    for c in res["ops"]:
        print(f"CUDASIM op {c['cuda_op']:22s} {c['case']:34s} {'bitwise' if c['bitwise'] else 'DIFFERS'} "
              f"max_ulp {c['max_ulp']} {c['seconds']}s {','.join(c['kernels'])}")
    for s in res["model"]:
        logits = {True: "bitwise", False: "DIFFER", None: "-"}[s["logits_bitwise"]]
        print(f"CUDASIM model {s['step']:28s} logits {logits} digest "
              f"{'equal' if s['digest_equal'] else 'DIFFERS'} {','.join(s['kernels'])}")
    return res


def test_simulator_rounds_like_the_gpu(sim):
    bad = [k for k, ok in sim["primitives"].items() if not ok]
    assert not bad, f"simulator primitives: {bad}"


def test_every_op_case_is_bitwise(sim):
    bad = {f"{c['cuda_op']} {c['case']}": c["max_ulp"] for c in sim["ops"] if not c["bitwise"]}
    assert not bad, f"simulated CUDA ops differ from the CPU twins (max ulp): {bad}"


def test_every_op_and_kernel_is_exercised(sim):
    cuda_ops = {n for n, (_, cu) in sim["front_doors"].items() if cu is not None}
    assert cuda_ops <= {c["cuda_op"] for c in sim["ops"]}
    ran = set().union(*(c["kernels"] for c in sim["ops"]))
    built = {f.__name__ for f, _ in tags.tagged(FAMILIES, "kernel")}
    assert built <= ran, f"kernels never launched by the cases: {built - ran}"


@pytest.mark.parametrize("op", sorted(dispatch.TABLE))
def test_cases_cross_every_dispatch_threshold(sim, op):
    """For each row of the table: a case at its bound and one just past it, each served by the
    kernel the table names, through the op's own launcher."""
    served = {c["rows"]: _kinds(c["kernels"]) for c in sim["ops"]
              if c["op"] == c["cuda_op"] == op and c["rows"] is not None}
    assert 1 in served
    for R, kinds in served.items():  # every case through the op's launcher ran the table's pick
        assert kinds == KERNELS[dispatch.pick(op, R)], (op, R, kinds)
    for most, name in dispatch.TABLE[op]:
        if most is None:
            continue
        assert most in served and most + 1 in served, f"{op}: no case at {most} and {most + 1} rows"
        assert served[most] == KERNELS[name], (op, most, served[most])
        assert served[most + 1] == KERNELS[dispatch.pick(op, most + 1)], (op, most + 1, served[most + 1])


def test_tiny_model_matches_cpu_bitwise(sim):
    """Logits (where a step has them) and cache digests after every step."""
    bad = [s["step"] for s in sim["model"] if s["digest_equal"] is not True or s["logits_bitwise"] is False]
    assert not bad, f"the simulated CUDA engine differs from the CPU engine at: {bad}"
    assert sum(s["logits_bitwise"] is True for s in sim["model"]) >= 9


def test_captured_steps_store_their_logits_in_mapped_host_memory(sim):
    """Steps small enough to capture (decode, verify, MTP rows: eager, captured and replayed) get
    their logits from the lm head storing into one of the cache's mapped ring buffers, with no
    download (the bits: the test above); primes (too large to capture) download theirs."""
    steps = [s for s in sim["model"] if s.get("mapped_logits") is not None
             and not s["step"].startswith(("greedy", "draft"))]  # a draft brings no logits to the host
    small = [s["step"] for s in steps if s["rows"] <= 8 and not s["mapped_logits"]]
    large = [s["step"] for s in steps if s["rows"] > 8 and s["mapped_logits"]]
    assert not small and not large, (small, large)
    assert sum(s["rows"] <= 8 for s in steps) >= 8


def test_tiny_model_runs_the_fast_kernels(sim):
    ran = _kinds(set().union(*(s["kernels"] for s in sim["model"])))
    assert FAST <= ran, f"fast kernels the model never ran: {FAST - ran}"
    assert not ran & {"linear_naive_k", "gdn_recurrence_naive_k"}
    rows = {s["rows"] for s in sim["model"] if s["kernels"]}
    assert {1, dispatch.GEMV_MAX_ROWS, dispatch.GEMV_MAX_ROWS + 1, dispatch.SPLIT_MAX_ROWS + 1} <= rows


def test_front_doors_export_the_same_ops(sim):
    """numba_kernels.cpu and numba_kernels.cuda as imported: the same ops with the same
    signatures, as the tags say (tests/test_kernel_layout.py checks the tags)."""
    sigs = tags.signatures(FAMILIES)
    for name, (cpu_sig, cuda_sig) in sim["front_doors"].items():
        want = sigs[name]
        assert cpu_sig == (str(want["cpu"]) if "cpu" in want else None), name
        assert cuda_sig == (str(want["cuda"]) if "cuda" in want else None), name
    assert sim["versions"] == {n: s["of"] for n, s in sigs.items() if "of" in s}


def test_bf16_weights_match_widened_float32_bitwise(sim):
    """The simulated CUDA engine with bf16-resident weights against the CPU engine on the widened
    float32 weights: every step bitwise (the engine holds its matrices as uint16 bits, asserted in
    cudasim_run.bf16_model_steps, so the weight ops ran on bf16 inputs)."""
    steps = [s for s in sim["model"] if s["step"].startswith("bf16 ")]
    assert len(steps) >= 6 and all(s["logits_bitwise"] is True and s["digest_equal"] is True for s in steps), steps
    assert set().union(*(s["kernels"] for s in steps)), "no kernel ran"


def test_greedy_steps_chain_on_the_device(sim):
    """Engine.decode_greedy's steps (bitwise: the test above) pick their successor's token on the
    device (greedy_pick's kernel), take no input from the host (no copy_i32: the captured
    decode step's first kernel, which copies the host's token and position in), and replay."""
    steps = [s for s in sim["model"] if s["step"].startswith("greedy")]
    assert len(steps) == 2 and all(s["logits_bitwise"] and s["digest_equal"] for s in steps), steps
    # the first call's eager and captured steps launch through launch() (LAUNCHES counts them);
    # the second call only replays the two graphs
    assert {"greedy_pick_k"} <= set(steps[0]["kernels"]), steps[0]
    assert steps[1]["kernels"] == [], steps[1]
    assert "copy_i32_k" not in steps[0]["kernels"], steps[0]


def test_draft_passes_chain_on_the_device(sim):
    """Engine.mtp_draft on the simulated GPU drafts what the CPU engine drafts (the CPU engine's
    chained passes are bitwise its stepwise ones: tests/test_draft_vocab.py) with the same MTP
    cache, over the whole vocabulary and a draft vocabulary: each pass picks on the device, is
    captured at its second call and only replayed at its third."""
    steps = [s for s in sim["model"] if s["step"].startswith("draft")]
    assert len(steps) == 6 and all(s["logits_bitwise"] and s["digest_equal"] for s in steps), steps
    for first in (0, 3):
        assert {"greedy_pick_k", "embed_k"} <= set(steps[first]["kernels"]), steps[first]
        assert steps[first + 2]["kernels"] == [], steps[first + 2]
