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
# # Receipts overview
#
# What a matrix receipt says: which run it is, the verdict of every schedule cell against its
# oracle, and what drifted between two receipts (by default the golden CPU run and the device
# run). This notebook only reads receipts; `harness run-matrix` writes them.

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

# %%
# %matplotlib inline
import pandas as pd

from harness.matrix.diff import diff_receipts
from harness.matrix.plots import schedule_labels, verdicts_figure
from harness.matrix.receipts import load, read_receipt, receipt_pair

path_a, path_b = receipt_pair(ROOT, RECEIPT, RECEIPT_B)

receipt_a = read_receipt(path_a)
receipt_b = read_receipt(path_b)
cells = load(receipt_a)
cells["schedule"] = cells["id"].map(schedule_labels(receipt_a["cells"]))


def describe(receipt: dict, path: Path) -> dict:
    env = receipt["env"]
    return {"receipt": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
            "created": receipt["created"], "backend": env.get("backend"), "device": env.get("device"),
            "git": (env.get("git_sha") or "?")[:12] + (" (dirty)" if env.get("git_dirty") else ""),
            "model": receipt["model"]["name"], "weights": receipt["model"]["weights_sha256"][:16],
            "spec_hash": receipt["spec_hash"][:16], "cells": len(receipt["cells"])}


pd.DataFrame([describe(receipt_a, path_a), describe(receipt_b, path_b)], index=["A", "B"]).T

# %% [markdown]
# ## Verdicts of receipt A
#
# One row per prompt, K and sampling; one column per prefill schedule. `bitwise` is the exact-mode
# promise; `tolerance` is allowed only where a weaker contract is declared; `fail` is a bug.

# %%
print(cells["verdict.status"].value_counts().to_string())
order = list(dict.fromkeys(cells["schedule"]))
table = cells.pivot_table(index=["prompt", "k", "sampling"], columns="schedule",
                          values="verdict.status", aggfunc="first", sort=False)
table.reindex(columns=order).fillna("—")

# %%
not_bitwise = cells[cells["verdict.status"] != "bitwise"]
if not_bitwise.empty:
    print("every cell is bitwise equal to its oracle")
not_bitwise[["id", "verdict.status", "verdict.max_abs", "verdict.max_ulp", "verdict.bound",
             "verdict.detail"]]

# %%
verdicts_figure(receipt_a)

# %% [markdown]
# ## Drift between A and B
#
# Compared fields only (digests, verdicts, tapes, yields, continuations, acceptance counts).
# Receipts of two backends are compared on their digests alone, as `harness diff --digests-only`
# does: a verdict is judged per device, the numbers themselves must agree.

# %%
cross_device = receipt_a["env"].get("backend") != receipt_b["env"].get("backend")
result = diff_receipts(receipt_a, receipt_b, digests_only=cross_device)
print(result.summary)
pd.DataFrame([{"cell": r.cell, "field": r.field, "A": r.a, "B": r.b, "note": r.note} for r in result.rows],
             columns=["cell", "field", "A", "B", "note"])

# %% [markdown]
# ## Where a failure starts: `harness bisect`
#
# A `fail` says that a cell parted from its oracle, not where. `harness bisect` runs both with
# every op's output rows hashed and names the first (layer, op, row, column) that differs, in
# the order row, pass (trunk, then the MTP head), occurrence, op. `run-matrix --bisect-failures`
# stores that in each failed cell's `bisect` field (listed here when receipt A has any).
#
# Below, a deliberate fault: run b flips the lowest bit of layer 2's DeltaNet recurrence output
# at row 20 (column 0) of a 40-token prompt primed in 16-row chunks; run a primes it token by
# token. Bisect names exactly that place, and the heat map shows how far the one-ulp difference
# spreads through later ops and rows (log scale; the first divergence is framed).

# %%
from harness.matrix.bisect import bisect, headline, schedule_sides
from harness.matrix.plots import bisect_figure

bisected = [c for c in receipt_a["cells"] if c.get("bisect")]
for c in bisected:
    print(f"{c['id']}: {headline(c['bisect'])}")

side_a, side_b, _ = schedule_sides(None, 40, "tokenwise", "batched:16", k=2, max_new=4)
demo = bisect(side_a, side_b, fault="2:recurrence:20")
print(headline(demo))
spread = demo["spread"]
print(f"spread: {spread['entries']} entries in {spread['rows']} rows and {spread['ops']} ops")
bisect_figure(demo)
