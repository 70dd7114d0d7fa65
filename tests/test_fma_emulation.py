"""``combine.fma.fma_float32`` (NumPy's single-rounding float32 fma) against
exact rational arithmetic (``fractions.Fraction``): hand-picked hard cases
(ties, double-rounding traps, exact cancellation, signed zeros, denormal
results, overflow, huge exponent gaps, inf/NaN) and many random ones.

The exact helpers (``exact_fma32``, ``exact_mul32``, ``round_exact``) live in
tests/exact_float.py, the slow reference of the combine tests too.
"""

from __future__ import annotations

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
from exact_float import FLT_MAX, TINY, exact_fma32, round_exact

from cupy_moe.combine.fma import fma_float32


def f32_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def assert_same_float32(got: np.ndarray, expected: np.ndarray, cases) -> None:
    """Bit for bit, except that any NaN matches any NaN (payloads unspecified)."""
    got, expected = np.asarray(got, np.float32), np.asarray(expected, np.float32)
    both_nan = np.isnan(got) & np.isnan(expected)
    differ = (f32_bits(got) != f32_bits(expected)) & ~both_nan
    if differ.any():
        i = int(np.flatnonzero(differ.reshape(-1))[0])
        a, b, c = (float(np.asarray(v, np.float32).reshape(-1)[i]) for v in cases)
        raise AssertionError(
            f"{int(differ.sum())} of {differ.size} differ; first: fma({a!r}, {b!r}, {c!r}) = "
            f"{float(got.reshape(-1)[i])!r} ({int(f32_bits(got).reshape(-1)[i]):#010x}), "
            f"exact {float(expected.reshape(-1)[i])!r} "
            f"({int(f32_bits(expected).reshape(-1)[i]):#010x})")


def check(a, b, c) -> None:
    a, b, c = (np.asarray(v, dtype=np.float32).reshape(-1) for v in (a, b, c))
    expected = np.array([exact_fma32(float(x), float(y), float(z))
                         for x, y, z in zip(a, b, c, strict=True)],
                        dtype=np.float32)
    assert_same_float32(fma_float32(a, b, c), expected, (a, b, c))


# -- the reference itself ---------------------------------------------------------

def test_round_exact_agrees_with_numpy_casts_of_doubles():
    """NumPy's double -> float32 / float16 casts are single roundings; the
    reference must round every double the same way (denormals, overflow)."""
    rng = np.random.default_rng(7)
    doubles = rng.integers(0, 2**64, size=4000, dtype=np.uint64).view(np.float64)
    doubles = doubles[np.isfinite(doubles)]
    # exponents near float32's and float16's ranges, where rounding is interesting
    mantissas = rng.random(4000) + 1.0
    exponents = rng.integers(-160, 130, size=4000)
    doubles = np.concatenate([doubles, mantissas * np.exp2(exponents),
                              -mantissas * np.exp2(rng.integers(-30, 17, size=4000))])
    with np.errstate(over="ignore"):
        as_f32, as_f16 = doubles.astype(np.float32), doubles.astype(np.float16)
    for d, want32, want16 in zip(doubles.tolist(), as_f32.tolist(), as_f16.tolist(), strict=True):
        got32 = round_exact(Fraction(d), "f32")
        got16 = round_exact(Fraction(d), "f16")
        assert f32_bits(got32) == f32_bits(want32), (d, got32, want32)
        assert np.float16(got16).view(np.uint16) == np.float16(want16).view(np.uint16), d


@pytest.mark.parametrize(("value", "fmt", "expected"), [
    (Fraction(1) + Fraction(1, 2**24), "f32", 1.0),                  # tie -> even
    (Fraction(1) + Fraction(3, 2**24), "f32", 1.0 + 2.0**-22),       # tie -> even (up)
    (Fraction(FLT_MAX) + Fraction(2**103), "f32", math.inf),         # tie past FLT_MAX
    (Fraction(FLT_MAX) + Fraction(2**103) - Fraction(1), "f32", FLT_MAX),
    (Fraction(1, 2**150), "f32", 0.0),                               # tie with 0 -> 0
    (Fraction(3, 2**151), "f32", TINY),
    (-Fraction(1, 2**151), "f32", -0.0),                             # keeps its sign
    (Fraction(65520), "f16", math.inf),                              # fp16's overflow tie
    (Fraction(65519), "f16", 65504.0),
    (Fraction(1, 2**25), "f16", 0.0),                                # tie with 0 -> 0
    (Fraction(257), "bf16", 256.0),                                  # tie -> even
    (Fraction(259), "bf16", 260.0),
])
def test_round_exact_known_values(value, fmt, expected):
    got = round_exact(value, fmt)
    assert got == expected and math.copysign(1, got) == math.copysign(1, expected)


# -- hard cases ------------------------------------------------------------------

ULP1 = 2.0**-23  # float32 spacing in [1, 2)

HARD_CASES = {
    # a * b + c lands exactly on a tie: ties to even
    "tie-down-to-even": (2.0**-12, 2.0**-12, 1.0, 1.0),
    "tie-up-to-even": (3.0 * 2.0**-12, 2.0**-12, 1.0, 1.0 + 2 * ULP1),
    # just below / above a tie by far less than float64 can hold next to c:
    # float64 rounds the sum onto the tie, then float32 rounds it the wrong way
    "double-rounding-below-tie": (1.0 + ULP1, 2.0**-24 * (1.0 - ULP1), 1.0 + ULP1,
                                  1.0 + ULP1),
    "double-rounding-above-tie": (-(1.0 + ULP1), 2.0**-25 * (1.0 - ULP1), 1.0 - 2.0**-24,
                                  1.0 - 2.0**-24),
    # exact cancellation: +0, whatever the signs
    "cancel-to-plus-zero": (3.0, 5.0, -15.0, 0.0),
    "cancel-negative-product": (-3.0, 5.0, 15.0, 0.0),
    "minus-zero-plus-minus-zero": (-0.0, 5.0, -0.0, -0.0),
    "minus-zero-plus-zero": (-0.0, 5.0, 0.0, 0.0),
    "zero-product-and-minus-zero": (0.0, -7.0, -0.0, -0.0),
    "zero-product-keeps-c": (0.0, -7.0, 2.5, 2.5),
    # a product far below c's last bit still decides a tie-free rounding
    "tiny-product-under-c": (2.0**-100, 2.0**-100, 1.0, 1.0),
    "tiny-negative-product-under-c": (-(2.0**-100), 2.0**-100, 1.0, 1.0),
    "tiny-product-on-odd-c": (2.0**-60, 2.0**-60, 1.0 + ULP1, 1.0 + ULP1),
    # huge c, tiny product, and the other way round
    "huge-c": (2.0**-70, 2.0**-70, 2.0**120, 2.0**120),
    "huge-product-tiny-c": (2.0**60, 2.0**60, TINY, 2.0**120),
    "tie-above-huge-product": (2.0**60, 2.0**60, 2.0**96, 2.0**120),
    "above-tie-above-huge-product": (2.0**60, 2.0**60, 2.0**96 + 2.0**73, 2.0**120 + 2.0**97),
    # denormal results
    "denormal-exact": (2.0**-75, 2.0**-74, 0.0, TINY),
    "denormal-tie-to-zero": (2.0**-75, 2.0**-75, 0.0, 0.0),
    "denormal-tie-to-even": (3.0 * 2.0**-75, 2.0**-75, 0.0, 2 * TINY),
    "denormal-cancel-tie": (-(2.0**-75), 2.0**-75, TINY, 0.0),
    "denormal-sum": (2.0**-140, 2.0**-9, 5 * TINY, 2.0**-149 * 5 + 2.0**-149),
    "tiny-negative-to-minus-zero": (-(2.0**-100), 2.0**-100, 0.0, -0.0),
    "denormal-above-tie": (2.0**-75 * (1.0 + ULP1), 2.0**-75, 0.0, TINY),
    "normal-from-denormals": (2.0**-64, 2.0**-62, 2.0**-126 - TINY, 2.0**-126 * 2 - TINY),
    # overflow
    "overflow": (FLT_MAX, 2.0, 0.0, math.inf),
    "overflow-at-tie": (2.0**51, 2.0**52, FLT_MAX, math.inf),
    "just-below-overflow-tie": (2.0**51 * (1.0 - ULP1), 2.0**52, FLT_MAX, FLT_MAX),
    "negative-overflow": (-FLT_MAX, FLT_MAX, 0.0, -math.inf),
    "max-minus-max": (FLT_MAX, 1.0, -FLT_MAX, 0.0),
    # infinities and NaN
    "inf-times-zero": (math.inf, 0.0, 1.0, math.nan),
    "inf-minus-inf": (math.inf, 1.0, -math.inf, math.nan),
    "inf-product": (math.inf, -2.0, 1.0, -math.inf),
    "inf-addend": (FLT_MAX, FLT_MAX, math.inf, math.inf),
    "nan-addend": (1.0, 1.0, math.nan, math.nan),
    "nan-factor": (math.nan, 0.0, 0.0, math.nan),
}


@pytest.mark.parametrize("case", sorted(HARD_CASES))
def test_hard_case(case):
    a, b, c, expected = HARD_CASES[case]
    # the table is right: the exact reference agrees with it
    exact = exact_fma32(float(np.float32(a)), float(np.float32(b)), float(np.float32(c)))
    for value in (a, b, c):
        assert float(np.float32(value)) == value or math.isnan(value), "not a float32"
    assert_same_float32(np.float32(exact), np.float32(expected), ([a], [b], [c]))
    got = fma_float32(np.float32(a), np.float32(b), np.float32(c))
    assert got.dtype == np.float32
    assert_same_float32(got, np.float32(expected), ([a], [b], [c]))


@pytest.mark.parametrize("case", ["double-rounding-below-tie", "double-rounding-above-tie"])
def test_double_rounding_traps_catch_a_naive_fma(case):
    """The traps are real: float64 multiply-add then a cast gets them wrong."""
    a, b, c, expected = HARD_CASES[case]
    naive = np.float32(np.float64(np.float32(a)) * np.float64(np.float32(b))
                       + np.float64(np.float32(c)))
    assert naive != np.float32(expected)


def test_scalars_and_broadcasting():
    got = fma_float32(np.float32(2.0), np.arange(3, dtype=np.float32)[:, None],
                      np.ones((1, 4), dtype=np.float32))
    assert got.shape == (3, 4) and got.dtype == np.float32
    assert (got == 2.0 * np.arange(3)[:, None] + 1.0).all()
    assert fma_float32(1.0, 2.0, 3.0).shape == ()


# -- random cases ------------------------------------------------------------------

def _f32(x) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float32)


def _random_bits(rng, n):
    return rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def _scaled(rng, n, low, high):
    """Random float32 of random sign with exponents in [low, high)."""
    sign = rng.choice([-1.0, 1.0], size=n)
    return _f32(sign * (1.0 + rng.random(n)) * np.exp2(rng.integers(low, high, size=n)))


def _nudged(rng, x, max_ulps=3):
    """x moved a few float32 ulps up or down."""
    x = x.copy()
    for _ in range(max_ulps):
        step = rng.integers(-1, 2, size=x.size)
        up, down = np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))
        x = np.where(step > 0, up, np.where(step < 0, down, x)).astype(np.float32)
    return x


def _cases(rng, family: str, n: int):
    if family == "random-bits":
        return _random_bits(rng, n), _random_bits(rng, n), _random_bits(rng, n)
    if family == "cancellation":
        a, b = _scaled(rng, n, -20, 20), _scaled(rng, n, -20, 20)
        # half with short significands: a * b is a float32, and cancels exactly
        short = rng.random(n) < 0.5
        a[short] = _f32(rng.integers(-4096, 4096, size=short.sum()) * 2.0**-6)
        b[short] = _f32(rng.integers(-2048, 2048, size=short.sum()) * 2.0**-9)
        return a, b, _nudged(rng, _f32(-(a.astype(np.float64) * b)))
    if family == "near-ties":
        # a * b close to half an ulp of c, with random low bits
        c = _scaled(rng, n, -10, 10)
        a = _scaled(rng, n, 0, 1)
        half_ulp = np.abs(np.spacing(c).astype(np.float64)) / 2
        b = _nudged(rng, _f32(half_ulp / a * rng.choice([-1, 1, 3, -3], size=n)))
        return a, b, c
    if family == "denormal":
        a, b = _scaled(rng, n, -80, -60), _scaled(rng, n, -80, -60)
        c = _f32(rng.integers(-2**20, 2**20, size=n) * TINY)
        return a, b, c
    if family == "overflow":
        a, b = _scaled(rng, n, 60, 66), _scaled(rng, n, 60, 66)
        return a, b, _scaled(rng, n, 125, 128)
    if family == "exponent-gaps":
        a, b = _scaled(rng, n, -70, 70), _scaled(rng, n, -70, 70)
        return a, b, _scaled(rng, n, -149, 128)
    raise ValueError(family)


@pytest.mark.parametrize("family", ["random-bits", "cancellation", "near-ties", "denormal",
                                    "overflow", "exponent-gaps"])
def test_random_cases_match_the_exact_fma(family):
    rng = np.random.default_rng(zlib.crc32(family.encode()))
    check(*_cases(rng, family, 4000))


def test_many_plain_random_cases():
    rng = np.random.default_rng(11)
    n = 20000
    a, b = _f32(rng.standard_normal(n)), _f32(rng.standard_normal(n))
    check(a, b, _f32(rng.standard_normal(n)))
