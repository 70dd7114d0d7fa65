"""GPU backend: CuPy arrays and CUDA torch tensors, through the NVRTC kernels.

Arguments are used in place (raw device pointers; no copies unless an input
is non-contiguous) and the kernels run on the caller's current stream: CuPy's
for CuPy arrays, torch's for tensors. Launches go straight to the driver with
a prebuilt ctypes argument block, which costs a fraction of CuPy's generic
argument conversion; nothing on this path synchronises with the host except
``validate=True``.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

import cupy
import numpy as np
from cupy.cuda import driver, runtime

from ._arrays import ArrayKind
from ._checks import ROUTING_ERROR_KINDS, ExpandProblem, raise_routing_error
from .loader import get_module

_SOURCE = "expand_to_fused.cu"
# Must match EXPAND_THREADS / EXPAND_UNROLL in kernels_cu/expand_to_fused.cu.
EXPAND_THREADS = 256
EXPAND_UNROLL = 4
ROWS_PER_ZERO_BLOCK = 8
_MAX_GRID_Y = 65535
_NONE_FOUND = 0x7F7F7F7F7F7F7F7F  # matches ROUTING_NONE in the kernel source

SF_NONE, SF_ROW_MAJOR, SF_COL_MAJOR = 0, 1, 2


class _ExpandArgs(ctypes.Structure):
    """Mirror of ``struct ExpandArgs`` in expand_to_fused.cu, field for field."""

    _fields_ = [
        ("x", ctypes.c_void_p),
        ("token_topk_to_pos", ctypes.c_void_p),
        ("pos_to_expert", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("x_sf", ctypes.c_void_p),
        ("out_sf", ctypes.c_void_p),
        ("row_bytes", ctypes.c_int64),
        ("num_tokens", ctypes.c_int32),
        ("top_k", ctypes.c_int32),
        ("num_expanded", ctypes.c_int32),
        ("sf_columns", ctypes.c_int32),
        ("sf_ld", ctypes.c_int32),
        ("rows_per_zero_block", ctypes.c_int32),
    ]


class _RoutingArgs(ctypes.Structure):
    """Mirror of ``struct RoutingArgs`` in expand_to_fused.cu."""

    _fields_ = [
        ("token_topk_to_pos", ctypes.c_void_p),
        ("pos_to_expert", ctypes.c_void_p),
        ("first_slot", ctypes.c_void_p),
        ("found", ctypes.c_void_p),
        ("num_slots", ctypes.c_int64),
        ("num_expanded", ctypes.c_int32),
    ]


class _ArgBlock(threading.local):
    """Per-thread argument blocks and the void* array cuLaunchKernel reads.

    The driver copies the arguments at launch, so one block per thread can be
    refilled for every call.
    """

    def __init__(self) -> None:
        self.expand = _ExpandArgs()
        self.expand_params = (ctypes.c_void_p * 1)(ctypes.addressof(self.expand))
        self.routing = _RoutingArgs()
        self.routing_params = (ctypes.c_void_p * 1)(ctypes.addressof(self.routing))


_arg_block = _ArgBlock()
_functions: dict[tuple[int, int, str], int] = {}


def _function(device: int, sf_mode: int, name: str) -> int:
    """Driver handle of kernel ``name`` of the ``sf_mode`` variant on ``device``."""
    key = (device, sf_mode, name)
    handle = _functions.get(key)
    if handle is None:
        module = get_module(_SOURCE, (("CUPY_MOE_SF_MODE", sf_mode),), device)
        # RawKernel.kernel is the loaded cupy.cuda.Function; the cached module
        # keeps its code alive.
        handle = _functions.setdefault(key, module.get_function(name).kernel.ptr)
    return handle


def _vector_bytes(row_bytes: int, *pointers: int) -> int:
    """Widest access (16, 8, 4, 2, 1 bytes) dividing the row and every base address."""
    bits = row_bytes | 16
    for pointer in pointers:
        bits |= pointer
    return bits & -bits


# -- the two GPU array kinds -------------------------------------------------

class _TorchCuda:
    @staticmethod
    def contiguous(a: Any) -> Any:
        return a if a.is_contiguous() else a.contiguous()

    @staticmethod
    def pointer(a: Any) -> int:
        return a.data_ptr()

    @staticmethod
    def stream(device: int) -> int:
        torch_c = sys.modules["torch"]._C
        getter = getattr(torch_c, "_cuda_getCurrentRawStream", None)
        if getter is not None:
            return getter(device)
        return sys.modules["torch"].cuda.current_stream(device).cuda_stream

    @staticmethod
    def empty(shape: tuple[int, ...], like: Any) -> Any:
        return sys.modules["torch"].empty(shape, dtype=like.dtype, device=like.device)

    @staticmethod
    def flat_value(a: Any, index: int) -> int:
        return int(a.reshape(-1)[index].item())


class _Cupy:
    @staticmethod
    def contiguous(a: Any) -> Any:
        return a if a.flags.c_contiguous else cupy.ascontiguousarray(a)

    @staticmethod
    def pointer(a: Any) -> int:
        return a.data.ptr

    @staticmethod
    def stream(device: int) -> int:
        return cupy.cuda.get_current_stream().ptr

    @staticmethod
    def empty(shape: tuple[int, ...], like: Any) -> Any:
        return cupy.empty(shape, dtype=like.dtype)

    @staticmethod
    def flat_value(a: Any, index: int) -> int:
        return int(a.reshape(-1)[index])


class _OnDevice:
    """Make ``device`` current for the call, only when it is not already."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.previous = None

    def __enter__(self) -> None:
        current = runtime.getDevice()
        if current != self.device:
            self.previous = current
            runtime.setDevice(self.device)

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            runtime.setDevice(self.previous)


def run_expand(kind: ArrayKind, problem: ExpandProblem, x: Any, x_sf: Any,
               token_topk_to_pos: Any, pos_to_expert: Any,
               out: Any, out_sf: Any, validate: bool) -> tuple[Any, Any]:
    """Both ops on the GPU; ``x_sf`` is None for the op without scale factors.

    Returns ``(out, out_sf)`` of the caller's kind; caller-provided outputs are
    written in place and returned as the same objects.
    """
    lib = _TorchCuda if kind is ArrayKind.TORCH_CUDA else _Cupy
    device = x.device.index if kind is ArrayKind.TORCH_CUDA else x.device.id
    with _OnDevice(device):
        stream = lib.stream(device)
        token_topk_to_pos = lib.contiguous(token_topk_to_pos)
        pos_to_expert = lib.contiguous(pos_to_expert)
        if validate:
            _validate_routing(lib, problem, token_topk_to_pos, pos_to_expert, device, stream)
        x = lib.contiguous(x)
        if out is None:
            out = lib.empty(problem.out_shape(), x)
        sf_mode = SF_NONE
        if x_sf is not None:
            x_sf = lib.contiguous(x_sf)
            sf_mode = SF_COL_MAJOR if problem.sf_col_major else SF_ROW_MAJOR
            if out_sf is None:
                if problem.sf_col_major:
                    buffer = lib.empty((problem.sf_columns, problem.sf_leading_dim), x_sf)
                    out_sf = buffer[:, :problem.num_expanded].T
                else:
                    out_sf = lib.empty(problem.out_sf_shape(), x_sf)
        _launch_expand(problem, sf_mode, device, stream, lib.pointer(x), lib.pointer(token_topk_to_pos),
                       lib.pointer(pos_to_expert), lib.pointer(out),
                       0 if x_sf is None else lib.pointer(x_sf),
                       0 if out_sf is None else lib.pointer(out_sf),
                       x.element_size() if kind is ArrayKind.TORCH_CUDA else x.itemsize)
    return out, out_sf


def _launch_expand(problem: ExpandProblem, sf_mode: int, device: int, stream: int,
                   x_ptr: int, map_ptr: int, p2e_ptr: int, out_ptr: int,
                   x_sf_ptr: int, out_sf_ptr: int, item_bytes: int) -> None:
    row_bytes = problem.hidden * item_bytes
    vec_bytes = _vector_bytes(row_bytes, x_ptr, out_ptr)
    chunks = -(-(row_bytes // vec_bytes) // (EXPAND_THREADS * EXPAND_UNROLL))
    if chunks > _MAX_GRID_Y:
        raise ValueError(f"x rows of {row_bytes} bytes are too long for one launch "
                         f"(at most {_MAX_GRID_Y * EXPAND_THREADS * EXPAND_UNROLL * vec_bytes})")
    zero_rows = problem.sf_leading_dim if sf_mode == SF_COL_MAJOR else problem.num_expanded
    grid_x = problem.num_tokens + -(-zero_rows // ROWS_PER_ZERO_BLOCK)
    if grid_x == 0:
        return
    a = _arg_block.expand
    a.x, a.token_topk_to_pos, a.pos_to_expert, a.out = x_ptr, map_ptr, p2e_ptr, out_ptr
    a.x_sf, a.out_sf = x_sf_ptr, out_sf_ptr
    a.row_bytes = row_bytes
    a.num_tokens, a.top_k, a.num_expanded = problem.num_tokens, problem.top_k, problem.num_expanded
    a.sf_columns, a.sf_ld = problem.sf_columns, problem.sf_leading_dim
    a.rows_per_zero_block = ROWS_PER_ZERO_BLOCK
    function = _function(device, sf_mode, f"expand_to_fused_v{vec_bytes}")
    driver.launchKernel(function, grid_x, chunks, 1, EXPAND_THREADS, 1, 1, 0, stream,
                        ctypes.addressof(_arg_block.expand_params), 0)


def _validate_routing(lib, problem: ExpandProblem, token_topk_to_pos: Any, pos_to_expert: Any,
                      device: int, stream: int) -> None:
    """Run the routing checks on ``stream``; one host synchronisation."""
    num_slots = problem.num_tokens * problem.top_k
    first_slot = cupy.empty(max(problem.num_expanded, 1), dtype=cupy.int64)
    found = cupy.empty(len(ROUTING_ERROR_KINDS), dtype=cupy.int64)
    for scratch in (first_slot, found):  # every byte 0x7F: the "none found" sentinel
        runtime.memsetAsync(scratch.data.ptr, 0x7F, scratch.nbytes, stream)
    a = _arg_block.routing
    a.token_topk_to_pos = lib.pointer(token_topk_to_pos)
    a.pos_to_expert = lib.pointer(pos_to_expert)
    a.first_slot, a.found = first_slot.data.ptr, found.data.ptr
    a.num_slots, a.num_expanded = num_slots, problem.num_expanded
    blocks = max(1, min(1024, -(-max(num_slots, problem.num_expanded) // 256)))
    params = ctypes.addressof(_arg_block.routing_params)
    for name in ("routing_first_slots", "routing_repeats_and_gaps"):
        driver.launchKernel(_function(device, SF_NONE, name), blocks, 1, 1, 256, 1, 1, 0,
                            stream, params, 0)
    found_host = np.empty(len(ROUTING_ERROR_KINDS), dtype=np.int64)
    runtime.memcpyAsync(found_host.ctypes.data, found.data.ptr, found_host.nbytes,
                        runtime.memcpyDeviceToHost, stream)
    runtime.streamSynchronize(stream)
    first = {kind: (-1 if value == _NONE_FOUND else int(value))
             for kind, value in zip(ROUTING_ERROR_KINDS, found_host)}
    raise_routing_error(first, problem, lambda i: lib.flat_value(token_topk_to_pos, i))
