"""The float32 arithmetic of the quantize ops, in NumPy: the oracle's half of
the one definition the kernels (kernels_cu/quantize_*.cuh) implement too.

Every function here is a fixed sequence of separately rounded IEEE float32
operations (NumPy float32 ufuncs round each result to nearest even; the
kernels spell the same operations ``__fmul_rn`` / ``__fadd_rn`` /
``__fdiv_rn``, which are never fused), so the CPU and the GPU agree bit for
bit. The constants are the bit patterns of the kernel headers'; a test reads
them back from the headers.

Per-block scaling (``block_scales``): ``amax`` is the largest ``|v|`` of the
block with NaN ignored (``np.fmax``, like CUDA's ``fmaxf``), floored at
``AMAX_FLOOR``; ``sf = amax / 448``; with ``round_sf`` the bits of ``sf`` are
rounded up to a power of two, ``(bits + 0x7FFFFF) & 0x7F800000``, and
``scale = 1 / sf``; else ``scale = 448 / amax``. ``q = e4m3(v * scale)``
(``encode_e4m3``).

``exp_f32``: ``exp`` of float32 by Cody-Waite range reduction and a
degree-6 polynomial evaluated by Horner's rule to the end, its input clamped
to [-86.5, 87] so that every result is a normal float32 (``exp`` saturates at
~2.7e-38 and ~6.1e37). Its steps are fused multiply-adds (one rounding each:
the kernels' ``__fmaf_rn``, here ``combine.fma.fma_float32``, exact) and
single adds. On that range its error is at most ``EXP_MAX_ULP`` = 1.02 ulp
of float64's ``exp`` (1.0180 measured on every float32 input there, at x =
-5.1994);
``exp(NaN)`` is ``exp(-86.5)`` (NaN is clamped like -inf, so no NaN payload
reaches the exponent arithmetic). For silu the saturation is harmless:
``1 + exp(-g)`` is 1 for ``g > 17``, and ``silu(g)`` is below 1e-35 in
magnitude for ``g < -87``; ``silu(NaN)`` is NaN.

``silu_f32``: ``g * RN(1 / (1 + exp_f32(-g)))`` (an IEEE reciprocal, then a
multiply); ``swiglu_f32``: ``(silu(gate) * up) * weight``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..combine.fma import fma_float32

__all__ = [
    "AMAX_FLOOR",
    "E4M3_MAX",
    "E4M3_NAN",
    "EXP_CONSTANT_BITS",
    "EXP_MAX_ULP",
    "block_scales",
    "encode_e4m3",
    "exp_f32",
    "silu_f32",
    "swiglu_f32",
    "ue8m0_bytes",
]

_F32, _I32, _U32 = np.float32, np.int32, np.uint32


def _f32_of_bits(bits: int) -> np.float32:
    return np.array(bits, dtype=_U32).view(_F32)[()]


E4M3_MAX = _F32(448.0)          # largest finite float8_e4m3fn
AMAX_FLOOR = _F32(1e-4)         # a block's amax is at least this (all-zero blocks)
E4M3_NAN = 0x7F                 # the one NaN code the ops write
_ROUND_UP_MANTISSA = 0x7FFFFF
_EXPONENT_BITS = 0x7F800000

# exp_f32's constants by their float32 bits; kernels_cu/quantize_exp.cuh has
# the same bits under the names QUANT_EXP_<name>.
EXP_CONSTANT_BITS = {
    "LOG2E": 0x3FB8AA3B,     # log2(e)
    "SHIFTER": 0x4B400000,   # 1.5 * 2**23: adding it rounds to an integer
    "LN2_HI": 0x3F317200,    # ln 2, 16 significant bits: n * LN2_HI is exact
    "LN2_LO": 0x35BFBE8E,    # ln 2 - LN2_HI
    # exp(r) ~ 1 + r (1 + C1 r + C2 r^2 + C3 r^3 + C4 r^4 + C5 r^5): a minimax
    # fit of the relative error on |r| <= 0.3487 (Lawson's iteration), each
    # coefficient's float32 rounding then nudged by a few ulps to the
    # smallest error of this evaluation order (benchmarks/NOTES.md, sixteenth
    # session)
    "C1": 0x3EFFFFFC,
    "C2": 0x3E2AAA0B,
    "C3": 0x3D2AAC1A,
    "C4": 0x3C0935D5,
    "C5": 0x3AB571A9,
    "LOW": 0xC2AD0000,       # -86.5: inputs below give exp(-86.5) (results stay normal)
    "HIGH": 0x42AE0000,      # 87: inputs above give exp(87)
}
_C = {name: _f32_of_bits(bits) for name, bits in EXP_CONSTANT_BITS.items()}
# exp_f32's largest error in ulps of the float32 result against float64's exp
# on [-86.5, 87]: 1.0180 measured on all 2.2e9 float32 inputs there (at x =
# -5.1994; the evaluation order before the sixteenth session's: 1.0192);
# tests/test_swiglu_cpu.py checks every 97th
EXP_MAX_ULP = 1.02


def exp_f32(x: np.ndarray) -> np.ndarray:
    """``exp(x)`` for float32 ``x``, bit for bit what the kernels compute.

    The operation order (each step one rounding; ``fma(a, b, c)`` is
    ``a * b + c`` rounded once): ``x = fmin(fmax(x, LOW), HIGH)`` (a NaN
    becomes LOW), ``t = fma(x, LOG2E, SHIFTER)`` (the rounding picks ``n =
    rint(x * LOG2E)``, to nearest even, and leaves it in t's low mantissa
    bits), ``n = t - SHIFTER`` (exact), ``r = fma(n, -LN2_LO, fma(n, -LN2_HI,
    x))`` (the inner one exact), Horner to the end ``q = fma(fma(fma(fma(
    fma(C5, r, C4), r, C3), r, C2), r, C1), r, 1)``, ``m = fma(q, r, 1)``,
    result ``bits(m) + (bits(t) << 23)`` mod 2**32: ``n`` added to m's
    exponent field (``bits(SHIFTER) << 23`` is 0 mod 2**32; the clamp keeps
    the exponent in range, so this is ``m * 2**n`` exactly).
    """
    c = _C
    x = np.asarray(x, dtype=_F32)
    with np.errstate(all="ignore"):  # NaN is part of the contract
        # as CUDA's fminf(fmaxf(x, LOW), HIGH): a NaN x becomes LOW, so no NaN
        # (whose payload differs between CPUs and GPUs) reaches the bit add.
        # Spelled with isnan: NumPy's fmax lets signalling NaNs through.
        x = np.minimum(np.maximum(np.where(np.isnan(x), c["LOW"], x), c["LOW"]), c["HIGH"])
        t = fma_float32(x, c["LOG2E"], c["SHIFTER"])
        n = t - c["SHIFTER"]
        r = fma_float32(n, -c["LN2_HI"], x)
        r = fma_float32(n, -c["LN2_LO"], r)
        q = fma_float32(c["C5"], r, c["C4"])
        for name in ("C3", "C2", "C1"):
            q = fma_float32(q, r, c[name])
        q = fma_float32(q, r, _F32(1.0))
        m = fma_float32(q, r, _F32(1.0))
        bits = np.asarray(m).view(_U32) + (np.asarray(t).view(_U32) << _U32(23))
        return np.asarray(bits, dtype=_U32).view(_F32)


def silu_f32(gate: np.ndarray) -> np.ndarray:
    """``g * RN(1 / (1 + exp_f32(-g)))``: an add, an IEEE reciprocal (``1 + e``
    is in [1, 2**126) or NaN), a multiply."""
    gate = np.asarray(gate, dtype=_F32)
    with np.errstate(all="ignore"):
        return gate * (_F32(1.0) / (_F32(1.0) + exp_f32(-gate)))


def swiglu_f32(gate: np.ndarray, up: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """``(silu(gate) * up) * weight`` in float32, in that order (weight: a
    column broadcast over the row, or None for no weight)."""
    with np.errstate(all="ignore"):
        act = silu_f32(gate) * np.asarray(up, dtype=_F32)
        if weight is not None:
            act = act * np.asarray(weight, dtype=_F32)
        return act


def block_scales(amax: np.ndarray, *, round_sf: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(sf, scale)`` of blocks whose NaN-free ``|v|`` maximum is ``amax``.

    ``amax`` is floored at AMAX_FLOOR here. An infinite ``amax`` gives
    ``sf = +inf`` and ``scale = 0``.
    """
    amax = np.maximum(np.asarray(amax, dtype=_F32), AMAX_FLOOR)
    with np.errstate(all="ignore"):
        sf = amax / E4M3_MAX
        if round_sf:
            bits = (sf.view(_U32) + _U32(_ROUND_UP_MANTISSA)) & _U32(_EXPONENT_BITS)
            sf = bits.view(_F32)
            scale = _F32(1.0) / sf
        else:
            scale = E4M3_MAX / amax
    return sf, scale


def encode_e4m3(values: np.ndarray) -> np.ndarray:
    """float32 -> float8_e4m3fn bytes (uint8): clamped to [-448, 448], rounded
    to nearest even (ml_dtypes' conversion), every NaN to the code 0x7F."""
    with np.errstate(all="ignore"):  # NaN inputs are expected: no RuntimeWarning for them
        clamped = np.clip(np.asarray(values, dtype=_F32), -E4M3_MAX, E4M3_MAX)  # NaN stays
        codes = clamped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return np.where((codes & 0x7F) == 0x7F, np.uint8(E4M3_NAN), codes)


def ue8m0_bytes(sf: np.ndarray) -> np.ndarray:
    """The exponent byte of each (power-of-two or infinite) float32 scale
    factor: UE8M0's code, ``2**(byte - 127)``; +inf gives 0xFF (UE8M0's NaN)."""
    return ((np.asarray(sf, dtype=_F32).view(_U32) >> _U32(23)) & _U32(0xFF)).astype(np.uint8)
