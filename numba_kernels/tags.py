"""One kernel source, two targets: the tags on the family modules' functions, and the build that
binds them to a target.

The family modules (``linear.py``, ``norms.py``, ``attention.py``, ...) are plain Python. They
never import ``numba`` or ``numba.cuda``; each function carries a tag:

- ``@body``: the float32 arithmetic of one output (or one tile, one column ...), compiled for both
  targets (``njit`` on the CPU, ``cuda.jit(device=True)`` on CUDA);
- ``@twin(op)``: the CPU twin of ``op`` (``njit``, cached on disk; ``parallel=True`` for
  ``prange`` loops); ``host=True`` marks a host-side helper that has no CUDA launcher;
- ``@kernel``: a CUDA kernel (``cuda.jit``);
- ``@launcher(op)``: the host function that launches ``op``'s kernels, with the twin's name and
  signature (cloned, not compiled). ``@launcher(of=op)`` is one version of ``op`` (``gemv``,
  ``attention_split`` ...), which the CUDA front door exports under its own name; a version may
  take keyword arguments of its own after the op's (``cfg=None``: a configuration of a generated
  kernel);
- ``@generator``: host-side Python behind the *generated* kernels -- a function that writes the
  source of one kernel configuration (a :class:`KernelSource`), or one that chooses a
  configuration. The CUDA build puts it into the namespace as it is (neither cloned nor compiled:
  it runs on the host with its own module's globals); :func:`numba_kernels.launch.generated`
  compiles the source it writes, once per configuration, in the CUDA namespace. The CPU build
  skips it.

Generated kernels are the fast ones whose register tiles and unrolled loops depend on a
configuration (tile sizes, rows per launch, head dims): writing them as text per configuration
gives Numba straight-line code with every index a constant. Their source calls the same
``@body`` functions and target primitives as the tagged kernels (``fma``, ``fmul``, ``exp32`` ...),
plus the memory primitives of :mod:`numba_kernels.intrin`.

``bound={public name: value}`` on a twin or launcher exports one op per entry, with the last
argument fixed (the scalar maps share one twin and one kernel).

The names a source uses that each target binds differently -- ``fma``, ``fmul``, ``sqrt32``,
``bits_to_f32``, ``widen``, ``wbits``, ``barrier``, ``syncwarp``, ``pdl_trigger``, ``prange``, ``cuda``, ``launch``, ``pdl_on``, ``grid1``,
``block_size``, ``zero_pos``, ``scratch``, ``zero_buffer``, ``generated``, ``aligned`` -- are imported from here, where they only stand for the target's.
:func:`build` clones every tagged function into one namespace per target (``types.FunctionType``
on the same code object) holding that target's primitives, every family's UPPER_CASE constants
and every other tagged function, then compiles it. Calling a family function directly, without a
front door, raises.
"""

from __future__ import annotations

import builtins
import dis
import inspect
import math
import types
from typing import NamedTuple

import numpy as np

from . import dispatch

_TAG = "_primewalk_tag"
KINDS = ("body", "twin", "kernel", "launcher", "generator")


def _tag(f, kind, op=None, **opts):
    setattr(f, _TAG, dict(kind=kind, op=op, **opts))
    return f


def body(f):
    """The arithmetic of one output, shared by the CPU twin and every CUDA kernel of an op."""
    return _tag(f, "body")


def twin(op=None, parallel=False, host=False, bound=None):
    """The CPU twin of ``op`` (exported as ``op``, or under each name of ``bound``)."""
    return lambda f: _tag(f, "twin", op, parallel=parallel, host=host, bound=bound)


def kernel(f):
    """A CUDA kernel."""
    return _tag(f, "kernel")


def launcher(op=None, of=None, bound=None):
    """The CUDA launcher of ``op``; or, with ``of``, a version of op ``of`` exported under its own
    name."""
    return lambda f: _tag(f, "launcher", op, of=of, bound=bound)


def generator(f):
    """Host code behind generated kernels: a source writer or a configuration choice (CUDA only)."""
    return _tag(f, "generator")


def tag_of(f):
    return getattr(f, _TAG, None) if isinstance(f, types.FunctionType) else None


# ------------------------------------------------------------------------------------------------
# stand-ins for the names each target binds (see the module docstring)
# ------------------------------------------------------------------------------------------------
class _Unbound:
    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.name}: family functions run through numba_kernels.cpu or "
                           f"numba_kernels.cuda, which bind it")

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        return _Unbound(f"{self.name}.{attr}")

    def __repr__(self):
        return f"<unbound {self.name}>"


TARGET_NAMES = ("fma", "fmul", "sqrt32", "bits_to_f32", "widen", "wbits", "barrier", "syncwarp", "pdl_trigger", "prange",
                "cuda", "launch", "pdl_on", "grid1", "block_size", "zero_pos", "scratch", "zero_buffer", "generated",
                "aligned")
(fma, fmul, sqrt32, bits_to_f32, widen, wbits, barrier, syncwarp, pdl_trigger, prange, cuda, launch, pdl_on, grid1,
 block_size, zero_pos, scratch, zero_buffer, generated, aligned) = (_Unbound(n) for n in TARGET_NAMES)


# ------------------------------------------------------------------------------------------------
# generated kernels
# ------------------------------------------------------------------------------------------------
STATIC_SMEM = 48 * 1024  # shared memory a block may declare statically; more is dynamic (opted in per kernel)
MAX_SMEM = 227 * 1024  # shared memory one block may use on an H100 / H200 (dynamic, opted in)


class KernelSource(NamedTuple):
    """What a ``@generator`` writes for one configuration: the Python source ``text`` defining the
    kernel ``kern`` (and the device helpers it calls, decorated ``@devf``: force-inlined), its
    ``name`` (unique per configuration: the launch counter and the compiled-kernel cache use it),
    ``threads`` per block, ``smem`` bytes of dynamic shared memory (0: none; above
    ``STATIC_SMEM`` the launch raises the kernel's limit first) and extra ``cuda.jit`` options
    as (key, value) pairs (``launch_bounds``, ``max_registers``)."""
    name: str
    text: str
    threads: int
    smem: int = 0
    jit: tuple = ()


# ------------------------------------------------------------------------------------------------
# the build
# ------------------------------------------------------------------------------------------------
def tagged(modules, kind):
    """[(function, tag)] of ``kind`` in module order, then definition order."""
    out = []
    for m in modules:
        for v in vars(m).values():
            t = tag_of(v)
            if t is not None and t["kind"] == kind and v.__module__ == m.__name__:
                out.append((v, t))
    return out


def constants(modules) -> dict:
    """Every UPPER_CASE name of the modules (imported ones included); one name, one object."""
    out: dict = {}
    for m in modules:
        for k, v in vars(m).items():
            if not k.isupper() or k.startswith("_"):
                continue
            if k in out and out[k] is not v:
                raise ValueError(f"{m.__name__}.{k} = {v!r} is not the {k} of another family: import it")
            out[k] = v
    return out


def unbound_names(f) -> list:
    """The global names ``f`` (and the functions nested in it) loads that neither its globals nor
    the builtins hold: for a function cloned into a target's namespace, the names that would
    raise ``NameError`` when the line runs (tests/test_launch_args.py checks every launcher)."""
    def loads(code):
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                yield ins.argval
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                yield from loads(c)

    return sorted(n for n in set(loads(f.__code__)) if n not in f.__globals__ and not hasattr(builtins, n))


def clone(f, ns):
    """``f``'s code with ``ns`` as its globals."""
    g = types.FunctionType(f.__code__, ns, f.__name__, f.__defaults__, f.__closure__)
    g.__doc__, g.__qualname__ = f.__doc__, f.__qualname__
    return g


def exported(f, t) -> dict:
    """{public name: function} for a twin or launcher ``f`` (already built)."""
    if t["bound"]:
        return {name: _bind_last(f, value, name) for name, value in t["bound"].items()}
    return {t["op"] or f.__name__: f}


def _bind_last(f, value, name):
    def op(*args):
        return f(*args, value)

    sig = inspect.signature(getattr(f, "py_func", f))
    op.__signature__ = sig.replace(parameters=list(sig.parameters.values())[:-1])
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{f.__name__}(..., {value!r})"
    return op


def build(modules, name, bindings, jit):
    """Clone and compile every tagged function of ``modules`` for one target.

    ``bindings``: the target's names (primitives, ``cuda`` / ``prange``, launch helpers). ``jit``:
    {kind: decorator(function, tag) or None}; kinds without an entry are skipped (the CPU build
    has no kernels or launchers, the CUDA build no twins). Returns (namespace, {public name: op}).
    """
    ns = {"__name__": name, "np": np, "math": math, "dispatch": dispatch}
    ns.update(constants(modules))
    ns.update(bindings)
    ops = {}
    for kind in KINDS:
        if jit.get(kind) is None:
            continue
        for f, t in tagged(modules, kind):
            if f.__name__ in ns:
                raise ValueError(f"{f.__module__}.{f.__name__}: the name is taken in the {name} namespace")
            ns[f.__name__] = built = jit[kind](f if kind == "generator" else clone(f, ns), t)
            if kind in ("twin", "launcher"):
                ops.update(exported(built, t))
    return ns, ops


def signatures(modules) -> dict:
    """{op: {"cpu": signature, "cuda": signature}} from the tags (no compilation, no GPU). A
    ``host`` twin has no "cuda"; a version of an op has no "cpu" and names the op under "of"."""
    out: dict = {}
    for kind, side in (("twin", "cpu"), ("launcher", "cuda")):
        for f, t in tagged(modules, kind):
            for name, op in exported(f, t).items():
                out.setdefault(name, {})[side] = inspect.signature(op)
                if t.get("host"):
                    out[name]["host"] = True
                if t.get("of"):
                    out[name]["of"] = t["of"]
    return out
