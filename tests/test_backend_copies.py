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


def test_mapped_flags():
    """The NaN/Inf flags and a captured step's inputs: zeroed mapped host memory."""
    b = fake_backend()
    f = b.mapped_zeros((5,), np.int32)
    assert f.dtype == np.int32 and f.tolist() == [0] * 5
    cpu = bk.CpuBackend.__new__(bk.CpuBackend)
    assert cpu.mapped_zeros((2,)).tolist() == [0, 0]


def test_captured_steps_take_position_and_ids_from_mapped_memory():
    """StepRunner: the first call of a key runs eagerly, the second captures, later calls replay;
    a replay's position and token ids reach the body through the host's mapped buffer and the
    graph's first kernel (copy_i32), with no copy call."""
    from harness.engine.graphs import StepRunner
    from numba_kernels import cpu as kcpu

    class Ops:
        copy_i32 = staticmethod(kcpu.copy_i32)

        @staticmethod
        def capture(fn, keep):
            class G:
                def replay(self):
                    fn()
            return G(), fn()

    cpu = bk.CpuBackend.__new__(bk.CpuBackend)
    runner = StepRunner(cpu, Ops(), graphs=True)

    class Cache:
        graphs, graph_seen = {}, set()

    seen = []

    def body(inp, at, pos):
        out = np.zeros(3, np.int64)
        out[:2] = np.asarray(inp["ids"])
        out[2] = at + int(pos[0])
        seen.append(out)
        return out
    cache = Cache()
    for start, ids in ((5, [7, 8]), (6, [9, 1]), (7, [2, 3]), (8, [4, 4])):
        seen.clear()
        runner.run(cache, ("trunk", 2), body, {"ids": np.array(ids, np.int32)}, start, lambda: [])
        assert seen[-1].tolist() == ids + [start]
    graph, out, own, head = cache.graphs[("trunk", 2)]
    assert head.tolist() == [8, 4, 4]


