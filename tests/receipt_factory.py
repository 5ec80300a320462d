"""A synthetic but realistic matrix receipt (schema 1) for the receipt, diff, plot and notebook tests.

Three prompts (one short enough for the ``short`` variant), the schedule variants of the matrix
(unyielded oracle, tokenwise, batched at three chunk sizes, split, checkpoint, split+checkpoint,
short, yielded with a peer), K = 1..3, greedy. Every schedule of one (prompt, K) shares its
digests, as exact mode promises; acceptance counts are consistent (histogram -> drafts, accepted,
per-position rates, mean length); timings are plausible and deterministic.
"""

from __future__ import annotations

import copy
import hashlib
import random

from harness.matrix.cells import schedule_label
from harness.matrix.receipts import SCHEMA_VERSION, spec_hash

MODEL = "tiny"
PROMPTS = {"p17": 17, "p130": 130, "p300": 300}
KS = (1, 2, 3)
FILL_CHUNK = 256
CHUNK_ROWS = 64
BOUNDARY = 64  # split / checkpoint position (on the GDN grid)
CKPT = 96
CONTINUATION = 24  # generated tokens per cell
WEIGHTS_SHA = hashlib.sha256(b"tiny-weights").hexdigest()

# (variant, variant_args, chunk_rows); the id label is built from them.
VARIANTS = (
    ("unyielded", {}, CHUNK_ROWS),
    ("tokenwise", {}, None),
    ("batched", {}, 16),
    ("batched", {}, 32),
    ("batched", {}, 64),
    ("split", {"split": BOUNDARY}, CHUNK_ROWS),
    ("checkpoint", {"checkpoint": CKPT}, CHUNK_ROWS),
    ("split+checkpoint", {"split": BOUNDARY, "checkpoint": CKPT}, CHUNK_ROWS),
    ("short", {}, None),
    ("yielded-with-peer", {"split": BOUNDARY}, CHUNK_ROWS),
)

# Prime throughput on the cpu backend, tokens/s, by variant (chunked variants scale with rows).
_CPU_PRIME = {"unyielded": 900.0, "tokenwise": 60.0, "batched": 900.0, "split": 850.0,
              "checkpoint": 840.0, "split+checkpoint": 800.0, "short": 300.0,
              "yielded-with-peer": 700.0}
# Per-position acceptance probability of the MTP head (greedy, a small model).
_ACCEPT = (0.82, 0.64, 0.47)


def cell_id(prompt: str, variant: str, args: dict, chunk_rows, k: int, sampling="greedy") -> str:
    return f"{MODEL}/{prompt}/{schedule_label(variant, args, chunk_rows)}/k{k}/{sampling}"


def _sha(*parts) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def _ranges(n: int, rows) -> list[int]:
    if not rows:
        return [n]
    return [min(rows, n - s) for s in range(0, n, rows)]


def _tape(variant: str, args: dict, chunk_rows, n: int):
    if variant == "short":
        return [["mtp-trunk", n]]  # trunk, setup and fill in one advance
    if variant == "tokenwise":
        trunk = [n]
    else:
        stops = sorted({v for v in args.values() if 0 < v < n})
        trunk, lo = [], 0
        for hi in stops + [n]:
            trunk += _ranges(hi - lo, chunk_rows)
            lo = hi
    fill = _ranges(n, FILL_CHUNK)
    return [["mtp-trunk", r] for r in trunk] + [["mtp-draft-fill", r] for r in fill]


def _acceptance(rng: random.Random, k: int) -> dict:
    hist = [0] * (k + 1)
    for _ in range(CONTINUATION // (k + 1) + 4):
        n = 0
        while n < k and rng.random() < _ACCEPT[n]:
            n += 1
        hist[n] += 1
    drafts = sum(hist)
    accepted = sum(i * h for i, h in enumerate(hist))
    per_position = [sum(hist[i + 1:]) / drafts for i in range(k)]
    return {"drafts": drafts, "accepted": accepted, "mean_acceptance_length": 1 + accepted / drafts,
            "per_position": per_position, "histogram": hist}


def make_receipt(backend: str = "cpu", device: str | None = None, prompts: dict | None = None,
                 ks=KS, variants=VARIANTS, speed: float = 1.0, statuses: dict | None = None,
                 source: str | None = None, shard: tuple[int, int] | None = None,
                 seed: int = 0) -> dict:
    """A receipt of the whole synthetic matrix.

    ``speed`` scales every throughput (a device run is faster); ``statuses`` maps cell id to
    "tolerance" | "fail" for cells whose verdict is not bitwise; ``source`` is recorded as the
    spec's path; ``shard=(i, n)`` keeps every n-th cell from the i-th, as a sharded run would.
    """
    prompts = dict(PROMPTS if prompts is None else prompts)
    statuses = statuses or {}
    spec = {"models": [MODEL], "prompts": prompts, "k": list(ks), "sampling": ["greedy"],
            "variants": [{"variant": v, "args": a, "chunk_rows": c} for v, a, c in variants],
            "fill_chunk": FILL_CHUNK, "mode": "exact", "backend": backend}
    if source is not None:
        spec["source"] = source
    cells = []
    for prompt, n in prompts.items():
        conti = random.Random(f"{seed}/{prompt}")
        tokens = [conti.randrange(1000) for _ in range(CONTINUATION)]
        for k in ks:
            oracle = cell_id(prompt, "unyielded", {}, CHUNK_ROWS, k)
            accept = _acceptance(random.Random(f"{seed}/{prompt}/k{k}"), k)
            for variant, args, chunk_rows in variants:
                if variant == "short" and n > FILL_CHUNK // 8:
                    continue  # the short program only exists for short prompts
                cid = cell_id(prompt, variant, args, chunk_rows, k)
                tape = _tape(variant, args, chunk_rows, n)
                jitter = random.Random(f"{seed}/{cid}/{backend}")
                base = _CPU_PRIME[variant] * (1.0 if chunk_rows in (None, 64) else chunk_rows / 64)
                prime_tps = base * speed * jitter.uniform(0.9, 1.1)
                decode_tps = 40.0 * speed * jitter.uniform(0.9, 1.1)
                status = statuses.get(cid, "bitwise")
                verdict = {"status": "bitwise", "max_abs": 0.0, "max_ulp": 0, "bound": None,
                           "detail": "logits and captures bitwise equal to the oracle"}
                if status == "tolerance":
                    verdict = {"status": "tolerance", "max_abs": 3.0e-6, "max_ulp": 4, "bound": 1e-4,
                               "detail": "chunked GDN off the grid: within the declared bound"}
                elif status == "fail":
                    verdict = {"status": "fail", "max_abs": 0.25, "max_ulp": 1 << 20, "bound": None,
                               "detail": "logits differ from the oracle at row 0"}
                cells.append({
                    "id": cid, "order": len(cells), "model": MODEL, "prompt": prompt,
                    "prompt_len": n, "variant": variant, "variant_args": dict(args),
                    "chunk_rows": chunk_rows, "k": k, "sampling": "greedy", "temperature": 0.0,
                    "seed": seed, "mode": "exact", "oracle": oracle, "tape": tape,
                    "yields": len(tape) - 1 if variant == "yielded-with-peer" else 0,
                    "digests": {"logits": _sha(seed, prompt, "logits", status if status == "fail" else ""),
                                "captures": _sha(seed, prompt, "captures"),
                                "final_state": _sha(seed, prompt, k, "state"),
                                "continuation": _sha(seed, prompt, "continuation")},
                    "verdict": verdict,
                    "continuation": {"tokens": list(tokens)},
                    "acceptance": copy.deepcopy(accept),
                    "timings": {"prime_s": n / prime_tps, "prime_tokens_per_s": prime_tps,
                                "chunk_wall_s": [rows / prime_tps for _, rows in tape],
                                "decode_tokens_per_s": decode_tps,
                                "spec_tokens_per_s": decode_tps * accept["mean_acceptance_length"]
                                * 0.85},
                })
    index, count = shard or (0, 1)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "matrix",
        "created": "2026-11-29T17:00:00Z",
        "env": {"git_sha": "0" * 40, "git_dirty": False, "python": "3.11.7", "numba": "0.68.1",
                "numpy": "2.4.6", "platform": "Linux-x86_64", "backend": backend,
                "device": device or ("NVIDIA H200" if backend == "cuda" else "synthetic cpu"),
                "driver": "570.00" if backend == "cuda" else None,
                "threads": None if backend == "cuda" else 2, "threads_why": "auto (0.1 of 2 CPUs busy)",
                "cores": 2, "load": {"start": [0.1, 0.2, 0.3], "end": [1.9, 0.8, 0.4]}},
        "model": {"name": MODEL, "path": "models/tiny", "weights_sha256": WEIGHTS_SHA,
                  "config": {"hidden_size": 64, "num_hidden_layers": 4,
                             "layer_types": ["linear_attention"] * 3 + ["full_attention"],
                             "num_nextn_predict_layers": 1}},
        "spec": spec,
        "spec_hash": spec_hash(spec),
        "shard": {"index": index, "count": count},
        "wall_s": 12.5,
        "warmup_s": 0.5,
        "skipped": [],
        "cells": cells[index::count],
    }


def find_cell(receipt: dict, cid: str) -> dict:
    return next(c for c in receipt["cells"] if c["id"] == cid)
