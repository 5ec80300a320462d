"""Static analysis of the GEMM prototypes without a GPU: PTX (Numba-CUDA) → ptxas → SASS.

    python tools/sass_gemm.py [VARIANT ...] [--bf16] [--keep DIR]

For each variant of ``kernels_proto.gemm.VARIANTS`` (default: all): registers, spills and shared
memory (``ptxas -v``), the instruction mix of the main loop (the backward branch whose body holds
the most FFMA), the FFMA share of the issued instructions per 32-column slice (the fold
``acc += part`` runs once per slice, the rest once per stage), and the distance in instructions
from each ``LDS.128`` to the first FFMA that reads it (with 2 warps per scheduler, a distance
below ~12 instructions exposes shared-memory latency). Needs CUDA's ``ptxas`` on PATH and
``cuobjdump`` (``$CUOBJDUMP`` or /usr/local/sass/cuobjdump).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import types

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numba.cuda.dispatcher as _disp  # noqa: E402
from numba import cuda  # noqa: E402

# device functions ask the current device for its compute capability; there is none here
_disp.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))

from kernels_proto import gemm as G  # noqa: E402

CUOBJDUMP = os.environ.get("CUOBJDUMP", "/usr/local/sass/cuobjdump")


def _opc(t):
    return re.sub(r"^@!?U?P[T0-9]\s+", "", t).split()[0]


def analyse(name, bf16=False, keep=None, scalar=False):
    fam, cfg = G.VARIANTS[name]
    wkind = ("h" if bf16 else "") + ("s" if scalar else "v")
    k = G.kernel(fam, **cfg) if fam == "ca" else G.kernel(fam, xv=not scalar, wkind=wkind, **cfg)
    sig = f"(float32[:, ::1], {'uint16' if bf16 else 'float32'}[:, ::1], float32[:, ::1], int64)"
    ptx, _ = cuda.compile_ptx(k.fn, sig, cc=(9, 0))
    d = keep or tempfile.mkdtemp()
    tag = name + ("_bf16" if bf16 else "") + ("_scalar" if scalar else "")
    pp, cb = os.path.join(d, tag + ".ptx"), os.path.join(d, tag + ".cubin")
    with open(pp, "w") as f:
        f.write(ptx)
    maxreg = [] if k.threads <= 256 else [f"-maxrregcount={65536 // k.threads}"]
    r = subprocess.run(["ptxas", "-arch=sm_90", "-v", *maxreg, pp, "-o", cb], capture_output=True, text=True)
    regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    sass = subprocess.run([CUOBJDUMP, "-sass", cb], capture_output=True, text=True).stdout
    if keep:
        with open(os.path.join(d, tag + ".sass"), "w") as f:
            f.write(sass)
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    loops = []
    for addr, txt in ins:
        m = re.search(r"BRA\s+(?:`\(.*?\)\s*)?(0x[0-9a-f]+)", txt)
        if m and int(m.group(1), 16) <= addr:
            lo = int(m.group(1), 16)
            body = [t for a, t in ins if lo <= a <= addr]
            loops.append((sum(_opc(t) == "FFMA" for t in body), body))
    ffma, body = max(loops, key=lambda x: x[0])
    mix = collections.Counter(_opc(t) for t in body)
    bk = cfg.get("BK", 32)
    sps = G.SLICE // bk
    fold = mix["FADD"] + mix["CS2R"] if sps > 1 else 0  # the fold runs once per slice
    per_slice = sps * (len(body) - fold) + fold
    ffma_slice = sps * ffma
    dist = []
    for i, t in enumerate(body):
        if t.startswith("LDS.128"):
            r0 = int(re.findall(r"\bR(\d+)\b", t)[0])
            dst = {str(r0 + j) for j in range(4)}
            for j in range(i + 1, len(body)):
                if _opc(body[j]) == "FFMA" and dst & set(re.findall(r"\bR(\d+)\b", body[j])[1:]):
                    dist.append(j - i)
                    break
    dist.sort()
    return dict(variant=tag, threads=k.threads, smem=k.smem, regs=regs,
                spill_bytes=int(spill.group(1)) + int(spill.group(2)) if spill else None,
                loop_instrs=len(body), loop_ffma=ffma, stages_per_slice=sps,
                instrs_per_slice=per_slice, ffma_share=ffma_slice / per_slice,
                ldg=sum(v for o, v in mix.items() if o.startswith(("LDG", "LDGSTS"))),
                sts=mix["STS"], lds128=mix["LDS.128"], lds_scalar=mix["LDS"], local=mix["LDL"] + mix["STL"],
                int_ops=sum(v for o, v in mix.items() if o.split(".")[0] in (
                    "IADD3", "IMAD", "LEA", "LOP3", "SHF", "SEL", "ISETP", "VIADD", "IABS", "UIADD3",
                    "ULEA", "USEL", "UISETP", "ULOP3", "USHF", "MOV", "UMOV")),
                lds_use_min=dist[0] if dist else None, lds_use_lt12=sum(x < 12 for x in dist),
                lds_use_median=dist[len(dist) // 2] if dist else None,
                mix=", ".join(f"{o}:{v}" for o, v in mix.most_common(14)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*")
    ap.add_argument("--bf16", action="store_true", help="also the bf16-weight kernels of the rp family")
    ap.add_argument("--scalar", action="store_true", help="also the scalar-load kernels (K % 4 != 0) of the rp family")
    ap.add_argument("--keep", default=None, help="write .ptx/.cubin/.sass here")
    a = ap.parse_args()
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
    names = a.variants or list(G.VARIANTS)
    rows = []
    for n in names:
        rows.append(analyse(n, keep=a.keep))
        if a.bf16 and G.VARIANTS[n][0] == "rp":
            rows.append(analyse(n, bf16=True, keep=a.keep))
        if a.scalar and G.VARIANTS[n][0] == "rp":
            rows.append(analyse(n, scalar=True, keep=a.keep))
    hdr = ("variant", "thr", "smem", "regs", "spill", "instr/slice", "FFMA%", "LDS128", "int", "LDS→use min/<12/med")
    print(f"{hdr[0]:<24}{hdr[1]:>5}{hdr[2]:>8}{hdr[3]:>6}{hdr[4]:>6}{hdr[5]:>12}{hdr[6]:>7}{hdr[7]:>8}{hdr[8]:>6}  {hdr[9]}")
    for r in rows:
        print(f"{r['variant']:<24}{r['threads']:>5}{r['smem']:>8}{r['regs']:>6}{r['spill_bytes']:>6}"
              f"{r['instrs_per_slice']:>12}{100 * r['ffma_share']:>6.1f}%{r['lds128']:>8}{r['int_ops']:>6}"
              f"  {r['lds_use_min']}/{r['lds_use_lt12']}/{r['lds_use_median']}")
    print()
    for r in rows:
        print(f"{r['variant']}: loop {r['loop_instrs']} instrs / {r['loop_ffma']} FFMA per stage "
              f"({r['stages_per_slice']} stage(s) per slice); {r['mix']}")


if __name__ == "__main__":
    main()
