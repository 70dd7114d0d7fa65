"""``fused_mapping`` on the GPU: CuPy arrays and CUDA torch tensors.

One int32 allocation holds every output (as views) and the kernels' scratch;
one or two launches on the caller's current stream fill it
(kernels_cu/mapping.cu).
No host synchronisation unless ``trim`` or ``validate``.
"""

from __future__ import annotations

import sys
from typing import Any

from cupy.cuda import driver

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
    launch_cooperative_in_clusters,
    launch_overlapping_previous,
    max_active_clusters,
)
from ..runtime.sizes import align_up
from . import launch_shape
from .launch_shape import (
    CLUSTER_SIZES,
    COOP_MAX_BLOCK_SLOTS,
    COOP_MAX_WARPS,
    MappingShape,
    mapping_shape,
    place_shared_bytes,
)
from .reference import FusedMapping
from .rules import MappingProblem, raise_mapping_error

SOURCE = "mapping.cu"

# struct MappingArgs of mapping.cu, field for field
MAPPING_ARGS = ArgStruct(
    ("topk_ids", "ptr"), ("token_topk_to_pos", "ptr"), ("pos_rows", "ptr"),
    ("expert_rows", "ptr"), ("block_counts", "ptr"), ("num_slots", "i32"), ("top_k", "i32"),
    ("num_experts", "i32"), ("alignment", "i32"), ("num_expanded", "i32"),
    ("warp_slots", "i32"), ("self_counting", "i32"), ("count_split", "i32"))
_pack_pointers = MAPPING_ARGS.pointer_packer.pack_into


# mapping.cu's MAPPING_KERNELS bits, by kernel (the name between "mapping_"
# and the id suffix)
KERNEL_BITS = {"count": 0, "place": 1, "coop": 2, "coop_cluster": 3, "warp": 4}


def kernel_defines(id_dtype: str, names: list[str]) -> tuple[tuple[str, int], ...]:
    """The module of kernels ``names`` (of ``kernel_names``) alone, for
    ``id_dtype``'s ids (mapping.cu's MAPPING_IDS and MAPPING_KERNELS): a
    first call in a fresh kernel cache compiles one or two kernels of the
    file's ten."""
    mask = 0
    for name in names:
        mask |= 1 << KERNEL_BITS[name.removeprefix("mapping_").rsplit("_", 1)[0]]
    return (("MAPPING_IDS", 2 if id_dtype == "int64" else 1), ("MAPPING_KERNELS", mask))


def kernel_names(shape: MappingShape, id_dtype: str) -> list[str]:
    """The kernels of mapping.cu a plan launches, in launch order (the count
    kernel first where there are two)."""
    suffix = "i64" if id_dtype == "int64" else "i32"
    kernel = ("warp" if shape.one_warp else "place" if not shape.cooperative
              else "coop_cluster" if shape.cluster_blocks else "coop")
    count = [] if shape.self_counting or shape.cooperative else [f"mapping_count_{suffix}"]
    return count + [f"mapping_{kernel}_{suffix}"]


def _clusters_held(place: int, shape: MappingShape) -> int:
    """How many clusters of ``shape``'s place kernel the GPU holds at once: a
    cluster sits in one GPC, so fewer may fit than SMs // C, and a
    cooperative launch needs every block resident. (Its shared memory opt-in
    set first: the query counts it.)"""
    if shape.shared_bytes > DEFAULT_DYNAMIC_SHARED_BYTES:
        allow_dynamic_shared(place, shape.shared_bytes)
    return max_active_clusters(place, shape.threads, shape.shared_bytes, shape.cluster_blocks)


def default_shape(problem: MappingProblem, device: int) -> MappingShape:
    """The launch shape a plan takes unless given one: on sm_90+ in clusters
    of ``launch_shape.DEFAULT_CLUSTER_BLOCKS`` where the grid is cooperative and the GPU
    holds its clusters at once, else without."""
    traits = device_traits(device)
    slots, experts, rows = problem.num_slots, problem.num_experts, problem.num_expanded

    def shape_with(cluster: int) -> MappingShape:
        return mapping_shape(slots, experts, rows, traits.multiprocessors,
                             traits.shared_bytes_optin, cooperative=traits.cooperative_launch,
                             cluster_blocks=cluster)

    # (read at call time: a measured default is one constant's edit, and tests set it)
    shape = shape_with(launch_shape.DEFAULT_CLUSTER_BLOCKS if traits.major >= 9 else 0)
    if shape.cluster_blocks:
        names = kernel_names(shape, problem.id_dtype)
        place = function_handle(SOURCE, kernel_defines(problem.id_dtype, names), device,
                                names[-1])
        try:
            held = _clusters_held(place, shape)
        except driver.CUDADriverError:  # a GPU (or partition) that takes no such clusters
            held = 0
        if shape.blocks > held * shape.cluster_blocks:
            shape = shape_with(0)
    return shape


class MappingPlan:
    """Launches and buffer layout of one problem on one device.

    One int32 buffer: token_topk_to_pos [N], the pos rows [3, X], the expert
    rows [3, E], then, from the next 16-byte boundary, the kernels' scratch:
    with two launches the count blocks' totals [count blocks, E] and the
    place blocks' prefixes [blocks, E], with a cooperative launch the blocks'
    totals as uint16 [blocks, align(E, 8)] (16-byte loads of 8 experts; in
    clusters only the first blocks / C rows are written: the clusters'
    totals); then the total of the rows [1].
    """

    __slots__ = ("args", "device", "launches", "offsets", "problem", "buffer_size",
                 "total_index", "shape", "split_sizes", "overlap", "token_shape",
                 "byte_offsets", "cooperative", "cluster")

    def __init__(self, problem: MappingProblem, device: int,
                 shape: MappingShape | None = None, overlap: bool | None = None) -> None:
        """``overlap``: with two launches, start the place kernel while the
        count kernel runs (programmatic dependent launch); default: on sm_90+."""
        self.problem, self.device = problem, device
        slots, experts, rows = problem.num_slots, problem.num_experts, problem.num_expanded
        traits = device_traits(device)
        if shape is None:
            shape = default_shape(problem, device)
        if overlap is None:
            overlap = traits.major >= 9
        self.overlap = overlap and not shape.self_counting and not shape.cooperative
        self.shape = shape
        if shape.cooperative and shape.warps > COOP_MAX_WARPS:
            raise ValueError(f"a cooperative launch has at most {COOP_MAX_WARPS} warps a block; "
                             f"got {shape.warps}")
        cluster = shape.cluster_blocks
        if cluster and not (shape.cooperative and traits.major >= 9
                            and cluster in CLUSTER_SIZES and shape.blocks % cluster == 0):
            raise ValueError(f"cluster_blocks must be one of {CLUSTER_SIZES} and divide the "
                             f"blocks of a cooperative grid on sm_90+; got cluster_blocks="
                             f"{cluster}, {shape.blocks} blocks, cooperative={shape.cooperative}, "
                             f"sm_{traits.major}x")
        if cluster and cluster * shape.warps * shape.warp_slots > COOP_MAX_BLOCK_SLOTS:
            raise ValueError(f"a cluster's slot counts are uint16: {cluster} blocks of "
                             f"{shape.warps * shape.warp_slots} slots pass "
                             f"{COOP_MAX_BLOCK_SLOTS}")
        # (a shape edited by hand, as sweeps do, must still give the kernel its rows)
        needed = place_shared_bytes(shape.warps, experts, cluster)
        if not shape.one_warp and shape.shared_bytes < needed:
            raise ValueError(f"the place kernel needs {needed} bytes of shared memory for "
                             f"{shape.warps} warps and {experts} experts"
                             f"{' in clusters' if cluster else ''}; the shape gives "
                             f"{shape.shared_bytes}")
        # block totals (cooperative: uint16, two to an int32), or count-block
        # totals and place-block prefixes
        block_counts = (0 if shape.self_counting else
                        shape.blocks * align_up(experts, 8) // 2 if shape.cooperative else
                        (shape.count_blocks + shape.blocks) * experts)
        expert_rows = slots + 3 * rows
        scratch = align_up(expert_rows + 3 * experts, 4)  # 16 bytes: the buffer's base is
        self.offsets = (0, slots, expert_rows, scratch)   # at least 256-byte aligned
        # launch()'s hot path reads these, not offsets and shape.cooperative
        self.byte_offsets = tuple(4 * o for o in self.offsets)
        self.cooperative = shape.cooperative
        self.cluster = cluster
        self.total_index = scratch + block_counts
        self.buffer_size = self.total_index + 1
        self.split_sizes = (slots, rows, rows, rows, experts, experts, experts,
                            self.buffer_size - expert_rows - 3 * experts)
        self.token_shape = (problem.num_tokens, problem.top_k)  # torch_views' view, cached
        names = kernel_names(shape, problem.id_dtype)
        defines = kernel_defines(problem.id_dtype, names)
        place = function_handle(SOURCE, defines, device, names[-1])
        if shape.shared_bytes > DEFAULT_DYNAMIC_SHARED_BYTES:
            allow_dynamic_shared(place, shape.shared_bytes)
        if cluster:
            most = _clusters_held(place, shape)
            if shape.blocks > most * cluster:
                raise ValueError(f"this GPU holds {most} clusters of {cluster} blocks at once; "
                                 f"a cooperative grid of {shape.blocks} blocks needs "
                                 f"{shape.blocks // cluster}")
        self.launches = [] if len(names) == 1 else [
            (function_handle(SOURCE, defines, device, names[0]), shape.count_blocks,
             shape.threads, 4 * shape.count_split * experts)]
        self.launches.append((place, shape.blocks, shape.threads, shape.shared_bytes))
        self.args = ArgBlock(MAPPING_ARGS, MAPPING_ARGS.constants(
            num_slots=slots, top_k=problem.top_k, num_experts=experts,
            alignment=problem.alignment, num_expanded=rows, warp_slots=shape.warp_slots,
            self_counting=int(shape.self_counting), count_split=shape.count_split),
            bind_context=True)

    def launch(self, stream: int, topk_ids: int, buffer: int) -> None:
        block = self.args
        o = self.byte_offsets
        _pack_pointers(block.buffer, 0, topk_ids, buffer + o[0], buffer + o[1], buffer + o[2],
                       buffer + o[3])
        launches = self.launches
        if self.cooperative:
            handle, blocks, threads, shared_bytes = launches[0]
            if self.cluster:
                launch_cooperative_in_clusters(handle, blocks, threads, shared_bytes, stream,
                                               block.params_address, self.cluster)
                return
            driver.launchCooperativeKernel(handle, blocks, 1, 1, threads, 1, 1, shared_bytes,
                                           stream, block.params_address)
            return
        if self.overlap:
            handle, blocks, threads, shared_bytes = launches[0]
            driver.launchKernel(handle, blocks, 1, 1, threads, 1, 1, shared_bytes, stream,
                                block.params_address, 0)
            launch_overlapping_previous(*launches[1], stream, block.params_address)
            return
        for handle, blocks, threads, shared_bytes in launches:
            driver.launchKernel(handle, blocks, 1, 1, threads, 1, 1, shared_bytes, stream,
                                block.params_address, 0)

    def views(self, buffer: Any) -> FusedMapping:
        """The outputs, as views of ``buffer`` (a CuPy array)."""
        p = self.problem
        slots, rows, experts = p.num_slots, p.num_expanded, p.num_experts
        o = self.offsets
        return FusedMapping(
            buffer[o[0]:o[0] + slots].reshape(p.num_tokens, p.top_k),
            *(buffer[o[1] + r * rows:o[1] + (r + 1) * rows] for r in range(3)),
            *(buffer[o[2] + r * experts:o[2] + (r + 1) * experts] for r in range(3)))

    def torch_views(self, buffer: Any) -> FusedMapping:
        """The outputs, as views of ``buffer`` (a torch tensor): one split is
        cheaper than seven slices, and ``split_with_sizes`` than ``split``
        (whose Python wrapper cost ~2.6 us more a call on a CPU host)."""
        parts = buffer.split_with_sizes(self.split_sizes)
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (~0.4 us)
        return _new_tuple(FusedMapping, (parts[0].view(self.token_shape), *parts[1:7]))


_plans = BoundedCache()
_new_tuple = tuple.__new__


def plan_for(problem: MappingProblem, device: int) -> MappingPlan:
    plan = _plans.get((problem, device))
    if plan is None:
        plan = _plans.put((problem, device), MappingPlan(problem, device))
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
        result = plan.torch_views(buffer) if kind is ArrayKind.TORCH_CUDA else plan.views(buffer)
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
    if _torch_int32 is None:  # the one tested, bound last (free-threaded Python)
        _raw_torch_stream = raw_torch_stream_getter()
        _torch_int32 = sys.modules["torch"].int32
    buffer = topk_ids.new_empty(plan.buffer_size, dtype=_torch_int32)
    plan.launch(_raw_torch_stream(plan.device), topk_ids.data_ptr(), buffer.data_ptr())
    return plan.torch_views(buffer)
