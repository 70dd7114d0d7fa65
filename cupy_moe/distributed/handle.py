"""What ``dispatch`` returns: the expanded rows, and the handle ``combine``
needs to send the expert outputs back to the tokens they came from."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..mapping import FusedMapping

__all__ = ["DispatchHandle", "Dispatched"]


class DispatchHandle(NamedTuple):
    """One ``dispatch`` call, as ``combine`` needs it (tensors on x's device).

    Sent side (this rank's T tokens): ``send_splits[r]`` rows went to rank r,
    ``send_token_index [sum(send_splits)]`` int64 is the token of each, grouped
    by destination rank, ascending within a rank.

    Received side (N = ``sum(recv_splits)`` rows, ``recv_splits[s]`` from rank
    s, ordered by source rank, then source token): ``recv_src_token [N]``
    int32, each row's token index on its source rank; ``recv_topk_ids [N, K]``
    int32, the token's K slots as this rank's local expert ids (-1: a slot of
    another rank's expert, or a dropped one); ``recv_topk_weights [N, K]``
    float32, the token's K router weights as given (those of -1 slots are
    never read); ``num_local_slots``, M, the slots with a local id; ``plan``,
    the ``FusedMapping`` of ``recv_topk_ids`` over ``num_local_experts``
    experts (X: ``dispatch``'s Returns); ``group``, the group dispatch ran
    on, as given (None: the default group).
    """

    rank: int
    world_size: int
    num_tokens: int
    hidden: int
    num_local_experts: int
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    send_token_index: Any
    recv_src_token: Any
    recv_topk_ids: Any
    recv_topk_weights: Any
    num_local_slots: int
    plan: FusedMapping
    group: Any = None

    @property
    def num_received(self) -> int:
        """N, the token rows this rank received."""
        return sum(self.recv_splits)


class Dispatched(NamedTuple):
    """``dispatch``'s result: ``expanded_x [X, H]`` (x's dtype), the received
    rows in the plan's expert-major layout; ``expanded_sf [X, S]`` (x_sf's
    dtype and the requested layout), their scale factors, or None without
    x_sf; and the ``handle`` for ``combine``."""

    expanded_x: Any
    expanded_sf: Any
    handle: DispatchHandle
