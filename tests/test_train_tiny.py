"""tools/train_tiny.py: the stdlib-small trainer.

- The torch model the trainer trains (HF's Qwen3-Next trunk + our torch MTP head) equals our
  float64 reference ``RefModel`` on its export: trunk logits, and MTP rows with row 0 pairing the
  first token with zeros (the engine's convention) — torch in float64 through HF's code with its
  float32 casts widened (``hf_float64_module``, as tests/oracle_models.py does), to 1e-9
  relative; the stock float32 modules to 1e-5. The training losses pair rows and targets as
  documented (main: byte t+1 from position t; MTP: byte t+2 from hidden t and byte t+1).
- Chained MTP depths (2, 3) trained in parallel equal the engine's one-row-at-a-time chain
  (``RefModel.mtp_rows``) to 1e-9, and their losses pair rows and targets as documented.
- ``--smoke`` runs end to end on the CPU in a temporary folder: every output is there, the export
  loads with ``harness.engine.weights.load_checkpoint`` and ``RefModel`` on ``heldout_eval.bin``
  reproduces the logged float64 numbers, the prompts are held-out UTF-8 excerpts of <= 1 KiB, the
  bundle reassembles, a rerun is bitwise identical, and ``harness/specs/stdlib.toml`` loads with
  the smoke output standing in for ``harness/models/stdlib-small``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

import train_tiny as tt  # noqa: E402

from harness.engine.weights import load_checkpoint, save_checkpoint  # noqa: E402
from numba_kernels.reference import RefModel  # noqa: E402

LIN, FULL = tt.LIN, tt.FULL

# Small, with every dimension distinct enough to catch a layout slip: d_k != d_v, value heads
# 2x key heads, GQA 4/2, partial rotary 0.5, two attention layers.
CHECK_MODEL = dict(
    tt.SMOKE_MODEL, hidden_size=32, num_hidden_layers=4, layer_types=[LIN, FULL, LIN, FULL],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=40,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
)
T_CHECK = 40


def _perturb(model, seed):
    """Every parameter away from its init (HF's norms are zeros at init, Linear std 0.02 gives
    flat logits), float32-representable so the float32 export is exact."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            shape = tuple(p.shape)
            r = torch.randn(shape, generator=g, dtype=torch.float64)
            if name.endswith("A_log"):
                v = torch.log(1.0 + 15.0 * torch.rand(shape, generator=g, dtype=torch.float64))
            elif name.endswith("dt_bias"):
                v = 2.0 * torch.rand(shape, generator=g, dtype=torch.float64) - 1.0
            elif name.endswith("linear_attn.norm.weight"):
                v = 1.0 + 0.2 * r
            elif len(shape) == 1:
                v = 0.2 * r
            elif name.endswith("embed_tokens.weight"):
                v = r
            else:
                v = r / math.sqrt(shape[-1])
            p.copy_(v.float().to(p.dtype))


def _rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """A perturbed model in float64 (HF float64 copy) and float32 (stock HF), exported, + RefModel."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    mod64 = tt.hf_float64_module()
    assert mod64 is not None
    torch.manual_seed(0)
    m64 = tt.TinyModel(CHECK_MODEL, hf_module=mod64)
    _perturb(m64, 1234)
    m64 = m64.double().eval()
    m32 = tt.TinyModel(CHECK_MODEL).eval()
    m32.load_state_dict({k: v.float() for k, v in m64.state_dict().items()})
    folder = str(tmp_path_factory.mktemp("check") / "model")
    save_checkpoint(folder, tt.model_config(CHECK_MODEL), tt.export_tensors(m64))
    ck = load_checkpoint(folder)
    assert ck.has_mtp and ck.config.num_nextn_predict_layers == 1
    ids = np.random.default_rng(5).integers(0, 256, T_CHECK)
    return dict(m64=m64, m32=m32, ref=RefModel(ck.config, ck.tensors), ck=ck, ids=ids)


def test_export_keys_are_the_loader_layout(checked):
    # the exporter writes exactly what the loader expects: HF trunk names + vLLM's mtp.* names
    from harness.engine.weights import mtp_shapes, trunk_shapes

    ck = checked["ck"]
    want = dict(trunk_shapes(ck.config), **mtp_shapes(ck.config))
    assert sorted(ck.tensors) == sorted(want)
    mtp_keys = {k for k in ck.tensors if k.startswith("mtp.")}
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
            "mtp.norm.weight", "mtp.layers.0.mlp.gate_proj.weight",
            "mtp.layers.0.self_attn.q_norm.weight"} <= mtp_keys
    assert not ck.config.is_moe_layer(0)


def test_torch_float64_equals_refmodel(checked):
    m64, ref, ids = checked["m64"], checked["ref"], checked["ids"]
    T = len(ids)
    with torch.no_grad():
        logits, h, mlogits = m64(torch.as_tensor(ids)[None])
    logits, h, mlogits = logits[0].numpy(), h[0].numpy(), mlogits[0].numpy()
    assert mlogits.shape == (T - 1, CHECK_MODEL["vocab_size"])
    rl, rh = ref.forward(ids)
    assert _rel(rl, logits) <= 1e-9 and _rel(rh, h) <= 1e-9, (_rel(rl, logits), _rel(rh, h))
    # MTP rows p = 0..T-2: token p with the trunk hidden at p-1, zeros for row 0 (the engine's rows)
    hid = np.concatenate([np.zeros((1, rh.shape[1])), rh[:-2]])
    ml, _ = ref.mtp_rows(ids[:-1], hid, ref.new_state(T), 0)
    assert _rel(ml, mlogits) <= 1e-9, _rel(ml, mlogits)
    # the same rows filled incrementally: row 0 first, then rows 1.. from start = 1 on that state
    st = ref.new_state(T)
    ref.mtp_rows(ids[:1], np.zeros((1, rh.shape[1])), st, 0)
    ml1, _ = ref.mtp_rows(ids[1:-1], rh[:-2], st, 1)
    assert _rel(ml1, mlogits[1:]) <= 1e-9
    # mtp_rows(x[1:], h[:-1], start=1) on a *fresh* state is another computation: its position 0
    # holds a zero key/value that the softmax still sees. Rows trained here always have row 0.
    ml_fresh, _ = ref.mtp_rows(ids[1:-1], rh[:-2], ref.new_state(T), 1)
    assert _rel(ml_fresh, mlogits[1:]) > 1e-6


def test_torch_float32_modules_close_to_refmodel(checked):
    # the stock modules the trainer runs (HF float32 casts, our head in float32): float32 tolerance
    m32, ref, ids = checked["m32"], checked["ref"], checked["ids"]
    with torch.no_grad():
        logits, h, mlogits = m32(torch.as_tensor(ids)[None])
    rl, rh = ref.forward(ids)
    hid = np.concatenate([np.zeros((1, rh.shape[1])), rh[:-2]])
    ml, _ = ref.mtp_rows(ids[:-1], hid, ref.new_state(len(ids)), 0)
    assert _rel(logits[0].double().numpy(), rl) <= 1e-5
    assert _rel(mlogits[0].double().numpy(), ml) <= 1e-5


def test_losses_pair_rows_and_targets(checked):
    # main: byte t+1 from position t; MTP: rows 1..T-2 (token p, hidden p-1) predict byte p+1
    m64, ref, ids = checked["m64"], checked["ref"], checked["ids"]
    T = len(ids)
    with torch.no_grad():
        main, (mtp,) = tt.losses(m64, torch.as_tensor(ids)[None])  # depth 1 only
    rl, rh = ref.forward(ids)
    hid = np.concatenate([np.zeros((1, rh.shape[1])), rh[:-2]])
    ml, _ = ref.mtp_rows(ids[:-1], hid, ref.new_state(T), 0)

    def ce(z, y):
        z = z - z.max(-1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(-1)) - z[np.arange(len(y)), y]))

    assert abs(float(main) - ce(rl[:-1], ids[1:])) <= 1e-9 * abs(float(main))
    assert abs(float(mtp) - ce(ml[1:], ids[2:])) <= 1e-9 * abs(float(mtp))
    # and the MTP target of row p really is two bytes past the hidden it reads
    assert ml[1:].shape[0] == len(ids[2:]) == T - 2


def test_chained_depths_are_the_engine_chain(checked):
    # Depth j of the parallel training form at row q = the engine's chain: depth-1 rows 0..p from
    # the trunk, then one row at a time at p+1, p+2, each fed the previous row's output hidden
    # (RefModel.mtp_rows, as Engine.mtp_draft does), the true bytes standing in for accepted drafts.
    m64, ref, ids = checked["m64"], checked["ref"], checked["ids"]
    T = len(ids)
    with torch.no_grad():
        _, _, mls = m64.forward_chain(torch.as_tensor(ids)[None], 3)
    mls = [m[0].numpy() for m in mls]
    rl, rh = ref.forward(ids)
    hid = np.concatenate([np.zeros((1, rh.shape[1])), rh[:-2]])
    chain = tt.ref_chain(ref, ids, hid, 3, stride=1)
    assert len(chain) == 2 * (T - 4)  # every base p = 1..T-4, depths 2 and 3
    for (j, q), z in chain.items():
        assert _rel(z, mls[j - 1][q]) <= 1e-9, (j, q, _rel(z, mls[j - 1][q]))
    # the chained attention matters: depth-2 rows under plain causal attention over their own
    # keys (no depth-1 keys) are another computation
    x = torch.as_tensor(ids)[None]
    with torch.no_grad():
        _, h1 = m64.trunk_forward(x)
        hid1 = torch.cat([torch.zeros_like(h1[:, :1]), h1[:, :T - 2]], dim=1)
        _, out1, _ = m64.mtp_forward(x[:, :-1], hid1)
        plain2, _, _ = m64.mtp_forward(x[:, :-1], torch.cat([torch.zeros_like(out1[:, :1]), out1[:, :-1]], dim=1))
    assert _rel(plain2[0, 2:].numpy(), mls[1][2:]) > 1e-6
    # the depth losses: depth j's rows j..T-2 predict byte q+1
    with torch.no_grad():
        main, mtp = tt.losses(m64, torch.as_tensor(ids)[None], 3)

    def ce(z, y):
        z = z - z.max(-1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(-1)) - z[np.arange(len(y)), y]))

    for j in (2, 3):
        z = np.stack([chain[(j, q)] if (j, q) in chain else mls[j - 1][q] for q in range(j, T - 1)])
        assert abs(float(mtp[j - 1]) - ce(z, ids[j + 1:])) <= 1e-9 * abs(float(mtp[j - 1]))


def test_split_rule_and_selection():
    assert tt.heldout_key("os.py") == tt.heldout_key("os.py")
    key = int.from_bytes(hashlib.sha256(b"json/decoder.py").digest()[:8], "big") / 2.0**64
    assert tt.heldout_key("json/decoder.py") == key
    files = [(f"m{i:03d}.py", (f"# file {i}\n" + "def f(x):\n    return x + 1\n" * 80).encode())
             for i in range(300)]
    train, held = tt.split_files(files, 0.1)
    assert held and train and len(train) + len(held) == 300
    assert all(tt.is_heldout(r, 0.1) for r, _ in held) and not any(tt.is_heldout(r, 0.1) for r, _ in train)
    sample = tt.eval_sample(held, 3, 256)
    assert len(sample) == 3 and len({r for r, _, _ in sample}) == 3
    for r, off, w in sample:
        b = dict(held)[r]
        assert len(w) == 256 and b[off:off + 256] == w and (off == 0 or b[off - 1:off] == b"\n")
    prompts = tt.prompt_excerpts(held, {r for r, _, _ in sample})
    assert len(prompts) == 4 and len({r for r, _, _ in prompts}) == 4
    for (r, off, text), target in zip(prompts, tt.PROMPT_TARGETS):
        assert target // 2 <= len(text) <= target <= 1024
        assert dict(held)[r][off:off + len(text)] == text and text.endswith(b"\n")
    stream = tt.token_stream(held[:2])
    assert len(stream) == sum(len(b) + 1 for _, b in held[:2]) and stream[len(held[0][1])] == tt.EOS


# ------------------------------------------------------------------------------------------------
# --smoke end to end
# ------------------------------------------------------------------------------------------------
def _run_smoke(out, bundle=None):
    cmd = [sys.executable, os.path.join(REPO, "tools", "train_tiny.py"), "--smoke", "--out", out]
    if bundle:
        cmd += ["--bundle", bundle]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout, time.time() - t0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    out = str(root / "models" / "stdlib-small")
    stdout, seconds = _run_smoke(out, bundle=str(root / "bundle"))
    return dict(root=root, out=out, stdout=stdout, seconds=seconds,
                log=json.load(open(os.path.join(out, "train_log.json"))))


def test_smoke_outputs(smoke):
    out, lg = smoke["out"], smoke["log"]
    # ~10 s on two idle cores; the bound leaves room for a loaded CI machine
    assert smoke["seconds"] < 110, smoke["seconds"]
    for f in ("config.json", "model.safetensors", "README.md", "train_log.json", "loss.png", "heldout_eval.bin"):
        assert os.path.isfile(os.path.join(out, f)), f
    with open(os.path.join(out, "loss.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    summary = [ln for ln in smoke["stdout"].splitlines() if ln.startswith("SUMMARY ")]
    assert len(summary) == 1 and "held-out" in summary[0]
    tr = lg["training"]
    assert tr["steps"] == tt.SMOKE_STEPS and tr["tokens"] == tt.SMOKE_STEPS * tr["batch"] * tr["seq_len"]
    assert lg["train"] and lg["evals"] and lg["evals"][0]["step"] == 0
    # it learned something, trunk and head
    assert lg["results"]["heldout"]["bits_per_byte"] < lg["evals"][0]["bits_per_byte"] - 1.0
    assert lg["results"]["heldout"]["mtp_bits_per_byte"] < lg["evals"][0]["mtp_bits_per_byte"] - 1.0
    card = open(os.path.join(out, "README.md"), encoding="utf-8").read()
    ho = lg["results"]["heldout"]
    for text in (f"{ho['bits_per_byte']:.4f}", f"{ho['mtp_top1']:.4f}", "loss.png", "heldout_eval.bin",
                 f"{lg['results']['sample_float64']['bits_per_byte']:.9f}", "sha256(relpath)"):
        assert text in card, text


def test_smoke_export_reproduces_on_refmodel(smoke):
    out, lg = smoke["out"], smoke["log"]
    ck = load_checkpoint(out)
    assert ck.has_mtp and ck.sha256 == lg["model"]["checkpoint_sha256"]
    ref = RefModel(ck.config, ck.tensors)
    T = lg["sample"]["window"]
    raw = open(os.path.join(out, "heldout_eval.bin"), "rb").read()
    assert len(raw) == lg["sample"]["bytes"] == T * len(lg["sample"]["windows"])
    nll = mnll = correct = 0.0
    for w in range(len(raw) // T):
        ids = np.frombuffer(raw[w * T:(w + 1) * T], np.uint8).astype(np.int64)
        logits, h = ref.forward(ids)
        ml, _ = ref.mtp_rows(ids[:-1], np.concatenate([np.zeros((1, h.shape[1])), h[:-2]]), ref.new_state(T), 0)
        for z, y, acc in ((logits[:-1], ids[1:], "nll"), (ml[1:], ids[2:], "mnll")):
            z = z - z.max(-1, keepdims=True)
            v = float((np.log(np.exp(z).sum(-1)) - z[np.arange(len(y)), y]).sum())
            if acc == "nll":
                nll += v
            else:
                mnll += v
        correct += float((ml[1:].argmax(-1) == ids[2:]).sum())
    n = len(raw) // T
    bpb, mbpb, top1 = nll / (n * (T - 1)) / math.log(2), mnll / (n * (T - 2)) / math.log(2), correct / (n * (T - 2))
    s64, s32, sref = lg["results"]["sample_float64"], lg["results"]["sample_float32"], lg["results"]["sample_ref"]
    assert s64["kind"].startswith("HF code with float32 casts widened")
    assert abs(bpb - s64["bits_per_byte"]) <= 1e-9 * bpb
    assert abs(mbpb - s64["mtp_bits_per_byte"]) <= 1e-9 * mbpb
    assert top1 == s64["mtp_top1"] == sref["mtp_top1"]
    assert abs(bpb - s32["bits_per_byte"]) <= 1e-4 * bpb
    assert sref["logits_max_rel_err"] <= 1e-9 and sref["mtp_logits_max_rel_err"] <= 1e-9
    assert abs(sref["bits_per_byte"] - bpb) <= 1e-9 * bpb


def test_smoke_prompts_are_heldout_excerpts(smoke):
    out, lg = smoke["out"], smoke["log"]
    names = sorted(os.listdir(os.path.join(out, "prompts")))
    assert names == [f"heldout{i}.py" for i in range(4)]
    root = lg["data"]["stdlib"]
    held = set(lg["data"]["heldout_files"])
    for meta in lg["prompts"]:
        raw = open(os.path.join(out, "prompts", meta["name"]), "rb").read()
        assert 0 < len(raw) <= 1024 and raw.decode("utf-8")
        assert meta["file"] in held and tt.is_heldout(meta["file"], lg["data"]["heldout_frac"])
        src = open(os.path.join(root, meta["file"]), "rb").read()
        assert src[meta["offset"]:meta["offset"] + len(raw)] == raw
    for w in lg["sample"]["windows"]:
        assert w["file"] in held and not w["file"].startswith("encodings/")


def test_smoke_bundle_reassembles(smoke):
    bdir = smoke["root"] / "bundle"
    parts = sorted(p for p in os.listdir(bdir) if ".tar.part" in p)
    data = b"".join(open(bdir / p, "rb").read() for p in parts)
    digest = open(bdir / "stdlib-small.sha256").read().split()[0]
    assert hashlib.sha256(data).hexdigest() == digest
    with tarfile.open(fileobj=__import__("io").BytesIO(data)) as tf:
        for m in tf.getmembers():
            if m.isfile():
                rel = os.path.relpath(m.name, "stdlib-small")
                assert tf.extractfile(m).read() == open(os.path.join(smoke["out"], rel), "rb").read(), rel


def test_smoke_is_deterministic(smoke, tmp_path):
    out = str(tmp_path / "again")
    _run_smoke(out)
    a = open(os.path.join(smoke["out"], "model.safetensors"), "rb").read()
    b = open(os.path.join(out, "model.safetensors"), "rb").read()
    assert a == b
    for f in ("heldout_eval.bin", *(os.path.join("prompts", f"heldout{i}.py") for i in range(4))):
        assert open(os.path.join(smoke["out"], f), "rb").read() == open(os.path.join(out, f), "rb").read()


def test_stdlib_spec_loads_with_the_smoke_model(smoke):
    from harness.matrix.cells import expand
    from harness.matrix.specfile import load_spec

    # the spec's paths are relative to its folder: ../models/stdlib-small from harness/specs/
    specs = smoke["root"] / "specs"
    specs.mkdir(exist_ok=True)
    shutil.copy(os.path.join(REPO, "harness", "specs", "stdlib.toml"), specs / "stdlib.toml")
    spec = load_spec(str(specs / "stdlib.toml"))
    assert list(spec.models) == ["stdlib"]
    assert os.path.samefile(spec.model_dirs["stdlib"], smoke["out"])
    assert [p.name for p in spec.prompts] == [f"heldout{i}" for i in range(4)]
    assert all(0 < p.length <= 1024 for p in spec.prompts)
    assert spec.k == (1, 2, 3, 4) and spec.max_new_tokens == 64 and spec.labels == ["greedy", "t0.7"]
    cells, notes = expand(spec)
    assert {c.variant for c in cells} == {"unyielded", "split", "yielded-with-peer"}
    assert len(cells) == 4 * 4 * 2 * 3, notes
