"""A user's own checkpoint, as a test builds it: a small random Qwen3-Next (MTP head, tied
embeddings, conv kernel 3, one key head shared by three value heads, odd attention heads, partial
rotary 0.5, a MoE layer without top-k renormalisation) saved as safetensors, with its own
``tokenizer.json`` -- a byte-level BPE trained here with HF ``tokenizers`` on a few sentences --
and a ``tokenizer_config.json`` naming the special tokens."""

from __future__ import annotations

import json
import os

from harness.engine.config import ModelConfig
from harness.engine.weights import save_checkpoint
from harness.synth import random_tensors

VOCAB = 320  # the model's embedding rows; the tokenizer uses fewer (padded, as Qwen's are)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A prime walker advances one chunk at a time and yields to a peer between chunks.",
    "Receipts record the digests of every logit and every state plane.",
    "def main(argv=None):\n    return 0\n",
    "Speculative decoding drafts tokens with the multi-token-prediction head and verifies them.",
    "Gated DeltaNet layers keep a recurrent state; attention layers keep keys and values.",
]
# A text prompt long enough (after BPE) for a split at 0.5 to apply (>= 64 tokens).
LONG_TEXT = CORPUS[1] + " " + CORPUS[2]

CONFIG = dict(
    vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=16,
    linear_value_head_dim=8, linear_conv_kernel_dim=3,
    num_attention_heads=3, num_key_value_heads=1, head_dim=16,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    rms_norm_eps=1e-6, intermediate_size=40, num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=16, shared_expert_intermediate_size=24, norm_topk_prob=False,
    decoder_sparse_step=2, tie_word_embeddings=True, num_nextn_predict_layers=1,
    max_position_embeddings=4096, model_type="qwen3_next",
)


def train_tokenizer(vocab_size: int = 300, corpus=CORPUS):
    """A byte-level BPE (GPT-2 / Qwen style) trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


def write_tokenizer(folder: str, tok, config: dict | None = None) -> None:
    tok.save(os.path.join(folder, "tokenizer.json"))
    conf = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
            "add_bos_token": False} if config is None else config
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(conf, f)


def build(folder: str, seed: int = 7, tokenizer: bool = True, mtp: bool = True, vocab_size: int = 300):
    """Write the checkpoint (and, with ``tokenizer``, its tokenizer files) to ``folder``; returns
    the trained ``tokenizers.Tokenizer`` (or None)."""
    cfg = ModelConfig.from_dict(dict(CONFIG, num_nextn_predict_layers=1 if mtp else 0))
    save_checkpoint(folder, cfg, random_tensors(cfg, seed=seed, mtp=mtp))
    if not tokenizer:
        return None
    tok = train_tokenizer(vocab_size)
    write_tokenizer(folder, tok)
    return tok
