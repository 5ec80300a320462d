"""``harness bench``'s exact-bf16 part (issue #19): the same bench-8l weights in the bf16
tensor-core mode (``Engine(..., mode="exact-bf16")``), beside exact mode and transformers bf16 in
the same run. (The other bf16 measure, issue #14's bf16-resident weights in exact mode, is
:func:`harness.gpu.bench.bf16_engine`.)

Measures: prime of 4096 tokens (goal ≥ 1.0 × transformers bf16 tokens/s), prime of 32768 tokens
(goal ≤ 0.7 s; skipped, and said so, when the 4096 prime projects past ``MAX_PRIME_32K_S``, or
past the time left and ``SMALL_32K_S``; cold, then warm when time allows: the warm run counts), decode ms/token after a 512-token prime (goal ≤ 1.5 × the bf16 weight floor:
half the float32 weight bytes / copy bandwidth); and, time allowing, the 4096 prime's per-op times
(``profile_prime_4096``: every op synchronised, ``bench.profile_step``). The goals are in
``bench_report.goals_block``.
"""

from __future__ import annotations

MAX_PRIME_32K_S = 120.0  # do not start a 32k prime projected (quadratic from 4096: ×64) past this
# a 32k prime projected under this runs even when the time box is spent: the goal's own measure,
# a few seconds at most (the projection is an upper bound: only attention grows ×64; at bb9b2a0
# 6.5 s projected for 1.58 s measured, and the box was spent, so the goal went unmeasured)
SMALL_32K_S = 8.0


def measure(ck, ids4096, ids512, timer, quick, time_left=lambda: float("inf"), floor_ms=None,
            backend="cuda", long_tokens=32768) -> dict:
    """The mode's measures as a dict (the bench's ``primewalk.mma``). ``time_left()``: seconds of
    the bench's time box this part may still use; ``floor_ms``: the bf16 weight floor;
    ``long_tokens``: the long prime's length (32,768; the key names keep it; tests run it short).
    The long prime runs once cold (the process's first prime of that length: its buffers grow)
    and, when the time box allows, once more: ``prime_32768_s`` is the warm run where there is
    one, like every other figure of the bench, ``prime_32768_cold_s`` the first."""
    from ..engine.model import Engine

    eng = Engine(ck, backend, check_finite=True, mode="exact-bf16")

    def prime(n, ids):
        s = eng.new_session(n + 64)
        eng.prime(s, ids)
        return s

    n4 = len(ids4096)
    res = {"mode": "exact-bf16", "weights": eng.weights, "prime_tokens": n4}  # weights: bf16 bits on CUDA
    res["prime_4096_s"] = timer(lambda: prime(n4, ids4096), reps=2)
    res["prime_4096_tokens_per_s"] = n4 / res["prime_4096_s"]
    L = long_tokens
    guess = res["prime_4096_s"] * (L / n4) ** 2  # attention: quadratic in the length
    if quick or guess > MAX_PRIME_32K_S or (guess > time_left() and guess > SMALL_32K_S):
        res["prime_32768_s"] = "skipped"
        res["prime_32768_skipped"] = (f"prime {n4} took {res['prime_4096_s']:.2f} s, {L} predicted {guess:.1f} s, "
                                      f"{time_left():.1f} s left (quick={quick})")
    else:
        ids_long = (list(ids4096) * (L // n4 + 1))[:L]
        cold = res["prime_32768_cold_s"] = timer(lambda: prime(L, ids_long), reps=1, warmup=0)
        warm = cold <= SMALL_32K_S or cold < time_left()
        res["prime_32768_s"] = timer(lambda: prime(L, ids_long), reps=1, warmup=0) if warm else cold
        res["prime_32768_runs"] = "cold, then warm (the warm one counts)" if warm else "one cold run (no time for a second)"
    from .bench import decode_figures  # chained (the goal's figure), stepwise, and the two bitwise alike

    res.update(decode_figures(eng, lambda: prime(len(ids512), ids512)))
    res["bf16_decode_floor_ms"] = floor_ms
    if not quick and time_left() > 4 * res["prime_4096_s"] + 10:  # where the 4096 prime's time goes
        from .bench import profile_step

        res["profile_prime_4096"] = profile_step(eng, f"prime_{n4}", ids4096)
    del eng
    return res


def table_lines(r) -> list:
    """The printed lines of the mode's measures (none when the part was skipped or failed)."""
    m = (r.get("primewalk") or {}).get("mma")
    if not isinstance(m, dict) or "prime_4096_tokens_per_s" not in m:
        return []

    def v(x, f="{:.3f}"):
        return f.format(x) if isinstance(x, (int, float)) else str(x)

    hf = ((r.get("hf") or {}).get("bf16") or {}).get("prime_4096_tokens_per_s")
    return [f"exact-bf16: prime 4096 {v(m['prime_4096_tokens_per_s'], '{:.1f}')} tok/s (hf bf16 {v(hf, '{:.1f}')}); "
            f"prime 32768 {v(m.get('prime_32768_s'))} s (cold {v(m.get('prime_32768_cold_s'))}); decode @512 {v(m.get('decode_512_ms_per_token'))} ms/tok "
            f"(bf16 floor {v(m.get('bf16_decode_floor_ms'))})"]
