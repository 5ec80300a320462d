#!/usr/bin/env python3
"""Train ``stdlib-small``: a byte-level Qwen3-Next model with an MTP head, on the Python standard
library's own ``.py`` sources.

    PYTHONPATH=. python tools/train_tiny.py --out harness/models/stdlib-small --minutes 12
    PYTHONPATH=. python tools/train_tiny.py --smoke --out /tmp/stdlib-smoke     # CPU, < 60 s

Needs the ``train`` extra (torch, transformers) plus numpy, safetensors and matplotlib.

Model. The trunk is HF ``Qwen3NextForCausalLM`` (:data:`MODEL`: hidden 256, 8 layers
``[GDN, GDN, GDN, attention] x 2``, dense SwiGLU MLP, byte vocabulary of 260). The MTP head is
written here in torch in vLLM's Qwen3-Next layout (:class:`MTPHead`; parameter names are the
checkpoint's ``mtp.*`` keys): ``fc(cat[pre_fc_norm_embedding(embed(x_p)),
pre_fc_norm_hidden(h_{p-1})])`` -> one gated full-attention decoder layer (dense MLP,
``intermediate_size``) -> ``mtp.norm`` -> the trunk's ``lm_head``. ``embed`` and ``lm_head`` are
the trunk's (shared, as in vLLM).

MTP rows. The MTP row at position ``p`` pairs the token at ``p`` with the trunk's final normed
hidden state at ``p - 1`` and predicts the token at ``p + 1``; RoPE uses the row's position ``p``.
Row 0 pairs the first token with zeros, exactly as the engine does at the start of a session
(``harness.walk.mtp_walker``; ``RefModel.mtp_rows(ids, [0, h_0 .. h_{T-2}], state, start=0)``). In
training, a window ``x_0 .. x_{T-1}`` gives MTP rows ``p = 0 .. T-2``; row 0 is in the head's
attention context (as in the engine) but **not in the loss** -- rows ``1 .. T-2`` are trained to
predict ``x_2 .. x_{T-1}``, i.e. byte ``t + 2`` from the trunk's hidden at ``t`` and the embedding
of byte ``t + 1``. The loss is DeepSeek-V3's: ``L = L_main + lambda * L_mtp`` with
``lambda = 0.3`` (one MTP depth).

Data. Every ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` (symlinks not followed),
skipping directories named ``site-packages``, ``dist-packages``, ``test``, ``tests``,
``idle_test``, ``__pycache__`` and ``pydoc_data`` (test suites are missing from many installs,
e.g. Debian's and the official Docker images', so excluding them keeps the corpus the same kind
of thing everywhere; ``pydoc_data/topics.py`` is ~750 KB of generated documentation prose in one
file, which would be 60 % of whichever split it fell in). A file is held out when the first 8
bytes of ``sha256(relative posix path)``, read big-endian, divided by 2**64 are below
``--heldout-frac`` (0.05). Each split is its files in sorted path order, each followed by EOS
(257). Training batches are uniformly random crops of ``--seq-len`` bytes of the train stream
(numpy PCG64 seeded by ``--seed``).

Schedule. AdamW (betas 0.9/0.95, weight decay 0.1 on matrices except the embedding), linear
warmup then cosine decay to 10 % of the peak, gradient clipping at 1.0, bf16 autocast on CUDA
(float32 master weights). Unless ``--steps`` is given, the step count is fixed once, after a
probe of steps 20..60 (inside the warmup, so the schedule up to there does not depend on it), from
the measured step time and the ``--minutes`` budget; training also stops at the wall-clock
deadline (script start + ``--minutes``), then the script evaluates and exports (about a minute).
Rerun with ``--steps N`` (N from train_log.json) to repeat a run's schedule exactly.

Outputs under ``--out``: ``config.json`` + ``model.safetensors`` (float32, HF layout plus
``mtp.*``, via ``harness.engine.weights.save_checkpoint``), ``README.md`` (model card),
``train_log.json``, ``loss.png``, ``heldout_eval.bin`` (raw bytes: ``sample_windows`` windows of
``seq_len`` bytes, each from its own held-out file, starting at the first line start after a third
of the file), ``prompts/heldout{0..3}.py`` (held-out excerpts for acceptance receipts: whole
lines from the first ``def``/``class`` after the middle of a file, 896 / 704 / 512 / 320 bytes at
most). Neither takes codec tables (``encodings/``). The
sample is evaluated window by window from an empty state in torch float32 and float64 (HF's code
with its float32 casts widened, as tests/oracle_models.py does), and with our float64 reference
(``RefModel``) on the exported checkpoint. ``--bundle DIR`` also writes the folder as a tar split
in parts of at most 15 MiB (``NAME.tar.partNNN`` + ``NAME.sha256``): rejoin with
``cat NAME.tar.part* > NAME.tar``.
"""

from __future__ import annotations

import time

_T_START = time.time()  # the --minutes budget counts from here (imports included)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import tarfile  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from harness.engine.config import ModelConfig  # noqa: E402
from harness.tokenizer import EOS, VOCAB_SIZE  # noqa: E402

LIN, FULL = "linear_attention", "full_attention"

# The model (HF Qwen3NextConfig names). 4.87 M parameters (4.23 M trunk + 0.64 M MTP head):
# 19.5 MB of float32 safetensors.
MODEL = dict(
    vocab_size=VOCAB_SIZE, hidden_size=256, num_hidden_layers=8, layer_types=[LIN, LIN, LIN, FULL] * 2,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
    linear_conv_kernel_dim=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    rms_norm_eps=1e-6, intermediate_size=320, num_experts=0, tie_word_embeddings=False,
    max_position_embeddings=4096, num_nextn_predict_layers=1,
)
# --smoke: the same layout, CPU-sized.
SMOKE_MODEL = dict(
    MODEL, hidden_size=32, num_hidden_layers=4, layer_types=[LIN, LIN, LIN, FULL],
    linear_key_head_dim=8, linear_value_head_dim=8, head_dim=8, intermediate_size=64,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
)

EXCLUDE_DIRS = ("site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "pydoc_data")
# The sample windows and the prompts skip generated codec tables (encodings/cp*.py, ...): they are
# in both splits, but as acceptance prompts they would flatter the head.
NOT_SAMPLED = ("encodings/",)
PROMPT_TARGETS = (896, 704, 512, 320)  # bytes; + 64 generated tokens stays within seq_len 1024
MAX_EXPORT_BYTES = 20_000_000
PART_BYTES = 15 * 2**20


@dataclasses.dataclass
class Hyper:
    seq_len: int = 1024
    batch: int = 32
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup: int = 200
    weight_decay: float = 0.1
    clip: float = 1.0
    mtp_weight: float = 0.3  # the weight of each MTP depth: DeepSeek-V3's lambda / D
    mtp_depth: int = 3  # chained depths trained (the engine drafts K tokens with one layer)
    eval_every: int = 250
    log_every: int = 25
    eval_windows: int = 32  # held-out windows in the periodic evaluation
    final_windows: int = 2048  # cap on the final held-out evaluation
    sample_windows: int = 8  # heldout_eval.bin
    probe: tuple = (20, 60)  # steps timed to fix the step count
    heldout_frac: float = 0.05
    max_train_bytes: int = 0  # 0: all
    max_heldout_bytes: int = 0


SMOKE_HYPER = dict(seq_len=64, batch=8, lr=3e-3, warmup=5, eval_every=10, log_every=5, eval_windows=4,
                   final_windows=32, sample_windows=2, probe=(3, 6), max_train_bytes=200_000,
                   max_heldout_bytes=60_000)
SMOKE_STEPS = 60


def log(msg: str) -> None:
    print(f"[{time.time() - _T_START:7.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------
def heldout_key(rel: str) -> float:
    """The split rule: sha256 of the relative posix path, first 8 bytes big-endian / 2**64."""
    return int.from_bytes(hashlib.sha256(rel.encode("utf-8")).digest()[:8], "big") / 2.0**64


def is_heldout(rel: str, frac: float) -> bool:
    return heldout_key(rel) < frac


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def stdlib_files(root: str) -> list:
    """[(relative posix path, bytes)] of every .py file under ``root``, sorted by path."""
    out = []
    for dp, dn, fn in os.walk(root):
        dn[:] = sorted(d for d in dn if d not in EXCLUDE_DIRS)
        for f in fn:
            full = os.path.join(dp, f)
            if not f.endswith(".py") or os.path.islink(full) or not os.path.isfile(full):
                continue
            with open(full, "rb") as fh:
                data = fh.read()
            if data:
                out.append((os.path.relpath(full, root).replace(os.sep, "/"), data))
    out.sort()
    return out


def split_files(files: list, frac: float) -> tuple:
    train = [(r, b) for r, b in files if not is_heldout(r, frac)]
    held = [(r, b) for r, b in files if is_heldout(r, frac)]
    return train, held


def cap_files(files: list, max_bytes: int) -> list:
    if not max_bytes:
        return files
    out, n = [], 0
    for r, b in files:
        if n >= max_bytes:
            break
        out.append((r, b))
        n += len(b) + 1
    return out


def token_stream(files: list) -> np.ndarray:
    """Files in order, each followed by EOS, as int64 token ids."""
    parts = []
    for _, b in files:
        parts.append(np.frombuffer(b, np.uint8).astype(np.int64))
        parts.append(np.array([EOS], np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _spread(items: list, n: int) -> list:
    """n items evenly spread over the list (deterministic), fewer if the list is shorter."""
    if len(items) <= n:
        return list(items)
    return [items[(2 * i + 1) * len(items) // (2 * n)] for i in range(n)]


def _line_start(b: bytes, pos: int) -> int:
    if pos <= 0:
        return 0
    i = b.find(b"\n", pos - 1)
    return len(b) if i < 0 else i + 1


def eval_sample(held: list, n: int, T: int) -> list:
    """[(relpath, offset, window bytes)]: ``n`` windows of ``T`` bytes from ``n`` held-out files
    (files of >= 2T bytes, evenly spread in path order), each starting at the first line start at
    or after a third of its file."""
    eligible = [(r, b) for r, b in held if len(b) >= 2 * T and not r.startswith(NOT_SAMPLED)]
    out = []
    for r, b in _spread(eligible, n):
        s = min(_line_start(b, len(b) // 3), len(b) - T)
        out.append((r, s, b[s:s + T]))
    return out


_DEF = (b"def ", b"class ", b"async def ", b"    def ", b"    async def ")


def prompt_excerpts(held: list, avoid: set, targets=PROMPT_TARGETS) -> list:
    """[(relpath, offset, bytes)]: one excerpt per target size from distinct held-out files (not
    in ``avoid`` where possible): whole lines from the first ``def``/``class`` line after the
    middle of the file, as many as fit in the target (<= 1 KiB), valid UTF-8."""
    def ok(b):
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return b"\0" not in b and b"\r" not in b

    pool = [(r, b) for r, b in held if len(b) >= 1500 and ok(b) and not r.startswith(NOT_SAMPLED)]
    fresh = [x for x in pool if x[0] not in avoid]
    n = len(fresh)
    out, used = [], set()
    for i, target in enumerate(targets):
        # target i scans the fresh files from i/len(targets) of the way along, then the avoided ones
        s0 = (2 * i + 1) * n // (2 * len(targets)) if n else 0
        for r, b in fresh[s0:] + fresh[:s0] + [x for x in pool if x[0] in avoid]:
            if r in used:
                continue
            lines = b[_line_start(b, len(b) // 2):].splitlines(keepends=True)
            k = next((i for i, ln in enumerate(lines) if ln.startswith(_DEF)), 0)
            text = b""
            for ln in lines[k:]:
                if len(text) + len(ln) > target:
                    break
                text += ln
            if len(text) >= target // 2 and ok(text):
                out.append((r, b.find(text), text))
                used.add(r)
                break
    return out


# ------------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------------
_F64_SUBS = [(r"torch\.float32\b", "torch.float64"), (r"torch\.float\b", "torch.float64"),
             (r"\.float\(\)", ".double()")]


@functools.lru_cache(maxsize=None)
def hf_float64_module():
    """HF's qwen3_next modeling code with its float32 casts widened to float64 (the same device as
    tests/oracle_models.py): HF's ``model.double()`` still rounds to float32 in its norms, gated
    delta rule and RoPE. Returns the module, or None when the copy cannot be made."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf_mod

    try:
        src = inspect.getsource(hf_mod)
        total = 0
        for pat, rep in _F64_SUBS:
            src, n = re.subn(pat, rep, src)
            total += n
        if total < 8:
            return None
        name = hf_mod.__name__ + "_float64_train"
        mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
        mod.__package__ = hf_mod.__package__
        mod.__file__ = hf_mod.__file__
        sys.modules[name] = mod
        exec(compile(src, f"{hf_mod.__file__} (float64 copy)", "exec"), mod.__dict__)
        return mod
    except Exception as e:  # noqa: BLE001 - a missing float64 copy only weakens one number
        log(f"float64 copy of HF's qwen3_next code failed ({type(e).__name__}: {e}); using model.double()")
        return None


def hf_config(d: dict, attn: str = "sdpa"):
    from transformers import Qwen3NextConfig

    kw = {k: v for k, v in d.items() if k != "num_nextn_predict_layers"}
    cfg = Qwen3NextConfig(**kw, pad_token_id=None)
    cfg._attn_implementation = attn
    return cfg


class ZeroRMSNorm(nn.Module):
    """Zero-centred RMSNorm ``x / sqrt(mean(x²) + eps) * (1 + w)``, computed in float32 (float64
    for float64 input), returned in the input dtype (as HF's Qwen3NextRMSNorm)."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n))
        self.eps = eps

    def forward(self, x):
        xf = x if x.dtype == torch.float64 else x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.to(xf.dtype))
        return y.to(x.dtype)


def apply_rope(x, cos, sin, rot: int):
    """Rotate-half RoPE on the first ``rot`` dims. x: [B, heads, R, D]; cos, sin: [R, rot/2]."""
    half = rot // 2
    x1, x2, rest = x[..., :half], x[..., half:rot], x[..., rot:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class MTPAttention(nn.Module):
    """Qwen3-Next gated attention: q_proj emits query ‖ gate per head, per-head q_norm / k_norm,
    partial RoPE, GQA, causal softmax, output * sigmoid(gate), o_proj."""

    def __init__(self, d: dict):
        super().__init__()
        h, hd = d["hidden_size"], d["head_dim"]
        self.nh, self.nkv, self.hd = d["num_attention_heads"], d["num_key_value_heads"], hd
        self.q_proj = nn.Linear(h, self.nh * hd * 2, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, h, bias=False)
        self.q_norm = ZeroRMSNorm(hd, d["rms_norm_eps"])
        self.k_norm = ZeroRMSNorm(hd, d["rms_norm_eps"])

    def forward(self, x, cos, sin, rot, prev=()):
        """``prev``: the (k, v) of the earlier depths of a chain (see :func:`chained_attention`);
        empty for depth 1 (plain causal attention). Returns (output, (k, v)), k/v [B, kv heads, R,
        head_dim] after RoPE."""
        B, R, _ = x.shape
        qg = self.q_proj(x).view(B, R, self.nh, 2 * self.hd)
        q, gate = qg[..., :self.hd], qg[..., self.hd:].reshape(B, R, self.nh * self.hd)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, R, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, R, self.nkv, self.hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q, k = apply_rope(q, cos, sin, rot), apply_rope(k, cos, sin, rot)
        v = v.to(q.dtype)
        rep = self.nh // self.nkv

        def heads(t):
            return t.repeat_interleave(rep, dim=1) if rep != 1 else t

        if prev:
            o = chained_attention(q, [heads(a) for a, _ in prev] + [heads(k)],
                                  [heads(b) for _, b in prev] + [heads(v)])
        else:
            o = F.scaled_dot_product_attention(q, heads(k), heads(v), is_causal=True)
        o = o.transpose(1, 2).reshape(B, R, self.nh * self.hd)
        return self.o_proj(o * torch.sigmoid(gate)), (k, v)


def _wide(z):
    """float32 for reduced precision, float64 stays float64."""
    return z if z.dtype == torch.float64 else z.float()


def _shift(t, s: int):
    """t [..., R, D] moved ``s`` rows down along R (row q holds row q - s; zeros above)."""
    if s == 0:
        return t
    return torch.cat([torch.zeros_like(t[..., :s, :]), t[..., :-s, :]], dim=-2)


def chained_attention(q, ks, vs):
    """The attention of depth ``j = len(ks)`` of a chained MTP draft, for every row at once.

    In the engine (``Engine.mtp_draft``, ``RefModel.mtp_draft``) the head first fills rows
    ``0..p`` from the trunk (depth 1), then drafts: the depth-2 row at ``p + 1`` attends to the
    depth-1 keys at ``0..p`` and to itself, the depth-3 row at ``p + 2`` to the depth-1 keys at
    ``0..p``, the depth-2 key at ``p + 1`` and itself, and so on. Here row ``q`` of depth ``j`` is
    the chain whose base is ``p = q - (j - 1)``: it sees ``ks[0]`` (depth 1) at positions
    ``<= q - (j - 1)`` and ``ks[i]`` (depth ``i + 1``) at position ``q - (j - 1 - i)`` only.
    q, ks[i], vs[i]: [B, heads, R, D] (same heads). Softmax in float32 (float64 for float64)."""
    j, R = len(ks), q.shape[-2]
    scale = q.shape[-1] ** -0.5
    pos = torch.arange(R, device=q.device)
    seen = pos[None, :] <= pos[:, None] - (j - 1)
    s = [_wide(q @ ks[0].transpose(-1, -2)) * scale]
    s[0] = s[0].masked_fill(~seen, float("-inf"))
    for i in range(1, j):
        s.append(_wide((q * _shift(ks[i], j - 1 - i)).sum(-1, keepdim=True)) * scale)
    p = torch.softmax(torch.cat(s, dim=-1), dim=-1).to(q.dtype)
    o = p[..., :R] @ vs[0]
    for i in range(1, j):
        o = o + p[..., R + i - 1:R + i] * _shift(vs[i], j - 1 - i)
    return o


class MTPMLP(nn.Module):
    def __init__(self, d: dict):
        super().__init__()
        h, i = d["hidden_size"], d["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MTPLayer(nn.Module):
    """``mtp.layers.0``: a full-attention Qwen3-Next decoder layer with a dense MLP."""

    def __init__(self, d: dict):
        super().__init__()
        self.input_layernorm = ZeroRMSNorm(d["hidden_size"], d["rms_norm_eps"])
        self.self_attn = MTPAttention(d)
        self.post_attention_layernorm = ZeroRMSNorm(d["hidden_size"], d["rms_norm_eps"])
        self.mlp = MTPMLP(d)

    def forward(self, x, cos, sin, rot, prev=()):
        a, kv = self.self_attn(self.input_layernorm(x), cos, sin, rot, prev)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class MTPHead(nn.Module):
    """vLLM's Qwen3-Next MTP predictor (without the shared embedding and lm head). Its
    ``state_dict`` keys, prefixed ``mtp.``, are the checkpoint's."""

    def __init__(self, d: dict, init_std: float = 0.02):
        super().__init__()
        h, eps = d["hidden_size"], d["rms_norm_eps"]
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = ZeroRMSNorm(h, eps)
        self.pre_fc_norm_hidden = ZeroRMSNorm(h, eps)
        self.layers = nn.ModuleList([MTPLayer(d)])
        self.norm = ZeroRMSNorm(h, eps)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    m.weight.normal_(0.0, init_std)

    def forward(self, emb, hid, cos, sin, rot, prev=()):
        """Returns (out hidden, (k, v) of the attention); ``prev`` as in :class:`MTPAttention`."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hid)], dim=-1))
        x, kv = self.layers[0](x, cos, sin, rot, prev)
        return self.norm(x), kv


class TinyModel(nn.Module):
    """HF ``Qwen3NextForCausalLM`` trunk + :class:`MTPHead`. ``hf_module`` picks the modeling code
    (default: transformers' own; :func:`hf_float64_module` for float64 checks)."""

    def __init__(self, d: dict, hf_module=None, attn: str = "sdpa"):
        super().__init__()
        if hf_module is None:
            from transformers.models.qwen3_next import modeling_qwen3_next as hf_module
        self.d = dict(d)
        self.trunk = hf_module.Qwen3NextForCausalLM(hf_config(d, attn))
        self.mtp = MTPHead(d, getattr(self.trunk.config, "initializer_range", 0.02))
        rp = d["rope_parameters"]
        self.rot = int(d["head_dim"] * rp["partial_rotary_factor"])
        self.theta = float(rp["rope_theta"])

    def rope(self, n: int, device):
        """cos, sin [n, rot/2] for positions 0..n-1, computed in float64."""
        inv = self.theta ** (-torch.arange(0, self.rot, 2, dtype=torch.float64, device=device) / self.rot)
        ang = torch.arange(n, dtype=torch.float64, device=device)[:, None] * inv[None, :]
        return ang.cos(), ang.sin()

    def trunk_forward(self, x):
        """x [B, T] -> (logits [B, T, V], final normed hidden [B, T, H])."""
        h = self.trunk.model(input_ids=x, use_cache=False).last_hidden_state
        return self.trunk.lm_head(h), h

    def mtp_forward(self, tokens, hiddens, prev=()):
        """MTP rows at positions 0..R-1: ``tokens`` [B, R] (the token at each row's position),
        ``hiddens`` [B, R, H] (the hidden of the position before: the trunk's at depth 1, zeros for
        row 0; the previous depth's output at depth > 1). ``prev``: the (k, v) of the earlier
        depths (:func:`chained_attention`). Returns (logits [B, R, V], out hidden [B, R, H], (k, v))."""
        cos, sin = self.rope(tokens.shape[1], tokens.device)
        out, kv = self.mtp(self.trunk.model.embed_tokens(tokens), hiddens, cos, sin, self.rot, prev)
        return self.trunk.lm_head(out), out, kv

    def mtp_chain(self, x, h, depth: int):
        """MTP logits of depths 1..``depth`` over a window, each [B, T-1, V] (row q = position q,
        predicting x_{q+1}). Depth 1 pairs x_q with the trunk's h_{q-1} (zeros for q = 0); depth
        j > 1 pairs x_q with depth j-1's output at q - 1 -- the chained draft of the engine, with
        the true bytes standing in for accepted drafts. Depth j's row q is valid for q >= j - 1
        (its chain's base row q - j + 1 >= 0)."""
        out_l = []
        prev = []
        hid = torch.cat([torch.zeros_like(h[:, :1]), h[:, :x.shape[1] - 2]], dim=1)
        for _ in range(depth):
            ml, out, kv = self.mtp_forward(x[:, :-1], hid, tuple(prev))
            out_l.append(ml)
            prev.append(kv)
            hid = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
        return out_l

    def forward(self, x):
        """x [B, T] -> (trunk logits [B, T, V], hidden [B, T, H], MTP logits [B, T-1, V]); MTP row
        p (0..T-2) pairs x_p with h_{p-1} (zeros for p = 0) and predicts x_{p+1}."""
        logits, h, ml = self.forward_chain(x, 1)
        return logits, h, ml[0]

    def forward_chain(self, x, depth: int):
        """(trunk logits, hidden, [MTP logits of depth 1..``depth``]) (:meth:`mtp_chain`)."""
        logits, h = self.trunk_forward(x)
        return logits, h, self.mtp_chain(x, h, depth)


def losses(model: TinyModel, x, depth: int = 1):
    """(main loss, [MTP loss of depth 1..depth]), mean nats per predicted byte. Depth j's rows
    j..T-2 are in its loss (row 0 of depth 1, and the rows whose chain would start there, are not)."""
    logits, _, ml = model.forward_chain(x, depth)
    V = logits.shape[-1]
    main = F.cross_entropy(_wide(logits[:, :-1].reshape(-1, V)), x[:, 1:].reshape(-1))
    mtp = [F.cross_entropy(_wide(m[:, j:].reshape(-1, V)), x[:, j + 1:].reshape(-1))
           for j, m in enumerate(ml, start=1)]
    return main, mtp


def export_tensors(model: TinyModel) -> dict:
    """Internal checkpoint names -> float32 numpy arrays (conv1d kept as [C, K])."""
    out = {}
    for k, v in model.trunk.state_dict().items():
        a = v.detach().to("cpu", torch.float32).numpy().copy()
        if k.endswith("linear_attn.conv1d.weight") and a.ndim == 3:
            a = a.reshape(a.shape[0], a.shape[2])
        out[k] = a
    if model.d.get("tie_word_embeddings"):
        out.pop("lm_head.weight", None)
    for k, v in model.mtp.state_dict().items():
        out["mtp." + k] = v.detach().to("cpu", torch.float32).numpy().copy()
    return out


def model_config(d: dict) -> ModelConfig:
    return ModelConfig.from_dict(json.loads(json.dumps(d)))


# ------------------------------------------------------------------------------------------------
# evaluation
# ------------------------------------------------------------------------------------------------
_EVAL_KEYS = ("nll", "n", "correct", "mtp_nll", "mtp_n", "mtp_correct", "agree")


def _chain_keys(depth: int) -> tuple:
    return tuple(f"mtp{j}_{k}" for j in range(2, depth + 1) for k in ("nll", "n", "correct"))


@torch.no_grad()
def evaluate(model: TinyModel, windows, batch: int, amp: bool = False, per_window: bool = False,
             depth: int = 1) -> dict:
    """Windows [N, T] (token ids), each from an empty state. Trunk: predict x_{t+1} at t = 0..T-2;
    MTP: rows 1..T-2 predict x_{p+1}; ``agree``: MTP argmax == trunk argmax at the same target (a
    teacher-forced proxy of greedy K=1 acceptance). With ``depth`` > 1 also the chained depths
    (``mtp{j}_*``, rows j..T-2, true bytes standing in for accepted drafts: the conditional
    acceptance of draft position j). Returns bits/byte and top-1 rates."""
    was = model.training
    model.eval()
    dev = windows.device
    keys = _EVAL_KEYS + _chain_keys(depth)
    tot = {k: 0.0 for k in keys}
    rows = []
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            logits, _, mls = model.forward_chain(x, depth)
        lt = _wide(logits[:, :-1])
        y = x[:, 1:]
        nll = F.cross_entropy(lt.transpose(1, 2), y, reduction="none").double()
        top = lt.argmax(-1)
        w = {"nll": nll.sum(1), "n": torch.full_like(nll[:, 0], nll.shape[1]),
             "correct": (top == y).double().sum(1)}
        for j, m in enumerate(mls, start=1):
            ml, ym = _wide(m[:, j:]), x[:, j + 1:]
            mnll = F.cross_entropy(ml.transpose(1, 2), ym, reduction="none").double()
            mtop = ml.argmax(-1)
            pre = "mtp" if j == 1 else f"mtp{j}"
            w.update({f"{pre}_nll": mnll.sum(1), f"{pre}_n": torch.full_like(mnll[:, 0], mnll.shape[1]),
                      f"{pre}_correct": (mtop == ym).double().sum(1)})
            if j == 1:
                w["agree"] = (mtop == top[:, 1:]).double().sum(1)
        w = {k: v.cpu().numpy() for k, v in w.items()}
        for k in keys:
            tot[k] += float(w[k].sum())
        if per_window:
            rows += [_rates({k: float(w[k][jw]) for k in keys}, depth) for jw in range(x.shape[0])]
    model.train(was)
    out = _rates(tot, depth)
    out["windows"] = int(windows.shape[0])
    if per_window:
        out["per_window"] = rows
    return out


def _rates(t: dict, depth: int = 1) -> dict:
    ln2 = math.log(2.0)
    out = {"bits_per_byte": t["nll"] / t["n"] / ln2, "top1": t["correct"] / t["n"],
           "mtp_bits_per_byte": t["mtp_nll"] / t["mtp_n"] / ln2, "mtp_top1": t["mtp_correct"] / t["mtp_n"],
           "mtp_trunk_agreement": t["agree"] / t["mtp_n"], "predictions": int(t["n"]),
           "mtp_predictions": int(t["mtp_n"])}
    if depth > 1:
        out["mtp_chain_top1"] = [out["mtp_top1"]] + [t[f"mtp{j}_correct"] / t[f"mtp{j}_n"]
                                                     for j in range(2, depth + 1)]
        out["mtp_chain_bits_per_byte"] = [out["mtp_bits_per_byte"]] + [
            t[f"mtp{j}_nll"] / t[f"mtp{j}_n"] / ln2 for j in range(2, depth + 1)]
    return out


def windows_of(stream: np.ndarray, T: int, cap: int) -> np.ndarray:
    """Non-overlapping windows of T tokens from the stream (the last partial one dropped); at most
    ``cap`` of them, evenly spread."""
    n = len(stream) // T
    w = stream[:n * T].reshape(n, T)
    if n > cap:
        w = w[np.linspace(0, n - 1, cap).round().astype(np.int64)]
    return w


def ref_chain(ref, ids, hid, depth: int, stride: int = 1) -> dict:
    """The chained MTP logits as the engine computes them: depth-1 rows over the window, then for
    each chain base p (1, 1 + stride, ..) the rows at p+1 .. p+depth-1 one at a time, each fed the
    previous row's output hidden, the true bytes standing in for accepted drafts (the cache rows
    they overwrite are restored after each chain). Returns {(depth j, row q): logits [V]}."""
    T = len(ids)
    st = ref.new_state(T)
    _, out = ref.mtp_rows(ids[:-1], hid, st, 0)
    res = {}
    for p in range(1, T - depth, stride):
        keep = (st.mtp_k[p + 1:p + depth].copy(), st.mtp_v[p + 1:p + depth].copy())
        o = out[p:p + 1]
        for j in range(2, depth + 1):
            q = p + j - 1
            lg, o = ref.mtp_rows(ids[q:q + 1], o, st, q)
            res[(j, q)] = lg[0]
        st.mtp_k[p + 1:p + depth], st.mtp_v[p + 1:p + depth] = keep
    return res


def ref_check(folder: str, sample: np.ndarray, torch64: dict, chain_stride: int = 16) -> dict:
    """Our float64 reference over the exported checkpoint on the sample windows, against the torch
    float64 logits (trunk, MTP rows and, when ``torch64`` has ``mtp_chain``, the chained depths
    at every ``chain_stride``-th base) and per-window bits/byte."""
    from harness.engine.weights import load_checkpoint
    from numba_kernels.reference import RefModel

    ck = load_checkpoint(folder)
    ref = RefModel(ck.config, ck.tensors)
    worst_l = worst_m = worst_c = 0.0
    ln2 = math.log(2.0)
    nll = mnll = n = mn = correct = 0.0
    for w, ids in enumerate(sample):
        T = len(ids)
        lg, h = ref.forward(ids)
        hid = np.concatenate([np.zeros((1, h.shape[1])), h[:-2]])
        ml, _ = ref.mtp_rows(ids[:-1], hid, ref.new_state(T), 0)
        tl, tm = torch64["logits"][w], torch64["mtp_logits"][w]
        worst_l = max(worst_l, float(np.abs(lg - tl).max() / np.abs(tl).max()))
        worst_m = max(worst_m, float(np.abs(ml - tm).max() / np.abs(tm).max()))
        chain = torch64.get("mtp_chain")
        if chain:
            for (j, q), z in ref_chain(ref, ids, hid, len(chain) + 1, chain_stride).items():
                t = chain[j - 2][w][q]
                worst_c = max(worst_c, float(np.abs(z - t).max() / np.abs(t).max()))

        def ce(z, y):
            z = z - z.max(-1, keepdims=True)
            return float((np.log(np.exp(z).sum(-1)) - z[np.arange(len(y)), y]).sum())

        nll += ce(lg[:-1], ids[1:])
        n += T - 1
        mnll += ce(ml[1:], ids[2:])
        mn += T - 2
        correct += float((ml[1:].argmax(-1) == ids[2:]).sum())
    return {"windows": int(len(sample)), "logits_max_rel_err": worst_l, "mtp_logits_max_rel_err": worst_m,
            "bits_per_byte": nll / n / ln2, "mtp_bits_per_byte": mnll / mn / ln2, "mtp_top1": correct / mn,
            "chain_logits_max_rel_err": worst_c if torch64.get("mtp_chain") else float("nan"),
            "chain_stride": chain_stride, "checkpoint_sha256": ck.sha256}


# ------------------------------------------------------------------------------------------------
# outputs
# ------------------------------------------------------------------------------------------------
def write_json(path: str, obj) -> None:
    from harness.atomic import write_text_atomic

    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def plot_losses(logd: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr, ev = logd["train"], logd["evals"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    if tr:
        a1.plot([r["step"] for r in tr], [r["train_bits_per_byte"] for r in tr], color="C0", alpha=0.5, lw=1,
                label="train (trunk)")
        a1.plot([r["step"] for r in tr], [r["train_mtp_bits_per_byte"] for r in tr], color="C1", alpha=0.5, lw=1,
                label="train (MTP)")
    if ev:
        st = [r["step"] for r in ev]
        a1.plot(st, [r["bits_per_byte"] for r in ev], "o-", color="C0", ms=3, label="held-out (trunk)")
        a1.plot(st, [r["mtp_bits_per_byte"] for r in ev], "s-", color="C1", ms=3, label="held-out (MTP)")
        a2.plot(st, [r["top1"] for r in ev], "o-", color="C0", ms=3, label="trunk top-1")
        a2.plot(st, [r["mtp_top1"] for r in ev], "s-", color="C1", ms=3, label="MTP top-1")
        a2.plot(st, [r["mtp_trunk_agreement"] for r in ev], "^-", color="C2", ms=3, label="MTP = trunk argmax")
        for j in range(2, len(ev[-1].get("mtp_chain_top1", [])) + 1):
            a1.plot(st, [r["mtp_chain_bits_per_byte"][j - 1] for r in ev], "s--", color=f"C{j + 1}", ms=3,
                    label=f"held-out (MTP depth {j})")
            a2.plot(st, [r["mtp_chain_top1"][j - 1] for r in ev], "s--", color=f"C{j + 1}", ms=3,
                    label=f"MTP depth {j} top-1")
    fin, last = logd["results"].get("heldout"), logd["training"].get("steps", 0)
    if fin:
        a1.plot([last], [fin["bits_per_byte"]], "*", color="C0", ms=10, label="final, all held-out (trunk)")
        a1.plot([last], [fin["mtp_bits_per_byte"]], "*", color="C1", ms=10, label="final, all held-out (MTP)")
        a2.plot([last], [fin["top1"]], "*", color="C0", ms=10)
        a2.plot([last], [fin["mtp_top1"]], "*", color="C1", ms=10)
        a2.plot([last], [fin["mtp_trunk_agreement"]], "*", color="C2", ms=10)
    a1.set_xlabel("step")
    a1.set_ylabel("bits / byte")
    a1.set_ylim(bottom=0)
    a1.set_title("loss")
    a1.grid(alpha=0.3)
    a1.legend()
    a2.set_xlabel("step")
    a2.set_ylabel("rate")
    a2.set_ylim(0, 1)
    a2.set_title("held-out accuracy")
    a2.grid(alpha=0.3)
    a2.legend()
    fig.suptitle(f"{logd['name']}: {logd['model']['params_total'] / 1e6:.2f} M params, "
                 f"{logd['training'].get('steps', 0)} steps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bundle(folder: str, dest: str) -> list:
    """tar of ``folder`` (deterministic order and metadata) in parts of <= PART_BYTES."""
    name = os.path.basename(os.path.normpath(folder))
    buf = io.BytesIO()

    def clean(ti):
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        ti.mtime = 0
        return ti

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(folder, arcname=name, filter=clean)
    data = buf.getvalue()
    os.makedirs(dest, exist_ok=True)
    paths = []
    for i in range(0, max(1, len(data)), PART_BYTES):
        p = os.path.join(dest, f"{name}.tar.part{i // PART_BYTES:03d}")
        with open(p, "wb") as f:
            f.write(data[i:i + PART_BYTES])
        paths.append(p)
    with open(os.path.join(dest, f"{name}.sha256"), "w") as f:
        f.write(f"{hashlib.sha256(data).hexdigest()}  {name}.tar\n")
    for extra in ("README.md", "train_log.json", "loss.png"):  # to look at without unpacking
        src = os.path.join(folder, extra)
        if os.path.isfile(src):
            with open(src, "rb") as fi, open(os.path.join(dest, extra), "wb") as fo:
                fo.write(fi.read())
    return paths


CARD = """# {name} — a byte-level Qwen3-Next model with a trained MTP head

Trained by `tools/train_tiny.py` on the Python {pyver} standard library's own `.py` sources, read
as bytes. {what}

## Model

- Qwen3-Next hybrid layout (HF `Qwen3NextForCausalLM`): hidden {hidden_size}, {num_hidden_layers} layers
  `{layer_pattern}`; gated DeltaNet {linear_num_key_heads} key / {linear_num_value_heads} value heads
  × {linear_key_head_dim}/{linear_value_head_dim}, conv kernel {linear_conv_kernel_dim}; gated attention
  {num_attention_heads} heads / {num_key_value_heads} KV heads × {head_dim}, partial rotary {prf}
  (theta {theta:g}); dense SwiGLU MLP {intermediate_size}; zero-centred RMSNorm eps {rms_norm_eps:g};
  untied lm head.
- Byte vocabulary of {vocab_size}: ids 0..255 are bytes, BOS 256, EOS 257 (the file separator in
  training), PAD 258, one spare.
- One MTP layer in vLLM's Qwen3-Next layout (`mtp.fc`, `mtp.pre_fc_norm_embedding`,
  `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*` = one gated full-attention decoder layer with a dense
  MLP of {intermediate_size}, `mtp.norm`; embedding and lm head shared with the trunk).
- {params_total:,} parameters ({params_trunk:,} trunk + {params_mtp:,} MTP head);
  `model.safetensors` float32, {size_mb:.2f} MB, sha256 over the files `{sha}`.

## Data

- Every `.py` file under `sysconfig.get_paths()["stdlib"]` (`{root}`), skipping directories named
  {excluded}: {n_files} files, {n_bytes:,} bytes.
- Split by file: held out when `int.from_bytes(sha256(relpath).digest()[:8], "big") / 2**64 <
  {frac}` (relpath = the posix path relative to the stdlib folder): {n_train} train files
  ({train_bytes:,} bytes), {n_held} held-out files ({held_bytes:,} bytes). The held-out list is in
  `train_log.json`.
- Each split is its files in path order, each followed by EOS. Batches are uniformly random crops of
  {seq_len} bytes of the train stream (seeded).

## Training

- Loss `L_main + {lam} · (L_mtp1 + … + L_mtp{depth})` (DeepSeek-V3's MTP objective `λ/D · Σ L_k` with
  D = {depth} depths, each weighing {lam}), all mean cross-entropy per predicted byte. Depth 1: the MTP
  row at position p pairs the byte at p with the trunk's final normed hidden state at p-1 (RoPE at
  position p) and predicts byte p+1. Row 0 pairs the first byte with zeros — exactly what the
  engine does at the start of a session — and is in the head's attention context but not in the
  loss. Depth j > 1 is the engine's chained draft, trained for every row at once: the row at q
  pairs byte q with depth j-1's output hidden at q-1 and attends to the depth-1 keys at positions
  ≤ q-j+1 and to its own chain's deeper keys (`chained_attention` in `tools/train_tiny.py`; the true
  bytes stand in for accepted drafts). The same one MTP layer serves every depth.
- AdamW (β 0.9/0.95, weight decay {wd} on matrices except the embedding), peak lr {lr:g}, {warmup} warmup
  steps, cosine to {minlr:g}; gradient clipping {clip}; batch {batch} × {seq_len} bytes; bf16 autocast
  on CUDA, float32 weights; seed {seed}.
- {steps} steps ({planned} planned{stopped}), {tokens:,} training bytes (≈ {epochs:.1f} epochs), {train_s:.0f} s
  of training on {device} ({tok_s:,.0f} bytes/s); torch {torch}, transformers {transformers}.

![loss curves](loss.png)

## Results

Held-out set ({ho_windows} windows of {seq_len} bytes from the held-out stream, each from an empty
state; torch float32; the curves' held-out points use {ev_windows} of them, under bf16 autocast on CUDA):

| | bits/byte | top-1 |
|---|---|---|
| trunk (next byte) | {ho_bpb:.4f} | {ho_top1:.4f} |
| MTP head (byte after next) | {ho_mbpb:.4f} | {ho_mtop1:.4f} |

MTP argmax equals the trunk's argmax for the same byte on {ho_agree:.1%} of the rows (a
teacher-forced proxy for greedy acceptance at K = 1). Chained drafts, teacher-forced (depth j
predicts byte q+1 at row q from depth j-1's hidden; the rate of draft position j given that the
earlier drafts were right):

| depth | {chain_head} |
|---|{chain_sep}|
| bits/byte | {chain_bpb} |
| top-1 | {chain_top1} |

### `heldout_eval.bin`

{sw} windows of {seq_len} raw bytes ({sample_bytes:,} bytes), window i = bytes `[offset, offset + {seq_len})`
of held-out file i (below; codec tables under `encodings/` are not sampled), each evaluated from
an empty state: trunk over positions 0..{tm2}
(predicting bytes 1..{tm1}), MTP over rows 1..{tm2} (row 0 pairs byte 0 with zeros; predicting
bytes 2..{tm1}).

| evaluation | trunk bits/byte | MTP bits/byte | MTP top-1 |
|---|---|---|---|
| torch float32 | {s32_bpb:.6f} | {s32_mbpb:.6f} | {s32_mtop1:.6f} |
| torch float64 ({f64_kind}) | {s64_bpb:.9f} | {s64_mbpb:.9f} | {s64_mtop1:.6f} |
| `RefModel` float64 on the export | {r_bpb:.9f} | {r_mbpb:.9f} | {r_mtop1:.6f} |

Reference vs torch float64: max relative logit error {r_err:.1e} (trunk), {r_merr:.1e} (MTP rows),
{r_cerr:.1e} (chained depths 2..{depth}: `RefModel.mtp_rows` one row at a time, as the engine drafts,
against the parallel training form, every {r_stride}th chain base).

| window | file | offset |
|---|---|---|
{sample_rows}

## Prompts

Held-out excerpts for acceptance receipts (`harness/specs/stdlib.toml`): whole lines from the first
`def` / `class` line after the middle of a held-out file (not a sample file, not `encodings/`), UTF-8:

| file | bytes | from | offset |
|---|---|---|---|
{prompt_rows}

## Reproduce

    PYTHONPATH=. python tools/train_tiny.py --out {out_rel} --minutes {minutes:g} --seed {seed} --steps {steps}

(`--steps` repeats this run's schedule; GPU arithmetic is not bitwise reproducible.)
"""


def write_card(path: str, logd: dict) -> None:
    m, d, t, r = logd["model"], logd["data"], logd["training"], logd["results"]
    c = logd["model"]["config"]
    ho, s32, s64, ref = r["heldout"], r["sample_float32"], r["sample_float64"], r["sample_ref"]
    pat = ", ".join({LIN: "GDN", FULL: "attn"}[x] for x in c["layer_types"])
    chain_t = ho.get("mtp_chain_top1", [ho["mtp_top1"]])
    chain_b = ho.get("mtp_chain_bits_per_byte", [ho["mtp_bits_per_byte"]])
    stopped = ""
    if t.get("stopped_by_time"):
        stopped = "; stopped at the time limit"
    card = CARD.format(
        name=logd["name"], pyver=d["python"], what=("Smoke run: tiny config, a data subset, a few steps."
                                                    if logd["smoke"] else ""),
        layer_pattern=pat, prf=c["rope_parameters"]["partial_rotary_factor"],
        theta=c["rope_parameters"]["rope_theta"], params_total=m["params_total"], params_trunk=m["params_trunk"],
        params_mtp=m["params_mtp"], size_mb=m["export_bytes"] / 1e6, sha=m["checkpoint_sha256"],
        root=d["stdlib"], excluded=", ".join(f"`{x}`" for x in EXCLUDE_DIRS), n_files=d["n_files"],
        n_bytes=d["n_bytes"], frac=d["heldout_frac"], n_train=d["n_train_files"], train_bytes=d["train_bytes"],
        n_held=d["n_heldout_files"], held_bytes=d["heldout_bytes"], seq_len=t["seq_len"], lam=t["mtp_weight"],
        wd=t["weight_decay"], lr=t["lr"], warmup=t["warmup"], minlr=t["lr"] * t["min_lr_frac"], clip=t["clip"],
        batch=t["batch"], seed=t["seed"], steps=t["steps"], planned=t["planned_steps"], stopped=stopped,
        tokens=t["tokens"], epochs=t["tokens"] / max(1, d["train_tokens"]), train_s=t["train_seconds"],
        device=t["device"], tok_s=t["tokens_per_s"], torch=logd["env"]["torch"],
        transformers=logd["env"]["transformers"], ho_windows=ho["windows"], ev_windows=t["eval_windows"],
        ho_bpb=ho["bits_per_byte"],
        ho_top1=ho["top1"], ho_mbpb=ho["mtp_bits_per_byte"], ho_mtop1=ho["mtp_top1"],
        ho_agree=ho["mtp_trunk_agreement"], sw=len(logd["sample"]["windows"]),
        sample_bytes=logd["sample"]["bytes"], tm1=t["seq_len"] - 1, tm2=t["seq_len"] - 2,
        s32_bpb=s32["bits_per_byte"], s32_mbpb=s32["mtp_bits_per_byte"], s32_mtop1=s32["mtp_top1"],
        s64_bpb=s64["bits_per_byte"], s64_mbpb=s64["mtp_bits_per_byte"], s64_mtop1=s64["mtp_top1"],
        f64_kind=s64["kind"], r_bpb=ref["bits_per_byte"], r_mbpb=ref["mtp_bits_per_byte"],
        r_mtop1=ref["mtp_top1"], r_err=ref["logits_max_rel_err"], r_merr=ref["mtp_logits_max_rel_err"],
        r_cerr=ref.get("chain_logits_max_rel_err", float("nan")), r_stride=ref.get("chain_stride", 0),
        depth=t.get("mtp_depth", 1), chain_head=" | ".join(str(j) for j in range(1, len(chain_t) + 1)),
        chain_sep="---|" * len(chain_t), chain_bpb=" | ".join(f"{v:.4f}" for v in chain_b),
        chain_top1=" | ".join(f"{v:.4f}" for v in chain_t),
        sample_rows="\n".join(f"| {i} | `{w['file']}` | {w['offset']} |"
                              for i, w in enumerate(logd["sample"]["windows"])),
        prompt_rows="\n".join(f"| `prompts/{p['name']}` | {p['bytes']} | `{p['file']}` | {p['offset']} |"
                              for p in logd["prompts"]),
        out_rel=logd["out"], minutes=t["minutes"], **{k: c[k] for k in (
            "hidden_size", "num_hidden_layers", "linear_num_key_heads", "linear_num_value_heads",
            "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "vocab_size")},
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(card)


# ------------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------------
def lr_at(step: int, hp: Hyper, total: int) -> float:
    if step < hp.warmup:
        return hp.lr * (step + 1) / hp.warmup
    p = min(1.0, (step - hp.warmup) / max(1, total - hp.warmup))
    lo = hp.lr * hp.min_lr_frac
    return lo + 0.5 * (hp.lr - lo) * (1.0 + math.cos(math.pi * p))


def param_groups(model: nn.Module, wd: float) -> list:
    decay, no = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed_tokens" not in name else no).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}]


def _commit():
    """The repo's commit (PRIMEWALK_COMMIT where the tree has no .git), or None."""
    if os.environ.get("PRIMEWALK_COMMIT"):
        return os.environ["PRIMEWALK_COMMIT"]
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return (r.stdout.strip() or None) if r.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def count(shapes: dict) -> int:
    return int(sum(int(np.prod(s)) for s in shapes.values()))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Train stdlib-small (byte-level Qwen3-Next + MTP head) on the "
                                             "Python stdlib's own sources; see the module docstring.",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join("harness", "models", "stdlib-small"),
                    help="output folder (default harness/models/stdlib-small)")
    ap.add_argument("--minutes", type=float, default=12.0,
                    help="wall-clock budget of the training, from the script's start (default 12); "
                         "evaluation and export follow (about a minute)")
    ap.add_argument("--steps", type=int, default=None, help="fix the number of steps (default: from the budget)")
    ap.add_argument("--smoke", action="store_true",
                    help=f"tiny config, data subset, {SMOKE_STEPS} steps (CPU, well under 60 s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto | cuda | cpu")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--eval-every", type=int, default=None)
    ap.add_argument("--eval-windows", type=int, default=None, help="held-out windows per periodic evaluation")
    ap.add_argument("--final-windows", type=int, default=None, help="cap on the final held-out evaluation")
    ap.add_argument("--stdlib", default=None, help="stdlib folder (default: sysconfig's)")
    ap.add_argument("--heldout-frac", type=float, default=None)
    ap.add_argument("--no-ref", action="store_true", help="skip the RefModel check of the export")
    ap.add_argument("--bundle", default=None, metavar="DIR",
                    help="also write the output folder as a tar in <= 15 MiB parts under DIR")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    hp = Hyper(**(SMOKE_HYPER if args.smoke else {}))
    for k, v in (("batch", args.batch), ("seq_len", args.seq_len), ("lr", args.lr),
                 ("eval_every", args.eval_every), ("heldout_frac", args.heldout_frac),
                 ("eval_windows", args.eval_windows), ("final_windows", args.final_windows)):
        if v is not None:
            setattr(hp, k, v)
    steps_fixed = args.steps if args.steps is not None else (SMOKE_STEPS if args.smoke else None)
    d = dict(SMOKE_MODEL if args.smoke else MODEL)
    T, B = hp.seq_len, hp.batch
    if T < 8:
        raise SystemExit("--seq-len must be at least 8")
    deadline = _T_START + 60.0 * args.minutes
    out = args.out
    os.makedirs(os.path.join(out, "prompts"), exist_ok=True)
    dev = torch.device("cuda" if (args.device == "auto" and torch.cuda.is_available()) else
                       (args.device if args.device != "auto" else "cpu"))
    amp = dev.type == "cuda"
    name = os.path.basename(os.path.normpath(out))

    # ---- data -----------------------------------------------------------------------------
    root = args.stdlib or stdlib_root()
    files = stdlib_files(root)
    train_f, held_f = split_files(files, hp.heldout_frac)
    train_f, held_f = cap_files(train_f, hp.max_train_bytes), cap_files(held_f, hp.max_heldout_bytes)
    if not train_f or not held_f:
        raise SystemExit(f"{root}: no train or no held-out files")
    train_s, held_s = token_stream(train_f), token_stream(held_f)
    if len(train_s) < T + 1 or len(held_s) < T:
        raise SystemExit(f"{root}: too little data for seq_len {T}")
    sample = eval_sample(held_f, hp.sample_windows, T)
    prompts = prompt_excerpts(held_f, {r for r, _, _ in sample})
    log(f"data: {root}: {len(files)} files; train {len(train_f)} files {len(train_s):,} tokens, "
        f"held-out {len(held_f)} files {len(held_s):,} tokens; {len(sample)} sample windows, {len(prompts)} prompts")
    if len(sample) < 1 or len(prompts) < len(PROMPT_TARGETS):
        raise SystemExit("not enough held-out files for the sample windows / prompts")

    with open(os.path.join(out, "heldout_eval.bin"), "wb") as f:
        f.write(b"".join(w for _, _, w in sample))
    for old in os.listdir(os.path.join(out, "prompts")):
        if re.fullmatch(r"heldout\d+\.py", old):
            os.remove(os.path.join(out, "prompts", old))
    prompt_meta = []
    for i, (r, off, text) in enumerate(prompts):
        pn = f"heldout{i}.py"
        with open(os.path.join(out, "prompts", pn), "wb") as f:
            f.write(text)
        prompt_meta.append({"name": pn, "file": r, "offset": off, "bytes": len(text),
                            "sha256": hashlib.sha256(text).hexdigest()})

    # ---- model ----------------------------------------------------------------------------
    torch.manual_seed(args.seed)
    np_rng = np.random.default_rng(args.seed)
    model = TinyModel(d).to(dev)
    model.train()
    mcfg = model_config(d)
    from harness.engine.weights import mtp_shapes, trunk_shapes

    n_trunk, n_mtp = count(trunk_shapes(mcfg)), count(mtp_shapes(mcfg))
    n_model = sum(p.numel() for p in model.parameters())
    assert n_model == n_trunk + n_mtp, (n_model, n_trunk, n_mtp)
    log(f"model: {n_trunk + n_mtp:,} parameters ({n_trunk:,} trunk + {n_mtp:,} MTP); device {dev}"
        + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "") + f"; bf16 autocast {amp}")
    opt = torch.optim.AdamW(param_groups(model, hp.weight_decay), lr=hp.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if dev.type == "cuda" else {}))
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    data = torch.from_numpy(train_s).to(dev)
    ar = torch.arange(T, device=dev)
    eval_w = torch.from_numpy(windows_of(held_s, T, hp.eval_windows)).to(dev)

    def get_batch():
        off = torch.from_numpy(np_rng.integers(0, len(train_s) - T + 1, size=B)).to(dev)
        return data[off[:, None] + ar]

    logd = {
        "name": name, "smoke": bool(args.smoke), "out": out,
        "env": {"python": platform.python_version(), "torch": torch.__version__, "commit": _commit(),
                "transformers": transformers.__version__, "numpy": np.__version__, "device": str(dev),
                "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor()},
        "model": {"config": d, "params_total": n_trunk + n_mtp, "params_trunk": n_trunk, "params_mtp": n_mtp},
        "data": {"stdlib": root, "python": platform.python_version(), "excluded_dirs": list(EXCLUDE_DIRS),
                 "n_files": len(files), "n_bytes": sum(len(b) for _, b in files),
                 "heldout_frac": hp.heldout_frac, "split_rule": "sha256(relpath)[:8] big-endian / 2**64 < frac",
                 "n_train_files": len(train_f), "train_bytes": sum(len(b) for _, b in train_f),
                 "train_tokens": int(len(train_s)), "n_heldout_files": len(held_f),
                 "heldout_bytes": sum(len(b) for _, b in held_f), "heldout_tokens": int(len(held_s)),
                 "heldout_files": [r for r, _ in held_f], "separator": "EOS (257) after each file",
                 "subset": bool(hp.max_train_bytes or hp.max_heldout_bytes)},
        "sample": {"file": "heldout_eval.bin", "window": T, "bytes": sum(len(w) for _, _, w in sample),
                   "windows": [{"file": r, "offset": o} for r, o, _ in sample]},
        "prompts": prompt_meta,
        "training": dict(dataclasses.asdict(hp), seed=args.seed, minutes=args.minutes, device=str(dev),
                         amp_bf16=amp, steps=0, planned_steps=steps_fixed, tokens=0),
        "train": [], "evals": [], "results": {},
    }
    log_path = os.path.join(out, "train_log.json")

    # ---- train ----------------------------------------------------------------------------
    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def periodic_eval(step):
        t0 = time.time()
        r = evaluate(model, eval_w, B, amp=amp, depth=hp.mtp_depth)
        r = {k: v for k, v in r.items() if k != "per_window"}
        r.update(step=step, elapsed_s=time.time() - _T_START, eval_s=time.time() - t0)
        logd["evals"].append(r)
        log(f"eval @ {step}: held-out {r['bits_per_byte']:.4f} bits/byte (top-1 {r['top1']:.3f}); MTP "
            f"{r['mtp_bits_per_byte']:.4f} bits/byte, top-1 {r['mtp_top1']:.3f}, = trunk {r['mtp_trunk_agreement']:.3f}"
            + (f"; chained top-1 {' / '.join(f'{a:.3f}' for a in r['mtp_chain_top1'])}" if "mtp_chain_top1" in r
               else "") + f" [{r['eval_s']:.1f} s]")
        write_json(log_path, logd)
        return r["eval_s"]

    eval_s = periodic_eval(0)
    total = steps_fixed if steps_fixed is not None else 10**9
    step, tokens, stopped_by_time = 0, 0, False
    acc_main = torch.zeros((), device=dev)
    acc_mtp = torch.zeros(hp.mtp_depth, device=dev)
    acc_n, t_log, tok_log = 0, time.time(), 0
    t_train0 = time.time()
    t_probe = None
    train_time_evals = 0.0
    while step < total:
        if time.time() >= deadline:
            stopped_by_time = True
            break
        lr = lr_at(step, hp, total)
        for g in opt.param_groups:
            g["lr"] = lr
        x = get_batch()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            main_l, mtp_ls = losses(model, x, hp.mtp_depth)
            mtp_l = torch.stack(mtp_ls)
            loss = main_l + hp.mtp_weight * mtp_l.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), hp.clip)
        opt.step()
        step += 1
        tokens += B * T
        acc_main += main_l.detach()
        acc_mtp += mtp_l.detach()
        acc_n += 1
        # fix the step count from the probe's step time (inside the warmup)
        if steps_fixed is None and step == hp.probe[0]:
            sync()
            t_probe = time.time()
        if steps_fixed is None and step == hp.probe[1]:
            sync()
            per_step = (time.time() - t_probe) / (hp.probe[1] - hp.probe[0])
            cost = per_step + eval_s / hp.eval_every
            total = step + max(1, int(0.95 * (deadline - time.time()) / cost))
            if total < hp.warmup * 2:
                hp.warmup = max(hp.probe[1], total // 4)
            logd["training"]["planned_steps"] = total
            logd["training"]["probe_step_s"] = per_step
            log(f"probe: {per_step * 1e3:.1f} ms/step ({B * T / per_step:,.0f} tokens/s); planning {total} steps")
        if step % hp.log_every == 0 or step == total:
            lm = float(acc_main) / acc_n
            lts = [float(v) / acc_n for v in acc_mtp]
            lt = lts[0]
            now = time.time()
            tps = (tokens - tok_log) / max(1e-9, now - t_log)
            rec = {"step": step, "tokens": tokens, "lr": lr, "train_loss": lm, "train_bits_per_byte": lm / math.log(2),
                   "train_mtp_loss": lt, "train_mtp_bits_per_byte": lt / math.log(2),
                   "train_mtp_chain_bits_per_byte": [v / math.log(2) for v in lts], "grad_norm": float(gnorm),
                   "tokens_per_s": tps, "elapsed_s": now - _T_START}
            logd["train"].append(rec)
            log(f"step {step}/{total if total < 10**9 else '?'} lr {lr:.2e} loss {lm:.4f} "
                f"({rec['train_bits_per_byte']:.3f}"
                f" b/B) mtp {' / '.join(f'{v / math.log(2):.3f}' for v in lts)} b/B |g| {float(gnorm):.2f} "
                f"{tps:,.0f} tok/s")
            acc_main.zero_()
            acc_mtp.zero_()
            acc_n, t_log, tok_log = 0, time.time(), tokens
        if step % hp.eval_every == 0 and step < total:
            te = time.time()
            eval_s = periodic_eval(step)
            train_time_evals += time.time() - te
            t_log = time.time()
            tok_log = tokens
    sync()
    train_s_wall = time.time() - t_train0
    tr = logd["training"]
    tr.update(steps=step, tokens=tokens, stopped_by_time=stopped_by_time, train_seconds=train_s_wall,
              eval_seconds_during_training=train_time_evals,
              tokens_per_s=tokens / max(1e-9, train_s_wall - train_time_evals))
    if tr["planned_steps"] is None or tr["planned_steps"] >= 10**9:
        tr["planned_steps"] = step
    log(f"training done: {step} steps, {tokens:,} tokens in {train_s_wall:.0f} s"
        + (" (stopped at the time limit)" if stopped_by_time else ""))

    # ---- export ---------------------------------------------------------------------------
    from harness.engine.weights import load_checkpoint, save_checkpoint

    model.eval()
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    save_checkpoint(out, mcfg, export_tensors(model))
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    ck = load_checkpoint(out)
    logd["model"].update(export_bytes=size, export_dtype="float32", checkpoint_sha256=ck.sha256)
    log(f"exported {out}/model.safetensors: {size / 1e6:.2f} MB, sha256 {ck.sha256[:16]}…")
    if size > MAX_EXPORT_BYTES and not args.smoke:
        log(f"WARNING: the export is {size:,} bytes > {MAX_EXPORT_BYTES:,}")

    # ---- final evaluation -----------------------------------------------------------------
    res = logd["results"]
    fw = torch.from_numpy(windows_of(held_s, T, hp.final_windows)).to(dev)
    res["heldout"] = evaluate(model, fw, B, amp=False, depth=hp.mtp_depth)
    log(f"held-out ({res['heldout']['windows']} windows, float32): {res['heldout']['bits_per_byte']:.4f} bits/byte, "
        f"MTP {res['heldout']['mtp_bits_per_byte']:.4f} bits/byte, MTP top-1 {res['heldout']['mtp_top1']:.4f}")
    sample_ids = np.stack([np.frombuffer(w, np.uint8).astype(np.int64) for _, _, w in sample])
    sw = torch.from_numpy(sample_ids).to(dev)
    res["sample_float32"] = evaluate(model, sw, B, amp=False, per_window=True, depth=hp.mtp_depth)
    mod64 = hf_float64_module()
    m64 = TinyModel(d, hf_module=mod64) if mod64 is not None else TinyModel(d)
    m64.load_state_dict(model.state_dict())
    m64 = m64.double().to(dev).eval()
    r64 = evaluate(m64, sw, B, amp=False, per_window=True, depth=hp.mtp_depth)
    r64["kind"] = ("HF code with float32 casts widened" if mod64 is not None
                   else "HF model.double(), float32 casts inside")
    res["sample_float64"] = r64
    log(f"sample ({len(sample)} x {T} bytes): float32 {res['sample_float32']['bits_per_byte']:.6f} bits/byte, "
        f"MTP top-1 {res['sample_float32']['mtp_top1']:.4f}; float64 {r64['bits_per_byte']:.9f} bits/byte, "
        f"MTP top-1 {r64['mtp_top1']:.4f}")
    if not args.no_ref:
        t0 = time.time()
        with torch.no_grad():
            lg, _, mls = m64.forward_chain(sw, hp.mtp_depth)
        torch64 = {"logits": lg.cpu().numpy(), "mtp_logits": mls[0].cpu().numpy(),
                   "mtp_chain": [m.cpu().numpy() for m in mls[1:]]}
        res["sample_ref"] = ref_check(out, sample_ids, torch64)
        res["sample_ref"]["seconds"] = time.time() - t0
        rr = res["sample_ref"]
        log(f"RefModel on the export: {rr['bits_per_byte']:.9f} bits/byte, MTP top-1 {rr['mtp_top1']:.4f}; "
            f"max rel err vs torch float64: logits {rr['logits_max_rel_err']:.1e}, "
            f"MTP {rr['mtp_logits_max_rel_err']:.1e}"
            f" [{rr['seconds']:.1f} s]")
    else:
        res["sample_ref"] = {k: float("nan") for k in ("bits_per_byte", "mtp_bits_per_byte", "mtp_top1",
                                                       "logits_max_rel_err", "mtp_logits_max_rel_err")}
    del m64

    # ---- card, log, plot, bundle ----------------------------------------------------------
    logd["total_seconds"] = time.time() - _T_START
    write_json(log_path, logd)
    plot_losses(logd, os.path.join(out, "loss.png"))
    write_card(os.path.join(out, "README.md"), logd)
    if args.bundle:
        parts = bundle(out, args.bundle)
        log(f"bundle: {', '.join(os.path.basename(p) for p in parts)} in {args.bundle}")
    ho, s32 = res["heldout"], res["sample_float32"]
    summary = (f"SUMMARY {name}: {n_trunk + n_mtp:,} params, {size / 1e6:.2f} MB, {step} steps, "
               f"{tokens:,} tokens, held-out {ho['bits_per_byte']:.4f} bits/byte, MTP {ho['mtp_bits_per_byte']:.4f} "
               f"bits/byte, MTP top-1 {ho['mtp_top1']:.4f}, MTP=trunk {ho['mtp_trunk_agreement']:.4f}; sample "
               f"f32 {s32['bits_per_byte']:.6f} / f64 {res['sample_float64']['bits_per_byte']:.6f} / ref "
               f"{res['sample_ref']['bits_per_byte']:.6f} bits/byte; {time.time() - _T_START:.0f} s total")
    print(summary, flush=True)
    return logd


if __name__ == "__main__":
    main()
