"""Write the embedded tiny Qwen3.5-layout model (harness/models/tiny-q35): fixed seed, random
weights rounded to bf16 and stored as BF16, MTP head.

    python tools/make_tiny_q35.py [--out harness/models/tiny-q35]

Qwen3.5-MoE text layout (``model_type`` ``qwen3_5_moe_text``): separate DeltaNet projections,
per-expert MoE weights with a shared expert in every layer, conv kernel 3, odd
head counts, partial rotary 0.25 with an ``mrope_section`` (ordinary rope for text-only
positions), one MTP layer. Rerunning it reproduces the committed files.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from harness.engine.config import ModelConfig  # noqa: E402
from harness.engine.weights import save_checkpoint  # noqa: E402
from harness.synth import random_tensors  # noqa: E402
from harness.tokenizer import VOCAB_SIZE  # noqa: E402

SEED = 20261201

TINY_Q35 = dict(
    model_type="qwen3_5_moe_text", vocab_size=VOCAB_SIZE, hidden_size=48, num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_conv_kernel_dim=3,
    num_attention_heads=3, num_key_value_heads=1, head_dim=16,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    rms_norm_eps=1e-6, num_experts=5, num_experts_per_tok=2, moe_intermediate_size=24,
    shared_expert_intermediate_size=32, tie_word_embeddings=False,
    mtp_num_hidden_layers=1, max_position_embeddings=8192,
)

CARD = """# tiny-q35 — an embedded Qwen3.5-layout model

Random weights (seed {seed}) rounded to bf16 and stored as BF16, written by
`python tools/make_tiny_q35.py`. Not trained. It runs the Qwen3.5 paths through the whole schedule
matrix (`harness/specs/tiny-q35.toml`): the Qwen3.5-MoE text key layout (separate
`in_proj_qkv` / `in_proj_z` / `in_proj_b` / `in_proj_a`, per-expert weights), bf16 storage,
conv kernel 3, odd head counts, an `mrope_section`.

- hidden 48, 4 layers: 3 gated DeltaNet (1 key / 3 value heads × 16, conv kernel 3) + 1 gated
  attention (3 heads / 1 KV head × 16, partial rotary 0.25, theta 1e7, mrope_section [1, 1, 0])
- MoE in every layer: 5 experts × 24, top-2 (renormalised), shared expert 32; untied lm head
- byte vocabulary (as `tiny`); one MTP layer (`mtp.*`, MoE like the trunk)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "harness", "models", "tiny-q35"))
    args = ap.parse_args()
    cfg = ModelConfig.from_dict(TINY_Q35)
    save_checkpoint(args.out, cfg, random_tensors(cfg, SEED), dtype="bfloat16")
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(CARD.format(seed=SEED))
    print(f"wrote {os.path.normpath(args.out)}")


if __name__ == "__main__":
    main()
