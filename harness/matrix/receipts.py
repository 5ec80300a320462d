"""Receipts: the JSON record of one matrix run, and the flat table beside it.

A receipt is one JSON object (schema below) written atomically with sorted keys, plus a CSV of
its cells with the same stem (one row per cell, nested fields as dotted columns, lists as JSON
strings) that loads into pandas. The matrix runner builds the dict and calls
:func:`write_receipt`; everything else (diff, merge, plots, notebooks) reads it back through
:func:`read_receipt` or :func:`load`.

Schema version 2 (version 1, the first release's, lacks the fields marked ²; it still loads,
diffs and plots, see :data:`READABLE_SCHEMAS` and :data:`FIELD_SINCE`)::

    {"schema_version": 2, "kind": "matrix", "created": "2026-11-29T17:00:00Z",
     "env": {"git_sha", "git_dirty", "python", "numba", "numpy", "platform",
             "backend": "cpu"|"cuda", "device", "driver",
             "threads"², "threads_why"², "cores"², "load"²: {"start": [1, 5, 15 min], "end": [...]},
             "code_fingerprint", "fingerprint_files" (cuda only: harness.gpu.evidence)},
     "model": {"name", "path", "weights_sha256", "config": {...},
               "tokenizer"²: {"name": "byte"|"tokenizer.json"|"none", "sha256", ...}},
     "spec": {...},  "spec_hash": spec_hash(spec),
     "shard": {"index": 0, "count": 1},  "wall_s": float, "warmup_s"²: float,
     "notes": [str, ...],
     "skipped"²: [{"model", "prompt", "prompt_len", "variant", "entry", "schedule", "reason"}, ...],
     "executor"?: {"kind": "workers"|"ray", "workers": [...], "tasks", "incidents": [...]},
     "cells": [{"id", "order"?, "model", "prompt", "prompt_len", "schedule"², "resolved_points"²,
                "variant", "variant_args",
                "chunk_rows", "k", "sampling", "temperature", "seed", "mode", "oracle",
                "tape": [[phase, rows], ...], "yields",
                "digests": {"logits", "captures", "final_state", "continuation", "prompt"²},
                "verdict": {"status": "bitwise"|"tolerance"|"fail", "max_abs", "max_ulp",
                            "bound", "detail"},
                "continuation": {"tokens": [...]},
                "acceptance": {"drafts", "accepted", "mean_acceptance_length",
                               "per_position": [K floats], "histogram": [K+1 ints]},
                "timings": {"prime_s", "prime_tokens_per_s", "chunk_wall_s": [...],
                            "decode_tokens_per_s", "spec_tokens_per_s"},
                "bisect"?: {"a", "b", "divergence", "spread", "compared", "only_a", "only_b",
                            "wall_s"}}, ...]}

``bisect`` is there only for a failed cell of ``run-matrix --bisect-failures``
(:func:`harness.matrix.bisect.bisect_failure`).

A ``"fairness"`` receipt (``harness fairness``, :mod:`harness.fairness.receipt`) follows the same
schema with one cell per (run, session) and a few top-level blocks of its own; everything here
reads it as well.

Which fields a diff compares and which are only recorded is the one table :data:`FIELD_ROLES`.
Floats must be finite (JSON has no NaN): a non-finite number is refused at write time.
"""

from __future__ import annotations

import csv
import datetime as _dt
import fnmatch
import hashlib
import io
import json
import os
import platform
import subprocess
from importlib import metadata

from ..atomic import write_text_atomic
from ..errors import PrimewalkError

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)  # what this harness reads, diffs, merges and plots
KIND = "matrix"
# Receipts of these kinds share this schema, their cells' shape and FIELD_ROLES: a "fairness"
# receipt (harness.fairness) has one cell per (run, session), so diff and load work on it too.
KINDS = (KIND, "fairness")

# Top-level spec keys left out of spec_hash: receipts of one spec on two backends share a hash.
SPEC_HASH_EXCLUDED = ("backend", "source")

COMPARED = "compared"  # a difference between two receipts is drift: `harness diff` exits 1
INFORMATIONAL = "informational"  # recorded for people, never compared

# The compared / informational split, in one place. Patterns are dotted paths (fnmatch) into a
# cell ("cell") or into the receipt itself ("receipt"). Cell fields not named here describe the
# cell's schedule (fixed by the spec, hence by spec_hash) or derive from compared fields
# (mean_acceptance_length, per_position, the verdict's max_abs / max_ulp / bound / detail).
FIELD_ROLES = (
    # scope      field pattern            role
    ("cell", "digests.*", COMPARED),
    ("cell", "verdict.status", COMPARED),
    ("cell", "tape", COMPARED),
    ("cell", "yields", COMPARED),
    ("cell", "continuation.tokens", COMPARED),
    ("cell", "acceptance.drafts", COMPARED),
    ("cell", "acceptance.accepted", COMPARED),
    ("cell", "acceptance.histogram", COMPARED),
    ("cell", "timings.*", INFORMATIONAL),
    ("cell", "bisect.*", INFORMATIONAL),
    ("receipt", "env.*", INFORMATIONAL),
    ("receipt", "created", INFORMATIONAL),
    ("receipt", "wall_s", INFORMATIONAL),
    ("receipt", "model.path", INFORMATIONAL),
    ("receipt", "executor.*", INFORMATIONAL),  # how a parallel run was spread (harness.matrix.pool)
    ("receipt", "model.tokenizer", INFORMATIONAL),  # compared through digests.prompt (the ids)
    ("receipt", "warmup_s", INFORMATIONAL),
    ("receipt", "skipped", INFORMATIONAL),  # fixed by the spec and the prompts' lengths
)

# Compared fields that a schema introduced: a receipt of an older schema does not have them, so
# they are compared only when both receipts are at least that version.
FIELD_SINCE = {"digests.prompt": 2}

VERDICTS = ("bitwise", "tolerance", "fail")

REQUIRED_KEYS = ("schema_version", "kind", "created", "env", "model", "spec", "spec_hash", "shard",
                 "cells")
REQUIRED_MODEL_KEYS = ("name", "weights_sha256")
REQUIRED_CELL_KEYS = ("id", "oracle", "model", "prompt", "variant", "k", "sampling", "tape",
                      "yields", "digests", "verdict")
REQUIRED_DIGESTS = ("logits", "captures", "final_state", "continuation")

# Leading CSV columns, in schema order; any other column follows, sorted.
_CELL_COLUMN_ORDER = ("order", "id", "model", "prompt", "prompt_len", "schedule", "variant", "variant_args",
                      "resolved_points", "chunk_rows", "k", "sampling", "temperature", "seed", "mode", "oracle",
                      "tape", "yields", "verdict", "digests", "continuation", "acceptance",
                      "timings")
# Columns that stay text when the CSV is read back (a digest or a name may look like a number).
_TEXT_COLUMNS = ("id", "model", "prompt", "schedule", "variant", "sampling", "mode", "oracle")


def field_role(scope: str, name: str) -> str | None:
    """The role of the dotted field ``name`` in ``scope`` ("cell" | "receipt"), or None."""
    for s, pattern, role in FIELD_ROLES:
        if s == scope and fnmatch.fnmatchcase(name, pattern):
            return role
    return None


def compared_fields(cell: dict, digests_only: bool = False, schema: int = SCHEMA_VERSION) -> dict:
    """The compared fields of one cell as ``{dotted name: value}`` (a missing field is None).

    ``digests_only`` keeps only ``digests.*``, what receipts of two devices are compared on
    (``harness diff --digests-only``). ``schema``: leave out the fields a later schema
    introduced (:data:`FIELD_SINCE`), to compare with a receipt of that schema.
    """
    out = {}
    for scope, pattern, role in FIELD_ROLES:
        if scope != "cell" or role != COMPARED:
            continue
        if digests_only and not pattern.startswith("digests."):
            continue
        if pattern.endswith(".*"):
            parent = cell.get(pattern[:-2]) or {}
            for key in sorted(parent):
                out[f"{pattern[:-2]}.{key}"] = parent[key]
        else:
            out[pattern] = _get_path(cell, pattern)
    return {k: v for k, v in out.items() if FIELD_SINCE.get(k, 0) <= schema}


def _get_path(obj: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


# ---------------------------------------------------------------------------------------------
# spec hash and environment


def canonical_json(obj) -> str:
    """The canonical JSON text that hashes are taken over: sorted keys, no spaces."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def spec_hash(spec: dict) -> str:
    """SHA-256 (hex) of the canonical JSON of ``spec`` without its top-level ``backend`` key."""
    if not isinstance(spec, dict):
        raise PrimewalkError(f"spec_hash: the spec must be a JSON object, not {type(spec).__name__}")
    kept = {k: v for k, v in spec.items() if k not in SPEC_HASH_EXCLUDED}
    try:
        text = canonical_json(kept)
    except (TypeError, ValueError) as e:
        raise PrimewalkError(f"spec_hash: the spec is not plain JSON ({e})") from None
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _git(args: list[str], cwd: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def env_info(backend: str, device: str | None = None, driver: str | None = None) -> dict:
    """The ``env`` block of a receipt: code version, library versions, machine.

    ``git_sha`` / ``git_dirty`` come from ``$PRIMEWALK_COMMIT`` (and ``$PRIMEWALK_DIRTY``,
    non-empty = dirty) when it is set -- the caller names the commit of a copied tree, e.g. on a
    GPU box whose copy may carry an older ``.git`` under newer files -- else from the checkout
    this package was imported from (tracked files only), else None. ``device`` defaults to the
    CPU's model name on the cpu backend. numba's version is read from package metadata, so this
    never imports numba.
    """
    if os.environ.get("PRIMEWALK_COMMIT"):
        sha, status = os.environ["PRIMEWALK_COMMIT"], os.environ.get("PRIMEWALK_DIRTY", "")
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        sha = _git(["rev-parse", "--verify", "--quiet", "HEAD"], here)
        status = _git(["status", "--porcelain", "--untracked-files=no"], here)
    import numpy

    return {
        "git_sha": sha.strip() if sha else None,
        "git_dirty": (status.strip() != "") if status is not None else None,
        "python": platform.python_version(),
        "numba": _version("numba"),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "backend": backend,
        "device": device if device is not None else (_cpu_name() if backend == "cpu" else backend),
        "driver": driver,
        **({} if backend == "cpu" else _fingerprint()),
    }


def _fingerprint() -> dict:
    """``code_fingerprint`` / ``fingerprint_files`` of this checkout (``harness evidence`` reads
    them from a device receipt's ``env``; CPU receipts do not carry them)."""
    from ..gpu.evidence import REPO, evidence_block

    return evidence_block(REPO)


def receipt_pair(root, a, b):
    """The two receipt paths a notebook compares (relative to ``root`` or absolute). When ``b``
    does not exist yet, ``a`` is compared with itself and a note says so."""
    from pathlib import Path

    path_a, path_b = Path(root) / a, Path(root) / b
    if not path_b.exists():
        print(f"note: no receipt at {path_b} yet; comparing {path_a} with itself")
        path_b = path_a
    return path_a, path_b


def acceptance_by_k(cells) -> dict:
    """{(k, sampling): acceptance pooled over those cells} for the cells with drafts: ``cells``,
    ``drafts`` and ``accepted`` summed, per-position rates weighted by drafts (Σ rate·drafts /
    Σ drafts), mean acceptance length 1 + Σ accepted / Σ drafts, and the histograms summed
    (``per_position`` / ``histogram`` are None where a cell lacks them). The one aggregation
    the plots, the notebooks and ``tools/acceptance_table.py`` share."""
    groups: dict = {}
    for c in cells:
        a = c.get("acceptance") or {}
        if a.get("drafts") and a.get("accepted") is not None:
            groups.setdefault((c.get("k"), c.get("sampling")), []).append(a)
    out = {}
    for key, accs in groups.items():
        drafts = sum(a["drafts"] for a in accs)
        accepted = sum(a["accepted"] for a in accs)
        per_position = hist = None
        if all(a.get("per_position") for a in accs):
            n = len(accs[0]["per_position"])
            per_position = [sum(a["per_position"][i] * a["drafts"] for a in accs) / drafts for i in range(n)]
        if all(a.get("histogram") for a in accs):
            hist = [sum(a["histogram"][i] for a in accs) for i in range(len(accs[0]["histogram"]))]
        out[key] = {"cells": len(accs), "drafts": drafts, "accepted": accepted,
                    "mean_acceptance_length": 1 + accepted / drafts, "per_position": per_position,
                    "histogram": hist}
    return out


def utc_now() -> str:
    """The ``created`` stamp: UTC, seconds, ``2026-11-29T17:00:00Z``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# validation


def validate(receipt, where: str = "receipt") -> None:
    """Raise a one-line :class:`PrimewalkError` naming the first thing wrong with ``receipt``."""
    if not isinstance(receipt, dict):
        raise PrimewalkError(f"{where}: not a receipt (a JSON object is expected, got "
                             f"{type(receipt).__name__})")
    if "kind" in receipt and receipt["kind"] not in KINDS:
        raise PrimewalkError(f"{where}: a {receipt['kind']!r} receipt, not a {KIND!r} receipt "
                             "(or a 'fairness' one)")
    for key in REQUIRED_KEYS:
        if key not in receipt:
            raise PrimewalkError(f"{where}: not a receipt (no '{key}')")
    if receipt["schema_version"] not in READABLE_SCHEMAS:
        raise PrimewalkError(f"{where}: receipt schema {receipt['schema_version']!r}, this harness "
                             f"reads schema {_readable()}")
    model = receipt["model"]
    if not isinstance(model, dict) or any(k not in model for k in REQUIRED_MODEL_KEYS):
        raise PrimewalkError(f"{where}: 'model' needs {', '.join(REQUIRED_MODEL_KEYS)}")
    if not isinstance(receipt["spec"], dict):
        raise PrimewalkError(f"{where}: 'spec' must be a JSON object")
    if receipt["spec_hash"] != spec_hash(receipt["spec"]):
        raise PrimewalkError(f"{where}: spec_hash does not match its spec (the spec was changed "
                             "after the run, or the hash was not made by harness.matrix.receipts.spec_hash)")
    shard = receipt["shard"]
    if not (isinstance(shard, dict) and isinstance(shard.get("index"), int)
            and isinstance(shard.get("count"), int) and 0 <= shard["index"] < shard["count"]):
        raise PrimewalkError(f"{where}: 'shard' must be {{\"index\": i, \"count\": n}} with 0 <= i < n")
    cells = receipt["cells"]
    if not isinstance(cells, list):
        raise PrimewalkError(f"{where}: 'cells' must be a list")
    seen = set()
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict):
            raise PrimewalkError(f"{where}: cell {i} is not a JSON object")
        for key in REQUIRED_CELL_KEYS:
            if key not in cell:
                raise PrimewalkError(f"{where}: cell {cell.get('id', i)!r} lacks '{key}'")
        cid = cell["id"]
        if cid in seen:
            raise PrimewalkError(f"{where}: duplicate cell id {cid!r}")
        seen.add(cid)
        digests = cell["digests"]
        if not isinstance(digests, dict) or any(k not in digests for k in REQUIRED_DIGESTS):
            raise PrimewalkError(f"{where}: cell {cid!r}: 'digests' needs {', '.join(REQUIRED_DIGESTS)}")
        status = cell["verdict"].get("status") if isinstance(cell["verdict"], dict) else None
        if status not in VERDICTS:
            raise PrimewalkError(f"{where}: cell {cid!r}: verdict status {status!r} is not one of "
                                 f"{', '.join(VERDICTS)}")


# ---------------------------------------------------------------------------------------------
# flat table


def flatten(obj: dict, prefix: str = "") -> dict:
    """Nested dicts to dotted keys; lists become compact JSON strings; scalars stay."""
    out = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value, separators=(",", ":"), allow_nan=False)
        else:
            out[name] = value
    return out


def _column_key(name: str):
    top = name.split(".", 1)[0]
    rank = _CELL_COLUMN_ORDER.index(top) if top in _CELL_COLUMN_ORDER else len(_CELL_COLUMN_ORDER)
    return rank, name


def cells_csv(cells: list[dict]) -> str:
    """The flat CSV text of ``cells``: one row per cell, columns in schema order."""
    rows = [flatten(c) for c in cells]
    columns = sorted({name for row in rows for name in row}, key=_column_key)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row[c] for c in columns])
    return buf.getvalue()


def csv_path(path: str) -> str:
    """The path of the flat table beside the receipt at ``path``."""
    return os.path.splitext(path)[0] + ".csv"


# ---------------------------------------------------------------------------------------------
# write / read


def write_receipt(path: str, receipt: dict) -> None:
    """Validate ``receipt`` and write it to ``path`` (JSON) and the CSV beside it, atomically.

    Both texts are built before anything touches the disk, so a receipt that cannot be
    serialised leaves the old files as they were. Each file is replaced by rename; an error
    while writing removes the temp file and leaves the previous file intact.
    """
    validate(receipt)
    try:
        text = json.dumps(receipt, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
        table = cells_csv(receipt["cells"])
    except (TypeError, ValueError) as e:
        raise PrimewalkError(f"receipt {path}: cannot be written as JSON ({e})") from None
    try:
        write_text_atomic(path, text)
        write_text_atomic(csv_path(path), table)
    except OSError as e:
        raise PrimewalkError(f"cannot write receipt {path}: {e.strerror or e}") from None


def _readable() -> str:
    return " or ".join(str(v) for v in READABLE_SCHEMAS)


def regenerate_command(receipt: dict, path: str) -> str:
    spec = receipt.get("spec") if isinstance(receipt.get("spec"), dict) else {}
    source = spec.get("source") or "default"
    if receipt.get("kind") == "fairness":
        return f"harness fairness --spec {source} --out {path}"
    return f"harness run-matrix --spec {source} --out {path}"


def read_receipt(path: str) -> dict:
    """Read and check the receipt at ``path`` (the ``.csv`` beside it is read as its ``.json``).

    Raises a one-line :class:`PrimewalkError` when the file is unreadable, is not JSON, is not a
    receipt, or was written under another schema version (the message says how to regenerate it).
    """
    path = os.fspath(path)
    if path.endswith(".csv"):
        path = os.path.splitext(path)[0] + ".json"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PrimewalkError(f"cannot read receipt {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise PrimewalkError(f"{path} is not a receipt (not UTF-8 text)") from None
    try:
        receipt = json.loads(text)
    except json.JSONDecodeError as e:
        raise PrimewalkError(f"{path} is not JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    if not isinstance(receipt, dict) or "schema_version" not in receipt:
        raise PrimewalkError(f"{path} is not a primewalk receipt (no 'schema_version')")
    if receipt["schema_version"] not in READABLE_SCHEMAS:
        raise PrimewalkError(f"{path} has receipt schema {receipt['schema_version']!r}, this harness "
                             f"reads schema {_readable()}; regenerate it: "
                             f"{regenerate_command(receipt, path)}")
    validate(receipt, where=path)
    return receipt


def load(source):
    """The cells of a receipt as a pandas DataFrame, one row per cell.

    ``source`` is the receipt's ``.json`` path, the ``.csv`` beside it, or a receipt dict; all
    three give the same frame. Columns are the dotted names of the flat table; list-valued
    columns (``tape``, ``continuation.tokens``, ``acceptance.per_position``, ...) hold lists.
    """
    import pandas as pd

    if isinstance(source, dict):
        validate(source)
        text = cells_csv(source["cells"])
    else:
        path = os.fspath(source)
        if path.endswith(".csv"):
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise PrimewalkError(f"cannot read receipt table {path}: {e.strerror or e}") from None
        else:
            text = cells_csv(read_receipt(path)["cells"])
    if not text.strip():  # a receipt without cells
        return pd.DataFrame()
    header = next(csv.reader(io.StringIO(text)))
    text_cols = {c: str for c in header if c in _TEXT_COLUMNS or c.startswith("digests.")}
    try:
        df = pd.read_csv(io.StringIO(text), dtype=text_cols, keep_default_na=False, na_values=[""])
    except (ValueError, pd.errors.ParserError) as e:
        raise PrimewalkError(f"receipt table cannot be parsed ({e})") from None
    for col in df.columns:
        values = df[col].dropna()
        if len(values) and all(isinstance(v, str) and v.startswith("[") for v in values):
            try:
                df[col] = [json.loads(v) if isinstance(v, str) else None for v in df[col]]
            except json.JSONDecodeError:
                pass
    return df


# ---------------------------------------------------------------------------------------------
# merge


def cell_order_key(cell: dict):
    """Spec order: the index the runner recorded in ``cell["order"]``, else the id."""
    order = cell.get("order")
    return (0, order, cell["id"]) if isinstance(order, (int, float)) else (1, 0, cell["id"])


def merge_receipts(receipts) -> dict:
    """Join the shard receipts of one run into one receipt (shard 0 of 1).

    ``receipts`` are dicts or paths. Refuses, with a one-line :class:`PrimewalkError`, receipts
    of another schema, spec, model, kind or backend, shards of different counts, a shard given
    twice or missing, and duplicate cell ids. Cells come out in spec order (``cell["order"]``,
    then id). ``env`` is the first shard's; ``created`` the latest; ``wall_s`` the longest shard
    (shards run side by side); ``merged_from`` records each shard's index, created and wall_s
    (and its ``executor`` block, when it was a parallel run).
    """
    items = [read_receipt(r) if not isinstance(r, dict) else r for r in receipts]
    if not items:
        raise PrimewalkError("merge: no receipts given")
    for i, r in enumerate(items):
        validate(r, where=f"merge: receipt {i}")
    first = items[0]

    def same(what, get):
        for i, r in enumerate(items[1:], 1):
            if get(r) != get(first):
                raise PrimewalkError(f"merge: receipt {i} has {what} {get(r)!r}, receipt 0 has "
                                     f"{get(first)!r}")

    same("schema_version", lambda r: r["schema_version"])
    same("kind", lambda r: r["kind"])
    same("spec_hash", lambda r: r["spec_hash"])
    same("model weights_sha256", lambda r: r["model"]["weights_sha256"])
    same("backend", lambda r: (r.get("env") or {}).get("backend"))
    same("shard count", lambda r: r["shard"]["count"])
    count = first["shard"]["count"]
    indices = [r["shard"]["index"] for r in items]
    dup = sorted({i for i in indices if indices.count(i) > 1})
    if dup:
        raise PrimewalkError(f"merge: shard {dup[0]} of {count} given more than once")
    missing = sorted(set(range(count)) - set(indices))
    if missing:
        raise PrimewalkError(f"merge: shard(s) {', '.join(map(str, missing))} of {count} missing")
    cells, owner = [], {}
    for r in items:
        for cell in r["cells"]:
            if cell["id"] in owner:
                raise PrimewalkError(f"merge: cell {cell['id']!r} is in shard {owner[cell['id']]} and "
                                     f"shard {r['shard']['index']}")
            owner[cell["id"]] = r["shard"]["index"]
            cells.append(cell)
    by_index = sorted(items, key=lambda r: r["shard"]["index"])
    merged = {k: v for k, v in first.items() if k not in ("cells", "shard", "created", "wall_s", "executor")}
    merged.update(
        shard={"index": 0, "count": 1},
        created=max(str(r["created"]) for r in items),
        wall_s=max((r.get("wall_s") or 0.0) for r in items),
        merged_from=[dict({"index": r["shard"]["index"], "created": r["created"], "wall_s": r.get("wall_s")},
                          **({"executor": r["executor"]} if "executor" in r else {})) for r in by_index],
        cells=sorted(cells, key=cell_order_key),
    )
    return merged
