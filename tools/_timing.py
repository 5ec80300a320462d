"""GPU timing shared by the device tools: a CUDA graph of launches replayed between two events,
and the GPU's SM clock as ``nvidia-smi`` reads it (a probe records it before and after: a GPU idle
before a probe can start at a fraction of its clock, receipts/probes/h100-probe-vd-ws-3df58be/)."""

import subprocess


def graph_us(launch, reps: int, replays: int = 3) -> float:
    """µs of device time per call: ``launch(i)`` for i in 0 .. reps - 1 captured in one CUDA graph
    (numba_kernels' launches only: no copies, no synchronisation), replayed once to warm up, then
    ``replays`` times between two events. Launched one by one from Python the GPU would wait on
    the host (a numba launch costs ~90 µs of host time on the H200's machine, more than a
    2,048-output GEMV runs)."""
    from numba_kernels import cuda as kc

    graph, _ = kc.capture(lambda: [launch(i) for i in range(reps)])
    return replayed_us(graph, replays) / reps


def replayed_us(graph, replays: int) -> float:
    """µs of device time per replay of a captured ``graph``: replayed once to warm up, then
    ``replays`` times back to back between two events."""
    from numba import cuda

    graph.replay()
    cuda.synchronize()
    start, stop = cuda.event(), cuda.event()
    start.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    stop.synchronize()
    return cuda.event_elapsed_time(start, stop) / replays * 1e3


def events_us(fn, reps: int) -> float:
    """The median µs of ``reps`` runs of ``fn()`` (launches, no synchronisation of its own), each
    between two CUDA events after the device has gone idle; one untimed run first (it compiles
    and warms)."""
    import numpy as np
    from numba import cuda

    start, stop = cuda.event(), cuda.event()
    got = []
    for _ in range(reps + 1):
        cuda.synchronize()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        got.append(start.elapsed_time(stop) * 1e3)
    return float(np.median(got[1:]))


def device_name() -> str:
    """The current CUDA device's name as a str ("the simulator" under Numba's simulator)."""
    from numba import cuda

    name = getattr(cuda.get_current_device(), "name", "the simulator")
    return name.decode() if isinstance(name, bytes) else str(name)


def sm_clocks(run=subprocess.run):
    """{"sm_mhz": current, "max_sm_mhz": its maximum} of GPU 0 from ``nvidia-smi``, or None where
    it cannot be read (no nvidia-smi, no GPU, an output not two numbers)."""
    try:
        p = run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=20)
        cur, top = (int(x) for x in p.stdout.splitlines()[0].split(","))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None
    return {"sm_mhz": cur, "max_sm_mhz": top}

