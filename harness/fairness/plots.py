"""Figures of a fairness receipt, saved next to it as ``<stem>.<name>.png``.

===========  ====================================================================================
timeline     one panel per policy, one lane per session: prime chunks (trunk, MTP fill) and
             decode units (speculative rounds, decode steps) as bars on the scheduler clock;
             arrivals as ticks, first events (first generated token) as dots
first_event  peers' first-event latency per policy (every peer a dot, p50 and p95 marked) and
             the long prompt's time to first token per policy against its time alone
===========  ====================================================================================

Same conventions as the matrix figures (:mod:`harness.matrix.plots`): the Agg canvas, the
default style, sizes that depend only on the data, PNG at dpi 150 without a ``Software`` stamp,
so identical receipts give identical bytes.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from matplotlib.patches import Patch

from ..matrix.plots import NoData, _clamp, _figure, _subtitle, render
from .receipt import read_fairness_receipt

UNIT_COLOURS = {"mtp-trunk": "#1f4e9c", "mtp-draft-fill": "#7fa7dc", "spec": "#ff7f0e", "decode": "#2ca02c"}
UNIT_NAMES = {"mtp-trunk": "prime chunk (trunk)", "mtp-draft-fill": "prime chunk (MTP fill)",
              "spec": "speculative round", "decode": "decode step"}


def _first_events(receipt: dict, label: str) -> dict:
    """{session name: (arrival_s, first_event_s)} of one run."""
    return {c["session"]: (c["timings"]["arrival_s"], c["timings"]["first_event_s"])
            for c in receipt["cells"] if c.get("run") == label and c.get("timings")}


def timeline_figure(receipt: dict):
    pols = [p for p in receipt.get("policies") or [] if p.get("timeline")]
    if not pols:
        raise NoData("no policy has a timeline")
    sessions = receipt["sessions"]
    n = len(sessions)
    end = max(u[5] for p in pols for u in p["timeline"])
    fig = _figure(11, _clamp(1.2 + len(pols) * (0.9 + 0.22 * n), 4, 40))
    axes = fig.subplots(len(pols), 1, sharex=True, squeeze=False)[:, 0]
    for ax, pol in zip(axes, pols):
        bars = {}
        for s, kind, phase, rows, t0, t1 in pol["timeline"]:
            key = phase if kind == "prime" else kind
            bars.setdefault((s, key), []).append((t0, t1 - t0))
        for (s, key), spans in sorted(bars.items()):
            ax.broken_barh(spans, (s - 0.35, 0.7), facecolors=UNIT_COLOURS.get(key, "#7f7f7f"),
                           edgecolor="white", linewidth=0.3)
        events = _first_events(receipt, pol["label"])
        for i, s in enumerate(sessions):
            arrival, first = events.get(s["name"], (None, None))
            if arrival is not None:
                ax.plot([arrival], [i], marker="|", markersize=12, color="black", linestyle="none")
            if first is not None:
                ax.plot([first], [i], marker="o", markersize=4, color="#d62728", linestyle="none")
        ax.set_yticks(range(n), [s["name"] for s in sessions], fontsize=7)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_xlim(0, end * 1.01)
        p95 = pol.get("peers_p95_s")
        ax.set_title(f"{pol['label']}: long prompt's first token {pol['long_ttft_s']:.3g} s"
                     + (f", peers' first-event p95 {p95:.3g} s" if p95 is not None else "")
                     + f", longest hold {pol['longest_hold_s']:.3g} s", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("scheduler clock (s, the measured time of each unit)")
    kinds = [k for k in UNIT_COLOURS if any((u[2] if u[1] == "prime" else u[1]) == k
                                            for p in pols for u in p["timeline"])]
    handles = [Patch(color=UNIT_COLOURS[k], label=UNIT_NAMES[k]) for k in kinds]
    handles += [axes[0].plot([], [], marker="|", color="black", linestyle="none", label="arrival")[0],
                axes[0].plot([], [], marker="o", color="#d62728", linestyle="none", label="first token")[0]]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    fig.suptitle(f"Who holds the device — {_subtitle(receipt)}", fontsize=10)
    return fig


def first_event_figure(receipt: dict):
    pols = receipt.get("policies") or []
    if not pols:
        raise NoData("the receipt has no policies")
    fig = _figure(_clamp(4 + 1.6 * len(pols), 8, 20), 4.8)
    left, right = fig.subplots(1, 2, width_ratios=[2, 1])
    values = [(p.get("peers_first_event_latency_s") or {}).get("values") or [] for p in pols]
    flat = [v for vs in values for v in vs if v > 0]
    for x, (p, vs) in enumerate(zip(pols, values)):
        if not vs:
            continue
        offsets = np.linspace(-0.18, 0.18, len(vs)) if len(vs) > 1 else np.zeros(1)
        left.plot(x + offsets, vs, marker="o", markersize=4, linestyle="none", color="#1f77b4", alpha=0.8)
        pct = p["peers_first_event_latency_s"]
        for name, style, dy, va in (("p50", ":", -1, "top"), ("p95", "-", 1, "bottom")):
            left.hlines(pct[name], x - 0.3, x + 0.3, colors="black", linestyles=style, linewidth=1)
            left.annotate(f"{name} {pct[name]:.3g} s", (x + 0.3, pct[name]), textcoords="offset points",
                          xytext=(3, dy), va=va, fontsize=7)
    if not flat:
        left.text(0.5, 0.5, "no peers", transform=left.transAxes, ha="center", va="center")
    elif max(flat) / min(flat) > 30:
        left.set_yscale("log")
    labels = [p["label"] for p in pols]
    left.set_xticks(range(len(pols)), labels)
    left.set_xlim(-0.6, len(pols) - 0.1)
    left.set_ylabel("peers' first-event latency (s)" + (" (log scale)" if left.get_yscale() == "log" else ""))
    left.set_title("Peers: arrival to first generated token", fontsize=9)
    left.grid(axis="y", alpha=0.3)
    ttft = [p["long_ttft_s"] for p in pols]
    right.bar(range(len(pols)), ttft, color="#1f4e9c", width=0.6)
    alone = (receipt.get("alone") or {}).get("long_ttft_s")
    if alone:
        right.axhline(alone, color="grey", linestyle="--", linewidth=1, label=f"alone {alone:.3g} s")
        right.legend(fontsize=7, loc="lower right")
    for x, v in enumerate(ttft):
        right.annotate(f"{v:.3g} s" + (f"\n×{v / alone:.3f}" if alone else ""), (x, v),
                       textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    right.set_xticks(range(len(pols)), labels)
    right.margins(y=0.2)
    right.set_ylabel("long prompt's time to first token (s)")
    right.set_title("The long prime's cost", fontsize=9)
    right.grid(axis="y", alpha=0.3)
    fig.suptitle(f"First events per policy — {_subtitle(receipt)}", fontsize=10)
    return fig


FIGURES = (("timeline", timeline_figure), ("first_event", first_event_figure))


def plot_fairness(path: str, quiet: bool = False) -> list:
    """Draw the figures of the fairness receipt at ``path`` next to it; returns the PNG paths."""
    path = os.fspath(path)
    if path.endswith(".csv"):
        path = os.path.splitext(path)[0] + ".json"
    receipt = read_fairness_receipt(path)
    written, skipped = render(receipt, os.path.splitext(path)[0], FIGURES)
    if not quiet:
        for name, why in skipped:
            print(f"plot: skipped {name}: {why}", file=sys.stderr)
    return written
