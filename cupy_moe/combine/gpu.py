"""``reduce_fused`` on the GPU: CuPy arrays and CUDA torch tensors.

Arguments are used in place (raw device pointers; no copies unless an input
is non-contiguous) and the kernel runs on the caller's current stream: CuPy's
for CuPy arrays, torch's for tensors. One launch per call (none when T = 0);
nothing synchronises with the host except ``validate=True``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cupy.cuda import driver, runtime

from ..runtime.arrays import ArrayKind
from ..runtime.bounded_cache import BoundedCache
from ..runtime.gpu_arrays import gpu_library, raw_torch_stream_getter
from ..runtime.launch import (
    ArgBlock,
    ArgStruct,
    DEFAULT_DYNAMIC_SHARED_BYTES,
    OnDevice,
    allow_dynamic_shared,
    device_traits,
    function_handle,
    launch,
)
from ..runtime.sizes import ceil_div
from .launch_shape import (
    BULK_VEC_BYTES,
    CombineShape,
    auto_combine_shape,
    fits_half_l2,
    sparse_slots,
)
from .rules import CombineProblem, raise_out_of_range

SOURCE = "combine.cu"

# struct CombineArgs of combine.cu, field for field
COMBINE_ARGS = ArgStruct(
    ("expanded", "ptr"), ("token_topk_to_pos", "ptr"), ("topk_weights", "ptr"),
    ("row_scale", "ptr"), ("out", "ptr"), ("row_vecs", "i64"), ("num_tokens", "i64"),
    ("num_expanded", "i64"), ("top_k", "i32"), ("row_threads", "i32"),
    ("tokens_per_block", "i32"))
# struct CombineCheckArgs of combine.cu
CHECK_ARGS = ArgStruct(("token_topk_to_pos", "ptr"), ("found", "ptr"), ("num_slots", "i64"),
                       ("num_expanded", "i64"))
_NONE_FOUND = 0x7F7F7F7F7F7F7F7F  # COMBINE_NONE in the kernel source
_check_args = ArgBlock(CHECK_ARGS)

# packs a launch's five pointers into its argument block (the hot path's only packing)
_pack_pointers = COMBINE_ARGS.pointer_packer.pack_into

# the kernel family of each element format; the widths each one has
KERNEL_PREFIX = {"f32": "reduce_fused_f32", "bf16": "reduce_fused_bf16",
                 "f16": "reduce_fused_f16"}
VEC_WIDTHS = {"f32": (16, 8, 4), "bf16": (16, 8, 4, 2), "f16": (16, 8, 4, 2)}
# combine.cu's FMT_* + 1: COMBINE_ONE_FORMAT's value for a format's kernels
_ONE_FORMAT = {"f32": 1, "bf16": 2, "f16": 3}
# the validate kernel's module: no reduce_fused kernel beside it
_CHECK_ONLY = (("COMBINE_ONE_FORMAT", -1),)


def kernel_defines(element_format: str, vec_bytes: int, out_float32: bool = False,
                   ) -> tuple[tuple[str, int], ...]:
    """The module of one reduce_fused kernel alone (combine.cu's
    COMBINE_ONE_FORMAT and COMBINE_ONE_VEC): a first call in a fresh kernel
    cache compiles the kernel it launches, not all eleven. ``out_float32``: a
    bf16 / fp16 kernel that stores its sums as float32 (COMBINE_OUT_F32)."""
    one = (("COMBINE_ONE_FORMAT", _ONE_FORMAT[element_format]), ("COMBINE_ONE_VEC", vec_bytes))
    return (*one, ("COMBINE_OUT_F32", 1)) if out_float32 else one


# static shared memory of a bulk block, rounded up (combine.cu
# reduce_fused_bulk: its mbarriers, 256 listed slots of 12 bytes, warp counts,
# token flags; ptxas reports 3,456 bytes on sm_90 with 4 or 8 stages)
BULK_STATIC_SHARED_BYTES = 4096


class CombineLaunch:
    """One kernel launch: handle, launch shape, argument block."""

    __slots__ = ("args", "grid_x", "grid_y", "handle", "name", "shape", "shared_bytes",
                 "threads")

    def __init__(self, name: str, handle: int, shape: CombineShape, args: ArgBlock) -> None:
        self.name, self.handle, self.shape, self.args = name, handle, shape, args
        self.grid_x, self.grid_y, _ = shape.grid
        self.threads = shape.threads
        self.shared_bytes = shape.shared_bytes


class CombinePlan:
    """The launches of one (problem, item size, device), by access width.

    ``shape_options``: keyword arguments of ``combine_shape`` (sweeps, tests).
    """

    __slots__ = ("device", "input_bytes", "kernels", "out_bytes", "out_shape", "problem",
                 "row_bytes", "shape_options")

    def __init__(self, problem: CombineProblem, item_bytes: int, device: int,
                 shape_options: tuple[tuple[str, Any], ...] = ()) -> None:
        self.device, self.problem = device, problem
        self.shape_options = shape_options
        self.row_bytes = problem.hidden * item_bytes
        self.kernels: dict[int, CombineLaunch] = {}
        slots_bytes = problem.num_tokens * problem.top_k * 4
        # sizes of expanded, token_topk_to_pos, topk_weights, row_scale; and of
        # out: what the fast path's overlap test compares
        self.input_bytes = (problem.num_expanded * self.row_bytes, slots_bytes,
                            slots_bytes if problem.has_weights else 0,
                            problem.num_expanded * 4 if problem.has_row_scale else 0)
        self.out_bytes = problem.num_tokens * problem.hidden * problem.out_item_bytes
        self.out_shape = problem.out_shape()

    def kernel(self, vec_bytes: int) -> CombineLaunch:
        found = self.kernels.get(vec_bytes)
        if found is None:
            problem = self.problem
            traits = device_traits(self.device)
            sparse = sparse_slots(problem.num_tokens, problem.top_k, problem.num_expanded)
            resident = fits_half_l2(problem.num_tokens, problem.top_k,
                                    problem.num_expanded, self.row_bytes, traits.l2_bytes)
            shape = auto_combine_shape(
                problem.num_tokens, self.row_bytes // vec_bytes, traits.multiprocessors,
                top_k=problem.top_k, sparse=sparse, l2_resident=resident,
                # bulk copies: 16-byte rows and bases, sm_90 and newer
                bulk_ok=vec_bytes == BULK_VEC_BYTES and traits.major >= 9,
                **dict(self.shape_options))
            if shape.shared_bytes + BULK_STATIC_SHARED_BYTES > traits.shared_bytes_optin:
                raise ValueError(f"bulk stages of {shape.shared_bytes} bytes do not fit the "
                                 f"{traits.shared_bytes_optin} bytes of shared memory a block "
                                 "may have")
            name = f"{KERNEL_PREFIX[problem.element_format]}_v{vec_bytes}"
            handle = function_handle(SOURCE, (*shape.defines(),
                                              *kernel_defines(problem.element_format,
                                                              vec_bytes, problem.out_float32)),
                                     self.device, name)
            if shape.shared_bytes > DEFAULT_DYNAMIC_SHARED_BYTES - BULK_STATIC_SHARED_BYTES:
                allow_dynamic_shared(handle, shape.shared_bytes)
            constants = COMBINE_ARGS.constants(
                row_vecs=self.row_bytes // vec_bytes, num_tokens=problem.num_tokens,
                num_expanded=problem.num_expanded, top_k=problem.top_k,
                row_threads=shape.row_threads, tokens_per_block=shape.tokens_per_block)
            found = self.kernels[vec_bytes] = CombineLaunch(name, handle, shape,
                                                            ArgBlock(COMBINE_ARGS, constants,
                                                                     bind_context=True))
        return found

    def launch(self, stream: int, expanded: int, token_topk_to_pos: int, topk_weights: int,
               row_scale: int, out: int) -> None:
        """Launch on ``stream`` (0 for an absent ``topk_weights`` / ``row_scale``)."""
        if self.out_bytes == 0:  # no tokens
            return
        # the widest access (16, 8, 4, 2 bytes) dividing the row and both bases
        # (a float32 out of a 2-byte input takes two such accesses per input one)
        bits = self.row_bytes | 16 | expanded | out
        kernel = self.kernels.get(bits & -bits) or self.kernel(bits & -bits)
        # written out, not through runtime.launch: this runs on every eager call
        block = kernel.args
        _pack_pointers(block.buffer, 0, expanded, token_topk_to_pos, topk_weights, row_scale,
                       out)
        driver.launchKernel(kernel.handle, kernel.grid_x, kernel.grid_y, 1, kernel.threads, 1,
                            1, kernel.shared_bytes, stream, block.params_address, 0)


_plans = BoundedCache()


def plan_for(problem: CombineProblem, item_bytes: int, device: int) -> CombinePlan:
    key = (problem, item_bytes, device)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, CombinePlan(problem, item_bytes, device))
    return plan


def run_reduce_fused(kind: ArrayKind, problem: CombineProblem, expanded: Any,
                     token_topk_to_pos: Any, topk_weights: Any, row_scale: Any, out: Any,
                     validate: bool, shape_options: tuple[tuple[str, Any], ...] | None = None,
                     ) -> tuple[Any, CombinePlan]:
    """The op on the GPU, after the public op checked every rule.

    Returns ``(out, plan)``; a caller-provided ``out`` is written in place and
    returned as the same object. ``shape_options``: launch-shape overrides
    (a plan of their own, not kept), else the problem's default plan.
    """
    lib = gpu_library(kind)
    device = lib.device(expanded)
    with OnDevice(device):
        stream = lib.stream(device)
        token_topk_to_pos = lib.contiguous(token_topk_to_pos)
        if validate:
            _validate(lib, problem, token_topk_to_pos, device, stream)
        expanded = lib.contiguous(expanded)
        if topk_weights is not None:
            topk_weights = lib.contiguous(topk_weights)
        if row_scale is not None:
            row_scale = lib.contiguous(row_scale)
        if shape_options is None:
            plan = plan_for(problem, lib.item_bytes(expanded), device)
        else:
            plan = CombinePlan(problem, lib.item_bytes(expanded), device, shape_options)
        if out is None:
            out = lib.empty(problem.out_shape(), expanded)
        plan.launch(stream, lib.pointer(expanded), lib.pointer(token_topk_to_pos),
                    0 if topk_weights is None else lib.pointer(topk_weights),
                    0 if row_scale is None else lib.pointer(row_scale), lib.pointer(out))
    return out, plan


_raw_torch_stream = None


def run_torch_fast(plan: CombinePlan, expanded, token_topk_to_pos, topk_weights, row_scale,
                   out) -> Any:
    """A torch call whose arguments' descriptions ``plan`` was made for (the
    fast path's hit); None when ``out`` overlaps an input, so that the full
    path raises. Written flat: it runs on every eager call."""
    global _raw_torch_stream
    if _raw_torch_stream is None:
        _raw_torch_stream = raw_torch_stream_getter()
    pointers = (expanded.data_ptr(), token_topk_to_pos.data_ptr(),
                0 if topk_weights is None else topk_weights.data_ptr(),
                0 if row_scale is None else row_scale.data_ptr())
    if out is None:
        out = expanded.new_empty(*plan.out_shape)
    else:  # the one rule that depends on addresses, not on descriptions
        first = out.data_ptr()
        end = first + plan.out_bytes
        for pointer, size in zip(pointers, plan.input_bytes, strict=True):
            # (empty ranges overlap nothing, as the full path's byte_span says)
            if size and first < end and pointer < end and first < pointer + size:
                return None
    plan.launch(_raw_torch_stream(plan.device), *pointers, out.data_ptr())
    return out


def _validate(lib, problem: CombineProblem, token_topk_to_pos: Any, device: int,
              stream: int) -> None:
    """Find the first slot >= X on ``stream``; one host synchronisation."""
    num_slots = problem.num_tokens * problem.top_k
    if num_slots == 0:
        return
    # one int64 as two int32, from the inputs' allocator (see expand's validate)
    found = lib.empty_int32(2, token_topk_to_pos)
    runtime.memsetAsync(lib.pointer(found), 0x7F, 8, stream)  # COMBINE_NONE
    _check_args.set_all(lib.pointer(token_topk_to_pos), lib.pointer(found), num_slots,
                        problem.num_expanded)
    blocks = max(1, min(1024, ceil_div(num_slots, 256)))
    launch(function_handle(SOURCE, _CHECK_ONLY, device, "reduce_fused_first_out_of_range"),
           (blocks, 1, 1), 256, 0, stream, _check_args)
    found_host = np.empty(1, dtype=np.int64)
    runtime.memcpyAsync(found_host.ctypes.data, lib.pointer(found), found_host.nbytes,
                        runtime.memcpyDeviceToHost, stream)
    runtime.streamSynchronize(stream)
    first = -1 if int(found_host[0]) == _NONE_FOUND else int(found_host[0])
    raise_out_of_range(first, problem, lambda i: lib.flat_value(token_topk_to_pos, i))
