"""The NumPy implementation of the expand ops: the CPU backend and the oracle
of the GPU kernels.

Vectorised (no Python loop over tokens) and dtype-blind: rows are moved as
raw bytes, so every payload (bf16, fp8, packed fp4, float32 or UE8M0 scale
factors) is copied bit for bit, NaN encodings included.
"""

from __future__ import annotations

import numpy as np

from ..runtime.sizes import align_up
from .rules import ROUTING_ERROR_KINDS, SF_TOKEN_ALIGN

__all__ = [
    "scatter_rows",
    "expand_to_fused_numpy",
    "expand_to_fused_with_sf_numpy",
    "empty_sf_output",
    "find_routing_errors",
]


def _routing(token_topk_to_pos: np.ndarray, num_expanded: int) -> tuple[np.ndarray, np.ndarray]:
    """(destination rows, source tokens) of every slot that is written.

    A negative slot is dropped; a slot at or past X is skipped too (the kernels
    never write outside the output, whatever the map holds).
    """
    num_tokens, top_k = token_topk_to_pos.shape
    flat = token_topk_to_pos.reshape(-1).astype(np.int64)
    written = (flat >= 0) & (flat < num_expanded)
    source = np.repeat(np.arange(num_tokens, dtype=np.int64), top_k)
    return flat[written], source[written]


def scatter_rows(src: np.ndarray, token_topk_to_pos: np.ndarray,
                 pos_to_expert: np.ndarray, out: np.ndarray, *,
                 zero_padding: bool = True) -> np.ndarray:
    """``out[p] = src[t]`` for each slot ``(t, k) -> p``; other rows zero.

    ``out`` is ``[X, C]`` with any strides (the column-major SF view too);
    ``src`` is ``[T, C]``. Every expert row (``pos_to_expert >= 0``) of
    ``out`` is written; rows no slot targets become zero. Padding rows
    (``pos_to_expert < 0``) become zero, or with ``zero_padding=False`` are
    not written at all, even where a malformed map targets them.
    """
    dest, source = _routing(token_topk_to_pos, out.shape[0])
    # Same-size unsigned views keep the copy bit-exact for float payloads (NaN
    # encodings, negative zero) and work on strided outputs too.
    carrier = np.dtype(f"u{out.dtype.itemsize}")
    out_bits, src_bits = out.view(carrier), src.view(carrier)
    if zero_padding:
        out_bits[...] = 0
        out_bits[dest] = src_bits[source]
        # Padding rows are zero even when a malformed map targets them.
        out_bits[pos_to_expert < 0] = 0
        return out
    expert_rows = pos_to_expert >= 0
    out_bits[expert_rows] = 0
    to_expert_row = expert_rows[dest]
    out_bits[dest[to_expert_row]] = src_bits[source[to_expert_row]]
    return out


def expand_to_fused_numpy(x: np.ndarray, token_topk_to_pos: np.ndarray,
                          pos_to_expert: np.ndarray, out: np.ndarray | None = None, *,
                          zero_padding: bool = True) -> np.ndarray:
    """``[X, H]`` rows of ``x`` in expert-major order (see the public op).

    With ``zero_padding=False`` padding rows keep what ``out`` held (np.empty's
    bytes when ``out`` is None): as the oracle of the kernels, a poisoned
    ``out`` makes the whole expected array exact, padding rows included.
    """
    x = np.ascontiguousarray(x)
    if out is None:
        out = np.empty((pos_to_expert.shape[0], x.shape[1]), dtype=x.dtype)
    return scatter_rows(x, token_topk_to_pos, pos_to_expert, out, zero_padding=zero_padding)


def empty_sf_output(num_expanded: int, sf_columns: int, dtype, *,
                    col_major: bool) -> tuple[np.ndarray, np.ndarray]:
    """(buffer, view) of an ``[X, S]`` SF output.

    Row-major: both are one ``[X, S]`` array. Column-major: the buffer is an
    ``[S, align(X, 4)]`` array whose pad columns are zero and the view is the
    transpose of its first X columns. Nothing else is initialised.
    """
    if col_major:
        buffer = np.empty((sf_columns, align_up(num_expanded, SF_TOKEN_ALIGN)), dtype=dtype)
        buffer[:, num_expanded:] = 0
        return buffer, buffer[:, :num_expanded].T
    buffer = np.empty((num_expanded, sf_columns), dtype=dtype)
    return buffer, buffer


def expand_to_fused_with_sf_numpy(
    x: np.ndarray, x_sf: np.ndarray, token_topk_to_pos: np.ndarray, pos_to_expert: np.ndarray,
    *, col_major: bool, out: np.ndarray | None = None, out_sf: np.ndarray | None = None,
    zero_padding: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows and their scale factors in expert-major order (see the public op).

    A caller's column-major ``out_sf`` must be a view into a buffer that holds
    the pad columns; the caller (the public op) has checked that. The pad
    columns are zeroed whatever ``zero_padding`` says: they are not padding
    rows' scale factors, which follow their data rows.
    """
    out = expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert, out,
                                zero_padding=zero_padding)
    x_sf = np.ascontiguousarray(x_sf)
    if out_sf is None:
        _, out_sf = empty_sf_output(pos_to_expert.shape[0], x_sf.shape[1], x_sf.dtype,
                                    col_major=col_major)
    elif col_major:
        _zero_pad_columns(out_sf)
    scatter_rows(x_sf, token_topk_to_pos, pos_to_expert, out_sf, zero_padding=zero_padding)
    return out, out_sf


def _zero_pad_columns(out_sf: np.ndarray) -> None:
    """Zero columns X .. align(X, 4) of the buffer behind a column-major view."""
    num_expanded, sf_cols = out_sf.shape
    pad = align_up(num_expanded, SF_TOKEN_ALIGN) - num_expanded
    if pad == 0 or sf_cols == 0:
        return
    leading = out_sf.strides[1] if sf_cols > 1 else (num_expanded + pad) * out_sf.itemsize
    padded = np.lib.stride_tricks.as_strided(
        out_sf, shape=(num_expanded + pad, sf_cols), strides=(out_sf.itemsize, leading))
    padded[num_expanded:] = 0


def find_routing_errors(token_topk_to_pos: np.ndarray, pos_to_expert: np.ndarray,
                        pos_to_token: np.ndarray | None = None) -> dict[str, int]:
    """First offending index of each kind of malformed map, -1 where none.

    Kinds, by flat index into ``token_topk_to_pos``: ``out_of_range`` (slot >=
    X), ``padding_target`` (slot names a row with ``pos_to_expert < 0``),
    ``duplicate`` (slot repeats the row of an earlier slot); by row of
    ``pos_to_expert``: ``untargeted`` (expert row no slot names); and, given
    ``pos_to_token``, by flat index: ``wrong_token`` (slot ``t*K + k`` whose
    row's ``pos_to_token`` is not ``t``).
    """
    num_expanded = pos_to_expert.shape[0]
    flat = token_topk_to_pos.reshape(-1).astype(np.int64)
    in_range = (flat >= 0) & (flat < num_expanded)
    in_range_idx = np.flatnonzero(in_range)
    rows = flat[in_range_idx]

    def first(indices: np.ndarray) -> int:
        return int(indices.min()) if indices.size else -1

    found = dict.fromkeys(ROUTING_ERROR_KINDS, -1)
    found["out_of_range"] = first(np.flatnonzero(flat >= num_expanded))
    found["padding_target"] = first(in_range_idx[pos_to_expert[rows] < 0])
    # np.unique's return_index is the first occurrence; every other one repeats.
    _, first_seen = np.unique(rows, return_index=True)
    repeated = np.ones(rows.shape[0], dtype=bool)
    repeated[first_seen] = False
    found["duplicate"] = first(in_range_idx[repeated])
    targeted = np.zeros(num_expanded, dtype=bool)
    targeted[rows] = True
    found["untargeted"] = first(np.flatnonzero((pos_to_expert >= 0) & ~targeted))
    if pos_to_token is not None:
        tokens = in_range_idx // max(token_topk_to_pos.shape[1], 1)
        found["wrong_token"] = first(in_range_idx[pos_to_token[rows] != tokens])
    assert tuple(found) == ROUTING_ERROR_KINDS
    return found
