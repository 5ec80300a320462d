"""Checkpoint loading and saving: safetensors only (never pickle), HF key names.

A checkpoint folder holds ``config.json`` and either ``model.safetensors`` or shards listed in
``model.safetensors.index.json``. Tensors stored as F32, F16 or BF16 load as float32 exactly
(widening adds zero bits); F64 is rounded to float32. :attr:`Checkpoint.dtypes` keeps what each
tensor was stored as (a bf16 checkpoint can keep its linear weights bf16 on the device:
:mod:`harness.engine.bf16`).

Keys are those of HF ``Qwen3NextForCausalLM`` or ``Qwen3_5ForCausalLM`` /
``Qwen3_5MoeForCausalLM`` (the config's ``model_type`` says which), plus the MTP head in vLLM's
layout (``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.0.*``
— one full-attention decoder layer —, ``mtp.norm``; the same keys for both families). Qwen3.5's
DeltaNet projections are separate (``in_proj_qkv`` = q‖k‖v, ``in_proj_z``, ``in_proj_b``,
``in_proj_a``) where Qwen3-Next fuses them per key head (``in_proj_qkvz``, ``in_proj_ba``); both
are kept as stored and mapped onto one engine layout by :mod:`.layout`. A multimodal checkpoint
(``Qwen3_5ForConditionalGeneration``) prefixes the text model with ``model.language_model.``
(read as ``model.``) and carries vision tensors (``model.visual.*``), which are skipped with a
note (:attr:`Checkpoint.notes`). Internally a few tensors are normalised:

- ``*.linear_attn.conv1d.weight`` ``[conv_dim, 1, K]`` is kept as ``[conv_dim, K]``;
- MoE experts, stored per expert (``mlp.experts.E.{gate,up,down}_proj.weight``) or fused the
  transformers-5 way (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``mlp.experts.down_proj``
  ``[E, H, I]``), become ``mlp.experts.gate_proj`` ``[E, I, H]``, ``mlp.experts.up_proj``
  ``[E, I, H]`` and ``mlp.experts.down_proj`` ``[E, H, I]``.

Every problem with the tensors (missing, unexpected, mis-shaped) is reported in one
:class:`~harness.errors.CheckpointError` that lists them all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import CheckpointError, ConfigError
from .config import FULL, LINEAR, ModelConfig
from .dims import dimension_mismatches

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": "bf16"}
_SIZES = {"F32": 4, "F16": 2, "F64": 8, "BF16": 2}


# ------------------------------------------------------------------------------------------------
# expected tensors
# ------------------------------------------------------------------------------------------------
def _attn_shapes(cfg: ModelConfig, p: str) -> dict:
    nh, nkv, hd, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    return {
        p + "self_attn.q_proj.weight": (nh * hd * 2, h),  # per head: query ‖ gate
        p + "self_attn.k_proj.weight": (nkv * hd, h),
        p + "self_attn.v_proj.weight": (nkv * hd, h),
        p + "self_attn.o_proj.weight": (h, nh * hd),
        p + "self_attn.q_norm.weight": (hd,),
        p + "self_attn.k_norm.weight": (hd,),
    }


def _gdn_shapes(cfg: ModelConfig, p: str) -> dict:
    h, nv = cfg.hidden_size, cfg.linear_num_value_heads
    if cfg.is_qwen3_5:  # separate projections: q‖k‖v, z, b, a
        proj = {
            p + "linear_attn.in_proj_qkv.weight": (cfg.conv_dim, h),
            p + "linear_attn.in_proj_z.weight": (cfg.value_dim, h),
            p + "linear_attn.in_proj_b.weight": (nv, h),
            p + "linear_attn.in_proj_a.weight": (nv, h),
        }
    else:  # fused, interleaved per key head
        proj = {
            p + "linear_attn.in_proj_qkvz.weight": (2 * cfg.key_dim + 2 * cfg.value_dim, h),
            p + "linear_attn.in_proj_ba.weight": (2 * nv, h),
        }
    return {
        **proj,
        p + "linear_attn.conv1d.weight": (cfg.conv_dim, cfg.linear_conv_kernel_dim),
        p + "linear_attn.dt_bias": (nv,),
        p + "linear_attn.A_log": (nv,),
        p + "linear_attn.norm.weight": (cfg.linear_value_head_dim,),
        p + "linear_attn.out_proj.weight": (h, cfg.value_dim),
    }


def _mlp_shapes(cfg: ModelConfig, p: str, moe: bool) -> dict:
    h = cfg.hidden_size
    if not moe:
        i = cfg.intermediate_size
        return {
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    e, i = cfg.num_experts, cfg.moe_intermediate_size
    out = {
        p + "mlp.gate.weight": (e, h),
        p + "mlp.experts.gate_proj": (e, i, h),
        p + "mlp.experts.up_proj": (e, i, h),
        p + "mlp.experts.down_proj": (e, h, i),
    }
    s = cfg.shared_expert_intermediate_size
    if s > 0:
        out.update({
            p + "mlp.shared_expert.gate_proj.weight": (s, h),
            p + "mlp.shared_expert.up_proj.weight": (s, h),
            p + "mlp.shared_expert.down_proj.weight": (h, s),
            p + "mlp.shared_expert_gate.weight": (1, h),
        })
    return out


def _layer_shapes(cfg: ModelConfig, p: str, kind: str, moe: bool) -> dict:
    h = cfg.hidden_size
    out = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    out.update(_gdn_shapes(cfg, p) if kind == LINEAR else _attn_shapes(cfg, p))
    out.update(_mlp_shapes(cfg, p, moe))
    return out


def trunk_shapes(cfg: ModelConfig) -> dict:
    """Internal tensor names -> shapes of the trunk (embedding, layers, final norm, lm head)."""
    h, v = cfg.hidden_size, cfg.vocab_size
    out = {"model.embed_tokens.weight": (v, h)}
    for i, kind in enumerate(cfg.layer_types):
        out.update(_layer_shapes(cfg, f"model.layers.{i}.", kind, cfg.is_moe_layer(i)))
    out["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (v, h)
    return out


def mtp_shapes(cfg: ModelConfig) -> dict:
    """Internal tensor names -> shapes of the MTP head (vLLM's Qwen3-Next layout)."""
    h = cfg.hidden_size
    out = {
        "mtp.fc.weight": (h, 2 * h),  # input: [pre_fc_norm_embedding(e) ‖ pre_fc_norm_hidden(h)]
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.norm.weight": (h,),
    }
    out.update(_layer_shapes(cfg, "mtp.layers.0.", FULL, cfg.is_moe_layer(0)))
    return out


# ------------------------------------------------------------------------------------------------
# safetensors reading (own parser: bf16 without torch, truncation detected, no pickle anywhere)
# ------------------------------------------------------------------------------------------------
def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path: str, dtypes: dict | None = None) -> tuple[dict, str]:
    """Read one .safetensors file -> ({name: float32 array}, sha256 hex of the file). ``dtypes``,
    if given, receives {name: stored dtype} ("BF16", "F32", ...)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) < 8:
        raise CheckpointError(f"{path}: truncated safetensors file ({len(data)} bytes)")
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data):
        raise CheckpointError(f"{path}: truncated or corrupt safetensors header")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: corrupt safetensors header (not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header")
    body = memoryview(data)[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape, (a, b) = meta["dtype"], tuple(int(s) for s in meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupt header entry for {name}") from None
        if dt not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {dt}")
        count = int(np.prod(shape)) if shape else 1
        if b - a != count * _SIZES[dt] or a < 0:
            raise CheckpointError(f"{path}: tensor {name} has inconsistent offsets")
        if b > len(body):
            raise CheckpointError(
                f"{path}: truncated (tensor {name} needs bytes up to {b}, file has {len(body)})")
        chunk = body[a:b]
        if dtypes is not None:
            dtypes[name] = dt
        if dt == "BF16":
            arr = _bf16_to_f32(np.frombuffer(chunk, dtype="<u2"))
        else:
            arr = np.frombuffer(chunk, dtype=np.dtype(_DTYPES[dt]).newbyteorder("<")).astype(np.float32)
        out[name] = arr.reshape(shape)
    return out, digest


def _checkpoint_files(folder: str) -> list:
    idx = os.path.join(folder, "model.safetensors.index.json")
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(idx):
        try:
            with open(idx, encoding="utf-8") as f:
                wm = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            raise CheckpointError(f"{idx}: unreadable shard index") from None
        files = sorted(set(wm.values()))
        missing = [s for s in files if not os.path.isfile(os.path.join(folder, s))]
        if missing:
            raise CheckpointError(f"{folder}: shard(s) listed in the index are missing: {', '.join(missing)}")
        return [os.path.join(folder, s) for s in files]
    if os.path.isfile(single):
        return [single]
    pickles = [n for n in os.listdir(folder) if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    if pickles:
        raise CheckpointError(
            f"{folder}: only pickle weights found ({pickles[0]}); primewalk loads safetensors only")
    raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json")


_PROJS = ("gate_proj", "up_proj", "down_proj")
_EXPERT_RE = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
TEXT_PREFIX = "model.language_model."  # multimodal Qwen3.5: the text model's tensors
VISION_PREFIXES = ("model.visual.", "visual.")  # multimodal Qwen3.5: the vision tower, not loaded


def _normalise(raw: dict, cfg: ModelConfig, raw_dtypes: dict | None = None) -> tuple[dict, list, dict, list]:
    """File keys -> internal keys. Returns (tensors, problems, {internal name: stored dtype},
    notes)."""
    out, problems, notes, dtypes = {}, [], [], {}
    raw_dtypes = raw_dtypes or {}
    experts: dict = {}
    vision = [n for n in raw if n.startswith(VISION_PREFIXES)]
    if vision:
        notes.append(f"skipped {len(vision)} vision tensor(s) ({vision[0].split('.')[0]}"
                     f"{'.visual' if vision[0].startswith('model.') else ''}.*): primewalk runs the text model")
    for name, arr in raw.items():
        if name.startswith(VISION_PREFIXES):
            continue
        dt = raw_dtypes.get(name)
        if name.startswith(TEXT_PREFIX):
            name = "model." + name[len(TEXT_PREFIX):]
            if name in raw:
                problems.append(f"{name} is stored twice (also under {TEXT_PREFIX})")
                continue
        m = _EXPERT_RE.match(name)
        if m:
            experts.setdefault(m.group(1), {})[(_PROJS.index(m.group(3)), int(m.group(2)))] = (arr, dt)
            continue
        if name.endswith(".mlp.experts.gate_up_proj"):
            base = name[: -len(".gate_up_proj")]
            if arr.ndim != 3 or arr.shape[1] % 2:
                problems.append(f"{name}: shape {tuple(arr.shape)} is not [E, 2I, H]")
                continue
            half = arr.shape[1] // 2
            out[base + ".gate_proj"] = np.ascontiguousarray(arr[:, :half])
            out[base + ".up_proj"] = np.ascontiguousarray(arr[:, half:])
            dtypes[base + ".gate_proj"] = dtypes[base + ".up_proj"] = dt
            continue
        if name.endswith("linear_attn.conv1d.weight") and arr.ndim == 3 and arr.shape[1] == 1:
            arr = arr.reshape(arr.shape[0], arr.shape[2])
        out[name] = arr
        dtypes[name] = dt
    for base, parts in experts.items():
        e = cfg.num_experts
        for kind, proj in enumerate(_PROJS):
            have = {i: a for (k, i), a in parts.items() if k == kind}
            lost = [i for i in range(e) if i not in have]
            extra = [i for i in have if i >= e]
            if lost:
                problems.append(f"missing {base}.{{{','.join(map(str, lost[:8]))}}}.{proj}.weight")
            if extra:
                problems.append(f"unexpected {base}.{{{','.join(map(str, extra[:8]))}}}.{proj}.weight")
            if lost or extra:
                continue
            shapes = {have[i][0].shape for i in range(e)}
            if len(shapes) != 1:
                problems.append(f"{base}.*.{proj}.weight: experts have different shapes {sorted(shapes)}")
                continue
            out[f"{base}.{proj}"] = np.stack([have[i][0] for i in range(e)])
            stored = {have[i][1] for i in range(e)}
            dtypes[f"{base}.{proj}"] = stored.pop() if len(stored) == 1 else "mixed"
    return out, problems, dtypes, notes


@dataclass
class Checkpoint:
    """A loaded model: config, float32 tensors under internal names, and identity."""

    config: ModelConfig
    tensors: dict
    path: str = ""
    sha256: str = ""  # over the safetensors files, in file-name order
    files: list = field(default_factory=list)
    dtypes: dict = field(default_factory=dict)  # internal name -> stored dtype ("BF16", "F32", ...)
    notes: list = field(default_factory=list)  # one-line notes on what was read (vision tensors skipped ...)

    def stored_as(self, names) -> set:
        """The stored dtypes of the tensors ``names`` (None for a tensor not read from a file)."""
        return {self.dtypes.get(n) for n in names}

    @property
    def has_mtp(self) -> bool:
        return "mtp.fc.weight" in self.tensors

    def lm_head(self) -> np.ndarray:
        if self.config.tie_word_embeddings:
            return self.tensors["model.embed_tokens.weight"]
        return self.tensors["lm_head.weight"]

    def require_mtp(self, what: str = "this command") -> None:
        if not self.has_mtp:
            raise CheckpointError(
                f"{self.path or 'model'}: the checkpoint has no MTP head (mtp.* tensors); "
                f"{what} needs one")


def check_tensors(cfg: ModelConfig, tensors: dict, source: str, problems: list | None = None) -> bool:
    """Validate names and shapes; raise one CheckpointError listing every problem.

    Returns whether the MTP head is present (all ``mtp.*`` tensors) — a checkpoint with no
    ``mtp.*`` tensor at all is a trunk-only model."""
    problems = list(problems or [])
    want = trunk_shapes(cfg)
    has_mtp = any(k.startswith("mtp.") for k in tensors)
    if has_mtp:
        want.update(mtp_shapes(cfg))
    optional = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    missing = sorted(k for k in want if k not in tensors)
    unexpected = sorted(k for k in tensors if k not in want and k not in optional)
    shaped = sorted(
        f"{k}: {tuple(tensors[k].shape)} != expected {tuple(want[k])}"
        for k in want if k in tensors and tuple(tensors[k].shape) != tuple(want[k])
    )
    dims = dimension_mismatches(cfg, tensors) if shaped or missing or unexpected else []
    if dims:  # name the config dimension, not every tensor it mis-shapes
        counts = [f"{n} {what}" for n, what in ((len(shaped), "mis-shaped"), (len(missing), "missing"),
                                                  (len(unexpected), "unexpected")) if n]
        raise CheckpointError(f"{source}: config.json disagrees with the tensors: " + "; ".join(dims)
                              + f" (tensors: {', '.join(counts)})")
    if missing:
        problems.append(f"missing {len(missing)}: " + ", ".join(missing[:12]) + (" …" if len(missing) > 12 else ""))
    if unexpected:
        problems.append(f"unexpected {len(unexpected)}: " + ", ".join(unexpected[:12]) + (" …" if len(unexpected) > 12 else ""))
    if shaped:
        problems.append(f"mis-shaped {len(shaped)}: " + "; ".join(shaped[:12]) + (" …" if len(shaped) > 12 else ""))
    if problems:
        raise CheckpointError(f"{source}: " + " | ".join(problems))
    return has_mtp


def load_checkpoint(folder: str, check_finite: bool = True) -> Checkpoint:
    """Load ``folder`` (config.json + safetensors). Errors are one-line CheckpointError/ConfigError."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: not a folder")
    cfg = ModelConfig.from_json(os.path.join(folder, "config.json"))
    raw, h, raw_dtypes = {}, hashlib.sha256(), {}
    files = _checkpoint_files(folder)
    for path in files:
        t, digest = read_safetensors(path, raw_dtypes)
        dup = sorted(set(t) & set(raw))
        if dup:
            raise CheckpointError(f"{path}: tensor(s) already in another shard: {', '.join(dup[:5])}")
        raw.update(t)
        h.update(os.path.basename(path).encode() + b"\0" + digest.encode())
    tensors, problems, dtypes, notes = _normalise(raw, cfg, raw_dtypes)
    has_mtp = check_tensors(cfg, tensors, folder, problems)
    if not has_mtp:
        cfg.num_nextn_predict_layers = 0
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    if check_finite:
        for k, a in tensors.items():
            if not np.isfinite(a).all():
                raise CheckpointError(f"{folder}: tensor {k} contains NaN or Inf")
    return Checkpoint(cfg, tensors, folder, h.hexdigest(), [os.path.basename(p) for p in files],
                      {k: dtypes.get(k) for k in tensors}, notes)


def to_file_tensors(ckpt_tensors: dict, per_expert: bool = True) -> dict:
    """Internal names -> HF file names (conv weight [C,1,K], experts per expert)."""
    out = {}
    for k, a in ckpt_tensors.items():
        if k.endswith("linear_attn.conv1d.weight"):
            out[k] = a.reshape(a.shape[0], 1, a.shape[1])
        elif re.search(r"\.mlp\.experts\.(gate_proj|up_proj|down_proj)$", k):
            base, proj = k.rsplit(".", 1)
            if per_expert:
                for e in range(a.shape[0]):
                    out[f"{base}.{e}.{proj}.weight"] = a[e]
            elif proj == "down_proj":
                out[k] = a
            elif proj == "gate_proj":
                out[base + ".gate_up_proj"] = np.concatenate([a, ckpt_tensors[base + ".up_proj"]], axis=1)
        else:
            out[k] = a
    return out


SAVE_DTYPES = ("float32", "float16", "bfloat16")


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), rounded to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return r


def save_bytes(tensors: dict, metadata: dict | None = None) -> bytes:
    """safetensors bytes of ``tensors`` ({name: float32/float16 array, or uint16 bf16 bits}, the
    last stored as BF16), in sorted name order (what ``safetensors.numpy.save`` lays out)."""
    codes = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint16): "BF16"}
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": codes[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(blobs)


def save_checkpoint(folder: str, cfg: ModelConfig, tensors: dict, max_shard_bytes: int | None = None,
                    dtype: str = "float32") -> None:
    """Write config.json and safetensors (sharded with an index when ``max_shard_bytes`` is set),
    every tensor as ``dtype`` (float32, float16, or bfloat16 rounded to nearest even)."""
    from ..atomic import write_bytes_atomic, write_text_atomic

    if dtype not in SAVE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {SAVE_DTYPES}")
    check_tensors(cfg, tensors, folder)
    os.makedirs(folder, exist_ok=True)
    cfg.save(os.path.join(folder, "config.json"))
    ft = {k: to_bf16_bits(v) if dtype == "bfloat16" else
          np.ascontiguousarray(v, dtype=np.float16 if dtype == "float16" else np.float32)
          for k, v in to_file_tensors(tensors).items()}
    if dtype == "bfloat16":
        save = save_bytes  # numpy has no bfloat16: our own writer stores the bits as BF16
    else:
        from safetensors.numpy import save
    names = sorted(ft)
    if not max_shard_bytes:
        write_bytes_atomic(os.path.join(folder, "model.safetensors"), save(ft, metadata={"format": "pt"}))
        return
    shards, cur, size = [], [], 0
    for k in names:
        nb = ft[k].nbytes
        if cur and size + nb > max_shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += nb
    shards.append(cur)
    wm = {}
    for i, keys in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_bytes_atomic(os.path.join(folder, fn), save({k: ft[k] for k in keys}, metadata={"format": "pt"}))
        wm.update({k: fn for k in keys})
    write_text_atomic(os.path.join(folder, "model.safetensors.index.json"),
                      json.dumps({"metadata": {"total_size": sum(a.nbytes for a in ft.values())},
                                  "weight_map": wm}, indent=2, sort_keys=True) + "\n")


__all__ = [
    "Checkpoint", "load_checkpoint", "save_checkpoint", "read_safetensors", "trunk_shapes",
    "mtp_shapes", "check_tensors", "ConfigError", "save_bytes", "to_bf16_bits",
]
