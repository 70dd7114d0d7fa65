"""The NumPy implementation of the quantize ops: the CPU backend and the oracle
of the kernels in kernels_cu/quantize.cu.

Vectorised over rows and blocks (no Python loop over tokens); every float32
step is that of ``numerics``, so the kernels' results are these bits.
Scale factors come out in the layouts ``expand_to_fused_with_sf`` takes as
``x_sf``: float32 row-major ``[R, S]``; float32 or packed UE8M0 int32
column-major, the transposed view of an ``[S, align(R, 4)]`` buffer whose pad
columns are zero.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np

from ..expand.reference import empty_sf_output
from ..expand.rules import SF_TOKEN_ALIGN, UE8M0_PER_INT32
from ..runtime.sizes import align_up, ceil_div
from .numerics import block_scales, encode_e4m3, swiglu_f32, ue8m0_bytes

__all__ = [
    "as_float32",
    "dequantize_fp8_numpy",
    "pack_ue8m0",
    "quantize_fp8_numpy",
    "quantize_values_numpy",
    "swiglu_quantize_fp8_numpy",
    "swiglu_values_numpy",
    "write_sf",
]

# elements of one thread's share of the SwiGLU activations (swiglu_values_numpy)
_CHUNK_ELEMENTS = 1 << 18


def as_float32(x: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 (ml_dtypes, or uint16 bits) or float32 input (exact)."""
    x = np.asarray(x)
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return x.astype(np.float32)


def quantize_values_numpy(values: np.ndarray, *, num_per_channels: int, round_sf: bool,
                          zero_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-row, per-block e4m3 codes of float32 ``values [R, H]``.

    Returns ``(codes uint8 [R, H], sf float32 [R, S])``, ``S = ceil(H / npc)``;
    the last block of a row may be partial (its amax is over the columns that
    exist). Rows set in ``zero_rows [R]`` get zero codes and a zero scale factor.
    """
    num_rows, hidden = values.shape
    blocks = ceil_div(hidden, num_per_channels)
    padded = np.zeros((num_rows, blocks * num_per_channels), dtype=np.float32)
    padded[:, :hidden] = values
    padded = padded.reshape(num_rows, blocks, num_per_channels)
    # NaN does not count, as in the kernels' fmaxf (written with isnan: NumPy's
    # fmax lets signalling NaNs through); an all-NaN block has amax 0 (floored
    # later)
    magnitudes = np.abs(padded)
    magnitudes[np.isnan(magnitudes)] = 0
    amax = np.max(magnitudes, axis=2, initial=np.float32(0.0))
    sf, scale = block_scales(amax, round_sf=round_sf)
    with np.errstate(all="ignore"):  # inf * 0 is NaN by contract
        scaled = padded * scale[:, :, None]
    codes = encode_e4m3(scaled).reshape(num_rows, blocks * num_per_channels)[:, :hidden]
    if zero_rows is not None:
        codes[zero_rows] = 0
        sf[zero_rows] = 0
    return codes, sf


def pack_ue8m0(sf: np.ndarray) -> np.ndarray:
    """``[R, S]`` power-of-two float32 scale factors -> ``[R, ceil(S / 4)]`` int32
    words: byte j of word w (little-endian) is block 4w + j's exponent byte;
    the pad blocks of the last word are 0. A zero scale factor is byte 0."""
    num_rows, blocks = sf.shape
    words = ceil_div(blocks, UE8M0_PER_INT32)
    codes = np.zeros((num_rows, words * UE8M0_PER_INT32), dtype=np.uint32)
    codes[:, :blocks] = ue8m0_bytes(sf)
    codes = codes.reshape(num_rows, words, UE8M0_PER_INT32)
    packed = codes[:, :, 0] | codes[:, :, 1] << 8 | codes[:, :, 2] << 16 | codes[:, :, 3] << 24
    return packed.astype(np.uint32).view(np.int32)


def write_sf(out_sf: np.ndarray, values: np.ndarray, *, col_major: bool,
             rows: np.ndarray | None = None) -> np.ndarray:
    """Store ``values [R, S]`` into ``out_sf`` (any view of the layout; only
    the rows where the bool ``rows [R]`` is True, when given) and, for the
    column-major layout, zero the pad columns R .. align(R, 4) of the buffer
    behind the view (the caller made sure it holds them)."""
    if rows is None:
        out_sf[...] = values
    else:
        out_sf[rows] = values[rows]
    if col_major:
        num_rows, columns = out_sf.shape
        pad = align_up(num_rows, SF_TOKEN_ALIGN) - num_rows
        if pad and columns:
            leading = (out_sf.strides[1] if columns > 1
                       else (num_rows + pad) * out_sf.itemsize)
            full = np.lib.stride_tricks.as_strided(
                out_sf, shape=(num_rows + pad, columns), strides=(out_sf.itemsize, leading))
            full[num_rows:] = 0
    return out_sf


def _finish(codes: np.ndarray, sf: np.ndarray, *, packed_ue8m0: bool, col_major: bool,
            out: np.ndarray | None, out_sf: np.ndarray | None,
            rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Codes and scale factors into the outputs (fresh ones when None); only
    the rows where the bool ``rows [R]`` is True, when given (the others keep
    what the outputs held; the column-major pad columns are zeroed anyway)."""
    if out is None:
        out = np.empty(codes.shape, dtype=ml_dtypes.float8_e4m3fn)
    if rows is None:
        out.view(np.uint8)[...] = codes
    else:
        out.view(np.uint8)[rows] = codes[rows]
    values = pack_ue8m0(sf) if packed_ue8m0 else sf
    if out_sf is None:
        _, out_sf = empty_sf_output(values.shape[0], values.shape[1], values.dtype,
                                    col_major=col_major)
    write_sf(out_sf, values, col_major=col_major, rows=rows)
    return out, out_sf


def quantize_fp8_numpy(x: np.ndarray, *, num_per_channels: int = 128, round_sf: bool = False,
                       packed_ue8m0: bool = False, use_tma_aligned_col_major_sf: bool = False,
                       out: np.ndarray | None = None,
                       out_sf: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_fp8`` of ``x [T, H]`` (bfloat16, uint16 bf16 bits or float32).

    Returns ``(x_fp8 [T, H] float8_e4m3fn, x_sf [T, S])`` (or writes and returns
    the given ``out`` / ``out_sf``); the arguments are not checked here (the
    public op does that).
    """
    codes, sf = quantize_values_numpy(as_float32(x), num_per_channels=num_per_channels,
                                      round_sf=round_sf)
    return _finish(codes, sf, packed_ue8m0=packed_ue8m0, col_major=use_tma_aligned_col_major_sf,
                   out=out, out_sf=out_sf)


def swiglu_padding_rows(num_rows: int, *, pos_to_expert: np.ndarray | None = None,
                        pos_to_token_topk: np.ndarray | None = None,
                        num_slots: int | None = None) -> np.ndarray:
    """The rows ``swiglu_quantize_fp8`` treats as padding (bool ``[X]``):
    ``pos_to_expert[p] < 0`` where given, or, where ``pos_to_token_topk`` is
    given (with weights: ``num_slots`` = T * K), a slot outside ``[0, T * K)``.
    The kernels' rule; the oracle, ``validate=True`` and the bench's check of
    unzeroed results all take it from here."""
    padding = np.zeros(num_rows, dtype=bool)
    if pos_to_expert is not None:
        padding |= np.asarray(pos_to_expert) < 0
    if pos_to_token_topk is not None:
        slots = np.asarray(pos_to_token_topk).astype(np.int64)
        padding |= (slots < 0) | (slots >= num_slots)
    return padding


def swiglu_values_numpy(h: np.ndarray, *, topk_weights: np.ndarray | None = None,
                        pos_to_token_topk: np.ndarray | None = None,
                        pos_to_expert: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The float32 activations ``[X, I]`` of ``h = [gate | up]`` and the rows
    that are padding (bool ``[X]``).

    Row p is padding when ``pos_to_expert[p] < 0``, or, with weights, when
    ``pos_to_token_topk[p]`` is outside ``[0, T * K)``; its activations are
    then 0 (its inputs are not used). Else ``act = (silu(gate) * up) * w``,
    ``w = topk_weights.flat[pos_to_token_topk[p]]`` (no factor without weights).
    """
    values = as_float32(h)
    num_rows, width = values.shape
    inter = width // 2
    weight = None
    if topk_weights is not None:
        flat = np.ascontiguousarray(topk_weights, dtype=np.float32).reshape(-1)
        padding = swiglu_padding_rows(num_rows, pos_to_expert=pos_to_expert,
                                      pos_to_token_topk=pos_to_token_topk,
                                      num_slots=flat.shape[0])
        slots = np.asarray(pos_to_token_topk).astype(np.int64)
        weight = flat[np.where(padding, 0, slots)] if flat.shape[0] else np.zeros(
            num_rows, dtype=np.float32)
        weight = weight[:, None]
    else:
        padding = swiglu_padding_rows(num_rows, pos_to_expert=pos_to_expert)
    # only the live rows' arithmetic (a decode plan's rows are mostly
    # padding), in row chunks on threads: NumPy's ufuncs release the GIL, and
    # exp_f32's exact fma emulation costs ~100 float64 operations an element
    act = np.zeros((num_rows, inter), dtype=np.float32)
    live = np.flatnonzero(~padding)
    step = max(1, _CHUNK_ELEMENTS // max(inter, 1))

    def run(first: int) -> None:
        rows = live[first:first + step]
        act[rows] = swiglu_f32(values[rows, :inter], values[rows, inter:],
                               None if weight is None else weight[rows])

    starts = range(0, live.size, step)
    if len(starts) <= 1:
        for first in starts:
            run(first)
    else:
        with ThreadPoolExecutor(max_workers=min(len(starts), os.cpu_count() or 1)) as pool:
            list(pool.map(run, starts))
    return act, padding


def swiglu_quantize_fp8_numpy(h: np.ndarray, *, num_per_channels: int = 128,
                              topk_weights: np.ndarray | None = None,
                              pos_to_token_topk: np.ndarray | None = None,
                              pos_to_expert: np.ndarray | None = None, round_sf: bool = False,
                              packed_ue8m0: bool = False,
                              use_tma_aligned_col_major_sf: bool = False,
                              out: np.ndarray | None = None,
                              out_sf: np.ndarray | None = None,
                              zero_padding: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``swiglu_quantize_fp8`` of ``h [X, 2I]``: the activations of
    ``swiglu_values_numpy`` quantized as ``quantize_fp8`` does; padding rows
    get zero codes and zero scale factors, or with ``zero_padding=False`` are
    not written (fresh outputs: np.empty's contents)."""
    act, padding = swiglu_values_numpy(h, topk_weights=topk_weights,
                                       pos_to_token_topk=pos_to_token_topk,
                                       pos_to_expert=pos_to_expert)
    codes, sf = quantize_values_numpy(act, num_per_channels=num_per_channels, round_sf=round_sf,
                                      zero_rows=padding)
    return _finish(codes, sf, packed_ue8m0=packed_ue8m0, col_major=use_tma_aligned_col_major_sf,
                   out=out, out_sf=out_sf, rows=None if zero_padding else ~padding)


def dequantize_fp8_numpy(x_fp8: np.ndarray, x_sf: np.ndarray, *,
                         num_per_channels: int) -> np.ndarray:
    """float32 ``q * sf`` of e4m3 codes ``[R, H]`` (float8_e4m3fn or uint8) and
    their scale factors ``[R, S]`` (float32, or packed UE8M0 int32: byte b is
    ``2**(b - 127)``, 0xFF NaN; any layout). One float32 multiply per element."""
    codes = np.ascontiguousarray(x_fp8).view(np.uint8)
    num_rows, hidden = codes.shape
    blocks = ceil_div(hidden, num_per_channels)
    x_sf = np.ascontiguousarray(x_sf)
    if x_sf.dtype == np.int32:
        words = x_sf.view(np.uint32)
        exponents = np.stack([(words >> np.uint32(8 * j)) & np.uint32(0xFF)
                              for j in range(UE8M0_PER_INT32)], axis=2)
        exponents = exponents.reshape(num_rows, -1)[:, :blocks]
        # 2**(e - 127) is exact in float32 for every e < 255 (e = 0: a subnormal)
        sf = np.ldexp(1.0, np.minimum(exponents, 254).astype(np.int64) - 127).astype(np.float32)
        sf = np.where(exponents == 0xFF, np.float32(np.nan), sf)  # UE8M0's NaN
    else:
        sf = x_sf.astype(np.float32)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    per_column = np.repeat(sf, num_per_channels, axis=1)[:, :hidden]
    with np.errstate(all="ignore"):
        return values * per_column
