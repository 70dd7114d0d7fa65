"""GPU backend: CuPy arrays and CUDA torch tensors, through the NVRTC kernels.

Arguments are used in place (raw device pointers; no copies unless an input
is non-contiguous) and the kernels run on the caller's current stream: CuPy's
for CuPy arrays, torch's for tensors. Nothing on this path synchronises with
the host except ``validate=True``.

Per-call host work is what decode latency is made of, so everything that
depends only on shapes and dtypes is done once per configuration: a ``_Plan``
holds the grid, the constant part of the argument block and the kernel
handles, and launches go straight to ``cuLaunchKernel`` with an argument
block packed by one ``struct.pack_into``. For torch tensors, a call whose
signature (types, shapes, dtypes, devices, contiguity) matches one already
checked skips the checks entirely (``torch_fast_call``).
"""

from __future__ import annotations

import ctypes
import struct
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
# Compile-time configuration of the expand kernels (defines of the variant).
KERNEL_CONFIG = {"EXPAND_THREADS": 256, "EXPAND_UNROLL": 4, "EXPAND_STREAMING": 1,
                 "BULK_EVICT_FIRST": 1}
# Grid policy (see _Plan._shape_grid); block counts in multiples of the SM count.
# Bulk-copy kernel (sm_90+, 16-byte rows): used when rows cut into chunks of
# BULK_MIN_CHUNK_BYTES give at least BULK_MIN_BLOCKS blocks; a row is cut into
# the fewest equal chunks (at most BULK_MAX_CHUNK_BYTES each) that give
# BULK_TARGET_BLOCKS blocks, or as many as the minimum size allows; below
# BULK_SPLIT_SLOTS_BELOW token chunks, the K slots are split into
# BULK_SLOT_PLANES groups (z planes; a chunk is then loaded once per group).
# Register kernel, small batches: below SHRINK_CHUNKS_BELOW token chunks,
# chunks shrink to one access per thread; below SPLIT_SLOTS_BELOW, each block
# takes one slot. ZERO_ROWS_*: output rows per zero-fill block (1 .. 32) of
# each kernel: a zero-fill block writes its padding rows one after another, so
# few rows keep it from being the launch's longest block (benchmarks/NOTES.md v6).
# Bulk rows of at least BULK_WHOLE_ROW_ZERO_FROM bytes are zero-filled by
# blocks of ZERO_ROWS_BULK_WHOLE whole rows (expand_to_fused_bulk_zero_rows:
# gridDim.y times fewer blocks), shorter ones by blocks of ZERO_ROWS_BULK
# rows' column chunk; measured, not derived: whole rows won on the 14 KiB
# rows of Kimi-K2 and lost on the 6-7 KiB ones (benchmarks/NOTES.md v7).
GRID_POLICY = {"BULK_MIN_BLOCKS": 1.0, "BULK_TARGET_BLOCKS": 12.0,
               "SHRINK_CHUNKS_BELOW": 2.0, "SPLIT_SLOTS_BELOW": 1.0,
               "BULK_MIN_CHUNK_BYTES": 2048, "BULK_MAX_CHUNK_BYTES": 16384,
               "ZERO_ROWS_REGISTERS": 2, "ZERO_ROWS_BULK": 4,
               "BULK_WHOLE_ROW_ZERO_FROM": 8192, "ZERO_ROWS_BULK_WHOLE": 2,
               "BULK_SPLIT_SLOTS_BELOW": 0.0, "BULK_SLOT_PLANES": 2}
BULK_SHARED_LIMIT = 16384  # the most dynamic shared memory the bulk kernel asks for
_BULK_THREADS = 32
_MAX_GRID_Y = 65535
_NONE_FOUND = 0x7F7F7F7F7F7F7F7F  # ROUTING_NONE in the kernel source

SF_NONE, SF_ROW_MAJOR, SF_COL_MAJOR = 0, 1, 2

# struct ExpandArgs of expand_to_fused.cu: x, token_topk_to_pos, pos_to_expert,
# out, x_sf, out_sf (pointers); row_bytes (int64); num_tokens, top_k,
# num_expanded, sf_columns, sf_ld, rows_per_zero_block, vecs_per_thread,
# slots_per_block (int32).
_EXPAND_ARGS = struct.Struct("<6Qq8i")
_EXPAND_POINTERS = struct.Struct("<6Q")  # the leading pointers alone
# struct RoutingArgs: token_topk_to_pos, pos_to_expert, first_slot, found
# (pointers); num_slots (int64); num_expanded (int32), padded to 8 bytes.
_ROUTING_ARGS = struct.Struct("<4Qqi4x")


class _ArgBlock(threading.local):
    """A per-thread argument block and the one-entry void* array pointing at it.

    The driver copies the argument bytes at launch, so the block can be
    refilled for every call; per thread, so concurrent callers don't collide.
    Given a kernel launch's constant tail (the ExpandArgs fields after the
    pointers), each thread's block starts with it packed, and a call only
    packs the six pointers.
    """

    def __init__(self, tail: tuple | None = None) -> None:
        self.buffer = (ctypes.c_uint64 * 16)()
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(self.buffer))
        self.params_address = ctypes.addressof(self.params)
        if tail is not None:
            _EXPAND_ARGS.pack_into(self.buffer, 0, 0, 0, 0, 0, 0, 0, *tail)


_arg_block = _ArgBlock()
_functions: dict[tuple, int] = {}


def _defines(sf_mode: int) -> tuple[tuple[str, int], ...]:
    return (("CUPY_MOE_SF_MODE", sf_mode), *sorted(KERNEL_CONFIG.items()))


def _function(device: int, sf_mode: int, name: str) -> int:
    """Driver handle of kernel ``name`` of the ``sf_mode`` variant on ``device``."""
    defines = _defines(sf_mode)
    key = (device, defines, name)
    handle = _functions.get(key)
    if handle is None:
        module = get_module(_SOURCE, defines, device)
        # RawKernel.kernel is the loaded cupy.cuda.Function; the cached module
        # keeps its code alive.
        handle = _functions.setdefault(key, module.get_function(name).kernel.ptr)
    return handle


_device_traits: dict[int, tuple[int, int]] = {}


def _device_traits_of(device: int) -> tuple[int, int]:
    """(multiprocessor count, compute capability major) of ``device``."""
    traits = _device_traits.get(device)
    if traits is None:
        props = runtime.getDeviceProperties(device)
        traits = _device_traits[device] = (props["multiProcessorCount"], props["major"])
    return traits


class _Launch:
    """Kernel handle, launch shape and the argument block's constant tail for
    one access width."""

    __slots__ = ("args", "grid_x", "grid_y", "grid_z", "handle", "shared_bytes", "tail", "threads")

    def __init__(self, handle: int, grid: tuple[int, int, int], threads: int, shared_bytes: int,
                 tail: tuple) -> None:
        self.handle, (self.grid_x, self.grid_y, self.grid_z) = handle, grid
        self.threads, self.shared_bytes, self.tail = threads, shared_bytes, tail
        self.args = _ArgBlock(tail)


class _Plan:
    """Everything about a call that depends only on its sizes, dtypes and device."""

    __slots__ = ("device", "sf_mode", "problem", "row_bytes", "zero_rows", "tail",
                 "kernels", "out_shape", "sf_buffer_shape")

    def __init__(self, problem: ExpandProblem, item_bytes: int, device: int) -> None:
        self.device = device
        self.problem = problem
        self.sf_mode = (SF_NONE if not problem.has_sf else
                        SF_COL_MAJOR if problem.sf_col_major else SF_ROW_MAJOR)
        self.row_bytes = problem.hidden * item_bytes
        # rows the zero-fill blocks walk (the column-major SF's pad columns too)
        self.zero_rows = (problem.sf_leading_dim if self.sf_mode == SF_COL_MAJOR
                          else problem.num_expanded)
        self.tail = (self.row_bytes, problem.num_tokens, problem.top_k, problem.num_expanded,
                     problem.sf_columns, problem.sf_leading_dim)
        self.kernels: dict[int, _Launch] = {}  # by access width in bytes
        self.out_shape = problem.out_shape()
        self.sf_buffer_shape = problem.out_sf_shape()  # row-major SF

    def kernel(self, vec_bytes: int) -> _Launch:
        found = self.kernels.get(vec_bytes)
        if found is None:
            found = self.kernels[vec_bytes] = self._shape_grid(vec_bytes)
        return found

    def _shape_grid(self, vec_bytes: int) -> _Launch:
        """Kernel, chunk size and slot split for this width.

        Large batches of 16-byte rows on sm_90+: the bulk-copy kernel, rows
        cut into the fewest equal chunks that make BULK_TARGET_BLOCKS blocks
        (so prefill moves whole rows, medium batches quarter rows); long
        rows are zero-filled by whole-row blocks. Else the
        register kernel: the biggest chunks, all K slots per block; when the
        tokens' chunks are too few to fill the chip (decode, small batches),
        chunks shrink to one access per thread and then each block takes one
        slot, so that more SMs share the stores.
        """
        n_vec = self.row_bytes // vec_bytes
        num_tokens, top_k = self.problem.num_tokens, self.problem.top_k
        multiprocessors, major = _device_traits_of(self.device)
        if vec_bytes == 16 and major >= 9 and top_k <= _BULK_THREADS:
            # chunks per row: at least 1 and enough to stay under the maximum
            # size, at most what the minimum size allows
            max_chunk = min(int(GRID_POLICY["BULK_MAX_CHUNK_BYTES"]), BULK_SHARED_LIMIT)
            fewest = -(-self.row_bytes // max_chunk)
            most = max(fewest, self.row_bytes // int(GRID_POLICY["BULK_MIN_CHUNK_BYTES"]))
            enough = GRID_POLICY["BULK_MIN_BLOCKS"] * multiprocessors
            if num_tokens > 0 and num_tokens * most >= enough:
                wanted = -(-int(GRID_POLICY["BULK_TARGET_BLOCKS"] * multiprocessors) // num_tokens)
                chunks = min(max(wanted, fewest), most)
                # equal chunks of whole warps' accesses (the last may be shorter)
                lane_vecs = -(-n_vec // (chunks * _BULK_THREADS))
                whole_rows = self.row_bytes >= GRID_POLICY["BULK_WHOLE_ROW_ZERO_FROM"]
                split = num_tokens * chunks < GRID_POLICY["BULK_SPLIT_SLOTS_BELOW"] * multiprocessors
                slots = -(-top_k // int(GRID_POLICY["BULK_SLOT_PLANES"])) if split else top_k
                return self._launch(
                    "expand_to_fused_bulk_zero_rows" if whole_rows else "expand_to_fused_bulk",
                    vec_bytes, _BULK_THREADS, lane_vecs, slots, lane_vecs * _BULK_THREADS * 16,
                    int(GRID_POLICY["ZERO_ROWS_BULK_WHOLE" if whole_rows else "ZERO_ROWS_BULK"]),
                    zero_whole_rows=whole_rows)
        threads = KERNEL_CONFIG["EXPAND_THREADS"]
        vecs_per_thread = KERNEL_CONFIG["EXPAND_UNROLL"]
        chunks = -(-n_vec // (threads * vecs_per_thread))
        if num_tokens * chunks < GRID_POLICY["SHRINK_CHUNKS_BELOW"] * multiprocessors:
            vecs_per_thread = 1
            chunks = -(-n_vec // threads)
        split = num_tokens * chunks < GRID_POLICY["SPLIT_SLOTS_BELOW"] * multiprocessors
        return self._launch(f"expand_to_fused_v{vec_bytes}", vec_bytes, threads, vecs_per_thread,
                            1 if split else top_k, 0, int(GRID_POLICY["ZERO_ROWS_REGISTERS"]))

    def _launch(self, kernel: str, vec_bytes: int, threads: int, vecs_per_thread: int,
                slots_per_block: int, shared_bytes: int, rows_per_zero_block: int,
                zero_whole_rows: bool = False) -> _Launch:
        chunk_bytes = threads * vecs_per_thread * vec_bytes
        chunks = -(-self.row_bytes // chunk_bytes)
        if chunks > _MAX_GRID_Y:
            raise ValueError(f"x rows of {self.row_bytes} bytes are too long for one launch "
                             f"(at most {_MAX_GRID_Y * chunk_bytes} bytes)")
        if not 1 <= rows_per_zero_block <= 32:  # one warp ballot covers a block's rows
            raise ValueError(f"rows per zero-fill block must be in 1 .. 32, not {rows_per_zero_block}")
        handle = _function(self.device, self.sf_mode, kernel)
        # zero-fill blocks are numbered across the z planes (the kernel's
        # rows_to_zero); whole-row ones across the y planes too
        planes = -(-self.problem.top_k // slots_per_block)
        zero_blocks = -(-self.zero_rows // rows_per_zero_block)
        spread = planes * chunks if zero_whole_rows else planes
        grid = (self.problem.num_tokens + -(-zero_blocks // spread), chunks, planes)
        return _Launch(handle, grid, threads, shared_bytes,
                       (*self.tail, rows_per_zero_block, vecs_per_thread, slots_per_block))

    def launch(self, stream: int, x: int, token_topk_to_pos: int, pos_to_expert: int,
               out: int, x_sf: int, out_sf: int) -> None:
        # Widest access (16, 8, 4, 2, 1 bytes) dividing the row and both bases.
        bits = self.row_bytes | 16 | x | out
        launch = self.kernels.get(bits & -bits) or self.kernel(bits & -bits)
        if launch.grid_x == 0:  # no tokens and no output rows
            return
        block = launch.args
        _EXPAND_POINTERS.pack_into(block.buffer, 0, x, token_topk_to_pos, pos_to_expert, out,
                                   x_sf, out_sf)
        driver.launchKernel(launch.handle, launch.grid_x, launch.grid_y, launch.grid_z,
                            launch.threads, 1, 1, launch.shared_bytes, stream,
                            block.params_address, 0)


_plans: dict[tuple, _Plan] = {}


def configure(kernel: dict | None = None, grid_policy: dict | None = None) -> None:
    """Change KERNEL_CONFIG / GRID_POLICY (experiments only) and forget every
    plan made under the old settings, the torch fast path's included."""
    KERNEL_CONFIG.update(kernel or {})
    GRID_POLICY.update(grid_policy or {})
    _plans.clear()
    _torch_plans.clear()


def _plan(problem: ExpandProblem, item_bytes: int, device: int) -> _Plan:
    key = (problem, item_bytes, device, tuple(KERNEL_CONFIG.items()),
           tuple(GRID_POLICY.items()))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _Plan(problem, item_bytes, device)
    return plan


# -- the two GPU array kinds -------------------------------------------------

def _torch_stream(device: int) -> int:
    torch = sys.modules["torch"]
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return getter(device)
    return torch.cuda.current_stream(device).cuda_stream


class _TorchCuda:
    stream = staticmethod(_torch_stream)

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
    def empty_col_major(sf_columns: int, leading_dim: int, num_expanded: int, like: Any) -> Any:
        # [align(X, 4), S] with strides (1, align(X, 4)) spans exactly the
        # [S, align(X, 4)] buffer, pad columns included; its first X rows are
        # the view returned.
        full = like.new_empty_strided((leading_dim, sf_columns), (1, leading_dim))
        # the slice costs a torch op (~1 us); X % 4 == 0 needs none
        return full if leading_dim == num_expanded else full[:num_expanded]

    @staticmethod
    def flat_value(a: Any, index: int) -> int:
        return int(a.reshape(-1)[index].item())


class _Cupy:
    @staticmethod
    def stream(device: int) -> int:
        return cupy.cuda.get_current_stream().ptr

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
    def empty_col_major(sf_columns: int, leading_dim: int, num_expanded: int, like: Any) -> Any:
        return cupy.empty((sf_columns, leading_dim), dtype=like.dtype)[:, :num_expanded].T

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


def _allocate(lib, plan: _Plan, x: Any, x_sf: Any, out: Any, out_sf: Any) -> tuple[Any, Any]:
    if out is None:
        out = lib.empty(plan.out_shape, x)
    if x_sf is not None and out_sf is None:
        if plan.sf_mode == SF_COL_MAJOR:
            problem = plan.problem
            out_sf = lib.empty_col_major(problem.sf_columns, problem.sf_leading_dim,
                                         problem.num_expanded, x_sf)
        else:
            out_sf = lib.empty(plan.sf_buffer_shape, x_sf)
    return out, out_sf


def run_expand(kind: ArrayKind, problem: ExpandProblem, x: Any, x_sf: Any,
               token_topk_to_pos: Any, pos_to_expert: Any,
               out: Any, out_sf: Any, validate: bool) -> tuple[Any, Any]:
    """Both ops on the GPU, after the public op checked every rule.

    ``x_sf`` is None for the op without scale factors. Returns ``(out,
    out_sf)`` of the caller's kind; caller-provided outputs are written in
    place and returned as the same objects.
    """
    torch_kind = kind is ArrayKind.TORCH_CUDA
    lib = _TorchCuda if torch_kind else _Cupy
    device = x.device.index if torch_kind else x.device.id
    signature = (_torch_signature(x, x_sf, token_topk_to_pos, pos_to_expert, out, out_sf,
                                  problem.num_per_channels, problem.sf_col_major)
                 if torch_kind and out_sf is None else None)
    with _OnDevice(device):
        stream = lib.stream(device)
        token_topk_to_pos = lib.contiguous(token_topk_to_pos)
        pos_to_expert = lib.contiguous(pos_to_expert)
        if validate:
            _validate_routing(lib, problem, token_topk_to_pos, pos_to_expert, device, stream)
        x = lib.contiguous(x)
        if x_sf is not None:
            x_sf = lib.contiguous(x_sf)
        plan = _plan(problem, lib.item_bytes(x), device)
        out, out_sf = _allocate(lib, plan, x, x_sf, out, out_sf)
        plan.launch(stream, lib.pointer(x), lib.pointer(token_topk_to_pos),
                    lib.pointer(pos_to_expert), lib.pointer(out),
                    0 if x_sf is None else lib.pointer(x_sf),
                    0 if out_sf is None else lib.pointer(out_sf))
    if signature is not None and _all_contiguous(signature):
        # Every rule held and every input was contiguous: later calls with
        # the same signature may skip straight to the launch.
        _remember_torch_plan(signature, plan)
    return out, out_sf


# -- the torch fast path --------------------------------------------------------

_torch_plans: dict[tuple, _Plan] = {}


def _torch_signature(x, x_sf, token_topk_to_pos, pos_to_expert, out, out_sf,
                     num_per_channels, col_major) -> tuple | None:
    """What the public op's checks read of its arguments, as a dict key.

    One flat tuple: ``num_per_channels, col_major``, then shape, dtype and
    device ordinal of x, token_topk_to_pos, pos_to_expert, x_sf (absent: one
    None) and out (absent: one None), then whether all of them are
    contiguous. None where the call is not one the fast path takes (an
    argument that is not exactly a torch.Tensor, or a caller's ``out_sf``,
    whose buffer extent is checked every time). Written out flat, since it
    runs on every eager call: each tensor property read costs ~0.05-0.1 us.
    """
    # (run_expand asks only for torch tensors, so torch is imported by then)
    tensor = _torch_tensor or sys.modules["torch"].Tensor
    if (out_sf is not None or type(x) is not tensor
            or type(token_topk_to_pos) is not tensor or type(pos_to_expert) is not tensor):
        return None
    contiguous = (x.is_contiguous() and token_topk_to_pos.is_contiguous()
                  and pos_to_expert.is_contiguous())
    key = (num_per_channels, col_major, x.shape, x.dtype, x.get_device(),
           token_topk_to_pos.shape, token_topk_to_pos.dtype, token_topk_to_pos.get_device(),
           pos_to_expert.shape, pos_to_expert.dtype, pos_to_expert.get_device())
    if x_sf is None:
        key += (None,)
    elif type(x_sf) is tensor:
        key += (x_sf.shape, x_sf.dtype, x_sf.get_device())
        contiguous = contiguous and x_sf.is_contiguous()
    else:
        return None
    if out is None:
        key += (None,)
    elif type(out) is tensor:
        key += (out.shape, out.dtype, out.get_device())
        contiguous = contiguous and out.is_contiguous()
    else:
        return None
    return (*key, contiguous)


def _all_contiguous(signature: tuple) -> bool:
    return signature[-1]


# torch.Tensor and torch's raw current-stream getter (an int, no Stream
# object), looked up once, with the first plan the fast path remembers
_torch_tensor = None
_raw_torch_stream = None


def _remember_torch_plan(signature: tuple, plan: _Plan) -> None:
    global _torch_tensor, _raw_torch_stream
    if _torch_tensor is None:
        torch = sys.modules["torch"]
        _raw_torch_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _torch_stream
        _torch_tensor = torch.Tensor
    _torch_plans[signature] = plan


def torch_fast_call(x, x_sf, token_topk_to_pos, pos_to_expert, out, out_sf,
                    num_per_channels, col_major) -> tuple[Any, Any] | None:
    """The call, if its signature was already checked by the full path; else None."""
    if _torch_tensor is None:
        return None  # no torch call has been checked yet
    signature = _torch_signature(x, x_sf, token_topk_to_pos, pos_to_expert, out, out_sf,
                                 num_per_channels, col_major)
    plan = _torch_plans.get(signature) if signature is not None else None
    if plan is None:
        return None
    device = plan.device
    if runtime.getDevice() != device:
        return None  # the full path switches devices
    # the allocation of _allocate, inlined: this is the eager hot path
    if out is None:
        out = x.new_empty(*plan.out_shape)
    if x_sf is None:
        plan.launch(_raw_torch_stream(device), x.data_ptr(), token_topk_to_pos.data_ptr(),
                    pos_to_expert.data_ptr(), out.data_ptr(), 0, 0)
        return out, None
    if plan.sf_mode == SF_COL_MAJOR:
        problem = plan.problem
        out_sf = _TorchCuda.empty_col_major(problem.sf_columns, problem.sf_leading_dim,
                                            problem.num_expanded, x_sf)
    else:
        out_sf = x_sf.new_empty(*plan.sf_buffer_shape)
    plan.launch(_raw_torch_stream(device), x.data_ptr(), token_topk_to_pos.data_ptr(),
                pos_to_expert.data_ptr(), out.data_ptr(), x_sf.data_ptr(), out_sf.data_ptr())
    return out, out_sf


# -- validate=True ----------------------------------------------------------------

def _validate_routing(lib, problem: ExpandProblem, token_topk_to_pos: Any, pos_to_expert: Any,
                      device: int, stream: int) -> None:
    """Run the routing checks on ``stream``; one host synchronisation."""
    num_slots = problem.num_tokens * problem.top_k
    first_slot = cupy.empty(max(problem.num_expanded, 1), dtype=cupy.int64)
    found = cupy.empty(len(ROUTING_ERROR_KINDS), dtype=cupy.int64)
    for scratch in (first_slot, found):  # every byte 0x7F: the "none found" sentinel
        runtime.memsetAsync(scratch.data.ptr, 0x7F, scratch.nbytes, stream)
    block = _arg_block
    _ROUTING_ARGS.pack_into(block.buffer, 0, lib.pointer(token_topk_to_pos),
                            lib.pointer(pos_to_expert), first_slot.data.ptr, found.data.ptr,
                            num_slots, problem.num_expanded)
    blocks = max(1, min(1024, -(-max(num_slots, problem.num_expanded) // 256)))
    for name in ("routing_first_slots", "routing_repeats_and_gaps"):
        driver.launchKernel(_function(device, SF_NONE, name), blocks, 1, 1, 256, 1, 1, 0,
                            stream, block.params_address, 0)
    found_host = np.empty(len(ROUTING_ERROR_KINDS), dtype=np.int64)
    runtime.memcpyAsync(found_host.ctypes.data, found.data.ptr, found_host.nbytes,
                        runtime.memcpyDeviceToHost, stream)
    runtime.streamSynchronize(stream)
    first = {kind: (-1 if value == _NONE_FOUND else int(value))
             for kind, value in zip(ROUTING_ERROR_KINDS, found_host)}
    raise_routing_error(first, problem, lambda i: lib.flat_value(token_topk_to_pos, i))
