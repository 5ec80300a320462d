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

    def host_to_device(self, dst, src, size):
        self.calls.append(("h2d", size))
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


def fake_backend(cap=0):
    b = bk.CudaBackend.__new__(bk.CudaBackend)
    b.cuda, b._drv, b._pin = FakeCuda(), FakeDriver(), bk.threading.local()
    b._leases = bk.PinnedLeases(lambda n: b.cuda.pinned_array(n, np.uint8), cap=cap)
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


def _lent(arr):
    """The pinned buffer lent to ``arr`` (through its views' bases), or None."""
    while arr is not None and not isinstance(arr, bk._Lease):
        arr = getattr(arr, "base", None)
    return None if arr is None else arr.buf


def test_downloads_lend_pinned_buffers_until_every_view_is_gone():
    """A download lands in a pinned buffer lent to the returned array: no host copy, and the
    buffer is reused only once the array and all its views are gone (never overwritten under a
    caller), within the pool's cap (past it: the staging buffer and a copy)."""
    rng = np.random.default_rng(1)
    b = fake_backend(cap=1 << 20)
    FakeCuda.pinned = 0
    big = rng.standard_normal((2, 40000)).astype(np.float32).view(FakeDev)  # 320 KB
    first = b.download(big)
    assert type(first) is np.ndarray and first.flags.writeable and np.array_equal(first, np.asarray(big))
    buf1 = _lent(first)
    assert buf1 is not None and np.shares_memory(first, buf1)
    row = first[1]  # a view outlives the array it came from
    keep = row.copy()
    del first
    other = rng.standard_normal((2, 40000)).astype(np.float32).view(FakeDev)
    second = b.download(other)
    buf2 = _lent(second)
    assert np.array_equal(second, np.asarray(other)) and buf2 is not buf1 and not np.shares_memory(second, row)
    assert np.array_equal(row, keep) and FakeCuda.pinned == 2
    del row, second
    third = b.download(big[:1])  # a free buffer that fits: reused, none allocated
    assert FakeCuda.pinned == 2 and np.array_equal(third, np.asarray(big[:1]))
    assert any(_lent(third) is x for x in (buf1, buf2))
    # past the cap (1 MB: three 320 KB buffers lent): the staging buffer and a copy
    held = [third, b.download(big), b.download(big)]
    assert b._leases.held <= b._leases.cap and b._leases.take(big.nbytes) is None
    fourth = b.download(other)
    assert np.array_equal(fourth, np.asarray(other)) and _lent(fourth) is None
    assert not any(np.shares_memory(fourth, h) for h in held) and not np.shares_memory(fourth, b._pin.buf)
    del held, third, fourth
    assert b._leases.take(big.nbytes) is not None  # given back once they are gone


def test_lease_pool_drops_free_buffers_to_make_room():
    unit = bk.PINNED_MIN_BYTES
    sizes = []
    pool = bk.PinnedLeases(lambda n: sizes.append(n) or np.zeros(n, np.uint8), cap=4 * unit)
    a = pool.lend(pool.take(3 * unit - 5), np.float32, (3 * unit // 4 - 2,))
    assert a.shape == (3 * unit // 4 - 2,) and pool.held == 3 * unit
    del a  # free: 3 units held
    big = pool.take(4 * unit)  # does not fit beside the free one: that one is dropped
    assert big is not None and big.size == 4 * unit and pool.held == 4 * unit
    assert pool.take(1) is None  # everything is lent
    assert sizes == [3 * unit, 4 * unit]


def test_lease_pool_picks_the_smallest_free_buffer_that_fits():
    unit = bk.PINNED_MIN_BYTES
    pool = bk.PinnedLeases(lambda n: np.zeros(n, np.uint8), cap=16 * unit)
    small, big, mid = (pool.lend(pool.take(k * unit), np.uint8, (k * unit,)) for k in (1, 5, 3))
    bufs = {k: _lent(a) for k, a in zip((1, 5, 3), (small, big, mid))}
    del small, big, mid  # free buffers of 1, 5 and 3 units
    assert pool.take(2 * unit) is bufs[3] and pool.take(2 * unit) is bufs[5] and pool.take(2 * unit) is not bufs[1]
    assert pool.take(unit) is bufs[1] and pool.held == 9 * unit + 2 * unit
