"""``harness evidence``: is the committed GPU evidence still about this code?

CI has no GPU, so CUDA results are committed as device receipts (``receipts/device/*.json``) and
benchmark JSON (``receipts/bench/*.json``). Each records the **code fingerprint** of the tree it
ran: a SHA-256 over the normalised source of the files that decide what runs on the GPU — every
kernel module (``numba_kernels/``, the float64 reference excepted) and the engine files that pick
and launch kernels (:data:`ENGINE_FILES`). Normalised means parsed: comments, docstrings,
blank lines and formatting do not count; any change to code does.

``harness evidence`` lists every committed receipt with its commit, date and device, and whether
its fingerprint equals the tree's. It exits 1 when one does not (stale evidence: the kernels or
the engine changed after the GPU run) or records none, naming the command that refreshes them.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout
KERNEL_DIR = "numba_kernels"
KERNEL_EXCLUDE = ("reference.py",)  # the float64 oracle: never runs on a GPU
# engine files that pick kernels, lay out their inputs and launch them (relative to the repo root)
ENGINE_FILES = (
    "harness/engine/backend.py",
    "harness/engine/cache.py",
    "harness/engine/graphs.py",
    "harness/engine/layout.py",
    "harness/engine/model.py",
)
EVIDENCE_GLOBS = ("receipts/device/*.json", "receipts/bench/*.json")
REFRESH = ("PRIMEWALK_COMMIT=$(git rev-parse HEAD) bash tools/device_evidence.sh OUT && "
           "PRIMEWALK_COMMIT=$(git rev-parse HEAD) bash tools/device_run.sh OUT bench")


def fingerprint_files(root: str) -> list[str]:
    """The files the fingerprint covers, relative to ``root``, in a fixed order."""
    kernels = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, KERNEL_DIR, "*.py"))
                     if os.path.basename(p) not in KERNEL_EXCLUDE)
    engine = [p for p in ENGINE_FILES if os.path.exists(os.path.join(root, p))]
    return [p.replace(os.sep, "/") for p in kernels] + sorted(engine)


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]


def _canon(node) -> str:
    """A version-stable text of an AST: node type and fields in declaration order; positions,
    and fields that are None or empty (e.g. 3.12's ``type_params``), are left out."""
    if isinstance(node, ast.JoinedStr):  # f-strings: 3.12 adds empty and split constants
        values = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                if not v.value:
                    continue
                if values and isinstance(values[-1], ast.Constant) and isinstance(values[-1].value, str):
                    values[-1] = ast.Constant(values[-1].value + v.value)
                    continue
            values.append(v)
        return f"JoinedStr({_canon(values)})"
    if isinstance(node, ast.AST):
        parts = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or value == []:
                continue
            parts.append(f"{name}={_canon(value)}")
        return f"{type(node).__name__}({','.join(parts)})"
    if isinstance(node, list):
        return "[" + ",".join(_canon(v) for v in node) + "]"
    return repr(node)


def normalised_source(text: str) -> str:
    """The parsed form of a Python source: equal for two sources that differ only in comments,
    docstrings and layout."""
    tree = ast.parse(text)
    _strip_docstrings(tree)
    return _canon(tree)


def code_fingerprint(root: str) -> str:
    """SHA-256 over the normalised sources of :func:`fingerprint_files`."""
    h = hashlib.sha256(b"primewalk-code/1\0")
    for rel in fingerprint_files(root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            src = normalised_source(f.read())
        h.update(rel.encode() + b"\0" + hashlib.sha256(src.encode()).digest())
    return h.hexdigest()


def evidence_block(root: str) -> dict:
    """What a device receipt records about the code it ran."""
    return {"code_fingerprint": code_fingerprint(root), "fingerprint_files": fingerprint_files(root)}


def _first(doc: dict, *paths):
    for path in paths:
        cur = doc
        for key in path.split("."):
            cur = cur.get(key) if isinstance(cur, dict) else None
        if cur is not None:
            return cur
    return None


def receipt_facts(doc: dict) -> dict:
    """Commit, date, device and fingerprint of a device or bench receipt (any of our formats)."""
    return {
        "commit": _first(doc, "commit", "env.git_sha", "env.commit"),
        "date": _first(doc, "date", "env.date", "created", "env.created"),
        "device": _first(doc, "device", "env.device", "env.device_name"),
        "fingerprint": _first(doc, "code_fingerprint", "env.code_fingerprint", "evidence.code_fingerprint"),
    }


def check_evidence(root: str) -> list[dict]:
    """One row per committed device/bench receipt: path, facts and ``status`` (``current``,
    ``stale`` or ``unstamped``)."""
    want = code_fingerprint(root)
    rows = []
    for pattern in EVIDENCE_GLOBS:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError) as e:
                rows.append({"path": rel, "status": "unreadable", "error": str(e)})
                continue
            facts = receipt_facts(doc) if isinstance(doc, dict) else {}
            fp = facts.get("fingerprint")
            status = "unstamped" if not fp else ("current" if fp == want else "stale")
            if isinstance(doc, dict) and (doc.get("ops_filter") or _shard_count(doc) > 1):
                status = "partial"  # device-check --ops (some ops' cases), one shard of several
            rows.append({"path": rel, **facts, "status": status})
    return rows


def _shard_count(doc: dict) -> int:
    """How many shards the receipt is one of (``"shard": {"index", "count"}``, as matrix receipts
    and ``device-check --shard`` write it); 1 when it has none."""
    shard = doc.get("shard")
    return int(shard.get("count", 1)) if isinstance(shard, dict) else 1


def _short(x, n=10):
    return "-" if not x else str(x)[:n]


def main(args) -> int:
    from ..matrix.builtin import REPO  # the repository root of this checkout

    root = getattr(args, "root", None) or REPO
    rows = check_evidence(root)
    want = code_fingerprint(root)
    print(f"code fingerprint of this tree: {want[:16]}  ({len(fingerprint_files(root))} files)")
    if not rows:
        print("no device or bench receipts are committed")
        return 1
    width = max(len(r["path"]) for r in rows)
    for r in rows:
        print(f"{r['path']:<{width}}  {r['status']:<10} commit {_short(r.get('commit'))}  "
              f"{_short(r.get('date'), 19):<19}  {r.get('device') or '-'}")
    bad = [r for r in rows if r["status"] != "current"]
    if bad:
        print(f"evidence: {len(bad)} of {len(rows)} GPU receipts do not match this code; refresh them on "
              f"a GPU machine with: {REFRESH}")
        return 1
    print(f"evidence: all {len(rows)} GPU receipts match this code")
    return 0


def register(sub) -> None:
    p = sub.add_parser("evidence", help="check that the committed GPU receipts match this code",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="repository root (default: this checkout)")
    p.set_defaults(func=main)
