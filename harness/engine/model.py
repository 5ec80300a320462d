"""The engine: weights resident on a backend, a shared workspace, per-session caches.

``Engine(checkpoint, backend)`` prepares the weights once (:mod:`.layout`); every session's work
goes through the same engine and the same workspace buffers (activations, scratch), so
interleaving sessions is a real hazard that the walker's peer check catches. Per-session state
lives in :class:`~harness.engine.cache.Cache`. The entry points and the arrays they take and
return are in :class:`Engine`'s docstring.

``weights="bf16"`` keeps the linear and MoE weights (and the embedding) bf16 on the backend; the
weight ops take them as uint16 bits and widen them in registers, so the bits are the float32 path's on the widened
weights (:mod:`.bf16`; the default ``auto`` picks it for a bf16 checkpoint on CUDA).

On a backend that can capture launches (CUDA), steps of at most
:data:`~harness.engine.graphs.GRAPH_MAX_ROWS` rows run once eagerly, are then captured per cache
and replayed (:mod:`.graphs`): the same kernels with the position read from the device, so
decode costs one graph launch instead of ~15 launches per layer. ``PRIMEWALK_GRAPHS=0`` or
``Engine(..., graphs=False)`` turns it off.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np

from ..errors import InputError, NumericError, PrimewalkError
from . import bf16
from .backend import get_backend, host_view
from .cache import Cache, Session
from .config import LINEAR
from .digests import config_fingerprint
from .draft import draft_ids
from .graphs import StepRunner, graph_key, graphs_wanted
from .layout import prepare_weights
from .modes import check_mode, mode_ops, weight_upload
from .rope import rope_tables
from .weights import Checkpoint

F32 = np.float32
#: The most rows one launch of a prime runs: longer primes are cut into chunks of at most this
#: many rows (bitwise equal to any other cut, by the exact contract), so the workspace is bounded
#: by the chunk, not by the prompt (:mod:`.memory` computes it).
PRIME_CHUNK_ROWS = 4096
#: Mapped logits buffers per captured step (key) and cache (:meth:`Engine._logits_slot`): a
#: decode loop holds the last step's logits while the next runs, so two alternate; the third
#: serves a caller that keeps one more.
LOGIT_RING = 3


# ------------------------------------------------------------------------------------------------
# the engine
# ------------------------------------------------------------------------------------------------
class Engine:
    """Weights on one backend plus the workspace every session shares.

    Entry points (bitwise consistent with each other in exact mode, since every kernel computes
    each row independently of how many rows share the launch):

    - ``prime_chunk(sess, ids)``: a batch of prompt rows; logits of the last row, hidden rows.
    - ``decode_step(sess, token)``: one row.
    - ``target_step(sess, ids, capture)``: K+1 verify rows with logits for every row and, with
      ``capture``, per-row DeltaNet state so :meth:`rollback` can keep an accepted prefix.
    - ``mtp_fill(sess, tokens, hiddens)`` / ``mtp_draft(sess, tokens, hiddens, chain)``: the MTP
      head (``mtp_rows`` is the pass both run; ``mtp_draft`` chains its passes on the device,
      drafting among a draft vocabulary once ``set_draft_vocab`` set one).

    Arrays at the API, one convention for every entry point:

    - **Logits are host** numpy float32 (``[V]`` or ``[n, V]``), brought to the host by the entry
      point: every caller picks a token from them. A captured step in exact mode (at most
      ``GRAPH_MAX_ROWS`` rows: decode, verify, MTP rows) has its lm head store them straight into pinned host
      memory mapped into the device, one of a small ring of buffers per step and session, so
      they need no download; other steps download them. The arrays are the caller's: a ring
      buffer is written again only once nothing of the array handed out over it is alive.
    - **Hidden rows stay on the backend** (``[R, H]`` float32: numpy on cpu, a device array on
      cuda) and are opaque to callers: pass them back to the engine (the MTP calls take backend
      rows as they are, or host rows) or download them explicitly with :meth:`host`.

    So a captured decode step copies nothing to the host (its logits and, when ``check_finite``,
    the NaN/Inf flags live in mapped host memory the kernels write directly).
    """

    def __init__(self, ckpt: Checkpoint, backend: str | None = None, check_finite: bool = True,
                 graphs: bool | None = None, chunk_rows: int = PRIME_CHUNK_ROWS, weights: str | None = None,
                 mode: str | None = None, draft_vocab=None):
        self.ckpt, self.cfg = ckpt, ckpt.config
        self.chunk_rows = int(chunk_rows)  # the most rows one prime launch runs
        self.mode = check_mode(mode)  # exact | exact-bf16 (.modes): the arithmetic
        self.B = get_backend(backend)
        # the resident weights (issue #14): "f32" | "bf16" (bf16 bits, uint16), independent of the mode
        self.weights = bf16.resolve(weights, self.B.name, ckpt) if self.mode == "exact" else bf16.resolve_for_mode(
            weights, self.mode, self.B.name)
        lin = emb = None
        if self.mode != "exact":  # GEMM weights rounded to bf16 (resident as bf16 bits or float32); the
            lin, emb = weight_upload(self.mode, self.B.upload, self.weights), self.B.upload  # embedding as loaded
        elif self.weights == "bf16":
            bf16.check_exact(ckpt.tensors)
            lin = lambda a: self.B.upload(bf16.narrow(a))  # noqa: E731
        self.ops = mode_ops(self.B.ops, self.mode)  # the weight ops take bf16 bits (uint16) as they are
        self.check_finite = check_finite
        self.graphs = graphs_wanted(self.ops, graphs)  # capture small steps (see .graphs)
        self.steps = StepRunner(self.B, self.ops, self.graphs)
        self.fingerprint = config_fingerprint(self.cfg)
        self.has_mtp = ckpt.has_mtp
        self._ws: dict = {}
        self._rope_n = 0
        self._flag_buf, self._flags_read = None, True
        self._no_flags = self.B.zeros((1,), np.int32)  # the flags of a launch that raises none
        w = prepare_weights(self.cfg, ckpt.tensors, self.B.upload, self.has_mtp, lin, emb)
        self._lin = lin or self.B.upload  # how a matrix a GEMM reads goes to the backend
        self._emb = emb or self._lin  # and the embedding (prepare_weights' rule)
        self.embed, self.lm_head, self.final_norm, self.layers, self.mtp = (
            w.embed, w.lm_head, w.final_norm, w.layers, w.mtp)
        self._flag_names = [L["name"] for L in self.layers] + ["lm_head"]  # one per NaN/Inf flag slot
        self.cap_conv_dummy = self.B.zeros((1, 1, 1))
        self.cap_rec_dummy = self.B.zeros((1, 1, 1, 1))
        self._trace = None  # the recording Trace of the step running now (see .trace)
        self.draft_ids = self.draft_head = None  # the draft vocabulary (.draft), none by default
        self._draft_gen = 0  # bumped by each set_draft_vocab: the draft passes' capture keys carry it
        if draft_vocab is not None:
            self.set_draft_vocab(draft_vocab)

    def host(self, rows) -> np.ndarray:
        """A host numpy copy of backend rows: hidden rows an entry point returned, or a plane."""
        return self.B.download(rows)

    # ---- workspace ---------------------------------------------------------------------------
    def ws(self, name, rows, width, dtype=F32):
        """A workspace buffer of at least ``rows`` × ``width`` (shared by all sessions)."""
        a = self._ws.get(name)
        if a is None or a.shape[0] < rows or a.shape[1] != width or a.dtype != dtype:
            cap = max(rows, 1 if a is None else a.shape[0])
            a = self._ws[name] = self.B.empty((cap, width), dtype)
        return a

    def xp(self, name, rows, width):
        """exact-bf16: the packed twin of workspace buffer ``name`` -- its rows' bf16 pairs
        (uint32 [rows, width/2]), which the op producing ``name`` writes beside it and the GEMMs
        reading ``name`` take instead of packing it themselves (one launch fewer each:
        ``numba_kernels`` ``xp=``). None in exact mode, for a width the tensor-core GEMV would
        not read packed (not a multiple of 8), and while a trace records (bisect taps and faults
        each op's own output: a fault flipped into ``name`` must reach the GEMMs that read it, so
        a traced step's GEMMs pack X themselves, as :meth:`_fused` runs the lm head unfused; the
        bits are the same): the GEMM then packs, or reads, X itself."""
        if self.mode != "exact-bf16" or width % 8 or self._trace is not None:
            return None
        return self.ws(name + ".xp", rows, width // 2, np.uint32)

    @staticmethod
    def _with_xp(op, xp, *args):
        """``op(*args)``, with X's packed twin ``xp`` (:meth:`xp`) appended where there is one (the
        float32 GEMM ops of exact mode take none)."""
        return op(*args) if xp is None else op(*args, xp)

    def _linear(self, X, W, out, R, xp=None):
        """``ops.linear``, handing the GEMM its input's packed twin where there is one."""
        self._with_xp(self.ops.linear, xp, X, W, out, R)

    def _ensure_rope(self, n):
        if n > self._rope_n:
            n = max(n, 2 * self._rope_n, 256)
            cos, sin = rope_tables(n, self.cfg.rotary_dim, self.cfg.rope_theta)
            self.cos, self.sin = self.B.upload(cos), self.B.upload(sin)
            self._rope_n = n

    # ---- sessions ----------------------------------------------------------------------------
    def new_session(self, max_ctx: int, session_id: int = 0) -> Session:
        """A fresh session of ``max_ctx`` positions. ``session_id`` keys the sampling counter
        RNG (seed, session, position), so give sessions whose draws must match the same id."""
        if not isinstance(max_ctx, (int, np.integer)) or max_ctx < 1:
            raise InputError(f"max_ctx must be a positive integer, got {max_ctx!r}")
        self._ensure_rope(int(max_ctx))
        return Session(Cache(self, int(max_ctx)), session_id=int(session_id))

    def check_ids(self, ids, what="prompt"):
        """``ids`` as int32 after checking them (a flat, non-empty list of integers in the
        vocabulary; else :class:`InputError`). A short list of Python ints -- a decode or verify
        step's -- is checked without numpy (a few µs on the step's critical path)."""
        V = self.cfg.vocab_size
        if type(ids) is list and 0 < len(ids) <= 64 and all(type(t) is int for t in ids):
            for i, t in enumerate(ids):
                if not 0 <= t < V:
                    self._id_out_of_range(what, t, i)
            return np.array(ids, np.int32)
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise InputError(f"{what}: expected a flat list of token ids, got shape {ids.shape}")
        if ids.size == 0:
            raise InputError(f"{what} is empty")
        if not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"{what}: token ids must be integers")
        bad = np.flatnonzero((ids < 0) | (ids >= V))
        if bad.size:
            self._id_out_of_range(what, int(ids[bad[0]]), int(bad[0]))
        return ids.astype(np.int32)

    def _id_out_of_range(self, what, t, i):
        raise InputError(f"{what}: token id {t} at index {i} is out of range for vocab_size {self.cfg.vocab_size}")

    def _check_session(self, sess, rows):
        if sess.cache.poisoned:
            raise InputError(f"session unusable: {sess.cache.poisoned}; restore a snapshot or start a new session")
        c = sess.cache
        if c.fingerprint != self.fingerprint:
            raise InputError("session cache belongs to a model with another config")
        if c.pos + rows > c.max_ctx:
            raise InputError(f"{rows} rows at position {c.pos} exceed the cache capacity {c.max_ctx}")

    # ---- layers ------------------------------------------------------------------------------
    def _gdn(self, L, li, h, R, cache, capture, caps):
        cfg, ops, ws = self.cfg, self.ops, self.ws
        kd, vd, cd, nv = cfg.key_dim, cfg.value_dim, cfg.conv_dim, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        nz = cd + vd  # one projection: q‖k‖v‖z, then b‖a from column nz
        qkvz = ws("qkvz", R, nz + 2 * nv)
        self._linear(h, L["qkvzba"], qkvz, R, self.xp("h", R, cfg.hidden_size))
        self._tap("qkvz", qkvz, c1=nz)
        self._tap("ba", qkvz, c0=nz)
        cap_c, cap_r = (caps["conv"][li], caps["rec"][li]) if capture else (self.cap_conv_dummy, self.cap_rec_dummy)
        mixed = ws("mixed", R, cd)
        ops.conv1d_silu(qkvz, 0, L["conv"], cache.conv[li], mixed, R, cap_c, capture)
        self._tap("conv", mixed)
        qn, kn = ws("qn", R, kd), ws("kn", R, kd)
        beta, g = ws("beta", R, nv), ws("g", R, nv)
        ops.gdn_prep(mixed, kd, cfg.linear_num_key_heads, dk, qkvz, nz, nv, L["A_log"], L["dt_bias"],
                     F32(1.0 / math.sqrt(dk)), qn, kn, beta, g, R)
        for name, a in (("gdn_q", qn), ("gdn_k", kn), ("beta", beta), ("g", g)):
            self._tap(name, a)
        o = ws("gdn_o", R, vd)
        ops.gdn_recurrence(qn, kn, mixed, 2 * kd, g, beta, cache.rec[li], o, R, dk, dv, cfg.v_per_k, cap_r, capture)
        self._tap("recurrence", o)
        on = ws("gdn_on", R, vd)
        onx = self.xp("gdn_on", R, vd) if dv % 2 == 0 else None  # a block a head packs its own pairs
        ops.gated_rmsnorm(o, qkvz, cd, nv, dv, L["norm"], cfg.rms_norm_eps, on, R, onx)
        self._tap("gated_norm", on)
        mix = ws("mix", R, cfg.hidden_size)
        self._linear(on, L["out"], mix, R, onx)
        self._tap("out_proj", mix)
        return mix

    def _attn(self, L, h, R, kc, vc, start, pos=None):
        cfg, ops, ws = self.cfg, self.ops, self.ws
        at = {} if pos is None else {"pos": pos}  # device-side position (captured steps, cuda only)
        hq, hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv = ws("qkv", R, 2 * hq * D + 2 * hkv * D)
        self._linear(h, L["qkv"], qkv, R, self.xp("h", R, cfg.hidden_size))
        self._tap("qkv", qkv)
        q = ws("q", R, hq * D)
        # q/k norms, RoPE and the K/V cache write, one launch: q normed and rotated; K normed,
        # rotated and V copied straight into the caches' rows start..
        ops.qk_norm_rope(qkv, hq, hkv, D, L["q_norm"], L["k_norm"], cfg.rms_norm_eps, cfg.rotary_dim // 2, self.cos,
                         self.sin, start, q, kc, vc, R, **at)
        self._tap("q_rope", q)
        self._tap("kv_write", kc, x0=start, then=vc)  # traced only eagerly: start is the position
        att = ws("att", R, hq * D)
        ops.attention(q, kc, vc, att, start, R, hq, hkv, D, F32(1.0 / math.sqrt(D)), **at)
        self._tap("attention", att)
        gated, gx = ws("att_g", R, hq * D), self.xp("att_g", R, hq * D)
        ops.sigmoid_gate(att, qkv, hq * D, gated, R, gx)
        self._tap("attn_gate", gated)
        mix = ws("mix", R, cfg.hidden_size)
        self._linear(gated, L["o"], mix, R, gx)
        self._tap("o_proj", mix)
        return mix

    def _mlp(self, L, h, R):
        cfg, ops, ws = self.cfg, self.ops, self.ws
        H = cfg.hidden_size
        mix = ws("mix", R, H)
        hx = self.xp("h", R, H)
        if not L["moe"]:
            I = L["inter"]
            gu, act, ax = ws("gu", R, 2 * I), ws("act", R, I), self.xp("act", R, I)
            self._gate_up(h, L["gu"], I, gu, act, R, hx, ax, "mlp_gu", "mlp_act")
            self._linear(act, L["down"], mix, R, ax)
            self._tap("mlp_down", mix)
            return mix
        E, k, I = cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
        rl, P = ws("router", R, E), ws("router_p", R, E)
        idx, wts = ws("moe_idx", R, k, np.int32), ws("moe_w", R, k)
        self._linear(h, L["router"], rl, R, hx)
        self._tap("moe_router", rl)
        ops.moe_route(rl, k, cfg.norm_topk_prob, P, idx, wts, R)
        self._tap("moe_route", wts, then=idx)
        mact, my = ws("moe_act", R * k, I), ws("moe_y", R * k, H)
        ops.moe_up(h, L["G2"], L["U2"], idx, I, mact, R)
        self._tap("moe_up", mact, m=k)  # row r: its k experts' rows r·k ..
        ops.moe_down(mact, L["D2"], idx, H, my, R)
        self._tap("moe_down", my, m=k)
        sh, sgl = ws("shared", R, H), ws("shared_gl", R, 1)
        if L["shared"]:
            S = cfg.shared_expert_intermediate_size
            sgu, sact, sx = ws("sgu", R, 2 * S), ws("sact", R, S), self.xp("sact", R, S)
            self._gate_up(h, L["sgu"], S, sgu, sact, R, hx, sx, "shared_gu", "shared_act")
            self._linear(sact, L["sdown"], sh, R, sx)
            self._tap("shared_down", sh)
            self._linear(h, L["sgate"], sgl, R, hx)
            self._tap("shared_gate", sgl)
        ops.moe_combine(my, wts, sh, sgl, L["shared"], mix, R)
        self._tap("moe_combine", mix)
        return mix

    def _gate_up(self, h, W, I, gu, act, R, hx, ax, gu_name, act_name):
        """An MLP's gate‖up projection ``gu`` of ``h`` and its SwiGLU ``act`` (packed twin ``ax``).
        In exact-bf16 with bf16-resident weights, outside a trace, one op (``linear_swiglu_mma``:
        the GEMV's epilogue computes the SwiGLU; ``gu`` is scratch); otherwise the two, each
        tapped (a traced step taps and faults each op's own output, as :meth:`_fused`)."""
        if self.mode == "exact-bf16" and self._fused():  # there: bf16 weights, no trace
            self.ops.linear_swiglu_mma(h, W, I, act, R, gu, hx, ax)
            return
        self._linear(h, W, gu, R, hx)
        self._tap(gu_name, gu)
        self.ops.swiglu_act(gu, I, act, R, ax)
        self._tap(act_name, act)

    def _block(self, L, li, x, h, R, start, kc, vc, cache, capture, caps, pos=None):
        """Layer ``L`` on the residual stream ``x`` whose input norm the caller has written to
        ``h`` (:meth:`_norm_in`); returns the MLP's output, which the caller adds to ``x`` in the
        same launch as the next norm (:meth:`_add_norm`)."""
        ops, cfg = self.ops, self.cfg
        if L["kind"] == LINEAR:
            mix = self._gdn(L, li, h, R, cache, capture, caps)
        else:
            mix = self._attn(L, h, R, kc, vc, start, pos)
        ops.add_rmsnorm(x, mix, L["post_norm"], cfg.rms_norm_eps, h, 0, R, self._no_flags, -1,  # h = norm(x += mix)
                        self.xp("h", R, cfg.hidden_size))
        self._tap("residual", x)
        self._tap("post_norm", h)
        return self._mlp(L, h, R)

    def _norm_in(self, x, L, R):
        """The first layer's input norm of ``x`` (later layers get theirs from :meth:`_add_norm`)."""
        h = self.ws("h", R, self.cfg.hidden_size)
        self.ops.rmsnorm(x, L["in_norm"], self.cfg.rms_norm_eps, h, 0, R, self.xp("h", R, self.cfg.hidden_size))
        self._tap("in_norm", h)
        return h

    def _fused(self):
        """Whether this step runs the fused op ``linear_flag`` (the lm head checking its logits as
        it stores them): in exact mode (the float32 GEMV), and in exact-bf16 with the weights
        resident as bf16 bits (the bf16 GEMV; with ``--weights f32`` the check would be a second
        kernel), outside a trace (bisect taps and faults each op's own output, so a traced step
        runs the ops one by one; the bits are the same)."""
        return (self.mode == "exact" or self.weights == "bf16") and self._trace is None

    def _add_norm(self, x, mix, w, out, R, flags, slot, name, ws_name):
        """A layer's last residual add and the norm after it (the next layer's input norm, or the
        final one, tapped as ``name``) in one launch: ``x += mix``, the layer's NaN/Inf flag on
        ``x`` (``flags[slot]``), ``out = norm(x)·(1 + w)`` (``out``: workspace ``ws_name``, its
        packed twin written too: :meth:`xp`)."""
        if flags is None:
            flags, slot = self._no_flags, -1
        self.ops.add_rmsnorm(x, mix, w, self.cfg.rms_norm_eps, out, 0, R, flags, slot,
                             self.xp(ws_name, R, self.cfg.hidden_size))
        self._tap("residual2", x)
        self._tap(name, out)

    def _flags(self):
        """The per-call NaN/Inf flags (one slot per layer + lm head), reset to zero. Host memory
        the kernels write directly (:meth:`~.backend.CudaBackend.mapped_zeros`): no copy either
        way. A previous call whose flags were never read (it raised before its download) may
        still be running: it is waited for before the reset."""
        if not self.check_finite:
            return None
        if self._flag_buf is None:
            self._flag_buf = self.B.mapped_zeros((len(self.layers) + 3,), np.int32)
            self._flag_host = host_view(self._flag_buf)
        else:
            if not self._flags_read:
                self.B.synchronize()
            self._flag_host[...] = 0
        self._flags_read = False
        return self._flag_buf

    def _raise_nonfinite(self, sess, flags, names=None):
        """After the call's synchronous logits download: raise if a flag is set (``names``: one
        per flag slot; the trunk's layers and lm head when None)."""
        if flags is None:
            return
        f = self._flag_host  # mapped host memory, written by the finished step
        self._flags_read = True
        if f.any():
            where = (names or self._flag_names)[int(np.flatnonzero(f)[0])]
            sess.cache.poisoned = f"{where} produced NaN or Inf"
            raise NumericError(f"{where} produced NaN or Inf (the session's cache is now unusable)")

    # ---- steps ------------------------------------------------------------------------------
    def _captured(self, key):
        """The key a step is captured under: ``key`` when graphs are on and no trace records, else
        None (eager)."""
        return key if self.graphs and self._trace is None else None

    def _step(self, c, key, body, inputs, start, keep=()):
        """Run ``body(inputs, start, pos)`` -- kernel launches only -- on cache ``c`` and return
        its outputs: captured and replayed under ``key`` when graphs are on, else eagerly
        (:meth:`~harness.engine.graphs.StepRunner.run`); always eagerly while a trace records.
        ``keep``: buffers the body reads or writes besides the workspace, the rope tables, the
        flags and ``inputs``."""
        return self.steps.run(c, self._captured(key), body, inputs, start,
                              lambda: [c, self.cos, self.sin, self._flag_buf, self._no_flags, *keep,
                                       *self._ws.values()])

    def _logits_slot(self, c, key, n, width=None):
        """(the key a step runs under, where its lm head stores the logits): for a step that is
        captured (``key`` not None, graphs on, no trace), the first free buffer of the cache's
        ring for ``key`` -- pinned host memory mapped into the device
        (:meth:`~.backend.CudaBackend.mapped_target`), up to LOGIT_RING of them, each written
        by its own capture of the step (the key gets the buffer's index) -- so the host hands
        the logits out after the step with no download; else (``key``, None): the workspace and
        one download, as for every step too large to capture, on the CPU, without a fused lm
        head, or while the caller still holds the logits of every buffer in the ring. The ring
        is exact mode's only: its float32 GEMV stores each logit once and checks it as it stores
        (:meth:`_fused`). In exact-bf16 the bf16 tensor-core GEMV fuses the check too, but its
        stores -- a warp's 16 × 8 tile, 32 bytes a row -- cross PCIe as small writes: on the
        H200 (tools/decode_profile.py, 2026-12-05) a captured five-row step with the ring took
        2.31 ms of device time against 1.05 without it, so exact-bf16 downloads its logits (and
        before the fused check, a second kernel reading mapped logits back took 2.08 ms a step,
        the bench at cba8c86). ``width``: the logits' columns (default the vocabulary)."""
        if self._captured(key) is None or self.mode != "exact" or not self._fused():
            return key, None
        ring = c.logit_rings.setdefault(key, [])
        for i, t in enumerate(ring):
            if self.B.mapped_free(t):
                return key + ("logits", i), t
        if len(ring) < LOGIT_RING:
            t = self.B.mapped_target((n, width or self.cfg.vocab_size))
            if t is not None:
                ring.append(t)
                return key + ("logits", len(ring) - 1), t
        return key, None

    def _logits_host(self, logits, dst):
        """A step's logits on the host (after its hidden copies were queued): ``dst``'s buffer
        handed out once the device is done, else one download of ``logits``."""
        if dst is None:
            return self.B.download(logits)
        self.B.synchronize()
        return self.B.hand_out_mapped(dst)

    # ---- trace mode (harness.engine.trace) ----------------------------------------------------
    @contextmanager
    def _tracing(self, sess, pazz, start, R):
        """Around one step of ``sess``: its trace (if any) records the step's op outputs."""
        tr = getattr(sess, "trace", None)
        if tr is None:
            yield
            return
        tr.begin(pazz, start, R)
        self._trace = tr
        try:
            yield
            tr.end()
        except BaseException:
            tr.abort()
            raise
        finally:
            self._trace = None

    def _tap(self, op, buf, **where):
        """Op ``op`` just wrote ``buf``: the recording trace, if any, reads it
        (:meth:`harness.engine.trace.Trace.tap`; ``where`` locates the step's rows in ``buf``)."""
        if self._trace is not None:
            self._trace.tap(op, buf, **where)

    def _trunk(self, sess, ids, logits_rows, capture=False, keep_hidden=True):
        """Run ``ids`` through the trunk at sess.cache.pos. Returns (logits host [n, V] for the
        last ``logits_rows`` rows (all when None), hidden [R, H], an owned backend array; only
        the last row [1, H] when not ``keep_hidden``)."""
        ids = self.check_ids(ids)
        R = len(ids)
        self._check_session(sess, R)
        c, cfg = sess.cache, self.cfg
        start = c.pos
        caps = None
        if capture:
            caps = sess.verify_caps
            if caps.get("rows") != R:
                caps.clear()
                caps.update(rows=R, conv={}, rec={})
                for li in cfg.gdn_layers:
                    caps["conv"][li] = self.B.empty((R, max(c.kc1, 1), cfg.conv_dim))
                    caps["rec"][li] = self.B.empty((R,) + tuple(c.rec[li].shape))
            caps["start"] = start
        n = R if logits_rows is None else min(logits_rows, R)
        flags = self._flags()
        key = graph_key("trunk", R, n, None if caps is None else id(caps["conv"]))

        def body(inp, at, pos):
            return self._trunk_body(c, inp["ids"], R, n, at, pos, capture, caps, flags, dst)

        with self._tracing(sess, "trunk", start, R):
            key, dst = self._logits_slot(c, key, n)  # inside: a recording trace runs eagerly, downloads
            logits, hf, last_row = self._step(c, key, body, {"ids": ids}, start,
                                              keep=() if caps is None else (caps["conv"], caps["rec"]))
        c.pos = start + R
        # the hidden copies are queued behind the step before the logits' download waits for all:
        # the host work of a step (copies, views) is done while the device runs it, none after
        # (the previous last row is released here too: a poisoned step's cache is unusable anyway)
        hidden = self.B.clone(hf if keep_hidden or R == 1 else last_row, step=True)
        c.last_h = hidden if hidden.shape[0] == 1 else self.B.clone(last_row, step=True)
        out = self._logits_host(logits, dst)
        self._raise_nonfinite(sess, flags)
        if capture:
            caps["hidden"] = hidden
        return out, hidden

    def _trunk_body(self, c, ids_dev, R, n, start, pos, capture, caps, flags, dst=None):
        """The trunk's launches (no copies): returns views of the logits [n, V] (in the
        workspace, ``dst``'s mapped buffer -- :meth:`_logits_slot` -- or ``dst``, a device
        array [n, V]), of the final-normed hidden
        rows [R, H] and of the last of them [1, H] (taken once per capture, not per replay: a
        device array's view costs tens of µs of host time)."""
        cfg, ops = self.cfg, self.ops
        x = self.ws("x", R, cfg.hidden_size)
        ops.embed(ids_dev, self.embed, x)
        self._tap("embed", x)
        h = self._norm_in(x, self.layers[0], R)
        hf = self.ws("hf", R, cfg.hidden_size)
        for li, L in enumerate(self.layers):
            mix = self._block(L, li, x, h, R, start, c.k.get(li), c.v.get(li), c, capture, caps, pos)
            if li + 1 < len(self.layers):
                self._add_norm(x, mix, self.layers[li + 1]["in_norm"], h, R, flags, li, "in_norm", "h")
            else:
                self._add_norm(x, mix, self.final_norm, hf, R, flags, li, "norm", "hf")
        return self._lm_head(hf, R, n, flags, len(self.layers), dst), hf[:R], hf[R - 1:R]

    def _lm_head(self, hf, R, n, flags, slot, dst, head=None):
        """The lm head of the last ``n`` of the step's ``R`` normed rows ``hf``: the logits [n, V]
        (a view of the workspace, of ``dst``'s mapped buffer -- :meth:`_logits_slot` -- or of
        ``dst``, a device array), checked
        for NaN/Inf into ``flags[slot]`` when ``flags`` is given -- by the op that computes them
        where :meth:`_fused` (``linear_flag``: the GEMV as it stores them), by a second pass
        otherwise; the rows' packed twin (:meth:`xp`) handed to the GEMM in exact-bf16.
        ``head``: (weight, width, workspace name) of another head than the lm head (the draft
        vocabulary's rows), with its own workspace: a capture holds its buffers' addresses."""
        ops = self.ops
        weight, width, name = head or (self.lm_head, self.cfg.vocab_size, "logits")
        logits = self.ws(name, n, width) if dst is None else getattr(dst, "dev", dst)
        hx = self.xp("hf", R, self.cfg.hidden_size)
        hx = None if hx is None else hx[R - n:]
        if flags is not None and self._fused():
            self._with_xp(ops.linear_flag, hx, hf[R - n:], weight, logits, n, flags, slot)
        else:
            self._linear(hf[R - n:], weight, logits, n, hx)
            if flags is not None:
                ops.nonfinite_flag(logits, n, flags, slot)
        self._tap("logits", logits, lo=R - n)  # the last n rows (the flag check writes none)
        return logits[:n]

    def prime_chunk(self, sess, ids):
        """Batched prime rows: (logits of the last row [V] host, hidden rows [R, H] backend).
        More than :attr:`chunk_rows` rows run as consecutive launches of at most that many."""
        ids = self.check_ids(ids)
        R = len(ids)
        if R <= self.chunk_rows:
            logits, hidden = self._trunk(sess, ids, 1)
            return logits[0], hidden
        self._check_session(sess, R)
        hidden = self.B.empty((R, self.cfg.hidden_size))
        for a in range(0, R, self.chunk_rows):
            b = min(a + self.chunk_rows, R)
            logits, h = self._trunk(sess, ids[a:b], 1)
            self.B.copy_into(hidden[a:b], h)
        sess.cache.last_h = hidden[R - 1:R]
        return logits[0], hidden

    def prime(self, sess, ids):
        """A long prime in chunks of at most :attr:`chunk_rows` rows, keeping no hidden rows:
        device memory bounded by the chunk, whatever the prompt's length. Returns the logits of
        the last row [V] host (bitwise those of ``prime_chunk`` on the same ids)."""
        ids = self.check_ids(ids)
        self._check_session(sess, len(ids))
        for a in range(0, len(ids), self.chunk_rows):
            logits, _ = self._trunk(sess, ids[a:a + self.chunk_rows], 1, keep_hidden=False)
        return logits[0]

    def decode_step(self, sess, token):
        """One row: (logits [V] host, hidden [1, H] backend)."""
        logits, hidden = self._trunk(sess, [int(token)], 1)
        return logits[0], hidden

    def decode_greedy(self, sess, token, n, keep_logits=False):
        """``n`` greedy decode steps from ``token`` (the token at ``sess.cache.pos``): each step
        runs its token and picks the next, ``numpy.argmax`` of its logits (the first of equal
        maxima; a NaN before any number). Returns (the ``n`` picks as ints -- the last one not
        yet run, as after ``n`` :meth:`decode_step` calls each fed the previous pick -- and,
        with ``keep_logits``, the steps' logits [n, V] host float32, else None).

        Bitwise those ``n`` :meth:`decode_step` calls (the same kernels on the same rows) with
        the pick on the device (op ``greedy_pick``): its last kernel writes the next step's
        token and position, so step t + 1 is issued before the host waits for step t, and the
        host's work of a step (reading the pick and the NaN/Inf flags, taking the logits)
        overlaps the device's. Each step has its own flags, pick and logits buffers (on the
        device and pinned), one of two slots that alternate; on a GPU each is captured once per
        cache (``("greedy", slot)``) and replayed, and with ``keep_logits`` a step's logits
        cross to the host on a copy stream of their own while the next step runs
        (:meth:`~.backend.CudaBackend.download_async`). A NaN/Inf raises :class:`NumericError` as :meth:`decode_step` does, once
        the step issued after it is done too (the session is unusable then either way). A call
        stopped part-way by anything else (an interrupt, a failed launch) waits for the steps
        it issued, sets the cache's position to them and leaves the session refusing
        (:class:`InputError`, ``decode_greedy stopped after k of n steps``) until a snapshot is
        restored: those steps' picks reached no caller. A recording trace (bisect) runs the
        :meth:`decode_step` calls themselves."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise InputError(f"decode_greedy: n must be a positive integer, got {n!r}")
        n = int(n)
        tok = int(self.check_ids([int(token)], "decode token")[0])
        self._check_session(sess, n)
        if getattr(sess, "trace", None) is not None:
            return self._greedy_stepwise(sess, tok, n, keep_logits)
        c, B, ch = sess.cache, self.B, self._chain()
        start = c.pos
        io, picked, flags, pin, ev, got = ch["io"], ch["picked"], ch["flags"], ch["pin"], ch["ev"], ch["got"]
        B.copy_into(io, np.array([start, tok], np.int32))
        out = np.empty((n, self.cfg.vocab_size), F32) if keep_logits else None
        picks, last = [], None

        def finish(t):
            """Wait for step t; its pick and logits to the host; raise on its flags."""
            s = t % 2
            B.wait(ev[s])
            if flags is not None and ch["flags_host"][s].any():
                B.synchronize()  # the step after it was issued: let it end before raising
                f = ch["flags_host"][s]
                where = self._flag_names[int(np.flatnonzero(f)[0])]
                c.pos = start + min(t + 2, n)
                c.poisoned = f"{where} produced NaN or Inf"
                raise NumericError(f"{where} produced NaN or Inf (the session's cache is now unusable)")
            picks.append(int(ch["picked_host"][s]))
            if out is not None:
                B.wait(got[s])  # its logits' copy (behind the step, beside the next one)
                out[t] = pin[s][0]

        issued = 0
        try:
            for t in range(n):
                s = t % 2
                fl = None if flags is None else flags[s]
                if fl is not None:
                    ch["flags_host"][s][...] = 0  # step t - 2, its last user, was waited for

                def body(at, pos, s=s, fl=fl):
                    logits, _, last_row = self._trunk_body(c, ch["ids"], 1, 1, at, pos, False, None, fl,
                                                           ch["logits"][s])
                    self.ops.greedy_pick(logits, io, picked, s)
                    return logits, last_row

                key = self._captured(("greedy", s))
                issued = t + 1  # from here the step may have run (in part): the cache is written
                logits, last = self.steps.run_chained(
                    c, key, body, start + t, ch["pos"],
                    lambda: [c, self.cos, self.sin, io, picked, self._no_flags, *(flags or ()), *self._ws.values()])
                B.record(ev[s])
                if out is not None:  # step t + 2, the next to write this slot's logits, is
                    B.download_async(pin[s], logits, got[s])  # issued after finish(t) waited for this
                if t:
                    finish(t - 1)
            c.pos = start + n
            c.last_h = B.clone(last, step=True)  # queued behind the last step
            finish(n - 1)
        except NumericError:
            raise
        except BaseException as e:  # an interrupt, a failed launch: steps ran that no caller saw
            self._wait_quietly()  # the steps issued end before the position says they ran
            c.pos = start + issued
            c.poisoned = f"decode_greedy stopped after {issued} of {n} steps ({type(e).__name__})"
            raise
        return picks, out

    def _greedy_stepwise(self, sess, tok, n, keep_logits):
        """:meth:`decode_greedy` as the :meth:`decode_step` calls it stands for."""
        picks, rows = [], []
        for _ in range(n):
            logits, _ = self.decode_step(sess, tok)
            tok = int(np.argmax(logits))
            picks.append(tok)
            if keep_logits:
                rows.append(np.array(logits, copy=True))
        return picks, (np.stack(rows) if keep_logits else None)

    def _chain(self):
        """:meth:`decode_greedy`'s buffers, made once: the chained steps' int32 [position, token]
        on the device (``io``, and its two views), the two slots' picks and NaN/Inf flags (mapped
        host memory the kernels write), their logits on the device (a slot's own: its copy to
        the host runs beside the other slot's step) and on the host (pinned), and events (a
        step done; its logits' copy done)."""
        ch = self.__dict__.get("_chain_bufs")
        if ch is None:
            B, V = self.B, self.cfg.vocab_size
            io = B.zeros((2,), np.int32)
            picked = B.mapped_zeros((2,), np.int32)
            ch = dict(io=io, pos=io[0:1], ids=io[1:2], picked=picked, picked_host=host_view(picked),
                      logits=[B.empty((1, V)) for _ in range(2)], pin=[B.pinned_empty((1, V)) for _ in range(2)],
                      ev=[B.event() for _ in range(2)], got=[B.event() for _ in range(2)], flags=None)
            if self.check_finite:  # one slot per layer and the lm head, as :meth:`_flags`
                ch["flags"] = [B.mapped_zeros((len(self.layers) + 3,), np.int32) for _ in range(2)]
                ch["flags_host"] = [host_view(f) for f in ch["flags"]]
            self._chain_bufs = ch
        return ch

    def target_step(self, sess, ids, capture=False):
        """Verify rows: (logits [R, V] host, hidden [R, H] backend); ``capture`` keeps per-row
        DeltaNet state for :meth:`rollback`."""
        return self._trunk(sess, ids, None, capture)

    def rollback(self, sess, keep: int) -> None:
        """After ``target_step(..., capture=True)`` of R rows, keep only the first ``keep`` rows:
        DeltaNet conv/recurrent state from row keep-1's capture, K/V length start + keep."""
        caps = sess.verify_caps
        if not caps or "start" not in caps:
            raise PrimewalkError("rollback without a captured target step")
        R, start = caps["rows"], caps["start"]
        if not 1 <= keep <= R or sess.cache.pos != start + R:
            raise PrimewalkError(f"rollback to {keep} of {R} captured rows is not possible here")
        c = sess.cache
        if keep < R:
            self.B.run_copies(self._rollback_plan(c, caps, keep))
            c.pos = start + keep
            c.last_h = caps["hidden"][keep - 1:keep]
        caps.pop("start")

    def _rollback_plan(self, c, caps, keep):
        """The copies of a rollback to ``keep`` rows (each DeltaNet layer's conv and recurrent
        state from row keep-1's capture), resolved once per capture buffers and ``keep``
        (:meth:`Backend.copy_plan`) and kept in ``caps``, whose buffers live as long as its row
        count (:meth:`_trunk`); checked against the cache's arrays before each reuse."""
        layers = self.cfg.gdn_layers
        plans = caps.setdefault("plans", {})
        plan = plans.get(keep)
        if plan is None or plan[0] is not c.conv or plan[1] is not c.rec:
            pairs = [p for li in layers for p in ((c.conv[li], caps["conv"][li][keep - 1]),
                                                  (c.rec[li], caps["rec"][li][keep - 1]))]
            plan = plans[keep] = (c.conv, c.rec, self.B.copy_plan(pairs))
        return plan[2]

    # ---- MTP ---------------------------------------------------------------------------------
    def require_mtp(self, what="the MTP head"):
        if not self.has_mtp:
            raise PrimewalkError(f"{self.ckpt.path or 'model'} has no MTP head (no mtp.* tensors); "
                                 f"{what} needs one")

    def set_draft_vocab(self, vocab) -> None:
        """Draft among ``vocab`` only (:mod:`.draft`: a count N for the ids 0..N-1, or token
        ids; None: the whole vocabulary again). The lm head's rows at those ids are copied once
        (resident as the lm head is); :meth:`mtp_draft` then runs its passes through that copy
        and returns ids of the vocabulary. The draft logits are the full head's at those ids,
        bit for bit."""
        self._draft_gen += 1  # the draft passes' captures read the head they were captured with
        if vocab is None:
            self.draft_ids = self.draft_head = None
            return
        self.require_mtp("a draft vocabulary")
        ids = draft_ids(vocab, self.cfg.vocab_size)
        t = self.ckpt.tensors
        src = t["model.embed_tokens.weight" if self.cfg.tie_word_embeddings else "lm_head.weight"]
        self.draft_head = self._lin(np.ascontiguousarray(np.asarray(src)[ids], dtype=F32))
        self.draft_ids = ids

    def mtp_rows(self, sess, tokens, hiddens, start, logits_rows=None, last_hidden=False, draft=False):
        """MTP head over rows at positions start..: row r pairs tokens[r] with hiddens[r] (the
        hidden state of the position before; [R, H], host or backend). Writes the MTP K/V there. Returns (logits host
        [n, V] of the last ``logits_rows`` rows (all when None), out hidden [R, H] backend, or only its last row
        [1, H] with ``last_hidden``). ``draft`` with a draft vocabulary (:meth:`set_draft_vocab`):
        the logits are [n, N], the draft vocabulary's columns only."""
        self.require_mtp()
        cfg, ops, M, c = self.cfg, self.ops, self.mtp, sess.cache
        sub = draft and self.draft_ids is not None
        ids = self.check_ids(tokens, "MTP tokens")
        R, H = len(ids), cfg.hidden_size
        if start + R > c.max_ctx:
            raise InputError(f"MTP rows up to position {start + R - 1} exceed the cache capacity {c.max_ctx}")
        n = R if logits_rows is None else min(logits_rows, R)
        flags = self._flags()
        hin = hiddens if not isinstance(hiddens, np.ndarray) else np.ascontiguousarray(hiddens, F32)
        key = graph_key("mtp", R, "draft", self._draft_gen, n) if sub else graph_key("mtp", R, n)
        head = self._draft_head() if sub else None
        if sub:
            self._drop_old_drafts(c)

        def body(inp, at, pos):
            hf = self.ws("hf", R, H)
            self._mtp_pass(inp["ids"], self.embed, inp["hin"], R, at, pos, c, flags, hf)
            return self._lm_head(hf, R, n, None, -1, dst, head), hf[:R], hf[R - 1:R]  # views, taken once per capture

        with self._tracing(sess, "mtp", start, R):
            key, dst = self._logits_slot(c, key, n, head[1] if sub else None)
            logits, hf, last_row = self._step(c, key, body, {"ids": ids, "hin": hin}, start)
        hidden = self.B.clone(last_row if last_hidden else hf, step=True)  # queued behind the step, before the download waits
        out = self._logits_host(logits, dst)
        self._raise_nonfinite(sess, flags, ["mtp.layers.0"])
        return out, hidden

    def _mtp_pass(self, ids, table, hin, R, at, pos, c, flags, hf):
        """The launches of one MTP pass over ``R`` rows up to its final norm: the rows of
        ``table`` at ``ids`` (the embedding, or the draft vocabulary's rows of it) paired with
        ``hin``, the head's layer at position ``at`` (``pos`` on the device when not None),
        the normed output rows into ``hf``."""
        cfg, ops, M, H = self.cfg, self.ops, self.mtp, self.cfg.hidden_size
        e = self.ws("mtp_e", R, H)
        ops.embed(ids, table, e)
        self._tap("embed", e)
        cat = self.ws("mtp_cat", R, 2 * H)
        cx = self.xp("mtp_cat", R, 2 * H)  # each half packs its own pairs (H % 4 == 0 where there is one)
        ops.rmsnorm(e, M["norm_e"], cfg.rms_norm_eps, cat, 0, R, cx)
        self._tap("norm_e", cat, c1=H)
        ops.rmsnorm(hin, M["norm_h"], cfg.rms_norm_eps, cat, H, R, cx)
        self._tap("norm_h", cat, c0=H)
        x = self.ws("x", R, H)
        self._linear(cat, M["fc"], x, R, cx)
        self._tap("fc", x)
        h = self._norm_in(x, M["layer"], R)
        mix = self._block(M["layer"], -1, x, h, R, at, c.mtp_k, c.mtp_v, c, False, None, pos)
        self._add_norm(x, mix, M["norm"], hf, R, flags, 0, "norm", "hf")

    def _draft_head(self):
        """(weight, width, logits workspace) of the draft vocabulary's lm-head rows."""
        return self.draft_head, len(self.draft_ids), "logits.draft"

    def mtp_fill(self, sess, tokens, hiddens):
        """Fill the head's K/V over committed rows at positions mtp_len..; row r pairs tokens[r]
        with hiddens[r] (trunk hidden of the position before; [n, H], host or backend)."""
        c = sess.cache
        n = len(tokens)
        if c.mtp_len + n > c.pos + 1:
            raise PrimewalkError(f"MTP fill of {n} rows at {c.mtp_len} runs ahead of the trunk ({c.pos})")
        self.mtp_rows(sess, tokens, hiddens, c.mtp_len, logits_rows=1)
        c.mtp_len += n

    def mtp_draft(self, sess, tokens, hiddens, chain):
        """One pass over the committed rows (filling the head's K/V; the last row must be the
        pending token at the trunk's position), then ``chain`` greedy drafts, each fed by the
        head's own output hidden. Returns the drafts: ids of the vocabulary, picked among the
        draft vocabulary's where one is set (:meth:`set_draft_vocab`; the lowest id on a tie).

        The passes are chained on the device: each one's last kernels pick its draft
        (``greedy_pick``, ``numpy.argmax`` of its logits row) and write it, and the next position,
        where the next pass reads its token, so the host issues every pass before it waits
        once, for the picks; no logits reach the host. A pass after the first embeds its
        token from the draft vocabulary's rows of the embedding, the pick being an index into
        them. Bitwise the passes :meth:`mtp_rows` runs one at a time with the host's argmax
        between them (:meth:`_draft_stepwise`, which a recording trace runs)."""
        c = sess.cache
        n = len(tokens)
        if c.mtp_len + n != c.pos + 1:
            raise PrimewalkError(f"MTP cache out of step: {c.mtp_len} + {n} rows vs trunk position {c.pos}")
        if c.pos + chain > c.max_ctx:
            raise InputError(f"MTP drafts up to position {c.pos + chain} exceed the context limit {c.max_ctx}")
        if getattr(sess, "trace", None) is not None or chain < 1:
            return self._draft_stepwise(sess, tokens, hiddens, chain)
        self.require_mtp()
        cfg, B = self.cfg, self.B
        ids = self.check_ids(tokens, "MTP tokens")
        start = c.mtp_len
        if start + n > c.max_ctx:
            raise InputError(f"MTP rows up to position {start + n - 1} exceed the cache capacity {c.max_ctx}")
        ch = self._draft_chain(chain, n)
        self._drop_old_drafts(c)
        io, picked, dh = ch["io"], ch["picked"], ch["h"]
        sub = self.draft_ids is not None
        head = self._draft_head() if sub else (self.lm_head, cfg.vocab_size, "logits")
        table = ch["embed"] if sub else self.embed  # a pass after the first embeds its pick
        flags = self._flags()
        hin = hiddens if not isinstance(hiddens, np.ndarray) else np.ascontiguousarray(hiddens, F32)
        keep = [io, picked, dh, head[0], table]
        gen = self._draft_gen
        io0 = np.array([start + n - 1, 0], np.int32)  # io's start: the first pick moves it to start + n

        def first(inp, at, pos):
            self.ops.copy_i32(inp["io0"], io, 2)  # an input of the step: no driver copy of its own
            self._mtp_pass(inp["ids"], self.embed, inp["hin"], n, at, pos, c, flags, dh[:n])
            self.ops.greedy_pick(self._lm_head(dh, n, 1, None, -1, None, head), io, picked, 0)

        try:
            self._step(c, graph_key("draft", n, "draft", gen), first, {"ids": ids, "hin": hin, "io0": io0}, start, keep)
            for i in range(1, chain):
                r = n if i == 1 else 1  # the previous pass's rows: its last row feeds this one

                def body(at, pos, i=i, r=r):
                    self._mtp_pass(io[1:2], table, dh[r - 1:r], 1, at, pos, c, flags, dh[:1])
                    self.ops.greedy_pick(self._lm_head(dh, 1, 1, None, -1, None, head), io, picked, i)

                self.steps.run_chained(c, self._captured(graph_key("draft+", r, "draft", gen, i)), body, start + n + i - 1,
                                       io[0:1], lambda: [c, self.cos, self.sin, self._flag_buf, self._no_flags,
                                                         *keep, *self._ws.values()])
            B.synchronize()
        except BaseException:  # a stopped or failed launch: let what was issued end before the next call
            self._wait_quietly()
            raise
        c.mtp_len = start + n
        self._raise_nonfinite(sess, flags, ["mtp.layers.0"])
        got = ch["picked_host"][:chain].tolist()
        return got if not sub else [int(self.draft_ids[d]) for d in got]

    def _draft_stepwise(self, sess, tokens, hiddens, chain):
        """:meth:`mtp_draft` as :meth:`mtp_rows` passes, the host's argmax between them."""
        c = sess.cache
        n = len(tokens)
        start = c.mtp_len
        logits, out = self.mtp_rows(sess, tokens, hiddens, start, logits_rows=1, last_hidden=True, draft=True)
        c.mtp_len = start + n
        ids = self.draft_ids
        drafts = []
        for i in range(chain):
            d = int(np.argmax(logits[-1]))
            d = d if ids is None else int(ids[d])
            drafts.append(d)
            if i + 1 < chain:
                logits, out = self.mtp_rows(sess, [d], out, start + n + i, logits_rows=1, last_hidden=True,
                                            draft=True)
        return drafts

    def _wait_quietly(self):
        """Wait for the launches issued so far, after a call was stopped part-way (an interrupt, a
        failed launch); a wait that fails too (a dead context) is let pass, so the error that
        stopped the call is the one raised."""
        try:
            self.B.synchronize()
        except Exception:  # noqa: BLE001
            pass

    def _drop_old_drafts(self, c):
        """Drop cache ``c``'s captures of draft passes made under an older draft generation (a
        draft vocabulary set since, or the chain's buffers grown): their keys carry it, after
        ``"draft"`` (``(what, rows, "draft", generation, ...)``), and what they hold (an old
        draft head, buffers) is freed. Runs between calls, when none of them is in flight."""
        if c.draft_gen == self._draft_gen:
            return
        for keys in (c.graphs, c.logit_rings, c.graph_seen):
            for k in [k for k in keys if len(k) > 3 and k[2] == "draft" and k[3] != self._draft_gen]:
                keys.remove(k) if isinstance(keys, set) else keys.pop(k)
        c.draft_gen = self._draft_gen

    def _draft_chain(self, chain, rows):
        """:meth:`mtp_draft`'s buffers, owned by the engine (a capture holds their addresses, so
        they outlive the workspace's growth): int32 [position, token] on the device (``io``),
        the picks (mapped host memory the kernels write), the passes' normed rows ``h`` (a pass
        reads its predecessor's last row there) and the draft vocabulary's embedding rows. Grown
        for a longer chain or a wider first pass, which bumps the draft passes' capture keys."""
        B, H = self.B, self.cfg.hidden_size
        ch = self.__dict__.get("_draft_bufs")
        if ch is None or ch["picked"].shape[0] < chain or ch["h"].shape[0] < rows:
            cap = max(chain, 8, 0 if ch is None else ch["picked"].shape[0])
            hr = max(rows, 8, 0 if ch is None else ch["h"].shape[0])
            picked = B.mapped_zeros((cap,), np.int32)
            ch = self._draft_bufs = dict(io=B.zeros((2,), np.int32), picked=picked, picked_host=host_view(picked),
                                         h=B.empty((hr, H)), embed=None, embed_gen=None)
            self._draft_gen += 1
        if self.draft_ids is not None and ch["embed_gen"] != self._draft_gen:
            t = np.asarray(self.ckpt.tensors["model.embed_tokens.weight"])
            ch["embed"] = self._emb(np.ascontiguousarray(t[self.draft_ids], dtype=F32))
            ch["embed_gen"] = self._draft_gen
        return ch
