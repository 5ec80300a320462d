#!/usr/bin/env python3
"""Compile the CUDA kernels for sm_90 on a machine without a GPU, before spending device time.

    python tools/check_compile.py [--ptxas] [--only NAME[,NAME]] [--json FILE] [--stretches] [--mma-only] [--sass DIR]

Numba's simulator runs a kernel's Python, not its compilation, so it misses what only the CUDA
compiler rejects: a device function that does not type for CUDA, a ``cuda.shared.array`` size
that is an expression instead of a named constant, a register budget that spills. This tool:

1. runs the op cases of ``tests/cudasim_run.py`` under the simulator (a subprocess with
   ``NUMBA_ENABLE_CUDASIM=1``; about 2 minutes on 2 cores) and records, for every launch, the
   kernel (a ``@kernel`` function by name, a generated kernel by its source) and its argument
   types;
2. compiles each distinct (kernel, argument types) here with numba-cuda's ``compile_ptx`` for
   compute capability 9.0 (no driver needed), and the tensor-core kernels of
   ``numba_kernels/mma_tc.py`` (which the simulator cannot run) with their one signature;
3. with ``--ptxas`` (needs ``ptxas`` on PATH), assembles each PTX for sm_90 and reports the
   registers and any spill.

Each line also gives the kernel's static PTX instruction count (``ptx_count``: the instructions of
its entry function; a proxy, before ptxas, for the instruction work a change adds or removes).
``--stretches`` breaks each kernel's count down (``ptx_stretches``): per stretch between two
barriers, its instructions, MMAs and global loads, and each loop's body (a branch back to a
label inside the stretch; a body's count times its trip count is roughly what a warp issues
there). ``--mma-only`` compiles the tensor-core kernels alone, without the simulator run
(seconds): ``python tools/check_compile.py --mma-only --only attention_mma_sk_k --stretches``.
``--sass DIR`` (implies ``--ptxas``; needs ``nvdisasm`` on PATH, e.g. from the
``nvidia-cuda-nvdisasm`` wheel's ``bin/``) disassembles each assembled kernel into DIR/NAME.N.sass
and counts its SASS (``sass_counts``): what the GPU runs, where the PTX is a step removed (ptxas
drops the inline-asm ``mov``s, adds register moves the PTX never names).

Prints one line per compiled kernel and exits 1 if any fails. A generated kernel is compiled in
the configurations the op cases use, not every configuration a model's shapes pick.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MARK = "SIGNATURES "


# ---- step 1: in the simulator -----------------------------------------------------------------
def _type_of(a):
    """A launch argument's numba type, as a small JSON-able description."""
    import numpy as np

    if hasattr(a, "shape") and hasattr(a, "dtype") and not isinstance(a, np.generic):
        return ["array", str(a.dtype), int(a.ndim), "C" if a.flags["C_CONTIGUOUS"] else "A"]
    if isinstance(a, (bool, np.bool_)):
        return ["scalar", "boolean"]
    if isinstance(a, np.generic):
        return ["scalar", str(a.dtype)]
    if isinstance(a, int):
        return ["scalar", "int64"]
    if isinstance(a, float):
        return ["scalar", "float64"]
    if a is None:  # an optional output not given (xp=None): the kernel's branch for it compiled out
        return ["none"]
    raise TypeError(f"launch argument of type {type(a).__name__} is not described")


def record() -> int:
    """Run the simulator's op cases with every launch recorded; print the signatures as JSON."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import cudasim_run  # noqa: E402  (runs nothing at import; builds the simulated kernels)
    from numba_kernels import cuda as kc
    from numba_kernels import launch

    seen: dict = {}
    run = kc._NS["launch"]

    def note(key, what, sig):
        entry = seen.setdefault(key, dict(what, sigs=[]))
        if sig not in entry["sigs"]:
            entry["sigs"].append(sig)

    def recording_launch(kernel, grid, block, *args, **kw):
        """The launchers' ``launch`` (they look it up in the CUDA namespace): note what is launched
        with which argument types, then launch it as before."""
        sig = [_type_of(a) for a in args]
        if isinstance(kernel, launch.Kernel):
            gen, cfg = next(((g, c) for (g, c), k in launch._GENERATED.items() if k is kernel), (None, None))
            # the simulator never launches with PDL; a captured step on sm_90 launches the PDL build of
            # a configuration that has one (GemvCfg, GdnCfg: with_pdl): record that build too
            pdl = cfg.with_pdl() if hasattr(cfg, "with_pdl") else cfg
            for c in (cfg, pdl) if pdl != cfg else (cfg,):
                src = gen(c)  # the generator's KernelSource again: its text and jit options
                note(("generated", src.name), {"kind": "generated", "name": src.name, "text": src.text,
                                               "threads": src.threads, "smem": src.smem,
                                               "jit": [list(kv) for kv in src.jit]}, sig)
        else:
            name = getattr(getattr(kernel, "py_func", kernel), "__name__", "?")
            note(("kernel", name), {"kind": "kernel", "name": name}, sig)
        return run(kernel, grid, block, *args, **kw)  # kw: pdl (launch.launch)

    kc._NS["launch"] = recording_launch
    try:
        cudasim_run.op_cases()
    finally:
        kc._NS["launch"] = run
    launched = set().union(*(c["kernels"] for c in cudasim_run.CASES))
    missed = sorted(launched - {k[1] for k in seen})  # launched some other way: not compiled here
    bad = [f"{c['cuda_op']} {c['case']}" for c in cudasim_run.CASES if not c["bitwise"]]
    print(MARK + json.dumps({"kernels": list(seen.values()), "not_bitwise": bad, "missed": missed}))
    return 0


# ---- step 2: here, no simulator ------------------------------------------------------------------
def _numba_type(t):
    from numba import types

    if t[0] == "array":
        return types.Array(getattr(types, t[1]) if t[1] != "bool" else types.boolean, t[2], t[3])
    if t[0] == "none":
        return types.none
    return getattr(types, t[1])


@contextlib.contextmanager
def _no_device_cc():
    """numba-cuda asks the current device for its compute capability when it compiles a device
    function that is not inlined; answer 9.0 without a driver (restored afterwards)."""
    import numba.cuda.dispatcher as dispatcher

    class _Device:
        compute_capability = (9, 0)

    before = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Device()
    try:
        yield
    finally:
        dispatcher.get_current_device = before


def _ptxas(ptx, max_registers=None, sass=None):
    """(registers, spill bytes, error) of ``ptxas -arch=sm_90 -v`` on the PTX; with ``sass`` (a
    path), the cubin's disassembly (``nvdisasm -c``) is written there too. ``error``: None, or
    one line naming the tool that failed."""
    d = tempfile.mkdtemp()
    try:
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as f:
            f.write(ptx)
        cmd = [shutil.which("ptxas") or "ptxas", "-arch=sm_90", "-v", p, "-o", p + ".cubin"]
        if max_registers:
            cmd += ["-maxrregcount", str(max_registers)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            return None, None, "ptxas: " + " ".join(r.stderr.strip().splitlines()[-1:])
        regs = [int(x) for x in re.findall(r"Used (\d+) registers", r.stderr)]
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", r.stderr)]
        if sass:
            r = subprocess.run([shutil.which("nvdisasm") or "nvdisasm", "-c", p + ".cubin"], capture_output=True,
                               text=True)
            if r.returncode:
                return None, None, "nvdisasm: " + (r.stderr.strip().splitlines() or ["failed"])[-1]
            from harness.atomic import write_text_atomic

            write_text_atomic(sass, r.stdout)
        return max(regs or [0]), max(spills or [0]), None
    finally:
        shutil.rmtree(d, ignore_errors=True)


# SASS instruction classes sass_counts reports: an opcode is in a class when it is one of the
# class's names or starts with one and a '.' (IMAD.MOV.U32 is a move, IMAD.SHL is not)
SASS_CLASSES = {"mma": ("HMMA",), "ldmatrix": ("LDSM",), "moves": ("MOV", "IMAD.MOV", "UMOV"),
                "global": ("LDG", "STG", "LDGSTS"), "shared": ("LDS", "STS"), "branches": ("BRA",), "nops": ("NOP",)}
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def sass_counts(text: str) -> dict:
    """Instruction counts of an ``nvdisasm -c`` listing: {"instructions": all, and one count per
    SASS_CLASSES entry}. An instruction is a line ``/*addr*/ [@pred] OPCODE ...``; a class matches
    by name (``IMAD.MOV.U32`` is a move by its prefix ``IMAD.MOV``; ``LDGSTS`` is global as
    itself, not by the prefix ``LDG``; ``LDSM`` is not ``LDS``)."""
    out = {"instructions": 0, **{k: 0 for k in SASS_CLASSES}}
    for line in text.splitlines():
        m = _SASS_LINE.match(line)
        if not m:
            continue
        op = m.group(1)
        out["instructions"] += 1
        for k, names in SASS_CLASSES.items():
            if any(op == n or op.startswith(n + ".") for n in names):
                out[k] += 1
    return out


def _instruction(line: str) -> bool:
    """Whether a PTX line is an instruction (a statement, not a directive, label or comment; an
    inline-asm block's instructions one by one)."""
    return ";" in line and not line.strip().startswith((".", "//", "{", "}"))


def ptx_count(ptx: str) -> int:
    """The instructions of the PTX's entry function."""
    return sum(1 for line in ptx[ptx.index(".entry"):].splitlines() if _instruction(line))


def ptx_stretches(ptx: str) -> list[dict]:
    """The entry function's PTX per stretch between barriers (``bar.sync``): {"lines": (first,
    last), "instructions", "mma", "ld_global", "loops": [(label line, branch line, body
    instructions)]}; a loop is a branch back to a label inside the stretch (one back past its
    barrier is code layout)."""
    lines = ptx.splitlines()
    first = next((i for i, line in enumerate(lines) if ".entry" in line), 0)
    labels, instr = {}, []
    for i, line in enumerate(lines[first:], first):
        t = line.strip()
        if t.startswith("$") and t.endswith(":"):
            labels[t[:-1]] = i
        elif _instruction(t):
            instr.append((i, t))
    cuts = [first] + [i for i, t in instr if t.startswith(("bar.sync", "barrier.sync"))] + [len(lines)]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        mine = [(i, t) for i, t in instr if a <= i < b]
        loops = []
        for i, t in mine:
            m = re.search(r"\bbra(?:\.uni)?\s+(\$[\w$]+)", t)
            if m and m.group(1) in labels and a <= labels[m.group(1)] < i:
                start = labels[m.group(1)]
                loops.append((start, i, sum(1 for j, _ in instr if start <= j <= i)))
        out.append({"lines": (a, b), "instructions": len(mine), "mma": sum("mma.sync" in t for _, t in mine),
                    "ld_global": sum("ld.global" in t for _, t in mine), "loops": loops})
    return out


def compile_all(recorded, only=None, ptxas=False, stretches=False, sass_dir=None):
    """Compile every recorded (kernel, signature) and the tensor-core kernels; returns rows."""
    import numpy as np

    np.row_stack = getattr(np, "row_stack", np.vstack)  # numba-cuda 0.30.4 with numpy 2.5
    with _no_device_cc():
        return _compile_all(recorded, only, ptxas or bool(sass_dir), stretches, sass_dir)


def _compile_all(recorded, only, ptxas, stretches=False, sass_dir=None):
    # the kernels as an sm_90 device builds them: with programmatic dependent launch's
    # griddepcontrol instructions (numba_kernels.intrin.pdl_emit; PRIMEWALK_PDL=0 compiles without)
    os.environ.setdefault("PRIMEWALK_PDL", "1")
    from numba import cuda

    from numba_kernels import cuda as kc
    from numba_kernels import launch, mma_tc
    from numba_kernels.tags import KernelSource

    jobs = []
    for k in recorded:
        if only and k["name"] not in only:
            continue
        if k["kind"] == "kernel":
            disp = kc._NS.get(k["name"])
            fn, opts = (getattr(disp, "py_func", None), {})
        else:
            src = KernelSource(k["name"], k["text"], k["threads"], k["smem"], tuple(tuple(kv) for kv in k["jit"]))
            fn, opts = launch.Kernel(src, launch._GEN_NS).disp.py_func, dict(src.jit)
        for sig in k["sigs"]:
            jobs.append((k["name"], fn, tuple(_numba_type(t) for t in sig), opts))
    from numba import types

    u2 = types.Array(types.uint32, 2, "C")
    for kern in (mma_tc.linear_mma_tc_k, mma_tc.linear_mma_gemm_k, mma_tc.linear_mma_gemv_k, mma_tc.linear_mma_g16_k):
        if not only or kern.py_func.__name__ in only:
            jobs.append((kern.py_func.__name__, kern.py_func, (u2, u2, u2, types.int64), {}))
    i1 = types.Array(types.int32, 1, "C")
    for kern in (*mma_tc.VD_KERNELS.values(), *mma_tc.VD_WIDE.values(), *mma_tc.VD_PDL.values()):  # plain (flags None) and the lm head's
        name = kern.py_func.__name__
        if not only or name in only:
            jobs.append((name, kern.py_func, (u2, u2, u2, types.int64, types.none, types.int64, types.none), {}))
        if not only or name + "_flag" in only:
            jobs.append((name + "_flag", kern.py_func, (u2, u2, u2, types.int64, i1, types.int64, types.none), {}))
    for kern in mma_tc.VD_GLU.values():  # the gate‖up GEMV with its SwiGLU: without and with the packed pairs
        name = kern.py_func.__name__
        if not only or name in only:
            jobs.append((name, kern.py_func, (u2, u2, u2, types.int64, types.none, types.int64, types.none), {}))
        if not only or name + "_xp" in only:
            jobs.append((name + "_xp", kern.py_func, (u2, u2, u2, types.int64, types.none, types.int64, u2), {}))
    h2 = types.Array(types.uint16, 2, "C")
    if not only or "linear_mma_tc_k_w16" in only:  # bf16-resident W, K % 8 != 0
        jobs.append(("linear_mma_tc_k_w16", mma_tc.linear_mma_tc_k.py_func, (u2, h2, u2, types.int64), {}))
    if not only or "mma_pack_x_k" in only:
        jobs.append(("mma_pack_x_k", mma_tc.mma_pack_x_k.py_func, (u2, u2, types.int64), {}))
    u1 = types.Array(types.uint32, 1, "C")
    if not only or "attention_mma_pk_k" in only:
        f2, i64 = types.Array(types.float32, 2, "C"), types.int64
        f3, u3 = types.Array(types.float32, 3, "C"), types.Array(types.uint32, 3, "C")
        jobs.append(("attention_mma_pk_k", mma_tc.attention_mma_pk_k.py_func,
                     (u1, u1, u1, u2, f2, i64, types.Array(types.int32, 1, "C"), i64, i64, i64, i64, types.float32,
                      f3, u3, i64, i64, i64), {"max_registers": mma_tc.PK_MAX_REGS}))
    for vs in (1, 2, 4):  # the split-KV kernel and its P·V splits (mma_tc.SK_VSPLIT)
        sk = mma_tc.sk_kernel(vs)
        if not only or sk.py_func.__name__ in only:
            i64, f3 = types.int64, types.Array(types.float32, 3, "C")
            jobs.append((sk.py_func.__name__, sk.py_func,
                         (u2, u2, u2, i64, types.Array(types.int32, 1, "C"), i64, i64, i64, types.float32, f3, f3),
                         {"max_registers": mma_tc.SK_MAX_REGS}))
    for kern in (mma_tc.att_pack_rows_k, mma_tc.att_pack_v_k):
        if not only or kern.__name__ in only:
            jobs.append((kern.__name__, kern.py_func, (u2, u1) + (types.int64,) * 4, {}))
    rows = []
    for name, fn, sig, opts in jobs:
        row = {"kernel": name, "signature": ", ".join(str(t) for t in sig)}
        t0 = time.perf_counter()
        try:
            if fn is None:
                raise LookupError(f"no CUDA kernel named {name} in numba_kernels.cuda")
            lb = opts.get("launch_bounds")
            ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0), **({"launch_bounds": lb} if lb else {}))
            row.update(ok=True, ptx_instructions=ptx_count(ptx))
            if stretches:
                row["stretches"] = ptx_stretches(ptx)
            if ptxas:
                sass = os.path.join(sass_dir, f"{name}.{len(rows)}.sass") if sass_dir else None
                regs, spill, err = _ptxas(ptx, opts.get("max_registers"), sass)
                row.update(registers=regs, spill_bytes=spill)
                if err:
                    row.update(ok=False, error=err)
                elif sass:
                    with open(sass, encoding="utf-8") as f:
                        row.update(sass=sass, sass_counts=sass_counts(f.read()))
        except Exception as e:  # noqa: BLE001  (any compiler error is a finding, reported in one line)
            row.update(ok=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        extra = f" {row['ptx_instructions']} PTX instructions" if "ptx_instructions" in row else ""
        extra += f", {row['registers']} regs, {row['spill_bytes']} B spilled" if "registers" in row else ""
        print(f"{'ok  ' if row['ok'] else 'FAIL'} {name}({row['signature']}){extra}"
              + ("" if row["ok"] else f"\n     {row['error']}"), flush=True)
        if "sass_counts" in row:
            print("     SASS: " + ", ".join(f"{v} {k}" for k, v in row["sass_counts"].items()) + f" ({row['sass']})",
                  flush=True)
        for k, st in enumerate(row.get("stretches", [])):
            loops = ", ".join(f"PTX lines {a}-{b}: {n}" for a, b, n in st["loops"]) or "none"
            print(f"     stretch {k}: {st['instructions']} instructions, {st['mma']} mma, {st['ld_global']} ld.global;"
                  f" loop bodies: {loops}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ptxas", action="store_true", help="also assemble for sm_90: registers and spills")
    ap.add_argument("--only", default="", help="kernel names to compile (comma-separated); default all")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--stretches", action="store_true",
                    help="also each kernel's PTX per stretch between barriers and per loop body")
    ap.add_argument("--mma-only", action="store_true",
                    help="only the tensor-core kernels of mma_tc (no simulator run: seconds)")
    ap.add_argument("--sass", default=None, metavar="DIR",
                    help="also disassemble each kernel (ptxas, then nvdisasm -c) into DIR/NAME.N.sass and count its "
                         "SASS instructions (implies --ptxas; nvdisasm: the nvidia-cuda-nvdisasm wheel's bin/ on PATH)")
    ap.add_argument("--record", action="store_true", help=argparse.SUPPRESS)  # step 1, in the simulator
    a = ap.parse_args(argv)
    if a.record:
        return record()
    if (a.ptxas or a.sass) and not shutil.which("ptxas"):
        print(f"check_compile: {'--sass' if a.sass else '--ptxas'} needs ptxas on PATH", file=sys.stderr)
        return 2
    if a.sass and not shutil.which("nvdisasm"):
        print("check_compile: --sass needs nvdisasm on PATH (pip install nvidia-cuda-nvdisasm, then its "
              "nvidia/cu13/bin/ on PATH)", file=sys.stderr)
        return 2
    if a.sass:
        try:
            os.makedirs(a.sass, exist_ok=True)
        except OSError as e:
            print(f"check_compile: --sass {a.sass}: {e.strerror}", file=sys.stderr)
            return 2
    only = {n for n in a.only.split(",") if n}
    rec = {"kernels": [], "not_bitwise": []} if a.mma_only else _recorded()
    if rec is None:
        return 1
    rows = compile_all(rec["kernels"], only, a.ptxas, a.stretches, a.sass)
    if not rows:
        print(f"check_compile: no kernel named {sorted(only)}" + (" among the tensor-core ones" if a.mma_only else ""),
              file=sys.stderr)
        return 2
    bad = [r for r in rows if not r["ok"]]
    if a.json:
        from harness.atomic import write_text_atomic

        write_text_atomic(a.json, json.dumps({"rows": rows, "not_bitwise": rec["not_bitwise"]}, indent=1))
    print(f"check_compile: {len(rows) - len(bad)}/{len(rows)} compiled for sm_90")
    return 1 if bad or rec["not_bitwise"] else 0


def _recorded():
    """Step 1 in a subprocess under the simulator: {"kernels", "not_bitwise", "missed"}, or None
    (said why) when that run failed."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--record"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith(MARK)), None)
    if p.returncode or line is None:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        print(f"check_compile: the simulator run failed: {tail[0]}", file=sys.stderr)
        return None
    rec = json.loads(line[len(MARK):])
    print(f"simulator: {len(rec['kernels'])} kernels launched by the op cases (with the GEMVs' and recurrence's PDL builds) in {time.perf_counter() - t0:.0f} s"
          + (f"; NOT bitwise: {rec['not_bitwise']}" if rec["not_bitwise"] else "")
          + (f"; launched but not recorded (not compiled here): {rec['missed']}" if rec["missed"] else ""), flush=True)
    return rec


if __name__ == "__main__":
    sys.exit(main())
