"""Which CUDA kernel serves a launch: the one table of row-count thresholds.

Every kernel of an op keeps the op's canonical order, so the choice never changes the bits
(DESIGN.md §3); it only picks the fastest launch for the shape. The CPU twin has one loop per op.

- ``linear``: R ≤ ``GEMV_MAX_ROWS`` (4: decode, verify, MTP drafts) → the GEMV of version
  ``GEMV_VERSION`` (``gemv_v1`` / ``gemv_v3``); more rows → ``gemm`` (64×64 tiles);
- ``attention``: R ≤ ``SPLIT_MAX_ROWS`` (16), when the per-tile statistics fit
  ``SPLIT_MAX_STATS_BYTES`` → ``attention_split`` (split-KV); otherwise ``attention_tiled`` (one
  block per row and head).

``linear_naive``, ``attention_tiled`` and ``gdn_recurrence_naive`` stay callable on their own
(reference launches, device checks). ``GEMV_VERSION`` comes from ``PRIMEWALK_LINEAR`` (``v1`` or
``v3``, default ``v3``) when :mod:`numba_kernels.cuda` is imported; set it here to pick another.
"""

from __future__ import annotations

import os

GEMV_MAX_ROWS = 4
SPLIT_MAX_ROWS = 16
SPLIT_MAX_STATS_BYTES = 256 * 1024 * 1024
GEMV_VERSIONS = ("v1", "v3")

# op: ((most rows, kernel), ..., (None, kernel for the rest))
TABLE = {
    "linear": ((GEMV_MAX_ROWS, "gemv"), (None, "gemm")),
    "attention": ((SPLIT_MAX_ROWS, "attention_split"), (None, "attention_tiled")),
}

GEMV_VERSION = "v3"


def pick(op: str, R: int) -> str:
    """The kernel of ``TABLE[op]`` for a launch of R rows."""
    for most, name in TABLE[op]:
        if most is None or R <= most:
            return name
    raise AssertionError(f"dispatch table of {op} has no catch-all row")


def gemv_version_from_env(env=os.environ) -> str:
    """``PRIMEWALK_LINEAR`` (v1 | v3, default v3); anything else is a ValueError."""
    v = env.get("PRIMEWALK_LINEAR", "v3")
    if v not in GEMV_VERSIONS:
        raise ValueError(f"PRIMEWALK_LINEAR={v!r}: expected v1 or v3")
    return v


# ---- exact-bf16 (issue #19) ---------------------------------------------------------------------
# One kernel per op at every row count (rows are independent inside an MMA, so a decode row padded
# to 16 is the same row of a prime). On a GPU numba_kernels.cuda sets "linear_mma" to the
# tensor-core kernel (mma_tc.linear_mma_tc); the other ops, and everything under the simulator,
# run the naive kernels (the twin's emulation, one thread per output).
MMA_KERNELS: dict = {}
