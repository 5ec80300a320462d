"""RoPE tables, computed once on the host (DESIGN §3.4)."""

from __future__ import annotations

import math

import numpy as np


def rope_tables(n: int, rot_dim: int, theta: float):
    """cos, sin [n, rot_dim/2] float32, computed in float64 with the math module (identical on
    every machine, unlike numpy's SIMD paths) and rounded once."""
    half = rot_dim // 2
    inv = [math.pow(theta, -(2.0 * i) / rot_dim) for i in range(half)]
    cos = np.empty((n, half), np.float64)
    sin = np.empty((n, half), np.float64)
    for p in range(n):
        for i, f in enumerate(inv):
            a = p * f
            cos[p, i] = math.cos(a)
            sin[p, i] = math.sin(a)
    return cos.astype(np.float32), sin.astype(np.float32)
