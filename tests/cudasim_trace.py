"""Trace mode on the CUDA backend under Numba's simulator, against the CPU engine (run by
tests/test_bisect_cuda.py in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``; prints one ``RESULT``
line of JSON).

A small MoE model (a shared expert, a dense layer, conv kernel 4) primes a 12-token prompt (a
short prime: trunk, setup and MTP fill in one advance) and continues 3 tokens speculatively with
K = 2: untraced and traced on the CPU, traced on CUDA. (The simulator is slow, so CUDA runs
once, traced: traced CUDA equal to untraced CPU, with the CPU's own traced-equals-untraced and
the backends' bitwise contract, says that tracing changes nothing on CUDA. The fault kernel is
checked bitwise with the other ops in cudasim_run.py, and where a fault lands does not depend on
the backend; ``tools/device_run.sh bisect`` runs both on the GPU.)
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cudasim_blocks  # noqa: E402

cudasim_blocks.install()

import numpy as np  # noqa: E402
from numba.core import config  # noqa: E402

assert config.ENABLE_CUDASIM, "the simulator is not on"

from harness.engine.config import ModelConfig  # noqa: E402
from harness.engine.model import Engine  # noqa: E402
from harness.engine.trace import Trace, first_divergence  # noqa: E402
from harness.engine.weights import Checkpoint  # noqa: E402
from harness.synth import random_tensors  # noqa: E402
from harness.walk.mtp_walker import run_prime  # noqa: E402
from harness.walk.speculative import continue_spec  # noqa: E402

MODEL = dict(
    vocab_size=24, hidden_size=20, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=4, linear_value_head_dim=4,
    linear_conv_kernel_dim=4, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    rms_norm_eps=1e-6, intermediate_size=8, num_experts=3, num_experts_per_tok=2, moe_intermediate_size=4,
    shared_expert_intermediate_size=6, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
    tie_word_embeddings=False, num_nextn_predict_layers=1,
)


def run(eng, trace):
    ids = np.random.default_rng(2).integers(0, MODEL["vocab_size"], 12).tolist()
    s = eng.new_session(32)
    s.trace = trace
    prep = run_prime(eng, s, ids, 2).prepared
    gen = continue_spec(eng, s, prep, 3, 2)
    return {"digest": s.cache.digest(), "tokens": [int(t) for t in gen.tokens],
            "logits": prep.logits.view(np.uint32).tolist()}


cfg = ModelConfig.from_dict(MODEL, "simulator model")
ck = Checkpoint(cfg, random_tensors(cfg, seed=11))
ec, eg = Engine(ck, "cpu"), Engine(ck, "cuda")
assert eg.B.name == "cuda"
tc, tg = Trace(ec), Trace(eg)
plain, cpu, traced = run(ec, None), run(ec, tc), run(eg, tg)
kc, hc = tc.table()
kg, hg = tg.table()
print("RESULT " + json.dumps({
    "cpu_traced_equals_untraced": cpu == plain, "cuda_traced_equals_cpu_untraced": traced == plain,
    "same_entries": bool(np.array_equal(kc, kg)), "same_hashes": bool(np.array_equal(hc, hg)),
    "entries": int(kc.size), "first_divergence": first_divergence(tc, tg)["first"]}))
