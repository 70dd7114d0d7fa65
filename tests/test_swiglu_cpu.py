"""``swiglu_quantize_fp8`` on the CPU and the float32 arithmetic it is defined
by: the exp's accuracy bound and its constants (shared with the kernels), the
oracle against a scalar reference (order of the multiplies, weights, padding
rows, NaN and infinity), outputs, and every argument error."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import assert_bits_equal, from_torch, to_torch
from quantize_cases import (
    LAYOUTS,
    SPECIALS,
    as_input_dtype,
    expected_sf_buffer,
    float_values,
    hard_rows,
    scalar_quantize,
    scalar_swiglu,
    sf_buffer_of,
)

from cupy_moe.quantize import swiglu_quantize_fp8
from cupy_moe.quantize.numerics import (
    EXP_CONSTANT_BITS,
    EXP_MAX_ULP,
    exp_f32,
    silu_f32,
    swiglu_f32,
)
from cupy_moe.quantize.reference import swiglu_values_numpy
from cupy_moe.runtime.loader import kernel_dir

F32 = np.float32


def assert_floats_equal(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Bit for bit, every NaN counted as one (float32 arithmetic does not fix a
    NaN's sign or payload: NumPy on x86 and CUDA differ; the codes do not)."""
    canonical = np.uint32(0x7FC00000)
    a = np.where(np.isnan(actual), canonical, actual.view(np.uint32))
    e = np.where(np.isnan(expected), canonical, expected.view(np.uint32))
    assert_bits_equal(a, e, what)


# -- exp ------------------------------------------------------------------------------

def _ulp_errors(x: np.ndarray, got: np.ndarray) -> np.ndarray:
    """|got - exp(x)| in ulps of the float32 result (float64 exp as truth)."""
    truth = np.exp(x.astype(np.float64))
    _, exponent = np.frexp(truth)
    ulp = np.ldexp(1.0, np.maximum(exponent - 24, -149))
    return np.abs(got.astype(np.float64) - truth) / ulp


def test_exp_is_within_its_bound_on_its_range():
    """Every 97th float32 of [-86.5, 87] (~23 million values): within
    EXP_MAX_ULP (measured on all of them) of float64's exp."""
    worst = 0.0
    low, high = int(F32(-86.5).view(np.uint32)), int(F32(87.0).view(np.uint32))
    for first, last in ((0, high), (0x80000000, low)):
        for start in range(first, last + 1, 1 << 25):
            bits = np.arange(start, min(last + 1, start + (1 << 25)), 97, dtype=np.uint64)
            x = bits.astype(np.uint32).view(F32)
            worst = max(worst, float(_ulp_errors(x, exp_f32(x)).max()))
    assert 0.5 < worst <= EXP_MAX_ULP, worst


def test_exp_saturates_and_clamps_nan_like_minus_infinity(rng):
    x = np.array([np.inf, 87.0, 88.0, 1e30, -np.inf, -86.5, -100.0, -1e30, np.nan, -np.nan,
                  0.0, -0.0], dtype=F32)
    got = exp_f32(x)
    high, low = exp_f32(F32(87.0)), exp_f32(F32(-86.5))
    assert (got[:4] == high).all() and (got[4:10] == low).all() and (got[10:] == 1.0).all()
    assert np.isfinite(high) and low >= np.finfo(F32).tiny
    # NaN of any payload: the same bits (the exponent arithmetic never sees it)
    payloads = rng.integers(1, 1 << 23, size=1000, dtype=np.uint32)
    nans = (np.uint32(0x7F800000) | payloads | (rng.integers(0, 2, 1000, dtype=np.uint32)
                                                  << np.uint32(31))).view(F32)
    assert (exp_f32(nans).view(np.uint32) == low.view(np.uint32)).all()
    assert np.isnan(silu_f32(nans)).all()


def test_kernel_headers_hold_the_same_exp_constants():
    header = (kernel_dir() / "quantize_exp.cuh").read_text()
    found = {name: int(value, 16) for name, value in
             re.findall(r"#define QUANT_EXP_(\w+) (0x[0-9A-Fa-f]+)u", header)}
    assert found == EXP_CONSTANT_BITS


def test_silu_is_close_to_float64(rng):
    """A few ulps for g >= -86 (exp within 1.02 ulp, then 1 + e, 1 / d and g * y);
    below, exp(-g) saturates at exp(87): silu is then tiny, not accurate."""
    g = np.concatenate([rng.standard_normal(200000) * 10.0 ** rng.uniform(-6, 1.9, 200000),
                        np.linspace(-100, 100, 20001)]).astype(F32)
    truth = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64)))
    got = silu_f32(g).astype(np.float64)
    accurate = (g >= -86) & (np.abs(truth) >= np.finfo(F32).tiny)
    relative = np.abs(got[accurate] - truth[accurate]) / np.abs(truth[accurate])
    assert relative.max() < 4 * 2.0**-24
    saturated = g < -86.5
    assert saturated.any() and (np.abs(got[saturated]) < 1e-35 * np.abs(g[saturated]) / 80).all()
    assert silu_f32(F32(np.inf)) == np.inf and silu_f32(F32(-np.inf)) == -np.inf
    assert np.isnan(silu_f32(F32(np.nan)))


def test_multiplies_happen_in_the_documented_order():
    """(silu(g) * up) * w: a case where s * (up * w) gives other bits."""
    rng = np.random.default_rng(7)
    g, u, w = (rng.standard_normal(10000).astype(F32) for _ in range(3))
    s = silu_f32(g)
    left, right = (s * u) * w, s * (u * w)
    differ = np.flatnonzero(left.view(np.uint32) != right.view(np.uint32))
    assert differ.size > 0
    i = int(differ[0])
    assert swiglu_f32(g[i:i + 1], u[i:i + 1], w[i:i + 1]).view(np.uint32) == left[i].view(
        np.uint32)
    h = np.concatenate([g[i:i + 1], u[i:i + 1]]).reshape(1, 2)
    act, _ = swiglu_values_numpy(h, topk_weights=w[i:i + 1].reshape(1, 1),
                                 pos_to_token_topk=np.array([0], np.int32))
    assert act.view(np.uint32)[0, 0] == left[i].view(np.uint32)


# -- activations and quantization against the scalar reference ------------------------

def _gate_up(rng, rows, inter, npc, dtype):
    """h = [gate | up] with hard blocks, gates reaching the exp's clamps."""
    gate = hard_rows(rng, rows, inter, npc)
    with np.errstate(all="ignore"):  # large values become inf: wanted too
        gate[rng.random(gate.shape) < 0.05] *= 1e3  # |g| beyond 86.5 / 87
    up = hard_rows(rng, rows, inter, npc)
    return as_input_dtype(np.concatenate([gate, up], axis=1), dtype)


def _maps(rng, rows, tokens=5, top_k=3):
    weights = rng.standard_normal((tokens, top_k)).astype(F32)
    weights.reshape(-1)[rng.integers(tokens * top_k)] = 0.0
    slots = rng.integers(-1, tokens * top_k + 2, size=rows).astype(np.int32)  # some outside
    experts = rng.integers(-1, 4, size=rows).astype(np.int32)
    return weights, slots, experts


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "uint16"])
@pytest.mark.parametrize("maps", ["none", "weights", "experts", "both"])
def test_activations_match_the_scalar_reference(dtype, maps, rng):
    h = _gate_up(rng, 9, 70, 32, dtype)
    weights, slots, experts = _maps(rng, 9)
    kwargs = {}
    if maps in ("weights", "both"):
        kwargs.update(topk_weights=weights, pos_to_token_topk=slots)
    if maps in ("experts", "both"):
        kwargs.update(pos_to_expert=experts)
    act, padding = swiglu_values_numpy(h, **kwargs)
    want, want_padding = scalar_swiglu(float_values(h), kwargs.get("topk_weights"),
                                       kwargs.get("pos_to_token_topk"),
                                       kwargs.get("pos_to_expert"))
    assert_floats_equal(act, want, "activations")
    assert (padding == want_padding).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_quantized_activations_match_the_scalar_reference(dtype, npc, layout, rng):
    packed, col_major, round_sf = LAYOUTS[layout]
    for rows, inter in ((1, 1), (3, 40), (6, 129), (5, 300)):
        h = _gate_up(rng, rows, inter, npc, dtype)
        weights, slots, experts = _maps(rng, rows)
        codes, out_sf = swiglu_quantize_fp8(
            h, num_per_channels=npc, topk_weights=weights, pos_to_token_topk=slots,
            pos_to_expert=experts, round_sf=round_sf, packed_ue8m0=packed,
            use_tma_aligned_col_major_sf=col_major)
        act, padding = scalar_swiglu(float_values(h), weights, slots, experts)
        want_codes, want_sf = scalar_quantize(act, npc, round_sf, zero_rows=padding)
        assert codes.dtype == ml_dtypes.float8_e4m3fn and codes.shape == (rows, inter)
        assert_bits_equal(codes.view(np.uint8), want_codes, "codes")
        assert_bits_equal(sf_buffer_of(out_sf, col_major=col_major),
                          expected_sf_buffer(want_sf, packed=packed, col_major=col_major), "sf")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_padding_rows_are_zero_codes_and_zero_scale_factors(layout, rng):
    packed, col_major, round_sf = LAYOUTS[layout]
    h = rng.standard_normal((6, 2 * 256)).astype(F32)
    h[1] = np.nan  # a padding row's input is never read: NaN there changes nothing
    weights = np.ones((3, 2), dtype=F32)
    slots = np.array([0, 1, -1, 5, 6, 2], np.int32)  # 2: -1; 4: 6 >= T*K
    experts = np.array([0, -1, 0, 1, 1, 2], np.int32)
    codes, out_sf = swiglu_quantize_fp8(
        h, topk_weights=weights, pos_to_token_topk=slots, pos_to_expert=experts,
        round_sf=round_sf, packed_ue8m0=packed, use_tma_aligned_col_major_sf=col_major)
    padding = [1, 2, 4]
    assert not codes.view(np.uint8)[padding].any()
    assert codes.view(np.uint8)[[0, 3, 5]].any()
    assert not np.ascontiguousarray(out_sf)[padding].view(np.uint32).any()
    assert np.ascontiguousarray(out_sf)[[0, 3, 5]].view(np.uint32).all()
    if col_major:  # pad columns 6, 7
        assert not sf_buffer_of(out_sf, col_major=True)[:, 6:].view(np.uint32).any()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_zero_padding_off_leaves_padding_rows_as_they_were(kind, layout, rng):
    """zero_padding=False: live rows as with True, bit for bit; padding rows'
    codes and scale factors keep the caller's bytes; the column-major pad
    columns (rows 6, 7 of the SF buffer) are zeroed; fresh outputs too."""
    packed, col_major, round_sf = LAYOUTS[layout]
    h = _gate_up(rng, 6, 256, 128, "float32")
    weights = np.ones((3, 2), dtype=F32)
    slots = np.array([0, 1, -1, 5, 6, 2], np.int32)
    experts = np.array([0, -1, 0, 1, 1, -1], np.int32)  # padding: 1, 2, 4, 5 (the last)
    live, padding = [0, 3], [1, 2, 4, 5]
    settings = {"topk_weights": weights, "pos_to_token_topk": slots, "pos_to_expert": experts,
                "round_sf": round_sf, "packed_ue8m0": packed,
                "use_tma_aligned_col_major_sf": col_major}
    want, want_sf = swiglu_quantize_fp8(h, **settings)
    columns = 1 if packed else 2
    out = np.full((6, 256), 0x5A, np.uint8)
    sf_dtype = np.int32 if packed else F32
    buffer = np.full((columns, 8) if col_major else (6, columns), -1, np.int32).view(sf_dtype)
    convert = to_torch if kind == "torch" else (lambda a: a)
    back = from_torch if kind == "torch" else (lambda a: a)
    args = {k: convert(v) if isinstance(v, np.ndarray) else v for k, v in settings.items()}
    out_given, buffer_given = convert(out), convert(buffer)
    out_sf_given = buffer_given[:, :6].T if col_major else buffer_given
    got, got_sf = swiglu_quantize_fp8(convert(h), **args, zero_padding=False, out=out_given,
                                      out_sf=out_sf_given)
    assert got is out_given and got_sf is out_sf_given
    out, buffer = back(out_given), back(buffer_given)
    out_sf = buffer[:, :6].T if col_major else buffer
    assert_bits_equal(out[live], want.view(np.uint8)[live], "live codes")
    assert (out[padding] == 0x5A).all()
    sf_rows = np.ascontiguousarray(out_sf).view(np.int32)
    assert_bits_equal(sf_rows[live], np.ascontiguousarray(want_sf).view(np.int32)[live], "sf")
    assert (sf_rows[padding] == -1).all()
    if col_major:
        assert not sf_buffer_of(out_sf, col_major=True)[:, 6:].view(np.uint32).any()
    fresh, fresh_sf = swiglu_quantize_fp8(convert(h), **args, zero_padding=False)
    fresh = from_torch(fresh) if kind == "torch" else fresh
    fresh_sf = from_torch(fresh_sf) if kind == "torch" else fresh_sf
    assert_bits_equal(fresh.view(np.uint8)[live], want.view(np.uint8)[live], "fresh codes")
    if col_major:
        assert not sf_buffer_of(fresh_sf, col_major=True)[:, 6:].view(np.uint32).any()


def test_nan_and_infinity_through_silu():
    inter = 128
    h = np.ones((1, 2 * inter), dtype=F32)
    h[0, 0] = np.nan                       # silu(NaN) -> NaN: code 0x7F, ignored by amax
    h[0, 1], h[0, inter + 1] = np.inf, 0.0  # inf * 0 -> NaN
    h[0, 2] = -200.0                       # exp clamps: silu(-200) is tiny, not NaN
    codes, sf = swiglu_quantize_fp8(h)
    got = codes.view(np.uint8)[0]
    assert got[0] == 0x7F and got[1] == 0x7F and got[2] in (0x80, 0x00)
    assert np.isfinite(sf[0, 0])
    h[0, 3] = np.inf                       # silu(inf) * 1 = inf: the block is poisoned
    codes, sf = swiglu_quantize_fp8(h)
    assert np.isposinf(sf[0, 0]) and codes.view(np.uint8)[0, 3] == 0x7F
    h[0, 3] = -np.inf                      # silu(-inf) = -inf * tiny = -inf: poisoned too
    codes, sf = swiglu_quantize_fp8(h)
    assert np.isposinf(sf[0, 0])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_torch_cpu_and_outputs_in_place(layout, rng):
    packed, col_major, round_sf = LAYOUTS[layout]
    h = _gate_up(rng, 7, 200, 128, "bfloat16")
    weights, slots, experts = _maps(rng, 7)
    settings = {"topk_weights": weights, "pos_to_token_topk": slots, "pos_to_expert": experts,
                "round_sf": round_sf, "packed_ue8m0": packed,
                "use_tma_aligned_col_major_sf": col_major}
    codes, out_sf = swiglu_quantize_fp8(h, **settings)
    torch_settings = {k: to_torch(v) if isinstance(v, np.ndarray) else v
                      for k, v in settings.items()}
    codes_t, out_sf_t = swiglu_quantize_fp8(to_torch(h), **torch_settings)
    assert codes_t.dtype == torch.float8_e4m3fn
    assert_bits_equal(from_torch(codes_t), codes)
    assert_bits_equal(sf_buffer_of(from_torch(out_sf_t), col_major=col_major),
                      sf_buffer_of(out_sf, col_major=col_major), "sf")
    columns = 1 if packed else 2
    out = np.full((7, 200), 0x5A, np.uint8)
    sf_dtype = np.int32 if packed else F32
    buffer = np.full((columns, 8) if col_major else (7, columns), -1, np.int32).view(sf_dtype)
    out_sf_given = buffer[:, :7].T if col_major else buffer
    got, got_sf = swiglu_quantize_fp8(h, **settings, out=out, out_sf=out_sf_given)
    assert got is out and got_sf is out_sf_given
    assert_bits_equal(out, codes.view(np.uint8))
    assert_bits_equal(sf_buffer_of(out_sf_given, col_major=col_major),
                      sf_buffer_of(out_sf, col_major=col_major), "sf in place")


def test_no_rows_and_non_contiguous_inputs(rng):
    codes, sf = swiglu_quantize_fp8(np.zeros((0, 512), F32), topk_weights=np.ones((0, 2), F32),
                                    pos_to_token_topk=np.zeros(0, np.int32),
                                    pos_to_expert=np.zeros(0, np.int32))
    assert codes.shape == (0, 256) and sf.shape == (0, 2)
    h = rng.standard_normal((10, 600)).astype(F32)
    view = h[::2]  # rows not contiguous
    experts = np.arange(10, dtype=np.int32)[::2] % 3 - 1
    codes, sf = swiglu_quantize_fp8(view, pos_to_expert=experts)
    want, want_sf = swiglu_quantize_fp8(np.ascontiguousarray(view),
                                        pos_to_expert=np.ascontiguousarray(experts))
    assert_bits_equal(codes, want)
    assert_bits_equal(sf, want_sf)


def test_specials_in_gate_and_up(rng):
    inter = 64
    h = np.concatenate([rng.choice(SPECIALS, (8, inter)), rng.choice(SPECIALS, (8, inter))],
                       axis=1).astype(F32)
    codes, sf = swiglu_quantize_fp8(h, num_per_channels=32)
    act, _ = scalar_swiglu(h)
    want_codes, want_sf = scalar_quantize(act, 32, False)
    assert_bits_equal(codes.view(np.uint8), want_codes)
    assert_bits_equal(sf, want_sf)


# -- argument errors -----------------------------------------------------------------

H = np.zeros((4, 256), dtype=F32)
W = np.ones((2, 2), dtype=F32)
SLOTS = np.array([0, 1, 2, 3], np.int32)
EXPERTS = np.array([0, 0, 1, -1], np.int32)


@pytest.mark.parametrize(("args", "error", "message"), [
    ({"h": None}, TypeError, "h must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got None"),
    ({"h": np.zeros((4, 255), F32)}, ValueError,
     "h must have an even number of columns 2I (gate | up); got shape (4, 255)"),
    ({"h": np.zeros((4, 0), F32)}, ValueError, "h must have I = h.shape[1] / 2 >= 1"),
    ({"h": np.zeros((4, 8), np.float16)}, ValueError,
     "h must be one of bfloat16, float32, uint16; got float16"),
    ({"h": np.zeros(8, F32)}, ValueError, "h must be 2-D [X, 2I]; got shape (8,)"),
    ({"topk_weights": W}, ValueError,
     ("topk_weights is given but pos_to_token_topk is not: topk_weights [T, K] and "
      "pos_to_token_topk [X] go together")),
    ({"pos_to_token_topk": SLOTS}, ValueError,
     "pos_to_token_topk is given but topk_weights is not"),
    ({"topk_weights": W.astype(np.float64), "pos_to_token_topk": SLOTS}, ValueError,
     "topk_weights must be one of float32; got float64"),
    ({"topk_weights": W.reshape(-1), "pos_to_token_topk": SLOTS}, ValueError,
     "topk_weights must be 2-D [T, K]; got shape (4,)"),
    ({"topk_weights": np.ones((2, 0), F32), "pos_to_token_topk": SLOTS}, ValueError,
     "topk_weights must have K = shape[1] >= 1 slots; got shape (2, 0)"),
    ({"topk_weights": W, "pos_to_token_topk": SLOTS.astype(np.int64)}, ValueError,
     "pos_to_token_topk must be one of int32; got int64"),
    ({"topk_weights": W, "pos_to_token_topk": SLOTS[:3]}, ValueError,
     "pos_to_token_topk.shape[0] must equal h.shape[0] (X = 4); got 3"),
    ({"pos_to_expert": EXPERTS.reshape(2, 2)}, ValueError,
     "pos_to_expert must be 1-D [X]; got shape (2, 2)"),
    ({"pos_to_expert": EXPERTS[:2]}, ValueError,
     "pos_to_expert.shape[0] must equal h.shape[0] (X = 4); got 2"),
    ({"pos_to_expert": EXPERTS.astype(np.uint32)}, ValueError,
     "pos_to_expert must be one of int32; got uint32"),
    ({"pos_to_expert": [0, 0, 1, -1]}, TypeError,
     "pos_to_expert must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got builtins.list"),
    ({"pos_to_expert": torch.from_numpy(EXPERTS)}, TypeError,
     "all arrays must be of one kind: h is numpy.ndarray, pos_to_expert is torch.Tensor (cpu)"),
    ({"num_per_channels": 16}, ValueError, "unsupported num_per_channels=16"),
    ({"packed_ue8m0": True, "use_tma_aligned_col_major_sf": True}, ValueError,
     "packed_ue8m0=True needs round_sf=True"),
    ({"packed_ue8m0": True, "round_sf": True}, ValueError,
     "packed_ue8m0=True needs use_tma_aligned_col_major_sf=True"),
    ({"round_sf": "no"}, TypeError, "round_sf must be True or False; got str 'no'"),
    ({"zero_padding": 0}, TypeError, "zero_padding must be True or False; got int 0"),
    ({"out": np.zeros((4, 256), np.uint8)}, ValueError,
     "out must have shape (4, 128); got (4, 256)"),
    ({"out_sf": np.zeros((4, 2), np.float32)}, ValueError,
     "out_sf must have shape (4, 1); got (4, 2)"),
    ({"token_topk_to_pos": SLOTS.reshape(2, 2)}, ValueError,
     ("token_topk_to_pos is given but topk_weights and pos_to_token_topk are not: it is the "
      "inverse of pos_to_token_topk (slot t * K + k's row)")),
    ({"topk_weights": W, "pos_to_token_topk": SLOTS, "token_topk_to_pos": SLOTS}, ValueError,
     "token_topk_to_pos must be 2-D [T, K]; got shape (4,)"),
    ({"topk_weights": W, "pos_to_token_topk": SLOTS,
      "token_topk_to_pos": SLOTS.reshape(2, 2).astype(np.int64)}, ValueError,
     "token_topk_to_pos must be one of int32; got int64"),
    ({"topk_weights": W, "pos_to_token_topk": SLOTS,
      "token_topk_to_pos": SLOTS.reshape(1, 4)}, ValueError,
     "token_topk_to_pos must have topk_weights' shape [T, K] = [2, 2]; got shape (1, 4)"),
    ({"topk_weights": W, "pos_to_token_topk": SLOTS, "token_topk_to_pos": [[0, 1], [2, 3]]},
     TypeError, "token_topk_to_pos must be a numpy.ndarray, cupy.ndarray or torch.Tensor"),
    ({"topk_weights": W, "pos_to_token_topk": SLOTS,
      "token_topk_to_pos": torch.from_numpy(SLOTS.reshape(2, 2))}, TypeError,
     "all arrays must be of one kind: h is numpy.ndarray, token_topk_to_pos is torch.Tensor"),
    ({"validate": 1}, TypeError, "validate must be True or False; got int 1"),
])
def test_bad_arguments(args, error, message):
    kwargs = dict(args)
    h = kwargs.pop("h", H)
    with pytest.raises(error, match=re.escape(message)):
        swiglu_quantize_fp8(h, **kwargs)


def test_output_overlapping_token_topk_to_pos_is_rejected():
    maps = np.zeros(4 * 128 // 4, dtype=np.int32)
    maps[:4] = SLOTS
    out = maps.view(np.uint8).reshape(4, 128)
    with pytest.raises(ValueError, match=re.escape("out overlaps token_topk_to_pos in memory")):
        swiglu_quantize_fp8(H, topk_weights=W, pos_to_token_topk=SLOTS,
                            token_topk_to_pos=maps[:4].reshape(2, 2), out=out)


def test_output_overlapping_a_map_is_rejected():
    maps = np.zeros(4 * 128 // 4 + 4, dtype=np.int32)
    out = maps.view(np.uint8)[:512].reshape(4, 128)
    with pytest.raises(ValueError, match=re.escape("out overlaps pos_to_expert in memory")):
        swiglu_quantize_fp8(H, pos_to_expert=maps[:4], out=out)


# -- token_topk_to_pos (the hint of the *_slots kernels) ---------------------------------

# a plan of T = 2 tokens, K = 2, X = 6: slot 0 -> row 0, slot 1 -> row 3,
# slot 3 -> row 1, slot 2 dropped; rows 2, 4, 5 padding
PLAN_EXPERTS = np.array([0, 0, -1, 1, -1, -1], np.int32)
PLAN_SLOTS = np.array([0, 3, -1, 1, -1, -1], np.int32)
PLAN_ROWS = np.array([[0, 3], [-1, 1]], np.int32)


def _plan_call(kind, token_topk_to_pos, **kwargs):
    convert = to_torch if kind == "torch" else (lambda a: a)
    h = _gate_up(np.random.default_rng(7), 6, 64, 32, "float32")
    return swiglu_quantize_fp8(
        convert(h), num_per_channels=32, topk_weights=convert(np.ones((2, 2), F32)),
        pos_to_token_topk=convert(PLAN_SLOTS), pos_to_expert=convert(PLAN_EXPERTS),
        token_topk_to_pos=convert(np.asarray(token_topk_to_pos, np.int32)), **kwargs)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize(("rows", "message"), [
    ([[6, 3], [-1, 1]], "token_topk_to_pos[0, 0] = 6 is out of range: h has X = 6 rows"),
    # out of range is looked for first, whatever comes before it
    ([[2, 7], [-1, 1]], "token_topk_to_pos[0, 1] = 7 is out of range: h has X = 6 rows"),
    ([[2, 3], [-1, 1]], "token_topk_to_pos[0, 0] = 2 names a padding row (pos_to_expert[2] < 0)"),
    ([[3, 0], [-1, 1]], ("token_topk_to_pos[0, 0] = 3 disagrees with pos_to_token_topk[3] = 1: "
                         "row 3 holds slot 1, not 0")),
    # two slots naming one row: the second disagrees
    ([[0, 3], [-1, 0]], ("token_topk_to_pos[1, 1] = 0 disagrees with pos_to_token_topk[0] = 0: "
                         "row 0 holds slot 0, not 3")),
    ([[0, 3], [-1, -1]], ("row 1 is live (pos_to_token_topk[1] = 3) but "
                          "token_topk_to_pos[1, 1] = -1 does not name it")),
    ([[0, -5], [-1, 1]], ("row 3 is live (pos_to_token_topk[3] = 1) but "
                          "token_topk_to_pos[0, 1] = -5 does not name it")),
])
def test_validate_checks_token_topk_to_pos_against_the_maps(kind, rows, message):
    out = np.full((6, 64), 0x5A, np.uint8)
    given = to_torch(out) if kind == "torch" else out
    with pytest.raises(ValueError, match=re.escape(message)):
        _plan_call(kind, rows, validate=True, out=given)
    host = from_torch(given) if kind == "torch" else given
    assert (host == 0x5A).all()  # nothing written
    _plan_call(kind, rows)  # without validate: not checked (the CPU ignores the hint)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_validate_counts_a_row_of_no_slot_as_padding(kind):
    """A row whose pos_to_token_topk lies outside [0, T * K) is padding even
    where pos_to_expert is not given or says live: a slot naming it is the
    second kind of fault, found before an earlier slot's disagreement (it
    was once reported as a disagreement, and the earlier one won)."""
    convert = to_torch if kind == "torch" else (lambda a: a)
    h = _gate_up(np.random.default_rng(7), 4, 64, 32, "float32")
    common = dict(num_per_channels=32, topk_weights=convert(np.ones((2, 2), F32)),
                  pos_to_token_topk=convert(np.array([0, -1, 2, 3], np.int32)),
                  token_topk_to_pos=convert(np.array([[2, 1], [-1, 3]], np.int32)),
                  validate=True)
    with pytest.raises(ValueError, match=re.escape(
            "token_topk_to_pos[0, 1] = 1 names a padding row (pos_to_token_topk[1] = -1 is "
            "outside [0, T * K = 4))")):
        swiglu_quantize_fp8(convert(h), **common)
    with pytest.raises(ValueError, match=re.escape(
            "token_topk_to_pos[0, 1] = 1 names a padding row (pos_to_token_topk[1] = -1 is "
            "outside [0, T * K = 4))")):
        swiglu_quantize_fp8(convert(h), pos_to_expert=convert(np.zeros(4, np.int32)), **common)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("zero_padding", [True, False])
def test_token_topk_to_pos_changes_no_result(kind, zero_padding):
    """The plan's own hint passes validate, and every row is what it is
    without the hint, bit for bit (zero_padding off: into the same
    poisoned outputs)."""
    back = from_torch if kind == "torch" else (lambda a: a)
    convert = to_torch if kind == "torch" else (lambda a: a)
    results = []
    for hint in (None, PLAN_ROWS):
        out = convert(np.full((6, 64), 0x5A, np.uint8))
        out_sf = convert(np.full((6, 2), -1.0, F32))
        h = _gate_up(np.random.default_rng(7), 6, 64, 32, "float32")
        codes, sf = swiglu_quantize_fp8(
            convert(h), num_per_channels=32, topk_weights=convert(np.ones((2, 2), F32)),
            pos_to_token_topk=convert(PLAN_SLOTS), pos_to_expert=convert(PLAN_EXPERTS),
            token_topk_to_pos=None if hint is None else convert(hint), validate=True,
            zero_padding=zero_padding, out=out, out_sf=out_sf)
        results.append((back(codes).view(np.uint8), back(sf).view(np.uint32)))
    assert_bits_equal(results[1][0], results[0][0], "codes")
    assert_bits_equal(results[1][1], results[0][1], "scale factors")
    assert (results[1][0][[2, 4, 5]] == (0 if zero_padding else 0x5A)).all()


def test_validate_without_the_hint_checks_nothing():
    """validate=True without token_topk_to_pos: the maps alone define the
    rows (out-of-range slots are padding), so there is nothing to check."""
    h = _gate_up(np.random.default_rng(7), 6, 64, 32, "float32")
    slots = np.array([0, 99, -1, -7, 3, 2], np.int32)
    want = swiglu_quantize_fp8(h, num_per_channels=32, topk_weights=np.ones((2, 2), F32),
                               pos_to_token_topk=slots)
    got = swiglu_quantize_fp8(h, num_per_channels=32, topk_weights=np.ones((2, 2), F32),
                              pos_to_token_topk=slots, validate=True)
    assert_bits_equal(got[0].view(np.uint8), want[0].view(np.uint8), "codes")



def test_token_topk_to_pos_with_another_k_is_refused():
    """The whole [T, K] shape, not T alone: the by-slot kernels read it as T * K
    entries."""
    with pytest.raises(ValueError, match=re.escape(
            "token_topk_to_pos must have topk_weights' shape [T, K] = [2, 2]; got shape (2, 1)")):
        swiglu_quantize_fp8(np.zeros((4, 256), np.float32),
                            topk_weights=np.ones((2, 2), np.float32),
                            pos_to_token_topk=np.arange(4, dtype=np.int32),
                            token_topk_to_pos=np.array([[0], [2]], np.int32))
