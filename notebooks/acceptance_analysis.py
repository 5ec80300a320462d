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
# # MTP acceptance
#
# How often the MTP head's drafts are accepted: per-position acceptance rates, mean acceptance
# length (1 + accepted / drafts) and the accept-count histogram per K, as vLLM defines them.
# Greedy acceptance must not depend on the prefill schedule or on the device; the last cells
# check both. This notebook only reads receipts.

# %%
import os
import sys
from pathlib import Path


def repo_root() -> Path:
    """The primewalk checkout above the working directory (Jupyter starts in the notebook's folder)."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "harness" / "receipts.py").is_file():
            return folder
    raise FileNotFoundError(f"no primewalk checkout (harness/receipts.py) above {Path.cwd()}")


ROOT = repo_root()
sys.path.insert(0, str(ROOT))

# %% tags=["parameters"]
# Receipt paths, relative to the repo root or absolute. PRIMEWALK_RECEIPT / PRIMEWALK_RECEIPT_B
# override the defaults (the tests point them at synthetic receipts).
# Default: the trained stdlib-small model (its MTP head has learned, so acceptance means
# something) on the H200, against the same matrix on the CPU twin.
RECEIPT = os.environ.get("PRIMEWALK_RECEIPT", "receipts/device/h200-stdlib.json")
RECEIPT_B = os.environ.get("PRIMEWALK_RECEIPT_B", "receipts/stdlib/cpu.json")

# %%
# %matplotlib inline
import pandas as pd

from harness.plots import acceptance_figure, acceptance_len_figure
from harness.receipts import load, read_receipt, receipt_pair

path_a, path_b = receipt_pair(ROOT, RECEIPT, RECEIPT_B)

receipt_a = read_receipt(path_a)
cells = load(receipt_a)
cells_b = load(path_b)
has_acceptance = "acceptance.drafts" in cells.columns and cells["acceptance.drafts"].notna().any()
print(f"A: {path_a} ({len(cells)} cells); acceptance recorded: {has_acceptance}")

# %% [markdown]
# ## Per K
#
# Counts are summed over every cell of one K and sampling (every schedule decodes the same
# continuation, so the rates are those of one decode, weighted by drafts).

# %%
def per_k(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (k, sampling), group in frame.dropna(subset=["acceptance.drafts"]).groupby(["k", "sampling"]):
        drafts = group["acceptance.drafts"].sum()
        accepted = group["acceptance.accepted"].sum()
        positions = [sum(p[i] * d for p, d in zip(group["acceptance.per_position"], group["acceptance.drafts"]))
                     / drafts for i in range(int(k))]
        hist = [sum(h[i] for h in group["acceptance.histogram"]) for i in range(int(k) + 1)]
        rows.append({"k": k, "sampling": sampling, "cells": len(group), "drafts": drafts,
                     "accepted": accepted, "mean_acceptance_length": 1 + accepted / drafts,
                     "per_position": [round(p, 3) for p in positions],
                     "histogram (0..K accepted)": hist})
    return pd.DataFrame(rows)


per_k(cells) if has_acceptance else "receipt A records no acceptance"

# %%
acceptance_figure(receipt_a) if has_acceptance else None

# %%
acceptance_len_figure(receipt_a) if has_acceptance else None

# %% [markdown]
# ## Schedule independence
#
# For greedy decoding the accept-count histogram of one prompt and K must be the same under
# every schedule. Rows below are (prompt, K) pairs where it is not.

# %%
if has_acceptance:
    greedy = cells[cells["sampling"] == "greedy"].dropna(subset=["acceptance.drafts"])
    spread = greedy.assign(hist=greedy["acceptance.histogram"].map(str)).groupby(["prompt", "k"])["hist"].nunique()
    print("acceptance is schedule independent" if (spread <= 1).all() else "acceptance depends on the schedule:")
    display_frame = spread[spread > 1].rename("distinct histograms").to_frame()
else:
    display_frame = None
display_frame

# %% [markdown]
# ## A vs B
#
# Acceptance counts are compared fields: the same cell must accept the same drafts on both runs.

# %%
keys = ["id", "acceptance.drafts", "acceptance.accepted"]
if has_acceptance and all(k in cells_b.columns for k in keys):
    both = cells[keys].merge(cells_b[keys], on="id", how="outer", suffixes=(" A", " B"), indicator=True)
    differ = both[(both["_merge"] != "both")
                  | (both["acceptance.drafts A"] != both["acceptance.drafts B"])
                  | (both["acceptance.accepted A"] != both["acceptance.accepted B"])]
    print(f"{len(differ)} of {len(both)} cells differ in acceptance between A and B")
    comparison = differ
else:
    comparison = "one of the receipts records no acceptance"
comparison
