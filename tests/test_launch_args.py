"""What the CUDA build hands to a launch, checked without a GPU: two faults that the simulator
cannot see (it runs kernels and launchers as Python) and that first showed on the H200.

- A kernel argument of ``None`` (an optional array whose branch is compiled out): numba-cuda
  0.30.4 compiles the kernel but refused to marshal the value at launch;
  :func:`numba_kernels.launch.pass_none_args` passes a null pointer. Checked: the wrapper's
  marshalling, and that a ``none`` parameter is exactly one 8-byte ``.param`` of the compiled
  kernel (what the null pointer fills).
- A launcher runs cloned into the CUDA build's namespace (:func:`numba_kernels.tags.build`), not
  with its module's globals: a name its module imports but the namespace lacks (``dataclasses``)
  raised ``NameError`` only on a path the simulator never takes (PDL on). Checked: every global
  name every launcher loads is bound in its namespace or a builtin.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np

np.row_stack = getattr(np, "row_stack", np.vstack)

from numba import cuda, types  # noqa: E402

from numba_kernels import launch, tags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _FakeKernel:
    """Stands for numba-cuda's ``_Kernel`` (the class whose marshalling is wrapped)."""

    extensions: list = []

    def _prepare_args(self, ty, val, stream, retr, kernelargs):
        kernelargs.append(("numba-cuda", str(ty), val))


def test_none_is_passed_as_a_null_pointer_and_everything_else_as_before():
    cls = type("K", (_FakeKernel,), {})
    assert launch.pass_none_args(cls) is True
    assert launch.pass_none_args(cls) is True  # once: not wrapped twice
    args: list = []
    k = cls()
    k._prepare_args(types.none, None, 0, [], args)
    k._prepare_args(types.int64, 5, 0, [], args)
    k._prepare_args(types.none, None, 0, [], args)
    assert args == [0, ("numba-cuda", "int64", 5), 0]


def test_numba_cuda_kernel_class_is_wrapped():
    """numba-cuda's own ``_Kernel`` is there and wrapped (an upgrade that moved it fails here)."""
    from numba.cuda import dispatcher

    assert launch.pass_none_args() is True
    assert getattr(dispatcher._Kernel._prepare_args, "_passes_none", False)
    args: list = []
    dispatcher._Kernel._prepare_args(None, types.none, None, 0, [], args)
    assert args == [0]


def _params(fn, sig):
    ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
    entry = ptx[ptx.index(".entry"):]
    return re.findall(r"^\s*\.param (\.\w+)", entry[:entry.index(")")], re.M)


def test_a_none_parameter_is_one_pointer_sized_param():
    def with_none(a, x, n):
        if x is None:
            a[0] = n

    def without(a, n):
        a[0] = n

    a = types.int64[::1]
    p_none = _params(with_none, (a, types.none, types.int64))
    p_plain = _params(without, (a, types.int64))
    assert len(p_none) == len(p_plain) + 1
    array_params = len(p_plain) - 1
    assert p_none[array_params] == ".u64"  # the none argument's, between the array's and n's


def test_every_launcher_loads_only_names_its_namespace_binds():
    code = """
        import json
        from numba_kernels import cuda as C, tags

        launchers = [(f, C._NS[f.__name__]) for f, _ in tags.tagged(C.FAMILIES, "launcher")]
        bad = [f"{f.__module__}.{f.__name__}: {n}" for f, g in launchers for n in tags.unbound_names(g)]
        print(json.dumps([len(launchers), bad]))
    """
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    n, bad = json.loads(p.stdout.strip().splitlines()[-1])
    assert n > 20 and bad == []


def test_unbound_names_sees_a_missing_name_in_nested_code_too():
    src = ("def f(c, xs):\n    y = [dataclasses.replace(x) for x in xs]\n"
           "    return np.asarray(y), len(y), c.with_pdl()\n")
    ns: dict = {}
    exec(compile(src, "<t>", "exec"), {}, ns)
    g = tags.clone(ns["f"], {"np": np})
    assert tags.unbound_names(g) == ["dataclasses"]
    assert tags.unbound_names(tags.clone(ns["f"], {"np": np, "dataclasses": None})) == []
