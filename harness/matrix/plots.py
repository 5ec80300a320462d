"""Figures of a receipt, saved next to it: ``<stem>.<name>.png``.

=================  ===========================================================================
verdicts           grid: rows = prompt / K / sampling, columns = the schedules as the spec writes
                   them (a fractional split is one column; each square shows the row it resolved
                   to); bitwise green, tolerance amber, fail red with max ulp and max |Δ|; a
                   schedule that does not apply to a prompt is drawn "n/a" (hatched), a cell
                   that is in another shard grey; a bisected failure names the layer,
                   op and row where it started
acceptance         acceptance rate per draft position, a line per K
acceptance_len     mean acceptance length (1 + accepted / drafts) vs K, a line per sampling
prime_throughput   prime tokens/s per schedule variant and chunk size (median, min-max whiskers)
decode             decode tokens/s, plain vs speculative, per K; each pair marked with the ratio
                   speculative / plain, and titled a speed-up or a slow-down as the data say
=================  ===========================================================================

The acceptance figures give their values in the legend rather than beside the points (where
they overlapped), and dodge their lines sideways a little so that equal values stay visible.

Figures are built on the Agg canvas under matplotlib's default style with sizes that depend
only on the data, and saved at dpi 150 without a ``Software`` stamp, so identical receipts give
identical bytes. A figure whose data the receipt lacks is skipped with a reason, not an error.
"""

from __future__ import annotations

import io
import os
import statistics
import sys

import matplotlib.style
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..atomic import write_bytes_atomic
from ..engine.config import LINEAR
from ..engine.trace import ATTN_OPS, DENSE_OPS, GDN_OPS, MTP_HEAD, MTP_TAIL, TRUNK_HEAD, layer_ops
from ..errors import PrimewalkError
from .receipts import acceptance_by_k, cell_order_key, read_receipt

DPI = 150
STATUS_COLOURS = {"bitwise": "#2ca02c", "tolerance": "#f2a900", "fail": "#d62728", "n/a": "#ffffff",
                  "other shard": "#c7c7c7"}
CHUNK_COLOURS = ("#595959", "#006ba4", "#ff800e", "#5f9ed1", "#c85200", "#a2c8ec", "#ffbc79")
_SEVERITY = ("bitwise", "tolerance", "fail")  # the worst verdict wins when two cells share a square


class NoData(Exception):
    """The receipt lacks what a figure draws; the message says what."""


# ---------------------------------------------------------------------------------------------
# labels


def _cells(receipt: dict) -> list[dict]:
    return sorted(receipt.get("cells") or [], key=cell_order_key)


def _unique(values) -> list:
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _multi_chunk_variants(cells: list[dict]) -> set:
    """Variants that ran at more than one chunk size: their labels show the chunk size."""
    seen = {}
    for c in cells:
        seen.setdefault(c.get("variant"), set()).add(c.get("chunk_rows"))
    return {v for v, chunks in seen.items() if len(chunks) > 1}


def variant_label(cell: dict, show_chunk: bool = False) -> str:
    """``split@64``, ``split+checkpoint@64,96``, ``batched c16``: the schedule of a cell.

    Several numeric arguments are listed in increasing order (they are positions in the
    prompt); otherwise as ``name=value`` sorted by name, so a receipt read back from JSON (keys
    sorted) and the dict it was written from give the same label.
    """
    text = str(cell.get("variant"))
    args = cell.get("variant_args") or {}
    if len(args) == 1:
        text += f"@{next(iter(args.values()))}"
    elif args and all(isinstance(v, (int, float)) for v in args.values()):
        text += "@" + ",".join(str(v) for v in sorted(args.values()))
    elif args:
        text += "@" + ",".join(f"{k}={args[k]}" for k in sorted(args))
    if show_chunk:
        text += f" c{cell['chunk_rows']}" if cell.get("chunk_rows") else " (no chunks)"
    return text


def spec_schedule(cell: dict, spec: dict | None) -> str | None:
    """The schedule of ``cell`` as the spec writes it (``split@0.5``): the cell's ``schedule``
    (schema 2), else found in a schema-1 receipt's spec, else None. A fractional point gives
    different rows in prompts of different lengths; this label is the same for all of them."""
    if cell.get("schedule"):
        return str(cell["schedule"])
    args = cell.get("variant_args") or {}
    name = cell.get("variant")
    if not args or not isinstance(spec, dict):
        return None
    entries = [v for v in spec.get("variants") or [] if isinstance(v, dict) and v.get("name") == name]
    if name in ("split", "checkpoint"):
        given = [x for v in entries for x in (v.get("at") or [])]
        row = args.get(name)
        if row in [x for x in given if isinstance(x, int)]:
            return f"{name}@{row}"
        fractions = [x for x in given if isinstance(x, float)]
        return f"{name}@{fractions[0]:g}" if len(fractions) == 1 else None
    keys = [k for k in ("split", "checkpoint") if k in args]
    matching = [v for v in entries if all(k in v for k in keys) and not any(
        k in v for k in ("split", "checkpoint") if k not in keys)]
    if len(matching) != 1:
        return None
    return f"{name}@" + ",".join(f"{matching[0][k]:g}" if isinstance(matching[0][k], float)
                                 else str(matching[0][k]) for k in keys)


def _labeller(cells: list[dict], spec: dict | None = None):
    multi = _multi_chunk_variants(cells)

    def label(c):
        if c.get("variant") == "batched" or not c.get("variant_args"):
            return variant_label(c, c.get("variant") in multi)
        return spec_schedule(c, spec) or variant_label(c, c.get("variant") in multi)

    return label


def schedule_labels(cells: list[dict], spec: dict | None = None) -> dict:
    """``{cell id: schedule label}`` as the figures label their columns: the schedule as the spec
    writes it (``split@0.5``, see :func:`spec_schedule`; ``spec``: the receipt's, for schema-1
    cells), the chunk size shown only for variants that ran at several."""
    label = _labeller(cells, spec)
    return {c["id"]: label(c) for c in cells}


def _distinguishing(cells: list[dict], key: list[str], candidates) -> list[str]:
    """The candidate fields needed, besides ``key``, to tell rows apart (temperature only when
    one sampling ran at several)."""
    extra = []
    for name in candidates:
        seen = {}
        for c in cells:
            seen.setdefault(tuple(str(c.get(f)) for f in key + extra), set()).add(str(c.get(name)))
        if any(len(v) > 1 for v in seen.values()):
            extra.append(name)
    return extra


def _row_label(cell: dict, extra: list[str]) -> str:
    parts = [f"{cell.get('prompt')} ({cell.get('prompt_len')} tok)" if cell.get("prompt_len") else
             str(cell.get("prompt")), f"K={cell.get('k')}", str(cell.get("sampling"))]
    parts += [f"{name}={cell.get(name)}" for name in extra]
    return " · ".join(parts)


def _subtitle(receipt: dict) -> str:
    env = receipt.get("env") or {}
    model = (receipt.get("model") or {}).get("name", "?")
    return f"{model} on {env.get('device', '?')} ({env.get('backend', '?')})"


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(round(width, 2), round(height, 2)), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _clamp(v, lo, hi):
    return max(lo, min(hi, v))


# ---------------------------------------------------------------------------------------------
# figures


def _verdict_text(c: dict, column: str) -> str:
    """What a square of the verdict grid says: ``=`` (``oracle``) for bitwise, the row a
    fractional point resolved to, and max ulp / max |Δ| where the cell is not bitwise."""
    v = c["verdict"]
    text = "oracle" if c.get("oracle") == c.get("id") else {"bitwise": "=", "tolerance": "tol.", "fail": "fail"}[v["status"]]
    args = c.get("variant_args") or {}
    rows = ",".join(str(args[k]) for k in ("split", "checkpoint") if k in args)
    if rows and not column.endswith("@" + rows):
        text += f" @{rows}"
    if v["status"] != "bitwise":
        if v.get("max_ulp") is not None:
            text += f"\n{v['max_ulp']:,} ulp"
        if v.get("max_abs") is not None:
            text += f"\n|Δ| {v['max_abs']:.2g}"
    return text


def verdicts_figure(receipt: dict) -> Figure:
    cells = _cells(receipt)
    if not cells:
        raise NoData("the receipt has no cells")
    label = _labeller(cells, receipt.get("spec"))
    extra = _distinguishing(cells, ["prompt", "k", "sampling"], ("model", "mode", "temperature", "seed"))
    row_of = {id(c): _row_label(c, extra) for c in cells}
    col_of = {id(c): label(c) for c in cells}
    rows = _unique(row_of[id(c)] for c in cells)
    cols = _unique(col_of[id(c)] for c in cells)
    grid = {}
    for c in cells:
        key = (row_of[id(c)], col_of[id(c)])
        if key not in grid or (_SEVERITY.index(c["verdict"]["status"])
                               > _SEVERITY.index(grid[key]["verdict"]["status"])):
            grid[key] = c
    # a whole receipt has every cell its spec expands: a square without a cell is a schedule that
    # does not apply to that prompt (the receipt's "skipped"); in a shard it may be elsewhere
    absent = "other shard" if ((receipt.get("shard") or {}).get("count") or 1) > 1 else "n/a"
    names = list(STATUS_COLOURS)
    codes = [[names.index(grid[(r, k)]["verdict"]["status"]) if (r, k) in grid else names.index(absent)
              for k in cols] for r in rows]
    failing = any(grid[key]["verdict"]["status"] != "bitwise" for key in grid)

    fig = _figure(_clamp(3.4 + 0.85 * len(cols), 7, 26),
                  _clamp(2.4 + (0.45 if failing else 0.3) * len(rows), 4, 40))
    ax = fig.add_subplot()
    cmap = ListedColormap([STATUS_COLOURS[n] for n in names])
    ax.imshow(codes, cmap=cmap, norm=BoundaryNorm([i - 0.5 for i in range(len(names) + 1)], len(names)),
              aspect="auto", interpolation="nearest")
    for i, r in enumerate(rows):
        for j, k in enumerate(cols):
            c = grid.get((r, k))
            if c is None:
                if absent == "n/a":
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///",
                                           edgecolor="#d0d0d0", linewidth=0))
                    ax.text(j, i, "n/a", ha="center", va="center", fontsize=7, color="#808080")
                continue
            status = c["verdict"]["status"]
            ax.text(j, i, _verdict_text(c, k) + failure_start(c), ha="center", va="center", fontsize=7 if status == "bitwise" else 6,
                    color="white" if status == "fail" else "black", linespacing=1.1)
    ax.set_xticks(range(len(cols)), cols, rotation=35, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xticks([j - 0.5 for j in range(1, len(cols))], minor=True)
    ax.set_yticks([i - 0.5 for i in range(1, len(rows))], minor=True)
    ax.grid(which="minor", color="#9a9a9a" if absent == "n/a" else "white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("prefill schedule (as the spec gives it; @row: where a fraction of the prompt fell)")
    ax.set_ylabel("prompt · K · sampling")
    ax.set_title(f"Verdict of each schedule against its oracle — {_subtitle(receipt)}", fontsize=10)
    counts = {n: sum(row.count(names.index(n)) for row in codes) for n in names}
    shown = [n for n in names if counts[n] or n in _SEVERITY]
    handles = []
    for n in shown:
        text = {"n/a": "not applicable", "other shard": "in another shard"}.get(n, n)
        handles.append(Patch(facecolor=STATUS_COLOURS[n], edgecolor="#9a9a9a", hatch="///" if n == "n/a" else None,
                             label=f"{text} ({counts[n]})"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    return fig


def failure_start(cell: dict) -> str:
    """Where a failed cell's run first parted from its oracle's (``run-matrix --bisect-failures``),
    as a second line for its square: ``\n2:recurrence r70``; empty without a bisection."""
    d = (cell.get("bisect") or {}).get("divergence")
    if cell["verdict"]["status"] != "fail" or not d:
        return ""
    return f"\n{d['layer']}:{d['op']} r{d['row']}"


def _by(cells, key):
    groups = {}
    for c in cells:
        groups.setdefault(key(c), []).append(c)
    return groups


def _dodge(index: int, count: int, width: float = 0.12) -> float:
    """The sideways offset of line ``index`` of ``count`` so that equal points do not hide each
    other (all within ``width``)."""
    return 0.0 if count <= 1 else (index - (count - 1) / 2) * width / (count - 1)


def acceptance_figure(receipt: dict) -> Figure:
    cells = [c for c in _cells(receipt)
             if (c.get("acceptance") or {}).get("per_position") and (c["acceptance"].get("drafts") or 0) > 0]
    if not cells:
        raise NoData("no cell has acceptance.per_position with drafts > 0")
    samplings = _unique(c.get("sampling") for c in cells)
    groups = acceptance_by_k(cells)
    fig = _figure(8, 4.5)
    ax = fig.add_subplot()
    styles = ("-", "--", ":", "-.")
    kmax = 0
    keys = sorted(groups, key=lambda g: (g[0], samplings.index(g[1])))
    for index, (k, sampling) in enumerate(keys):
        rates = groups[(k, sampling)]["per_position"]
        n = len(rates)
        xs = [i + 1 + _dodge(index, len(keys)) for i in range(n)]
        kmax = max(kmax, n)
        name = f"K={k}" + (f" {sampling}" if len(samplings) > 1 else "")
        ax.plot(xs, rates, marker="o", markersize=5, linestyle=styles[samplings.index(sampling) % len(styles)],
                label=f"{name}: " + " ".join(f"{r:.2f}" for r in rates))
    ax.set_xticks(range(1, kmax + 1))
    ax.set_xlim(0.7, kmax + 0.3)
    ax.set_ylim(0.0, 1.05)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (accepted / drafts)")
    ax.set_title(f"MTP acceptance rate per draft position — {_subtitle(receipt)}", fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(title="drafts per step: rate at\nposition 1, 2, …", fontsize=8, title_fontsize=8,
               loc="outside right upper")
    return fig


def acceptance_len_figure(receipt: dict) -> Figure:
    cells = [c for c in _cells(receipt) if (c.get("acceptance") or {}).get("drafts")
             and c["acceptance"].get("accepted") is not None]
    if not cells:
        raise NoData("no cell has acceptance.drafts and acceptance.accepted")
    fig = _figure(8, 4.5)
    ax = fig.add_subplot()
    ks = sorted({c.get("k") for c in cells})
    pooled = acceptance_by_k(cells)
    samplings = _unique(c.get("sampling") for c in cells)
    for index, sampling in enumerate(samplings):
        ks_s = sorted(k for k, s in pooled if s == sampling)
        xs = [k + _dodge(index, len(samplings), 0.08) for k in ks_s]
        ys = [pooled[(k, sampling)]["mean_acceptance_length"] for k in ks_s]
        ax.plot(xs, ys, marker="o", markersize=5,
                label=f"{sampling}: " + ", ".join(f"K={k} {y:.2f}" for k, y in zip(ks_s, ys)))
    ax.plot(ks, [k + 1 for k in ks], linestyle="--", color="grey", label="K + 1 (every draft accepted)")
    ax.set_xticks(ks)
    ax.set_xlim(min(ks) - 0.3, max(ks) + 0.3)
    ax.set_ylim(0.9, max(ks) + 1.3)
    ax.set_xlabel("K (drafts per step)")
    ax.set_ylabel("mean acceptance length (1 + accepted / drafts)")
    ax.set_title(f"Mean acceptance length vs K — {_subtitle(receipt)}", fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(title="sampling: mean length per K", fontsize=8, title_fontsize=8, loc="outside right upper")
    return fig


def _bars(ax, groups, colours):
    """Median bars with min-max whiskers; value printed above each bar."""
    for x, (values, colour) in enumerate(zip(groups, colours)):
        med = statistics.median(values)
        ax.bar(x, med, color=colour, width=0.7)
        ax.errorbar(x, med, yerr=[[med - min(values)], [max(values) - med]], color="black", capsize=3,
                    linewidth=0.8)
        ax.annotate(f"{med:,.0f}" if med >= 10 else f"{med:.2g}", (x, max(values)),
                    textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)


def prime_throughput_figure(receipt: dict) -> Figure:
    cells = [c for c in _cells(receipt)
             if isinstance((c.get("timings") or {}).get("prime_tokens_per_s"), (int, float))]
    if not cells:
        raise NoData("no cell has timings.prime_tokens_per_s")
    groups = _by(cells, _labeller(cells, receipt.get("spec")))
    labels = list(groups)
    chunks = sorted({c.get("chunk_rows") or 0 for c in cells})
    colour_of = {ch: CHUNK_COLOURS[i % len(CHUNK_COLOURS)] for i, ch in enumerate(chunks)}
    values = [[c["timings"]["prime_tokens_per_s"] for c in groups[label]] for label in labels]
    colours = [colour_of[groups[label][0].get("chunk_rows") or 0] for label in labels]
    fig = _figure(_clamp(2.5 + 0.7 * len(labels), 7, 24), 5)
    ax = fig.add_subplot()
    _bars(ax, values, colours)
    flat = [v for vs in values for v in vs if v > 0]
    if flat and max(flat) / min(flat) > 30:
        ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_xlabel("prefill schedule")
    ax.set_ylabel("prime tokens/s" + (" (log scale)" if ax.get_yscale() == "log" else ""))
    ax.set_title(f"Prime throughput per schedule (median over prompts and K, whiskers min–max)\n"
                 f"{_subtitle(receipt)}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.legend(handles=[Patch(color=colour_of[ch], label=f"{ch} rows" if ch else "no chunks")
                        for ch in chunks], title="chunk size", fontsize=8, title_fontsize=8,
               loc="outside right upper")
    return fig


def decode_figure(receipt: dict) -> Figure:
    def has(c, name):
        return isinstance((c.get("timings") or {}).get(name), (int, float))

    cells = [c for c in _cells(receipt) if has(c, "decode_tokens_per_s") or has(c, "spec_tokens_per_s")]
    if not cells:
        raise NoData("no cell has timings.decode_tokens_per_s or timings.spec_tokens_per_s")
    samplings = _unique(c.get("sampling") for c in cells)
    groups = _by(cells, lambda c: (c.get("k"), c.get("sampling")))
    keys = sorted(groups, key=lambda g: (g[0], samplings.index(g[1])))
    fig = _figure(_clamp(3 + 1.1 * len(keys), 7, 20), 4.5)
    ax = fig.add_subplot()
    width = 0.38
    series = (("decode_tokens_per_s", "plain decode", "#7f7f7f", -width / 2),
              ("spec_tokens_per_s", "speculative (MTP drafts)", "#1f77b4", width / 2))
    medians = {}
    for name, label, colour, dx in series:
        xs, ys = [], []
        for x, key in enumerate(keys):
            vals = [c["timings"][name] for c in groups[key] if has(c, name)]
            if vals:
                xs.append(x + dx)
                ys.append(statistics.median(vals))
                medians[(key, name)] = ys[-1]
        if xs:
            ax.bar(xs, ys, width=width, color=colour, label=label)
    ratios = []
    for x, key in enumerate(keys):
        plain, spec = medians.get((key, "decode_tokens_per_s")), medians.get((key, "spec_tokens_per_s"))
        if plain and spec:
            r = spec / plain
            ratios.append(r)
            ax.annotate(f"×{r:.2f}", (x + width / 2, spec), textcoords="offset points",
                        xytext=(0, 3), ha="center", fontsize=8, color=SPEEDUP_COLOURS[r >= 1.0])
    ax.set_xticks(range(len(keys)),
                  [f"K={k}" + (f"\n{s}" if len(samplings) > 1 else "") for k, s in keys])
    ax.margins(y=0.15)
    ax.set_xlabel("K (drafts per step)")
    ax.set_ylabel("decode tokens/s (median over cells)")
    why = ("\nspeculation pays only when verifying K + 1 rows costs about as much as decoding one; "
           "here it costs more (see the README)" if ratios and max(ratios) < 1.0 else "")
    ax.set_title(f"{decode_verdict(ratios)} — {_subtitle(receipt)}{why}", fontsize=10 if not why else 9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig


SPEEDUP_COLOURS = {True: "#1a7f37", False: "#b3261e"}  # ratio >= 1: faster; < 1: slower


def decode_verdict(ratios: list) -> str:
    """The decode figure's title, as the ratios (speculative / plain tokens/s) say: a speed-up,
    a slow-down, or mixed."""
    head = "Decode throughput, speculative vs plain"
    if not ratios:
        return head
    lo, hi = min(ratios), max(ratios)
    if lo >= 1.0:
        return f"{head}: a speed-up of ×{lo:.2f}–{hi:.2f}" if hi > lo else f"{head}: a speed-up of ×{lo:.2f}"
    if hi < 1.0:
        return (f"{head}: speculation is slower here (×{lo:.2f}–{hi:.2f} of plain)" if hi > lo
                else f"{head}: speculation is slower here (×{lo:.2f} of plain)")
    return f"{head}: ×{lo:.2f}–{hi:.2f} (× < 1: slower than plain, > 1: faster)"


FIGURES = (
    ("verdicts", verdicts_figure),
    ("acceptance", acceptance_figure),
    ("acceptance_len", acceptance_len_figure),
    ("prime_throughput", prime_throughput_figure),
    ("decode", decode_figure),
)


# ---------------------------------------------------------------------------------------------
# files


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def render(receipt: dict, stem: str, figures=FIGURES) -> tuple[list[str], list[tuple[str, str]]]:
    """Write every figure of ``receipt`` (``figures``: (name, builder) pairs) as
    ``<stem>.<name>.png``; returns (written, skipped)."""
    written, skipped = [], []
    with matplotlib.style.context("default"):
        for name, build in figures:
            try:
                fig = build(receipt)
            except NoData as e:
                skipped.append((name, str(e)))
                continue
            path = f"{stem}.{name}.png"
            try:
                write_bytes_atomic(path, png_bytes(fig))
            except OSError as e:
                raise PrimewalkError(f"cannot write {path}: {e.strerror or e}") from None
            written.append(path)
    return written, skipped


def plot_receipt(path: str, quiet: bool = False) -> list[str]:
    """Draw the figures of the receipt at ``path`` next to it; returns the PNG paths written.

    A figure the receipt has no data for is skipped, with a note on stderr unless ``quiet``.
    """
    path = os.fspath(path)
    receipt = read_receipt(path)
    written, skipped = render(receipt, os.path.splitext(path)[0])
    if not quiet:
        for name, why in skipped:
            print(f"plot: skipped {name}: {why}", file=sys.stderr)
    return written


# a bisect heat map's columns: every layer kind's ops in execution order (head, mixers, MLPs, tail)
OP_COLUMNS = (TRUNK_HEAD + MTP_HEAD + GDN_OPS[:-1] + ATTN_OPS[1:] + DENSE_OPS[:-1]
              + layer_ops(LINEAR, True, True)[len(GDN_OPS) + 1:] + MTP_TAIL)


def bisect_figure(res: dict) -> Figure:
    """A ``harness bisect`` result as a layer × op heat map: how many entries (op output rows,
    over all rows and occurrences) differ at each op, on a log scale; the first divergence is
    framed. Layers top to bottom and ops left to right in execution order (``trunk`` holds the
    embedding, final norm and logits, ``mtp`` the head and its layer)."""
    import numpy as np
    from matplotlib.patches import Rectangle

    layers = []
    for names in res["ops"].values():
        for name in names:
            layer = name.split(":", 1)[0]
            layers += [layer] if layer not in layers else []
    present = {name.split(":", 1)[1] for names in res["ops"].values() for name in names}
    ops = [op for op in dict.fromkeys(OP_COLUMNS) if op in present] + sorted(present - set(OP_COLUMNS))
    grid = np.full((len(layers), len(ops)), np.nan)
    valid = np.zeros_like(grid, dtype=bool)
    for names in res["ops"].values():
        for name in names:
            layer, op = name.split(":", 1)
            valid[layers.index(layer), ops.index(op)] = True
    grid[valid] = 0
    for o in (res.get("spread") or {}).get("by_op", []):
        grid[layers.index(o["layer"]), ops.index(o["op"])] += o["entries"]
    fig = _figure(_clamp(1.2 + 0.32 * len(ops), 6, 16), _clamp(1.6 + 0.3 * len(layers), 3, 12))
    ax = fig.add_subplot()
    im = ax.imshow(np.log10(1 + grid), cmap="magma_r", aspect="auto", vmin=0)
    fig.colorbar(im, ax=ax, label="log10(1 + differing entries)", shrink=0.8)
    d = res.get("divergence")
    if d is not None:
        i, j = layers.index(d["layer"]), ops.index(d["op"])
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#1f77b4", linewidth=2.5))
    ax.set_xticks(range(len(ops)), ops, rotation=60, ha="right", rotation_mode="anchor", fontsize=7)
    ax.set_yticks(range(len(layers)), layers, fontsize=8)
    ax.set_xlabel("op (execution order)")
    ax.set_ylabel("layer")
    title = "no divergence" if d is None else (f"first divergence {d['layer']}:{d['op']} row {d['row']} "
                                               f"col {d['col']} ({d['ulp']} ulp)")
    ax.set_title(f"{title}\na: {res['a']['run']}  b: {res['b']['run']}", fontsize=8)
    return fig
