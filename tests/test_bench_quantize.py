"""The fp8 producers (``quantize_fp8``, ``swiglu_quantize_fp8``) in the
benchmark harness: their inputs, their records on the CPU backend, the GPU
benchmark's control flow (CPU stand-ins for the device and the timers) with
``out=`` and ``out_sf=`` in every scale-factor layout, and the bit-exact check
catching a wrong code or scale factor. The ops' own contract is tested by
tests/test_quantize_*.py and tests/test_swiglu_*.py; here it is the harness.

Tests that run an op skip while ``cupy_moe.quantize`` has no such op (the
family is written beside the harness; issue 14).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
from bench_cases import FakeTimer

from cupy_moe.harness import report, runner
from cupy_moe.harness.inputs import plan_mapping, workload_inputs
from cupy_moe.harness.manifest import load_workloads

pytestmark = pytest.mark.smoke

WORKLOADS = {w.label: w for op in ("quantize_fp8", "swiglu_quantize_fp8")
             for w in load_workloads(op)}
GPU_FIELDS = ("gpu_us", "pct_copy_roofline", "copy_same_bytes_us", "eager_us", "graph_us")
FLOOR_FIELDS = ("zero_bytes", "memset_zero_us", "copy_routed_us", "pct_copy_memset_model")
PEER_FIELDS = ("index_select_eager_us", "torch_ref_us", "torch_nosync_us", "speedup_vs_ref",
               "speedup_vs_nosync")
# one small workload of each op and scale-factor layout
SMALL = ["quant-kimi-k2-decode-row-major", "quant-kimi-k2-decode-col-major",
         "quant-kimi-k2-decode-packed", "swiglu-qwen3-30b-a3b-decode-e128-plan-col-major",
         "swiglu-dsv3-ep8-decode-plan-col-major"]


def needs_op(op_name: str):
    """The newer op's function (from its family package)."""
    return runner.family_op(op_name)


def flip_one_bit(result, index):
    """``result`` (NumPy array or CPU tensor, any strides) with the lowest bit
    of one element flipped, in place."""
    if isinstance(result, np.ndarray):
        result.view(f"u{result.itemsize}")[index] ^= 1
        return result
    import torch
    bits = {1: torch.uint8, 4: torch.int32}[result.element_size()]
    result.view(bits)[index] ^= 1
    return result


# --- inputs ---------------------------------------------------------------------

def test_quantize_inputs_are_finite_rows_of_varied_magnitude(rng):
    w = WORKLOADS["quant-qwen3-30b-a3b-medium-packed"]
    inputs = workload_inputs(w, rng)
    assert list(inputs) == ["x"]
    x = inputs["x"]
    assert x.shape == (512, 2048) and x.dtype.name == "bfloat16"
    amax = np.abs(x.astype(np.float32)).max(axis=1)
    assert np.isfinite(amax).all()
    # rows from 2^-8 to 2^8 of a standard normal: the scale factors spread
    assert amax.max() / amax.min() > 2 ** 8
    assert not np.array_equal(x, workload_inputs(w, np.random.default_rng(3))["x"])


@pytest.mark.parametrize("label", ["swiglu-qwen3-30b-a3b-decode-e128-plan-col-major",
                                   "swiglu-dsv3-ep8-small-plan-col-major"])
def test_swiglu_inputs_are_the_plans_rows(label, rng):
    w = WORKLOADS[label]
    inputs = workload_inputs(w, rng)
    assert list(inputs) == ["h", "topk_weights", "pos_to_token_topk", "pos_to_expert"]
    for name, array in inputs.items():
        assert array.shape == w.shapes[name], name
    plan = plan_mapping(w)
    np.testing.assert_array_equal(inputs["pos_to_token_topk"], plan.pos_to_token_topk)
    np.testing.assert_array_equal(inputs["pos_to_expert"], plan.pos_to_expert)
    routed = plan.pos_to_expert >= 0
    assert np.count_nonzero(routed) == w.routed_rows
    h = inputs["h"]
    assert h.dtype.name == "bfloat16" and h.shape[1] == 2 * w.hidden
    assert h[routed].view(np.uint16).any(axis=1).all() and not h[~routed].view(np.uint16).any()
    weights = inputs["topk_weights"]
    assert weights.dtype == np.float32 and (weights > 0).all()
    # every routed row's slot points into the weights
    slots = inputs["pos_to_token_topk"][routed]
    assert (0 <= slots).all() and (slots < weights.size).all()


def test_shapes_text_names_the_scale_factors():
    assert runner._shapes_text(WORKLOADS["quant-kimi-k2-medium-npc32-row-major"]) == (
        "T=512 H=7168 npc=32 S=224 float32/row")
    assert runner._shapes_text(WORKLOADS["quant-qwen3-30b-a3b-prefill-packed"]) == (
        "T=4096 H=2048 npc=128 S=4 int32/col")
    assert runner._shapes_text(WORKLOADS["swiglu-dsv3-ep8-small-plan-col-major"]) == (
        "T=32 I=2048 K=8 X=3072 npc=128 plan E=32/256 A=128 routed=34 S=16 float32/col "
        "+topk_weights +pos_to_expert")
    assert runner.output_names(WORKLOADS["quant-kimi-k2-decode-packed"]) == ("x_fp8", "x_sf")
    assert runner.output_names(WORKLOADS[SMALL[3]]) == ("y_fp8", "y_sf")


# --- the benchmark on the CPU -------------------------------------------------------

@pytest.mark.parametrize("label", SMALL)
def test_bench_cpu_workload_is_checked_and_timed(label, rng):
    w = WORKLOADS[label]
    needs_op(w.op)
    record = runner.bench_cpu_workload(w, 1, rng)
    assert record.status == "ok", record.status
    assert (record.op, record.label, record.bytes) == (w.op, label, w.bytes)
    assert record.cpu_us > 0 and record.gbps == w.bytes / record.cpu_us / 1e3
    assert all(getattr(record, name) is None for name in GPU_FIELDS + FLOOR_FIELDS + PEER_FIELDS)
    # the oracle's outputs: e4m3 codes, and the SF in the workload's layout
    codes, sf = runner.reference_outputs(w, workload_inputs(w, rng))
    rows = w.num_tokens if w.op == "quantize_fp8" else w.num_expanded
    assert codes.shape == (rows, w.hidden) and codes.itemsize == 1
    assert sf.shape == (rows, w.sf_columns) and sf.dtype.name == w.sf_dtype
    if w.use_tma_aligned_col_major_sf:
        assert sf.strides[0] == sf.itemsize  # the transposed view of [S, align(rows, 4)]


def corrupted(op, output: int, index):
    """``op`` whose result is wrong in one bit of element ``index`` of output
    ``output`` (0: the codes, 1: the scale factors)."""
    def wrong(*args, **kwargs):
        results = op(*args, **kwargs)
        flip_one_bit(results[output], index)
        return results
    return wrong


@pytest.mark.parametrize(("label", "output", "message"), [
    ("quant-kimi-k2-decode-row-major", 0, "x_fp8: 1 elements differ, first at (0, 9)"),
    ("quant-kimi-k2-decode-col-major", 1, "x_sf: 1 elements differ, first at (0, 9)"),
    ("swiglu-qwen3-30b-a3b-decode-e128-plan-col-major", 1,
     "y_sf: 1 elements differ, first at (0, 3)"),
])
def test_a_wrong_cpu_result_is_reported_and_not_timed(label, output, message, rng, monkeypatch):
    w = WORKLOADS[label]
    op = needs_op(w.op)
    index = (0, 3) if w.op == "swiglu_quantize_fp8" else (0, 9)
    monkeypatch.setattr(runner, w.op, corrupted(op, output, index))
    record = runner.bench_cpu_workload(w, 1, rng)
    assert record.status == f"MISMATCH {message}"
    assert record.cpu_us is None and record.gbps is None


# --- the GPU benchmark's control flow, on the CPU ------------------------------------

@pytest.fixture
def cpu_torch_backend(monkeypatch):
    """bench_gpu_workload's torch backend with CPU tensors (the op runs its CPU
    path); the graph and eager timers run the call once and give fixed
    figures; the torch peers must not be reached."""
    torch = pytest.importorskip("torch")
    from cupy_moe.runtime.arrays import numpy_to_torch

    def no_peers(*args, **kwargs):
        raise AssertionError("the newer ops have no torch peers")

    monkeypatch.setattr(runner, "_to_torch", lambda a: numpy_to_torch(np.ascontiguousarray(a)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(runner, "torch_graph_us", lambda fn: (fn(), 0.75)[1])
    monkeypatch.setattr(runner, "eager_us", lambda fn, calls, sync: (fn(), 1.5)[1])
    monkeypatch.setattr(runner, "_time_torch_peers", no_peers)


@pytest.mark.parametrize("label", SMALL)
def test_bench_gpu_workload_times_with_out_and_out_sf(cpu_torch_backend, label, rng,
                                                      monkeypatch):
    w = WORKLOADS[label]
    op = needs_op(w.op)
    outputs: list[tuple] = []

    def recording(*args, **kwargs):
        results = op(*args, **kwargs)
        if "out" in kwargs:  # the op wrote the buffers it was given
            assert results[0] is kwargs["out"] and results[1] is kwargs["out_sf"]
        outputs.append(("out" in kwargs, "out_sf" in kwargs))
        return results
    monkeypatch.setattr(runner, w.op, recording)
    timer = FakeTimer(memset=False)
    record = runner.bench_gpu_workload(w, timer, "torch", 5, 3.0, rng)
    assert record.status == "ok", record.status
    assert timer.calls == [("median_us", 5), ("copy_us", w.bytes // 2, 5)]
    assert (record.gpu_us, record.copy_same_bytes_us, record.eager_us) == (4.0, 2.5, 1.5)
    assert record.graph_us == 0.75 and record.gbps == w.bytes / 4.0 / 1e3
    # the check and the allocating call without out=; the GPU-timed call with
    # both (the column-major SF buffers too), the eager one without (a user's
    # call, allocation included), the graphed one with both
    assert outputs == [(False, False), (False, False), (True, True), (False, False),
                       (True, True)]
    assert all(getattr(record, name) is None for name in FLOOR_FIELDS + PEER_FIELDS)
    assert record.cpu_us is None and record.extra == {}


def test_a_wrong_gpu_result_is_reported_and_not_timed(cpu_torch_backend, rng, monkeypatch):
    w = WORKLOADS["quant-kimi-k2-decode-packed"]
    op = needs_op(w.op)
    monkeypatch.setattr(runner, w.op, corrupted(op, 1, (0, 13)))
    timer = FakeTimer(memset=False)
    record = runner.bench_gpu_workload(w, timer, "torch", 5, 3.0, rng)
    assert record.status == "MISMATCH x_sf: 1 elements differ, first at (0, 13)"
    assert timer.calls == []
    assert all(getattr(record, name) is None for name in GPU_FIELDS)


def test_the_cpu_table_rows_of_the_fp8_producers(rng):
    records = []
    for label in SMALL[2:4]:
        w = WORKLOADS[label]
        needs_op(w.op)
        records.append(asdict(runner.bench_cpu_workload(w, 1, rng)))
    result = {"date": "2026-01-01", "backend": "cpu", "iters": 1, "quick": True,
              "versions": {}, "copy_tbps": None, "device": "x86_64", "records": records,
              "notes": []}
    lines = report.table_lines(result)
    assert lines[2].startswith("| quant | quant-kimi-k2-decode-packed | T=1 H=7168 npc=128 S=14 "
                               "int32/col | 0.02 | ")
    assert lines[3].startswith(f"| swiglu | {SMALL[3]} | T=1 I=768 K=8 X=1024 npc=128 plan "
                               "E=128 A=128 routed=8 S=6 float32/col +topk_weights "
                               "+pos_to_expert | 0.84 | ")


# --- SwiGLU with zero_padding=False and the plan's hint (the -unzeroed entries) ------

UNZEROED = "swiglu-dsv3-ep8-decode-plan-col-major-unzeroed"


def test_unzeroed_workloads_pass_the_flag_and_the_hint(rng, monkeypatch):
    """The call gets zero_padding=False and the plan's token_topk_to_pos; the
    result is checked on the live rows only (the padding rows of a fresh
    output hold anything), and the record is timed."""
    w = WORKLOADS[UNZEROED]
    assert not w.zero_padding and w.shapes["token_topk_to_pos"] == (1, 8)
    op = needs_op(w.op)
    host = workload_inputs(w, rng)
    assert np.array_equal(host["token_topk_to_pos"], plan_mapping(w).token_topk_to_pos)
    seen = []

    def spy(*args, **kwargs):
        seen.append((kwargs["zero_padding"], kwargs["token_topk_to_pos"] is not None))
        codes, sf = op(*args, **kwargs)
        # garbage in every padding row, as a kernel may leave them
        live = runner.compared_rows(w, host)
        np.asarray(codes).view(np.uint8)[~live] = 0xA5
        return codes, sf

    monkeypatch.setattr(runner, w.op, spy)
    record = runner.bench_cpu_workload(w, 1, rng)
    assert record.status == "ok" and record.cpu_us > 0
    assert seen and set(seen) == {(False, True)}


def test_unzeroed_workloads_still_catch_a_wrong_live_row(rng, monkeypatch):
    w = WORKLOADS[UNZEROED]
    host = workload_inputs(w, rng)
    live = runner.compared_rows(w, host)
    # the plan's live rows: its routed rows, the only ones compared
    assert live.sum() == w.routed_rows and live.shape == (w.num_expanded,)
    first_live = int(np.flatnonzero(live)[0])
    monkeypatch.setattr(runner, w.op, corrupted(needs_op(w.op), 0, (first_live, 3)))
    record = runner.bench_cpu_workload(w, 1, rng)
    # reported among the compared rows: the first live row is row 0 of them
    assert record.status == "MISMATCH y_fp8: 1 elements differ, first at (0, 3)"


def test_compared_rows_are_every_row_but_for_unzeroed_swiglu(rng):
    for label in ("quant-kimi-k2-decode-row-major",
                  "swiglu-dsv3-ep8-decode-plan-col-major"):
        w = WORKLOADS[label]
        assert runner.compared_rows(w, workload_inputs(w, rng)) is None
