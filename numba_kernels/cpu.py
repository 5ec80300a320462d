"""The CPU front door: every op's twin (``@njit``, float32, cached on disk), gathered from the
family modules.

Each twin loops over its op's independent outputs (rows, heads, channels, columns) and computes
each one with the same ``@body`` the CUDA kernels' threads run, so a twin and its kernels agree
bit for bit. Outputs may be spread over threads (``prange``); no reduction is ever split across
threads. Shapes and contracts: the family modules' docstrings.

The CPU primitives: ``fma`` is the ``llvm.fma.f32`` intrinsic (one rounding), ``fmul`` a plain
float32 multiply (LLVM does not contract without fast-math), ``sqrt32`` ``math.sqrt`` on a
float32 (``llvm.sqrt.f32``), ``bits_to_f32`` an LLVM bitcast, ``widen`` a weight element as
float32 (a bf16 bit pattern, uint16, widened exactly: its bits shifted up by 16; anything else
converted), ``wbits`` an MMA operand element's float32 bit pattern (uint16 bf16 bits shifted up, a
float32 bitcast, a uint32 as it is), ``barrier`` nothing (one lane).
"""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import caching as _nb_caching
from numba.core import types
from numba.extending import intrinsic

from . import attention, conv, deltanet, dispatch, elementwise, exact, linear, moe, norms, rope, sampling, tags, trace
from . import mma_attention, mma_gemm

FAMILIES = (exact, elementwise, linear, norms, attention, rope, conv, deltanet, moe, sampling, trace, mma_gemm,
            mma_attention)


# ------------------------------------------------------------------------------------------------
# on-disk cache: keyed on every source file the twins are built from
# ------------------------------------------------------------------------------------------------
# Numba keys a cached function on the file that defines it, but every twin has bodies of other
# family files compiled into it (and the clones have this file's primitives compiled in): an edit
# to exact.py alone would load stale twins from __pycache__. The twins' locators therefore stamp
# the contents of all of them.
_SOURCES = tuple(os.path.abspath(m.__file__) for m in (tags, dispatch, *FAMILIES)) + (os.path.abspath(__file__),)


def _sources_stamp() -> str:
    h = hashlib.sha256()
    for p in _SOURCES:
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _twin_locator(base):
    class TwinLocator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.abspath(py_file) not in _SOURCES:
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return _sources_stamp()

    TwinLocator.__name__ = TwinLocator.__qualname__ = "Twin" + base.__name__.lstrip("_")
    return TwinLocator


def _install_locators() -> None:
    impl = getattr(_nb_caching, "CacheImpl", None) or _nb_caching._CacheImpl  # numba ≥ 0.62 / older
    if any(getattr(c, "_primewalk_twin", False) for c in impl._locator_classes):
        return
    bases = [getattr(_nb_caching, n, None) or getattr(_nb_caching, "_" + n)
             for n in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")]
    mine = [_twin_locator(b) for b in bases]
    for c in mine:
        c._primewalk_twin = True
    impl._locator_classes = mine + list(impl._locator_classes)


_install_locators()


# ------------------------------------------------------------------------------------------------
# primitives
# ------------------------------------------------------------------------------------------------
@intrinsic
def _fma(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def _bits_to_f32(typingctx, i):
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


def widen_intrinsic(typingctx, x):
    """``widen(x)``: a uint16 is a bf16 bit pattern, widened exactly (``bits_to_f32(x << 16)``); any
    other number is converted to float32 (a float32 stays itself). The CUDA target compiles the
    same typing and code (:mod:`numba_kernels.launch`)."""
    if isinstance(x, types.Integer) and x.bitwidth == 16 and not x.signed:
        def codegen(context, builder, signature, args):
            u = builder.zext(args[0], ir.IntType(32))
            return builder.bitcast(builder.shl(u, ir.Constant(ir.IntType(32), 16)), ir.FloatType())
    elif isinstance(x, (types.Integer, types.Float)):
        def codegen(context, builder, signature, args):
            return context.cast(builder, args[0], signature.args[0], types.float32)
    else:
        return None
    return types.float32(x), codegen


widen = intrinsic(widen_intrinsic)


def wbits_intrinsic(typingctx, x):
    """``wbits(x)``: the float32 bit pattern (uint32) of an element of an exact-bf16 operand array:
    a uint16 is a bf16 bit pattern (its bits shifted up by 16: the widened float32's bits), a
    float32 its own bits, any other 32-bit integer already a bit pattern (a ``view(np.uint32)``).
    So one MMA emulation reads float32 operands, their uint32 views and bf16-resident weights
    (uint16) alike. The CUDA target compiles the same typing and code (:mod:`numba_kernels.launch`)."""
    u32 = ir.IntType(32)
    if isinstance(x, types.Integer) and x.bitwidth == 16 and not x.signed:
        def codegen(context, builder, signature, args):
            return builder.shl(builder.zext(args[0], u32), ir.Constant(u32, 16))
    elif isinstance(x, types.Float) and x.bitwidth == 32:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], u32)
    elif isinstance(x, types.Integer) and x.bitwidth == 32:
        def codegen(context, builder, signature, args):
            return args[0]
    else:
        return None
    return types.uint32(x), codegen


wbits = intrinsic(wbits_intrinsic)


@njit(inline="always")
def fma(a, b, c):
    return _fma(np.float32(a), np.float32(b), np.float32(c))


@njit(inline="always")
def fmul(a, b):
    return np.float32(a) * np.float32(b)


@njit(inline="always")
def bits_to_f32(i):
    return _bits_to_f32(np.int32(i))


@njit(inline="always")
def barrier():
    pass


sqrt32 = math.sqrt


# ------------------------------------------------------------------------------------------------
# the twins
# ------------------------------------------------------------------------------------------------
def _jit_twin(f, t):
    return njit(cache=True, parallel=t["parallel"])(f)


_NS, OPS = tags.build(FAMILIES, __name__,
                      dict(fma=fma, fmul=fmul, sqrt32=sqrt32, bits_to_f32=bits_to_f32, widen=widen, wbits=wbits,
                           barrier=barrier, prange=prange),
                      {"body": lambda f, t: njit(cache=True)(f), "twin": _jit_twin})
BODIES = {f.__name__: _NS[f.__name__] for f, _ in tags.tagged(FAMILIES, "body")}
globals().update(tags.constants(FAMILIES))
globals().update(BODIES)
globals().update(OPS)
