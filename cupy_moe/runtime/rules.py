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
    """``value`` as a Python int; TypeError for bools (a 0-d bool array or
    tensor too), floats and non-numbers."""
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)) or str(getattr(value, "dtype", "")).endswith("bool"):
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
              expected_dtype: str | tuple[str, ...], *,
              dtype_reason: str | None = "that of the input") -> None:
    """A caller-provided output must match the result it stands for exactly:
    writeable, the result's shape, its dtype (or one of ``expected_dtype``
    where several carry the same bits); the message gives ``dtype_reason``."""
    allowed = (expected_dtype,) if isinstance(expected_dtype, str) else tuple(expected_dtype)
    if not desc.writeable:
        raise ValueError(f"{name} is read-only; an output must be writeable")
    if tuple(desc.shape) != tuple(expected_shape):
        raise ValueError(f"{name} must have shape {tuple(expected_shape)}; "
                         f"got {tuple(desc.shape)}")
    if desc.dtype not in allowed:
        reason = f" ({dtype_reason})" if dtype_reason else ""
        raise ValueError(f"{name} must have dtype {' or '.join(allowed)}{reason}; "
                         f"got {desc.dtype}")


def check_strides(name: str, kind: ArrayKind, array: Any, expected: tuple[int, ...],
                  layout: str) -> None:
    """Element strides must agree on every dimension longer than 1 (the others
    are never stepped); an empty array has no element to step to (NumPy 2
    gives it zero strides), so any strides do."""
    if 0 in tuple(array.shape):
        return
    strides = element_strides(kind, array)
    if not all(n <= 1 or s == e for n, s, e in zip(array.shape, strides, expected, strict=True)):
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
    named_inputs = [(name, array, 0) for name, array in named_inputs]
    for i, (out_name, out, extent) in enumerate(named_outputs):
        for other_name, other, other_extent in named_inputs + named_outputs[i + 1:]:
            if _overlap(kind, (out, extent), (other, other_extent)):
                raise ValueError(f"{out_name} overlaps {other_name} in memory; outputs must "
                                 "not share memory with the inputs or with each other")


def _overlap(kind: ArrayKind, a: tuple[Any, int], b: tuple[Any, int]) -> bool:
    """Whether two (array, written_bytes) entries share memory."""
    if kind.on_gpu:
        (low, high), (other_low, other_high) = (_written_span(kind, *a),
                                                _written_span(kind, *b))
        return low < other_high and other_low < high
    return bool(np.shares_memory(_written_view(kind, *a), _written_view(kind, *b)))


def _written_span(kind: ArrayKind, array: Any, extent: int) -> tuple[int, int]:
    low, high = byte_span(kind, array)
    if extent and high > low:
        high = max(high, low + extent)
    return low, high


def _written_view(kind: ArrayKind, array: Any, extent: int) -> np.ndarray:
    """A NumPy view of the bytes the op touches: the array, or with
    ``extent``, a flat view of that many bytes from its first element (the
    column-major SF's pad columns lie past the view)."""
    if kind is ArrayKind.TORCH_CPU:
        array = torch_to_numpy(array)
    if extent and array.size:
        return np.lib.stride_tricks.as_strided(array, (extent // array.itemsize,),
                                               (array.itemsize,))
    return array
