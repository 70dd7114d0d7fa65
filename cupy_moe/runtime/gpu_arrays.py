"""The two GPU array kinds behind one interface: CuPy arrays and CUDA tensors.

Each op's GPU code asks ``gpu_library(kind)`` for the class of its arrays and
uses only these static methods: current stream, contiguity, raw pointers,
output allocation (each library's own allocator), reading one element back.
"""

from __future__ import annotations

import sys
from typing import Any

import cupy

from .arrays import ArrayKind

__all__ = ["TorchCuda", "Cupy", "gpu_library", "raw_torch_stream_getter"]


def raw_torch_stream_getter():
    """torch's current-stream getter that returns the raw handle as an int
    (~0.1 us; the public ``current_stream().cuda_stream`` costs ~4 us)."""
    torch = sys.modules["torch"]
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return getter or (lambda device: torch.cuda.current_stream(device).cuda_stream)


class TorchCuda:
    @staticmethod
    def stream(device: int) -> int:
        return raw_torch_stream_getter()(device)

    @staticmethod
    def device(a: Any) -> int:
        return a.device.index

    @staticmethod
    def contiguous(a: Any) -> Any:
        return a if a.is_contiguous() else a.contiguous()

    @staticmethod
    def pointer(a: Any) -> int:
        return a.data_ptr()

    @staticmethod
    def item_bytes(a: Any) -> int:
        return a.element_size()

    @staticmethod
    def empty(shape: tuple[int, ...], like: Any) -> Any:
        return like.new_empty(*shape)  # ints, not a tuple: torch parses them ~0.4 us faster

    @staticmethod
    def empty_col_major(rows: int, columns: int, leading_dim: int, like: Any) -> Any:
        """A ``[rows, columns]`` view, element strides ``(1, leading_dim)``, over
        a ``[columns, leading_dim]`` buffer (``leading_dim >= rows``: the pad
        columns are inside the allocation)."""
        full = like.new_empty_strided((leading_dim, columns), (1, leading_dim))
        # the slice costs a torch op (~1 us); leading_dim == rows needs none
        return full if leading_dim == rows else full[:rows]

    @staticmethod
    def empty_int32(count: int, like: Any) -> Any:
        return like.new_empty(count, dtype=sys.modules["torch"].int32)

    @staticmethod
    def flat_value(a: Any, index: int) -> int:
        return int(a.reshape(-1)[index].item())

    @staticmethod
    def to_numpy(a: Any) -> Any:
        """A host copy (synchronises with the current stream)."""
        return a.cpu().numpy()


class Cupy:
    @staticmethod
    def stream(device: int) -> int:
        # that device's current stream, whichever device is current (as
        # TorchCuda.stream): the callers switch to it first, but need not
        return cupy.cuda.get_current_stream(device).ptr

    @staticmethod
    def device(a: Any) -> int:
        return a.device.id

    @staticmethod
    def contiguous(a: Any) -> Any:
        return a if a.flags.c_contiguous else cupy.ascontiguousarray(a)

    @staticmethod
    def pointer(a: Any) -> int:
        return a.data.ptr

    @staticmethod
    def item_bytes(a: Any) -> int:
        return a.itemsize

    @staticmethod
    def empty(shape: tuple[int, ...], like: Any) -> Any:
        return cupy.empty(shape, dtype=like.dtype)

    @staticmethod
    def empty_col_major(rows: int, columns: int, leading_dim: int, like: Any) -> Any:
        return cupy.empty((columns, leading_dim), dtype=like.dtype)[:, :rows].T

    @staticmethod
    def empty_int32(count: int, like: Any) -> Any:
        return cupy.empty(count, dtype=cupy.int32)

    @staticmethod
    def flat_value(a: Any, index: int) -> int:
        return int(a.reshape(-1)[index])

    @staticmethod
    def to_numpy(a: Any) -> Any:
        """A host copy (synchronises with the current stream)."""
        return cupy.asnumpy(a)


def gpu_library(kind: ArrayKind):
    return TorchCuda if kind is ArrayKind.TORCH_CUDA else Cupy
