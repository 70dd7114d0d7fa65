"""Array kinds, one description of an array, and CPU conversions.

``describe(name, array)`` is the only place that reads an argument's kind,
shape, dtype, device and flags: the argument rules read its result, and the
torch fast path uses the very same tuples as its cache key, so a call the
fast path lets through is one the rules have already passed.

torch and CuPy are optional: they are looked up in ``sys.modules`` rather than
imported, since an argument of theirs can only exist once they are imported.
"""

from __future__ import annotations

import enum
import sys
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

__all__ = ["ArrayKind", "ArrayDesc", "describe", "torch_fields", "common_kind", "torch_to_numpy",
           "numpy_to_torch", "element_strides", "bytes_to_allocation_end", "byte_span"]


class ArrayKind(str, enum.Enum):
    # a str mixin: a plain Enum hashes in Python (~0.1 us), and kinds are part
    # of the fast path's key, hashed on every eager call
    NUMPY = "numpy.ndarray"
    TORCH_CPU = "torch.Tensor (cpu)"
    TORCH_CUDA = "torch.Tensor (cuda)"
    CUPY = "cupy.ndarray"

    @property
    def on_gpu(self) -> bool:
        return self in (ArrayKind.TORCH_CUDA, ArrayKind.CUPY)

    @property
    def is_torch(self) -> bool:
        return self in (ArrayKind.TORCH_CPU, ArrayKind.TORCH_CUDA)


class ArrayDesc(NamedTuple):
    """What the rules may read of an array argument (hashable: a cache key part).

    ``dtype`` is the canonical name (NumPy's, or torch's without ``torch.``);
    ``device`` the CUDA ordinal (None on the CPU); ``contiguous`` C order;
    ``requires_grad`` only ever True for torch; ``writeable`` only ever False
    for a read-only NumPy array.
    """

    kind: ArrayKind
    shape: tuple
    dtype: str
    device: int | None
    contiguous: bool
    requires_grad: bool
    writeable: bool


# Enum member lookups cost ~0.1 us each: the hot path reads these globals.
_TORCH_CUDA, _TORCH_CPU = ArrayKind.TORCH_CUDA, ArrayKind.TORCH_CPU

# torch dtype -> canonical name, filled as dtypes are met (str() costs ~0.3 us)
_torch_dtype_names: dict[Any, str] = {}


def _torch_dtype_name(dtype: Any) -> str:
    name = _torch_dtype_names.get(dtype)
    if name is None:
        name = _torch_dtype_names[dtype] = str(dtype).removeprefix("torch.")
    return name


def torch_fields(name: str, tensor: Any) -> tuple:
    """The fields of a tensor's ArrayDesc, as a plain tuple.

    The one place tensor properties are read: ``describe`` wraps it, and the
    torch fast path uses it as is for its key (a plain tuple equals, and
    hashes like, the ArrayDesc of the same fields, and costs ~0.25 us less
    to build, which is most of an eager decode call's margin).
    AttributeError for anything that is not a tensor.
    """
    if tensor.is_cuda:
        return (_TORCH_CUDA, tensor.shape, _torch_dtype_names.get(tensor.dtype)
                or _torch_dtype_name(tensor.dtype), tensor.get_device(),
                tensor.is_contiguous(), tensor.requires_grad, True)
    if tensor.device.type != "cpu":
        raise ValueError(f"{name} is a tensor on device '{tensor.device}'; cupy_moe takes "
                         "CPU and CUDA tensors")
    return (_TORCH_CPU, tensor.shape, _torch_dtype_name(tensor.dtype), None,
            tensor.is_contiguous(), tensor.requires_grad, True)


def describe(name: str, array: Any) -> ArrayDesc:
    """The description of argument ``name``.

    Raises TypeError naming ``name`` for anything that is not a NumPy array,
    CuPy array or torch tensor (None included), and ValueError for a tensor
    on a device other than the CPU or a CUDA GPU (e.g. ``meta``), a sparse
    tensor, a lazily negated tensor view, or a NumPy array of non-native
    byte order.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        if array.layout is not torch.strided:  # (the fast path only keeps strided ones)
            raise ValueError(f"{name} is a {str(array.layout).removeprefix('torch.')} tensor; "
                             f"cupy_moe takes dense ones (pass {name}.to_dense())")
        # The kernels and NumPy read the stored bytes, not their negation; not
        # resolved for the caller (a copy: an out so copied would lose the
        # results). A non-contiguous one is refused or copied (resolved) by the
        # rules anyway; a contiguous one comes from torch._neg_view alone, and
        # the fast path's key leaves the bit out (~0.2 us a tensor).
        if array.is_neg():
            raise ValueError(f"{name} is a lazily negated view (torch's negative bit is set): "
                             f"pass {name}.resolve_neg()")
        return ArrayDesc._make(torch_fields(name, array))
    if isinstance(array, np.ndarray):
        if not array.dtype.isnative:  # the kernels and the NumPy backend read raw bytes
            raise ValueError(f"{name} has non-native byte order (dtype '{array.dtype.str}'); "
                             f"pass {name}.astype({array.dtype.newbyteorder('=').str!r})")
        flags = array.flags
        return ArrayDesc(ArrayKind.NUMPY, array.shape, array.dtype.name, None,
                         flags.c_contiguous, False, flags.writeable)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(array, cupy.ndarray):
        return ArrayDesc(ArrayKind.CUPY, array.shape, array.dtype.name, array.device.id,
                         array.flags.c_contiguous, False, True)
    got = "None" if array is None else f"{type(array).__module__}.{type(array).__qualname__}"
    raise TypeError(f"{name} must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got {got}")


def common_kind(descs: dict[str, ArrayDesc | None]) -> tuple[ArrayKind, int | None]:
    """The one kind and device of all described arrays (None entries skipped).

    Raises TypeError when two kinds are mixed, ValueError when two GPU arrays
    sit on different devices (naming both arguments), and TypeError for a
    torch tensor that requires grad while grad mode is on: the ops are
    inference-only and record nothing for autograd.
    """
    first_name = kind = device = None
    for name, desc in descs.items():
        if desc is None:
            continue
        if kind is None:
            first_name, kind, device = name, desc.kind, desc.device
        elif desc.kind is not kind:
            raise TypeError(f"all arrays must be of one kind: {first_name} is {kind.value}, "
                            f"{name} is {desc.kind.value}")
        elif desc.device != device:
            raise ValueError(f"all arrays must be on one device: {first_name} is on "
                             f"cuda:{device}, {name} is on cuda:{desc.device}")
        if desc.requires_grad and sys.modules["torch"].is_grad_enabled():
            raise TypeError(f"{name} requires grad, but cupy_moe ops are inference-only (no "
                            f"autograd): pass {name}.detach() or call under torch.no_grad()")
    return kind, device


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
    # A lazily negated view (``z.conj().imag``) raises here, torch's error
    # saying to call resolve_neg() first: resolving it for the caller would
    # copy, and an ``out`` so copied would lose the results.
    name = _torch_dtype_name(tensor.dtype)
    if name in _TORCH_VIA_BITS:
        bits, np_dtype = _TORCH_VIA_BITS[name]
        return tensor.view(getattr(torch, bits)).numpy().view(np_dtype)
    return tensor.numpy()


def numpy_to_torch(array: np.ndarray) -> Any:
    """A CPU tensor sharing ``array``'s memory, torch's native dtype. An empty
    array gives a fresh contiguous tensor: NumPy 2 gives empty arrays zero
    strides, which some torch ops (``torch._grouped_mm``) refuse."""
    torch = sys.modules["torch"]
    name = array.dtype.name
    if array.size == 0:
        return torch.empty(array.shape, dtype=numpy_to_torch(np.empty(1, array.dtype)).dtype)
    if name in _TORCH_VIA_BITS:
        bits, _ = _TORCH_VIA_BITS[name]
        return torch.from_numpy(array.view(bits)).view(getattr(torch, name))
    return torch.from_numpy(array)


def element_strides(kind: ArrayKind, array: Any) -> tuple[int | float, ...]:
    """Strides in elements. A NumPy or CuPy view may step a byte count that is
    no whole number of elements (``np.ndarray(..., strides=(7, 3))``): such
    a stride comes back as a fraction, which equals no layout's stride (a
    floor division would pass a self-overlapping view as C-contiguous)."""
    if kind.is_torch:
        return tuple(array.stride())
    item = array.itemsize
    return tuple(s // item if s % item == 0 else s / item for s in array.strides)


def byte_span(kind: ArrayKind, array: Any) -> tuple[int, int]:
    """``[first, end)`` device addresses of the bytes a GPU array's view touches
    (``(0, 0)`` when it is empty)."""
    if kind is ArrayKind.CUPY:
        address, item, strides = array.data.ptr, array.itemsize, array.strides
    else:
        item = array.element_size()
        address, strides = array.data_ptr(), [s * item for s in array.stride()]
    if 0 in array.shape:
        return (0, 0)
    low = high = address
    for n, stride in zip(array.shape, strides, strict=True):
        reach = (n - 1) * stride
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return (low, high + item)


def bytes_to_allocation_end(kind: ArrayKind, array: Any) -> int:
    """Bytes from ``array``'s first element to the end of the memory it views.

    Tells whether a view (a column-major SF output) may be written past its
    own last element, into pad columns of the buffer behind it. For a CuPy
    array imported by DLPack that is as far as the imported array reaches
    (import the whole buffer, then take the view in CuPy).
    """
    if kind.is_torch:
        return array.untyped_storage().nbytes() - array.storage_offset() * array.element_size()
    if kind is ArrayKind.CUPY:
        memory = array.data.mem
        if type(memory).__name__ != "DLPackMemory":
            # CuPy's own allocation (from its pool: rounded up to 512 bytes, a
            # slack that belongs to the array's allocation too)
            return memory.size - (array.data.ptr - memory.ptr)
        # Imported by DLPack: CuPy does not know the exporter's allocation (its
        # DLPackMemory.size sums the shape instead of multiplying it), only
        # the imported array's extent, the root of the view chain.
        ndarray, root = sys.modules["cupy"].ndarray, array
        while isinstance(root.base, ndarray):
            root = root.base
        return byte_span(ArrayKind.CUPY, root)[1] - array.data.ptr
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
