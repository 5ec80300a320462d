# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Throughput
#
# Prime (prefill) tokens/s per schedule and chunk size, per-chunk wall times, and decode tokens/s
# plain vs speculative per K, for receipt A and, side by side, receipt B (by default the golden
# CPU run and the device run). Then the `harness bench` result (bench-8l on a GPU, named in the JSON): the prime
# length curve against transformers, and the goals of issues #15 and #16. Timings are
# informational: they are never part of a verdict. This notebook only reads receipts.

# %%
import os
from pathlib import Path

from harness.matrix.builtin import REPO

ROOT = Path(REPO)  # the checkout primewalk is installed from (pip install -e .)

# %% tags=["parameters"]
# Receipt paths, relative to the repo root or absolute. PRIMEWALK_RECEIPT / PRIMEWALK_RECEIPT_B
# override the defaults (the tests point them at synthetic receipts).
RECEIPT = os.environ.get("PRIMEWALK_RECEIPT", "receipts/golden/default.json")
RECEIPT_B = os.environ.get("PRIMEWALK_RECEIPT_B", "receipts/device/cuda-default.json")
# The bench JSON (harness bench); PRIMEWALK_BENCH overrides it.
BENCH = os.environ.get("PRIMEWALK_BENCH", "receipts/bench/cuda-bench.json")

# %%
# %matplotlib inline
import pandas as pd

from harness.matrix.plots import decode_figure, prime_throughput_figure, schedule_labels
from harness.matrix.receipts import load, read_receipt, receipt_pair

path_a, path_b = receipt_pair(ROOT, RECEIPT, RECEIPT_B)


def frame(path: Path) -> tuple[dict, pd.DataFrame]:
    receipt = read_receipt(path)
    cells = load(receipt)
    cells["schedule"] = cells["id"].map(schedule_labels(receipt["cells"]))
    return receipt, cells


receipt_a, cells_a = frame(path_a)
receipt_b, cells_b = frame(path_b)
device = {name: f"{r['env'].get('device')} ({r['env'].get('backend')})"
          for name, r in (("A", receipt_a), ("B", receipt_b))}
device

# %% [markdown]
# ## Prime throughput per schedule
#
# Median over prompts and K; `B / A` is the speed-up of run B.

# %%
def median_of(cells: pd.DataFrame, column: str, by: list[str]) -> pd.Series:
    if column not in cells.columns:
        return pd.Series(dtype=float, name=column)
    return cells.groupby(by, sort=False, dropna=False)[column].median()


by = ["schedule", "chunk_rows"]
prime = pd.DataFrame({"A tokens/s": median_of(cells_a, "timings.prime_tokens_per_s", by),
                      "B tokens/s": median_of(cells_b, "timings.prime_tokens_per_s", by)})
prime["B / A"] = prime["B tokens/s"] / prime["A tokens/s"]
prime.round(2)

# %%
prime_throughput_figure(receipt_a) if "timings.prime_tokens_per_s" in cells_a.columns else None

# %% [markdown]
# ## Chunk wall times
#
# Every chunk of the tape, with its phase and rows: where the prime spends its time.

# %%
if "timings.chunk_wall_s" in cells_a.columns:
    chunks = cells_a.dropna(subset=["timings.chunk_wall_s"])[["schedule", "tape", "timings.chunk_wall_s"]]
    chunks = chunks.assign(chunk=[list(zip(t, w)) for t, w in zip(chunks["tape"], chunks["timings.chunk_wall_s"])])
    chunks = chunks.explode("chunk").dropna(subset=["chunk"])
    chunks["phase"] = [c[0][0] for c in chunks["chunk"]]
    chunks["rows"] = [c[0][1] for c in chunks["chunk"]]
    chunks["ms per row"] = [1e3 * c[1] / max(c[0][1], 1) for c in chunks["chunk"]]
    chunk_table = chunks.groupby(["schedule", "phase"], sort=False).agg(
        chunks=("rows", "size"), rows=("rows", "sum"), ms_per_row=("ms per row", "median")).round(3)
else:
    chunk_table = "receipt A records no chunk wall times"
chunk_table

# %% [markdown]
# ## Decode: plain vs speculative

# %%
decode = pd.DataFrame({
    "A plain": median_of(cells_a, "timings.decode_tokens_per_s", ["k", "sampling"]),
    "A speculative": median_of(cells_a, "timings.spec_tokens_per_s", ["k", "sampling"]),
    "B plain": median_of(cells_b, "timings.decode_tokens_per_s", ["k", "sampling"]),
    "B speculative": median_of(cells_b, "timings.spec_tokens_per_s", ["k", "sampling"]),
})
decode["A speed-up"] = decode["A speculative"] / decode["A plain"]
decode["B speed-up"] = decode["B speculative"] / decode["B plain"]
decode.round(2)

# %%
has_decode = any(c in cells_a.columns for c in ("timings.decode_tokens_per_s", "timings.spec_tokens_per_s"))
decode_figure(receipt_a) if has_decode else None

# %% [markdown]
# ## bench-8l: prime time vs prompt length
#
# `harness bench` primes 4,096 to 131,072 tokens with primewalk (exact mode, in chunks) and with
# transformers fp32 and bf16. `oom`: out of device memory; `skipped`: the run's time box.
# Both axes are logarithmic.

# %%
import json

from harness.gpu import bench_report

bench_path = Path(BENCH) if Path(BENCH).is_absolute() else ROOT / BENCH
bench = json.loads(bench_path.read_text()) if bench_path.exists() else {}
has_curve = bool(bench.get("prime_curve"))
if not bench:
    print(f"note: no bench result at {bench_path}")
elif not has_curve:
    print(f"note: {BENCH} (schema {bench.get('schema_version', 1)}, {bench.get('created')}) predates the length "
          f"curve; refresh it with: bash tools/device_run.sh OUT bench")
curve = pd.DataFrame(bench.get("prime_curve", [])).set_index("tokens") if has_curve else None
curve

# %%
bench_report.prime_curve_figure(bench) if has_curve else None

# %% [markdown]
# ## Goals of issues #15 and #16
#
# `met` is `n/a` where the run could not measure the goal (for example bf16-resident decode
# before the engine has it).

# %%
goals = bench.get("goals") or {}
if goals and all(isinstance(g, dict) for g in goals.values()):
    goal_table = pd.DataFrame.from_dict(goals, orient="index")[["value", "goal", "met"]]
else:  # schema 1: name -> met
    goal_table = pd.DataFrame({"met": goals}) if goals else "no goals recorded"
goal_table
