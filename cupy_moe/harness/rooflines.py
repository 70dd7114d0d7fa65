"""Roofline byte counts: the fewest bytes one call of an op must move through
device memory, each input read once and each output written once.

``shapes`` maps input names to shapes, as in ``Workload.shapes``:
``x [T, H]``, ``token_topk_to_pos [T, K]`` int32, ``pos_to_expert [X]``
int32 and, for the SF op, ``x_sf [T, S]``; for ``fused_mapping``
``topk_ids [T, K]``. ``elem_bytes`` is the item size of ``x`` (2 for bf16, 1
for fp8) or of ``topk_ids`` (8 for int64). The figures divide measured times
into GB/s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

__all__ = ["ROOFLINES", "expand_to_fused_bytes", "expand_to_fused_with_sf_bytes",
           "fused_mapping_bytes"]

Shapes = Mapping[str, tuple[int, ...]]

INDEX_BYTES = 4  # token_topk_to_pos, pos_to_expert and the plan's other arrays are int32
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


# An op's function takes (shapes, elem_bytes) and, for fused_mapping, the
# keywords num_experts and num_expanded.
ROOFLINES: dict[str, Callable[..., int]] = {
    "expand_to_fused": expand_to_fused_bytes,
    "expand_to_fused_with_sf": expand_to_fused_with_sf_bytes,
    "fused_mapping": fused_mapping_bytes,
}
