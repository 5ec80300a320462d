"""Where a speculative round's wall time goes: the draft step, the verify step, the rollback,
the hidden rows' download and the host's acceptance test, each summed over one continuation.

``harness bench`` times the draft and the verify step alone; a continuation's rounds also roll
the DeltaNet state back to the accepted row (``Engine.rollback``: two copies a DeltaNet layer
when a draft was rejected), bring the verify step's hidden rows to the host
(``Engine.host``), and test each draft against the verify logits (``speculative._verify``).
This runs ``continue_spec`` (after untimed runs that compile and capture, as the bench
does) with each of those wrapped in a timer, and prints, per K, the seconds in each, the
rest (``other``: the stream's own work), and how many rollbacks copied state.

    python tools/probe_spec_round.py --out spec-round.json                     # stdlib-small, CPU twin
    python tools/probe_spec_round.py --out spec-round.json --backend cuda --k 1,2,3,4

The JSON is written after each K (``complete`` says whether every K asked for finished), so a
run its time box stops keeps the rounds of the Ks it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness.atomic import write_text_atomic  # noqa: E402
from harness.engine.model import Engine  # noqa: E402
from harness.engine.weights import load_checkpoint  # noqa: E402
from harness.gpu.bench import SPEC_UNTIMED_RUNS, run_untimed  # noqa: E402
from harness.models import model_path  # noqa: E402
from harness.walk import speculative  # noqa: E402
from harness.walk.mtp_walker import run_prime  # noqa: E402

PHASES = ("mtp_draft", "target_step", "rollback", "host", "verify")


def _wrap(obj, name, acc, key):
    fn = getattr(obj, name)

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            acc[key][0] += 1
            acc[key][1] += time.perf_counter() - t0

    setattr(obj, name, timed)


def round_costs(eng, prompt, k, new_tokens, untimed=SPEC_UNTIMED_RUNS):
    """{phase: [calls, seconds]}, the wall seconds, tokens, rounds and copying rollbacks of one
    timed ``continue_spec`` (its session's run ``untimed`` + 1), and the steps it captured (a
    step shape is run eagerly the first time, captured the second: none, when the runs before
    met every shape twice)."""
    cap = len(prompt) + 2 * new_tokens + k + 8
    sess = eng.new_session(cap)

    def go(before=lambda: None):
        prepared = run_prime(eng, sess, prompt, k).prepared
        before()  # the timers count the continuation's calls only, not the prime's
        return speculative.continue_spec(eng, sess, prepared, new_tokens, k)

    run_untimed(eng, sess, go, untimed)  # as harness bench: every step shape captured before the timed run
    graphs = len(sess.cache.graphs)
    acc = {p: [0, 0.0] for p in PHASES}
    copying = [0]
    rollback = eng.rollback

    def counted_rollback(s, keep):
        copying[0] += keep < s.verify_caps["rows"]
        return rollback(s, keep)

    methods, verify = ("mtp_draft", "target_step", "rollback", "host"), speculative._verify

    def install():
        eng.rollback = counted_rollback
        for n in methods:
            _wrap(eng, n, acc, n)
        _wrap(speculative, "_verify", acc, "verify")

    try:
        res = go(install)
    finally:  # the wraps are instance attributes: dropping them leaves the class's methods
        for n in methods:
            vars(eng).pop(n, None)
        speculative._verify = verify
    rounds = res.metrics["drafts"]
    return {"k": k, "wall_s": res.wall_s, "tokens": len(res.tokens), "tokens_per_s": res.tokens_per_s,
            "token_ids": [int(t) for t in res.tokens], "cache_digest": sess.cache.digest(),
            "rounds": rounds, "copying_rollbacks": copying[0], "untimed_runs": untimed,
            "captured_in_timed_run": len(sess.cache.graphs) - graphs,
            "mean_acceptance_length": res.metrics["mean_acceptance_length"],
            "phases": {p: {"calls": c, "s": s} for p, (c, s) in acc.items()},
            "other_s": res.wall_s - sum(s for _, s in acc.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON to write")
    ap.add_argument("--model", default=model_path("stdlib-small"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--k", default="1,2,3,4")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--untimed-runs", type=int, default=SPEC_UNTIMED_RUNS,
                    help="continuations run before the timed one (1: as harness bench did until 9a49357)")
    a = ap.parse_args(argv)
    eng = Engine(load_checkpoint(a.model), a.backend)
    text = open(os.path.join(os.path.dirname(os.path.abspath(speculative.__file__)), "speculative.py"), "rb").read()
    prompt = [b % eng.cfg.vocab_size for b in text[: a.prompt_len]]  # byte-level: source text
    ks = [int(x) for x in a.k.split(",") if x]
    out = {"kind": "probe-spec-round", "device": eng.B.device_name(), "backend": a.backend, "model": a.model,
           "prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "k_asked": ks, "complete": False, "rows": [],
           "created": None, "commit": os.environ.get("PRIMEWALK_COMMIT")}
    for k in ks:  # the JSON is rewritten after each K: a run stopped by its time box keeps the Ks it finished
        r = round_costs(eng, prompt, k, a.new_tokens, a.untimed_runs)
        out["rows"].append(r)
        out["complete"] = len(out["rows"]) == len(ks)
        out["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_text_atomic(a.out, json.dumps(out, indent=1) + "\n")
        ph = " ".join(f"{p} {v['s'] * 1e6 / max(r['rounds'], 1):.0f}" for p, v in r["phases"].items())
        print(f"K={k}: {r['tokens_per_s']:.0f} tokens/s, {r['rounds']} rounds ({r['copying_rollbacks']} rolled state "
              f"back), acceptance {r['mean_acceptance_length']:.2f}; µs a round: {ph} "
              f"other {r['other_s'] * 1e6 / max(r['rounds'], 1):.0f}; {r['captured_in_timed_run']} steps captured in it",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
