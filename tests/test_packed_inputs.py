"""exact-bf16's packed GEMM inputs (``xp=``, issue #19): the ops that produce a GEMM's input (the
norms, SwiGLU, the attention gate) write its bf16 pairs beside it, and ``linear_mma`` reads them
instead of packing X in a launch of its own.

Each claim against an independent computation:

- a producer's packed output is numpy's round-to-nearest-even of its float32 output
  (``mma.f32_to_bf16``), pair by pair, NaN and ±inf outputs included, and its float32 output is
  unchanged by the packing;
- ``linear_mma`` with ``xp`` reads the bf16 values from ``xp``, not from X;
- the engine in exact-bf16 mode gives the same bits with its packed inputs as without them (every
  GEMM then rounds X itself), on the tiny model and on MoE configs with shared experts and the MTP
  head, a gated norm whose heads pack their own pairs and one whose odd head width cannot.

The CUDA kernels' side is the simulator's (``tests/cudasim_run.py``, ``tests/test_sim_mma_tc.py``)
and the device check's (``harness/gpu/devicecheck.py``: ``packed_cases``).
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.engine.config import ModelConfig
from harness.engine.model import Engine
from harness.engine.weights import Checkpoint, load_checkpoint
from harness.models import default_model_path
from harness.synth import random_tensors
from numba_kernels import cpu
from numba_kernels.mma import f32_to_bf16

F32 = np.float32
rng = np.random.default_rng(11)


def packed(a):
    """numpy's packing of float32 rows: bf16 bits (nearest even; every NaN 0x7fc0), pairs as
    uint32, low half first."""
    b = np.where(np.isnan(a), 0x7FC0, f32_to_bf16(a)).astype(np.uint32)
    return b[:, 0::2] | (b[:, 1::2] << 16)


def bits(a):
    return np.ascontiguousarray(a, F32).view(np.uint32)


def nonfinite(a):
    """``a`` with a NaN of sign 1 (its packed half is 0x7fc0 all the same) and an ∞."""
    a = a.copy()
    a[0, 1], a[-1, -3] = -np.float32(np.nan), np.inf
    return a


def run_both(op, args, out_i, xp_shape):
    """``op`` without and with a packed output; returns (the float32 output of each, the packed one)."""
    plain = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    getattr(cpu, op)(*plain)
    xp = np.full(xp_shape, 0xDEADBEEF, np.uint32)
    withp = [a.copy() if isinstance(a, np.ndarray) else a for a in args] + [xp]
    getattr(cpu, op)(*withp)
    return plain[out_i], withp[out_i], xp


@pytest.mark.parametrize("R,N,oo", [(1, 64, 0), (3, 70, 70), (2, 2048, 0)])
def test_norms_pack_their_outputs(R, N, oo):
    X, w = nonfinite(rng.standard_normal((R, N)).astype(F32)), (0.1 * rng.standard_normal(N)).astype(F32)
    a, b, xp = run_both("rmsnorm", (X, w, F32(1e-6), np.zeros((R, oo + N), F32), oo, R), 3, (R, (oo + N) // 2))
    np.testing.assert_array_equal(bits(a), bits(b))
    np.testing.assert_array_equal(xp[:, oo // 2:], packed(b[:, oo:]))
    assert (xp[:, :oo // 2] == 0xDEADBEEF).all()  # outside the op's columns: untouched
    D = nonfinite(rng.standard_normal((R, N)).astype(F32))
    a, b, xp = run_both("add_rmsnorm", (X, D, w, F32(1e-6), np.zeros((R, N), F32), 0, R, np.zeros(2, np.int32), 1),
                        4, (R, N // 2))
    np.testing.assert_array_equal(bits(a), bits(b))
    np.testing.assert_array_equal(xp, packed(b))
    assert np.isnan(b).any()  # the NaN pairs were among them


@pytest.mark.parametrize("R,H,D", [(1, 4, 16), (3, 2, 40)])
def test_gated_norm_and_gates_pack_their_outputs(R, H, D):
    n = H * D
    X, Z = nonfinite(rng.standard_normal((R, n)).astype(F32)), rng.standard_normal((R, 3 * n)).astype(F32)
    w = (1 + 0.1 * rng.standard_normal(D)).astype(F32)
    a, b, xp = run_both("gated_rmsnorm", (X, Z, 2 * n, H, D, w, F32(1e-6), np.zeros((R, n), F32), R), 7, (R, n // 2))
    np.testing.assert_array_equal(bits(a), bits(b))
    np.testing.assert_array_equal(xp, packed(b))
    GU = nonfinite(3 * rng.standard_normal((R, 2 * n)).astype(F32))
    a, b, xp = run_both("swiglu_act", (GU, n, np.zeros((R, n), F32), R), 2, (R, n // 2))
    np.testing.assert_array_equal(bits(a), bits(b))
    np.testing.assert_array_equal(xp, packed(b))
    a, b, xp = run_both("sigmoid_gate", (X, GU, n, np.zeros((R, n), F32), R), 3, (R, n // 2))
    np.testing.assert_array_equal(bits(a), bits(b))
    np.testing.assert_array_equal(xp, packed(b))


@pytest.mark.parametrize("op,args", [
    ("rmsnorm", lambda xp: (np.ones((2, 8), F32), np.zeros(8, F32), F32(1e-6), np.zeros((2, 16), F32), 3, 2, xp)),
    ("rmsnorm", lambda xp: (np.ones((2, 8), F32), np.zeros(8, F32), F32(1e-6), np.zeros((2, 16), F32), 8, 2, xp[:, :3])),
    ("gated_rmsnorm", lambda xp: (np.ones((2, 6), F32), np.ones((2, 6), F32), 0, 2, 3, np.ones(3, F32), F32(1e-6),
                                  np.zeros((2, 6), F32), 2, xp)),
    ("swiglu_act", lambda xp: (np.ones((2, 14), F32), 7, np.zeros((2, 7), F32), 2, xp)),
    ("linear_mma", lambda xp: (np.ones((2, 12), F32), np.ones((3, 12), F32), np.zeros((2, 3), F32), 2, xp)),
])
def test_unusable_packed_output_is_one_clear_error(op, args):
    with pytest.raises(ValueError, match="xp"):
        getattr(cpu, op)(*args(np.zeros((2, 8), np.uint32)))


def test_linear_mma_reads_the_packed_values():
    R, K, N = 3, 96, 40
    X = nonfinite(rng.standard_normal((R, K)).astype(F32))
    W = (f32_to_bf16(0.1 * rng.standard_normal((N, K)).astype(F32)).astype(np.uint32) << 16).view(F32)
    want, got, other = (np.zeros((R, N), F32) for _ in range(3))
    cpu.linear_mma(X, W, want, R)
    cpu.linear_mma(X, W, got, R, packed(X))
    np.testing.assert_array_equal(bits(want), bits(got))
    Y = rng.standard_normal((R, K)).astype(F32)
    cpu.linear_mma(X, W, other, R, packed(Y))  # X says one thing, xp another: xp wins
    cpu.linear_mma(Y, W, want, R)
    np.testing.assert_array_equal(bits(want), bits(other))


MOE = dict(
    vocab_size=96, hidden_size=64, num_hidden_layers=3,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=6,
    linear_conv_kernel_dim=3, num_attention_heads=3, num_key_value_heads=1, head_dim=16,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    rms_norm_eps=1e-6, intermediate_size=48, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
    shared_expert_intermediate_size=24, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[0],
    tie_word_embeddings=False, num_nextn_predict_layers=1,
)


def _engines(ck):
    """Two exact-bf16 CPU engines on ``ck``: with packed GEMM inputs (the default) and without."""
    a, b = Engine(ck, "cpu", mode="exact-bf16"), Engine(ck, "cpu", mode="exact-bf16")
    b.xp = lambda *_: None  # every GEMM rounds its X itself
    return a, b


@pytest.mark.parametrize("model", ["tiny", "moe-dv6", "moe-dv3-tied"])
def test_engine_bits_with_and_without_packed_inputs(model):
    if model == "tiny":
        ck = load_checkpoint(default_model_path())
    else:
        d = dict(MOE)
        if model == "moe-dv3-tied":  # 8 value heads of 3: a head cannot pack its pairs (none packed)
            d.update(linear_num_value_heads=8, linear_value_head_dim=3, tie_word_embeddings=True)
        cfg = ModelConfig.from_dict(d, model)
        ck = Checkpoint(cfg, random_tensors(cfg, seed=5))
    a, b = _engines(ck)
    H = ck.config.hidden_size
    assert a.xp("h", 2, H) is not None and b.xp("h", 2, H) is None
    a._trace = object()  # a recording trace: faults flipped into an op's output reach its GEMMs
    assert a.xp("h", 2, H) is None
    a._trace = None
    same_steps(a, b, ck)


def same_steps(a, b, ck, primed=None):
    """Engines ``a`` and ``b`` on ``ck`` give the same bits: a 20-row prime's logits and hidden
    rows, a captured 5-row verify step, 3 decode steps, the cache digests and (with an MTP head)
    3 MTP rows; ``primed()`` runs right after the prime."""
    ids = (np.arange(30) * 7 + 3) % ck.config.vocab_size
    sa, sb = a.new_session(40), b.new_session(40)
    la, ha = a.prime_chunk(sa, ids[:20])
    lb, hb = b.prime_chunk(sb, ids[:20])
    np.testing.assert_array_equal(bits(la), bits(lb))
    np.testing.assert_array_equal(bits(a.host(ha)), bits(b.host(hb)))
    if primed is not None:
        primed()
    la, _ = a.target_step(sa, ids[20:25], capture=True)
    lb, _ = b.target_step(sb, ids[20:25], capture=True)
    np.testing.assert_array_equal(bits(la), bits(lb))
    for t in ids[25:28]:
        la, _ = a.decode_step(sa, int(t))
        lb, _ = b.decode_step(sb, int(t))
        np.testing.assert_array_equal(bits(la), bits(lb))
    assert sa.cache.digest() == sb.cache.digest()
    if ck.has_mtp:
        hid = np.asarray(a.host(ha), F32)[:3]
        ma, _ = a.mtp_rows(sa, [int(t) for t in ids[:3]], hid, 0)
        mb, _ = b.mtp_rows(sb, [int(t) for t in ids[:3]], hid, 0)
        np.testing.assert_array_equal(bits(ma), bits(mb))


@pytest.mark.parametrize("bad", [None, "nan", "inf", "past-R"])
def test_lm_head_flag_in_exact_bf16(bad):
    """``linear_flag_mma`` (exact-bf16's lm head, fused on a GPU into the bf16 GEMV's stores): its
    outputs are ``linear_mma``'s, and flags[slot] is set exactly when an output row below R
    holds a NaN or ±inf (numpy's check of those outputs)."""
    R, K, N = 3, 96, 40
    X = rng.standard_normal((R + 1, K)).astype(F32)
    if bad == "nan":
        X[1, 5] = np.nan
    elif bad == "inf":
        X[2, 7] = F32(3e38)  # a product past float32
    elif bad == "past-R":
        X[R, 3] = np.nan  # never stored: no flag
    W = f32_to_bf16(rng.standard_normal((N, K)).astype(F32) * F32(10 if bad == "inf" else 0.1))
    want, got = np.zeros((R + 1, N), F32), np.zeros((R + 1, N), F32)
    flags = np.zeros(3, np.int32)
    cpu.linear_mma(X, W, want, R)
    cpu.linear_flag_mma(X, W, got, R, flags, 2, packed(X))
    np.testing.assert_array_equal(bits(want), bits(got))
    assert flags[2] == int(not np.isfinite(want[:R]).all()) and flags[:2].sum() == 0
    assert (flags[2] == 1) == (bad in ("nan", "inf"))


def test_exact_bf16_engine_fuses_the_lm_head_flag_with_bf16_weights():
    """With bf16-resident weights the exact-bf16 engine runs the fused ``linear_flag`` (what lets a
    captured step store its logits straight into mapped host memory); with float32 weights the
    lm head and a separate check. The logits are the same bits either way."""
    ck = load_checkpoint(default_model_path())
    e16, eb = Engine(ck, "cpu", mode="exact-bf16"), Engine(ck, "cpu", mode="exact-bf16", weights="bf16")
    assert not e16._fused() and eb._fused()
    assert eb.ops.linear_flag is cpu.linear_flag_mma
    calls = []
    real = eb.ops.linear_flag
    eb.ops.linear_flag = lambda *a: calls.append(len(a)) or real(*a)
    ids = (np.arange(12) * 5 + 2) % ck.config.vocab_size
    sa, sb = e16.new_session(16), eb.new_session(16)
    la, _ = e16.prime_chunk(sa, ids)
    lb, _ = eb.prime_chunk(sb, ids)
    np.testing.assert_array_equal(bits(la), bits(lb))
    assert calls == [7]  # X, W, out, R, flags, slot and the packed rows


@pytest.mark.parametrize("model", ["tiny", "moe"])
def test_exact_bf16_engine_fuses_the_swiglu_with_bf16_weights(model):
    """With bf16-resident weights the exact-bf16 engine runs each MLP's gate‖up projection and
    its SwiGLU (the dense MLPs' and the shared experts') as one op, ``linear_swiglu_mma`` (on a
    GPU one GEMV launch, its epilogue storing silu(gate)·up); with float32 weights, and in a
    traced step (bisect taps each op's output), the two ops. Logits, hidden rows, MTP rows and
    cache digests are the same bits either way."""
    from harness.engine.trace import Trace

    if model == "tiny":
        ck = load_checkpoint(default_model_path())
    else:  # layer 0 dense, the others routed experts with a shared one
        cfg = ModelConfig.from_dict(dict(MOE), model)
        ck = Checkpoint(cfg, random_tensors(cfg, seed=7))
    e16, eb = Engine(ck, "cpu", mode="exact-bf16"), Engine(ck, "cpu", mode="exact-bf16", weights="bf16")
    calls = {id(e16): 0, id(eb): 0}
    for e in (e16, eb):
        def counted(*a, _e=e, _f=e.ops.linear_swiglu_mma):
            calls[id(_e)] += 1
            return _f(*a)
        e.ops.linear_swiglu_mma = counted
    mlps = sum(1 for L in eb.layers if not L["moe"] or L["shared"])

    def primed():
        assert calls[id(e16)] == 0 and calls[id(eb)] == mlps

    same_steps(e16, eb, ck, primed)
    n = calls[id(eb)]
    assert n > 5 * mlps
    st = eb.new_session(40)
    st.trace = Trace(eb)
    eb.prime_chunk(st, np.arange(9) + 3)
    assert calls[id(eb)] == n  # traced: the two ops, each tapped
    assert {"mlp_gu", "mlp_act"} <= {op for _, op in st.trace.names["trunk"]} and st.trace.steps


def test_linear_swiglu_mma_is_the_two_ops():
    """``linear_swiglu_mma``'s outputs and packed pairs are ``linear_mma`` then ``swiglu_act``'s,
    from X or from its packed pairs; shapes that do not fit are one clear error."""
    R, K, I = 3, 72, 10
    X = (4 * rng.standard_normal((R, K))).astype(F32)
    X[2, 5] = np.nan
    W = ((rng.standard_normal((2 * I, K)) / np.sqrt(K)).astype(F32).view(np.uint32) >> 16).astype(np.uint16)
    gu, want, wx = np.zeros((R, 2 * I), F32), np.zeros((R, I), F32), np.zeros((R, I // 2), np.uint32)
    cpu.linear_mma(X, W, gu, R)
    cpu.swiglu_act(gu, I, want, R, wx)
    for xp in (None, np.ascontiguousarray(packed(X))):
        out, ox = np.full((R, I), 7, F32), np.zeros((R, I // 2), np.uint32)
        cpu.linear_swiglu_mma(X, W, I, out, R, np.zeros((R, 2 * I), F32), xp, ox)
        np.testing.assert_array_equal(bits(out), bits(want))
        np.testing.assert_array_equal(ox, wx)
        np.testing.assert_array_equal(ox, packed(want))
    with pytest.raises(ValueError, match=r"W must be \[2I, K\]"):
        cpu.linear_swiglu_mma(X, W, I + 1, np.zeros((R, I + 1), F32), R, np.zeros((R, 2 * I + 2), F32))
    with pytest.raises(ValueError, match="gu"):
        cpu.linear_swiglu_mma(X, W, I, np.zeros((R, I), F32), R, np.zeros((R, I), F32))
    W9 = W[np.r_[0:9, I:I + 9]]  # I = 9: no pairs to pack
    with pytest.raises(ValueError, match="packed output"):
        cpu.linear_swiglu_mma(X, W9, 9, np.zeros((R, 9), F32), R, np.zeros((R, 18), F32), None, np.zeros((R, 5), np.uint32))
