"""Launch plans of the expand kernels, and the torch fast path's keys: host-side
bookkeeping that needs CuPy but no GPU."""

import dataclasses
import math

import pytest

pytest.importorskip("cupy")

import cupy_moe.expand.plan as plan_module  # noqa: E402
from cupy_moe.expand.gpu import ROUTING_ARGS  # noqa: E402
from cupy_moe.expand.plan import (  # noqa: E402
    EXPAND_ARGS,
    SF_PASS_ALL,
    SF_PASS_NONE,
    SF_PASS_ZEROS,
    SF_ROW_MAJOR,
    ExpandPlan,
)
from cupy_moe.expand.rules import ExpandProblem  # noqa: E402
from cupy_moe.expand.tuning import DEFAULT_TUNING, ExpandTuning  # noqa: E402
from cupy_moe.runtime import launch as launch_module  # noqa: E402
from cupy_moe.runtime.arrays import describe  # noqa: E402
from cupy_moe.runtime.fast_path import TorchFastPath  # noqa: E402
from cupy_moe.runtime.launch import DeviceTraits  # noqa: E402
from cupy_moe.runtime.sizes import align_up  # noqa: E402


def test_argument_blocks_match_the_kernel_structs():
    # struct ExpandArgs: 7 pointers, an int64, 15 int32 (padded to 8 bytes);
    # RoutingArgs: 5 pointers, an int64, two int32.
    assert EXPAND_ARGS.size == 7 * 8 + 8 + 15 * 4 + 4
    assert EXPAND_ARGS.names[-7:] == ("zero_padding", "first_zero_row", "sf_pass",
                                      "sf_pass_blocks", "zero_row_blocks",
                                      "rows_per_gather_block", "token_blocks")
    assert EXPAND_ARGS.pointer_count == 7
    assert ROUTING_ARGS.size == 5 * 8 + 8 + 2 * 4


def test_arg_struct_pads_like_the_compiler():
    # an int32 before a pointer is padded to the pointer's alignment
    layout = launch_module.ArgStruct(("p", "ptr"), ("n", "i32"), ("q", "ptr"), ("m", "i32"))
    assert layout.packer.format == "<Qi4xQi4x" and layout.size == 32
    with pytest.raises(TypeError, match=r"missing \['m'\], unknown \['z'\]"):
        layout.constants(n=1, q=2, z=3)


@pytest.fixture
def fake_h200(monkeypatch):
    """Plans for a device 0 with 132 SMs and compute capability 9.x, no GPU needed;
    a launch's handle is its kernel's name."""
    monkeypatch.setitem(launch_module._device_traits, 0, DeviceTraits(132, 9, 232448))
    monkeypatch.setattr(plan_module, "function_handle",
                        lambda source, defines, device, name: name)


# The ninth session's bulk zero-fill: bulk stores from a stage for rows of
# 8 KiB and more, column chunks below, no zero kernel (what the tests of those
# mechanisms pin; the defaults moved to 16-byte stores of whole rows)
STAGED = dataclasses.replace(DEFAULT_TUNING, bulk_whole_row_zero_from=8192,
                             bulk_zero_rows_plain=0, zero_kernel_from_bytes=math.inf,
                             padding_whole_chunks_from=math.inf)
# small padding-heavy batches' copies by the bulk kernel, as before the
# forty-eighth session's whole register chunks
BULK_SMALL_BATCHES = dataclasses.replace(DEFAULT_TUNING, padding_whole_chunks_from=math.inf)
# the default without the long rows' rows kernel (rows of more than 8 KiB at
# 512 <= T < 1024: test_default_long_rows_take_token_blocks_of_4_slots), for
# the tests of the bulk and register kernels' layouts on Kimi-K2's T = 512 shapes
NO_LONG_ROWS = dataclasses.replace(DEFAULT_TUNING, long_rows_tokens_from=math.inf)


def _launch_for(num_tokens, hidden, item_bytes=2, vec_bytes=16, top_k=8,
                tuning=DEFAULT_TUNING, zero_padding=True, **sf):
    problem = ExpandProblem(num_tokens, hidden, top_k, num_tokens * top_k,
                            "bfloat16" if item_bytes == 2 else "float8_e4m3fn", **sf)
    return ExpandPlan(problem, item_bytes, 0, tuning, zero_padding=zero_padding).kernel(vec_bytes)


@pytest.mark.parametrize(("num_tokens", "hidden", "chunk_bytes", "chunks"), [
    (4096, 7168, 14336, 1),   # kimi-k2-prefill: whole rows
    (4096, 3072, 6144, 1),    # qwen3-30b-prefill
    (512, 7168, 3584, 4),     # kimi-k2-medium: 2048 blocks >= 12 x 132, equal quarters
    (512, 3072, 2048, 3),     # qwen3-30b-medium: 1536 < 12 x 132, the most chunks of >= 2 KiB
    (32, 7168, 2048, 7),      # kimi-k2-small: 224 blocks >= 132
    (4096, 16384, 16384, 2),  # rows longer than the biggest chunk
    (500, 7000, 3584, 4),     # 14000 bytes: 4 chunks of 7 vectors per lane, the last short
])
def test_bulk_kernel_chunks_for_the_batch(fake_h200, num_tokens, hidden, chunk_bytes, chunks):
    launch = _launch_for(num_tokens, hidden, tuning=NO_LONG_ROWS)
    # every row length: zero-fill blocks of whole rows, by 16-byte stores
    assert launch.handle == "expand_to_fused_bulk_zero_rows_plain"
    assert (launch.threads, launch.shared_bytes, launch.grid[1]) == (32, chunk_bytes, chunks)
    assert launch.constant("vecs_per_thread") == chunk_bytes // 16 // 32
    assert launch.constant("slots_per_block") == 8
    assert (chunks - 1) * chunk_bytes < launch.constant("row_bytes") <= chunks * chunk_bytes


@pytest.mark.parametrize(("num_tokens", "hidden", "vec_bytes", "major", "top_k"), [
    (1, 7168, 16, 9, 8),      # decode: too few blocks
    (32, 3072, 16, 9, 8),     # qwen3-30b-small: 96 chunks of 2 KiB < 132 SMs
    (4096, 7168, 8, 9, 8),    # 8-byte aligned rows
    (4096, 7168, 16, 8, 8),   # sm_80: no bulk-copy engine
    (4096, 7168, 16, 9, 33),  # more slots than the warp's lanes
])
def test_register_kernel_elsewhere(fake_h200, monkeypatch, num_tokens, hidden, vec_bytes, major,
                                   top_k):
    monkeypatch.setitem(launch_module._device_traits, 0, DeviceTraits(132, major, 232448))
    launch = _launch_for(num_tokens, hidden, vec_bytes=vec_bytes, top_k=top_k)
    assert launch.handle == f"expand_to_fused_v{vec_bytes}"
    assert (launch.threads, launch.shared_bytes) == (DEFAULT_TUNING.threads, 0)


# (zero-fill blocks of a column chunk: the bulk kernel's first layout)
FORCE_BULK = ExpandTuning(bulk_min_blocks=0.0, padding_share_registers=math.inf,
                          medium_padding_share_registers=math.inf,
                          bulk_whole_row_zero_from=math.inf)
FORCE_REGISTERS = ExpandTuning(bulk_min_blocks=math.inf)


def test_no_tokens_take_the_register_kernel_even_when_bulk_is_forced(fake_h200):
    # T == 0 only zero-fills; the bulk kernel's chunking divides by T
    assert _launch_for(0, 7168, tuning=FORCE_BULK).handle == "expand_to_fused_v16"


@pytest.mark.parametrize(("tuning", "handle"), [
    (FORCE_BULK, "expand_to_fused_bulk"), (FORCE_REGISTERS, "expand_to_fused_v16")])
def test_forcing_a_kernel_reaches_small_batches(fake_h200, tuning, handle):
    # what the GPU tests' kernel paths rely on: 5 tokens of 32-byte rows
    assert _launch_for(5, 16, tuning=tuning).handle == handle
    # bulk: either zero-fill
    assert _launch_for(4096, 7168, tuning=tuning).handle.startswith(handle)


def test_the_zero_stage_kernel_path_reaches_small_batches(fake_h200):
    """conftest's "bulk-zero-stage" path: whole-row zero-fill from a 2 KiB stage
    above the 512-byte copy chunks, for the GPU tests' small rows too."""
    from conftest import KERNEL_PATHS

    tuning = KERNEL_PATHS["bulk-zero-stage"]
    # (a copy chunk is at least 512 bytes: 32 lanes x 16 bytes)
    for num_tokens, hidden, stage in ((5, 16, 512), (5, 2048, 2048), (4096, 7168, 14336)):
        launch = _launch_for(num_tokens, hidden, tuning=tuning)
        assert (launch.handle, launch.shared_bytes) == ("expand_to_fused_bulk_zero_rows", stage)


@pytest.mark.parametrize(("num_tokens", "hidden", "num_expanded", "handle", "chunks",
                          "zero_rows"), [
    # kimi-k2-medium on a 128-expert plan (75% padding): the register kernel,
    # 16 KiB chunks, 1 row each; its tightly packed twin keeps the bulk kernel
    (512, 7168, 16384, "expand_to_fused_v16", 1, 2),
    (512, 7168, 4096, "expand_to_fused_bulk_zero_rows_plain", 4, 2),
    # qwen3-30b-medium, 384 experts (92% padding): register, 6 KiB rows
    (512, 3072, 49152, "expand_to_fused_v16", 1, 3),
    # qwen3-30b-small, 128 experts: 32 token chunks (>= 16) kept whole, all
    # K slots a block, zero-fill blocks of 3 rows (~16 KiB): one launch
    (32, 3072, 14848, "expand_to_fused_v16", 1, 3),
    # kimi-k2-prefill on a 384-expert plan: 33% padding, the bulk kernel
    (4096, 7168, 49152, "expand_to_fused_bulk_zero_rows_plain", 1, 2),
    # kimi-k2-medium on an EP8 plan (48 local experts, X = 6144): 33%
    # padding by shapes, 59 MB of routed rows (< 128 MB): the register kernel
    (512, 7168, 6144, "expand_to_fused_v16", 1, 2),
    # its fp8 twin (29 MB) and qwen3-30b's (25 MB) too
    (512, 3584, 6144, "expand_to_fused_v16", 1, 3),
    (512, 3072, 6144, "expand_to_fused_v16", 1, 3),
    # qwen3-30b-prefill on a 256-expert plan: 32% padding, 201 MB routed
    (4096, 3072, 48128, "expand_to_fused_bulk_zero_rows_plain", 1, 2),
    # a medium batch with under 30% padding keeps the bulk kernel
    (512, 7168, 5632, "expand_to_fused_bulk_zero_rows_plain", 4, 2),
])
def test_padding_heavy_plans(fake_h200, num_tokens, hidden, num_expanded, handle, chunks,
                             zero_rows):
    # (long rows off: by default Kimi-K2's T = 512 rows take the rows kernel)
    problem = ExpandProblem(num_tokens, hidden, 8, num_expanded, "bfloat16")
    launch = ExpandPlan(problem, 2, 0, NO_LONG_ROWS).kernel(16)
    assert (launch.handle, launch.grid[1]) == (handle, chunks)
    assert launch.constant("rows_per_zero_block") == zero_rows


@pytest.mark.parametrize(("num_tokens", "hidden", "num_expanded", "stage_bytes", "zero_rows"), [
    # kimi-k2-small, 128 experts: 1 KiB copy chunks; zero-fill blocks of 1 row
    # from a 14 KiB stage (the row)
    (32, 7168, 14848, 14336, 1),
    # 64 KiB rows: the stage stops at 16 KiB
    (32, 32768, 14848, 16384, 1),
    # tightly packed (not padding-heavy): the copy chunk's stage, 2 rows a block
    (4096, 7168, 32768, 14336, 2),
])
def test_padding_heavy_zero_fill_stage(fake_h200, num_tokens, hidden, num_expanded, stage_bytes,
                                       zero_rows):
    problem = ExpandProblem(num_tokens, hidden, 8, num_expanded, "bfloat16")
    launch = ExpandPlan(problem, 2, 0, STAGED).kernel(16)
    assert launch.handle == "expand_to_fused_bulk_zero_rows"
    assert launch.shared_bytes == stage_bytes
    assert launch.constant("rows_per_zero_block") == zero_rows
    # a stage of the copy chunk only when asked
    tuning = dataclasses.replace(STAGED, padding_zero_stage_bytes=0)
    launch = ExpandPlan(problem, 2, 0, tuning).kernel(16)
    assert launch.shared_bytes == launch.constant("vecs_per_thread") * 32 * 16


def test_padding_heavy_fp8_rows_take_shorter_chunks_before_the_register_kernel(fake_h200):
    # (small batches on the bulk kernel, as before padding_whole_chunks_from)
    # qwen3-30b-small's fp8 rows (3 KiB) on a 128-expert plan: 1 KiB chunks
    # make 96 copy blocks, too few for the bulk kernel; 512-byte ones 192
    problem = ExpandProblem(32, 3072, 8, 14848, "float8_e4m3fn")
    launch = ExpandPlan(problem, 1, 0, BULK_SMALL_BATCHES).kernel(16)
    assert (launch.handle, launch.grid[1], launch.shared_bytes) == (
        "expand_to_fused_bulk_zero_rows_plain", 6, 512)
    # without the shorter chunks: the register kernel
    tuning = dataclasses.replace(BULK_SMALL_BATCHES, padding_bulk_least_chunk_bytes=1024)
    assert ExpandPlan(problem, 1, 0, tuning).kernel(16).handle == "expand_to_fused_v16"
    # where 1 KiB chunks make enough blocks they stay (kimi-k2-small's 14 KiB rows)
    problem = ExpandProblem(32, 7168, 8, 14848, "bfloat16")
    assert ExpandPlan(problem, 2, 0, BULK_SMALL_BATCHES).kernel(16).grid[1] == 14


def test_plain_store_zero_rows_keep_the_copy_chunks_stage(fake_h200):
    # kimi-k2-small, 128 experts: whole-row zero-fill blocks by 16-byte stores,
    # so the launch's stage stays the 1 KiB copy chunk
    problem = ExpandProblem(32, 7168, 8, 14848, "bfloat16")
    tuning = dataclasses.replace(STAGED, bulk_zero_rows_plain=1)
    launch = ExpandPlan(problem, 2, 0, tuning).kernel(16)
    assert (launch.handle, launch.shared_bytes) == ("expand_to_fused_bulk_zero_rows_plain", 1024)
    assert launch.constant("rows_per_zero_block") == 1
    # column-chunk zero-fill (short rows) has no stage to spare: unchanged
    problem = ExpandProblem(32, 3072, 8, 14848, "bfloat16")
    launch = ExpandPlan(problem, 2, 0, tuning).kernel(16)
    assert (launch.handle, launch.shared_bytes) == ("expand_to_fused_bulk", 1024)


def test_padding_heavy_short_rows_take_column_chunks_unless_asked(fake_h200):
    # qwen3-30b-small: 6 KiB rows (below bulk_whole_row_zero_from)
    problem = ExpandProblem(32, 3072, 8, 14848, "bfloat16")
    launch = ExpandPlan(problem, 2, 0, STAGED).kernel(16)
    assert (launch.handle, launch.shared_bytes) == ("expand_to_fused_bulk", 1024)
    tuning = dataclasses.replace(STAGED, padding_zero_whole_rows=1)
    launch = ExpandPlan(problem, 2, 0, tuning).kernel(16)
    assert (launch.handle, launch.shared_bytes) == ("expand_to_fused_bulk_zero_rows", 6144)
    assert launch.constant("rows_per_zero_block") == 1


@pytest.mark.parametrize(("num_tokens", "hidden", "item_bytes", "zero_rows"), [
    (1, 7168, 2, 4),      # decode: chunks shrink to 4 KiB -> 4 rows of 16 KiB
    (1, 1536, 1, 11),     # 1.5 KiB rows -> 11 rows
    (1, 64, 1, 32),       # tiny rows: a ballot's 32 at most
    (4096, 7168, 2, 2),   # 16 KiB chunks: zero_rows_registers' 2, at least (sm_80)
])
def test_register_zero_fill_blocks_zero_about_16_kib(fake_h200, monkeypatch, num_tokens, hidden,
                                                     item_bytes, zero_rows):
    monkeypatch.setitem(launch_module._device_traits, 0, DeviceTraits(132, 8, 232448))
    launch = _launch_for(num_tokens, hidden, item_bytes=item_bytes)
    assert launch.handle == "expand_to_fused_v16"
    assert launch.constant("rows_per_zero_block") == zero_rows


@pytest.mark.parametrize(("num_tokens", "hidden", "num_expanded", "col_major", "grid"), [
    # decode, register kernel, slots split over 8 planes, chunks of 4 KiB:
    # 16 rows in 4-row zero-fill blocks (16 KiB each) = 4 blocks, one column
    # of them across the planes
    (1, 7168, 16, False, (1 + 1, 4, 8)),
    # 40 rows -> 10 zero-fill blocks over 8 planes: 2 columns (6 blocks idle)
    (1, 7168, 40, False, (1 + 2, 4, 8)),
    # column-major SF: the pad columns count, align(18, 4) = 20 rows; rows of
    # 1 KiB: 16-row blocks, 2 of them
    (1, 1024, 18, True, (1 + 1, 1, 8)),
    # qwen3-30b-medium, bulk kernel, 3 chunks: 4096 rows in 2-row blocks of
    # whole rows, numbered across the y planes: 683 columns (1 block idle)
    (512, 3072, 4096, False, (512 + 683, 3, 1)),
    # kimi-k2-prefill, 14 KiB rows: 32768 rows in 2-row blocks of whole rows
    (4096, 7168, 32768, False, (4096 + 16384, 1, 1)),
    # kimi-k2-medium, 4 chunks: 2048 whole-row blocks, numbered across the y planes
    (512, 7168, 4096, False, (512 + 512, 4, 1)),
    # kimi-k2-small, 7 chunks: 128 whole-row blocks over 7 planes, 19 columns (5 idle)
    (32, 7168, 256, False, (32 + 19, 7, 1)),
])
def test_zero_fill_blocks_span_the_slot_planes(fake_h200, num_tokens, hidden, num_expanded,
                                               col_major, grid):
    item_bytes = 1 if col_major else 2
    sf = {"sf_columns": 2, "sf_col_major": True} if col_major else {}
    problem = ExpandProblem(num_tokens, hidden, 8, num_expanded,
                            "float8_e4m3fn" if col_major else "bfloat16", **sf)
    # (no SF pass blocks: the zero-fill blocks walk the pad columns too)
    tuning = dataclasses.replace(NO_LONG_ROWS, sf_by_position=0)
    launch = ExpandPlan(problem, item_bytes, 0, tuning).kernel(16)
    assert launch.grid == grid
    rows = launch.constant("rows_per_zero_block")
    zero_rows = align_up(num_expanded, 4) if col_major else num_expanded
    # every row is some zero-fill block's, and no whole column of blocks is idle
    columns = grid[0] - num_tokens
    planes = grid[2] * (grid[1] if "_zero_rows" in launch.handle else 1)
    assert columns * planes * rows >= zero_rows > (columns - 1) * planes * rows


def test_whole_row_zero_fill_tuning_reaches_short_rows(fake_h200):
    # what the GPU tests' "bulk-zero-rows" kernel path relies on: 2 KiB rows
    # of 5 tokens take the whole-row zero-fill kernel, cut into 4 chunks
    tuning = ExpandTuning(bulk_min_blocks=0.0, padding_share_registers=math.inf,
                          medium_padding_share_registers=math.inf,
                          bulk_whole_row_zero_from=0,
                          bulk_min_chunk_bytes=512, bulk_zero_rows_plain=0)
    launch = _launch_for(5, 1024, tuning=tuning)
    assert launch.handle == "expand_to_fused_bulk_zero_rows"
    assert (launch.shared_bytes, launch.grid[1]) == (512, 4)


def test_plans_are_cached_per_tuning(fake_h200):
    problem = ExpandProblem(4, 64, 2, 8, "bfloat16")
    a = plan_module.plan_for(problem, 2, 0, DEFAULT_TUNING)
    assert plan_module.plan_for(problem, 2, 0, ExpandTuning()) is a  # equal tunings, one plan
    b = plan_module.plan_for(problem, 2, 0, dataclasses.replace(DEFAULT_TUNING, unroll=2))
    assert b is not a and b.tuning.unroll == 2
    assert ("EXPAND_UNROLL", 2) in plan_module.kernel_defines(0, b.tuning)


# -- zero_padding=False: zero-fill blocks only where the pad columns need them ------

WHOLE_ROW_ZERO_FILL = ExpandTuning(bulk_min_blocks=0.0, padding_share_registers=math.inf,
                                   medium_padding_share_registers=math.inf,
                                   bulk_whole_row_zero_from=0, bulk_min_chunk_bytes=512,
                                   bulk_zero_rows_plain=0)


def _zero_fill_columns(launch, num_tokens):
    return launch.grid[0] - num_tokens


@pytest.mark.parametrize(("num_tokens", "hidden", "handle"), [
    (1, 7168, "expand_to_fused_v16"),                # decode: slots split over 8 planes
    (512, 3072, "expand_to_fused_bulk_zero_rows_plain"),   # zero-fill blocks of whole rows
    (4096, 7168, "expand_to_fused_bulk_zero_rows_plain"),
])
@pytest.mark.parametrize("sf", [{}, {"sf_columns": 2}], ids=["no-sf", "row-major-sf"])
def test_leaving_padding_rows_launches_the_token_blocks_alone(fake_h200, num_tokens, hidden,
                                                              handle, sf):
    keep = _launch_for(num_tokens, hidden, **sf)
    leave = _launch_for(num_tokens, hidden, zero_padding=False, **sf)
    assert keep.handle == leave.handle == handle
    assert _zero_fill_columns(keep, num_tokens) > 0
    assert leave.grid == (num_tokens, *keep.grid[1:])
    assert (keep.constant("zero_padding"), keep.constant("first_zero_row")) == (1, 0)
    # the kernel's zero-fill rows would start at X: none left
    assert (leave.constant("zero_padding"), leave.constant("first_zero_row")) == (
        0, num_tokens * 8)


@pytest.mark.parametrize(("tuning", "handle"), [
    (DEFAULT_TUNING, "expand_to_fused_v16"),
    (dataclasses.replace(DEFAULT_TUNING, zero_rows_registers=1), "expand_to_fused_v16"),
    (FORCE_BULK, "expand_to_fused_bulk"),
    (dataclasses.replace(FORCE_BULK, zero_rows_bulk=1), "expand_to_fused_bulk"),
    (WHOLE_ROW_ZERO_FILL, "expand_to_fused_bulk_zero_rows"),
    (dataclasses.replace(WHOLE_ROW_ZERO_FILL, zero_rows_bulk_whole=1),
     "expand_to_fused_bulk_zero_rows"),
    (dataclasses.replace(WHOLE_ROW_ZERO_FILL, bulk_zero_rows_plain=1),
     "expand_to_fused_bulk_zero_rows_plain"),
], ids=["registers", "registers-1-row", "bulk", "bulk-1-row", "bulk-zero-rows",
        "bulk-zero-rows-1-row", "bulk-zero-rows-plain"])
@pytest.mark.parametrize("num_expanded", [16, 17, 18, 19])
def test_leaving_padding_rows_keeps_blocks_for_the_col_major_pad_columns(
        fake_h200, tuning, handle, num_expanded):
    # 3 tokens of 2 KiB fp8 rows, K = 8: X % 4 == 1, 2, 3 leaves 3, 2, 1 pad
    # columns; X % 4 == 0 none. The fewest columns of zero-fill blocks that
    # cover the pad columns alone (one plane of 1-row blocks: one column each).
    problem = ExpandProblem(3, 2048, 8, num_expanded, "float8_e4m3fn", sf_columns=4,
                            sf_col_major=True)
    launch = ExpandPlan(problem, 1, 0, tuning, zero_padding=False).kernel(16)
    assert launch.handle == handle
    assert launch.constant("first_zero_row") == num_expanded
    assert launch.constant("zero_padding") == 0
    pad_columns = align_up(num_expanded, 4) - num_expanded
    columns = _zero_fill_columns(launch, 3)
    planes = launch.grid[2] * (launch.grid[1] if "_zero_rows" in handle else 1)
    rows = launch.constant("rows_per_zero_block")
    assert columns * planes * rows >= pad_columns > (columns - 1) * planes * rows


@pytest.mark.parametrize("col_major", [False, True])
def test_no_tokens_still_zero_the_expert_rows_when_leaving_padding_rows(fake_h200, col_major):
    # T == 0: no slot writes the expert rows, so the zero-fill blocks still
    # walk every row (the kernel then skips the padding ones)
    sf = {"sf_columns": 2, "sf_col_major": True} if col_major else {}
    problem = ExpandProblem(0, 7168, 8, 42, "float8_e4m3fn", **sf)
    keep = ExpandPlan(problem, 1, 0, DEFAULT_TUNING).kernel(16)
    leave = ExpandPlan(problem, 1, 0, DEFAULT_TUNING, zero_padding=False).kernel(16)
    assert leave.grid == keep.grid and keep.grid[0] > 0
    assert leave.constant("first_zero_row") == keep.constant("first_zero_row") == 0
    assert (keep.constant("zero_padding"), leave.constant("zero_padding")) == (1, 0)


def test_no_tokens_and_no_pad_columns_launch_nothing_when_leaving_padding_rows(fake_h200):
    problem = ExpandProblem(0, 64, 2, 0, "bfloat16")
    assert ExpandPlan(problem, 2, 0, DEFAULT_TUNING, zero_padding=False).kernel(16).grid[0] == 0


def test_plans_are_cached_per_zero_padding(fake_h200):
    problem = ExpandProblem(4, 64, 2, 8, "bfloat16")
    keep = plan_module.plan_for(problem, 2, 0, DEFAULT_TUNING)
    assert plan_module.plan_for(problem, 2, 0, DEFAULT_TUNING, zero_padding=True) is keep
    leave = plan_module.plan_for(problem, 2, 0, DEFAULT_TUNING, zero_padding=False)
    assert leave is not keep
    assert (keep.zero_padding, leave.zero_padding) == (True, False)
    assert plan_module.plan_for(problem, 2, 0, DEFAULT_TUNING, zero_padding=False) is leave


# -- the torch fast path's key holds zero_padding ----------------------------------

class _FakePlan:
    device = 0


@pytest.fixture
def expand_fast_paths(monkeypatch):
    """The ops' fast paths, emptied, taking CPU tensors for CUDA ones (their keys
    are built the same way) on a current device 0; the plans they would replay
    are recorded instead of launched."""
    from cupy_moe.expand import api

    replayed = []
    for name in ("_plain_fast_path", "_sf_fast_path"):
        path = TorchFastPath()
        path.remember((), (None,), _FakePlan())  # arms it: torch.Tensor, device getter
        path.clear()
        monkeypatch.setattr(path, "_current_device", lambda: 0)
        monkeypatch.setattr(api, name, path)
    monkeypatch.setattr(api, "_run_torch_fast",
                        lambda plan, *args: replayed.append(plan) or ("replayed", None))
    return api, replayed


def test_plain_op_fast_path_keys_zero_padding(expand_fast_paths):
    torch = pytest.importorskip("torch")
    api, replayed = expand_fast_paths
    x = torch.zeros(3, 8, dtype=torch.bfloat16)
    t2p = torch.tensor([[0, 1], [2, -1], [3, -1]], dtype=torch.int32)
    p2e = torch.tensor([0, 0, 1, 1, -1], dtype=torch.int32)
    # x, token_topk_to_pos, pos_to_expert; pos_to_token and out absent
    descs = (describe("", x), describe("", t2p), describe("", p2e), None, None)
    leave, keep = _FakePlan(), _FakePlan()
    api._plain_fast_path.remember((False,), descs, leave)

    assert api.expand_to_fused(x, t2p, p2e, zero_padding=False) == "replayed"
    # no plan for True yet: the full path (the CPU backend here) takes it
    assert isinstance(api.expand_to_fused(x, t2p, p2e), torch.Tensor)
    assert replayed == [leave]
    api._plain_fast_path.remember((True,), descs, keep)
    assert api.expand_to_fused(x, t2p, p2e) == "replayed"
    assert api.expand_to_fused(x, t2p, p2e, zero_padding=True) == "replayed"
    assert replayed == [leave, keep, keep]
    # 1 == True would find True's plan: a non-bool must reach the full path's rule
    with pytest.raises(TypeError, match=r"zero_padding must be True or False; got int 1"):
        api.expand_to_fused(x, t2p, p2e, zero_padding=1)
    assert len(replayed) == 3


def _sf_op_tensors():
    """x, x_sf, token_topk_to_pos, pos_to_expert, pos_to_token of a small SF call."""
    torch = pytest.importorskip("torch")
    return (torch.zeros(3, 256, dtype=torch.uint8), torch.zeros(3, 1, dtype=torch.int32),
            torch.tensor([[0, 1], [2, -1], [3, -1]], dtype=torch.int32),
            torch.tensor([0, 0, 1, 1, -1], dtype=torch.int32),
            torch.tensor([0, 0, 1, 2, -1], dtype=torch.int32))


def test_sf_op_fast_path_keys_zero_padding(expand_fast_paths):
    torch = pytest.importorskip("torch")
    api, replayed = expand_fast_paths
    x, x_sf, t2p, p2e, _ = _sf_op_tensors()
    # x, x_sf, token_topk_to_pos, pos_to_expert; pos_to_token, out, out_sf absent
    descs = tuple(describe("", a) for a in (x, x_sf, t2p, p2e)) + (None, None, None)
    leave = _FakePlan()
    api._sf_fast_path.remember((128, True, False), descs, leave)
    kwargs = {"num_per_channels": 128, "use_tma_aligned_col_major_sf": True}

    assert api.expand_to_fused_with_sf(x, x_sf, t2p, p2e, **kwargs,
                                       zero_padding=False) == ("replayed", None)
    result = api.expand_to_fused_with_sf(x, x_sf, t2p, p2e, **kwargs)
    assert isinstance(result[0], torch.Tensor) and replayed == [leave]
    api._sf_fast_path.remember((128, True, True), descs, _FakePlan())
    with pytest.raises(TypeError, match=r"zero_padding must be True or False; got int 1"):
        api.expand_to_fused_with_sf(x, x_sf, t2p, p2e, **kwargs, zero_padding=1)
    assert replayed == [leave]


def test_sf_op_fast_path_keys_pos_to_token(expand_fast_paths):
    torch = pytest.importorskip("torch")
    api, replayed = expand_fast_paths
    x, x_sf, t2p, p2e, p2t = _sf_op_tensors()
    given = _FakePlan()
    api._sf_fast_path.remember(
        (128, True, True), tuple(describe("", a) for a in (x, x_sf, t2p, p2e, p2t)) + (None,) * 2,
        given)
    kwargs = {"num_per_channels": 128, "use_tma_aligned_col_major_sf": True}
    assert api.expand_to_fused_with_sf(x, x_sf, t2p, p2e, **kwargs, pos_to_token=p2t) == (
        "replayed", None)
    assert replayed == [given]
    # without it the key differs: the full path (the CPU reference here)
    result = api.expand_to_fused_with_sf(x, x_sf, t2p, p2e, **kwargs)
    assert isinstance(result[0], torch.Tensor) and replayed == [given]


def test_plain_op_fast_path_keys_pos_to_token(expand_fast_paths):
    torch = pytest.importorskip("torch")
    api, replayed = expand_fast_paths
    x = torch.zeros(3, 8, dtype=torch.bfloat16)
    _, _, t2p, p2e, p2t = _sf_op_tensors()
    given = _FakePlan()
    api._plain_fast_path.remember(
        (True,), tuple(describe("", a) for a in (x, t2p, p2e, p2t)) + (None,), given)
    assert api.expand_to_fused(x, t2p, p2e, pos_to_token=p2t) == "replayed"
    assert replayed == [given]
    # without it the key differs: the full path (the CPU reference here)
    assert isinstance(api.expand_to_fused(x, t2p, p2e), torch.Tensor)
    assert replayed == [given]


@pytest.mark.parametrize(("change", "message"), [
    ({"zero_rows_registers": 0}, r"zero_rows_registers must be in 1 \.\. 32; got 0"),
    ({"zero_rows_bulk_whole": 33}, r"zero_rows_bulk_whole must be in 1 \.\. 32; got 33"),
    ({"threads": 100}, r"threads must be whole warps in 32 \.\. 1024 .*got 100"),
    ({"unroll": 0}, r"unroll must be in 1 \.\. 16; got 0"),
    ({"bulk_max_chunk_bytes": 0}, r"bulk_min_chunk_bytes <= bulk_max_chunk_bytes; got 2048, 0"),
    ({"padding_bulk_min_chunk_bytes": 8},
     r"16 <= padding_bulk_min_chunk_bytes <= bulk_max_chunk_bytes; got 8, 16384"),
    ({"padding_bulk_least_chunk_bytes": 10**5},
     r"16 <= padding_bulk_least_chunk_bytes <= bulk_max_chunk_bytes; got 100000, 16384"),
    ({"bulk_target_blocks": -1.0}, r"bulk_target_blocks must be a number >= 0; got -1\.0"),
    ({"split_slots_below": "1"}, r"split_slots_below must be a number >= 0; got '1'"),
    ({"padding_zero_whole_rows": 2}, r"padding_zero_whole_rows must be 0 or 1; got 2"),
    ({"bulk_zero_rows_plain": True}, r"bulk_zero_rows_plain must be a number >= 0; got True"),
    ({"bulk_zero_rows_plain": 3}, r"bulk_zero_rows_plain must be 0 or 1; got 3"),
    ({"zero_kernel_beside_registers": 2}, r"zero_kernel_beside_registers must be 0 or 1; got 2"),
    ({"compiled_row": 3}, r"compiled_row must be 0, 1 or 2; got 3"),
    ({"rows_kernel_fitted_unroll": 2}, r"rows_kernel_fitted_unroll must be 0 or 1; got 2"),
    ({"zero_fill_runs": 3}, r"zero_fill_runs must be 0, 1 or 2; got 3"),
    ({"register_min_blocks": 9}, r"register_min_blocks must leave blocks of 256 threads room "
                                 r"on an SM \(at most 8\); got 9"),
    ({"register_min_blocks": 2.5}, r"register_min_blocks must be a whole number of blocks; "
                                   r"got 2\.5"),
    ({"register_min_blocks": 3, "threads": 1024},
     r"blocks of 1024 threads room on an SM \(at most 2\); got 3"),
    ({"compiled_row": True}, r"compiled_row must be a number >= 0; got True"),
    ({"padding_zero_rows_bulk_whole": 0}, r"padding_zero_rows_bulk_whole must be in 1 \.\. 32"),
    ({"zero_kernel_from_bytes": -1.0}, r"zero_kernel_from_bytes must be a number >= 0; got -1\.0"),
    ({"padding_whole_chunks_from": -1.0},
     r"padding_whole_chunks_from must be a number >= 0; got -1\.0"),
    ({"medium_padding_share_registers": -0.3},
     r"medium_padding_share_registers must be a number >= 0; got -0\.3"),
    ({"medium_copy_bytes": "128e6"}, r"medium_copy_bytes must be a number >= 0; got '128e6'"),
    ({"padding_zero_stage_bytes": 1000},
     r"padding_zero_stage_bytes must be a multiple of 16 \(bulk stores\); got 1000"),
    ({"gather_rows": 0}, r"gather_rows must be in 1 \.\. threads \(256\); got 0"),
    ({"threads": 128, "gather_rows": 129},
     r"gather_rows must be in 1 \.\. threads \(128\); got 129"),
    ({"gather_x_bytes_below": -1}, r"gather_x_bytes_below must be a number >= 0; got -1"),
    ({"load_hint": 4}, r"load_hint must be 0, 1, 2 or 3; got 4"),
    ({"store_hint": 3}, r"store_hint must be 0, 1 or 2; got 3"),
])
def test_tuning_rejects_values_the_kernels_cannot_take(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(DEFAULT_TUNING, **change)


def test_tuning_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_TUNING.unroll = 2


# -- padding rows by a kernel of their own (expand_zero_padding_rows) -------------------

# (scale factors in line: the SF pass blocks beside it have tests of their own)
ZERO_KERNEL = dataclasses.replace(DEFAULT_TUNING, zero_kernel_from_bytes=0,
                                  zero_kernel_beside_registers=1, sf_by_position=0)


def test_the_c_struct_has_the_host_fields_in_order():
    import re
    from pathlib import Path

    source = (Path(plan_module.__file__).parents[2] / "kernels_cu" / "expand.cu").read_text()
    body = re.search(r"struct ExpandArgs \{(.*?)\};", source, re.S).group(1)
    names = re.findall(r"(\w+);", re.sub(r"//[^\n]*", "", body))
    assert tuple(names) == EXPAND_ARGS.names


def test_the_zero_kernel_path_reaches_the_gpu_tests_shapes(fake_h200):
    """conftest's "zero-kernel" path: small tight test shapes take it too."""
    from conftest import KERNEL_PATHS

    tuning = KERNEL_PATHS["zero-kernel"]
    for num_tokens, hidden in ((5, 16), (5, 2048), (4096, 7168)):
        launch = _launch_for(num_tokens, hidden, tuning=tuning)
        assert launch.zero_launch is not None and launch.grid_x == num_tokens
    assert _launch_for(0, 2048, tuning=tuning).zero_launch is None


@pytest.mark.parametrize(("num_tokens", "hidden", "num_expanded", "name"), [
    # small batches (32 token chunks) keep whole register chunks: no zero kernel
    (32, 7168, 14848, "expand_to_fused_v16"),   # kimi-k2-small-e128: 209 MB of padding
    (32, 3072, 14848, "expand_to_fused_v16"),   # qwen3-30b-small-e128: 90 MB
    (32, 3072, 3072, "expand_to_fused_v16"),    # qwen3-30b-small EP8: 17 MB
    (512, 7168, 16384, "expand_to_fused_v16"),  # kimi-k2-medium-e128: whole chunks anyway
    # fewer token chunks shrink them: the zero kernel from 64 MB of padding
    # beside the bulk kernel's copies (15 tokens: 180 blocks of 512 bytes) or
    # the shrunk register kernel's (decode: 117 MB of padding)
    (15, 3072, 14848, "expand_to_fused_bulk_overlapped"),
    (1, 7168, 8192, "expand_to_fused_v16_overlapped"),
    (8, 7168, 4096, "expand_to_fused_bulk_zero_rows_plain"),  # 58 MB: no zero kernel
])
def test_the_zero_kernel_by_default(fake_h200, num_tokens, hidden, num_expanded, name):
    problem = ExpandProblem(num_tokens, hidden, 8, num_expanded, "bfloat16")
    launch = ExpandPlan(problem, 2, 0, DEFAULT_TUNING).kernel(16)
    assert launch.name == name
    assert (launch.zero_launch is not None) == name.endswith("_overlapped")


@pytest.mark.parametrize(("num_tokens", "hidden", "item_bytes", "whole"), [
    (32, 3072, 2, True),   # qwen3-30b-small: 32 token chunks
    (32, 3072, 1, True),   # ... its fp8 rows
    (16, 3072, 2, True),   # 16 token chunks: the threshold
    (15, 3072, 2, False),  # 15: chunks shrink (the bulk kernel's copies)
    (8, 7168, 2, False),
])
def test_padding_heavy_small_batches_keep_whole_chunks(fake_h200, num_tokens, hidden,
                                                       item_bytes, whole):
    problem = ExpandProblem(num_tokens, hidden, 8, 14848,
                            "bfloat16" if item_bytes == 2 else "float8_e4m3fn")
    launch = ExpandPlan(problem, item_bytes, 0, DEFAULT_TUNING).kernel(16)
    # whole chunks: the register kernel, one chunk a row (rows <= 16 KiB), all
    # K slots a block, its own zero-fill blocks (no second kernel)
    assert (launch.name == "expand_to_fused_v16" and launch.grid[1:] == (1, 1)
            and launch.constant("slots_per_block") == 8
            and launch.constant("vecs_per_thread") == DEFAULT_TUNING.unroll
            and launch.zero_launch is None) == whole
    # never (inf): the bulk kernel's copies, as before
    launch = ExpandPlan(problem, item_bytes, 0, BULK_SMALL_BATCHES).kernel(16)
    assert launch.name.startswith("expand_to_fused_bulk")
    # not padding-heavy (tightly packed): chunks shrink whatever the field says
    problem = ExpandProblem(num_tokens, hidden, 8, num_tokens * 8,
                            "bfloat16" if item_bytes == 2 else "float8_e4m3fn")
    launches = [ExpandPlan(problem, item_bytes, 0, tuning).kernel(16)
                for tuning in (DEFAULT_TUNING, BULK_SMALL_BATCHES)]
    assert launches[0].grid == launches[1].grid and launches[0].name == launches[1].name
    assert launches[0].grid[1:] != (1, 1)


@pytest.mark.parametrize(("num_tokens", "hidden", "item_bytes", "num_expanded", "rows", "sf"), [
    (32, 7168, 2, 14848, 1, {}),          # kimi-k2-small-e128: 14 KiB rows, 1 a block
    (32, 3072, 2, 14848, 2, {}),          # qwen3-30b-small: 6 KiB rows
    (32, 3072, 1, 14848, 5, {"sf_columns": 6, "sf_dtype": "int32", "num_per_channels": 128,
                             "sf_col_major": True}),  # fp8 rows, packed SF, pad columns
    (512, 7168, 2, 16385, 1, {"sf_columns": 56, "sf_dtype": "float32",
                              "num_per_channels": 128}),  # the register copy kernel
])
def test_padding_heavy_calls_may_zero_by_a_second_kernel(fake_h200, num_tokens, hidden,
                                                          item_bytes, num_expanded, rows, sf):
    problem = ExpandProblem(num_tokens, hidden, 8, num_expanded,
                            "bfloat16" if item_bytes == 2 else "float8_e4m3fn", **sf)
    plan = ExpandPlan(problem, item_bytes, 0, ZERO_KERNEL)
    copy = plan.kernel(16)
    zero = copy.zero_launch
    # the copy kernel: token blocks only, letting the zero kernel start; a bulk
    # kernel's stage is its copy chunk (no zero-fill blocks to size it for)
    assert copy.grid_x == num_tokens and copy.name.endswith("_overlapped")
    assert copy.name in ("expand_to_fused_bulk_overlapped", "expand_to_fused_v16_overlapped")
    if copy.name.startswith("expand_to_fused_bulk"):
        assert copy.shared_bytes == copy.constant("vecs_per_thread") * 32 * 16
    assert zero.handle == "expand_zero_padding_rows" and zero.threads == ZERO_KERNEL.threads
    assert zero.constant("rows_per_zero_block") == rows
    # every block a row block (blocks from zero_row_blocks on would be SF pass ones)
    assert zero.constant("zero_row_blocks") == zero.grid_x
    # its blocks cover every data row and the column-major SF's pad columns
    zero_rows_end = plan.zero_rows_end(SF_PASS_NONE)
    assert zero.grid == (-(-zero_rows_end // rows), 1, 1)
    assert zero_rows_end == (align_up(num_expanded, 4) if sf.get("sf_col_major")
                             else num_expanded)
    for field in ("num_tokens", "num_expanded", "first_zero_row", "zero_padding", "sf_ld"):
        assert zero.constant(field) == copy.constant(field)


@pytest.mark.parametrize(("change", "why"), [
    ({"num_tokens": 0}, "no copy kernel to overlap"),
    ({"num_expanded": 352}, "not padding-heavy"),  # 27% of the rows padding (< 30%)
])
def test_the_zero_kernel_needs_a_padding_heavy_call_with_tokens(fake_h200, change, why):
    shape = {"num_tokens": 32, "hidden": 7168, "top_k": 8, "num_expanded": 14848, **change}
    problem = ExpandProblem(x_dtype="bfloat16", **shape)
    launch = ExpandPlan(problem, 2, 0, ZERO_KERNEL).kernel(16)
    assert launch.zero_launch is None, why
    assert not launch.name.endswith("_overlapped")


def test_the_zero_kernel_needs_16_byte_rows_sm90_and_zero_padding(fake_h200, monkeypatch):
    problem = ExpandProblem(32, 7168, 8, 14848, "bfloat16")
    assert ExpandPlan(problem, 2, 0, ZERO_KERNEL).kernel(8).zero_launch is None
    assert ExpandPlan(problem, 2, 0, ZERO_KERNEL, zero_padding=False).kernel(16).zero_launch \
        is None
    monkeypatch.setitem(launch_module._device_traits, 0, DeviceTraits(132, 8, 232448))
    assert ExpandPlan(problem, 2, 0, ZERO_KERNEL).kernel(16).zero_launch is None


def test_a_call_launches_the_zero_kernel_right_after_the_copies(fake_h200, monkeypatch):
    launches = []
    monkeypatch.setattr(plan_module.driver, "launchKernel",
                        lambda handle, *args: launches.append(("plain", handle, args)))
    monkeypatch.setattr(plan_module, "launch_overlapping_previous",
                        lambda handle, *args: launches.append(("overlapping", handle, args)))
    problem = ExpandProblem(32, 7168, 8, 14848, "bfloat16")
    plan = ExpandPlan(problem, 2, 0, ZERO_KERNEL)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0, 0)
    assert [(kind, handle) for kind, handle, _ in launches] == [
        ("plain", plan.kernel(16).handle), ("overlapping", "expand_zero_padding_rows")]
    zero = plan.kernel(16).zero_launch
    assert launches[1][2] == (zero.grid_x, zero.threads, 0, 7, zero.args.params_address)
    pointers = EXPAND_ARGS.pointer_packer.unpack_from(zero.args.buffer)
    assert pointers == (0x1000, 0x2000, 0x3000, 0x4000, 0, 0, 0)


# -- column-major scale factors by position (ExpandTuning.sf_by_position) -----------

SF_BY_POSITION = dataclasses.replace(DEFAULT_TUNING, sf_by_position=1)
PACKED_SF = {"sf_columns": 14, "sf_dtype": "int32", "num_per_channels": 128,
             "sf_col_major": True}


def _sf_plan(num_tokens=4096, num_expanded=48130, tuning=SF_BY_POSITION, sf=PACKED_SF,
             **options):
    # kimi-k2-prefill-e256-plan's shape (fp8 rows, packed SF), X not a multiple of 4
    problem = ExpandProblem(num_tokens, 7168, 8, num_expanded, "float8_e4m3fn", **sf)
    return ExpandPlan(problem, 1, 0, tuning, **options)


@pytest.mark.parametrize(("options", "sf_pass"), [
    ({}, SF_PASS_ZEROS),
    ({"with_pos_to_token": True}, SF_PASS_ALL),
    ({"zero_padding": False}, SF_PASS_NONE),  # only the pad columns: in line
    ({"zero_padding": False, "with_pos_to_token": True}, SF_PASS_ALL),
])
def test_the_sf_pass_blocks_lead_the_copy_kernels_grid(fake_h200, options, sf_pass):
    plan = _sf_plan(**options)
    copy = plan.kernel(16)
    assert copy.constant("sf_pass") == sf_pass == plan.sf_pass(16)
    assert copy.zero_launch is None and copy.name == "expand_to_fused_bulk_zero_rows_plain"
    pass_blocks = copy.constant("sf_pass_blocks")
    if sf_pass == SF_PASS_NONE:
        assert pass_blocks == 0
        return
    # a one-warp block's 32 positions each, up to align(X, 4): pad columns included
    assert pass_blocks == -(-48132 // 32)
    # the zero-fill blocks walk the data rows only (X, not align(X, 4))
    assert plan.zero_rows_end(sf_pass) == 48130
    walked = 48130 - copy.constant("first_zero_row")
    zero_blocks = -(-walked // copy.constant("rows_per_zero_block"))
    assert copy.grid_x == pass_blocks + 4096 + zero_blocks


@pytest.mark.parametrize("given", [False, True])
def test_beside_the_zero_kernel_the_sf_pass_blocks_end_its_grid(fake_h200, given):
    """The zero kernel starts once every copy block has: the pass blocks go
    there, after its row blocks, not into the copy kernel."""
    tuning = dataclasses.replace(SF_BY_POSITION, zero_kernel_from_bytes=0,
                                 zero_kernel_beside_registers=1, sf_pass_beside_zero_kernel=1)
    plan = _sf_plan(num_tokens=32, num_expanded=14850, tuning=tuning, with_pos_to_token=given)
    copy = plan.kernel(16)
    sf_pass = SF_PASS_ALL if given else SF_PASS_ZEROS
    assert copy.constant("sf_pass") == sf_pass and copy.constant("sf_pass_blocks") == 0
    assert copy.name.endswith("_overlapped") and copy.grid_x == 32
    zero = copy.zero_launch
    assert zero.constant("sf_pass") == sf_pass
    rows = zero.constant("rows_per_zero_block")
    row_blocks = -(-14850 // rows)  # data rows only: the pass zeroes the pad columns
    assert zero.constant("zero_row_blocks") == row_blocks
    assert zero.grid_x == row_blocks + -(-14852 // zero.threads)


@pytest.mark.parametrize("given", [False, True])
def test_no_sf_pass_beside_the_zero_kernel_when_switched_off(fake_h200, given):
    tuning = dataclasses.replace(DEFAULT_TUNING, zero_kernel_from_bytes=0,
                                 zero_kernel_beside_registers=1, sf_pass_beside_zero_kernel=0)
    plan = _sf_plan(num_tokens=32, num_expanded=14850, tuning=tuning, with_pos_to_token=given)
    copy = plan.kernel(16)
    assert copy.constant("sf_pass") == SF_PASS_NONE and copy.constant("sf_pass_blocks") == 0
    zero = copy.zero_launch
    rows = zero.constant("rows_per_zero_block")
    # its row blocks zero the pad columns (rows X .. align(X, 4)) too; no pass blocks
    assert zero.constant("zero_row_blocks") == zero.grid_x == -(-14852 // rows)


def test_the_sf_pass_is_on_by_default(fake_h200):
    assert DEFAULT_TUNING.sf_by_position == 1
    assert _sf_plan(tuning=DEFAULT_TUNING).kernel(16).constant("sf_pass") == SF_PASS_ZEROS
    # beside the zero kernel too (Kimi-K2 small, packed: 86.0 -> 90.0% of the copy)
    assert DEFAULT_TUNING.sf_pass_beside_zero_kernel == 1
    tuning = dataclasses.replace(DEFAULT_TUNING, zero_kernel_from_bytes=0,
                                 zero_kernel_beside_registers=1)
    zero = _sf_plan(num_tokens=32, num_expanded=14850, tuning=tuning).kernel(16).zero_launch
    assert zero.constant("sf_pass") == SF_PASS_ZEROS


@pytest.mark.parametrize(("change", "why"), [
    ({"sf": {**PACKED_SF, "sf_col_major": False, "sf_dtype": "float32", "sf_columns": 56}},
     "row-major SF: a row's words are one run already"),
    ({"num_tokens": 0, "num_expanded": 1024}, "no tokens: no copy kernel to overlap"),
    ({"tuning": dataclasses.replace(DEFAULT_TUNING, sf_by_position=0)}, "switched off"),
    ({"num_expanded": 4096 * 8}, "X = T*K: no padding rows by shapes, nothing to zero"),
])
def test_no_sf_pass(fake_h200, change, why):
    plan = _sf_plan(**change)
    launch = plan.kernel(16)
    assert launch.constant("sf_pass") == SF_PASS_NONE, why
    assert launch.constant("sf_pass_blocks") == 0
    # the zero-fill blocks zero the column-major SF's pad columns themselves
    assert launch.constant("zero_row_blocks") == 0
    problem = plan.problem
    assert plan.zero_rows_end(SF_PASS_NONE) == (
        align_up(problem.num_expanded, 4) if problem.sf_col_major else problem.num_expanded)


def test_no_sf_pass_off_16_byte_rows_or_before_sm90(fake_h200, monkeypatch):
    assert _sf_plan().kernel(8).constant("sf_pass") == SF_PASS_NONE
    monkeypatch.setitem(launch_module._device_traits, 0, DeviceTraits(132, 8, 232448))
    assert _sf_plan().kernel(16).constant("sf_pass") == SF_PASS_NONE


def test_a_call_passes_pos_to_token_to_both_kernels(fake_h200, monkeypatch):
    launches = []
    monkeypatch.setattr(plan_module.driver, "launchKernel",
                        lambda handle, *args: launches.append(handle))
    monkeypatch.setattr(plan_module, "launch_overlapping_previous",
                        lambda handle, *args: launches.append(handle))
    plan = _sf_plan(with_pos_to_token=True)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000)
    copy = plan.kernel(16)
    assert launches == [copy.handle]
    assert EXPAND_ARGS.pointer_packer.unpack_from(copy.args.buffer) == (
        0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000)


def test_a_tightly_packed_call_takes_the_pass_only_given_pos_to_token(fake_h200):
    tight = {"num_expanded": 4096 * 8}
    assert _sf_plan(**tight).kernel(16).constant("sf_pass") == SF_PASS_NONE
    assert _sf_plan(**tight, with_pos_to_token=True).kernel(16).constant("sf_pass") == SF_PASS_ALL


# -- rows by position (expand_to_fused_gather; ExpandTuning.gather_x_bytes_below) ----

GATHER = dataclasses.replace(DEFAULT_TUNING, gather_x_bytes_below=8e6)
QWEN3_FP8_ROW_SF = {"sf_columns": 24, "sf_dtype": "float32", "num_per_channels": 128}


def _gather_plan(num_tokens=512, hidden=3072, num_expanded=16385, tuning=GATHER,
                 sf=QWEN3_FP8_ROW_SF, with_pos_to_token=True, **options):
    # qwen3-30b-medium-e128-plan-sf-row-major's shape (fp8 rows), one row more
    problem = ExpandProblem(num_tokens, hidden, 8, num_expanded, "float8_e4m3fn", **sf)
    return ExpandPlan(problem, 1, 0, tuning, with_pos_to_token=with_pos_to_token, **options)


@pytest.mark.parametrize(("sf", "sf_pass"), [
    ({}, SF_PASS_NONE),
    (QWEN3_FP8_ROW_SF, SF_PASS_NONE),  # row-major: a warp writes its row's words
    (PACKED_SF, SF_PASS_ALL),  # column-major: whole sectors, by the pass blocks
])
@pytest.mark.parametrize("zero_padding", [True, False])
def test_gather_blocks_take_rows_by_position(fake_h200, sf, sf_pass, zero_padding):
    plan = _gather_plan(sf=sf, zero_padding=zero_padding)
    launch = plan.kernel(16)
    assert plan.gathers(16)
    assert launch.name == launch.handle == "expand_to_fused_gather"
    assert (launch.threads, launch.shared_bytes, launch.zero_launch) == (256, 0, None)
    assert launch.constant("rows_per_gather_block") == 16
    assert launch.constant("sf_pass") == sf_pass == plan.sf_pass(16)
    pass_blocks = -(-16388 // 256) if sf_pass == SF_PASS_ALL else 0  # align(X, 4) rows
    assert launch.constant("sf_pass_blocks") == pass_blocks
    assert launch.grid == (pass_blocks + -(-16385 // 16), 1, 1)
    assert launch.constant("zero_padding") == int(zero_padding)
    # the token-major kernels' fields stay 0
    for name in ("rows_per_zero_block", "vecs_per_thread", "slots_per_block",
                 "first_zero_row", "zero_row_blocks"):
        assert launch.constant(name) == 0, name


def test_gather_rows_a_block_from_the_tuning(fake_h200):
    tuning = dataclasses.replace(GATHER, gather_rows=40)
    launch = _gather_plan(tuning=tuning, sf={}).kernel(16)
    assert launch.constant("rows_per_gather_block") == 40
    assert launch.grid == (-(-16385 // 40), 1, 1)


def test_gather_with_no_tokens_zeroes_by_position(fake_h200):
    launch = _gather_plan(num_tokens=0, num_expanded=1024, sf=PACKED_SF).kernel(16)
    assert launch.name == "expand_to_fused_gather"
    assert launch.constant("sf_pass") == SF_PASS_ALL
    assert launch.grid == (4 + 64, 1, 1)


def test_gather_is_not_bound_to_sm90(fake_h200, monkeypatch):
    monkeypatch.setitem(launch_module._device_traits, 0, DeviceTraits(108, 8, 166912))
    plan = _gather_plan(sf=PACKED_SF)
    launch = plan.kernel(16)
    assert launch.name == "expand_to_fused_gather"
    assert launch.constant("sf_pass") == SF_PASS_ALL == plan.sf_pass(16)


@pytest.mark.parametrize(("change", "why"), [
    ({"with_pos_to_token": False}, "no hint: no token to read a row from"),
    ({"tuning": DEFAULT_TUNING}, "off by default (not yet run on a GPU)"),
    ({"tuning": dataclasses.replace(GATHER, gather_x_bytes_below=512 * 3072)},
     "x of 512 * 3072 bytes is not below 512 * 3072"),
])
def test_no_gather(fake_h200, change, why):
    plan = _gather_plan(**change)
    assert not plan.gathers(16), why
    assert plan.kernel(16).name != "expand_to_fused_gather", why
    assert plan.kernel(16).constant("rows_per_gather_block") == 0


def test_gather_takes_16_byte_accesses_only(fake_h200):
    plan = _gather_plan()
    assert plan.gathers(16) and not plan.gathers(8)
    assert plan.kernel(8).name == "expand_to_fused_v8"


def test_a_call_passes_pos_to_token_to_the_gather_kernel(fake_h200, monkeypatch):
    launches = []
    monkeypatch.setattr(plan_module.driver, "launchKernel",
                        lambda handle, gx, gy, gz, *args: launches.append((handle, gx, gy, gz)))
    plan = _gather_plan(sf={})
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0, 0, 0x7000)
    launch = plan.kernel(16)
    assert launches == [(launch.handle, *launch.grid)]
    assert EXPAND_ARGS.pointer_packer.unpack_from(launch.args.buffer) == (
        0x1000, 0x2000, 0x3000, 0x4000, 0, 0, 0x7000)


def _record_modules(monkeypatch) -> dict:
    """The defines each kernel's module is made with, by kernel name (the
    launch's handle is the name)."""
    modules = {}
    monkeypatch.setattr(plan_module, "function_handle",
                        lambda source, defines, device, name: modules.setdefault(name, defines)
                        and name)
    return modules


@pytest.mark.parametrize(("num_tokens", "hidden", "item_bytes", "vecs_per_thread"), [
    (512, 1536, 2, 4),     # Qwen3's 3 KiB rows: one chunk, 192 of its 1024 accesses
    (32, 1536, 2, 1),      # ... chunks shrunk: one access a thread
    (4096, 7168, 2, 4),    # chunks of 256 x 4 accesses, a short last one
    (512, 3072, 1, 4),     # fp8 rows of 3 KiB
])
def test_a_compiled_row_is_the_register_kernels_own_module(fake_h200, monkeypatch, num_tokens,
                                                           hidden, item_bytes, vecs_per_thread):
    """compiled_row: the register kernel's launch gets a module compiled for
    its row (bytes, accesses a thread); every other launch the plain one."""
    modules = _record_modules(monkeypatch)
    tuning = ExpandTuning(bulk_min_blocks=math.inf, compiled_row=1)
    launch = _launch_for(num_tokens, hidden, item_bytes=item_bytes, tuning=tuning)
    assert launch.handle == "expand_to_fused_v16"
    assert launch.constant("vecs_per_thread") == vecs_per_thread
    defines = dict(modules["expand_to_fused_v16"])
    assert (defines["EXPAND_ROW_BYTES"], defines["EXPAND_VECS_PER_THREAD"]) == (
        hidden * item_bytes, vecs_per_thread)
    # off by default; the bulk kernel never takes it
    modules.clear()
    _launch_for(num_tokens, hidden, item_bytes=item_bytes,
                tuning=dataclasses.replace(tuning, compiled_row=0))
    assert "EXPAND_ROW_BYTES" not in dict(modules["expand_to_fused_v16"])
    modules.clear()
    bulk = _launch_for(4096, 7168, tuning=ExpandTuning(compiled_row=1))
    assert bulk.handle.startswith("expand_to_fused_bulk")
    assert all("EXPAND_ROW_BYTES" not in dict(d) for d in modules.values())


@pytest.mark.parametrize(("num_tokens", "hidden", "item_bytes", "compiled"), [
    (512, 3072, 1, True),    # Qwen3 fp8 rows of 3 KiB: 192 of 256 threads, one access each
    (32, 1536, 2, True),     # chunks shrunk to one access a thread
    (512, 3072, 2, False),   # Qwen3 bf16 rows of 6 KiB: some threads hold two accesses
    (4096, 7168, 2, False),  # chunks of 256 x 4 accesses
])
def test_compiled_row_2_takes_rows_of_one_access_a_thread(fake_h200, monkeypatch, num_tokens,
                                                          hidden, item_bytes, compiled):
    """compiled_row=2: the row's own module only where each thread of a
    chunk holds one access (where the twenty-fourth session measured a gain)."""
    modules = _record_modules(monkeypatch)
    tuning = ExpandTuning(bulk_min_blocks=math.inf, compiled_row=2)
    launch = _launch_for(num_tokens, hidden, item_bytes=item_bytes, tuning=tuning)
    assert launch.handle == "expand_to_fused_v16"
    assert ("EXPAND_ROW_BYTES" in dict(modules["expand_to_fused_v16"])) == compiled


def test_zero_fill_runs_is_a_define_of_every_module_only_where_set(fake_h200, monkeypatch):
    """zero_fill_runs (on by default): EXPAND_ZERO_RUNS in the modules'
    defines (the register kernel reads it); none with 0; the launch itself
    is the same."""
    modules = _record_modules(monkeypatch)
    tuning = ExpandTuning(bulk_min_blocks=math.inf)
    assert tuning.zero_fill_runs == 1
    launch = _launch_for(512, 3072, item_bytes=1, tuning=tuning)
    assert dict(modules["expand_to_fused_v16"])["EXPAND_ZERO_RUNS"] == 1
    modules.clear()
    row_by_row = _launch_for(512, 3072, item_bytes=1,
                             tuning=dataclasses.replace(tuning, zero_fill_runs=0))
    assert "EXPAND_ZERO_RUNS" not in dict(modules["expand_to_fused_v16"])
    assert (launch.handle, launch.grid, launch.threads) == (row_by_row.handle, row_by_row.grid,
                                                            row_by_row.threads)
    assert bytes(launch.args.buffer) == bytes(row_by_row.args.buffer)


def test_register_min_blocks_is_a_define_only_where_set(fake_h200, monkeypatch):
    """register_min_blocks: EXPAND_MIN_BLOCKS (the register kernels'
    __launch_bounds__ minimum) only where set; 0 by default."""
    modules = _record_modules(monkeypatch)
    _launch_for(512, 3072, tuning=ExpandTuning(bulk_min_blocks=math.inf, register_min_blocks=8))
    assert dict(modules["expand_to_fused_v16"])["EXPAND_MIN_BLOCKS"] == 8
    modules.clear()
    _launch_for(512, 3072, tuning=ExpandTuning(bulk_min_blocks=math.inf))
    assert "EXPAND_MIN_BLOCKS" not in dict(modules["expand_to_fused_v16"])


def test_cache_hints_reach_the_defines_only_where_not_streaming():
    """load_hint / store_hint become vector_access.cuh's VECTOR_LOAD_HINT /
    VECTOR_STORE_HINT; the default (.cs both ways) adds no define, so the
    default modules are compiled as before."""
    assert not any(name.startswith("VECTOR_") for name, _ in DEFAULT_TUNING.defines())
    tuned = dataclasses.replace(DEFAULT_TUNING, load_hint=3, store_hint=1)
    assert tuned.defines()[-2:] == (("VECTOR_LOAD_HINT", 3), ("VECTOR_STORE_HINT", 1))
    assert dataclasses.replace(DEFAULT_TUNING, store_hint=2).defines()[-1] == (
        "VECTOR_STORE_HINT", 2)


# the lean rows kernel (expand_to_fused_rows)
ROWS = dataclasses.replace(DEFAULT_TUNING, rows_kernel_tokens_below=1024)


def _rows_plan(num_tokens=32, hidden=3072, num_expanded=3072, tuning=ROWS, sf=None,
               dtype="bfloat16", **options):
    # qwen3-30b-small-e48-ep8-plan's shape (bf16 rows of 6 KiB)
    problem = ExpandProblem(num_tokens, hidden, 8, num_expanded, dtype, **(sf or {}))
    return ExpandPlan(problem, 1 if dtype == "float8_e4m3fn" else 2, 0, tuning, **options)


@pytest.mark.parametrize("zero_padding", [True, False])
def test_rows_kernel_blocks(fake_h200, zero_padding):
    plan = _rows_plan(zero_padding=zero_padding)
    launch = plan.kernel(16)
    assert plan.takes_rows_kernel(16)
    assert launch.name == launch.handle == "expand_to_fused_rows"
    assert (launch.threads, launch.shared_bytes, launch.zero_launch) == (256, 0, None)
    # 32 token blocks of all 8 slots, then a block a row (none without zero_padding)
    assert launch.constant("token_blocks") == 32
    assert launch.constant("slots_per_block") == 8
    assert launch.constant("first_zero_row") == (0 if zero_padding else 3072)
    assert launch.grid == (32 + (3072 if zero_padding else 0), 1, 1)
    for name in ("rows_per_zero_block", "vecs_per_thread", "sf_pass", "sf_pass_blocks",
                 "zero_row_blocks", "rows_per_gather_block"):
        assert launch.constant(name) == 0, name


def test_rows_kernel_decode_takes_a_block_a_slot(fake_h200):
    # below rows_kernel_slot_blocks_below tokens (default 2: decode), each
    # token block one slot: K blocks store a token's K rows at once
    launch = _rows_plan(num_tokens=1, num_expanded=1024).kernel(16)
    assert (launch.constant("token_blocks"), launch.constant("slots_per_block")) == (8, 1)
    assert launch.grid == (8 + 1024, 1, 1)
    two = _rows_plan(num_tokens=2, num_expanded=1024).kernel(16)
    assert (two.constant("token_blocks"), two.constant("slots_per_block")) == (2, 8)
    tuning = dataclasses.replace(ROWS, rows_kernel_slot_blocks_below=3, rows_kernel_threads=128)
    three = _rows_plan(num_tokens=2, num_expanded=1024, tuning=tuning).kernel(16)
    assert (three.constant("token_blocks"), three.constant("slots_per_block")) == (16, 1)
    assert three.threads == 128


@pytest.mark.parametrize(("change", "why"), [
    ({"tuning": DEFAULT_TUNING}, "off by default"),
    ({"num_tokens": 1024}, "1024 tokens are not below 1024"),
    ({"num_tokens": 0, "num_expanded": 1024}, "no tokens: every row zeroed, expert rows too"),
    ({"sf": QWEN3_FP8_ROW_SF, "dtype": "float8_e4m3fn"}, "scale factors"),
    ({"hidden": 8200}, "rows of 16,400 bytes: past the 16 KiB a block holds"),
    ({"with_pos_to_token": True,
      "tuning": dataclasses.replace(ROWS, gather_x_bytes_below=1e9,
                                    rows_by_position_tokens_below=0)},
     "the gather kernel comes first"),
])
def test_no_rows_kernel(fake_h200, change, why):
    plan = _rows_plan(**change)
    assert not plan.takes_rows_kernel(16), why
    assert plan.kernel(16).name != "expand_to_fused_rows", why
    assert plan.kernel(16).constant("token_blocks") == 0, why


def test_rows_kernel_takes_16_byte_accesses_only(fake_h200):
    plan = _rows_plan()
    assert plan.kernel(16).name == "expand_to_fused_rows"
    assert not plan.takes_rows_kernel(8)
    assert plan.kernel(8).name == "expand_to_fused_v8"


def test_rows_kernel_rows_of_16_kib_at_most(fake_h200):
    assert _rows_plan(hidden=8192).takes_rows_kernel(16)  # 16,384 bytes
    assert not _rows_plan(hidden=8200).takes_rows_kernel(16)


def test_rows_kernel_grid_fits_a_launch(fake_h200):
    # T * K token blocks plus X row blocks past 2^31 - 1: the other kernels
    plan = _rows_plan(num_tokens=1000, num_expanded=2**31 - 1000,
                      tuning=dataclasses.replace(ROWS, rows_kernel_slot_blocks_below=math.inf))
    assert not plan.takes_rows_kernel(16)


def test_rows_kernel_threads_must_be_whole_warps():
    with pytest.raises(ValueError, match=r"rows_kernel_threads must be whole warps in 32 "
                                         r"\.\. 1024; got 48"):
        ExpandTuning(rows_kernel_threads=48)
    with pytest.raises(ValueError, match=r"rows_kernel_threads must be whole warps.*got 2048"):
        ExpandTuning(rows_kernel_threads=2048)


@pytest.mark.parametrize(("group", "token_blocks", "slots"), [
    (0, 32, 8), (3, 32 * 3, 3), (4, 32 * 2, 4), (8, 32, 8), (20, 32, 8)])
def test_rows_kernel_slot_groups(fake_h200, group, token_blocks, slots):
    launch = _rows_plan(tuning=dataclasses.replace(ROWS, rows_kernel_slot_group=group)).kernel(16)
    assert (launch.constant("token_blocks"), launch.constant("slots_per_block")) == (
        token_blocks, slots)
    assert launch.grid == (token_blocks + 3072, 1, 1)


@pytest.mark.parametrize(("hidden", "threads", "by_position", "unroll"), [
    (3072, 256, False, 2),    # Qwen3's 6 KiB rows: 384 vectors, 1.5 a thread
    (3072, 128, True, 3),     # ... 3 a thread
    (7168, 96, True, 10),     # Kimi-K2's 14 KiB rows: 896 vectors, 9.33 a thread
    (8192, 256, False, 4),    # 16 KiB: as many as room for the longest row
    (8, 256, True, 1),        # one vector
])
def test_rows_kernel_is_compiled_for_the_calls_row(fake_h200, monkeypatch, hidden, threads,
                                                  by_position, unroll):
    """rows_kernel_fitted_unroll (default 1): a thread holds ceil(row vectors
    / threads) vectors, a module for each such count; 0: the kernel's own
    room for 16 KiB rows (no define)."""
    modules = _record_modules(monkeypatch)
    tuning = dataclasses.replace(BY_POSITION if by_position else ROWS, rows_kernel_threads=threads,
                                 rows_by_position_narrow_threads=0)
    plan = _rows_plan(hidden=hidden, tuning=tuning, with_pos_to_token=by_position)
    assert plan.kernel(16).name == "expand_to_fused_rows"
    assert plan.rows_by_position(16) == by_position
    defines = dict(modules["expand_to_fused_rows"])
    assert defines["EXPAND_ROWS_UNROLL"] == unroll
    assert defines["EXPAND_ROWS_THREADS"] == threads
    modules.clear()
    _rows_plan(hidden=hidden, tuning=dataclasses.replace(tuning, rows_kernel_fitted_unroll=0),
               with_pos_to_token=by_position).kernel(16)
    assert "EXPAND_ROWS_UNROLL" not in dict(modules["expand_to_fused_rows"])


@pytest.mark.parametrize(("hidden", "dtype", "sf", "by_position", "threads", "unroll"), [
    (3072, "bfloat16", None, True, 64, 6),    # Qwen3's 6 KiB rows: narrow, 6 vectors a thread
    (4096, "bfloat16", None, True, 64, 8),    # 8 KiB: the narrow bound, inclusive
    (4104, "bfloat16", None, True, 256, 3),   # past it: rows_kernel_threads
    (7168, "bfloat16", None, True, 256, 4),   # Kimi-K2's bf16 rows (14 KiB)
    # Kimi-K2's fp8 rows (7 KiB) with row-major scale factors: never narrow
    (7168, "float8_e4m3fn", {"sf_columns": 56, "sf_dtype": "float32", "num_per_channels": 128},
     True, 256, 2),
    (3072, "bfloat16", None, False, 256, 2),  # token blocks: never narrow
])
def test_rows_kernel_by_position_narrow_rows_take_narrow_blocks(fake_h200, monkeypatch, hidden,
                                                               dtype, sf, by_position, threads,
                                                               unroll):
    """By position, rows of at most rows_by_position_narrow_row_bytes (8 KiB)
    without scale factors take blocks of rows_by_position_narrow_threads
    (64), compiled for them; 0 gives them rows_kernel_threads."""
    modules = _record_modules(monkeypatch)
    plan = _rows_plan(hidden=hidden, dtype=dtype, tuning=BY_POSITION if by_position else ROWS,
                      with_pos_to_token=by_position, sf=sf)
    launch = plan.kernel(16)
    assert (launch.name, plan.rows_by_position(16)) == ("expand_to_fused_rows", by_position)
    assert launch.threads == plan.rows_threads(by_position) == threads
    defines = dict(modules["expand_to_fused_rows"])
    assert (defines["EXPAND_ROWS_THREADS"], defines["EXPAND_ROWS_UNROLL"]) == (threads, unroll)
    wide = _rows_plan(hidden=hidden, dtype=dtype, with_pos_to_token=by_position, sf=sf,
                      tuning=dataclasses.replace(BY_POSITION if by_position else ROWS,
                                                 rows_by_position_narrow_threads=0))
    assert wide.kernel(16).threads == 256


@pytest.mark.parametrize("value", [48, 16, 2048])
def test_rows_by_position_narrow_threads_must_be_whole_warps(value):
    with pytest.raises(ValueError, match=r"rows_by_position_narrow_threads must be 0 or whole "
                                         rf"warps in 32 \.\. 1024; got {value}"):
        ExpandTuning(rows_by_position_narrow_threads=value)


@pytest.mark.parametrize(("value", "shown"), [(2.5, r"2\.5"), (math.inf, "inf"), (math.nan, "nan")])
def test_rows_kernel_slot_group_must_be_whole(value, shown):
    with pytest.raises(ValueError, match=r"rows_kernel_slot_group must be a whole number of "
                                         rf"slots; got {shown}"):
        ExpandTuning(rows_kernel_slot_group=value)


# the long rows' layout: kimi-k2-medium's shape (T = 512, 14 KiB bf16 rows, X = 4096)
KIMI_MEDIUM = {"num_tokens": 512, "hidden": 7168, "num_expanded": 4096}


@pytest.mark.parametrize("zero_padding", [True, False])
def test_default_long_rows_take_token_blocks_of_4_slots(fake_h200, monkeypatch, zero_padding):
    """By default, calls without scale factors whose rows are longer than
    8 KiB, with 512 <= T < 1024 and outputs below 64 MB, take the rows
    kernel: 128 threads, token blocks of 4 slots, then a block a padding row."""
    modules = _record_modules(monkeypatch)
    plan = _rows_plan(**KIMI_MEDIUM, tuning=DEFAULT_TUNING, zero_padding=zero_padding)
    launch = plan.kernel(16)
    assert plan.long_rows(16) and plan.takes_rows_kernel(16) and not plan.rows_by_position(16)
    assert (launch.name, launch.threads) == ("expand_to_fused_rows", 128)
    assert (launch.constant("token_blocks"), launch.constant("slots_per_block")) == (1024, 4)
    assert launch.grid == (1024 + (4096 if zero_padding else 0), 1, 1)
    defines = dict(modules["expand_to_fused_rows"])
    assert (defines["EXPAND_ROWS_THREADS"], defines["EXPAND_ROWS_UNROLL"]) == (128, 7)
    assert "EXPAND_ROWS_BY_POSITION" not in defines
    # the same call given pos_to_token (58.7 MB: past the by-position bound)
    given = _rows_plan(**KIMI_MEDIUM, tuning=DEFAULT_TUNING, with_pos_to_token=True)
    assert given.long_rows(16) and given.kernel(16).constant("slots_per_block") == 4
    # 63,995,904 bytes of output: below the bound
    assert _rows_plan(**{**KIMI_MEDIUM, "num_expanded": 4464}, tuning=DEFAULT_TUNING).long_rows(16)


@pytest.mark.parametrize(("change", "why"), [
    ({"num_tokens": 511}, "511 tokens: below 512"),
    ({"num_tokens": 1024, "num_expanded": 8192}, "1024 tokens are not below 1024"),
    ({"hidden": 4096}, "rows of 8 KiB: not longer than 8 KiB"),
    ({"num_expanded": 6144}, "kimi-k2-medium-e48-ep8-plan: 88 MB of output"),
    ({"num_expanded": 4465}, "64,010,240 bytes of output: not below 64e6"),
    ({"hidden": 8200}, "rows of 16,400 bytes: past the 16 KiB a block holds"),
    ({"hidden": 12288, "dtype": "float8_e4m3fn",
      "sf": {"sf_columns": 96, "sf_dtype": "float32", "num_per_channels": 128}},
     "12 KiB fp8 rows with scale factors"),
    ({"tuning": dataclasses.replace(DEFAULT_TUNING, long_rows_tokens_from=math.inf)}, "off"),
])
def test_no_long_rows(fake_h200, change, why):
    plan = _rows_plan(**{**KIMI_MEDIUM, "tuning": DEFAULT_TUNING, **change})
    assert not plan.long_rows(16), why
    assert not plan.takes_rows_kernel(16), why
    assert plan.kernel(16).name != "expand_to_fused_rows", why


def test_long_rows_yield_to_the_rows_kernels_other_switches(fake_h200):
    # by position (an output below 32 MB, given pos_to_token): a block a row
    small = _rows_plan(num_tokens=512, hidden=7168, num_expanded=2048, tuning=DEFAULT_TUNING,
                       with_pos_to_token=True)
    assert small.rows_by_position(16) and not small.long_rows(16)
    assert small.kernel(16).constant("token_blocks") == 0
    # rows_kernel_tokens_below sets its own layout (all K slots, rows_kernel_threads)
    rows = _rows_plan(**KIMI_MEDIUM, tuning=ROWS)
    assert not rows.long_rows(16)
    assert (rows.kernel(16).threads, rows.kernel(16).constant("slots_per_block")) == (256, 8)


@pytest.mark.parametrize("value", [48, 16, 2048])
def test_long_rows_threads_must_be_whole_warps(value):
    with pytest.raises(ValueError, match=r"long_rows_threads must be whole warps in 32 "
                                         rf"\.\. 1024; got {value}"):
        ExpandTuning(long_rows_threads=value)


@pytest.mark.parametrize(("value", "shown"), [(2.5, r"2\.5"), (math.inf, "inf")])
def test_long_rows_slot_group_must_be_whole(value, shown):
    with pytest.raises(ValueError, match=r"long_rows_slot_group must be a whole number of "
                                         rf"slots; got {shown}"):
        ExpandTuning(long_rows_slot_group=value)


BY_POSITION = dataclasses.replace(DEFAULT_TUNING, rows_by_position_tokens_below=1024,
                                  rows_by_position_bytes_below=math.inf)


@pytest.mark.parametrize("zero_padding", [True, False])
def test_rows_kernel_by_position_blocks(fake_h200, zero_padding):
    # given pos_to_token: a block a row, padding rows too (they return at
    # once without zero_padding), no token blocks
    plan = _rows_plan(tuning=BY_POSITION, with_pos_to_token=True, zero_padding=zero_padding)
    launch = plan.kernel(16)
    assert plan.rows_by_position(16) and plan.takes_rows_kernel(16)
    assert launch.name == "expand_to_fused_rows"
    assert launch.grid == (3072, 1, 1)
    for name in ("token_blocks", "first_zero_row"):
        assert launch.constant(name) == 0, name


def test_rows_kernel_by_position_needs_pos_to_token(fake_h200):
    plan = _rows_plan(tuning=BY_POSITION)
    assert not plan.rows_by_position(16) and not plan.takes_rows_kernel(16)
    assert plan.kernel(16).name != "expand_to_fused_rows"
    # the token-block rows kernel is its own switch
    both = _rows_plan(tuning=dataclasses.replace(BY_POSITION, rows_kernel_tokens_below=1024))
    assert both.kernel(16).constant("token_blocks") == 32


@pytest.mark.parametrize(("change", "why"), [
    ({"num_tokens": 1024}, "1024 tokens are not below 1024"),
    ({"num_tokens": 0, "num_expanded": 1024}, "no tokens"),
    ({"sf": PACKED_SF, "dtype": "float8_e4m3fn", "hidden": 7168},
     "column-major scale factors (the SF pass writes them by position)"),
    ({"hidden": 8200}, "rows of 16,400 bytes: past the 16 KiB a block holds"),
])
def test_no_rows_by_position(fake_h200, change, why):
    plan = _rows_plan(tuning=BY_POSITION, with_pos_to_token=True, **change)
    assert not plan.rows_by_position(16), why
    assert plan.kernel(16).name != "expand_to_fused_rows", why


@pytest.mark.parametrize("zero_padding", [True, False])
def test_rows_kernel_by_position_takes_row_major_scale_factors(fake_h200, zero_padding):
    # kimi-k2-decode-e384-plan-sf-row-major given pos_to_token, by default: a
    # block a row, its S words with it (the module compiled for row-major SF);
    # token blocks still take none
    plan = _rows_plan(num_tokens=1, hidden=7168, num_expanded=1024, tuning=DEFAULT_TUNING,
                      sf={"sf_columns": 56, "sf_dtype": "float32", "num_per_channels": 128},
                      dtype="float8_e4m3fn", with_pos_to_token=True, zero_padding=zero_padding)
    assert plan.rows_by_position(16) and plan.sf_mode == SF_ROW_MAJOR
    launch = plan.kernel(16)
    assert (launch.name, launch.grid) == ("expand_to_fused_rows", (1024, 1, 1))
    assert launch.constant("sf_columns") == 56
    no_hint = _rows_plan(num_tokens=1, hidden=7168, num_expanded=1024,
                         tuning=dataclasses.replace(DEFAULT_TUNING, rows_kernel_tokens_below=64),
                         sf={"sf_columns": 56, "sf_dtype": "float32", "num_per_channels": 128},
                         dtype="float8_e4m3fn")
    assert not no_hint.takes_rows_kernel(16)


@pytest.mark.parametrize(("num_tokens", "num_expanded", "taken"), [
    (32, 3072, True),    # qwen3-30b-small-e48-ep8-plan: 18.9 MB
    (1, 1024, True),     # decode
    (512, 4096, True),   # qwen3-30b-medium-e32-ep8-plan: 25.2 MB
    (1023, 3072, True),
    (1024, 3072, False),  # 1024 tokens
    (32, 5209, False),   # 32,004,096 bytes of output: not below 32e6
    (32, 5208, True),    # 31,997,952 bytes
])
def test_default_rows_by_position(fake_h200, num_tokens, num_expanded, taken):
    # the default: calls given pos_to_token with T < 1024 and outputs below 32 MB
    plan = _rows_plan(num_tokens=num_tokens, num_expanded=num_expanded, tuning=DEFAULT_TUNING,
                      with_pos_to_token=True)
    assert plan.rows_by_position(16) == taken
    assert (plan.kernel(16).name == "expand_to_fused_rows") == taken
    assert not _rows_plan(num_tokens=num_tokens, num_expanded=num_expanded,
                          tuning=DEFAULT_TUNING).takes_rows_kernel(16)


def test_rows_kernel_by_position_comes_before_the_gather(fake_h200):
    tuning = dataclasses.replace(BY_POSITION, gather_x_bytes_below=1e9)
    plan = _rows_plan(tuning=tuning, with_pos_to_token=True)
    assert not plan.gathers(16)
    assert plan.kernel(16).name == "expand_to_fused_rows"
    # rows past 16 KiB: no rows kernel, so the gather
    wide = _rows_plan(hidden=8200, tuning=tuning, with_pos_to_token=True)
    assert wide.gathers(16) and wide.kernel(16).name == "expand_to_fused_gather"


def test_rows_kernel_by_position_grid_is_the_rows(fake_h200):
    # 1000 tokens' K slot blocks would overflow the grid; by position, X blocks fit
    tuning = dataclasses.replace(BY_POSITION, rows_kernel_tokens_below=1024,
                                 rows_kernel_slot_blocks_below=math.inf)
    plan = _rows_plan(num_tokens=1000, num_expanded=2**31 - 1000, tuning=tuning,
                      with_pos_to_token=True)
    assert plan.takes_rows_kernel(16)
    assert plan.kernel(16).grid == (2**31 - 1000, 1, 1)


def test_register_min_blocks_infinite_is_not_a_whole_number():
    with pytest.raises(ValueError, match=r"register_min_blocks must be a whole number of "
                                         r"blocks; got inf"):
        ExpandTuning(register_min_blocks=math.inf)
