"""tools/check_compile.py, the CUDA compile check for a machine without a GPU: launch arguments
described as numba types, a kernel compiled for sm_90 from a recorded signature, and a kernel
that the CUDA compiler rejects reported as a failure (the simulator would have run it)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import check_compile as chk  # noqa: E402

pytest.importorskip("numba.cuda")


def test_launch_arguments_become_numba_types():
    a = np.zeros((3, 4), np.float32)
    assert chk._type_of(a) == ["array", "float32", 2, "C"]
    assert chk._type_of(a[:, :2]) == ["array", "float32", 2, "A"]
    assert chk._type_of(np.float32(1)) == ["scalar", "float32"]
    assert chk._type_of(np.int32(1)) == ["scalar", "int32"]
    assert chk._type_of(3) == ["scalar", "int64"] and chk._type_of(2.5) == ["scalar", "float64"]
    assert chk._type_of(True) == ["scalar", "boolean"]
    assert str(chk._numba_type(["array", "uint16", 1, "C"])) == "array(uint16, 1d, C)"
    with pytest.raises(TypeError):
        chk._type_of(object())


RMS_SIG = [["array", "float32", 2, "C"], ["array", "float32", 1, "C"], ["scalar", "float32"],
           ["array", "float32", 2, "C"], ["scalar", "int64"], ["scalar", "int64"], ["none"]]  # xp=None


def test_compiles_a_recorded_kernel_and_reports_what_the_compiler_rejects(monkeypatch):
    from numba import cuda

    from numba_kernels import cuda as kc

    def bad_k(X, n):  # a shared array sized by an argument: the simulator runs it, the compiler refuses
        s = cuda.shared.array(n + 1, np.float32)
        s[0] = X[0]

    monkeypatch.setitem(kc._NS, "bad_k", cuda.jit(bad_k))
    rec = [{"kind": "kernel", "name": "rmsnorm_k", "sigs": [RMS_SIG]},
           {"kind": "kernel", "name": "bad_k", "sigs": [[["array", "float32", 1, "C"], ["scalar", "int64"]]]},
           {"kind": "kernel", "name": "missing_k", "sigs": [[["scalar", "int64"]]]}]
    rows = {r["kernel"]: r for r in chk.compile_all(rec, only={"rmsnorm_k", "bad_k", "missing_k"})}
    assert rows["rmsnorm_k"]["ok"], rows["rmsnorm_k"]
    assert rows["rmsnorm_k"]["ptx_instructions"] > 20  # a row norm: loads, an fma chain, a sum, stores
    assert not rows["bad_k"]["ok"] and rows["bad_k"]["error"]
    assert not rows["missing_k"]["ok"] and "no CUDA kernel named missing_k" in rows["missing_k"]["error"]
    import numba.cuda.dispatcher as dispatcher
    assert dispatcher.get_current_device.__name__ != "<lambda>"  # the stand-in device is gone again


def test_ptx_count_counts_the_entry_functions_instructions():
    ptx = """.version 8.0
.visible .func helper() { ret; }
.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .f32 %f<4>;
	ld.param.u64 %rd1, [k_param_0];
// a comment; with a semicolon
$L__BB0_1:
	fma.rn.f32 %f1, %f2, %f3, %f1;
	{
	.reg .pred q;
	setp.ne.b32 q, %r1, 0;
	}
	ret;
}
"""
    assert chk.ptx_count(ptx) == 4  # ld.param, fma, setp, ret (not the helper, directives, label, comment)


def test_ptx_stretches_split_at_barriers_and_find_loops_within_a_stretch():
    """``--stretches``: a hand-written entry function's instructions per stretch between barriers;
    a loop is a branch back to a label inside the same stretch (its body counted from the label
    to the branch); a branch back past a barrier is layout, not a loop; a helper function before
    the entry is not counted."""
    ptx = "\n".join([
        ".visible .func helper() { ret; }",
        ".visible .entry k(", ")", "{",
        "\tld.global.u32 \t%r1, [%rd1];",       # stretch 0: 2 instructions, no loop
        "\tadd.s32 \t%r2, %r1, 1;",
        "$L__BB0_1:",
        "\tbar.sync \t0;",                       # the cut (a stretch starts at its barrier)
        "$L__BB0_2:",
        "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 \t{%f1}, {%r1}, {%r2}, {%f2};",
        "\tadd.s32 \t%r3, %r3, 1;",
        "\t@%p1 bra \t$L__BB0_2;",               # a loop of 3 (label .. branch)
        "\t@%p2 bra \t$L__BB0_1;",               # back past the barrier: layout
        "\tret;",
        "}",
    ])
    segs = chk.ptx_stretches(ptx)
    assert [s["instructions"] for s in segs] == [2, 6]
    assert [s["mma"] for s in segs] == [0, 1] and [s["ld_global"] for s in segs] == [1, 0]
    assert segs[0]["loops"] == [] and [n for _, _, n in segs[1]["loops"]] == [3]
    assert sum(s["instructions"] for s in segs) == chk.ptx_count(ptx)


def test_mma_only_compiles_named_tensor_core_kernels_without_the_simulator(tmp_path, capsys):
    """``--mma-only``: the tensor-core kernels alone (no simulator subprocess), ``--json`` written
    as for a whole run, per-stretch lines with ``--stretches``; a name that is not one of them is
    a one-line usage error (exit 2), not an empty success."""
    import json

    out = tmp_path / "cc.json"
    assert chk.main(["--mma-only", "--only", "mma_pack_x_k", "--stretches", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ok   mma_pack_x_k(" in printed and "stretch 0:" in printed and "1/1 compiled" in printed
    rows = json.loads(out.read_text())["rows"]
    assert [r["kernel"] for r in rows] == ["mma_pack_x_k"] and rows[0]["stretches"]
    assert rows[0]["ptx_instructions"] == sum(s["instructions"] for s in rows[0]["stretches"])
    assert chk.main(["--mma-only", "--only", "no_such_k"]) == 2
    assert "no kernel named ['no_such_k']" in capsys.readouterr().err


SASS = """
        .text.linear_mma_vd1w_k:
.L_x_24:
        /*1df0*/                   ULDC.64 UR24, c[0x0][0x288] ;
        /*1e00*/                   DEPBAR.LE SB0, 0x2 ;
        /*1e10*/              @!PT LDS RZ, [RZ] ;
        /*1e20*/                   LDGSTS.E.BYPASS.128 [R23], desc[UR18][R18.64] ;
        /*1e30*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*1e40*/                   LDSM.16.M88.4 R24, [R47] ;
        /*1e50*/                   IMAD.MOV.U32 R16, RZ, RZ, R24 ;
        /*1e60*/                   MOV R9, R4 ;
        /*1e70*/                   IMAD.SHL.U32 R12, R12, 0x4, RZ ;
        /*1e80*/                   HMMA.16816.F32.BF16 R24, R16, R8, R24 ;
        /*1e90*/                   NOP ;
        /*1ea0*/               @P0 BRA `(.L_x_24) ;
        /*1eb0*/                   STG.E desc[UR4][R2.64], R24 ;
        /*1ec0*/                   EXIT ;
"""


def test_sass_counts_sorts_an_nvdisasm_listing_by_opcode():
    """Every ``/*addr*/ [@pred] OPCODE`` line is an instruction (labels, section names and blank
    lines are not); a class matches its opcodes by name, not by any prefix: ``IMAD.MOV.U32`` is a
    move and ``IMAD.SHL`` is not, ``LDGSTS`` and ``LDG`` are both global, ``LDSM`` is no ``LDS``."""
    c = chk.sass_counts(SASS)
    assert c == {"instructions": 14, "mma": 1, "ldmatrix": 1, "moves": 2, "global": 3, "shared": 1,
                 "branches": 1, "nops": 1}


def test_sass_needs_ptxas_and_nvdisasm_or_says_so(monkeypatch, capsys):
    """``--sass DIR`` without nvdisasm (or ptxas) on PATH is a one-line usage error (exit 2) before
    anything compiles."""
    import shutil

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda n: None if n == "nvdisasm" else (real(n) or f"/bin/{n}"))
    assert chk.main(["--mma-only", "--only", "mma_pack_x_k", "--sass", "/tmp/never-made"]) == 2
    assert "--sass needs nvdisasm on PATH" in capsys.readouterr().err
    monkeypatch.setattr(shutil, "which", lambda n: None)
    assert chk.main(["--mma-only", "--only", "mma_pack_x_k", "--sass", "/tmp/never-made"]) == 2
    assert "--sass needs ptxas on PATH" in capsys.readouterr().err
    assert not os.path.exists("/tmp/never-made")


_RECORD_PDL = r"""
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import numpy as np
import cudasim_run
import check_compile as chk
from numba_kernels import cuda as kc


def one_case():  # a launch with launch.launch's pdl keyword, as the GEMVs' launchers make it
    X, out = np.ones((1, 64), np.float32), np.zeros((1, 64), np.float32)
    kc._NS["launch"](kc._NS["rmsnorm_k"], 1, 32, X, np.zeros(64, np.float32), np.float32(1e-6), out, 0, 1, None,
                     pdl=True)
    cudasim_run.CASES.append({"kernels": ["rmsnorm_k"], "bitwise": True, "cuda_op": "rmsnorm", "case": "pdl"})


cudasim_run.op_cases = one_case
sys.exit(chk.record())
"""


def _record(tmp_path, script_text):
    """Run ``script_text`` (a stand-in op_cases, then check_compile.record) under the simulator;
    return the JSON record it prints."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "rec.py"
    script.write_text(script_text)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=root)
    p = subprocess.run([sys.executable, str(script), root], cwd=root, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith(chk.MARK))
    return json.loads(line[len(chk.MARK):])


def test_record_passes_launch_keywords_through(tmp_path):
    """The simulator step records a launch made with ``pdl=True`` (launch.launch's keyword) and
    launches it: before, its recording stand-in took positional arguments only and the whole run
    failed at the first such launch."""
    rec = _record(tmp_path, _RECORD_PDL)
    assert [k["name"] for k in rec["kernels"]] == ["rmsnorm_k"] and not rec["missed"] and not rec["not_bitwise"]


_RECORD_GEMV = r"""
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import numpy as np
from numba import cuda
import cudasim_run
import check_compile as chk
from numba_kernels import cuda as kc


def one_case():  # one GEMV, launched as the simulator launches it: without PDL
    X, W = np.ones((1, 64), np.float32), np.ones((40, 64), np.float32)
    kc.gemv(cuda.to_device(X), cuda.to_device(W), cuda.to_device(np.zeros((1, 40), np.float32)), 1)
    cudasim_run.CASES.append({"kernels": sorted(kc.LAUNCHES), "bitwise": True, "cuda_op": "gemv", "case": "one"})


cudasim_run.op_cases = one_case
sys.exit(chk.record())
"""


def test_record_adds_the_pdl_build_of_a_gemv_the_simulator_launched(tmp_path):
    """A captured step on sm_90 launches a GEMV's PDL build (GemvCfg.with_pdl), which the simulator
    never launches: the record step notes it beside the launched build, with the same argument
    types, its source waiting in pdl_wait() (so step 2 compiles both)."""
    ks = _record(tmp_path, _RECORD_GEMV)["kernels"]
    assert len(ks) == 2 and all(k["kind"] == "generated" for k in ks), [k["name"] for k in ks]
    plain, pdl = ks
    assert plain["name"].startswith("gemv_f32_") and pdl["name"] == plain["name"] + "_pdl"
    assert pdl["sigs"] == plain["sigs"] and len(plain["sigs"]) == 1
    assert "pdl_wait()" in pdl["text"] and "pdl_wait()" not in plain["text"]
