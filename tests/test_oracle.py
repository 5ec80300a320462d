"""The float64 reference (numba_kernels/reference.py) against HF transformers' Qwen3-Next and
Qwen3.5 (dense, MoE, multimodal), and its MTP head against an independent torch implementation of
vLLM's ``qwen3_next_mtp.py`` / ``qwen3_5_mtp.py`` layout built from HF parts.

Per configuration (tests/oracle_models.py) and a 40-token random prompt:

- logits: at every position, our max abs error against HF in float64 is at most a tenth of HF's
  own float32-vs-float64 gap at that position, and at most 1e-5 x max |logit|; over the whole
  prompt at most 1e-12 x max |logit| (both are float64 computations of the same model; what is
  left is float64 rounding in different orders, HF's chunked gated delta rule against our
  token-by-token recurrence);
- the hidden state we return equals HF's final normed hidden state (the last entry of
  ``output_hidden_states``);
- incremental decode (token by token, uneven chunks) equals the full forward to ~1e-12;
- MoE experts load the same from per-expert keys (what ``save_pretrained`` writes) and from fused
  keys (transformers 5's in-memory layout);
- ``mtp_rows`` / ``mtp_draft`` equal a torch float64 MTP head built from HF's decoder layer.

"HF in float64" is HF's own modeling code with its float32 casts widened (see
``oracle_models.hf_float64_module``): the stock ``model.double()`` still rounds to float32 in its
norms, gated delta rule, router and RoPE, ~1e-6 relative, as large as the float32 gap itself.
The stock number is printed too.

``pytest -s`` prints one ``ORACLE`` line per configuration and check; collect them with
``grep '^ORACLE'``. Set ``PRIMEWALK_ORACLE_JSON=path`` to also get them as JSON.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import oracle_models as om  # noqa: E402

from harness.engine.weights import load_checkpoint, read_safetensors, save_checkpoint  # noqa: E402
from harness.errors import CheckpointError  # noqa: E402
from harness.synth import random_tensors  # noqa: E402
from numba_kernels.reference import RefModel  # noqa: E402

NAMES = list(om.CONFIGS)
MOE_NAMES = [n for n in NAMES if om.text_config(n).get("num_experts", 0) > 0]
REL_BOUND = 1e-12  # reference vs HF float64 (widened casts), relative to max |logit|
MTP_CHAIN = 3

RESULTS: dict = {}


def record(name: str, check: str, **values) -> None:
    RESULTS.setdefault(name, {}).setdefault(check, {}).update(values)
    fields = " ".join(f"{k}={v:.3e}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"\nORACLE {name} {check} {fields}")


@pytest.fixture(scope="module", autouse=True)
def _dump_results():
    yield
    path = os.environ.get("PRIMEWALK_ORACLE_JSON")
    if path and RESULTS:
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=2, sort_keys=True)


# ------------------------------------------------------------------------------------------------
# fixtures: one HF model per configuration, its checkpoint, our reference over it
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("oracle"))


_CACHE: dict = {}


@pytest.fixture(scope="module")
def oracle(root):
    def get(name):
        if name not in _CACHE:
            torch.set_num_threads(min(2, torch.get_num_threads()))
            m = om.build(name, root)
            ck = load_checkpoint(m.folder)
            ref = RefModel(ck.config, ck.tensors)
            logits, hidden = ref.forward(m.ids)
            _CACHE[name] = dict(m=m, ck=ck, ref=ref, logits=logits, hidden=hidden,
                                hf64=om.hf_forward(m.hf64, m.ids),
                                hf32=om.hf_forward(m.hf32, m.ids),
                                stock=om.hf_forward(m.hf64_stock, m.ids))
        return _CACHE[name]

    yield get
    _CACHE.clear()


# ------------------------------------------------------------------------------------------------
# trunk
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_parameters_perturbed_from_init(name, oracle):
    m = oracle(name)["m"]
    for pname, p in m.hf32.named_parameters():
        p = p.detach().double()
        assert torch.isfinite(p).all(), pname
        assert p.numel() == 1 or float(p.std()) > 0.01, f"{pname} looks constant"
        if pname.endswith("norm.weight") and "linear_attn.norm" not in pname:  # zeros at init
            assert float(p.abs().max()) > 0.05, f"{pname} still at its zero init"
        if pname.endswith("dt_bias"):
            assert not torch.allclose(p, torch.ones_like(p)), pname


@pytest.mark.parametrize("name", NAMES)
def test_config_read_like_hf(name, oracle):
    o = oracle(name)
    cfg, outer = o["ck"].config, o["m"].hf32.config
    hf = outer.get_text_config()
    for k in ["vocab_size", "hidden_size", "num_hidden_layers", "linear_num_key_heads",
              "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "linear_conv_kernel_dim", "num_attention_heads", "num_key_value_heads", "head_dim",
              "rms_norm_eps"]:
        assert getattr(cfg, k) == getattr(hf, k), k
    for k in ["intermediate_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
              "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"]:
        if hasattr(hf, k):  # the Qwen3.5 configs have no unused MoE fields
            assert getattr(cfg, k) == getattr(hf, k), k
    assert cfg.tie_word_embeddings == outer.tie_word_embeddings  # HF ties by the outer config
    assert cfg.layer_types == list(hf.layer_types)
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"]
    assert cfg.partial_rotary_factor == hf.rope_parameters["partial_rotary_factor"]
    assert cfg.mrope_section == hf.rope_parameters.get("mrope_section")
    assert cfg.is_qwen3_5 == (hf.model_type != "qwen3_next")
    if name in om.LEGACY:
        assert "rope_parameters" not in o["m"].config and "layer_types" not in o["m"].config
        assert "rope_theta" in o["m"].config and "full_attention_interval" in o["m"].config
    layers = om.text_model(o["m"].hf32).layers
    for i in range(cfg.num_hidden_layers):
        hf_moe = type(layers[i].mlp).__name__ == om.family(name).moe_block
        assert cfg.is_moe_layer(i) == hf_moe, i


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_hf_float64(name, oracle):
    o = oracle(name)
    ours = o["logits"]
    l64, l32, stock = o["hf64"][0], o["hf32"][0], o["stock"][0]
    assert ours.shape == l64.shape == (len(o["m"].ids), o["ck"].config.vocab_size)
    err = np.abs(ours - l64).max(axis=-1)  # per position
    gap = np.abs(l32 - l64).max(axis=-1)  # HF's own float32-vs-float64 gap
    scale = np.abs(l64).max(axis=-1)
    top = float(np.abs(l64).max())
    record(name, "logits",
           max_rel_err=float(err.max() / top), max_abs_err=float(err.max()),
           hf_fp32_gap_rel=float(gap.max() / top), hf_fp32_gap_abs=float(gap.max()),
           hf_stock_double_rel=float(np.abs(stock - l64).max() / top), max_abs_logit=top)
    for t in range(len(err)):
        assert err[t] <= 0.1 * gap[t], f"position {t}: error {err[t]:.3e} > 0.1 x fp32 gap {gap[t]:.3e}"
        assert err[t] <= 1e-5 * scale[t], f"position {t}: error {err[t]:.3e} > 1e-5 x {scale[t]:.3e}"
    assert err.max() <= REL_BOUND * top, f"max error {err.max():.3e} > {REL_BOUND} x {top:.3e}"
    # unmodified HF code (model.double(), float32 inside) agrees to its own float32 rounding
    stock_err = np.abs(ours - stock).max(axis=-1)
    assert (stock_err <= 1e-5 * scale).all(), float(stock_err.max())
    # the greedy tokens agree, too
    assert (ours.argmax(-1) == l64.argmax(-1)).all()


@pytest.mark.parametrize("name", NAMES)
def test_hidden_is_hf_final_normed_hidden(name, oracle):
    o = oracle(name)
    h64 = o["hf64"][1]
    # HF: the last entry of output_hidden_states is the final norm's output
    with torch.no_grad():
        x = torch.as_tensor(np.asarray(o["m"].ids, dtype=np.int64))[None]
        last = o["m"].hf64.model(input_ids=x, use_cache=False).last_hidden_state[0].numpy()
    np.testing.assert_array_equal(h64, last)
    err = float(np.abs(o["hidden"] - h64).max())
    record(name, "hidden", max_rel_err=err / float(np.abs(h64).max()))
    assert err <= 1e-10 * float(np.abs(h64).max())
    # and the logits are the lm head over it
    lm = o["ck"].lm_head().astype(np.float64)
    np.testing.assert_allclose(o["hidden"] @ lm.T, o["logits"], rtol=0, atol=1e-12 * np.abs(o["logits"]).max())


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


@pytest.mark.parametrize("name", NAMES)
def test_incremental_equals_forward(name, oracle):
    o = oracle(name)
    ref, ids, full_l, full_h = o["ref"], o["m"].ids, o["logits"], o["hidden"]
    T = len(ids)
    splits = {"tokenwise": [1] * T, "chunks_17_23": [17, T - 17], "chunks_5_29_rest": [5, 29, T - 34]}
    worst = 0.0
    for label, sizes in splits.items():
        assert sum(sizes) == T and min(sizes) > 0
        st = ref.new_state(T)
        ls, hs, p = [], [], 0
        for n in sizes:
            lg, hd = ref.run(ids[p:p + n], st)
            ls.append(lg)
            hs.append(hd)
            p += n
        assert st.pos == T
        rl, rh = _rel(np.concatenate(ls), full_l), _rel(np.concatenate(hs), full_h)
        worst = max(worst, rl, rh)
        assert rl <= 1e-12 and rh <= 1e-12, (label, rl, rh)
    record(name, "incremental", max_rel_diff=worst)


@pytest.mark.parametrize("name", MOE_NAMES)
def test_experts_per_expert_and_fused_load_identically(name, oracle, root):
    o = oracle(name)
    m, ck = o["m"], o["ck"]
    # transformers 5: fused in memory, per expert on disk (save_pretrained reverts the fusion)
    sd_keys = set(m.hf32.state_dict())
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd_keys)
    file_keys = set(read_safetensors(os.path.join(m.folder, "model.safetensors"))[0])
    assert any(k.endswith("mlp.experts.0.gate_proj.weight") for k in file_keys)
    assert not any(k.endswith("gate_up_proj") for k in file_keys)

    fused = os.path.join(root, name + "-fused")
    om.save_fused(m.hf32, m.folder, fused)
    assert any(k.endswith("mlp.experts.gate_up_proj")
               for k in read_safetensors(os.path.join(fused, "model.safetensors"))[0])
    ours = os.path.join(root, name + "-resaved")
    save_checkpoint(ours, ck.config, ck.tensors)  # our writer: per expert
    assert any(k.endswith("mlp.experts.0.up_proj.weight")
               for k in read_safetensors(os.path.join(ours, "model.safetensors"))[0])
    for folder in (fused, ours):
        ck2 = load_checkpoint(folder)
        assert sorted(ck2.tensors) == sorted(ck.tensors)
        for k in ck.tensors:
            np.testing.assert_array_equal(ck2.tensors[k], ck.tensors[k], err_msg=k)
    ck2 = load_checkpoint(fused)
    np.testing.assert_array_equal(RefModel(ck2.config, ck2.tensors).forward(m.ids)[0], o["logits"])


# ------------------------------------------------------------------------------------------------
# MTP: an independent torch float64 implementation of vLLM's Qwen3-Next MTP layout
# ------------------------------------------------------------------------------------------------
class TorchMTP(torch.nn.Module):
    """vLLM ``Qwen3NextMultiTokenPredictor`` / ``Qwen3_5MultiTokenPredictor`` + ``compute_logits``,
    in float64, from HF parts of the model's family: ``fc(cat[pre_fc_norm_embedding(embed(x)),
    pre_fc_norm_hidden(h)])`` -> one full-attention decoder layer (layer index 0; MoE in the
    Qwen3.5-MoE family) -> ``norm`` -> the trunk's lm head."""

    def __init__(self, hf64_model, mtp: dict, fam: om.Family):
        super().__init__()
        mod = om.hf_float64_module(fam.module)
        cfg = copy.deepcopy(hf64_model.config.get_text_config())
        cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = "eager"
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        norm = getattr(mod, fam.prefix + "RMSNorm")
        self.embed = hf64_model.get_input_embeddings().weight.detach()
        self.lm_head = hf64_model.lm_head.weight.detach()
        self.pre_fc_norm_embedding = norm(h, eps)
        self.pre_fc_norm_hidden = norm(h, eps)
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.layer = getattr(mod, fam.prefix + "DecoderLayer")(cfg, 0)
        self.norm = norm(h, eps)
        self.rotary = getattr(mod, fam.rotary)(cfg)
        self.double()
        sd = {}
        for k, v in mtp.items():
            k = k[len("mtp."):]
            k = k.replace("layers.0.", "layer.", 1) if k.startswith("layers.0.") else k
            sd[k] = torch.as_tensor(np.asarray(v, dtype=np.float64))
        for base in [k[: -len(".gate_proj")] for k in list(sd) if k.endswith("mlp.experts.gate_proj")]:
            # HF experts: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I]
            sd[base + ".gate_up_proj"] = torch.cat([sd.pop(base + ".gate_proj"), sd.pop(base + ".up_proj")], 1)
        self.load_state_dict(sd, strict=True)
        self.eval()

    @torch.no_grad()
    def forward(self, tokens, hiddens):
        """All rows at positions 0..N-1 with a causal mask. Returns (logits, out_hidden) numpy."""
        tok = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        hid = torch.as_tensor(np.asarray(hiddens, dtype=np.float64))
        n = len(tok)
        x = torch.cat([self.pre_fc_norm_embedding(self.embed[tok]), self.pre_fc_norm_hidden(hid)], -1)
        x = self.fc(x)[None]
        pos = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        x = self.layer(x, position_embeddings=self.rotary(x, pos), attention_mask=mask, position_ids=pos)
        out = self.norm(x[0])
        return (out @ self.lm_head.T).numpy(), out.numpy()


def _mtp_setup(name, oracle, root):
    o = oracle(name)
    key = "mtp"
    if key not in o:
        m, ck = o["m"], o["ck"]
        mtp = {k: v for k, v in random_tensors(ck.config, seed=7 + len(name), mtp=True).items()
               if k.startswith("mtp.")}
        folder = os.path.join(root, name + "-mtp")
        om.add_mtp(m.folder, folder, mtp)
        ck2 = load_checkpoint(folder)
        assert ck2.has_mtp and ck2.config.has_mtp
        ref = RefModel(ck2.config, ck2.tensors)
        np.testing.assert_array_equal(ref.forward(m.ids)[0], o["logits"])  # trunk unchanged
        o[key] = dict(ref=ref, torch=TorchMTP(m.hf64, mtp, om.family(name)), ck=ck2)
    return o, o[key]


@pytest.mark.parametrize("name", NAMES)
def test_mtp_rows_match_torch(name, oracle, root):
    o, mt = _mtp_setup(name, oracle, root)
    ids, T, H = o["m"].ids, len(o["m"].ids), o["ck"].config.hidden_size
    # row p pairs token p with the trunk hidden at p-1; row 0 with zeros
    ours_rows = np.concatenate([np.zeros((1, H)), o["hidden"][:-1]])
    hf_rows = np.concatenate([np.zeros((1, H)), o["hf64"][1][:-1]])
    want_l, want_h = mt["torch"](ids, hf_rows)
    st = mt["ref"].new_state(T)
    got_l, got_h = mt["ref"].mtp_rows(ids, ours_rows, st, 0)
    rl, rh = _rel(got_l, want_l), _rel(got_h, want_h)
    record(name, "mtp_rows", max_rel_err=rl, hidden_max_rel_err=rh)
    assert rl <= 1e-10 and rh <= 1e-10
    # in two uneven pieces from the carried MTP K/V
    st = mt["ref"].new_state(T)
    a, b = mt["ref"].mtp_rows(ids[:11], ours_rows[:11], st, 0), mt["ref"].mtp_rows(ids[11:], ours_rows[11:], st, 11)
    assert _rel(np.concatenate([a[0], b[0]]), got_l) <= 1e-12
    assert _rel(np.concatenate([a[1], b[1]]), got_h) <= 1e-12


def _torch_greedy(tm, tokens, hiddens, chain):
    toks, hids, drafts = list(tokens), [np.asarray(h) for h in hiddens], []
    for _ in range(chain):
        logits, out = tm(toks, np.stack(hids))
        d = int(np.argmax(logits[-1]))
        drafts.append(d)
        toks.append(d)
        hids.append(out[-1])
    return drafts


@pytest.mark.parametrize("name", NAMES)
def test_mtp_draft_chains_like_torch(name, oracle, root):
    o, mt = _mtp_setup(name, oracle, root)
    ids, T, H = o["m"].ids, len(o["m"].ids), o["ck"].config.hidden_size
    ref = mt["ref"]
    ours_rows = np.concatenate([np.zeros((1, H)), o["hidden"][:-1]])
    hf_rows = np.concatenate([np.zeros((1, H)), o["hf64"][1][:-1]])
    # one fill of every row, then the chain
    st = ref.new_state(T + MTP_CHAIN)
    got = ref.mtp_draft(ids, ours_rows, st, MTP_CHAIN)
    want = _torch_greedy(mt["torch"], ids, hf_rows, MTP_CHAIN)
    assert got == want
    assert st.mtp_len == T
    # fill in two calls: the first call's draft rows (K/V past mtp_len) must not leak into the second
    st = ref.new_state(T + MTP_CHAIN)
    first = ref.mtp_draft(ids[:23], ours_rows[:23], st, 2)
    assert first == _torch_greedy(mt["torch"], ids[:23], hf_rows[:23], 2)
    assert ref.mtp_draft(ids[23:], ours_rows[23:], st, MTP_CHAIN) == want
    record(name, "mtp_draft", drafts=",".join(map(str, want)))


def test_trunk_only_checkpoint_refuses_mtp(oracle):
    o = oracle(NAMES[0])
    ck = o["ck"]  # HF's save_pretrained output: no mtp.* tensors
    assert not ck.has_mtp
    assert ck.config.num_nextn_predict_layers == 0 and not ck.config.has_mtp
    assert not any(k.startswith("mtp.") for k in ck.tensors)
    with pytest.raises(CheckpointError, match=r"no MTP head \(mtp\.\* tensors\); speculative decoding needs one"):
        ck.require_mtp("speculative decoding")
    with pytest.raises(ValueError, match="no MTP head"):
        o["ref"].mtp_rows(o["m"].ids[:3], np.zeros((3, ck.config.hidden_size)), o["ref"].new_state(3), 0)
    with pytest.raises(ValueError, match="no MTP head"):
        o["ref"].mtp_draft(o["m"].ids[:3], np.zeros((3, ck.config.hidden_size)), o["ref"].new_state(3), 1)


# ------------------------------------------------------------------------------------------------
# bf16 checkpoints: HF's own bf16 save, loaded exactly, against HF in float64 on the same weights
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["q35_dense", "q35_moe"])
def test_bf16_checkpoint_round_trip(name, oracle, root):
    """``model.to(bfloat16).save_pretrained``: every tensor loads as torch's own bf16 -> float32
    widening of the float32 checkpoint's value (bitwise); the reference on it matches HF float64
    on the same bf16 weights to REL_BOUND; the CPU engine gives the same bits with its matrices
    kept bf16 as with them widened."""
    from harness.engine.model import Engine

    o = oracle(name)
    m = o["m"]
    hf16 = copy.deepcopy(m.hf32).to(torch.bfloat16)
    folder = os.path.join(root, name + "-bf16")
    hf16.save_pretrained(folder, safe_serialization=True)
    ck = load_checkpoint(folder)
    assert set(ck.dtypes.values()) == {"BF16"}
    assert sorted(ck.tensors) == sorted(o["ck"].tensors)
    for k, v in ck.tensors.items():
        want = torch.from_numpy(np.ascontiguousarray(o["ck"].tensors[k])).bfloat16().float().numpy()
        assert v.dtype == np.float32 and np.array_equal(v.view(np.uint32), want.view(np.uint32)), k
    hf64 = copy.deepcopy(m.hf64)
    missing, unexpected = hf64.load_state_dict({k: v.double() for k, v in hf16.state_dict().items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    want = om.hf_forward(hf64, m.ids)[0]
    got = RefModel(ck.config, ck.tensors).forward(m.ids)[0]
    rel = _rel(got, want)
    record(name, "bf16_checkpoint", max_rel_err=rel)
    assert rel <= REL_BOUND
    logits = {}
    for mode in ("f32", "bf16"):
        e = Engine(ck, "cpu", weights=mode)
        logits[mode] = np.asarray(e.target_step(e.new_session(len(m.ids)), np.asarray(m.ids))[0]).copy()
    assert np.array_equal(logits["f32"].view(np.uint32), logits["bf16"].view(np.uint32))


def test_harness_oracle_command(capsys):
    """``harness oracle`` on the embedded Qwen3.5-layout model (bf16 checkpoint, per-expert MoE
    keys, an MTP head transformers ignores): PASS; an impossible --rtol: FAIL, exit 1."""
    from harness.cli import main
    from harness.models import model_path

    for rtol, rc_want, verdict in (("1e-4", 0, "PASS"), ("1e-12", 1, "FAIL")):
        rc = main(["oracle", "--model", model_path("tiny-q35"), "--prompt-len", "12", "--rtol", rtol])
        out = capsys.readouterr().out.strip().splitlines()
        assert rc == rc_want and len(out) == 1 and out[0].startswith(verdict + " "), out
        fields = dict(kv.split("=", 1) for kv in out[0].split()[1:])
        assert fields["model_type"] == "qwen3_5_moe_text" and fields["tokens"] == "12"
        assert float(fields["reference_vs_hf_f32"]) <= 1e-4
