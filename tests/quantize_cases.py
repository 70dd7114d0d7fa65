"""Shared pieces of the quantize / swiglu tests (no tests of its own; named to
sit with the family's test files): an independent scalar reference, input
generators with the hard cases, and the expected scale-factor buffers.

The scalar reference is written from the contract, not from
``cupy_moe.quantize``: a loop over blocks and values, NumPy float32 scalars
for the IEEE operations, and e4m3 rounding by search over the 255 decoded
codes (ties to the even code). It shares nothing with the code under test but
``numerics.exp_f32`` (the defined exp of the swiglu activation, whose accuracy
its own test bounds).
"""

from __future__ import annotations

import bisect
import math

import ml_dtypes
import numpy as np

from cupy_moe.quantize.numerics import exp_f32

F32 = np.float32
E4M3_MAX_VALUE = 448.0

# (packed_ue8m0, use_tma_aligned_col_major_sf, round_sf): every accepted setting
LAYOUTS = {
    "row-f32": (False, False, False),
    "row-f32-round": (False, False, True),
    "col-f32": (False, True, False),
    "col-f32-round": (False, True, True),
    "col-ue8m0": (True, True, True),
}


def decode_e4m3(code: int) -> float:
    """The value of an e4m3fn code, from its bits (NaN for S.1111.111)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


# finite magnitudes in code order: code c (0 .. 0x7E) has value E4M3_MAGNITUDES[c]
E4M3_MAGNITUDES = [decode_e4m3(c) for c in range(0x7F)]


def scalar_e4m3(value: float) -> int:
    """The e4m3fn code of one float: NaN -> 0x7F; clamped to +-448; nearest
    magnitude, ties to the even code; the sign bit kept (also for zero)."""
    if math.isnan(value):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, value) < 0 else 0
    magnitude = min(abs(value), E4M3_MAX_VALUE)
    above = bisect.bisect_left(E4M3_MAGNITUDES, magnitude)  # magnitudes ascend with codes
    if E4M3_MAGNITUDES[above] == magnitude:
        return sign | above
    below = above - 1
    gap_below = magnitude - E4M3_MAGNITUDES[below]
    gap_above = E4M3_MAGNITUDES[above] - magnitude
    if gap_below != gap_above:
        return sign | (below if gap_below < gap_above else above)
    return sign | (below if below % 2 == 0 else above)


def f32_bits(value) -> int:
    return int(np.array(value, dtype=F32).view(np.uint32))


def f32_of_bits(bits: int) -> np.float32:
    return np.array(bits & 0xFFFFFFFF, dtype=np.uint32).view(F32)[()]


def scalar_scales(block: list, round_sf: bool) -> tuple[np.float32, np.float32]:
    """(sf, scale) of one block of float32 values, from the contract."""
    amax = F32(0.0)
    for v in block:
        if not math.isnan(float(v)) and abs(float(v)) > float(amax):
            amax = F32(abs(v))
    amax = max(amax, F32(1e-4))
    with np.errstate(all="ignore"):
        sf = F32(amax) / F32(448.0)
        if round_sf:
            sf = f32_of_bits((f32_bits(sf) + 0x7FFFFF) & 0x7F800000)
            scale = F32(1.0) / sf
        else:
            scale = F32(448.0) / F32(amax)
    return sf, scale


def scalar_quantize(values: np.ndarray, num_per_channels: int, round_sf: bool,
                    zero_rows=None) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 [R, H], sf float32 [R, S]) of float32 ``values`` by loops."""
    num_rows, hidden = values.shape
    blocks = -(-hidden // num_per_channels)
    codes = np.zeros((num_rows, hidden), dtype=np.uint8)
    sfs = np.zeros((num_rows, blocks), dtype=F32)
    for r in range(num_rows):
        if zero_rows is not None and zero_rows[r]:
            continue
        for b in range(blocks):
            lo, hi = b * num_per_channels, min(hidden, (b + 1) * num_per_channels)
            block = [F32(v) for v in values[r, lo:hi]]
            sf, scale = scalar_scales(block, round_sf)
            sfs[r, b] = sf
            for j, v in enumerate(block):
                with np.errstate(all="ignore"):
                    codes[r, lo + j] = scalar_e4m3(float(F32(v) * scale))
    return codes, sfs


def scalar_swiglu(h: np.ndarray, weights=None, pos_to_token_topk=None,
                  pos_to_expert=None) -> tuple[np.ndarray, np.ndarray]:
    """(activations float32 [X, I], padding bool [X]) by loops: silu(g) = g *
    RN(1 / (1 + exp_f32(-g))), then * up, then * weight."""
    num_rows, width = h.shape
    inter = width // 2
    act = np.zeros((num_rows, inter), dtype=F32)
    padding = np.zeros(num_rows, dtype=bool)
    flat = None if weights is None else np.asarray(weights, dtype=F32).reshape(-1)
    for p in range(num_rows):
        weight = None
        if pos_to_expert is not None and pos_to_expert[p] < 0:
            padding[p] = True
        if flat is not None:
            slot = int(pos_to_token_topk[p])
            if slot < 0 or slot >= flat.shape[0]:
                padding[p] = True
            else:
                weight = flat[slot]
        if padding[p]:
            continue
        for j in range(inter):
            g, u = F32(h[p, j]), F32(h[p, inter + j])
            with np.errstate(all="ignore"):
                e = F32(exp_f32(np.array([-g], dtype=F32))[0])
                recip = F32(1.0) / (F32(1.0) + e)
                a = (g * recip) * u
                if weight is not None:
                    a = a * weight
            act[p, j] = a
    return act, padding


def pack_words(sf: np.ndarray) -> np.ndarray:
    """int32 [R, ceil(S / 4)] UE8M0 words of power-of-two float32 ``sf`` by loops."""
    num_rows, blocks = sf.shape
    words = np.zeros((num_rows, -(-blocks // 4)), dtype=np.uint32)
    for r in range(num_rows):
        for b in range(blocks):
            exponent = (f32_bits(sf[r, b]) >> 23) & 0xFF
            words[r, b // 4] |= np.uint32(exponent << (8 * (b % 4)))
    return words.view(np.int32)


def expected_sf_buffer(sf: np.ndarray, *, packed: bool, col_major: bool) -> np.ndarray:
    """The whole SF buffer the ops must leave: row-major ``[R, S]``, or
    column-major ``[S, align(R, 4)]`` with zero pad columns."""
    values = pack_words(sf) if packed else sf
    if not col_major:
        return values
    num_rows, columns = values.shape
    buffer = np.zeros((columns, -(-num_rows // 4) * 4), dtype=values.dtype)
    buffer[:, :num_rows] = values.T
    return buffer


def sf_buffer_of(out_sf: np.ndarray, *, col_major: bool) -> np.ndarray:
    """The buffer behind a NumPy SF output (the pad columns too)."""
    if not col_major:
        return out_sf
    num_rows, columns = out_sf.shape
    ld = -(-num_rows // 4) * 4
    return np.lib.stride_tricks.as_strided(out_sf, shape=(columns, ld),
                                           strides=(ld * out_sf.itemsize, out_sf.itemsize))


# -- inputs ------------------------------------------------------------------------

SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e-42, 1e-45,
                     448.0, -448.0, 464.0, 1e38, -3.3e38, 1e-4, 9.9e-5], dtype=F32)


def e4m3_midpoints() -> np.ndarray:
    """Magnitudes halfway between neighbouring e4m3 codes (ties of the rounding)
    and the codes' own values."""
    values = np.array(E4M3_MAGNITUDES, dtype=np.float64)
    return np.concatenate([(values[:-1] + values[1:]) / 2, values]).astype(F32)


def block_values(rng: np.random.Generator, size: int, kind: str) -> np.ndarray:
    """``size`` float32 values of one block of a given kind of hard case."""
    if kind == "normal":
        return (rng.standard_normal(size) * 10.0 ** rng.uniform(-8, 8)).astype(F32)
    if kind == "ties":
        # block max 448 * 2^-k: scale is exactly 2^k (both rounding modes), so
        # midpoints * 2^-k land exactly on e4m3 ties
        k = int(rng.integers(-20, 21))
        values = rng.choice(e4m3_midpoints(), size) * rng.choice([-1, 1], size)
        values[rng.integers(size)] = 448.0
        return (values * 2.0**-k).astype(F32)
    if kind == "tiny":  # amax below the 1e-4 floor
        return (rng.standard_normal(size) * 10.0 ** rng.uniform(-12, -5)).astype(F32)
    if kind == "near-max":  # values that scale to just below / at 448
        amax = 10.0 ** rng.uniform(-3, 3)
        return (amax * rng.choice([1, -1], size) * (1 - rng.uniform(0, 0.05, size))).astype(F32)
    if kind == "zeros":
        return np.zeros(size, dtype=F32)
    if kind == "special":
        values = (rng.standard_normal(size)).astype(F32)
        where = rng.random(size) < 0.3
        values[where] = rng.choice(SPECIALS, int(where.sum()))
        return values
    if kind == "nan":  # finite values and a few NaN, no infinity
        values = rng.standard_normal(size).astype(F32)
        values[rng.random(size) < 0.2] = np.nan
        return values
    if kind == "denormal":  # float32 denormals (and tiny normals)
        return (rng.standard_normal(size) * 1e-39).astype(F32)
    raise ValueError(kind)


BLOCK_KINDS = ("normal", "ties", "tiny", "near-max", "zeros", "special", "nan", "denormal")


def hard_rows(rng: np.random.Generator, num_rows: int, hidden: int,
              num_per_channels: int, kinds=BLOCK_KINDS) -> np.ndarray:
    """float32 [R, H]: every block of a random kind of hard case."""
    rows = np.zeros((num_rows, hidden), dtype=F32)
    for r in range(num_rows):
        for lo in range(0, hidden, num_per_channels):
            hi = min(hidden, lo + num_per_channels)
            rows[r, lo:hi] = block_values(rng, hi - lo, str(rng.choice(kinds)))
    return rows


def as_input_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as the op's input dtype: float32, ml_dtypes bfloat16
    (rounded), or uint16 holding those bfloat16 bits."""
    if dtype == "float32":
        return values.astype(F32)
    with np.errstate(invalid="ignore"):  # NaN converts to a bfloat16 NaN: wanted
        bf16 = values.astype(ml_dtypes.bfloat16)
    return bf16.view(np.uint16) if dtype == "uint16" else bf16


def float_values(x: np.ndarray) -> np.ndarray:
    """float32 of an input array (bf16 bits in uint16 included), exactly."""
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(F32)
    return x.astype(F32)
