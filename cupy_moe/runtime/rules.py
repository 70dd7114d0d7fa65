"""Argument rules every op shares, and their error messages.

Rules read ``ArrayDesc`` tuples (``describe``), never the arrays, except where
a rule is about memory itself (strides, overlap). Every message names the
argument and the numbers.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .arrays import ArrayDesc, ArrayKind, byte_span, element_strides, torch_to_numpy

__all__ = ["require_int", "require_bool", "check_ndim", "check_dtype", "check_out",
           "check_strides", "check_no_overlap"]


def require_int(name: str, value: Any) -> int:
    """``value`` as a Python int; TypeError for bools, floats and non-numbers."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int; got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}") from None


def require_bool(name: str, value: Any) -> bool:
    """``value`` as a Python bool; TypeError for anything but True / False."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {type(value).__name__} {value!r}")
    return bool(value)


def check_ndim(name: str, desc: ArrayDesc, ndim: int, layout: str) -> None:
    if len(desc.shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}; got shape {tuple(desc.shape)}")


def check_dtype(name: str, desc: ArrayDesc, allowed: tuple[str, ...]) -> None:
    if desc.dtype not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {desc.dtype}")


def check_out(name: str, desc: ArrayDesc, expected_shape: tuple[int, ...],
              expected_dtype: str) -> None:
    """A caller-provided output must match the result it stands for exactly."""
    if not desc.writeable:
        raise ValueError(f"{name} is read-only; an output must be writeable")
    if tuple(desc.shape) != tuple(expected_shape):
        raise ValueError(f"{name} must have shape {tuple(expected_shape)}; "
                         f"got {tuple(desc.shape)}")
    if desc.dtype != expected_dtype:
        raise ValueError(f"{name} must have dtype {expected_dtype} (that of the input); "
                         f"got {desc.dtype}")


def check_strides(name: str, kind: ArrayKind, array: Any, expected: tuple[int, ...],
                  layout: str) -> None:
    """Element strides must agree on every dimension longer than 1 (the others
    are never stepped); an empty array has no element to step to (NumPy 2
    gives it zero strides), so any strides do."""
    if 0 in tuple(array.shape):
        return
    strides = element_strides(kind, array)
    if not all(n <= 1 or s == e for n, s, e in zip(array.shape, strides, expected)):
        raise ValueError(f"{name} must be {layout}, element strides {tuple(expected)}; "
                         f"got {tuple(strides)}")


def check_no_overlap(kind: ArrayKind, outputs: dict[str, tuple[Any, int]],
                     inputs: dict[str, Any]) -> None:
    """No output may share memory with an input or with another output.

    ``outputs`` maps a name to ``(array, written_bytes)``: ``written_bytes`` > 0
    is how far from its first element the op writes when that reaches past
    the view (the column-major SF's pad columns); 0 means the view itself.
    On the CPU the test is NumPy's exact ``np.shares_memory``; on the GPU it
    compares address ranges. Entries that are None are skipped.
    """
    named_outputs = [(name, array, extent) for name, (array, extent) in outputs.items()
                     if array is not None]
    named_inputs = [(name, array) for name, array in inputs.items() if array is not None]
    for i, (out_name, out, extent) in enumerate(named_outputs):
        others = named_inputs + [(name, array) for name, array, _ in named_outputs[i + 1:]]
        for other_name, other in others:
            if _overlap(kind, out, extent, other):
                raise ValueError(f"{out_name} overlaps {other_name} in memory; outputs must "
                                 "not share memory with the inputs or with each other")


def _overlap(kind: ArrayKind, out: Any, extent: int, other: Any) -> bool:
    if kind.on_gpu:
        low, high = byte_span(kind, out)
        if extent and high > low:
            high = max(high, low + extent)
        other_low, other_high = byte_span(kind, other)
        return low < other_high and other_low < high
    if kind is ArrayKind.TORCH_CPU:
        out, other = torch_to_numpy(out), torch_to_numpy(other)
    return bool(np.shares_memory(out, other))
