"""``harness bench``: primewalk on CUDA against HF transformers and hardware anchors, one run.

Model ``bench-8l``: Qwen3-Next dimensions (hidden 2048; GDN 16 key / 32 value heads × 128,
conv 4; attention 16 heads / 2 KV heads × 256, partial rotary 0.25; dense MLP 5632; vocab
151936), 8 layers (3 GDN : 1 attention), random weights, built with transformers on the device
and saved; primewalk loads the same files (plus a random MTP head, which HF's class lacks).

Measures (exact mode): prime of 4096 tokens; decode of 32 tokens after a 512-token prime; the
same at a 32k-token context (cache filled with random K/V and state, since decode cost depends
on the context length, not on its values); speculative decoding for K = 1..3 with the cost of
one draft step and of one K+1 verify step; yielded vs drained prime; peak GPU memory. Anchors
in the same run: transformers fp32 eager (TF32 off) and bf16; torch SGEMM (cuBLAS, TF32 off) on
the model's GEMM shapes; a device-to-device copy (bandwidth ceiling); the decode floor = bytes
of every weight read once per token (lm head included, embedding excluded) / copy bandwidth.
Writes one JSON and prints one table. Needs a CUDA GPU and torch + transformers.
"""

from __future__ import annotations

import datetime as _dt
import json
import tempfile
import time

import numpy as np

from ..atomic import write_text_atomic
from ..errors import PrimewalkError

BENCH_8L = dict(
    vocab_size=151936, hidden_size=2048, num_hidden_layers=8,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
    partial_rotary_factor=0.25, rope_theta=10000.0, intermediate_size=5632, num_experts=0,
    tie_word_embeddings=False, rms_norm_eps=1e-6, max_position_embeddings=65536,
)


def _median(xs):
    return float(np.median(np.asarray(xs, dtype=np.float64)))


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


def build_hf_model(folder, seed=0):
    """Create bench-8l with transformers (random, every parameter perturbed) and save it."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    kw = {k: v for k, v in BENCH_8L.items() if k not in ("rope_theta", "partial_rotary_factor")}
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": BENCH_8L["rope_theta"],
                             "partial_rotary_factor": BENCH_8L["partial_rotary_factor"]}
    cfg = Qwen3NextConfig(**kw)
    model = Qwen3NextForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def hf_anchors(model, ids4096, ids512, timer, dtype_name):
    import torch

    dev = torch.device("cuda")
    dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
    m = model.to(device=dev, dtype=dtype).eval()
    x4096 = torch.tensor([ids4096], device=dev)
    x512 = torch.tensor([ids512], device=dev)
    out = {}
    with torch.no_grad():
        out["prime_4096_s"] = timer(lambda: m(x4096, use_cache=False), reps=3)

        def gen(n):
            return lambda: m.generate(x512, max_new_tokens=n, min_new_tokens=n, do_sample=False)

        t33 = timer(gen(33), reps=2)
        t1 = timer(gen(1), reps=2)
        out["decode_ms_per_token"] = (t33 - t1) / 32 * 1e3
    out["prime_4096_tokens_per_s"] = 4096 / out["prime_4096_s"]
    return out


def torch_anchors(timer):
    import torch

    dev = torch.device("cuda")
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


def profile_steps(eng, ids4096, ids512):
    """Per-op time of one 512-context decode step and of one 4096-token prime."""
    out = {}
    plain_ops = eng.ops
    try:
        for name, n, ids in (("decode_512", 512, ids512), ("prime_4096", 4096, ids4096)):
            s = eng.new_session(n + 64)
            if name.startswith("decode"):
                eng.prime_chunk(s, ids)
            prof = eng.ops = OpProfile(plain_ops, eng.B.synchronize)
            t0 = time.perf_counter()
            if name.startswith("decode"):
                eng.decode_step(s, 1)
            else:
                eng.prime_chunk(s, ids)
            eng.B.synchronize()
            out[name] = prof.report(time.perf_counter() - t0)
            eng.ops = plain_ops
    finally:
        eng.ops = plain_ops
    return out


def _fill_random_context(engine, sess, n, rng):
    """Pretend ``n`` positions are primed: random K/V rows and recurrent state (decode timing)."""
    c, B = sess.cache, engine.B
    for li in c.k:
        for plane in (c.k[li], c.v[li]):
            B.copy_into(plane[:n], rng.standard_normal((n, plane.shape[1])).astype(np.float32))
    for li in c.rec:
        B.copy_into(c.rec[li], (0.05 * rng.standard_normal(c.rec[li].shape)).astype(np.float32))
    c.pos = n


def ours(ck, ids4096, ids512, timer, quick):
    from ..engine.model import Engine
    from ..walk.mtp_walker import run_prime
    from ..walk.speculative import continue_plain, continue_spec

    from numba import cuda

    free0, total = cuda.current_context().get_memory_info()
    eng = Engine(ck, "cuda", check_finite=True)
    res = {"weights_on_device_bytes": int(free0 - cuda.current_context().get_memory_info()[0])}

    def prime(n, ids):
        s = eng.new_session(n + 64)
        eng.prime_chunk(s, ids)
        return s

    res["prime_4096_s"] = timer(lambda: prime(4096, ids4096), reps=2)
    res["prime_4096_tokens_per_s"] = 4096 / res["prime_4096_s"]

    def decode_after(sess, n=32, warmup=2):
        tok = 1
        for _ in range(warmup):  # compilation and first-touch stay out of the timing
            logits, _ = eng.decode_step(sess, tok)
            tok = int(np.argmax(logits))
        eng.B.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            logits, _ = eng.decode_step(sess, tok)
            tok = int(np.argmax(logits))
        eng.B.synchronize()
        return (time.perf_counter() - t0) / n

    res["decode_512_ms_per_token"] = _median([decode_after(prime(512, ids512)) for _ in range(2)]) * 1e3
    res["captured_steps"] = bool(eng.graphs)
    graphs, eng.graphs = eng.graphs, False  # the same steps with every launch issued from Python
    res["decode_512_uncaptured_ms_per_token"] = decode_after(prime(512, ids512)) * 1e3
    eng.graphs = graphs
    rng = np.random.default_rng(0)
    n32k = 32768 if not quick else 4096
    s32 = eng.new_session(n32k + 64)
    _fill_random_context(eng, s32, n32k, rng)
    res["decode_32k_ms_per_token"] = decode_after(s32, 32) * 1e3
    res["context_32k"] = n32k
    free_min = cuda.current_context().get_memory_info()[0]
    # speculative decoding after a 512-token prime
    res["spec"] = {}
    for k in (1, 2, 3):
        sess = eng.new_session(512 + 128 + k)
        run = run_prime(eng, sess, ids512, k)
        spec = continue_spec(eng, sess, run.prepared, 64, k)
        sess2 = eng.new_session(512 + 128 + k)
        run2 = run_prime(eng, sess2, ids512, k)
        plain = continue_plain(eng, sess2, run2.prepared, 64)
        # one draft step (K chained MTP passes) and one K+1 verify step, timed in isolation
        d_s, v_s = [], []
        for _ in range(3):
            snap = sess.cache.snapshot()
            c = sess.cache
            fill = [1, 2]
            hid = np.zeros((2, eng.cfg.hidden_size), np.float32)
            c.mtp_len = c.pos - 1
            eng.B.synchronize()
            t0 = time.perf_counter()
            drafts = eng.mtp_draft(sess, fill, hid, k)
            eng.B.synchronize()
            d_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            eng.target_step(sess, [1] + drafts, capture=True)
            eng.B.synchronize()
            v_s.append(time.perf_counter() - t0)
            sess.cache.restore(snap)
        res["spec"][f"k{k}"] = {"spec_tokens_per_s": spec.tokens_per_s, "plain_tokens_per_s": plain.tokens_per_s,
                                "same_tokens": spec.tokens == plain.tokens,
                                "mean_acceptance_length": spec.metrics["mean_acceptance_length"],
                                "draft_step_ms": _median(d_s) * 1e3, "verify_step_ms": _median(v_s) * 1e3}
    # yielded vs drained walker prime (4096 tokens, 512-row chunks)
    walls = {}
    for mode in ("drained", "yielded"):
        def go():
            s = eng.new_session(4096 + 64)
            run_prime(eng, s, ids4096, 1, chunk_rows=512, fill_chunk=512,
                      yield_hook=(lambda: None) if mode == "yielded" else None)
        walls[mode] = timer(go, reps=2)
    res["walker_prime_4096_drained_s"] = walls["drained"]
    res["walker_prime_4096_yielded_s"] = walls["yielded"]
    res["yield_overhead_pct"] = 100.0 * (walls["yielded"] - walls["drained"]) / walls["drained"]
    # the GDN recurrence's share of the prime
    cfg, ops, B = eng.cfg, eng.ops, eng.B
    R, kd, nv = 4096, cfg.key_dim, cfg.linear_num_value_heads
    q = B.upload((0.05 * rng.standard_normal((R, kd))).astype(np.float32))
    v = B.upload(rng.standard_normal((R, cfg.conv_dim)).astype(np.float32))
    g = B.upload(-np.abs(rng.standard_normal((R, nv))).astype(np.float32))
    beta = B.upload(rng.uniform(0, 1, (R, nv)).astype(np.float32))
    S = B.zeros((nv, cfg.linear_key_head_dim, cfg.linear_value_head_dim))
    o = B.empty((R, cfg.value_dim))
    t_gdn = timer(lambda: ops.gdn_recurrence(q, q, v, 2 * kd, g, beta, S, o, R, cfg.linear_key_head_dim,
                                              cfg.linear_value_head_dim, cfg.v_per_k, eng.cap_rec_dummy, False), reps=2)
    res["gdn_recurrence_share_of_prime"] = len(cfg.gdn_layers) * t_gdn / res["prime_4096_s"]
    res["peak_used_bytes"] = int(free0 - free_min)  # weights + workspace + caches, device-wide
    res["profile"] = profile_steps(eng, ids4096, ids512)
    return eng, res


def logits_check(eng, model_fp32_logits, ids):
    s = eng.new_session(len(ids) + 8)
    ours_l, _ = eng.target_step(s, ids)
    ref = model_fp32_logits
    return float(np.abs(ours_l - ref).max() / np.abs(ref).max())


def run_bench(out_path, commit=None, quick=False, seed=0):
    try:
        import torch
    except ImportError:
        raise PrimewalkError("harness bench needs torch and transformers (pip install '.[oracle]')") from None
    from ..engine import backend as bk
    from ..engine.weights import load_checkpoint
    from ..synth import random_tensors

    gpu = bk.get_backend("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    timer = Timer(torch.cuda.synchronize)
    rng = np.random.default_rng(seed)
    ids4096 = rng.integers(0, BENCH_8L["vocab_size"], 4096).tolist()
    ids512 = ids4096[:512]
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        model = build_hf_model(folder, seed)
        ck = load_checkpoint(folder)
        ck.tensors.update(random_tensors(ck.config, seed + 1, mtp=True, trunk=False))
        ck.config.num_nextn_predict_layers = 1
    weight_bytes = sum(a.nbytes for k, a in ck.tensors.items() if not k.startswith("mtp.") and k != "model.embed_tokens.weight")
    errors = {}

    def attempt(name, fn, default=None):
        try:
            return fn()
        except Exception as e:  # keep the other measures of a one-shot device run
            errors[name] = f"{type(e).__name__}: {e}"
            print(f"[bench] {name} failed: {errors[name]}", flush=True)
            return default

    nan = float("nan")
    hf = {}
    hf["fp32"] = attempt("hf fp32", lambda: hf_anchors(model, ids4096, ids512, timer, "fp32"),
                         {"prime_4096_s": nan, "prime_4096_tokens_per_s": nan, "decode_ms_per_token": nan})
    with torch.no_grad():
        ref_logits = model.to("cuda", torch.float32)(torch.tensor([ids4096[:64]], device="cuda")).logits[0].float().cpu().numpy()
    hf["bf16"] = attempt("hf bf16", lambda: hf_anchors(model, ids4096, ids512, timer, "bf16"), dict(hf["fp32"]))
    del model
    torch.cuda.empty_cache()
    sgemm, bw = torch_anchors(timer)
    torch.cuda.empty_cache()
    eng, mine = ours(ck, ids4096, ids512, timer, quick)
    mine["logits_rel_err_vs_hf_fp32"] = logits_check(eng, ref_logits, ids4096[:64])
    floor_ms = weight_bytes / bw * 1e3
    all_weight_bytes = sum(a.nbytes for a in ck.tensors.values())
    ratios = {
        "decode_512_over_floor": mine["decode_512_ms_per_token"] / floor_ms,
        "decode_32k_over_floor": mine["decode_32k_ms_per_token"] / floor_ms,
        "decode_speedup_vs_hf_fp32": hf["fp32"]["decode_ms_per_token"] / mine["decode_512_ms_per_token"],
        "prime_vs_hf_fp32": mine["prime_4096_tokens_per_s"] / hf["fp32"]["prime_4096_tokens_per_s"],
        "peak_over_weights_bytes": mine["peak_used_bytes"] - mine["weights_on_device_bytes"],
    }
    goals = {
        "decode_512 <= 1.5 x floor": ratios["decode_512_over_floor"] <= 1.5,
        "decode_32k <= 2 x floor": ratios["decode_32k_over_floor"] <= 2.0,
        "prime_4096 >= 0.7 x hf fp32": ratios["prime_vs_hf_fp32"] >= 0.7,
        "yield overhead <= 2 %": mine["yield_overhead_pct"] <= 2.0,
        "peak <= weights + 2 GB at 32k": ratios["peak_over_weights_bytes"] <= 2 * 1024 ** 3,
    }
    from . import bench_bf16  # exact-bf16 beside exact and transformers bf16 (issue #19)

    bf = attempt("exact-bf16", lambda: bench_bf16.measure(ck, ids4096, ids512, timer, quick, bw, weight_bytes,
                                                          hf["bf16"]))
    if bf is not None:
        ratios.update(bf[1])
        goals.update(bf[2])
    result = {
        "kind": "bench", "schema_version": 1, "model": "bench-8l", "config": BENCH_8L, "quick": quick,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": gpu.device_name(), "driver": gpu.driver(), "commit": commit,
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "weights_bytes_decode": weight_bytes, "weights_bytes_all": all_weight_bytes,
        "copy_bandwidth_bytes_per_s": bw, "decode_floor_ms": floor_ms, "sgemm": sgemm,
        "hf": hf, "primewalk": mine, "primewalk_bf16": None if bf is None else bf[0], "ratios": ratios, "goals": goals,
        "wall_s": round(time.perf_counter() - t_all, 1), "errors": errors,
    }
    write_text_atomic(out_path, json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


def table(r) -> str:
    m, hf = r["primewalk"], r["hf"]
    rows = [
        ("prime 4096 tok/s", m["prime_4096_tokens_per_s"], hf["fp32"]["prime_4096_tokens_per_s"], hf["bf16"]["prime_4096_tokens_per_s"]),
        ("decode @512 ms/tok", m["decode_512_ms_per_token"], hf["fp32"]["decode_ms_per_token"], hf["bf16"]["decode_ms_per_token"]),
        (f"decode @{m['context_32k']} ms/tok", m["decode_32k_ms_per_token"], float("nan"), float("nan")),
    ]
    if "decode_512_uncaptured_ms_per_token" in m:
        rows.insert(2, ("  uncaptured @512", m["decode_512_uncaptured_ms_per_token"], float("nan"), float("nan")))
    out = [f"{'measure':24s} {'primewalk':>12s} {'hf fp32':>12s} {'hf bf16':>12s}"]
    out += [f"{a:24s} {b:12.3f} {c:12.3f} {d:12.3f}" for a, b, c, d in rows]
    for k, v in m["spec"].items():
        out.append(f"spec {k}: {v['spec_tokens_per_s']:.1f} tok/s (plain {v['plain_tokens_per_s']:.1f}), draft step "
                   f"{v['draft_step_ms']:.2f} ms, verify step {v['verify_step_ms']:.2f} ms, same tokens {v['same_tokens']}")
    out.append(f"copy bandwidth {r['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s; decode floor {r['decode_floor_ms']:.3f} ms/token; "
               f"sgemm {max(x['tflops'] for x in r['sgemm'].values()):.1f} TFLOP/s")
    out.append(f"yield overhead {m['yield_overhead_pct']:.2f} %; GDN recurrence share of prime "
               f"{100 * m['gdn_recurrence_share_of_prime']:.1f} %; peak used {m['peak_used_bytes'] / 2**30:.2f} GiB "
               f"(weights {r['weights_bytes_all'] / 2**30:.2f} GiB); logits rel err vs hf fp32 {m['logits_rel_err_vs_hf_fp32']:.2e}")
    from .bench_bf16 import table_lines

    out += table_lines(r)
    for k, v in r["ratios"].items():
        out.append(f"ratio {k}: {v:.3f}" if isinstance(v, float) else f"ratio {k}: {v}")
    for k, v in r["goals"].items():
        out.append(f"goal {k}: {'met' if v else 'NOT met'}")
    for step, p in m.get("profile", {}).items():
        top = ", ".join(f"{k} {v['s'] * 1e3:.2f} ms/{v['calls']}" for k, v in list(p["ops"].items())[:6])
        out.append(f"profile {step} ({p['total_s'] * 1e3:.1f} ms with syncs): {top}")
    return "\n".join(out)
