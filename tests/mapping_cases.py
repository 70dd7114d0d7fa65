"""An independent loop oracle of the routing plan and random routing cases,
shared by the CPU and GPU tests of ``fused_mapping``."""

from __future__ import annotations

import numpy as np


def loop_mapping(topk_ids: np.ndarray, num_experts: int, alignment: int,
                 num_expanded: int) -> list[np.ndarray]:
    """The seven outputs by a plain walk: experts in order, each expert's slots
    in ascending t * K + k, segments aligned, rows at or past X dropped."""
    num_tokens, top_k = topk_ids.shape
    flat = topk_ids.reshape(-1)
    token_topk_to_pos = np.full(flat.size, -1, dtype=np.int32)
    pos = np.full((3, num_expanded), -1, dtype=np.int32)
    starts, ends, counts = (np.zeros(num_experts, dtype=np.int32) for _ in range(3))
    row = 0
    for e in range(num_experts):
        slots = [i for i in range(flat.size) if flat[i] == e]
        starts[e], ends[e], counts[e] = row, row + len(slots), len(slots)
        for rank, i in enumerate(slots):
            if row + rank < num_expanded:
                token_topk_to_pos[i] = row + rank
                pos[:, row + rank] = (e, i // top_k, i)
        row += -(-len(slots) // alignment) * alignment
    return [token_topk_to_pos.reshape(num_tokens, top_k), *pos, starts, ends, counts]


def random_case(rng: np.random.Generator, *, max_tokens: int = 300, max_experts: int = 1024):
    """(topk_ids, num_experts, alignment, num_expanded or None): random sizes,
    dropped (-1) and remote (>= E) ids, int32 or int64; X sometimes short."""
    num_tokens = int(rng.integers(0, max_tokens + 1))
    top_k = int(rng.integers(1, 11))
    num_experts = int(rng.integers(1, max_experts + 1))
    alignment = int(rng.choice([1, 2, 3, 4, 16, 64, 128, 256, int(rng.integers(1, 257))]))
    dtype = rng.choice([np.int32, np.int64])
    # often fewer distinct experts than E, so that segments are long
    span = int(rng.integers(1, num_experts + 1))
    topk_ids = rng.integers(0, span, size=(num_tokens, top_k)).astype(dtype)
    if num_tokens:
        topk_ids[rng.random(topk_ids.shape) < rng.random() * 0.3] = -1
        topk_ids[rng.random(topk_ids.shape) < 0.05] = num_experts + int(rng.integers(0, 50))
    num_expanded = None
    if rng.random() < 0.25:
        num_expanded = int(rng.integers(0, num_tokens * top_k * 2 + 2))
    return topk_ids, num_experts, alignment, num_expanded
