"""exact-bf16 (issue #19): the MMA step, the GEMM and attention twins, the engine mode.

Bitwise claims, each against an independent computation:

- ``mma_step`` (numba_kernels/mma_gemm.py, the specialised step every exact-bf16 op uses) equals
  the hardware's bits on every recorded H200 output (receipts/mma/);
- ``linear_mma`` equals a chain of whole m16n8k16 tiles through ``mma.mma_check`` (the measured
  rule's own emulation), rows padded to 16 and K to a multiple of 16, for shapes that are not
  multiples of 16 or 8, with ±∞/NaN/subnormal inputs;
- ``attention_mma`` equals the same tile chains written out in numpy around ``mma.mma_check``;
- a decode row equals the same row of a prime (the op, and the engine end to end);
- weights resident as bf16 bits (uint16, the default on CUDA) give the bits of the float32
  arrays of the same values, in every MMA op and in the engine.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from harness.engine.bf16 import narrow, resolve_for_mode
from harness.engine.model import Engine
from harness.engine.modes import round_bf16
from harness.engine.weights import load_checkpoint
from harness.errors import InputError
from harness.models import default_model_path
from numba_kernels import cpu, mma

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VECTORS = os.path.join(REPO, "receipts", "mma", "h200-mma-vectors.npz")


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def test_step_equals_recorded_h200_outputs():
    z = np.load(VECTORS)
    A, B, C, D = mma.bf16_to_f32(z["A"]), mma.bf16_to_f32(z["B"]), z["C"], z["D"]
    out = np.empty(C.shape, np.uint32)
    cpu.mma_steps(A, B, C, out)
    same = out == bits(D)
    assert same.all(), f"{int((~same).sum())} of {same.size} outputs differ"
    assert same.size >= 1_000_000


def tile_chain(X, W):
    """out[r, o] by whole tiles: rows padded to 16, columns to 8, K to a multiple of 16; each step
    one mma.mma_check tile whose C is the previous step's D."""
    R, K = X.shape
    N = W.shape[0]
    Rp, Np, Kp = -(-R // 16) * 16, -(-N // 8) * 8, -(-K // 16) * 16
    Xb = np.zeros((Rp, Kp), np.uint16)
    Xb[:R, :K] = mma.f32_to_bf16(X)
    Wb = np.zeros((Np, Kp), np.uint16)
    Wb[:N, :K] = mma.f32_to_bf16(W)
    D = np.zeros((Rp, Np), np.float32)
    for s in range(0, Kp, 16):
        At = Xb[:, s:s + 16].reshape(Rp // 16, 1, 16, 16).repeat(Np // 8, 1).reshape(-1, 16, 16)
        Bt = Wb[:, s:s + 16].T.reshape(1, 16, Np // 8, 8).transpose(0, 2, 1, 3).repeat(Rp // 16, 0).reshape(-1, 16, 8)
        Ct = D.reshape(Rp // 16, 16, Np // 8, 8).transpose(0, 2, 1, 3).reshape(-1, 16, 8)
        Dt = mma.mma_check(At, Bt, Ct)
        D = Dt.reshape(Rp // 16, Np // 8, 16, 8).transpose(0, 2, 1, 3).reshape(Rp, Np).copy()
    return D[:R, :N]


def spiky(rng, shape, specials=False):
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(np.float32)
    x[rng.random(shape) < 0.15] = 0.0
    x[rng.random(shape) < 0.02] = np.float32(1e-39)  # float32 subnormal → bf16 subnormal
    if specials:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, 4, replace=False)
        flat[idx] = [np.inf, -np.inf, np.nan, 3e38]
    return x


@pytest.mark.parametrize("R,N,K", [(1, 7, 40), (5, 13, 16), (19, 9, 7), (33, 24, 100)])
def test_linear_mma_equals_tile_chain(R, N, K):
    rng = np.random.default_rng(R * 1000 + N * 10 + K)
    X = spiky(rng, (R, K), specials=R > 4)
    W = round_bf16(spiky(rng, (N, K), specials=N == 13))
    out = np.empty((R, N), np.float32)
    cpu.linear_mma(X, W, out, R)
    np.testing.assert_array_equal(bits(out), bits(tile_chain(X, W)))
    # a decode row (one row, padded to 16 on the GPU) equals the same row of the batch
    for r in range(R):
        one = np.empty((1, N), np.float32)
        cpu.linear_mma(np.ascontiguousarray(X[r:r + 1]), W, one, 1)
        np.testing.assert_array_equal(bits(one[0]), bits(out[r]))


@pytest.mark.parametrize("R,N,K", [(1, 7, 40), (19, 9, 7), (33, 24, 104)])
def test_bf16_resident_weights_give_the_same_bits(R, N, K):
    rng = np.random.default_rng(R + N + K)
    X = spiky(rng, (R, K), specials=R > 4)
    W = round_bf16(spiky(rng, (N, K), specials=True))
    a, b = np.empty((R, N), np.float32), np.empty((R, N), np.float32)
    cpu.linear_mma(X, W, a, R)
    cpu.linear_mma(X, narrow(W), b, R)
    np.testing.assert_array_equal(bits(a), bits(b))
    np.testing.assert_array_equal(bits(a), bits(tile_chain(X, W)))
    E, k, I, H = 4, 2, 8, K
    idx = np.stack([rng.choice(E, k, replace=False) for _ in range(R)]).astype(np.int32)
    G, U = round_bf16(spiky(rng, (E * I, H))), round_bf16(spiky(rng, (E * I, H), specials=True))
    up = [np.empty((R * k, I), np.float32) for _ in range(2)]
    cpu.moe_up_mma(X, G, U, idx, I, up[0], R)
    cpu.moe_up_mma(X, narrow(G), narrow(U), idx, I, up[1], R)
    np.testing.assert_array_equal(bits(up[0]), bits(up[1]))
    D2 = round_bf16(spiky(rng, (E * H, I), specials=True))
    down = [np.empty((R * k, H), np.float32) for _ in range(2)]
    cpu.moe_down_mma(up[0], D2, idx, H, down[0], R)
    cpu.moe_down_mma(up[0], narrow(D2), idx, H, down[1], R)
    np.testing.assert_array_equal(bits(down[0]), bits(down[1]))


def test_mode_resident_weights_default_and_choice():
    assert resolve_for_mode(None, "exact-bf16", "cuda") == "bf16"
    assert resolve_for_mode(None, "exact-bf16", "cpu") == "f32"
    assert resolve_for_mode("f32", "exact-bf16", "cuda") == "f32"
    assert resolve_for_mode("bf16", "exact-bf16", "cpu") == "bf16"
    from harness.errors import PrimewalkError

    with pytest.raises(PrimewalkError, match="unknown weights mode 'fp8'"):
        resolve_for_mode("fp8", "exact-bf16", "cpu")


def attention_by_tiles(Q, kc, vc, start, R, hq, hkv, D, scale):
    """numba_kernels/mma_attention.py's order written out with mma.mma_check for every dot."""
    out = np.empty((R, hq * D), np.float32)
    rep = hq // hkv
    one = np.float32(1)
    for r in range(R):
        pos = start + r
        for h in range(hq):
            q, ko = Q[r:r + 1, h * D:(h + 1) * D], (h // rep) * D
            m = l = None
            acc = None
            for k0 in range(0, pos + 1, 64):
                n = min(64, pos + 1 - k0)
                s = tile_chain(q, kc[k0:k0 + n, ko:ko + D])[0] * np.float32(scale)
                mt = s.max()
                p = np.array([cpu.exp32(np.float32(v - mt)) for v in s], np.float32)
                lt = np.float32(0)
                for v in p:
                    lt = np.float32(lt + v)
                pv = tile_chain(p[None], np.ascontiguousarray(vc[k0:k0 + n, ko:ko + D].T))[0]
                if m is None:
                    m, l, acc = mt, lt, pv
                else:
                    mn = max(m, mt)
                    al, be = cpu.exp32(np.float32(m - mn)), cpu.exp32(np.float32(mt - mn))
                    l = cpu.merge_acc(l, al, lt, be)
                    acc = np.array([cpu.merge_acc(a, al, b, be) for a, b in zip(acc, pv)], np.float32)
                    m = mn
            out[r, h * D:(h + 1) * D] = acc / l
    assert one == 1
    return out


def test_attention_mma_equals_tile_chains():
    rng = np.random.default_rng(5)
    hq, hkv, D, start, R = 3, 1, 24, 70, 3  # odd heads, D not a multiple of 16, two tiles
    kc = rng.standard_normal((start + R, hkv * D)).astype(np.float32)
    vc = rng.standard_normal((start + R, hkv * D)).astype(np.float32)
    Q = rng.standard_normal((R, hq * D)).astype(np.float32)
    out = np.empty((R, hq * D), np.float32)
    cpu.attention_mma(Q, kc, vc, out, start, R, hq, hkv, D, np.float32(0.2))
    np.testing.assert_array_equal(bits(out), bits(attention_by_tiles(Q, kc, vc, start, R, hq, hkv, D, 0.2)))
    # a decode row equals the same row of the batch
    one = np.empty((1, hq * D), np.float32)
    cpu.attention_mma(np.ascontiguousarray(Q[2:3]), kc, vc, one, start + 2, 1, hq, hkv, D, np.float32(0.2))
    np.testing.assert_array_equal(bits(one[0]), bits(out[2]))


@pytest.fixture(scope="module")
def engines():
    ck = load_checkpoint(default_model_path())
    return Engine(ck, "cpu"), Engine(ck, "cpu", mode="exact-bf16")


def test_engine_mode_rounds_gemm_weights_only(engines):
    e32, e16 = engines
    assert e32.mode == "exact" and e16.mode == "exact-bf16"
    L32, L16 = e32.layers[0], e16.layers[0]
    for key in ("qkvzba", "out", "gu", "down"):
        np.testing.assert_array_equal(L16[key], round_bf16(L32[key]))
        assert (bits(L16[key]) & 0xFFFF == 0).all()
    np.testing.assert_array_equal(L16["in_norm"], L32["in_norm"])  # norms stay as loaded
    np.testing.assert_array_equal(e16.embed, e32.embed)
    assert e16.ops.linear is cpu.linear_mma and e16.ops.attention is cpu.attention_mma
    assert e32.ops.linear is cpu.linear


def test_engine_decode_row_equals_prime_row(engines):
    _, e16 = engines
    ids = (np.arange(70) * 7 + 3) % e16.cfg.vocab_size
    s1 = e16.new_session(80)
    _, _ = e16.prime_chunk(s1, ids[:40])
    l_prime, h_prime = e16.target_step(s1, ids[40:70])  # 30 verify rows, one launch
    s2 = e16.new_session(80)
    e16.prime_chunk(s2, ids[:40])
    for t in range(40, 70):
        l_dec, h_dec = e16.decode_step(s2, ids[t])
        np.testing.assert_array_equal(bits(l_dec), bits(l_prime[t - 40]))
        np.testing.assert_array_equal(bits(e16.host(h_dec)[0]), bits(e16.host(h_prime)[t - 40]))


def test_engine_mode_bf16_resident_weights(engines):
    """exact-bf16 with the GEMM weights resident as bf16 bits: uint16 matrices holding the rounded
    weights' bits, and every logit and hidden row the bits of the float32-resident engine."""
    _, e16 = engines
    eb = Engine(e16.ckpt, "cpu", mode="exact-bf16", weights="bf16")
    assert eb.weights == "bf16" and e16.weights == "f32"
    for key in ("qkvzba", "out", "gu", "down"):
        assert eb.layers[0][key].dtype == np.uint16
        np.testing.assert_array_equal(eb.layers[0][key], narrow(e16.layers[0][key]))
    assert eb.lm_head.dtype == np.uint16 and eb.embed.dtype == np.float32
    ids = (np.arange(37) * 5 + 1) % eb.cfg.vocab_size
    sa, sb = e16.new_session(48), eb.new_session(48)
    la, ha = e16.prime_chunk(sa, ids[:30])
    lb, hb = eb.prime_chunk(sb, ids[:30])
    np.testing.assert_array_equal(bits(la), bits(lb))
    for t in ids[30:]:
        la, _ = e16.decode_step(sa, t)
        lb, _ = eb.decode_step(sb, t)
        np.testing.assert_array_equal(bits(la), bits(lb))


def test_modes_differ_and_bad_mode_is_one_line(engines):
    e32, e16 = engines
    ids = np.arange(1, 30) % e32.cfg.vocab_size
    a, _ = e32.prime_chunk(e32.new_session(40), ids)
    b, _ = e16.prime_chunk(e16.new_session(40), ids)
    assert not np.array_equal(a, b)
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()
    with pytest.raises(InputError, match="unknown mode 'bf16'"):
        Engine(e32.ckpt, "cpu", mode="bf16")


def test_spec_mode_is_part_of_the_spec_hash():
    from harness.errors import PrimewalkError
    from harness.matrix.receipts import spec_hash
    from harness.matrix.specfile import load_spec

    a = load_spec(os.path.join(REPO, "harness", "specs", "tiny.toml"))
    b = load_spec(os.path.join(REPO, "harness", "specs", "tiny.toml"), mode="exact-bf16")
    assert (a.mode, b.mode) == ("exact", "exact-bf16") and b.data["mode"] == "exact-bf16"
    assert spec_hash(a.data) != spec_hash(b.data)
    with pytest.raises(PrimewalkError, match="--mode: expected one of exact, exact-bf16"):
        load_spec(os.path.join(REPO, "harness", "specs", "tiny.toml"), mode="fp8")
