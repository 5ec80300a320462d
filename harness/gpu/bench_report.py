"""The device-free half of ``harness bench``: the time box, the out-of-memory guard, the prime
length curve, the goals of issues #15 and #16, the curve's figure, and the tables.

Everything here runs on a CPU (``tests/test_bench.py`` drives it with fakes); what measures
on the GPU is in :mod:`harness.gpu.bench`.

JSON (``receipts/bench/*.json``, ``schema_version`` 2) written by the bench and read here:

- ``prime_curve``: one entry per prompt length, ``{"tokens", "primewalk_s", "hf_fp32_s",
  "hf_bf16_s", "peak_bytes"}``; a time is seconds, ``"oom"`` (out of device memory, caught and
  freed), ``"skipped"`` (time box or ``--skip``) or ``"error"``.
- ``goals``: ``{name: {"value", "goal", "met"}}``; ``met`` is true / false, or ``"n/a"`` with
  value ``"n/a"`` when the run could not measure it.
"""

from __future__ import annotations

import gc
import math
import time

OOM, SKIPPED, ERROR, NA = "oom", "skipped", "error", "n/a"
GB = 10 ** 9
#: issue #15: the 131,072-token prime's peak device memory may exceed the weights by this much
PEAK_ALLOWANCE_BYTES = 12 * GB
CURVE_LENGTHS = (4096, 16384, 32768, 131072)
PROFILE_LENGTHS = (4096, 32768)
RUNNERS = ("primewalk", "hf_fp32", "hf_bf16")


# ------------------------------------------------------------------------------------------------
# the time box and the out-of-memory guard
# ------------------------------------------------------------------------------------------------
class Budget:
    """Seconds left of a time box. ``clock`` is injectable (tests)."""

    def __init__(self, seconds: float, clock=time.perf_counter):
        self.seconds, self.clock, self.t0 = float(seconds), clock, clock()

    def left(self) -> float:
        return self.seconds - (self.clock() - self.t0)

    def sub(self, fraction: float) -> "Budget":
        """A budget of ``fraction`` of what is left now, on the same clock."""
        return Budget(max(0.0, fraction * self.left()), self.clock)


def is_oom(e: BaseException) -> bool:
    """Out of device memory: torch's ``OutOfMemoryError`` or a CUDA driver error saying so."""
    if type(e).__name__ in ("OutOfMemoryError", "MemoryError"):
        return True
    text = str(e).lower()
    return "out of memory" in text or "cuda_error_out_of_memory" in text


def free_device_memory() -> None:
    """Drop what an out-of-memory run left: Python garbage, torch's cache, numba's pending frees."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover - torch absent or no GPU
        pass
    try:
        from numba import cuda

        if cuda.is_available():
            cuda.current_context().deallocations.clear()
    except Exception:  # pragma: no cover
        pass


def guarded(fn, errors: dict, name: str, free=free_device_memory):
    """``fn()``, or ``"oom"`` after an out-of-memory error (freed, not a failure), or ``"error"``
    after any other exception (recorded in ``errors[name]``)."""
    try:
        return fn()
    except Exception as e:  # one measure failing must not lose the rest of a one-shot run
        if is_oom(e):
            errors[name] = f"oom: {type(e).__name__}: {str(e)[:200]}"
            free()
            return OOM
        errors[name] = f"{type(e).__name__}: {str(e)[:500]}"
        print(f"[bench] {name} failed: {errors[name]}", flush=True)
        free()
        return ERROR


def predict_s(n: int, done: list) -> float | None:
    """A conservative guess of one prime of ``n`` tokens from the last measured (tokens,
    seconds): quadratic in the length (attention), None when nothing was measured."""
    pts = [(m, t) for m, t in done if isinstance(t, float) and t > 0]
    if not pts:
        return None
    m, t = pts[-1]
    return t * (n / m) ** 2


def new_curve(lengths) -> list:
    """``prime_curve`` entries for ``lengths``, every time ``"skipped"`` until a run fills it."""
    return [{"tokens": int(n), **{f"{k}_s": SKIPPED for k in RUNNERS}, "peak_bytes": None} for n in lengths]


def run_curve(curve: list, name: str, fn, budget: Budget | None, errors: dict, peak=None,
              free=free_device_memory, runs=lambda n: 1) -> list:
    """Fill ``curve``'s ``<name>_s`` (``name`` from :data:`RUNNERS`) with ``fn(n)`` seconds, in
    order of length. A length is skipped when ``budget`` (a :class:`Budget`) has no time left or
    :func:`predict_s` times ``runs(n)`` (the timed runs and warm-ups ``fn(n)`` makes) says it
    would not fit; once a length ran out of memory the longer ones are
    recorded ``"oom"`` without running. ``peak(n)``: bytes the run of ``n`` tokens used, called
    right after a successful run (into ``peak_bytes``)."""
    done, oomed = [], False
    for e in curve:
        n, key = e["tokens"], f"{name}_s"
        guess = predict_s(n, done)
        guess = None if guess is None else guess * runs(n)
        if oomed:
            e[key] = OOM
        elif budget is not None and (budget.left() <= 0 or (guess is not None and guess > budget.left())):
            e[key] = SKIPPED
            errors[f"{name} prime {n}"] = (f"time box: predicted {guess:.1f} s, {budget.left():.1f} s left"
                                           if guess is not None else "time box: no time left")
        else:
            t = guarded(lambda: fn(n), errors, f"{name} prime {n}", free)
            e[key] = t
            oomed = t == OOM
            done.append((n, t))
            if peak is not None and isinstance(t, float):
                e["peak_bytes"] = int(peak(n))
        print(f"[bench] prime {n} {name}: {_fmt(e[key])}", flush=True)
    return curve


def _fmt(v, unit=" s", digits=3) -> str:
    return f"{v:.{digits}f}{unit}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


# ------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------
def causal_attention_flops(n: int, heads: int, head_dim: int, layers: int, start: int = 0) -> int:
    """FLOPs of causal attention over ``n`` query rows after ``start`` cached positions: row i
    sees ``start + i + 1`` keys; QKᵀ and PV are 2·D FLOPs per (query, key, head) each."""
    keys = n * start + n * (n + 1) // 2
    return 4 * head_dim * heads * layers * keys


def gemm_flops(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


# ------------------------------------------------------------------------------------------------
# goals
# ------------------------------------------------------------------------------------------------
def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _sub(d: dict, key: str) -> dict:
    """``d[key]`` when it is a dict (a block of the bench JSON), else an empty dict."""
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def _goal(value, goal: str, ok) -> dict:
    if value is None:
        return {"value": NA, "goal": goal, "met": NA}
    return {"value": value, "goal": goal, "met": bool(ok(value))}


def curve_entry(curve, n):
    return next((e for e in curve if e["tokens"] == n), {})


def goals_block(r: dict) -> dict:
    """Every goal of issues #15 (long-context prime), #16 (decode, speculative decoding), #14
    (bf16-resident decode) and #19 (the exact-bf16 mode) from a
    bench result ``r``: ``{name: {"value", "goal", "met"}}``."""
    curve, m = r.get("prime_curve", []), r.get("primewalk", {})
    g = {}

    def ratio(n):
        e = curve_entry(curve, n)
        ours, hf = _num(e.get("primewalk_s")), _num(e.get("hf_fp32_s"))
        return None if ours is None or hf is None or ours <= 0 else hf / ours  # tokens/s ratio

    g["prime_4096_vs_hf_fp32"] = _goal(ratio(4096), ">= 0.6 x HF fp32 tokens/s", lambda v: v >= 0.6)
    g["prime_16384_vs_hf_fp32"] = _goal(ratio(16384), ">= 1.0 x HF fp32 tokens/s", lambda v: v >= 1.0)
    g["prime_32768_s"] = _goal(_num(curve_entry(curve, 32768).get("primewalk_s")), "<= 2.5 s", lambda v: v <= 2.5)
    g["prime_131072_s"] = _goal(_num(curve_entry(curve, 131072).get("primewalk_s")), "<= 30 s", lambda v: v <= 30)
    peak, wts = _num(curve_entry(curve, 131072).get("peak_bytes")), _num(m.get("weights_on_device_bytes"))
    over = None if peak is None or wts is None else peak - wts
    g["prime_131072_peak_over_weights_bytes"] = _goal(over, f"<= {PEAK_ALLOWANCE_BYTES // GB} GB",
                                                      lambda v: v <= PEAK_ALLOWANCE_BYTES)
    g["attention_tflops_32768"] = _goal(_num(m.get("attention_tflops_32768")), ">= 15 TFLOP/s", lambda v: v >= 15)
    gemm = _sub(m, "gemm")
    g["gemm_tflops"] = _goal(_num(gemm.get("tflops")), ">= 25 TFLOP/s on the bench shapes",
                             lambda v: v >= 25)
    floor = _num(r.get("decode_floor_ms"))

    def over_floor(key, f=floor):
        v = _num(m.get(key))
        return None if v is None or not f else v / f

    g["decode_512_over_floor"] = _goal(over_floor("decode_512_ms_per_token"), "<= 1.5 x floor", lambda v: v <= 1.5)
    g["decode_32k_over_floor"] = _goal(over_floor("decode_32k_ms_per_token"), "<= 2 x floor", lambda v: v <= 2.0)
    spec = {k: v for k, v in (m.get("spec") or {}).items() if isinstance(v, dict)}
    # a verify or draft step is timed alone, the host waiting for it: against one decode step
    # timed alike (stepwise: decode_step calls, the host's argmax between them) -- the median of
    # its steps where the JSON has them (the draft and verify figures are medians too; from
    # 2026-12-06), else their mean, else (before 2026-12-05) the one decode figure there was
    dec = (_num(_sub(m, "decode_512_stepwise_step_ms").get("median")) or _num(m.get("decode_512_stepwise_ms_per_token"))
           or _num(m.get("decode_512_ms_per_token")))
    verify = [_num(v.get("verify_step_ms")) for k, v in sorted(spec.items()) if int(k[1:]) + 1 <= 5]
    verify = [v for v in verify if v is not None]
    g["verify_step_over_decode"] = _goal(max(verify) / dec if verify and dec else None,
                                         "<= 1.2 x one decode step (K+1 <= 5 rows, worst K)", lambda v: v <= 1.2)
    d3 = _num((spec.get("k3") or {}).get("draft_step_ms"))
    g["draft_step_k3_over_decode"] = _goal(d3 / dec if d3 is not None and dec else None,
                                           "<= 0.5 x one decode step", lambda v: v <= 0.5)
    # the same step drafting among a draft vocabulary (harness.engine.draft), where the bench timed it
    dv = _sub(spec.get("k3") or {}, "draft_vocab")
    d3v = _num(dv.get("draft_step_ms"))
    if d3v is not None:
        g["draft_step_k3_draft_vocab_over_decode"] = _goal(
            d3v / dec if dec else None, f"<= 0.5 x one decode step (drafting among {dv.get('size')} ids)",
            lambda v: v <= 0.5)
    bf = _sub(m, "bf16")
    bf_ms, bf_floor = _num(bf.get("decode_512_ms_per_token")), _num(r.get("decode_floor_bf16_ms"))
    g["bf16_decode_512_over_bf16_floor"] = _goal(bf_ms / bf_floor if bf_ms is not None and bf_floor else None,
                                                 "<= 1.5 x bf16 floor (bench-8l rounded to bf16, resident as bf16 bits)",
                                                 lambda v: v <= 1.5)
    # issue #19: the exact-bf16 mode (bf16 tensor-core MMA) beside transformers bf16
    mm = _sub(m, "mma")
    ours4, hf4 = _num(mm.get("prime_4096_tokens_per_s")), _num(((r.get("hf") or {}).get("bf16") or {}).get(
        "prime_4096_tokens_per_s"))
    g["mma_prime_4096_vs_hf_bf16"] = _goal(ours4 / hf4 if ours4 is not None and hf4 else None,
                                           ">= 1.0 x HF bf16 tokens/s (exact-bf16)", lambda v: v >= 1.0)
    g["mma_prime_32768_s"] = _goal(_num(mm.get("prime_32768_s")), "<= 0.7 s (exact-bf16)", lambda v: v <= 0.7)
    mm_ms, mm_floor = _num(mm.get("decode_512_ms_per_token")), _num(mm.get("bf16_decode_floor_ms"))
    g["mma_decode_512_over_bf16_floor"] = _goal(mm_ms / mm_floor if mm_ms is not None and mm_floor else None,
                                                "<= 1.5 x bf16 weight floor (exact-bf16)", lambda v: v <= 1.5)
    return g


# ------------------------------------------------------------------------------------------------
# the figure
# ------------------------------------------------------------------------------------------------
CURVE_LABELS = {"primewalk": "primewalk (exact, fp32)", "hf_fp32": "transformers fp32", "hf_bf16": "transformers bf16"}


def prime_curve_figure(r: dict):
    """Log-log prime time vs prompt length, one line per runner; out-of-memory points marked."""
    from ..matrix.plots import _figure

    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    curve = r.get("prime_curve", [])
    for name, style in zip(RUNNERS, ("o-", "s--", "^:")):
        pts = [(e["tokens"], e[f"{name}_s"]) for e in curve if _num(e.get(f"{name}_s")) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=CURVE_LABELS[name])
        ooms = [e["tokens"] for e in curve if e.get(f"{name}_s") == OOM]
        if ooms and pts:
            ax.plot(ooms, [pts[-1][1]] * len(ooms), "x", color=ax.lines[-1].get_color(),
                    label=f"{CURVE_LABELS[name]}: out of memory")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("prime time (s)")
    ax.set_title(f"{r.get('model', '?')} on {r.get('device', '?')}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    return fig


def write_curve_plot(r: dict, json_path: str) -> str:
    """Write :func:`prime_curve_figure` next to the JSON (``<stem>.prime_curve.png``, the
    plots' naming); returns the path."""
    import os

    import matplotlib

    from ..atomic import write_bytes_atomic
    from ..matrix.plots import png_bytes

    path = os.path.splitext(json_path)[0] + ".prime_curve.png"
    with matplotlib.style.context("default"):
        write_bytes_atomic(path, png_bytes(prime_curve_figure(r)))
    return path


# ------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------
def _v(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if abs(v) >= 1e6:
        return f"{v / 2 ** 30:.2f} GiB" if float(v).is_integer() else f"{v:.3g}"
    return f"{v:.{digits}f}"


def goals_markdown(r: dict) -> str:
    """The README's table: every goal with its value and whether it is met (numbers from ``r``)."""
    rows = ["| goal | measured | target | met |", "|---|---|---|---|"]
    for name, g in (r.get("goals") or {}).items():
        if isinstance(g, dict):
            met = {True: "yes", False: "no"}.get(g["met"], str(g["met"]))
            rows.append(f"| {name} | {_v(g['value'])} | {g['goal']} | {met} |")
        else:  # schema 1: name -> bool
            rows.append(f"| {name} | | | {'yes' if g else 'no'} |")
    return "\n".join(rows)


def curve_markdown(r: dict, hf: str = "HF", oom: str = OOM, no_peak: str = "") -> str:
    """The prime length curve as a table: ``hf`` names transformers in the headers, ``oom`` is
    written for an out-of-memory point and ``no_peak`` for a missing peak."""
    rows = [f"| prompt tokens | primewalk s | {hf} fp32 s | {hf} bf16 s | primewalk peak |", "|---|---|---|---|---|"]

    def t(v):
        return oom if v == OOM else _v(v)

    for e in r.get("prime_curve", []):
        peak = e.get("peak_bytes")
        rows.append(f"| {e['tokens']:,} | {t(e.get('primewalk_s'))} | {t(e.get('hf_fp32_s'))} | "
                    f"{t(e.get('hf_bf16_s'))} | {no_peak if peak is None else f'{peak / 2 ** 30:.2f} GiB'} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------------
# the README's block: every number of the Performance section's tables, from one bench JSON
# ------------------------------------------------------------------------------------------------
README_BEGIN = "<!-- bench-tables: begin (python tools/bench_table.py --readme README.md writes this block) -->"
README_END = "<!-- bench-tables: end -->"

#: the goals in the README's order: (issue, goal name)
GOAL_ORDER = (
    ("#15", "prime_4096_vs_hf_fp32"), ("#15", "prime_16384_vs_hf_fp32"), ("#15", "prime_32768_s"),
    ("#15", "prime_131072_s"), ("#15", "prime_131072_peak_over_weights_bytes"),
    ("#15", "attention_tflops_32768"), ("#15", "gemm_tflops"),
    ("#16", "decode_512_over_floor"), ("#16", "decode_32k_over_floor"), ("#16", "verify_step_over_decode"),
    ("#16", "draft_step_k3_over_decode"), ("#16", "draft_step_k3_draft_vocab_over_decode"),
    ("#16", "bf16_decode_512_over_bf16_floor"),
    ("#19", "mma_prime_4096_vs_hf_bf16"), ("#19", "mma_prime_32768_s"), ("#19", "mma_decode_512_over_bf16_floor"),
)


#: the GPU the issues state their goals for (#15, #16 and #19: "bench-8l, H200")
GOALS_DEVICE = "H200"


def goals_device_note(r: dict) -> str:
    """A sentence for a bench that ran on another GPU than the goals' (empty on an H200): its
    ``met`` column reads that run against the targets; it does not say the issue's goal is met."""
    device = str(r.get("device") or "")
    if not device or GOALS_DEVICE in device:
        return ""
    return (f"The issues state these goals for an {GOALS_DEVICE}, and this run's device is "
            f"{device.removeprefix('cuda: ')}: `met` compares this run with the targets; it does "
            f"not say that a goal is met on an {GOALS_DEVICE}.")


def _ms(v) -> str:
    return "-" if _num(v) is None else f"{v:.3f} ms"


def _rate(v) -> str:
    return "-" if _num(v) is None else f"{v:,.0f}"


def _spec_rows(spec: dict):
    return [(int(k[1:]), v) for k, v in sorted(spec.items(), key=lambda kv: int(kv[0][1:]))
            if isinstance(v, dict) and k[1:].isdigit()]


def _goal_detail(name: str, r: dict) -> str:
    """What the README shows beside a goal's value: its unit and the measure behind it."""
    m = r.get("primewalk", {}) or {}
    mm = _sub(m, "mma")
    spec = dict(_spec_rows(m.get("spec") or {}))
    if name == "decode_512_over_floor":
        return f" ({_ms(m.get('decode_512_ms_per_token'))}/token)"
    if name == "decode_32k_over_floor":
        return f" ({_ms(m.get('decode_32k_ms_per_token'))}/token)"
    if name == "verify_step_over_decode":
        v = {k: _num(s.get("verify_step_ms")) for k, s in spec.items() if k + 1 <= 5}
        v = {k: x for k, x in v.items() if x is not None}
        if not v:
            return ""
        worst = max(v, key=v.get)
        return (f" (worst K = {worst}; verify steps {min(v.values()):.3f}-{max(v.values()):.3f} ms for "
                f"{min(v) + 1}-{max(v) + 1} rows)")
    if name == "draft_step_k3_over_decode":
        return f" ({_ms((spec.get(3) or {}).get('draft_step_ms'))})"
    if name == "draft_step_k3_draft_vocab_over_decode":
        return f" ({_ms(_sub(spec.get(3) or {}, 'draft_vocab').get('draft_step_ms'))})"
    if name == "bf16_decode_512_over_bf16_floor":
        return f" ({_ms(_sub(m, 'bf16').get('decode_512_ms_per_token'))}/token)"
    if name == "mma_decode_512_over_bf16_floor":
        return f" ({_ms(mm.get('decode_512_ms_per_token'))}/token)"
    if name == "mma_prime_4096_vs_hf_bf16":
        t, s = _num(mm.get("prime_4096_tokens_per_s")), _num(mm.get("prime_4096_s"))
        return "" if t is None else f" ({t / 1e3:.1f} k tokens/s" + ("" if s is None else f", {s:.3f} s") + ")"
    if name == "mma_prime_32768_s":
        cold = _num(mm.get("prime_32768_cold_s"))
        return "" if cold is None else f" warm ({cold:.3f} s cold)"
    return ""


def _goal_value(name: str, v) -> str:
    if _num(v) is None:
        return str(v)
    if name.endswith("_bytes"):
        return f"{v / 2 ** 30:.2f} GiB"
    if "tflops" in name:
        return f"{v:.1f} TFLOP/s"
    if name.endswith("_s"):
        return f"{v:.3f} s"
    return f"{v:.3f} ×"


def readme_markdown(r: dict, path: str = "receipts/bench/cuda-bench.json") -> str:
    """The README's Performance tables from bench result ``r`` (read from ``path``): the run and
    its anchors, the prime length curve, decode, speculative decoding and the goals -- every
    number read from ``r``, so the README cannot drift from the committed JSON
    (``tests/test_readme.py``)."""
    m = r.get("primewalk", {}) or {}
    hf = r.get("hf", {}) or {}
    sg = [_num(s.get("tflops")) for s in (r.get("sgemm") or {}).values() if isinstance(s, dict)]
    sg = [x for x in sg if x is not None]
    bw = _num(r.get("copy_bandwidth_bytes_per_s"))
    floor, floor16 = _num(r.get("decode_floor_ms")), _num(r.get("decode_floor_bf16_ms"))
    out = [
        f"Measured at commit `{str(r.get('commit'))[:7]}` ({str(r.get('created'))[:10]}; {r.get('device')}, "
        f"CUDA {r.get('driver')}; torch {r.get('torch')}, transformers {r.get('transformers')}), every number "
        f"in these tables from `{path}`. Anchors in the same run: cuBLAS SGEMM "
        f"{max(sg):.1f} TFLOP/s (TF32 off), device copy {bw / 1e12:.2f} TB/s; so the decode floor, every "
        f"decode weight read once at that rate, is {floor:.3f} ms/token with float32 weights and "
        f"{floor16:.3f} ms with bf16 ones." if sg and bw and floor and floor16 else
        f"Measured at commit `{str(r.get('commit'))[:7]}`, every number in these tables from `{path}`.",
        "",
        "Prime time (seconds) against prompt length, with primewalk's peak device memory:",
        "",
        curve_markdown(r, hf="transformers", oom="out of memory", no_peak="-"),
    ]
    mm = _sub(m, "mma")
    bf = _sub(m, "bf16")

    def over(v, f):
        return "" if _num(v) is None or not f else f"{v / f:.3f} ×"

    def same(d):
        v = d.get("decode_chained_equals_stepwise")
        return "" if v is None else (" (bitwise equal)" if v is True else " (**differ**)")

    def step(d):
        return f"{_ms(d.get('decode_512_stepwise_ms_per_token'))}{same(d)}"

    def cell(v, f, unit):
        return f" {over(v, f)}{unit} " if f else " "

    rows = [("primewalk exact, 512 context", m.get("decode_512_ms_per_token"), floor, "", step(m)),
            ("primewalk exact, 32,768 context", m.get("decode_32k_ms_per_token"), floor, "", ""),
            ("primewalk exact, bf16-resident weights, 512", bf.get("decode_512_ms_per_token"), floor16, " (bf16)",
             step(bf)),
            ("primewalk exact-bf16, 512", mm.get("decode_512_ms_per_token"),
             _num(mm.get("bf16_decode_floor_ms")) or floor16, " (bf16)", step(mm)),
            ("primewalk exact, 512, without CUDA graphs", m.get("decode_512_uncaptured_ms_per_token"), None, "", ""),
            ("transformers fp32, 512", (hf.get("fp32") or {}).get("decode_ms_per_token"), None, "", ""),
            ("transformers bf16, 512", (hf.get("bf16") or {}).get("decode_ms_per_token"), None, "", "")]
    if "decode_512_stepwise_ms_per_token" in m:
        out += ["", "Decode, one token a step (ms/token; the floor as above). Greedy decode as "
                "`Engine.decode_greedy` runs it -- chained: each step's pick on the device feeds the next step, "
                "whose launch does not wait for the host to read the last one's logits; every step's logits "
                "reach the host -- and, beside it, stepwise: `decode_step` calls with numpy's argmax between "
                "them, the host waiting for each step (the two checked bitwise alike in the same run):", "",
                "| what | ms/token | over its floor | stepwise ms/token |", "|---|---|---|---|"]
        out += [f"| {w} | {_ms(v)} |{cell(v, f, u)}|" + (f" {st} |" if st else " |") for w, v, f, u, st in rows]
    else:  # a bench from before the chained decode: its figures are stepwise
        out += ["", "Decode, one token a step (ms/token; the floor as above):", "",
                "| what | ms/token | over its floor |", "|---|---|---|"]
        out += [f"| {w} | {_ms(v)} |{cell(v, f, u)}|" for w, v, f, u, _ in rows]
    runs = [("bench-8l", m.get("spec") or {}), ("stdlib-small", _sub(r, "stdlib_small").get("spec") or {})]
    if any(_spec_rows(s) for _, s in runs):
        untimed = {int(s.get("untimed_runs", 1)) for _, spec in runs for _, s in _spec_rows(spec)}
        nth = {1: "second", 2: "third"}.get(max(untimed), f"{max(untimed) + 1}th")
        out += ["", f"Speculative decoding (greedy; each timed on the {nth} run of a reset session; a draft "
                "step is K chained MTP rows, a verify step K + 1 rows):", "",
                "| model | K | plain tokens/s | speculative tokens/s | mean acceptance length | draft step | verify step |",
                "|---|---|---|---|---|---|---|"]
        for model, spec in runs:
            for k, s in _spec_rows(spec):
                acc = _num(s.get("mean_acceptance_length"))
                out.append(f"| {model} | {k} | {_rate(s.get('plain_tokens_per_s'))} | "
                           f"{_rate(s.get('spec_tokens_per_s'))} | {'-' if acc is None else f'{acc:.2f}'} | "
                           f"{_ms(s.get('draft_step_ms'))} | {_ms(s.get('verify_step_ms'))} |")
        dv = [(k, _sub(s, "draft_vocab")) for k, s in _spec_rows(runs[0][1]) if _sub(s, "draft_vocab")]
        if dv:
            out += ["", f"bench-8l drafting among a draft vocabulary, the ids 0..N-1 (`harness.engine.draft`; "
                        f"its MTP head is random, so the acceptance says nothing):", "",
                    "| K | draft vocabulary N | draft step | full-vocabulary draft step | speculative tokens/s | "
                    "same tokens as plain |", "|---|---|---|---|---|---|"]
            full = dict(_spec_rows(runs[0][1]))
            out += [f"| {k} | {v.get('size')} | {_ms(v.get('draft_step_ms'))} | {_ms(full[k].get('draft_step_ms'))} | "
                    f"{_rate(v.get('spec_tokens_per_s'))} | {'yes' if v.get('same_tokens') else 'no'} |" for k, v in dv]
            by = [(k, n, ms) for k, v in dv for n, ms in sorted(_sub(v, "draft_step_ms_by_size").items(),
                                                                key=lambda x: -int(x[0]))]
            if by:
                out += ["", "The same draft step at smaller draft vocabularies: " + "; ".join(
                    f"K = {k}, N = {int(n):,}: {_ms(ms)}" for k, n, ms in by) + "."]
    goals = r.get("goals") or {}
    note = goals_device_note(r)
    out += ["", f"The goals (the JSON's `goals` block). {note}" if note else "The goals (the JSON's `goals` block):", "",
            "| issue | goal | measured | target | met |", "|---|---|---|---|---|"]
    order = list(GOAL_ORDER) + [("", n) for n in goals if n not in {g for _, g in GOAL_ORDER}]
    for issue, name in order:
        g = goals.get(name)
        if not isinstance(g, dict):
            continue
        met = {True: "yes", False: "**no**"}.get(g.get("met"), str(g.get("met")))
        detail = _goal_detail(name, r) if _num(g.get("value")) is not None else ""
        out.append(f"| {issue} | `{name}` | {_goal_value(name, g.get('value'))}{detail} | {g.get('goal')} | {met} |")
    return "\n".join(out)


def _block_span(text: str) -> tuple[int, int]:
    """Where the README's block lies in ``text``: (just after README_BEGIN, at README_END); raises
    ValueError unless each marker is there once, in order."""
    a, b = text.find(README_BEGIN), text.find(README_END)
    if a < 0 or b < 0 or b < a or text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
        raise ValueError(f"no single block between '{README_BEGIN}' and '{README_END}'")
    return a + len(README_BEGIN), b


def replace_readme_block(text: str, block: str) -> str:
    """``text`` with the part between README_BEGIN and README_END replaced by ``block``; raises
    ValueError when the markers are missing or out of order."""
    a, b = _block_span(text)
    return text[:a] + "\n" + block + "\n" + text[b:]


def readme_block(text: str) -> str:
    """The part of ``text`` between README_BEGIN and README_END (stripped of the newlines next to
    the markers); raises ValueError as :func:`replace_readme_block`."""
    a, b = _block_span(text)
    return text[a:b].strip("\n")
