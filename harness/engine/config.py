"""Model configuration: an HF ``Qwen3NextConfig`` or Qwen3.5 text config as a dataclass.

Field names follow HF so real ``config.json`` files load unchanged. Both the current
``rope_parameters: {rope_theta, partial_rotary_factor}`` and the older top-level ``rope_theta`` /
``partial_rotary_factor`` are accepted. :meth:`ModelConfig.validate` names the first problem in
one line (raised as :class:`~harness.errors.ConfigError`).

Families (``model_type``):

- ``qwen3_next``: HF ``Qwen3NextConfig``; MoE on the layers ``decoder_sparse_step`` /
  ``mlp_only_layers`` select; the MTP depth is ``num_nextn_predict_layers``.
- ``qwen3_5_text`` (dense) and ``qwen3_5_moe_text``: HF ``Qwen3_5TextConfig`` /
  ``Qwen3_5MoeTextConfig``. The multimodal ``qwen3_5`` / ``qwen3_5_moe`` configs nest the text
  model under ``text_config`` (read from there; the vision config is ignored). As in HF, the dense
  family has no experts and the MoE family puts MoE (always renormalised, with the shared expert)
  in every layer, the MTP layer included; the MTP depth is ``mtp_num_hidden_layers``. Their rope
  carries ``mrope_section`` / ``mrope_interleaved``: for text-only positions (the three position
  ids equal) that is ordinary rope over the rotary dims, which is what primewalk computes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from ..errors import ConfigError

LINEAR = "linear_attention"
FULL = "full_attention"
QWEN3_NEXT = "qwen3_next"
QWEN3_5_TEXT, QWEN3_5_MOE_TEXT = "qwen3_5_text", "qwen3_5_moe_text"
MULTIMODAL = {"qwen3_5": QWEN3_5_TEXT, "qwen3_5_moe": QWEN3_5_MOE_TEXT}  # outer type -> its text_config's
MODEL_TYPES = (QWEN3_NEXT, QWEN3_5_TEXT, QWEN3_5_MOE_TEXT, *MULTIMODAL)
ROPE_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"}


@dataclass
class ModelConfig:
    vocab_size: int = 151936
    hidden_size: int = 2048
    num_hidden_layers: int = 48
    layer_types: list = field(default_factory=list)  # per layer: "linear_attention" | "full_attention"
    # gated DeltaNet (linear attention) layers
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32  # a multiple of the key heads; value heads share key heads in groups
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4  # causal depthwise conv over q‖k‖v; state = last kernel-1 inputs
    # gated full-attention layers
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int = 256
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25  # RoPE on the first int(head_dim * factor) dims of each head
    rms_norm_eps: float = 1e-6
    # MLP: dense SwiGLU, or MoE on layers selected by decoder_sparse_step / mlp_only_layers
    intermediate_size: int = 5632
    num_experts: int = 512  # HF default; 0 = dense MLP everywhere
    num_experts_per_tok: int = 10
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list = field(default_factory=list)
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 1  # MTP depth (vLLM's Qwen3-Next head); 0 = trunk only
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    model_type: str = "qwen3_next"  # qwen3_next | qwen3_5_text | qwen3_5_moe_text (multimodal: its text type)
    # Qwen3.5's multimodal rope, kept to write the config back; for text-only positions it is
    # ordinary rope over the rotary dims (see the module docstring)
    mrope_section: list | None = None
    mrope_interleaved: bool | None = None

    # ---- derived ---------------------------------------------------------------------------
    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def v_per_k(self) -> int:
        return self.linear_num_value_heads // self.linear_num_key_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer_idx: int) -> bool:
        """HF's rule: MoE unless listed in mlp_only_layers, when experts exist and
        (layer_idx + 1) % decoder_sparse_step == 0. The MTP layer uses layer index 0 (vLLM)."""
        return (
            layer_idx not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    @property
    def gdn_layers(self) -> list:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR]

    @property
    def attn_layers(self) -> list:
        return [i for i, t in enumerate(self.layer_types) if t == FULL]

    @property
    def has_mtp(self) -> bool:
        return self.num_nextn_predict_layers > 0

    @property
    def is_qwen3_5(self) -> bool:
        """Qwen3.5 layout: separate DeltaNet projections ``in_proj_qkv`` / ``in_proj_z`` /
        ``in_proj_b`` / ``in_proj_a`` (Qwen3-Next fuses and interleaves them)."""
        return self.model_type in (QWEN3_5_TEXT, QWEN3_5_MOE_TEXT)

    # ---- io --------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> "ModelConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        d = _text_config(d, source)
        mt = d.get("model_type", QWEN3_NEXT)
        rope = d.pop("rope_parameters", None) or d.pop("rope_scaling", None)
        if rope is not None:
            if not isinstance(rope, dict):
                raise ConfigError(f"{source}: rope_parameters must be an object")
            rtype = rope.get("rope_type", rope.get("type", "default"))
            if rtype != "default":
                raise ConfigError(f"{source}: rope_type {rtype!r} is not supported (only 'default')")
            for k in ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"):
                if k in rope:
                    d[k] = rope[k]
        if mt != QWEN3_NEXT:
            _qwen3_5_fields(d, mt, source)
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for k in ("mlp_only_layers", "num_nextn_predict_layers", "mrope_section", "mrope_interleaved"):
            if kw.get(k) is None:
                kw.pop(k, None)
        if d.get("attention_bias"):
            raise ConfigError(f"{source}: attention_bias is true; only bias-free attention is supported")
        cfg = cls(**kw)
        if not cfg.layer_types:
            interval = int(d.get("full_attention_interval", 4))
            cfg.layer_types = [
                LINEAR if (i + 1) % interval else FULL for i in range(cfg.num_hidden_layers)
            ]
        cfg.validate(source)
        return cfg

    @classmethod
    def from_json(cls, path: str) -> "ModelConfig":
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read ({e})") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(d, source=path)

    def to_dict(self) -> dict:
        """The config as HF writes it (``config.json``): Qwen3-Next keys, or for the Qwen3.5
        family the text config's own keys (``mtp_num_hidden_layers``, no unused MoE keys)."""
        d = dataclasses.asdict(self)
        rope = {
            "rope_type": "default",
            "rope_theta": d.pop("rope_theta"),
            "partial_rotary_factor": d.pop("partial_rotary_factor"),
        }
        for k in ("mrope_section", "mrope_interleaved"):
            v = d.pop(k)
            if v is not None:
                rope[k] = v
        d["rope_parameters"] = rope
        if self.is_qwen3_5:
            d["mtp_num_hidden_layers"] = d.pop("num_nextn_predict_layers")
            for k in ("decoder_sparse_step", "mlp_only_layers", "norm_topk_prob"):
                d.pop(k)
            if self.model_type == QWEN3_5_MOE_TEXT:
                d.pop("intermediate_size")
            else:
                for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                          "shared_expert_intermediate_size"):
                    d.pop(k)
        return d

    def save(self, path: str) -> None:
        from ..atomic import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    # ---- validation ------------------------------------------------------------------------
    def validate(self, source: str = "config") -> None:
        def bad(msg):
            raise ConfigError(f"{source}: {msg}")

        ints = [
            "vocab_size", "hidden_size", "num_hidden_layers", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "decoder_sparse_step",
        ]
        for name in ints:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(f"{name} must be a positive integer, got {v!r}")
        for name in ["num_experts", "num_experts_per_tok", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "num_nextn_predict_layers"]:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                bad(f"{name} must be a non-negative integer, got {v!r}")
        if self.hidden_act != "silu":
            bad(f"hidden_act {self.hidden_act!r} is not supported (only 'silu')")
        if not isinstance(self.layer_types, list) or len(self.layer_types) != self.num_hidden_layers:
            bad(f"layer_types has {len(self.layer_types) if isinstance(self.layer_types, list) else '?'} "
                f"entries, num_hidden_layers is {self.num_hidden_layers}")
        for i, t in enumerate(self.layer_types):
            if t not in (LINEAR, FULL):
                bad(f"layer_types[{i}] is {t!r}, expected 'linear_attention' or 'full_attention'")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            bad(f"linear_num_value_heads ({self.linear_num_value_heads}) is not a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})")
        if self.num_attention_heads % self.num_key_value_heads:
            bad(f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if not (0.0 < float(self.partial_rotary_factor) <= 1.0):
            bad(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")
        if float(self.rope_theta) <= 0:
            bad(f"rope_theta must be positive, got {self.rope_theta}")
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            bad(f"rotary dim int(head_dim * partial_rotary_factor) = {self.rotary_dim} must be even "
                f"and at least 2 (head_dim {self.head_dim}, factor {self.partial_rotary_factor})")
        if not (0.0 < float(self.rms_norm_eps) < 1.0):
            bad(f"rms_norm_eps must be in (0, 1), got {self.rms_norm_eps}")
        if not isinstance(self.mlp_only_layers, list) or any(
            not isinstance(i, int) for i in self.mlp_only_layers
        ):
            bad("mlp_only_layers must be a list of layer indices")
        if self.model_type == QWEN3_5_MOE_TEXT and self.num_experts < 1:
            bad("num_experts must be positive for model_type 'qwen3_5_moe_text'")
        if self.num_experts > 0:
            if not (1 <= self.num_experts_per_tok <= self.num_experts):
                bad(f"num_experts_per_tok ({self.num_experts_per_tok}) must be in 1..num_experts "
                    f"({self.num_experts})")
            if self.moe_intermediate_size < 1:
                bad("moe_intermediate_size must be positive when num_experts > 0")
        if self.mrope_section is not None and (
                not isinstance(self.mrope_section, list) or len(self.mrope_section) != 3
                or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in self.mrope_section)):
            bad(f"rope_parameters.mrope_section must be three non-negative integers (t, h, w), "
                f"got {self.mrope_section!r}")
        if self.mrope_interleaved is not None and not isinstance(self.mrope_interleaved, bool):
            bad(f"rope_parameters.mrope_interleaved must be true or false, got {self.mrope_interleaved!r}")
        if self.num_nextn_predict_layers > 1:
            bad(f"num_nextn_predict_layers = {self.num_nextn_predict_layers}: only one MTP layer "
                "is supported")
        self.rope_theta = float(self.rope_theta)
        self.partial_rotary_factor = float(self.partial_rotary_factor)
        self.rms_norm_eps = float(self.rms_norm_eps)


# ------------------------------------------------------------------------------------------------
# Qwen3.5
# ------------------------------------------------------------------------------------------------
def _text_config(d: dict, source: str) -> dict:
    """The text model's config: ``d`` itself, or for a multimodal Qwen3.5 config its
    ``text_config`` (the vision config is ignored). ``tie_word_embeddings`` is the outer
    config's where it has one (HF's ``Qwen3_5ForConditionalGeneration`` ties by it)."""
    mt = d.get("model_type", QWEN3_NEXT)
    if mt not in MODEL_TYPES:
        raise ConfigError(f"{source}: model_type is {mt!r}, expected one of "
                          + ", ".join(repr(m) for m in MODEL_TYPES))
    if mt not in MULTIMODAL:
        return dict(d)
    text = d.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"{source}: model_type {mt!r} nests the text model under text_config, "
                          "which is missing or not an object")
    out = dict(text)
    want = MULTIMODAL[mt]
    if out.setdefault("model_type", want) != want:
        raise ConfigError(f"{source}: text_config.model_type is {out['model_type']!r}, expected {want!r} "
                          f"inside a {mt!r} config")
    outer, inner = d.get("tie_word_embeddings"), text.get("tie_word_embeddings")
    if outer is not None and inner is not None and bool(outer) != bool(inner):
        raise ConfigError(f"{source}: tie_word_embeddings is {outer} but text_config.tie_word_embeddings "
                          f"is {inner}; transformers ties by the first and vLLM by the second")
    if outer is not None:
        out["tie_word_embeddings"] = outer
    return out


def _qwen3_5_fields(d: dict, mt: str, source: str) -> None:
    """Qwen3.5 text config -> this dataclass's fields, in place: the MTP depth, which layers are
    MoE (none, or all), and the settings HF's Qwen3.5 code does not have (refused, not ignored)."""
    def refuse(msg):
        raise ConfigError(f"{source}: {msg}")

    n_mtp = d.pop("mtp_num_hidden_layers", None)
    if n_mtp is not None:
        if d.get("num_nextn_predict_layers", n_mtp) != n_mtp:
            refuse(f"mtp_num_hidden_layers ({n_mtp}) and num_nextn_predict_layers "
                   f"({d['num_nextn_predict_layers']}) disagree")
        d["num_nextn_predict_layers"] = n_mtp
    if d.get("mtp_use_dedicated_embeddings"):
        refuse("mtp_use_dedicated_embeddings is true; only an MTP head that shares the trunk's "
               "embedding is supported")
    if d.get("layer_scale"):
        refuse("layer_scale is true; per-layer output scales are not supported")
    if mt == QWEN3_5_TEXT:
        d["num_experts"] = 0  # dense: HF's Qwen3.5 text model has no experts
    else:
        if d.get("norm_topk_prob") is False:
            refuse("norm_topk_prob is false, but transformers' Qwen3.5-MoE always renormalises the "
                   "top-k router weights (vLLM follows the flag); primewalk will not pick one silently")
        d.update(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])  # MoE in every layer
