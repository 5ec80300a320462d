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
# # Prime fairness
#
# What a fairness receipt says (`harness fairness`): a long prompt primes while peer sessions
# arrive; each scheduling policy orders the units of work differently (`drain`: a started prime
# runs to its end; `yield`: after each prime chunk every ready peer gets a unit; `interval@n`: n
# decode units per prime chunk). The verdict is bitwise: every session's digests must be the same
# under every policy and alone. The measures are the peers' first-event latency and the long
# prompt's time to first token. This notebook only reads the receipt.

# %%
import os
from pathlib import Path

from harness.matrix.builtin import REPO

ROOT = Path(REPO)  # the checkout primewalk is installed from (pip install -e .)

# %% tags=["parameters"]
# The receipt, relative to the repo root or absolute; PRIMEWALK_FAIRNESS_RECEIPT overrides it. The
# H200 run (receipts/fairness/h200-bench-8l.json) when it is there, else the CPU spec's receipt.
RECEIPT = os.environ.get("PRIMEWALK_FAIRNESS_RECEIPT", "receipts/fairness/h200-bench-8l.json")
FALLBACK = "receipts/fairness/tiny.json"

# %%
# %matplotlib inline
import pandas as pd

from harness.fairness.plots import first_event_figure, timeline_figure
from harness.fairness.receipt import read_fairness_receipt
from harness.matrix.receipts import load

path = ROOT / RECEIPT
if not path.exists():
    print(f"note: no receipt at {path} yet; reading {FALLBACK}")
    path = ROOT / FALLBACK
receipt = read_fairness_receipt(path)
cells = load(receipt)
env, alone = receipt["env"], receipt["alone"]
pd.Series({"receipt": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
           "created": receipt["created"], "backend": env.get("backend"), "device": env.get("device"),
           "git": (env.get("git_sha") or "?")[:12] + (" (dirty)" if env.get("git_dirty") else ""),
           "model": receipt["model"]["name"], "weights": receipt["model"]["weights_sha256"][:16],
           "sessions": len(receipt["sessions"]), "policies": ", ".join(p["label"] for p in receipt["policies"]),
           "long prompt alone: time to first token (s)": alone["long_ttft_s"],
           "arrivals in": alone["arrival_unit"]})

# %% [markdown]
# ## The sessions and the bitwise verdict
#
# One row per session, one column per run: `alone` is each session by itself on the engine (its
# reference); every other column is all sessions together under one policy. `bitwise` means the
# prime logits, boundary captures, final cache, continuation and tape equal the session alone.

# %%
print(f"verdict: {receipt['verdict']['status']} ({receipt['verdict']['cells']} cells)")
runs = list(dict.fromkeys(cells["run"]))
grid = cells.pivot_table(index="session", columns="run", values="verdict.status", aggfunc="first", sort=False)
sessions = pd.DataFrame(receipt["sessions"]).set_index("name")[["role", "prompt_len", "arrival_s", "k",
                                                                  "sampling", "max_new_tokens"]]
sessions.join(grid.reindex(columns=runs))

# %%
failed = cells[cells["verdict.status"] != "bitwise"]
if failed.empty:
    print("every session is bitwise equal across policies and alone")
failed[["id", "verdict.detail", "verdict.max_abs", "verdict.max_ulp"]]

# %% [markdown]
# ## What each policy does
#
# Peers' first-event latency: arrival to first generated token (p95 by linear interpolation).
# The long prompt's time to first token, also over its time alone. A *tick* is one unit of work;
# the *hold* is the longest stretch of one session's units while another session was waiting.

# %%
measures = pd.DataFrame(receipt["policies"]).set_index("label")[
    ["peers_p50_s", "peers_p95_s", "peers_max_s", "long_ttft_s", "long_ttft_over_alone", "longest_tick_s",
     "longest_hold_s", "makespan_s", "units"]]
if "drain" in measures.index:
    measures["peers_p95 / drain"] = measures["peers_p95_s"] / measures.loc["drain", "peers_p95_s"]
    measures["long_ttft / drain"] = measures["long_ttft_s"] / measures.loc["drain", "long_ttft_s"]
measures

# %%
goals = pd.DataFrame(receipt["goals"], columns=["metric", "policy", "baseline", "max_ratio", "ratio", "met"])
print("no goals in this spec" if goals.empty else goals.to_string(index=False))

# %%
first_event_figure(receipt)

# %%
timeline_figure(receipt)

# %% [markdown]
# ## Per session, per policy
#
# Times on the scheduler clock (the measured time of each unit): arrival, first event, finish,
# and the device time of the session's own units.

# %%
cols = ["run", "session", "timings.arrival_s", "timings.first_event_s", "timings.first_event_latency_s",
        "timings.finish_s", "timings.busy_s", "timings.units", "acceptance.mean_acceptance_length"]
cells[cells["run"] != "alone"][[c for c in cols if c in cells.columns]]
