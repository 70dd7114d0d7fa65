"""Integer size arithmetic shared by every op family and the harness."""

from __future__ import annotations

__all__ = ["ceil_div", "align_up"]


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (b > 0), without floating point."""
    return -(-a // b)


def align_up(a: int, b: int) -> int:
    """The smallest multiple of ``b`` that is >= ``a``."""
    return ceil_div(a, b) * b
