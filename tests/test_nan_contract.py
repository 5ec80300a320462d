"""The NaN rule of the arithmetic contract: where a NaN arises is fixed, its sign and payload are
not (the GPU's fma returns 0x7fffffff, the CPU propagates an input's payload); every digest and
every device-check comparison sees one canonical NaN."""

import numpy as np
import pytest

from harness.engine.digests import CANONICAL_NAN, cache_digest, canonical_f32, logits_digest


def _nan(bits):
    return np.array([bits], np.uint32).view(np.float32)[0]


def test_every_nan_is_one_canonical_nan_and_numbers_keep_their_bits():
    a = np.array([1.5, -0.0, np.inf, _nan(0x7FFFFFFF), _nan(0xFFC00001), 3e-45], np.float32)
    c = canonical_f32(a)
    assert c.view(np.uint32)[3] == CANONICAL_NAN and c.view(np.uint32)[4] == CANONICAL_NAN
    keep = [0, 1, 2, 5]
    assert np.array_equal(c.view(np.uint32)[keep], a.view(np.uint32)[keep])  # -0.0 and subnormals kept
    assert a.view(np.uint32)[3] == 0x7FFFFFFF  # the input is not modified


def test_digests_ignore_nan_payloads_but_not_where_a_nan_is():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    gpu, cpu, num = x.copy(), x.copy(), x.copy()
    gpu[1, 2], cpu[1, 2] = _nan(0x7FFFFFFF), _nan(0xFFC12345)
    assert logits_digest(gpu) == logits_digest(cpu)
    assert logits_digest(gpu) != logits_digest(num)
    assert cache_digest(3, 0, [("s", gpu)]) == cache_digest(3, 0, [("s", cpu)])
    moved = x.copy()
    moved[2, 2] = _nan(0x7FFFFFFF)
    assert logits_digest(moved) != logits_digest(gpu)


def test_the_cpu_twin_puts_nans_where_the_reference_does():
    from numba_kernels import cpu

    rng = np.random.default_rng(3)
    R, K, N = 3, 96, 10
    X = rng.standard_normal((R, K)).astype(np.float32)
    W = rng.standard_normal((N, K)).astype(np.float32)
    X[0, 5], X[1, 7], W[4, 9] = np.nan, np.inf, -np.inf
    out = np.zeros((R, N), np.float32)
    cpu.linear(X, W, out, R)
    ref = X.astype(np.float64) @ W.astype(np.float64).T
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    assert np.array_equal(np.isinf(out), np.isinf(ref))


@pytest.mark.parametrize("kind", ["gpu", "simulator"])
def test_flags_read_in_place_without_the_device_array_view(kind, monkeypatch):
    """The engine reads its NaN/Inf flags in place through a plain ndarray over the mapped
    memory: numba's mapped arrays on a GPU (an ndarray subclass) override ``view`` with the
    device array's, which fails on them; the simulator's are no ndarray at all (FakeCUDAArray,
    read through ``__array__``). Both kinds are read where the kernels wrote."""
    from harness.engine.model import Engine
    from harness.engine.weights import load_checkpoint
    from harness.errors import NumericError
    from harness.models import default_model_path

    class Mapped(np.ndarray):  # like numba's MappedNDArray: a device array's ``view``
        def view(self, *a, **k):
            raise AttributeError("'MappedNDArray' object has no attribute 'is_c_contiguous'")

    class Fake:  # like the simulator's FakeCUDAArray
        def __init__(self, ary):
            self._ary = ary

        def __array__(self, dtype=None, copy=None):
            return self._ary

        def __setitem__(self, i, v):
            self._ary[i] = v

    eng = Engine(load_checkpoint(default_model_path()), "cpu")
    made = []

    def mapped_zeros(shape, dtype):
        z = np.zeros(shape, dtype)
        made.append(z)
        return z.view(Mapped) if kind == "gpu" else Fake(z)

    monkeypatch.setattr(eng.B, "mapped_zeros", mapped_zeros)  # the backend object is shared
    sess = eng.new_session(8)
    flags = eng._flags()
    eng._raise_nonfinite(sess, flags)  # all clear: no error
    made[0][1] = 1  # a kernel's write
    flags = eng._flags()  # the next call resets it
    assert not made[0].any()
    made[0][len(eng.layers)] = 1
    with pytest.raises(NumericError, match="lm_head produced NaN or Inf"):
        eng._raise_nonfinite(sess, flags)
