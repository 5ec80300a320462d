"""GPU timing shared by the device tools: a CUDA graph of launches replayed between two events."""


def graph_us(launch, reps: int, replays: int = 3) -> float:
    """µs of device time per call: ``launch(i)`` for i in 0 .. reps - 1 captured in one CUDA graph
    (numba_kernels' launches only: no copies, no synchronisation), replayed once to warm up, then
    ``replays`` times between two events. Launched one by one from Python the GPU would wait on
    the host (a numba launch costs ~90 µs of host time on the H200's machine, more than a
    2,048-output GEMV runs)."""
    from numba import cuda

    from numba_kernels import cuda as kc

    graph, _ = kc.capture(lambda: [launch(i) for i in range(reps)])
    graph.replay()
    cuda.synchronize()
    start, stop = cuda.event(), cuda.event()
    start.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    stop.synchronize()
    return cuda.event_elapsed_time(start, stop) / (replays * reps) * 1e3
