"""``reduce_fused``'s launch plans without a GPU: the device traits, kernel
handles and the driver's launch are stand-ins, so that what a call would
launch (kernel, access width, grid, argument block) is checked on any machine."""

from __future__ import annotations

import pytest

pytest.importorskip("cupy")

from cupy_moe.combine import gpu
from cupy_moe.combine.launch_shape import auto_combine_shape
from cupy_moe.combine.rules import CombineProblem
from cupy_moe.runtime.launch import DeviceTraits

MULTIPROCESSORS = 132


class FakeDriver:
    """Records launches instead of making them."""

    def __init__(self) -> None:
        self.launches = []

    def launchKernel(self, handle, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.launches.append({"handle": handle, "grid": (gx, gy, gz), "block": (bx, by, bz),
                              "shared": shared, "stream": stream, "params": params})


@pytest.fixture
def fake_gpu(monkeypatch):
    handles = {}
    monkeypatch.setattr(gpu, "device_traits",
                        lambda device: DeviceTraits(MULTIPROCESSORS, 9, 227 * 1024))
    monkeypatch.setattr(gpu, "function_handle",
                        lambda source, defines, device, name: handles.setdefault(
                            name, 0x1000 + len(handles)))
    driver = FakeDriver()
    monkeypatch.setattr(gpu, "driver", driver)
    def launched():
        """(kernel name, launch record) of the last launch."""
        record = driver.launches[-1]
        name = next(n for n, h in handles.items() if h == record["handle"])
        return name, record

    return driver, launched


def _problem(num_tokens=64, hidden=7168, top_k=8, num_expanded=600, dtype="bfloat16",
             weights=True, row_scale=False):
    return CombineProblem(num_tokens, hidden, top_k, num_expanded, dtype, weights, row_scale)


def _fields(plan, vec_bytes):
    layout = gpu.COMBINE_ARGS
    values = layout.packer.unpack_from(plan.kernel(vec_bytes).args.buffer)
    return dict(zip(layout.names, values, strict=True))


@pytest.mark.parametrize(("dtype", "item", "hidden", "expanded", "out", "kernel"), [
    ("bfloat16", 2, 7168, 0x10000, 0x20000, "reduce_fused_bf16_v16"),
    ("uint16", 2, 7168, 0x10000, 0x20000, "reduce_fused_bf16_v16"),
    ("float16", 2, 7168, 0x10008, 0x20000, "reduce_fused_f16_v8"),   # base 8-aligned
    ("float16", 2, 7168, 0x10000, 0x20004, "reduce_fused_f16_v4"),   # out 4-aligned
    ("bfloat16", 2, 7169, 0x10000, 0x20000, "reduce_fused_bf16_v2"),  # odd H: one element
    ("bfloat16", 2, 7170, 0x10000, 0x20000, "reduce_fused_bf16_v4"),
    ("float32", 4, 7168, 0x10000, 0x20000, "reduce_fused_f32_v16"),
    ("float32", 4, 7167, 0x10000, 0x20000, "reduce_fused_f32_v4"),
    ("float32", 4, 7168, 0x10004, 0x20000, "reduce_fused_f32_v4"),
    ("float32", 4, 2, 0x10000, 0x20000, "reduce_fused_f32_v8"),
])
def test_widest_access_and_its_kernel(fake_gpu, dtype, item, hidden, expanded, out, kernel):
    _driver, launched = fake_gpu
    plan = gpu.CombinePlan(_problem(hidden=hidden, dtype=dtype), item, 0)
    plan.launch(5, expanded, 0x30000, 0x40000, 0, out)
    name, record = launched()
    assert name == kernel
    vec_bytes = int(kernel.rsplit("_v", 1)[1])
    shape = auto_combine_shape(64, hidden * item // vec_bytes, MULTIPROCESSORS)
    assert record["grid"] == shape.grid and record["block"] == (shape.threads, 1, 1)
    assert record["shared"] == 0 and record["stream"] == 5
    fields = _fields(plan, vec_bytes)
    assert fields == {"expanded": expanded, "token_topk_to_pos": 0x30000,
                      "topk_weights": 0x40000, "row_scale": 0, "out": out,
                      "row_vecs": hidden * item // vec_bytes, "num_tokens": 64,
                      "num_expanded": 600, "top_k": 8, "row_threads": shape.row_threads,
                      "tokens_per_block": shape.tokens_per_block}


def test_no_tokens_launch_nothing(fake_gpu):
    driver, _ = fake_gpu
    plan = gpu.CombinePlan(_problem(num_tokens=0), 2, 0)
    plan.launch(0, 0x10000, 0, 0, 0, 0x20000)
    assert driver.launches == []


def test_plans_are_kept_per_problem(fake_gpu):
    problem = _problem()
    assert gpu.plan_for(problem, 2, 0) is gpu.plan_for(problem, 2, 0)
    assert gpu.plan_for(problem, 2, 0) is not gpu.plan_for(problem, 2, 1)


def test_plan_table_is_bounded(fake_gpu, monkeypatch):
    """Plans are keyed by shapes (batch sizes vary): the table keeps the
    newest; an evicted problem gets a fresh plan."""
    from cupy_moe.runtime.bounded_cache import BoundedCache

    monkeypatch.setattr(gpu, "_plans", BoundedCache(2))
    first = gpu.plan_for(_problem(num_tokens=1), 2, 0)
    second = gpu.plan_for(_problem(num_tokens=2), 2, 0)
    gpu.plan_for(_problem(num_tokens=3), 2, 0)
    assert len(gpu._plans) == 2
    assert gpu.plan_for(_problem(num_tokens=2), 2, 0) is second
    assert gpu.plan_for(_problem(num_tokens=1), 2, 0) is not first


def test_shape_options_reach_the_launch(fake_gpu):
    _driver, launched = fake_gpu
    plan = gpu.CombinePlan(_problem(num_tokens=4096), 2, 0,
                           (("fill_blocks_per_sm", 0.0), ("max_warps", 2)))
    plan.launch(0, 0x10000, 0x30000, 0, 0, 0x20000)
    _, record = launched()
    assert record["block"] == (64, 1, 1) and record["grid"] == (4096, 14, 1)


def _record_defines(monkeypatch) -> list:
    """The defines of each kernel module a plan asks for, in order, less the
    kernel's own (COMBINE_ONE_FORMAT / COMBINE_ONE_VEC: the test below)."""
    modules = []

    def record(source, defines, device, name):
        defines = dict(defines)
        kernel = gpu.kernel_defines(name.split("_")[2], int(name.rsplit("_v", 1)[1]))
        assert tuple(defines.items())[-2:] == kernel, (name, defines)
        modules.append({key: value for key, value in defines.items()
                        if key not in dict(kernel)})
        return 0x1000

    monkeypatch.setattr(gpu, "function_handle", record)
    return modules


@pytest.mark.parametrize(("dtype", "vec_bytes", "kernel"), [
    ("bfloat16", 16, "reduce_fused_bf16_v16"), ("float16", 2, "reduce_fused_f16_v2"),
    ("float32", 4, "reduce_fused_f32_v4")])
def test_a_plan_module_holds_the_kernel_it_launches_alone(monkeypatch, fake_gpu, dtype,
                                                         vec_bytes, kernel):
    """Each kernel a plan launches comes from a module of that kernel alone:
    its format (FMT_* + 1) and access width (what such a module holds:
    test_combine_compile.py)."""
    asked = []
    monkeypatch.setattr(gpu, "function_handle",
                        lambda source, defines, device, name: asked.append((name, defines))
                        or 0x1000)
    gpu.CombinePlan(_problem(dtype=dtype), 2, 0, ()).kernel(vec_bytes)
    format_value = {"bfloat16": 2, "float16": 3, "float32": 1}[dtype]
    assert asked[-1][0] == kernel
    assert asked[-1][1][-2:] == (("COMBINE_ONE_FORMAT", format_value),
                                 ("COMBINE_ONE_VEC", vec_bytes))


def test_the_warp_slots_option_compiles_its_variant(monkeypatch, fake_gpu):
    """warp_slots reaches the kernel's module (COMBINE_WARP_SLOTS); without
    it the module is the plain many-token one."""
    modules = _record_defines(monkeypatch)
    options = (("max_warps", 4), ("slot_batch", 4), ("vecs_per_thread", 2),
               ("warp_slots", True))
    gpu.CombinePlan(_problem(num_tokens=4096), 2, 0, options).kernel(16)
    assert modules[-1] == {"COMBINE_VECS": 2, "COMBINE_SLOT_BATCH": 4,
                           "COMBINE_WARP_SLOTS": 1}
    gpu.CombinePlan(_problem(num_tokens=4096, num_expanded=4096 * 8), 2, 0,
                    (("vecs_per_thread", 4), ("slot_batch", 4), ("max_warps", 4))).kernel(16)
    assert modules[-1] == {"COMBINE_VECS": 4, "COMBINE_SLOT_BATCH": 4}


ROWS_7 = {"COMBINE_VECS": 7, "COMBINE_TOKEN_ROWS": 8, "COMBINE_FULL_ROWS": 1}
NC = {"VECTOR_LOAD_HINT": 3}  # sparse plans' row loads: the read-only path


@pytest.mark.parametrize(("num_tokens", "num_expanded", "hidden", "defines"), [
    # rows whole groups of 128 threads (7168 bf16 columns: 7 vectors a thread):
    # token_rows wherever its grid fills the chip, whatever X says
    (4096, 4096 + 32 * 127, 7168, {**ROWS_7, **NC}),
    # (a dense plan's tokens with at most half their slots live: .nc, FEW_LIVE_LOAD_HINT)
    (4096, 4096 * 8, 7168, {**ROWS_7, "COMBINE_FEW_LIVE_LOAD_HINT": 3}),
    (512, 2048, 7168, {**ROWS_7, **NC}),  # rows in 2 chunks of 2 warps
    (32, 128, 7168, NC),
    # rows they do not fill (5120 columns, 640 vectors). An expert-parallel
    # plan's X (4096 of 32768 slots, plus padding): sparse, a warp streams the
    # live rows of 4 tokens
    (4096, 4096 + 32 * 127, 5120,
     {"COMBINE_SLOT_BATCH": 4, "COMBINE_STREAM_ROUNDS": 1, **NC}),
    (4096, 4096 * 4, 5120, {"COMBINE_SLOT_BATCH": 4, "COMBINE_STREAM_ROUNDS": 1, **NC}),
    # over half of the slots: the many-token shape (its warps walk live slots too)
    (4096, 4096 * 4 + 1, 5120,
     {"COMBINE_VECS": 4, "COMBINE_SLOT_BATCH": 4, "COMBINE_WARP_SLOTS": 1}),
    (512, 2048, 5120,  # 128 x 5 blocks
     {"COMBINE_SLOT_BATCH": 4, "COMBINE_STREAM_ROUNDS": 1, **NC}),
    (512, 4096, 5120, {"COMBINE_VECS": 4, "COMBINE_SLOT_BATCH": 4, "COMBINE_WARP_SLOTS": 1}),
    # few tokens: no many-token grid fills the chip; the default shape
    (32, 128, 5120, NC),
    (32, 32 * 8, 5120, {}),
])
def test_many_token_plans_take_token_rows_or_walk_the_live_slots(
        monkeypatch, fake_gpu, num_tokens, num_expanded, hidden, defines):
    """Rows that groups of 128 threads fill take token_rows (K compiled in)
    where its grid fills the chip; elsewhere sparse_slots (X at most half of
    T * K) picks the streamed shape where its grid fills the chip, and the
    many-token shape walks live slots anyway. Sparse plans load rows by the
    read-only path (the fake GPU's L2 size is unknown: nothing else does)."""
    modules = _record_defines(monkeypatch)
    plan = gpu.CombinePlan(_problem(num_tokens=num_tokens, num_expanded=num_expanded,
                                    hidden=hidden), 2, 0)
    plan.kernel(16)
    assert modules[-1] == defines


@pytest.mark.parametrize(("major", "vec_bytes", "bulk"), [(9, 16, True), (9, 8, False),
                                                      (8, 16, False)])
def test_the_bulk_option_needs_16_byte_rows_on_sm90(monkeypatch, fake_gpu, major, vec_bytes,
                                                    bulk):
    """bulk_stages compiles COMBINE_BULK_STAGES and launches with its stages'
    shared memory; narrower accesses (unaligned rows or bases) and GPUs
    before sm_90 take the plain shape of the other options instead."""
    driver, _launched = fake_gpu
    monkeypatch.setattr(gpu, "device_traits",
                        lambda device: DeviceTraits(MULTIPROCESSORS, major, 227 * 1024))
    modules = _record_defines(monkeypatch)
    options = (("bulk_rounds", 2), ("bulk_stages", 4), ("max_warps", 4),
               ("vecs_per_thread", 2))
    plan = gpu.CombinePlan(_problem(num_tokens=8192, num_expanded=16384), 2, 0, options)
    plan.launch(0, 0x10000 + vec_bytes, 0x30000, 0, 0, 0x20000)
    record = driver.launches[-1]
    shape = plan.kernel(vec_bytes).shape
    if bulk:
        assert modules[-1] == {"COMBINE_VECS": 2, "COMBINE_BULK_STAGES": 4,
                               "COMBINE_BULK_ROUNDS": 2}
        assert record["shared"] == shape.shared_bytes == 4 * 128 * 2 * 16
        assert record["block"] == (128, 1, 1) and record["grid"] == (256, 4, 1)
    else:  # bulk_rounds goes with bulk_stages
        assert modules[-1] == {"COMBINE_VECS": 2}
        assert record["shared"] == 0 and (shape.bulk_stages, shape.bulk_rounds) == (0, 1)


def test_bulk_stages_beyond_48_kib_opt_in_and_beyond_the_gpu_raise(monkeypatch, fake_gpu):
    calls = []
    monkeypatch.setattr(gpu, "allow_dynamic_shared", lambda *args: calls.append(args))
    problem = _problem(num_tokens=4096, num_expanded=8192)
    # 8 stages of 224 threads x 4 vectors: 112 KiB, past the default 48
    big = (("bulk_stages", 8), ("fill_blocks_per_sm", 0.0), ("max_warps", 8),
           ("vecs_per_thread", 4))
    kernel = gpu.CombinePlan(problem, 2, 0, big).kernel(16)
    assert kernel.shared_bytes == 8 * 224 * 4 * 16
    assert calls == [(kernel.handle, kernel.shared_bytes)]
    # 2 stages: 28 KiB, no opt-in
    small = (("bulk_stages", 2), ("fill_blocks_per_sm", 0.0), ("max_warps", 8),
             ("vecs_per_thread", 4))
    assert gpu.CombinePlan(problem, 2, 0, small).kernel(16).shared_bytes == 2 * 224 * 64
    assert len(calls) == 1
    monkeypatch.setattr(gpu, "device_traits",
                        lambda device: DeviceTraits(MULTIPROCESSORS, 9, 100 * 1024))
    with pytest.raises(ValueError, match=r"bulk stages of 114688 bytes do not fit the 102400 "
                                         r"bytes of shared memory a block may have"):
        gpu.CombinePlan(problem, 2, 0, big).kernel(16)


def test_overlap_sizes_of_the_fast_path():
    plan = gpu.CombinePlan(_problem(row_scale=True), 2, 0)  # kernels are made lazily
    assert plan.input_bytes == (600 * 7168 * 2, 64 * 8 * 4, 64 * 8 * 4, 600 * 4)
    assert plan.out_bytes == 64 * 7168 * 2 and plan.out_shape == (64, 7168)


@pytest.mark.parametrize(("num_tokens", "hidden", "load_hint"), [
    (512, 2048, 3),     # Qwen3-30B-A3B T = 512: 19 MB, in half the L2
    (512, 7168, None),  # Kimi-K2 T = 512: 66 MB, evict-first
    (1, 7168, 3),
])
def test_calls_that_fit_half_the_l2_load_by_the_read_only_path(monkeypatch, fake_gpu,
                                                                num_tokens, hidden, load_hint):
    monkeypatch.setattr(gpu, "device_traits", lambda device: DeviceTraits(
        MULTIPROCESSORS, 9, 227 * 1024, False, 50 * 2**20))
    modules = _record_defines(monkeypatch)
    gpu.CombinePlan(_problem(num_tokens=num_tokens, num_expanded=num_tokens * 8,
                             hidden=hidden), 2, 0).kernel(16)
    assert modules[-1].get("VECTOR_LOAD_HINT") == load_hint
