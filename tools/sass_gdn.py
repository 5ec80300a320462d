"""Static analysis of the GDN recurrence kernels without a GPU: PTX (Numba/NVVM) → ptxas → SASS.

    .venv/bin/python tools/sass_gdn.py [--dk 128] [--out /tmp/gdn_sass] [--variant NAME ...]

Prints per variant: registers, stack/spills, shared memory, and the instruction mix of the hot
row loop (the largest loop body: the basic blocks between the loop head and its back edge).
The device functions are compiled for cc 9.0 without a driver (``get_current_device`` is
stubbed: compile_ptx itself needs no GPU).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import types

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numba.cuda.dispatcher as _disp  # noqa: E402
from numba import cuda  # noqa: E402

_disp.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))

SIG_NEW = ("(float32[:, ::1], float32[:, ::1], float32[:, ::1], int64, float32[:, ::1], float32[:, ::1], "
           "float32[::1], float32[::1], int64, int64, int64, float32[::1], int64)")
SIG_OLD = ("(float32[:, ::1], float32[:, ::1], float32[:, ::1], int64, float32[:, ::1], float32[:, ::1], "
           "float32[:, :, ::1], float32[:, ::1], int64, int64, int64, int64, float32[:, :, :, ::1], boolean)")
SASS = "/usr/local/sass/cuobjdump"


def compile_sass(pyfunc, sig, outdir, name):
    ptx, _ = cuda.compile_ptx(pyfunc, sig, cc=(9, 0))
    p = os.path.join(outdir, name)
    with open(p + ".ptx", "w") as f:
        f.write(ptx)
    r = subprocess.run(["ptxas", "-arch=sm_90", "-v", p + ".ptx", "-o", p + ".cubin"], capture_output=True, text=True)
    info = r.stderr
    sass = subprocess.run([SASS, "-sass", p + ".cubin"], capture_output=True, text=True).stdout
    with open(p + ".sass", "w") as f:
        f.write(sass)
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    stack = int(re.search(r"(\d+) bytes stack frame", info).group(1))
    spill_st = int(re.search(r"(\d+) bytes spill stores", info).group(1))
    spill_ld = int(re.search(r"(\d+) bytes spill loads", info).group(1))
    smem = re.search(r"(\d+) bytes smem", info)
    return dict(regs=regs, stack=stack, spill_st=spill_st, spill_ld=spill_ld,
                smem=int(smem.group(1)) if smem else 0, sass=sass, ptx=ptx)


INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
HEX = re.compile(r"/\*\s*0x([0-9a-f]{16})\s*\*/")


def parse(sass, ctrl=False):
    """[(addr, opcode, operands)] of the first kernel in a cuobjdump listing; with ``ctrl`` a fourth
    field: the scheduling control bits (stall, write barrier, read barrier, wait mask) decoded from the
    high word of the 128-bit instruction (sm_70+ layout)."""
    out = []
    lines = sass.splitlines()
    for n, ln in enumerate(lines):
        m = INSN.search(ln)
        if m:
            row = (int(m.group(1), 16), m.group(3), m.group(4))
            if ctrl:
                hi = HEX.search(lines[n + 1]) if n + 1 < len(lines) else None
                c = int(hi.group(1), 16) >> 41 if hi else 0
                row += ((c & 15, (c >> 5) & 7, (c >> 8) & 7, (c >> 11) & 63),)
            out.append(row)
    return out


# variable latencies (cycles) assumed for the scoreboard model; fixed-latency ops use ptxas' stall counts
VAR_LAT = {"LDS": 30, "SHFL": 28, "LDC": 30, "LDG": 500, "LDL": 30, "S2R": 25, "S2UR": 10, "I2F": 6, "F2I": 6,
           "MUFU": 20, "BAR": 20}
# shared-memory/MIO return cycles per warp instruction (LDS.128 with pairwise-uniform lanes: 2)
MIO = {"LDS.128": 2, "LDS.64": 1, "LDS": 1, "SHFL": 1, "STS": 1, "STS.128": 4}


def model(body, rows, warps_per_sm=4):
    """Cycles per row of the loop ``body`` (parsed with ctrl) for one warp alone on its SM sub-partition
    (in-order issue, ptxas' stall counts, barrier waits with VAR_LAT), and the SM's shared-memory
    return cycles per row when ``warps_per_sm`` warps run it. Runs three iterations; reports the third."""
    t = 0
    bar = [0] * 6
    starts = []
    for it in range(3):
        starts.append(t)
        for addr, op, args, (stall, wb, rb, wait) in body:
            for b in range(6):
                if wait >> b & 1:
                    t = max(t, bar[b])
            base = op.split(".")[0]
            if wb != 7:
                bar[wb] = max(bar[wb], t + VAR_LAT.get(base, 6))
            if rb != 7:
                bar[rb] = max(bar[rb], t + 4)
            t += max(stall, 1)
    starts.append(t)
    issue = (starts[3] - starts[2]) / rows
    mio = sum(MIO.get(op, MIO.get(op.split(".")[0], 0)) for _, op, _, _ in body) * warps_per_sm / rows
    return issue, mio


def hot_loop(ins):
    """The innermost loop (backward branch) whose body holds a SHFL (the row loop); else the one with
    the most FFMA/FMUL."""
    best = None
    for k, (addr, op, args, *_) in enumerate(ins):
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", args)
            if not m:
                continue
            tgt = int(m.group(1), 16)
            if tgt < addr:
                body = [x for x in ins if tgt <= x[0] <= addr]
                sh = any(x[1].startswith("SHFL") for x in body)
                nf = sum(1 for x in body if x[1].startswith(("FFMA", "FMUL")))
                score = (sh, -len(body) if sh else nf)
                if best is None or score > best[0]:
                    best = (score, body)
    return best[1] if best else []


def mix(body):
    cnt = collections.Counter(op.split(".")[0] if not op.startswith(("LDG", "LDS", "STG", "STS", "LDL", "STL"))
                              else op for _, op, *_ in body)
    return dict(cnt.most_common())


def report(name, r, rows=1, warps_per_sm=4, ghz=1.9):
    ins = parse(r["sass"], ctrl=True)
    body = hot_loop(ins)
    m = mix(body)
    nfp = sum(v for k, v in m.items() if k in ("FFMA", "FMUL", "FADD"))
    cyc, mio = model(body, rows, warps_per_sm) if body else (0, 0)
    per_row = max(cyc, mio)
    print(f"== {name}: {r['regs']} regs, stack {r['stack']} B, spills {r['spill_st']}/{r['spill_ld']} B, "
          f"smem {r['smem']} B, {len(ins)} SASS instructions")
    print(f"   row loop: {len(body) / rows:.0f} instructions/row, {nfp / rows:.0f} FP; mix/row "
          f"{ {k: round(v / rows, 1) for k, v in m.items()} }")
    print(f"   model: {cyc:.0f} cycles/row issue+latency (1 warp/SMSP), {mio:.0f} shared-memory cycles/row per SM "
          f"({warps_per_sm} warps) -> {per_row:.0f} cycles = {per_row / ghz / 1e3:.3f} us/row at {ghz} GHz")
    return dict(regs=r["regs"], stack=r["stack"], spills=[r["spill_st"], r["spill_ld"]], smem=r["smem"],
                n_sass=len(ins), loop_instructions_per_row=len(body) / rows, loop_fp_per_row=nfp / rows,
                loop_mix=m, model_cycles_per_row=cyc, model_smem_cycles_per_row=mio,
                predicted_us_per_row=per_row / ghz / 1e3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--heads", type=int, default=32, help="value heads (for warps per SM in the model)")
    ap.add_argument("--out", default="/tmp/gdn_sass")
    ap.add_argument("--old", action="store_true", help="also today's _gdn_fast_k")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--variant", nargs="*", default=None, help="mode,wpb,tc,cap e.g. fuse,4,16,0 (tc 0: auto)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    from kernels_proto import gdn
    res = {}
    if a.old:
        import numba_kernels.cuda  # noqa: F401  (cuda_gdn imports from it)
        from numba_kernels.cuda_gdn import _gdn_fast_k
        res["old"] = report("old _gdn_fast_k", compile_sass(_gdn_fast_k.py_func, SIG_OLD, a.out, "old"))
    variants = a.variant or ["rot,4,8,0", "rot,4,8,1", "pipe,4,8,0", "pipe,4,8,1", "rot,2,16,0", "rot,4,16,0",
                             "rot,1,8,0", "fuse,4,8,0", "plain,4,8,0"]  # the probe's variants
    for v in variants:
        mode, wpb, tc, cap = v.split(",")
        k, spec = gdn.make_kernel(a.dk, a.dv, int(wpb), int(tc) or None, mode, bool(int(cap)))
        name = k.py_func.__name__
        wsm = max(1, round(a.heads * ((a.dv + spec["cb"] - 1) // spec["cb"]) * int(wpb) / 132))
        res[name] = report(name, compile_sass(k.py_func, SIG_NEW, a.out, name), rows=2 if mode == "rot" else 1,
                           warps_per_sm=wsm)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
