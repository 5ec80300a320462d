"""Float64 numpy reference of the Qwen3-Next hybrid model with its MTP head.

The oracle for tolerances: readable, one function per op, no attention to speed. Shapes use
``T`` rows (tokens), ``H`` hidden size, ``Hv``/``Hk`` value/key heads of the gated DeltaNet,
``dk``/``dv`` their head dims, ``Hq``/``Hkv`` attention heads, ``D`` the attention head dim.

Layer semantics follow HF ``transformers/models/qwen3_next/modeling_qwen3_next.py`` (and
``qwen3_5`` / ``qwen3_5_moe``, which differ only in the DeltaNet's separate input projections,
:func:`split_qkv_z_b_a`, and which layers are MoE); the MTP head follows vLLM's
``qwen3_next_mtp.py`` / ``qwen3_5_mtp.py``:
``fc(cat[pre_fc_norm_embedding(embed(x_{p})), pre_fc_norm_hidden(h_{p-1})])`` → one full-attention
decoder layer with its own KV cache → ``mtp.norm`` → the shared lm head. Here the MTP row at
position ``p`` pairs the token at ``p`` with the trunk's final hidden state at ``p - 1``
(post final norm, as vLLM passes it) and predicts the token at ``p + 1``; chained drafts feed
the head's own output hidden state (post ``mtp.norm``) back in place of the trunk's.
"""

from __future__ import annotations

import math

import numpy as np

F64 = np.float64


# ------------------------------------------------------------------------------------------------
# elementwise
# ------------------------------------------------------------------------------------------------
def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    """log(1 + e^x), computed stably."""
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


# ------------------------------------------------------------------------------------------------
# norms
# ------------------------------------------------------------------------------------------------
def rms_norm(x, w, eps):
    """Zero-centred RMSNorm: ``x / sqrt(mean(x²) + eps) * (1 + w)``. x: [..., N], w: [N]."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def gated_rms_norm(x, z, w, eps):
    """Gated RMSNorm of the DeltaNet output: ``x / sqrt(mean(x²) + eps) * w * silu(z)``.
    x, z: [..., dv], w: [dv] (not zero-centred)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w * silu(z)


def l2_norm(x, eps=1e-6):
    """``x / sqrt(sum(x²) + eps)`` over the last axis (FLA's l2norm)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


# ------------------------------------------------------------------------------------------------
# gated DeltaNet pieces
# ------------------------------------------------------------------------------------------------
def causal_conv1d(x, w, state):
    """Causal depthwise conv1d with SiLU and carried state.

    x: [T, C] new inputs; w: [C, K]; state: [K-1, C], the previous K-1 inputs (oldest first).
    Returns (y [T, C], new_state [K-1, C]). ``y[t, c] = silu(sum_j w[c, j] * xx[t + j, c])`` over
    ``xx = state ‖ x``."""
    K = w.shape[1]
    xx = np.concatenate([state, x], axis=0)  # [K-1+T, C]
    T = x.shape[0]
    y = np.zeros_like(x)
    for j in range(K):
        y += xx[j:j + T] * w[:, j]
    return silu(y), xx[T:].copy()


def gated_delta_rule(q, k, v, g, beta, state):
    """The gated delta rule, token by token, per value head.

    q, k: [T, Hv, dk] (already L2-normalised, q scaled by 1/sqrt(dk), key heads expanded to
    value heads); v: [T, Hv, dv]; g: [T, Hv] log-decay; beta: [T, Hv]; state: [Hv, dk, dv].
    Per token: ``S ← S·exp(g); δ = β(v − Sᵀk); S ← S + k δᵀ; o = Sᵀq``.
    Returns (o [T, Hv, dv], new state)."""
    S = state.copy()
    T = q.shape[0]
    o = np.zeros((T,) + v.shape[1:], dtype=F64)
    for t in range(T):
        S = S * np.exp(g[t])[:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        o[t] = np.einsum("hkv,hk->hv", S, q[t])
    return o, S


def split_qkvz_ba(cfg, qkvz, ba):
    """HF's per-key-head interleaved projections -> q, k [T, Hk, dk]; v, z [T, Hv, dv]; b, a [T, Hv].

    ``in_proj_qkvz`` emits, per key head, ``q (dk) ‖ k (dk) ‖ v (r·dv) ‖ z (r·dv)`` with
    r = Hv / Hk; ``in_proj_ba`` emits per key head ``b (r) ‖ a (r)``."""
    T = qkvz.shape[0]
    hk, dk, dv, r = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.v_per_k
    x = qkvz.reshape(T, hk, 2 * dk + 2 * r * dv)
    q, k = x[..., :dk], x[..., dk:2 * dk]
    v = x[..., 2 * dk:2 * dk + r * dv].reshape(T, hk * r, dv)
    z = x[..., 2 * dk + r * dv:].reshape(T, hk * r, dv)
    y = ba.reshape(T, hk, 2 * r)
    b, a = y[..., :r].reshape(T, hk * r), y[..., r:].reshape(T, hk * r)
    return q, k, v, z, b, a


def split_qkv_z_b_a(cfg, qkv, z, b, a):
    """Qwen3.5's separate projections -> the same q, k [T, Hk, dk]; v, z [T, Hv, dv]; b, a [T, Hv].

    ``in_proj_qkv`` emits ``q (Hk·dk) ‖ k (Hk·dk) ‖ v (Hv·dv)``; ``in_proj_z`` z (Hv·dv);
    ``in_proj_b`` and ``in_proj_a`` one value per value head."""
    T, kd = qkv.shape[0], cfg.key_dim
    hk, dk, dv = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    q, k = qkv[:, :kd].reshape(T, hk, dk), qkv[:, kd:2 * kd].reshape(T, hk, dk)
    v = qkv[:, 2 * kd:].reshape(T, -1, dv)
    return q, k, v, z.reshape(T, -1, dv), b, a


# ------------------------------------------------------------------------------------------------
# attention pieces
# ------------------------------------------------------------------------------------------------
def rope_cos_sin(positions, rot_dim, theta):
    """cos, sin: [T, rot_dim/2] for the given absolute positions (float64, math module)."""
    half = rot_dim // 2
    inv = [theta ** (-(2.0 * i) / rot_dim) for i in range(half)]
    ang = np.array([[p * f for f in inv] for p in positions], dtype=F64).reshape(len(positions), half)
    return np.cos(ang), np.sin(ang)


def apply_rope(x, cos, sin, rot_dim):
    """Rotate-half RoPE on the first ``rot_dim`` dims of each head. x: [T, heads, D]."""
    half = rot_dim // 2
    x1, x2 = x[..., :half], x[..., half:rot_dim]
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.copy()
    out[..., :half] = x1 * c - x2 * s
    out[..., half:rot_dim] = x2 * c + x1 * s
    return out


def gqa_attention(q, k_cache, v_cache, positions):
    """Causal GQA attention over a KV cache.

    q: [T, Hq, D] at absolute ``positions`` [T]; k_cache, v_cache: [P, Hkv, D] holding every key
    up to max(positions). Query head h reads KV head ``h // (Hq / Hkv)``. Returns [T, Hq, D]."""
    T, hq, D = q.shape
    rep = hq // k_cache.shape[1]
    out = np.zeros_like(q)
    for t in range(T):
        n = positions[t] + 1
        for h in range(hq):
            kk, vv = k_cache[:n, h // rep], v_cache[:n, h // rep]
            s = kk @ q[t, h] / math.sqrt(D)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vv
    return out


# ------------------------------------------------------------------------------------------------
# MLPs
# ------------------------------------------------------------------------------------------------
def swiglu(x, w_gate, w_up, w_down):
    """Dense SwiGLU: ``down(silu(gate x) * up x)``. x: [T, H]; w_gate, w_up: [I, H]; w_down: [H, I]."""
    return (silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def moe_route(logits, top_k, renormalise):
    """Softmax router, top-k with ties to the lowest index, optional renormalisation.
    logits: [T, E] -> (indices [T, k], weights [T, k]) in descending-probability order."""
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    wts = np.take_along_axis(p, idx, axis=-1)
    if renormalise:
        wts = wts / wts.sum(axis=-1, keepdims=True)
    return idx, wts


def moe(x, w, p, cfg):
    """Sparse MoE block with shared expert (HF Qwen3NextSparseMoeBlock). x: [T, H]."""
    idx, wts = moe_route(x @ w[p + "mlp.gate.weight"].T, cfg.num_experts_per_tok, cfg.norm_topk_prob)
    G, U, Dn = w[p + "mlp.experts.gate_proj"], w[p + "mlp.experts.up_proj"], w[p + "mlp.experts.down_proj"]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, wt in zip(idx[t], wts[t]):
            out[t] += wt * swiglu(x[t:t + 1], G[e], U[e], Dn[e])[0]
    if cfg.shared_expert_intermediate_size > 0:
        s = swiglu(x, w[p + "mlp.shared_expert.gate_proj.weight"], w[p + "mlp.shared_expert.up_proj.weight"],
                   w[p + "mlp.shared_expert.down_proj.weight"])
        out += sigmoid(x @ w[p + "mlp.shared_expert_gate.weight"].T) * s
    return out


def mlp(x, w, p, cfg, moe_layer):
    if moe_layer:
        return moe(x, w, p, cfg)
    return swiglu(x, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])


# ------------------------------------------------------------------------------------------------
# layers
# ------------------------------------------------------------------------------------------------
def gdn_layer(x, w, p, cfg, conv_state, rec_state):
    """Gated DeltaNet mixer. x: [T, H] (normed input). Returns (out [T, H], conv_state, rec_state)."""
    a_ = p + "linear_attn."
    if cfg.is_qwen3_5:
        q, k, v, z, b, a = split_qkv_z_b_a(cfg, *(x @ w[a_ + f"in_proj_{n}.weight"].T for n in ("qkv", "z", "b", "a")))
    else:
        q, k, v, z, b, a = split_qkvz_ba(cfg, x @ w[a_ + "in_proj_qkvz.weight"].T, x @ w[a_ + "in_proj_ba.weight"].T)
    T = x.shape[0]
    mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=-1)
    mixed, conv_state = causal_conv1d(mixed, w[a_ + "conv1d.weight"], conv_state)
    kd = cfg.key_dim
    hk, dk, r = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.v_per_k
    q = mixed[:, :kd].reshape(T, hk, dk)
    k = mixed[:, kd:2 * kd].reshape(T, hk, dk)
    v = mixed[:, 2 * kd:].reshape(T, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
    q = np.repeat(l2_norm(q), r, axis=1) / math.sqrt(dk)
    k = np.repeat(l2_norm(k), r, axis=1)
    beta = sigmoid(b)
    g = -np.exp(w[a_ + "A_log"]) * softplus(a + w[a_ + "dt_bias"])
    o, rec_state = gated_delta_rule(q, k, v, g, beta, rec_state)
    o = gated_rms_norm(o, z, w[a_ + "norm.weight"], cfg.rms_norm_eps)
    return o.reshape(T, -1) @ w[a_ + "out_proj.weight"].T, conv_state, rec_state


def attn_layer(x, w, p, cfg, k_cache, v_cache, start):
    """Gated full attention. x: [T, H] at positions start..start+T-1; writes K/V into the caches
    ([P, Hkv, D]) at those positions. Returns out [T, H]."""
    s_ = p + "self_attn."
    T, hq, hkv, D = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qg = (x @ w[s_ + "q_proj.weight"].T).reshape(T, hq, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(T, hq * D)
    q = rms_norm(q, w[s_ + "q_norm.weight"], cfg.rms_norm_eps)
    k = rms_norm((x @ w[s_ + "k_proj.weight"].T).reshape(T, hkv, D), w[s_ + "k_norm.weight"], cfg.rms_norm_eps)
    v = (x @ w[s_ + "v_proj.weight"].T).reshape(T, hkv, D)
    pos = list(range(start, start + T))
    cos, sin = rope_cos_sin(pos, cfg.rotary_dim, cfg.rope_theta)
    q, k = apply_rope(q, cos, sin, cfg.rotary_dim), apply_rope(k, cos, sin, cfg.rotary_dim)
    k_cache[start:start + T], v_cache[start:start + T] = k, v
    o = gqa_attention(q, k_cache, v_cache, pos).reshape(T, hq * D)
    return (o * sigmoid(gate)) @ w[s_ + "o_proj.weight"].T


# ------------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------------
class RefState:
    """Carried state of one sequence: per GDN layer conv [K-1, C] and recurrent [Hv, dk, dv]
    state; per attention layer K/V [max_ctx, Hkv, D]; the MTP layer's K/V; ``pos``, ``mtp_len``."""

    def __init__(self, cfg, max_ctx):
        self.pos, self.mtp_len, self.max_ctx = 0, 0, max_ctx
        kv = (max_ctx, cfg.num_key_value_heads, cfg.head_dim)
        self.conv, self.rec, self.k, self.v = {}, {}, {}, {}
        for i, t in enumerate(cfg.layer_types):
            if t == "linear_attention":
                self.conv[i] = np.zeros((cfg.linear_conv_kernel_dim - 1, cfg.conv_dim))
                self.rec[i] = np.zeros((cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                        cfg.linear_value_head_dim))
            else:
                self.k[i], self.v[i] = np.zeros(kv), np.zeros(kv)
        self.mtp_k, self.mtp_v = np.zeros(kv), np.zeros(kv)


class RefModel:
    """The float64 model over a checkpoint's tensors (converted once)."""

    def __init__(self, cfg, tensors):
        self.cfg = cfg
        self.w = {k: np.asarray(a, dtype=F64) for k, a in tensors.items()}
        self.lm_head = self.w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else self.w["lm_head.weight"]

    def new_state(self, max_ctx):
        return RefState(self.cfg, max_ctx)

    def _decoder_layer(self, x, i, p, kind, moe_layer, st, start, mtp=False):
        cfg, w = self.cfg, self.w
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        if kind == "linear_attention":
            h, st.conv[i], st.rec[i] = gdn_layer(h, w, p, cfg, st.conv[i], st.rec[i])
        elif mtp:
            h = attn_layer(h, w, p, cfg, st.mtp_k, st.mtp_v, start)
        else:
            h = attn_layer(h, w, p, cfg, st.k[i], st.v[i], start)
        x = x + h
        return x + mlp(rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps), w, p, cfg, moe_layer)

    def run(self, ids, st):
        """Process ``ids`` [T] from carried state ``st``. Returns (logits [T, V], hidden [T, H]),
        hidden being the final normed hidden state the MTP head consumes."""
        cfg = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        if st.pos + len(ids) > st.max_ctx:
            raise ValueError("sequence exceeds the state's max_ctx")
        x = self.w["model.embed_tokens.weight"][ids]
        for i, kind in enumerate(cfg.layer_types):
            x = self._decoder_layer(x, i, f"model.layers.{i}.", kind, cfg.is_moe_layer(i), st, st.pos)
        st.pos += len(ids)
        h = rms_norm(x, self.w["model.norm.weight"], cfg.rms_norm_eps)
        return h @ self.lm_head.T, h

    def forward(self, ids):
        """Full-sequence forward from empty state: (logits [T, V], hidden [T, H])."""
        return self.run(ids, self.new_state(len(ids)))

    # ---- MTP ---------------------------------------------------------------------------------
    def mtp_rows(self, tokens, hiddens, st, start):
        """MTP head over rows at positions start.. : row r pairs ``tokens[r]`` (the token at that
        position) with ``hiddens[r]`` (the hidden state at the position before). Writes the MTP
        K/V at those positions. Returns (logits [T, V], out_hidden [T, H])."""
        cfg, w = self.cfg, self.w
        if "mtp.fc.weight" not in w:
            raise ValueError("the model has no MTP head")
        e = rms_norm(w["model.embed_tokens.weight"][np.asarray(tokens, dtype=np.int64)],
                     w["mtp.pre_fc_norm_embedding.weight"], cfg.rms_norm_eps)
        h = rms_norm(np.asarray(hiddens, dtype=F64), w["mtp.pre_fc_norm_hidden.weight"], cfg.rms_norm_eps)
        x = np.concatenate([e, h], axis=-1) @ w["mtp.fc.weight"].T
        x = self._decoder_layer(x, 0, "mtp.layers.0.", "full_attention", cfg.is_moe_layer(0), st, start, mtp=True)
        out = rms_norm(x, w["mtp.norm.weight"], cfg.rms_norm_eps)
        return out @ self.lm_head.T, out

    def mtp_draft(self, tokens, hiddens, st, chain):
        """Fill the head over the committed rows (at st.mtp_len..), then ``chain`` greedy drafts,
        each fed by the head's own output hidden. Returns the draft tokens."""
        start = st.mtp_len
        logits, out = self.mtp_rows(tokens, hiddens, st, start)
        st.mtp_len = start + len(tokens)
        drafts = []
        for c in range(chain):
            d = int(np.argmax(logits[-1]))
            drafts.append(d)
            if c + 1 < chain:
                logits, out = self.mtp_rows([d], out[-1:], st, start + len(tokens) + c)
        return drafts


__all__ = [
    "sigmoid", "silu", "softplus", "rms_norm", "gated_rms_norm", "l2_norm", "causal_conv1d",
    "gated_delta_rule", "split_qkvz_ba", "split_qkv_z_b_a", "rope_cos_sin", "apply_rope", "gqa_attention", "swiglu",
    "moe_route", "moe", "mlp", "gdn_layer", "attn_layer", "RefState", "RefModel",
]
