"""Accuracy of the CPU twins (numba_kernels/cpu.py) against float64, and the arithmetic contract.

- every op on seeded random inputs of several shapes vs the float64 reference
  (numba_kernels/reference.py) or a direct float64 numpy formula: relative RMS error
  ``‖out − ref‖₂ / ‖ref‖₂ ≤ 1e-6`` (outputs and updated state / captures);
- scalar math (exp32, sigmoid32, silu32, softplus32, log1p_unit) on ~1e6 points spanning the
  ranges, thresholds and special values: max relative error ≤ 3e-7 where the exact result is a
  normal float32, ≤ 2 subnormal ulps (2·2⁻¹⁴⁹) absolute where it is subnormal;
- the contract, bitwise: ``cpu.fma`` is fused, the canonical dot is the documented slice order
  (against a pure-numpy float32 emulation with an exactly rounded fma), exp32 is the documented
  algorithm, rmsnorm's eps is float32 whatever the caller passes;
- argmax ties → lowest index (moe_route); attention never reads a key after the query's position;
- whole model: CPU engine logits vs RefModel ≤ 1e-4 × max|logit| on the tiny model and on the
  oracle configurations of tests/oracle_models.py (built with HF transformers and
  ``save_pretrained``, so HF indirectly checks the twins), and the MTP head likewise.

``pytest -s`` prints one ``ACCURACY`` line per op / configuration.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
from numba import njit

from harness.engine.model import Engine
from harness.engine.rope import rope_tables
from harness.models import default_model_path
from harness.engine.weights import load_checkpoint
from numba_kernels import cpu
from numba_kernels import reference as ref

F32, F64 = np.float32, np.float64
TOL_RMS = 1e-6
TOL_SCALAR = 3e-7
TOL_MODEL = 1e-4
TINY_F = float(np.finfo(F32).tiny)  # smallest normal float32
SUB_ULP = 2.0 ** -149

RESULTS: dict = {}


def record(kind: str, name: str, value: float, **extra) -> None:
    RESULTS[(kind, name)] = value
    more = " ".join(f"{k}={v:.3e}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items())
    print(f"\nACCURACY {kind} {name} {value:.3e} {more}".rstrip())


def rel_rms(out, want) -> float:
    out, want = np.asarray(out, F64).ravel(), np.asarray(want, F64).ravel()
    return float(np.linalg.norm(out - want) / np.linalg.norm(want))


def rnd(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(F32)


def check_op(name, case, pairs):
    """pairs: [(label, out, ref)]; every relative RMS error ≤ TOL_RMS."""
    worst = 0.0
    for label, out, want in pairs:
        assert np.isfinite(out).all(), f"{name} {case}: {label} has non-finite values"
        e = rel_rms(out, want)
        worst = max(worst, e)
        assert e <= TOL_RMS, f"{name} {case}: {label} relative RMS error {e:.3e} > {TOL_RMS:.0e}"
    prev = RESULTS.get(("op", name), 0.0)
    record("op", f"{name}[{case}]", worst)
    RESULTS[("op", name)] = max(prev, worst)


# ------------------------------------------------------------------------------------------------
# exact float32 emulation helpers
# ------------------------------------------------------------------------------------------------
def fma32(a, b, c):
    """Correctly rounded float32 fma, vectorised: a·b is exact in float64; a TwoSum gives
    a·b + c = s + err exactly; round(s) to float32 is the answer unless s sits exactly on a
    float32 midpoint with a non-zero tail, which then decides the direction."""
    a, b, c = (np.asarray(v, F32).astype(F64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    with np.errstate(over="ignore", invalid="ignore"):
        r = s.astype(F32)
        r64 = r.astype(F64)
        nb = np.nextafter(r, np.where(s > r64, F32(np.inf), F32(-np.inf)).astype(F32))
        mid = (r64 + nb.astype(F64)) * 0.5
        away = (s != r64) & (s == mid) & (err != 0) & (np.sign(err) == np.sign(s - r64))
    return np.where(away, nb, r).astype(F32)


def dot_emulated(A, B, slice_=32):
    """Canonical dot of every row pair (A[m], B[m]): fma chain from +0 per slice of 32, slice
    partials added left to right into +0 — numpy float32 arithmetic only."""
    M, n = A.shape
    acc = np.zeros(M, F32)
    for k0 in range(0, n, slice_):
        part = np.zeros(M, F32)
        for i in range(k0, min(k0 + slice_, n)):
            part = fma32(A[:, i], B[:, i], part)
        acc = acc + part
    return acc


def exp32_emulated(x):
    """numba_kernels.exact.exp32 step by step in numpy float32 (finite x in the unclamped range)."""
    from numba_kernels import exact as ex

    x = np.asarray(x, F32)
    n = np.floor(x * ex.LOG2E + ex.HALF).astype(np.int64)  # float32 multiply, float32 add
    nf = n.astype(F32)
    r = fma32(-nf, ex.LN2_HI, x)
    r = fma32(-nf, ex.LN2_LO, r)
    p = fma32(ex.E7, r, ex.E6)
    for c in (ex.E5, ex.E4, ex.E3, ex.E2, ex.ONE, ex.ONE):
        p = fma32(p, r, c)
    n1 = n >> 1

    def pow2(k):
        return ((k + 127) << 23).astype(np.int32).view(F32)

    with np.errstate(under="ignore"):
        return (p * pow2(n1)) * pow2(n - n1)


@njit
def _vfma(a, b, c, out):
    for i in range(a.size):
        out[i] = cpu.fma(a[i], b[i], c[i])


@njit
def _vdot(A, B, out):
    for i in range(A.shape[0]):
        out[i] = cpu.dot_rows(A, i, 0, B, i, 0, A.shape[1])


@njit
def _vlog1p(y, out):
    for i in range(y.size):
        out[i] = cpu.log1p_unit(y[i])


@njit
def _vexp(x, out):
    for i in range(x.size):
        out[i] = cpu.exp32(x[i])


# ------------------------------------------------------------------------------------------------
# the contract, bitwise
# ------------------------------------------------------------------------------------------------
def test_fma32_emulation_is_correctly_rounded():
    """The test's own fma emulation against exact rational arithmetic on hard cases."""
    from fractions import Fraction

    rng = np.random.default_rng(1)
    a = rnd(rng, 2000)
    b = rnd(rng, 2000)
    c = (-(a.astype(F64) * b) * (1 + rng.uniform(-1e-6, 1e-6, 2000))).astype(F32)
    got = fma32(a, b, c)
    for i in range(0, 2000, 7):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        # correct rounding: no float32 is closer than got[i] (ties: either neighbour is checked below)
        g = Fraction(float(got[i]))
        lo = Fraction(float(np.nextafter(got[i], F32(-np.inf))))
        hi = Fraction(float(np.nextafter(got[i], F32(np.inf))))
        assert abs(g - exact) <= abs(lo - exact) and abs(g - exact) <= abs(hi - exact), i
    # midpoint cases: (1 + 2^-12)² = 1 + 2^-11 + 2^-24 is a float32 midpoint; a tiny c is lost in
    # the float64 sum, yet decides the rounding
    x = F32(1 + 2 ** -12)
    assert fma32(x, x, F32(2.0 ** -70)) == F32(1 + 2 ** -11 + 2 ** -23)
    assert fma32(x, x, F32(-2.0 ** -70)) == F32(1 + 2 ** -11)
    assert fma32(x, x, F32(0.0)) == F32(1 + 2 ** -11)  # a true tie: to even
    assert fma32(F32(1.0), F32(1.0), F32(2 ** -24)) == F32(1.0)  # exact tie → even
    assert fma32(F32(1.0), F32(1.0) + F32(2 ** -23), F32(2 ** -24)) == F32(1.0) + F32(2 ** -22)


def test_fma_is_fused():
    """cpu.fma rounds once: on inputs where round(round(a·b) + c) differs from the exactly
    rounded a·b + c, it returns the latter, bit for bit."""
    rng = np.random.default_rng(2)
    n = 200_000
    a, b = rnd(rng, n), rnd(rng, n)
    prod = (a * b).astype(F32)  # rounded product
    c = (-prod * (1 + rng.uniform(-2e-7, 2e-7, n))).astype(F32)  # cancellation exposes the rounding
    out = np.empty(n, F32)
    _vfma(a, b, c, out)
    unfused = (prod + c).astype(F32)
    want = fma32(a, b, c)
    differ = unfused.view(np.uint32) != want.view(np.uint32)
    assert differ.sum() > n // 10, "the search found too few inputs where fusing matters"
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    # the textbook case: (1 + 2^-12)² − (1 + 2^-11) = 2^-24 fused, 0 unfused
    a1 = np.array([1 + 2 ** -12], F32)
    c1 = np.array([-(1 + 2 ** -11)], F32)
    o1 = np.empty(1, F32)
    _vfma(a1, a1, c1, o1)
    assert o1[0] == F32(2 ** -24) and (a1 * a1 + c1)[0] == 0


@pytest.mark.parametrize("n", [1, 31, 32, 33, 100, 2048])
def test_dot_is_the_documented_slice_order(n):
    rng = np.random.default_rng(100 + n)
    M = 3000 if n <= 100 else 600
    # mixed magnitudes make the order matter
    A = (rng.standard_normal((M, n)) * np.exp(rng.uniform(-3, 3, (M, n)))).astype(F32)
    B = rnd(rng, M, n)
    out = np.empty(M, F32)
    _vdot(A, B, out)
    want = dot_emulated(A, B)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    if n > 32:  # the emulation tells orders apart: one long chain or a numpy dot differ
        chain = dot_emulated(A, B, slice_=n)
        assert (chain.view(np.uint32) != want.view(np.uint32)).any()
    # the linear layer uses the same order for every (row, output) pair
    R, N = 3, 5
    X, W = A[:R].copy(), B[:N].copy()
    y = np.zeros((R, N), F32)
    cpu.linear(X, W, y, R)
    want2 = dot_emulated(np.repeat(X, N, 0), np.tile(W, (R, 1))).reshape(R, N)
    np.testing.assert_array_equal(y.view(np.uint32), want2.view(np.uint32))


def test_exp32_is_the_documented_algorithm():
    """exp32 bit for bit against a numpy float32 emulation of exact.exp32 (catches a contracted
    ``x·log2e + 0.5`` or a libm call)."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-103.9, 88.7, 300_000), rng.uniform(-2, 2, 100_000)]).astype(F32)
    out = np.empty_like(x)
    _vexp(x, out)
    np.testing.assert_array_equal(out.view(np.uint32), exp32_emulated(x).view(np.uint32))


def test_rmsnorm_eps_is_float32_whatever_the_caller_passes():
    """The engine passes cfg.rms_norm_eps as a Python float; the CUDA wrappers pass float32. The
    twins must round eps to float32 and stay in float32 (regression: rms_inv used to add a
    float64 eps, then sqrt and divide in float64, so CPU and CUDA differed)."""
    rng = np.random.default_rng(4)
    X = rnd(rng, 400, 64, scale=1e-3)  # mean(x²) ~ eps: the eps path matters
    w = rnd(rng, 64, scale=0.1)
    o64, o32 = np.zeros_like(X), np.zeros_like(X)
    cpu.rmsnorm(X, w, 1e-6, o64, 0, 400)
    cpu.rmsnorm(X, w, F32(1e-6), o32, 0, 400)
    np.testing.assert_array_equal(o64.view(np.uint32), o32.view(np.uint32))
    # and it is the float32 formula: inv = 1 / sqrt(dot/n + eps) in float32
    ss = dot_emulated(X, X)
    inv = (F32(1.0) / np.sqrt(ss / F32(64) + F32(1e-6))).astype(F32)
    want = ((X * inv[:, None]).astype(F32) * (F32(1.0) + w)).astype(F32)
    np.testing.assert_array_equal(o32.view(np.uint32), want.view(np.uint32))
    for fn, args in [(cpu.head_rmsnorm, (X, 0, 4, 16, w[:16])), ]:
        a, b = np.zeros_like(X), np.zeros_like(X)
        fn(*args, 1e-6, a, 400)
        fn(*args, F32(1e-6), b, 400)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    Z = rnd(rng, 400, 64)
    a, b = np.zeros_like(X), np.zeros_like(X)
    cpu.gated_rmsnorm(X, Z, 0, 4, 16, w[:16], 1e-6, a, 400)
    cpu.gated_rmsnorm(X, Z, 0, 4, 16, w[:16], F32(1e-6), b, 400)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


_CACHE_PROBE = """
import numpy as np, numba
from numba_kernels import cpu
X = np.full((1, 4), 3.0, np.float32)
o = np.zeros((1, 4), np.float32)
cpu.rmsnorm(X, np.zeros(4, np.float32), 1e-6, o, 0, 1)

@numba.njit
def f(x):  # a new caller of a cached body: numba loads the body's cached environment
    return cpu.exp32(x)

print(cpu.__file__, float(o[0, 0]), float(f(np.float32(1.0))))
"""


def test_kernel_cache_follows_every_family_file(tmp_path):
    """The twins are cached on disk (``cache=True``) and have other family files' bodies compiled
    in: an edit to exact.py alone (the canonical dot, which rmsnorm in norms.py calls) must not
    load stale kernels, nor an edit to norms.py, and a new njit caller of a cached body must load
    (regressions: numba keyed the twins on cpu.py only; the clones had no ``__name__`` and
    numba's cache loader failed on ``importlib.import_module(None)``)."""
    import shutil
    import subprocess

    src = os.path.dirname(cpu.__file__)
    pkg = tmp_path / "numba_kernels"
    pkg.mkdir()
    for f in os.listdir(src):
        if f.endswith(".py"):
            shutil.copy(os.path.join(src, f), pkg / f)
    (tmp_path / "probe.py").write_text(_CACHE_PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}

    def run():
        p = subprocess.run([sys.executable, "probe.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        path, norm, e = p.stdout.split()
        assert os.path.dirname(path) == str(pkg)
        return float(norm), float(e)

    def edit(name, old, new):
        f = pkg / name
        text = f.read_text()
        assert text.count(old) == 1, (name, old)
        f.write_text(text.replace(old, new))

    first = run()  # x = 3 in every column: 3 / sqrt(36 / 4 + eps)
    assert abs(first[0] - 1.0) < 1e-6
    assert any(f.endswith(".nbi") for f in os.listdir(pkg / "__pycache__")), "nothing was cached"
    assert run() == first  # from the cache
    edit("exact.py", "    acc = ZERO\n    for k0 in range(0, n, SLICE):", "    acc = ONE\n    for k0 in range(0, n, SLICE):")
    norm, e = run()  # the dot now starts at 1: 3 / sqrt(37 / 4 + eps)
    assert abs(norm - 3 / math.sqrt(9.25)) < 1e-6, f"stale kernel: rmsnorm {norm} after exact.py changed"
    assert e == first[1]
    edit("norms.py", "return ONE / sqrt32(ss / F32(n) + F32(eps))", "return TWO / sqrt32(ss / F32(n) + F32(eps))")
    norm2, e = run()
    assert abs(norm2 - 2 * norm) < 1e-6, f"stale kernel: rmsnorm {norm2} after norms.py changed (was {norm})"
    assert e == first[1]


# ------------------------------------------------------------------------------------------------
# scalar math
# ------------------------------------------------------------------------------------------------
def _thresholds(*centres, n=2000):
    """n consecutive float32 values on each side of each centre (of |centre|, then signed)."""
    out = []
    for c in centres:
        i = int(np.array([abs(c)], F32).view(np.int32)[0])
        v = np.arange(max(i - n, 0), i + n, dtype=np.int64).astype(np.int32).view(F32)
        out.append(-v if c < 0 else v)
        if c == 0:
            out.append(-v)
    return np.concatenate(out)


def _points(rng, lo, hi, centres, n=1 << 20):
    x = np.concatenate([
        rng.uniform(lo, hi, n // 2),
        rng.uniform(-8, 8, n // 4),
        np.sign(rng.standard_normal(n // 8)) * np.exp(rng.uniform(-40, 4, n // 8)),  # tiny / small
        _thresholds(*centres, n=max(1, (n // 8) // (2 * max(1, len(centres))))),
    ]).astype(F32)
    return x[(x >= lo) & (x <= hi)]


def _scalar_check(name, out, want, x):
    """Max relative error where the exact result is normal, subnormal ulps below that."""
    out = np.asarray(out, F64)
    normal = np.abs(want) >= TINY_F
    finite = np.isfinite(want)
    m = normal & finite
    relerr = np.abs(out[m] - want[m]) / np.abs(want[m])
    worst = float(relerr.max())
    i = int(np.argmax(relerr))
    sub = finite & ~normal
    sub_err = float(np.abs(out[sub] - want[sub]).max() / SUB_ULP) if sub.any() else 0.0
    record("scalar", name, worst, n=int(out.size), subnormal_ulps=sub_err,
           worst_x=float(x[m][i]))
    assert worst <= TOL_SCALAR, f"{name}: max relative error {worst:.3e} at x={x[m][i]!r}"
    assert sub_err <= 2.0, f"{name}: subnormal results off by {sub_err} ulps"
    # beyond float32's range: exactly inf / 0 as the exact result rounds
    assert np.all(np.isfinite(out[m])), name


def _edge(fn_map, x):
    x = np.asarray(x, F32)
    out = np.empty_like(x)
    fn_map(x, out)
    return out


def test_exp32_accuracy():
    rng = np.random.default_rng(10)
    lo, hi = -110.0, 90.0
    x = _points(rng, lo, hi, [88.72283, -87.33655, -103.27893, -103.97208, 0.0, 0.34657, -0.34657])
    out = np.empty_like(x)
    cpu.map_exp(x, out)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(F64))
    # exact result above FLT_MAX (after rounding) must be inf, below half the smallest subnormal 0
    over = want >= 2.0 ** 128 - 2.0 ** 103  # FLT_MAX + half an ulp
    assert np.all(np.isinf(out[over])) and over.any()
    under = want <= 2.0 ** -150
    assert np.all(out[under] == 0) and under.any()
    keep = ~over & ~under
    _scalar_check("exp32", out[keep], want[keep], x[keep])
    e = _edge(cpu.map_exp, [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72283, np.nextafter(F32(88.72283), F32(100))])
    assert e[0] == 1 and e[1] == 1 and e[2] == np.inf and e[3] == 0 and np.isnan(e[4])
    assert np.isfinite(e[5]) and e[6] == np.inf
    assert rel_rms(e[5], math.exp(float(F32(88.72283)))) <= TOL_SCALAR


def test_sigmoid32_accuracy():
    rng = np.random.default_rng(11)
    x = _points(rng, -110.0, 110.0, [0.0, -88.72283, -87.33655, -103.27893, 16.6, -16.6])
    out = np.empty_like(x)
    cpu.map_sigmoid(x, out)
    xd = x.astype(F64)
    want = np.where(xd >= 0, 1 / (1 + np.exp(-np.abs(xd))), np.exp(-np.abs(xd)) / (1 + np.exp(-np.abs(xd))))
    _scalar_check("sigmoid32", out, want, x)
    e = _edge(cpu.map_sigmoid, [0.0, -0.0, np.inf, -np.inf, np.nan, 200.0, -200.0])
    assert e[0] == 0.5 and e[1] == 0.5 and e[2] == 1 and e[3] == 0 and np.isnan(e[4])
    assert e[5] == 1 and e[6] == 0


def test_silu32_accuracy():
    rng = np.random.default_rng(12)
    x = _points(rng, -120.0, 110.0, [0.0, -88.72283, -92.0, -103.0, -16.6, 16.6])
    out = np.empty_like(x)
    cpu.map_silu(x, out)
    xd = x.astype(F64)
    want = xd * np.where(xd >= 0, 1 / (1 + np.exp(-np.abs(xd))), np.exp(-np.abs(xd)) / (1 + np.exp(-np.abs(xd))))
    _scalar_check("silu32", out, want, x)
    e = _edge(cpu.map_silu, [0.0, -0.0, np.inf, -np.inf, np.nan, -300.0])
    assert e[0] == 0 and e[1] == 0 and e[2] == np.inf and np.isnan(e[4])
    assert e[3] == 0 and e[5] == 0, "silu(−inf) and silu(−300) are −0 (the limit), not NaN"


def test_softplus32_accuracy():
    rng = np.random.default_rng(13)
    x = _points(rng, -110.0, 110.0, [0.0, -87.33655, -103.27893, 16.6, -16.6, 88.72283])
    out = np.empty_like(x)
    cpu.map_softplus(x, out)
    xd = x.astype(F64)
    want = np.maximum(xd, 0) + np.log1p(np.exp(-np.abs(xd)))
    _scalar_check("softplus32", out, want, x)
    e = _edge(cpu.map_softplus, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30])
    assert abs(e[0] - math.log(2)) <= 1e-7 and e[1] == e[0] and e[2] == np.inf and e[3] == 0
    assert np.isnan(e[4]) and e[5] == F32(1e30) and e[6] == 0


def test_log1p_unit_accuracy():
    """log1p_unit is only used on [0, 1] (softplus's log1p(e^-|x|))."""
    rng = np.random.default_rng(14)
    y = np.concatenate([
        rng.uniform(0, 1, 600_000),
        np.exp(rng.uniform(-103, 0, 1 << 18)),
        _thresholds(0.41421356, 1.0, 0.5, n=20000)[: 1 << 16],
        np.array([0.0, 1.0, 2.0 ** -149, TINY_F]),
    ]).astype(F32)
    y = y[(y >= 0) & (y <= 1)]
    out = np.empty_like(y)
    _vlog1p(y, out)
    want = np.log1p(y.astype(F64))
    _scalar_check("log1p_unit", out, want, y)
    assert out[y == 0].max() == 0


# ------------------------------------------------------------------------------------------------
# ops vs float64
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("R,K,N", [(1, 64, 260), (7, 33, 97), (64, 2048, 48), (130, 97, 33)])
def test_linear(R, K, N):
    rng = np.random.default_rng(R * 1000 + K)
    X, W = rnd(rng, R + 2, K), rnd(rng, N, K, scale=K ** -0.5)
    out = np.full((R + 2, N), 7.0, F32)
    cpu.linear(X, W, out, R)
    assert (out[R:] == 7.0).all(), "rows past R were written"
    check_op("linear", f"R{R}-K{K}-N{N}", [("out", out[:R], X[:R].astype(F64) @ W.astype(F64).T)])


def test_embed():
    rng = np.random.default_rng(5)
    table = rnd(rng, 260, 64)
    ids = rng.integers(0, 260, 9).astype(np.int32)
    out = np.zeros((9, 64), F32)
    cpu.embed(ids, table, out)
    np.testing.assert_array_equal(out, table[ids])
    record("op", "embed[R9]", 0.0)


@pytest.mark.parametrize("R,N", [(5, 64), (3, 2048), (9, 36)])
def test_add_rmsnorm_is_add_then_rmsnorm(R, N):
    """The fused op: X += D in place, its NaN/Inf flag, then the norm into out -- bit for bit the
    three ops it replaces (NaN and inf included), and within the stated tolerance of the float64
    reference."""
    rng = np.random.default_rng(N + 2 * R)
    X, D, w = rnd(rng, R + 1, N, scale=3.0), rnd(rng, R + 1, N), rnd(rng, N, scale=0.1)
    X[0, 1], D[R - 1, N - 1], D[0, 2] = np.nan, np.inf, -np.inf
    X0 = X.copy()
    fused, out, flags = X.copy(), np.zeros((R + 1, 2 * N), F32), np.zeros(3, np.int32)
    cpu.add_rmsnorm(fused, D, w, 1e-6, out, N, R, flags, 1)
    two, out2, flags2 = X.copy(), np.zeros((R + 1, 2 * N), F32), np.zeros(3, np.int32)
    cpu.add(two, D, two, R)
    cpu.nonfinite_flag(two, R, flags2, 1)
    cpu.rmsnorm(two, w, 1e-6, out2, N, R)
    np.testing.assert_array_equal(fused.view(np.uint32), two.view(np.uint32))
    np.testing.assert_array_equal(out.view(np.uint32), out2.view(np.uint32))
    assert flags.tolist() == flags2.tolist() == [0, 1, 0]
    for slot, X1, D1 in ((0, rnd(rng, R, N), rnd(rng, R, N)), (-1, X0[:R].copy(), D[:R])):
        f = np.zeros(1, np.int32)  # finite sums: no flag; slot -1: flags untouched whatever the sums
        cpu.add_rmsnorm(X1, D1, w, 1e-6, np.zeros((R, N), F32), 0, R, f, slot)
        assert f[0] == 0
    assert (fused[R] == X0[R]).all() and (out[:, :N] == 0).all() and (out[R] == 0).all()  # rows past R untouched
    fin = slice(1, R - 1) if R > 2 else slice(0, 0)  # rows without the planted NaN/inf
    want = ref.rms_norm((X0[fin].astype(F64) + D[fin].astype(F64)), w.astype(F64), 1e-6)
    if want.size:
        check_op("add_rmsnorm", f"R{R}-N{N}", [("out", out[fin, N:], want)])


@pytest.mark.parametrize("R", [1, 5, 9])
def test_linear_flag_is_linear_then_nonfinite_flag(R):
    """The lm head's fused op: the outputs are ``linear``'s bits, the flag ``nonfinite_flag``'s --
    raised by a NaN or an overflow to inf in rows < R, not by one in a row past R."""
    rng = np.random.default_rng(R)
    X, W = rnd(rng, R + 1, 40), rnd(rng, 70, 40, scale=0.2)
    for bad in (None, (R - 1, np.nan), (0, 3e38), (R, np.nan)):
        Xb = X.copy()
        if bad is not None:
            Xb[bad[0], 7 if bad[1] != 3e38 else slice(None)] = bad[1]  # a NaN; a row of 3e38: sums overflow
        out, flags = np.zeros((R + 1, 70), F32), np.zeros(2, np.int32)
        cpu.linear_flag(Xb, W, out, R, flags, 1)
        out2, flags2 = np.zeros((R + 1, 70), F32), np.zeros(2, np.int32)
        cpu.linear(Xb, W, out2, R)
        cpu.nonfinite_flag(out2, R, flags2, 1)
        np.testing.assert_array_equal(out.view(np.uint32), out2.view(np.uint32))
        assert flags.tolist() == flags2.tolist() == [0, int(bad is not None and bad[0] < R)]
        assert bad is None or bad[0] == R or not np.isfinite(out[bad[0]]).all()


@pytest.mark.parametrize("R,N", [(5, 64), (3, 2048), (9, 36)])
def test_rmsnorm(R, N):
    rng = np.random.default_rng(N + R)
    X, w = rnd(rng, R, N, scale=3.0), rnd(rng, N, scale=0.1)
    out = np.zeros((R, 2 * N), F32)
    cpu.rmsnorm(X, w, 1e-6, out, N, R)
    assert (out[:, :N] == 0).all()
    check_op("rmsnorm", f"R{R}-N{N}", [("out", out[:, N:], ref.rms_norm(X.astype(F64), w.astype(F64), 1e-6))])


@pytest.mark.parametrize("R,H,D", [(3, 4, 16), (20, 6, 12), (2, 2, 128)])
def test_gated_rmsnorm(R, H, D):
    rng = np.random.default_rng(R + H + D)
    X, Z, w = rnd(rng, R, H * D), rnd(rng, R, 3 * H * D), 1 + rnd(rng, D, scale=0.1)
    zo = 2 * H * D
    out = np.zeros((R, H * D), F32)
    cpu.gated_rmsnorm(X, Z, zo, H, D, w, 1e-6, out, R)
    want = ref.gated_rms_norm(X.reshape(R, H, D).astype(F64), Z[:, zo:].reshape(R, H, D).astype(F64),
                              w.astype(F64), 1e-6).reshape(R, H * D)
    check_op("gated_rmsnorm", f"R{R}-H{H}-D{D}", [("out", out, want)])


@pytest.mark.parametrize("R,H,D", [(7, 4, 16), (3, 3, 12), (2, 2, 256)])
def test_head_rmsnorm(R, H, D):
    rng = np.random.default_rng(R * H + D)
    X, w = rnd(rng, R, 3 * H * D), rnd(rng, D, scale=0.1)
    xo = H * D + 1
    out = np.zeros((R, H * D), F32)
    cpu.head_rmsnorm(X, xo, H, D, w, 1e-6, out, R)
    want = ref.rms_norm(X[:, xo:xo + H * D].reshape(R, H, D).astype(F64), w.astype(F64), 1e-6).reshape(R, H * D)
    check_op("head_rmsnorm", f"R{R}-H{H}-D{D}", [("out", out, want)])


@pytest.mark.parametrize("R,N", [(4, 33), (64, 64)])
def test_add_swiglu_sigmoid_gate(R, N):
    rng = np.random.default_rng(R + N)
    X, Y = rnd(rng, R, N), rnd(rng, R, N)
    out = np.zeros((R, N), F32)
    cpu.add(X, Y, out, R)
    check_op("add", f"R{R}-N{N}", [("out", out, X.astype(F64) + Y)])
    GU = rnd(rng, R, 2 * N, scale=3.0)
    act = np.zeros((R, N), F32)
    cpu.swiglu_act(GU, N, act, R)
    g, u = GU[:, :N].astype(F64), GU[:, N:].astype(F64)
    check_op("swiglu_act", f"R{R}-I{N}", [("out", act, ref.silu(g) * u)])
    G = rnd(rng, R, 2 * N, scale=3.0)
    gated = np.zeros((R, N), F32)
    cpu.sigmoid_gate(X, G, N, gated, R)
    check_op("sigmoid_gate", f"R{R}-N{N}", [("out", gated, X.astype(F64) * ref.sigmoid(G[:, N:].astype(F64)))])


@pytest.mark.parametrize("C,K,R", [(96, 3, 7), (40, 4, 65), (8, 2, 3)])
def test_conv1d_silu(C, K, R):
    rng = np.random.default_rng(C + K + R)
    xo = 5
    X, W = rnd(rng, R, C + xo), rnd(rng, C, K, scale=K ** -0.5)
    state0 = rnd(rng, K - 1, C)
    state, out, cap = state0.copy(), np.zeros((R, C), F32), np.zeros((R, K - 1, C), F32)
    cpu.conv1d_silu(X, xo, W, state, out, R, cap, True)
    x64 = X[:, xo:].astype(F64)
    want, want_state = ref.causal_conv1d(x64, W.astype(F64), state0.astype(F64))
    caps = []
    st = state0.astype(F64)
    for t in range(R):
        _, st = ref.causal_conv1d(x64[t:t + 1], W.astype(F64), st)
        caps.append(st)
    check_op("conv1d_silu", f"C{C}-K{K}-R{R}", [("out", out, want), ("state", state, want_state),
                                                 ("captures", cap, np.stack(caps))])
    # without capture: same outputs, cap untouched
    state2, out2, cap2 = state0.copy(), np.zeros((R, C), F32), np.zeros((1, 1, 1), F32)
    cpu.conv1d_silu(X, xo, W, state2, out2, R, cap2, False)
    np.testing.assert_array_equal(out2, out)
    np.testing.assert_array_equal(state2, state)


@pytest.mark.parametrize("hk,nv,dk,R", [(3, 6, 16, 9), (2, 4, 128, 3), (1, 1, 8, 2)])
def test_gdn_prep(hk, nv, dk, R):
    rng = np.random.default_rng(hk + nv + dk + R)
    kd = hk * dk
    QKV, BA = rnd(rng, R, 2 * kd + nv * 8), rnd(rng, R, 3 + 2 * nv, scale=2.0)  # b ‖ a from column 3
    A_log, dt_bias = np.log(rng.uniform(1, 16, nv)).astype(F32), rng.uniform(-1, 1, nv).astype(F32)
    qscale = F32(1 / math.sqrt(dk))
    Qn, Kn = np.zeros((R, kd), F32), np.zeros((R, kd), F32)
    beta, g = np.zeros((R, nv), F32), np.zeros((R, nv), F32)
    cpu.gdn_prep(QKV, kd, hk, dk, BA, 3, nv, A_log, dt_bias, qscale, Qn, Kn, beta, g, R)
    q = QKV[:, :kd].reshape(R, hk, dk).astype(F64)
    k = QKV[:, kd:2 * kd].reshape(R, hk, dk).astype(F64)
    b, a = BA[:, 3:3 + nv].astype(F64), BA[:, 3 + nv:].astype(F64)
    check_op("gdn_prep", f"Hk{hk}-Hv{nv}-dk{dk}-R{R}", [
        ("q", Qn, (ref.l2_norm(q) / math.sqrt(dk)).reshape(R, kd)),
        ("k", Kn, ref.l2_norm(k).reshape(R, kd)),
        ("beta", beta, ref.sigmoid(b)),
        ("g", g, -np.exp(A_log.astype(F64)) * ref.softplus(a + dt_bias.astype(F64))),
    ])


@pytest.mark.parametrize("hk,nv,dk,dv,R", [(3, 6, 16, 24, 9), (2, 4, 128, 32, 5), (2, 2, 8, 12, 40)])
def test_gdn_recurrence(hk, nv, dk, dv, R):
    rng = np.random.default_rng(hk * nv + dk * dv + R)
    kd, vpk, vo = hk * dk, nv // hk, 7

    def unit(a):
        return (a / np.linalg.norm(a.reshape(R, hk, dk), axis=-1, keepdims=True).repeat(dk, -1).reshape(R, kd)).astype(F32)

    q = (unit(rnd(rng, R, kd)) * F32(dk ** -0.5)).astype(F32)
    k = unit(rnd(rng, R, kd))
    V = rnd(rng, R, vo + nv * dv)
    g = (-np.abs(rnd(rng, R, nv, scale=0.5))).astype(F32)
    beta = rng.uniform(0, 1, (R, nv)).astype(F32)
    S0 = rnd(rng, nv, dk, dv, scale=0.1)
    S, out, cap = S0.copy(), np.zeros((R, nv * dv), F32), np.zeros((R, nv, dk, dv), F32)
    cpu.gdn_recurrence(q, k, V, vo, g, beta, S, out, R, dk, dv, vpk, cap, True)
    q64 = np.repeat(q.reshape(R, hk, dk).astype(F64), vpk, axis=1)
    k64 = np.repeat(k.reshape(R, hk, dk).astype(F64), vpk, axis=1)
    v64 = V[:, vo:].reshape(R, nv, dv).astype(F64)
    o, S_want = ref.gated_delta_rule(q64, k64, v64, g.astype(F64), beta.astype(F64), S0.astype(F64))
    caps, st = [], S0.astype(F64)
    for t in range(R):
        _, st = ref.gated_delta_rule(q64[t:t + 1], k64[t:t + 1], v64[t:t + 1], g[t:t + 1].astype(F64),
                                     beta[t:t + 1].astype(F64), st)
        caps.append(st)
    check_op("gdn_recurrence", f"Hk{hk}-Hv{nv}-dk{dk}-dv{dv}-R{R}",
             [("out", out, o.reshape(R, nv * dv)), ("state", S, S_want), ("captures", cap, np.stack(caps))])


@pytest.mark.parametrize("R,H,D,rot,start", [(7, 4, 16, 4, 0), (3, 2, 32, 32, 1000), (5, 3, 12, 12, 63)])
def test_rope(R, H, D, rot, start):
    rng = np.random.default_rng(R + H + D + start)
    half = rot // 2
    cos, sin = rope_tables(start + R + 1, rot, 10000.0)
    X = rnd(rng, R, H * D)
    out = X.copy()
    cpu.rope(out, H, D, half, cos, sin, start, R)
    c64, s64 = ref.rope_cos_sin(list(range(start, start + R)), rot, 10000.0)
    want = ref.apply_rope(X.reshape(R, H, D).astype(F64), c64, s64, rot).reshape(R, H * D)
    check_op("rope", f"R{R}-H{H}-D{D}-rot{rot}-p{start}", [("out", out, want)])


@pytest.mark.parametrize("R,hq,hkv,D,rot,start", [(3, 4, 2, 16, 4, 0), (2, 5, 1, 24, 24, 70), (4, 3, 3, 12, 0, 9),
                                                   (1, 16, 2, 256, 64, 1000), (2, 3, 1, 10, 6, 5)])
def test_qk_norm_rope_is_the_five_ops(R, hq, hkv, D, rot, start):
    """The fused op: q/k head norms, RoPE on both and the K/V write -- bit for bit
    head_rmsnorm ×2, rope ×2 and kv_write (odd head counts, partial and zero rotary dims), rows
    of the caches other than start..start+R untouched; within the stated tolerance of the
    float64 reference."""
    rng = np.random.default_rng(R * hq + D + start)
    half = rot // 2
    cos, sin = rope_tables(start + R + 3, rot, 10000.0)
    QKV = rnd(rng, R + 1, 2 * hq * D + 2 * hkv * D, scale=2.0)
    wq, wk = rnd(rng, D, scale=0.1), rnd(rng, D, scale=0.1)
    ctx = start + R + 2
    Q, kc, vc = np.zeros((R + 1, hq * D), F32), rnd(rng, ctx, hkv * D), rnd(rng, ctx, hkv * D)
    kc0, vc0 = kc.copy(), vc.copy()
    cpu.qk_norm_rope(QKV, hq, hkv, D, wq, wk, 1e-6, half, cos, sin, start, Q, kc, vc, R)
    q5, k5 = np.zeros((R, hq * D), F32), np.zeros((R, hkv * D), F32)
    kc5, vc5 = kc0.copy(), vc0.copy()
    cpu.head_rmsnorm(QKV, 0, hq, D, wq, 1e-6, q5, R)
    cpu.head_rmsnorm(QKV, 2 * hq * D, hkv, D, wk, 1e-6, k5, R)
    cpu.rope(q5, hq, D, half, cos, sin, start, R)
    cpu.rope(k5, hkv, D, half, cos, sin, start, R)
    cpu.kv_write(k5, 0, QKV, 2 * hq * D + hkv * D, kc5, vc5, start, R)
    np.testing.assert_array_equal(Q[:R].view(np.uint32), q5.view(np.uint32))
    np.testing.assert_array_equal(kc.view(np.uint32), kc5.view(np.uint32))
    np.testing.assert_array_equal(vc.view(np.uint32), vc5.view(np.uint32))
    assert not Q[R].any()  # rows past R untouched
    rows = slice(start, start + R)
    assert (kc[:start] == kc0[:start]).all() and (kc[start + R:] == kc0[start + R:]).all()
    assert (vc[:start] == vc0[:start]).all() and (vc[start + R:] == vc0[start + R:]).all()
    np.testing.assert_array_equal(vc[rows], QKV[:R, 2 * hq * D + hkv * D:])
    c64, s64 = ref.rope_cos_sin(list(range(start, start + R)), rot, 10000.0)

    def want(off, heads, w):
        x = QKV[:R, off:off + heads * D].reshape(R, heads, D).astype(F64)
        return ref.apply_rope(ref.rms_norm(x, w.astype(F64), 1e-6), c64, s64, rot).reshape(R, heads * D)
    check_op("qk_norm_rope", f"R{R}-Hq{hq}-Hkv{hkv}-D{D}-rot{rot}-p{start}",
             [("q", Q[:R], want(0, hq, wq)), ("k", kc[rows], want(2 * hq * D, hkv, wk))])


def test_kv_write():
    rng = np.random.default_rng(6)
    Kh, Vh = rnd(rng, 3, 40), rnd(rng, 3, 50)
    kc, vc = np.zeros((10, 16), F32), np.zeros((10, 16), F32)
    cpu.kv_write(Kh, 4, Vh, 30, kc, vc, 6, 3)
    np.testing.assert_array_equal(kc[6:9], Kh[:, 4:20])
    np.testing.assert_array_equal(vc[6:9], Vh[:, 30:46])
    assert not kc[:6].any() and not kc[9:].any() and not vc[:6].any()
    record("op", "kv_write[R3-p6]", 0.0)


ATT_CASES = [(4, 2, 16, 0, 130), (3, 1, 12, 60, 9), (4, 4, 8, 500, 2), (2, 1, 64, 127, 3), (6, 3, 16, 64, 1)]


@pytest.mark.parametrize("hq,hkv,D,start,R", ATT_CASES)
def test_attention(hq, hkv, D, start, R):
    rng = np.random.default_rng(hq + D + start + R)
    ctx = start + R
    Q = rnd(rng, R, hq * D, scale=2.0)
    kc, vc = rnd(rng, ctx + 70, hkv * D, scale=2.0), rnd(rng, ctx + 70, hkv * D)
    kc[ctx:] = np.nan  # keys past the last query's position: never visited
    vc[ctx:] = np.nan
    out = np.zeros((R, hq * D), F32)
    scale = F32(1 / math.sqrt(D))
    cpu.attention(Q, kc, vc, out, start, R, hq, hkv, D, scale)
    assert np.isfinite(out).all(), "a key after the query's position was read"
    want = ref.gqa_attention(Q.reshape(R, hq, D).astype(F64), kc[:ctx].reshape(ctx, hkv, D).astype(F64),
                             vc[:ctx].reshape(ctx, hkv, D).astype(F64), list(range(start, ctx)))
    check_op("attention", f"Hq{hq}-Hkv{hkv}-D{D}-p{start}-R{R}", [("out", out, want.reshape(R, hq * D))])
    # each query alone, with every key after its own position poisoned: same bits, finite
    for r in range(R):
        p = start + r
        k2, v2 = kc.copy(), vc.copy()
        k2[p + 1:] = np.nan
        v2[p + 1:] = np.nan
        o1 = np.zeros((1, hq * D), F32)
        cpu.attention(Q[r:r + 1].copy(), k2, v2, o1, p, 1, hq, hkv, D, scale)
        assert np.isfinite(o1).all(), f"query at position {p} read a key after it"
        np.testing.assert_array_equal(o1[0].view(np.uint32), out[r].view(np.uint32))


def test_attention_gqa_mapping():
    """Query head h reads KV head h // (hq / hkv): a KV head poisoned with NaN shows up exactly in
    the query heads mapped to it."""
    rng = np.random.default_rng(7)
    hq, hkv, D, R = 6, 3, 8, 2
    Q, kc, vc = rnd(rng, R, hq * D), rnd(rng, R, hkv * D), rnd(rng, R, hkv * D)
    vc[:, 1 * D:2 * D] = np.nan
    out = np.zeros((R, hq * D), F32)
    cpu.attention(Q, kc, vc, out, 0, R, hq, hkv, D, F32(D ** -0.5))
    bad = [h for h in range(hq) if np.isnan(out[:, h * D:(h + 1) * D]).any()]
    assert bad == [2, 3]


@pytest.mark.parametrize("R,E,k,renorm", [(6, 8, 2, True), (5, 16, 3, False), (4, 64, 8, True)])
def test_moe_route(R, E, k, renorm):
    rng = np.random.default_rng(R + E + k)
    L = rnd(rng, R, E, scale=2.0)
    P, idx, wts = np.zeros((R, E), F32), np.zeros((R, k), np.int32), np.zeros((R, k), F32)
    cpu.moe_route(L, k, renorm, P, idx, wts, R)
    want_idx, want_w = ref.moe_route(L.astype(F64), k, renorm)
    np.testing.assert_array_equal(idx, want_idx)
    check_op("moe_route", f"R{R}-E{E}-k{k}-renorm{int(renorm)}", [("weights", wts, want_w)])


def test_moe_route_ties_go_to_the_lowest_index():
    E, k = 8, 3
    L = np.zeros((5, E), F32)
    L[1, [5, 2]] = 3.0  # tie for first
    L[2, 6], L[2, [4, 1]] = 5.0, 2.0  # tie for second
    L[3, [7, 0, 3]] = 1.0  # three-way tie
    L[4] = np.arange(E, dtype=F32)[::-1] * 0  # all equal again
    P, idx, wts = np.zeros((5, E), F32), np.zeros((5, k), np.int32), np.zeros((5, k), F32)
    cpu.moe_route(L, k, True, P, idx, wts, 5)
    assert idx.tolist() == [[0, 1, 2], [2, 5, 0], [6, 1, 4], [0, 3, 7], [0, 1, 2]]
    np.testing.assert_array_equal(idx, ref.moe_route(L.astype(F64), k, True)[0])
    assert wts[1, 0] == wts[1, 1] and wts[3, 0] == wts[3, 2]


@pytest.mark.parametrize("R,E,k,I,H", [(5, 8, 2, 12, 36), (3, 16, 4, 40, 64)])
def test_moe_experts(R, E, k, I, H):
    rng = np.random.default_rng(R + E + I + H)
    X = rnd(rng, R, H)
    G, U, Dn = rnd(rng, E, I, H, scale=H ** -0.5), rnd(rng, E, I, H, scale=H ** -0.5), rnd(rng, E, H, I, scale=I ** -0.5)
    idx = np.stack([rng.choice(E, k, replace=False) for _ in range(R)]).astype(np.int32)
    act = np.zeros((R * k, I), F32)
    cpu.moe_up(X, G.reshape(E * I, H), U.reshape(E * I, H), idx, I, act, R)
    x64 = X.astype(F64)
    want_act = np.stack([ref.silu(x64[r] @ G[e].T.astype(F64)) * (x64[r] @ U[e].T.astype(F64))
                         for r in range(R) for e in idx[r]])
    y = np.zeros((R * k, H), F32)
    cpu.moe_down(act, Dn.reshape(E * H, I), idx, H, y, R)
    a64 = act.astype(F64)
    want_y = np.stack([a64[r * k + q] @ Dn[idx[r, q]].T.astype(F64) for r in range(R) for q in range(k)])
    wts = rng.uniform(0, 1, (R, k)).astype(F32)
    SH, sgl = rnd(rng, R, H), rnd(rng, R, 1)
    out = np.zeros((R, H), F32)
    cpu.moe_combine(y, wts, SH, sgl, True, out, R)
    y64 = y.astype(F64).reshape(R, k, H)
    want_out = np.einsum("rq,rqh->rh", wts.astype(F64), y64) + ref.sigmoid(sgl.astype(F64)) * SH
    out_ns = np.zeros((R, H), F32)
    cpu.moe_combine(y, wts, SH, sgl, False, out_ns, R)
    check_op("moe_up", f"R{R}-E{E}-k{k}-I{I}-H{H}", [("act", act, want_act)])
    check_op("moe_down", f"R{R}-E{E}-k{k}-I{I}-H{H}", [("y", y, want_y)])
    check_op("moe_combine", f"R{R}-k{k}-H{H}", [("shared", out, want_out),
                                                ("no shared", out_ns, np.einsum("rq,rqh->rh", wts.astype(F64), y64))])
    # the whole block against reference.moe on its own routing
    w = {"mlp.gate.weight": rnd(rng, E, H, scale=H ** -0.5).astype(F64), "mlp.experts.gate_proj": G.astype(F64),
         "mlp.experts.up_proj": U.astype(F64), "mlp.experts.down_proj": Dn.astype(F64)}

    class C:
        num_experts_per_tok, norm_topk_prob, shared_expert_intermediate_size = k, True, 0

    rl = np.zeros((R, E), F32)
    cpu.linear(X, w["mlp.gate.weight"].astype(F32), rl, R)
    P, idx2, wts2 = np.zeros((R, E), F32), np.zeros((R, k), np.int32), np.zeros((R, k), F32)
    cpu.moe_route(rl, k, True, P, idx2, wts2, R)
    cpu.moe_up(X, G.reshape(E * I, H), U.reshape(E * I, H), idx2, I, act, R)
    cpu.moe_down(act, Dn.reshape(E * H, I), idx2, H, y, R)
    cpu.moe_combine(y, wts2, SH, sgl, False, out, R)
    check_op("moe_block", f"R{R}-E{E}-k{k}", [("out", out, ref.moe(x64, w, "", C))])


def test_nonfinite_flag():
    rng = np.random.default_rng(8)
    for bad in (np.nan, np.inf, -np.inf):
        X = rnd(rng, 4, 33)
        X[2, 7] = bad
        flags = np.zeros(3, np.int32)
        cpu.nonfinite_flag(X, 4, flags, 1)
        assert flags.tolist() == [0, 1, 0]
        flags[:] = 0
        cpu.nonfinite_flag(X, 2, flags, 1)  # only the first R rows are looked at
        assert not flags.any()
    X = rnd(rng, 4, 33)
    X[0, 0] = np.finfo(F32).max
    flags = np.zeros(2, np.int32)
    cpu.nonfinite_flag(X, 4, flags, 0)
    assert not flags.any()


# ------------------------------------------------------------------------------------------------
# whole model
# ------------------------------------------------------------------------------------------------
def _model_rel(got, want):
    return float(np.abs(np.asarray(got, F64) - want).max() / np.abs(want).max())


def _check_model(label, ck, ids, hf=None):
    from numba_kernels.reference import RefModel

    eng = Engine(ck, "cpu")
    rm = RefModel(ck.config, ck.tensors)
    T = len(ids)
    sess = eng.new_session(T + 4)
    logits, hidden = eng.target_step(sess, np.asarray(ids))
    want, want_h = rm.forward(ids)
    err = _model_rel(logits, want)
    herr = _model_rel(hidden, want_h)
    extra = {}
    if hf is not None:
        extra["vs_hf64"] = _model_rel(logits, hf)
    record("model", label, err, hidden=herr, rel_rms=rel_rms(logits, want), T=T, **extra)
    assert err <= TOL_MODEL, f"{label}: logits max error {err:.3e} × max|logit| > {TOL_MODEL:.0e}"
    if hf is not None:
        assert extra["vs_hf64"] <= TOL_MODEL, f"{label}: vs HF float64 {extra['vs_hf64']:.3e}"
    assert (np.argmax(logits, -1) == np.argmax(want, -1)).mean() >= 0.95
    if ck.has_mtp:
        _check_mtp(label, eng, rm, ids, hidden)


def _check_mtp(label, eng, rm, ids, hidden):
    """engine.mtp_rows vs RefModel.mtp_rows on the same inputs (row p: token p with the trunk
    hidden at p − 1, row 0 with zeros), then one chained row fed by the head's own output."""
    T, H = len(ids), eng.cfg.hidden_size
    rows = np.concatenate([np.zeros((1, H), F32), np.asarray(hidden)[:-1]]).astype(F32)
    sess = eng.new_session(T + 4)
    got, out_h = eng.mtp_rows(sess, ids, rows, 0)
    st = rm.new_state(T + 4)
    want, want_h = rm.mtp_rows(ids, rows.astype(F64), st, 0)
    err = _model_rel(got, want)
    d = int(np.argmax(want[-1]))
    got2, _ = eng.mtp_rows(sess, [d], out_h[T - 1:T], T)
    want2, _ = rm.mtp_rows([d], want_h[-1:], st, T)
    err2 = _model_rel(got2, want2)
    record("mtp", label, max(err, err2), rows=err, chained=err2)
    assert err <= TOL_MODEL and err2 <= TOL_MODEL, f"{label} MTP: {err:.3e}, chained {err2:.3e}"


def test_whole_model_tiny():
    ck = load_checkpoint(default_model_path())
    assert ck.has_mtp
    ids = np.random.default_rng(20).integers(0, ck.config.vocab_size, 150)
    _check_model("tiny", ck, ids)


@pytest.fixture(scope="module")
def oracle_root(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return str(tmp_path_factory.mktemp("oracle_acc"))


ORACLE_NAMES = ["dense_grouped", "moe_renorm", "moe_odd", "legacy_rope"]


@pytest.mark.parametrize("name", ORACLE_NAMES)
def test_whole_model_oracle_configs(name, oracle_root):
    import torch

    import oracle_models as om
    from harness.synth import random_tensors

    assert name in om.CONFIGS
    torch.set_num_threads(min(2, torch.get_num_threads()))
    m = om.build(name, oracle_root)
    ck = load_checkpoint(m.folder)
    ids = np.random.default_rng(30 + len(name)).integers(0, ck.config.vocab_size, 100)  # > one tile
    hf, _ = om.hf_forward(m.hf64, ids)
    _check_model(name, ck, ids, hf=hf)
    # with an MTP head added (the oracle folders are trunk-only, as HF writes them)
    mtp = {k: v for k, v in random_tensors(ck.config, seed=7 + len(name), mtp=True).items() if k.startswith("mtp.")}
    folder = os.path.join(oracle_root, name + "-mtp")
    om.add_mtp(m.folder, folder, mtp)
    ck2 = load_checkpoint(folder)
    assert ck2.has_mtp
    eng = Engine(ck2, "cpu")
    from numba_kernels.reference import RefModel

    _, hidden = eng.target_step(eng.new_session(len(ids)), np.asarray(ids))
    _check_mtp(name, eng, RefModel(ck2.config, ck2.tensors), ids, hidden)


def test_zz_summary():
    """Print the per-op worst relative errors (``pytest -s``)."""
    ops = sorted((n, v) for (k, n), v in RESULTS.items() if k == "op" and "[" not in n)
    for n, v in ops:
        print(f"\nACCURACY-SUMMARY op {n} {v:.3e}")
    for (k, n), v in sorted(RESULTS.items()):
        if k in ("scalar", "model", "mtp"):
            print(f"\nACCURACY-SUMMARY {k} {n} {v:.3e}")
