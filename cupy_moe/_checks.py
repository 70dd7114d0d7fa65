"""Shape and dtype rules of the expand-to-fused ops, and their error messages.

Everything here works on plain shapes and canonical dtype names (``"bfloat16"``,
``"float8_e4m3fn"``, ``"int32"``, ...), so every array kind shares one set of
rules and one wording of each error.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


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


def _check_dtype(name: str, dtype: str, allowed: tuple[str, ...]) -> None:
    if dtype not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {dtype}")


def _check_ndim(name: str, shape: tuple[int, ...], ndim: int, layout: str) -> None:
    if len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}; got shape {tuple(shape)}")


def check_expand(
    x_shape: tuple[int, ...],
    x_dtype: str,
    map_shape: tuple[int, ...],
    map_dtype: str,
    p2e_shape: tuple[int, ...],
    p2e_dtype: str,
    *,
    x_dtypes: tuple[str, ...] = EXPAND_X_DTYPES,
) -> ExpandProblem:
    """Check the rules shared by both ops and return the call's sizes."""
    _check_ndim("x", x_shape, 2, "[T, H]")
    _check_ndim("token_topk_to_pos", map_shape, 2, "[T, K]")
    _check_ndim("pos_to_expert", p2e_shape, 1, "[X]")
    _check_dtype("x", x_dtype, x_dtypes)
    _check_dtype("token_topk_to_pos", map_dtype, (MAP_DTYPE,))
    _check_dtype("pos_to_expert", p2e_dtype, (MAP_DTYPE,))
    num_tokens, hidden = x_shape
    if hidden < 1:
        raise ValueError(f"x must have H = x.shape[1] >= 1 columns; got shape {tuple(x_shape)}")
    if map_shape[0] != num_tokens:
        raise ValueError(
            f"token_topk_to_pos.shape[0] must equal x.shape[0] (T = {num_tokens}); "
            f"got {map_shape[0]}"
        )
    if map_shape[1] < 1:
        raise ValueError(f"token_topk_to_pos must have K = shape[1] >= 1 slots; got {map_shape[1]}")
    return ExpandProblem(num_tokens, hidden, map_shape[1], p2e_shape[0], x_dtype)


def check_expand_with_sf(
    x_shape: tuple[int, ...],
    x_dtype: str,
    x_sf_shape: tuple[int, ...],
    x_sf_dtype: str,
    map_shape: tuple[int, ...],
    map_dtype: str,
    p2e_shape: tuple[int, ...],
    p2e_dtype: str,
    *,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool,
) -> ExpandProblem:
    """Check the rules of ``expand_to_fused_with_sf`` and return the call's sizes."""
    if num_per_channels not in SUPPORTED_NUM_PER_CHANNELS:
        raise ValueError(
            f"unsupported num_per_channels={num_per_channels!r}; "
            f"must be one of {SUPPORTED_NUM_PER_CHANNELS}"
        )
    base = check_expand(
        x_shape, x_dtype, map_shape, map_dtype, p2e_shape, p2e_dtype,
        x_dtypes=EXPAND_SF_X_DTYPES,
    )
    _check_ndim("x_sf", x_sf_shape, 2, "[T, S]")
    _check_dtype("x_sf", x_sf_dtype, SF_DTYPES)
    packed = x_sf_dtype == "int32"
    if packed and not use_tma_aligned_col_major_sf:
        raise ValueError(
            "int32 x_sf is packed UE8M0, and packed UE8M0 scale factors require "
            "use_tma_aligned_col_major_sf=True"
        )
    expected_s = sf_columns(base.hidden, num_per_channels, packed_ue8m0=packed)
    if tuple(x_sf_shape) != (base.num_tokens, expected_s):
        rule = (
            "S = ceil(ceil(H / num_per_channels) / 4) for packed UE8M0 int32"
            if packed else "S = ceil(H / num_per_channels) for float32"
        )
        raise ValueError(
            f"x_sf must have shape (T, S) = ({base.num_tokens}, {expected_s}) with "
            f"{rule}, H = {base.hidden}, num_per_channels = {num_per_channels}; "
            f"got {tuple(x_sf_shape)}"
        )
    return ExpandProblem(
        base.num_tokens, base.hidden, base.top_k, base.num_expanded, x_dtype,
        sf_columns=expected_s, sf_dtype=x_sf_dtype, num_per_channels=num_per_channels,
        sf_col_major=bool(use_tma_aligned_col_major_sf),
    )


def check_out(name: str, shape: tuple[int, ...], dtype: str,
              expected_shape: tuple[int, ...], expected_dtype: str) -> None:
    """A caller-provided output must match the result it stands for exactly."""
    if tuple(shape) != tuple(expected_shape):
        raise ValueError(f"{name} must have shape {tuple(expected_shape)}; got {tuple(shape)}")
    if dtype != expected_dtype:
        raise ValueError(f"{name} must have dtype {expected_dtype} (that of the input); got {dtype}")


def expected_out_strides(problem: ExpandProblem, *, sf: bool) -> tuple[int, int]:
    """Element strides an output must have: row-major, or the TMA column-major view."""
    if sf and problem.sf_col_major:
        return (1, problem.sf_leading_dim)
    return (problem.sf_columns if sf else problem.hidden, 1)


def strides_match(shape: tuple[int, ...], strides: tuple[int, ...],
                  expected: tuple[int, ...]) -> bool:
    """Strides agree on every dimension longer than 1 (others are never stepped)."""
    return all(n <= 1 or s == e for n, s, e in zip(shape, strides, expected))


def check_out_strides(name: str, problem: ExpandProblem, shape, strides, *, sf: bool) -> None:
    expected = expected_out_strides(problem, sf=sf)
    if not strides_match(shape, strides, expected):
        layout = (
            f"the transposed view of an [S, align(X, 4)] = [{problem.sf_columns}, "
            f"{problem.sf_leading_dim}] buffer"
            if sf and problem.sf_col_major else "C-contiguous"
        )
        raise ValueError(
            f"{name} must be {layout}, element strides {expected}; got {tuple(strides)}"
        )


# Routing-map validation (validate=True). Each backend finds, in one pass, the
# first offending flat index of each kind (-1 where there is none); the message
# is worded here so that every backend reports the same error.
ROUTING_ERROR_KINDS = ("out_of_range", "padding_target", "duplicate", "untargeted")


def raise_routing_error(first: dict[str, int], problem: ExpandProblem, map_value) -> None:
    """Raise ValueError for the first kind of fault found, if any.

    ``first`` maps each kind of ``ROUTING_ERROR_KINDS`` to a flat index into
    ``token_topk_to_pos`` (a row of ``pos_to_expert`` for ``untargeted``), or
    -1. ``map_value(i)`` reads ``token_topk_to_pos.flat[i]``.
    """
    k = problem.top_k
    i = first["out_of_range"]
    if i >= 0:
        raise ValueError(
            f"token_topk_to_pos[{i // k}, {i % k}] = {map_value(i)} is out of range: "
            f"pos_to_expert has X = {problem.num_expanded} rows"
        )
    i = first["padding_target"]
    if i >= 0:
        p = map_value(i)
        raise ValueError(
            f"token_topk_to_pos[{i // k}, {i % k}] = {p} targets a padding position "
            f"(pos_to_expert[{p}] < 0)"
        )
    i = first["duplicate"]
    if i >= 0:
        raise ValueError(
            f"token_topk_to_pos[{i // k}, {i % k}] = {map_value(i)} duplicates a "
            f"position an earlier slot already targets (duplicate valid positions)"
        )
    p = first["untargeted"]
    if p >= 0:
        raise ValueError(
            f"pos_to_expert[{p}] >= 0 marks an expert row that no slot of "
            f"token_topk_to_pos targets (row never targeted)"
        )
