"""Every digest primewalk records, one definition each; everything else imports them.

A digest is the SHA-256 of a tagged, fixed-order byte string: lengths and shapes as
little-endian int64, float values as their little-endian float32 bits (every NaN as one
canonical NaN: :func:`canonical_f32`). Equal digests mean equal
bits; the tags (``primewalk-cache/1`` …) version each layout.

- :func:`cache_digest`: a session's state (a live :class:`~harness.engine.cache.Cache` or a
  :class:`~harness.engine.cache.Snapshot`): positions, then every plane in the cache's order.
- :func:`logits_digest`: a logits array (shape and bits).
- :func:`capture_digest`: a list of boundary captures (position, logits, last hidden row, state).
- :func:`continuation_digest`: generated token ids.
- :func:`prompt_digest`: a prompt's token ids (what the tokenizer, or the seed, produced).
- :func:`config_fingerprint`: a model config (which caches and snapshots belong together).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np


CANONICAL_NAN = np.uint32(0x7FC00000)


def canonical_f32(a) -> np.ndarray:
    """``a`` as float32 with every NaN replaced by the one canonical NaN (bits 0x7fc00000).

    The arithmetic contract fixes every finite and infinite result bit for bit, and where a NaN
    arises, but not a NaN's sign or payload: IEEE leaves them to the hardware (the GPU's fma
    returns 0x7fffffff, the CPU propagates an input's payload). So every digest and every bitwise
    comparison sees one canonical NaN; NaN against a number still differs. (The engine raises on
    a non-finite hidden row or logit before any NaN reaches a receipt.)"""
    host = np.ascontiguousarray(a.copy_to_host() if hasattr(a, "copy_to_host") else a, dtype="<f4")
    nan = np.isnan(host)
    if nan.any():
        host = host.copy()
        host.view(np.uint32)[nan] = CANONICAL_NAN
    return host


def _f32_bytes(a) -> bytes:
    """The little-endian float32 bits of a host (numpy) or device array, row-major, every NaN
    canonical (:func:`canonical_f32`)."""
    return canonical_f32(a).tobytes()


def _i64_bytes(values) -> bytes:
    return np.array(values, dtype="<i8").tobytes()


def cache_digest(pos: int, mtp_len: int, planes) -> str:
    """SHA-256 over the trunk and MTP lengths and, per ``(name, array)`` plane in the given
    (fixed) order, its name, shape and float32 bits."""
    h = hashlib.sha256(b"primewalk-cache/1\0")
    h.update(_i64_bytes([pos, mtp_len]))
    for name, a in planes:
        h.update(name.encode() + b"\0" + _i64_bytes(a.shape))
        h.update(_f32_bytes(a))
    return h.hexdigest()


def logits_digest(logits) -> str:
    """SHA-256 over the shape and float32 bits of ``logits``."""
    a = np.asarray(logits, dtype=np.float32)
    return hashlib.sha256(b"primewalk-logits/1\0" + _i64_bytes(a.shape) + _f32_bytes(a)).hexdigest()


def capture_digest(captures) -> str:
    """SHA-256 over each capture's position, logits bits, last hidden bits and state digest
    (captures: ``pos``, ``logits``, ``last_h``, ``snap`` with ``digest()``)."""
    h = hashlib.sha256(b"primewalk-captures/1\0")
    h.update(_i64_bytes([len(captures)]))
    for c in captures:
        h.update(_i64_bytes([c.pos]))
        h.update(_f32_bytes(c.logits))
        h.update(_f32_bytes(c.last_h))
        h.update(c.snap.digest().encode())
    return h.hexdigest()


def continuation_digest(tokens) -> str:
    """SHA-256 of the token ids as little-endian int64."""
    return hashlib.sha256(_i64_bytes(list(tokens))).hexdigest()


def prompt_digest(ids) -> str:
    """SHA-256 of a prompt's token ids as little-endian int64, tagged ``primewalk-prompt/1``."""
    return hashlib.sha256(b"primewalk-prompt/1\0" + _i64_bytes(list(ids))).hexdigest()


def config_fingerprint(cfg) -> str:
    """SHA-256 of the config's sorted-key JSON."""
    return hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()
