"""The routing plan (``fused_mapping``) in the benchmark harness: its inputs,
its oracle, the CPU benchmark, the GPU benchmark's control flow (with CPU
stand-ins for the device and the timers), and its rows in the report."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
from helpers import assert_bits_equal
from mapping_cases import loop_mapping

import cupy_moe
from cupy_moe.harness import report, runner
from cupy_moe.harness.inputs import TOPK_DROP, random_topk_ids, workload_inputs
from cupy_moe.harness.manifest import load_workloads
from cupy_moe.mapping import worst_case_rows

pytestmark = pytest.mark.smoke

WORKLOADS = load_workloads("fused_mapping")
FIELDS = cupy_moe.FusedMapping._fields
# GPU figures a CPU record leaves empty, and the torch peers' figures, which
# fused_mapping's records leave empty on every backend
GPU_FIELDS = ("gpu_us", "pct_copy_roofline", "copy_same_bytes_us", "eager_us", "graph_us")
# the expand ops' copy + memset floor: empty for fused_mapping on every backend
FLOOR_FIELDS = ("zero_bytes", "memset_zero_us", "copy_routed_us", "pct_copy_memset_model")
PEER_FIELDS = ("index_select_eager_us", "torch_ref_us", "torch_nosync_us", "speedup_vs_ref",
               "speedup_vs_nosync")


def workload(label: str):
    (found,) = [w for w in WORKLOADS if w.label == label]
    return found


# --- inputs ---------------------------------------------------------------------

def test_random_topk_ids_are_uniform_experts_with_a_few_dropped():
    topk_ids = random_topk_ids(np.random.default_rng(7), 8192, 8, 384)
    assert topk_ids.shape == (8192, 8) and topk_ids.dtype == np.int64
    assert topk_ids.min() == -1 and topk_ids.max() == 383
    assert set(np.unique(topk_ids).tolist()) == {-1, *range(384)}
    dropped = np.count_nonzero(topk_ids == -1) / topk_ids.size
    assert TOPK_DROP == 0.02 and 0.015 < dropped < 0.025
    # every expert gets about its share of the routed slots (65536 * 0.98 / 384 ~ 167)
    counts = np.bincount(topk_ids[topk_ids >= 0], minlength=384)
    assert 100 < counts.min() and counts.max() < 250


def test_random_topk_ids_follow_the_generator_and_the_arguments():
    first = random_topk_ids(np.random.default_rng(3), 64, 4, 16)
    assert np.array_equal(first, random_topk_ids(np.random.default_rng(3), 64, 4, 16))
    assert not np.array_equal(first, random_topk_ids(np.random.default_rng(4), 64, 4, 16))
    narrow = random_topk_ids(np.random.default_rng(3), 64, 4, 16, dtype="int32")
    assert narrow.dtype == np.int32 and np.array_equal(narrow, first)
    assert (random_topk_ids(np.random.default_rng(3), 64, 4, 16, drop=0.0) >= 0).all()
    assert (random_topk_ids(np.random.default_rng(3), 64, 4, 16, drop=1.0) == -1).all()
    assert random_topk_ids(np.random.default_rng(3), 0, 8, 16).shape == (0, 8)


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.label)
def test_workload_inputs_are_the_ids_of_the_workload(w, rng):
    inputs = workload_inputs(w, rng)
    assert list(inputs) == ["topk_ids"]
    topk_ids = inputs["topk_ids"]
    assert topk_ids.shape == (w.num_tokens, w.top_k) and topk_ids.dtype == np.int64
    assert -1 <= topk_ids.min() and topk_ids.max() < w.num_experts


# --- the oracle and the op, as the runner calls them ---------------------------

@pytest.mark.parametrize("label", ["mapping-decode", "mapping-small", "mapping-medium"])
def test_reference_outputs_match_the_loop_oracle(label, rng):
    w = workload(label)
    host = workload_inputs(w, rng)
    expected = runner.reference_outputs(w, host)
    assert isinstance(expected, cupy_moe.FusedMapping)
    oracle = loop_mapping(host["topk_ids"], w.num_experts, w.alignment, w.num_expanded)
    for name, got, want in zip(FIELDS, expected, oracle, strict=True):
        assert_bits_equal(got, want, name)


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.label)
def test_the_timed_call_gives_the_oracle_bit_for_bit(w, rng):
    host = workload_inputs(w, rng)
    got = runner._call(w, host)
    expected = runner.reference_outputs(w, host)
    assert runner.output_names(w) == FIELDS
    assert [a.shape for a in got] == [(w.num_tokens, w.top_k)] + [(w.num_expanded,)] * 3 + [
        (w.num_experts,)] * 3
    for name, a, b in zip(FIELDS, got, expected, strict=True):
        assert_bits_equal(a, b, name)
    assert runner._mismatch(got, expected, np.asarray, FIELDS) is None
    # X is the op's default: the worst case, as the manifest says
    assert w.num_expanded == worst_case_rows(w.num_tokens * w.top_k, w.num_experts, w.alignment)


def test_mismatch_names_the_field_and_the_first_wrong_element(rng):
    w = workload("mapping-small")
    expected = runner.reference_outputs(w, workload_inputs(w, rng))
    results = list(expected)
    results[5] = expected.expert_end.copy()
    results[5][[7, 9]] += 1
    assert runner._mismatch(results, expected, np.asarray, FIELDS) == (
        "expert_end: 2 elements differ, first at (7,)")
    results = list(expected)
    results[2] = expected.pos_to_token[:-1]
    assert runner._mismatch(results, expected, np.asarray, FIELDS) == (
        f"pos_to_token: shape ({w.num_expanded - 1},) != ({w.num_expanded},)")
    results = list(expected)
    results[6] = expected.tokens_per_expert.astype(np.int64)
    assert runner._mismatch(results, expected, np.asarray, FIELDS) == (
        "tokens_per_expert: dtype int64 != int32")
    assert runner._mismatch(expected[:6], expected, np.asarray, FIELDS) == (
        "6 outputs, expected 7")


# --- the CPU benchmark ------------------------------------------------------------

@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.label)
def test_bench_cpu_workload_times_a_bit_exact_plan(w, rng):
    record = runner.bench_cpu_workload(w, 2, rng)
    assert record.status == "ok", record.status
    assert (record.op, record.label, record.bytes) == ("fused_mapping", w.label, w.bytes)
    assert record.shapes == (f"T={w.num_tokens} K=8 E={w.num_experts} A=128 "
                             f"X={w.num_expanded} int64")
    assert record.cpu_us > 0 and record.gbps == w.bytes / record.cpu_us / 1e3
    assert all(getattr(record, name) is None for name in GPU_FIELDS + PEER_FIELDS + FLOOR_FIELDS)
    assert record.extra == {}


def test_bench_cpu_workload_reports_a_wrong_plan_and_does_not_time_it(rng, monkeypatch):
    def off_by_one(topk_ids, num_experts, **kwargs):
        plan = cupy_moe.fused_mapping(topk_ids, num_experts, **kwargs)
        return plan._replace(tokens_per_expert=plan.tokens_per_expert + (
            np.arange(num_experts) == 3))
    monkeypatch.setattr(runner, "fused_mapping", off_by_one)
    record = runner.bench_cpu_workload(workload("mapping-medium"), 2, rng)
    assert record.status == "MISMATCH tokens_per_expert: 1 elements differ, first at (3,)"
    assert record.cpu_us is None and record.gbps is None


# --- the GPU benchmark's control flow, on the CPU ----------------------------------

class FakeTimer:
    """GpuTimer's interface: runs each function once, returns fixed figures."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def median_us(self, fn, iters, *, flush=True):
        self.calls.append(("median_us", iters, flush, type(fn())))
        return 4.0

    def copy_us(self, nbytes, iters):
        self.calls.append(("copy_us", nbytes, iters))
        return 2.5


@pytest.fixture
def cpu_torch_backend(monkeypatch):
    """bench_gpu_workload's torch backend with CPU tensors: the op runs its CPU
    path; the graph and eager timers run the call once and return fixed figures;
    the torch peers must not be reached."""
    torch = pytest.importorskip("torch")
    from cupy_moe.runtime.arrays import numpy_to_torch

    timed: list[str] = []

    def graph_us(fn):
        timed.append(f"graph {type(fn()).__name__}")
        return 0.75

    def eager(fn, calls, sync):
        timed.append(f"eager {type(fn()).__name__} x{calls}")
        sync()
        return 1.5

    def no_peers(*args, **kwargs):
        raise AssertionError("fused_mapping has no torch peers")

    monkeypatch.setattr(runner, "_to_torch", lambda a: numpy_to_torch(np.ascontiguousarray(a)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(runner, "torch_graph_us", graph_us)
    monkeypatch.setattr(runner, "eager_us", eager)
    monkeypatch.setattr(runner, "_time_torch_peers", no_peers)
    return timed


@pytest.mark.parametrize("kernel_only", [False, True])
def test_bench_gpu_workload_fills_the_gpu_figures_and_no_peer(cpu_torch_backend, kernel_only,
                                                              rng):
    w = workload("mapping-prefill-e256")
    timer = FakeTimer()
    record = runner.bench_gpu_workload(w, timer, "torch", 5, 3.0, rng, kernel_only=kernel_only)
    assert record.status == "ok", record.status
    # the plain call is timed (no out=), and what it returns is the plan
    assert timer.calls == [("median_us", 5, True, cupy_moe.FusedMapping),
                           ("copy_us", w.bytes // 2, 5)]
    assert record.gpu_us == 4.0
    assert record.gbps == w.bytes / 4.0 / 1e3
    assert record.pct_copy_roofline == 100 * record.gbps / 3.0e3
    assert record.copy_same_bytes_us == 2.5
    assert record.graph_us == 0.75  # every mapping workload is small enough for a graph
    if kernel_only:
        assert cpu_torch_backend == ["graph FusedMapping"]
        assert record.eager_us is None
    else:
        assert cpu_torch_backend == ["eager FusedMapping x100", "graph FusedMapping"]
        assert record.eager_us == 1.5
    assert all(getattr(record, name) is None for name in PEER_FIELDS + FLOOR_FIELDS)
    assert record.cpu_us is None and record.extra == {}


def test_bench_gpu_workload_reports_a_wrong_plan_and_does_not_time_it(cpu_torch_backend, rng,
                                                                      monkeypatch):
    def shifted(topk_ids, num_experts, **kwargs):
        plan = cupy_moe.fused_mapping(topk_ids, num_experts, **kwargs)
        return plan._replace(pos_to_token_topk=plan.pos_to_token_topk.roll(1))
    monkeypatch.setattr(runner, "fused_mapping", shifted)
    timer = FakeTimer()
    record = runner.bench_gpu_workload(workload("mapping-decode"), timer, "torch", 5, 3.0, rng)
    # decode: 8 routed slots at most, the rest of the 1024 rows padding
    assert record.status.startswith("MISMATCH pos_to_token_topk: ")
    assert record.status.endswith(" elements differ, first at (0,)")
    assert timer.calls == [] and cpu_torch_backend == []
    assert all(getattr(record, name) is None for name in GPU_FIELDS + PEER_FIELDS)


# --- the report --------------------------------------------------------------------

def gpu_result(records) -> dict:
    return {"date": "2026-01-01", "backend": "torch", "iters": 5, "quick": False,
            "versions": {}, "copy_tbps": 3.0, "device": "a GPU", "records": records,
            "notes": []}


def test_gpu_table_shows_the_mapping_row_with_empty_peer_columns(cpu_torch_backend, rng):
    w = workload("mapping-decode")
    record = runner.bench_gpu_workload(w, FakeTimer(), "torch", 5, 3.0, rng)
    failed = asdict(runner.Record(w.op, "mapping-small", "T=32", 399_360,
                                  status="MISMATCH expert_end: 1 elements differ, first at (0,)"))
    lines = report.table_lines(gpu_result([asdict(record), failed]))
    assert lines[0].startswith("| op | workload | shapes | MB | GPU us |")
    gbps = w.bytes / 4.0 / 1e3
    # no copy + memset floor for the routing plan: "% copy+memset", "copy+memset us" are "-"
    assert lines[2] == (f"| mapping | mapping-decode | T=1 K=8 E=384 A=128 X=1024 int64 | 0.02 "
                        f"| 4.0 | {gbps:.0f} | {100 * gbps / 3.0e3:.1f} | - | 2.5 | 62.5 | - | 1.5 "
                        "| - | 0.75 | - | - | - | - |")
    assert lines[3] == ("| mapping | mapping-small | T=32 | 0.40 | MISMATCH expert_end: 1 "
                        "elements differ, first at (0,) |" + "  |" * 13)
    assert len(lines) == 4


def test_cpu_table_and_plot_of_mapping_records(rng, tmp_path):
    records = [asdict(runner.bench_cpu_workload(workload("mapping-decode"), 1, rng))]
    result = {**gpu_result(records), "backend": "cpu", "copy_tbps": None}
    lines = report.table_lines(result)
    assert lines[2].startswith("| mapping | mapping-decode | T=1 K=8 E=384 A=128 X=1024 int64 "
                               "| 0.02 | ")
    assert report.summary_lines(result) == [
        "cupy-moe bench: a GPU, backend cpu, 2026-01-01, median of 5 iterations"]
    pytest.importorskip("matplotlib")
    report.write_plot(result, str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").stat().st_size > 0
