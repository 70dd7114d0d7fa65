"""The NumPy routing plan: the CPU backend of ``fused_mapping`` and the oracle
of its kernels."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..runtime.sizes import align_up

__all__ = ["FusedMapping", "fused_mapping_numpy", "worst_case_rows"]


class FusedMapping(NamedTuple):
    """The routing plan of ``topk_ids [T, K]`` over E experts into X rows (all int32).

    ``token_topk_to_pos [T, K]``: the row of each slot, -1 where dropped (a
    negative id, an id >= E, or a row at or past X). ``pos_to_expert [X]``:
    the expert of each row, -1 for padding (DeepGEMM's contiguous-layout
    ``grouped_layout``). ``pos_to_token [X]``, ``pos_to_token_topk [X]``
    (``t * K + k``): the slot each row holds, -1 for padding.
    ``expert_start [E]``, ``expert_end [E]`` (start + count) and
    ``tokens_per_expert [E]``: expert e's slots take rows ``expert_start[e]
    .. expert_end[e]``; its segment ends at ``expert_start[e] + align(count,
    alignment)``. Segments do not depend on X: those reaching past it lose
    their slots there.
    """

    token_topk_to_pos: Any
    pos_to_expert: Any
    pos_to_token: Any
    pos_to_token_topk: Any
    expert_start: Any
    expert_end: Any
    tokens_per_expert: Any

    def trimmed(self, num_expanded: int) -> FusedMapping:
        """The same plan with the row arrays cut to their first ``num_expanded`` rows."""
        return self._replace(pos_to_expert=self.pos_to_expert[:num_expanded],
                             pos_to_token=self.pos_to_token[:num_expanded],
                             pos_to_token_topk=self.pos_to_token_topk[:num_expanded])


def worst_case_rows(num_slots: int, num_experts: int, alignment: int) -> int:
    """The most rows any routing of ``num_slots`` slots can need: every expert
    that gets a slot wastes at most ``alignment - 1`` rows, and at most
    ``min(E, slots)`` experts get one. Tighter than ``slots + E * (A - 1)``
    when slots are few (decode)."""
    used_experts = min(num_experts, num_slots)
    return (num_slots + used_experts * (alignment - 1)) // alignment * alignment


def fused_mapping_numpy(topk_ids: np.ndarray, num_experts: int, *, alignment: int,
                        num_expanded: int | None = None) -> FusedMapping:
    """The plan of ``topk_ids [T, K]`` (any integer dtype) as NumPy int32 arrays.

    ``num_expanded`` is X; None gives the exact X, the end of the last segment.
    Within an expert, slots take rows in ascending ``t * K + k``: a stable
    sort by expert keeps that order.
    """
    topk_ids = np.asarray(topk_ids)
    top_k = topk_ids.shape[1] if topk_ids.ndim == 2 else 1
    flat = topk_ids.reshape(-1).astype(np.int64)
    routed = np.flatnonzero((flat >= 0) & (flat < num_experts))
    experts = flat[routed]
    counts = np.bincount(experts, minlength=num_experts)
    segments = align_up(counts, alignment)
    starts = np.cumsum(segments) - segments
    if num_expanded is None:
        num_expanded = int(segments.sum())
    order = np.argsort(experts, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size) - np.repeat(np.cumsum(counts) - counts, counts)
    rows = starts[experts] + rank
    placed = rows < num_expanded
    rows, slots, experts = rows[placed], routed[placed], experts[placed]

    token_topk_to_pos = np.full(flat.shape[0], -1, dtype=np.int32)
    token_topk_to_pos[slots] = rows
    pos_rows = np.full((3, num_expanded), -1, dtype=np.int32)
    pos_rows[0, rows] = experts
    pos_rows[1, rows] = slots // top_k
    pos_rows[2, rows] = slots
    return FusedMapping(token_topk_to_pos.reshape(topk_ids.shape), *pos_rows,
                        starts.astype(np.int32), (starts + counts).astype(np.int32),
                        counts.astype(np.int32))
