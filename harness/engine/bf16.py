"""Weights kept bf16 on the backend: which ones, when, and the ops that read them.

A bf16 value widened to float32 (its 16 bits followed by 16 zero bits) is exact, and the ops that
read weights (``linear``, ``moe_up``, ``moe_down``, ``embed``; :mod:`numba_kernels.linear`,
:mod:`numba_kernels.moe`, :mod:`numba_kernels.elementwise`) accept a weight as uint16 bf16 bits
with the same signature, widen each weight in a register and then run the float32 op's fma order. So an engine whose weights are resident as
bf16 bits computes the same bits as one whose weights are the widened float32 values, and a
decode step reads half the weight bytes.

Which weights: every matrix a ``linear`` or MoE op reads (the DeltaNet and attention projections,
the dense and shared-expert MLPs, the router and shared-expert gate, the routed experts, the MTP
``fc``, the lm head) and the embedding (one table when tied). Norm weights, the conv and the
DeltaNet's ``A_log`` / ``dt_bias`` are small and stay float32.

When (:func:`resolve`): ``--weights f32`` never, ``bf16`` always (every such weight must be
exactly a bf16 value, else a one-line error: primewalk does not round weights), ``auto`` (the
default) when the backend is CUDA and the checkpoint stores all of them as BF16.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import CheckpointError, PrimewalkError

MODES = ("auto", "f32", "bf16")
BF16 = np.uint16  # bf16 weights live on the backend as their bits


def matrix_names(tensors: dict) -> list:
    """The internal names of the tensors a bf16 engine keeps as bf16: matrices (2-D and up) and
    the embedding; the conv weight (a depthwise filter, not a matrix op) stays float32."""
    return sorted(k for k, a in tensors.items()
                  if np.ndim(a) >= 2 and not k.endswith("linear_attn.conv1d.weight"))


def resolve(requested: str | None, backend: str, ckpt) -> str:
    """The weight mode ("f32" | "bf16") for ``requested`` (None: ``$PRIMEWALK_WEIGHTS`` or auto)."""
    mode = (requested or os.environ.get("PRIMEWALK_WEIGHTS") or "auto").lower()
    if mode not in MODES:
        raise PrimewalkError(f"unknown weights mode {mode!r} (choose one of: {', '.join(MODES)})")
    if mode != "auto":
        return mode
    stored = ckpt.stored_as(matrix_names(ckpt.tensors))
    return "bf16" if backend == "cuda" and stored == {"BF16"} else "f32"


def resolve_for_mode(requested: str | None, mode: str, backend: str = "cpu") -> str:
    """The resident weights under a mode other than ``exact`` (issue #19's ``exact-bf16``, whose
    GEMM weights are rounded to bf16 at load, :mod:`.modes`): ``bf16`` keeps them as their bits
    (uint16), ``f32`` as float32 arrays of the bf16 values, ``auto`` bf16 on CUDA (half the bytes)
    and f32 on the CPU. The same bits either way: the MMA kernels and the twin read both."""
    w = (requested or os.environ.get("PRIMEWALK_WEIGHTS") or "auto").lower()
    if w not in MODES:
        raise PrimewalkError(f"unknown weights mode {w!r} (choose one of: {', '.join(MODES)})")
    if w == "auto":
        return "bf16" if backend == "cuda" else "f32"
    return w


def check_exact(tensors: dict) -> None:
    """Every tensor :func:`matrix_names` picks must be exactly a bf16 value; the first one that is
    not is named in a one-line error (primewalk widens exactly; it never rounds weights)."""
    for name in matrix_names(tensors):
        u = np.ascontiguousarray(tensors[name], dtype=np.float32).view(np.uint32)
        low = u & np.uint32(0xFFFF)
        if low.any():
            v = float(u.view(np.float32).reshape(-1)[int(np.flatnonzero(low)[0])])
            raise CheckpointError(f"--weights bf16: {name} holds values that are not bf16 (e.g. {v!r}); the "
                                  "checkpoint is not stored as bf16 and primewalk does not round weights "
                                  "(use --weights f32)")


def narrow(a: np.ndarray) -> np.ndarray:
    """float32 values that are bf16 values (:func:`check_exact`) -> their bf16 bits (uint16)."""
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(BF16)


def widen(h: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32, exactly."""
    return (np.asarray(h, dtype=np.uint32) << 16).view(np.float32)


def decode_bytes(tensors: dict, resident: str) -> int:
    """Bytes of the trunk weights one decode step reads (MTP head and embedding excluded; the lm
    head included) when the weights are ``resident`` ("f32" | "bf16"): the numerator of a decode
    floor."""
    kept = set(matrix_names(tensors)) if resident == "bf16" else set()
    return sum(a.size * (2 if k in kept else 4) for k, a in tensors.items()
               if not k.startswith("mtp.") and k != "model.embed_tokens.weight")
