"""The bf16 tensor-core MMA emulation (issue #19): the Numba integer emulation against the slow
Fraction reference, hand-worked cases of the rule, `harness mma-check` errors, the recorder
end to end with fake hardware, and every committed hardware vector file: the documented rule
matches 100 % of them, and each measured part of the rule is pinned by the outputs that the
alternatives get wrong."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import zlib

import numpy as np
import pytest

from harness.gpu import mmacheck
from harness.errors import PrimewalkError
from numba_kernels import mma
from numba_kernels.mma import DEFAULT, Rule, bf16_to_f32, f32_to_bf16, mma_check_bits, ref_mma

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECEIPTS = sorted(glob.glob(os.path.join(ROOT, "receipts", "mma", "*.npz")))
FIRST = os.path.join(ROOT, "receipts", "mma", "h200-mma-vectors.npz")  # the first H200 recording


def _recorder():
    spec = importlib.util.spec_from_file_location("mma_vectors", os.path.join(ROOT, "tools", "mma_vectors.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MV = _recorder()


def bf(x) -> int:
    """bf16 bits of a value that bf16 holds exactly."""
    b = int(f32_to_bf16(np.float32(x)))
    assert float(bf16_to_f32(np.uint16(b))) == np.float32(x), x
    return b


def f32bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def one(arow, bcol, c, rule: Rule = DEFAULT) -> int:
    """d[0, 0] of a tile whose row 0 of A and column 0 of B are given (bf16 bits), C[0,0] = c
    (a float or, as int, bits); checks the Numba emulation and the slow reference agree."""
    A = np.zeros((1, 16, 16), np.uint16)
    B = np.zeros((1, 16, 8), np.uint16)
    C = np.zeros((1, 16, 8), np.float32)
    A[0, 0, : len(arow)] = arow
    B[0, : len(bcol), 0] = bcol
    C.view(np.uint32)[0, 0, 0] = c if isinstance(c, int) else f32bits(c)
    got = int(mma_check_bits(A, B, C, rule)[0, 0, 0])
    ref = mma.ref_dot(A[0, 0, :], B[0, :, 0], int(C.view(np.uint32)[0, 0, 0]), rule)
    assert got == ref, f"numba {got:08x} vs reference {ref:08x}"
    single = int(mma.mma_m16n8k16(A[0], B[0], C[0], rule.params()).view(np.uint32)[0, 0])
    assert single == got
    return got


# ------------------------------------------------------------------------------------------------
# Numba emulation = slow reference
# ------------------------------------------------------------------------------------------------
def _rand_tiles(rng, n, kind):
    if kind == "normal":
        A = MV.rand_bf16(rng, (n, 16, 16), -8, 8)
        B = MV.rand_bf16(rng, (n, 16, 8), -8, 8)
        C = MV.c_mix(rng, n)
    elif kind == "mixed":
        A = MV.rand_bf16(rng, (n, 16, 16), -40, 40, zeros=0.1)
        B = MV.rand_bf16(rng, (n, 16, 8), -40, 40)
        C = MV.rand_f32(rng, (n, 16, 8), -60, 60)
    elif kind == "zeros":
        A = MV.rand_bf16(rng, (n, 16, 16), -10, 10, zeros=1 / 3)
        B = MV.rand_bf16(rng, (n, 16, 8), -10, 10, zeros=1 / 3)
        C = MV.c_mix(rng, n)
    elif kind == "cancel":
        A, B, C = MV.g_cancel_pairs(rng, n)
    else:
        A, B, C = MV.g_cancel_c(rng, n)
    return A, B, C


@pytest.mark.parametrize("kind", ["normal", "mixed", "zeros", "cancel", "cancel_c"])
def test_numba_equals_reference_random(kind):
    rng = np.random.default_rng(zlib.crc32(kind.encode()))
    A, B, C = _rand_tiles(rng, 6, kind)
    E = mma_check_bits(A, B, C)
    for t in range(len(A)):
        np.testing.assert_array_equal(E[t], ref_mma(A[t], B[t], C[t]), err_msg=f"{kind} tile {t}")


def test_numba_equals_reference_every_category():
    """One tile of every recorder category (specials, subnormals, overflow, random bits)."""
    A, B, C, cat, names = MV.generate(seed=5, scale=0.0)  # 2 tiles per category
    first = np.unique(cat, return_index=True)[1]
    E = mma_check_bits(A[first], B[first], C[first])
    for e, t in zip(E, first):
        np.testing.assert_array_equal(e, ref_mma(A[t], B[t], C[t]), err_msg=str(names[cat[t]]))


VARIANTS = [
    Rule(in_sub=mma.SUB_LOG2, c_sub=mma.SUB_LOG2),
    Rule(in_sub=mma.SUB_DAZ, c_sub=mma.SUB_DAZ, zero_sign=mma.ZS_PLUS),
    Rule(out_sub=mma.OUT_RNE, overflow=mma.OVF_MAXFLT),
    Rule(out_sub=mma.OUT_RNA),
    Rule(out_sub=mma.OUT_RZ24_RNE, grid_floor=-150),
    Rule(out_sub=mma.OUT_FTZ, prod_ovf=mma.PROD_INF, inf_zero=mma.IZ_ZERO, nan_bits=mma.QNAN),
    Rule(norm_round=mma.RND_RNE, grid_floor=-149),
]


@pytest.mark.parametrize("rule", VARIANTS, ids=lambda r: r.label())
def test_numba_equals_reference_variants(rule):
    names = ["subnormal_result", "c_subnormal", "bf16_subnormal_in", "f32_overflow", "prod_huge",
             "inf_zero", "nan_C", "zero_sign", "random_bits", "normal_e8"]
    A, B, C, cat, allnames = MV.generate(seed=11, scale=0.0)
    idx = [int(np.nonzero(cat == list(allnames).index(n))[0][0]) for n in names]
    E = mma_check_bits(A[idx], B[idx], C[idx], rule)
    for e, t in zip(E, idx):
        np.testing.assert_array_equal(e, ref_mma(A[t], B[t], C[t], rule), err_msg=str(allnames[cat[t]]))


def test_parallel_batch_equals_single_tile():
    rng = np.random.default_rng(3)
    A, B, C = _rand_tiles(rng, 20, "mixed")
    E = mma.mma_check(A, B, C)
    for t in (0, 7, 19):
        np.testing.assert_array_equal(mma.mma_m16n8k16(A[t], B[t], C[t]).view(np.uint32), E[t].view(np.uint32))


# ------------------------------------------------------------------------------------------------
# hand-worked cases
# ------------------------------------------------------------------------------------------------
def test_products_are_exact_small_integers():
    # 3·5 + 7·(−2) + 0.5 = 1.5
    assert one([bf(3), bf(7)], [bf(5), bf(-2)], 0.5) == f32bits(1.5)


def test_negative_term_truncated_toward_zero_not_the_sum():
    # c = 1, product −2^-30: emax = 0, grid 2^-25, the product truncates to 0 → 1.0 exactly,
    # where RZ of the exact sum 1 − 2^-30 would be 0x3f7fffff
    assert one([bf(-(2.0 ** -30))], [bf(1)], 1.0) == 0x3F800000


def test_truncation_not_round_to_nearest():
    # c = 1, product 1.5·2^-25 = 3·2^-26: truncated to 2^-25 → 1 + 2^-25 → RZ → 1.0; the exact sum
    # 1 + 2^-24 + 2^-26 rounds to nearest as 1 + 2^-23 (0x3f800001)
    assert one([bf(1.5 * 2.0 ** -25)], [bf(1)], 1.0) == 0x3F800000
    assert one([bf(1.5 * 2.0 ** -25)], [bf(1)], 1.0, Rule(norm_round=mma.RND_RNE)) == 0x3F800000
    # RZ of the result itself: 1 + 2^-23 + 2^-24 (kept on the grid) → 1 + 2^-23
    assert one([bf(2.0 ** -23), bf(2.0 ** -24)], [bf(1), bf(1)], 1.0) == 0x3F800001


def test_exponent_field_sum_not_product_exponent():
    # 1.5·1.5 = 2.25 has e = 0 (field sum) although 2.25 ≥ 2, so the grid is 2^-25 and fifteen
    # products of 2^-25 survive: 2.25 + 15·2^-25 → RZ (ulp 2^-22) → 2.25 + 2^-22. With the
    # product's own exponent (1) the grid would be 2^-24 and they would all vanish (2.25).
    arow = [bf(1.5)] + [bf(2.0 ** -25)] * 15
    bcol = [bf(1.5)] + [bf(1)] * 15
    assert one(arow, bcol, 0.0) == 0x40100001


def test_accumulator_truncated_by_large_products():
    # products 2^20 and −2^20 cancel; c = 1.2345 is truncated to the grid 2^-5 of emax = 20
    c = np.float32(1.2345)
    want = np.float32(np.floor(float(c) * 32) / 32)
    assert one([bf(2.0 ** 20), bf(-(2.0 ** 20))], [bf(1), bf(1)], float(c)) == f32bits(want)


def test_products_beyond_float32_range():
    big = bf(2.0 ** 100)
    # 2^200 − 2^200 + 1: exact products, emax 200, the 1 truncates to 0, sum 0 → +0 (no inf, no NaN)
    assert one([big, big, bf(1)], [big, bf(-(2.0 ** 100)), bf(1)], 0.0) == 0
    # 2^200 alone overflows float32 → +inf (overflow = INF) or FLT_MAX
    assert one([big], [big], 0.0) == 0x7F800000
    assert one([big], [big], 0.0, Rule(overflow=mma.OVF_MAXFLT)) == 0x7F7FFFFF
    # 2^100·2^-100 = 1 is an ordinary product
    assert one([big], [bf(2.0 ** -100)], 0.0) == 0x3F800000
    # as a candidate, a product with e ≥ 128 may be an infinity of its own: then 2^200 − 2^200 is NaN
    assert one([big, big], [big, bf(-(2.0 ** 100))], 0.0, Rule(prod_ovf=mma.PROD_INF)) == mma.NAN_CUDA


def test_specials():
    inf, ninf = 0x7F80, 0xFF80
    assert one([inf], [bf(2)], 1.0) == 0x7F800000
    assert one([inf], [bf(-2)], 1.0) == 0xFF800000
    assert one([inf], [0], 1.0) == mma.NAN_CUDA  # ∞·0
    assert one([inf], [0], 1.0, Rule(inf_zero=mma.IZ_ZERO)) == 0x3F800000
    assert one([inf, inf], [bf(1), bf(-1)], 0.0) == mma.NAN_CUDA  # +∞ − ∞
    assert one([ninf], [bf(1)], 0x7F800000) == mma.NAN_CUDA  # c = +∞, product −∞
    assert one([bf(1)], [bf(1)], 0xFF800000) == 0xFF800000  # c = −∞
    assert one([bf(1)], [bf(1)], 0x7FC12345) == mma.NAN_CUDA  # NaN payloads are not propagated
    assert one([0x7F81], [bf(1)], 0.0, Rule(nan_bits=mma.QNAN)) == mma.QNAN


IEEE_ZERO = DEFAULT.replace(zero_sign=mma.ZS_IEEE)


def test_signed_zeros():
    # all 16 products −0 and c = −0: the hardware writes +0 (IEEE would give −0)
    arow = [0x8000] * 16
    bcol = [bf(1)] * 16
    assert one(arow, bcol, -0.0) == 0
    assert one(arow, bcol, -0.0, IEEE_ZERO) == 0x80000000
    assert one(arow, bcol, 0.0) == 0
    assert one([], [], -0.0) == 0  # c = −0 alone
    # exact cancellation → +0 even with c = −0
    assert one([bf(3), bf(-3)], [bf(1), bf(1)], -0.0) == 0
    assert one([bf(3), bf(-3)], [bf(1), bf(1)], -0.0, IEEE_ZERO) == 0


def test_negative_sum_truncated_to_zero_is_plus_zero():
    # c = −2^-149 (subnormal: emax = −126, grid 2^-151 = one "unit"), product +3 units:
    # S = −4 + 3 = −1 unit, below 2^-149 → zero: +0 on the hardware, −0 under IEEE signs
    c = 0x80000001
    a, b = bf(1.5 * 2.0 ** -75), bf(2.0 ** -75)  # 1.5·2^-150 = 3·2^-151
    assert one([a], [b], c) == 0
    assert one([a], [b], c, IEEE_ZERO) == 0x80000000
    # the same with the signs flipped is +0 either way
    assert one([a | 0x8000], [b], 0x00000001) == 0


def test_grid_floor():
    # c = 0, products 2^-134 (emax −134) and −2^-159. Without a floor the grid is 2^-159 and keeps
    # the small product: 2^-134 − 2^-159 → RZ to the subnormal grid → 2^-134 − 2^-149 (0x7fff).
    # The hardware's grid stops at 2^-158, so −2^-159 truncates to 0 and the result is 2^-134.
    arow = [bf(2.0 ** -67), bf(-(2.0 ** -80))]
    bcol = [bf(2.0 ** -67), bf(2.0 ** -79)]
    assert one(arow, bcol, 0.0) == 0x00008000
    assert one(arow, bcol, 0.0, DEFAULT.replace(grid_floor=mma.NO_FLOOR)) == 0x00007FFF
    # at emax −133 the floor and emax − 25 coincide (2^-158): a −2^-158 product is kept
    arow = [bf(2.0 ** -66), bf(-(2.0 ** -79))]
    bcol = [bf(2.0 ** -67), bf(2.0 ** -79)]
    assert one(arow, bcol, 0.0) == 0x0000FFFF
    # a product below 2^-158 alone contributes nothing: +0
    assert one([bf(-(2.0 ** -80))], [bf(2.0 ** -80)], 0.0) == 0
    # a non-zero c (e_c ≥ −126) keeps the grid at 2^-151 or above: the floor never acts
    assert one([bf(2.0 ** -75)], [bf(2.0 ** -75)], 0x00000001) == 0x00000001


def test_subnormal_results():
    # 1.5·2^-74 · 2^-75 = 1.5·2^-149: RZ → 2^-149 (0x1); RNE → 2·2^-149 (ties to even); FTZ → +0
    a, b = bf(1.5 * 2.0 ** -74), bf(2.0 ** -75)
    assert one([a], [b], 0.0) == 0x00000001
    assert one([a], [b], 0.0, Rule(out_sub=mma.OUT_RNE)) == 0x00000002
    assert one([a], [b], 0.0, Rule(out_sub=mma.OUT_FTZ)) == 0
    assert one([a], [b], 0.0, Rule(out_sub=mma.OUT_RNA)) == 0x00000002
    # 2.5·2^-149 (a = 1.25·2^-74): RNE → 2 (even), RNA → 3
    a25 = bf(1.25 * 2.0 ** -74)
    assert one([a25], [bf(2.0 ** -74)], 0.0, Rule(out_sub=mma.OUT_RNE)) == 0x00000002
    assert one([a25], [bf(2.0 ** -74)], 0.0, Rule(out_sub=mma.OUT_RNA)) == 0x00000003
    # a negative result under 2^-149 is +0 (−0 under IEEE signs)
    assert one([bf(-(2.0 ** -75))], [bf(2.0 ** -75)], 0.0) == 0
    assert one([bf(-(2.0 ** -75))], [bf(2.0 ** -75)], 0.0, IEEE_ZERO.replace(grid_floor=mma.NO_FLOOR)) == 0x80000000
    # a subnormal c alone passes through unchanged
    assert one([], [], 0x00000123) == 0x00000123


def test_bf16_subnormal_input_candidates():
    # a0 = 2^-133 (bf16 subnormal, field 0), b0 = 2^100: product 2^-33; a1·b1 = 3·2^-57.
    # FIELD: e0 = −126 + 100 = −26 → grid 2^-51 drops 3·2^-57 → 2^-33 (0x2f000000)
    # LOG2:  e0 = −133 + 100 = −33 → grid 2^-58 keeps it → 2^-33 + 3·2^-57 → RZ → 0x2f000001
    # DAZ:   the subnormal is 0 → 3·2^-57 (0x23C00000)
    arow = [0x0001, bf(1.5 * 2.0 ** -56)]
    bcol = [bf(2.0 ** 100), bf(1)]
    assert one(arow, bcol, 0.0) == 0x2F000000
    assert one(arow, bcol, 0.0, Rule(in_sub=mma.SUB_LOG2)) == 0x2F000001
    assert one(arow, bcol, 0.0, Rule(in_sub=mma.SUB_DAZ)) == 0x23C00000


def test_rule_labels_round_trip():
    for r in VARIANTS + [DEFAULT]:
        assert mma.parse_rule(r.label()) == r
    with pytest.raises(ValueError):
        mma.parse_rule("out_sub=sideways")
    with pytest.raises(ValueError):
        mma.parse_rule("colour=blue")


def test_docstring_states_the_rule():
    doc = mma.__doc__
    for words in ("emax − 25", "toward zero", "exponent fields", "2^−149", "nan_bits", "in_sub",
                  "max(emax − 25, −158)", "Zero is +0", "0x7fffffff", "Limits"):
        assert words in doc, words


# ------------------------------------------------------------------------------------------------
# harness mma-check
# ------------------------------------------------------------------------------------------------
def _vectors(path, n=10, **override):
    rng = np.random.default_rng(1)
    A, B, C = _rand_tiles(rng, n, "mixed")
    D = mma.mma_check(A, B, C)
    arrays = {"A": A, "B": B, "C": C, "D": D, "category": np.zeros(n, np.int32),
              "categories": np.array(["mixed"])}
    arrays.update(override)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    np.savez_compressed(path, **arrays)
    return arrays


def test_mma_check_all_match(tmp_path, capsys):
    p = tmp_path / "v.npz"
    _vectors(p)
    assert mmacheck.mma_check_file(str(p)) == (1280, 1280, None)
    assert mmacheck.main([str(p)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "mma-check: 1280/1280 outputs bitwise"


def test_mma_check_mismatch(tmp_path, capsys):
    p = tmp_path / "v.npz"
    arrays = _vectors(p)
    D = arrays["D"].copy()
    D.view(np.uint32)[3, 4, 5] ^= 1
    _vectors(p, D=D)
    m, n, info = mmacheck.mma_check_file(str(p))
    assert (m, n) == (1279, 1280)
    assert (info["tile"], info["i"], info["j"], info["category"]) == (3, 4, 5, "mixed")
    assert mmacheck.main([str(p)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "mma-check: 1279/1280 outputs bitwise"
    assert "first mismatch" in out and "tile 3 (i=4, j=5)" in out


@pytest.mark.parametrize("case, message", [
    ("missing", "missing key(s) D"),
    ("dtype", "A has dtype int32"),
    ("shape", "B has shape [10, 8, 16]"),
    ("ntiles", "C has 9 tiles"),
    ("empty", "no tiles"),
    ("garbage", "not a readable .npz"),
    ("npy", "not an .npz archive"),
    ("nofile", "no such file"),
    ("pickled", "cannot be read"),
])
def test_mma_check_malformed(tmp_path, capsys, case, message):
    p = tmp_path / "v.npz"
    if case == "missing":
        _vectors(p, D=None)
    elif case == "dtype":
        _vectors(p, A=np.zeros((10, 16, 16), np.int32))
    elif case == "shape":
        _vectors(p, B=np.zeros((10, 8, 16), np.uint16))
    elif case == "ntiles":
        _vectors(p, C=np.zeros((9, 16, 8), np.float32))
    elif case == "empty":
        z = {"A": np.zeros((0, 16, 16), np.uint16), "B": np.zeros((0, 16, 8), np.uint16),
             "C": np.zeros((0, 16, 8), np.float32), "D": np.zeros((0, 16, 8), np.float32)}
        np.savez(p, **z)
    elif case == "garbage":
        p.write_bytes(b"this is not a zip file")
    elif case == "npy":
        p = tmp_path / "v.npy"
        np.save(p, np.zeros(3))
    elif case == "nofile":
        p = tmp_path / "absent.npz"
    elif case == "pickled":
        _vectors(p, A=np.array([{"x": 1}], dtype=object))
    with pytest.raises(PrimewalkError) as e:
        mmacheck.mma_check_file(str(p))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert mmacheck.main([str(p)]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert len(cap.err.strip().splitlines()) == 1 and message in cap.err


def test_mma_check_register_hook(tmp_path):
    import argparse

    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command")
    mmacheck.register(sub)
    p = tmp_path / "v.npz"
    _vectors(p)
    args = ap.parse_args(["mma-check", str(p), "--rule", "out_sub=rne"])
    assert args.func(args) == 0  # no subnormal results in these tiles
    bad = ap.parse_args(["mma-check", str(p), "--rule", "out_sub=sideways"])
    with pytest.raises(PrimewalkError):
        bad.func(bad)


def test_mma_check_defaults_to_committed_files(tmp_path, capsys, monkeypatch):
    p = tmp_path / "v.npz"
    _vectors(p)
    monkeypatch.setattr(mmacheck, "committed_files", lambda: [str(p)])
    assert mmacheck.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "mma-check: 1280/1280 outputs bitwise" and out[1].startswith("files: ")
    monkeypatch.setattr(mmacheck, "committed_files", lambda: [])
    assert mmacheck.main([]) == 2
    assert "none committed" in capsys.readouterr().err
    # the real list is this checkout's receipts/mma/*.npz
    monkeypatch.undo()
    assert mmacheck.committed_files() == RECEIPTS


def test_mma_check_is_a_harness_command():
    from harness import cli

    args = cli.build_parser().parse_args(["mma-check", "x.npz", "--rule", "grid_floor=none"])
    assert args.files == ["x.npz"] and args.rule == "grid_floor=none" and callable(args.func)


# ------------------------------------------------------------------------------------------------
# the recorder, end to end on fake hardware
# ------------------------------------------------------------------------------------------------
def test_recorder_default_size():
    A, B, C, cat, names = MV.generate()
    assert A.shape[0] * 128 >= 1_050_000
    assert len(names) == len(set(names.tolist())) and np.all(np.bincount(cat) >= 64)


def test_recorder_fake_hw_end_to_end(tmp_path):
    out = tmp_path / "rec"
    assert MV.main(["--out", str(out), "--fake-hw", "out_sub=rne,nan_bits=0x7fc00000", "--scale", "0.03"]) == 0
    z = np.load(out / "mma_vectors.npz")
    assert set(z.files) == {"A", "B", "C", "D", "category", "categories"}
    assert z["A"].dtype == np.uint16 and z["D"].dtype == np.float32 and z["category"].shape == (z["A"].shape[0],)
    assert set(np.unique(z["category"])) == set(range(len(z["categories"])))
    # the documented rule differs from this fake hardware; the candidate search finds it
    m, n, info = mmacheck.mma_check_file(str(out / "mma_vectors.npz"))
    assert m < n and info is not None
    hidden = mma.parse_rule("out_sub=rne,nan_bits=0x7fc00000")
    m2, _, info2 = mmacheck.mma_check_file(str(out / "mma_vectors.npz"), hidden)
    assert m2 == n and info2 is None
    s = json.loads((out / "mma_summary.json").read_text())
    assert s["analysis"]["best"]["matched"] == n
    assert (out / "mma_mismatches.txt").read_text().startswith("==== rule: rule")
    assert (out / "mma_table.txt").exists() and (out / "src" / "mma_device.cu").exists()
    assert "     | emax " in (out / "mma_mismatches.txt").read_text()  # the rule's steps, explained
    # --previous: the same inputs recorded again; one changed bit is found
    A, B, C, cat, names = z["A"], z["B"], z["C"], z["category"], z["categories"]
    D = np.ascontiguousarray(z["D"]).view(np.uint32).copy()
    prev = MV.compare_previous([str(out / "mma_vectors.npz")], A, B, C, D, cat, names)
    assert prev["equal"] == prev["outputs"] == D.size and "first_difference" not in prev
    D[5, 2, 3] ^= 1
    prev = MV.compare_previous([str(out / "mma_vectors.npz")], A, B, C, D, cat, names)
    assert prev["equal"] == D.size - 1
    assert {k: prev["first_difference"][k] for k in ("tile", "i", "j")} == {"tile": 5, "i": 2, "j": 3}


def test_recorder_same_seed_regenerates_the_first_recording():
    """The categories added later come last: the default seed still generates the committed
    recording's inputs first, so a second recording can compare the hardware on them."""
    z = np.load(FIRST)
    A, B, C, cat, names = MV.generate()
    n = z["A"].shape[0]
    assert A.shape[0] > n
    assert np.array_equal(A[:n], z["A"]) and np.array_equal(B[:n], z["B"])
    assert np.array_equal(C[:n].view(np.uint32), z["C"].view(np.uint32))
    assert np.array_equal(cat[:n], z["category"]) and list(names[: len(z["categories"])]) == list(z["categories"])


def test_recorder_new_categories_discriminate():
    """floor_edge and underflow_sign separate the measured rule from its nearest alternatives on
    many outputs (the first recording had 12 and 4 such outputs)."""
    A, B, C, cat, names = MV.generate(seed=3, scale=0.2)
    for name, alternatives in (("floor_edge", ["grid_floor=none", "grid_floor=-157", "grid_floor=-159"]),
                               ("underflow_sign", ["zero_sign=ieee"])):
        t = cat == list(names).index(name)
        E = mma_check_bits(A[t], B[t], C[t])
        for spec in alternatives:
            differ = int((mma_check_bits(A[t], B[t], C[t], mma.parse_rule(spec)) != E).sum())
            assert differ >= 0.02 * E.size, (name, spec, differ, E.size)


# ------------------------------------------------------------------------------------------------
# committed hardware vectors
# ------------------------------------------------------------------------------------------------
def test_hardware_vectors_are_committed():
    assert RECEIPTS, "no hardware vectors under receipts/mma/ (tools/mma_vectors.py writes them)"
    total = sum(np.load(p)["A"].shape[0] * 128 for p in RECEIPTS)
    assert total >= 1_000_000, total


@pytest.mark.parametrize("path", RECEIPTS, ids=os.path.basename)
def test_committed_hardware_vectors(path):
    """The documented rule (``mma.DEFAULT``) reproduces every recorded output bit for bit,
    special cases included."""
    matched, total, info = mmacheck.mma_check_file(path)
    assert matched == total, f"{os.path.basename(path)}: {matched}/{total} outputs bitwise; first mismatch {info}"


# What each alternative to a measured part gets wrong on the first recording, in the categories
# that decide it (the table in numba_kernels/mma.py's docstring): the evidence for the rule.
PINS = [
    ("grid_floor=none", ["subnormal_result"], 3),
    ("grid_floor=-159", ["subnormal_result"], 2),
    ("grid_floor=-157", ["subnormal_result"], 10),
    ("grid_floor=-156", ["subnormal_result"], 52),
    ("zero_sign=ieee", ["zero_sign", "c_subnormal"], 5124),
    ("c_sub=log2", ["c_subnormal", "subnormal_result"], 10671),
    ("in_sub=log2", ["bf16_subnormal_in"], 7413),
    ("out_sub=rne", ["subnormal_result", "c_subnormal"], 25782),
    ("inf_zero=zero", ["inf_zero", "inf_A", "inf_B", "nan_A"], None),
    ("nan_bits=0x7fc00000", ["nan_A", "nan_B", "nan_C"], None),
]


@pytest.fixture(scope="module")
def first_recording():
    if not os.path.exists(FIRST):
        pytest.fail(f"{FIRST} is missing")
    v = mmacheck.load_vectors(FIRST)
    return v


@pytest.mark.parametrize("spec, cats, wrong", PINS, ids=[p[0] for p in PINS])
def test_each_measured_part_is_pinned(first_recording, spec, cats, wrong):
    v = first_recording
    names = [str(x) for x in v["categories"]]
    sel = np.isin(v["category"], [names.index(c) for c in cats])
    A, B, C = v["A"][sel], v["B"][sel], v["C"][sel]
    D = np.ascontiguousarray(v["D"][sel]).view(np.uint32)
    assert np.array_equal(mma_check_bits(A, B, C), D)
    bad = int((mma_check_bits(A, B, C, mma.parse_rule(spec)) != D).sum())
    if wrong is None:
        assert bad > 0, spec
    else:
        assert bad == wrong, (spec, bad)
