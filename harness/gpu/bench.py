"""``harness bench``: primewalk on CUDA against HF transformers and hardware anchors, one run.

Model ``bench-8l``: Qwen3-Next dimensions (hidden 2048; GDN 16 key / 32 value heads × 128,
conv 4; attention 16 heads / 2 KV heads × 256, partial rotary 0.25; dense MLP 5632; vocab
151936), 8 layers (3 GDN : 1 attention), random weights, built with transformers on the device
and saved; primewalk loads the same files (plus a random MTP head, which HF's class lacks).
``stdlib-small`` (the trained model in ``harness/models``) adds speculative decoding with an
MTP head whose drafts are accepted.

Measures (exact mode), in one device command of under 10 minutes (a time box, ``--budget-s``):

- issue #15, the prime length curve: 4,096 / 16,384 / 32,768 / 131,072 tokens (``--lengths``),
  primewalk (``Engine.prime``: launches of at most ``Engine.chunk_rows`` rows, so memory does not
  grow with the prompt) beside transformers fp32 and bf16 (``logits_to_keep=1``); an
  out-of-memory is recorded ``"oom"``, a length that would not fit the time box ``"skipped"``;
  peak device memory per length; the per-op profile at 4,096 and 32,768; attention TFLOP/s
  (causal FLOPs) at 32,768 and GEMM TFLOP/s on the bench shapes; a log-log figure of the curve
  next to the JSON (``<stem>.prime_curve.png``).
- issue #16: decode at 512 and 32k context (the cache filled with random K/V and state: decode
  cost depends on the context length, not its values) against the floor (bytes of every weight
  read once per token, lm head included, embedding excluded / device copy bandwidth);
  speculative decoding K = 1..4 on bench-8l and stdlib-small (tokens/s plain vs speculative,
  acceptance, the cost of one K-draft step and of one K+1-row verify step); bf16-resident
  decode when the engine has it (``n/a`` otherwise).
- issue #19, the exact-bf16 mode (:mod:`.bench_mma`, ``primewalk.mma``; ``--skip mma``): prime
  4,096 vs transformers bf16, prime 32,768 (skipped when the 4,096 prime predicts it past the
  time box), decode at 512 vs the bf16 weight floor (half the float32 floor).
- anchors in the same run: torch SGEMM (cuBLAS, TF32 off) on the model's GEMM shapes, a
  device-to-device copy, transformers decode; yielded vs drained walker prime.

Writes one JSON (``schema_version`` 2: ``prime_curve``, ``goals``, device, driver, date, commit,
``code_fingerprint``; see :mod:`.bench_report`) and prints one table. Needs a CUDA GPU and
torch + transformers.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
import time

import numpy as np

from ..atomic import write_text_atomic
from ..errors import PrimewalkError
from . import bench_report as rep
from .bench_report import NA, SKIPPED, Budget, causal_attention_flops, gemm_flops, guarded

BENCH_8L = dict(
    vocab_size=151936, hidden_size=2048, num_hidden_layers=8,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
    partial_rotary_factor=0.25, rope_theta=10000.0, intermediate_size=5632, num_experts=0,
    tie_word_embeddings=False, rms_norm_eps=1e-6, max_position_embeddings=262144,
)
DEFAULT_BUDGET_S = 450.0  # the whole run, model build included; the device command allows 600
SKIPPABLE = ("hf", "hf-bf16", "profile", "spec", "stdlib", "walker", "decode-32k", "bf16", "mma")
SPEC_KS = (1, 2, 3, 4)
# a draft and a verify step are timed SPEC_STEP_WARMUP + SPEC_STEP_REPS times, the median of the
# last SPEC_STEP_REPS counts (7 until 6356ab9: a step's run-to-run spread on the H200, ~0.1 ms,
# was as large as the differences between K; receipts/probes/README.md); their least and most go
# beside it (draft_step_ms_range, verify_step_ms_range: two H100s differed by ~0.1 ms at one code,
# receipts/probes/h100-bench-recheck-abe1920/)
SPEC_STEP_WARMUP, SPEC_STEP_REPS = 2, 15
# a speculative continuation is timed on its third run (spec_run: every step shape it meets is
# replayed then, none captured)
SPEC_UNTIMED_RUNS = 2
# the draft step is also timed drafting among the first BENCH_DRAFT_VOCAB ids (harness.engine.draft:
# the size EAGLE-3 and FR-Spec use for 128k-152k vocabularies), the lm head's other rows unread
BENCH_DRAFT_VOCAB = 32768
# ... and, for K = 3 only, at these smaller sizes (draft_vocab.draft_step_ms_by_size): the step's
# cost against N, its MTP layer's share fixed
BENCH_DRAFT_VOCAB_CURVE = (16384, 8192)
# where the run happens: the torch device and the engine backend (tests run the whole bench on
# the CPU with a tiny model by setting both to "cpu")
DEVICE, BACKEND = "cuda", "cuda"


class _HostContext:
    """Stands in for numba's CUDA context off the GPU: no device memory to count."""

    class deallocations:  # noqa: N801 - mirrors numba's attribute
        @staticmethod
        def clear():
            pass

    @staticmethod
    def get_memory_info():
        return (0, 0)


def device_context():
    """numba's CUDA context (free/total memory, pending frees), or a stand-in off the GPU."""
    if BACKEND != "cuda":
        return _HostContext()
    from numba import cuda

    return cuda.current_context()


def _sync():
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _median(xs):
    return float(np.median(np.asarray(xs, dtype=np.float64)))


def _ms_range(xs):
    """{min, max, n} of step times ``xs`` (seconds) in ms: the spread behind a median, which
    differs most between machines for the draft and verify steps (host work timed in full)."""
    return {"min": float(min(xs)) * 1e3, "max": float(max(xs)) * 1e3, "n": len(xs)}


class Timer:
    """Wall time around synchronised device work (the host waits for the device at both ends)."""

    def __init__(self, sync):
        self.sync = sync

    def __call__(self, fn, reps=3, warmup=1):
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(reps):
            self.sync()
            t0 = time.perf_counter()
            fn()
            self.sync()
            out.append(time.perf_counter() - t0)
        return _median(out)


def curve_reps(n: int, first: int) -> tuple[int, int]:
    """(reps, warmup) of a curve point: the first length warms up, long ones run once."""
    if n == first:
        return 2, 1
    return (2, 0) if n <= 16384 else (1, 0)


def build_hf_model(folder, seed=0, config=None):
    """Create bench-8l (or ``config``, a dict shaped like :data:`BENCH_8L`) with transformers
    (random, every parameter perturbed) and save it."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = config or BENCH_8L
    torch.manual_seed(seed)
    kw = {k: v for k, v in config.items() if k not in ("rope_theta", "partial_rotary_factor")}
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": config["rope_theta"],
                             "partial_rotary_factor": config["partial_rotary_factor"]}
    cfg = Qwen3NextConfig(**kw)
    model = Qwen3NextForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def with_mtp_head(ck, seed):
    """``ck`` (an HF checkpoint, which has no MTP head) plus a random MTP head seeded ``seed``."""
    from ..synth import random_tensors

    ck.tensors.update(random_tensors(ck.config, seed, mtp=True, trunk=False))
    ck.config.num_nextn_predict_layers = 1
    return ck


def bench_checkpoint(folder, seed=0):
    """bench-8l as harness bench runs it: (the HF model, the primewalk Checkpoint with a random MTP
    head seeded ``seed + 1``); the HF files are written to ``folder``."""
    from ..engine.weights import load_checkpoint

    model = build_hf_model(folder, seed)
    return model, with_mtp_head(load_checkpoint(folder), seed + 1)


# ------------------------------------------------------------------------------------------------
# transformers
# ------------------------------------------------------------------------------------------------
def hf_prime_runner(m, ids, timer, first, device=None):
    """``fn(n)``: seconds of one HF forward over ``n`` prompt tokens (logits of the last row
    only, as a prime needs)."""
    import torch

    def run(n):
        x = torch.tensor([ids[:n]], device=device or DEVICE)
        reps, warmup = curve_reps(n, first)

        def go():
            with torch.no_grad():
                m(x, use_cache=False, logits_to_keep=1)

        try:
            return timer(go, reps=reps, warmup=warmup)
        finally:
            del x

    return run


def hf_decode_ms(m, ids512, timer):
    import torch

    x512 = torch.tensor([ids512], device=DEVICE)
    with torch.no_grad():
        def gen(n):
            return lambda: m.generate(x512, max_new_tokens=n, min_new_tokens=n, do_sample=False)

        t33 = timer(gen(33), reps=2)
        t1 = timer(gen(1), reps=2)
    return (t33 - t1) / 32 * 1e3


def torch_anchors(timer):
    import torch

    dev = torch.device(DEVICE)
    shapes = {"mlp_up 4096x2048x11264": (4096, 2048, 11264), "mlp_down 4096x5632x2048": (4096, 5632, 2048),
              "qkvz 4096x2048x12288": (4096, 2048, 12288), "gemm 4096x2048x5632": (4096, 2048, 5632)}
    res = {}
    for name, (m, k, n) in shapes.items():
        a = torch.randn(m, k, device=dev)
        b = torch.randn(k, n, device=dev)
        t = timer(lambda: a @ b, reps=10, warmup=3)
        res[name] = {"s": t, "tflops": 2 * m * k * n / t / 1e12}
    src = torch.randn(512 * 1024 * 1024, device=dev)  # 2 GiB
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src), reps=10, warmup=3)
    bw = 2 * src.numel() * 4 / t
    del src, dst
    return res, bw


# ------------------------------------------------------------------------------------------------
# primewalk
# ------------------------------------------------------------------------------------------------
class OpProfile:
    """Stands in for an engine's op module: synchronises around every op and adds its time to
    its name, to see where a step's time goes (the sum exceeds the unprofiled step time by the
    synchronisations)."""

    def __init__(self, ops, sync):
        self._ops, self._sync, self.times, self.calls = ops, sync, {}, {}

    def __getattr__(self, name):
        fn = getattr(self._ops, name)

        def timed(*a, **k):
            self._sync()
            t0 = time.perf_counter()
            r = fn(*a, **k)
            self._sync()
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
            self.calls[name] = self.calls.get(name, 0) + 1
            return r

        return timed

    def report(self, total_s):
        rows = sorted(self.times.items(), key=lambda kv: -kv[1])
        return {"total_s": total_s, "ops": {k: {"s": v, "calls": self.calls[k]} for k, v in rows}}


def profile_step(eng, name, ids):
    """Per-op time of one step: ``decode_<n>`` (one decode step after an ``n``-token prime) or
    ``prime_<n>`` (a prime of ``n`` tokens in ``Engine.prime``'s chunks)."""
    plain_ops = eng.ops
    n = int(name.split("_")[1])
    try:
        s = eng.new_session(n + 64)
        if name.startswith("decode"):
            eng.prime(s, ids[:n])
        prof = eng.ops = OpProfile(plain_ops, eng.B.synchronize)
        t0 = time.perf_counter()
        if name.startswith("decode"):
            eng.decode_step(s, 1)
        else:
            eng.prime(s, ids[:n])
        eng.B.synchronize()
        return prof.report(time.perf_counter() - t0)
    finally:
        eng.ops = plain_ops


def profile_steps(eng, ids_prime, ids_decode, prime_lengths=None):
    """Per-op time of one 512-context decode step and of a prime at each of ``prime_lengths``
    (default: the length of ``ids_prime``)."""
    out = {f"decode_{len(ids_decode)}": profile_step(eng, f"decode_{len(ids_decode)}", ids_decode)}
    for n in prime_lengths or (len(ids_prime),):
        out[f"prime_{n}"] = profile_step(eng, f"prime_{n}", ids_prime)
    return out


def attention_tflops(eng, profile: dict, n: int):
    """Attention TFLOP/s of a profiled ``n``-token prime (causal FLOPs / the attention op's time)."""
    p = (profile or {}).get(f"prime_{n}")
    if not p or "attention" not in p["ops"]:
        return None
    cfg = eng.cfg
    layers = len(cfg.layer_types) - len(cfg.gdn_layers)
    flops = causal_attention_flops(n, cfg.num_attention_heads, cfg.head_dim, layers)
    return flops / p["ops"]["attention"]["s"] / 1e12


def gemm_rates(eng, timer, rows=4096, seed=0):
    """TFLOP/s of the engine's linear op on the bench shapes (the weights of the first DeltaNet
    and the first attention layer, ``rows`` rows) and over all of them."""
    B, ops, rng = eng.B, eng.ops, np.random.default_rng(seed)
    gdn = eng.layers[eng.cfg.gdn_layers[0]]
    att = next(L for L in eng.layers if L["kind"] != gdn["kind"])
    shapes = {"qkvz": gdn["qkvzba"], "out": gdn["out"], "mlp_gate_up": gdn["gu"], "mlp_down": gdn["down"],
              "attn_qkv": att["qkv"], "attn_o": att["o"]}
    res, flops, secs = {}, 0, 0.0
    for name, W in shapes.items():
        N, K = W.shape
        x = B.upload((0.1 * rng.standard_normal((rows, K))).astype(np.float32))
        y = B.empty((rows, N))
        t = timer(lambda: ops.linear(x, W, y, rows), reps=3, warmup=1)
        f = gemm_flops(rows, K, N)
        res[f"{name} {rows}x{K}x{N}"] = {"s": t, "tflops": f / t / 1e12}
        flops, secs = flops + f, secs + t
    return {"shapes": res, "tflops": flops / secs / 1e12}


def _fill_random_context(engine, sess, n, rng):
    """Pretend ``n`` positions are primed: random K/V rows and recurrent state (decode timing)."""
    c, B = sess.cache, engine.B
    for li in c.k:
        for plane in (c.k[li], c.v[li]):
            B.copy_into(plane[:n], rng.standard_normal((n, plane.shape[1])).astype(np.float32))
    for li in c.rec:
        B.copy_into(c.rec[li], (0.05 * rng.standard_normal(c.rec[li].shape)).astype(np.float32))
    c.pos = n


def decode_ms(eng, sess, n=32, warmup=None, chained=True):
    """Milliseconds per greedy decode step on ``sess`` (compilation and first touch excluded).

    ``chained`` (the figure the goals read): :meth:`Engine.decode_greedy`, ``n`` steps in one
    call with every step's logits brought to the host (``keep_logits``) -- the pick on the
    device, so the host's work of a step overlaps the next step's. Its warm-up (one call of
    four steps) runs each of its two slots eagerly and captured. Else (``stepwise``): ``n``
    :meth:`Engine.decode_step` calls with numpy's argmax between them, the host waiting for
    each step; its warm-up covers the captures: a captured step runs once eagerly and is
    captured at its second run, once per mapped logits buffer it stores into
    (``Engine._logits_slot``; a loop holding the last logits alternates two), so the default
    runs every buffer's first two steps before the clock starts."""
    from ..engine.model import LOGIT_RING

    if chained:
        picks, _ = eng.decode_greedy(sess, 1, 4 if warmup is None else max(int(warmup), 1), keep_logits=True)
        eng.B.synchronize()
        t0 = time.perf_counter()
        eng.decode_greedy(sess, picks[-1], n, keep_logits=True)
        eng.B.synchronize()
        return (time.perf_counter() - t0) / n * 1e3
    return float(np.mean(stepwise_steps_ms(eng, sess, n, warmup)))


def host_pace(reps=15):
    """How fast this host runs a stepwise step's own work, to tell a slow host from a slow step in a
    run's figures: µs of numpy's argmax over a bench-8l logits row (151,936 float32 values) and of
    a Python loop of 10,000 additions, each the median of ``reps`` runs."""
    row = np.random.default_rng(0).standard_normal(BENCH_8L["vocab_size"]).astype(np.float32)
    timer = Timer(lambda: None)  # host work only: nothing to wait for

    def us(fn):
        return timer(fn, reps=reps, warmup=0) * 1e6

    def loop():
        x = 0
        for i in range(10_000):
            x += i
        return x

    return {"argmax_us": us(lambda: int(np.argmax(row))), "py_loop_us": us(loop)}


def stepwise_steps_ms(eng, sess, n=32, warmup=None):
    """:func:`decode_ms`'s stepwise decode, each step timed alone: the milliseconds of each of the
    ``n`` :meth:`Engine.decode_step` calls with numpy's argmax after it (the calls
    ``Engine._greedy_stepwise`` makes), the host waiting for each. Its mean is the stepwise
    ms/token; its median is the goals' "one decode step" (the draft and verify steps are medians
    of their calls too): a bench at ecb35dd had a mean of 2.066 ms where the same tree's step took
    1.40-1.46 ms in four other processes, and one slow stretch moves a mean of 32 steps."""
    from ..engine.model import LOGIT_RING

    warmup = 2 * (LOGIT_RING + 1) if warmup is None else warmup
    tok = eng._greedy_stepwise(sess, 1, warmup, False)[0][-1] if warmup else 1
    eng.B.synchronize()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        logits, _ = eng.decode_step(sess, tok)
        tok = int(np.argmax(logits))
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def chained_equals_stepwise(eng, make_session, n=16, token=1):
    """Whether :meth:`Engine.decode_greedy` gives the picks and logits (bitwise) and the cache
    digest of ``n`` :meth:`Engine.decode_step` calls fed numpy's argmax, from ``token`` in two
    sessions ``make_session()`` primed alike -- checked beside the timing, on the engine it times
    (and by tools/fuzz_configs.py per configuration)."""
    a, b = make_session(), make_session()
    picks, rows = eng._greedy_stepwise(a, token, n, True)
    got, logits = eng.decode_greedy(b, token, n, keep_logits=True)
    return bool(got == picks and np.array_equal(logits.view(np.uint32), rows.view(np.uint32))
                and a.cache.digest() == b.cache.digest())


def _primed(eng, ids):
    """A session of ``eng`` primed with ``ids`` (128 positions to spare)."""
    s = eng.new_session(len(ids) + 128)
    eng.prime(s, ids)
    return s


def decode_figures(eng, make_session, reps=1):
    """The decode figures of one engine at one context: chained (the median of ``reps`` runs),
    stepwise (the mean of its steps, and their median, least and most: :func:`stepwise_steps_ms`),
    and whether the two are bitwise the same decode."""
    chained = _median([decode_ms(eng, make_session()) for _ in range(reps)])  # first, as before
    sess = make_session()
    pace = host_pace()  # the stepwise steps wait on the host: its pace right before them
    steps = stepwise_steps_ms(eng, sess)
    return {"decode_512_ms_per_token": chained,
            "decode_512_stepwise_ms_per_token": float(np.mean(steps)),
            "decode_512_stepwise_step_ms": {"median": _median(steps), "min": float(min(steps)),
                                            "max": float(max(steps)), "steps": len(steps), "host_pace": pace},
            "decode_chained_equals_stepwise": chained_equals_stepwise(eng, make_session)}


def run_untimed(eng, sess, go, runs=SPEC_UNTIMED_RUNS):
    """Run ``go()`` (a continuation on ``sess``) ``runs`` times, resetting ``sess`` to the zero
    state after each: the untimed runs before a timed one, in which every step shape it meets
    is run eagerly and then captured."""
    from ..walk.scheduler import reset_session, zero_snapshot

    for _ in range(runs):
        go()
        reset_session(sess, zero_snapshot(eng))


def spec_run(eng, prompt, k, new_tokens=64, draft_vocab=None, draft_vocab_curve=()):
    """Speculative (K drafts) vs plain greedy decoding after the same prime, each timed on its
    third run (compilation and graph capture excluded: ``steady``), and the cost of one draft step (K
    chained MTP passes) and of one K+1-row verify step, timed in isolation; with
    ``draft_vocab`` N (smaller than the vocabulary) the draft step again, drafting among the
    ids 0..N-1 (``draft_vocab`` in the result), and at each size of ``draft_vocab_curve``
    (``draft_step_ms_by_size``)."""
    from ..walk.mtp_walker import run_prime
    from ..walk.speculative import continue_plain, continue_spec

    cap = len(prompt) + 2 * new_tokens + k + 8

    def steady(go):
        """(result, session) of ``go(session)`` run SPEC_UNTIMED_RUNS + 1 times on one session,
        reset in between, the last timed (its result): a step shape is run eagerly the first
        time it comes, captured the second and replayed after, so a shape the first run met
        once (a round's fill rows after a rare acceptance) is captured in the second run and
        replayed in the third. Until 9a49357 the second run was timed, and the capture of such
        shapes counted in it."""
        sess = eng.new_session(cap)
        run_untimed(eng, sess, lambda: go(sess))
        return go(sess), sess

    spec, sess = steady(lambda s: continue_spec(eng, s, run_prime(eng, s, prompt, k).prepared, new_tokens, k))
    plain, _ = steady(lambda s: continue_plain(eng, s, run_prime(eng, s, prompt, k).prepared, new_tokens))
    snap = sess.cache.snapshot()
    d_s, v_s = _time_draft_verify(eng, sess, snap, k, verify=True)
    out = {"spec_tokens_per_s": spec.tokens_per_s, "plain_tokens_per_s": plain.tokens_per_s,
           "untimed_runs": SPEC_UNTIMED_RUNS,
           "same_tokens": spec.tokens == plain.tokens,
           "mean_acceptance_length": float(spec.metrics["mean_acceptance_length"]),
           "draft_step_ms": _median(d_s) * 1e3, "verify_step_ms": _median(v_s) * 1e3,
           "draft_step_ms_range": _ms_range(d_s), "verify_step_ms_range": _ms_range(v_s),
           "draft_chained_equals_stepwise": drafts_chained_equal_stepwise(eng, sess, snap, k)}
    if draft_vocab and eng.cfg.vocab_size > draft_vocab:  # the same step drafting among the first ids
        eng.set_draft_vocab(draft_vocab)
        try:
            dv, _ = steady(lambda s: continue_spec(eng, s, run_prime(eng, s, prompt, k).prepared, new_tokens, k))
            dv_s = _time_draft_verify(eng, sess, snap, k)[0]
            out["draft_vocab"] = {"size": draft_vocab, "spec_tokens_per_s": dv.tokens_per_s,
                                  "same_tokens": dv.tokens == plain.tokens,
                                  "mean_acceptance_length": float(dv.metrics["mean_acceptance_length"]),
                                  "draft_step_ms": _median(dv_s) * 1e3, "draft_step_ms_range": _ms_range(dv_s),
                                  "draft_chained_equals_stepwise": drafts_chained_equal_stepwise(eng, sess, snap, k)}
            by = {}
            for n in draft_vocab_curve:
                eng.set_draft_vocab(n)
                by[str(n)] = _median(_time_draft_verify(eng, sess, snap, k)[0]) * 1e3
            if by:
                out["draft_vocab"]["draft_step_ms_by_size"] = by
        finally:
            eng.set_draft_vocab(None)
    return out


def drafts_chained_equal_stepwise(eng, sess, snap, k):
    """Whether ``Engine.mtp_draft`` (chained passes, the picks on the device) drafts what its
    passes run one at a time with the host's argmax draft (``_draft_stepwise``), leaving the same
    cache digest; ``sess`` restored to ``snap`` before each and after."""
    out = []
    for run in (eng.mtp_draft, eng._draft_stepwise):
        sess.cache.restore(snap)
        sess.cache.mtp_len = sess.cache.pos - 1
        out.append((run(sess, [1, 2], np.zeros((2, eng.cfg.hidden_size), np.float32), k), sess.cache.digest()))
    sess.cache.restore(snap)
    return out[0] == out[1]


def _time_draft_verify(eng, sess, snap, k, verify=False):
    """The seconds of SPEC_STEP_REPS draft steps (``mtp_draft`` of K drafts) and, with
    ``verify``, of the K+1-row verify step after each, the first SPEC_STEP_WARMUP passes (which
    may compile or capture a step) left out; the cache restored to ``snap`` after every pass.
    One snapshot for all: a snapshot taken each pass (until f19fbe9) cloned every cache plane
    and the last hidden row (19 device allocations on bench-8l), and numba frees device arrays
    in batches once more than ten are pending, so the bench's own garbage was freed inside
    whichever timed step a batch fell in."""
    d_s, v_s = [], []
    for _ in range(SPEC_STEP_WARMUP + SPEC_STEP_REPS):
        c = sess.cache
        hid = np.zeros((2, eng.cfg.hidden_size), np.float32)
        c.mtp_len = c.pos - 1
        eng.B.synchronize()
        t0 = time.perf_counter()
        drafts = eng.mtp_draft(sess, [1, 2], hid, k)
        eng.B.synchronize()
        d_s.append(time.perf_counter() - t0)
        if verify:
            t0 = time.perf_counter()
            eng.target_step(sess, [1] + drafts, capture=True)
            eng.B.synchronize()
            v_s.append(time.perf_counter() - t0)
        sess.cache.restore(snap)
    return d_s[SPEC_STEP_WARMUP:], v_s[SPEC_STEP_WARMUP:]


def bf16_engine(ck):
    """bench-8l with bf16-resident weights (issue #14): every matrix rounded to bf16 (round to
    nearest even, what an HF bf16 save does) and kept as bf16 bits on the device. Returns (engine,
    decode bytes per step at the resident sizes)."""
    from ..engine import bf16
    from ..engine.model import Engine

    ck16 = bf16_checkpoint(ck)
    return Engine(ck16, BACKEND, check_finite=True, weights="bf16"), bf16.decode_bytes(ck16.tensors, "bf16")


def bf16_checkpoint(ck):
    """``ck`` with every matrix rounded to bf16 (round to nearest even, what an HF bf16 save
    does): a checkpoint that ``weights="bf16"`` can keep as bf16 bits."""
    import dataclasses

    from ..engine import bf16
    from ..engine.modes import round_bf16

    names = set(bf16.matrix_names(ck.tensors))
    return dataclasses.replace(ck, tensors={k: round_bf16(v) if k in names else v for k, v in ck.tensors.items()})


def stdlib_spec(ks, new_tokens=128, prompt_tokens=512):
    """Speculative decoding on the trained stdlib-small model (drafts that get accepted)."""
    from ..engine.model import Engine
    from ..engine.weights import load_checkpoint
    from ..models import model_path
    from ..tokenizer import encode

    folder = model_path("stdlib-small")
    with open(os.path.join(folder, "prompts", "heldout0.py"), encoding="utf-8", errors="replace") as f:
        prompt = encode(f.read())[:prompt_tokens]
    eng = Engine(load_checkpoint(folder), BACKEND, check_finite=True)
    s = eng.new_session(len(prompt) + 64)
    eng.prime(s, prompt)
    out = {"prompt_tokens": len(prompt), "new_tokens": new_tokens, "decode_ms_per_token": decode_ms(eng, s)}
    out["spec"] = {f"k{k}": spec_run(eng, prompt, k, new_tokens) for k in ks}
    return out


def ours(ck, ids, ids512, timer, curve, budget, skip, errors, free0):
    """Every primewalk measure on bench-8l (see the module docstring). Returns (engine, dict)."""
    from ..engine.memory import plan
    from ..engine.model import Engine
    from ..walk.mtp_walker import run_prime

    ctx = device_context()
    lengths = [e["tokens"] for e in curve]
    eng = Engine(ck, BACKEND, check_finite=True)
    res = {"weights_on_device_bytes": int(free0 - ctx.get_memory_info()[0]), "chunk_rows": eng.chunk_rows,
           "captured_steps": bool(eng.graphs)}
    res["memory_plan"] = {str(n): {"above_weights_bytes": p.above_weights, "cache_bytes": p.cache,
                                   "workspace_bytes": p.workspace_bytes}
                          for n in lengths for p in [plan(eng.cfg, n + 64, eng.chunk_rows)]}

    def prime_s(n):
        reps, warmup = curve_reps(n, lengths[0])
        out = []
        for i in range(warmup + reps):
            ctx.deallocations.clear()  # the previous session's planes are freed before the next is made
            s = eng.new_session(n + 64)
            eng.B.synchronize()
            t0 = time.perf_counter()
            eng.prime(s, ids[:n])
            eng.B.synchronize()
            if i >= warmup:
                out.append(time.perf_counter() - t0)
            peaks[n] = int(free0 - ctx.get_memory_info()[0])  # the session is still alive here
            del s
        return _median(out)

    def prime_session(n):
        return _primed(eng, ids[:n])

    peaks = {}
    rep.run_curve(curve, "primewalk", prime_s, budget.sub(0.5), errors, peak=lambda n: peaks[n],
                  runs=lambda n: sum(curve_reps(n, lengths[0])))
    e4096 = rep.curve_entry(curve, 4096)
    if isinstance(e4096.get("primewalk_s"), float):  # schema 1 fields, read by the README and notebooks
        res["prime_4096_s"] = e4096["primewalk_s"]
        res["prime_4096_tokens_per_s"] = 4096 / e4096["primewalk_s"]

    def fits(seconds):
        return budget.left() > seconds

    res["gemm"] = guarded(lambda: gemm_rates(eng, timer), errors, "gemm rates")
    got = guarded(lambda: decode_figures(eng, lambda: prime_session(512), reps=2), errors, "decode 512")
    res.update(got if isinstance(got, dict) else {"decode_512_ms_per_token": got})
    if eng.graphs:
        eng.graphs = False  # the same steps with every launch issued from Python
        res["decode_512_uncaptured_ms_per_token"] = guarded(lambda: decode_ms(eng, prime_session(512)), errors,
                                                            "decode 512 uncaptured")
        eng.graphs = True
    if "decode-32k" not in skip:
        def d32k():
            s32 = eng.new_session(32768 + 64)
            _fill_random_context(eng, s32, 32768, np.random.default_rng(0))
            return decode_ms(eng, s32, 32)

        res["decode_32k_ms_per_token"] = guarded(d32k, errors, "decode 32k")
        res["context_32k"] = 32768
    res["spec"] = {}
    if "spec" not in skip:
        for k in SPEC_KS:
            res["spec"][f"k{k}"] = guarded(lambda: spec_run(
                eng, ids512, k, draft_vocab=BENCH_DRAFT_VOCAB, draft_vocab_curve=BENCH_DRAFT_VOCAB_CURVE if k == 3 else ()),
                errors, f"spec k{k}")
        res["spec"] = {k: v for k, v in res["spec"].items() if isinstance(v, dict)}
    if "walker" not in skip and fits(30):
        def walker():
            walls = {}
            for mode in ("drained", "yielded"):
                def go():
                    s = eng.new_session(4096 + 64)
                    run_prime(eng, s, ids[:4096], 1, chunk_rows=512, fill_chunk=512,
                              yield_hook=(lambda: None) if mode == "yielded" else None)
                walls[mode] = timer(go, reps=2)
            return walls

        walls = guarded(walker, errors, "walker yielded vs drained")
        if isinstance(walls, dict):
            res["walker_prime_4096_drained_s"] = walls["drained"]
            res["walker_prime_4096_yielded_s"] = walls["yielded"]
            res["yield_overhead_pct"] = 100.0 * (walls["yielded"] - walls["drained"]) / walls["drained"]
    res["profile"] = {}
    if "profile" not in skip:
        res["profile"]["decode_512"] = guarded(lambda: profile_step(eng, "decode_512", ids512), errors,
                                               "profile decode 512")
        for n in rep.PROFILE_LENGTHS:
            t = rep.curve_entry(curve, n).get("primewalk_s")
            if n in lengths and isinstance(t, float) and fits(1.5 * t + 20):
                res["profile"][f"prime_{n}"] = guarded(lambda: profile_step(eng, f"prime_{n}", ids), errors,
                                                       f"profile prime {n}")
        res["profile"] = {k: v for k, v in res["profile"].items() if isinstance(v, dict)}
    res["attention_tflops_32768"] = attention_tflops(eng, res["profile"], 32768)
    res["attention_tflops_4096"] = attention_tflops(eng, res["profile"], 4096)
    res["peak_used_bytes"] = max(peaks.values(), default=None)
    return eng, res


def logits_check(eng, model_fp32_logits, ids):
    s = eng.new_session(len(ids) + 8)
    ours_l, _ = eng.target_step(s, ids)
    ref = model_fp32_logits
    return float(np.abs(ours_l - ref).max() / np.abs(ref).max())


def _git_commit(root):
    try:
        import subprocess

        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except Exception:
        return None


def run_bench(out_path, commit=None, quick=False, seed=0, lengths=None, skip=(), budget_s=DEFAULT_BUDGET_S):
    """The whole bench (module docstring) in one time box of ``budget_s`` seconds; writes the
    JSON at ``out_path`` and the curve's figure beside it. Returns the result."""
    try:
        import torch
    except ImportError:
        raise PrimewalkError("harness bench needs torch and transformers (pip install '.[oracle]')") from None
    from ..engine import backend as bk
    from ..engine.threads import machine_load
    from ..engine.weights import load_checkpoint
    from ..matrix.builtin import REPO
    from .evidence import evidence_block

    bad = set(skip) - set(SKIPPABLE)
    if bad:
        raise PrimewalkError(f"bench --skip: unknown {sorted(bad)} (choose from {', '.join(SKIPPABLE)})")
    lengths = sorted({int(n) for n in (lengths or (rep.CURVE_LENGTHS[:2] if quick else rep.CURVE_LENGTHS))})
    skip, budget, t_all = set(skip), Budget(budget_s), time.perf_counter()
    load0 = machine_load()
    gpu = bk.get_backend(BACKEND)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    timer = Timer(_sync)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, BENCH_8L["vocab_size"], max(lengths + [4096])).tolist()
    ids512 = ids[:512]
    errors = {}
    with tempfile.TemporaryDirectory() as folder:
        model, ck = bench_checkpoint(folder, seed)
    weight_bytes = sum(a.nbytes for k, a in ck.tensors.items() if not k.startswith("mtp.") and k != "model.embed_tokens.weight")
    sgemm, bw = torch_anchors(timer)
    curve = rep.new_curve(lengths)
    hf, ref_logits = {"fp32": {}, "bf16": {}}, None
    for name, dtype, share in (("fp32", torch.float32, 0.2), ("bf16", torch.bfloat16, 0.12)):
        if "hf" in skip or (name == "bf16" and "hf-bf16" in skip):
            continue
        m = guarded(lambda: model.to(device=DEVICE, dtype=dtype).eval(), errors, f"hf {name} load")
        if isinstance(m, str):
            continue
        rep.run_curve(curve, f"hf_{name}", hf_prime_runner(m, ids, timer, lengths[0]), budget.sub(share), errors,
                      runs=lambda n: sum(curve_reps(n, lengths[0])))
        hf[name]["decode_ms_per_token"] = guarded(lambda: hf_decode_ms(m, ids512, timer), errors, f"hf {name} decode")
        t = rep.curve_entry(curve, 4096).get(f"hf_{name}_s")
        if isinstance(t, float):
            hf[name].update(prime_4096_s=t, prime_4096_tokens_per_s=4096 / t)
        if name == "fp32":
            with torch.no_grad():
                ref_logits = guarded(lambda: m(torch.tensor([ids[:64]], device=DEVICE)).logits[0].float().cpu().numpy(),
                                     errors, "hf fp32 reference logits")
        del m
    del model
    rep.free_device_memory()
    free0 = device_context().get_memory_info()[0]
    got = guarded(lambda: ours(ck, ids, ids512, timer, curve, budget, skip, errors, free0), errors, "primewalk")
    eng, mine = got if isinstance(got, tuple) else (None, {})  # a failed engine still leaves the JSON
    if eng is not None and isinstance(ref_logits, np.ndarray):
        mine["logits_rel_err_vs_hf_fp32"] = guarded(lambda: logits_check(eng, ref_logits, ids[:64]), errors,
                                                    "logits check")
    floor_ms = weight_bytes / bw * 1e3
    mine["mma"] = {NA: "skipped"}
    if "mma" not in skip:  # exact-bf16 (issue #19) beside exact and transformers bf16, before the
        # optional parts: the box is mostly spent by now, and its goals are measured here or not at all
        from . import bench_mma

        gotm = guarded(lambda: bench_mma.measure(ck, ids[:4096], ids512, timer, quick, budget.sub(0.5).left,
                                                 weight_bytes / 2 / bw * 1e3, backend=BACKEND), errors, "exact-bf16")
        mine["mma"] = gotm if isinstance(gotm, dict) else {NA: gotm}
    mine["bf16"] = {NA: "skipped"}
    if "bf16" not in skip:
        def bf16_decode():
            e16, nbytes = bf16_engine(ck)
            return {**decode_figures(e16, lambda: _primed(e16, ids512)), "decode_bytes": nbytes,
                    "floor_ms": nbytes / bw * 1e3}

        got16 = guarded(bf16_decode, errors, "bf16 decode")
        mine["bf16"] = got16 if isinstance(got16, dict) else {NA: got16}
    stdlib = SKIPPED
    if "stdlib" not in skip and budget.left() > 60:
        stdlib = guarded(lambda: stdlib_spec(SPEC_KS), errors, "stdlib-small spec")

    def over(a, b):
        return a / b if isinstance(a, float) and isinstance(b, float) and b else None

    ratios = {
        "decode_512_over_floor": over(mine.get("decode_512_ms_per_token"), floor_ms),
        "decode_32k_over_floor": over(mine.get("decode_32k_ms_per_token"), floor_ms),
        "decode_speedup_vs_hf_fp32": over(hf["fp32"].get("decode_ms_per_token"), mine.get("decode_512_ms_per_token")),
        "prime_vs_hf_fp32": over(mine.get("prime_4096_tokens_per_s"), hf["fp32"].get("prime_4096_tokens_per_s")),
        "peak_over_weights_bytes": (None if mine.get("peak_used_bytes") is None
                                    else mine["peak_used_bytes"] - mine.get("weights_on_device_bytes", 0)),
        "yield_overhead_pct": mine.get("yield_overhead_pct"),
    }
    if "mma" not in skip:
        ratios["mma_prime_4096_vs_hf_bf16"] = over(mine["mma"].get("prime_4096_tokens_per_s"),
                                                   hf["bf16"].get("prime_4096_tokens_per_s"))
        ratios["mma_decode_512_over_bf16_floor"] = over(mine["mma"].get("decode_512_ms_per_token"),
                                                        mine["mma"].get("bf16_decode_floor_ms"))
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = {
        "kind": "bench", "schema_version": 2, "model": "bench-8l", "config": BENCH_8L, "quick": quick,
        "lengths": lengths, "skip": sorted(skip), "budget_s": budget_s,
        "created": now, "date": now, "device": gpu.device_name(), "driver": gpu.driver(), "pdl": gpu.pdl(),
        "commit": commit or os.environ.get("PRIMEWALK_COMMIT") or _git_commit(REPO),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "weights_bytes_decode": weight_bytes, "weights_bytes_all": sum(a.nbytes for a in ck.tensors.values()),
        "copy_bandwidth_bytes_per_s": bw, "decode_floor_ms": floor_ms, "decode_floor_bf16_ms": mine["bf16"].get("floor_ms", floor_ms / 2),
        "sgemm": sgemm, "hf": hf, "prime_curve": curve, "primewalk": mine, "stdlib_small": stdlib,
        "ratios": ratios, "errors": errors,
        "cores": load0["cores"], "load": {"start": load0["loadavg"], "end": machine_load()["loadavg"]},
        **evidence_block(REPO),
    }
    result["goals"] = rep.goals_block(result)
    result["wall_s"] = round(time.perf_counter() - t_all, 1)
    write_text_atomic(out_path, json.dumps(result, indent=1, sort_keys=True) + "\n")
    result["figure"] = guarded(lambda: rep.write_curve_plot(result, out_path), errors, "curve figure")
    return result


def table(r) -> str:
    """The bench's printed summary (either JSON schema)."""
    v = rep._v
    m, hf = r["primewalk"], r.get("hf", {})
    nan = "-"
    out = [f"{r.get('model')} on {r.get('device')} (driver {r.get('driver')}), commit {str(r.get('commit'))[:10]}, "
           f"{r.get('created')}, wall {r.get('wall_s')} s"]
    if r.get("prime_curve"):
        out.append("prime curve (s):")
        out.append(f"  {'tokens':>8s} {'primewalk':>10s} {'hf fp32':>10s} {'hf bf16':>10s} {'peak GiB':>9s}")
        for e in r["prime_curve"]:
            pk = e.get("peak_bytes")
            out.append(f"  {e['tokens']:>8d} {v(e.get('primewalk_s')):>10s} {v(e.get('hf_fp32_s')):>10s} "
                       f"{v(e.get('hf_bf16_s')):>10s} {nan if pk is None else f'{pk / 2 ** 30:.2f}':>9s}")
    rows = [("prime 4096 tok/s", m.get("prime_4096_tokens_per_s"), hf.get("fp32", {}).get("prime_4096_tokens_per_s"),
             hf.get("bf16", {}).get("prime_4096_tokens_per_s")),
            ("decode @512 ms/tok", m.get("decode_512_ms_per_token"), hf.get("fp32", {}).get("decode_ms_per_token"),
             hf.get("bf16", {}).get("decode_ms_per_token")),
            ("  uncaptured @512", m.get("decode_512_uncaptured_ms_per_token"), None, None),
            (f"decode @{m.get('context_32k', '32k')} ms/tok", m.get("decode_32k_ms_per_token"), None, None)]
    out.append(f"{'measure':24s} {'primewalk':>12s} {'hf fp32':>12s} {'hf bf16':>12s}")
    out += [f"{a:24s} {v(b):>12s} {v(c):>12s} {v(d):>12s}" for a, b, c, d in rows if b is not None]
    def spread(d, what):  # the timed steps' least and most, where the run recorded them
        g = d.get(f"{what}_step_ms_range")
        return f" ({g['min']:.2f}-{g['max']:.2f})" if isinstance(g, dict) else ""

    for label, spec in (("bench-8l", m.get("spec") or {}),
                        ("stdlib-small", (r.get("stdlib_small") or {}).get("spec", {}) if isinstance(r.get("stdlib_small"), dict) else {})):
        for k, s in spec.items():
            out.append(f"spec {label} {k}: {s['spec_tokens_per_s']:.1f} tok/s (plain {s['plain_tokens_per_s']:.1f}), "
                       f"acceptance length {s['mean_acceptance_length']:.2f}, draft step {s['draft_step_ms']:.2f} ms"
                       f"{spread(s, 'draft')}, verify step {s['verify_step_ms']:.2f} ms{spread(s, 'verify')}, "
                       f"same tokens {s['same_tokens']}"
                       + (f"; among {s['draft_vocab']['size']} ids: draft step {s['draft_vocab']['draft_step_ms']:.2f} ms"
                          f"{spread(s['draft_vocab'], 'draft')}" if isinstance(s.get("draft_vocab"), dict) else ""))
    sg = r.get("sgemm") or {}
    out.append(f"copy bandwidth {r['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s; decode floor {r['decode_floor_ms']:.3f} "
               f"ms/token; sgemm {max((x['tflops'] for x in sg.values()), default=float('nan')):.1f} TFLOP/s")
    if isinstance(m.get("gemm"), dict):
        out.append(f"primewalk GEMM {m['gemm']['tflops']:.1f} TFLOP/s on the bench shapes; attention at 32768 "
                   f"{v(m.get('attention_tflops_32768'))} TFLOP/s")
    from .bench_mma import table_lines

    out += table_lines(r)
    for k, x in (r.get("ratios") or {}).items():
        out.append(f"ratio {k}: {v(x)}")
    note = rep.goals_device_note(r) if r.get("goals") else ""
    if note:
        out.append(f"note goals: {note}")
    for k, g in (r.get("goals") or {}).items():
        if isinstance(g, dict):
            met = {True: "met", False: "NOT met"}.get(g["met"], str(g["met"]))
            out.append(f"goal {k}: {v(g['value'])} (goal {g['goal']}): {met}")
        else:
            out.append(f"goal {k}: {'met' if g else 'NOT met'}")
    for step, p in (m.get("profile") or {}).items():
        ops = sorted(p["ops"].items(), key=lambda kv: -kv[1]["s"])[:6]
        top = ", ".join(f"{k} {x['s'] * 1e3:.2f} ms/{x['calls']}" for k, x in ops)
        out.append(f"profile {step} ({p['total_s'] * 1e3:.1f} ms with syncs): {top}")
    for k, e in (r.get("errors") or {}).items():
        out.append(f"note {k}: {e}")
    return "\n".join(out)
