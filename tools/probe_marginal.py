#!/usr/bin/env python3
"""What each op's launches cost a captured decode step on the GPU, with their neighbours overlapping
them as they do in the graph (issues #16 / #19).

    PYTHONPATH=. python tools/probe_marginal.py --out marginal.json [--mode exact-bf16] [--ctx 512]
        [--reps 48] [--ops add_rmsnorm,swiglu_act,...] [--backend cuda] [--step draft [--draft-vocab N]]

Nsight Compute times each kernel alone (serialised); in a replayed step, programmatic dependent
launch overlaps a small kernel with its neighbours, so its serialised time says little about what
fusing it away would save (``add_rmsnorm_sk`` and ``conv_gdn_prep``: 17.5 µs less serialised, the
captured step unchanged; ``receipts/probes/README.md``). This probe measures it: a one-row decode
step of bench-8l (random weights, as ``tools/decode_profile.py``) after a ``--ctx``-token prime,
captured as the engine captures it, timed as ``--reps`` back-to-back replays between two events;
then, for each op of ``--ops``, the same step captured again in a fresh session with that op's
calls left out (a no-op while the step is captured), and timed alike. The difference is what the
op's launches cost the step in the graph: a fusion that removes them saves at most about that.
Leaving an op out leaves its outputs as they were, so those steps compute garbage (NaN/Inf
included: the engine's flag check is off for them); nothing reads their numbers. ``--ops`` entry
``small`` leaves out every op but the GEMVs (``linear``, ``linear_flag``, ``linear_swiglu_mma``)
and the embedding: what is left is the GEMVs' own time in the graph; ``linear`` leaves out the
GEMVs but the lm head's (with exact-bf16's bf16 weights the MLP input's, ``linear_swiglu_mma``,
its SwiGLU with it; ``swiglu_act`` then has no calls). Prints one line an op and writes the JSON (exit 0).

``--step draft``: the same for a chained MTP draft pass (``Engine.mtp_draft``, K = 3 after a
two-row first pass, as the bench times it; ``--draft-vocab N`` drafting among the ids 0..N-1):
the third pass's graph -- one row, fed by the pass before it on the device -- replayed back to
back, each replay drafting the next position. Its ops besides the GEMVs also count ``embed`` and
``greedy_pick`` (``small`` leaves those out too).

``--backend cpu`` runs the same steps eagerly on the CPU twin (nothing is captured there; the
times are the host's): a dry run of the tool, as the tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _timing import replayed_us  # noqa: E402
from harness.atomic import write_text_atomic  # noqa: E402

# the ops of a decode step besides the GEMVs (harness/engine/model.py)
SMALL = ("add_rmsnorm", "rmsnorm", "swiglu_act", "sigmoid_gate", "qk_norm_rope", "attention", "conv1d_silu",
         "gdn_prep", "gdn_recurrence", "gated_rmsnorm")
DEFAULT_OPS = SMALL + ("linear", "small")
# a draft pass's (harness/engine/model.py: _mtp_pass, then the head and the pick)
DRAFT_SMALL = ("embed", "rmsnorm", "add_rmsnorm", "qk_norm_rope", "attention", "sigmoid_gate", "swiglu_act",
               "greedy_pick")
DRAFT_OPS = DRAFT_SMALL + ("linear", "small")
# "linear": every GEMV of the step, the MLP input's fused with its SwiGLU (exact-bf16, bf16 weights) among them
LINEAR = ("linear", "linear_swiglu_mma")
DRAFT_K = 3


class Skipping:
    """``ops`` with the calls of ``names`` left out (each counted in :attr:`calls`); every other
    attribute is ``ops``'s."""

    def __init__(self, ops, names):
        self._ops, self._names, self.calls = ops, frozenset(names), 0

    def __getattr__(self, name):
        if name in self._names:
            def skipped(*args, **kw):
                self.calls += 1
            return skipped
        return getattr(self._ops, name)


def step_us(eng, sess, reps):
    """A one-row decode step on ``sess`` run eagerly, captured, then replayed ``reps`` times back
    to back between two events: µs a replay (on the CPU: µs an eager step)."""
    for _ in range(3):  # eager, capture, replay
        eng.decode_step(sess, 1)
    graphs = [g for k, g in sess.cache.graphs.items() if k[0] == "trunk" and k[1] == 1]
    return replays_us(eng, graphs, reps, lambda: eng.decode_step(sess, 1))


def draft_pass_us(eng, sess, reps):
    """The last pass of a K = DRAFT_K draft step on ``sess`` (its MTP cache filled to the trunk's
    position less one, as the bench's draft steps start): three draft steps (eager, capture,
    replay) from one snapshot, then that pass's graph replayed ``reps`` times back to back, each
    replay drafting the next position: µs a replay (on the CPU: µs a whole eager draft step)."""
    hid = np.zeros((2, eng.cfg.hidden_size), np.float32)
    snap = sess.cache.snapshot()

    def draft():
        sess.cache.restore(snap)
        sess.cache.mtp_len = sess.cache.pos - 1
        eng.mtp_draft(sess, [1, 2], hid, DRAFT_K)

    for _ in range(3):
        draft()
    graphs = [g for k, g in sess.cache.graphs.items() if k[0] == "draft+" and k[-1] == DRAFT_K - 1]
    return replays_us(eng, graphs, reps, draft)


def replays_us(eng, graphs, reps, eager):
    """µs a replay of the last of ``graphs`` (captures: (graph, ...)), ``reps`` replays back to back
    between two events after one untimed; with none (the CPU captures nothing), µs a call of
    ``eager``, host-timed."""
    eng.B.synchronize()
    if not graphs:
        t = time.perf_counter()
        for _ in range(reps):
            eager()
        return (time.perf_counter() - t) / reps * 1e6
    return replayed_us(graphs[-1][0], reps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="exact", help="arithmetic mode: exact | exact-bf16")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--reps", type=int, default=48)
    ap.add_argument("--ops", default=None, help="ops to leave out, one at a time, comma-separated "
                    "(default: the step's small ops one by one, then linear, then small)")
    ap.add_argument("--step", default="decode", choices=("decode", "draft"), help="the step to time")
    ap.add_argument("--draft-vocab", type=int, default=None, help="--step draft: draft among the ids 0..N-1")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--model", default=None, help="a checkpoint folder (default: bench-8l, random weights)")
    a = ap.parse_args(argv)
    if a.reps < 1 or a.ctx < 1:
        print("probe_marginal: --reps and --ctx must be positive", file=sys.stderr)
        return 2
    from harness.engine.config import ModelConfig
    from harness.engine.model import Engine
    from harness.engine.weights import Checkpoint, load_checkpoint
    from harness.errors import PrimewalkError
    from harness.gpu.bench import BENCH_8L

    if a.backend == "cuda":
        np.row_stack = getattr(np, "row_stack", np.vstack)
    try:
        if a.model:
            ck = load_checkpoint(a.model)
        else:
            from harness.synth import random_tensors

            cfg = ModelConfig.from_dict(dict(BENCH_8L, num_nextn_predict_layers=1))
            ck = Checkpoint(cfg, random_tensors(cfg, 0))
        eng = Engine(ck, a.backend, check_finite=True, mode=a.mode)
    except PrimewalkError as e:
        print(f"probe_marginal: {e}", file=sys.stderr)
        return 2
    draft = a.step == "draft"
    if draft and not eng.has_mtp:
        print("probe_marginal: --step draft needs a model with an MTP head", file=sys.stderr)
        return 2
    small = DRAFT_SMALL if draft else SMALL
    ops = [o for o in (a.ops or ",".join(DRAFT_OPS if draft else DEFAULT_OPS)).split(",") if o]
    known = set(small) | {"linear", "linear_flag", "linear_swiglu_mma", "embed", "small"}
    bad = [o for o in ops if o not in known]
    if bad:
        print(f"probe_marginal: unknown op {bad[0]!r} (known: {', '.join(sorted(known))})", file=sys.stderr)
        return 2
    ids = np.random.default_rng(1).integers(0, ck.config.vocab_size, a.ctx)

    if draft and a.draft_vocab:
        try:
            eng.set_draft_vocab(a.draft_vocab)
        except PrimewalkError as e:
            print(f"probe_marginal: {e}", file=sys.stderr)
            return 2

    def session():
        s = eng.new_session(a.ctx + a.reps + 2 * DRAFT_K + 16)
        eng.prime(s, ids)
        if draft:
            eng.mtp_fill(s, ids[1:].tolist(), np.zeros((a.ctx - 1, ck.config.hidden_size), np.float32))
        return s

    timed = draft_pass_us if draft else step_us
    base = timed(eng, session(), a.reps)
    res = {"kind": "probe-marginal", "device": eng.B.device_name(), "mode": eng.mode, "step": a.step,
           "draft_vocab": a.draft_vocab if draft else None, "ctx": a.ctx, "reps": a.reps,
           "commit": os.environ.get("PRIMEWALK_COMMIT"), "base_us": base, "ops": {}}
    what = f"a draft pass (K = {DRAFT_K}'s last)" if draft else "the one-row step"
    print(f"{res['device']}, {eng.mode}: {what} {base:.1f} us", flush=True)
    real = eng.ops
    for op in ops:
        s = session()  # primed with every op
        skip = Skipping(real, small if op == "small" else LINEAR if op == "linear" else (op,))
        eng.ops, eng._raise_nonfinite = skip, lambda *args, **kw: None  # the garbage may be NaN
        try:
            without = timed(eng, s, a.reps)
        finally:
            eng.ops = real
            del eng._raise_nonfinite  # the instance attribute: the method again
        # a step's calls: on a GPU its eager and captured runs made them (the replays make none);
        # on the CPU every step is eager (a draft: every pass of its K, the first's two rows one launch)
        calls = skip.calls // ((2 if eng.B.name == "cuda" else 3 + a.reps) * (DRAFT_K if draft else 1))
        res["ops"][op] = {"without_us": without, "saves_us": base - without, "calls_a_step": calls}
        print(f"without {op:16s} ({calls:2d} calls a step): {without:8.1f} us, {base - without:7.1f} us less", flush=True)
    write_text_atomic(a.out, json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
