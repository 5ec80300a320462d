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


def wavefronts(c: G.Cfg) -> float:
    """Modelled L1/shared data-path wavefronts (128 B each) per 4 KiB of fp32-equivalent weights
    ... per warp chunk: weight LDG + STS + LDS (4 each per 512-byte instruction), X broadcast LDS
    (1 per instruction while SP ≤ 8), X staging LDG + STS, partial stores, merge loads."""
    wb = 4096 * c.MO * (0.5 if c.BF16 else 1.0)  # weight bytes per warp chunk
    w = 3 * 4 * c.NI * c.MO
    x = 8 * c.RB * (1 if c.SP <= 8 else c.SP // 8)
    xs = 2 * 4 * (c.RB * c.CS * 8 / c.NW) / 32
    p = c.RB * c.MO
    mg = c.CS * (c.OB * c.RB / 32) / c.NW
    return (w + x + xs + p + mg) * 4096 / wb


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cfg", nargs="*", default=list(CONFIGS))
    ap.add_argument("--dump", default="/tmp/gemv_sass")
    args = ap.parse_args(argv)
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
        print(f"   modelled L1/smem wavefronts per 4 KiB of weights: {wavefronts(c):.0f} (budget 256 at 4.2 TB/s)")
        print(f"   occupancy: {b} blocks/SM = {b * c.NW} warps/SM; weight bytes in flight/SM = {fl // 1024} KiB")
        ffma = cnt.get("FFMA", 0)
        useful = 32 * c.RB * c.PF * c.MO
        print(f"   loop: FFMA={ffma} (useful {useful} per iteration of {c.PF} chunk(s)); "
              f"non-FFMA per FFMA = {(len(loop) - ffma) / max(ffma, 1):.2f}")
        print("   " + ", ".join(f"{k}={v}" for k, v in sorted(cnt.items(), key=lambda kv: -kv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
