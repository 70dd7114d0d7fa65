"""The expand ops on the GPU: CuPy arrays and CUDA torch tensors.

Arguments are used in place (raw device pointers; no copies unless an input
is non-contiguous) and the kernels run on the caller's current stream: CuPy's
for CuPy arrays, torch's for tensors. Nothing here synchronises with the host
except ``validate=True``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cupy.cuda import runtime

from ..runtime.arrays import ArrayKind
from ..runtime.gpu_arrays import TorchCuda, gpu_library, raw_torch_stream_getter
from ..runtime.launch import ArgBlock, ArgStruct, OnDevice, function_handle, launch
from ..runtime.sizes import ceil_div
from .plan import SF_COL_MAJOR, SF_NONE, SOURCE, ExpandPlan, kernel_defines, plan_for
from .rules import ROUTING_ERROR_KINDS, ExpandProblem, raise_routing_error
from .tuning import ExpandTuning

# struct RoutingArgs of expand.cu
ROUTING_ARGS = ArgStruct(("token_topk_to_pos", "ptr"), ("pos_to_expert", "ptr"),
                         ("pos_to_token", "ptr"), ("first_slot", "ptr"), ("found", "ptr"),
                         ("num_slots", "i64"), ("num_expanded", "i32"), ("top_k", "i32"))
_NONE_FOUND = 0x7F7F7F7F7F7F7F7F  # ROUTING_NONE in the kernel source
_routing_args = ArgBlock(ROUTING_ARGS)


def _allocate(lib, plan: ExpandPlan, x: Any, x_sf: Any, out: Any, out_sf: Any) -> tuple[Any, Any]:
    problem = plan.problem
    if out is None:
        out = lib.empty(problem.out_shape(), x)
    if x_sf is not None and out_sf is None:
        if plan.sf_mode == SF_COL_MAJOR:
            out_sf = lib.empty_col_major(problem.num_expanded, problem.sf_columns,
                                         problem.sf_leading_dim, x_sf)
        else:
            out_sf = lib.empty(problem.out_sf_shape(), x_sf)
    return out, out_sf


def run_expand(kind: ArrayKind, problem: ExpandProblem, tuning: ExpandTuning, x: Any,
               x_sf: Any, token_topk_to_pos: Any, pos_to_expert: Any, out: Any, out_sf: Any,
               validate: bool, zero_padding: bool,
               pos_to_token: Any = None) -> tuple[tuple[Any, Any], ExpandPlan]:
    """Both ops on the GPU, after the public op checked every rule.

    ``x_sf`` is None for the op without scale factors. Returns ``((out,
    out_sf), plan)``; caller-provided outputs are written in place and
    returned as the same objects.
    """
    lib = gpu_library(kind)
    device = lib.device(x)
    with OnDevice(device):
        stream = lib.stream(device)
        token_topk_to_pos = lib.contiguous(token_topk_to_pos)
        pos_to_expert = lib.contiguous(pos_to_expert)
        if pos_to_token is not None:
            pos_to_token = lib.contiguous(pos_to_token)
        if validate:
            _validate_routing(lib, problem, token_topk_to_pos, pos_to_expert, pos_to_token,
                              device, stream)
        x = lib.contiguous(x)
        if x_sf is not None:
            x_sf = lib.contiguous(x_sf)
        plan = plan_for(problem, lib.item_bytes(x), device, tuning, zero_padding=zero_padding,
                        with_pos_to_token=pos_to_token is not None)
        out, out_sf = _allocate(lib, plan, x, x_sf, out, out_sf)
        plan.launch(stream, lib.pointer(x), lib.pointer(token_topk_to_pos),
                    lib.pointer(pos_to_expert), lib.pointer(out),
                    0 if x_sf is None else lib.pointer(x_sf),
                    0 if out_sf is None else lib.pointer(out_sf),
                    0 if pos_to_token is None else lib.pointer(pos_to_token))
    return (out, out_sf), plan


_raw_torch_stream = None


def run_torch_fast(plan: ExpandPlan, x, x_sf, token_topk_to_pos, pos_to_expert,
                   out, pos_to_token=None) -> tuple[Any, Any] | None:
    """A torch call whose arguments' descriptions ``plan`` was made for (the
    fast path's hit); None when ``out`` overlaps an input, so that the full
    path raises. Written flat: it runs on every eager call."""
    global _raw_torch_stream
    if _raw_torch_stream is None:
        _raw_torch_stream = raw_torch_stream_getter()
    x_ptr, map_ptr, p2e_ptr = x.data_ptr(), token_topk_to_pos.data_ptr(), pos_to_expert.data_ptr()
    sf_ptr = 0 if x_sf is None else x_sf.data_ptr()
    p2t_ptr = 0 if pos_to_token is None else pos_to_token.data_ptr()
    if out is None:
        out = x.new_empty(*plan.out_shape)
    else:  # the one rule that depends on addresses, not on descriptions
        first = out.data_ptr()
        end = first + plan.out_bytes
        for pointer, size in zip((x_ptr, map_ptr, p2e_ptr, sf_ptr, p2t_ptr), plan.input_bytes,
                                 strict=True):
            # (empty ranges overlap nothing, as the full path's byte_span says)
            if size and first < end and pointer < end and first < pointer + size:
                return None
    if x_sf is None:
        plan.launch(_raw_torch_stream(plan.device), x_ptr, map_ptr, p2e_ptr, out.data_ptr(), 0, 0,
                    p2t_ptr)
        return out, None
    if plan.sf_mode == SF_COL_MAJOR:
        problem = plan.problem
        out_sf = TorchCuda.empty_col_major(problem.num_expanded, problem.sf_columns,
                                           problem.sf_leading_dim, x_sf)
    else:
        out_sf = x_sf.new_empty(*plan.out_sf_shape)
    plan.launch(_raw_torch_stream(plan.device), x_ptr, map_ptr, p2e_ptr, out.data_ptr(), sf_ptr,
                out_sf.data_ptr(), p2t_ptr)
    return out, out_sf


def _validate_routing(lib, problem: ExpandProblem, token_topk_to_pos: Any, pos_to_expert: Any,
                      pos_to_token: Any, device: int, stream: int) -> None:
    """Run the routing checks on ``stream``; one host synchronisation."""
    num_slots = problem.num_tokens * problem.top_k
    # int64 scratch as pairs of int32, from the inputs' own allocator (torch's
    # for tensors: ordered on the stream the kernels run on; CuPy's pool would
    # hand out memory ordered on CuPy's current stream instead)
    scratch_words = (2 * max(problem.num_expanded, 1), 2 * len(ROUTING_ERROR_KINDS))
    first_slot, found = (lib.empty_int32(words, token_topk_to_pos) for words in scratch_words)
    for scratch, words in zip((first_slot, found), scratch_words, strict=True):
        # every byte 0x7F: the "none found" sentinel
        runtime.memsetAsync(lib.pointer(scratch), 0x7F, 4 * words, stream)
    _routing_args.set_all(lib.pointer(token_topk_to_pos), lib.pointer(pos_to_expert),
                          0 if pos_to_token is None else lib.pointer(pos_to_token),
                          lib.pointer(first_slot), lib.pointer(found), num_slots,
                          problem.num_expanded, problem.top_k)
    blocks = max(1, min(1024, ceil_div(max(num_slots, problem.num_expanded), 256)))
    # the routing kernels are the same in every variant: take the plain one's
    # (a module of the two alone)
    defines = kernel_defines(SF_NONE, ExpandTuning(), "routing")
    for name in ("routing_first_slots", "routing_repeats_and_gaps"):
        launch(function_handle(SOURCE, defines, device, name), (blocks, 1, 1), 256, 0, stream,
               _routing_args)
    found_host = np.empty(len(ROUTING_ERROR_KINDS), dtype=np.int64)
    runtime.memcpyAsync(found_host.ctypes.data, lib.pointer(found), found_host.nbytes,
                        runtime.memcpyDeviceToHost, stream)
    runtime.streamSynchronize(stream)
    first = {kind: (-1 if value == _NONE_FOUND else int(value))
             for kind, value in zip(ROUTING_ERROR_KINDS, found_host, strict=True)}
    raise_routing_error(first, problem, lambda i: lib.flat_value(token_topk_to_pos, i),
                        lambda p: lib.flat_value(pos_to_token, p))
