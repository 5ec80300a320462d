"""The layout of numba_kernels/ (no GPU, no simulator): one module per op family, two thin front
doors that export the same ops, one home per constant, no import cycles, and a package whose
import never touches CUDA."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys

import pytest

from numba_kernels import cpu, dispatch, tags
from numba_kernels.cpu import FAMILIES

PKG = os.path.dirname(os.path.abspath(cpu.__file__))
ROOT = os.path.dirname(PKG)
MODULES = sorted(f[:-3] for f in os.listdir(PKG) if f.endswith(".py") and f != "__init__.py")
SIGS = tags.signatures(FAMILIES)


def _tree(name):
    with open(os.path.join(PKG, name + ".py"), encoding="utf-8") as f:
        return ast.parse(f.read())


def _imports(name):
    """(package modules, other top-level packages) that module ``name`` imports anywhere."""
    own, other = set(), set()
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                if node.module:
                    own.add(node.module.split(".")[0])
                else:
                    own.update(a.name for a in node.names)
            elif node.module:
                other.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("numba_kernels."):
                    own.add(a.name.split(".")[1])
                else:
                    other.add(a.name.split(".")[0])
    return own & set(MODULES), other


@pytest.mark.parametrize("op", sorted(n for n, s in SIGS.items() if "cpu" in s and not s.get("host")))
def test_front_doors_export_each_op_with_one_signature(op):
    """The CUDA launcher takes the twin's arguments; rope, kv_write and attention also take the
    device-side position of a captured step (``pos=None``)."""
    cpu_p = list(SIGS[op]["cpu"].parameters.values())
    assert "cuda" in SIGS[op], f"{op} has a CPU twin but no CUDA launcher"
    cuda_p = list(SIGS[op]["cuda"].parameters.values())
    assert cuda_p[:len(cpu_p)] == cpu_p, (op, SIGS[op])
    extra = cuda_p[len(cpu_p):]
    assert [(p.name, p.default) for p in extra] in ([], [("pos", None)]), (op, extra)


def test_host_helpers_and_versions():
    """Ops on one side only: host-side helpers (CPU) and versions of an op (CUDA), each with its
    op's signature."""
    host = {n for n, s in SIGS.items() if "cuda" not in s}
    assert host and all(SIGS[n].get("host") for n in host)
    versions = {n: s["of"] for n, s in SIGS.items() if "cpu" not in s}
    assert set(versions) == {"linear_naive", "gemv", "gemm", "attention_tiled", "attention_split", "attention_prime",
                             "gdn_recurrence_naive", "gdn_recurrence_fast", "linear_mma_naive", "attention_mma_naive",
                             "attention_mma_tiled", "attention_mma_split"}
    for n, of in versions.items():  # the op's parameters, then optional ones of its own: a configuration
        # (cfg=None) first, then any others (gemv's epilogue arguments), so that a version runs as its op
        mine, op = list(SIGS[n]["cuda"].parameters.values()), list(SIGS[of]["cuda"].parameters.values())
        extra = mine[len(op):]
        assert mine[:len(op)] == op and all(p.default is not inspect.Parameter.empty for p in extra), (n, of)
        assert not extra or (extra[0].name, extra[0].default) == ("cfg", None), (n, of)


def test_cpu_front_door_is_the_tags():
    assert set(cpu.OPS) == {n for n, s in SIGS.items() if "cpu" in s}
    for n, f in cpu.OPS.items():
        assert inspect.signature(getattr(f, "py_func", f)) == SIGS[n]["cpu"], n
        assert getattr(cpu, n) is f


def test_no_import_cycles():
    graph = {m: _imports(m)[0] for m in MODULES}
    state: dict = {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", f"import cycle: {' -> '.join(path + [m])}"
        state[m] = "open"
        for n in sorted(graph[m]):
            visit(n, path + [m])
        state[m] = "done"

    for m in MODULES:
        visit(m, [])


def test_family_modules_are_plain_python():
    """Family modules (and tags, dispatch) import neither numba nor numba.cuda: the front doors
    compile them."""
    for m in FAMILIES + (tags, dispatch):
        name = m.__name__.rsplit(".", 1)[1]
        assert "numba" not in _imports(name)[1], name
    assert "cuda" not in _imports("cpu")[0] and "launch" not in _imports("cpu")[0]


def test_each_constant_has_one_home():
    """An UPPER_CASE name is assigned in one module of the package (``SLICE``, ``ATT_TILE``, the
    dispatch thresholds ...); the others import it."""
    homes: dict = {}
    for m in MODULES:
        if m in ("reference", "cpu", "cuda"):  # the float64 oracle; the front doors' own tables
            continue
        for node in _tree(m).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id.isupper():
                        homes.setdefault(n.id, []).append(m)
    twice = {k: v for k, v in homes.items() if len(v) > 1}
    assert not twice, twice
    assert homes["GEMV_MAX_ROWS"] == ["dispatch"] and homes["SPLIT_MAX_ROWS"] == ["dispatch"]
    assert homes["SLICE"] == ["exact"] and homes["ATT_TILE"] == ["exact"]


def test_twin_cache_stamps_every_source_file():
    stamped = {os.path.basename(p) for p in cpu._SOURCES}
    assert {os.path.basename(m.__file__) for m in FAMILIES + (tags, dispatch)} | {"cpu.py"} <= stamped


def test_importing_the_package_never_imports_cuda():
    code = ("import sys, numba_kernels.cpu, numba_kernels.reference, harness.engine.model, harness.engine.backend; "
            "print(sorted(m for m in sys.modules if m == 'numba.cuda' or m.startswith('numba.cuda.') "
            "or m in ('numba_kernels.cuda', 'numba_kernels.launch')))")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "PRIMEWALK_BACKEND")}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]", p.stdout


def test_dispatch_table_picks():
    assert dispatch.pick("linear", 1) == dispatch.pick("linear", dispatch.GEMV_MAX_ROWS) == "gemv"
    assert dispatch.pick("linear", dispatch.GEMV_MAX_ROWS + 1) == "gemm"
    assert dispatch.pick("attention", dispatch.SPLIT_MAX_ROWS) == "attention_split"
    assert dispatch.pick("attention", dispatch.SPLIT_MAX_ROWS + 1) == "attention_prime"
    assert dispatch.pick("gdn_recurrence", 1) == dispatch.pick("gdn_recurrence", 4096) == "gdn_recurrence_fast"
    assert all(rows[-1][0] is None for rows in dispatch.TABLE.values())
    assert dispatch.GEMV_BUCKETS[-1] == dispatch.GEMV_MAX_ROWS


def test_family_functions_need_a_front_door():
    from numba_kernels import linear

    import numpy as np

    with pytest.raises(RuntimeError, match="numba_kernels.cpu or numba_kernels.cuda"):
        linear.linear_cpu(np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32), 1)
