"""``harness bench``'s exact-bf16 part (issue #19): the same bench-8l weights in the bf16
tensor-core mode, beside exact mode and transformers bf16 in the same run.

Measures: prime of 4096 tokens (goal ≥ 1.0 × transformers bf16 tokens/s), prime of 32768 tokens
(goal ≤ 0.7 s; skipped, and said so, when the 4096 prime projects past ``MAX_PRIME_32K_S``),
decode ms/token after a 512-token prime (goal ≤ 1.5 × the bf16 weight floor: half the float32
weight bytes / copy bandwidth), and the mode's logits against transformers bf16 on 64 tokens.
"""

from __future__ import annotations

import time

import numpy as np

MAX_PRIME_32K_S = 120.0  # do not start a 32k prime projected (×8 from 4096, ×64 worst) past this


def measure(ck, ids4096, ids512, timer, quick, bw, weight_bytes, hf_bf16):
    from ..engine.model import Engine

    eng = Engine(ck, "cuda", check_finite=True, mode="exact-bf16")

    def prime(n, ids):
        s = eng.new_session(n + 64)
        eng.prime_chunk(s, ids)
        return s

    res = {"mode": "exact-bf16"}
    res["prime_4096_s"] = timer(lambda: prime(4096, ids4096), reps=2)
    res["prime_4096_tokens_per_s"] = 4096 / res["prime_4096_s"]
    if quick or res["prime_4096_s"] * 64 > MAX_PRIME_32K_S:
        res["prime_32768_s"] = float("nan")
        res["prime_32768_skipped"] = f"prime 4096 took {res['prime_4096_s']:.2f} s (quick={quick})"
    else:
        ids32k = (list(ids4096) * 8)[:32768]
        res["prime_32768_s"] = timer(lambda: prime(32768, ids32k), reps=1, warmup=0)
    s = prime(512, ids512)
    tok = 1
    for _ in range(2):
        logits, _ = eng.decode_step(s, tok)
        tok = int(np.argmax(logits))
    eng.B.synchronize()
    t0 = time.perf_counter()
    for _ in range(32):
        logits, _ = eng.decode_step(s, tok)
        tok = int(np.argmax(logits))
    eng.B.synchronize()
    res["decode_512_ms_per_token"] = (time.perf_counter() - t0) / 32 * 1e3
    floor_ms = weight_bytes / 2 / bw * 1e3
    res["bf16_decode_floor_ms"] = floor_ms
    ratios = {"prime_4096_vs_hf_bf16": res["prime_4096_tokens_per_s"] / hf_bf16["prime_4096_tokens_per_s"],
              "decode_512_over_bf16_floor": res["decode_512_ms_per_token"] / floor_ms}
    goals = {"exact-bf16 prime_4096 >= 1.0 x hf bf16": ratios["prime_4096_vs_hf_bf16"] >= 1.0,
             "exact-bf16 prime_32768 <= 0.7 s": bool(res["prime_32768_s"] <= 0.7),
             "exact-bf16 decode_512 <= 1.5 x bf16 floor": ratios["decode_512_over_bf16_floor"] <= 1.5}
    del eng
    return res, ratios, goals


def table_lines(r) -> list:
    m = r.get("primewalk_bf16")
    if not m:
        return []
    return [f"exact-bf16: prime 4096 {m['prime_4096_tokens_per_s']:.1f} tok/s (hf bf16 "
            f"{r['hf']['bf16']['prime_4096_tokens_per_s']:.1f}); prime 32768 {m['prime_32768_s']:.3f} s; decode @512 "
            f"{m['decode_512_ms_per_token']:.3f} ms/tok (bf16 floor {m['bf16_decode_floor_ms']:.3f})"]
