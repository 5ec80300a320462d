"""Primitives for prototype kernels, exact on the GPU *and* under Numba's CUDA simulator.

On a GPU: ``fma`` = ``cuda.fma`` (one rounding), ``fmul`` = ``__fmul_rn`` (never contracted),
``bits_to_f32`` = ``__int_as_float``. Under ``NUMBA_ENABLE_CUDASIM=1`` the same functions are
plain Python: ``fma`` calls a CPU-compiled ``llvm.fma.f32`` (a true fused multiply-add, so a
simulated kernel is bit-identical to the CPU twin), ``fmul`` is a float32 multiply.

``B`` holds the bodies of :mod:`numba_kernels.exact` (``exp32``, ``dot_rows``, ``merge_scale``…)
specialised for this target. Set ``NUMBA_ENABLE_CUDASIM`` before importing this module.
"""

from __future__ import annotations

import numpy as np
from numba.core import config as _config

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still names np.row_stack
    np.row_stack = np.vstack

from llvmlite import ir  # noqa: E402
from numba import cuda, njit  # noqa: E402
from numba.core import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from numba_kernels import attention, exact, tags  # noqa: E402

SIMULATED = bool(_config.ENABLE_CUDASIM)
F32 = np.float32
dev = cuda.jit(device=True)


@intrinsic
def _llvm_fma(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)

    return sig, codegen


@njit(cache=True)
def cpu_fma(a, b, c):
    """fma(a, b, c) in float32 with one rounding, compiled for the CPU."""
    return _llvm_fma(np.float32(a), np.float32(b), np.float32(c))


if not SIMULATED:
    from numba.cuda import libdevice

    @dev
    def fma(a, b, c):
        return cuda.fma(F32(a), F32(b), F32(c))

    @dev
    def fmul(a, b):
        return libdevice.fmul_rn(F32(a), F32(b))

    @dev
    def bits_to_f32(i):
        return libdevice.int_as_float(np.int32(i))
else:
    def fma(a, b, c):
        return F32(cpu_fma(F32(a), F32(b), F32(c)))

    def fmul(a, b):
        return F32(a) * F32(b)

    def bits_to_f32(i):
        return np.array([i], np.int32).view(np.float32)[0]


# the shared exact bodies (exact.py, attention.py merge steps) compiled for this target
B, _ = tags.build([exact, attention], __name__, {"fma": fma, "fmul": fmul, "bits_to_f32": bits_to_f32},
                  {"body": lambda f, _tag: dev(f)})
SLICE = exact.SLICE
ATT_TILE = exact.ATT_TILE
