"""Exact float arithmetic in ``fractions.Fraction``: float32 / bf16 / fp16
rounding to nearest even, and the float32 product and fma rounded once. The
slow reference of the combine tests (tests/test_fma_emulation.py,
tests/combine_cases.py).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

# (significand bits, smallest normal exponent, largest exponent) of each format
FORMATS = {"f32": (24, -126, 127), "bf16": (8, -126, 127), "f16": (11, -14, 15)}

FLT_MAX = float(np.finfo(np.float32).max)
TINY = 2.0**-149  # the smallest float32 denormal


# -- exact reference -----------------------------------------------------------

def round_exact(value: Fraction, fmt: str = "f32", *, negative_zero: bool = False) -> float:
    """``value`` rounded to nearest even in ``fmt`` (gradual underflow,
    overflow to +-inf), as a Python float. An exact zero is -0.0 only when
    ``negative_zero``; a nonzero value that rounds to zero keeps its sign."""
    precision, emin, emax = FORMATS[fmt]
    if value == 0:
        return -0.0 if negative_zero else 0.0
    sign = -1.0 if value < 0 else 1.0
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    quantum = Fraction(2) ** (max(exponent, emin) - precision + 1)
    scaled = magnitude / quantum
    units = scaled.numerator // scaled.denominator
    rest = scaled - units
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and units % 2 == 1):
        units += 1
    rounded = units * quantum
    if rounded >= Fraction(2) ** (emax + 1):
        return sign * math.inf
    return sign * float(rounded)


def _negative(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def exact_mul32(a: float, b: float) -> float:
    """float32 ``a * b`` (float32 values given as Python floats), one rounding."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b  # IEEE: inf * 0 -> NaN, inf * x -> +-inf
    return round_exact(Fraction(a) * Fraction(b), negative_zero=_negative(a) != _negative(b))


def exact_fma32(a: float, b: float, c: float) -> float:
    """float32 ``fma(a, b, c)``, one rounding of the exact ``a * b + c``."""
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return a * b + c  # exact in float64 for float32 inputs; inf/NaN by IEEE
    product = Fraction(a) * Fraction(b)
    product_negative = _negative(a) != _negative(b)
    # an exact zero sum is -0 only when both addends are -0 (round to nearest)
    both_negative_zeros = product == 0 and product_negative and c == 0 and _negative(c)
    return round_exact(product + Fraction(c), negative_zero=both_negative_zeros)
