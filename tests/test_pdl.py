"""Programmatic dependent launch (numba_kernels.launch.pdl_on, intrin.pdl_trigger / pdl_wait):
when it is on, what a launch carries, and what the kernels compile to -- all without a GPU.

The ordering itself (a PDL GEMV's X read after its producer's writes) is the GPU's: on the H200,
``harness device-check`` compares the captured steps, launched with PDL, bitwise with the CPU
twin, and the simulator tests run the PDL builds of the GEMVs bitwise (tests/test_sim_gemv.py,
tests/test_sim_mma_tc.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _py(code, **env):
    """Run ``code`` in a fresh process (PDL's decision is fixed once per process) with ``env``;
    return the JSON it prints last."""
    e = {k: v for k, v in os.environ.items() if k not in ("PRIMEWALK_PDL", "NUMBA_ENABLE_CUDASIM")}
    e.update(env, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=e, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


_STATE = """
    import json
    import numpy as np
    np.row_stack = np.vstack
    from numba_kernels import intrin, launch
    print(json.dumps([intrin.pdl_emit(), launch.pdl_on()]))
"""


def test_pdl_off_without_a_gpu_or_when_asked():
    """No GPU (CI, this machine): off. PRIMEWALK_PDL=0: off whatever the device. Under the
    simulator: off (one kernel at a time, nothing to overlap)."""
    assert _py(_STATE) == [False, False]
    assert _py(_STATE, PRIMEWALK_PDL="0") == [False, False]
    assert _py(_STATE, PRIMEWALK_PDL="1", NUMBA_ENABLE_CUDASIM="1") == [False, False]


def test_launch_config_carries_the_attribute_only_for_this_threads_pdl_launch():
    """With PDL forced on, numba-cuda's launch configuration gets programmatic_stream_serialization
    exactly while this thread's launch asks for it: not before, not after, not in another thread."""
    got = _py("""
        import json, threading
        import numpy as np
        np.row_stack = np.vstack
        from numba_kernels import launch
        from numba.cuda import dispatcher
        on = launch.pdl_on()
        cfg = lambda: bool(dispatcher.LaunchConfig(grid=1, block=32, shmem_size=0).programmatic_stream_serialization)
        before = cfg()
        launch._PDL_TLS.on = True
        inside = cfg()
        other = []
        t = threading.Thread(target=lambda: other.append(cfg()))
        t.start(); t.join()
        launch._PDL_TLS.on = False
        print(json.dumps([on, before, inside, other[0], cfg()]))
    """, PRIMEWALK_PDL="1")
    assert got == [True, False, True, False, False]


class _Disp:
    """A stand-in kernel: records, per call, whether the launch asked for PDL."""

    def __init__(self, fail=False):
        self.calls, self.fail = [], fail
        self.py_func = self._k

    @staticmethod
    def _k():
        pass

    def __getitem__(self, cfg):
        def call(*args):
            from numba_kernels import launch

            self.calls.append((cfg[2] == 0, bool(getattr(launch._PDL_TLS, "on", False))))
            if self.fail:
                raise RuntimeError("launch failed")
        return call


def test_launch_asks_for_pdl_only_inside_a_capture(monkeypatch):
    """``launch(..., pdl=True)`` carries the attribute when a capture records it and PDL is on;
    at once (no capture), without ``pdl``, or with PDL off it is a plain launch; the flag is down
    again after a launch that raises."""
    from numba_kernels import launch

    monkeypatch.setattr(launch, "pdl_on", lambda: True)
    k = _Disp()
    launch.launch(k, 1, 32, pdl=True)  # not capturing: plain
    monkeypatch.setattr(launch._Launch, "target", object())  # a capture's builder
    launch.launch(k, 1, 32, pdl=True)
    launch.launch(k, 1, 32)
    monkeypatch.setattr(launch, "pdl_on", lambda: False)
    launch.launch(k, 1, 32, pdl=True)
    monkeypatch.setattr(launch, "pdl_on", lambda: True)
    bad = _Disp(fail=True)
    with pytest.raises(RuntimeError):
        launch.launch(bad, 1, 32, pdl=True)
    assert k.calls == [(True, False), (False, True), (False, False), (False, False)]
    assert bad.calls == [(False, True)] and not launch._PDL_TLS.on


_PTX = """
    import json, dataclasses
    import numpy as np
    np.row_stack = np.vstack
    import sys
    sys.path.insert(0, "tools")
    import check_compile as cc
    from numba import cuda, types
    out = {}
    with cc._no_device_cc():
        from numba_kernels import cuda as kc, launch, linear as L, mma_tc
        u2 = types.Array(types.uint32, 2, "C")
        f1, f2, i64 = types.Array(types.float32, 1, "C"), types.Array(types.float32, 2, "C"), types.int64
        vd = [(8, kt, k) for (x, kt), k in sorted(mma_tc.VD_PDL.items())[:1]] + [(8, 256, mma_tc.VD_KERNELS[1])]
        vd += [(16, 256, mma_tc.VD_GLU[(1, True)]), (16, 256, mma_tc.VD_GLU[(1, False)])]  # gate and up rows
        for wrows, kt, k in vd:
            ptx, _ = cuda.compile_ptx(k.py_func, (u2, u2, u2, i64, types.none, i64, types.none), cc=(9, 0))
            i = ptx.find("griddepcontrol.wait")
            out[k.py_func.__name__] = [ptx.count("griddepcontrol.wait"), ptx[:i].count("cp.async") if i >= 0 else None,
                                       (mma_tc.V16_STAGES - 1) * wrows * (kt // 256)]
        cfg = dataclasses.replace(L.gemv_config(2048, 4096, 1, False, True), PDL=True)
        g = launch.Kernel(kc._NS["gemv_source"](cfg), launch._GEN_NS)
        ptx, _ = cuda.compile_ptx(g.disp.py_func, (f1, i64, f1, i64, i64, f2, i64, f1), cc=(9, 0))
        out[cfg.name()] = [ptx.count("griddepcontrol.wait"), ptx[:ptx.find("griddepcontrol.wait")].count("ld.global")]
        ptx, _ = cuda.compile_ptx(kc._NS["rmsnorm_k"].py_func, (f2, f1, types.float64, f2, i64, i64, types.none),
                                  cc=(9, 0))
        out["rmsnorm_k"] = [ptx.count("griddepcontrol.launch_dependents")]
        from numba_kernels import deltanet as D
        gc = D.GdnCfg(128, 128, pdl=True)
        gk = launch.Kernel(kc._NS["gdn_source"](gc), launch._GEN_NS)
        ptx, _ = cuda.compile_ptx(gk.disp.py_func, (f2, f2, f2, i64, f2, f2, f1, f1, i64, i64, i64, f1, i64), cc=(9, 0))
        i = ptx.find("griddepcontrol.wait")
        out[gc.name()] = [ptx.count("griddepcontrol.wait"), ptx[:i].count("ld.global") if i >= 0 else None]
    print(json.dumps(out))
"""


def test_kernels_compile_with_the_pdl_instructions_where_it_is_on():
    """For sm_90 (PRIMEWALK_PDL=1, no GPU): the PDL bf16 GEMV waits once, after exactly its
    prefetched W copies (stages - 1 stages of the warp's 8 rows; the fused MLP input's 16: gate and
    up rows); the plain one never waits; the
    PDL float32 GEMV waits once, after its first weight loads; the PDL recurrence once, after its
    state slice's loads; a producer triggers. With
    PRIMEWALK_PDL=0 neither instruction is emitted (an sm_80 GPU could not assemble them)."""
    on = _py(_PTX, PRIMEWALK_PDL="1")
    (pdl_name, (waits, before, want)), = [(n, v) for n, v in on.items() if n.startswith("linear_mma_vd") and "_pdl" in n]
    assert waits == 1 and before == want, on
    assert on["linear_mma_vd1_k"][0] == 0
    waits, before, want = on["linear_swiglu_mma_vd1_pdl_k"]  # the fused MLP input: its 16 W rows' copies first
    assert waits == 1 and before == want, on
    assert on["linear_swiglu_mma_vd1_k"][0] == 0
    gname = next(n for n in on if n.startswith("gemv_"))
    assert gname.endswith("_pdl") and on[gname][0] == 1 and on[gname][1] > 0, on
    assert on["rmsnorm_k"] == [1]
    rec = next(n for n in on if n.startswith("gdn_"))  # the recurrence: its 32-row state slice first
    assert rec.endswith("_pdl") and on[rec][0] == 1 and on[rec][1] >= 32, on
    off = _py(_PTX, PRIMEWALK_PDL="0")
    assert off[pdl_name][0] == 0 and off[gname][0] == 0 and off["rmsnorm_k"] == [0] and off[rec][0] == 0, off
