"""A matrix spec: its schema (TOML), its validation, and the parsed :class:`MatrixSpec`.

:func:`load_spec` reads a spec file; :func:`parse_spec` validates the parsed TOML one section at
a time (scalars, sampling, models, prompts, variants, then the explicit points against the
prompts) and raises the first problem as a one-line :class:`~harness.errors.PrimewalkError`
naming the file, the key and what was expected, before anything runs.

Spec (TOML; keys other than these are errors)::

    backend = "cpu"            # cpu | cuda (--backend overrides)
    mode = "exact"             # exact | exact-bf16 (--mode overrides; "chunked" is not implemented yet)
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
    tiny = "tiny"              # "tiny", "tiny-q35", "stdlib-small": embedded; else a folder (relative to the spec)
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

Every key, with examples, is documented in ``docs/specs.md``. Text and file prompts are encoded
by each model's own tokenizer (:mod:`harness.engine.tokenizer`), so their length can differ
between the models of one spec; a model without a tokenizer refuses them.

Split / checkpoint points are absolute rows (ints) or fractions of the prompt (floats in (0, 1)).
A point must leave two segments of at least ``PRIME_MIN_T`` = 32 rows. An explicit row that does
not is refused (a row at or past the end of a prompt just does not apply to it). A fraction f of
a T-token prompt resolves by :meth:`Point.resolve`: ⌊f·T⌋ rounded down to the GDN grid of 64 (the
seed's rule) when that leaves two segments of ``PRIME_MIN_T`` rows; otherwise the row nearest to
f·T that does (f·T rounded half up, clamped to [32, T − 32]); a prompt of fewer than
2 · ``PRIME_MIN_T`` = 64 tokens cannot be split, and the cell is skipped (the receipt lists it
under ``skipped``). ``short`` applies to prompts of at most ``fill_chunk`` rows and primes with
``fill_chunk`` = the prompt length. ``yielded-with-peer`` advances one chunk at a time with a
peer session decoding a token between chunks (optionally split and checkpointed).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tomllib
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import PrimewalkError
from ..walk.schedule import GDN_GRID, PRIME_MIN_T
from .builtin import DEFAULT_SPEC, REPO, SPECS_DIR, builtin_stem, golden_path

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
MODES = ("exact", "exact-bf16", "chunked")  # exact-bf16: harness/engine/modes.py
BACKENDS = ("cpu", "cuda")


# ------------------------------------------------------------------------------------------------
# the parsed spec
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """A split / checkpoint position: an absolute row (int) or a fraction of the prompt (float)."""

    value: int | float

    @property
    def fraction(self) -> bool:
        return isinstance(self.value, float)

    def resolve(self, tp: int) -> int | None:
        """The row of this point in a ``tp``-token prompt (module docstring): an explicit row as
        it is; a fraction on the grid of 64 when that leaves two segments of ``PRIME_MIN_T``
        rows, else the nearest row that does; None when no row does (``tp`` < 64)."""
        if not self.fraction:
            return int(self.value)
        return self.resolution(tp)[0]

    def resolution(self, tp: int) -> tuple:
        """(row or None, how it was found), e.g. ``(64, "0.5 × 130 = 65 → 64 (down to the grid of
        64)")``."""
        if not self.fraction:
            return int(self.value), f"row {int(self.value)} (explicit)"
        exact = self.value * tp
        head = f"{self.value:g} × {tp} = {exact:g}"
        grid = (int(math.floor(exact)) // GDN_GRID) * GDN_GRID
        if usable_point(grid, tp):
            return grid, f"{head} → {grid} (down to the grid of {GDN_GRID})"
        if tp < 2 * PRIME_MIN_T:
            return None, (f"{head}: a {tp}-token prompt cannot be split (two segments of at least "
                          f"PRIME_MIN_T = {PRIME_MIN_T} rows need {2 * PRIME_MIN_T})")
        row = min(max(int(math.floor(exact + 0.5)), PRIME_MIN_T), tp - PRIME_MIN_T)
        return row, (f"{head} → {row} (the grid row {grid} leaves a segment under {PRIME_MIN_T} rows; "
                     f"nearest row leaving {PRIME_MIN_T} on each side)")

    def __str__(self) -> str:
        return f"{self.value:g}" if self.fraction else str(self.value)


def usable_point(p: int, tp: int) -> bool:
    """Row ``p`` splits a ``tp``-token prompt into two segments of at least ``PRIME_MIN_T`` rows."""
    return PRIME_MIN_T <= p and tp - p >= PRIME_MIN_T


@dataclass(frozen=True)
class PromptSpec:
    name: str
    kind: str  # synthetic | text | file
    key: str  # where in the spec, e.g. "prompts[0].lengths[1]"
    length: int | None  # tokens: synthetic; text / file: when every model's tokenizer agrees
    seed: int | None = None  # synthetic
    token_ids: tuple | None = None  # text / file: the ids when every model's tokenizer agrees
    k: tuple | None = None  # per-prompt K values (None: the spec's)
    sampling: tuple | None = None  # per-prompt sampling labels (None: all)
    text: str | None = None  # text / file: the text the models' tokenizers encode

    def ids(self, vocab_size: int) -> list[int]:
        """The prompt's token ids (synthetic ids are uniform in [0, vocab_size), seeded); a text
        prompt's when every model encodes it alike (else :meth:`MatrixSpec.prompt_ids`)."""
        if self.kind == "synthetic":
            rng = np.random.default_rng([int(self.seed), int(self.length)])
            return [int(t) for t in rng.integers(0, vocab_size, self.length)]
        if self.token_ids is None:
            raise PrimewalkError(f"{self.key}: the models' tokenizers encode this prompt differently; "
                                 "ask the spec for one model's ids")
        return list(self.token_ids)


@dataclass(frozen=True)
class Case:
    """One schedule of the spec's variants list (a batched chunk size or a point expanded)."""

    variant: str
    key: str  # e.g. "variants[3]"
    chunk_rows: int | None = None  # batched only
    split: Point | None = None
    checkpoint: Point | None = None

    @property
    def label(self) -> str:
        """The schedule as the spec writes it: ``split@0.5``, ``batched@c32``,
        ``split+checkpoint@0.5,0.75`` (the cell id shows the rows the points resolve to)."""
        points = [str(p) for p in (self.split, self.checkpoint) if p is not None]
        text = self.variant + ("@" + ",".join(points) if points else "")
        return text + (f"@c{self.chunk_rows}" if self.variant == "batched" else "")


@dataclass
class MatrixSpec:
    source: str  # "default" for the built-in spec, else the file path as given
    where: str  # the file name used in messages
    models: dict  # name -> path as written (an embedded model's name, harness.models, or a folder)
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
    tokenizers: dict = field(default_factory=dict)  # model name -> tokenizer (None: the model has none)
    encoded: dict = field(default_factory=dict)  # (model, prompt name) -> ids of a text / file prompt

    def prompt_ids(self, model: str, ps: PromptSpec, vocab_size: int) -> list[int]:
        """The ids ``model`` is fed for prompt ``ps`` (its tokenizer's, for text and files)."""
        if ps.kind == "synthetic":
            return ps.ids(vocab_size)
        return list(self.encoded[(model, ps.name)])

    def prompt_len(self, model: str, ps: PromptSpec) -> int:
        """How many tokens prompt ``ps`` has for ``model``."""
        return ps.length if ps.kind == "synthetic" else len(self.encoded[(model, ps.name)])

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


# ------------------------------------------------------------------------------------------------
# validation helpers
# ------------------------------------------------------------------------------------------------
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


def _valid_name(name) -> bool:
    return isinstance(name, str) and bool(name) and all(ch.isalnum() or ch in "-_." for ch in name)


def _safe_stem(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem) or "file"


# ------------------------------------------------------------------------------------------------
# parsing, one section at a time
# ------------------------------------------------------------------------------------------------
def load_spec(path: str | None = None, backend: str | None = None, model: str | None = None,
              mode: str | None = None) -> MatrixSpec:
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
    data = read_toml(full, where)
    spec = parse_spec(data, where=where, source=source,
                      base_dir=os.path.dirname(os.path.abspath(full)), backend=backend, model=model, mode=mode)
    spec.builtin = stem
    return spec


def read_toml(path: str, where: str) -> dict:
    """The parsed TOML file at ``path``; a one-line error naming ``where`` if it cannot be read
    or parsed."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise PrimewalkError(f"{where}: cannot read the spec ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise PrimewalkError(f"{where}: not valid TOML ({e})") from None


def read_text_file(base_dir: str, path: str) -> tuple[bytes, str]:
    """The bytes and the UTF-8 text of the prompt file ``path`` (relative to ``base_dir``);
    ValueError says why not (unreadable, not UTF-8, empty)."""
    full = path if os.path.isabs(path) else os.path.join(base_dir, path)
    try:
        with open(full, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8")
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{path} is empty")
    return raw, text


def parse_spec(data: dict, where: str = "spec.toml", source: str | None = None,
               base_dir: str | None = None, backend: str | None = None,
               model: str | None = None, mode: str | None = None) -> MatrixSpec:
    """Validate the parsed TOML ``data`` and build a :class:`MatrixSpec`.

    ``where`` names the file in errors; relative paths resolve against ``base_dir``; ``backend``,
    ``model`` (a checkpoint folder) and ``mode`` override the spec's (the mode is part of the
    recorded spec, so of ``spec_hash``: receipts of two modes never compare as one spec). Raises a one-line
    :class:`PrimewalkError` on the first problem.
    """
    w = _Where(where)
    base_dir = base_dir or os.getcwd()
    if not isinstance(data, dict):
        w.expect("(top level)", "a TOML table", data)
    _check_keys(w, "", data, TOP_KEYS)
    _check_required(w, data)
    if mode is not None:
        if mode not in MODES[:2]:
            raise PrimewalkError(f"--mode: expected one of {', '.join(MODES[:2])}, got {_show(mode)}")
        data = dict(data, mode=mode)
    mode, backend, max_new, chunk_rows, fill_chunk, ks = _scalars(w, data, backend)
    samplings, labels, norm_s = _samplings(w, data)
    models, dirs = _models(w, data, base_dir, model)
    prompts, norm_p = _prompts(w, data, base_dir, labels)
    cases, norm_v = _variants(w, data)
    tokenizers, encoded, prompts = _encode(w, dirs, prompts)

    spec = MatrixSpec(source=source or where, where=where, models=models, model_dirs=dirs,
                      prompts=prompts, cases=cases, k=tuple(ks), sampling=samplings, labels=labels,
                      max_new_tokens=max_new, chunk_rows=chunk_rows, fill_chunk=fill_chunk,
                      mode=mode, backend=backend, tokenizers=tokenizers, encoded=encoded)
    _check_points(w, cases, spec)
    spec.data = {"models": dict(models), "prompts": norm_p, "variants": norm_v, "k": list(ks),
                 "sampling": norm_s, "max_new_tokens": max_new, "chunk_rows": chunk_rows,
                 "fill_chunk": fill_chunk, "mode": mode, "backend": backend,
                 "source": spec.source}
    return spec


def _scalars(w, data, backend):
    """mode, backend (the override, the spec's, $PRIMEWALK_BACKEND, or cpu), max_new_tokens,
    chunk_rows, fill_chunk and the K values."""
    mode = data.get("mode", "exact")
    if mode not in MODES:
        w.expect("mode", '"exact" or "exact-bf16"', mode)
    if mode not in MODES[:2]:
        w.fail("mode", f'"{mode}" is not implemented yet (only "exact" and "exact-bf16")')
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
    ks = _int_list(w, "k", data["k"])
    return mode, backend, max_new, chunk_rows, fill_chunk, ks


def _samplings(w, data):
    """The Sampling settings, their labels (``greedy``, ``t0.7``, or ``t0.7s1`` where two share a
    temperature) and their normalised form."""
    from ..walk.sampling import Sampling

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
    return samplings, labels, norm_s


def _models(w, data, base_dir, model):
    """name -> path as written, and name -> resolved checkpoint folder (``model`` overrides the
    spec's models with one folder)."""
    raw_m = data.get("models", {EMBEDDED: EMBEDDED})
    if not isinstance(raw_m, dict) or not raw_m:
        w.expect("models", 'a table of name = path (e.g. tiny = "tiny")', raw_m)
    models, dirs = {}, {}
    for name, path in raw_m.items():
        key = f"models.{name}"
        if not _valid_name(name):
            w.fail(key, "a model name may use letters, digits, '-', '_' and '.' only")
        if not isinstance(path, str) or not path:
            w.expect(key, 'a checkpoint folder (or an embedded model: tiny, tiny-q35, stdlib-small)', path)
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
    return models, dirs


def _resolve_model(base_dir: str, path: str) -> str:
    """The folder of a spec's model ``path``: an embedded model's name (``harness.models``), or a
    folder relative to ``base_dir``."""
    from ..models import resolve

    return resolve(path, base_dir)


def _prompts(w, data, base_dir, labels):
    """The PromptSpecs of every ``[[prompts]]`` entry, in order (names unique), and the entries'
    normalised form."""
    raw_p = data.get("prompts")
    if raw_p is None:
        w.fail("prompts", "missing (expected [[prompts]] tables, e.g. kind = \"synthetic\", "
                          "lengths = [130], seed = 0)")
    if not isinstance(raw_p, list) or not raw_p:
        w.expect("prompts", "a non-empty list of prompt tables", raw_p)
    prompts, norm_p, owner = [], [], {}
    for i, p in enumerate(raw_p):
        added, norm = _prompt_entry(w, f"prompts[{i}]", i, p, base_dir, labels)
        norm_p.append(norm)
        for ps in added:
            if ps.name in owner:
                w.fail(ps.key, f"prompt name {ps.name!r} is already used by {owner[ps.name]}; give this "
                               "entry another name")
            owner[ps.name] = ps.key
        prompts += added
    return prompts, norm_p


def _prompt_entry(w, key, i, p, base_dir, labels):
    """One ``[[prompts]]`` table: its PromptSpecs (a synthetic entry gives one per length) and
    its normalised form."""
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
        added.append(PromptSpec(name or f"text{i}", kind, f"{key}.text", None, k=pk, sampling=psamp,
                                text=text))
        norm.update(text=text)
    else:
        path = p.get("path")
        if not isinstance(path, str) or not path:
            w.expect(f"{key}.path", "a text file path (relative to the spec)", path)
        try:
            raw, text = read_text_file(base_dir, path)
        except ValueError as e:
            w.fail(f"{key}.path", str(e))
        stem = name or _safe_stem(path)
        added.append(PromptSpec(stem, kind, f"{key}.path", None, k=pk, sampling=psamp, text=text))
        norm.update(path=path, sha256=hashlib.sha256(raw).hexdigest())
    if name is not None:
        norm["name"] = name
    if pk is not None:
        norm["k"] = list(pk)
    if psamp is not None:
        norm["sampling"] = list(psamp)
    return added, norm


def _variants(w, data):
    """The Cases of the variants list (a batched entry gives one per chunk size, a split or
    checkpoint entry one per point), and the entries' normalised form."""
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
    return cases, norm_v


def _check_points(w, cases, spec):
    """Explicit points must leave two segments of PRIME_MIN_T rows in every prompt they apply to
    (for every model: a text prompt's length is its tokenizer's)."""
    for c in cases:
        for what, pt in (("split", c.split), ("checkpoint", c.checkpoint)):
            if pt is None or pt.fraction:
                continue
            key = f"{c.key}.at" if c.variant in ("split", "checkpoint") else f"{c.key}.{what}"
            if pt.value < PRIME_MIN_T:
                w.fail(key, f"{what} point {pt.value} leaves a first segment of {pt.value} rows "
                            f"(< PRIME_MIN_T = {PRIME_MIN_T})")
            for model in spec.models:
                for ps in spec.prompts:
                    n = spec.prompt_len(model, ps)
                    if pt.value < n and n - pt.value < PRIME_MIN_T:
                        w.fail(key, f"{what} point {pt.value} leaves a last segment of {n - pt.value} "
                                    f"rows in prompt {ps.name} ({n} tokens"
                                    + (f" for model {model}" if len(spec.models) > 1 else "")
                                    + f"; < PRIME_MIN_T = {PRIME_MIN_T}); use a fraction such as 0.5")


def _encode(w, dirs, prompts):
    """Each model's tokenizer, the ids of every text / file prompt per model, and the prompts
    with ``length`` / ``token_ids`` set where every model encodes them alike. A text prompt on a
    model without a tokenizer is refused."""
    from ..engine.config import ModelConfig
    from ..engine.tokenizer import encode_text, load_tokenizer

    texts = [ps for ps in prompts if ps.kind != "synthetic"]
    tokenizers, encoded = {}, {}
    for name, folder in dirs.items():
        cfg = ModelConfig.from_json(os.path.join(folder, "config.json"))
        tok = tokenizers[name] = load_tokenizer(folder, cfg.vocab_size)
        for ps in texts:
            try:
                encoded[(name, ps.name)] = tuple(encode_text(tok, ps.text, folder, cfg.vocab_size,
                                                             f"a {ps.kind} prompt"))
            except PrimewalkError as e:
                w.fail(ps.key, f"model {name}: {e}")
    out = []
    for ps in prompts:
        if ps.kind != "synthetic":
            variants = {encoded[(name, ps.name)] for name in dirs}
            if len(variants) == 1:
                ids = next(iter(variants))
                ps = replace(ps, length=len(ids), token_ids=ids)
        out.append(ps)
    return tokenizers, encoded, out


def _check_required(w, data):
    """Every required key that is missing, reported at once: ``k``, ``variants``, ``prompts``,
    each prompt's ``kind`` and its kind's key (``lengths``, ``text``, ``path``), and each
    variant's arguments."""
    missing = [key for key in ("k", "variants", "prompts") if key not in data]
    need = {"synthetic": "lengths", "text": "text", "file": "path"}
    prompts = data.get("prompts")
    for i, p in enumerate(prompts if isinstance(prompts, list) else []):
        if isinstance(p, dict):
            if "kind" not in p:
                missing.append(f"prompts[{i}].kind")
            elif p["kind"] in need and need[p["kind"]] not in p:
                missing.append(f"prompts[{i}].{need[p['kind']]}")
    variants = data.get("variants")
    for i, v in enumerate(variants if isinstance(variants, list) else []):
        if isinstance(v, dict) and v.get("name") in VARIANT_KEYS:
            missing += [f"variants[{i}].{r}" for r in VARIANT_KEYS[v["name"]][1] if r not in v]
    if missing:
        examples = {"k": "k = [1, 2]", "variants": 'variants = ["unyielded"]',
                    "prompts": '[[prompts]] kind = "synthetic" lengths = [130]'}
        shown = "; ".join(f"{m} (e.g. {examples[m]})" if m in examples else m for m in missing)
        raise PrimewalkError(f"{w.where}: missing required key{'s' if len(missing) > 1 else ''}: {shown}; "
                             "docs/specs.md lists every key")
