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


def parse(sass):
    """[(addr, opcode, operands)] of the first kernel in a cuobjdump listing."""
    out = []
    for ln in sass.splitlines():
        m = INSN.search(ln)
        if m:
            out.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def hot_loop(ins):
    """The innermost loop (backward branch) whose body holds a SHFL (the row loop); else the one with
    the most FFMA/FMUL."""
    best = None
    for k, (addr, op, args) in enumerate(ins):
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
                              else op for _, op, _ in body)
    return dict(cnt.most_common())


def report(name, r):
    ins = parse(r["sass"])
    body = hot_loop(ins)
    m = mix(body)
    nfp = sum(v for k, v in m.items() if k in ("FFMA", "FMUL", "FADD"))
    print(f"== {name}: {r['regs']} regs, stack {r['stack']} B, spills {r['spill_st']}/{r['spill_ld']} B, "
          f"smem {r['smem']} B, {len(ins)} SASS instructions")
    print(f"   hot loop: {len(body)} instructions, {nfp} FP (FFMA/FMUL/FADD); mix {m}")
    return dict(regs=r["regs"], stack=r["stack"], spills=[r["spill_st"], r["spill_ld"]], smem=r["smem"],
                n_sass=len(ins), loop_len=len(body), loop_fp=nfp, loop_mix=m)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--out", default="/tmp/gdn_sass")
    ap.add_argument("--old", action="store_true", help="also today's _gdn_fast_k")
    ap.add_argument("--variant", nargs="*", default=None, help="mode,wpb,tc,cap e.g. fuse,4,16,0 (tc 0: auto)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    from kernels_proto import gdn
    res = {}
    if a.old:
        import numba_kernels.cuda  # noqa: F401  (cuda_gdn imports from it)
        from numba_kernels.cuda_gdn import _gdn_fast_k
        res["old"] = report("old _gdn_fast_k", compile_sass(_gdn_fast_k.py_func, SIG_OLD, a.out, "old"))
    variants = a.variant or ["fuse,4,16,0", "fuse,4,16,1", "pipe,4,16,0", "plain,4,16,0", "fuse,2,16,0",
                             "fuse,8,16,0", "fuse,4,8,0"]
    for v in variants:
        mode, wpb, tc, cap = v.split(",")
        k, spec = gdn.make_kernel(a.dk, a.dv, int(wpb), int(tc) or None, mode, bool(int(cap)))
        name = k.py_func.__name__
        res[name] = report(name, compile_sass(k.py_func, SIG_NEW, a.out, name))
    return res


if __name__ == "__main__":
    main()
