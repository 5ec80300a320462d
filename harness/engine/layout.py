"""HF checkpoint tensors → the engine's fused buffers, re-arranged once at load.

The layout changes no output's arithmetic: the DeltaNet's projections become ``q‖k‖v‖z`` /
``b‖a`` (Qwen3-Next's per-key-head interleaved ``in_proj_qkvz``/``in_proj_ba`` rows regrouped;
Qwen3.5's separate ``in_proj_qkv``, ``in_proj_z`` and ``in_proj_b``, ``in_proj_a`` stacked), attention's
per-head ``query‖gate`` rows are regrouped into ``queries‖gates`` (with K and V rows appended), and SwiGLU's
gate and up rows stacked — each output is still one canonical dot product of its own weight row,
so both families run the same kernels.

:func:`prepare_weights` uploads everything a forward pass reads; each layer is a dict of backend
arrays (:func:`prepare_layer` says which keys each kind has). The matrices the ``linear`` and MoE
ops read (and the embedding) go through ``linear_upload``, which can keep them bf16
(:mod:`.bf16`); norms, the conv and the DeltaNet's ``A_log`` / ``dt_bias`` stay float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import LINEAR, ModelConfig


def qkvz_order(cfg: ModelConfig) -> np.ndarray:
    """Row permutation taking HF's per-key-head [q k v z] groups to [q_all k_all v_all z_all]."""
    hk, dk, dv, r = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.v_per_k
    grp = 2 * dk + 2 * r * dv
    q = [h * grp + i for h in range(hk) for i in range(dk)]
    k = [h * grp + dk + i for h in range(hk) for i in range(dk)]
    v = [h * grp + 2 * dk + i for h in range(hk) for i in range(r * dv)]
    z = [h * grp + 2 * dk + r * dv + i for h in range(hk) for i in range(r * dv)]
    return np.array(q + k + v + z)


def ba_order(cfg: ModelConfig) -> np.ndarray:
    """Row permutation taking HF's per-key-head [b a] groups to [b_all a_all]."""
    hk, r = cfg.linear_num_key_heads, cfg.v_per_k
    b = [h * 2 * r + i for h in range(hk) for i in range(r)]
    a = [h * 2 * r + r + i for h in range(hk) for i in range(r)]
    return np.array(b + a)


def q_gate_order(cfg: ModelConfig) -> np.ndarray:
    """Row permutation taking ``q_proj``'s per-head [query gate] rows to [queries gates]."""
    hq, D = cfg.num_attention_heads, cfg.head_dim
    q = [h * 2 * D + i for h in range(hq) for i in range(D)]
    g = [h * 2 * D + D + i for h in range(hq) for i in range(D)]
    return np.array(q + g)


@dataclass
class EngineWeights:
    """Everything the forward pass reads, on the backend."""

    embed: object  # [V, H]
    lm_head: object  # [V, H]: the embedding itself when tied
    final_norm: object  # [H]
    layers: list  # one prepare_layer dict per trunk layer
    mtp: dict | None  # fc, norm_e, norm_h, norm, layer (a full-attention layer dict); None without a head


def prepare_weights(cfg: ModelConfig, t: dict, upload, has_mtp: bool, linear_upload=None,
                    embed_upload=None) -> EngineWeights:
    """Upload the checkpoint tensors ``t`` (internal names, float32) in the engine layout;
    ``upload(host array) -> backend array``; ``linear_upload`` (default ``upload``) for every
    matrix a ``linear`` or MoE op reads (bf16-resident bits, issue #14, or the exact-bf16 mode's
    rounding, :mod:`.modes`); ``embed_upload`` (default ``linear_upload``) for the embedding. A
    tied lm head is the embedding when both go the same way, else its own copy through
    ``linear_upload``."""
    lin = linear_upload or upload
    emb = embed_upload or lin
    embed = emb(np.ascontiguousarray(t["model.embed_tokens.weight"], dtype=np.float32))
    if cfg.tie_word_embeddings:
        lm_head = embed if emb is lin else lin(np.ascontiguousarray(t["model.embed_tokens.weight"], dtype=np.float32))
    else:
        lm_head = lin(t["lm_head.weight"])
    final_norm = upload(t["model.norm.weight"])
    layers = [prepare_layer(cfg, t, f"model.layers.{i}.", kind, cfg.is_moe_layer(i), upload, lin)
              for i, kind in enumerate(cfg.layer_types)]
    mtp = None
    if has_mtp:
        mtp = {
            "fc": lin(t["mtp.fc.weight"]),
            "norm_e": upload(t["mtp.pre_fc_norm_embedding.weight"]),
            "norm_h": upload(t["mtp.pre_fc_norm_hidden.weight"]),
            "norm": upload(t["mtp.norm.weight"]),
            "layer": prepare_layer(cfg, t, "mtp.layers.0.", "full_attention", cfg.is_moe_layer(0), upload, lin),
        }
    return EngineWeights(embed, lm_head, final_norm, layers, mtp)


def gdn_projections(cfg: ModelConfig, t: dict, a: str) -> tuple:
    """The DeltaNet's input projections of layer prefix ``a`` (``...linear_attn.``) as
    (``q‖k‖v‖z`` [conv_dim + value_dim, H], ``b‖a`` [2·Hv, H]) host arrays, from either family."""
    if cfg.is_qwen3_5:
        return (np.concatenate([t[a + "in_proj_qkv.weight"], t[a + "in_proj_z.weight"]]),
                np.concatenate([t[a + "in_proj_b.weight"], t[a + "in_proj_a.weight"]]))
    return t[a + "in_proj_qkvz.weight"][qkvz_order(cfg)], t[a + "in_proj_ba.weight"][ba_order(cfg)]


def prepare_layer(cfg: ModelConfig, t: dict, p: str, kind: str, moe: bool, upload, lin=None) -> dict:
    """One decoder layer (tensor prefix ``p``) as a dict: ``kind``, ``moe``, ``name``,
    ``in_norm``, ``post_norm``; DeltaNet ``qkvzba`` [q‖k‖v‖z‖b‖a, H] (one GEMV), ``conv``,
    ``A_log``, ``dt_bias``, ``norm``, ``out``; or attention ``qkv`` [queries‖gates‖K‖V, H],
    ``q_norm``, ``k_norm``, ``o``; then a dense MLP ``gu`` [gate‖up, H], ``down``, ``inter``, or
    MoE ``router``, ``G2``/``U2`` [E·I, H], ``D2`` [E·H, I], ``shared`` and, with a shared
    expert, ``sgu``, ``sdown``, ``sgate``. ``lin`` (default ``upload``) uploads the matrices."""
    up, lin = upload, lin or upload
    L = {"kind": kind, "moe": moe, "name": p.rstrip("."),
         "in_norm": up(t[p + "input_layernorm.weight"]),
         "post_norm": up(t[p + "post_attention_layernorm.weight"])}
    if kind == LINEAR:
        a = p + "linear_attn."
        qkvz, ba = gdn_projections(cfg, t, a)
        L.update(qkvzba=lin(np.concatenate([qkvz, ba])),
                 conv=up(t[a + "conv1d.weight"]), A_log=up(t[a + "A_log"]),
                 dt_bias=up(t[a + "dt_bias"]), norm=up(t[a + "norm.weight"]),
                 out=lin(t[a + "out_proj.weight"]))
    else:
        s = p + "self_attn."
        L.update(qkv=lin(np.concatenate([t[s + "q_proj.weight"][q_gate_order(cfg)],
                                         t[s + "k_proj.weight"], t[s + "v_proj.weight"]])),
                 q_norm=up(t[s + "q_norm.weight"]), k_norm=up(t[s + "k_norm.weight"]),
                 o=lin(t[s + "o_proj.weight"]))
    if not moe:
        L.update(gu=lin(np.concatenate([t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]])),
                 down=lin(t[p + "mlp.down_proj.weight"]), inter=cfg.intermediate_size)
    else:
        e, i, h = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        L.update(router=lin(t[p + "mlp.gate.weight"]),
                 G2=lin(t[p + "mlp.experts.gate_proj"].reshape(e * i, h)),
                 U2=lin(t[p + "mlp.experts.up_proj"].reshape(e * i, h)),
                 D2=lin(t[p + "mlp.experts.down_proj"].reshape(e * h, i)))
        L["shared"] = cfg.shared_expert_intermediate_size > 0
        if L["shared"]:
            q = p + "mlp.shared_expert."
            L.update(sgu=lin(np.concatenate([t[q + "gate_proj.weight"], t[q + "up_proj.weight"]])),
                     sdown=lin(t[q + "down_proj.weight"]), sgate=lin(t[p + "mlp.shared_expert_gate.weight"]))
    return L
