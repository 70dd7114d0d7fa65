"""Array kinds: which library an argument belongs to, and CPU conversions.

torch and CuPy are optional: they are looked up in ``sys.modules`` rather than
imported, since an argument of theirs can only exist once they are imported.
"""

from __future__ import annotations

import enum
import sys
from typing import Any

import ml_dtypes
import numpy as np


class ArrayKind(enum.Enum):
    NUMPY = "numpy.ndarray"
    TORCH_CPU = "torch.Tensor (cpu)"
    TORCH_CUDA = "torch.Tensor (cuda)"
    CUPY = "cupy.ndarray"

    @property
    def on_gpu(self) -> bool:
        return self in (ArrayKind.TORCH_CUDA, ArrayKind.CUPY)


def kind_of(name: str, array: Any) -> ArrayKind:
    """The kind of ``array``; TypeError naming ``name`` for anything else."""
    if isinstance(array, np.ndarray):
        return ArrayKind.NUMPY
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        return ArrayKind.TORCH_CUDA if array.is_cuda else ArrayKind.TORCH_CPU
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(array, cupy.ndarray):
        return ArrayKind.CUPY
    raise TypeError(
        f"{name} must be a numpy.ndarray, cupy.ndarray or torch.Tensor; "
        f"got {type(array).__module__}.{type(array).__qualname__}"
    )


def device_of(kind: ArrayKind, array: Any) -> int | None:
    """CUDA device ordinal of a GPU array, None on the CPU."""
    if kind is ArrayKind.TORCH_CUDA:
        return array.device.index
    if kind is ArrayKind.CUPY:
        return array.device.id
    return None


def common_kind(arrays: dict[str, Any]) -> tuple[ArrayKind, int | None]:
    """The one kind and device of all named arrays (None values are skipped).

    Raises TypeError when two kinds are mixed and ValueError when two GPU
    arrays sit on different devices, naming both arguments.
    """
    first_name = kind = device = None
    for name, array in arrays.items():
        if array is None:
            continue
        this_kind = kind_of(name, array)
        this_device = device_of(this_kind, array)
        if kind is None:
            first_name, kind, device = name, this_kind, this_device
        elif this_kind is not kind:
            raise TypeError(
                f"all arrays must be of one kind: {first_name} is {kind.value}, "
                f"{name} is {this_kind.value}"
            )
        elif this_device != device:
            raise ValueError(
                f"all arrays must be on one device: {first_name} is on cuda:{device}, "
                f"{name} is on cuda:{this_device}"
            )
    return kind, device


def dtype_name(kind: ArrayKind, array: Any) -> str:
    """Canonical dtype name: numpy's name, or torch's without ``torch.``."""
    if kind in (ArrayKind.TORCH_CPU, ArrayKind.TORCH_CUDA):
        return str(array.dtype).removeprefix("torch.")
    return array.dtype.name


# torch CPU tensors <-> NumPy arrays, sharing memory. NumPy has no bfloat16 or
# float8 of its own: ml_dtypes names them, the bytes are viewed through a
# same-size integer type on the torch side.
_TORCH_VIA_BITS = {
    "bfloat16": ("int16", ml_dtypes.bfloat16),
    "float8_e4m3fn": ("uint8", ml_dtypes.float8_e4m3fn),
}


def torch_to_numpy(tensor: Any) -> np.ndarray:
    """A NumPy view of a CPU tensor (any strides), native dtype via ml_dtypes."""
    torch = sys.modules["torch"]
    name = str(tensor.dtype).removeprefix("torch.")
    if name in _TORCH_VIA_BITS:
        bits, np_dtype = _TORCH_VIA_BITS[name]
        return tensor.view(getattr(torch, bits)).numpy().view(np_dtype)
    return tensor.numpy()


def numpy_to_torch(array: np.ndarray) -> Any:
    """A CPU tensor sharing ``array``'s memory, torch's native dtype."""
    torch = sys.modules["torch"]
    name = array.dtype.name
    if name in _TORCH_VIA_BITS:
        bits, _ = _TORCH_VIA_BITS[name]
        return torch.from_numpy(array.view(bits)).view(getattr(torch, name))
    return torch.from_numpy(array)


def element_strides(kind: ArrayKind, array: Any) -> tuple[int, ...]:
    if kind in (ArrayKind.TORCH_CPU, ArrayKind.TORCH_CUDA):
        return tuple(array.stride())
    return tuple(s // array.itemsize for s in array.strides)


def bytes_to_allocation_end(kind: ArrayKind, array: Any) -> int:
    """Bytes from ``array``'s first element to the end of the memory it views.

    Tells whether a view (the column-major SF output) may be written past its
    own last element, into pad columns of the buffer behind it.
    """
    if kind in (ArrayKind.TORCH_CPU, ArrayKind.TORCH_CUDA):
        return array.untyped_storage().nbytes() - array.storage_offset() * array.element_size()
    if kind is ArrayKind.CUPY:
        return array.data.mem.size - (array.data.ptr - array.data.mem.ptr)
    return _byte_bounds(_numpy_owner(array))[1] - array.ctypes.data


def _numpy_owner(array: np.ndarray) -> np.ndarray:
    """The array that owns ``array``'s memory, through views and as_strided."""
    owner = array
    while True:
        base = owner.base
        if isinstance(base, np.ndarray):
            owner = base
        elif isinstance(getattr(base, "base", None), np.ndarray):
            owner = base.base  # as_strided wraps the real array in a DummyArray
        else:
            return owner


# np.byte_bounds moved to np.lib.array_utils in NumPy 2.0.
_byte_bounds = getattr(getattr(np.lib, "array_utils", None), "byte_bounds", None) or getattr(
    np, "byte_bounds", None)
