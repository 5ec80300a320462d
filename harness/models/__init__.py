"""Embedded models. ``tiny`` (random weights, CI-sized) is the default of every command."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def model_path(name: str = "tiny") -> str:
    return os.path.join(HERE, name)


def default_model_path() -> str:
    return model_path("tiny")
