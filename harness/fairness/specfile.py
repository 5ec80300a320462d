"""A fairness spec: its schema (TOML), its validation, and the parsed :class:`FairnessSpec`.

:func:`load_spec` reads a spec file and :func:`parse_spec` validates the parsed TOML; every
problem is collected and reported at once, in one line (``FILE: 3 problems: KEY: what was
expected, got …; …``), before anything runs.

Spec (TOML; keys other than these are errors)::

    description = "..."
    backend = "cpu"             # cpu | cuda (--backend overrides)
    model = "tiny"              # an embedded model (tiny, tiny-q35, stdlib-small) or a checkpoint folder, relative to the spec (--model overrides)
    chunk_rows = 64             # rows per prime chunk of every session's walker
    fill_chunk = 64             # rows per MTP draft-fill chunk; a prompt of <= fill_chunk rows primes in one unit
    arrival_unit = "s"          # "s": arrivals in seconds; "long_prime": in units of the long
                                # prompt's time to first token when it runs alone (measured first)
    policies = ["drain", "yield", {name = "interval", steps = 2}]
    independent_check = true    # also check each session's alone run against an unyielded prime

    [long]                      # the long prompt
    length = 1024               # seeded synthetic ids; or text = "...", or path = "prompt.txt"
    seed = 0                    # synthetic only
    arrival = 0.0
    max_new_tokens = 8
    k = 2                       # 0: plain decode steps; >= 1: speculative rounds of K drafts
    sampling = {temperature = 0.0, seed = 0}
    boundary = 512              # optional: the prime is split, checkpointed and captured here

    [peers]
    count = 8
    arrival_interval = 0.1      # peer i arrives at first_arrival + i * interval (first_arrival
    first_arrival = 0.1         #   defaults to the interval); or arrivals = [t0, t1, ...] (count
                                #   of them), or poisson_interval = 0.1 (mean gap, exponential
                                #   gaps from arrival_seed after first_arrival, default 0)
    prompt_lengths = [64, 128]  # each of these lists is cycled over the peers (peer i takes
    max_new_tokens = [8, 16]    #   entry i mod its length); a single value is a list of one
    k = [1, 2, 3]
    sampling = [{temperature = 0.0}, {temperature = 0.7, seed = 3}]
    seed = 1                    # peer i's prompt: synthetic ids seeded with (seed, i, length)

    [[goals]]                   # optional; reported in the receipt, never a failure
    metric = "peers_p95_s"      # a per-policy measure (see METRICS)
    policy = "yield"
    baseline = "drain"
    max_ratio = 0.05            # met when metric(policy) <= max_ratio * metric(baseline)

Sessions are named ``long`` and ``peer1`` … ``peerN``; their job indices (0 for the long one)
are their sampling session ids.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import PrimewalkError
from ..matrix.builtin import REPO
from ..matrix.specfile import EMBEDDED, _resolve_model, read_text_file, read_toml
from ..walk.sampling import Sampling
from ..walk.scheduler import Policy
from ..walk.schedule import PRIME_MIN_T

HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS_DIR = os.path.join(HARNESS, "specs", "fairness")  # the built-in fairness specs
GOLDEN_DIR = os.path.join(REPO, "receipts", "fairness")  # ... and their receipts
BACKENDS = ("cpu", "cuda")
ARRIVAL_UNITS = ("s", "long_prime")
TOP_KEYS = ("description", "backend", "model", "chunk_rows", "fill_chunk", "arrival_unit", "policies",
            "independent_check", "long", "peers", "goals")
LONG_KEYS = ("length", "text", "path", "seed", "arrival", "max_new_tokens", "k", "sampling", "boundary")
PEER_KEYS = ("count", "arrivals", "arrival_interval", "first_arrival", "poisson_interval", "arrival_seed",
             "prompt_lengths", "max_new_tokens", "k", "sampling", "seed")
GOAL_KEYS = ("metric", "policy", "baseline", "max_ratio")
# The per-policy measures a goal can name (the receipt's policies[] entries carry them).
METRICS = ("peers_p50_s", "peers_p95_s", "peers_max_s", "long_ttft_s", "longest_tick_s", "longest_hold_s",
           "makespan_s")


@dataclass(frozen=True)
class SessionSpec:
    """One session of the spec: its prompt (synthetic ids, or text), arrival (in the spec's
    arrival unit) and continuation."""

    name: str  # long | peer1 ...
    role: str  # long | peer
    length: int
    arrival: float
    max_new_tokens: int
    k: int
    sampling: Sampling
    seed: tuple | None = None  # synthetic prompt: the id generator's seed
    token_ids: tuple | None = None  # text / file prompt
    boundary: int | None = None

    def ids(self, vocab_size: int) -> list[int]:
        if self.token_ids is not None:
            return list(self.token_ids)
        return [int(t) for t in np.random.default_rng(list(self.seed)).integers(0, vocab_size, self.length)]


@dataclass(frozen=True)
class Goal:
    metric: str
    policy: str
    baseline: str
    max_ratio: float


@dataclass
class FairnessSpec:
    source: str  # the path as given (repository-relative for a built-in spec)
    where: str  # the file name in messages
    model: str  # as written (an embedded model's name, harness.models, or a folder)
    model_dir: str
    backend: str
    chunk_rows: int
    fill_chunk: int
    arrival_unit: str
    policies: list  # Policy
    independent_check: bool
    long: SessionSpec
    peers: list  # SessionSpec
    goals: list  # Goal
    data: dict = field(default_factory=dict)  # the normalised spec, as recorded in the receipt
    builtin: str | None = None  # stem of a built-in spec (harness/specs/fairness/<stem>.toml)

    @property
    def sessions(self) -> list:
        return [self.long] + list(self.peers)

    @property
    def stem(self) -> str:
        return self.builtin or os.path.splitext(os.path.basename(self.source))[0]

    @property
    def golden(self) -> str | None:
        """The committed receipt of a built-in spec, ``receipts/fairness/<stem>.json``."""
        return os.path.join(GOLDEN_DIR, f"{self.builtin}.json") if self.builtin else None


def builtin_specs() -> dict:
    """stem -> path of every ``*.toml`` directly under ``harness/specs/fairness/``."""
    return {os.path.splitext(n)[0]: os.path.join(SPECS_DIR, n) for n in sorted(os.listdir(SPECS_DIR))
            if n.endswith(".toml")}


def _builtin_stem(path: str) -> str | None:
    full = os.path.realpath(path)
    if os.path.dirname(full) != os.path.realpath(SPECS_DIR) or not full.endswith(".toml"):
        return None
    return os.path.splitext(os.path.basename(full))[0]


# ------------------------------------------------------------------------------------------------
# validation: every problem collected, reported at once
# ------------------------------------------------------------------------------------------------
def _show(value) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= 60 else text[:59] + "…"


class _Problems:
    def __init__(self, where: str):
        self.where, self.items = where, []

    def add(self, key: str, text: str) -> None:
        self.items.append(f"{key}: {text}")

    def expect(self, key: str, expected: str, got) -> None:
        self.add(key, f"expected {expected}, got {_show(got)}")

    def unknown(self, key: str, table: dict, allowed) -> None:
        for name in table:
            if name not in allowed:
                self.add(f"{key}.{name}" if key else name, f"unknown key (expected one of: {', '.join(allowed)})")

    def raise_if_any(self) -> None:
        if len(self.items) == 1:
            raise PrimewalkError(f"{self.where}: {self.items[0]}")
        if self.items:
            raise PrimewalkError(f"{self.where}: {len(self.items)} problems: " + "; ".join(self.items))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(p, key, v, lo: int, what: str, default=None):
    """An integer >= lo (the default when absent: v is None), or None after noting a problem."""
    if v is None:
        return default
    if not _is_int(v) or v < lo:
        p.expect(key, what, v)
        return None
    return int(v)


def _time(p, key, v, default=None):
    if v is None:
        return default
    if not _is_num(v) or v < 0:
        p.expect(key, "a time >= 0 (a number)", v)
        return None
    return float(v)


def _sampling(p, key, v):
    if not isinstance(v, dict):
        p.expect(key, "a table {temperature = 0.7, seed = 1}", v)
        return None
    p.unknown(key, v, ("temperature", "seed"))
    t, seed = v.get("temperature", 0.0), v.get("seed", 0)
    ok = True
    if not _is_num(t) or t < 0:
        p.expect(f"{key}.temperature", "a finite number >= 0", t)
        ok = False
    if not _is_int(seed) or seed < 0:
        p.expect(f"{key}.seed", "a non-negative integer", seed)
        ok = False
    return Sampling(float(t), int(seed)) if ok else None


def _cycled(p, key, v, parse):
    """A list of values (a single value is a list of one), each parsed by ``parse(key, x)``."""
    items = v if isinstance(v, list) else [v]
    if not items:
        p.expect(key, "a value or a non-empty list", v)
        return None
    out = [parse(f"{key}[{i}]" if isinstance(v, list) else key, x) for i, x in enumerate(items)]
    return None if any(x is None for x in out) else out


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------
def load_spec(path: str, backend: str | None = None, model: str | None = None) -> FairnessSpec:
    """Read and validate the fairness spec at ``path``; ``backend`` / ``model`` (a checkpoint
    folder, or an embedded model's name) override the spec's."""
    path = os.fspath(path)
    stem = _builtin_stem(path)
    where = os.path.relpath(os.path.realpath(path), REPO) if stem else path
    data = read_toml(path, where)
    spec = parse_spec(data, where=where, base_dir=os.path.dirname(os.path.abspath(path)), backend=backend,
                      model=model)
    spec.builtin = stem
    return spec


def parse_spec(data, where: str = "fairness.toml", base_dir: str | None = None, backend: str | None = None,
               model: str | None = None) -> FairnessSpec:
    """Validate parsed TOML ``data`` and build a :class:`FairnessSpec`; raises one
    :class:`PrimewalkError` listing every problem."""
    p = _Problems(where)
    base_dir = base_dir or os.getcwd()
    if not isinstance(data, dict):
        p.expect("(top level)", "a TOML table", data)
        p.raise_if_any()
    p.unknown("", data, TOP_KEYS)
    if "description" in data and not isinstance(data["description"], str):
        p.expect("description", "a string", data["description"])
    backend = _backend(p, data, backend)
    model_name, model_dir = _model(p, data, base_dir, model)
    chunk_rows = _int(p, "chunk_rows", data.get("chunk_rows"), 1, "a positive integer", 64)
    fill_chunk = _int(p, "fill_chunk", data.get("fill_chunk"), 1, "a positive integer", 64)
    unit = data.get("arrival_unit", "s")
    if unit not in ARRIVAL_UNITS:
        p.expect("arrival_unit", " or ".join(f'"{u}"' for u in ARRIVAL_UNITS), unit)
    check = data.get("independent_check", True)
    if not isinstance(check, bool):
        p.expect("independent_check", "true or false", check)
    policies = _policies(p, data.get("policies"))
    long, norm_long = _long(p, data.get("long"), base_dir, model_dir)
    peers, norm_peers = _peers(p, data.get("peers"))
    goals = _goals(p, data.get("goals"), [q.label for q in policies or []])
    p.raise_if_any()
    spec = FairnessSpec(source=where, where=where, model=model_name, model_dir=model_dir, backend=backend,
                        chunk_rows=chunk_rows, fill_chunk=fill_chunk, arrival_unit=unit, policies=policies,
                        independent_check=check, long=long, peers=peers, goals=goals)
    spec.data = {"model": model_name, "backend": backend, "chunk_rows": chunk_rows, "fill_chunk": fill_chunk,
                 "arrival_unit": unit, "policies": [{"name": q.name, "steps": q.steps} if q.name == "interval"
                                                    else {"name": q.name} for q in policies],
                 "independent_check": check, "long": norm_long, "peers": norm_peers,
                 "goals": [g.__dict__.copy() for g in goals], "source": where}
    return spec


def _backend(p, data, override):
    b = data.get("backend")
    if b is not None and b not in BACKENDS:
        p.expect("backend", " or ".join(f'"{x}"' for x in BACKENDS), b)
        b = None
    if override is not None and override not in BACKENDS:
        raise PrimewalkError(f"--backend: expected one of {', '.join(BACKENDS)}, got {_show(override)}")
    b = override or b or os.environ.get("PRIMEWALK_BACKEND") or "cpu"
    if b not in BACKENDS:
        raise PrimewalkError(f"PRIMEWALK_BACKEND: expected one of {', '.join(BACKENDS)}, got {_show(b)}")
    return b


def _model(p, data, base_dir, override):
    if override is not None:
        folder = _resolve_model(os.getcwd(), override)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise PrimewalkError(f"--model: {override}: not a checkpoint folder (no config.json)")
        return override, folder
    m = data.get("model", EMBEDDED)
    if not isinstance(m, str) or not m:
        p.expect("model", 'a checkpoint folder (or an embedded model: tiny, tiny-q35, stdlib-small)', m)
        return None, None
    folder = _resolve_model(base_dir, m)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        p.add("model", f"{m}: not a checkpoint folder (no config.json in {folder})")
    return m, folder


def _policies(p, raw):
    if raw is None:
        p.add("policies", 'missing (expected a list such as ["drain", "yield", {name = "interval", steps = 2}])')
        return []
    if not isinstance(raw, list) or not raw:
        p.expect("policies", "a non-empty list of policy names or tables", raw)
        return []
    out, seen = [], {}
    for i, v in enumerate(raw):
        key = f"policies[{i}]"
        table = {"name": v} if isinstance(v, str) else v
        if not isinstance(table, dict) or table.get("name") not in ("drain", "yield", "interval"):
            p.expect(key, '"drain", "yield" or {name = "interval", steps = N}', v)
            continue
        name = table["name"]
        p.unknown(key, table, ("name", "steps") if name == "interval" else ("name",))
        steps = 1
        if name == "interval":
            if "steps" not in table:
                p.add(f"{key}.steps", "missing (the decode units served per prime chunk, e.g. steps = 2)")
                continue
            steps = _int(p, f"{key}.steps", table["steps"], 1, "a positive integer")
            if steps is None:
                continue
        pol = Policy(name, steps)
        if pol.label in seen:
            p.add(key, f"{pol.label} is already policies[{seen[pol.label]}]")
            continue
        seen[pol.label] = i
        out.append(pol)
    return out


def _encode(p, key, text, model_dir):
    """The ids of ``text`` by the spec model's own tokenizer (a model without one refuses text)."""
    from ..engine.config import ModelConfig
    from ..engine.tokenizer import encode_text, load_tokenizer

    if model_dir is None or not os.path.isfile(os.path.join(model_dir, "config.json")):
        return None  # the model is already reported
    try:
        vocab = ModelConfig.from_json(os.path.join(model_dir, "config.json")).vocab_size
        return tuple(encode_text(load_tokenizer(model_dir, vocab), text, model_dir, vocab, "a text prompt"))
    except PrimewalkError as e:
        p.add(key, str(e))
        return None


def _prompt(p, key, table, base_dir, model_dir):
    """(length, seed tuple or None, token ids or None, normalised) of the long prompt; text is
    encoded by the model's own tokenizer."""

    given = [k for k in ("length", "text", "path") if k in table]
    if len(given) != 1:
        p.add(key, "give exactly one of length (synthetic ids), text or path" +
              (f" (got {', '.join(given)})" if given else ""))
        return None
    kind = given[0]
    if kind != "length" and "seed" in table:
        p.add(f"{key}.seed", "only a synthetic prompt (length = N) takes a seed")
    if kind == "length":
        n = _int(p, f"{key}.length", table["length"], 1, "a positive integer")
        seed = _int(p, f"{key}.seed", table.get("seed"), 0, "a non-negative integer", 0)
        if n is None or seed is None:
            return None
        return n, (seed, n), None, {"length": n, "seed": seed}
    if kind == "text":
        text = table["text"]
        if not isinstance(text, str) or not text:
            p.expect(f"{key}.text", "a non-empty string", text)
            return None
        ids = _encode(p, f"{key}.text", text, model_dir)
        return None if ids is None else (len(ids), None, ids, {"text": text})
    path = table["path"]
    if not isinstance(path, str) or not path:
        p.expect(f"{key}.path", "a text file path (relative to the spec)", path)
        return None
    try:
        raw, text = read_text_file(base_dir, path)
    except ValueError as e:
        p.add(f"{key}.path", str(e))
        return None
    ids = _encode(p, f"{key}.path", text, model_dir)
    if ids is None:
        return None
    return len(ids), None, ids, {"path": path, "sha256": hashlib.sha256(raw).hexdigest()}


def _long(p, raw, base_dir, model_dir):
    key = "long"
    if raw is None:
        p.add(key, "missing (expected a [long] table, e.g. length = 1024)")
        return None, None
    if not isinstance(raw, dict):
        p.expect(key, "a table", raw)
        return None, None
    p.unknown(key, raw, LONG_KEYS)
    prompt = _prompt(p, key, raw, base_dir, model_dir)
    arrival = _time(p, f"{key}.arrival", raw.get("arrival"), 0.0)
    new = _int(p, f"{key}.max_new_tokens", raw.get("max_new_tokens"), 1, "a positive integer", 16)
    k = _int(p, f"{key}.k", raw.get("k"), 0, "an integer >= 0 (0: plain decoding)", 1)
    sampling = _sampling(p, f"{key}.sampling", raw.get("sampling", {}))
    boundary = _int(p, f"{key}.boundary", raw.get("boundary"), 1, "a positive integer (a prompt row)")
    if prompt is not None and boundary is not None:
        n = prompt[0]
        if boundary < PRIME_MIN_T or n - boundary < PRIME_MIN_T:
            p.add(f"{key}.boundary", f"row {boundary} of a {n}-token prompt leaves a segment shorter than "
                                     f"PRIME_MIN_T = {PRIME_MIN_T}")
            boundary = None
    if None in (prompt, arrival, new, k, sampling):
        return None, None
    n, seed, ids, norm = prompt
    norm.update(arrival=arrival, max_new_tokens=new, k=k,
                sampling={"temperature": sampling.temperature, "seed": sampling.seed})
    if boundary is not None:
        norm["boundary"] = boundary
    return SessionSpec("long", "long", n, arrival, new, k, sampling, seed=seed, token_ids=ids,
                       boundary=boundary), norm


def _arrivals(p, key, raw, count):
    given = [k for k in ("arrivals", "arrival_interval", "poisson_interval") if k in raw]
    if count == 0 and not given:
        return [], {}
    if len(given) != 1:
        p.add(key, "give exactly one of arrivals (a list), arrival_interval or poisson_interval" +
              (f" (got {', '.join(given)})" if given else ""))
        return None, None
    how = given[0]
    if how != "poisson_interval" and "arrival_seed" in raw:
        p.add(f"{key}.arrival_seed", "only poisson_interval takes an arrival_seed")
    if how == "arrivals":
        if "first_arrival" in raw:
            p.add(f"{key}.first_arrival", "not with an explicit arrivals list")
        v = raw["arrivals"]
        if not isinstance(v, list) or len(v) != count:
            p.expect(f"{key}.arrivals", f"a list of {count} times (one per peer)", v)
            return None, None
        times = [_time(p, f"{key}.arrivals[{i}]", x) for i, x in enumerate(v)]
        return (None, None) if None in times else (times, {"arrivals": times})
    gap = raw[how]
    if not _is_num(gap) or gap <= 0:
        p.expect(f"{key}.{how}", "a number > 0", gap)
        return None, None
    gap = float(gap)
    first = _time(p, f"{key}.first_arrival", raw.get("first_arrival"), gap if how == "arrival_interval" else 0.0)
    if first is None:
        return None, None
    if how == "arrival_interval":
        return [first + i * gap for i in range(count)], {"arrival_interval": gap, "first_arrival": first}
    seed = _int(p, f"{key}.arrival_seed", raw.get("arrival_seed"), 0, "a non-negative integer", 0)
    if seed is None:
        return None, None
    gaps = np.random.default_rng(seed).exponential(gap, count)
    times = [first + float(t) for t in np.cumsum(gaps)]
    return times, {"poisson_interval": gap, "first_arrival": first, "arrival_seed": seed}


def _peers(p, raw):
    key = "peers"
    if raw is None:
        return [], {"count": 0}
    if not isinstance(raw, dict):
        p.expect(key, "a table", raw)
        return [], None
    p.unknown(key, raw, PEER_KEYS)
    count = _int(p, f"{key}.count", raw.get("count"), 0, "an integer >= 0", None)
    if count is None:
        if "count" not in raw:
            p.add(f"{key}.count", "missing (how many peers)")
        return [], None
    times, norm = _arrivals(p, key, raw, count)
    lengths = _cycled(p, f"{key}.prompt_lengths", raw.get("prompt_lengths", 64),
                      lambda k_, x: _int(p, k_, x, 1, "a positive integer"))
    news = _cycled(p, f"{key}.max_new_tokens", raw.get("max_new_tokens", 16),
                   lambda k_, x: _int(p, k_, x, 1, "a positive integer"))
    ks = _cycled(p, f"{key}.k", raw.get("k", 1), lambda k_, x: _int(p, k_, x, 0, "an integer >= 0 (0: plain decoding)"))
    samplings = _cycled(p, f"{key}.sampling", raw.get("sampling", {}), lambda k_, x: _sampling(p, k_, x))
    seed = _int(p, f"{key}.seed", raw.get("seed"), 0, "a non-negative integer", 1)
    if None in (times, lengths, news, ks, samplings, seed):
        return [], None
    peers = []
    for i in range(count):
        n = lengths[i % len(lengths)]
        peers.append(SessionSpec(f"peer{i + 1}", "peer", n, times[i], news[i % len(news)], ks[i % len(ks)],
                                 samplings[i % len(samplings)], seed=(seed, i + 1, n)))
    norm = dict(norm, count=count, prompt_lengths=lengths, max_new_tokens=news, k=ks, seed=seed,
                sampling=[{"temperature": s.temperature, "seed": s.seed} for s in samplings])
    return peers, norm


def _goals(p, raw, labels):
    if raw is None:
        return []
    if not isinstance(raw, list):
        p.expect("goals", "a list of [[goals]] tables", raw)
        return []
    out = []
    for i, g in enumerate(raw):
        key = f"goals[{i}]"
        if not isinstance(g, dict):
            p.expect(key, "a table {metric, policy, baseline, max_ratio}", g)
            continue
        p.unknown(key, g, GOAL_KEYS)
        ok = True
        if g.get("metric") not in METRICS:
            p.expect(f"{key}.metric", "one of " + ", ".join(METRICS), g.get("metric"))
            ok = False
        for role in ("policy", "baseline"):
            if g.get(role) not in labels:
                p.expect(f"{key}.{role}", "a policy of this spec (" + ", ".join(labels) + ")", g.get(role))
                ok = False
        r = g.get("max_ratio")
        if not _is_num(r) or r <= 0:
            p.expect(f"{key}.max_ratio", "a number > 0", r)
            ok = False
        if ok:
            out.append(Goal(g["metric"], g["policy"], g["baseline"], float(r)))
    return out
