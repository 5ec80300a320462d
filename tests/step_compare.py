"""One model step on the CPU engine and on the CUDA engine, compared bit for bit: shared by the
simulator's model steps (``tests/cudasim_run.py``) and ``tools/fuzz_configs.py`` (``--sim``, and
``--device`` on a GPU)."""

from __future__ import annotations

import numpy as np

from numba_kernels.launch import LAUNCHES


def model_step(name, rows, f, ec, sc, eg, sg):
    """One step ``f(engine, session)`` on the CPU engine and the CUDA engine (simulated, or the GPU's): the record
    of the kernels it ran, whether the logits (on the host) and the cache digests are equal, and
    whether the CUDA step's logits are one of its cache's mapped ring buffers the lm head stored
    into (Engine._logits_slot)."""
    from harness.engine.backend import host_view

    LAUNCHES.clear()
    want, got = np.asarray(f(ec, sc)[0]), np.asarray(f(eg, sg)[0])  # logits come to the host
    rings = [t for ring in sg.cache.logit_rings.values() for t in ring]
    return dict(step=name, rows=rows, kernels=sorted(LAUNCHES),
                logits_bitwise=bool(np.array_equal(got.view(np.uint32), want.view(np.uint32))),
                digest_equal=sc.cache.digest() == sg.cache.digest(),
                mapped_logits=any(np.shares_memory(got, host_view(t.buf)) for t in rings))
