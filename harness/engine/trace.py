"""Trace mode: every op's output row, hashed as it is produced, for one session (DESIGN §8).

Attach a :class:`Trace` to a session (``sess.trace = Trace(engine)``). Each engine step of that
session -- a trunk step (prime chunk, decode step, target step) or an MTP-head step (fill,
drafts) -- then runs eagerly (captured CUDA-graph steps are skipped: eager launches give the
same bits) and the engine hands the trace each op's output buffer right after the op ran
(``Engine._tap``). The trace

- hashes every row the op computed with the ``row_hash`` kernel op (64-bit FNV-1a over the
  float32 bit patterns, lane-interleaved: :mod:`numba_kernels.trace`; integer arithmetic on
  the backend, the same on both backends), so CPU and CUDA traces compare without downloading
  activations;
- keeps the full row (its float32 bits) where asked (``keep``);
- flips the lowest mantissa bit of one element where asked (``fault``: the demonstration and
  test hook of ``harness bisect``): the first column of one op's output at one row, in the
  buffer itself, before anything reads it.

Apart from the fault, a trace only reads the buffers it is shown (its hashes go to its own
buffer), so digests with tracing on and off are equal.

**Places.** An entry is (pass, absolute row, occurrence, op). The passes are ``trunk`` and
``mtp``; the op lists are :func:`op_list` -- per layer kind, in execution order, the names that
``harness bisect --list-ops`` prints and ``--fault`` takes as ``LAYER:OP`` (``trunk:embed``,
``0:in_norm`` … ``0:residual2`` …, ``trunk:norm``, ``trunk:logits``; ``mtp:embed``, ``mtp:norm_e``,
``mtp:norm_h``, ``mtp:fc``, the head's layer ``mtp:in_norm`` …, ``mtp:norm``, ``mtp:logits``). The
*row* of an MTP entry is the position its K/V is written at. The *occurrence* counts how often
the session computed that (pass, row) before: speculative decoding verifies rows it later rolls
back and recomputes, and chained drafts are recomputed as committed rows; prime rows have
occurrence 0. Every other op runs once per row; ``logits`` only for the rows a step asks for
(the last row of a prime chunk, every verify row).

**Comparison order** (:func:`first_divergence`): by absolute row, then pass (trunk before mtp),
then occurrence, then op in execution order. Every entry depends only on entries of earlier
rows or on earlier ops of its own (row, pass, occurrence): the conv state holds earlier rows'
inputs, the recurrent state earlier rows' (the recurrence's state is internal: a fault on
``recurrence`` moves its output row only, never the state), attention at row r reads K/V rows
≤ r written by the ``kv_write`` op before it, an MTP row at p pairs the token at p with the trunk
(or head) hidden row of p - 1, and the token at any row comes from logits or drafts of earlier
rows, as do the accept / roll-back decisions that choose which rows run next. So whatever a
fault at one entry changes comes after it in this order, and the fault's own entry differs (one
flipped bit in a row always changes its FNV-1a hash): the first differing entry common to two
traces is the fault. Execution order differs between schedules (a batched chunk runs layer by
layer over many rows, tokenwise row by row); this order is the same for both.
"""

from __future__ import annotations

import numpy as np

from ..errors import PrimewalkError
from .config import LINEAR

PASSES = ("trunk", "mtp")
GDN_OPS = ("in_norm", "qkvz", "ba", "conv", "gdn_q", "gdn_k", "beta", "g", "recurrence", "gated_norm",
           "out_proj", "residual")
ATTN_OPS = ("in_norm", "qkv", "q_rope", "kv_write", "attention", "attn_gate", "o_proj", "residual")
DENSE_OPS = ("post_norm", "mlp_gu", "mlp_act", "mlp_down", "residual2")
SHARED_OPS = ("shared_gu", "shared_act", "shared_down", "shared_gate")
TRUNK_HEAD, TRUNK_TAIL = ("embed",), ("norm", "logits")
MTP_HEAD, MTP_TAIL = ("embed", "norm_e", "norm_h", "fc"), ("norm", "logits")

OCC_BITS, OP_BITS = 10, 16  # an entry's sort key: row, pass, occurrence, op packed in one int64


def layer_ops(kind: str, moe: bool, shared: bool) -> tuple:
    """The ops of one decoder layer, in execution order: its mixer (gated DeltaNet or
    attention), then a dense or MoE MLP (with or without a shared expert)."""
    mixer = GDN_OPS if kind == LINEAR else ATTN_OPS
    if not moe:
        return mixer + DENSE_OPS
    return mixer + ("post_norm", "moe_router", "moe_route", "moe_up", "moe_down",
                    *(SHARED_OPS if shared else ()), "moe_combine", "residual2")


def op_list(cfg, has_mtp: bool) -> dict:
    """``{pass: [(layer, op), ...]}`` in execution order for a model config (the MTP head's
    layer is a full-attention layer with layer 0's MLP kind, as the engine lays it out); layer
    is ``"trunk"``, a trunk layer's index as text, or ``"mtp"`` (the head and its layer). The
    engine checks every traced step against it (:meth:`Trace.tap`)."""
    shared = cfg.shared_expert_intermediate_size > 0
    trunk = [("trunk", op) for op in TRUNK_HEAD]
    for li, kind in enumerate(cfg.layer_types):
        trunk += [(str(li), op) for op in layer_ops(kind, cfg.is_moe_layer(li), shared)]
    trunk += [("trunk", op) for op in TRUNK_TAIL]
    out = {"trunk": trunk}
    if has_mtp:
        out["mtp"] = [("mtp", op) for op in
                      MTP_HEAD + layer_ops("full_attention", cfg.is_moe_layer(0), shared) + MTP_TAIL]
    return out


def place_name(layer: str, op: str) -> str:
    return f"{layer}:{op}"


def parse_fault(text: str, ops: dict) -> tuple:
    """``LAYER:OP:ROW`` -> (pass, row, op index); a one-line PrimewalkError when it names no op."""
    parts = str(text).split(":")
    if len(parts) != 3:
        raise PrimewalkError(f"--fault: expected LAYER:OP:ROW (e.g. 2:recurrence:40), got {text!r}")
    layer, op, row = parts
    try:
        row = int(row)
    except ValueError:
        raise PrimewalkError(f"--fault {text}: the row must be an integer, got {row!r}") from None
    if row < 0:
        raise PrimewalkError(f"--fault {text}: the row must be >= 0")
    for p, names in ops.items():
        if (layer, op) in names:
            return p, row, names.index((layer, op))
    raise PrimewalkError(f"--fault {text}: no op {layer}:{op} in this model (harness bisect --list-ops "
                         f"lists them)")


class StopTrace(Exception):
    """Raised from a tap once a trace's ``stop_after`` entry is recorded: nothing later is
    needed, so the run stops there (its session is then unusable)."""


class Trace:
    """The trace of one session (see the module docstring).

    ``keep``: (pass, row, occurrence) triples whose rows are kept in full (every op);
    ``rows``: absolute rows to record (None: all); ``fault``: (pass, row, op index) whose output
    gets its lowest bit flipped at column 0 of that row, on the row's first occurrence;
    ``stop_after``: an entry key (:meth:`key`) after which the run stops (:class:`StopTrace`);
    ``hashes``: False records no hashes (no ``row_hash`` launches, no downloads: :meth:`table`
    is empty), only the kept rows -- what bisect's re-runs for the divergent row's values need.
    """

    def __init__(self, engine, keep=(), rows=None, fault=None, stop_after=None, hashes=True):
        self.B, self.ops = engine.B, engine.ops
        self.names = op_list(engine.cfg, engine.mtp is not None)
        self.keep = set(keep)
        self.rows = None if rows is None else set(int(r) for r in rows)
        self.fault, self.fault_applied = fault, False
        self.stop_after = stop_after
        self.hashes = bool(hashes)
        self.steps = []  # (pass, start, occurrences [R], hashes [R, S] uint64, first row per op [S])
        self.kept = {}  # entry key -> (row bits, dtype parts): see _row
        self._seen = {}  # (pass, row) -> times computed
        self._H = {}  # pass -> backend hash buffer, reused
        self._views = {}  # id(buffer) -> (buffer, uint32 view)
        self._step = None

    # ---- the engine's side --------------------------------------------------------------------
    def begin(self, pazz: str, start: int, R: int) -> None:
        """A step of ``R`` rows at absolute rows ``start``.. of pass ``pazz`` begins."""
        occ = np.empty(R, np.int64)
        for r in range(R):
            occ[r] = self._seen.get((pazz, start + r), 0)
            self._seen[(pazz, start + r)] = occ[r] + 1
        S = len(self.names[pazz])
        H = self._H.get(pazz)
        if self.hashes and (H is None or H.shape[0] < R):
            H = self._H[pazz] = self.B.empty((max(R, 256), S), np.uint64)
        keep = [r for r in range(R) if (pazz, start + r, int(occ[r])) in self.keep] if self.keep else []
        self._step = dict(pazz=pazz, start=start, R=R, occ=occ, H=H, first=np.full(S, -1, np.int64), cursor=0,
                          keep=keep)

    def tap(self, op: str, buf, x0=0, m=1, c0=0, c1=None, lo=0, then=None) -> None:
        """Op ``op`` of the step wrote its rows: step row ``lo + j`` (j < R - lo) is buffer rows
        ``x0 + j·m`` … ``+ m - 1``, columns ``c0:c1`` (default all); ``then``: a second buffer
        holding the rest of the output at the same rows (its columns follow the first's)."""
        st = self._step
        pazz, start, R = st["pazz"], st["start"], st["R"]
        slot = st["cursor"]
        names = self.names[pazz]
        if slot >= len(names) or names[slot][1] != op:
            want = names[slot][1] if slot < len(names) else "nothing"
            raise AssertionError(f"trace: the engine ran {op} where the {pazz} op list has {want}")
        st["cursor"] = slot + 1
        st["first"][slot] = lo
        n = R - lo
        c1 = buf.shape[1] if c1 is None else c1
        X = self._view(buf)
        if self.fault is not None and not self.fault_applied and self.fault[0] == pazz and self.fault[2] == slot:
            r = self.fault[1] - start
            if lo <= r < R and st["occ"][r] == 0:
                self.ops.flip_low_bit(X, x0 + (r - lo) * m, c0)
                self.fault_applied = True
        if self.hashes:
            H = st["H"][lo:]
            self.ops.row_hash(X, x0, m, c0, c1, H, slot, False, n)
            if then is not None:
                self.ops.row_hash(self._view(then), x0, m, 0, then.shape[1], H, slot, True, n)
        for r in st["keep"]:
            if r >= lo:
                key = self.key(pazz, start + r, int(st["occ"][r]), slot)
                self.kept[key] = self._row(buf, then, x0 + (r - lo) * m, m, c0, c1)
                if self.stop_after == key:
                    raise StopTrace()

    def end(self) -> None:
        """The step finished: its hashes come to the host."""
        st, self._step = self._step, None
        names = self.names[st["pazz"]]
        if st["cursor"] != len(names):
            raise AssertionError(f"trace: a {st['pazz']} step ran {st['cursor']} of its {len(names)} ops")
        if self.hashes:
            hashes = self.B.download(st["H"][: st["R"]])
            self.steps.append((st["pazz"], st["start"], st["occ"], hashes, st["first"]))

    def abort(self) -> None:
        """The step stopped early (an error, or :class:`StopTrace`): nothing of it is recorded."""
        self._step = None

    def _view(self, buf):
        got = self._views.get(id(buf))
        if got is None:
            got = self._views[id(buf)] = (buf, buf.view(np.uint32))
        return got[1]

    def _row(self, buf, then, i, m, c0, c1) -> tuple:
        """(bits uint32, [(dtype name, columns), ...]): a traced row in full, its buffers' columns
        one after the other (the rows are downloaded whole: column slices of device arrays are
        not contiguous)."""
        parts = [(buf.dtype, self.B.download(buf[i:i + m])[:, c0:c1])]
        if then is not None:
            parts.append((then.dtype, self.B.download(then[i:i + m])))
        return (np.concatenate([np.ascontiguousarray(a).view(np.uint32).reshape(-1) for _, a in parts]),
                [(np.dtype(d).name, a.size) for d, a in parts])

    # ---- reading it --------------------------------------------------------------------------
    @staticmethod
    def key(pazz: str, row: int, occ: int, slot: int) -> int:
        """An entry's sort key: row, pass, occurrence, op (see the module docstring)."""
        if occ >= 1 << OCC_BITS or slot >= 1 << OP_BITS:
            raise PrimewalkError(f"trace: occurrence {occ} or op {slot} out of range")
        return ((((row << 1) | PASSES.index(pazz)) << OCC_BITS | occ) << OP_BITS) | slot

    @staticmethod
    def split_keys(keys):
        """(rows, pass indices, occurrences, op indices) of sort keys (ints or int64 arrays)."""
        slot = keys & ((1 << OP_BITS) - 1)
        occ = (keys >> OP_BITS) & ((1 << OCC_BITS) - 1)
        rp = keys >> (OP_BITS + OCC_BITS)
        return rp >> 1, rp & 1, occ, slot

    @classmethod
    def unkey(cls, key: int) -> tuple:
        """(pass, row, occurrence, op index) of a sort key."""
        row, p, occ, slot = cls.split_keys(int(key))
        return PASSES[p], row, occ, slot

    def table(self) -> tuple:
        """(keys int64 sorted, hashes uint64): every recorded entry once (a key recorded twice
        would be a bookkeeping bug)."""
        keys, hashes = [], []
        for pazz, start, occ, H, first in self.steps:
            R = H.shape[0]
            rows = np.arange(start, start + R, dtype=np.int64)
            for slot in np.flatnonzero(first >= 0):
                sel = np.arange(int(first[slot]), R)
                if self.rows is not None:
                    sel = sel[np.isin(rows[sel], list(self.rows))]
                base = (((rows[sel] << 1) | PASSES.index(pazz)) << OCC_BITS | occ[sel]) << OP_BITS
                keys.append(base | slot)
                hashes.append(H[sel, slot])
        if not keys:
            return np.zeros(0, np.int64), np.zeros(0, np.uint64)
        k, h = np.concatenate(keys), np.concatenate(hashes)
        order = np.argsort(k, kind="stable")
        k, h = k[order], h[order]
        if k.size > 1 and (k[1:] == k[:-1]).any():
            raise AssertionError("trace: an entry was recorded twice")
        return k, h

    def place(self, key: int) -> dict:
        """An entry as data: pass, layer, op, row, occurrence."""
        pazz, row, occ, slot = self.unkey(key)
        layer, op = self.names[pazz][slot]
        return {"pass": pazz, "layer": layer, "op": op, "row": row, "occurrence": occ}


def first_divergence(a: Trace, b: Trace) -> dict:
    """Compare two traces on the entries both recorded, in the comparison order (module
    docstring). Returns ``compared``, ``only_a``, ``only_b`` (entry counts), ``first`` (the first
    differing entry's key, or None) and ``later`` (the keys of every other differing entry)."""
    ka, ha = a.table()
    kb, hb = b.table()
    common, ia, ib = np.intersect1d(ka, kb, assume_unique=True, return_indices=True)
    differ = common[ha[ia] != hb[ib]]
    return {"compared": int(common.size), "only_a": int(ka.size - common.size),
            "only_b": int(kb.size - common.size),
            "first": int(differ[0]) if differ.size else None, "later": differ[1:]}

