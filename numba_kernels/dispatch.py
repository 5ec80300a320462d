"""Which CUDA kernel serves a launch: the one table of row-count thresholds.

Every kernel of an op keeps the op's canonical order, so the choice never changes the bits
(DESIGN.md §3); it only picks the fastest launch for the shape. The CPU twin has one loop per op.

- ``linear``: R ≤ ``GEMV_MAX_ROWS`` (8: decode, verify, MTP drafts) → ``gemv``, built for the
  row bucket of ``GEMV_BUCKETS`` that holds R (R = 3 runs the 4-row kernel, R = 6, 7 the 8-row
  one); more rows → ``gemm`` (128×128 tiles);
- ``attention``: R ≤ ``SPLIT_MAX_ROWS`` (16), when the per-tile statistics fit
  ``SPLIT_MAX_STATS_BYTES`` → ``attention_split`` (split-KV decode: one block per 64-key tile and
  KV head, for all the query vectors of its group; the block size is the smallest of
  ``SPLIT_BLOCKS`` that holds R · hq / hkv vectors); otherwise ``attention_prime`` (query tiles of
  64 rows); head dims too large for their shared memory → ``attention_tiled``;
- ``gdn_recurrence``: every row count → ``gdn_recurrence_fast``;
- ``conv1d_silu``: R ≤ ``CONV_SEQ_MAX_ROWS`` → one thread per channel over the rows (one launch),
  more rows → one thread per (row, channel), then the state.

The per-shape configuration inside a kernel (the GEMV's warp shape per (N, K, R), the GEMM's
loaders) is its family's (:func:`numba_kernels.linear.gemv_pick`, ...). ``linear_naive``,
``attention_tiled`` and ``gdn_recurrence_naive`` stay callable on their own (reference launches,
device checks).
"""

from __future__ import annotations

GEMV_MAX_ROWS = 8
CONV_SEQ_MAX_ROWS = 8  # conv1d_silu: one thread per channel up to this many rows, one per (row, channel) past it
GEMV_BUCKETS = (1, 2, 4, 5, 8)  # rows a GEMV kernel is built for (the last is GEMV_MAX_ROWS)
SPLIT_MAX_ROWS = 16
SPLIT_MAX_STATS_BYTES = 256 * 1024 * 1024
SPLIT_BLOCKS = ("s8", "s16", "s32", "s64")  # split-KV blocks by the query vectors they hold

# op: ((most rows, kernel), ..., (None, kernel for the rest))
TABLE = {
    "linear": ((GEMV_MAX_ROWS, "gemv"), (None, "gemm")),
    "attention": ((SPLIT_MAX_ROWS, "attention_split"), (None, "attention_prime")),
    "gdn_recurrence": ((None, "gdn_recurrence_fast"),),
}


def pick(op: str, R: int) -> str:
    """The kernel of ``TABLE[op]`` for a launch of R rows."""
    for most, name in TABLE[op]:
        if most is None or R <= most:
            return name
    raise AssertionError(f"dispatch table of {op} has no catch-all row")


# ---- exact-bf16 (issue #19) ---------------------------------------------------------------------
# Rows are independent inside an MMA, so a decode row padded to 16 is the same row of a prime. On a
# GPU numba_kernels.cuda sets "linear_mma" (and "linear_flag_mma", the lm head: the bf16 GEMV
# checking each output as it stores it; "linear_swiglu_mma", an MLP's input: the bf16 GEMV storing
# the SwiGLU of its gate and up chains) to the tensor-core kernels (mma_tc.linear_mma_tc: from
# mma_tc.GEMM_MIN_ROWS rows the block-tiled GEMM, fewer one warp per 16×8 tile) and "attention_mma"
# to mma_tc.attention_mma_gpu: up to SPLIT_MAX_ROWS rows split-KV on the tensor cores
# (attention_mma_sk, when its buffers fit SPLIT_MAX_STATS_BYTES), more on the tensor cores (attention_mma_tc, head_dim a
# multiple of 4 up to mma_tc.ATT_TC_MAX_D), else one block per (row, head) (attention_mma_tiled).
# Under the simulator (no inline PTX) linear_mma, and the MoE ops everywhere, run the naive kernels
# (the twin's emulation, one thread per output) and attention_mma split-KV or attention_mma_tiled.
MMA_KERNELS: dict = {}
