"""The NumPy ``reduce_fused``: the CPU backend and the oracle of the GPU kernels.

Numerics (DeepSeek TileKernels' reduce_fused, bit for bit): per token ``t``,
slots in ``k`` order, a negative slot (or one >= X) skipped,

    s   = topk_weights[t, k] * row_scale[p]     one float32 multiply, rounded;
                                                a missing factor is 1 (s = w,
                                                s = row_scale[p], or s = 1)
    acc = fma(float32(expanded[p]), s, acc)     float32 fma, one rounding,
                                                acc starting from +0.0

and the result is ``acc`` rounded once to the input dtype (round to nearest
even, gradual underflow, overflow to +-inf), or, where a bf16 / fp16 call
is given a float32 ``out``, ``acc`` itself (the unrounded float32 sums).
``fma`` is emulated exactly by :func:`cupy_moe.combine.fma.fma_float32`. A
token with no used slot gives +0.0.

Special values follow IEEE float32 arithmetic: a NaN in a used row, weight or
scale gives NaN in the columns it reaches; +-inf gives +-inf, or NaN where it
meets the opposite infinity or a zero factor (inf * 0); a finite sum past
float32's range overflows to +-inf, and the final rounding to bf16 or fp16
may overflow too (fp16's largest finite value is 65504). Every NaN result is
the canonical NaN of its dtype (``CANONICAL_NAN_BITS``: the sign clear, every
significand bit set, as NVIDIA's float32 arithmetic and its conversions give
them): NaN payloads are not propagated, so that the kernels and this oracle
agree on every bit.

Vectorised over tokens and columns; the only Python loop is over the K slots
(and over blocks of tokens, which bound the float64 temporaries).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .fma import fma_float32
from .rules import ELEMENT_FORMAT

__all__ = ["CANONICAL_NAN_BITS", "reduce_fused_numpy"]

# Bits of the one NaN each dtype's result holds.
CANONICAL_NAN_BITS = {"f32": 0x7FFFFFFF, "bf16": 0x7FFF, "f16": 0x7FFF}
_FORMAT_DTYPE = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16),
                 "f16": np.dtype(np.float16)}
# Token rows per step: bounds the float64 temporaries of the fma to ~8 MB each.
_BLOCK_ELEMENTS = 1 << 20


def _as_float32(rows: np.ndarray, fmt: str) -> np.ndarray:
    """Rows of the input dtype as float32 (exact: bf16 and fp16 widen exactly)."""
    if rows.dtype.name == "uint16":
        rows = rows.view(ml_dtypes.bfloat16)
    return rows.astype(np.float32)


def _round_to_format(acc: np.ndarray, fmt: str) -> np.ndarray:
    """float32 -> the result dtype, rounded once; NaN made canonical."""
    with np.errstate(over="ignore", invalid="ignore"):
        result = acc.astype(_FORMAT_DTYPE[fmt])
    bits = result.view(f"u{result.itemsize}")
    bits[np.isnan(acc)] = CANONICAL_NAN_BITS[fmt]
    return result


def reduce_fused_numpy(expanded: np.ndarray, token_topk_to_pos: np.ndarray,
                       topk_weights: np.ndarray | None = None,
                       row_scale: np.ndarray | None = None,
                       out: np.ndarray | None = None) -> np.ndarray:
    """The ``[T, H]`` combine of ``expanded [X, H]`` (see the module's numerics).

    ``expanded``: bfloat16 (ml_dtypes), uint16 (bf16 bits), float16 or
    float32, any strides. ``token_topk_to_pos [T, K]`` int32;
    ``topk_weights [T, K]`` and ``row_scale [X]`` float32 or None. Slots >= X
    are skipped (never read). ``out``: a writeable ``[T, H]`` array of
    ``expanded``'s dtype, or float32 (the sums unrounded), written and
    returned; else a new C-contiguous array of ``expanded``'s dtype.
    """
    fmt = ELEMENT_FORMAT[expanded.dtype.name]
    num_expanded, hidden = expanded.shape
    num_tokens, top_k = token_topk_to_pos.shape
    if out is None:
        out = np.empty((num_tokens, hidden), dtype=expanded.dtype)
    out_format = ELEMENT_FORMAT[out.dtype.name]  # f32: the sums as they are
    out_fmt = out.view(_FORMAT_DTYPE[out_format]) if out.dtype.name == "uint16" else out
    block = max(1, _BLOCK_ELEMENTS // hidden)
    for first in range(0, num_tokens, block):
        tokens = slice(first, min(first + block, num_tokens))
        positions = np.asarray(token_topk_to_pos[tokens], dtype=np.int64)
        acc = np.zeros((positions.shape[0], hidden), dtype=np.float32)
        for k in range(top_k):
            p = positions[:, k]
            used = np.flatnonzero((p >= 0) & (p < num_expanded))
            if used.size == 0:
                continue
            rows = p[used]
            scale = _slot_scale(topk_weights, row_scale, first + used, k, rows)
            x = _as_float32(expanded[rows], fmt)
            acc[used] = fma_float32(x, scale[:, None], acc[used])
        out_fmt[tokens] = _round_to_format(acc, out_format)
    return out


def _slot_scale(topk_weights, row_scale, tokens: np.ndarray, k: int,
                rows: np.ndarray) -> np.ndarray:
    """``s`` of slot ``k`` of ``tokens`` (reading rows ``rows``), float32."""
    if topk_weights is None and row_scale is None:
        return np.ones(tokens.shape[0], dtype=np.float32)
    if row_scale is None:
        return np.asarray(topk_weights[tokens, k], dtype=np.float32)
    scale = np.asarray(row_scale[rows], dtype=np.float32)
    if topk_weights is None:
        return scale
    with np.errstate(all="ignore"):  # inf * 0 and overflow are IEEE results here
        return np.asarray(topk_weights[tokens, k], dtype=np.float32) * scale
