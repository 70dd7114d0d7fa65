"""Which rank owns which experts: E experts over R ranks in contiguous blocks.

Rank r owns the global experts ``r * E/R .. (r + 1) * E/R``; its local expert
j is global expert ``r * E/R + j``. E must be a multiple of R (every rank
holds the same number of experts, so every rank's weight shards have one
shape).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..runtime.rules import require_int

__all__ = ["ExpertPartition", "partition_experts"]


class ExpertPartition(NamedTuple):
    """E experts over R ranks, ``E / R`` each, in contiguous blocks (build it
    with :func:`partition_experts`, which checks the sizes)."""

    num_experts: int
    world_size: int

    @property
    def local_experts(self) -> int:
        """E / R: the experts each rank holds."""
        return self.num_experts // self.world_size

    def experts_of(self, rank: int) -> range:
        """The global ids of ``rank``'s experts, in local order."""
        rank = self._check_rank(rank)
        return range(rank * self.local_experts, (rank + 1) * self.local_experts)

    def owner(self, expert: int) -> int:
        """The rank holding global expert ``expert`` (0 <= expert < E)."""
        expert = require_int("expert", expert)
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert must be in [0, num_experts = {self.num_experts}); "
                             f"got {expert}")
        return expert // self.local_experts

    def to_local(self, expert: int) -> tuple[int, int]:
        """``(rank, local id)`` of global expert ``expert``."""
        rank = self.owner(expert)
        return rank, expert - rank * self.local_experts

    def shard(self, weights: Any, rank: int) -> Any:
        """``rank``'s experts of a full ``[E, ...]`` weight array (a view, rows
        ``experts_of(rank)``): what that rank passes to ``ep_moe_layer``."""
        experts = self.experts_of(rank)
        if weights.shape[0] != self.num_experts:
            raise ValueError(f"weights must have E = {self.num_experts} experts in dimension "
                             f"0; got shape {tuple(weights.shape)}")
        return weights[experts.start:experts.stop]

    def _check_rank(self, rank: int) -> int:
        rank = require_int("rank", rank)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size = {self.world_size}); got {rank}")
        return rank


def partition_experts(num_experts: int, world_size: int) -> ExpertPartition:
    """The partition of ``num_experts`` experts over ``world_size`` ranks.

    TypeError for sizes that are not ints; ValueError unless ``num_experts >=
    1``, ``world_size >= 1`` and ``num_experts % world_size == 0``.
    """
    num_experts = require_int("num_experts", num_experts)
    world_size = require_int("world_size", world_size)
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1; got {num_experts}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size}")
    if num_experts % world_size:
        raise ValueError(f"num_experts = {num_experts} is not divisible by the {world_size} "
                         f"ranks of the group: expert parallelism gives every rank "
                         f"num_experts / world_size experts")
    return ExpertPartition(num_experts, world_size)
