"""Random weights for any config: the embedded tiny model, tests, benchmarks.

``random_tensors(cfg, seed)`` fills every tensor the config calls for (internal names, float32)
with seeded values scaled so that activations stay O(1): matrices ~ N(0, 1/fan_in), zero-centred
norm weights ~ N(0, 0.1) (never all zeros, so a wrong norm convention shows), the gated norm
weight ~ 1 + N(0, 0.1), ``A_log = log U(1, 16)`` as in HF, ``dt_bias ~ U(-1, 1)``.
"""

from __future__ import annotations

import numpy as np

from .engine.config import ModelConfig
from .engine.weights import mtp_shapes, trunk_shapes


def random_tensors(cfg: ModelConfig, seed: int = 0, mtp: bool = True, scale: float = 1.0,
                   trunk: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    shapes = trunk_shapes(cfg) if trunk else {}
    if mtp:
        shapes.update(mtp_shapes(cfg))
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("A_log"):
            a = np.log(rng.uniform(1.0, 16.0, shape))
        elif name.endswith("dt_bias"):
            a = rng.uniform(-1.0, 1.0, shape)
        elif name.endswith("linear_attn.norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            a = 0.1 * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            a = rng.standard_normal(shape)
        else:
            a = scale * rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = a.astype(np.float32)
    return out
