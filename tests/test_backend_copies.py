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
        assert not np.shares_memory(host, b._pin.__dict__.get("buf", np.zeros(1)))
    first = b._pin.buf
    b.download(big[:2])
    assert b._pin.buf is first and FakeCuda.pinned == 1  # reused, not reallocated
    bigger = rng.standard_normal((8, 40000)).astype(np.float32).view(FakeDev)
    assert np.array_equal(b.download(bigger), np.asarray(bigger)) and b._pin.buf.size >= bigger.nbytes
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


def test_upload_async_and_mapped_flags():
    """A replay's inputs: one asynchronous copy from pinned memory on the legacy default stream
    (ordered before the graph launched there); the NaN/Inf flags: zeroed mapped host memory."""
    b = fake_backend()
    FakeDriver.calls.clear()
    head = b.pinned_empty((4,), np.int32)
    head[:] = [70, 1, 2, 3]
    io = np.zeros(4, np.int32).view(FakeDev)
    b.upload_async(io, head)
    assert np.asarray(io).tolist() == [70, 1, 2, 3]
    assert FakeDriver.calls == [(("h2d-async", "legacy"), 16)]
    f = b.mapped_zeros((5,), np.int32)
    assert f.dtype == np.int32 and f.tolist() == [0] * 5
    cpu = bk.CpuBackend.__new__(bk.CpuBackend)
    dst = np.zeros(3, np.int32)
    cpu.upload_async(dst, np.array([4, 5, 6], np.int32))
    assert dst.tolist() == [4, 5, 6] and cpu.mapped_zeros((2,)).tolist() == [0, 0]
