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
# length (1 + accepted / drafts) and the accept-count histogram per K, as vLLM defines them, on
# the trained stdlib-small model (its MTP head has learned, chained drafts included, so acceptance
# means something): its acceptance matrix (`harness/specs/stdlib.toml`, K = 1..4) and the default
# matrix's golden (`harness/specs/default.toml`, K = 1..3). Greedy acceptance must not depend on
# the prefill schedule or on the device; the last cells check both. This notebook only reads
# receipts.

# %%
import os
from pathlib import Path

from harness.matrix.builtin import REPO

ROOT = Path(REPO)  # the checkout primewalk is installed from (pip install -e .)

# %% tags=["parameters"]
# Receipt paths, relative to the repo root or absolute. PRIMEWALK_RECEIPT / PRIMEWALK_RECEIPT_B
# override the defaults (the tests point them at synthetic receipts).
# Defaults: A is the stdlib-small acceptance matrix on the CPU twin, B the same matrix on a
# GPU (the receipt names its device); DEFAULT_GOLDEN is the default matrix's golden receipt (the same model, CPU twin).
RECEIPT = os.environ.get("PRIMEWALK_RECEIPT", "receipts/stdlib/cpu.json")
RECEIPT_B = os.environ.get("PRIMEWALK_RECEIPT_B", "receipts/device/cuda-stdlib.json")
DEFAULT_GOLDEN = os.environ.get("PRIMEWALK_RECEIPT_DEFAULT", "receipts/golden/default.json")

# %%
# %matplotlib inline
import pandas as pd

from harness.matrix.plots import acceptance_figure, acceptance_len_figure
from harness.matrix.receipts import acceptance_by_k, load, read_receipt, receipt_pair

path_a, path_b = receipt_pair(ROOT, RECEIPT, RECEIPT_B)

receipt_a = read_receipt(path_a)
receipt_b = read_receipt(path_b)
cells = load(receipt_a)
cells_b = load(receipt_b)
has_acceptance = "acceptance.drafts" in cells.columns and cells["acceptance.drafts"].notna().any()
print(f"A: {path_a} ({len(cells)} cells, model {receipt_a['model']['name']}); "
      f"acceptance recorded: {has_acceptance}")
same_weights = receipt_a["model"]["weights_sha256"] == receipt_b["model"]["weights_sha256"]
if not same_weights:
    print(f"note: B ({path_b}) was recorded with other weights than A; the A vs B comparison below "
          "says nothing until B is re-recorded")
# drafts among a draft vocabulary (run-matrix --draft-vocab): acceptance is that vocabulary's
draft_vocab = {name: (r.get("env") or {}).get("draft_vocab") for name, r in (("A", receipt_a), ("B", receipt_b))}
for name, dv in draft_vocab.items():
    if dv:
        print(f"{name} drafted among a draft vocabulary of {dv['size']} ids (sha256 {dv['ids_sha256'][:16]})")
same_drafting = draft_vocab["A"] == draft_vocab["B"]

# %% [markdown]
# ## Per K
#
# Counts are summed over every cell of one K and sampling (every schedule decodes the same
# continuation, so the rates are those of one decode, weighted by drafts).

# %%
def per_k(receipt: dict) -> pd.DataFrame:
    rows = [{"k": k, "sampling": sampling, "cells": p["cells"], "drafts": p["drafts"], "accepted": p["accepted"],
             "mean_acceptance_length": p["mean_acceptance_length"],
             "per_position": [round(r, 3) for r in p["per_position"]],
             "histogram (0..K accepted)": p["histogram"]}
            for (k, sampling), p in sorted(acceptance_by_k(receipt["cells"]).items())]
    return pd.DataFrame(rows)


per_k(receipt_a) if has_acceptance else "receipt A records no acceptance"

# %%
acceptance_figure(receipt_a) if has_acceptance else None

# %%
acceptance_len_figure(receipt_a) if has_acceptance else None

# %% [markdown]
# ## The default matrix
#
# The README's main job (`harness run-matrix`) runs the same model on two other held-out excerpts
# and a short prompt, K = 1..3, under every prime schedule; its golden receipt records the same
# acceptance counts.

# %%
default_path = ROOT / DEFAULT_GOLDEN
if default_path.exists():
    receipt_default = read_receipt(default_path)
    cells_default = load(receipt_default)
    print(f"default golden: {default_path} ({len(cells_default)} cells, model {receipt_default['model']['name']})")
    default_has = ("acceptance.drafts" in cells_default.columns
                   and cells_default["acceptance.drafts"].notna().any())
    default_table = per_k(receipt_default) if default_has else "the default golden records no acceptance"
else:
    print(f"note: no default golden at {default_path} (harness run-matrix --update-golden)")
    default_table = None
default_table

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
# Acceptance counts are compared fields: the same cell must accept the same drafts on both runs
# (when both drafted among the same vocabulary: the whole one, or the same `--draft-vocab`).

# %%
keys = ["id", "acceptance.drafts", "acceptance.accepted"]
if not same_weights:
    comparison = "A and B were recorded with different weights"
elif not same_drafting:
    comparison = "A and B drafted among different draft vocabularies: their acceptance differs by design"
elif has_acceptance and all(k in cells_b.columns for k in keys):
    both = cells[keys].merge(cells_b[keys], on="id", how="outer", suffixes=(" A", " B"), indicator=True)
    differ = both[(both["_merge"] != "both")
                  | (both["acceptance.drafts A"] != both["acceptance.drafts B"])
                  | (both["acceptance.accepted A"] != both["acceptance.accepted B"])]
    print(f"{len(differ)} of {len(both)} cells differ in acceptance between A and B")
    comparison = differ
else:
    comparison = "one of the receipts records no acceptance"
comparison
