"""Case generators and the slow exact reference of ``reduce_fused``, shared by
tests/test_combine_cpu.py and tests/test_combine_gpu.py.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import ml_dtypes
import numpy as np
from exact_float import exact_fma32, exact_mul32, round_exact

from cupy_moe.combine.reference import CANONICAL_NAN_BITS

COMBINE_DTYPES = ["bfloat16", "float16", "float32", "uint16"]  # uint16: bf16 bits
VALUE_KINDS = ["normal", "specials", "bits", "denormal"]
SCALE_OPTIONS = [(False, False), (True, False), (False, True), (True, True)]
FORMAT_OF = {"bfloat16": "bf16", "uint16": "bf16", "float16": "f16", "float32": "f32"}
FLOAT_DTYPE = {"bf16": np.dtype(ml_dtypes.bfloat16), "f16": np.dtype(np.float16),
                "f32": np.dtype(np.float32)}


def exact(message: str) -> str:
    """A ``match=`` pattern for a literal piece of an error message."""
    return re.escape(message)


# -- random inputs (shared with the GPU tests) -----------------------------------------

def storage_dtype(dtype: str) -> np.dtype:
    return np.dtype(np.uint16) if dtype == "uint16" else FLOAT_DTYPE[FORMAT_OF[dtype]]


def random_values(rng, shape, dtype: str, kind: str) -> np.ndarray:
    """Values of ``dtype`` (uint16: bf16 bits): ``normal``; ``specials``
    (normal, a few NaN, +-inf, +-0, extremes, denormals); ``bits`` (random
    codes: every NaN, inf, denormal); ``denormal`` (around the denormal range)."""
    fmt = FORMAT_OF[dtype]
    float_dtype = FLOAT_DTYPE[fmt]
    info = ml_dtypes.finfo(float_dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if kind == "bits":
        raw = rng.integers(0, 256, size=count * float_dtype.itemsize, dtype=np.uint8)
        values = raw.view(float_dtype)
    elif kind == "denormal":
        values = rng.standard_normal(count) * float(info.smallest_normal) * 4
    else:
        values = rng.standard_normal(count) * 4
        if kind == "specials":
            pool = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, float(info.max),
                             -float(info.max), float(info.smallest_subnormal),
                             -float(info.smallest_subnormal), float(info.smallest_normal)])
            chosen = rng.random(count) < 0.05
            values[chosen] = rng.choice(pool, size=int(chosen.sum()))
    with np.errstate(all="ignore"):
        values = np.asarray(values).astype(float_dtype).reshape(shape)
    return values.view(np.uint16) if dtype == "uint16" else values


def random_scales(rng, shape, kind: str) -> np.ndarray:
    """float32 weights or row scales of the same kinds (``normal``: in [0, 1))."""
    if kind == "normal":
        return rng.random(shape, dtype=np.float32)
    if kind == "denormal":
        return (rng.random(shape) * 2.0**-120).astype(np.float32)
    return random_values(rng, shape, "float32", kind)


def random_map(rng, num_tokens: int, top_k: int, *, out_of_range: bool = True):
    """``(token_topk_to_pos [T, K] int32, X)``: distinct rows of a random layout
    with padding rows, a random share of dropped slots (-1 or other negatives),
    sometimes a repeated row, and (``out_of_range``) sometimes slots >= X."""
    slots = num_tokens * top_k
    num_expanded = slots + int(rng.integers(0, 8))
    if slots and rng.random() < 0.1:
        num_expanded = int(rng.integers(0, slots + 1))  # fewer rows than slots
    positions = np.full(slots, -1, dtype=np.int64)
    placed = min(slots, num_expanded)
    positions[:placed] = rng.permutation(num_expanded)[:placed]
    positions = rng.permutation(positions)
    drop = rng.random() * 0.6
    dropped = rng.random(slots) < drop
    positions[dropped] = rng.choice([-1, -1, -1, -2, -(2**31)], size=int(dropped.sum()))
    if num_expanded and rng.random() < 0.2:
        repeated = rng.random(slots) < 0.1
        positions[repeated] = rng.integers(0, num_expanded, size=int(repeated.sum()))
    if out_of_range and rng.random() < 0.2:
        beyond = rng.random(slots) < 0.1
        positions[beyond] = num_expanded + rng.integers(0, 1000, size=int(beyond.sum()))
        positions[positions >= 2**31] = 2**31 - 1
    return positions.astype(np.int32).reshape(num_tokens, top_k), num_expanded


def random_case(rng, *, num_tokens: int, hidden: int, top_k: int, dtype: str,
                value_kind: str, weights: bool, row_scale: bool,
                out_of_range: bool = True) -> dict:
    """The arguments of one call, as NumPy arrays."""
    token_topk_to_pos, num_expanded = random_map(rng, num_tokens, top_k,
                                                 out_of_range=out_of_range)
    scale_kind = value_kind if rng.random() < 0.5 else "normal"
    return {
        "expanded": random_values(rng, (num_expanded, hidden), dtype, value_kind),
        "token_topk_to_pos": token_topk_to_pos,
        "topk_weights": random_scales(rng, (num_tokens, top_k), scale_kind) if weights
        else None,
        "row_scale": random_scales(rng, (num_expanded,), scale_kind) if row_scale else None,
    }


# -- the slow reference ------------------------------------------------------------------

def _widen(expanded: np.ndarray, fmt: str) -> list:
    """Rows as lists of Python floats, decoded from the bits (not via ml_dtypes)."""
    bits = expanded.view(f"u{expanded.itemsize}")
    if fmt == "bf16":
        values = (bits.astype(np.uint32) << 16).view(np.float32)
    elif fmt == "f16":
        values = bits.view(np.float16).astype(np.float32)
    else:
        values = bits.view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        return values.astype(np.float64).tolist()


def _narrow_bits(acc: float, fmt: str) -> int:
    """Bits of the float32 ``acc`` rounded once to ``fmt``; NaN canonical."""
    if math.isnan(acc):
        return CANONICAL_NAN_BITS[fmt]
    if fmt != "f32" and math.isfinite(acc):
        acc = round_exact(Fraction(acc), fmt, negative_zero=math.copysign(1, acc) < 0)
    f32 = int(np.float32(acc).view(np.uint32))
    if fmt == "bf16":
        return f32 >> 16  # exactly a bf16 now: its top half
    if fmt == "f16":
        return int(np.float16(acc).view(np.uint16))  # exactly an fp16 now
    return f32


def slow_reduce_fused(expanded, token_topk_to_pos, topk_weights=None, row_scale=None, *,
                      out_float32: bool = False):
    """The contract, one element at a time, in exact arithmetic: the bits of
    the [T, H] result as unsigned ints (``out_float32``: the float32 sums,
    not rounded to ``expanded``'s dtype)."""
    fmt = FORMAT_OF[expanded.dtype.name]
    num_expanded, hidden = expanded.shape
    num_tokens, top_k = token_topk_to_pos.shape
    rows = _widen(expanded, fmt)
    out_fmt = "f32" if out_float32 else fmt
    result = np.zeros((num_tokens, hidden), dtype="u4" if out_float32 else f"u{expanded.itemsize}")
    for t in range(num_tokens):
        used = []  # (row, s) of the token's used slots, in k order
        for k in range(top_k):
            p = int(token_topk_to_pos[t, k])
            if not 0 <= p < num_expanded:
                continue
            w = None if topk_weights is None else float(topk_weights[t, k])
            r = None if row_scale is None else float(row_scale[p])
            s = exact_mul32(w, r) if w is not None and r is not None else (
                w if w is not None else r if r is not None else 1.0)
            used.append((rows[p], s))
        for h in range(hidden):
            acc = 0.0
            for row, s in used:
                acc = exact_fma32(row[h], s, acc)
            result[t, h] = _narrow_bits(acc, out_fmt)
    return result


def bits_of(array: np.ndarray) -> np.ndarray:
    return array.view(f"u{array.itemsize}")


def assert_bits(actual: np.ndarray, expected_bits: np.ndarray, what: str = "result") -> None:
    got = bits_of(actual)
    assert got.shape == expected_bits.shape, (got.shape, expected_bits.shape)
    if not np.array_equal(got, expected_bits):
        first = tuple(int(i) for i in np.argwhere(got != expected_bits)[0])
        raise AssertionError(f"{what}: {int((got != expected_bits).sum())} differ; first at "
                             f"{first}: got {int(got[first]):#x}, expected "
                             f"{int(expected_bits[first]):#x}")
