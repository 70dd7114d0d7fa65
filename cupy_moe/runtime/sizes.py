"""Integer size arithmetic shared by every op family and the harness."""

from __future__ import annotations

__all__ = ["ceil_div", "align_up", "MAX_ROWS"]

# The most rows (X) a routing plan, and tokens (T) an expand call, may have:
# positions are int32, the mapping kernels index 3 * X rows of one buffer, and
# an expand launch's grid x counts up to T + X + X / 32 blocks. One bound, so
# that every plan fused_mapping makes fits expand.
MAX_ROWS = (2**31 - 1) // 3


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (b > 0), without floating point."""
    return -(-a // b)


def align_up(a: int, b: int) -> int:
    """The smallest multiple of ``b`` that is >= ``a``."""
    return ceil_div(a, b) * b
