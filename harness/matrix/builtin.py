"""The built-in specs and their golden receipts.

Built-in specs are the ``*.toml`` files under ``harness/specs/``: ``default.toml`` (the README's
main job, on the trained stdlib-small model; what ``harness run-matrix`` runs), ``tiny.toml``
(the random tiny model: the quick matrix) and ``stdlib.toml`` (the acceptance matrix). Each
built-in spec ``<stem>`` has its golden CPU receipt at ``receipts/golden/<stem>.json``
(:func:`golden_path`), re-recorded only by ``harness run-matrix [--spec harness/specs/<stem>.toml]
--update-golden`` (cpu backend, no --out / --shard / --model; a cell that fails leaves the golden
as it was).
"""

from __future__ import annotations

import os

HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the harness package
REPO = os.path.dirname(HARNESS)  # the checkout primewalk is installed from
SPECS_DIR = os.path.join(HARNESS, "specs")  # the built-in specs; each has a golden receipt
GOLDEN_DIR = os.path.join(REPO, "receipts", "golden")
DEFAULT_SPEC = os.path.join(SPECS_DIR, "default.toml")


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
