"""``reduce_fused`` on the CPU (NumPy arrays and CPU tensors): the NumPy oracle
against a slow, independent reference (a loop over elements in exact rational
arithmetic), the contract's corner cases, and every argument error.

The case generators and the slow reference are in tests/combine_cases.py
(shared with tests/test_combine_gpu.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from combine_cases import (
    COMBINE_DTYPES,
    FORMAT_OF,
    SCALE_OPTIONS,
    VALUE_KINDS,
    assert_bits,
    bits_of,
    exact,
    random_case,
    random_values,
    slow_reduce_fused,
    storage_dtype,
)
from helpers import from_torch, to_torch

from cupy_moe.combine import reduce_fused, reduce_fused_numpy
from cupy_moe.combine import reference as combine_reference
from cupy_moe.combine.reference import CANONICAL_NAN_BITS

# -- the oracle against the slow reference ----------------------------------------

@pytest.mark.parametrize("seed", range(160))
def test_oracle_matches_the_exact_reference(seed):
    rng = np.random.default_rng(seed)
    dtype = COMBINE_DTYPES[seed % 4]
    value_kind = VALUE_KINDS[(seed // 4) % 4]
    weights, row_scale = SCALE_OPTIONS[(seed // 16) % 4]
    case = random_case(rng, num_tokens=int(rng.integers(0, 8)), hidden=int(rng.integers(1, 24)),
                       top_k=int(rng.integers(1, 11)), dtype=dtype, value_kind=value_kind,
                       weights=weights, row_scale=row_scale)
    expected = slow_reduce_fused(**case)
    assert_bits(reduce_fused_numpy(**case), expected,
                f"{dtype} {value_kind} weights={weights} row_scale={row_scale}")


@pytest.mark.parametrize("dtype", COMBINE_DTYPES)
def test_oracle_on_long_sums_of_mixed_magnitudes(dtype):
    """Many slots of very different magnitudes: every step's rounding counts."""
    rng = np.random.default_rng(3)
    fmt = FORMAT_OF[dtype]
    expanded = random_values(rng, (40, 7), dtype, "normal")
    scales = np.exp2(rng.integers(-30, 30, size=(4, 10))).astype(np.float32)
    token_topk_to_pos = rng.permutation(40)[:40].reshape(4, 10).astype(np.int32)
    weights = (rng.standard_normal((4, 10)).astype(np.float32) * scales)
    row_scale = rng.random(40, dtype=np.float32) + np.float32(0.5)
    expected = slow_reduce_fused(expanded, token_topk_to_pos, weights, row_scale)
    assert_bits(reduce_fused_numpy(expanded, token_topk_to_pos, weights, row_scale), expected,
                fmt)


@pytest.mark.parametrize("seed", range(48))
def test_oracle_float32_out_matches_the_exact_reference(seed):
    """A bf16 / fp16 call into a float32 out: the sums themselves, unrounded."""
    rng = np.random.default_rng(1000 + seed)
    dtype = ("bfloat16", "float16", "uint16")[seed % 3]
    weights, row_scale = SCALE_OPTIONS[(seed // 3) % 4]
    case = random_case(rng, num_tokens=int(rng.integers(0, 8)), hidden=int(rng.integers(1, 24)),
                       top_k=int(rng.integers(1, 11)), dtype=dtype,
                       value_kind=VALUE_KINDS[(seed // 12) % 4], weights=weights,
                       row_scale=row_scale)
    expected = slow_reduce_fused(**case, out_float32=True)
    out = random_values(rng, expected.shape, "float32", "bits")  # poisoned
    assert reduce_fused_numpy(**case, out=out) is out
    assert_bits(bits_of(out), expected, f"{dtype} weights={weights} row_scale={row_scale}")


def test_oracle_blocks_of_tokens_do_not_change_the_result(monkeypatch):
    rng = np.random.default_rng(5)
    case = random_case(rng, num_tokens=37, hidden=50, top_k=3, dtype="bfloat16",
                       value_kind="specials", weights=True, row_scale=True)
    whole = reduce_fused_numpy(**case)
    monkeypatch.setattr(combine_reference, "_BLOCK_ELEMENTS", 120)  # 2 tokens a block
    assert_bits(reduce_fused_numpy(**case), bits_of(whole))


# -- the numerics, by hand -------------------------------------------------------------

def _f32_map(rows, map_rows):
    return np.array(rows, dtype=np.float32).reshape(-1, 1), np.array(map_rows, dtype=np.int32)


def test_slots_are_summed_in_k_order_with_a_rounding_each():
    expanded, _ = _f32_map([2.0**24, 1.0, -(2.0**24)], [[0]])
    # 2**24 + 1 rounds back to 2**24 (a tie, to even), then cancels: 0
    assert reduce_fused(expanded, np.array([[0, 1, 2]], np.int32))[0, 0] == 0.0
    # cancel first, then add 1: 1
    assert reduce_fused(expanded, np.array([[0, 2, 1]], np.int32))[0, 0] == 1.0


def test_each_step_is_one_fma_rounding():
    x = np.float32(1 + 2.0**-12)
    expanded = np.array([[-1.0], [x]], dtype=np.float32)
    weights = np.array([[1.0, x]], dtype=np.float32)
    got = reduce_fused(expanded, np.array([[0, 1]], np.int32), weights)[0, 0]
    # fma(x, x, -1) = 2**-11 + 2**-24 exactly; a rounded product would lose 2**-24
    assert got == np.float32(2.0**-11 + 2.0**-24)


def test_a_step_near_a_tie_is_rounded_once():
    # the double-rounding trap of test_fma_emulation: float64 multiply-add and a
    # cast would give 1 + 2**-22
    one_up = np.float32(1 + 2.0**-23)
    expanded = np.array([[one_up], [one_up]], dtype=np.float32)
    weights = np.array([[1.0, 2.0**-24 * (1 - 2.0**-23)]], dtype=np.float32)
    got = reduce_fused(expanded, np.array([[0, 1]], np.int32), weights)
    assert got[0, 0] == one_up


def test_weight_times_row_scale_is_rounded_before_the_fma():
    x = np.float32(1 + 2.0**-12)
    expanded = np.array([[-1.0], [1.0]], dtype=np.float32)
    weights = np.array([[1.0, x]], dtype=np.float32)
    row_scale = np.array([1.0, x], dtype=np.float32)
    got = reduce_fused(expanded, np.array([[0, 1]], np.int32), weights, row_scale=row_scale)
    # s = RN(x * x) = 1 + 2**-11 (a tie, to even), then fma(1, s, -1) = 2**-11
    assert got[0, 0] == np.float32(2.0**-11)


@pytest.mark.parametrize("dtype", COMBINE_DTYPES)
def test_nan_results_are_canonical(dtype):
    fmt = FORMAT_OF[dtype]
    nan_bits = {"bf16": 0xFFC1, "f16": 0xFE01, "f32": 0xFFC00001}[fmt]  # negative, payload
    expanded = np.array([[nan_bits, 0]], dtype=f"u{storage_dtype(dtype).itemsize}")
    expanded = expanded.view(storage_dtype(dtype))
    inf = np.array([np.inf], np.float32)
    got = reduce_fused(expanded, np.array([[0]], np.int32), np.array([[2.0]], np.float32),
                       row_scale=inf)
    # NaN * s, and 0 * inf: both NaN, stored as the canonical NaN
    assert (bits_of(got) == CANONICAL_NAN_BITS[fmt]).all()


@pytest.mark.parametrize(("dtype", "value", "expected"), [
    ("float16", 60000.0, np.inf),        # 120000 overflows fp16
    ("bfloat16", 3e38, np.inf),          # 6e38 overflows float32 itself
    ("float32", -3e38, -np.inf),
    ("float16", 2.0**-24, 2.0**-23),     # fp16 denormals stay
    ("bfloat16", 2.0**-133, 2.0**-132),  # bf16 denormals stay
])
def test_overflow_and_denormal_results(dtype, value, expected):
    expanded = np.array([[value]], dtype=storage_dtype(dtype))
    got = reduce_fused(expanded, np.array([[0, 0]], np.int32))
    assert float(got[0, 0]) == expected


def test_rounding_to_bf16_is_once_and_to_nearest_even():
    # 1 + 2**-8 is a bf16 tie (to even: 1); 1 + 2**-8 + 2**-16 is above it
    expanded = np.array([[1.0], [2.0**-8], [2.0**-16]], dtype=ml_dtypes.bfloat16)
    assert float(reduce_fused(expanded, np.array([[0, 1]], np.int32))[0, 0]) == 1.0
    assert float(reduce_fused(expanded, np.array([[0, 1, 2]], np.int32))[0, 0]) == 1 + 2.0**-7


# -- the contract's corner cases, on both CPU kinds ------------------------------------------

KINDS = ["numpy", "torch"]


def as_kind(kind, array):
    return None if array is None else (to_torch(array) if kind == "torch" else array)


def host(kind, result, dtype: str) -> np.ndarray:
    """Check the result's kind and dtype; a NumPy view of its bits."""
    if kind == "torch":
        assert isinstance(result, torch.Tensor) and result.device.type == "cpu"
        assert result.dtype == getattr(torch, dtype)
        return from_torch(result)
    assert isinstance(result, np.ndarray) and result.dtype == storage_dtype(dtype)
    return result


def call(kind, case, **kwargs):
    return reduce_fused(as_kind(kind, case["expanded"]), as_kind(kind, case["token_topk_to_pos"]),
                        as_kind(kind, case["topk_weights"]),
                        row_scale=as_kind(kind, case["row_scale"]), **kwargs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", COMBINE_DTYPES)
@pytest.mark.parametrize(("weights", "row_scale"), SCALE_OPTIONS,
                         ids=["plain", "weights", "row-scale", "both"])
def test_public_op_matches_the_oracle(kind, dtype, weights, row_scale):
    rng = np.random.default_rng()
    case = random_case(rng, num_tokens=30, hidden=77, top_k=9, dtype=dtype,
                       value_kind="specials", weights=weights, row_scale=row_scale)
    expected = reduce_fused_numpy(**case)
    assert_bits(host(kind, call(kind, case), dtype), bits_of(expected))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", COMBINE_DTYPES)
def test_out_is_written_in_place_and_returned(kind, dtype):
    rng = np.random.default_rng()
    case = random_case(rng, num_tokens=9, hidden=33, top_k=4, dtype=dtype, value_kind="bits",
                       weights=True, row_scale=False)
    expected = reduce_fused_numpy(**case)
    out = as_kind(kind, random_values(rng, (9, 33), dtype, "bits"))  # poisoned
    result = call(kind, case, out=out)
    assert result is out
    assert_bits(host(kind, out, dtype), bits_of(expected))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_float32_out_holds_the_sums_unrounded(kind, dtype):
    """bf16 / fp16 input, float32 out: the float32 result of the same call on
    the input widened to float32 (the same fma chain), which rounds to the
    bits of the call without out (one rounding, at the end)."""
    rng = np.random.default_rng()
    case = random_case(rng, num_tokens=23, hidden=41, top_k=5, dtype=dtype,
                       value_kind="specials", weights=True, row_scale=True)
    widened = dict(case, expanded=case["expanded"].astype(np.float32))
    out = as_kind(kind, random_values(rng, (23, 41), "float32", "bits"))  # poisoned
    assert call(kind, case, out=out) is out
    sums = host(kind, out, "float32")
    assert_bits(sums, bits_of(reduce_fused_numpy(**widened)))
    rounded = combine_reference._round_to_format(sums.copy(), FORMAT_OF[dtype])
    assert_bits(bits_of(rounded), bits_of(reduce_fused_numpy(**case)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", COMBINE_DTYPES)
def test_no_tokens_give_an_empty_result(kind, dtype):
    expanded = random_values(np.random.default_rng(), (5, 12), dtype, "normal")
    empty_map = np.zeros((0, 3), dtype=np.int32)
    result = reduce_fused(as_kind(kind, expanded), as_kind(kind, empty_map))
    assert tuple(result.shape) == (0, 12)
    host(kind, result, dtype)
    out = as_kind(kind, np.zeros((0, 12), dtype=storage_dtype(dtype)))
    assert reduce_fused(as_kind(kind, expanded), as_kind(kind, empty_map), out=out) is out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", COMBINE_DTYPES)
def test_dropped_and_out_of_range_slots_give_plus_zero(kind, dtype):
    expanded = random_values(np.random.default_rng(), (4, 10), dtype, "specials")
    token_topk_to_pos = np.array([[-1, -1], [4, -7], [2**31 - 1, -(2**31)]], dtype=np.int32)
    weights = np.full((3, 2), np.nan, dtype=np.float32)  # never used
    result = reduce_fused(as_kind(kind, expanded), as_kind(kind, token_topk_to_pos),
                          as_kind(kind, weights))
    assert (bits_of(host(kind, result, dtype)) == 0).all()


def test_no_rows_at_all():
    result = reduce_fused(np.zeros((0, 6), np.float32), np.array([[-1], [3]], np.int32),
                          row_scale=np.zeros(0, np.float32))
    assert result.shape == (2, 6) and (bits_of(result) == 0).all()


def test_an_out_of_range_slot_is_skipped_as_a_dropped_one():
    rng = np.random.default_rng(1)
    expanded = random_values(rng, (6, 16), "bfloat16", "normal")
    token_topk_to_pos = np.array([[0, 6, 1], [2, 3, 100]], dtype=np.int32)
    dropped = np.where(token_topk_to_pos >= 6, -1, token_topk_to_pos).astype(np.int32)
    assert_bits(reduce_fused(expanded, token_topk_to_pos),
                bits_of(reduce_fused(expanded, dropped)))


def test_non_contiguous_inputs_are_accepted():
    rng = np.random.default_rng(2)
    case = random_case(rng, num_tokens=8, hidden=24, top_k=3, dtype="float16",
                       value_kind="normal", weights=True, row_scale=True, out_of_range=False)
    expected = reduce_fused_numpy(**case)
    wide = np.zeros((case["expanded"].shape[0], 48), dtype=np.float16)
    wide[:, ::2] = case["expanded"]
    strided = {"expanded": wide[:, ::2],
               "token_topk_to_pos": np.asfortranarray(case["token_topk_to_pos"]),
               "topk_weights": np.asfortranarray(case["topk_weights"]),
               "row_scale": np.repeat(case["row_scale"], 2)[::2]}
    for kind in KINDS:
        result = reduce_fused(*(as_kind(kind, strided[n]) if kind == "numpy" else
                                torch.from_numpy(strided[n]) for n in
                                ("expanded", "token_topk_to_pos", "topk_weights")),
                              row_scale=torch.from_numpy(strided["row_scale"])
                              if kind == "torch" else strided["row_scale"])
        assert_bits(host(kind, result, "float16"), bits_of(expected))


def test_torch_tensors_under_no_grad_are_accepted():
    expanded = torch.randn(4, 8, requires_grad=True)
    weights = torch.rand(2, 2, requires_grad=True)
    token_topk_to_pos = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)
    with torch.no_grad():
        result = reduce_fused(expanded, token_topk_to_pos, weights)
    expected = reduce_fused_numpy(expanded.detach().numpy(), token_topk_to_pos.numpy(),
                                  weights.detach().numpy())
    assert_bits(result.numpy(), bits_of(expected))


# -- validate=True ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_validate_names_the_first_slot_past_x(kind):
    expanded = np.zeros((4, 8), dtype=np.float32)
    token_topk_to_pos = np.array([[0, -1], [3, 7], [4, 1]], dtype=np.int32)
    with pytest.raises(ValueError, match=exact(
            "token_topk_to_pos[1, 1] = 7 is out of range: expanded has X = 4 rows")):
        reduce_fused(as_kind(kind, expanded), as_kind(kind, token_topk_to_pos), validate=True)


@pytest.mark.parametrize("kind", KINDS)
def test_validate_accepts_a_well_formed_map(kind):
    rng = np.random.default_rng(4)
    case = random_case(rng, num_tokens=12, hidden=8, top_k=3, dtype="bfloat16",
                       value_kind="normal", weights=True, row_scale=False, out_of_range=False)
    result = call(kind, case, validate=True)
    assert_bits(host(kind, result, "bfloat16"), bits_of(reduce_fused_numpy(**case)))


# -- argument errors ---------------------------------------------------------------------------

def _args(dtype="bfloat16"):
    """expanded [4, 8], token_topk_to_pos [3, 2]: T = 3, K = 2, X = 4, H = 8."""
    return {"expanded": np.zeros((4, 8), dtype=storage_dtype(dtype)),
            "token_topk_to_pos": np.array([[0, 1], [2, -1], [3, -1]], dtype=np.int32),
            "topk_weights": np.ones((3, 2), dtype=np.float32),
            "row_scale": np.ones(4, dtype=np.float32)}


def _call(args, **kwargs):
    return reduce_fused(args["expanded"], args["token_topk_to_pos"], args["topk_weights"],
                        row_scale=args["row_scale"], **kwargs)


BAD_ARGUMENTS = {
    "expanded-none": ("expanded", None, TypeError,
                      "expanded must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got None"),
    "map-none": ("token_topk_to_pos", None, TypeError,
                 ("token_topk_to_pos must be a numpy.ndarray, cupy.ndarray or torch.Tensor; "
                 "got None")),
    "weights-list": ("topk_weights", [[1.0, 1.0]] * 3, TypeError,
                     ("topk_weights must be a numpy.ndarray, cupy.ndarray or torch.Tensor; "
                     "got builtins.list")),
    "row-scale-float": ("row_scale", 1.0, TypeError,
                        ("row_scale must be a numpy.ndarray, cupy.ndarray or torch.Tensor; "
                        "got builtins.float")),
    "expanded-int32": ("expanded", np.zeros((4, 8), np.int32), ValueError,
                       "expanded must be one of bfloat16, float16, float32, uint16; got int32"),
    "expanded-float64": ("expanded", np.zeros((4, 8), np.float64), ValueError,
                         ("expanded must be one of bfloat16, float16, float32, uint16; "
                         "got float64")),
    "expanded-fp8": ("expanded", np.zeros((4, 8), ml_dtypes.float8_e4m3fn), ValueError,
                     ("expanded must be one of bfloat16, float16, float32, uint16; "
                     "got float8_e4m3fn")),
    "expanded-1d": ("expanded", np.zeros(8, ml_dtypes.bfloat16), ValueError,
                    "expanded must be 2-D [X, H]; got shape (8,)"),
    "expanded-3d": ("expanded", np.zeros((4, 8, 1), ml_dtypes.bfloat16), ValueError,
                    "expanded must be 2-D [X, H]; got shape (4, 8, 1)"),
    "no-columns": ("expanded", np.zeros((4, 0), ml_dtypes.bfloat16), ValueError,
                   "expanded must have H = expanded.shape[1] >= 1 columns; got shape (4, 0)"),
    "map-int64": ("token_topk_to_pos", np.zeros((3, 2), np.int64), ValueError,
                  "token_topk_to_pos must be one of int32; got int64"),
    "map-1d": ("token_topk_to_pos", np.zeros(3, np.int32), ValueError,
               "token_topk_to_pos must be 2-D [T, K]; got shape (3,)"),
    "no-slots": ("token_topk_to_pos", np.zeros((3, 0), np.int32), ValueError,
                 "token_topk_to_pos must have K = shape[1] >= 1 slots; got 0"),
    "weights-float64": ("topk_weights", np.ones((3, 2), np.float64), ValueError,
                        "topk_weights must be one of float32; got float64"),
    "weights-bf16": ("topk_weights", np.ones((3, 2), ml_dtypes.bfloat16), ValueError,
                     "topk_weights must be one of float32; got bfloat16"),
    "weights-1d": ("topk_weights", np.ones(6, np.float32), ValueError,
                   "topk_weights must be 2-D [T, K]; got shape (6,)"),
    "weights-shape": ("topk_weights", np.ones((3, 3), np.float32), ValueError,
                      ("topk_weights must have the shape of token_topk_to_pos, (T, K) = (3, 2); "
                      "got (3, 3)")),
    "weights-tokens": ("topk_weights", np.ones((2, 2), np.float32), ValueError,
                       ("topk_weights must have the shape of token_topk_to_pos, (T, K) = (3, 2); "
                       "got (2, 2)")),
    "row-scale-float16": ("row_scale", np.ones(4, np.float16), ValueError,
                          "row_scale must be one of float32; got float16"),
    "row-scale-2d": ("row_scale", np.ones((4, 1), np.float32), ValueError,
                     "row_scale must be 1-D [X]; got shape (4, 1)"),
    "row-scale-rows": ("row_scale", np.ones(5, np.float32), ValueError,
                       ("row_scale must have one value per row of expanded, X = 4; "
                       "got shape (5,)")),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_bad_arguments_are_rejected_naming_them(case):
    name, value, error, message = BAD_ARGUMENTS[case]
    args = _args()
    args[name] = value
    with pytest.raises(error, match=exact(message)):
        _call(args)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_arguments_of_torch_tensors_read_the_same(kind):
    args = {name: as_kind(kind, a) for name, a in _args().items()}
    args["topk_weights"] = as_kind(kind, np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match=exact(
            "topk_weights must have the shape of token_topk_to_pos, (T, K) = (3, 2); "
            "got (3, 3)")):
        _call(args)


BAD_OUTPUTS = {
    "shape": (np.zeros((3, 9), ml_dtypes.bfloat16), "out must have shape (3, 8); got (3, 9)"),
    "dtype": (np.zeros((3, 8), np.float16),
              "out must have dtype bfloat16 or float32 (that of the input, or float32 for the "
              "unrounded sums); got float16"),
    "uint16-for-bf16": (np.zeros((3, 8), np.uint16),
                        "out must have dtype bfloat16 or float32 (that of the input, or float32 "
                        "for the unrounded sums); got uint16"),
    "float64": (np.zeros((3, 8), np.float64),
                "out must have dtype bfloat16 or float32 (that of the input, or float32 for the "
                "unrounded sums); got float64"),
    "not-contiguous": (np.zeros((8, 3), ml_dtypes.bfloat16).T,
                       "out must be C-contiguous, element strides (8, 1); got (1, 3)"),
    "column-view": (np.zeros((3, 16), ml_dtypes.bfloat16)[:, ::2],
                    "out must be C-contiguous, element strides (8, 1); got (16, 2)"),
    # byte strides of no whole element (a floor division read them as (8, 1))
    "odd-byte-strides": (np.ndarray((3, 8), ml_dtypes.bfloat16, buffer=np.zeros(64, np.uint8),
                                    strides=(17, 3)),
                         "out must be C-contiguous, element strides (8, 1); got (8.5, 1.5)"),
}


@pytest.mark.parametrize("case", sorted(BAD_OUTPUTS))
def test_bad_outputs_are_rejected(case):
    out, message = BAD_OUTPUTS[case]
    with pytest.raises(ValueError, match=exact(message)):
        _call(_args(), out=out)


def test_read_only_out_is_rejected():
    out = np.zeros((3, 8), ml_dtypes.bfloat16)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=exact("out is read-only; an output must be writeable")):
        _call(_args(), out=out)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("other", ["expanded", "token_topk_to_pos", "topk_weights",
                                   "row_scale"])
def test_out_overlapping_an_input_is_rejected(kind, other):
    args = _args("float32")
    buffer = np.zeros(40, np.float32)  # other from element 0, out from element 2
    out = buffer[2:26].reshape(3, 8)
    inside = buffer.view(args[other].dtype)[:args[other].size]
    inside[...] = args[other].reshape(-1)
    args[other] = inside.reshape(args[other].shape)
    if kind == "torch":  # the same memory
        args = {name: torch.from_numpy(a) for name, a in args.items()}
        out = torch.from_numpy(out)
    with pytest.raises(ValueError, match=exact(
            f"out overlaps {other} in memory; outputs must not share memory with the inputs")):
        _call(args, out=out)


def test_mixed_kinds_are_rejected_naming_both():
    args = _args()
    args["topk_weights"] = torch.ones(3, 2)
    with pytest.raises(TypeError, match=exact(
            "all arrays must be of one kind: expanded is numpy.ndarray, topk_weights is "
            "torch.Tensor (cpu)")):
        _call(args)


def test_validate_must_be_a_bool():
    with pytest.raises(TypeError, match=exact("validate must be True or False; got int 1")):
        _call(_args(), validate=1)


def test_row_scale_and_out_are_keyword_only():
    args = _args()
    with pytest.raises(TypeError):
        reduce_fused(args["expanded"], args["token_topk_to_pos"], args["topk_weights"],
                     args["row_scale"])


@pytest.mark.parametrize("name", ["expanded", "topk_weights", "row_scale"])
def test_tensors_requiring_grad_are_rejected(name):
    args = {n: to_torch(a) for n, a in _args("float32").items()}
    args[name] = args[name].clone().requires_grad_(True)
    with pytest.raises(TypeError, match=exact(
            f"{name} requires grad, but cupy_moe ops are inference-only (no autograd): "
            f"pass {name}.detach() or call under torch.no_grad()")):
        _call(args)


@pytest.mark.parametrize("name", ["expanded", "token_topk_to_pos", "topk_weights", "row_scale",
                                  "out"])
def test_meta_tensors_are_rejected_naming_them(name):
    args = {n: to_torch(a) for n, a in _args().items()}
    out = None
    if name == "out":
        out = torch.empty((3, 8), dtype=torch.bfloat16, device="meta")
    else:
        args[name] = args[name].to("meta")
    with pytest.raises(ValueError, match=exact(
            f"{name} is a tensor on device 'meta'; cupy_moe takes CPU and CUDA tensors")):
        _call(args, out=out)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_ndarray_subclasses_are_read_as_plain_arrays():
    """np.matrix keeps every index 2-D: the weights' and rows' matrices are
    read as the arrays they view (they once failed inside the oracle with
    NumPy's broadcast error), and a matrix out is written in place and
    returned as itself."""
    rng = np.random.default_rng(5)
    expanded = rng.standard_normal((3, 4)).astype(np.float32)
    token_topk_to_pos = np.array([[0], [2]], np.int32)
    weights = rng.standard_normal((2, 1)).astype(np.float32)
    expected = reduce_fused(expanded, token_topk_to_pos, weights)
    out = np.asmatrix(np.zeros((2, 4), np.float32))
    result = reduce_fused(np.asmatrix(expanded), token_topk_to_pos, np.asmatrix(weights),
                          out=out)
    assert result is out
    np.testing.assert_array_equal(np.asarray(out).view(np.uint32), expected.view(np.uint32))


# -- bounds at their edges (each test killed a mutant the suite let through) --------------------

@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_row_scale_shorter_than_x_is_refused(kind):
    """Shorter, not only longer: a short row_scale would be read past its end."""
    convert = torch.from_numpy if kind == "torch" else np.asarray
    expanded = np.zeros((4, 8), np.float32)
    token_topk_to_pos = np.array([[0, 1], [2, -1], [3, -1]], np.int32)
    with pytest.raises(ValueError, match=exact(
            "row_scale must have one value per row of expanded, X = 4; got shape (3,)")):
        reduce_fused(convert(expanded), convert(token_topk_to_pos), None,
                     row_scale=convert(np.ones(3, np.float32)))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize(("rows", "named"), [
    ([[0, -1], [3, 1], [7, 1]], "token_topk_to_pos[2, 0] = 7"),  # [t, k] not [k, t]
    ([[0, 4], [9, 1]], "token_topk_to_pos[0, 1] = 4"),            # a slot of exactly X
])
def test_validate_names_the_first_slot_at_or_past_x(kind, rows, named):
    convert = torch.from_numpy if kind == "torch" else np.asarray
    expanded = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match=exact(
            f"{named} is out of range: expanded has X = 4 rows")):
        reduce_fused(convert(expanded), convert(np.array(rows, np.int32)), validate=True)


def test_an_out_of_one_row_may_have_any_row_stride():
    """A [1, H] out (decode, T = 1) never steps its row stride: it is
    C-contiguous whatever that stride is (NumPy's flags agree)."""
    rng = np.random.default_rng(0)
    expanded = rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    token_topk_to_pos = np.array([[2, 0]], np.int32)
    out = np.zeros((1, 16), ml_dtypes.bfloat16)[:, :8]
    assert out.flags.c_contiguous and out.strides[0] != 8 * out.itemsize
    assert reduce_fused(expanded, token_topk_to_pos, out=out) is out
    expected = reduce_fused(expanded, token_topk_to_pos)
    assert np.array_equal(out.view(np.uint16), expected.view(np.uint16))
