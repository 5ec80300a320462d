"""Write the embedded tiny model (harness/models/tiny): fixed seed, random weights, MTP head.

    python tools/make_tiny.py [--out harness/models/tiny]

d=64, 4 layers (3 gated DeltaNet + 1 gated attention), dense SwiGLU MLP, byte vocabulary
(256 bytes + specials), one MTP layer. Rerunning it reproduces the committed files.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from harness.engine.config import ModelConfig  # noqa: E402
from harness.engine.weights import save_checkpoint  # noqa: E402
from harness.synth import random_tensors  # noqa: E402
from harness.tokenizer import VOCAB_SIZE  # noqa: E402

SEED = 20261129

TINY = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_conv_kernel_dim=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    rms_norm_eps=1e-6, intermediate_size=128, num_experts=0, tie_word_embeddings=False,
    num_nextn_predict_layers=1, max_position_embeddings=8192,
)

CARD = """# tiny — primewalk's embedded default model

Random weights (seed {seed}), written by `python tools/make_tiny.py`. Not trained: drafts are
accepted by chance. Small enough that the CPU schedule matrix runs in CI.

- hidden 64, 4 layers: 3 gated DeltaNet (2 key / 4 value heads × 16, conv kernel 4) + 1 gated
  attention (4 heads / 2 KV heads × 16, partial rotary 0.25, theta 1e4)
- dense SwiGLU MLP 128; zero-centred RMSNorm eps 1e-6; untied lm head
- byte vocabulary: 256 bytes + BOS 256, EOS 257, PAD 258, one spare (260)
- one MTP layer in vLLM's Qwen3-Next layout (`mtp.*`)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "harness", "models", "tiny"))
    args = ap.parse_args()
    cfg = ModelConfig.from_dict(TINY)
    save_checkpoint(args.out, cfg, random_tensors(cfg, SEED))
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(CARD.format(seed=SEED))
    print(f"wrote {os.path.normpath(args.out)}")


if __name__ == "__main__":
    main()
