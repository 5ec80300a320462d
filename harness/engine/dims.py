"""Which config dimension a checkpoint's tensors disagree with.

When tensors are mis-shaped, the cause is almost always one number in ``config.json`` (a
``hidden_size`` of 96 makes every matrix "wrong"). :func:`dimension_mismatches` reads each
dimension back from the tensor that carries it alone (the hidden size from the embedding, the
DeltaNet value heads from ``dt_bias``, the head size from ``q_norm``, …) and names the config
fields whose value differs, so the error says ``hidden_size is 96 in config.json, 64 in the
tensors (model.embed_tokens.weight [260, 64])`` instead of listing every tensor.
"""

from __future__ import annotations

from .config import FULL, LINEAR, ModelConfig


def _first(layer_types: list, kind: str) -> int | None:
    return next((i for i, t in enumerate(layer_types) if t == kind), None)


def inferred_dims(cfg: ModelConfig, tensors: dict) -> dict:
    """``{config field: (value in the tensors, evidence)}`` for every dimension a tensor shows on
    its own; ``evidence`` names the tensor and its shape. Products that the tensors cannot
    separate are keyed by the fields joined with ``×`` (``linear_num_key_heads×linear_key_head_dim``)."""
    out: dict = {}

    def shape(name):
        a = tensors.get(name)
        return tuple(int(x) for x in a.shape) if a is not None else None

    def take(fieldname, name, axis, fn=lambda v, s: v):
        s = shape(name)
        if fieldname in out or s is None or len(s) <= axis:
            return
        value = fn(s[axis], s)
        if value is not None:
            out[fieldname] = (int(value), f"{name} {list(s)}")

    take("vocab_size", "model.embed_tokens.weight", 0)
    take("hidden_size", "model.embed_tokens.weight", 1)
    take("hidden_size", "model.norm.weight", 0)
    g, f = _first(cfg.layer_types, LINEAR), _first(cfg.layer_types, FULL)
    if g is not None:
        p = f"model.layers.{g}.linear_attn."
        take("linear_conv_kernel_dim", p + "conv1d.weight", 1)
        take("linear_num_value_heads", p + "dt_bias", 0)
        take("linear_value_head_dim", p + "norm.weight", 0)
        nv, dv = out.get("linear_num_value_heads"), out.get("linear_value_head_dim")
        if nv and dv:
            v_dim = nv[0] * dv[0]
            take("linear_num_key_heads×linear_key_head_dim", p + "in_proj_qkvz.weight", 0,
                 lambda rows, s: (rows - 2 * v_dim) // 2 if (rows - 2 * v_dim) % 2 == 0 else None)
    for p in ([f"model.layers.{f}.self_attn."] if f is not None else []) + ["mtp.layers.0.self_attn."]:
        take("head_dim", p + "q_norm.weight", 0)
        hd = out.get("head_dim")
        if hd and hd[0] > 0:
            take("num_attention_heads", p + "q_proj.weight", 0,
                 lambda rows, s: rows // (2 * hd[0]) if rows % (2 * hd[0]) == 0 else None)
            take("num_key_value_heads", p + "k_proj.weight", 0,
                 lambda rows, s: rows // hd[0] if rows % hd[0] == 0 else None)
    for i in range(len(cfg.layer_types)):
        p = f"model.layers.{i}.mlp."
        take("intermediate_size", p + "gate_proj.weight", 0)
        take("num_experts", p + "gate.weight", 0)
        take("moe_intermediate_size", p + "experts.gate_proj", 1)
        take("shared_expert_intermediate_size", p + "shared_expert.gate_proj.weight", 0)
    layers = {int(k.split(".")[2]) for k in tensors if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    if layers:
        out["num_hidden_layers"] = (max(layers) + 1, f"tensors of model.layers.0 … {max(layers)}")
    return out


def _config_value(cfg: ModelConfig, fieldname: str) -> int:
    value = 1
    for part in fieldname.split("×"):
        value *= int(getattr(cfg, part))
    return value


def dimension_mismatches(cfg: ModelConfig, tensors: dict) -> list[str]:
    """One phrase per config dimension the tensors disagree with, e.g. ``hidden_size is 96 in
    config.json, 64 in the tensors (model.embed_tokens.weight [260, 64])``; [] when none does."""
    out = []
    for fieldname, (value, evidence) in inferred_dims(cfg, tensors).items():
        want = _config_value(cfg, fieldname)
        if want != value:
            out.append(f"{fieldname} is {want} in config.json, {value} in the tensors ({evidence})")
    return out
