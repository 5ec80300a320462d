"""Argument helpers shared by the tools in this folder (imported as ``_cli``: a tool's own folder
is first on ``sys.path`` when it runs as a script)."""

import argparse


def int_list(lo=1, hi=None, what="integers"):
    """An argparse ``type``: a comma-separated list of integers from ``lo`` to ``hi`` (no upper
    bound when None), as a tuple; anything else is a one-line usage error naming ``what``."""
    span = f"from {lo}" + ("" if hi is None else f" to {hi}")

    def parse(text):
        try:
            vals = tuple(int(v) for v in text.split(","))
        except ValueError:
            vals = ()
        if not vals or min(vals) < lo or (hi is not None and max(vals) > hi):
            raise argparse.ArgumentTypeError(f"{text!r}: comma-separated {what} {span}")
        return vals

    return parse
