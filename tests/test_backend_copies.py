"""The CUDA backend's driver-level copies (``CudaBackend.copy_into`` / ``download`` / ``clone`` on a
GPU): the same results as numba's device-array copies, for contiguous arrays and views, with the
pinned staging buffer reused and grown. Run here with a stand-in driver over host memory (a GPU
runs them for real in device-check, the matrices and the bench)."""

from __future__ import annotations

import numpy as np

from harness.engine import backend as bk


class FakeDev(np.ndarray):
    """A host array standing in for a numba device array (``copy_to_host``, ``copy_to_device``)."""

    __cuda_memory__ = True

    def copy_to_host(self):
        return np.array(self, copy=True).view(np.ndarray)

    def copy_to_device(self, src):
        self[...] = src


class FakeDriver:
    calls: list = []

    def host_to_device(self, dst, src, size, stream=0):
        self.calls.append(("h2d" if not stream else ("h2d-async", stream), size))
        dst.view(np.ndarray).reshape(-1).view(np.uint8)[:size] = np.ascontiguousarray(src).reshape(-1).view(np.uint8)[:size]

    def device_to_host(self, dst, src, size):
        self.calls.append(("d2h", size))
        dst.reshape(-1).view(np.uint8)[:size] = np.ascontiguousarray(src).reshape(-1).view(np.uint8)[:size]

    def device_to_device(self, dst, src, size):
        self.calls.append(("d2d", size))
        self.host_to_device(dst, src, size)
        self.calls.pop()


class FakeCuda:
    pinned = 0

    def device_array(self, shape, dtype):
        return np.zeros(shape, dtype).view(FakeDev)

    def pinned_array(self, n, dtype):
        FakeCuda.pinned += 1
        return np.zeros(n, dtype)

    def legacy_default_stream(self):
        return "legacy"

    def mapped_array(self, shape, dtype):
        return np.full(shape, 7, dtype)


def fake_backend():
    b = bk.CudaBackend.__new__(bk.CudaBackend)
    b.cuda, b._drv, b._pin, b._legacy = FakeCuda(), FakeDriver(), bk.threading.local(), None
    return b


def test_driver_copies_equal_numpy_copies():
    rng = np.random.default_rng(0)
    b = fake_backend()
    big = rng.standard_normal((4, 40000)).astype(np.float32).view(FakeDev)  # 640 KB: the pinned path
    small = rng.standard_normal((3, 5)).astype(np.float32).view(FakeDev)
    for dev in (big, big[1:3], small, small[2:]):
        host = b.download(dev)
        assert type(host) is np.ndarray and host.shape == dev.shape and np.array_equal(host, np.asarray(dev))
    # the staging buffer: downloads past the pool's size, reused and grown
    huge = np.zeros((2, bk.POOL_MAX_BYTES // 4 + 8), np.float32).view(FakeDev)
    huge[1, 5] = 3.0
    h = b.download(huge)
    first = b._pin.buf
    assert np.array_equal(h, np.asarray(huge)) and not np.shares_memory(h, first)
    assert np.array_equal(b.download(huge[:1]), np.asarray(huge[:1])) and b._pin.buf is first  # reused
    # a strided view is not one run: numba's copy
    col = big[:, :7]
    assert np.array_equal(b.download(col), np.asarray(col))
    # uploads and device-to-device copies
    dst = np.zeros((3, 5), np.float32).view(FakeDev)
    src = rng.standard_normal((3, 5)).astype(np.float32)
    b.copy_into(dst, src)
    assert np.array_equal(np.asarray(dst), src)
    ids = np.zeros(4, np.int32).view(FakeDev)
    b.copy_into(ids, [7, 8, 9, 10])  # not an array: numba's own (checked) copy
    assert ids.tolist() == [7, 8, 9, 10]
    b.copy_into(ids, np.array([1, 2, 3, 4], np.int32))
    assert ids.tolist() == [1, 2, 3, 4]
    c = b.clone(big[1:3])
    assert np.array_equal(np.asarray(c), np.asarray(big[1:3])) and not np.shares_memory(c, big)
    kinds = {k for k, _ in FakeDriver.calls}
    assert kinds == {"h2d", "d2h", "d2d"}


def test_pooled_downloads_never_overwrite_what_the_caller_holds():
    """Downloads of PINNED_MIN_BYTES .. POOL_MAX_BYTES come back in pooled pinned buffers (no host
    copy); a buffer is reused only once nothing handed out of it is alive -- not the array, not
    a view of a view, not a memoryview -- so a kept result is never overwritten; with every
    buffer held, downloads fall back to new arrays through the staging buffer."""
    rng = np.random.default_rng(1)
    b = fake_backend()
    FakeCuda.pinned = 0
    devs = [rng.standard_normal((5, 30000)).astype(np.float32).view(FakeDev) for _ in range(8)]
    a = b.download(devs[0])
    row = a[2]  # a view; the array itself dropped
    del a
    sub = row[10:20][::2]  # a view of a view
    del row
    mem = memoryview(b.download(devs[1]))  # only a memoryview kept
    c = b.download(devs[2])
    c0 = c.copy()
    pool = b._pin.pool
    assert len(pool) == 3 and FakeCuda.pinned == 3  # three held: three buffers
    for i in range(3, 8):  # one more pooled buffer, then (all four held) the staging path
        keep = b.download(devs[i])
        assert np.array_equal(keep, np.asarray(devs[i]))
        del keep
    assert len(pool) == bk.POOL_BUFFERS == 4 and FakeCuda.pinned == 4  # the fourth, reused
    assert np.array_equal(sub, np.asarray(devs[0])[2, 10:20:2])
    assert np.array_equal(np.frombuffer(mem, np.float32).reshape(5, -1), np.asarray(devs[1]))
    assert np.array_equal(c, c0)
    held = [b.download(devs[7])]  # the free fourth one
    more = b.download(devs[6])  # all four held: a new array via the staging buffer
    assert np.array_equal(more, np.asarray(devs[6])) and FakeCuda.pinned == 5  # (the staging buffer)
    assert not any(np.shares_memory(more, e[0]) for e in pool)
    del sub, mem, c, held
    again = b.download(devs[5])  # released: pooled again, no new pinned memory
    assert any(np.shares_memory(again, e[0]) for e in pool) and FakeCuda.pinned == 5
    # a larger download than a free buffer holds replaces it
    bigger = rng.standard_normal((3, 200000)).astype(np.float32).view(FakeDev)
    del again
    got = b.download(bigger)
    assert np.array_equal(got, np.asarray(bigger)) and len(pool) == 4
    assert any(np.shares_memory(got, e[0]) for e in pool)


def test_pooled_downloads_take_the_smallest_free_buffer_that_fits():
    """Best fit: a small download leaves the large free buffer to the large one after it (a verify
    step's logits after a decode step's), and a too-small free buffer stays for small ones while
    the pool has room."""
    rng = np.random.default_rng(2)
    b = fake_backend()
    FakeCuda.pinned = 0
    small = rng.standard_normal((1, 300000)).astype(np.float32).view(FakeDev)  # 1.2 MB
    large = rng.standard_normal((4, 300000)).astype(np.float32).view(FakeDev)  # 4.8 MB
    del_me = b.download(large)
    big_buf = b._pin.pool[0][0]
    del del_me
    got = b.download(small)  # fits the large free buffer (the only one): taken
    assert np.shares_memory(got, big_buf) and FakeCuda.pinned == 1
    del got
    keep_small = b.download(small)
    del keep_small
    held_large = b.download(large)  # both free? the large buffer is the one that fits
    assert np.shares_memory(held_large, big_buf)
    s1 = b.download(small)  # the large one held: a new small buffer
    assert not np.shares_memory(s1, big_buf) and FakeCuda.pinned == 2
    small_buf = next(e[0] for e in b._pin.pool if np.shares_memory(s1, e[0]))
    del s1, held_large
    s2 = b.download(small)  # both free: the smallest that fits
    assert np.shares_memory(s2, small_buf)
    l2 = b.download(large)  # and the large one is still free for the large download
    assert np.shares_memory(l2, big_buf) and FakeCuda.pinned == 2
    del s2, l2
    huge = rng.standard_normal((5, 300000)).astype(np.float32).view(FakeDev)  # 6 MB: fits neither
    h = b.download(huge)  # a third buffer (room in the pool): the two smaller ones stay
    assert len(b._pin.pool) == 3 and FakeCuda.pinned == 3
    assert np.array_equal(h, np.asarray(huge))


class FakeCudaMem(FakeCuda):
    """numba's own device arrays over made-up device addresses (no GPU: nothing reads them)."""

    def __init__(self):
        self.next = 1 << 20

    def device_array(self, shape, dtype):
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        from numba.cuda.cudadrv.driver import MemoryPointer, binding

        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        mem = MemoryPointer(None, binding.CUdeviceptr(self.next), n)
        self.next += -(-n // 256) * 256
        return DeviceNDArray(tuple(shape), bk._c_strides(shape, dtype.itemsize), dtype, gpu_data=mem)


def test_pooled_device_array_lives_as_long_as_its_views():
    """A pooled step buffer's hand-out is numba's device array through a pointer owned by a token:
    numba's slices and views take their memory by ``gpu_data.view`` (``DeviceNDArray._do_getitem``)
    or share ``gpu_data`` (``reshape``, ``view(dtype)``), all keeping that owner, so the token
    dies exactly when the last of them does; a shape past the buffer is refused."""
    import gc
    import weakref

    import pytest

    mem = FakeCudaMem().device_array((256,), np.uint8).gpu_data
    token = bk._StepToken()
    alive = weakref.ref(token)
    a = bk.pooled_device_array(mem, (2, 8), np.float32, token)
    del token
    assert (a.shape, a.strides, a.dtype) == ((2, 8), (32, 4), np.float32)
    assert int(a.gpu_data.device_pointer) == int(mem.device_pointer) and a.gpu_data.owner is alive()
    row = a.gpu_data.view(32, 64)  # what a[1] takes as its memory
    del a
    gc.collect()
    assert alive() is not None and row.device_pointer_value == int(mem.device_pointer) + 32
    del row
    gc.collect()
    assert alive() is None
    with pytest.raises(ValueError, match="larger than the 256-byte buffer"):
        bk.pooled_device_array(mem, (65,), np.float32, bk._StepToken())


def test_step_buffers_are_reused_only_when_nothing_of_them_is_alive():
    """``CudaBackend._step_buffer``: a step's hidden rows come from a per-thread pool of device
    buffers of their size; a buffer is handed out again only once nothing of the previous
    hand-out is alive, at most STEP_POOL_PER_SIZE are in use per size (then None: the caller
    allocates), and arrays past STEP_POOL_MAX_BYTES, or a backend whose arrays are not numba's,
    get None."""
    import gc

    b = fake_backend()
    b.cuda = FakeCudaMem()
    addr = lambda a: int(a.gpu_data.device_pointer)  # noqa: E731
    h1 = b._step_buffer((1, 2048), np.float32)
    h2 = b._step_buffer((1, 2048), np.float32)
    assert h1.shape == (1, 2048) and addr(h1) != addr(h2)
    first = addr(h1)
    del h1
    gc.collect()
    h3 = b._step_buffer((2, 1024), np.float32)  # the same bytes: the freed buffer again
    assert addr(h3) == first and h3.shape == (2, 1024)
    held = [b._step_buffer((1, 2048), np.float32) for _ in range(bk.STEP_POOL_PER_SIZE - 2)]
    assert len({addr(x) for x in held + [h2, h3]}) == bk.STEP_POOL_PER_SIZE
    assert b._step_buffer((1, 2048), np.float32) is None  # every buffer of the size in use
    assert b._step_buffer((4, 2048), np.float32) is not None  # another size: its own buffers
    assert b._step_buffer((bk.STEP_POOL_MAX_BYTES // 4 + 1,), np.float32) is None
    plain = fake_backend()  # stand-in device arrays (not numba's): no pooling
    assert plain._step_buffer((1, 2048), np.float32) is None


def test_mapped_targets_are_held_while_their_hand_out_is_alive():
    """A captured step's lm head stores into ``mapped_target``'s device array; after the step the
    host hands the buffer out as a new array with no copy (``hand_out_mapped``), and the target
    is not free (``mapped_free``) while anything of that array is alive."""
    import gc

    rng = np.random.default_rng(4)
    b = fake_backend()
    t = b.mapped_target((2, 300))
    assert t.dev.shape == (2, 300) and t.dev.dtype == np.float32 and b.mapped_free(t)
    want = rng.standard_normal((2, 300)).astype(np.float32)
    t.dev[...] = want  # "the kernel" stores the logits
    got = b.hand_out_mapped(t)
    assert np.array_equal(got, want) and np.shares_memory(got, t.buf) and not b.mapped_free(t)
    row = got[1]
    del got
    gc.collect()
    assert not b.mapped_free(t) and np.array_equal(row, want[1])
    del row
    gc.collect()
    assert b.mapped_free(t)


def test_mapped_targets_are_capped_per_process():
    """The live mapped targets of the process stay within MAPPED_MAX_BYTES (16-byte rounded):
    past it ``mapped_target`` gives None (the step downloads its logits), and a collected
    target gives its bytes back."""
    import gc

    b = fake_backend()
    old, base = bk.MAPPED_MAX_BYTES, bk._mapped_bytes[0]
    try:
        bk.MAPPED_MAX_BYTES = base + 3 * 1200 + 32
        held = [b.mapped_target((1, 300)) for _ in range(3)]  # 1,200 bytes each
        assert all(t is not None for t in held) and bk._mapped_bytes[0] == base + 3600
        assert b.mapped_target((1, 300)) is None and b.mapped_target((1, 5)) is not None  # 20 → 32 bytes: fits
        gc.collect()
        assert bk._mapped_bytes[0] == base + 3600  # the 32-byte one was dropped: given back
        del held[0]
        gc.collect()
        assert bk._mapped_bytes[0] == base + 2400 and b.mapped_target((1, 300)) is not None
        held.clear()
        gc.collect()
        assert bk._mapped_bytes[0] == base
    finally:
        bk.MAPPED_MAX_BYTES = old


def test_mapped_device_view_is_a_device_array_over_numbas_mapped_buffer():
    """numba's mapped array (an ndarray subclass whose ``view`` is the device array's, failing on
    it on a GPU) gets its device view built over the buffer's device memory: a C-contiguous
    DeviceNDArray of the asked shape and dtype sharing the buffer's ``gpu_data``; a shape past
    the buffer is refused."""
    import pytest
    from numba.cuda.cudadrv import devicearray as da

    buf = np.ndarray.view(np.zeros(96, np.uint8), da.MappedNDArray)
    mem = object()  # stands in for the buffer's mapped device memory
    buf.device_setup(mem)
    v = bk.mapped_device_view(buf, np.float32, (2, 3, 4))
    assert type(v) is da.DeviceNDArray and v.gpu_data is mem
    assert (v.shape, v.strides, v.dtype) == ((2, 3, 4), (48, 16, 4), np.float32)
    with pytest.raises(ValueError, match="larger than the 96-byte buffer"):
        bk.mapped_device_view(buf, np.float32, (5, 5))


def test_logits_ring_gives_each_held_step_its_own_buffer():
    """``Engine._logits_slot``: a captured step's key gets the first free buffer of its cache's
    ring and the buffer's index in its key (each buffer has its own capture); a held hand-out
    moves the next step to the next buffer, up to LOGIT_RING, then the plain key and no
    target (the workspace and a download); released, the first buffer serves again. Eager steps
    (no key, graphs off, a trace) and exact-bf16 steps never get one."""
    import gc
    from types import SimpleNamespace

    from harness.engine import model

    b = fake_backend()
    eng = SimpleNamespace(graphs=True, _trace=None, mode="exact", B=b, cfg=SimpleNamespace(vocab_size=50))
    eng._fused = lambda: model.Engine._fused(eng)
    eng._captured = lambda key: model.Engine._captured(eng, key)
    c = SimpleNamespace(logit_rings={})
    slot = lambda key: model.Engine._logits_slot(eng, c, key, 2)  # noqa: E731
    key = ("trunk", 2, 2, None)
    held = []
    for i in range(model.LOGIT_RING):
        k, t = slot(key)
        assert k == key + ("logits", i) and t.dev.shape == (2, 50)
        held.append(b.hand_out_mapped(t))
    assert slot(key) == (key, None)  # every buffer held by the caller
    assert slot(("mtp", 1, 1))[0] == ("mtp", 1, 1, "logits", 0)  # another step: its own ring
    del held[0]
    gc.collect()
    assert slot(key)[0] == key + ("logits", 0)
    assert slot(None) == (None, None)
    eng.graphs = False
    assert slot(key) == (key, None)
    eng.graphs, eng._trace = True, object()
    assert slot(key) == (key, None)
    # exact-bf16: no ring, with either weights (float32-resident: the NaN/Inf check would be a
    # second kernel reading mapped logits back; bf16: the fused GEMV's small stores cross PCIe)
    eng._trace, eng.mode, eng.weights = None, "exact-bf16", "f32"
    assert slot(key) == (key, None)
    eng.weights = "bf16"
    assert model.Engine._fused(eng) and slot(key) == (key, None)
    eng.mode = "exact"
    assert slot(key)[0] == key + ("logits", 0)


def test_mapped_flags():
    """The NaN/Inf flags and a captured step's inputs: zeroed mapped host memory."""
    b = fake_backend()
    f = b.mapped_zeros((5,), np.int32)
    assert f.dtype == np.int32 and f.tolist() == [0] * 5
    cpu = bk.CpuBackend.__new__(bk.CpuBackend)
    assert cpu.mapped_zeros((2,)).tolist() == [0, 0]


def _stand_in_runner(captures=None):
    """A StepRunner on the CPU backend whose ops capture a step by running it once and replay it
    by running it again (each capture's keep list appended to ``captures``), and an empty cache."""
    from harness.engine.graphs import StepRunner
    from numba_kernels import cpu as kcpu

    class Ops:
        copy_i32 = staticmethod(kcpu.copy_i32)

        @staticmethod
        def capture(fn, keep):
            if captures is not None:
                captures.append(keep)

            class G:
                def replay(self):
                    fn()
            return G(), fn()

    class Cache:
        def __init__(self):
            self.graphs, self.graph_seen = {}, set()

    return StepRunner(bk.CpuBackend.__new__(bk.CpuBackend), Ops(), graphs=True), Cache()


def test_captured_steps_take_position_and_ids_from_mapped_memory():
    """StepRunner: the first call of a key runs eagerly, the second captures, later calls replay;
    a replay's position and token ids reach the body through the host's mapped buffer and the
    graph's first kernel (copy_i32), with no copy call."""
    runner, cache = _stand_in_runner()
    seen = []

    def body(inp, at, pos):
        out = np.zeros(3, np.int64)
        out[:2] = np.asarray(inp["ids"])
        out[2] = at + int(pos[0])
        seen.append(out)
        return out
    for start, ids in ((5, [7, 8]), (6, [9, 1]), (7, [2, 3]), (8, [4, 4])):
        seen.clear()
        runner.run(cache, ("trunk", 2), body, {"ids": np.array(ids, np.int32)}, start, lambda: [])
        assert seen[-1].tolist() == ids + [start]
    graph, out, own, head, rows = cache.graphs[("trunk", 2)]
    assert head.tolist() == [8, 4, 4] and rows == {}


def test_captured_steps_take_host_rows_from_mapped_memory(monkeypatch):
    """A captured step's other inputs given as host arrays of 4-byte items (an MTP pass's hidden
    rows, the draft chain's start) reach a replay through the same mapped buffer as its position
    and ids, each from a 16-byte boundary, with no copy call; the capture key says which inputs
    came that way."""
    runner, cache = _stand_in_runner()
    copies = []
    base = runner.B.copy_into
    monkeypatch.setattr(runner.B, "copy_into", lambda d, s: (copies.append(np.array(s)), base(d, s)))
    seen = []

    def body(inp, at, pos):
        seen.append((np.array(inp["ids"]).tolist(), np.array(inp["hin"]).tolist(), np.array(inp["io0"]).tolist(),
                     at + int(pos[0])))
        return len(seen)
    key = ("draft", 3)
    for step in range(4):
        ids = [step, step + 1, step + 2]
        hin = (np.arange(6, dtype=np.float32).reshape(3, 2) + 0.5 * step).astype(np.float32)
        io0 = np.array([10 + step, 0], np.int32)
        copies.clear()
        runner.run(cache, key, body, {"ids": ids, "hin": hin, "io0": io0}, 20 + step, lambda: [])
        assert seen[-1] == (ids, hin.tolist(), io0.tolist(), 20 + step)
        if step >= 1:  # captured, then replayed: nothing copied by a driver copy call
            assert copies == [], copies
    mkey = key + (("mapped", "hin", "io0"),)
    assert mkey in cache.graphs and key not in cache.graphs
    graph, out, own, head, rows = cache.graphs[mkey]
    # [pos, 3 ids] | 6 float32 words from word 4 | 2 int32 words from word 12 (16-byte boundaries)
    assert head.shape == (14,) and head[:4].tolist() == [23, 3, 4, 5]
    assert head[4:10].view(np.float32).tolist() == hin.tolist()[0] + hin.tolist()[1] + hin.tolist()[2]
    assert head[12:14].tolist() == [13, 0] and sorted(rows) == ["hin", "io0"]


def test_chained_steps_run_eagerly_then_capture_then_replay():
    """StepRunner.run_chained: key None runs the body with the scalar start; otherwise the first
    call runs eagerly on the device position, the second captures (the capture's own run is the
    step), later calls replay the one graph and return its outputs; no host write either way."""
    captures = []
    runner, cache = _stand_in_runner(captures)
    pos = np.array([40], np.int32)
    calls = []

    def body(at, p):
        calls.append((at, None if p is None else int(p[0])))
        return ("out", len(calls))
    assert runner.run_chained(cache, None, body, 12, pos, lambda: ["kept"]) == ("out", 1)
    assert calls == [(12, None)] and not cache.graph_seen
    assert runner.run_chained(cache, ("greedy", 0), body, 12, pos, lambda: ["kept"]) == ("out", 2)
    assert calls[-1] == (0, 40) and not captures and ("greedy", 0) in cache.graph_seen
    out = runner.run_chained(cache, ("greedy", 0), body, 13, pos, lambda: ["kept"])
    assert captures == [["kept"]] and len(calls) == 4  # the capture's own run, then its replay
    assert out == ("out", 3)  # the captured outputs, which every replay writes
    pos[0] = 41
    assert runner.run_chained(cache, ("greedy", 0), body, 99, pos, lambda: ["kept"]) == ("out", 3)
    assert calls[-1] == (0, 41) and len(captures) == 1
