"""tools/probe_marginal.py (what an op's launches cost a captured decode step) on the CPU twin: the
ops it leaves out are left out and counted, every other op runs, the engine is whole again
afterwards, and bad input is one line and exit 2. Its timings mean something only on a GPU."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

import probe_marginal as pm  # noqa: E402
from harness.engine.model import Engine  # noqa: E402
from harness.engine.weights import load_checkpoint  # noqa: E402
from harness.models import default_model_path  # noqa: E402


class Counting:
    """``ops`` counting every call by name."""

    def __init__(self, ops):
        self._ops, self.calls = ops, {}

    def __getattr__(self, name):
        f = getattr(self._ops, name)
        if not callable(f):
            return f

        def call(*a, **kw):
            self.calls[name] = self.calls.get(name, 0) + 1
            return f(*a, **kw)
        return call


def test_skipping_leaves_out_the_named_ops_only():
    eng = Engine(load_checkpoint(default_model_path()), "cpu")
    s = eng.new_session(32)
    eng.prime(s, [5, 17, 200, 3])
    snap = s.cache.snapshot()
    real = eng.ops
    counting = eng.ops = Counting(real)
    want, _ = eng.decode_step(s, 1)
    eng.ops = real
    s.cache.restore(snap)
    skip = eng.ops = pm.Skipping(real, ("swiglu_act",))
    got, _ = eng.decode_step(s, 1)
    eng.ops = real
    assert counting.calls["swiglu_act"] > 0 and skip.calls == counting.calls["swiglu_act"]
    assert not np.array_equal(np.asarray(got), np.asarray(want))  # the MLP's activation was not computed


def test_the_probe_on_the_cpu_twin(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = pm.main(["--out", str(out), "--backend", "cpu", "--model", default_model_path(), "--ctx", "8",
                  "--reps", "2", "--ops", "add_rmsnorm,small"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["kind"] == "probe-marginal" and r["base_us"] > 0 and set(r["ops"]) == {"add_rmsnorm", "small"}
    eng = Engine(load_checkpoint(default_model_path()), "cpu")
    s = eng.new_session(16)
    eng.prime(s, [1, 2])
    eng.ops = counting = Counting(eng.ops)
    eng.decode_step(s, 1)
    assert r["ops"]["add_rmsnorm"]["calls_a_step"] == counting.calls["add_rmsnorm"]
    assert r["ops"]["small"]["calls_a_step"] == sum(counting.calls.get(o, 0) for o in pm.SMALL)
    assert "without add_rmsnorm" in capsys.readouterr().out


def test_the_draft_pass_probe_on_the_cpu_twin(tmp_path):
    out = tmp_path / "d.json"
    rc = pm.main(["--out", str(out), "--backend", "cpu", "--model", default_model_path(), "--ctx", "8",
                  "--reps", "1", "--step", "draft", "--draft-vocab", "64", "--ops", "greedy_pick,small"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["step"] == "draft" and r["draft_vocab"] == 64 and r["base_us"] > 0
    assert r["ops"]["greedy_pick"]["calls_a_step"] == 1  # one pick a pass
    assert r["ops"]["small"]["calls_a_step"] > r["ops"]["greedy_pick"]["calls_a_step"]


@pytest.mark.parametrize("args, msg", [(["--ops", "rmsnorm,nope"], "unknown op 'nope'"),
                                       (["--reps", "0"], "--reps and --ctx must be positive"),
                                       (["--step", "draft", "--ops", "conv1d_silu"], "unknown op 'conv1d_silu'")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, msg):
    assert pm.main(["--out", str(tmp_path / "m.json"), "--backend", "cpu", "--model", default_model_path()] + args) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and not (tmp_path / "m.json").exists()
