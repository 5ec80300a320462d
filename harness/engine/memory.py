"""Device memory of the engine, computed without allocating it.

:func:`plan` runs the engine's own step bodies (the trunk and the MTP head) on a backend whose
arrays take no memory (``np.broadcast_to`` of one zero) and whose ops do nothing, so the
workspace it reports is the one the real engine allocates: every ``Engine.ws`` buffer, sized by
the rows of the largest launch. With primes cut into ``chunk_rows`` launches
(:attr:`Engine.chunk_rows`) the workspace is bounded by the chunk; the K/V cache grows with the
context, as it must. Kernel-owned scratch (split-KV statistics, ``numba_kernels.launch.scratch``)
is capped by the kernels and not counted here.

Device buffers and what sizes them, for a prime of T tokens at context C:

- weights: the model; the K/V cache ``[C, Hkv·D]`` per attention layer (and the MTP layer's);
  the rope tables ``[C, rotary/2]``: the context, as they must.
- workspace (``Engine.ws``), the eager ids buffer, the hidden rows a launch returns: the launch's
  rows, at most ``chunk_rows`` in ``Engine.prime`` / ``prime_chunk`` (``prime_chunk`` still
  returns all T hidden rows, ``[T, H]``, as its callers asked; ``Engine.prime`` keeps only the
  last row; the walker copies each chunk's rows to the host).
- logits: only the rows a caller needs (one per prime launch; K+1 for a verify step).
- verify captures: K+1 rows of DeltaNet state; snapshots: the cache rows in use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cache import Cache
from .config import ModelConfig
from .modes import DEFAULT_MODE
from .weights import mtp_shapes, trunk_shapes


class _NoOps:
    """Every op is a no-op (shapes only)."""

    def __getattr__(self, name):
        return lambda *a, **k: None


class _Layer(dict):
    """A layer dict whose weights are absent (the ops do nothing with them)."""

    def __missing__(self, key):
        return None


class ShapeBackend:
    """A backend whose arrays have shapes and dtypes but no storage."""

    name = "shapes"
    ops = _NoOps()

    def empty(self, shape, dtype=np.float32):
        return np.broadcast_to(np.zeros((), dtype), tuple(np.atleast_1d(shape)))

    zeros = empty

    def upload(self, a):
        return self.empty(np.shape(a), np.asarray(a).dtype)

    def download(self, a):
        return np.zeros(a.shape, a.dtype)

    def copy_into(self, dst, src):
        pass

    def clone(self, a, step=False):
        return self.empty(a.shape, a.dtype)

    def mapped_target(self, shape, dtype=np.float32):
        return None  # host memory: not in the device's budget

    def synchronize(self):
        pass


@dataclass
class MemoryPlan:
    """Bytes the engine allocates on the device for one session of ``max_ctx`` positions whose
    launches have at most ``rows`` rows (``logits_rows`` of them with logits)."""

    weights: int
    cache: int
    workspace: dict  # name -> bytes
    step_outputs: int  # the hidden rows a launch returns (owned copies)

    @property
    def workspace_bytes(self) -> int:
        return sum(self.workspace.values())

    @property
    def above_weights(self) -> int:
        return self.cache + self.workspace_bytes + self.step_outputs


def plan(cfg: ModelConfig, max_ctx: int, rows: int, logits_rows: int = 1, keep_hidden: bool = False) -> MemoryPlan:
    """The engine's device allocations for ``cfg`` (see the module docstring)."""
    from .model import Engine  # the engine's own bodies decide the workspace

    B = ShapeBackend()
    eng = Engine.__new__(Engine)
    eng.cfg, eng.B, eng.ops, eng._ws, eng.graphs = cfg, B, B.ops, {}, False
    eng.has_mtp = cfg.has_mtp
    eng.check_finite, eng._flag_buf, eng._trace, eng.mode = False, None, None, DEFAULT_MODE
    eng._no_flags = B.empty((1,), np.int32)
    eng.layers = [_Layer(kind=kind, moe=cfg.is_moe_layer(i), name=f"model.layers.{i}",
                         inter=cfg.intermediate_size, shared=cfg.shared_expert_intermediate_size > 0)
                  for i, kind in enumerate(cfg.layer_types)]
    eng.embed = eng.lm_head = eng.final_norm = None
    eng.cos = eng.sin = eng.cap_conv_dummy = eng.cap_rec_dummy = None
    eng.fingerprint = "shapes"
    c = Cache(eng, max_ctx)
    ids = B.empty((rows,), np.int32)
    eng._trunk_body(c, ids, rows, min(logits_rows, rows), 0, None, False, None, None)
    if cfg.has_mtp:
        eng.mtp = {"layer": _Layer(eng.layers[0], kind="full_attention", moe=cfg.is_moe_layer(0))}
        M = eng.mtp
        # the MTP pass of the engine, shapes only (Engine.mtp_rows' body)
        H = cfg.hidden_size
        eng.ws("mtp_e", rows, H), eng.ws("mtp_cat", rows, 2 * H)
        x = eng.ws("x", rows, H)
        eng._block(M["layer"], -1, x, rows, 0, c.mtp_k, c.mtp_v, c, False, None, None, 0)
        eng.ws("hf", rows, H), eng.ws("logits", min(logits_rows, rows), cfg.vocab_size)
    shapes = dict(trunk_shapes(cfg))
    if cfg.has_mtp:
        shapes.update(mtp_shapes(cfg))
    weights = sum(4 * int(np.prod(s)) for s in shapes.values())
    cache = sum(a.size * a.itemsize for a in [*c.conv.values(), *c.rec.values(), *c.k.values(), *c.v.values()]
                + ([c.mtp_k, c.mtp_v] if c.mtp_k is not None else []))
    ws = {k: int(a.size * a.itemsize) for k, a in eng._ws.items()}
    out = 4 * cfg.hidden_size * (rows + 1 if keep_hidden and rows > 1 else 1)  # the rows and the last row's own copy
    return MemoryPlan(int(weights), int(cache), ws, int(out))
