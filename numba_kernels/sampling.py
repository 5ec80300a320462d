"""Host-side sampling helpers (float32, index order): CPU only, whatever the backend -- the
sampler reads logits on the host (``harness/sampling.py``)."""

from __future__ import annotations

import numpy as np

from .exact import ZERO
from .tags import fmul, twin


@twin("normalise", host=True)
def normalise_cpu(e):
    """e / Σe with the sum taken in index order."""
    s = ZERO
    for i in range(e.size):
        s = s + e[i]
    out = np.empty_like(e)
    for i in range(e.size):
        out[i] = e[i] / s
    return out


@twin("draw_index", host=True)
def draw_index_cpu(p, u):
    """The first i whose running sum of p (index order) exceeds u · Σp; the last nonzero
    index when rounding leaves the sum short."""
    t = ZERO
    for i in range(p.size):
        t = t + p[i]
    target = fmul(u, t)
    c = ZERO
    last = 0
    for i in range(p.size):
        if p[i] > ZERO:
            last = i
        c = c + p[i]
        if c > target:
            return i
    return last
