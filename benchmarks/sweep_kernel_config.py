"""A/B tunings of the expand kernels on every manifest workload. GPU only.

    python benchmarks/sweep_kernel_config.py [--rounds R] [--iters N] [--only LABEL ...]
                                             [--plans] [--json PATH] [--configs TEXT ...]

Each config is an ``ExpandTuning`` (cupy_moe.expand.tuning) changed from the
default in one way; the first config is the default. Inputs are drawn once
per workload; every config's output is first checked bit-exact against the
NumPy reference, through ``run_with_tuning`` into outputs poisoned before the
call. What is timed is the launch of that call's plan (what the torch fast
path runs), so the full path's host checks stay out of the figures.
Interleaved rounds run the configs in turn (A B C .. A B C ..), so a slow
stretch of the machine hits every config alike; a cell is the median over
rounds, with the rounds' spread (max - min). Bandwidth-bound shapes: % of the
same-run copy bandwidth (L2 flushed between iterations); decode and small
shapes: GPU µs per call from CUDA-graph replays.

Diagnostic rows replay the default plan's launch changed in one way, to
place the time of a step: "no SF words" moves no scale factors
(sf_columns = 0), "no zero-fill blocks" launches the token blocks only,
"zero-fill blocks find no padding rows" reads a pos_to_expert with none (the
blocks' cost without their stores). Their outputs are wrong by design and
are not checked. The "floor" row (bandwidth-bound shapes) times, in the same
run, a device-to-device copy of the routed rows' bytes plus a memset of the
padding rows' bytes (``runner.split_bytes``: what ``cupy-moe bench`` reports
as copy+memset), as a % of the copy like the configs.

Only configs that still make sense on the current kernels are here; the
ones measured before and the switches dropped because they lost are in
benchmarks/NOTES.md and results/sweep.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys

import numpy as np
import torch

from cupy_moe.expand.api import run_with_tuning
from cupy_moe.expand.plan import EXPAND_ARGS, ExpandPlan, plan_for
from cupy_moe.expand.rules import check_expand, check_expand_with_sf
from cupy_moe.expand.tuning import DEFAULT_TUNING, ExpandTuning
from cupy_moe.harness.ab_sweep import pick_variants
from cupy_moe.harness.inputs import workload_inputs
from cupy_moe.harness.manifest import Workload, load_workloads
from cupy_moe.harness.runner import GRAPH_MAX_BYTES, reference_outputs, split_bytes
from cupy_moe.harness.timing import GpuTimer, torch_graph_us
from cupy_moe.runtime.arrays import describe, numpy_to_torch
from cupy_moe.runtime.gpu_arrays import raw_torch_stream_getter
from cupy_moe.runtime.launch import ArgBlock, launch


def _tuned(**changes) -> ExpandTuning:
    return dataclasses.replace(DEFAULT_TUNING, **changes)


# (name, tuning); the first is the default. Block counts are multiples of the
# SM count; row lengths in bytes.
# the ninth session's bulk zero-fill: bulk stores from a stage for rows of
# 8 KiB and more (a 16 KiB stage on padding-heavy plans), column chunks below,
# no zero kernel
STAGED = dict(bulk_whole_row_zero_from=8 * 1024, bulk_zero_rows_plain=0,
              zero_kernel_from_bytes=math.inf)

CONFIGS: list[tuple[str, ExpandTuning]] = [
    ("default", DEFAULT_TUNING),
    ("bulk zero-fill by column chunks on every row length",
     _tuned(bulk_whole_row_zero_from=math.inf)),
    ("1 whole row per bulk zero-fill block", _tuned(zero_rows_bulk_whole=1)),
    ("3 whole rows per bulk zero-fill block", _tuned(zero_rows_bulk_whole=3)),
    ("bulk target 8 x SMs blocks", _tuned(bulk_target_blocks=8.0)),
    ("bulk target 16 x SMs blocks", _tuned(bulk_target_blocks=16.0)),
    ("bulk chunks >= 1 KiB", _tuned(bulk_min_chunk_bytes=1024)),
    ("register kernel only (no bulk copies)", _tuned(bulk_min_blocks=math.inf)),
    # the register kernel compiled for the call's row (a module per row
    # length): wherever the default takes it, and on every call (twenty-
    # fourth session: Qwen3 fp8 medium +1.3 to +2.2, bf16 medium -0.5 to -0.9)
    ("register kernel compiled for the row", _tuned(compiled_row=1)),
    ("register kernel only, compiled for the row",
     _tuned(bulk_min_blocks=math.inf, compiled_row=1)),
    # ... only where a thread of a chunk holds one access (the rows that gained)
    ("register kernel compiled for rows of one access a thread", _tuned(compiled_row=2)),
    # zero-fill blocks by runs of rows (ExpandTuning.zero_fill_runs; the
    # default since the twenty-ninth session), row by row before it, the runs
    # unrolled, with the compiled row (32 KiB or 32-row blocks and 192-thread
    # blocks lost: results/sweep_zero_runs_h200.md)
    ("zero-fill row by row", _tuned(zero_fill_runs=0)),
    ("zero-fill by runs", _tuned(zero_fill_runs=1)),
    ("zero-fill by runs, unrolled", _tuned(zero_fill_runs=2)),
    ("zero-fill by runs, rows of one access a thread compiled",
     _tuned(zero_fill_runs=1, compiled_row=2)),
    # the register kernels bounded to 8 blocks of 256 threads an SM (32
    # registers: without SF they take 37, 6 blocks an SM)
    ("register kernel: 8 blocks an SM", _tuned(register_min_blocks=8)),
    # cache hints other than .cs (evict-first) on the register kernels'
    # accesses (thirty-third session: reduce_fused gained 2% on the EP8 plans
    # with loads by the read-only path)
    ("loads .nc", _tuned(load_hint=3)),
    ("loads plain", _tuned(load_hint=1)),
    # the seed's kernel stores plainly (STG.E.128; ours .cs: ncu, forty-seventh session)
    ("stores plain", _tuned(store_hint=1)),
    ("loads .nc, stores plain", _tuned(load_hint=3, store_hint=1)),
    ("loads .cg, stores .cg", _tuned(load_hint=2, store_hint=2)),
    # blocks that fit the row: 3 KiB fp8 rows are 192 16-byte accesses (a
    # quarter of a 256-thread block idle), Kimi-K2's 14 KiB bf16 rows 896 (4 x 224)
    *((f"register kernel: {threads} threads", _tuned(threads=threads)) for threads in (192, 224)),
    # the seed's geometry (thirtieth session): its TileLang kernel, which
    # leads on the small padding-heavy plans by 2-4%, is one block of 64
    # threads a row (a padding row zeroed, or a token copied); here blocks of
    # 64, 128 or 256 threads (the register kernel's, and the zero kernel's
    # beside the bulk kernel) with zero-fill blocks of one row each. Tied or
    # lost everywhere (results/expand_seed_geometry_h100.md)
    *((f"register kernel: {threads} threads, 1 row per zero-fill block",
       _tuned(threads=threads, zero_rows_registers=1, zero_block_bytes_registers=0))
      for threads in (64, 128, 256)),
    ("register kernel: 64 threads", _tuned(threads=64)),
    # register zero-fill blocks sized by rows alone (before the ~16 KiB floor):
    # decode's graph time went 1.41 -> 1.65 us across that change
    ("register zero-fill blocks by rows only", _tuned(zero_block_bytes_registers=0)),
    # zero-fill blocks of more rows: fewer, longer blocks on padding-heavy plans
    *((f"{rows} rows per register zero-fill block", _tuned(zero_rows_registers=rows))
      for rows in (4, 8, 16)),
    *((f"{rows} rows' chunks per bulk zero-fill block",
       _tuned(zero_rows_bulk=rows, bulk_whole_row_zero_from=math.inf)) for rows in (8, 16)),
    *((f"{rows} whole rows per bulk zero-fill block", _tuned(zero_rows_bulk_whole=rows))
      for rows in (4, 8)),
    # the ninth session's staged zero-fill, and its padding-heavy settings
    # (default there: 1 row a block, a 16 KiB stage)
    ("staged: the ninth session's bulk zero-fill", _tuned(**STAGED)),
    ("staged padding: stage of the copy chunk, 2 rows a block",
     _tuned(**STAGED, padding_zero_stage_bytes=0, padding_zero_rows_bulk_whole=2)),
    ("staged padding: whole rows on every row length",
     _tuned(**STAGED, padding_zero_whole_rows=1)),
    *((f"staged padding: stage {kib} KiB",
       _tuned(**STAGED, padding_zero_stage_bytes=kib * 1024)) for kib in (4, 8)),
    ("padding: 2 rows a block", _tuned(padding_zero_rows_bulk_whole=2)),
    ("padding-heavy plans on the bulk kernel too",
     _tuned(padding_share_registers=math.inf, medium_padding_share_registers=math.inf)),
    # plans with a third of their rows padding by shapes (EP8 medium: X = 6144
    # for T * K = 4096, most slots dropped; prefill at E = 256, 384) on the
    # register kernel too (its whole-block zero-fill); the default since the
    # thirteenth session below 128 MB of routed rows only
    ("padding share >= 0.3: register kernel", _tuned(padding_share_registers=0.3)),
    ("padding share >= 0.3: register kernel below 128 MB routed (before: 0.5)",
     _tuned(medium_padding_share_registers=0.5)),
    # every padding-heavy bulk plan on 512-byte chunks (default: only where 1
    # KiB chunks are too few blocks for the bulk kernel, Qwen3's fp8 rows at
    # T = 32; elsewhere they tied, NOTES.md eleventh session), and never
    ("padding: bulk chunks >= 512 B", _tuned(padding_bulk_min_chunk_bytes=512)),
    ("padding: bulk chunks >= 1 KiB", _tuned(padding_bulk_least_chunk_bytes=1024)),
    # padding-heavy plans' padding rows by a kernel of their own beside the
    # copies (expand_zero_padding_rows; default: beside the bulk kernel, from
    # 64 MB of padding rows)
    ("no zero kernel", _tuned(zero_kernel_from_bytes=math.inf)),
    ("padding: zero kernel", _tuned(zero_kernel_from_bytes=0)),
    ("padding: zero kernel beside the register kernel too",
     _tuned(zero_kernel_from_bytes=0, zero_kernel_beside_registers=1)),
    ("padding: zero kernel, 64 threads a row",
     _tuned(zero_kernel_from_bytes=0, threads=64, unroll=16, zero_block_bytes_registers=0)),
    # the zero kernel's blocks longer (default ~16 KiB: 2 of Qwen3's 6 KiB
    # rows): ncu (forty-seventh session, H200, qwen3-30b-small-e128) counted
    # 168 instructions a warp for its 3 stores, against the seed's 29 for 6;
    # more rows a block spread the ballot and the loop set-up over more
    # stores (elsewhere this field sizes the register kernel's zero-fill blocks)
    *((f"zero kernel: blocks of ~{kib} KiB", _tuned(zero_block_bytes_registers=kib * 1024))
      for kib in (32, 64, 128)),
    # benchmarks/zero_map_probe.py (forty-eighth session, H100): after the
    # map, plain stores ran at 97.8% of memset on Qwen3's 90 MB of padding
    # rows against .cs's 95.4% (EP8's 19 MB: 96.4 against 92.5), a 256-thread
    # block a row at 98.4%; the map itself cost ~0.5 us. And one kernel, not
    # two: no dependent launch between the copies and the zeros
    ("zero kernel: plain, 1 row a block", _tuned(store_hint=1, zero_block_bytes_registers=0,
                                                  zero_rows_registers=1)),
    *((f"one kernel: {threads} threads, no shrink, {rows} row{'s' * (rows > 1)} a zero-fill "
       "block, plain",
       _tuned(threads=threads, unroll=16 if threads < 128 else 4, shrink_chunks_below=0.0,
              split_slots_below=0.0, zero_rows_registers=rows, zero_block_bytes_registers=0,
              store_hint=1))
      for threads, rows in ((256, 1), (256, 2), (128, 1), (32, 1))),
    # ... the same restricted to padding-heavy plans of 16 token chunks and
    # more (ExpandTuning.padding_whole_chunks_from; the default since the
    # forty-eighth session), on decode too, and never (the bulk kernel's
    # copies, and the zero kernel beside them from 64 MB of padding). With
    # whole chunks, 2 rows a zero-fill block is "register zero-fill blocks by
    # rows only", plain stores "stores plain". The "padding: whole chunks*"
    # columns of results/expand_seed_one_kernel_h100.md ran before the
    # threshold: whole chunks on every padding-heavy plan, decode too
    ("padding: whole chunks from 1 token chunk", _tuned(padding_whole_chunks_from=1.0)),
    ("padding: no whole chunks", _tuned(padding_whole_chunks_from=math.inf)),
    # EP plans look tightly packed by their shapes (X = T * K) though the
    # mask drops most slots: every plan padding-heavy, so whole chunks in one
    # launch (the medium EP8 plans took the bulk kernel's one-warp blocks)
    ("every plan padding-heavy", _tuned(padding_share_registers=0.0)),
    ("every plan padding-heavy, 1 row a zero-fill block",
     _tuned(padding_share_registers=0.0, zero_block_bytes_registers=0, zero_rows_registers=1)),
    # every plan padding-heavy (EP plans are, with their slots dropped, though
    # their shapes do not say so): the zero kernel beside the copies
    ("every plan: zero kernel", _tuned(zero_kernel_from_bytes=0, padding_share_registers=0.0,
                                       zero_kernel_beside_registers=1)),
    # padding-heavy plans on the register kernel laid out as the seed's
    # kernel is (one block a token or a padding row, few threads, whole rows,
    # all K slots): chunks never shrink, slots never split; each zero-fill
    # block one row (two in the last)
    *((f"rows: {threads} threads, whole rows, {rows} a zero-fill block",
       _tuned(threads=threads, unroll=unroll, shrink_chunks_below=0.0, split_slots_below=0.0,
              zero_rows_registers=rows, zero_block_bytes_registers=0))
      for threads, unroll, rows in ((64, 16, 1), (128, 8, 1), (32, 16, 1), (64, 16, 2))),
    # the geometry of benchmarks/row_block_probe.cu's lean kernel, which ties
    # the seed on the EP8 plans in a CUDA graph (token blocks of whole rows,
    # then a zero-fill block a row, plain stores), on the register kernel;
    # "every plan" also for the EP plans that look tight by their shapes
    *((f"lean: {threads} threads, 1 row a zero-fill block, plain{suffix}",
       _tuned(threads=threads, unroll=unroll, zero_rows_registers=1,
              zero_block_bytes_registers=0, store_hint=1, **extra))
      for threads, unroll in ((128, 8), (256, 4))
      for suffix, extra in (("", {}), (", every plan", {"padding_share_registers": 0.0}))),
    # the lean rows kernel itself (expand.cu's expand_to_fused_rows: no SF)
    ("rows kernel: T < 1024", _tuned(rows_kernel_tokens_below=1024)),
    ("rows kernel: T < 1024, 128 threads",
     _tuned(rows_kernel_tokens_below=1024, rows_kernel_threads=128)),
    ("rows kernel: T < 1024, a slot a token block below 64 tokens",
     _tuned(rows_kernel_tokens_below=1024, rows_kernel_slot_blocks_below=64)),
    *((f"rows kernel: T < 1024, 128 threads, {group} slots a token block",
       _tuned(rows_kernel_tokens_below=1024, rows_kernel_threads=128,
              rows_kernel_slot_group=group))
      for group in (2, 4)),
    # ... writing by position, a block a row, given pos_to_token
    *((f"rows kernel by position: T < 1024, {threads} threads",
       _tuned(rows_by_position_tokens_below=1024, rows_by_position_bytes_below=math.inf,
              rows_kernel_threads=threads))
      for threads in (128, 256)),
    # ... its unroll: room for 16 KiB rows (one module for every row; the
    # default before the fifty-third session), or the call's row (fitted)
    *((f"rows kernel by position: T < 1024, {threads} threads, room for 16 KiB rows",
       _tuned(rows_by_position_tokens_below=1024, rows_by_position_bytes_below=math.inf,
              rows_kernel_threads=threads, rows_kernel_fitted_unroll=0))
      for threads in (128, 256)),
    # ... T < 1024 under the default's bytes bound (32 MB)
    *((f"rows kernel by position: T < 1024 below 32 MB, {threads} threads",
       _tuned(rows_by_position_tokens_below=1024, rows_kernel_threads=threads))
      for threads in (128, 256)),
    # column-major scale factors: by the token and zero-fill blocks (before
    # the twentieth session), or every one by the SF pass blocks where the call
    # passes pos_to_token (default: the pass writes the zeros only)
    ("SF in line", _tuned(sf_by_position=0)),
    ("SF by position: all, given pos_to_token", DEFAULT_TUNING),
    # beside the zero kernel (Kimi-K2 small plans) as its last blocks (the
    # default since the twenty-fourth session), or not: SF by its row blocks
    ("no SF pass beside the zero kernel", _tuned(sf_pass_beside_zero_kernel=0)),
    ("no SF pass beside the zero kernel, given pos_to_token",
     _tuned(sf_pass_beside_zero_kernel=0)),
    # rows by position (expand_to_fused_gather), given pos_to_token: where x is
    # below 16 MB (every plan but Kimi-K2's prefill ones), by rows a block; on
    # every call
    # (rows by position off: it comes first where it is on)
    *((f"gather: x below 16 MB, {rows} rows a block",
       _tuned(gather_x_bytes_below=16e6, gather_rows=rows, rows_by_position_tokens_below=0))
      for rows in (8, 16, 32, 64)),
    ("gather: every call", _tuned(gather_x_bytes_below=math.inf, rows_by_position_tokens_below=0)),
    # a warp a row, fewer rows a block: smaller blocks (8 rows won over 16-64
    # in the twenty-fourth session; the seed's kernel takes a block a row)
    *((f"gather: x below 16 MB, {rows} rows a block of {threads} threads",
       _tuned(gather_x_bytes_below=16e6, gather_rows=rows, threads=threads,
              rows_by_position_tokens_below=0))
      for rows, threads in ((4, 128), (2, 64), (1, 32))),
    # the default before rows by position (fifty-first session), given pos_to_token
    ("no rows by position, given pos_to_token", _tuned(rows_by_position_tokens_below=0)),
    ("room for 16 KiB rows, given pos_to_token", _tuned(rows_kernel_fitted_unroll=0)),
    # the default of the fifty-first and fifty-second sessions: by position below 64 tokens
    ("rows by position below 64 tokens, given pos_to_token",
     _tuned(rows_by_position_tokens_below=64)),
    # by position: blocks of 64 threads for rows of at most 8 KiB without scale
    # factors (the default since the fifty-fifth session) or not
    ("by position, rows_kernel_threads, given pos_to_token",
     _tuned(rows_by_position_narrow_threads=0)),
    ("by position, 64 threads to 8 KiB rows, given pos_to_token",
     _tuned(rows_by_position_narrow_threads=64)),
    # long rows (more than 8 KiB, no SF) at 512 <= T < 1024: the rows kernel's
    # token blocks of 4 slots at 128 threads (the default since the
    # fifty-sixth session), or not, or laid out otherwise
    ("long rows: off, given pos_to_token", _tuned(long_rows_tokens_from=math.inf)),
    ("long rows: any output, given pos_to_token", _tuned(long_rows_bytes_below=math.inf)),
    ("long rows: 256 threads, given pos_to_token", _tuned(long_rows_threads=256)),
    *((f"long rows: {group} slots a token block, given pos_to_token",
       _tuned(long_rows_slot_group=group)) for group in (2, 8)),
]
# configs whose calls pass pos_to_token (each row's token; the workloads that
# have one, the plan workloads: elsewhere they run as the default does)
WITH_POS_TO_TOKEN = {"SF by position: all, given pos_to_token",
                     "no SF pass beside the zero kernel, given pos_to_token",
                     "no rows by position, given pos_to_token",
                     "room for 16 KiB rows, given pos_to_token",
                     "rows by position below 64 tokens, given pos_to_token",
                     *(name for name, _ in CONFIGS
                       if name.startswith(("gather: ", "rows kernel by position: ",
                                           "by position, ", "long rows: ")))}
assert len({name for name, _ in CONFIGS}) == len(CONFIGS), "config names must differ"

_stream = raw_torch_stream_getter()


def _to_torch(array: np.ndarray) -> torch.Tensor:
    return numpy_to_torch(np.ascontiguousarray(array)).cuda()


def _run(w: Workload, tuning: ExpandTuning, args: dict, outs: tuple = (),
         with_pos_to_token: bool = False) -> tuple:
    """``w``'s op under ``tuning`` (into ``outs`` when given); its results as a tuple."""
    result = run_with_tuning(
        tuning, args["x"], args["token_topk_to_pos"], args["pos_to_expert"],
        x_sf=args.get("x_sf"), num_per_channels=w.num_per_channels,
        use_tma_aligned_col_major_sf=w.use_tma_aligned_col_major_sf,
        out=outs[0] if outs else None, out_sf=outs[1] if len(outs) > 1 else None,
        pos_to_token=args["pos_to_token"] if with_pos_to_token else None)
    return result if "x_sf" in args else result[:1]


def _plan(w: Workload, args: dict, tuning: ExpandTuning,
          with_pos_to_token: bool = False) -> ExpandPlan:
    """The plan ``run_with_tuning`` launches for these arguments: the same rules
    make the same problem, so ``plan_for`` returns the same cached object."""
    x, t2p, p2e = (describe(name, args[name])
                   for name in ("x", "token_topk_to_pos", "pos_to_expert"))
    if w.op == "expand_to_fused":
        problem = check_expand(x, t2p, p2e)
    else:
        problem = check_expand_with_sf(
            x, describe("x_sf", args["x_sf"]), t2p, p2e, num_per_channels=w.num_per_channels,
            use_tma_aligned_col_major_sf=w.use_tma_aligned_col_major_sf)
    return plan_for(problem, args["x"].element_size(), args["x"].device.index, tuning,
                    with_pos_to_token=with_pos_to_token)


def _pointers(args: dict, outs: tuple) -> tuple[int, ...]:
    """x, token_topk_to_pos, pos_to_expert, out, x_sf, out_sf (0 where absent)."""
    return (args["x"].data_ptr(), args["token_topk_to_pos"].data_ptr(),
            args["pos_to_expert"].data_ptr(), outs[0].data_ptr(),
            args["x_sf"].data_ptr() if "x_sf" in args else 0,
            outs[1].data_ptr() if len(outs) > 1 else 0)


def _raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """uint8 view of a tensor's whole storage region (column-major SF included)."""
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,)).view(torch.uint8)


def _check(w: Workload, tuning: ExpandTuning, args: dict, expected: tuple,
           outs: tuple, with_pos_to_token: bool = False) -> str | None:
    for out in outs:
        _raw_bytes(out).fill_(0xA5)
    _run(w, tuning, args, outs, with_pos_to_token)
    assert len(outs) == len(expected), (len(outs), len(expected))
    # one output (expand_to_fused) or two (with_sf): the names' first len(outs)
    for name, got, want in zip(("expanded_x", "expanded_x_sf")[:len(outs)], outs, expected,
                               strict=True):
        if not torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)):
            return f"MISMATCH {name}"
    return None


def _time(w: Workload, fn, timer: GpuTimer, iters: int, copy_tbps: float) -> float:
    if w.bytes <= GRAPH_MAX_BYTES:
        return torch_graph_us(fn)
    return 100 * w.bytes / timer.median_us(fn, iters) / 1e6 / copy_tbps


def _plan_launch(plan: ExpandPlan, pointers: tuple[int, ...]):
    def run():
        plan.launch(_stream(plan.device), *pointers)
    return run


def _diagnostic_launches(w: Workload, args: dict, outs: tuple):
    """(name, launch function) pairs replaying the default plan changed in one way."""
    plan = _plan(w, args, DEFAULT_TUNING)
    pointers = _pointers(args, outs)
    # the access width plan.launch picks for these pointers
    bits = plan.row_bytes | 16 | pointers[0] | pointers[3]
    kernel = plan.kernel(bits & -bits)
    constants = {name: kernel.constant(name)
                 for name in EXPAND_ARGS.names[EXPAND_ARGS.pointer_count:]}
    # every row an expert's
    no_padding = torch.zeros(w.num_expanded, dtype=torch.int32, device="cuda")
    variants = [("no zero-fill blocks", constants, (w.num_tokens, *kernel.grid[1:]), pointers),
                ("zero-fill blocks find no padding rows", constants, kernel.grid,
                 (*pointers[:2], no_padding.data_ptr(), *pointers[3:]))]
    if "x_sf" in args:
        variants.append(("no SF words", {**constants, "sf_columns": 0}, kernel.grid, pointers))
    variants = [(name, fields, grid, (*launch_pointers, 0))  # pos_to_token: none
                for name, fields, grid, launch_pointers in variants]
    result = []
    for name, fields, grid, launch_pointers in variants:
        block = ArgBlock(EXPAND_ARGS, EXPAND_ARGS.constants(**fields))

        def run(block=block, grid=grid, launch_pointers=launch_pointers, keep=no_padding):
            block.set_pointers(*launch_pointers)
            launch(kernel.handle, grid, kernel.threads, kernel.shared_bytes,
                   _stream(plan.device), block)
        result.append((f"diagnostic: {name}", run))
    return result


FLOOR_ROW = "floor: copy of the routed rows + memset of the padding rows"


def _floor(w: Workload, host: dict, timer: GpuTimer, iters: int, copy_tbps: float) -> float:
    """The copy + memset floor of ``w`` on ``host`` inputs, as a % of the copy."""
    copy_bytes, zero_bytes = split_bytes(w, host)
    us = timer.copy_us(copy_bytes // 2, iters) + (timer.memset_us(zero_bytes, iters)
                                                  if zero_bytes else 0.0)
    return 100 * w.bytes / us / 1e6 / copy_tbps


def _cell_text(values: list[float] | str, unit: str) -> str:
    if isinstance(values, str):
        return values
    spread = (max(values) - min(values)) / 2
    if unit == "us":
        return f"{statistics.median(values):.2f} µs ±{spread:.2f}"
    return f"{statistics.median(values):.1f} ±{spread:.1f}"


def _changes(tuning: ExpandTuning) -> dict[str, float]:
    """The fields of ``tuning`` that differ from the default."""
    return {field.name: getattr(tuning, field.name) for field in dataclasses.fields(tuning)
            if getattr(tuning, field.name) != getattr(DEFAULT_TUNING, field.name)}


def _json_fields(fields: dict[str, float]) -> dict[str, float | str]:
    """Tuning fields for strict JSON: infinity as the string "inf"."""
    return {name: value if math.isfinite(value) else str(value) for name, value in fields.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--only", nargs="*", metavar="LABEL", help="workload labels (default: all)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--configs", nargs="*", metavar="TEXT",
                        help="only the configs whose name contains one of these (the default "
                             "always runs)")
    parser.add_argument("--plans", action="store_true",
                        help="the real-plan workloads (padding-heavy) instead of the tightly "
                             "packed ones")
    args = parser.parse_args()
    if args.rounds < 1 or args.iters < 1:
        parser.error(f"--rounds and --iters must be >= 1, got {args.rounds} and {args.iters}")
    every = [w for op in ("expand_to_fused", "expand_to_fused_with_sf")
             for w in load_workloads(op) if (w.plan is not None) == args.plans]
    unknown = sorted(set(args.only or ()) - {w.label for w in every})
    if unknown:
        parser.error(f"--only: unknown workload label(s) {', '.join(unknown)}")
    workloads = [w for w in every if not args.only or w.label in args.only]
    configs = pick_variants(CONFIGS, args.configs, "--configs", parser.error)
    timer = GpuTimer()
    copy_tbps = timer.copy_tbps()
    rng = np.random.default_rng()
    cells: dict[str, dict[str, list | str]] = {name: {} for name, _ in configs}
    for w in workloads:
        host = workload_inputs(w, rng)
        inputs = {name: _to_torch(a) for name, a in host.items()}
        expected = tuple(_to_torch(e) for e in reference_outputs(w, host))
        outs = _run(w, DEFAULT_TUNING, inputs)
        pointers = _pointers(inputs, outs)
        for round_index in range(args.rounds):
            for name, tuning in configs:
                if isinstance(cells[name].get(w.label), str):
                    continue  # already failed
                # the plan's pos_to_token (workload_inputs: plan workloads)
                given = name in WITH_POS_TO_TOKEN and "pos_to_token" in inputs
                problem = (_check(w, tuning, inputs, expected, outs, given) if round_index == 0
                           else None)
                if problem:
                    cells[name][w.label] = problem
                    continue
                run = _plan_launch(_plan(w, inputs, tuning, given),
                                   (*pointers, inputs["pos_to_token"].data_ptr() if given else 0))
                cells[name].setdefault(w.label, []).append(
                    _time(w, run, timer, args.iters, copy_tbps))
        for name, run in _diagnostic_launches(w, inputs, outs):
            cells.setdefault(name, {})[w.label] = [_time(w, run, timer, args.iters, copy_tbps)
                                                   for _ in range(args.rounds)]
        if w.bytes > GRAPH_MAX_BYTES:  # (decode and small shapes: graph µs, no floor)
            cells.setdefault(FLOOR_ROW, {})[w.label] = [
                _floor(w, host, timer, args.iters, copy_tbps) for _ in range(args.rounds)]
        print(w.label, "done", file=sys.stderr, flush=True)

    units = {w.label: "us" if w.bytes <= GRAPH_MAX_BYTES else "%" for w in workloads}
    print(f"copy roofline {copy_tbps:.2f} TB/s; {args.rounds} rounds; % of it per workload "
          "(decode/small: CUDA-graph replay µs per call); ± half the rounds' spread")
    print("| config | " + " | ".join(w.label for w in workloads) + " |")
    print("|---" * (len(workloads) + 1) + "|")
    for name, row in cells.items():
        print(f"| {name} | " + " | ".join(_cell_text(row[w.label], units[w.label])
                                          if w.label in row else "" for w in workloads) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_tbps": copy_tbps, "rounds": args.rounds, "units": units,
                       "default_tuning": _json_fields(dataclasses.asdict(DEFAULT_TUNING)),
                       "config_changes": {name: _json_fields(_changes(tuning))
                                          for name, tuning in configs},
                       "cells": cells}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
