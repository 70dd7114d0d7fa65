"""The NumPy routing plan: the oracle of ``fused_mapping`` (and, until the GPU
kernel lands, the only implementation)."""

from __future__ import annotations

import numpy as np

from ..runtime.sizes import align_up

__all__ = ["fused_mapping_numpy"]


def fused_mapping_numpy(topk_ids: np.ndarray, num_experts: int, *,
                        alignment: int) -> tuple[np.ndarray, np.ndarray]:
    """The expert-major routing plan of ``topk_ids``: (token_topk_to_pos, pos_to_expert).

    ``topk_ids`` is ``[T, K]`` (any integer dtype), a negative id is a dropped
    slot. Expert e owns a segment of ``align(count_e, alignment)`` rows, in
    expert order; within it its slots come in ascending ``t * K + k`` order,
    and the segment's tail rows are padding (``pos_to_expert = -1``).
    Returns int32 ``[T, K]`` and ``[X]``.
    """
    topk_ids = np.asarray(topk_ids)
    if np.any(topk_ids >= num_experts):
        raise ValueError(f"topk_ids holds an expert id >= num_experts = {num_experts}")
    flat = topk_ids.reshape(-1).astype(np.int64)
    routed = np.flatnonzero(flat >= 0)
    experts = flat[routed]
    counts = np.bincount(experts, minlength=num_experts)
    segment = align_up(counts, alignment)
    starts = np.concatenate([[0], np.cumsum(segment)[:-1]])
    # A stable sort by expert keeps ascending slot order inside each expert.
    order = np.argsort(experts, kind="stable")
    rank_in_expert = np.empty_like(order)
    rank_in_expert[order] = np.arange(order.size) - np.repeat(
        np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    positions = starts[experts] + rank_in_expert
    token_topk_to_pos = np.full(flat.shape[0], -1, dtype=np.int32)
    token_topk_to_pos[routed] = positions
    pos_to_expert = np.full(int(segment.sum()), -1, dtype=np.int32)
    pos_to_expert[positions] = experts
    return token_topk_to_pos.reshape(topk_ids.shape), pos_to_expert
