"""Zero-copy exchange of GPU arrays between torch and CuPy (DLPack).

CuPy has no bfloat16 or float8 dtypes, so those tensors cross as their bits:
bfloat16 as ``uint16``, every float8 type as ``uint8`` (the carriers the ops
take on CuPy). ``as_torch(array, dtype=...)`` restores the native dtype.
Both directions use the DLPack protocol, whose stream handshake makes the
consumer's current stream wait for the producer's: no host synchronisation,
and no copy (the result shares memory with the argument).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .runtime.extras import require_cupy, require_torch

__all__ = ["as_cupy", "as_torch"]

# torch dtypes CuPy cannot hold -> the same-size integer types that carry
# their bits: (torch type exported, CuPy type of the view given back)
_BITS_CARRIERS = {"bfloat16": ("int16", "uint16"), "float8_e4m3fn": ("uint8", "uint8"),
                  "float8_e5m2": ("uint8", "uint8"), "float8_e4m3fnuz": ("uint8", "uint8"),
                  "float8_e5m2fnuz": ("uint8", "uint8"), "float8_e8m0fnu": ("uint8", "uint8")}
_CARRIER_OF_SIZE = {1: "uint8", 2: "int16"}


def as_cupy(tensor: Any) -> Any:
    """A ``cupy.ndarray`` viewing the memory of a CUDA ``tensor`` (no copy).

    Same shape and strides; bfloat16 becomes ``uint16`` and float8 ``uint8``
    (their bits), every other dtype is kept.

    Raises TypeError for anything but a torch.Tensor, ValueError for a tensor
    that is not on a CUDA device.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor; got {type(tensor).__module__}."
                        f"{type(tensor).__qualname__}")
    if not tensor.is_cuda:
        raise ValueError(f"tensor must be on a CUDA device; got device '{tensor.device}'")
    cupy = require_cupy("as_cupy")

    name = str(tensor.dtype).removeprefix("torch.")
    if name in _BITS_CARRIERS:
        exported, carrier = _BITS_CARRIERS[name]
        return cupy.from_dlpack(tensor.view(getattr(torch, exported))).view(carrier)
    return cupy.from_dlpack(tensor)


def as_torch(array: Any, dtype: Any = None) -> Any:
    """A CUDA ``torch.Tensor`` viewing the memory of a ``cupy.ndarray`` (no copy).

    ``dtype``: the torch dtype to view the bits as (a ``torch.dtype``, or a
    name such as ``"bfloat16"`` or ``"float8_e4m3fn"``, or a NumPy /
    ml_dtypes dtype of that name); it must have the array's item size. None
    keeps the array's own dtype.

    Raises TypeError for anything but a cupy.ndarray or for an unknown
    dtype, ValueError when the item sizes differ.
    """
    cupy = sys.modules.get("cupy")
    if cupy is None or not isinstance(array, cupy.ndarray):
        raise TypeError(f"array must be a cupy.ndarray; got {type(array).__module__}."
                        f"{type(array).__qualname__}")
    torch = require_torch("as_torch")

    target = _torch_dtype(torch, dtype if dtype is not None else array.dtype)
    if target.itemsize != array.itemsize:
        raise ValueError(f"dtype {target} has {target.itemsize}-byte items, array "
                         f"{array.dtype} has {array.itemsize}-byte items; a view needs equal "
                         "sizes")
    name = str(target).removeprefix("torch.")
    if name in _BITS_CARRIERS or array.dtype == np.uint16:
        # through a carrier every DLPack version and torch release know
        array = array.view(_CARRIER_OF_SIZE[array.itemsize])
    return torch.from_dlpack(array).view(target)


def _torch_dtype(torch: Any, dtype: Any) -> Any:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise TypeError(f"dtype {dtype!r} names no torch dtype")
    return found
