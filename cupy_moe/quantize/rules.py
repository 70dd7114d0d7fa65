"""Shape, dtype and setting rules of the quantize ops, and their error messages.

Rules read ``ArrayDesc`` tuples, so every array kind shares one set of rules
and one wording of each error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..expand.rules import SF_TOKEN_ALIGN, SUPPORTED_NUM_PER_CHANNELS, sf_columns
from ..runtime.arrays import ArrayDesc
from ..runtime.rules import check_dtype, check_ndim
from ..runtime.sizes import align_up, ceil_div
from .reference import swiglu_padding_rows

# bfloat16 (uint16 carries its bits where an array library has none) or float32
QUANTIZE_IN_DTYPES = ("bfloat16", "float32", "uint16")
# e4m3 codes: the native fp8 dtype, or their bytes (CuPy has no fp8 dtype)
FP8_OUT_DTYPES = ("float8_e4m3fn", "uint8")
WEIGHT_DTYPE = "float32"
MAP_DTYPE = "int32"
# column offsets in the kernels are 32-bit
MAX_HIDDEN = 1 << 30


@dataclass(frozen=True)
class QuantizeProblem:
    """Sizes and settings of one call, after every rule has been checked.

    ``num_rows`` is R (T for ``quantize_fp8``, X for ``swiglu_quantize_fp8``),
    ``hidden`` the columns of the fp8 output (H, or I). ``num_weights`` is
    T * K when ``topk_weights`` is given, else -1. ``zero_padding`` (swiglu):
    whether padding rows are written (zeros) or left as they are.
    ``has_token_topk_to_pos`` (swiglu): the call passed the slots' rows
    (with weights, so T * K is ``num_weights``).
    """

    num_rows: int
    hidden: int
    in_dtype: str
    num_per_channels: int
    round_sf: bool
    packed_ue8m0: bool
    col_major: bool
    swiglu: bool = False
    num_weights: int = -1
    has_pos_to_expert: bool = False
    zero_padding: bool = True
    has_token_topk_to_pos: bool = False

    @property
    def sf_blocks(self) -> int:
        """Scale-factor blocks per row, ``ceil(H / npc)``."""
        return ceil_div(self.hidden, self.num_per_channels)

    @property
    def sf_columns(self) -> int:
        """S, the columns of the SF output (packed: ``ceil(blocks / 4)`` words)."""
        return sf_columns(self.hidden, self.num_per_channels, packed_ue8m0=self.packed_ue8m0)

    @property
    def sf_dtype(self) -> str:
        return "int32" if self.packed_ue8m0 else "float32"

    @property
    def sf_leading_dim(self) -> int:
        """Columns of the column-major SF buffer, ``align(R, 4)``."""
        return align_up(self.num_rows, SF_TOKEN_ALIGN)

    def out_shape(self) -> tuple[int, int]:
        return (self.num_rows, self.hidden)

    def out_sf_shape(self) -> tuple[int, int]:
        return (self.num_rows, self.sf_columns)

    def out_sf_strides(self) -> tuple[int, int]:
        """Element strides of the SF output: row-major, or the TMA column-major view."""
        return (1, self.sf_leading_dim) if self.col_major else (self.sf_columns, 1)

    def out_sf_layout(self) -> str:
        if self.col_major:
            return (f"the transposed view of an [S, align(R, 4)] = [{self.sf_columns}, "
                    f"{self.sf_leading_dim}] buffer")
        return "C-contiguous"

    def out_sf_buffer_bytes(self) -> int:
        """Bytes from the SF output's first element that the ops write
        (column-major: the pad columns R .. align(R, 4) too)."""
        if self.col_major:
            return self.sf_columns * self.sf_leading_dim * 4
        return self.num_rows * self.sf_columns * 4


def check_settings(num_per_channels: int, round_sf: bool, packed_ue8m0: bool,
                   col_major: bool) -> None:
    if num_per_channels not in SUPPORTED_NUM_PER_CHANNELS:
        raise ValueError(f"unsupported num_per_channels={num_per_channels!r}; "
                         f"must be one of {SUPPORTED_NUM_PER_CHANNELS}")
    if packed_ue8m0 and not round_sf:
        raise ValueError("packed_ue8m0=True needs round_sf=True: a UE8M0 scale factor is a "
                         "power of two")
    if packed_ue8m0 and not col_major:
        raise ValueError("packed_ue8m0=True needs use_tma_aligned_col_major_sf=True: packed "
                         "UE8M0 scale factors are only laid out column-major")


def _check_width(name: str, desc: ArrayDesc, hidden: int, what: str) -> None:
    if hidden < 1:
        raise ValueError(f"{name} must have {what} >= 1; got shape {tuple(desc.shape)}")
    if hidden > MAX_HIDDEN:
        raise ValueError(f"{name} must have {what} <= {MAX_HIDDEN}; got shape "
                         f"{tuple(desc.shape)}")


def check_quantize(x: ArrayDesc, *, num_per_channels: int, round_sf: bool, packed_ue8m0: bool,
                   col_major: bool) -> QuantizeProblem:
    """Rules of ``quantize_fp8``; returns the call's sizes."""
    check_settings(num_per_channels, round_sf, packed_ue8m0, col_major)
    check_ndim("x", x, 2, "[T, H]")
    check_dtype("x", x, QUANTIZE_IN_DTYPES)
    num_tokens, hidden = x.shape
    _check_width("x", x, hidden, "H = x.shape[1]")
    return QuantizeProblem(num_tokens, hidden, x.dtype, num_per_channels, round_sf,
                           packed_ue8m0, col_major)


def check_swiglu(h: ArrayDesc, topk_weights: ArrayDesc | None,
                 pos_to_token_topk: ArrayDesc | None, pos_to_expert: ArrayDesc | None, *,
                 num_per_channels: int, round_sf: bool, packed_ue8m0: bool,
                 col_major: bool, zero_padding: bool = True,
                 token_topk_to_pos: ArrayDesc | None = None) -> QuantizeProblem:
    """Rules of ``swiglu_quantize_fp8``; returns the call's sizes."""
    check_settings(num_per_channels, round_sf, packed_ue8m0, col_major)
    check_ndim("h", h, 2, "[X, 2I]")
    check_dtype("h", h, QUANTIZE_IN_DTYPES)
    num_rows, width = h.shape
    if width % 2:
        raise ValueError(f"h must have an even number of columns 2I (gate | up); got shape "
                         f"{tuple(h.shape)}")
    _check_width("h", h, width // 2, "I = h.shape[1] / 2")
    if (topk_weights is None) != (pos_to_token_topk is None):
        given, missing = (("topk_weights", "pos_to_token_topk") if pos_to_token_topk is None
                          else ("pos_to_token_topk", "topk_weights"))
        raise ValueError(f"{given} is given but {missing} is not: topk_weights [T, K] and "
                         "pos_to_token_topk [X] go together (row p is weighted by "
                         "topk_weights.flat[pos_to_token_topk[p]])")
    num_weights = -1
    if topk_weights is not None:
        check_ndim("topk_weights", topk_weights, 2, "[T, K]")
        check_dtype("topk_weights", topk_weights, (WEIGHT_DTYPE,))
        if topk_weights.shape[1] < 1:
            raise ValueError(f"topk_weights must have K = shape[1] >= 1 slots; got shape "
                             f"{tuple(topk_weights.shape)}")
        num_weights = topk_weights.shape[0] * topk_weights.shape[1]
    for name, desc in (("pos_to_token_topk", pos_to_token_topk),
                       ("pos_to_expert", pos_to_expert)):
        if desc is None:
            continue
        check_ndim(name, desc, 1, "[X]")
        check_dtype(name, desc, (MAP_DTYPE,))
        if desc.shape[0] != num_rows:
            raise ValueError(f"{name}.shape[0] must equal h.shape[0] (X = {num_rows}); "
                             f"got {desc.shape[0]}")
    if token_topk_to_pos is not None:
        if topk_weights is None:
            raise ValueError("token_topk_to_pos is given but topk_weights and "
                             "pos_to_token_topk are not: it is the inverse of "
                             "pos_to_token_topk (slot t * K + k's row)")
        check_ndim("token_topk_to_pos", token_topk_to_pos, 2, "[T, K]")
        check_dtype("token_topk_to_pos", token_topk_to_pos, (MAP_DTYPE,))
        if tuple(token_topk_to_pos.shape) != tuple(topk_weights.shape):
            raise ValueError(f"token_topk_to_pos must have topk_weights' shape [T, K] = "
                             f"{list(topk_weights.shape)}; got shape "
                             f"{tuple(token_topk_to_pos.shape)}")
    return QuantizeProblem(num_rows, width // 2, h.dtype, num_per_channels, round_sf,
                           packed_ue8m0, col_major, swiglu=True, num_weights=num_weights,
                           has_pos_to_expert=pos_to_expert is not None,
                           zero_padding=zero_padding,
                           has_token_topk_to_pos=token_topk_to_pos is not None)


def check_slot_rows(token_topk_to_pos, pos_to_token_topk, pos_to_expert, num_rows: int) -> None:
    """``validate=True`` of swiglu_quantize_fp8: ``token_topk_to_pos`` (NumPy
    [T, K]) must name exactly the rows the maps make live, each from its
    own slot. Faults are looked for in this order, the first index of the
    first kind found raised: a slot's row >= X, a slot naming a padding row
    (``pos_to_expert < 0``, or a ``pos_to_token_topk`` outside ``[0, T * K)``:
    ``swiglu_padding_rows``), a slot naming a row that holds another slot
    (``pos_to_token_topk``: duplicates too), a live row its slot does not
    name. A negative entry is a dropped slot."""
    top_k = token_topk_to_pos.shape[1]
    rows_of = token_topk_to_pos.reshape(-1).astype(np.int64)
    num_slots = rows_of.size
    named = np.flatnonzero(rows_of >= 0)
    past = named[rows_of[named] >= num_rows]
    if past.size:
        s = int(past[0])
        raise ValueError(f"token_topk_to_pos[{s // top_k}, {s % top_k}] = {rows_of[s]} is out "
                         f"of range: h has X = {num_rows} rows")
    rows = rows_of[named]
    slot_of = pos_to_token_topk.astype(np.int64)
    padding_rows = swiglu_padding_rows(num_rows, pos_to_expert=pos_to_expert,
                                       pos_to_token_topk=slot_of, num_slots=num_slots)
    padding = named[padding_rows[rows]]
    if padding.size:
        s = int(padding[0])
        p = int(rows_of[s])
        why = (f"pos_to_expert[{p}] < 0" if pos_to_expert is not None and pos_to_expert[p] < 0
               else f"pos_to_token_topk[{p}] = {slot_of[p]} is outside [0, T * K = {num_slots})")
        raise ValueError(f"token_topk_to_pos[{s // top_k}, {s % top_k}] = {p} names a padding "
                         f"row ({why})")
    other = named[slot_of[rows] != named]
    if other.size:
        s = int(other[0])
        p = int(rows_of[s])
        raise ValueError(f"token_topk_to_pos[{s // top_k}, {s % top_k}] = {p} disagrees with "
                         f"pos_to_token_topk[{p}] = {pos_to_token_topk[p]}: row {p} holds "
                         f"slot {pos_to_token_topk[p]}, not {s}")
    live_rows = np.flatnonzero(~padding_rows)
    unnamed = live_rows[rows_of[slot_of[live_rows]] != live_rows]
    if unnamed.size:
        p = int(unnamed[0])
        s = int(slot_of[p])
        raise ValueError(f"row {p} is live (pos_to_token_topk[{p}] = {s}) but "
                         f"token_topk_to_pos[{s // top_k}, {s % top_k}] = {rows_of[s]} does "
                         f"not name it")
