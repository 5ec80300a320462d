"""Random HF ``Qwen3NextForCausalLM`` models for the oracle tests (tests/test_oracle.py).

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
  config.json is rewritten that way and HF itself re-reads it).

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
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
from transformers.models.qwen3_next import modeling_qwen3_next as hf_mod

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
LEGACY = {"legacy_rope": 2}  # name -> full_attention_interval written instead of layer_types


# ------------------------------------------------------------------------------------------------
# HF's modeling code with its float32 casts widened to float64
# ------------------------------------------------------------------------------------------------
_F64_SUBS = [
    (r"torch\.float32\b", "torch.float64"),
    (r"torch\.float\b", "torch.float64"),  # `torch.float64` itself is not matched (no \b before 64)
    (r"\.float\(\)", ".double()"),
]


@functools.lru_cache(maxsize=None)
def hf_float64_module():
    """A copy of ``transformers.models.qwen3_next.modeling_qwen3_next`` whose float32 casts are
    float64 casts. Returns the module; its classes are used exactly like HF's."""
    src = inspect.getsource(hf_mod)
    total = 0
    for pat, rep in _F64_SUBS:
        src, n = re.subn(pat, rep, src)
        total += n
    assert total >= 8, f"expected float32 casts in HF's qwen3_next code, found {total}"
    name = hf_mod.__name__ + "_float64_oracle"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = hf_mod.__package__
    mod.__file__ = hf_mod.__file__
    sys.modules[name] = mod  # typing.get_type_hints (PreTrainedModel.__init_subclass__) looks here
    exec(compile(src, f"{hf_mod.__file__} (float64 oracle copy)", "exec"), mod.__dict__)
    return mod


# ------------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------------
def hf_config(name: str, attn: str = "eager") -> Qwen3NextConfig:
    d = copy.deepcopy(CONFIGS[name])
    cfg = Qwen3NextConfig(**d)
    cfg._experts_implementation = "eager"  # the grouped-mm path does not do float64
    cfg._attn_implementation = attn
    return cfg


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
        return self.hf32.config.num_experts > 0


def build(name: str, root: str, seed: int = SEED, prompt_len: int = PROMPT_LEN) -> OracleModel:
    """Build, perturb and save (``save_pretrained``, safetensors) the model ``name`` under
    ``root/name``; return it with its float32 / float64 variants and a random prompt."""
    seed = seed + sum(map(ord, name))
    cfg = hf_config(name)
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(cfg).eval()
    perturb_(model, seed)
    folder = os.path.join(root, name)
    model.save_pretrained(folder, safe_serialization=True)
    if name in LEGACY:
        _legacy_config_json(os.path.join(folder, "config.json"), LEGACY[name])
        # HF must read the old style the same way: rebuild the HF model from the folder
        model = Qwen3NextForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        model.config._experts_implementation = "eager"
        rp = model.config.rope_parameters
        want = CONFIGS[name]["rope_parameters"]
        assert rp["rope_theta"] == want["rope_theta"], rp
        assert rp["partial_rotary_factor"] == want["partial_rotary_factor"], rp
        assert list(model.config.layer_types) == CONFIGS[name]["layer_types"]
    with open(os.path.join(folder, "config.json")) as f:
        saved = json.load(f)

    m64 = hf_float64_module()
    cfg64 = copy.deepcopy(model.config)
    cfg64._experts_implementation = "eager"
    cfg64._attn_implementation = "eager"
    hf64 = m64.Qwen3NextForCausalLM(cfg64).double().eval()
    missing, unexpected = hf64.load_state_dict(
        {k: v.double() for k, v in model.state_dict().items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if cfg64.tie_word_embeddings:
        assert hf64.lm_head.weight.data_ptr() == hf64.model.embed_tokens.weight.data_ptr()

    stock = copy.deepcopy(model).double().eval()
    stock.config._experts_implementation = "eager"

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, size=prompt_len)
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
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd) or model.config.num_experts == 0
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


__all__ = ["CONFIGS", "LEGACY", "OracleModel", "build", "hf_forward", "hf_float64_module",
           "hf_config", "perturb_", "save_fused", "add_mtp", "transformers"]
