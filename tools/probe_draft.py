"""The draft step's cost on bench-8l, by draft vocabulary size (``harness.engine.draft``).

A K-draft step (``Engine.mtp_draft``: the fill rows, then K chained MTP passes) against one
stepwise decode step on the same engine (the median of 32, as the bench's goals take it; their
mean recorded too), for the whole vocabulary and for draft vocabularies of
the first N ids; each timed as ``harness bench`` times it (``bench._time_draft_verify``). Also
checks, once per N, that the drafts are the argmax of the full head's logits over those ids.

    python tools/probe_draft.py --out receipts/probes/draft.json
    python tools/probe_draft.py --sizes 32768,16384 --ks 3 --backend cpu --model harness/models/tiny  # a dry run

Each row also splits the step's wall time (``issue_ms``: from the call until the host has issued
every pass and waits; the rest is the device finishing; ``first_replay_ms``: from the call until
the first captured pass is launched, time the device has nothing to run; ``after_sync_ms``: from
the end of that wait until the call returns). ``--bench-dir DIR`` keeps bench-8l's
files in DIR (built there once, loaded by later runs with the same random MTP head). Run under
Nsight Compute for every kernel of one warm K-draft step among N ids:

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        python tools/probe_draft.py --out p.json --bench-dir /tmp/b8 --ncu-step 3 --sizes 32768 > kernels.csv

(``--ncu-step K`` runs a few K-draft steps among the first of ``--sizes`` ids, brackets the next
one with cudaProfilerStart/Stop and skips the timing rows.)

``--profile-calls N`` then runs N more K-draft steps (K the last of ``--ks``, among the first of
``--sizes`` ids) with cProfile on around each ``mtp_draft`` call only, and writes the host's
functions by their own time a call (``profile``: the 40 largest; cProfile's own cost included,
so shares, not absolute figures): where the prologue before the first replay goes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _timing import sm_clocks  # noqa: E402

from harness.atomic import write_text_atomic  # noqa: E402
from harness.gpu import bench  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON to write")
    ap.add_argument("--sizes", default="65536,32768,16384,8192", help="draft vocabulary sizes N")
    ap.add_argument("--ks", default="1,2,3,4", help="draft lengths K")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--model", default=None, help="a checkpoint folder (default: bench-8l, built with transformers)")
    ap.add_argument("--bench-dir", default=None, help="bench-8l's files: built here when absent, else loaded")
    ap.add_argument("--ncu-step", type=int, default=0, help="profile one K-draft step (see above)")
    ap.add_argument("--profile-calls", type=int, default=0, help="then N K-draft steps under cProfile (see above)")
    a = ap.parse_args(argv)
    from harness.engine.model import Engine
    from harness.engine.weights import load_checkpoint

    sizes = [int(x) for x in a.sizes.split(",") if x]
    ks = [int(x) for x in a.ks.split(",") if x]
    if a.model:
        ck = load_checkpoint(a.model)
    elif a.bench_dir and os.path.exists(os.path.join(a.bench_dir, "config.json")):
        ck = bench.with_mtp_head(load_checkpoint(a.bench_dir), 1)  # bench_checkpoint's head (seed 0 + 1)
    else:
        _, ck = bench.bench_checkpoint(a.bench_dir or tempfile.mkdtemp(prefix="bench8l-"))
    eng = Engine(ck, a.backend, check_finite=True)
    V = eng.cfg.vocab_size
    ids = np.random.default_rng(0).integers(0, V, 512).tolist()
    issued = _issue_marks(eng, graphs=a.backend == "cuda")
    if a.ncu_step:
        return _ncu_step(eng, ids, a.ncu_step, sizes[0] if sizes else None, a.backend == "cuda")
    clocks_before = sm_clocks()
    steps = bench.stepwise_steps_ms(eng, bench._primed(eng, ids))
    dec = bench._median(steps)  # one decode step, as the bench's goals take it (the median of the stepwise steps)
    sess = bench._primed(eng, ids)
    snap = sess.cache.snapshot()
    rows = []
    for n in [None] + [s for s in sizes if s < V]:
        eng.set_draft_vocab(n)
        for k in ks:
            t0 = time.perf_counter()
            for m in issued.values():
                m.clear()
            d, _ = bench._time_draft_verify(eng, sess, snap, k)
            rows.append({"draft_vocab": n or V, "k": k, "draft_step_ms": bench._median(d) * 1e3,
                         "issue_ms": _tail_median(issued["issue"], len(d)),
                         "first_replay_ms": _tail_median(issued["first"], len(d)),
                         "after_sync_ms": _tail_median(issued["tail"], len(d)),
                         "over_decode": bench._median(d) * 1e3 / dec, "wall_s": time.perf_counter() - t0})
            print(f"N={n or V:7d} K={k} draft step {rows[-1]['draft_step_ms']:.3f} ms = "
                  f"{rows[-1]['over_decode']:.3f} x decode; issued after {rows[-1]['issue_ms'] or float('nan'):.3f} ms"
                  f" (first replay {rows[-1]['first_replay_ms'] or float('nan'):.3f}), "
                  f"{rows[-1]['after_sync_ms'] or float('nan'):.3f} ms after the wait",
                  flush=True)
        if n is not None:  # the drafts are the full head's argmax over the draft vocabulary
            sess.cache.restore(snap)
            sess.cache.mtp_len = sess.cache.pos - 1
            hid = np.zeros((2, eng.cfg.hidden_size), np.float32)
            got = eng.mtp_draft(sess, [1, 2], hid, 1)[0]
            sess.cache.restore(snap)
            full, _ = eng.mtp_rows(sess, [1, 2], hid, sess.cache.pos - 1, logits_rows=1)
            sess.cache.restore(snap)
            want = int(eng.draft_ids[int(np.argmax(full[-1][eng.draft_ids]))])
            rows[-1]["first_draft_is_full_argmax_over_ids"] = got == want
    profile = _profile(eng, sess, snap, ks[-1], sizes[0] if sizes else None, a.profile_calls) if a.profile_calls else None
    eng.set_draft_vocab(None)
    out = {"kind": "probe-draft", "device": eng.B.device_name(), "backend": a.backend, "vocab": V,
           "decode_512_stepwise_ms": dec, "decode_512_stepwise_mean_ms": float(np.mean(steps)), "rows": rows, "clocks_before": clocks_before, "clocks_after": sm_clocks(),
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": os.environ.get("PRIMEWALK_COMMIT")}
    if profile is not None:
        out["profile"] = profile
    write_text_atomic(a.out, json.dumps(out, indent=1) + "\n")
    return 0 if all(r.get("first_draft_is_full_argmax_over_ids", True) for r in rows) else 1


def _profile(eng, sess, snap, k, n, calls, top=40):
    """{"k", "draft_vocab", "calls", "functions"}: ``calls`` K-draft steps among ``n`` ids (None:
    the whole vocabulary), warmed first, each ``mtp_draft`` call under cProfile; "functions": the
    ``top`` functions by own time, in µs a call of the step (``own_us``, ``cum_us``, ``calls``: per
    step)."""
    import cProfile
    import pstats

    eng.set_draft_vocab(n)
    bench._time_draft_verify(eng, sess, snap, k)  # compiles, captures, warms
    prof = cProfile.Profile()
    for _ in range(calls):
        c = sess.cache
        hid = np.zeros((2, eng.cfg.hidden_size), np.float32)
        c.mtp_len = c.pos - 1
        eng.B.synchronize()
        prof.enable()
        eng.mtp_draft(sess, [1, 2], hid, k)
        prof.disable()
        sess.cache.restore(snap)
    stats = pstats.Stats(prof).stats
    rows = [{"function": f"{os.path.relpath(f) if f.startswith(os.sep) else f}:{line}({name})",
             "calls": nc / calls, "own_us": tt / calls * 1e6, "cum_us": ct / calls * 1e6}
            for (f, line, name), (_, nc, tt, ct, _) in stats.items()]
    rows.sort(key=lambda r: -r["own_us"])
    print(f"host functions of one {k}-draft step among {n or eng.cfg.vocab_size} ids (cProfile, {calls} calls):")
    for r in rows[:15]:
        print(f"  {r['own_us']:8.1f} us own {r['cum_us']:8.1f} cum {r['calls']:5.0f}x  {r['function']}", flush=True)
    return {"k": k, "draft_vocab": n or eng.cfg.vocab_size, "calls": calls, "functions": rows[:top]}


def _tail_median(xs, n):
    """The median of the last ``n`` of ``xs`` in ms (the timed calls after the warm-up), None
    when fewer were marked."""
    return bench._median(xs[-n:]) * 1e3 if n and len(xs) >= n else None


def _issue_marks(eng, graphs=False):
    """{name: list of seconds}, one entry a ``eng.mtp_draft`` call from now on: "issue", from the
    call until its first ``eng.B.synchronize()`` (``mtp_draft`` synchronizes once, after issuing
    all its passes): the host's share of the step, the rest is the device finishing; "first",
    from the call until its first graph replay is issued (on CUDA with graphs: the device has
    nothing to run before it); "tail", from that synchronize's return until the call returns
    (the picks' download and what follows). ``graphs``: patch ``Graph.replay`` for "first"
    (CUDA only; a probe runs once a process)."""
    marks = {"issue": [], "first": [], "tail": []}
    sync, draft = eng.B.synchronize, eng.mtp_draft
    state = {}

    def timed_sync(*args, **kw):
        t0 = state.pop("t0", None)
        if t0 is not None:
            marks["issue"].append(time.perf_counter() - t0)
        out = sync(*args, **kw)
        if t0 is not None:
            state["synced"] = time.perf_counter()
        return out

    def timed_draft(*args, **kw):
        state.clear()
        state["t0"] = state["call"] = time.perf_counter()
        try:
            return draft(*args, **kw)
        finally:
            if "synced" in state:
                marks["tail"].append(time.perf_counter() - state["synced"])
            state.clear()

    eng.B.synchronize, eng.mtp_draft = timed_sync, timed_draft
    if not graphs:  # the CPU twin: no captured passes, no replay marks
        return marks
    from numba_kernels.launch import Graph

    replay = Graph.replay

    def timed_replay(self):
        if "call" in state and "replayed" not in state:
            state["replayed"] = True
            marks["first"].append(time.perf_counter() - state["call"])
        return replay(self)

    Graph.replay = timed_replay
    return marks


def _ncu_step(eng, ids, k, n, profile=True):
    """Warm K-draft steps among ``n`` ids (None: the whole vocabulary), then one between
    cudaProfilerStart/Stop (``profile``; off: a dry run on the CPU)."""
    from numba import cuda

    start, stop = (cuda.profile_start, cuda.profile_stop) if profile else (lambda: None, lambda: None)
    eng.set_draft_vocab(n)
    sess = bench._primed(eng, ids)
    snap = sess.cache.snapshot()
    bench._time_draft_verify(eng, sess, snap, k)  # compiles, captures, warms
    c = sess.cache
    c.mtp_len = c.pos - 1
    hid = np.zeros((2, eng.cfg.hidden_size), np.float32)
    eng.B.synchronize()
    start()
    got = eng.mtp_draft(sess, [1, 2], hid, k)
    eng.B.synchronize()
    stop()
    print(f"profiled one {k}-draft step among {n or eng.cfg.vocab_size} ids: drafts {got}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
