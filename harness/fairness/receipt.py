"""The fairness receipt: the matrix receipt's schema and conventions with ``kind = "fairness"``.

Written atomically as JSON (sorted keys) plus a CSV of its cells beside it, by
:func:`~harness.matrix.receipts.write_receipt`; read back by :func:`read_fairness_receipt`.
``harness diff`` compares two fairness receipts cell by cell on the compared fields of
:data:`~harness.matrix.receipts.FIELD_ROLES` (digests, verdict status, tape, yields,
continuation tokens, acceptance counts); every timing is informational.

Schema version 1 (the matrix keys, then these)::

    {"schema_version": 1, "kind": "fairness", "created", "env", "model", "spec", "spec_hash",
     "shard": {"index": 0, "count": 1}, "wall_s",
     "sessions": [{"index", "name", "role": "long"|"peer", "prompt_len", "arrival_s",
                   "max_new_tokens", "k", "sampling"}, ...],
     "alone": {"long_ttft_s", "arrival_unit", "arrival_scale_s", "independent_check"},
     "policies": [{"label", "name", "steps", "peers_first_event_latency_s": {"p50", "p95", "max",
                   "values"}, "peers_p50_s", "peers_p95_s", "peers_max_s", "long_ttft_s",
                   "long_ttft_over_alone", "longest_tick_s", "longest_hold_s", "makespan_s",
                   "idle_s", "units", "timeline": [[session, kind, phase, rows, start_s, end_s], ...]}],
     "goals": [{"metric", "policy", "baseline", "max_ratio", "value", "baseline_value", "ratio",
                "met"}],
     "verdict": {"status": "bitwise"|"fail", "cells", "sessions", "failed": [cell ids]},
     "cells": [{"id": "<run>/<session>", "run": "alone"|<policy label>, "session", "role",
                "variant": <run>, "oracle": "alone/<session>", "prompt", "prompt_len", "k",
                "sampling", "max_new_tokens", "tape", "yields", "digests": {"logits", "captures",
                "final_state", "continuation"}, "verdict", "continuation": {"tokens"},
                "acceptance", "timings": {"arrival_s", "start_s", "first_event_s", "finish_s",
                "first_event_latency_s", "finish_latency_s", "busy_s", "prime_s", "units"}}, ...]}

Times are seconds on the scheduler clock (the measured device time of each unit). A cell's
``yields`` is its prime's chunk count less one: every run advances the walker one chunk per unit
and so hands the device back after each chunk; whether another session ran in between is the
policy's (see the timeline).
"""

from __future__ import annotations

from ..errors import PrimewalkError
from ..matrix.receipts import read_receipt, write_receipt

KIND = "fairness"
REQUIRED = ("sessions", "alone", "policies", "goals", "verdict")


def validate_fairness(receipt: dict, where: str = "receipt") -> None:
    """What a fairness receipt has beyond a matrix receipt's keys (a one-line error if not)."""
    if receipt.get("kind") != KIND:
        raise PrimewalkError(f"{where}: a {receipt.get('kind')!r} receipt, not a {KIND!r} receipt")
    for key in REQUIRED:
        if key not in receipt:
            raise PrimewalkError(f"{where}: not a fairness receipt (no '{key}')")
    n = len(receipt["sessions"])
    for pol in receipt["policies"]:
        for unit in pol.get("timeline", []):
            if not (isinstance(unit, list) and len(unit) == 6 and 0 <= unit[0] < n):
                raise PrimewalkError(f"{where}: policy {pol.get('label')!r}: a timeline entry must be "
                                     f"[session, kind, phase, rows, start_s, end_s], got {unit!r}")


def write_fairness_receipt(path: str, receipt: dict) -> None:
    validate_fairness(receipt, path)
    write_receipt(path, receipt)


def read_fairness_receipt(path: str) -> dict:
    receipt = read_receipt(path)
    validate_fairness(receipt, path)
    return receipt
