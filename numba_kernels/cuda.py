"""The CUDA front door: every op's launcher, with the CPU twin's name and signature, gathered from
the family modules and bit-identical to the twins.

Import this module only when the CUDA backend is chosen: importing the package never touches
CUDA. Every kernel's threads compute their outputs with the same ``@body`` functions as
:mod:`numba_kernels.cpu`, compiled as device functions with this target's primitives
(:mod:`numba_kernels.launch`); the generated kernels (``@generator``) are compiled per
configuration in this namespace; which kernel serves a launch is :mod:`numba_kernels.dispatch`'s
table. Beyond the ops: the versions (``linear_naive``, ``gemv``, ``gemm``, ``attention_tiled``,
``attention_split``, ``attention_prime``, ``gdn_recurrence_naive``, ``gdn_recurrence_fast``),
``capture`` / ``Graph`` (captured steps), ``zero_pos``, ``generated`` and ``SIMULATED``.
"""

from __future__ import annotations

from numba import cuda as _cuda

from . import dispatch, launch, tags
from .cpu import FAMILIES

SIMULATED = launch.SIMULATED
capture, Graph, zero_pos, LAUNCHES = launch.capture, launch.Graph, launch.zero_pos, launch.LAUNCHES
generated = launch.generated

_NS, OPS = tags.build(FAMILIES, __name__, launch.bindings(),
                      {"body": lambda f, t: _cuda.jit(device=True)(f), "kernel": lambda f, t: _cuda.jit(f),
                       "launcher": lambda f, t: f, "generator": lambda f, t: f})
launch.set_namespace(_NS)
VERSIONS = {f.__name__: t["of"] for f, t in tags.tagged(FAMILIES, "launcher") if t["of"]}  # version: its op
GENERATORS = {f.__name__: f for f, _ in tags.tagged(FAMILIES, "generator")}
globals().update(tags.constants(FAMILIES))
globals().update({f.__name__: _NS[f.__name__] for f, _ in tags.tagged(FAMILIES, "body")})
globals().update(OPS)

# exact-bf16 (issue #19): on a GPU, linear_mma issues mma.sync (mma_tc.py: inline PTX, which the
# simulator cannot run); under the simulator it stays the naive kernel (the twin's emulation)
if not SIMULATED:
    from . import mma_tc

    mma_tc.bind(_NS)
    linear_mma_tc = mma_tc.linear_mma_tc
    linear_mma = dispatch.MMA_KERNELS["linear_mma"] = linear_mma_tc
    linear_flag_mma = dispatch.MMA_KERNELS["linear_flag_mma"] = mma_tc.linear_flag_mma_tc
    linear_swiglu_mma = dispatch.MMA_KERNELS["linear_swiglu_mma"] = mma_tc.linear_swiglu_mma_tc
    attention_mma_tc = mma_tc.attention_mma_tc
    attention_mma = dispatch.MMA_KERNELS["attention_mma"] = mma_tc.attention_mma_gpu
