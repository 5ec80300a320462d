"""User-facing errors.

Every problem a user can cause (a bad config, a truncated checkpoint, a token id out of range, an
unusable matrix spec) is raised as a :class:`PrimewalkError` whose message is one line. The CLI
prints it to stderr and exits with code 2; it never shows a traceback for these.
"""


class PrimewalkError(Exception):
    """A one-line, user-facing error. The CLI exits 2 on it."""


class ConfigError(PrimewalkError):
    """The model config is invalid or unsupported."""


class CheckpointError(PrimewalkError):
    """The checkpoint cannot be read or does not match its config."""


class InputError(PrimewalkError):
    """Bad token ids, empty prompts, capacity overflow and the like."""


class NumericError(PrimewalkError):
    """NaN or Inf detected in weights or activations."""
