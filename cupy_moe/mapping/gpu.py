"""``fused_mapping`` on the GPU: CuPy arrays and CUDA torch tensors.

One int32 allocation holds every output (as views) and the kernels' scratch;
three launches on the caller's current stream fill it (kernels_cu/mapping.cu).
No host synchronisation unless ``trim`` or ``validate``.
"""

from __future__ import annotations

import sys
from typing import Any

from cupy.cuda import driver

from ..runtime.arrays import ArrayKind
from ..runtime.gpu_arrays import gpu_library, raw_torch_stream_getter
from ..runtime.launch import ArgBlock, ArgStruct, OnDevice, function_handle
from ..runtime.sizes import ceil_div
from .reference import FusedMapping
from .rules import MappingProblem, raise_mapping_error

SOURCE = "mapping.cu"
MAP_CHUNK = 256  # slots per chunk = threads of a count or place block (as in the source)
PREFIX_EXPERTS, PREFIX_THREADS = 32, 256  # experts and threads of a prefix block
FILL_PER_THREAD = 16  # pos_* entries a counting thread sets to -1, at least

# struct MappingArgs of mapping.cu, field for field
MAPPING_ARGS = ArgStruct(
    ("topk_ids", "ptr"), ("token_topk_to_pos", "ptr"), ("pos_rows", "ptr"),
    ("expert_rows", "ptr"), ("chunk_rows", "ptr"), ("num_slots", "i32"), ("top_k", "i32"),
    ("num_experts", "i32"), ("alignment", "i32"), ("num_expanded", "i32"),
    ("num_chunks", "i32"))
_pack_pointers = MAPPING_ARGS.pointer_packer.pack_into


class MappingPlan:
    """Launches and buffer layout of one problem on one device."""

    __slots__ = ("args", "device", "launches", "offsets", "problem", "buffer_size",
                 "total_index")

    def __init__(self, problem: MappingProblem, device: int) -> None:
        self.problem, self.device = problem, device
        slots, experts, rows = problem.num_slots, problem.num_experts, problem.num_expanded
        chunks = ceil_div(slots, MAP_CHUNK)
        # one buffer: token_topk_to_pos [N], pos rows [3, X], expert rows [3, E],
        # chunk scratch [chunks, E], the total of the rows [1]
        self.offsets = (0, slots, slots + 3 * rows, slots + 3 * rows + 3 * experts)
        self.total_index = self.offsets[3] + chunks * experts
        self.buffer_size = self.total_index + 1
        suffix = "i64" if problem.id_dtype == "int64" else "i32"
        count_blocks = max(chunks, ceil_div(3 * rows, MAP_CHUNK * FILL_PER_THREAD))

        def kernel(name: str, blocks: int, threads: int, shared_bytes: int) -> tuple:
            return (function_handle(SOURCE, (), device, name), blocks, threads, shared_bytes)

        # counting (and padding) only when there are slots or rows; the place
        # kernel always runs: its block 0 writes the expert rows
        self.launches = ([kernel(f"mapping_count_{suffix}", count_blocks, MAP_CHUNK, 4 * experts)]
                         if count_blocks else [])
        self.launches.append(kernel("mapping_prefix", ceil_div(experts, PREFIX_EXPERTS),
                                    PREFIX_THREADS, 0))
        self.launches.append(kernel(f"mapping_place_{suffix}", max(chunks, 1), MAP_CHUNK,
                                    8 * experts))
        self.args = ArgBlock(MAPPING_ARGS, MAPPING_ARGS.constants(
            num_slots=slots, top_k=problem.top_k, num_experts=experts,
            alignment=problem.alignment, num_expanded=rows, num_chunks=chunks))

    def launch(self, stream: int, topk_ids: int, buffer: int) -> None:
        block = self.args
        o = self.offsets
        _pack_pointers(block.buffer, 0, topk_ids, buffer + 4 * o[0], buffer + 4 * o[1],
                       buffer + 4 * o[2], buffer + 4 * o[3])
        for handle, blocks, threads, shared_bytes in self.launches:
            driver.launchKernel(handle, blocks, 1, 1, threads, 1, 1, shared_bytes, stream,
                                block.params_address, 0)

    def views(self, buffer: Any) -> FusedMapping:
        """The outputs, as views of ``buffer``."""
        p = self.problem
        slots, rows, experts = p.num_slots, p.num_expanded, p.num_experts
        o = self.offsets
        return FusedMapping(
            buffer[o[0]:o[0] + slots].reshape(p.num_tokens, p.top_k),
            *(buffer[o[1] + r * rows:o[1] + (r + 1) * rows] for r in range(3)),
            *(buffer[o[2] + r * experts:o[2] + (r + 1) * experts] for r in range(3)))


_plans: dict[tuple, MappingPlan] = {}


def plan_for(problem: MappingProblem, device: int) -> MappingPlan:
    plan = _plans.get((problem, device))
    if plan is None:
        plan = _plans[(problem, device)] = MappingPlan(problem, device)
    return plan


def run_mapping(kind: ArrayKind, problem: MappingProblem, topk_ids: Any, trim: bool,
                validate: bool) -> tuple[FusedMapping, MappingPlan]:
    lib = gpu_library(kind)
    device = lib.device(topk_ids)
    with OnDevice(device):
        stream = lib.stream(device)
        topk_ids = lib.contiguous(topk_ids)
        plan = plan_for(problem, device)
        buffer = lib.empty_int32(plan.buffer_size, topk_ids)
        plan.launch(stream, lib.pointer(topk_ids), lib.pointer(buffer))
        result = plan.views(buffer)
        if validate:
            raise_mapping_error(lib.to_numpy(topk_ids), lib.to_numpy(result.token_topk_to_pos),
                                problem)
        if trim:
            total = lib.flat_value(buffer, plan.total_index)
            result = result.trimmed(min(total, problem.num_expanded))
    return result, plan


# torch's raw current-stream getter and torch.int32, bound on the first fast call
_raw_torch_stream = _torch_int32 = None


def run_torch_fast(plan: MappingPlan, topk_ids: Any) -> FusedMapping:
    """A torch call whose description ``plan`` was made for (the fast path's hit)."""
    global _raw_torch_stream, _torch_int32
    if _raw_torch_stream is None:
        _raw_torch_stream = raw_torch_stream_getter()
        _torch_int32 = sys.modules["torch"].int32
    buffer = topk_ids.new_empty(plan.buffer_size, dtype=_torch_int32)
    plan.launch(_raw_torch_stream(plan.device), topk_ids.data_ptr(), buffer.data_ptr())
    return plan.views(buffer)
