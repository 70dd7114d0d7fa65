"""A dict that keeps at most ``max_entries`` entries, the oldest dropped first.

The plan tables (each family's ``plan_for``, the torch fast path) are keyed by
the call's shapes, and a server's batch sizes vary (expert parallelism changes
X every call): unbounded, they would grow for the life of the process. A
dropped key's next call builds its plan again (host work only; a plan's
argument block is copied by every launch, so no launch in flight needs it).
Lookups stay plain ``dict.get`` calls (the fast path's budget is a fraction of
a microsecond); inserting takes a lock, since two threads evicting at once
would pick the same oldest key (a KeyError in one of them) or iterate the
dict while the other inserts (a RuntimeError), and a new plan is off the hot
path anyway.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["MAX_PLANS", "BoundedCache"]

MAX_PLANS = 512  # plans a table keeps (a plan is a few hundred bytes of host memory)


class BoundedCache(dict):
    """``dict`` with ``put``: insert, then drop the oldest entry past
    ``max_entries`` (insertion order; a lookup does not refresh an entry)."""

    def __init__(self, max_entries: int = MAX_PLANS) -> None:
        super().__init__()
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1; got {max_entries}")
        self.max_entries = max_entries
        self._insert_lock = threading.Lock()

    def put(self, key: Any, value: Any) -> Any:
        """``self[key] = value`` within the bound; returns ``value``. Safe
        from several threads (lookups need no lock: a dict read is atomic)."""
        with self._insert_lock:
            self[key] = value
            while len(self) > self.max_entries:
                del self[next(iter(self))]
        return value

    def clear(self) -> None:
        with self._insert_lock:  # not under an eviction in another thread
            super().clear()
