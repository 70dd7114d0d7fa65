"""The cache hints of kernels_cu/vector_access.cuh, as a module's defines.

A hint's index in ``LOAD_HINTS`` / ``STORE_HINTS`` is the value of the
header's VECTOR_LOAD_HINT / VECTOR_STORE_HINT; index 0, .cs (evict-first), is
the header's default and takes no define, so modules that keep it are
compiled as before. reduce_fused names hints by these strings (its launch
shape), expand's tuning by their indices.
"""

from __future__ import annotations

LOAD_HINTS = ("cs", "plain", "cg", "nc")  # .cs, plain (L1 and L2), .cg (L2 only), .nc
STORE_HINTS = ("cs", "plain", "cg")


def hint_defines(load: int, store: int) -> tuple[tuple[str, int], ...]:
    """The defines of load hint index ``load`` and store hint index ``store``
    (none for .cs)."""
    return tuple((name, int(index)) for name, index in (
        ("VECTOR_LOAD_HINT", load), ("VECTOR_STORE_HINT", store)) if index)


def require_hint_index(owner: str, name: str, value: object, hints: tuple[str, ...]) -> None:
    """ValueError unless ``value`` is an index into ``hints`` (a tuning's hint
    field, ``owner.name``; a bool is not one)."""
    if isinstance(value, bool) or value not in range(len(hints)):
        choices = ", ".join(str(i) for i in range(len(hints) - 1))
        raise ValueError(f"{owner}.{name} must be {choices} or {len(hints) - 1}; "
                         f"got {value!r}")


def half_l2_holds(touched_bytes: int, l2_bytes: int) -> bool:
    """Whether a call touching ``touched_bytes`` (the most it reads and
    writes) fits in half of an L2 of ``l2_bytes`` (0: unknown, never): its
    inputs may still be in L2 from the kernel that wrote them (a graph's next
    call, a layer's previous op), where loads without the evict-first hint
    find them. Sizes only, never the data: a CUDA graph can capture the call."""
    return l2_bytes > 0 and 2 * touched_bytes <= l2_bytes
