"""Random HF Qwen3-Next and Qwen3.5 models for the oracle tests (tests/test_oracle.py).

Each configuration in :data:`CONFIGS` is small enough that the whole oracle suite runs in well
under two minutes on two CPU cores, and together they cover the variations the reference must get
right:

- ``dense_grouped``: dense SwiGLU, value heads 3x key heads, d_k != d_v, partial rotary 0.5,
  conv kernel 4;
- ``moe_renorm``: MoE with 8 experts, top-2, shared expert, ``norm_topk_prob`` True,
  ``decoder_sparse_step`` 1 with one layer in ``mlp_only_layers`` (the MTP layer, index 0, is MoE);
- ``moe_odd``: MoE without renormalisation, 3 key / 3 value heads, 3 attention heads / 1 KV
  head, conv kernel 3, tied word embeddings, partial rotary 1.0, ``decoder_sparse_step`` 2;
- ``legacy_rope``: the older config style: top-level ``rope_theta`` / ``partial_rotary_factor``
  and ``full_attention_interval`` instead of ``rope_parameters`` / ``layer_types`` (the folder's
  config.json is rewritten that way and HF itself re-reads it);
- ``q35_dense`` (``Qwen3_5ForCausalLM``): separate DeltaNet projections, 3 key / 6 value heads,
  d_k != d_v, conv kernel 3, 3 attention heads / 1 KV head, partial rotary 0.5 with an
  ``mrope_section``, tied word embeddings;
- ``q35_moe`` (``Qwen3_5MoeForCausalLM``): MoE in every layer (6 experts, top-3, always
  renormalised, shared expert), 1 key / 3 value heads, conv kernel 5, 5 attention heads / 1 KV
  head, partial rotary 0.25 (two rotary dims), untied;
- ``q35_vl`` (``Qwen3_5MoeForConditionalGeneration``, a tiny vision tower): the multimodal
  layout — config nested under ``text_config``, tensors under ``model.language_model.``, vision
  tensors beside them — and HF's 3-D (mrope) position ids for a text-only prompt.

Qwen3.5-MoE has no ``norm_topk_prob`` (HF always renormalises), so "MoE without renormalisation"
is ``moe_odd``, a Qwen3-Next config.

Every parameter is drawn from a fixed seed, away from HF's init (norm weights are zeros at init,
``A_log`` / ``dt_bias`` have fixed inits, Linear std 0.02 would make the logits nearly flat).

HF's "float64" model (``model.double()``) is not float64 throughout: the qwen3_next modeling code
casts to float32 in its RMSNorms (``x.float()``), the gated RMSNorm, the gated delta rule
(``.to(torch.float32)``), the decay ``g`` (``A_log.float()``), the router softmax
(``dtype=torch.float``), the eager attention softmax and the RoPE frequencies. As an oracle for a
float64 reference that would measure HF's own float32 rounding, not ours. :func:`hf_float64_module`
therefore compiles a copy of HF's own modeling source with exactly those casts widened to
float64 (nothing else changes), and the float64 oracle runs HF's code through that copy. The
stock ``model.double()`` is still run and reported for information.

How transformers 5 stores MoE experts: in memory fused (``mlp.experts.gate_up_proj`` [E, 2I, H],
gate rows first, and ``mlp.experts.down_proj`` [E, H, I]); ``save_pretrained`` reverts that
conversion and writes per-expert keys (``mlp.experts.{e}.{gate,up,down}_proj.weight``).
:func:`save_fused` writes the in-memory (fused) ``state_dict`` so the loader's fused path is
exercised with HF's own layout as well.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

import transformers
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
from transformers.models.qwen3_next import modeling_qwen3_next

SEED = 20261130
PROMPT_LEN = 40

_LIN, _FULL = "linear_attention", "full_attention"

# config.json dicts (HF names). Keep them small: CI runs all of this on 2 cores.
CONFIGS = {
    "dense_grouped": dict(
        vocab_size=131, hidden_size=32, num_hidden_layers=4,
        layer_types=[_LIN, _FULL, _LIN, _FULL],
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        rms_norm_eps=1e-6, intermediate_size=56, num_experts=0, tie_word_embeddings=False,
    ),
    "moe_renorm": dict(
        vocab_size=97, hidden_size=32, num_hidden_layers=4,
        layer_types=[_LIN, _FULL, _LIN, _FULL],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        rms_norm_eps=1e-6, intermediate_size=40,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[2], tie_word_embeddings=False,
    ),
    "moe_odd": dict(
        vocab_size=101, hidden_size=36, num_hidden_layers=4,
        layer_types=[_LIN, _LIN, _FULL, _LIN],
        linear_num_key_heads=3, linear_num_value_heads=3, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=3,
        num_attention_heads=3, num_key_value_heads=1, head_dim=12,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
        rms_norm_eps=1e-6, intermediate_size=44,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=12,
        shared_expert_intermediate_size=20, norm_topk_prob=False, decoder_sparse_step=2,
        mlp_only_layers=[], tie_word_embeddings=True,
    ),
    # Saved in the old style (see LEGACY_KEYS): the layer types come from full_attention_interval.
    "legacy_rope": dict(
        vocab_size=89, hidden_size=32, num_hidden_layers=4,
        layer_types=[_LIN, _FULL, _LIN, _FULL],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
        rms_norm_eps=1e-5, intermediate_size=48, num_experts=0, tie_word_embeddings=False,
    ),
}
# Qwen3.5 (model_type qwen3_5_text / qwen3_5_moe_text; the multimodal qwen3_5_moe nests it)
_Q35_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
             "mrope_section": [1, 1, 1], "mrope_interleaved": True}
CONFIGS.update({
    "q35_dense": dict(
        model_type="qwen3_5_text", vocab_size=103, hidden_size=36, num_hidden_layers=4,
        layer_types=[_LIN, _FULL, _LIN, _LIN],
        linear_num_key_heads=3, linear_num_value_heads=6, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=3,
        num_attention_heads=3, num_key_value_heads=1, head_dim=12, rope_parameters=_Q35_ROPE,
        rms_norm_eps=1e-6, intermediate_size=44, tie_word_embeddings=True,
    ),
    "q35_moe": dict(
        model_type="qwen3_5_moe_text", vocab_size=89, hidden_size=40, num_hidden_layers=4,
        layer_types=[_LIN, _LIN, _FULL, _FULL],
        linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=16,
        linear_value_head_dim=8, linear_conv_kernel_dim=5,
        num_attention_heads=5, num_key_value_heads=1, head_dim=8,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        rms_norm_eps=1e-6, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=12,
        shared_expert_intermediate_size=20, tie_word_embeddings=False,
    ),
    "q35_vl": dict(
        model_type="qwen3_5_moe", tie_word_embeddings=False,
        text_config=dict(
            vocab_size=97, hidden_size=32, num_hidden_layers=4, layer_types=[_LIN, _FULL, _LIN, _FULL],
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=8, linear_conv_kernel_dim=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                             "mrope_section": [1, 1, 0], "mrope_interleaved": True},
            rms_norm_eps=1e-6, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
            shared_expert_intermediate_size=16, tie_word_embeddings=False),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                           patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                           num_position_embeddings=16),
        # far from the text vocab: no prompt token is an image token
        image_token_id=96, video_token_id=95, vision_start_token_id=94, vision_end_token_id=93,
    ),
})
LEGACY = {"legacy_rope": 2}  # name -> full_attention_interval written instead of layer_types


@dataclass(frozen=True)
class Family:
    """HF's classes for one ``model_type``: the modeling module, the model class the oracle runs,
    its config class, and the class-name prefix of its parts (``<prefix>DecoderLayer`` ...)."""

    module: object
    model: str
    config: str
    prefix: str
    rotary: str
    moe_block: str | None  # the sparse MoE block's class (None: dense only)
    multimodal: bool = False


FAMILIES = {
    "qwen3_next": Family(modeling_qwen3_next, "Qwen3NextForCausalLM", "Qwen3NextConfig", "Qwen3Next",
                         "Qwen3NextRotaryEmbedding", "Qwen3NextSparseMoeBlock"),
    "qwen3_5_text": Family(modeling_qwen3_5, "Qwen3_5ForCausalLM", "Qwen3_5TextConfig", "Qwen3_5",
                           "Qwen3_5TextRotaryEmbedding", None),
    "qwen3_5_moe_text": Family(modeling_qwen3_5_moe, "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", "Qwen3_5Moe",
                               "Qwen3_5MoeTextRotaryEmbedding", "Qwen3_5MoeSparseMoeBlock"),
    "qwen3_5_moe": Family(modeling_qwen3_5_moe, "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeConfig",
                          "Qwen3_5Moe", "Qwen3_5MoeTextRotaryEmbedding", "Qwen3_5MoeSparseMoeBlock", True),
}


def family(name: str) -> Family:
    return FAMILIES[CONFIGS[name].get("model_type", "qwen3_next")]


def text_config(name: str) -> dict:
    """The text model's config dict of ``name`` (its ``text_config`` for a multimodal one)."""
    d = CONFIGS[name]
    return d["text_config"] if family(name).multimodal else d


def text_model(model):
    """The decoder stack of an HF model: ``model.model`` or, multimodal, ``model.model.language_model``."""
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


# ------------------------------------------------------------------------------------------------
# HF's modeling code with its float32 casts widened to float64
# ------------------------------------------------------------------------------------------------
_F64_SUBS = [
    (r"torch\.float32\b", "torch.float64"),
    (r"torch\.float\b", "torch.float64"),  # `torch.float64` itself is not matched (no \b before 64)
    (r"\.float\(\)", ".double()"),
]


@functools.lru_cache(maxsize=None)
def hf_float64_module(hf_mod=modeling_qwen3_next):
    """A copy of HF's modeling module ``hf_mod`` (default
    ``transformers.models.qwen3_next.modeling_qwen3_next``) whose float32 casts are float64 casts.
    Returns the module; its classes are used exactly like HF's."""
    src = inspect.getsource(hf_mod)
    total = 0
    for pat, rep in _F64_SUBS:
        src, n = re.subn(pat, rep, src)
        total += n
    assert total >= 8, f"expected float32 casts in HF's {hf_mod.__name__}, found {total}"
    name = hf_mod.__name__ + "_float64_oracle"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = hf_mod.__package__
    mod.__file__ = hf_mod.__file__
    sys.modules[name] = mod  # typing.get_type_hints (PreTrainedModel.__init_subclass__) looks here
    exec(compile(src, f"{hf_mod.__file__} (float64 oracle copy)", "exec"), mod.__dict__)
    if "AutoModel" in mod.__dict__:  # a multimodal model builds its parts through AutoModel ...
        own = {getattr(c.config_class, "__name__", c.config_class): c for c in vars(mod).values()
               if isinstance(c, type) and c.__name__.endswith(("TextModel", "VisionModel"))}

        class _OwnParts:  # ... which would pick the stock classes: use this copy's
            @staticmethod
            def from_config(config, **kw):
                return own[type(config).__name__]._from_config(config, **kw)

        mod.AutoModel = _OwnParts
    return mod


# ------------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------------
def _eager(cfg, attn: str = "eager"):
    """Eager experts (the grouped-mm path does not do float64) and ``attn`` attention, on the
    config and its text config."""
    for c in {id(cfg): cfg, id(cfg.get_text_config()): cfg.get_text_config()}.values():
        c._experts_implementation = "eager"
        c._attn_implementation = attn
    return cfg


def hf_config(name: str, attn: str = "eager"):
    d = copy.deepcopy(CONFIGS[name])
    d.pop("model_type", None)
    return _eager(getattr(transformers, family(name).config)(**d), attn)


def perturb_(model: torch.nn.Module, seed: int) -> None:
    """Fill every parameter from ``seed``, away from HF's init: matrices ~ N(0, 1/fan_in)
    (embedding N(0, 1)), zero-centred RMSNorm weights ~ N(0, 0.2), the gated norm weight
    ~ 1 + N(0, 0.2), ``A_log = log U(1, 16)``, ``dt_bias ~ U(-1, 1)``, conv ~ N(0, 1/K)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            shape = tuple(p.shape)
            if name.endswith("A_log"):
                v = torch.log(1.0 + 15.0 * torch.rand(shape, generator=g, dtype=torch.float64))
            elif name.endswith("dt_bias"):
                v = 2.0 * torch.rand(shape, generator=g, dtype=torch.float64) - 1.0
            elif name.endswith("linear_attn.norm.weight"):
                v = 1.0 + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
            elif len(shape) == 1:
                v = 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
            elif name.endswith("embed_tokens.weight"):
                v = torch.randn(shape, generator=g, dtype=torch.float64)
            elif name.endswith("conv1d.weight"):  # [C, 1, K]
                v = torch.randn(shape, generator=g, dtype=torch.float64) / math.sqrt(shape[-1])
            else:  # Linear [out, in], experts [E, out, in]: fan_in is the last axis
                v = torch.randn(shape, generator=g, dtype=torch.float64) / math.sqrt(shape[-1])
            p.copy_(v.to(p.dtype))


def _legacy_config_json(path: str, interval: int) -> None:
    """Rewrite a saved config.json in the older style: top-level rope_theta /
    partial_rotary_factor, no rope_parameters, full_attention_interval instead of layer_types."""
    with open(path) as f:
        d = json.load(f)
    rope = d.pop("rope_parameters")
    d["rope_theta"] = rope["rope_theta"]
    d["partial_rotary_factor"] = rope["partial_rotary_factor"]
    types = d.pop("layer_types")
    want = [_LIN if (i + 1) % interval else _FULL for i in range(d["num_hidden_layers"])]
    assert types == want, (types, want)
    d["full_attention_interval"] = interval
    with open(path, "w") as f:
        json.dump(d, f, indent=2)


@dataclass
class OracleModel:
    name: str
    folder: str  # HF save_pretrained output (trunk only)
    hf32: torch.nn.Module  # stock HF, float32
    hf64: torch.nn.Module  # HF's code with float64 internals (hf_float64_module)
    hf64_stock: torch.nn.Module  # stock HF after model.double()
    ids: np.ndarray  # the prompt
    config: dict = field(default_factory=dict)  # config.json as saved

    @property
    def is_moe(self) -> bool:
        return getattr(self.hf32.config.get_text_config(), "num_experts", 0) > 0


def build(name: str, root: str, seed: int = SEED, prompt_len: int = PROMPT_LEN) -> OracleModel:
    """Build, perturb and save (``save_pretrained``, safetensors) the model ``name`` under
    ``root/name``; return it with its float32 / float64 variants and a random prompt."""
    seed = seed + sum(map(ord, name))
    cfg = hf_config(name)
    fam = family(name)
    cls = getattr(transformers, fam.model)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    perturb_(model, seed)
    folder = os.path.join(root, name)
    model.save_pretrained(folder, safe_serialization=True)
    if name in LEGACY:
        _legacy_config_json(os.path.join(folder, "config.json"), LEGACY[name])
        # HF must read the old style the same way: rebuild the HF model from the folder
        model = cls.from_pretrained(folder, dtype=torch.float32).eval()
        model.config._experts_implementation = "eager"
        rp = model.config.rope_parameters
        want = CONFIGS[name]["rope_parameters"]
        assert rp["rope_theta"] == want["rope_theta"], rp
        assert rp["partial_rotary_factor"] == want["partial_rotary_factor"], rp
        assert list(model.config.layer_types) == CONFIGS[name]["layer_types"]
    with open(os.path.join(folder, "config.json")) as f:
        saved = json.load(f)

    m64 = hf_float64_module(fam.module)
    cfg64 = _eager(copy.deepcopy(model.config))
    hf64 = getattr(m64, fam.model)(cfg64).double().eval()
    missing, unexpected = hf64.load_state_dict(
        {k: v.double() for k, v in model.state_dict().items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if cfg64.tie_word_embeddings:
        assert hf64.lm_head.weight.data_ptr() == text_model(hf64).embed_tokens.weight.data_ptr()

    stock = copy.deepcopy(model).double().eval()
    _eager(stock.config)

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.get_text_config().vocab_size, size=prompt_len)
    if fam.multimodal:  # a text-only prompt: no image or video tokens
        special = {cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id}
        ids = np.array([t if t not in special else 0 for t in ids])
    return OracleModel(name, folder, model, hf64, stock, ids, saved)


# ------------------------------------------------------------------------------------------------
# running HF
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def hf_forward(model: torch.nn.Module, ids) -> tuple[np.ndarray, np.ndarray]:
    """(logits [T, V], final normed hidden [T, H]) as float64 numpy. The hidden state is the
    last entry of ``output_hidden_states``, which in transformers 5 is the output of the final
    norm (it equals ``model.model(ids).last_hidden_state``)."""
    x = torch.as_tensor(np.asarray(ids, dtype=np.int64))[None]
    out = model(input_ids=x, output_hidden_states=True, use_cache=False)
    return (out.logits[0].double().numpy(), out.hidden_states[-1][0].double().numpy())


# ------------------------------------------------------------------------------------------------
# checkpoint variants
# ------------------------------------------------------------------------------------------------
def save_fused(model: torch.nn.Module, src_folder: str, dst_folder: str) -> None:
    """Write ``model.state_dict()`` as is (transformers-5 in-memory layout: fused
    ``mlp.experts.gate_up_proj`` / ``mlp.experts.down_proj``) beside ``src_folder``'s config."""
    from safetensors.torch import save_file

    os.makedirs(dst_folder, exist_ok=True)
    shutil.copy(os.path.join(src_folder, "config.json"), os.path.join(dst_folder, "config.json"))
    sd = {k: v.detach().float().contiguous().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd) or not hasattr(model.config, "num_experts")
    save_file(sd, os.path.join(dst_folder, "model.safetensors"), metadata={"format": "pt"})


def add_mtp(src_folder: str, dst_folder: str, mtp_tensors: dict) -> None:
    """Copy ``src_folder`` to ``dst_folder`` adding ``mtp.*`` tensors (internal names, converted
    to file names: experts per expert) to its model.safetensors."""
    from safetensors.numpy import load_file, save_file

    from harness.engine.weights import to_file_tensors

    os.makedirs(dst_folder, exist_ok=True)
    shutil.copy(os.path.join(src_folder, "config.json"), os.path.join(dst_folder, "config.json"))
    t = load_file(os.path.join(src_folder, "model.safetensors"))
    extra = to_file_tensors(mtp_tensors)
    assert all(k.startswith("mtp.") for k in extra) and not set(extra) & set(t)
    t.update({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in extra.items()})
    save_file(t, os.path.join(dst_folder, "model.safetensors"), metadata={"format": "pt"})


__all__ = ["CONFIGS", "LEGACY", "FAMILIES", "Family", "OracleModel", "build", "family", "hf_forward",
           "hf_float64_module", "hf_config", "perturb_", "save_fused", "add_mtp", "text_config", "text_model",
           "transformers"]
