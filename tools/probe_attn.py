#!/usr/bin/env python3
"""Probe of the query-tiled prime attention and the GQA split-KV decode attention
(``kernels_proto/attn.py``) on one GPU: every variant is checked bit for bit against the CPU twin
(``numba_kernels.cpu.attention``) and timed with CUDA events, beside today's kernels
(``attention_tiled``, ``attention_split``) and torch's SDPA (bf16 flash, fp32) on the same inputs.

    PYTHONPATH=. python tools/probe_attn.py --out DIR            # the GPU run (< 90 s)
    PYTHONPATH=. python tools/probe_attn.py --out DIR --sim      # simulator, tiny shapes
    PYTHONPATH=. python tools/probe_attn.py --out DIR --static   # no GPU: PTX → ptxas / SASS

Writes DIR/probe_attn.json and prints a table. Shapes: bench-8l (hq = 16, hkv = 2, D = 256);
prime T = 4096, 16384, 32768 (one layer; TFLOP/s on causal FLOPs 4·(T²/2)·D·hq; bitwise on sampled
rows, all heads); decode R = 1, 4, 5, 16 rows at contexts 512, 4096, 32768 with the device-side
position (grid sized by the cache capacity, as in captured steps; µs per layer; bitwise on every
output; timed as CUDA-graph replays, as a captured decode step runs, beside the eager call);
then small edge shapes (other D, odd head counts, mid-tile starts). Every item is wrapped: a
failure is one line in the table and the run goes on; items past the time budget are skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still names np.row_stack
    np.row_stack = np.vstack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

F32 = np.float32
T0 = time.time()


def elapsed():
    return time.time() - T0


def _r(x, n):
    return None if x is None else round(float(x), n)


# ------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------
FULL = dict(
    hq=16, hkv=2, D=256,
    prime_T=(32768, 4096, 16384),
    prime_variants=("p64t512", "p64", "p64t512g8", "p64:sync"),
    prime_variants_small=2,  # below the largest T only the first two
    prime_reps={4096: 5, 16384: 3, 32768: 2},
    decode_ctx=(512, 4096, 32768),
    decode_R=(1, 4, 5, 16),
    capacity=32768 + 64,
    decode_extra={1: ["s8:kvs", "s8:TPB2"], 4: ["s32w", "s32w:TPB2"], 16: ["s64t512:TPB4"]},
    decode_reps=20,
    sample_rows=12,
    edges=[  # (variant or "split", D, hq, hkv, start, R)
        ("p64t512", 128, 6, 3, 100, 300),
        ("p64", 80, 3, 1, 33, 77),
        ("p64t512", 33, 4, 2, 5, 70),
        ("split", 128, 6, 3, 1000, 5),
        ("split", 80, 3, 1, 77, 16),
        ("split", 33, 4, 2, 130, 1),
    ],
    budget=80.0,
)
SIM = dict(  # every code path once, on shapes the simulator runs in a few minutes (no timings)
    hq=4, hkv=2, D=16,
    prime_T=(130,),
    prime_variants=("p64t512", "p64:sync"),
    prime_variants_small=2,
    prime_reps={130: 1},
    decode_ctx=(70,),
    decode_R=(1, 5),
    capacity=136,
    decode_extra={1: ["s8:kvs"], 5: ["s32w:TPB2"]},
    decode_reps=1,
    sample_rows=6,
    edges=[("p64", 33, 3, 1, 50, 20), ("split", 33, 3, 1, 70, 3)],
    budget=1e9,
)


def parse_variant(v):
    """'p64' / 'p64:sync' (synchronous staging) / 'p64g8:G2' (heads per block) / 's64:TPB4' …"""
    name, *opts = v.split(":")
    kw = {}
    for o in opts:
        if o == "sync":
            kw["cpa"] = False
        elif o == "kvs":
            kw["kv_shared"] = True
        elif o.startswith("TPB"):
            kw["TPB"] = int(o[3:])
        elif o.startswith("G"):
            kw["G"] = int(o[1:])
    return name, kw


# ------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------
class Probe:
    def __init__(self, args, plan):
        self.args, self.plan = args, plan
        self.rows = []
        self.rng = np.random.default_rng(0)
        from numba import cuda

        from kernels_proto import attn
        from numba_kernels import cpu as kp
        self.cuda, self.attn, self.kp = cuda, attn, kp
        self.sim = attn.SIMULATED

    # -- bookkeeping ---------------------------------------------------------------------------
    def add(self, **row):
        row.setdefault("t", round(elapsed(), 1))
        self.rows.append(row)
        keys = ("section", "name", "shape", "ms", "us", "tflops", "bitwise", "error")
        print("  ".join(f"{k}={row[k]}" for k in keys if k in row and row[k] is not None), flush=True)

    def over_budget(self):
        return elapsed() > self.plan["budget"]

    def guard(self, section, name, shape, fn):
        if self.over_budget():
            self.add(section=section, name=name, shape=shape, error="skipped: time budget")
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001  (one line per failure, the run goes on)
            self.add(section=section, name=name, shape=shape, error=f"{type(e).__name__}: {str(e)[:300]}",
                     trace=traceback.format_exc()[-2000:])
            return None

    # -- timing ----------------------------------------------------------------------------------
    def time_ms(self, fn, reps, warm=1):
        cuda = self.cuda
        if self.sim:  # the simulator's times mean nothing
            return None
        for _ in range(warm):
            fn()
        cuda.synchronize()
        ts = []
        for _ in range(reps):
            a, b = cuda.event(), cuda.event()
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(cuda.event_elapsed_time(a, b))
        return float(np.median(ts))

    # -- data ------------------------------------------------------------------------------------
    def randn(self, *shape, scale=1.0):
        return (scale * self.rng.standard_normal(shape, dtype=np.float32)).astype(F32)

    def twin_rows(self, Q, kc, vc, rows, start, hq, hkv, D, scale):
        """The CPU twin's output rows (each row on its own: start + r)."""
        out = np.zeros((len(rows), hq * D), F32)
        for i, r in enumerate(rows):
            o = np.zeros((1, hq * D), F32)
            self.kp.attention(np.ascontiguousarray(Q[r:r + 1]), kc, vc, o, start + r, 1, hq, hkv, D, F32(scale))
            out[i] = o[0]
        return out

    @staticmethod
    def same(a, b):
        return bool(np.array_equal(np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32)))

    # -- prime -----------------------------------------------------------------------------------
    def prime(self):
        p, cuda, attn = self.plan, self.cuda, self.attn
        hq, hkv, D = p["hq"], p["hkv"], p["D"]
        scale = F32(1.0 / math.sqrt(D))
        Tmax = max(p["prime_T"])
        Qa, ka, va = self.randn(Tmax, hq * D), self.randn(Tmax, hkv * D), self.randn(Tmax, hkv * D)
        for T in p["prime_T"]:
            if self.over_budget():
                self.add(section="prime", name="*", shape=f"T{T}", error="skipped: time budget")
                continue
            Q, kc, vc = Qa[:T], ka[:T], va[:T]
            dQ, dk, dv = cuda.to_device(Q), cuda.to_device(kc), cuda.to_device(vc)
            dout = cuda.device_array((T, hq * D), F32)
            flops = 4.0 * (T * T / 2.0) * D * hq
            n = p["sample_rows"]
            rows = sorted(set([0, 1, 63, 64, 65, T // 2, T // 2 + 1, T - 65, T - 64, T - 2, T - 1]
                              + list(self.rng.integers(0, T, max(0, n - 11)))))
            rows = [r for r in rows if 0 <= r < T]
            t = time.time()
            want = self.twin_rows(Q, kc, vc, rows, 0, hq, hkv, D, scale)
            self.add(section="prime", name="cpu-twin", shape=f"T{T} rows{len(rows)}", cpu_s=round(time.time() - t, 2))
            for v in p["prime_variants"][: None if T == Tmax else p["prime_variants_small"]]:
                name, kw = parse_variant(v)

                def run(name=name, kw=kw):
                    attn.attention_prime(dQ, dk, dv, dout, 0, T, hq, hkv, D, scale, variant=name, **kw)

                def item(v=v, run=run):
                    tc = time.time()
                    run()
                    cuda.synchronize()
                    first = time.time() - tc
                    got = dout.copy_to_host()[rows]
                    ok = self.same(got, want)
                    ms = self.time_ms(run, p["prime_reps"][T], warm=0)
                    cfg = self.cfg_info(v, D, hq, hkv)
                    self.add(section="prime", name=v, shape=f"T{T}", ms=_r(ms, 3),
                             tflops=_r(ms and flops / ms / 1e9, 2), bitwise=ok, first_call_s=round(first, 2),
                             maxdiff=float(np.abs(got - want).max()), **cfg)
                self.guard("prime", v, f"T{T}", item)
            self.prime_anchors(T, Q, kc, vc, dQ, dk, dv, hq, hkv, D, scale, flops, rows, want)
            del dQ, dk, dv, dout

    def prime_anchors(self, T, Q, kc, vc, dQ, dk, dv, hq, hkv, D, scale, flops, rows, want):
        cuda = self.cuda
        from numba_kernels import cuda as kc_mod
        # today's attention_tiled: full at T ≤ 4096, else the last rows only (rate on that subset)
        sub = T if T <= 4096 else min(T, 256)
        s0 = T - sub

        def tiled():
            dsub = cuda.to_device(np.ascontiguousarray(Q[s0:]))
            o = cuda.device_array((sub, hq * D), F32)
            run = lambda: kc_mod.attention_tiled(dsub, dk, dv, o, s0, sub, hq, hkv, D, scale)  # noqa: E731
            run()
            cuda.synchronize()
            got = o.copy_to_host()
            idx = [i for i, r in enumerate(rows) if r >= s0]
            ok = self.same(got[[rows[i] - s0 for i in idx]], want[idx]) if idx else None
            ms = self.time_ms(run, 1 if T > 4096 else 2, warm=0)
            f = 4.0 * D * hq * sum(s0 + r + 1 for r in range(sub))
            self.add(section="prime", name="anchor:attention_tiled", shape=f"T{T} rows{s0}..{T - 1}", ms=_r(ms, 3),
                     tflops=_r(ms and f / ms / 1e9, 3), bitwise=ok, est_full_ms=_r(ms and ms * flops / f, 1))
        self.guard("prime", "anchor:attention_tiled", f"T{T}", tiled)
        if self.sim:
            return

        def sdpa(dtype):
            import torch
            import torch.nn.functional as Fn
            dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
            q = torch.as_tensor(dQ, device="cuda").view(T, hq, D).transpose(0, 1).unsqueeze(0).to(dt).contiguous()
            k = torch.as_tensor(dk, device="cuda").view(T, hkv, D).transpose(0, 1).unsqueeze(0).to(dt)
            v = torch.as_tensor(dv, device="cuda").view(T, hkv, D).transpose(0, 1).unsqueeze(0).to(dt)
            k = k.repeat_interleave(hq // hkv, 1).contiguous()  # GQA expanded: every backend takes it
            v = v.repeat_interleave(hq // hkv, 1).contiguous()
            from torch.nn.attention import SDPBackend, sdpa_kernel
            backend = SDPBackend.FLASH_ATTENTION if dtype == "bf16" else SDPBackend.EFFICIENT_ATTENTION

            def run():
                with sdpa_kernel([backend]):  # never the math fallback (T² memory)
                    return Fn.scaled_dot_product_attention(q, k, v, is_causal=True, scale=float(scale))
            torch.cuda.synchronize()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ts = []
            run()
            for _ in range(3):
                ev[0].record()
                run()
                ev[1].record()
                ev[1].synchronize()
                ts.append(ev[0].elapsed_time(ev[1]))
            ms = float(np.median(ts))
            o = run().float().transpose(1, 2).reshape(T, hq * D)[rows].cpu().numpy()
            self.add(section="prime", name=f"anchor:torch-sdpa-{dtype}", shape=f"T{T}", ms=round(ms, 3),
                     tflops=round(flops / ms / 1e9, 2), maxdiff_vs_twin=float(np.abs(o - want).max()))
        for dt in ("bf16", "fp32"):
            self.guard("prime", f"anchor:torch-sdpa-{dt}", f"T{T}", lambda dt=dt: sdpa(dt))

    def cfg_info(self, v, D, hq, hkv, R=None):
        attn = self.attn
        name, kw = parse_variant(v)
        c = attn.prime_config(hq, hkv, D, name, **kw) if R is None else attn.split_config(R, hq, hkv, D, name, **kw)
        info = dict(BQ=c.BQ, NT=c.NT, G=c.G, tileS=f"{c.TMS}x{c.TNS}", tileO=f"{c.TMO}x{c.TNO}", smem=c.layout()[4])
        info.update(self.regs(c))
        return info

    def regs(self, c):
        if self.sim:
            return {}
        try:
            disp, _ = self.attn.kernel(c)
            ov = next(iter(disp.overloads.values()))
            return dict(regs=ov.regs_per_thread, local_bytes=ov.local_mem_per_thread)
        except Exception:  # noqa: BLE001
            return {}

    # -- decode ----------------------------------------------------------------------------------
    def decode(self):
        p, cuda, attn = self.plan, self.cuda, self.attn
        hq, hkv, D = p["hq"], p["hkv"], p["D"]
        rep = hq // hkv
        scale = F32(1.0 / math.sqrt(D))
        cap = p["capacity"]
        from numba_kernels import cuda as kc_mod
        from numba_kernels import cuda_attention as ka_mod
        for ctx in p["decode_ctx"]:
            # K/V copies rotated so that the touched part (ctx rows) does not sit in the 60 MB L2
            touched = ctx * hkv * D * 4 * 2
            ncopy = 1 if self.sim else max(1, min(64, math.ceil(120e6 / touched)))
            big_k = self.randn(cap + (ncopy - 1) * ctx, hkv * D)
            big_v = self.randn(cap + (ncopy - 1) * ctx, hkv * D)
            dbk, dbv = cuda.to_device(big_k), cuda.to_device(big_v)
            copies = [(dbk[i * ctx: i * ctx + cap], dbv[i * ctx: i * ctx + cap]) for i in range(ncopy)]
            for R in p["decode_R"]:
                if self.over_budget():
                    self.add(section="decode", name="*", shape=f"ctx{ctx} R{R}", error="skipped: time budget")
                    continue
                start = ctx - R  # rows at positions ctx − R .. ctx − 1
                Q = self.randn(R, hq * D)
                dQ = cuda.to_device(Q)
                want = np.zeros((R, hq * D), F32)
                self.kp.attention(Q, big_k[:cap], big_v[:cap], want, start, R, hq, hkv, D, scale)
                pos = cuda.to_device(np.array([start], np.int32))
                dout = cuda.device_array((R, hq * D), F32)
                state = {"i": 0}

                def rot():
                    state["i"] = (state["i"] + 1) % ncopy
                    return copies[state["i"]]

                base = attn.split_variant(R, rep)
                variants = [base] + p["decode_extra"].get(R, [])

                def measure(call, reps):
                    """Eager µs (host launches included) and graph-replay µs (GPU time, as in a captured
                    decode step; round-robin over graphs captured on different K/V copies)."""
                    def run():
                        call(*rot())
                    state["i"] = -1
                    run()  # copy 0: the checked inputs; also compiles and allocates
                    cuda.synchronize()
                    ok = self.same(dout.copy_to_host(), want)
                    eager = self.time_ms(run, reps)
                    graph, gerr = None, None
                    if not self.sim:
                        try:
                            gs = []
                            for i in range(min(4, ncopy)):
                                keep = list(copies[i]) + list(attn._STATS.values()) + list(ka_mod._STATS.values())
                                gs.append(kc_mod.capture(lambda i=i: call(*copies[i]), keep=keep)[0])
                            k = {"i": 0}

                            def replay():
                                gs[k["i"] % len(gs)].replay()
                                k["i"] += 1
                            graph = self.time_ms(replay, reps, warm=len(gs))
                        except Exception as e:  # noqa: BLE001
                            gerr = f"{type(e).__name__}: {str(e)[:200]}"
                    return ok, eager, graph, gerr

                for v in variants:
                    name, kw = parse_variant(v)

                    def item(v=v, name=name, kw=kw):
                        ok, eager, graph, gerr = measure(
                            lambda k, vv: attn.attention_split(dQ, k, vv, dout, 0, R, hq, hkv, D, scale, pos=pos,
                                                               variant=name, **kw), p["decode_reps"])
                        ms = graph if graph is not None else eager
                        self.add(section="decode", name=v, shape=f"ctx{ctx} R{R}", us=_r(ms and ms * 1e3, 1),
                                 us_eager=_r(eager and eager * 1e3, 1), graph_error=gerr, bitwise=ok,
                                 tflops=_r(ms and 4.0 * D * hq * sum(start + r + 1 for r in range(R)) / ms / 1e9, 2),
                                 **self.cfg_info(v, D, hq, hkv, R))
                    self.guard("decode", v, f"ctx{ctx} R{R}", item)

                def anchor(kind):
                    fn = ka_mod.attention_split if kind == "split" else kc_mod.attention_tiled
                    ok, eager, graph, gerr = measure(
                        lambda k, vv: fn(dQ, k, vv, dout, 0, R, hq, hkv, D, scale, pos=pos), max(2, p["decode_reps"] // 4))
                    ms = graph if graph is not None else eager
                    self.add(section="decode", name=f"anchor:attention_{kind}", shape=f"ctx{ctx} R{R}",
                             us=_r(ms and ms * 1e3, 1), us_eager=_r(eager and eager * 1e3, 1), graph_error=gerr,
                             bitwise=ok)
                for kind in ("split", "tiled"):
                    self.guard("decode", f"anchor:attention_{kind}", f"ctx{ctx} R{R}", lambda kind=kind: anchor(kind))
            del copies, dbk, dbv

    # -- edges -----------------------------------------------------------------------------------
    def edges(self):
        cuda, attn = self.cuda, self.attn
        for v, D, hq, hkv, start, R in self.plan["edges"]:
            shape = f"D{D} hq{hq} hkv{hkv} start{start} R{R}"

            def item(v=v, D=D, hq=hq, hkv=hkv, start=start, R=R, shape=shape):
                cap = start + R + 3
                Q, kc, vc = self.randn(R, hq * D), self.randn(cap, hkv * D), self.randn(cap, hkv * D)
                scale = F32(1.0 / math.sqrt(D))
                want = np.zeros((R, hq * D), F32)
                self.kp.attention(Q, kc, vc, want, start, R, hq, hkv, D, scale)
                out = cuda.to_device(np.full((R, hq * D), 7.0, F32))
                if v == "split":
                    attn.attention_split(cuda.to_device(Q), cuda.to_device(kc), cuda.to_device(vc), out, start, R,
                                         hq, hkv, D, scale)
                else:
                    name, kw = parse_variant(v)
                    attn.attention_prime(cuda.to_device(Q), cuda.to_device(kc), cuda.to_device(vc), out, start, R,
                                         hq, hkv, D, scale, variant=name, **kw)
                got = out.copy_to_host()
                self.add(section="edge", name=v, shape=shape, bitwise=self.same(got, want),
                         maxdiff=float(np.abs(got - want).max()))
            self.guard("edge", v, shape, item)


def device_info(cuda, sim):
    if sim:
        return {"device": "simulator"}
    d = cuda.get_current_device()
    name = d.name.decode() if isinstance(d.name, bytes) else str(d.name)
    return {"device": name, "cc": list(d.compute_capability), "sms": d.MULTIPROCESSOR_COUNT}


def print_table(rows):
    print("\n" + "-" * 110)
    print(f"{'section':8} {'name':28} {'shape':30} {'time':>12} {'TFLOP/s':>8} {'bitwise':>8}")
    for r in rows:
        tm = f"{r['ms']} ms" if r.get("ms") is not None else (f"{r['us']} us" if r.get("us") is not None else "")
        tf = "" if r.get("tflops") is None else str(r["tflops"])
        bw = "" if r.get("bitwise") is None else ("yes" if r["bitwise"] else "NO")
        print(f"{r['section']:8} {r['name'][:28]:28} {r.get('shape', '')[:30]:30} {tm:>12} {tf:>8} {bw:>8}"
              + (f"  ERROR {r['error'][:60]}" if r.get("error") else ""))


def print_best(rows):
    """The fastest bitwise variant per shape (prime: TFLOP/s; decode: µs) beside the anchors."""
    best = {}
    for r in rows:
        if r.get("bitwise") is not True or r["name"].startswith("anchor:") or r["section"] not in ("prime", "decode"):
            continue
        key = (r["section"], r["shape"])
        val = r.get("ms") if r["section"] == "prime" else r.get("us")
        if val is not None and (key not in best or val < best[key][0]):
            best[key] = (val, r["name"], r.get("tflops"))
    print("\nbest bitwise variant per shape:")
    for (sec, shape), (val, name, tf) in best.items():
        anchors = [f"{r['name'][7:]} {r.get('ms') or r.get('us')}" for r in rows
                   if r["section"] == sec and r["name"].startswith("anchor:") and r.get("shape", "").split(" ")[0] == shape.split(" ")[0]
                   and (sec == "prime" or r.get("shape") == shape)]
        unit = "ms" if sec == "prime" else "us"
        print(f"  {sec:6} {shape:14} {name:16} {val} {unit}" + (f" ({tf} TFLOP/s)" if sec == "prime" else "")
              + (f"   anchors: {', '.join(anchors)}" if anchors else ""))


# ------------------------------------------------------------------------------------------------
# static analysis (no GPU): PTX → ptxas → SASS, per variant
# ------------------------------------------------------------------------------------------------
def static(out_dir, D=256):
    import re
    import subprocess
    import tempfile
    from collections import Counter

    import numba.cuda.dispatcher as _d
    from numba import cuda

    class _Dev:  # compile_ptx types device functions against the current device; there is none
        compute_capability = (9, 0)
    _d.get_current_device = lambda: _Dev()
    from kernels_proto import attn

    sass_tool = os.environ.get("CUOBJDUMP", "/usr/local/sass/cuobjdump")
    psig = "(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], int64, int32[::1], int64, int64, int64, float32)"
    ssig = ("(float32[:, ::1], float32[:, ::1], float32[:, ::1], int64, int32[::1], int64, int64, int64, float32, "
            "float32[:, :, ::1], float32[:, :, ::1])")
    cfgs = [(v, attn.prime_cfg(D, v)) for v in attn.PRIME]
    cfgs += [(v, attn.split_cfg(D, v, 8)) for v in attn.SPLIT]
    cfgs += [("s8:kvs", attn.split_cfg(D, "s8", 8, kv_shared=True)), ("s64:TPB4", attn.split_cfg(D, "s64", 8, TPB=4))]
    res = []
    for name, c in cfgs:
        t = time.time()
        ptx, _ = cuda.compile_ptx(attn.pyfunc(c), psig if c.mode == "prime" else ssig, cc=(9, 0), launch_bounds=c.NT)
        ct = time.time() - t
        with tempfile.TemporaryDirectory() as td:
            pp, cb = os.path.join(td, "k.ptx"), os.path.join(td, "k.cubin")
            open(pp, "w").write(ptx)
            r = subprocess.run(["ptxas", "-arch=sm_90", "-v", pp, "-o", cb], capture_output=True, text=True)
            info = " ".join(r.stderr.split())
            sass = subprocess.run([sass_tool, "-sass", cb], capture_output=True, text=True).stdout
        regs = re.search(r"Used (\d+) registers", info)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
        ins = [(int(m.group(1), 16), m.group(2).strip()) for m in
               re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
        loops = []
        for i, (addr, txt) in enumerate(ins):
            m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", txt)
            if m and m.group(1) and int(m.group(1), 16) <= addr:
                body = [tx for a, tx in ins if int(m.group(1), 16) <= a <= addr]
                mix = Counter(re.sub(r"^@!?U?P\w+\s+", "", tx).split()[0] for tx in body)
                ff = sum(n for k, n in mix.items() if k.startswith("FFMA"))
                if ff >= 32 and len(body) < 1500:
                    loops.append(dict(instrs=len(body), ffma=ff, ffma_frac=round(ff / len(body), 3),
                                      lds128=mix.get("LDS.128", 0), ldl=mix.get("LDL", 0),
                                      top=dict(mix.most_common(6))))
        row = dict(variant=name, mode=c.mode, BQ=c.BQ, NT=c.NT, tileS=f"{c.TMS}x{c.TNS}", tileO=f"{c.TMO}x{c.TNO}",
                   smem=c.layout()[4], regs=int(regs.group(1)) if regs else None,
                   spill_st=int(spill.group(1)) if spill else None, spill_ld=int(spill.group(2)) if spill else None,
                   ldgsts=sass.count("LDGSTS"), compile_s=round(ct, 1), ffma_loops=loops)
        res.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "ffma_loops"}), flush=True)
        for lp in loops:
            print("    loop", json.dumps(lp), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "probe_attn_static.json"), "w") as f:
        json.dump(res, f, indent=1)


# ------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for probe_attn.json")
    ap.add_argument("--sim", action="store_true", help="Numba's CUDA simulator, tiny shapes (no GPU)")
    ap.add_argument("--static", action="store_true", help="no GPU: registers, spills, SASS inner loops per variant")
    ap.add_argument("--budget", type=float, default=None, help="seconds before optional items are skipped")
    ap.add_argument("--only", default="prime,decode,edges", help="sections to run")
    args = ap.parse_args(argv)
    if args.static:
        static(args.out)
        return 0
    if args.sim:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        if "numba" in sys.modules:
            print("the simulator must be switched on before numba is imported", file=sys.stderr)
            return 2
    plan = dict(SIM if args.sim else FULL)
    if args.budget is not None:
        plan["budget"] = args.budget
    pr = Probe(args, plan)
    res = {"schema": 1, "probe": "attn", "sim": pr.sim, "plan": {k: v for k, v in plan.items()},
           "python": platform.python_version(), "numpy": np.__version__}
    try:
        import numba
        res["numba"] = numba.__version__
        import numba_cuda
        res["numba_cuda"] = getattr(numba_cuda, "__version__", None)
    except Exception:  # noqa: BLE001
        pass
    res.update(device_info(pr.cuda, pr.sim))
    print(json.dumps({k: res[k] for k in ("device",) if k in res}), flush=True)
    for sec in args.only.split(","):
        getattr(pr, sec)()
    res["rows"] = pr.rows
    res["wall_s"] = round(elapsed(), 1)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "probe_attn.json")
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=1, default=str)
    os.replace(path + ".tmp", path)
    print_table(pr.rows)
    print_best(pr.rows)
    print(f"wrote {path} ({res['wall_s']} s)")
    bad = [r for r in pr.rows if r.get("bitwise") is False and not r["name"].startswith("anchor:")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
