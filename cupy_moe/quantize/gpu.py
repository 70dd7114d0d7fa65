"""The quantize ops on the GPU: CuPy arrays and CUDA torch tensors.

Arguments are used in place (raw device pointers; copies only of
non-contiguous inputs) and one kernel of kernels_cu/quantize.cu runs on the
caller's current stream: CuPy's for CuPy arrays, torch's for tensors. Nothing
here synchronises with the host, and a call's grid depends on its shapes
only, so calls can be captured in CUDA graphs.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import cupy
from cupy.cuda import driver

from ..runtime.arrays import ArrayKind
from ..runtime.bounded_cache import BoundedCache
from ..runtime.cache_hints import half_l2_holds
from ..runtime.gpu_arrays import gpu_library, raw_torch_stream_getter
from ..runtime.launch import (
    ArgBlock,
    ArgStruct,
    OnDevice,
    device_traits,
    function_handle,
)
from .launch_shape import (
    SEGMENT_COLUMNS,
    SF_COL_MAJOR_F32,
    SF_COL_MAJOR_UE8M0,
    SF_ROW_MAJOR_F32,
    QuantizeShape,
    QuantizeTuning,
    launch_shape,
)
from .rules import QuantizeProblem

SOURCE = "quantize.cu"

# struct QuantizeArgs of quantize.cu, field for field
QUANTIZE_ARGS = ArgStruct(
    ("x", "ptr"), ("out", "ptr"), ("out_sf", "ptr"), ("topk_weights", "ptr"),
    ("pos_to_token_topk", "ptr"), ("pos_to_expert", "ptr"), ("slot_to_row", "ptr"),
    ("num_rows", "i64"),
    ("num_weights", "i64"), ("row_magic", "i64"), ("block_magic", "i64"),
    ("pass_magic", "i64"), ("hidden", "i32"), ("sf_blocks", "i32"), ("sf_ld", "i32"),
    ("group_log2", "i32"), ("lanes_per_row", "i32"), ("row_shift", "i32"), ("block_shift", "i32"),
    ("pass_shift", "i32"), ("passes", "i32"), ("sf_layout", "i32"), ("round_sf", "i32"),
    ("block_rows", "i32"), ("zero_padding", "i32"))
_pack_pointers = QUANTIZE_ARGS.pointer_packer.pack_into


def kernel_name(problem: QuantizeProblem, vector: bool, rows: bool = False,
                narrow: str = "", segment_columns: int = SEGMENT_COLUMNS,
                tiles: bool = False, by_slot: bool = False) -> str:
    """The kernel: coalesced (``vector``; swiglu's row-major one with ``rows``,
    ``*_rows{W}`` with W-column segments (W = 256, 512, 768), the few-rows
    one with ``narrow``, ``"vec1"`` or swiglu's ``"block_rows"``;
    quantize_fp8's ``*_tiles`` with ``tiles``; swiglu's ``*_slots`` twin of
    ``*_vec``, ``*_vec1`` or a row-major one with ``by_slot``) or element
    accesses."""
    op = "swiglu_quantize_fp8" if problem.swiglu else "quantize_fp8"
    dtype = "f32" if problem.in_dtype == "float32" else "bf16"
    segments = "rows" if segment_columns == SEGMENT_COLUMNS else f"rows{segment_columns}"
    coalesced = segments if rows else "tiles" if tiles else narrow or "vec"
    if not vector:
        return f"{op}_{dtype}_any"
    return f"{op}_{dtype}_{coalesced}{'_slots' if by_slot else ''}"


# quantize.cu's kernel forms (the name's end after the dtype), in the order
# of the QUANTIZE_KERNELS bits
KERNEL_FORMS = ("vec", "vec1", "any", "tiles", "block_rows", "rows", "rows768", "rows512",
                "rows256", "vec_slots", "vec1_slots", "rows_slots", "rows768_slots",
                "rows512_slots", "rows256_slots")


def kernel_set_defines(problem: QuantizeProblem,
                       kernel: str | None = None) -> tuple[tuple[str, int], ...]:
    """The module's kernels: the problem's op and input dtype alone
    (quantize.cu's QUANTIZE_OPS and QUANTIZE_INPUTS bit masks) and, given
    ``kernel`` (a name of ``kernel_name``'s), that kernel alone
    (QUANTIZE_KERNELS), so that a first call in a fresh kernel cache
    compiles one kernel, not the file's 32."""
    defines = (("QUANTIZE_OPS", 2 if problem.swiglu else 1),
               ("QUANTIZE_INPUTS", 2 if problem.in_dtype == "float32" else 1))
    if kernel is None:
        return defines
    form = kernel.split("_bf16_" if "_bf16_" in kernel else "_f32_", 1)[1]
    return (*defines, ("QUANTIZE_KERNELS", 1 << KERNEL_FORMS.index(form)))


class _KernelHandles(dict):
    """A plan's two kernels, ``vector`` -> driver handle, each compiled (a
    module of its own) at its first launch: the element-access kernel waits
    for a call with misaligned pointers, which most plans never see."""

    __slots__ = ("plan",)

    def __init__(self, plan: QuantizePlan) -> None:
        super().__init__()
        self.plan = plan

    def __missing__(self, vector: bool) -> int:
        plan = self.plan
        name = plan.kernel_name(vector)
        with OnDevice(plan.device):  # a launch from the torch fast path sets no device
            handle = self[vector] = function_handle(
                SOURCE, (*plan.defines, *kernel_set_defines(plan.problem, name)), plan.device,
                name)
        return handle


def takes_slots(problem: QuantizeProblem, tuning: QuantizeTuning) -> bool:
    """Whether the coalesced launch visits the T * K slots (the ``*_slots``
    kernels) instead of the X rows: swiglu given ``token_topk_to_pos`` with
    ``zero_padding=False``, at least one slot, whole scale-factor blocks
    (the coalesced kernels' condition), and at least
    ``tuning.by_slot_from_rows_per_slot`` rows a slot."""
    return (problem.swiglu and problem.has_token_topk_to_pos and not problem.zero_padding
            and problem.num_weights > 0 and problem.hidden % problem.num_per_channels == 0
            and problem.num_rows >= tuning.by_slot_from_rows_per_slot * problem.num_weights)


def sf_layout(problem: QuantizeProblem) -> int:
    if problem.packed_ue8m0:
        return SF_COL_MAJOR_UE8M0
    return SF_COL_MAJOR_F32 if problem.col_major else SF_ROW_MAJOR_F32


class QuantizePlan:
    """The launches of one (problem, device, tuning): both kernels (coalesced
    16-byte accesses, when H % npc == 0 and a call's pointers are 16-byte
    aligned; else element accesses), their grids and the argument block with
    its constant fields packed. With ``by_slot`` the coalesced kernel is a
    ``*_slots`` one, its grid over the T * K slots; the element-access one
    (misaligned pointers) still visits the X rows, as without the hint."""

    __slots__ = ("args", "by_slot", "defines", "device", "handles", "problem", "shape")

    def __init__(self, problem: QuantizeProblem, device: int, tuning: QuantizeTuning) -> None:
        self.problem, self.device = problem, device
        # live rows, at most: T * K with weights (the rest are padding), else X
        live_rows = (min(problem.num_rows, problem.num_weights) if problem.num_weights >= 0
                     else problem.num_rows)
        multiprocessors = device_traits(device).multiprocessors
        # swiglu, few live rows: at most narrow_live_rows, or (padding rows
        # not written) few for the codes around them; quantize_fp8: few
        # columns an SM
        if problem.swiglu:
            narrow = (live_rows <= tuning.narrow_live_rows
                      or (not problem.zero_padding and problem.num_rows * problem.hidden
                          >= tuning.unzeroed_block_rows_from_bytes * live_rows))
        else:
            narrow = (problem.num_rows * problem.hidden
                      <= tuning.vec1_columns_per_sm * multiprocessors)
        columns = 4 if problem.in_dtype == "float32" else 8  # a 16-byte chunk
        # codes of rows known to be padding that the call zero-fills (the
        # row-major kernels' segment widths: QuantizeTuning.fill_segment_columns)
        fill_bytes = ((problem.num_rows - live_rows) * problem.hidden
                      if problem.swiglu and problem.zero_padding else 0)
        try:
            self.shape: QuantizeShape = launch_shape(
                problem.num_rows, problem.hidden, problem.num_per_channels, multiprocessors,
                tuning, swiglu=problem.swiglu, narrow_columns=columns if narrow else 0,
                sf_layout=sf_layout(problem), fill_bytes=fill_bytes)
        except ValueError:
            if not narrow:
                raise
            # a narrow grid too large for one launch (a huge X of padding
            # rows): the wide grid, which may fit (else the same error)
            self.shape = launch_shape(problem.num_rows, problem.hidden,
                                      problem.num_per_channels, multiprocessors, tuning,
                                      swiglu=problem.swiglu, sf_layout=sf_layout(problem),
                                      fill_bytes=fill_bytes)
        self.by_slot = takes_slots(problem, tuning)
        if self.by_slot:
            # the coalesced grid over the slots, *_vec1_slots up to
            # narrow_slot_columns_per_sm (never *_block_rows: it walks rows);
            # *_any's grid stays the rows' (its fields do not depend on the count)
            slot_tuning = replace(tuning, block_rows_from_bytes=float("inf"))
            try:
                slot_shape = launch_shape(
                    problem.num_weights, problem.hidden, problem.num_per_channels,
                    multiprocessors, slot_tuning, swiglu=True,
                    narrow_columns=(columns if problem.num_weights * problem.hidden
                                    <= tuning.narrow_slot_columns_per_sm * multiprocessors
                                    else 0),
                    sf_layout=sf_layout(problem))
            except ValueError:  # more slots than one launch takes: the rows' grid
                self.by_slot = False
            else:
                self.shape = slot_shape._replace(threads=self.shape.threads,
                                                 blocks=self.shape.blocks)
        # the most the call reads (rows of x, or of h: 2I columns) and writes
        # (codes, scale factors): where that fits in half the L2, x may still
        # be there from its writer (QuantizeTuning.resident_load_hint)
        item_bytes = 4 if problem.in_dtype == "float32" else 2
        touched = problem.num_rows * (problem.hidden * item_bytes * (2 if problem.swiglu else 1)
                                      + problem.hidden + 4 * problem.sf_blocks)
        self.defines = tuning.defines(resident=half_l2_holds(touched,
                                                             device_traits(device).l2_bytes))
        self.handles = _KernelHandles(self)
        shape = self.shape
        self.args = ArgBlock(QUANTIZE_ARGS, QUANTIZE_ARGS.constants(
            num_rows=problem.num_rows, num_weights=max(problem.num_weights, 0),
            row_magic=shape.row_magic, block_magic=shape.block_magic,
            pass_magic=shape.pass_magic, hidden=problem.hidden,
            sf_blocks=problem.sf_blocks, sf_ld=problem.sf_leading_dim,
            group_log2=shape.group_log2, lanes_per_row=shape.lanes_per_row,
            row_shift=shape.row_shift, block_shift=shape.block_shift,
            pass_shift=shape.pass_shift, passes=shape.passes,
            sf_layout=sf_layout(problem), round_sf=int(problem.round_sf),
            block_rows=shape.block_rows, zero_padding=int(problem.zero_padding)),
            bind_context=True)

    def kernel_name(self, vector: bool) -> str:
        """The kernel of the coalesced launch (``vector``) or of the
        element-access one."""
        return kernel_name(self.problem, vector, vector and self.shape.rows,
                           self.narrow_kernel(vector), self.shape.segment_columns,
                           self.shape.tiles, vector and self.by_slot)

    def narrow_kernel(self, vector: bool) -> str:
        """The few-live-rows kernel of the coalesced launch ("" if none)."""
        if not (vector and self.shape.narrow):
            return ""
        return "block_rows" if self.shape.block_rows else "vec1"

    def launch(self, stream: int, x: int, out: int, out_sf: int, topk_weights: int,
               pos_to_token_topk: int, pos_to_expert: int, slot_to_row: int) -> None:
        """One launch on ``stream``; the pointers are 0 for absent arrays
        (``slot_to_row``: ``token_topk_to_pos``, which a ``by_slot`` plan
        needs)."""
        shape = self.shape
        vector = shape.vec_blocks > 0 and (x | out) % 16 == 0
        blocks, threads = shape.grid(vector)
        if blocks == 0:
            return
        block = self.args
        _pack_pointers(block.buffer, 0, x, out, out_sf, topk_weights, pos_to_token_topk,
                       pos_to_expert, slot_to_row)
        driver.launchKernel(self.handles[vector], blocks, 1, 1, threads, 1, 1, 0, stream,
                            block.params_address, 0)


_plans = BoundedCache()


def plan_for(problem: QuantizeProblem, device: int, tuning: QuantizeTuning) -> QuantizePlan:
    key = (problem, device, tuning)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, QuantizePlan(problem, device, tuning))
    return plan


def _allocate_torch(problem: QuantizeProblem, like: Any, out: Any, out_sf: Any) -> tuple[Any, Any]:
    torch = sys.modules["torch"]
    if out is None:
        out = like.new_empty(problem.out_shape(), dtype=torch.float8_e4m3fn)
    if out_sf is None:
        dtype = torch.int32 if problem.packed_ue8m0 else torch.float32
        rows, columns = problem.out_sf_shape()
        if problem.col_major:
            ld = problem.sf_leading_dim
            full = like.new_empty_strided((ld, columns), (1, ld), dtype=dtype)
            out_sf = full if ld == rows else full[:rows]
        else:
            out_sf = like.new_empty((rows, columns), dtype=dtype)
    return out, out_sf


def _allocate_cupy(problem: QuantizeProblem, out: Any, out_sf: Any) -> tuple[Any, Any]:
    if out is None:
        out = cupy.empty(problem.out_shape(), dtype=cupy.uint8)
    if out_sf is None:
        rows, columns = problem.out_sf_shape()
        if problem.col_major:
            out_sf = cupy.empty((columns, problem.sf_leading_dim),
                                dtype=problem.sf_dtype)[:, :rows].T
        else:
            out_sf = cupy.empty((rows, columns), dtype=problem.sf_dtype)
    return out, out_sf


def run_quantize(kind: ArrayKind, problem: QuantizeProblem, tuning: QuantizeTuning, x: Any,
                 topk_weights: Any, pos_to_token_topk: Any, pos_to_expert: Any,
                 token_topk_to_pos: Any, out: Any,
                 out_sf: Any) -> tuple[tuple[Any, Any], QuantizePlan]:
    """Either op on the GPU, after the public op checked every rule.

    ``x`` is ``h`` for swiglu; the maps are None where not given. Returns
    ``((out, out_sf), plan)``; caller-provided outputs are written in place
    and returned as the same objects.
    """
    lib = gpu_library(kind)
    device = lib.device(x)
    with OnDevice(device):
        stream = lib.stream(device)
        # contiguous copies stay referenced until after the launch: a copy
        # freed earlier could become the outputs' memory
        inputs = [None if a is None else lib.contiguous(a)
                  for a in (x, topk_weights, pos_to_token_topk, pos_to_expert,
                            token_topk_to_pos)]
        plan = plan_for(problem, device, tuning)
        if kind is ArrayKind.TORCH_CUDA:
            out, out_sf = _allocate_torch(problem, inputs[0], out, out_sf)
        else:
            out, out_sf = _allocate_cupy(problem, out, out_sf)
        pointers = [0 if a is None else lib.pointer(a) for a in inputs]
        plan.launch(stream, pointers[0], lib.pointer(out), lib.pointer(out_sf), *pointers[1:])
    return (out, out_sf), plan


_raw_torch_stream = None


def run_torch_fast(plan: QuantizePlan, x: Any, topk_weights: Any, pos_to_token_topk: Any,
                   pos_to_expert: Any, token_topk_to_pos: Any) -> tuple[Any, Any]:
    """A torch call (fresh outputs, contiguous inputs) whose descriptions
    ``plan`` was made for: the fast path's hit. Written flat: it runs on every
    eager call."""
    global _raw_torch_stream
    if _raw_torch_stream is None:
        _raw_torch_stream = raw_torch_stream_getter()
    out, out_sf = _allocate_torch(plan.problem, x, None, None)
    plan.launch(_raw_torch_stream(plan.device), x.data_ptr(), out.data_ptr(), out_sf.data_ptr(),
                0 if topk_weights is None else topk_weights.data_ptr(),
                0 if pos_to_token_topk is None else pos_to_token_topk.data_ptr(),
                0 if pos_to_expert is None else pos_to_expert.data_ptr(),
                0 if token_topk_to_pos is None else token_topk_to_pos.data_ptr())
    return out, out_sf
