"""``reduce_fused`` in the benchmark harness: its inputs, its records on the
CPU backend, the GPU benchmark's control flow (CPU stand-ins for the device
and the timers), the bit-exact check catching a wrong result, and how the
harness behaves while a newer op's family is missing. The op's own contract
is tested by tests/test_combine_*.py; here it is the harness.

Tests that run the op skip while ``cupy_moe.combine`` has no ``reduce_fused``
(the family is written beside the harness; issue 14).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
from bench_cases import FakeTimer

from cupy_moe.harness import report, runner
from cupy_moe.harness.inputs import plan_mapping, workload_inputs
from cupy_moe.harness.manifest import PlanSpec, Workload, load_workloads

pytestmark = pytest.mark.smoke

WORKLOADS = {w.label: w for w in load_workloads("reduce_fused")}
# GPU figures a CPU record leaves empty; the expand ops' copy + memset floor
# and the torch peers' figures, empty for the newer ops on every backend
GPU_FIELDS = ("gpu_us", "pct_copy_roofline", "copy_same_bytes_us", "eager_us", "graph_us")
FLOOR_FIELDS = ("zero_bytes", "memset_zero_us", "copy_routed_us", "pct_copy_memset_model")
PEER_FIELDS = ("index_select_eager_us", "torch_ref_us", "torch_nosync_us", "speedup_vs_ref",
               "speedup_vs_nosync")


def needs_op(op_name: str):
    """The newer op's function (from its family package)."""
    return runner.family_op(op_name)


def flip_one_bit(result, index):
    """``result`` (NumPy array or CPU tensor) with the lowest bit of one
    element flipped, in place: a wrong result the check must catch."""
    if isinstance(result, np.ndarray):
        result.view(f"u{result.itemsize}")[index] ^= 1
        return result
    import torch
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[result.element_size()]
    result.view(bits)[index] ^= 1
    return result


# --- inputs ---------------------------------------------------------------------

def tiny(**flags) -> Workload:
    """A small reduce workload over a padded plan (16 experts, 8-row segments)."""
    spec = PlanSpec(num_experts=16, alignment=8, seed=1)
    num_expanded = spec.sizes(6, 4)[0]
    shapes = {"expanded": (num_expanded, 40), "token_topk_to_pos": (6, 4)}
    if flags.get("topk_weights"):
        shapes["topk_weights"] = (6, 4)
    if flags.get("row_scale"):
        shapes["row_scale"] = (num_expanded,)
    return Workload("reduce_fused", "tiny", shapes, "bfloat16", plan=spec)


@pytest.mark.parametrize("w", [
    WORKLOADS["reduce-kimi-k2-decode"], WORKLOADS["reduce-dsv3-ep8-small-plan"],
    tiny(topk_weights=True, row_scale=True), tiny(row_scale=True), tiny()],
    ids=["kimi-decode", "dsv3-ep8-small", "tiny-weights-row-scale", "tiny-row-scale", "tiny"])
def test_workload_inputs_are_the_plans_rows(w, rng):
    inputs = workload_inputs(w, rng)
    assert list(inputs) == list(w.shapes)
    for name, array in inputs.items():
        assert array.shape == w.shapes[name], name
    assert inputs["expanded"].dtype.name == "bfloat16"
    plan = plan_mapping(w)
    np.testing.assert_array_equal(inputs["token_topk_to_pos"], plan.token_topk_to_pos)
    routed = plan.pos_to_expert >= 0
    assert np.count_nonzero(routed) == w.routed_rows
    # finite values on the routed rows, zeros on the padding rows (never read)
    rows = inputs["expanded"][routed].astype(np.float32)
    assert np.isfinite(rows).all() and rows.any(axis=1).all()
    assert not inputs["expanded"][~routed].view(np.uint16).any()
    if "topk_weights" in w.shapes:
        weights = inputs["topk_weights"]
        assert weights.dtype == np.float32 and (weights > 0).all()
        np.testing.assert_allclose(weights.sum(axis=1), 1, rtol=1e-5)
    if "row_scale" in w.shapes:
        scale = inputs["row_scale"]
        assert scale.dtype == np.float32 and (0.25 <= scale).all() and (scale <= 4).all()
    # the routing is the plan's, the values the generator's
    again = workload_inputs(w, np.random.default_rng(12345))
    np.testing.assert_array_equal(again["token_topk_to_pos"], inputs["token_topk_to_pos"])
    assert not np.array_equal(again["expanded"], inputs["expanded"])


def test_shapes_text_names_the_plan_and_the_optional_inputs():
    assert runner._shapes_text(WORKLOADS["reduce-dsv3-ep8-small-plan"]) == (
        "T=32 H=7168 K=8 X=3072 plan E=32/256 A=128 routed=34 +topk_weights")
    assert runner._shapes_text(WORKLOADS["reduce-kimi-k2-medium-row-scale"]) == (
        "T=512 H=7168 K=8 X=4096 plan E=384 A=1 routed=4096 +topk_weights +row_scale")
    # fused_mapping's default X (the worst case), not the plan's exact rows
    assert runner._shapes_text(WORKLOADS["reduce-dsv3-ep8-prefill-plan-untrimmed"]) == (
        "T=4096 H=7168 K=8 X=36736 plan E=32/256 A=128 routed=4128 untrimmed +topk_weights")
    assert runner.output_names(WORKLOADS["reduce-kimi-k2-decode"]) == ("out",)


# --- the newer ops' names -----------------------------------------------------------

def test_the_oracle_is_the_family_op_whatever_the_runners_name(monkeypatch):
    from cupy_moe import combine
    monkeypatch.setattr(runner, "reduce_fused", lambda *args, **kwargs: None)
    assert runner.family_op("reduce_fused") is combine.reduce_fused
    assert runner._timed_op("reduce_fused") is not combine.reduce_fused
    assert runner.cpu_quick_max_bytes("reduce_fused") == runner.CPU_QUICK_MAX_COMPUTE_BYTES
    assert runner.cpu_quick_max_bytes("expand_to_fused") == runner.CPU_QUICK_MAX_BYTES


# --- the benchmark on the CPU -------------------------------------------------------

@pytest.mark.parametrize("label", ["reduce-qwen3-30b-a3b-decode", "reduce-dsv3-ep8-small-plan"])
def test_bench_cpu_workload_is_checked_and_timed(label, rng):
    op = needs_op("reduce_fused")
    w = WORKLOADS[label]
    record = runner.bench_cpu_workload(w, 2, rng)
    assert record.status == "ok", record.status
    assert (record.op, record.label, record.bytes) == ("reduce_fused", label, w.bytes)
    assert record.cpu_us > 0 and record.gbps == w.bytes / record.cpu_us / 1e3
    assert all(getattr(record, name) is None for name in GPU_FIELDS + FLOOR_FIELDS + PEER_FIELDS)
    # the oracle is the op on NumPy arrays: [T, H] of expanded's dtype
    host = workload_inputs(w, rng)
    (expected,) = runner.reference_outputs(w, host)
    assert expected.shape == (w.num_tokens, w.hidden) and expected.dtype.name == "bfloat16"
    direct = op(host["expanded"], host["token_topk_to_pos"], host["topk_weights"])
    np.testing.assert_array_equal(expected.view(np.uint16), direct.view(np.uint16))


def corrupted_reduce(op):
    """``reduce_fused`` whose result is wrong in one bit of one element (1, 5)."""
    def wrong(*args, **kwargs):
        return flip_one_bit(op(*args, **kwargs), (1, 5))
    return wrong


def test_a_wrong_cpu_result_is_reported_and_not_timed(rng, monkeypatch):
    op = needs_op("reduce_fused")
    monkeypatch.setattr(runner, "reduce_fused", corrupted_reduce(op))
    record = runner.bench_cpu_workload(WORKLOADS["reduce-qwen3-30b-a3b-small"], 2, rng)
    assert record.status == "MISMATCH out: 1 elements differ, first at (1, 5)"
    assert record.cpu_us is None and record.gbps is None


# --- the GPU benchmark's control flow, on the CPU ------------------------------------

@pytest.fixture
def cpu_torch_backend(monkeypatch):
    """bench_gpu_workload's torch backend with CPU tensors (the op runs its CPU
    path); the graph and eager timers run the call once and give fixed
    figures; the torch peers must not be reached."""
    torch = pytest.importorskip("torch")
    from cupy_moe.runtime.arrays import numpy_to_torch

    timed: list[str] = []

    def graph_us(fn):
        fn()
        timed.append("graph")
        return 0.75

    def eager(fn, calls, sync):
        fn()
        timed.append(f"eager x{calls}")
        return 1.5

    def no_peers(*args, **kwargs):
        raise AssertionError("the newer ops have no torch peers")

    monkeypatch.setattr(runner, "_to_torch", lambda a: numpy_to_torch(np.ascontiguousarray(a)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(runner, "torch_graph_us", graph_us)
    monkeypatch.setattr(runner, "eager_us", eager)
    monkeypatch.setattr(runner, "_time_torch_peers", no_peers)
    return timed


@pytest.mark.parametrize("kernel_only", [False, True])
def test_bench_gpu_workload_times_with_out_and_has_no_peer(cpu_torch_backend, kernel_only, rng,
                                                           monkeypatch):
    op = needs_op("reduce_fused")
    passed: list[tuple[str, ...]] = []

    def recording(*args, **kwargs):
        passed.append(tuple(sorted(kwargs)))
        return op(*args, **kwargs)
    monkeypatch.setattr(runner, "reduce_fused", recording)
    w = WORKLOADS["reduce-dsv3-ep8-small-plan"]
    timer = FakeTimer(memset=False)
    record = runner.bench_gpu_workload(w, timer, "torch", 5, 3.0, rng, kernel_only=kernel_only)
    assert record.status == "ok", record.status
    assert timer.calls == [("median_us", 5), ("copy_us", w.bytes // 2, 5)]
    assert (record.gpu_us, record.copy_same_bytes_us) == (4.0, 2.5)
    assert record.gbps == w.bytes / 4.0 / 1e3
    assert record.pct_copy_roofline == 100 * record.gbps / 3.0e3
    assert record.graph_us == 0.75  # under GRAPH_MAX_BYTES
    # checked and allocated without out=; timed (and graphed) with it
    assert passed[:3] == [("row_scale",)] * 2 + [("out", "row_scale")]
    if kernel_only:
        assert cpu_torch_backend == ["graph"] and record.eager_us is None
    else:
        assert cpu_torch_backend == ["eager x100", "graph"] and record.eager_us == 1.5
    assert all(getattr(record, name) is None for name in FLOOR_FIELDS + PEER_FIELDS)
    assert record.cpu_us is None and record.extra == {}


def test_a_wrong_gpu_result_is_reported_and_not_timed(cpu_torch_backend, rng, monkeypatch):
    op = needs_op("reduce_fused")
    monkeypatch.setattr(runner, "reduce_fused", corrupted_reduce(op))
    timer = FakeTimer(memset=False)
    record = runner.bench_gpu_workload(WORKLOADS["reduce-kimi-k2-small"], timer, "torch", 5,
                                       3.0, rng)
    assert record.status == "MISMATCH out: 1 elements differ, first at (1, 5)"
    assert timer.calls == [] and cpu_torch_backend == []
    assert all(getattr(record, name) is None for name in GPU_FIELDS + FLOOR_FIELDS)


def test_the_gpu_table_row_of_a_reduce_record(cpu_torch_backend, rng):
    needs_op("reduce_fused")
    w = WORKLOADS["reduce-qwen3-30b-a3b-decode"]
    record = asdict(runner.bench_gpu_workload(w, FakeTimer(memset=False), "torch", 5, 3.0, rng))
    result = {"date": "2026-01-01", "backend": "torch", "iters": 5, "quick": False,
              "versions": {}, "copy_tbps": 3.0, "device": "a GPU", "records": [record],
              "notes": []}
    gbps = w.bytes / 4.0 / 1e3
    assert report.table_lines(result)[2] == (
        f"| reduce | {w.label} | T=1 H=2048 K=8 X=8 plan E=128 A=1 routed=8 +topk_weights "
        f"| {w.bytes / 1e6:.2f} | 4.0 | {gbps:.0f} | {100 * gbps / 3.0e3:.1f} | - | 2.5 | 62.5 "
        "| - | 1.5 | - | 0.75 | - | - | - | - |")
