"""Launch plans of the expand kernels, and the torch fast path's keys: host-side
bookkeeping that needs CuPy but no GPU."""

import dataclasses
import math

import pytest

pytest.importorskip("cupy")

import cupy_moe.expand.plan as plan_module  # noqa: E402
from cupy_moe.expand.gpu import ROUTING_ARGS  # noqa: E402
from cupy_moe.expand.plan import EXPAND_ARGS, ExpandPlan  # noqa: E402
from cupy_moe.expand.rules import ExpandProblem  # noqa: E402
from cupy_moe.expand.tuning import DEFAULT_TUNING, ExpandTuning  # noqa: E402
from cupy_moe.runtime import launch as launch_module  # noqa: E402
from cupy_moe.runtime.launch import DeviceTraits  # noqa: E402
from cupy_moe.runtime.sizes import align_up  # noqa: E402


def test_argument_blocks_match_the_kernel_structs():
    # struct ExpandArgs: 6 pointers, an int64, 8 int32; RoutingArgs: 4
    # pointers, an int64, an int32 padded to the struct's 8-byte alignment.
    assert EXPAND_ARGS.size == 6 * 8 + 8 + 8 * 4
    assert EXPAND_ARGS.pointer_count == 6
    assert ROUTING_ARGS.size == 4 * 8 + 8 + 8


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


def _launch_for(num_tokens, hidden, item_bytes=2, vec_bytes=16, top_k=8,
                tuning=DEFAULT_TUNING, **sf):
    problem = ExpandProblem(num_tokens, hidden, top_k, num_tokens * top_k,
                            "bfloat16" if item_bytes == 2 else "float8_e4m3fn", **sf)
    return ExpandPlan(problem, item_bytes, 0, tuning).kernel(vec_bytes)


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
    launch = _launch_for(num_tokens, hidden)
    # rows of 8 KiB and more: zero-fill blocks of whole rows
    assert launch.handle == ("expand_to_fused_bulk_zero_rows" if hidden * 2 >= 8192
                             else "expand_to_fused_bulk")
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


FORCE_BULK = ExpandTuning(bulk_min_blocks=0.0)
FORCE_REGISTERS = ExpandTuning(bulk_min_blocks=math.inf)


def test_no_tokens_take_the_register_kernel_even_when_bulk_is_forced(fake_h200):
    # T == 0 only zero-fills; the bulk kernel's chunking divides by T
    assert _launch_for(0, 7168, tuning=FORCE_BULK).handle == "expand_to_fused_v16"


@pytest.mark.parametrize(("tuning", "handle"), [
    (FORCE_BULK, "expand_to_fused_bulk"), (FORCE_REGISTERS, "expand_to_fused_v16")])
def test_forcing_a_kernel_reaches_small_batches(fake_h200, tuning, handle):
    # what the GPU tests' kernel paths rely on: 5 tokens of 32-byte rows
    assert _launch_for(5, 16, tuning=tuning).handle == handle
    assert _launch_for(4096, 7168, tuning=tuning).handle.startswith(handle)  # bulk: either zero-fill


@pytest.mark.parametrize(("num_tokens", "hidden", "num_expanded", "col_major", "grid"), [
    # decode, register kernel, slots split over 8 planes: 16 rows in 2-row
    # zero-fill blocks = 8 blocks, one column of them across the planes
    (1, 7168, 16, False, (1 + 1, 4, 8)),
    # 40 rows -> 20 zero-fill blocks over 8 planes: 3 columns (4 blocks idle)
    (1, 7168, 40, False, (1 + 3, 4, 8)),
    # column-major SF: the pad columns count, align(18, 4) = 20 rows
    (1, 1024, 18, True, (1 + 2, 1, 8)),
    # qwen3-30b-medium, bulk kernel, 3 chunks: 4096 rows in 4-row blocks of a chunk
    (512, 3072, 4096, False, (512 + 1024, 3, 1)),
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
    launch = ExpandPlan(problem, item_bytes, 0, DEFAULT_TUNING).kernel(16)
    assert launch.grid == grid
    rows = launch.constant("rows_per_zero_block")
    zero_rows = align_up(num_expanded, 4) if col_major else num_expanded
    # every row is some zero-fill block's, and no whole column of blocks is idle
    columns = grid[0] - num_tokens
    planes = grid[2] * (grid[1] if launch.handle.endswith("_zero_rows") else 1)
    assert columns * planes * rows >= zero_rows > (columns - 1) * planes * rows


def test_whole_row_zero_fill_tuning_reaches_short_rows(fake_h200):
    # what the GPU tests' "bulk-zero-rows" kernel path relies on: 2 KiB rows
    # of 5 tokens take the whole-row zero-fill kernel, cut into 4 chunks
    tuning = ExpandTuning(bulk_min_blocks=0.0, bulk_whole_row_zero_from=0,
                          bulk_min_chunk_bytes=512)
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


@pytest.mark.parametrize(("change", "message"), [
    ({"zero_rows_registers": 0}, r"zero_rows_registers must be in 1 \.\. 32; got 0"),
    ({"zero_rows_bulk_whole": 33}, r"zero_rows_bulk_whole must be in 1 \.\. 32; got 33"),
    ({"threads": 100}, r"threads must be whole warps in 32 \.\. 1024 .*got 100"),
    ({"unroll": 0}, r"unroll must be in 1 \.\. 16; got 0"),
    ({"bulk_max_chunk_bytes": 0}, r"bulk_min_chunk_bytes <= bulk_max_chunk_bytes; got 2048, 0"),
    ({"bulk_target_blocks": -1.0}, r"bulk_target_blocks must be a number >= 0; got -1\.0"),
    ({"split_slots_below": "1"}, r"split_slots_below must be a number >= 0; got '1'"),
])
def test_tuning_rejects_values_the_kernels_cannot_take(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(DEFAULT_TUNING, **change)


def test_tuning_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_TUNING.unroll = 2
