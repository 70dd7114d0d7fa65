"""Units of cupy_moe/runtime/, interop.py and harness/ on the CPU: the kernel
cache's and the module table's keys, torch_fields of CUDA tensors, the
DLPack carrier of uint16, the rooflines' and timings' arithmetic, the CLI's
iteration counts, the GPU overlap test's pad columns. Each was seen to fail
on a one-line change that the other tests let through (the loader test
needs NVRTC, as test_nvrtc_compile.py)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch


def test_the_kernel_cache_keys_the_target_architecture(tmp_path, monkeypatch):
    """Two targets of one source and defines are two cached binaries (a
    cache shared by machines with different GPUs must not hand one's cubin
    to the other)."""
    from cupy_moe.runtime import loader
    from helpers import nvrtc_or_skip

    nvrtc_or_skip()
    monkeypatch.setenv("CUPY_MOE_CACHE_DIR", str(tmp_path))
    sm80 = loader._compile("mapping.cu", (), "sm_80", True)
    sm90 = loader._compile("mapping.cu", (), "sm_90", True)
    assert sm80 != sm90
    assert sm80.read_bytes() != sm90.read_bytes()


def test_a_module_is_loaded_once_per_device(monkeypatch):
    """get_module keys its modules by device too: a module loaded on device
    0 is not handed to device 1 (its functions live in device 0's context)."""
    from cupy_moe.runtime import loader

    loaded = []

    class FakeRawModule:
        def __init__(self, path):
            loaded.append(path)

    fake_cupy = types.SimpleNamespace(RawModule=FakeRawModule)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(loader, "_modules", {})
    monkeypatch.setattr(loader, "device_target", lambda device: ("sm_90", True))
    monkeypatch.setattr(loader, "_compile", lambda *args: "/nowhere/mapping.cubin")
    first = loader.get_module("mapping.cu", (), 0)
    second = loader.get_module("mapping.cu", (), 1)
    assert first is not second and len(loaded) == 2
    assert loader.get_module("mapping.cu", (), 1) is second and len(loaded) == 2


class _AsCuda:
    """A CPU tensor that says it is on cuda:0 (torch_fields' CUDA branch
    reads these attributes only)."""

    def __init__(self, tensor):
        self._tensor = tensor
        self.is_cuda = True
        self.shape, self.dtype, self.requires_grad = tensor.shape, tensor.dtype, tensor.requires_grad

    def get_device(self):
        return 0

    def is_contiguous(self):
        return self._tensor.is_contiguous()


@pytest.mark.parametrize("make", [lambda x: x, lambda x: x.t(), lambda x: x.requires_grad_(True)],
                         ids=["contiguous", "transposed", "requires-grad"])
def test_torch_fields_of_a_cuda_tensor_are_those_of_a_cpu_one(make):
    """The CUDA branch of torch_fields (the fast path's key and describe's
    fields) reads contiguity and grad as the CPU branch does: a transposed
    CUDA tensor is not contiguous (else the rules and the fast path would
    take it as C order)."""
    from cupy_moe.runtime.arrays import ArrayKind, torch_fields

    tensor = make(torch.zeros(4, 6))
    cpu = torch_fields("x", tensor)
    cuda = torch_fields("x", _AsCuda(tensor))
    assert cuda[0] is ArrayKind.TORCH_CUDA and cuda[3] == 0
    assert cuda[1:3] + cuda[4:] == cpu[1:3] + cpu[4:]


def test_as_torch_hands_uint16_to_dlpack_through_its_int16_carrier(monkeypatch):
    """as_torch of a uint16 CuPy array (bfloat16 bits) goes through int16,
    a DLPack type every torch release takes, then views the bits as the
    target dtype."""
    from cupy_moe import interop

    class FakeArray:
        def __init__(self, dtype):
            self.dtype = np.dtype(dtype)
            self.itemsize = self.dtype.itemsize

        def view(self, dtype):
            return FakeArray(dtype)

    exported = []

    def from_dlpack(array):
        exported.append(array.dtype)
        return torch.zeros(3, dtype=getattr(torch, array.dtype.name))

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=FakeArray))
    monkeypatch.setattr(torch, "from_dlpack", from_dlpack)
    assert interop.as_torch(FakeArray("uint16"), dtype="bfloat16").dtype == torch.bfloat16
    assert interop.as_torch(FakeArray("uint16")).dtype == torch.uint16
    assert exported == [np.dtype("int16"), np.dtype("int16")]


def test_swiglu_roofline_by_slot_reads_the_routed_rows_only():
    """zero_padding off with the token_topk_to_pos hint and no pos_to_expert:
    the slots name their rows, so R rows of h are read (not X)."""
    from cupy_moe.harness.rooflines import swiglu_quantize_fp8_bytes

    X, I, T, K, R, S, e = 100, 256, 8, 4, 30, 2, 2
    shapes = {"h": (X, 2 * I), "topk_weights": (T, K), "pos_to_token_topk": (X,),
              "token_topk_to_pos": (T, K)}
    got = swiglu_quantize_fp8_bytes(shapes, e, routed_rows=R, sf_columns=S, zero_padding=False)
    assert got == R * 2 * I * e + R * I + 4 * R * S + 4 * T * K + 4 * R


def test_copy_bandwidth_counts_the_bytes_read_and_written():
    from cupy_moe.harness.timing import GpuTimer

    timer = GpuTimer.__new__(GpuTimer)            # no GPU: only copy_us is needed
    timer.copy_us = lambda nbytes, iters: 10.0    # 1 MB in 10 us
    assert timer.copy_tbps(10**6, 5) == pytest.approx(2 * 10**6 / 10.0 / 1e6)


def test_interleaved_medians_take_the_runs_in_turn_each_flushed():
    """medians_interleaved_us: a warm-up of each, then run i of every
    function before run i + 1 of any, each run flushed and between its own
    two events; each function's median of its own runs."""
    from types import SimpleNamespace

    from cupy_moe.harness.timing import GpuTimer

    log, clock = [], [0.0]

    class Event:
        def record(self):
            self.at = clock[0]
            log.append("event")

        def synchronize(self):
            pass

    def elapsed_ms(start, end):
        return end.at - start.at

    timer = GpuTimer.__new__(GpuTimer)  # no GPU: fake events and a fake clock
    timer.cupy = SimpleNamespace(cuda=SimpleNamespace(Event=Event, get_elapsed_time=elapsed_ms))
    timer.flush_l2 = lambda: log.append("flush")
    timer.spin = lambda: log.append("spin")

    def op(name, costs):
        def run():
            log.append(name)
            clock[0] += costs.pop(0)
        return run

    # ms per run (the first is the warm-up); medians of the timed runs: 2 and 5
    a = op("a", [100.0, 1.0, 2.0, 3.0])
    b = op("b", [100.0, 5.0, 9.0, 4.0])
    assert timer.medians_interleaved_us([a, b], 3, hide_host=True) == [2000.0, 5000.0]
    run = ["flush", "spin", "event", None, "event"]
    assert log == ["a", "b"] + [name if step is None else step
                                for _ in range(3) for name in "ab" for step in run]
    log.clear()
    assert timer.medians_interleaved_us([], 3) == [] and log == []  # nothing to time


def test_eager_us_is_the_time_per_call(monkeypatch):
    """Each call takes 2 us of a fake clock: 2 us a call, whatever the
    numbers of calls and rounds."""
    from cupy_moe.harness import timing

    clock = [0.0]

    def call():
        clock[0] += 2e-6

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    assert timing.eager_us(call, calls=10, sync=lambda: None, rounds=3) == pytest.approx(2.0)


def test_bench_quick_times_ten_iterations_and_a_full_run_fifty(monkeypatch, capsys):
    from cupy_moe.harness import cli, runner

    seen = []

    def fake_run(ops, labels, backend, iters, quick, **kwargs):
        seen.append((iters, quick))
        return {"device": "cpu", "backend": "cpu", "date": "today", "iters": iters,
                "copy_tbps": None, "notes": [], "records": []}

    monkeypatch.setattr(runner, "run", fake_run)
    assert cli.main(["bench", "--quick", "--backend", "cpu"]) == 0
    assert cli.main(["bench", "--backend", "cpu"]) == 0
    assert cli.main(["bench", "--backend", "cpu", "--iters", "3"]) == 0
    assert seen == [(10, True), (50, False), (3, False)]


def test_gpu_overlap_counts_the_pad_columns_written_past_the_view():
    """On the GPU (address ranges), an output's written extent past its view
    (the column-major SF's pad columns) overlaps an input lying there."""
    from cupy_moe.runtime.arrays import ArrayKind
    from cupy_moe.runtime.rules import check_no_overlap

    def device_array(address, shape, strides, itemsize=4):
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=address), shape=shape,
                                     strides=strides, itemsize=itemsize)

    # out_sf [R = 5, S = 2] column-major, leading dimension 8: its view ends
    # at byte 52, the pad columns of its last column at byte 64
    out_sf = device_array(0x10000, (5, 2), (4, 32))
    x_sf = device_array(0x10000 + 56, (2,), (4,))
    check_no_overlap(ArrayKind.CUPY, {"out_sf": (out_sf, 0)}, {"x_sf": x_sf})
    with pytest.raises(ValueError, match="out_sf overlaps x_sf"):
        check_no_overlap(ArrayKind.CUPY, {"out_sf": (out_sf, 64)}, {"x_sf": x_sf})


@pytest.mark.parametrize("label", ["qwen3-30b-decode", "kimi-k2-decode-sf-row-major"])
def test_a_torch_peer_is_checked_by_the_ops_own_outputs(label):
    """cupy-moe bench checks each torch peer bit for bit before timing it:
    by the op's output names, one for the plain expand (a names tuple
    longer than the results stopped the bench on every plain expand
    workload), two with scale factors; a wrong element is named."""
    from cupy_moe.harness import peers, runner
    from cupy_moe.harness.inputs import workload_inputs
    from cupy_moe.harness.manifest import load_workloads
    from cupy_moe.runtime.arrays import numpy_to_torch

    w = next(w for op in ("expand_to_fused", "expand_to_fused_with_sf")
             for w in load_workloads(op) if w.label == label)
    host = workload_inputs(w, np.random.default_rng(0))
    expected = runner.reference_outputs(w, host)
    args = {name: numpy_to_torch(array) for name, array in host.items()}
    maps = (args["token_topk_to_pos"], args["pos_to_expert"])
    result = (peers.torch_reference_expand(args["x"], *maps) if w.sf_columns is None else
              peers.torch_reference_expand_with_sf(
                  args["x"], args["x_sf"], *maps,
                  use_tma_aligned_col_major_sf=w.use_tma_aligned_col_major_sf))
    assert runner._peer_mismatch(w, result, expected) is None
    first = result if w.sf_columns is None else result[0]
    row = int(np.flatnonzero(host["pos_to_expert"] >= 0)[0])
    first.view(torch.uint8)[row, 0] ^= 1
    assert runner._peer_mismatch(w, result, expected).startswith(
        f"expanded_x: 1 elements differ, first at ({row}, 0)")
