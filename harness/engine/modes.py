"""The engine's arithmetic modes: ``exact`` (float32 on the FMA units, the default) and
``exact-bf16`` (the bf16 tensor-core MMA, reproduced bit for bit on the CPU; issue #19,
``numba_kernels/MMA.md``).

A mode decides two things only:

- **the weights of every GEMM** (every linear layer, the MoE router and experts, the DeltaNet and
  attention projections, the MTP ``fc``, the lm head): in ``exact-bf16`` they are rounded to bf16
  (round to nearest even) once at load, so a bf16 checkpoint's weights are unchanged and a float32
  checkpoint's are rounded, and kept as their bf16 bits (uint16; the default on CUDA: half the
  bytes a decode step reads) or as float32 arrays holding the bf16 values (the default on the CPU,
  ``--weights f32``): the same bits either way, since the MMA kernels and the twin read both. A
  tied lm head gets its own rounded copy; the embedding table, norms, conv, ``A_log`` and
  ``dt_bias`` stay as loaded.
- **which ops run the GEMMs**: ``linear``, ``linear_flag`` (the lm head), ``attention``, ``moe_up``
  and ``moe_down`` become their ``_mma`` versions (activations rounded to bf16 at every GEMM input, K in MMA steps of 16).

Everything else (norms, softmax statistics, RoPE, gates, conv, the DeltaNet recurrence, all state)
is the float32 exact path in both modes.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError

MODES = ("exact", "exact-bf16")
DEFAULT_MODE = "exact"
MMA_OPS = ("linear", "linear_flag", "attention", "moe_up", "moe_down")  # run as <name>_mma in exact-bf16


def check_mode(mode) -> str:
    mode = DEFAULT_MODE if mode is None else mode
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r} (choose one of: {', '.join(MODES)})")
    return mode


def round_bf16(a) -> np.ndarray:
    """float32 values rounded to bf16 (nearest even; NaN stays NaN), as float32."""
    from numba_kernels.mma import bf16_to_f32, f32_to_bf16

    return bf16_to_f32(f32_to_bf16(a))


def weight_upload(mode: str, upload, resident: str = "f32"):
    """How GEMM weights go to the backend in ``mode``: in ``exact-bf16`` rounded to bf16, then kept
    as float32 arrays (``resident`` "f32") or as their bits (uint16, "bf16": half the bytes)."""
    if mode == "exact-bf16":
        if resident == "bf16":
            from numba_kernels.mma import f32_to_bf16  # the bits round_bf16 widens back

            return lambda a: upload(np.ascontiguousarray(f32_to_bf16(a)))
        return lambda a: upload(round_bf16(a))
    return upload


class ModeOps:
    """The backend's op set with the mode's GEMM ops in place of the float32 ones; every other
    name (ops, versions, ``capture`` ...) is the backend's."""

    def __init__(self, ops, mode: str):
        self._ops = ops
        self.mode = mode
        if mode == "exact-bf16":
            for name in MMA_OPS:
                setattr(self, name, getattr(ops, name + "_mma"))

    def __getattr__(self, name):
        return getattr(self._ops, name)


def mode_ops(ops, mode: str):
    return ops if mode == DEFAULT_MODE else ModeOps(ops, mode)
