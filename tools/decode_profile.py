#!/usr/bin/env python3
"""Where a captured decode step's time goes on CUDA (bench-8l dimensions, random weights).

    PYTHONPATH=. python tools/decode_profile.py --out decode-profile.json [--ctx 512] [--rows 1,5]
        [--mode exact|exact-bf16] [--weights f32|bf16] [--api-times] [--cprofile]

For each step size (rows: 1 = a decode step, R > 1 = an R-row verify step) after a ``--ctx``-token
prime: the whole step as the engine runs it (graph replay, logits download, finite check, hidden
clone, host argmax), at one row the same steps chained (``chained_us``: ``Engine.decode_greedy``,
the pick on the device, the host a step behind), the graph replay alone (host launch + device
time, synchronised), and the host-side pieces; and whether the captured step's logits are bitwise those of the same step
launched eagerly (``captured_equals_eager``; exit 1 if not). Run under Nsight Compute to get every kernel of one captured step:

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        python tools/decode_profile.py --out p.json --ncu-step 1 > kernels.csv

(``--ncu-step R`` brackets one replayed R-row step with cudaProfilerStart/Stop and skips the
timing loops.)
"""

import argparse
import collections
import contextlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _cli import int_list  # noqa: E402
from _timing import sm_clocks  # noqa: E402
from harness.atomic import write_text_atomic  # noqa: E402


@contextlib.contextmanager
def _api_timer(events=None, py=()):
    """{driver function name: [calls, seconds]} of the numba driver calls made inside, the graph
    launches (``graph_launch``) among them; ``events``: a list that also gets (name, start,
    end) perf_counter stamps of each call. ``py``: (object, method name) pairs timed too, as
    ``py:NAME`` (the engine's host-side pieces of a step)."""
    from numba.cuda.cudadrv.driver import driver

    from numba_kernels import launch

    calls = collections.defaultdict(lambda: [0, 0.0])

    def timed(name, fn):
        def call(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                e = time.perf_counter()
                c = calls[name]
                c[0] += 1
                c[1] += e - t
                if events is not None:
                    events.append((name, t, e))
        return call

    replay = launch.Graph.replay
    launch.Graph.replay = lambda self: timed("graph_launch", lambda: replay(self))()

    wrapped = {n: f for n, f in vars(driver).items() if n.startswith("cu") and callable(f)}
    for n, f in wrapped.items():
        setattr(driver, n, timed(n, f))
    first = driver._cuda_python_wrap_fn  # a driver function first used inside: timed too

    def wrap(fname):
        f = first(fname)
        wrapped.setdefault(fname, f)
        setattr(driver, fname, timed(fname, f))
        return getattr(driver, fname)
    driver._cuda_python_wrap_fn = wrap
    for obj, name in py:
        setattr(obj, name, timed("py:" + name, getattr(obj, name)))
    try:
        yield calls
    finally:
        for obj, name in py:
            delattr(obj, name)  # the instance attribute: the class's method again
        launch.Graph.replay = replay
        del driver._cuda_python_wrap_fn
        for n, f in wrapped.items():
            setattr(driver, n, f)


SCHED = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}  # CU_CTX_SCHED_*


def _ctx_flags(set_to=None):
    """The current context's flags (cuCtxGetFlags), or, given ``set_to`` (a SCHED name or the
    flags), cuCtxSetFlags's error code."""
    try:
        from cuda.bindings import driver as d
    except ImportError:  # older cuda-python
        from cuda import cuda as d
    if set_to is None:
        err, flags = d.cuCtxGetFlags()
        return int(flags)
    flags = SCHED[set_to] if isinstance(set_to, str) else set_to
    (err,) = d.cuCtxSetFlags(flags)
    return int(err)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--rows", default=(1, 5), type=int_list(1, 8, "row counts"),
                    help="step sizes, comma-separated (1: a decode step; up to 8, the captured steps)")
    ap.add_argument("--reps", type=int, default=48)
    ap.add_argument("--ncu-step", type=int, default=0)
    ap.add_argument("--mode", default="exact", help="arithmetic mode: exact | exact-bf16")
    ap.add_argument("--weights", default=None,
                    help="resident weights: f32 | bf16 (default: the mode's; bf16: the random matrices rounded to bf16)")
    ap.add_argument("--cprofile", action="store_true", help="also profile the whole steps' host side (cProfile)")
    ap.add_argument("--api-times", action="store_true",
                    help="also time every driver call numba makes during the whole steps (calls and us per step)")
    ap.add_argument("--capture", action="store_true",
                    help="multi-row steps keep per-row DeltaNet state for a rollback, as a speculative verify step "
                         "does (harness bench times verify steps so)")
    ap.add_argument("--sched", default="",
                    help="also time the whole step under these context scheduling flags, comma-separated "
                         "(auto, spin, yield, blocking: cuCtxSetFlags), restoring the first flags after")
    args = ap.parse_args(argv)
    from numba import cuda

    from harness.engine.config import ModelConfig
    from harness.engine.model import Engine
    from harness.engine.weights import Checkpoint
    from harness.gpu.bench import BENCH_8L, bf16_checkpoint
    from harness.synth import random_tensors

    cfg = ModelConfig.from_dict(dict(BENCH_8L, num_nextn_predict_layers=1))
    t0 = time.perf_counter()
    ck = Checkpoint(cfg, random_tensors(cfg, 0))
    if args.weights == "bf16":  # bf16-resident weights hold bf16 values: round them as the bench does
        ck = bf16_checkpoint(ck)
    eng = Engine(ck, "cuda", check_finite=True, mode=args.mode, weights=args.weights)
    res = {"device": eng.B.device_name(), "ctx": args.ctx, "mode": eng.mode, "weights": eng.weights,
           "pdl": eng.B.pdl(), "build_s": time.perf_counter() - t0, "clocks_before": sm_clocks(), "steps": {}}
    B = eng.B
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, args.ctx)
    same = True
    for R in args.rows:
        sess = eng.new_session(args.ctx + 4 * args.reps + 64)
        eng.prime(sess, ids)
        step = (lambda t: eng.decode_step(sess, t)) if R == 1 else \
            (lambda t: eng.target_step(sess, [t] * R, capture=args.capture))
        snap = sess.cache.pos
        for _ in range(3):  # eager, capture, replay
            step(1)
        key = next(k for k in sess.cache.graphs if k[1] == R)
        graph = sess.cache.graphs[key][0]
        if args.ncu_step:
            if R == args.ncu_step:
                B.synchronize()
                cuda.profile_start()
                step(1)
                B.synchronize()
                cuda.profile_stop()
            continue

        def timed(fn, n=args.reps):
            B.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            B.synchronize()
            return (time.perf_counter() - t) / n * 1e6

        def whole():
            logits, _ = step(1)
            int(np.argmax(logits if logits.ndim == 1 else logits[-1]))
            if sess.cache.pos > snap + 3 * args.reps:
                sess.cache.pos = snap  # stay inside the capacity (timing only)

        r = {"whole_us": timed(whole)}
        if R == 1:  # the same steps chained (Engine.decode_greedy: the host a step behind the device)
            sess.cache.pos = snap
            eng.decode_greedy(sess, 1, 4, keep_logits=True)  # each slot eager, then captured
            sess.cache.pos = snap
            B.synchronize()
            t = time.perf_counter()
            eng.decode_greedy(sess, 1, args.reps, keep_logits=True)
            B.synchronize()
            r["chained_us"] = (time.perf_counter() - t) / args.reps * 1e6
            sess.cache.pos = snap
        # the captured step (its GEMVs launched with PDL where that is on) against the same step
        # launched eagerly from Python, from one cache state: the logits bit for bit
        snapc, graphs = sess.cache.snapshot(), eng.graphs
        eng.graphs = False
        eager = np.array(step(1)[0], copy=True)
        sess.cache.restore(snapc)
        eng.graphs = graphs
        replayed = np.array(step(1)[0], copy=True)
        sess.cache.restore(snapc)
        r["captured_equals_eager"] = bool(np.array_equal(eager.view(np.uint32), replayed.view(np.uint32)))
        same &= r["captured_equals_eager"]
        if args.sched:  # how the host waits for the GPU (the step's host work after the wait)
            r["ctx_flags"] = _ctx_flags()
            r["whole_us_by_sched"] = {}
            for name in args.sched.split(","):
                err = _ctx_flags(name)
                r["whole_us_by_sched"][name] = timed(whole) if err == 0 else f"cuCtxSetFlags error {err}"
            _ctx_flags(r["ctx_flags"])
        if args.cprofile:  # where the host's share of a step goes
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.reps):
                whole()
            B.synchronize()
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
            r["cprofile_tottime"] = buf.getvalue().splitlines()

        if args.api_times:  # each driver call numba makes, timed (a synchronous copy includes the wait)
            ev, bounds = [], []
            py = [(eng, n) for n in ("check_ids", "_check_session", "_flags", "_raise_nonfinite")] + \
                [(eng.steps, "run"), (B, "clone"), (B, "download")]
            with _api_timer(ev, py) as calls:
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    whole()
                    bounds.append((t0, time.perf_counter()))
                B.synchronize()
            r["api_per_step"] = {k: {"calls": n / args.reps, "us": t / args.reps * 1e6}
                                 for k, (n, t) in sorted(calls.items(), key=lambda kv: -kv[1][1])}
            # one step's timeline, from the same steps: the first call of each name in a step, its
            # start and end in us from the step's start (medians over the steps; names called in
            # every step), and the step's end after the caller's argmax
            steps = []
            for t0, t1 in bounds:
                first = {}
                for n, a, e in ev:
                    if t0 <= a <= t1:
                        first.setdefault(n, ((a - t0) * 1e6, (e - t0) * 1e6))
                first["end"] = ((t1 - t0) * 1e6, (t1 - t0) * 1e6)
                steps.append(first)
            common = set.intersection(*(set(st) for st in steps))
            line = [[n, round(float(np.median([st[n][0] for st in steps])), 1),
                     round(float(np.median([st[n][1] for st in steps])), 1)] for n in common]
            r["timeline_us"] = sorted(line, key=lambda e: e[1])

        def replay():
            graph.replay()
            B.synchronize()

        r["replay_sync_us"] = timed(replay)
        ev0, ev1 = cuda.event(), cuda.event()
        ev0.record()
        for _ in range(args.reps):
            graph.replay()
        ev1.record()
        ev1.synchronize()
        r["replay_device_us"] = cuda.event_elapsed_time(ev0, ev1) / args.reps * 1e3
        out = sess.cache.graphs[key][1][0]
        r["download_logits_us"] = timed(lambda: B.download(out[:R]))
        view = out[:R]
        r["download_view_us"] = timed(lambda: B.download(view))  # without numba's slicing
        pinned = cuda.pinned_array(view.nbytes, np.uint8)  # the bare driver copy, for its bandwidth
        r["d2h_pinned_us"] = timed(lambda: view.copy_to_host(pinned.view(view.dtype).reshape(view.shape)))
        # the other way to a new host array: the driver's copy straight into pageable memory (it
        # stages internally), against the backend's pinned copy + host copy (download_view_us)
        r["d2h_pageable_new_us"] = timed(lambda: view.copy_to_host(np.empty(view.shape, view.dtype)))
        r["host_copy_us"] = timed(lambda: pinned.copy())  # the host copy alone, pinned to a new array
        keep = np.empty_like(pinned)  # ... and into memory already touched: the new array's page faults
        r["host_copy_reused_us"] = timed(lambda: np.copyto(keep, pinned))
        r["host_alloc_touch_us"] = timed(lambda: np.ones(pinned.shape, np.uint8))  # faults + a write, no copy
        r["logits_bytes"] = int(view.nbytes)
        host = B.download(view)
        r["argmax_us"] = timed(lambda: int(np.argmax(host[-1])))
        res["steps"][str(R)] = r
        shown = {k: v for k, v in r.items() if k.endswith(("_us", "_bytes", "_eager")) or k.startswith(("api", "time"))}
        print(R, json.dumps(shown), flush=True)
    if not args.ncu_step:
        res["clocks_after"] = sm_clocks()
        write_text_atomic(args.out, json.dumps(res, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
