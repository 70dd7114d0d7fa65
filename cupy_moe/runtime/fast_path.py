"""The torch fast path: eager calls whose arguments were already checked.

A call's key is its scalar settings plus the ``describe`` tuple of each array
argument (None where absent): exactly what the rules read, so a key that was
checked once stays checked. A call with a known key skips the rules and the
planning and goes straight to the plan its first call made. Only calls whose
tensors are all contiguous and need no grad are remembered (the full path
copies non-contiguous inputs, and grad mode can change between calls).
"""

from __future__ import annotations

import sys
from typing import Any

from .arrays import ArrayDesc, describe

__all__ = ["TorchFastPath"]


class TorchFastPath:
    """Plans by call key, for one op. ``plan.device`` must name its CUDA device."""

    def __init__(self) -> None:
        self._plans: dict[tuple, Any] = {}
        self._tensor_type = None  # torch.Tensor, once a plan is remembered
        self._current_device = None

    def lookup(self, scalars: tuple, arrays: tuple) -> Any:
        """The plan of this call, or None when the full path must take it."""
        if not self._plans:
            return None
        key = [scalars]
        tensor = self._tensor_type
        for array in arrays:
            if array is None:
                key.append(None)
            elif type(array) is tensor:  # exactly: a subclass may override anything
                try:
                    key.append(describe("", array))
                except (TypeError, ValueError):
                    return None  # the full path raises with the argument's name
            else:
                return None
        plan = self._plans.get(tuple(key))
        if plan is None or self._current_device() != plan.device:
            return None  # the full path switches devices
        return plan

    def remember(self, scalars: tuple, descs: tuple[ArrayDesc | None, ...], plan: Any) -> None:
        """Keep ``plan`` for calls described by ``descs`` (in ``lookup``'s order)."""
        if not all(d is None or (d.contiguous and not d.requires_grad) for d in descs):
            return
        if self._tensor_type is None:
            from .launch import current_device
            self._tensor_type = sys.modules["torch"].Tensor
            self._current_device = current_device
        self._plans[(scalars, *descs)] = plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
