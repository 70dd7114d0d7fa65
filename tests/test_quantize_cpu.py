"""``quantize_fp8`` on the CPU (NumPy arrays and CPU tensors): the NumPy oracle
against an independent scalar reference on the hard cases (e4m3 ties, values
near 448, e4m3 subnormals, amax under the 1e-4 floor, partial blocks, NaN and
infinity, float32 denormals), every SF layout, outputs, and every argument
error."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import assert_bits_equal, from_torch, to_torch
from quantize_cases import (
    BLOCK_KINDS,
    LAYOUTS,
    as_input_dtype,
    expected_sf_buffer,
    float_values,
    hard_rows,
    scalar_quantize,
    sf_buffer_of,
)

import cupy_moe
from cupy_moe.quantize import dequantize_fp8_numpy, quantize_fp8, swiglu_quantize_fp8
from cupy_moe.quantize.numerics import AMAX_FLOOR, block_scales, encode_e4m3


def quantize(x, layout, npc, **kwargs):
    packed, col_major, round_sf = LAYOUTS[layout]
    return quantize_fp8(x, num_per_channels=npc, round_sf=round_sf, packed_ue8m0=packed,
                        use_tma_aligned_col_major_sf=col_major, **kwargs)


def check_against_scalar(x: np.ndarray, layout: str, npc: int, codes, out_sf) -> None:
    packed, col_major, round_sf = LAYOUTS[layout]
    want_codes, want_sf = scalar_quantize(float_values(x), npc, round_sf)
    assert_bits_equal(np.asarray(codes).view(np.uint8), want_codes, "x_fp8")
    assert_bits_equal(sf_buffer_of(out_sf, col_major=col_major),
                      expected_sf_buffer(want_sf, packed=packed, col_major=col_major), "x_sf")


# -- the oracle against the scalar reference -------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "uint16"])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_hard_cases_match_the_scalar_reference(dtype, npc, layout, rng):
    for num_tokens, hidden in ((1, 1), (3, 7), (5, 33), (2, 200), (7, 300), (4, 1000)):
        x = as_input_dtype(hard_rows(rng, num_tokens, hidden, npc), dtype)
        codes, out_sf = quantize(x, layout, npc)
        assert codes.dtype == ml_dtypes.float8_e4m3fn and codes.shape == (num_tokens, hidden)
        check_against_scalar(x, layout, npc, codes, out_sf)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_random_bits_match_the_scalar_reference(dtype, layout, rng):
    """Every bit pattern of the input type (NaN payloads, infinities,
    subnormals) in the same block as anything else."""
    itemsize = 2 if dtype == "bfloat16" else 4
    raw = rng.integers(0, 256, size=6 * 290 * itemsize, dtype=np.uint8)
    x = raw.view(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32).reshape(6, 290)
    for npc in (32, 128):
        codes, out_sf = quantize(x, layout, npc)
        check_against_scalar(x, layout, npc, codes, out_sf)


# -- hand-checked cases -------------------------------------------------------------

def _one_block(values, npc=128, **kwargs):
    x = np.zeros((1, npc), dtype=np.float32)
    x[0, :len(values)] = values
    return quantize_fp8(x, num_per_channels=npc, **kwargs)


@pytest.mark.parametrize("round_sf", [False, True])
def test_ties_round_to_the_even_code(round_sf):
    # block max 448: scale exactly 1 in both modes
    values = [448.0, 1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, 15 * 2.0**-10, 432.0, 400.0,
              -1.0625, 0.0, -0.0, 440.0]
    codes, sf = _one_block(values, round_sf=round_sf)
    assert sf.tolist() == [[1.0]]
    got = codes.view(np.uint8)[0, :len(values)].tolist()
    # 1.0625: 1.0 (0x38) vs 1.125 (0x39) -> 0x38; 1.1875 -> 1.25 (0x3A); 2^-10 -> 0;
    # 3 * 2^-10 -> 2 * 2^-9 (0x02); 15 * 2^-10 -> 2^-6 (0x08); 432: 416 (0x7D) vs 448
    # (0x7E) -> 0x7E; 400: 384 (0x7C) vs 416 -> 0x7C; -0.0 keeps its sign; 440 -> 448
    assert got == [0x7E, 0x38, 0x3A, 0x00, 0x02, 0x08, 0x7E, 0x7C, 0xB8, 0x00, 0x80, 0x7E]


def test_values_scaled_past_448_clamp_and_the_max_maps_to_448():
    # amax = 3 * 2^-8 (not a power of two): 448 / amax * amax rounds to 448.00003
    amax = np.float32(3 * 2.0**-8)
    codes, sf = _one_block([amax, -amax, amax * np.float32(0.999)])
    assert codes.view(np.uint8)[0, :3].tolist() == [0x7E, 0xFE, 0x7E]
    assert sf[0, 0] == np.float32(amax) / np.float32(448)


def test_amax_below_the_floor_uses_the_floor():
    floor_sf = np.float32(1e-4) / np.float32(448)
    codes, sf = _one_block([1e-6, -5e-5])
    assert sf[0, 0] == floor_sf
    scale = np.float32(448) / np.float32(1e-4)
    expected = encode_e4m3(np.array([1e-6, -5e-5], dtype=np.float32) * scale)
    assert codes.view(np.uint8)[0, :2].tolist() == expected.tolist()
    codes, sf = _one_block([])  # an all-zero block
    assert sf[0, 0] == floor_sf and not codes.view(np.uint8).any()
    _, sf = _one_block([], round_sf=True)  # 2.23e-7 rounds up to 2^-22
    assert sf[0, 0] == np.float32(2.0**-22)


def test_e4m3_subnormals_and_float32_denormals():
    # scale 1: values below 2^-6 are e4m3 subnormals (multiples of 2^-9)
    codes, _ = _one_block([448.0, 2.0**-9, 5 * 2.0**-9, 2.0**-7, 1e-40, -1e-40, 2.0**-11])
    assert codes.view(np.uint8)[0, :7].tolist() == [0x7E, 0x01, 0x05, 0x04, 0x00, 0x80, 0x00]
    # a block of float32 denormals only: amax floors at 1e-4, every code is +-0
    codes, _ = _one_block([1e-40, -2e-39, 1e-45])
    assert codes.view(np.uint8)[0, :3].tolist() == [0x00, 0x80, 0x00]


def test_nan_is_ignored_by_amax_and_coded_0x7f():
    codes, sf = _one_block([np.nan, 2.0, -np.nan, -1.0])
    assert sf[0, 0] == np.float32(2.0) / np.float32(448)
    got = codes.view(np.uint8)[0, :4].tolist()
    assert got[0] == got[2] == 0x7F  # whatever the NaN's sign
    assert got[1] == 0x7E and got[3] == encode_e4m3(np.float32(-1.0) * (np.float32(448) / 2))
    codes, sf = _one_block([np.nan] * 128)  # all NaN: amax 0 -> the floor
    assert sf[0, 0] == np.float32(1e-4) / np.float32(448)
    assert (codes.view(np.uint8) == 0x7F).all()


@pytest.mark.parametrize("round_sf", [False, True])
def test_infinity_poisons_its_block_only(round_sf):
    x = np.ones((1, 256), dtype=np.float32)
    x[0, 3], x[0, 4], x[0, 5], x[0, 200] = np.inf, -2.0, np.nan, 3.0
    codes, sf = quantize_fp8(x, round_sf=round_sf)
    assert np.isposinf(sf[0, 0]) and sf[0, 1] == (
        np.float32(2.0**-7) if round_sf else np.float32(3.0) / np.float32(448))
    block = codes.view(np.uint8)[0, :128]
    assert block[3] == 0x7F and block[5] == 0x7F  # inf * 0 and NaN
    assert block[4] == 0x80 and block[0] == 0x00  # finite values: +-0
    assert (dequantize_fp8_numpy(codes, sf, num_per_channels=128)[0, :128] != 0).all()
    assert np.isnan(dequantize_fp8_numpy(codes, sf, num_per_channels=128)[0, :128]).all()
    x[0, 3] = -np.inf  # -inf alike
    codes_neg, sf_neg = quantize_fp8(x, round_sf=round_sf)
    assert np.isposinf(sf_neg[0, 0]) and codes_neg.view(np.uint8)[0, 3] == 0x7F
    # packed: the infinite scale factor's byte is 0xFF (UE8M0's NaN)
    _, words = quantize_fp8(x, round_sf=True, packed_ue8m0=True,
                            use_tma_aligned_col_major_sf=True)
    assert int(words[0, 0]) & 0xFF == 0xFF and (int(words[0, 0]) >> 8) & 0xFF == 127 - 7


def test_round_sf_gives_powers_of_two_and_exact_inverse_scales(rng):
    x = hard_rows(rng, 16, 512, 128, kinds=("normal", "tiny", "near-max", "ties"))
    _, sf = quantize_fp8(x, round_sf=True)
    bits = sf.view(np.uint32)
    assert not (bits & 0x7FFFFF).any(), "round_sf scale factors must be powers of two"
    _, sf_plain = quantize_fp8(x)
    assert (sf >= sf_plain).all() and (sf < 2 * sf_plain).all()


def test_round_sf_inverse_from_the_exponent_equals_the_division():
    """quant_block_scales (quantize_e4m3.cuh) writes round_sf's 1 / sf from
    sf's exponent bits E, (254 - E) << 23 (inf: 0), where the oracle divides:
    the same bits on every rounded sf the floor and float32's range allow."""
    lowest, highest = (block_scales(np.array([amax], dtype=np.float32), round_sf=True)[0]
                       for amax in (AMAX_FLOOR, np.finfo(np.float32).max))
    exponents = (int(lowest.view(np.uint32)[0]) >> 23, int(highest.view(np.uint32)[0]) >> 23)
    assert exponents == (105, 247)
    bits = np.arange(exponents[0], exponents[1] + 1, dtype=np.uint32) << 23
    bits = np.append(bits, np.uint32(0x7F800000))   # an infinite amax
    from_exponent = np.where(bits == 0x7F800000, np.uint32(0), np.uint32(254 << 23) - bits)
    with np.errstate(divide="ignore"):
        divided = (np.float32(1.0) / bits.view(np.float32)).view(np.uint32)
    assert_bits_equal(from_exponent, divided)


# -- layouts ------------------------------------------------------------------------

@pytest.mark.parametrize("num_tokens", [0, 1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_shapes_strides_and_zero_pad_columns(num_tokens, layout, rng):
    packed, col_major, _ = LAYOUTS[layout]
    hidden, npc = 1000, 32   # 32 blocks, packed: 8 words
    x = as_input_dtype(hard_rows(rng, num_tokens, hidden, npc), "bfloat16")
    codes, out_sf = quantize(x, layout, npc)
    columns = 8 if packed else 32
    ld = -(-num_tokens // 4) * 4
    assert codes.shape == (num_tokens, hidden) and out_sf.shape == (num_tokens, columns)
    assert out_sf.dtype == (np.int32 if packed else np.float32)
    if col_major and num_tokens > 1:
        assert out_sf.strides == (out_sf.itemsize, ld * out_sf.itemsize)
    if not col_major:
        assert out_sf.flags.c_contiguous
    check_against_scalar(x, layout, npc, codes, out_sf)


def test_packed_words_hold_four_blocks_little_endian_and_zero_pad_blocks(rng):
    x = rng.standard_normal((3, 7 * 32)).astype(np.float32)  # 7 blocks: 2 words, 1 pad block
    x[:, 32:64] *= 2.0**10
    _, words = quantize_fp8(x, num_per_channels=32, round_sf=True, packed_ue8m0=True,
                            use_tma_aligned_col_major_sf=True)
    _, sf = quantize_fp8(x, num_per_channels=32, round_sf=True)
    exponents = (sf.view(np.uint32) >> 23).astype(np.int64)
    for r in range(3):
        word0, word1 = int(words[r, 0]) & 0xFFFFFFFF, int(words[r, 1]) & 0xFFFFFFFF
        assert [(word0 >> (8 * j)) & 0xFF for j in range(4)] == exponents[r, :4].tolist()
        assert [(word1 >> (8 * j)) & 0xFF for j in range(3)] == exponents[r, 4:].tolist()
        assert word1 >> 24 == 0


# -- outputs ------------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", ["float8_e4m3fn", "uint8"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_out_and_out_sf_are_written_in_place(out_dtype, layout, rng):
    packed, col_major, _ = LAYOUTS[layout]
    num_tokens, hidden, npc = 5, 300, 128
    x = as_input_dtype(hard_rows(rng, num_tokens, hidden, npc), "bfloat16")
    columns = 1 if packed else 3
    out = np.full((num_tokens, hidden), 0xAB, dtype=np.uint8).view(
        ml_dtypes.float8_e4m3fn if out_dtype == "float8_e4m3fn" else np.uint8)
    sf_dtype = np.int32 if packed else np.float32
    if col_major:
        buffer = np.full((columns, 8), -1, dtype=np.int32).view(sf_dtype)  # pad columns poisoned
        out_sf = buffer[:, :num_tokens].T
    else:
        out_sf = np.full((num_tokens, columns), -1, dtype=np.int32).view(sf_dtype)
    codes, result_sf = quantize(x, layout, npc, out=out, out_sf=out_sf)
    assert codes is out and result_sf is out_sf
    check_against_scalar(x, layout, npc, out, out_sf)


def test_only_one_output_given(rng):
    x = rng.standard_normal((3, 64)).astype(np.float32)
    out = np.empty((3, 64), dtype=np.uint8)
    codes, sf = quantize_fp8(x, out=out)
    assert codes is out and sf.dtype == np.float32
    out_sf = np.empty((3, 1), dtype=np.float32)
    codes, sf = quantize_fp8(x, out_sf=out_sf)
    assert sf is out_sf and codes.dtype == ml_dtypes.float8_e4m3fn
    check_against_scalar(x, "row-f32", 128, codes, sf)


def test_non_contiguous_input(rng):
    x = as_input_dtype(rng.standard_normal((8, 600)).astype(np.float32), "bfloat16")
    view = x[::2, 100:400]
    codes, sf = quantize_fp8(view, num_per_channels=32)
    check_against_scalar(np.ascontiguousarray(view), "row-f32", 32, codes, sf)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_torch_cpu_tensors_give_the_numpy_bits(layout, rng):
    packed, col_major, _ = LAYOUTS[layout]
    x = as_input_dtype(hard_rows(rng, 6, 520, 128), "bfloat16")
    codes, out_sf = quantize(x, layout, 128)
    codes_t, out_sf_t = quantize(to_torch(x), layout, 128)
    assert codes_t.dtype == torch.float8_e4m3fn
    assert out_sf_t.dtype == (torch.int32 if packed else torch.float32)
    assert_bits_equal(from_torch(codes_t), codes.view(np.uint8).view(ml_dtypes.float8_e4m3fn))
    if col_major:
        assert out_sf_t.stride() == (1, 8)
    assert_bits_equal(sf_buffer_of(from_torch(out_sf_t), col_major=col_major),
                      sf_buffer_of(out_sf, col_major=col_major), "x_sf")
    # caller-provided tensors
    out = torch.zeros((6, 520), dtype=torch.float8_e4m3fn)
    codes_t2, _ = quantize(to_torch(x), layout, 128, out=out)
    assert codes_t2 is out
    assert_bits_equal(from_torch(out), codes.view(np.uint8).view(ml_dtypes.float8_e4m3fn))


def test_float32_torch_cpu_input(rng):
    x = rng.standard_normal((4, 256)).astype(np.float32)
    codes_t, sf_t = quantize_fp8(torch.from_numpy(x), num_per_channels=32)
    codes, sf = quantize_fp8(x, num_per_channels=32)
    assert_bits_equal(from_torch(codes_t), codes)
    assert_bits_equal(sf_t.numpy(), sf)


def test_public_name_is_exported():
    assert cupy_moe.quantize.quantize_fp8 is quantize_fp8


# -- the round trip through expand ----------------------------------------------------

@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_quantize_then_expand_equals_expand_then_quantize(npc, layout, rng):
    """Quantizing is per row, so it commutes with expand: expert rows are the
    same bits either way, and dequantized every row is (padding rows: 0)."""
    _, col_major, _ = LAYOUTS[layout]
    num_tokens, top_k, hidden = 37, 4, 700
    x = as_input_dtype(hard_rows(rng, num_tokens, hidden, npc, kinds=BLOCK_KINDS[:5]),
                       "bfloat16")
    topk_ids = rng.integers(0, 6, size=(num_tokens, top_k))
    topk_ids[::7, 1] = -1
    plan = cupy_moe.fused_mapping(topk_ids, 6, alignment=8)
    maps = (plan.token_topk_to_pos, plan.pos_to_expert)
    codes, x_sf = quantize(x, layout, npc)
    moved, moved_sf = cupy_moe.expand_to_fused_with_sf(
        codes, x_sf, *maps, num_per_channels=npc, use_tma_aligned_col_major_sf=col_major)
    direct, direct_sf = quantize(cupy_moe.expand_to_fused(x, *maps), layout, npc)
    experts = plan.pos_to_expert >= 0
    assert_bits_equal(moved.view(np.uint8)[experts], direct.view(np.uint8)[experts], "codes")
    assert_bits_equal(np.ascontiguousarray(moved_sf)[experts],
                      np.ascontiguousarray(direct_sf)[experts], "scale factors")
    assert_bits_equal(dequantize_fp8_numpy(moved, moved_sf, num_per_channels=npc),
                      dequantize_fp8_numpy(direct, direct_sf, num_per_channels=npc),
                      "dequantized")


def test_dequantize_inverts_up_to_e4m3_precision(rng):
    x = rng.standard_normal((8, 512)).astype(np.float32)
    for layout in LAYOUTS:
        codes, sf = quantize(x, layout, 128)
        back = dequantize_fp8_numpy(codes, sf, num_per_channels=128)
        assert np.allclose(back, x, rtol=0.07, atol=1e-3), layout


# -- the kernels' integer e4m3 rounding ---------------------------------------------

def test_integer_e4m3_rounding_of_the_kernels_matches_the_oracle():
    """kernels_cu/quantize_e4m3.cuh's quant_e4m3_software (sm_80, and the
    software variant), emulated step for step, on a sweep of float32 bit
    patterns: the same codes as the oracle's (ml_dtypes) conversion."""
    for start in range(0, 1 << 32, 1 << 28):
        bits = np.arange(start, start + (1 << 28), 211, dtype=np.uint64).astype(np.uint32)
        values = bits.view(np.float32)
        sign = (bits >> 24) & 0x80
        magnitude = np.minimum(bits & 0x7FFFFFFF, np.uint32(0x43E00000))
        normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - (120 << 3)
        subnormal = np.rint(magnitude.view(np.float32) * np.float32(512)).astype(np.uint32)
        codes = np.where(magnitude >= 0x3C800000, normal, subnormal) | sign
        codes = np.where((bits & 0x7FFFFFFF) > 0x7F800000, 0x7F, codes).astype(np.uint8)
        assert_bits_equal(codes, encode_e4m3(values), f"codes from {start:#x}")


# -- argument errors -----------------------------------------------------------------

X = np.zeros((3, 256), dtype=np.float32)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"num_per_channels": 64}, ValueError,
     "unsupported num_per_channels=64; must be one of (32, 128)"),
    ({"num_per_channels": "128"}, TypeError, "num_per_channels must be an int; got str '128'"),
    ({"num_per_channels": True}, TypeError, "num_per_channels must be an int; got bool True"),
    ({"num_per_channels": 128.0}, TypeError, "num_per_channels must be an int; got float"),
    ({"round_sf": 1}, TypeError, "round_sf must be True or False; got int 1"),
    ({"packed_ue8m0": None}, TypeError, "packed_ue8m0 must be True or False; got NoneType"),
    ({"use_tma_aligned_col_major_sf": "yes"}, TypeError,
     "use_tma_aligned_col_major_sf must be True or False; got str"),
    ({"packed_ue8m0": True, "use_tma_aligned_col_major_sf": True}, ValueError,
     "packed_ue8m0=True needs round_sf=True"),
    ({"packed_ue8m0": True, "round_sf": True}, ValueError,
     "packed_ue8m0=True needs use_tma_aligned_col_major_sf=True"),
])
def test_bad_settings(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        quantize_fp8(X, **kwargs)


@pytest.mark.parametrize(("x", "error", "message"), [
    (None, TypeError, "x must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got None"),
    ([[1.0, 2.0]], TypeError,
     "x must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got builtins.list"),
    (np.zeros((3, 8), dtype=np.float16), ValueError,
     "x must be one of bfloat16, float32, uint16; got float16"),
    (np.zeros((3, 8), dtype=np.float64), ValueError,
     "x must be one of bfloat16, float32, uint16; got float64"),
    (np.zeros(8, dtype=np.float32), ValueError, "x must be 2-D [T, H]; got shape (8,)"),
    (np.zeros((2, 3, 8), dtype=np.float32), ValueError, "x must be 2-D [T, H]; got shape"),
    (np.zeros((3, 0), dtype=np.float32), ValueError,
     "x must have H = x.shape[1] >= 1; got shape (3, 0)"),
    (torch.zeros((3, 8), dtype=torch.float16), ValueError,
     "x must be one of bfloat16, float32, uint16; got float16"),
    (torch.zeros((3, 8), device="meta"), ValueError, "x is a tensor on device 'meta'"),
])
def test_bad_x(x, error, message):
    with pytest.raises(error, match=re.escape(message)):
        quantize_fp8(x)


@pytest.mark.parametrize(("op", "width", "what"), [
    (quantize_fp8, (1 << 30) + 1, "H = x.shape[1]"),
    (swiglu_quantize_fp8, (1 << 31) + 2, "I = h.shape[1] / 2"),
])
def test_rows_wider_than_a_launch_takes_are_refused(op, width, what):
    wide = np.broadcast_to(np.float32(1), (1, width))  # no memory behind it
    name = "h" if op is swiglu_quantize_fp8 else "x"
    with pytest.raises(ValueError, match=re.escape(
            f"{name} must have {what} <= {1 << 30}; got shape (1, {width})")):
        op(wide)


def test_run_with_tuning_refuses_unknown_ops_and_keywords():
    from cupy_moe.quantize.api import run_with_tuning
    from cupy_moe.quantize.launch_shape import QuantizeTuning

    with pytest.raises(ValueError, match=re.escape(
            "op must be 'quantize_fp8' or 'swiglu_quantize_fp8'; got 'expand_to_fused'")):
        run_with_tuning(QuantizeTuning(), "expand_to_fused", X)
    with pytest.raises(TypeError, match=re.escape(
            "quantize_fp8() got unexpected keyword arguments ['topk_weights', 'zero_padding']")):
        run_with_tuning(QuantizeTuning(), "quantize_fp8", X, zero_padding=False,
                        topk_weights=None)


def test_grad_tensors_are_refused_outside_no_grad():
    x = torch.zeros((3, 8), requires_grad=True)
    with pytest.raises(TypeError, match=re.escape("x requires grad, but cupy_moe ops are "
                                                  "inference-only")):
        quantize_fp8(x)
    with torch.no_grad():
        quantize_fp8(x)


def _col_major(rows, columns, ld, dtype=np.float32):
    return np.zeros((columns, ld), dtype=dtype)[:, :rows].T


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"out": np.zeros((3, 255), np.uint8)}, ValueError,
     "out must have shape (3, 256); got (3, 255)"),
    ({"out": np.zeros((3, 256), np.float32)}, ValueError,
     "out must have dtype float8_e4m3fn or uint8; got float32"),
    ({"out": np.zeros((3, 512), np.uint8)[:, ::2]}, ValueError,
     "out must be C-contiguous, element strides (256, 1); got (512, 2)"),
    ({"out": "out"}, TypeError, "out must be a numpy.ndarray, cupy.ndarray or torch.Tensor"),
    ({"out": torch.zeros((3, 256), dtype=torch.uint8)}, TypeError,
     "all arrays must be of one kind: x is numpy.ndarray, out is torch.Tensor (cpu)"),
    ({"out_sf": np.zeros((3, 3), np.float32)}, ValueError,
     "out_sf must have shape (3, 2); got (3, 3)"),
    ({"out_sf": np.zeros((3, 2), np.int32)}, ValueError,
     "out_sf must have dtype float32; got int32"),
    ({"out_sf": np.zeros((3, 1), np.float32), "round_sf": True, "packed_ue8m0": True,
      "use_tma_aligned_col_major_sf": True}, ValueError,
     "out_sf must have dtype int32; got float32"),
    ({"out_sf": np.zeros((3, 2), np.float32), "use_tma_aligned_col_major_sf": True},
     ValueError, ("out_sf must be the transposed view of an [S, align(R, 4)] = [2, 4] "
                  "buffer, element strides (1, 4); got (2, 1)")),
    ({"out_sf": np.lib.stride_tricks.as_strided(np.zeros(7, np.float32), (3, 2), (4, 16)),
      "use_tma_aligned_col_major_sf": True},
     ValueError, ("out_sf must view a buffer of [S, align(R, 4)] = [2, 4] elements (32 "
                  "bytes, pad columns included); only 28 bytes follow its first element")),
    ({"out_sf": _col_major(3, 2, 4)[:, :2]}, ValueError,
     "out_sf must be C-contiguous, element strides (2, 1); got (1, 4)"),
    # byte strides of no whole element: a floor division read (10, 5) as (2, 1)
    ({"out_sf": np.ndarray((3, 2), np.float32, buffer=np.zeros(64, np.uint8), strides=(10, 5))},
     ValueError, "out_sf must be C-contiguous, element strides (2, 1); got (2.5, 1.25)"),
    ({"out_sf": np.ndarray((3, 2), np.float32, buffer=np.zeros(64, np.uint8), strides=(5, 13)),
      "use_tma_aligned_col_major_sf": True},
     ValueError, ("out_sf must be the transposed view of an [S, align(R, 4)] = [2, 4] "
                  "buffer, element strides (1, 4); got (1.25, 3.25)")),
])
def test_bad_outputs(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        quantize_fp8(X, **kwargs)


def test_read_only_and_overlapping_outputs():
    out = np.zeros((3, 256), np.uint8)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=re.escape("out is read-only; an output must be "
                                                   "writeable")):
        quantize_fp8(X, out=out)
    x_bytes = np.zeros((3, 256), dtype=np.float32)
    with pytest.raises(ValueError, match=re.escape("out overlaps x in memory")):
        quantize_fp8(x_bytes, out=x_bytes.reshape(-1).view(np.uint8)[:768].reshape(3, 256))
    shared = np.zeros(3 * 256 + 64, dtype=np.uint8)
    out = shared[:3 * 256].reshape(3, 256)
    out_sf = shared[3 * 256 - 32:3 * 256 - 8].view(np.float32).reshape(3, 2)
    with pytest.raises(ValueError, match=re.escape("out overlaps out_sf in memory")):
        quantize_fp8(X, out=out, out_sf=out_sf)
    # a column-major out_sf whose pad columns (written too) reach into out
    buffer = np.zeros(4 * 2 + 256 * 3 // 4, dtype=np.float32)
    out_sf = buffer[:8].reshape(2, 4)[:, :3].T
    out = buffer[8:].view(np.uint8).reshape(3, 256)
    quantize_fp8(X, out=out, out_sf=out_sf, use_tma_aligned_col_major_sf=True)  # disjoint: fine
    out_sf = buffer[:8].reshape(2, 4)[:, :3].T
    sliver = buffer[7:7 + 192].view(np.uint8).reshape(3, 256)
    with pytest.raises(ValueError, match=re.escape("out overlaps out_sf in memory")):
        quantize_fp8(X, out=sliver, out_sf=out_sf, use_tma_aligned_col_major_sf=True)


def test_empty_inputs_give_empty_outputs():
    for layout in LAYOUTS:
        packed = LAYOUTS[layout][0]
        codes, sf = quantize(np.zeros((0, 300), np.float32), layout, 128)
        assert codes.shape == (0, 300) and sf.shape == (0, 1 if packed else 3)
        codes_t, sf_t = quantize(torch.zeros((0, 300), dtype=torch.bfloat16), layout, 128)
        assert tuple(codes_t.shape) == (0, 300) and tuple(sf_t.shape) == (0, 1 if packed else 3)


def test_nan_inputs_give_their_code_without_a_runtime_warning():
    import warnings

    values = np.array([np.nan, -np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's "invalid value encountered in cast"
        codes = encode_e4m3(values)
        cupy_moe.quantize_fp8(np.array([[np.nan, 1.0]], dtype=np.float32), num_per_channels=32)
    assert codes.tolist() == [0x7F, 0x7F, 0x7E, 0xFE, 0x38]
