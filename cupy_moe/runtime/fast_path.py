"""The torch fast path: eager calls whose arguments were already checked.

A call's key is its scalar settings plus the description of each array
argument (``torch_fields``, what ``describe`` wraps; None where absent):
exactly what the rules read, so a key that was checked once stays checked.
A call with a known key skips the rules and the planning and goes straight
to the plan its first call made. Only calls whose tensors are all
contiguous and need no grad are remembered (the full path copies
non-contiguous inputs, and grad mode can change between calls).

Keys hold shapes, so the table is a ``BoundedCache`` (at most ``MAX_PLANS``
plans, the oldest dropped first): a dropped key's next call takes the full
path once.
"""

from __future__ import annotations

from typing import Any

from .arrays import ArrayDesc, torch_fields
from .bounded_cache import MAX_PLANS, BoundedCache

__all__ = ["TorchFastPath"]


class TorchFastPath:
    """Plans by call key, for one op. ``plan.device`` must name its CUDA device."""

    def __init__(self, max_plans: int = MAX_PLANS) -> None:
        self._plans = BoundedCache(max_plans)
        self._current_device = None

    def lookup(self, scalars: tuple, arrays: tuple) -> Any:
        """The plan of this call, or None when the full path must take it."""
        if not self._plans:
            return None
        try:
            key = (scalars, *[None if a is None else torch_fields("", a) for a in arrays])
        except (AttributeError, ValueError, RuntimeError, TypeError):
            # not a tensor, or not one we take (a sparse CSR tensor has no
            # is_contiguous; a symbolic shape does not hash): the full path
            # says why
            return None
        plan = self._plans.get(key)
        if plan is None or self._current_device() != plan.device:
            return None  # the full path switches devices
        return plan

    def remember(self, scalars: tuple, descs: tuple[ArrayDesc | None, ...], plan: Any) -> None:
        """Keep ``plan`` for calls described by ``descs`` (in ``lookup``'s order)."""
        if not all(d is None or (d.contiguous and not d.requires_grad) for d in descs):
            return
        if self._current_device is None:
            from cupy.cuda.runtime import getDevice  # the bare binding: no wrapper call
            self._current_device = getDevice
        self._plans.put((scalars, *descs), plan)

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
