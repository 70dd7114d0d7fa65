"""Shape and dtype rules of the expand ops, and their error messages.

Rules read ``ArrayDesc`` tuples, so every array kind shares one set of rules
and one wording of each error.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.arrays import ArrayDesc
from ..runtime.rules import check_dtype, check_ndim
from ..runtime.sizes import MAX_ROWS, align_up, ceil_div

SUPPORTED_NUM_PER_CHANNELS = (32, 128)
UE8M0_PER_INT32 = 4
# The TMA-aligned column-major SF buffer pads its token dimension to this.
SF_TOKEN_ALIGN = 4

# 16-bit activations; uint16 carries bf16 bits where an array library has no
# bfloat16 (older CuPy).
EXPAND_X_DTYPES = ("bfloat16", "float16", "uint16")
# 1-byte quantized payloads: fp8 e4m3, or raw bytes (e.g. two fp4 per byte).
EXPAND_SF_X_DTYPES = ("float8_e4m3fn", "uint8", "int8")
SF_DTYPES = ("float32", "int32")
MAP_DTYPE = "int32"
# K: a small batch's register launch takes a grid plane a slot (CUDA's grid z)
MAX_TOP_K = 65535


def sf_columns(hidden: int, num_per_channels: int, *, packed_ue8m0: bool) -> int:
    """S: scale factors per row, ``ceil(H / npc)``, or that over 4 when packed."""
    blocks = ceil_div(hidden, num_per_channels)
    return ceil_div(blocks, UE8M0_PER_INT32) if packed_ue8m0 else blocks


@dataclass(frozen=True)
class ExpandProblem:
    """Sizes of one call, after every rule has been checked.

    ``sf_columns`` is 0 for the op without scale factors. ``sf_leading_dim`` is
    the column count of the column-major SF buffer, ``align(X, 4)``.
    """

    num_tokens: int
    hidden: int
    top_k: int
    num_expanded: int
    x_dtype: str
    sf_columns: int = 0
    sf_dtype: str | None = None
    num_per_channels: int | None = None
    sf_col_major: bool = False

    @property
    def has_sf(self) -> bool:
        return self.sf_columns > 0

    @property
    def sf_leading_dim(self) -> int:
        return align_up(self.num_expanded, SF_TOKEN_ALIGN)

    def out_shape(self) -> tuple[int, int]:
        return (self.num_expanded, self.hidden)

    def out_sf_shape(self) -> tuple[int, int]:
        return (self.num_expanded, self.sf_columns)

    def out_strides(self) -> tuple[int, int]:
        return (self.hidden, 1)

    def out_sf_strides(self) -> tuple[int, int]:
        """Element strides of the SF output: row-major, or the TMA column-major view."""
        return (1, self.sf_leading_dim) if self.sf_col_major else (self.sf_columns, 1)

    def out_sf_layout(self) -> str:
        if self.sf_col_major:
            return (f"the transposed view of an [S, align(X, 4)] = [{self.sf_columns}, "
                    f"{self.sf_leading_dim}] buffer")
        return "C-contiguous"

    def out_sf_buffer_bytes(self) -> int:
        """Bytes from the SF output's first element that the kernels write
        (column-major: the pad columns X .. align(X, 4) too)."""
        if self.sf_col_major:
            return self.sf_columns * self.sf_leading_dim * 4
        return self.num_expanded * self.sf_columns * 4


def check_expand(x: ArrayDesc, token_topk_to_pos: ArrayDesc, pos_to_expert: ArrayDesc, *,
                 x_dtypes: tuple[str, ...] = EXPAND_X_DTYPES) -> ExpandProblem:
    """Check the rules shared by both ops and return the call's sizes."""
    check_ndim("x", x, 2, "[T, H]")
    check_ndim("token_topk_to_pos", token_topk_to_pos, 2, "[T, K]")
    check_ndim("pos_to_expert", pos_to_expert, 1, "[X]")
    check_dtype("x", x, x_dtypes)
    check_dtype("token_topk_to_pos", token_topk_to_pos, (MAP_DTYPE,))
    check_dtype("pos_to_expert", pos_to_expert, (MAP_DTYPE,))
    num_tokens, hidden = x.shape
    num_slots_rows, top_k = token_topk_to_pos.shape
    if hidden < 1:
        raise ValueError(f"x must have H = x.shape[1] >= 1 columns; got shape {tuple(x.shape)}")
    if num_slots_rows != num_tokens:
        raise ValueError(f"token_topk_to_pos.shape[0] must equal x.shape[0] (T = {num_tokens}); "
                         f"got {num_slots_rows}")
    if top_k < 1:
        raise ValueError(f"token_topk_to_pos must have K = shape[1] >= 1 slots; got {top_k}")
    if top_k > MAX_TOP_K:
        raise ValueError(f"token_topk_to_pos has K = {top_k} slots a token; at most "
                         f"{MAX_TOP_K} are supported")
    for name, count in (("x has T", num_tokens), ("pos_to_expert has X", pos_to_expert.shape[0])):
        if count > MAX_ROWS:
            raise ValueError(f"{name} = {count} rows; at most {MAX_ROWS} are supported")
    return ExpandProblem(num_tokens, hidden, top_k, pos_to_expert.shape[0], x.dtype)


def check_expand_with_sf(x: ArrayDesc, x_sf: ArrayDesc, token_topk_to_pos: ArrayDesc,
                         pos_to_expert: ArrayDesc, *, num_per_channels: int,
                         use_tma_aligned_col_major_sf: bool) -> ExpandProblem:
    """Check the rules of ``expand_to_fused_with_sf`` and return the call's sizes."""
    if num_per_channels not in SUPPORTED_NUM_PER_CHANNELS:
        raise ValueError(f"unsupported num_per_channels={num_per_channels!r}; "
                         f"must be one of {SUPPORTED_NUM_PER_CHANNELS}")
    base = check_expand(x, token_topk_to_pos, pos_to_expert, x_dtypes=EXPAND_SF_X_DTYPES)
    check_ndim("x_sf", x_sf, 2, "[T, S]")
    check_dtype("x_sf", x_sf, SF_DTYPES)
    packed = x_sf.dtype == "int32"
    if packed and not use_tma_aligned_col_major_sf:
        raise ValueError("int32 x_sf is packed UE8M0, and packed UE8M0 scale factors require "
                         "use_tma_aligned_col_major_sf=True")
    expected_s = sf_columns(base.hidden, num_per_channels, packed_ue8m0=packed)
    if tuple(x_sf.shape) != (base.num_tokens, expected_s):
        rule = ("S = ceil(ceil(H / num_per_channels) / 4) for packed UE8M0 int32"
                if packed else "S = ceil(H / num_per_channels) for float32")
        raise ValueError(f"x_sf must have shape (T, S) = ({base.num_tokens}, {expected_s}) with "
                         f"{rule}, H = {base.hidden}, num_per_channels = {num_per_channels}; "
                         f"got {tuple(x_sf.shape)}")
    return ExpandProblem(base.num_tokens, base.hidden, base.top_k, base.num_expanded, x.dtype,
                         sf_columns=expected_s, sf_dtype=x_sf.dtype,
                         num_per_channels=num_per_channels,
                         sf_col_major=use_tma_aligned_col_major_sf)


def check_pos_to_token(pos_to_token: ArrayDesc, problem: ExpandProblem) -> None:
    """``pos_to_token`` [X] int32: the token of each output row (-1 on padding
    rows), as ``fused_mapping`` returns it."""
    check_ndim("pos_to_token", pos_to_token, 1, "[X]")
    check_dtype("pos_to_token", pos_to_token, (MAP_DTYPE,))
    if pos_to_token.shape[0] != problem.num_expanded:
        raise ValueError(f"pos_to_token.shape[0] must equal pos_to_expert.shape[0] "
                         f"(X = {problem.num_expanded}); got {pos_to_token.shape[0]}")


# Routing-map validation (validate=True). Each backend finds, in one pass, the
# first offending flat index of each kind (-1 where there is none); the message
# is worded here so that every backend reports the same error.
ROUTING_ERROR_KINDS = ("out_of_range", "padding_target", "duplicate", "untargeted",
                       "wrong_token")


def raise_routing_error(first: dict[str, int], problem: ExpandProblem, map_value,
                        token_value=None) -> None:
    """Raise ValueError for the first kind of fault found, if any.

    ``first`` maps each kind of ``ROUTING_ERROR_KINDS`` to a flat index into
    ``token_topk_to_pos`` (a row of ``pos_to_expert`` for ``untargeted``), or
    -1. ``map_value(i)`` reads ``token_topk_to_pos.flat[i]``, ``token_value(p)``
    ``pos_to_token[p]`` (``wrong_token``: a slot whose row names another token;
    only looked for when the call passes ``pos_to_token``).
    """
    k = problem.top_k
    i = first["out_of_range"]
    if i >= 0:
        raise ValueError(f"token_topk_to_pos[{i // k}, {i % k}] = {map_value(i)} is out of "
                         f"range: pos_to_expert has X = {problem.num_expanded} rows")
    i = first["padding_target"]
    if i >= 0:
        p = map_value(i)
        raise ValueError(f"token_topk_to_pos[{i // k}, {i % k}] = {p} targets a padding "
                         f"position (pos_to_expert[{p}] < 0)")
    i = first["duplicate"]
    if i >= 0:
        raise ValueError(f"token_topk_to_pos[{i // k}, {i % k}] = {map_value(i)} duplicates a "
                         "position an earlier slot already targets (duplicate valid positions)")
    p = first["untargeted"]
    if p >= 0:
        raise ValueError(f"pos_to_expert[{p}] >= 0 marks an expert row that no slot of "
                         "token_topk_to_pos targets (row never targeted)")
    i = first["wrong_token"]
    if i >= 0:
        p = map_value(i)
        raise ValueError(f"pos_to_token[{p}] = {token_value(p)} disagrees with "
                         f"token_topk_to_pos[{i // k}, {i % k}] = {p}: row {p} holds token "
                         f"{i // k}")
