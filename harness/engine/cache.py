"""Per-session state: the :class:`Cache` (every plane a session's rows wrote), its owned copy
:class:`Snapshot`, and the :class:`Session` that carries a cache through a prime and a
continuation. The engine's workspace is not here: it is shared by all sessions."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputError
from .config import LINEAR
from .digests import cache_digest


class Cache:
    """Per-session state: attention K/V per layer ``[max_ctx, Hkv·D]``, DeltaNet conv state
    ``[K-1, conv_dim]`` and recurrent state ``[Hv, dk, dv]`` per layer, the MTP layer's K/V,
    ``pos`` (trunk rows done), ``mtp_len`` (MTP rows filled), ``max_ctx``. Planes live on the
    engine's backend."""

    def __init__(self, engine, max_ctx: int):
        cfg, B = engine.cfg, engine.B
        self.cfg, self.B, self.fingerprint = cfg, B, engine.fingerprint
        self.max_ctx, self.pos, self.mtp_len = int(max_ctx), 0, 0
        self.poisoned = None  # why the planes can no longer be trusted (NaN/Inf), until a restore
        self.last_h = None  # backend [1, H]: trunk hidden row of the last processed position
        kvw = cfg.num_key_value_heads * cfg.head_dim
        self.conv, self.rec, self.k, self.v = {}, {}, {}, {}
        self.kc1 = cfg.linear_conv_kernel_dim - 1
        for i, t in enumerate(cfg.layer_types):
            if t == LINEAR:
                self.conv[i] = B.zeros((max(self.kc1, 1), cfg.conv_dim))
                self.rec[i] = B.zeros((cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                       cfg.linear_value_head_dim))
            else:
                self.k[i], self.v[i] = B.zeros((self.max_ctx, kvw)), B.zeros((self.max_ctx, kvw))
        self.mtp_k = B.zeros((self.max_ctx, kvw)) if cfg.has_mtp else None
        self.mtp_v = B.zeros((self.max_ctx, kvw)) if cfg.has_mtp else None
        # captured steps on this cache's planes (harness.engine.graphs): key -> (graph, outputs,
        # inputs); keys seen once (run eagerly, to compile and allocate before a capture)
        self.graphs: dict = {}
        self.graph_seen: set = set()
        # captured steps' mapped logits buffers (Engine._logits_slot): key -> [MappedTarget, ...];
        # each is written by its own capture of the step, so they live as long as the graphs
        self.logit_rings: dict = {}
        # the engine's draft generation (Engine.set_draft_vocab) this cache's draft captures
        # were last checked against (Engine._drop_old_drafts)
        self.draft_gen = 0

    def planes(self):
        """(name, backend array view) in the fixed digest order."""
        out = []
        for i, t in enumerate(self.cfg.layer_types):
            if t == LINEAR:
                out.append((f"layers.{i}.conv", self.conv[i][: self.kc1]))
                out.append((f"layers.{i}.recurrent", self.rec[i]))
            else:
                out.append((f"layers.{i}.k", self.k[i][: self.pos]))
                out.append((f"layers.{i}.v", self.v[i][: self.pos]))
        if self.mtp_k is not None:
            out.append(("mtp.k", self.mtp_k[: self.mtp_len]))
            out.append(("mtp.v", self.mtp_v[: self.mtp_len]))
        return out

    def digest(self) -> str:
        """:func:`~harness.engine.digests.cache_digest` of the planes in use."""
        return cache_digest(self.pos, self.mtp_len, self.planes())

    def snapshot(self) -> "Snapshot":
        """An owned copy of every plane (only the rows in use of the K/V planes)."""
        return Snapshot(self.fingerprint, self.pos, self.mtp_len,
                        [(n, self.B.clone(a)) for n, a in self.planes()],
                        None if self.last_h is None else self.B.clone(self.last_h))

    def restore(self, snap: "Snapshot") -> None:
        if not isinstance(snap, Snapshot):
            raise InputError("restore: not a cache snapshot")
        if snap.fingerprint != self.fingerprint:
            raise InputError("restore: the snapshot comes from a model with another config")
        if snap.pos > self.max_ctx or snap.mtp_len > self.max_ctx:
            raise InputError(f"restore: the snapshot holds {max(snap.pos, snap.mtp_len)} positions, "
                             f"this cache only {self.max_ctx}")
        self.pos, self.mtp_len = snap.pos, snap.mtp_len
        for (name, dst), (sname, src) in zip(self.planes(), snap.planes):
            assert name == sname
            if src.shape[0]:
                self.B.copy_into(dst, src)
        self.last_h = None if snap.last_h is None else self.B.clone(snap.last_h)
        self.poisoned = None


@dataclass
class Snapshot:
    """An owned copy of a cache's planes (:meth:`Cache.snapshot`); its digest equals the cache's
    at the time it was taken."""

    fingerprint: str
    pos: int
    mtp_len: int
    planes: list  # (name, backend array), in Cache.planes order
    last_h: object = None  # not part of the digest: the hidden row the next MTP fill pairs with

    def digest(self) -> str:
        return cache_digest(self.pos, self.mtp_len, self.planes)


@dataclass
class Session:
    """One sequence's state: its cache, the committed tokens, the boundary captures and the turn
    checkpoint a prime took, the prepared prime (``prime_ready``: set by the walker's finish; a
    session is primed once), the sampling RNG's session id, and the per-row DeltaNet state of
    the last captured target step (``verify_caps``, for :meth:`Engine.rollback`)."""

    cache: Cache
    committed: list = field(default_factory=list)
    boundary_captures: list = field(default_factory=list)
    turn_ckpt: object = None
    prime_ready: object = None
    session_id: int = 0
    verify_caps: dict = field(default_factory=dict)  # per-row DeltaNet state of the last target step
    trace: object = None  # a harness.engine.trace.Trace recording this session's steps, or None

    @property
    def last_h(self):
        """Backend [1, H]: the trunk hidden row of the last processed position (or None)."""
        return self.cache.last_h

    @property
    def poisoned(self):
        return self.cache.poisoned
