"""Roofline byte counts: the fewest bytes one call of an op must move through
device memory, each input read once and each output written once.

``shapes`` maps input names to shapes, as in ``Workload.shapes``:
``x [T, H]``, ``token_topk_to_pos [T, K]`` int32, ``pos_to_expert [X]``
int32 and, for the SF op, ``x_sf [T, S]``; for ``fused_mapping``
``topk_ids [T, K]``. ``elem_bytes`` is the item size of ``x`` (2 for bf16, 1
for fp8) or of ``topk_ids`` (8 for int64). The figures divide measured times
into GB/s.

The newer ops: ``reduce_fused`` (``expanded [X, H]`` of ``elem_bytes``,
``token_topk_to_pos [T, K]``, optional ``topk_weights [T, K]`` and
``row_scale [X]``), ``quantize_fp8`` (``x [T, H]``) and
``swiglu_quantize_fp8`` (``h [X, 2I]``, optional ``topk_weights [T, K]``
with ``pos_to_token_topk [X]``, optional ``pos_to_expert [X]``). Their fp8
outputs are 1 byte an element, their scale factors 4 bytes (a float32, or a
word of four packed UE8M0 exponents); as for the SF expand op, the pad
columns of the TMA-aligned layout are left out.

The expand ops' bytes split in two (:func:`expand_split_bytes`): what a copy
must move (the token rows read, the routed rows written, the maps read) and
what a memset must write (the padding rows' zeros). The benchmark times a
device-to-device copy and a memset of these two sizes as the floor of "copy
the routed rows, zero the padding".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

__all__ = ["ROOFLINES", "SplitBytes", "expand_split_bytes", "expand_to_fused_bytes",
           "expand_to_fused_with_sf_bytes", "fused_mapping_bytes", "quantize_fp8_bytes",
           "reduce_fused_bytes", "swiglu_quantize_fp8_bytes"]

Shapes = Mapping[str, tuple[int, ...]]

INDEX_BYTES = 4  # token_topk_to_pos, pos_to_expert and the plan's other arrays are int32
# float32, or an int32 word of four packed UE8M0 exponents
SF_BYTES = 4
FP8_BYTES = 1  # an e4m3 output element
WEIGHT_BYTES = 4  # topk_weights and row_scale are float32


def _used_tokens(shapes: Shapes, used_tokens: int | None) -> int:
    num_tokens = shapes["x"][0]
    if used_tokens is None:
        return num_tokens
    if not 0 <= used_tokens <= num_tokens:
        raise ValueError(f"used_tokens must be in [0, T = {num_tokens}]; got {used_tokens}")
    return used_tokens


def expand_to_fused_bytes(shapes: Shapes, elem_bytes: int, *,
                          used_tokens: int | None = None) -> int:
    """Bytes of ``expand_to_fused``: ``x [T, H]`` and both maps read,
    ``expanded_x [X, H]`` written (padding rows included: they are zeroed).

    ``used_tokens`` (U, default T) is the number of tokens with at least one
    routed slot: only their rows of ``x`` need be read (fewer than T where
    expert parallelism drops the slots of remote experts)::

        U*H*e + 4*T*K + 4*X + X*H*e
    """
    num_tokens, hidden = shapes["x"]
    top_k = shapes["token_topk_to_pos"][1]
    (num_expanded,) = shapes["pos_to_expert"]
    return (_used_tokens(shapes, used_tokens) * hidden * elem_bytes
            + num_tokens * top_k * INDEX_BYTES
            + num_expanded * INDEX_BYTES
            + num_expanded * hidden * elem_bytes)


def expand_to_fused_with_sf_bytes(shapes: Shapes, elem_bytes: int, *,
                                  used_tokens: int | None = None) -> int:
    """Bytes of ``expand_to_fused_with_sf``: those of ``expand_to_fused`` plus
    ``x_sf [T, S]`` read and ``expanded_x_sf [X, S]`` written, 4 bytes a scale
    factor. The pad columns of the TMA-aligned layout (``align(X, 4) - X``)
    are left out: they are a layout choice, not data the op must move.
    ``used_tokens`` as in :func:`expand_to_fused_bytes` (their SF rows are
    the ones read)::

        U*(H*e + 4*S) + 4*T*K + 4*X + X*(H*e + 4*S)
    """
    sf_columns = shapes["x_sf"][1]
    (num_expanded,) = shapes["pos_to_expert"]
    used = _used_tokens(shapes, used_tokens)
    return (expand_to_fused_bytes(shapes, elem_bytes, used_tokens=used)
            + used * sf_columns * SF_BYTES
            + num_expanded * sf_columns * SF_BYTES)


class SplitBytes(NamedTuple):
    """An expand call's roofline bytes in two parts that add up to them."""

    copy_bytes: int  # token rows read, routed rows written, maps read
    zero_bytes: int  # padding rows written (zeros), never read


def expand_split_bytes(shapes: Shapes, elem_bytes: int, *, routed_rows: int,
                       used_tokens: int | None = None) -> SplitBytes:
    """The bytes of either expand op (``x_sf`` in ``shapes``: the SF op), split
    into a copy and a memset.

    With a row of ``r = H*e (+ 4*S)`` bytes (``x`` and, for the SF op, its
    scale factors), R = ``routed_rows`` of the X rows holding a slot's token
    and U = ``used_tokens`` (default T) tokens with a routed slot:

    - ``copy_bytes = U*r + 4*T*K + 4*X + R*r``: each used token's row read
      once, each routed row written once, both maps read once;
    - ``zero_bytes = (X - R)*r``: each padding row (``pos_to_expert < 0``)
      written once, with zeros, and never read.

    Their sum is :func:`expand_to_fused_bytes` (or the SF op's) with the same
    U, whatever R is: the split moves bytes between the parts, not in or out.
    The TMA layout's pad columns are left out, as there.
    """
    num_tokens, hidden = shapes["x"]
    top_k = shapes["token_topk_to_pos"][1]
    (num_expanded,) = shapes["pos_to_expert"]
    if not 0 <= routed_rows <= num_expanded:
        raise ValueError(f"routed_rows must be in [0, X = {num_expanded}]; got {routed_rows}")
    used = _used_tokens(shapes, used_tokens)
    row = hidden * elem_bytes
    if "x_sf" in shapes:
        row += shapes["x_sf"][1] * SF_BYTES
    copy_bytes = (used * row
                  + num_tokens * top_k * INDEX_BYTES
                  + num_expanded * INDEX_BYTES
                  + routed_rows * row)
    return SplitBytes(copy_bytes, (num_expanded - routed_rows) * row)


def fused_mapping_bytes(shapes: Shapes, elem_bytes: int, *, num_experts: int,
                        num_expanded: int) -> int:
    """Bytes of ``fused_mapping``: ``topk_ids [T, K]`` read (``elem_bytes``
    an id: 8 for int64, 4 for int32), and its seven int32 outputs written once:
    ``token_topk_to_pos [T, K]``, the three row arrays ``pos_to_expert``,
    ``pos_to_token`` and ``pos_to_token_topk`` of ``num_expanded`` (X) rows
    each, padding rows included (they are written -1), and the three expert
    arrays ``expert_start``, ``expert_end`` and ``tokens_per_expert`` of
    ``num_experts`` (E) each::

        T*K*elem_bytes + 4*T*K + 3*4*X + 3*4*E

    The kernels' scratch (per-block counts, the row total) is left out: it is
    a choice of the implementation, not data the op must move."""
    num_tokens, top_k = shapes["topk_ids"]
    slots = num_tokens * top_k
    return (slots * elem_bytes
            + slots * INDEX_BYTES
            + 3 * num_expanded * INDEX_BYTES
            + 3 * num_experts * INDEX_BYTES)


def _routed_rows(num_expanded: int, routed_rows: int) -> int:
    if not 0 <= routed_rows <= num_expanded:
        raise ValueError(f"routed_rows must be in [0, X = {num_expanded}]; got {routed_rows}")
    return routed_rows


def reduce_fused_bytes(shapes: Shapes, elem_bytes: int, *, routed_rows: int) -> int:
    """Bytes of ``reduce_fused``: of ``expanded [X, H]`` only the R =
    ``routed_rows`` rows a slot points at are read (padding rows and the rows
    of dropped slots never are), ``token_topk_to_pos`` and, where passed,
    ``topk_weights`` read whole, ``row_scale`` read at the R routed rows, and
    ``out [T, H]`` written (every token, zeros where no slot is routed)::

        R*H*e + 4*T*K + [4*T*K weights] + [4*R row_scale] + T*H*e
    """
    num_expanded, hidden = shapes["expanded"]
    num_tokens, top_k = shapes["token_topk_to_pos"]
    routed = _routed_rows(num_expanded, routed_rows)
    total = (routed * hidden * elem_bytes
             + num_tokens * top_k * INDEX_BYTES
             + num_tokens * hidden * elem_bytes)
    if "topk_weights" in shapes:
        total += num_tokens * top_k * WEIGHT_BYTES
    if "row_scale" in shapes:
        total += routed * WEIGHT_BYTES
    return total


def quantize_fp8_bytes(shapes: Shapes, elem_bytes: int, *, sf_columns: int) -> int:
    """Bytes of ``quantize_fp8``: ``x [T, H]`` read, ``x_fp8 [T, H]`` (1 byte
    an element) and ``x_sf [T, S]`` (4 bytes a float32 or a packed word)
    written; S = ``sf_columns``::

        T*H*e + T*H + 4*T*S
    """
    num_tokens, hidden = shapes["x"]
    return (num_tokens * hidden * elem_bytes
            + num_tokens * hidden * FP8_BYTES
            + num_tokens * sf_columns * SF_BYTES)


def swiglu_quantize_fp8_bytes(shapes: Shapes, elem_bytes: int, *, routed_rows: int,
                              sf_columns: int, zero_padding: bool = True) -> int:
    """Bytes of ``swiglu_quantize_fp8`` over ``h [X, 2I]``: the rows it must
    read, ``y_fp8 [X, I]`` and ``y_sf [X, S]`` written whole (padding rows
    too: they are zeros), and the maps and weights.

    With ``pos_to_expert`` the padding rows are never read: only the R =
    ``routed_rows`` rows of ``h`` are (without it, all X), and
    ``pos_to_expert`` is read whole. With ``topk_weights``,
    ``pos_to_token_topk`` is read whole and one weight gathered a routed
    row::

        rows*2I*e + X*I + 4*X*S + [4*X pos_to_expert] + [4*X + 4*R weights]

    where rows is R with ``pos_to_expert``, else X. With ``zero_padding``
    False only the R routed rows of ``y_fp8`` and ``y_sf`` are written (X
    becomes R in the two output terms); given ``token_topk_to_pos [T, K]``
    as well, the slots name their rows, so R rows of ``h`` are read and the
    maps read are the hint and the R weights (4*T*K + 4*R) instead of
    ``pos_to_expert`` and ``pos_to_token_topk``.
    """
    num_expanded, width = shapes["h"]
    routed = _routed_rows(num_expanded, routed_rows)
    by_slot = not zero_padding and "token_topk_to_pos" in shapes
    read_rows = routed if "pos_to_expert" in shapes or by_slot else num_expanded
    written_rows = num_expanded if zero_padding else routed
    total = (read_rows * width * elem_bytes
             + written_rows * (width // 2) * FP8_BYTES
             + written_rows * sf_columns * SF_BYTES)
    if by_slot:
        num_tokens, top_k = shapes["token_topk_to_pos"]
        return total + num_tokens * top_k * INDEX_BYTES + routed * WEIGHT_BYTES
    if "pos_to_expert" in shapes:
        total += num_expanded * INDEX_BYTES
    if "topk_weights" in shapes:
        total += num_expanded * INDEX_BYTES + routed * WEIGHT_BYTES
    return total


# An op's function takes (shapes, elem_bytes) and, for fused_mapping, the
# keywords num_experts and num_expanded (the expand ops: used_tokens,
# optional; reduce_fused: routed_rows; quantize_fp8: sf_columns;
# swiglu_quantize_fp8: both, and zero_padding, optional).
ROOFLINES: dict[str, Callable[..., int]] = {
    "expand_to_fused": expand_to_fused_bytes,
    "expand_to_fused_with_sf": expand_to_fused_with_sf_bytes,
    "fused_mapping": fused_mapping_bytes,
    "reduce_fused": reduce_fused_bytes,
    "quantize_fp8": quantize_fp8_bytes,
    "swiglu_quantize_fp8": swiglu_quantize_fp8_bytes,
}
