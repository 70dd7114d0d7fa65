"""Roofline byte counts: the fewest bytes one call of an op must move through
device memory, each input read once and each output written once.

``shapes`` maps input names to shapes, as in ``Workload.shapes``:
``x [T, H]``, ``token_topk_to_pos [T, K]`` int32, ``pos_to_expert [X]``
int32 and, for the SF op, ``x_sf [T, S]``. ``elem_bytes`` is the item size of
``x`` (2 for bf16, 1 for fp8). The figures divide measured times into GB/s.
"""

from __future__ import annotations

from typing import Callable, Mapping

__all__ = ["expand_to_fused_bytes", "expand_to_fused_with_sf_bytes", "ROOFLINES"]

Shapes = Mapping[str, tuple[int, ...]]

INDEX_BYTES = 4  # token_topk_to_pos and pos_to_expert are int32
# float32, or an int32 word of four packed UE8M0 exponents
SF_BYTES = 4


def expand_to_fused_bytes(shapes: Shapes, elem_bytes: int) -> int:
    """Bytes of ``expand_to_fused``: ``x [T, H]`` and both maps read,
    ``expanded_x [X, H]`` written (padding rows included: they are zeroed)."""
    num_tokens, hidden = shapes["x"]
    top_k = shapes["token_topk_to_pos"][1]
    (num_expanded,) = shapes["pos_to_expert"]
    return (num_tokens * hidden * elem_bytes
            + num_tokens * top_k * INDEX_BYTES
            + num_expanded * INDEX_BYTES
            + num_expanded * hidden * elem_bytes)


def expand_to_fused_with_sf_bytes(shapes: Shapes, elem_bytes: int) -> int:
    """Bytes of ``expand_to_fused_with_sf``: those of ``expand_to_fused`` plus
    ``x_sf [T, S]`` read and ``expanded_x_sf [X, S]`` written, 4 bytes a scale
    factor. The pad columns of the TMA-aligned layout (``align(X, 4) - X``)
    are left out: they are a layout choice, not data the op must move."""
    num_tokens, sf_columns = shapes["x_sf"]
    (num_expanded,) = shapes["pos_to_expert"]
    return (expand_to_fused_bytes(shapes, elem_bytes)
            + num_tokens * sf_columns * SF_BYTES
            + num_expanded * sf_columns * SF_BYTES)


ROOFLINES: dict[str, Callable[[Shapes, int], int]] = {
    "expand_to_fused": expand_to_fused_bytes,
    "expand_to_fused_with_sf": expand_to_fused_with_sf_bytes,
}
