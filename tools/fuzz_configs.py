#!/usr/bin/env python3
"""Random Qwen3-Next / Qwen3.5 configurations, end to end on the CPU: the whole config space, not
the tests' few models.

    python tools/fuzz_configs.py --seed 1 --n 20 [--out log.jsonl] [--sim | --device [--wide]]

Each configuration is drawn from ``--seed`` (model family Qwen3-Next, Qwen3.5 dense or Qwen3.5
MoE; 2-5 layers of random types; key/value head counts 1-4 with 1-3 value heads per key head;
head dims 4-20; conv kernels 2-6; attention heads in groups of 1-4 per KV head; partial rotary
0.25-1 with mrope sections; MoE with 2-8 experts, top-1..4, with or without renormalisation,
sparse steps and MLP-only layers; tied or untied embeddings; odd hidden sizes). For each:

1. transformers builds it with random weights and saves it (safetensors); its logits, run in
   float64 (``tests/oracle_models.py``: HF's own code with its float32 casts widened), against
   the float64 reference (``numba_kernels.reference``: ``ref_vs_hf64``, max |Δ| / max |logit|)
   and the CPU engine against the reference (``eng_vs_ref``); greedy decode after the prompt,
   ``Engine.decode_greedy``'s chained steps against the ``decode_step`` calls (``greedy_bitwise``);
   ``Engine.mtp_draft``'s chained passes among a random draft vocabulary against the stepwise
   passes (``drafts_bitwise``, on the checkpoint with the MTP head of step 2);
2. a random MTP head is added and ``harness run-matrix`` runs a random spec on it -- three prompt
   lengths (1-200 tokens, one of 64-140, one under 64), split and checkpoint points drawn per
   spec (fractions and a row), random chunk sizes, K, sampling -- in both modes (``exact``,
   ``exact-bf16``): every cell must be bitwise (exit 0);
3. with ``--sim`` (the simulator on: ``NUMBA_ENABLE_CUDASIM=1``, minutes a model): the CUDA engine
   under Numba's simulator against the CPU engine, bit for bit -- a prime, a verify step with
   captures and a rollback, three decode steps (eager, captured, replayed), four chained greedy
   steps (``decode_greedy``: each slot eager, then captured), an MTP row, and a chained K = 3
   draft step among a random draft vocabulary.

With ``--device`` (a CUDA GPU) step 3 runs on the GPU instead of the simulator, in both modes: the
real kernels -- the tensor-core ones of ``exact-bf16`` included, which the simulator replaces by
emulations -- on shapes no test or receipt has (head dims 4-20, odd hidden sizes, conv kernels
2-6), each step's logits and cache digest against the CPU engine. ``--wide`` draws real models'
layer sizes instead (head dims 64-272, hidden sizes 256-2,056, up to 17 query heads a KV head,
primes up to 300 rows).

One JSON line per configuration (``--out``, and printed); exit 1 if any fails. Needs the oracle
extra (torch, transformers); ``--sim`` and ``--device`` run only step 3.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

LIN, FULL = "linear_attention", "full_attention"
REF_TOL = 1e-9  # float64 reference vs HF in float64, of max |logit|: 4e-16-4.1e-14 measured; far above rounding
ENG_TOL = 1e-4  # float32 engine vs the float64 reference, of max |logit|: 2e-7-1.3e-5 measured; harness oracle's default bound


def rand_config(r: random.Random, wide: bool = False) -> dict:
    """An HF config.json dict drawn from ``r`` (see the module docstring). ``wide``: the sizes of
    real models' layers instead of the small ones (``--wide``; the same draws otherwise)."""
    fam = r.choice(["qwen3_next"] * 3 + ["qwen3_5_text", "qwen3_5_moe_text"])
    L = r.randint(2, 5)
    types = [r.choice([LIN, LIN, FULL]) for _ in range(L)]
    if r.random() < 0.85:  # mostly both kinds of layer
        if FULL not in types:
            types[r.randrange(L)] = FULL
        if LIN not in types:
            types[r.randrange(L)] = LIN
    hk = r.randint(1, 4)
    kv = r.randint(1, 3)
    hd = r.choice([64, 96, 128, 256, 272] if wide else [4, 8, 12, 16, 20])
    prf = r.choice([0.25, 0.5, 1.0])
    while int(hd * prf) % 2:
        prf = r.choice([0.5, 1.0])
    rope = {"rope_type": "default", "rope_theta": r.choice([10000.0, 1e6]), "partial_rotary_factor": prf}
    # (small, wide): the sizes drawn; wide ones cross the kernels' thresholds -- head dims past
    # 256 (the split-KV tensor-core kernel's limit), 17 query heads a KV head (two MMA head
    # groups), rows of K % 16 == 8, several 64-key tiles and prime chunks
    z = {"vocab": ((60, 140), (300, 3000)), "hidden": ([16, 24, 30, 32, 36, 40, 44], [256, 264, 520, 1000, 1024, 2056]),
         "dk": ([4, 6, 8, 12, 16], [64, 96, 128]), "dv": ([4, 6, 8, 10, 12], [64, 96, 128]),
         "rep": ([1, 2, 3, 4], [1, 2, 4, 8, 17]), "inter": ([20, 28, 40, 44, 56], [512, 1000, 2048, 2824]),
         "inter_next": ([20, 40], [520, 1024]), "moe": ([8, 12, 16], [128, 264]), "shared": ([8, 16, 20], [256, 520])}
    z = {k: v[1] if wide else v[0] for k, v in z.items()}
    d = dict(vocab_size=r.randint(*z["vocab"]), hidden_size=r.choice(z["hidden"]),
             num_hidden_layers=L, layer_types=types,
             linear_num_key_heads=hk, linear_num_value_heads=hk * r.choice([1, 1, 2, 3]),
             linear_key_head_dim=r.choice(z["dk"]), linear_value_head_dim=r.choice(z["dv"]),
             linear_conv_kernel_dim=r.choice([2, 3, 4, 5, 6]),
             num_attention_heads=kv * r.choice(z["rep"]), num_key_value_heads=kv, head_dim=hd,
             rope_parameters=rope, rms_norm_eps=r.choice([1e-6, 1e-5]), tie_word_embeddings=r.random() < 0.4)
    moe = fam == "qwen3_5_moe_text" or (fam == "qwen3_next" and r.random() < 0.5)
    if fam == "qwen3_5_text" or (fam == "qwen3_next" and not moe):
        d["intermediate_size"] = r.choice(z["inter"])
    if fam == "qwen3_next":
        d["intermediate_size"] = d.get("intermediate_size", r.choice(z["inter_next"]))
        d["num_experts"] = 0
    if moe:
        E = r.randint(2, 8)
        d.update(num_experts=E, num_experts_per_tok=r.randint(1, min(4, E)), moe_intermediate_size=r.choice(z["moe"]),
                 shared_expert_intermediate_size=r.choice(z["shared"]))
        if fam == "qwen3_next":
            d.update(norm_topk_prob=r.random() < 0.5, decoder_sparse_step=r.randint(1, 2),
                     mlp_only_layers=sorted(r.sample(range(L), r.randint(0, 1))))
    if fam != "qwen3_next":
        d["model_type"] = fam
        half = int(hd * prf) // 2
        a = r.randint(0, half)
        b = r.randint(0, half - a)
        rope.update(mrope_section=[a, b, half - a - b], mrope_interleaved=True)
    return d


def rand_spec(r: random.Random, model: str) -> str:
    """A matrix spec (TOML) on ``model`` with random prompts, points, chunking, K and sampling."""
    lens = sorted({r.randint(1, 200) for _ in range(2)} | {r.randint(64, 140)} | {r.randint(1, 63)})
    absrow = ""
    for _ in range(50):  # a row that leaves 32 rows after it in every prompt it splits
        row = r.randint(32, max(32, max(lens) - 32))
        if all(row >= T or T - row >= 32 for T in lens):
            absrow = f", {row}"
            break
    return f"""backend = "cpu"
max_new_tokens = {r.randint(2, 9)}
chunk_rows = {r.choice([8, 16, 48, 64])}
fill_chunk = {r.choice([8, 16, 32, 64])}
k = [{r.randint(1, 2)}, {r.randint(3, 4)}]
sampling = [{{ temperature = 0.0, seed = 0 }}, {{ temperature = 0.8, seed = {r.randint(0, 99)} }}]
variants = ["unyielded", "tokenwise", {{ name = "batched", chunk_rows = [{r.randint(1, 20)}, {r.randint(21, 150)}] }},
  {{ name = "split", at = [{r.uniform(0.01, 0.99):.3f}{absrow}] }}, {{ name = "checkpoint", at = [{r.uniform(0.01, 0.99):.3f}] }},
  {{ name = "split+checkpoint", split = {r.uniform(0.01, 0.99):.3f}, checkpoint = {r.uniform(0.01, 0.99):.3f} }},
  "short", "yielded-with-peer", {{ name = "yielded-with-peer", split = 0.5, checkpoint = 0.5 }}]
[models]
m = "{model}"
[[prompts]]
kind = "synthetic"
lengths = {lens}
seed = {r.randint(0, 9)}
"""


def cpu_case(r, seed, root) -> dict:
    import numpy as np

    import oracle_models as om
    from harness.engine.model import Engine
    from harness.engine.weights import load_checkpoint, save_checkpoint
    from harness.gpu.bench import chained_equals_stepwise, drafts_chained_equal_stepwise, with_mtp_head
    from numba_kernels.reference import RefModel

    name = f"fz{seed}"
    d = rand_config(r)
    om.CONFIGS[name] = d
    rec = {"config": d}
    m = om.build(name, root, seed=seed, prompt_len=r.randint(5, 50))
    ck = load_checkpoint(m.folder)
    ref = RefModel(ck.config, ck.tensors).forward(m.ids)[0]
    hf64, _ = om.hf_forward(m.hf64, m.ids)
    scale = float(np.abs(hf64).max())
    rec["ref_vs_hf64"] = float(np.abs(ref - hf64).max()) / scale
    eng = Engine(ck, "cpu")
    ours = np.asarray(eng.target_step(eng.new_session(len(m.ids)), m.ids)[0], np.float64)
    rec["eng_vs_ref"] = float(np.abs(ours - ref).max()) / scale
    ck2 = with_mtp_head(load_checkpoint(m.folder), seed + 1)
    mt = os.path.join(root, name + "_mtp")
    save_checkpoint(mt, ck2.config, ck2.tensors)
    spec = os.path.join(root, name + ".toml")
    with open(spec, "w") as f:
        f.write(rand_spec(r, mt))
    # greedy decode after the prompt: Engine.decode_greedy's chained steps (the pick on the
    # device's op, here its twin) bitwise the decode_step calls they stand for
    def primed():
        s = eng.new_session(len(m.ids) + 5)
        eng.target_step(s, m.ids[:-1])
        return s
    rec["greedy_bitwise"] = chained_equals_stepwise(eng, primed, 5, int(m.ids[-1]))
    # MTP drafts among a random draft vocabulary: the chained passes bitwise the stepwise ones
    V = ck2.config.vocab_size
    e2 = Engine(ck2, "cpu", draft_vocab=r.sample(range(V), r.randint(1, V)))
    s2 = e2.new_session(len(m.ids) + 8)
    e2.target_step(s2, m.ids)
    rec["drafts_bitwise"] = drafts_chained_equal_stepwise(e2, s2, s2.cache.snapshot(), r.randint(1, 4))
    ok = (rec["ref_vs_hf64"] <= REF_TOL and rec["eng_vs_ref"] <= ENG_TOL and rec["greedy_bitwise"]
          and rec["drafts_bitwise"])
    for mode in ("exact", "exact-bf16"):
        p = subprocess.run([sys.executable, "-m", "harness.cli", "run-matrix", "--spec", spec, "--mode", mode,
                            "--no-plots", "--quiet", "--out", os.path.join(root, f"{name}_{mode}.json")],
                           cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        rec[mode] = {"rc": p.returncode, "summary": lines[-1] if lines else ""}
        ok &= p.returncode == 0
    rec["ok"] = bool(ok)
    return rec


def engine_case(r, seed, modes=("exact",), wide=False) -> dict:
    """Step 3 (``--sim``) or its run on a GPU (``--device``): the CUDA engine against the CPU
    engine, bit for bit, in each of ``modes`` (the same configuration, weights and steps);
    ``wide``: rand_config's wide sizes and primes up to 300 rows."""
    import numpy as np

    from harness.engine.config import ModelConfig
    from harness.engine.model import Engine
    from harness.engine.weights import Checkpoint
    from harness.synth import random_tensors
    from step_compare import model_step

    d = dict(rand_config(r, wide), num_nextn_predict_layers=1)
    rec = {"config": d}
    cfg = ModelConfig.from_dict(d, "fuzz")
    ck = Checkpoint(cfg, random_tensors(cfg, seed=seed))
    P, R = r.randint(3, 300 if wide else 70), r.randint(2, 8)
    keep = r.randint(1, R)  # verify rows the rollback keeps
    vocab = r.sample(range(cfg.vocab_size), r.randint(1, cfg.vocab_size))  # the draft vocabulary
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, P + R + 3)
    # room for the prime, the verify rows, three decodes, four greedy steps and a K = 3 draft
    # after a rollback that kept every verify row
    cap = P + R + 3 + 4 + 3
    steps = []
    for mode in modes:
        ec, eg = Engine(ck, "cpu", mode=mode), Engine(ck, "cuda", mode=mode)
        sc, sg = ec.new_session(cap), eg.new_session(cap)
        tag = f"{mode} " if len(modes) > 1 else ""

        def step(name, rows, f):
            steps.append(model_step(tag + name, rows, f, ec, sc, eg, sg))

        step(f"prime R{P}", P, lambda e, s: e.prime_chunk(s, ids[:P]))
        step(f"verify R{R}", R, lambda e, s: e.target_step(s, ids[P:P + R], capture=True))
        ec.rollback(sc, keep)
        eg.rollback(sg, keep)
        steps.append(dict(step=f"{tag}rollback {keep}", rows=None, kernels=[], logits_bitwise=None,
                          digest_equal=sc.cache.digest() == sg.cache.digest()))
        for j in range(3):
            step(f"decode {j}", 1, lambda e, s: e.decode_step(s, int(ids[P + keep + j])))
        step("greedy n4", 1, lambda e, s: (e.decode_greedy(s, int(ids[0]), 4, keep_logits=True)[1],))
        h = np.random.default_rng(seed).standard_normal((1, cfg.hidden_size)).astype(np.float32)
        step("mtp row", 1, lambda e, s: e.mtp_rows(s, [int(ids[1])], h if e is ec else e.B.upload(h), 0,
                                                   logits_rows=1))
        # chained MTP drafts among a random draft vocabulary (a first pass of two rows, K = 3)
        ec.set_draft_vocab(vocab)
        eg.set_draft_vocab(vocab)
        h2 = np.random.default_rng(seed + 1).standard_normal((2, cfg.hidden_size)).astype(np.float32)

        def drafts(e, s):
            s.cache.mtp_len = s.cache.pos - 1
            return (np.array(e.mtp_draft(s, [int(ids[2]), int(ids[3])], h2 if e is ec else e.B.upload(h2), 3)),)

        step("drafts K3 (draft vocabulary)", 2, drafts)
    rec["steps"] = steps
    rec["ok"] = all(x["logits_bitwise"] in (None, True) and x["digest_equal"] for x in steps)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="the first configuration's seed (default 0)")
    ap.add_argument("--n", type=int, default=10, help="configurations (seeds seed .. seed + n - 1; default 10)")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    ap.add_argument("--sim", action="store_true",
                    help="the CUDA engine under Numba's simulator against the CPU engine (NUMBA_ENABLE_CUDASIM=1)")
    ap.add_argument("--device", action="store_true",
                    help="step 3 on the GPU: the CUDA engine against the CPU engine in both modes (exact, exact-bf16)")
    ap.add_argument("--wide", action="store_true",
                    help="with --device: real models' layer sizes (head dims 64-272, hidden 256-2,056, up to 17 "
                         "query heads a KV head, primes up to 300 rows)")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("--n must be at least 1")
    if args.sim and args.device:
        ap.error("--sim and --device are two runs of the same step: pick one")
    if args.wide and not args.device:
        ap.error("--wide runs with --device only (the simulator and the CPU oracle would take hours a model)")
    if args.device:
        from numba import cuda

        if not cuda.is_available():
            ap.error("--device needs a CUDA GPU (none is visible here); --sim runs the same step under the simulator")
    if args.sim:
        from numba.core import config

        if not config.ENABLE_CUDASIM:
            ap.error("--sim needs NUMBA_ENABLE_CUDASIM=1 in the environment (set before numba is imported)")
        import cudasim_blocks  # the simulator tests' block scheduler: one simulated thread at a time

        cudasim_blocks.install()
    modes = ("exact",) if args.sim else ("exact", "exact-bf16")  # step 3's modes (--sim, --device)
    kind = "sim" if args.sim else "device-wide" if args.wide else "device" if args.device else "cpu"
    bad = 0
    with tempfile.TemporaryDirectory() as root:
        for seed in range(args.seed, args.seed + args.n):
            r = random.Random(seed)
            t0 = time.perf_counter()
            try:
                rec = cpu_case(r, seed, root) if kind == "cpu" else engine_case(r, seed, modes, args.wide)
            except Exception:  # noqa: BLE001  (a failure is a finding: recorded, the run goes on)
                rec = {"ok": False, "exception": traceback.format_exc()[-3000:]}
            rec = {"seed": seed, "kind": kind, "s": round(time.perf_counter() - t0, 1), **rec}
            bad += not rec["ok"]
            line = json.dumps(rec)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(line + "\n")
    print(f"fuzz_configs: {args.n - bad}/{args.n} configurations pass", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
