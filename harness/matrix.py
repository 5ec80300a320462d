"""The schedule matrix: a TOML spec expanded into cells, each primed, continued and judged against
its oracle, written as one receipt (``harness run-matrix``).

A *spec* names models, prompts, schedule variants, K values, sampling settings and the
continuation length; :func:`load_spec` reads and validates it (one-line errors naming the file,
the key and what was expected, before anything runs) and :func:`expand` turns it into
:class:`Cell` s. Each cell is one (model, prompt, variant + its arguments, K, sampling): the MTP
prime walker primes the prompt under that schedule, then ``continue_spec`` generates
``max_new_tokens`` tokens speculatively. Its *oracle* is the ``unyielded`` cell of the same model,
prompt, K and sampling; a cell is ``bitwise`` when its prime logits, final cache state and
continuation equal the oracle's bit for bit and its boundary captures equal an independent
unyielded prime of the same segments (``oracle_prime``), otherwise ``fail`` (with max |Δ| and
max ulp of the prime logits, and what differed). Greedy cells also check that the speculative
continuation equals plain decoding token for token (DESIGN §6).

Spec (TOML; keys other than these are errors)::

    backend = "cpu"            # cpu | cuda (--backend overrides)
    mode = "exact"             # exact ("chunked" is not implemented yet)
    max_new_tokens = 16        # continuation length M
    chunk_rows = 64            # rows per batched trunk chunk (batched variants set their own)
    fill_chunk = 64            # rows per MTP draft-fill chunk
    k = [1, 2, 3]
    sampling = [{temperature = 0.0, seed = 0}, {temperature = 0.7, seed = 1}]
    variants = ["unyielded", "tokenwise", {name = "batched", chunk_rows = [32, 100]},
                {name = "split", at = [0.5]}, {name = "checkpoint", at = [64]},
                {name = "split+checkpoint", split = 0.5, checkpoint = 0.5}, "short",
                "yielded-with-peer", {name = "yielded-with-peer", split = 0.5, checkpoint = 0.5}]
    [models]
    tiny = "tiny"              # "tiny": the embedded model; else a folder (relative to the spec)
    [[prompts]]
    kind = "synthetic"         # seeded ids, named p<length>
    lengths = [40, 130, 257]
    seed = 0
    k = [2]                    # optional, any prompt: its own K values ...
    sampling = ["greedy"]      # ... and a subset of the sampling labels
    [[prompts]]
    kind = "text"              # or kind = "file", path = "prompt.txt" (relative to the spec)
    text = "def main():"
    name = "code"

Split / checkpoint points are absolute rows (ints) or fractions of the prompt (floats in (0, 1))
rounded down to the GDN grid of 64, as in the seed. A point must leave two segments of at least
``PRIME_MIN_T`` rows: an explicit point that does not is refused (a point at or past the end of a
prompt just does not apply to it); a fraction that does not skips that cell with a note. ``short``
applies to prompts of at most ``fill_chunk`` rows and primes with ``fill_chunk`` = the prompt
length. ``yielded-with-peer`` advances one chunk at a time with a peer session decoding a token
between chunks (optionally split and checkpointed).

Built-in specs are the ``*.toml`` files under ``harness/specs/``: ``default.toml`` (the README's
main job, on the trained stdlib-small model; what ``harness run-matrix`` runs), ``tiny.toml``
(the random tiny model: the quick matrix) and ``stdlib.toml`` (the acceptance matrix). Each
built-in spec ``<stem>`` has its golden CPU receipt at ``receipts/golden/<stem>.json``
(:func:`golden_path`), re-recorded only by ``harness run-matrix [--spec harness/specs/<stem>.toml]
--update-golden`` (cpu backend, no --out / --shard / --model; a cell that fails leaves the golden
as it was).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import tomllib
from dataclasses import dataclass, field

import numpy as np

from .errors import PrimewalkError
from .schedule import PRIME_MIN_T

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SPECS_DIR = os.path.join(HERE, "specs")  # the built-in specs; each has a golden receipt
GOLDEN_DIR = os.path.join(REPO, "receipts", "golden")
DEFAULT_SPEC = os.path.join(SPECS_DIR, "default.toml")
GDN_GRID = 64  # fractional points round down to this grid (the seed's gdn_chunk_size)
EMBEDDED = "tiny"

VARIANTS = ("unyielded", "tokenwise", "batched", "split", "checkpoint", "split+checkpoint", "short",
            "yielded-with-peer")
ORACLE = "unyielded"
# The keys each variant takes (besides "name"), and which of them are required.
VARIANT_KEYS = {
    "unyielded": ((), ()),
    "tokenwise": ((), ()),
    "batched": (("chunk_rows",), ("chunk_rows",)),
    "split": (("at",), ("at",)),
    "checkpoint": (("at",), ("at",)),
    "split+checkpoint": (("split", "checkpoint"), ("split", "checkpoint")),
    "short": ((), ()),
    "yielded-with-peer": (("split", "checkpoint"), ()),
}
TOP_KEYS = ("backend", "mode", "max_new_tokens", "chunk_rows", "fill_chunk", "k", "sampling",
            "variants", "models", "prompts", "description")
PROMPT_KEYS = {"synthetic": ("kind", "lengths", "seed", "name", "k", "sampling"),
               "text": ("kind", "text", "name", "k", "sampling"),
               "file": ("kind", "path", "name", "k", "sampling")}
MODES = ("exact", "chunked")
BACKENDS = ("cpu", "cuda")
PEER_PROMPT_LEN = 64
PEER_SEED = 1234


def golden_path(stem: str) -> str:
    """The golden receipt of the built-in spec ``harness/specs/<stem>.toml``."""
    return os.path.join(GOLDEN_DIR, f"{stem}.json")


GOLDEN_PATH = golden_path("default")  # the default spec's golden


def builtin_specs() -> dict:
    """The built-in specs, stem -> path: every ``*.toml`` directly under ``harness/specs/``."""
    return {os.path.splitext(n)[0]: os.path.join(SPECS_DIR, n) for n in sorted(os.listdir(SPECS_DIR))
            if n.endswith(".toml") and os.path.isfile(os.path.join(SPECS_DIR, n))}


def builtin_stem(path) -> str | None:
    """The stem of ``path`` if it is a built-in spec (a ``.toml`` directly under harness/specs/)."""
    full = os.path.realpath(os.fspath(path))
    if os.path.dirname(full) != os.path.realpath(SPECS_DIR) or not full.endswith(".toml"):
        return None
    return os.path.splitext(os.path.basename(full))[0]


# ------------------------------------------------------------------------------------------------
# spec
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """A split / checkpoint position: an absolute row (int) or a fraction of the prompt (float)."""

    value: int | float

    @property
    def fraction(self) -> bool:
        return isinstance(self.value, float)

    def resolve(self, tp: int) -> int:
        if self.fraction:
            return (int(math.floor(self.value * tp)) // GDN_GRID) * GDN_GRID
        return int(self.value)

    def __str__(self) -> str:
        return f"{self.value:g}" if self.fraction else str(self.value)


@dataclass(frozen=True)
class PromptSpec:
    name: str
    kind: str  # synthetic | text | file
    key: str  # where in the spec, e.g. "prompts[0].lengths[1]"
    length: int
    seed: int | None = None  # synthetic
    token_ids: tuple | None = None  # text / file
    k: tuple | None = None  # per-prompt K values (None: the spec's)
    sampling: tuple | None = None  # per-prompt sampling labels (None: all)

    def ids(self, vocab_size: int) -> list[int]:
        """The prompt's token ids (synthetic ids are uniform in [0, vocab_size), seeded)."""
        if self.kind == "synthetic":
            rng = np.random.default_rng([int(self.seed), int(self.length)])
            return [int(t) for t in rng.integers(0, vocab_size, self.length)]
        return list(self.token_ids)


@dataclass(frozen=True)
class Case:
    """One schedule of the spec's variants list (a batched chunk size or a point expanded)."""

    variant: str
    key: str  # e.g. "variants[3]"
    chunk_rows: int | None = None  # batched only
    split: Point | None = None
    checkpoint: Point | None = None


@dataclass
class MatrixSpec:
    source: str  # "default" for the built-in spec, else the file path as given
    where: str  # the file name used in messages
    models: dict  # name -> path as written ("tiny" = embedded)
    model_dirs: dict  # name -> resolved folder
    prompts: list  # PromptSpec
    cases: list  # Case
    k: tuple
    sampling: list  # Sampling
    labels: list  # the sampling ids, parallel to ``sampling``
    max_new_tokens: int
    chunk_rows: int
    fill_chunk: int
    mode: str
    backend: str
    data: dict = field(default_factory=dict)  # the normalised spec, as recorded in the receipt
    builtin: str | None = None  # the stem of a built-in spec (harness/specs/<stem>.toml), else None

    @property
    def is_default(self) -> bool:
        return self.source == "default"

    @property
    def stem(self) -> str:
        if self.builtin:
            return self.builtin
        return "default" if self.is_default else os.path.splitext(os.path.basename(self.source))[0]

    @property
    def golden(self) -> str | None:
        """Where this spec's golden receipt lives (built-in specs only), else None."""
        return golden_path(self.builtin) if self.builtin else None


def _show(value) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= 60 else text[:59] + "…"


class _Where:
    """Builds the one-line errors of one spec file."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, text: str):
        raise PrimewalkError(f"{self.where}: {key}: {text}")

    def expect(self, key: str, expected: str, got):
        self.fail(key, f"expected {expected}, got {_show(got)}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pos_int(w, key, v, what="a positive integer"):
    if not _is_int(v) or v < 1:
        w.expect(key, what, v)
    return int(v)


def _int_list(w, key, v, allow_scalar=True, distinct=True):
    if allow_scalar and _is_int(v):
        v = [v]
    if not isinstance(v, list) or not v or not all(_is_int(x) and x >= 1 for x in v):
        w.expect(key, "a list of positive integers", v)
    if distinct and len(set(v)) != len(v):
        w.expect(key, "a list of distinct positive integers", v)
    return [int(x) for x in v]


def _point(w, key, v) -> Point:
    if _is_int(v) and v >= 1:
        return Point(int(v))
    if isinstance(v, float) and math.isfinite(v) and 0.0 < v < 1.0:
        return Point(float(v))
    w.expect(key, "a row (positive integer) or a fraction of the prompt (0 < float < 1)", v)


def _check_keys(w, key, table, allowed, hint=""):
    for k in table:
        if k not in allowed:
            prefix = f"{key}." if key else ""
            w.fail(f"{prefix}{k}", "unknown key" + (f" ({hint})" if hint else f" (expected one of: "
                                                                              f"{', '.join(allowed)})"))


def _resolve_model(base_dir: str, path: str) -> str:
    if path == EMBEDDED:
        from .models import default_model_path

        return default_model_path()
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))


def parse_spec(data: dict, where: str = "spec.toml", source: str | None = None,
               base_dir: str | None = None, backend: str | None = None,
               model: str | None = None) -> MatrixSpec:
    """Validate the parsed TOML ``data`` and build a :class:`MatrixSpec`.

    ``where`` names the file in errors; relative paths resolve against ``base_dir``; ``backend``
    and ``model`` (a checkpoint folder) override the spec's. Raises a one-line
    :class:`PrimewalkError` on the first problem.
    """
    from . import tokenizer
    from .sampling import Sampling

    w = _Where(where)
    base_dir = base_dir or os.getcwd()
    if not isinstance(data, dict):
        w.expect("(top level)", "a TOML table", data)
    _check_keys(w, "", data, TOP_KEYS)

    # scalars
    mode = data.get("mode", "exact")
    if mode not in MODES:
        w.expect("mode", '"exact"', mode)
    if mode != "exact":
        w.fail("mode", f'"{mode}" is not implemented yet (only "exact")')
    spec_backend = data.get("backend")
    if spec_backend is not None and spec_backend not in BACKENDS:
        w.expect("backend", "one of " + ", ".join(f'"{b}"' for b in BACKENDS), spec_backend)
    if backend is not None and backend not in BACKENDS:
        raise PrimewalkError(f"--backend: expected one of {', '.join(BACKENDS)}, got {_show(backend)}")
    backend = backend or spec_backend or os.environ.get("PRIMEWALK_BACKEND") or "cpu"
    if backend not in BACKENDS:
        raise PrimewalkError(f"PRIMEWALK_BACKEND: expected one of {', '.join(BACKENDS)}, got {_show(backend)}")
    max_new = _pos_int(w, "max_new_tokens", data.get("max_new_tokens", 16))
    if max_new < 2:
        w.expect("max_new_tokens", "an integer >= 2 (the boundary token and at least one more)", max_new)
    chunk_rows = _pos_int(w, "chunk_rows", data.get("chunk_rows", 64))
    fill_chunk = _pos_int(w, "fill_chunk", data.get("fill_chunk", 64))
    if "description" in data and not isinstance(data["description"], str):
        w.expect("description", "a string", data["description"])
    if "k" not in data:
        w.fail("k", "missing (expected a list of positive integers, e.g. k = [1, 2, 3])")
    ks = _int_list(w, "k", data["k"])

    # sampling
    raw_s = data.get("sampling", [{"temperature": 0.0, "seed": 0}])
    if not isinstance(raw_s, list) or not raw_s:
        w.expect("sampling", "a non-empty list of tables {temperature, seed}", raw_s)
    samplings, norm_s = [], []
    for i, s in enumerate(raw_s):
        key = f"sampling[{i}]"
        if not isinstance(s, dict):
            w.expect(key, "a table {temperature = 0.7, seed = 1}", s)
        _check_keys(w, key, s, ("temperature", "seed"))
        t = s.get("temperature", 0.0)
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            w.expect(f"{key}.temperature", "a finite number >= 0", t)
        seed = s.get("seed", 0)
        if not _is_int(seed) or seed < 0:
            w.expect(f"{key}.seed", "a non-negative integer", seed)
        samplings.append(Sampling(float(t), int(seed)))
        norm_s.append({"temperature": float(t), "seed": int(seed)})
    labels = []
    for i, s in enumerate(samplings):
        same = [j for j, o in enumerate(samplings) if o.label == s.label]
        if s.greedy and len(same) > 1:
            w.fail(f"sampling[{i}]", f"greedy is listed twice (sampling[{same[0]}]); greedy decoding "
                                     "ignores the seed")
        label = s.label if len(same) == 1 else f"{s.label}s{s.seed}"
        if label in labels:
            w.fail(f"sampling[{i}]", f"duplicates sampling[{labels.index(label)}] ({label})")
        labels.append(label)

    # models
    raw_m = data.get("models", {EMBEDDED: EMBEDDED})
    if not isinstance(raw_m, dict) or not raw_m:
        w.expect("models", 'a table of name = path (e.g. tiny = "tiny")', raw_m)
    models, dirs = {}, {}
    for name, path in raw_m.items():
        key = f"models.{name}"
        if not _valid_name(name):
            w.fail(key, "a model name may use letters, digits, '-', '_' and '.' only")
        if not isinstance(path, str) or not path:
            w.expect(key, 'a checkpoint folder (or "tiny" for the embedded model)', path)
        models[name] = path
        dirs[name] = _resolve_model(base_dir, path)
    if model is not None:
        name = EMBEDDED if model == EMBEDDED else (os.path.basename(os.path.normpath(model)) or "model")
        if not _valid_name(name):
            name = "model"
        models, dirs = {name: model}, {name: _resolve_model(os.getcwd(), model)}
    for name, d in dirs.items():
        if not os.path.isfile(os.path.join(d, "config.json")):
            if model is not None:
                raise PrimewalkError(f"--model: {model}: not a checkpoint folder (no config.json)")
            w.fail(f"models.{name}", f"{models[name]}: not a checkpoint folder (no config.json in {d})")

    # prompts
    raw_p = data.get("prompts")
    if raw_p is None:
        w.fail("prompts", "missing (expected [[prompts]] tables, e.g. kind = \"synthetic\", "
                          "lengths = [130], seed = 0)")
    if not isinstance(raw_p, list) or not raw_p:
        w.expect("prompts", "a non-empty list of prompt tables", raw_p)
    prompts, norm_p, owner = [], [], {}
    for i, p in enumerate(raw_p):
        key = f"prompts[{i}]"
        if not isinstance(p, dict):
            w.expect(key, 'a table with kind = "synthetic" | "text" | "file"', p)
        kind = p.get("kind")
        if kind not in PROMPT_KEYS:
            w.expect(f"{key}.kind", 'one of "synthetic", "text", "file"', kind)
        _check_keys(w, key, p, PROMPT_KEYS[kind], hint=f"a {kind} prompt takes: "
                    + ", ".join(PROMPT_KEYS[kind]))
        name = p.get("name")
        if name is not None and (not isinstance(name, str) or not _valid_name(name)):
            w.expect(f"{key}.name", "a name of letters, digits, '-', '_' or '.'", name)
        pk = None
        if "k" in p:
            pk = tuple(_int_list(w, f"{key}.k", p["k"]))
        psamp = None
        if "sampling" in p:
            v = p["sampling"]
            if isinstance(v, str):
                v = [v]
            if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
                w.expect(f"{key}.sampling", "a list of sampling labels (" + ", ".join(labels) + ")", p["sampling"])
            for x in v:
                if x not in labels:
                    w.expect(f"{key}.sampling", "labels among " + ", ".join(f'"{l}"' for l in labels), x)
            psamp = tuple(x for x in labels if x in v)
        norm, added = {"kind": kind}, []
        if kind == "synthetic":
            if "lengths" not in p:
                w.fail(f"{key}.lengths", "missing (expected a list of positive integers)")
            lengths = _int_list(w, f"{key}.lengths", p["lengths"], allow_scalar=False)
            seed = p.get("seed", 0)
            if not _is_int(seed) or seed < 0:
                w.expect(f"{key}.seed", "a non-negative integer", seed)
            stem = name or "p"
            for j, n in enumerate(lengths):
                added.append(PromptSpec(f"{stem}{n}", kind, f"{key}.lengths[{j}]", n, seed=int(seed),
                                          k=pk, sampling=psamp))
            norm.update(lengths=lengths, seed=int(seed))
        elif kind == "text":
            text = p.get("text")
            if not isinstance(text, str) or not text:
                w.expect(f"{key}.text", "a non-empty string", text)
            ids = tuple(tokenizer.encode(text))
            added.append(PromptSpec(name or f"text{i}", kind, f"{key}.text", len(ids), token_ids=ids,
                                      k=pk, sampling=psamp))
            norm.update(text=text)
        else:
            path = p.get("path")
            if not isinstance(path, str) or not path:
                w.expect(f"{key}.path", "a text file path (relative to the spec)", path)
            full = path if os.path.isabs(path) else os.path.join(base_dir, path)
            try:
                with open(full, "rb") as f:
                    raw = f.read()
                text = raw.decode("utf-8")
            except OSError as e:
                w.fail(f"{key}.path", f"cannot read {path} ({e.strerror or e})")
            except UnicodeDecodeError:
                w.fail(f"{key}.path", f"{path} is not UTF-8 text")
            if not text:
                w.fail(f"{key}.path", f"{path} is empty")
            ids = tuple(tokenizer.encode(text))
            stem = name or _safe_stem(path)
            added.append(PromptSpec(stem, kind, f"{key}.path", len(ids), token_ids=ids, k=pk,
                                      sampling=psamp))
            norm.update(path=path, sha256=hashlib.sha256(raw).hexdigest())
        if name is not None:
            norm["name"] = name
        if pk is not None:
            norm["k"] = list(pk)
        if psamp is not None:
            norm["sampling"] = list(psamp)
        norm_p.append(norm)
        for ps in added:
            if ps.name in owner:
                w.fail(ps.key, f"prompt name {ps.name!r} is already used by {owner[ps.name]}; give this "
                               "entry another name")
            owner[ps.name] = ps.key
        prompts += added

    # variants
    raw_v = data.get("variants")
    if raw_v is None:
        w.fail("variants", "missing (expected a list such as [\"unyielded\", \"tokenwise\"])")
    if not isinstance(raw_v, list) or not raw_v:
        w.expect("variants", "a non-empty list of variant names or tables", raw_v)
    cases, norm_v = [], []
    for i, v in enumerate(raw_v):
        key = f"variants[{i}]"
        table = {"name": v} if isinstance(v, str) else v
        if not isinstance(table, dict):
            w.expect(key, "a variant name or a table with name = ...", v)
        name = table.get("name")
        if name not in VARIANTS:
            w.expect(f"{key}.name" if isinstance(v, dict) else key,
                     "one of " + ", ".join(VARIANTS), name)
        allowed, required = VARIANT_KEYS[name]
        _check_keys(w, key, table, ("name",) + allowed,
                    hint=f"{name} takes " + (", ".join(allowed) if allowed else "no arguments"))
        for r in required:
            if r not in table:
                w.fail(f"{key}.{r}", f"missing ({name} needs {', '.join(required)})")
        norm = {"name": name}
        if name == "batched":
            sizes = _int_list(w, f"{key}.chunk_rows", table["chunk_rows"])
            cases += [Case(name, key, chunk_rows=c) for c in sizes]
            norm["chunk_rows"] = sizes
        elif name in ("split", "checkpoint"):
            at = table["at"] if isinstance(table["at"], list) else [table["at"]]
            if not at:
                w.expect(f"{key}.at", "a point or a non-empty list of points", table["at"])
            pts = [_point(w, f"{key}.at[{j}]" if isinstance(table["at"], list) else f"{key}.at", x)
                   for j, x in enumerate(at)]
            cases += [Case(name, key, **{name: pt}) for pt in pts]
            norm["at"] = [pt.value for pt in pts]
        else:
            sp = _point(w, f"{key}.split", table["split"]) if "split" in table else None
            ck = _point(w, f"{key}.checkpoint", table["checkpoint"]) if "checkpoint" in table else None
            cases.append(Case(name, key, split=sp, checkpoint=ck))
            if sp is not None:
                norm["split"] = sp.value
            if ck is not None:
                norm["checkpoint"] = ck.value
        norm_v.append(norm)
    if not any(c.variant == ORACLE for c in cases):
        w.fail("variants", f'expected "{ORACLE}" among the variants (it is every cell\'s oracle)')

    # explicit points must leave two segments of PRIME_MIN_T rows in every prompt they apply to
    for c in cases:
        for what, pt in (("split", c.split), ("checkpoint", c.checkpoint)):
            if pt is None or pt.fraction:
                continue
            key = f"{c.key}.at" if c.variant in ("split", "checkpoint") else f"{c.key}.{what}"
            if pt.value < PRIME_MIN_T:
                w.fail(key, f"{what} point {pt.value} leaves a first segment of {pt.value} rows "
                            f"(< PRIME_MIN_T = {PRIME_MIN_T})")
            for ps in prompts:
                if pt.value < ps.length and ps.length - pt.value < PRIME_MIN_T:
                    w.fail(key, f"{what} point {pt.value} leaves a last segment of {ps.length - pt.value} "
                                f"rows in prompt {ps.name} ({ps.length} tokens; < PRIME_MIN_T = "
                                f"{PRIME_MIN_T}); use a fraction such as 0.5")

    spec = MatrixSpec(source=source or where, where=where, models=models, model_dirs=dirs,
                      prompts=prompts, cases=cases, k=tuple(ks), sampling=samplings, labels=labels,
                      max_new_tokens=max_new, chunk_rows=chunk_rows, fill_chunk=fill_chunk,
                      mode=mode, backend=backend)
    spec.data = {"models": dict(models), "prompts": norm_p, "variants": norm_v, "k": list(ks),
                 "sampling": norm_s, "max_new_tokens": max_new, "chunk_rows": chunk_rows,
                 "fill_chunk": fill_chunk, "mode": mode, "backend": backend,
                 "source": spec.source}
    return spec


def _valid_name(name) -> bool:
    return isinstance(name, str) and bool(name) and all(ch.isalnum() or ch in "-_." for ch in name)


def _safe_stem(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem) or "file"


def load_spec(path: str | None = None, backend: str | None = None, model: str | None = None) -> MatrixSpec:
    """Read and validate the spec at ``path`` (None or ``"default"``: the built-in default).

    A spec under ``harness/specs/`` is *built-in*, however its path is written: its ``source`` is
    ``"default"`` for the default and the repository-relative path for the others, and its golden
    receipt is ``receipts/golden/<stem>.json``.
    """
    full = DEFAULT_SPEC if path is None or path == "default" else os.fspath(path)
    stem = builtin_stem(full)
    if stem is not None:
        where = os.path.relpath(os.path.join(SPECS_DIR, f"{stem}.toml"), REPO)
        source = "default" if stem == "default" else where
    else:
        where = source = full
    try:
        with open(full, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise PrimewalkError(f"{where}: cannot read the spec ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise PrimewalkError(f"{where}: not valid TOML ({e})") from None
    spec = parse_spec(data, where=where, source=source,
                      base_dir=os.path.dirname(os.path.abspath(full)), backend=backend, model=model)
    spec.builtin = stem
    return spec


# ------------------------------------------------------------------------------------------------
# cells
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    id: str
    order: int
    model: str
    prompt: PromptSpec
    variant: str
    variant_args: dict
    chunk_rows: int | None  # None: not batched (tokenwise)
    fill_chunk: int
    k: int
    sampling: object  # Sampling
    sampling_label: str
    oracle: str
    split: int | None = None
    checkpoint: int | None = None

    @property
    def tokenwise(self) -> bool:
        return self.variant == "tokenwise"

    @property
    def yielded(self) -> bool:
        return self.variant == "yielded-with-peer"

    @property
    def points(self) -> tuple:
        """Boundary positions the walker captures at (split and checkpoint)."""
        return tuple(sorted({p for p in (self.split, self.checkpoint) if p is not None}))

    @property
    def group(self) -> tuple:
        return (self.model, self.prompt.name, self.k, self.sampling_label)


def schedule_label(variant: str, args: dict, chunk_rows) -> str:
    """``split@64``, ``split+checkpoint@64,96``, ``batched@c32``: a cell's schedule in its id."""
    text = variant
    if args:
        text += "@" + ",".join(str(v) for v in args.values())
    if variant == "batched":
        text += f"@c{chunk_rows}"
    return text


def cell_id(model: str, prompt: str, label: str, k: int, sampling: str) -> str:
    return f"{model}/{prompt}/{label}/k{k}/{sampling}"


def _usable(p: int, tp: int) -> bool:
    return PRIME_MIN_T <= p and tp - p >= PRIME_MIN_T


def expand(spec: MatrixSpec) -> tuple[list, list]:
    """The cells of ``spec`` in spec order (model, prompt, K, sampling, variant), and notes on the
    cells left out (a fractional point that leaves a short segment, ``short`` on a long prompt,
    an explicit point past a prompt's end, two entries giving the same cell)."""
    cells, notes, seen = [], [], {}
    for model in spec.models:
        for ps in spec.prompts:
            tp = ps.length
            runs = []  # (case, label, args, chunk_rows, fill_chunk, split, ckpt) for this prompt
            for c in spec.cases:
                split = c.split.resolve(tp) if c.split is not None else None
                ckpt = c.checkpoint.resolve(tp) if c.checkpoint is not None else None
                bad = [(w, pt, r) for w, pt, r in (("split", c.split, split), ("checkpoint", c.checkpoint, ckpt))
                       if pt is not None and not _usable(r, tp)]
                if bad:
                    w_, pt, r = bad[0]
                    why = (f"{w_} {pt} is at or past the end" if not pt.fraction and r >= tp else
                           f"{w_} {pt} -> row {r} leaves a segment < PRIME_MIN_T = {PRIME_MIN_T}")
                    notes.append(f"{c.key} ({c.variant}) skipped for {model}/{ps.name} ({tp} tokens): {why}")
                    continue
                if c.variant == "short" and tp > spec.fill_chunk:
                    if model == next(iter(spec.models)):
                        notes.append(f"{c.key} (short) skipped for {ps.name}: {tp} tokens > fill_chunk "
                                     f"{spec.fill_chunk}")
                    continue
                args = {}
                if split is not None:
                    args["split"] = split
                if ckpt is not None:
                    args["checkpoint"] = ckpt
                chunk_rows = (c.chunk_rows if c.variant == "batched" else
                              None if c.variant == "tokenwise" else spec.chunk_rows)
                fill = tp if c.variant == "short" else spec.fill_chunk
                label = schedule_label(c.variant, args, chunk_rows)
                if any(r[1] == label for r in runs):
                    first = next(r[0] for r in runs if r[1] == label)
                    notes.append(f"{c.key} gives the same cell as {first.key} for {model}/{ps.name} "
                                 f"({label}); skipped")
                    continue
                runs.append((c, label, args, chunk_rows, fill, split, ckpt))
            ks = ps.k or spec.k
            for k in ks:
                for s, slabel in zip(spec.sampling, spec.labels):
                    if ps.sampling is not None and slabel not in ps.sampling:
                        continue
                    oracle = cell_id(model, ps.name, ORACLE, k, slabel)
                    for c, label, args, chunk_rows, fill, split, ckpt in runs:
                        cid = cell_id(model, ps.name, label, k, slabel)
                        assert cid not in seen, cid
                        seen[cid] = True
                        cells.append(Cell(cid, len(cells), model, ps, c.variant, dict(args), chunk_rows,
                                          fill, k, s, slabel, oracle, split, ckpt))
    return cells, notes


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 0 <= I < N; None -> (0, 1)."""
    if text is None:
        return 0, 1
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise PrimewalkError(f"--shard: expected I/N (e.g. 0/4), got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise PrimewalkError(f"--shard: expected I/N with 0 <= I < N, got {text!r}")
    return i, n


# ------------------------------------------------------------------------------------------------
# running a cell
# ------------------------------------------------------------------------------------------------
@dataclass
class Raw:
    """What one cell's run produced (before the verdict)."""

    tape: list
    yields: int
    logits: np.ndarray
    digests: dict
    tokens: list
    plain_tokens: list
    acceptance: dict
    timings: dict


def continuation_digest(tokens) -> str:
    """SHA-256 of the token ids as little-endian int64."""
    return hashlib.sha256(np.asarray(list(tokens), dtype="<i8").tobytes()).hexdigest()


def capacity(tp: int, max_new: int, k: int) -> int:
    """Cache positions of a cell's session: the same for every schedule of one (prompt, K), since
    the speculative loop caps its drafts by the room left."""
    return tp + max_new + 2 * (k + 1) + 16


def _finite(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def run_cell(engine, cell: Cell, ids: list, max_new: int) -> Raw:
    """Prime ``ids`` under the cell's schedule, continue speculatively, then plainly from a
    snapshot of the primed cache on a second session (so the digests are untouched)."""
    from .spec import continue_plain, continue_spec
    from .walker import DEFAULT_CHUNK_ROWS, Peer, capture_digest, logits_digest, run_prime

    tp = len(ids)
    cap = capacity(tp, max_new, cell.k)
    sess = engine.new_session(cap)
    if cell.split is not None:
        sess.capture_at = cell.split
    if cell.checkpoint is not None:
        sess.ckpt_at = cell.checkpoint
    hook = None
    if cell.yielded:
        hook = Peer(engine, prompt_len=PEER_PROMPT_LEN, seed=PEER_SEED).step
    run = run_prime(engine, sess, ids, cell.k, sampling=cell.sampling, yield_hook=hook,
                    prime_split=cell.split, chunk_rows=cell.chunk_rows or DEFAULT_CHUNK_ROWS,
                    fill_chunk=cell.fill_chunk, tokenwise=cell.tokenwise)
    prepared = run.prepared
    logits = np.array(prepared.logits, dtype=np.float32)
    captures = capture_digest(sess.boundary_captures)
    snap = sess.cache.snapshot()
    gen = continue_spec(engine, sess, prepared, max_new, cell.k, cell.sampling)
    final = sess.cache.digest()
    plain_sess = engine.new_session(cap, session_id=sess.session_id)
    plain_sess.cache.restore(snap)
    plain = continue_plain(engine, plain_sess, prepared, max_new, cell.sampling)
    prime_s = prepared.wall_s if getattr(prepared, "wall_s", 0.0) else run.wall_s
    m = gen.metrics
    acceptance = {"drafts": int(m.get("drafts", 0)), "draft_tokens": int(m.get("draft_tokens", 0)),
                  "accepted": int(m.get("accepted", 0)),
                  "mean_acceptance_length": _finite(m.get("mean_acceptance_length")),
                  "per_position": [_finite(x) for x in m.get("per_position", [])],
                  "histogram": [int(x) for x in m.get("histogram", [])]}
    timings = {"prime_s": _finite(prime_s),
               "prime_tokens_per_s": _finite(tp / prime_s) if prime_s > 0 else None,
               "chunk_wall_s": [_finite(x) for x in run.chunk_wall_s],
               "decode_tokens_per_s": _finite(plain.tokens_per_s) or None,
               "spec_tokens_per_s": _finite(gen.tokens_per_s) or None}
    return Raw(tape=[[str(ph), int(r)] for ph, r in run.tape], yields=int(run.yields), logits=logits,
               digests={"logits": logits_digest(logits), "captures": captures, "final_state": final,
                        "continuation": continuation_digest(gen.tokens)},
               tokens=[int(t) for t in gen.tokens], plain_tokens=[int(t) for t in plain.tokens],
               acceptance=acceptance, timings=timings)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance in float32 units in the last place between ``a`` and ``b``."""
    ia = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
    ib = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
    oa = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ob = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.max(np.abs(oa - ob))) if oa.size else 0


def _compare(a: np.ndarray, b: np.ndarray) -> tuple:
    if a.shape != b.shape:
        return None, None
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return _finite(np.max(d)) if d.size else 0.0, ulp_distance(a, b)


def verdict(cell: Cell, raw: Raw, oracle: Raw, indep_logits: np.ndarray, indep_captures: str) -> dict:
    """The cell's verdict against its oracle (see the module docstring)."""
    from .walker import logits_digest

    is_oracle = cell.id == cell.oracle
    ref = np.asarray(indep_logits, np.float32) if is_oracle else oracle.logits
    differ = []
    if is_oracle:
        if raw.digests["logits"] != logits_digest(indep_logits):
            differ.append("logits (vs an independent unyielded prime)")
    elif raw.digests["logits"] != oracle.digests["logits"]:
        differ.append("logits")
    want_caps = indep_captures if (cell.points or is_oracle) else oracle.digests["captures"]
    if raw.digests["captures"] != want_caps:
        differ.append("captures" + (f" at {','.join(map(str, cell.points))}" if cell.points else ""))
    if not is_oracle:
        if raw.digests["final_state"] != oracle.digests["final_state"]:
            differ.append("final_state")
        if raw.tokens != oracle.tokens:
            i = next((j for j, (x, y) in enumerate(zip(raw.tokens, oracle.tokens)) if x != y),
                     min(len(raw.tokens), len(oracle.tokens)))
            differ.append(f"continuation (from token {i})")
    if cell.sampling.greedy and raw.tokens != raw.plain_tokens:
        i = next((j for j, (x, y) in enumerate(zip(raw.tokens, raw.plain_tokens)) if x != y),
                 min(len(raw.tokens), len(raw.plain_tokens)))
        differ.append(f"speculative vs plain greedy decoding (from token {i})")
    if not differ:
        detail = ("the oracle: logits and captures bitwise equal to an independent unyielded prime"
                  if is_oracle else "logits, captures, final state and continuation bitwise equal to the oracle")
        return {"status": "bitwise", "max_abs": 0.0, "max_ulp": 0, "bound": None, "detail": detail}
    max_abs, max_ulp = _compare(raw.logits, ref)
    return {"status": "fail", "max_abs": max_abs, "max_ulp": max_ulp, "bound": None,
            "detail": "differs: " + "; ".join(differ)}


# ------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------
@dataclass
class _Model:
    name: str
    path: str
    ckpt: object
    engine: object
    ids: dict = field(default_factory=dict)  # prompt name -> ids


def load_models(spec: MatrixSpec) -> dict:
    """One engine per model (every cell of a model shares it), prompts checked against its vocab."""
    from .model import Engine
    from .weights import load_checkpoint

    out = {}
    for name, folder in spec.model_dirs.items():
        ck = load_checkpoint(folder)
        ck.require_mtp("the schedule matrix")
        eng = Engine(ck, spec.backend)
        m = _Model(name, folder, ck, eng)
        V = ck.config.vocab_size
        for ps in spec.prompts:
            ids = ps.ids(V)
            bad = [t for t in ids if not 0 <= t < V]
            if bad:
                raise PrimewalkError(f"{spec.where}: {ps.key}: token id {bad[0]} is out of range for "
                                     f"model {name} (vocab_size {V})")
            m.ids[ps.name] = ids
        out[name] = m
    return out


def model_block(models: dict) -> dict:
    blocks = {n: {"name": n, "path": m.path, "weights_sha256": m.ckpt.sha256,
                  "config": m.ckpt.config.to_dict()} for n, m in models.items()}
    if len(blocks) == 1:
        return next(iter(blocks.values()))
    joined = "".join(f"{n}={b['weights_sha256']}\n" for n, b in blocks.items())
    return {"name": "+".join(blocks), "path": None,
            "weights_sha256": hashlib.sha256(joined.encode()).hexdigest(), "config": None,
            "models": blocks}


def _rate(x) -> str:
    if x is None:
        return "—"
    return f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def cell_line(c: dict) -> str:
    """``cell tiny/p130/split@64/k2/greedy bitwise prime 12.3k tok/s accept 1.4``"""
    v = c["verdict"]
    text = f"cell {c['id']} {v['status']} prime {_rate(c['timings'].get('prime_tokens_per_s'))} tok/s"
    mal = (c.get("acceptance") or {}).get("mean_acceptance_length")
    text += f" accept {mal:.2f}" if mal is not None else " accept —"
    if v["status"] != "bitwise":
        extra = []
        if v.get("max_abs") is not None:
            extra.append(f"max |Δ| {v['max_abs']:.3g}")
        if v.get("max_ulp") is not None:
            extra.append(f"{v['max_ulp']} ulp")
        text += f" — {v['detail']}" + (f" ({', '.join(extra)})" if extra else "")
    return text


class _Progress:
    """tqdm over the cells when it is importable (quiet off a terminal), else a stderr line per
    cell on a terminal; ``write`` prints a line without tearing the bar."""

    def __init__(self, total: int, quiet: bool):
        self.bar = None
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        if quiet:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, unit="cell", disable=None, file=sys.stderr, dynamic_ncols=True,
                        leave=False)

    def start(self, i: int, total: int, cid: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.set_description_str(cid, refresh=False)
        elif self.tty:
            print(f"[{i + 1}/{total}] {cid}", file=sys.stderr, flush=True)

    def write(self, line: str) -> None:
        if self.quiet:
            return
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_matrix(spec: MatrixSpec, shard: tuple = (0, 1), quiet: bool = False, models: dict | None = None) -> dict:
    """Run the cells of ``spec`` in shard ``shard`` = (I, N) (cells i with i % N == I) and return
    the receipt (not written). Oracle cells outside the shard are run, not recorded."""
    from .receipts import KIND, SCHEMA_VERSION, env_info, spec_hash, utc_now
    from .walker import oracle_prime

    t0 = time.perf_counter()
    cells, notes = expand(spec)
    if not quiet:
        for n in notes:
            print(f"note: {n}", file=sys.stderr)
    models = models if models is not None else load_models(spec)
    index, count = shard
    mine = [c for c in cells if c.order % count == index]
    by_id = {c.id: c for c in cells}
    oracles: dict = {}  # oracle cell id -> Raw
    indep: dict = {}  # (cell group, points) -> (logits, capture digest)
    out = []
    progress = _Progress(len(mine), quiet)
    try:
        for i, cell in enumerate(mine):
            progress.start(i, len(mine), cell.id)
            m = models[cell.model]
            ids = m.ids[cell.prompt.name]
            if cell.oracle not in oracles:
                ocell = by_id[cell.oracle]
                oracles[cell.oracle] = run_cell(m.engine, ocell, ids, spec.max_new_tokens)
            if cell.id == cell.oracle:
                raw = oracles[cell.oracle]
            else:
                raw = run_cell(m.engine, cell, ids, spec.max_new_tokens)
            key = cell.group + (cell.points,)
            if key not in indep:
                indep[key] = oracle_prime(m.engine, ids, cell.k, list(cell.points), cell.sampling)
            ilogits, icaps = indep[key]
            entry = {
                "id": cell.id, "order": cell.order, "model": cell.model, "prompt": cell.prompt.name,
                "prompt_len": cell.prompt.length, "variant": cell.variant,
                "variant_args": dict(cell.variant_args), "chunk_rows": cell.chunk_rows,
                "fill_chunk": cell.fill_chunk, "boundary_points": list(cell.points), "k": cell.k,
                "sampling": cell.sampling_label, "temperature": float(cell.sampling.temperature),
                "seed": int(cell.sampling.seed), "mode": spec.mode, "oracle": cell.oracle,
                "tape": raw.tape, "yields": raw.yields, "digests": dict(raw.digests),
                "verdict": verdict(cell, raw, oracles[cell.oracle], np.asarray(ilogits), icaps),
                "continuation": {"tokens": list(raw.tokens)},
                "acceptance": dict(raw.acceptance), "timings": dict(raw.timings),
            }
            out.append(entry)
            progress.update()
            progress.write(cell_line(entry))
    finally:
        progress.close()
    first = next(iter(models.values()))
    B = first.engine.B
    env = env_info(spec.backend, device=None if spec.backend == "cpu" else B.device_name(),
                   driver=None if spec.backend == "cpu" else B.driver())
    data = dict(spec.data)
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "created": utc_now(), "env": env,
            "model": model_block(models), "spec": data, "spec_hash": spec_hash(data),
            "shard": {"index": index, "count": count}, "wall_s": time.perf_counter() - t0,
            "notes": list(notes), "cells": out}


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------
def default_out(spec: MatrixSpec, shard: tuple) -> str:
    stem = spec.stem
    if shard != (0, 1):
        stem += f".shard{shard[0]}"
    return os.path.join("out", f"{stem}.json")


def summary_line(receipt: dict, path: str, plots: list | None) -> str:
    counts = {}
    for c in receipt["cells"]:
        s = c["verdict"]["status"]
        counts[s] = counts.get(s, 0) + 1
    parts = [f"{counts.get(s, 0)} {s}" for s in ("bitwise", "tolerance", "fail")
             if counts.get(s) or s != "tolerance"]
    shard = receipt["shard"]
    text = (f"matrix: {len(receipt['cells'])} cells" + (f" (shard {shard['index']}/{shard['count']})"
                                                          if shard["count"] > 1 else "")
            + f": {', '.join(parts)} in {receipt['wall_s']:.1f} s; receipt {path} (+ .csv)")
    if plots:
        text += f"; plots {os.path.splitext(path)[0]}.*.png ({len(plots)})"
    return text


def cmd_run_matrix(args) -> int:
    from .receipts import write_receipt

    shard = parse_shard(args.shard)
    spec = load_spec(args.spec, backend=args.backend, model=args.model)
    if args.update_golden:
        if spec.golden is None:
            raise PrimewalkError(f"--update-golden: {spec.where} is not a built-in spec; only the specs under "
                                 f"{os.path.relpath(SPECS_DIR, REPO)}/ have a golden receipt "
                                 f"({os.path.relpath(GOLDEN_DIR, REPO)}/<stem>.json)")
        why = []
        if spec.backend != "cpu":
            why.append(f"the backend is {spec.backend}")
        if args.model is not None:
            why.append("--model is given")
        if shard != (0, 1):
            why.append("--shard is given")
        if args.out is not None:
            why.append("--out is given (the golden's path is fixed)")
        if why:
            raise PrimewalkError("--update-golden only records a built-in spec on the cpu backend "
                                 f"(unsharded, the spec's models) to {os.path.relpath(spec.golden)}; here "
                                 + ", ".join(why))
    out = spec.golden if args.update_golden else (args.out or default_out(spec, shard))
    receipt = run_matrix(spec, shard, quiet=args.quiet)
    failed = sum(1 for c in receipt["cells"] if c["verdict"]["status"] == "fail")
    if args.update_golden and failed:
        out = default_out(spec, shard)
        print(f"harness run-matrix: {failed} cell(s) failed; the golden is NOT updated (receipt "
              f"written to {out} instead)", file=sys.stderr)
    write_receipt(out, receipt)
    plots = None
    if not args.no_plots:
        from .plots import plot_receipt

        plots = plot_receipt(out, quiet=args.quiet)
    print(summary_line(receipt, out, plots))
    return 1 if failed else 0


def register(subparsers) -> None:
    """Add ``run-matrix`` to an argparse ``subparsers``; its handler returns an exit code."""
    import argparse

    p = subparsers.add_parser(
        "run-matrix", help="run the schedule matrix and write its receipt (exit 1 if any cell fails)",
        description="Prime every prompt under every schedule variant of a matrix spec, continue "
                    "speculatively, judge each cell against its unyielded oracle (bitwise or fail) and "
                    "write the receipt (JSON + CSV) and its figures.",
        epilog="examples:\n"
               "  harness run-matrix                                   # built-in default spec (stdlib-small), cpu\n"
               "  harness run-matrix --spec my.toml --out out/my.json\n"
               "  harness run-matrix --backend cuda --out receipts/device/h200-default.json\n"
               "  harness run-matrix --shard 0/2 --out out/s0.json && harness run-matrix --shard 1/2 "
               "--out out/s1.json\n"
               "  harness merge out/default.json out/s0.json out/s1.json\n"
               "  harness run-matrix --spec harness/specs/tiny.toml    # the quick matrix (random tiny model)\n"
               "  harness run-matrix --update-golden                   # re-record receipts/golden/default.json\n"
               "  harness run-matrix --spec harness/specs/tiny.toml --update-golden  # ... receipts/golden/tiny.json\n"
               "  (--update-golden takes the built-in specs under harness/specs/ only, on the cpu backend)\n"
               "exit status: 0 all cells bitwise, 1 a cell failed, 2 unusable spec or input",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", metavar="FILE", default=None,
                   help="matrix spec (TOML); default: the built-in harness/specs/default.toml "
                        "(stdlib-small); harness/specs/tiny.toml is the quick one")
    p.add_argument("--model", metavar="DIR", default=None,
                   help="run every cell on this checkpoint folder instead of the spec's models")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="compute backend (default: the spec's, else $PRIMEWALK_BACKEND or cpu)")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="receipt path (default: out/<spec stem>.json; a .csv and figures go beside it)")
    p.add_argument("--shard", metavar="I/N", default=None,
                   help="run only cells i with i %% N == I (join shards with harness merge)")
    p.add_argument("--update-golden", action="store_true",
                   help="write the spec's golden receipt, receipts/golden/<stem>.json (built-in specs "
                        "under harness/specs/ only, cpu backend, no --out/--shard/--model)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no per-cell lines")
    p.add_argument("--no-plots", action="store_true", help="write the receipt only, no figures")
    p.set_defaults(func=cmd_run_matrix)
