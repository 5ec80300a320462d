#!/usr/bin/env python3
"""Static PTX instruction counts of a CUDA kernel, without a GPU.

    PYTHONPATH=. python tools/ptx_count.py numba_kernels.mma_tc:attention_mma_sk_k \\
        "void(uint32[:, ::1], uint32[:, ::1], uint32[:, ::1], int64, int32[::1], int64, int64, int64, float32, float32[:, :, ::1], float32[:, :, ::1])"

Compiles the kernel's Python function to PTX for sm_90 (NVVM only: no driver, no device) and
prints, for each stretch between two barriers (``bar.sync``), its instructions, MMAs and global
loads, and its loops (a branch back to an earlier label) with the instructions of each loop's
body (a branch back to a label before the stretch's barrier is code layout, not a loop: left
out). A loop body's count times its trip count is roughly what a warp issues there (ptxas may
still change the instruction mix: this is a first look, not a profile; ``--out FILE`` keeps the
PTX). ``MODULE:NAME`` names the ``@cuda.jit`` kernel; the module's CUDA bodies are bound first
(``numba_kernels.cuda`` imported).
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def compile_ptx(target: str, sig: str, cc=(9, 0)) -> str:
    """The PTX of ``MODULE:NAME``'s kernel for ``sig`` at compute capability ``cc``, with no GPU:
    device functions ask the current device for its compute capability as they compile, so a
    stand-in answers ``cc``."""
    import importlib
    import types

    import numpy as np

    if not hasattr(np, "row_stack"):  # numba-cuda 0.30 with numpy 2.5
        np.row_stack = np.vstack
    import numba.cuda.dispatcher as dispatcher
    from numba.cuda import compile_ptx as _compile

    import numba_kernels.cuda  # noqa: F401  (binds the kernels' CUDA bodies)

    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    mod, _, name = target.partition(":")
    if not name:
        raise SystemExit(f"ptx_count: name the kernel as MODULE:NAME, got {target!r}")
    try:
        kernel = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"ptx_count: no kernel {target}: {e}")
    ptx, _ = _compile(getattr(kernel, "py_func", kernel), sig, cc=cc)
    return ptx


def count(ptx: str) -> list[dict]:
    """Per stretch between barriers: {"lines": (first, last), "instructions", "mma", "ld_global",
    "loops": [(label line, branch line, body instructions)]}."""
    lines = ptx.splitlines()
    labels, instr = {}, []
    for i, line in enumerate(lines):
        t = line.strip()
        if t.startswith("$") and t.endswith(":"):
            labels[t[:-1]] = i
        elif t.endswith(";") and not t.startswith(("//", ".", "{", "}")):
            instr.append((i, t))
    cuts = [0] + [i for i, t in instr if t.startswith("bar.sync") or t.startswith("barrier.sync")] + [len(lines)]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        mine = [(i, t) for i, t in instr if a <= i < b]
        loops = []
        for i, t in mine:
            m = re.search(r"\bbra(?:\.uni)?\s+(\$[\w$]+)", t)
            if m and m.group(1) in labels and a <= labels[m.group(1)] < i:  # back within the stretch
                start = labels[m.group(1)]
                loops.append((start, i, sum(1 for j, _ in instr if start <= j <= i)))
        out.append({"lines": (a, b), "instructions": len(mine), "mma": sum("mma.sync" in t for _, t in mine),
                    "ld_global": sum("ld.global" in t for _, t in mine), "loops": loops})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", help="MODULE:NAME of a @cuda.jit kernel")
    ap.add_argument("sig", help="its numba signature, e.g. \"void(float32[:, ::1], int64)\"")
    ap.add_argument("--out", help="also write the PTX here")
    args = ap.parse_args(argv)
    ptx = compile_ptx(args.kernel, args.sig)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(ptx)
    segs = count(ptx)
    print(f"{args.kernel}: {sum(s['instructions'] for s in segs)} PTX instructions, "
          f"{sum(s['mma'] for s in segs)} mma.sync, {sum(s['ld_global'] for s in segs)} ld.global")
    for k, s in enumerate(segs):
        loops = ", ".join(f"lines {a}-{b}: {n}" for a, b, n in s["loops"]) or "none"
        print(f"  stretch {k} (PTX lines {s['lines'][0]}-{s['lines'][1]}): {s['instructions']} instructions, "
              f"{s['mma']} mma, {s['ld_global']} ld.global; loop bodies: {loops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
