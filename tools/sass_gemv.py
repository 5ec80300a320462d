#!/usr/bin/env python3
"""Static analysis of the proto GEMV kernels without a GPU: PTX (numba) → ptxas (registers,
spills, shared memory) → SASS instruction mix of the whole kernel and of the main loop.

    PYTHONPATH=. .venv/bin/python tools/sass_gemv.py [--cfg NAME ...] [--dump DIR]

The main loop is the largest backward-branch region (the chunk loop). Counts are per loop
iteration = PF chunks per warp; the useful work per chunk is 32·RB FFMA per lane.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

import numba.cuda.dispatcher as _disp  # noqa: E402


class _Dev:  # device functions ask the current device for its compute capability
    compute_capability = (9, 0)


_disp.get_current_device = lambda: _Dev()

from numba import cuda  # noqa: E402

from kernels_proto import gemv as G  # noqa: E402

PTXAS = os.environ.get("PTXAS", "ptxas")
CUOBJDUMP = os.environ.get("CUOBJDUMP", "/usr/local/sass/cuobjdump")

CONFIGS = {
    # large N (≥ 8192): 8 warps × 4 outputs, each warp its own rows, one step per chunk
    "big-R1": G.Cfg(RB=1, OW=4, NOG=8, NG=1, PF=2),
    "big-R1-pf1": G.Cfg(RB=1, OW=4, NOG=8, NG=1, PF=1),
    "big-R2": G.Cfg(RB=2, OW=4, NOG=8, NG=1, PF=2),
    "big-R4": G.Cfg(RB=4, OW=4, NOG=4, NG=1, PF=2),
    "big-R5": G.Cfg(RB=5, OW=4, NOG=4, NG=1, PF=1),
    "big-R8": G.Cfg(RB=8, OW=4, NOG=4, NG=1, PF=1),
    "big-R8-mo2": G.Cfg(RB=8, OW=4, NOG=2, NG=1, PF=1, MO=2),
    "big-R5-mo2": G.Cfg(RB=5, OW=4, NOG=2, NG=1, PF=1, MO=2),
    # small N (2048): K split over warps
    "small-R1": G.Cfg(RB=1, OW=8, NOG=1, NG=4, PF=2),
    "small-R1-ow4": G.Cfg(RB=1, OW=4, NOG=2, NG=4, PF=2),
    "small-R4": G.Cfg(RB=4, OW=8, NOG=1, NG=4, PF=1),
    "small-R8": G.Cfg(RB=8, OW=8, NOG=1, NG=2, PF=1),
    "small-R8-mo2": G.Cfg(RB=8, OW=8, NOG=1, NG=2, PF=1, MO=2),
    # bf16 weights
    "bf16-big-R1": G.Cfg(RB=1, OW=4, NOG=8, NG=1, PF=2, BF16=True),
    "bf16-small-R1": G.Cfg(RB=1, OW=8, NOG=1, NG=4, PF=2, BF16=True),
    "bf16-big-R8": G.Cfg(RB=8, OW=4, NOG=4, NG=1, PF=2, BF16=True),
}


def _cycles(addrs, width, load=True):
    """Shared-memory cycles of one warp access (addresses in 32-bit words): 32-bit accesses in one
    pass; 128-bit loads in 4 quarter-warp passes, or 2 half-warp passes when lane pairs (n, n^1) or
    (n, n^2) share addresses (packed return, NVIDIA forums: 2 registers per lane per cycle); each
    pass costs the worst bank's number of distinct words."""
    if width == 1:
        phases = [range(32)]
    elif load and (all(addrs[n] == addrs[n ^ 1] for n in range(32)) or all(addrs[n] == addrs[n ^ 2] for n in range(32))):
        phases = [range(0, 16), range(16, 32)]
    else:
        phases = [range(p * 8, p * 8 + 8) for p in range(4)]
    tot = 0
    for ph in phases:
        banks = {}
        for ln in ph:
            for e in range(width):
                banks.setdefault((addrs[ln] + e) % 32, set()).add(addrs[ln] + e)
        tot += max(len(v) for v in banks.values())
    return tot


def smem_cycles(c: G.Cfg) -> dict:
    """Modelled L1/shared data-path cycles (128 B per cycle) per warp chunk, per kind of access,
    and in total per 4 KiB of weight bytes (4.2 TB/s = 16 B per cycle per SM at 1.98 GHz leaves
    256 cycles per 4 KiB)."""
    NI, SW, SP, OW, CS, PSTR, OB, RB, MO = c.NI, c.SW, c.SP, c.OW, c.CS, c.PSTR, c.OB, c.RB, c.MO

    def pos(t):
        row, sli = divmod(t, SP)
        return (row // OW) * 32 + sli * OW + row % OW
    nl = NI * MO
    o = {}
    o["LDG W"] = nl * 4
    o["STS W"] = nl * max(_cycles([pos((32 * i + ln) // NI) * SW + (ln % NI) * 4 for ln in range(32)], 4, False)
                          for i in range(nl))
    o["LDS W"] = nl * max(_cycles([(ln + 32 * m) * SW + 4 * j for ln in range(32)], 4)
                          for j in range(NI) for m in range(MO))
    o["LDS X"] = 8 * RB * max(_cycles([(r * CS + g * SP + ln // OW) * 36 + 4 * q for ln in range(32)], 4)
                              for g in range(c.NG) for q in range(8) for r in range(RB))
    xq = RB * CS * 8 / c.NW / 32  # X staging instructions per warp
    o["X stage"] = xq * (4 + 4)
    o["P + merge"] = RB * MO + CS * (OB * RB / 32) / c.NW
    tot = sum(o.values())
    wbytes = 4096 * MO * (0.5 if c.BF16 else 1)
    o = {k: round(v, 1) for k, v in o.items()}
    o["per 4KiB"] = round(tot * 4096 / wbytes)
    return o


def compile_cfg(c: G.Cfg, dump: str | None = None):
    k = G.kernel(c)
    ptx, _ = cuda.compile_ptx(k.py_func, G.signature(c), cc=(9, 0))
    d = dump or tempfile.mkdtemp()
    os.makedirs(d, exist_ok=True)
    base = os.path.join(d, c.name())
    open(base + ".ptx", "w").write(ptx)
    r = subprocess.run([PTXAS, "-arch=sm_90", "-v", base + ".ptx", "-o", base + ".cubin"],
                       capture_output=True, text=True)
    info = r.stderr + r.stdout
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", info)
    smem = re.search(r"(\d+) bytes smem", info)
    sass = subprocess.run([CUOBJDUMP, "-sass", base + ".cubin"], capture_output=True, text=True).stdout
    open(base + ".sass", "w").write(sass)
    return dict(regs=regs, stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)),
                smem=int(smem.group(1)) if smem else 0, sass=sass)


_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def parse(sass: str):
    out = []
    for line in sass.splitlines():
        m = _INS.search(line)
        if m:
            out.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def main_loop(ins):
    """The instructions of the largest backward branch (the chunk loop)."""
    best = None
    for addr, op, args in ins:
        if op.startswith("BRA"):
            t = re.search(r"0x([0-9a-f]+)", args)
            if t:
                tgt = int(t.group(1), 16)
                if tgt < addr and (best is None or addr - tgt > best[1] - best[0]):
                    best = (tgt, addr)
    if best is None:
        return []
    return [x for x in ins if best[0] <= x[0] <= best[1]]


def classify(op: str) -> str:
    base = op.split(".")[0]
    if op.startswith("LDG"):
        return op if ".128" in op else "LDG(scalar)"
    if op.startswith(("LDS", "STS")):
        return op if ".128" in op else base + "(scalar)"
    if base in ("LDL", "STL"):
        return "LOCAL " + base
    if base in ("FFMA", "FADD", "FMUL", "BAR", "SHFL", "STG", "BRA", "WARPSYNC", "NANOSLEEP"):
        return base
    if base in ("IMAD", "IADD3", "LEA", "LOP3", "SHF", "ISETP", "SEL", "IABS", "I2F", "F2I", "IMNMX",
                "VIMNMX", "PRMT", "MOV", "IMAD.WIDE", "ULDC", "S2R", "S2UR", "R2UR", "UMOV", "UIADD3",
                "ULEA", "USHF", "ULOP3", "UIMAD", "UISETP", "PLOP3", "IMNMX"):
        return "int/move"
    return "other:" + base


def summary(c: G.Cfg, res):
    ins = parse(res["sass"])
    loop = main_loop(ins)
    cnt = collections.Counter(classify(op) for _, op, _ in loop)
    tot = collections.Counter(classify(op) for _, op, _ in ins)
    return ins, loop, cnt, tot


def occupancy(c: G.Cfg, regs: int, smem: int):
    """Blocks per SM on an H100/H200 (65536 registers, 228 KiB shared, 2048 threads, 32 blocks)
    and the weight bytes in flight per SM (PF chunks of 16·NI bytes per lane)."""
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = (65536 // per_warp) // c.NW
    by_smem = 233472 // (smem + 1024)
    by_thr = 2048 // c.NT
    b = min(by_regs, by_smem, by_thr, 32)
    return b, b * c.NT * 16 * c.NI * c.PF * c.MO


def hot_counts(c: G.Cfg, hot) -> dict:
    """Instruction mix of the hot loop per chunk (per warp)."""
    ins = parse(hot["sass"])
    loop = main_loop(ins)
    cnt = collections.Counter(classify(op) for _, op, _ in loop)
    per = {k: v / c.PF for k, v in cnt.items()}
    ffma = per.get("FFMA", 0)
    g = lambda *ks: sum(v for k, v in per.items() if any(k.startswith(x) for x in ks))  # noqa: E731
    return dict(total=len(loop) / c.PF, FFMA=ffma, LDG=g("LDG"), LDS=g("LDS"), STS=g("STS"),
                int=per.get("int/move", 0), BAR=per.get("BAR", 0), local=g("LOCAL"))


def predict(c: G.Cfg, regs: int, smem: int) -> dict:
    """Steady-state bandwidth model (TB/s of weight bytes): the smaller of DRAM (4.2), the L1/shared
    data path at 85 % of 128 B/cycle/SM (1.98 GHz), and bytes in flight over a 0.8 µs loaded
    latency on 132 SMs."""
    b, fl = occupancy(c, regs, smem)
    cyc = smem_cycles(c)["per 4KiB"]
    dp = 4.2 * 256 / cyc * 0.85 if cyc > 0 else 9.9
    inflight = 132 * fl / 0.8e-6 / 1e12
    return dict(blocks=b, warps=b * c.NW, inflight_KiB=fl // 1024, cycles_4KiB=cyc,
                TBps=round(min(4.2, dp, inflight), 2), bound=min((4.2, "DRAM"), (dp, "data path"), (inflight, "in flight"))[1])


def table(names):
    import tools.probe_gemv as P
    v = P.variants(G)
    rows = []
    for n in names or list(v):
        c = v[n][0]
        res = compile_cfg(c, "/tmp/gemv_sass")
        hot = compile_cfg(dataclasses.replace(c, HOT=True), "/tmp/gemv_sass")
        h = hot_counts(c, hot)
        pr = predict(c, res["regs"], res["smem"])
        rows.append((n, c, res, h, pr))
        print(f"{n:15s} {c.name():28s} regs {res['regs']:3d} spill {res['spill_st']:2d} smem {res['smem'] / 1024:4.1f}K "
              f"| {pr['blocks']} blk {pr['warps']:2d} warps {pr['inflight_KiB']:3d}K in flight "
              f"| chunk: {h['total']:5.0f} instr, FFMA {h['FFMA']:4.0f} LDG {h['LDG']:3.0f} LDS {h['LDS']:3.0f} "
              f"STS {h['STS']:3.0f} int {h['int']:4.0f} BAR {h['BAR']:.0f} local {h['local']:.0f} "
              f"| smem {pr['cycles_4KiB']:3d}/256 cyc per 4K | {pr['TBps']:.2f} TB/s ({pr['bound']})", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cfg", nargs="*", default=list(CONFIGS))
    ap.add_argument("--dump", default="/tmp/gemv_sass")
    ap.add_argument("--table", nargs="*", help="one line per probe variant (all when empty)")
    args = ap.parse_args(argv)
    if args.table is not None:
        table(args.table)
        return 0
    for name in args.cfg:
        c = CONFIGS[name] if name in CONFIGS else eval("G.Cfg(" + name + ")")  # noqa: S307
        try:
            c.check()
        except AssertionError as e:
            print(f"== {name}: does not fit: {e}")
            continue
        res = compile_cfg(c, args.dump)
        hot = compile_cfg(dataclasses.replace(c, HOT=True), args.dump)
        ins, loop, cnt, tot = summary(c, hot)
        print(f"== {name}: {c.name()}  regs={res['regs']} stack={res['stack']} spill={res['spill_st']}/"
              f"{res['spill_ld']} smem={res['smem']} (model {c.smem_bytes}); hot path (no partial chunk): "
              f"regs={hot['regs']} kernel={len(ins)} instr, loop={len(loop)} instr")
        b, fl = occupancy(c, res["regs"], res["smem"])
        print(f"   modelled L1/smem cycles per warp chunk: {smem_cycles(c)} (budget 256 per 4 KiB at 4.2 TB/s)")
        print(f"   occupancy: {b} blocks/SM = {b * c.NW} warps/SM; weight bytes in flight/SM = {fl // 1024} KiB")
        ffma = cnt.get("FFMA", 0)
        useful = 32 * c.RB * c.PF * c.MO
        print(f"   loop: FFMA={ffma} (useful {useful} per iteration of {c.PF} chunk(s)); "
              f"non-FFMA per FFMA = {(len(loop) - ffma) / max(ffma, 1):.2f}")
        print("   " + ", ".join(f"{k}={v}" for k, v in sorted(cnt.items(), key=lambda kv: -kv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
