"""Embedded models, named by their folder here: ``tiny`` (random weights, CI-sized; the default of
every command but ``run-matrix``), ``tiny-q35`` (random weights in the Qwen3.5-MoE layout, bf16)
and ``stdlib-small`` (trained on the Python standard library; the default matrix's model).

Wherever a command or a spec takes a checkpoint folder (``--model``, a matrix spec's
``[models]``, a fairness spec's ``model``), one of these bare names means the embedded model;
a folder of the same name is given as a path (``./tiny``)."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
EMBEDDED_NAMES = ("tiny", "tiny-q35", "stdlib-small")


def model_path(name: str = "tiny") -> str:
    return os.path.join(HERE, name)


def default_model_path() -> str:
    return model_path("tiny")


def resolve(path: str, base_dir: str | None = None) -> str:
    """The checkpoint folder that ``path`` names: an embedded model for one of
    :data:`EMBEDDED_NAMES`, else ``path`` itself, relative to ``base_dir`` when given and
    ``path`` is relative."""
    if path in EMBEDDED_NAMES:
        return model_path(path)
    if base_dir is None or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(base_dir, path))
