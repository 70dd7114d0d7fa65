"""The kernels under the CPU emulation (as test_kernels_on_cpu.py, in CI) at
their bounds: slots and hints of exactly X, T or T * K, no tokens, odd rows
and short last chunks, alignments that are not powers of two, blocks below
the amax floor. Each test was seen to fail on a kernel changed by one
comparison or constant that the other tests let through."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cupy_moe
from cuda_on_cpu import build
from cuda_on_cpu.device import POISON, emulated_gpu
from cupy_moe.expand.api import run_with_tuning as expand_with_tuning
from cupy_moe.expand.reference import expand_to_fused_numpy
from cupy_moe.expand.tuning import ExpandTuning
from cupy_moe.quantize.api import run_with_tuning as quantize_with_tuning
from test_kernels_on_cpu import GATHER, _plan

pytestmark = pytest.mark.skipif(not build.compiler_available(),
                                reason=f"no C++ compiler ({build.CXX}) to build the kernels with")


ROWS_BY_POSITION = ExpandTuning(rows_by_position_tokens_below=float("inf"))


@pytest.mark.parametrize(("tuning", "kernel"), [(GATHER, "expand_to_fused_gather"),
                                                (ROWS_BY_POSITION, "expand_to_fused_rows")])
def test_gather_a_hint_naming_token_t_gives_zeros(monkeypatch, rng, tuning, kernel):
    """Rows by position (the gather kernel, the rows kernel by position): an
    expert row whose pos_to_token hint is T (one past the last token) is a
    row of zeros, as any hint outside [0, T): x[T] is never read. x is a view
    of a longer array, so a read of row T finds data, not a fault."""
    num_tokens = 29
    plan, _ = _plan(rng, num_tokens, 8, 32, 24, 16)
    longer = rng.integers(1, 2**16, (num_tokens + 1, 3072), dtype=np.uint16)
    x = longer[:num_tokens]
    want = expand_to_fused_numpy(x, plan.token_topk_to_pos, plan.pos_to_expert)
    hint = plan.pos_to_token.copy()
    rows = np.flatnonzero(plan.pos_to_expert >= 0)[::5]
    hint[rows] = num_tokens
    want[rows] = 0
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got, _ = expand_with_tuning(tuning, x, plan.token_topk_to_pos, plan.pos_to_expert,
                                pos_to_token=hint)
    gpu.check_canaries()
    assert kernel in gpu.launches
    np.testing.assert_array_equal(got, want)


def test_expand_validate_reports_a_slot_of_exactly_x(monkeypatch):
    """validate=True on the GPU path (routing_first_slots): a slot naming
    row X (one past the last) is out of range, with the CPU's message; the
    kernel never reads pos_to_expert[X] nor writes first_slot[X]."""
    token_topk_to_pos = np.array([[0, 1], [4, 2]], dtype=np.int32)   # X = 4
    pos_to_expert = np.array([0, 0, 1, -1], dtype=np.int32)
    x = np.arange(2 * 16, dtype=np.uint16).reshape(2, 16)
    with pytest.raises(ValueError) as cpu_error:
        cupy_moe.expand_to_fused(x, token_topk_to_pos, pos_to_expert, validate=True)
    gpu = emulated_gpu(monkeypatch)
    with pytest.raises(ValueError) as emulated_error:
        cupy_moe.expand_to_fused(x, token_topk_to_pos, pos_to_expert, validate=True)
    assert "routing_first_slots" in gpu.launches
    gpu.check_canaries()
    assert str(emulated_error.value) == str(cpu_error.value)


@pytest.mark.parametrize("tuning", [ExpandTuning(bulk_min_blocks=float("inf")),
                                    ExpandTuning(bulk_min_blocks=float("inf"), compiled_row=1)],
                         ids=["registers", "compiled-row"])
def test_expand_skips_slots_of_exactly_x(monkeypatch, rng, tuning):
    """The register kernels skip a slot naming row X (one past the last), as
    any slot past X: nothing is written past the output (128-byte rows: a
    stray row lands in the canary margin)."""
    plan, _ = _plan(rng, 29, 8, 32, 24, 16)
    num_rows = plan.pos_to_expert.shape[0]
    token_topk_to_pos = plan.token_topk_to_pos.copy()
    dropped = np.argwhere(token_topk_to_pos < 0)[::2]
    assert dropped.size
    token_topk_to_pos[tuple(dropped.T)] = num_rows
    x = rng.integers(0, 2**16, (29, 64), dtype=np.uint16)
    want = expand_to_fused_numpy(x, token_topk_to_pos, plan.pos_to_expert)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got, _ = expand_with_tuning(tuning, x, token_topk_to_pos, plan.pos_to_expert)
    gpu.check_canaries()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("col_major", [False, True])
def test_expand_with_no_tokens_zeroes_the_expert_rows(monkeypatch, rng, col_major):
    """T = 0: no slot writes the expert rows, the zero-fill blocks zero them
    (and their scale factors), as the oracle's zeros."""
    pos_to_expert = np.repeat(np.array([0, -1, 1, 2, -1], np.int32), 7)[:33]
    x = np.zeros((0, 1024), np.uint8).view(ml_dtypes.float8_e4m3fn)
    x_sf = np.zeros((0, 8), np.float32)
    token_topk_to_pos = np.zeros((0, 4), np.int32)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got, got_sf = expand_with_tuning(ExpandTuning(), x, token_topk_to_pos, pos_to_expert,
                                     x_sf=x_sf, num_per_channels=128,
                                     use_tma_aligned_col_major_sf=col_major)
    gpu.check_canaries()
    assert gpu.launches
    assert (got.view(np.uint8) == 0).all()
    assert (np.asarray(got_sf) == 0).all()


@pytest.mark.parametrize("hidden", [101, 7])
def test_reduce_fused_odd_bf16_rows_round_ties_to_even(monkeypatch, rng, hidden):
    """Odd H in bfloat16: 2-byte accesses (VecOf<2>), one element a vector,
    each sum narrowed by Format<BF16>::narrow (not the paired cvt). Powers
    of two times 1 + 2^-8 are ties halfway between two bfloat16s: round to
    nearest even, as the oracle."""
    from cupy_moe.combine.reference import reduce_fused_numpy

    num_tokens, top_k = 13, 2
    num_rows = num_tokens * top_k
    token_topk_to_pos = rng.permutation(num_rows).astype(np.int32).reshape(num_tokens, top_k)
    token_topk_to_pos[:, 1] = -1                          # one live slot a token
    powers = rng.integers(-20, 20, (num_rows, hidden)).astype(np.float32)
    signs = rng.choice(np.array([-1, 1], np.float32), (num_rows, hidden))
    expanded = (signs * np.exp2(powers)).astype(ml_dtypes.bfloat16)
    weights = np.full((num_tokens, top_k), 1 + 2.0**-8, np.float32)
    want = reduce_fused_numpy(expanded, token_topk_to_pos, weights)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = cupy_moe.reduce_fused(expanded, token_topk_to_pos, weights)
    gpu.check_canaries()
    assert any(name.endswith("_v2") for name in gpu.launches), gpu.launches
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))


def test_reduce_fused_bulk_short_last_chunk_reads_only_its_row(monkeypatch, rng):
    """The bulk layout on rows whose last column chunk is short (125 16-byte
    vectors): each bulk load moves the chunk's bytes, not a whole stage's.
    expanded ends against an inaccessible page and its last row is live: a
    load past the row faults."""
    from cupy_moe.combine.api import run_with_shape
    from cupy_moe.combine.reference import reduce_fused_numpy
    from cuda_on_cpu.device import fenced

    num_tokens, top_k, hidden = 10, 3, 1000               # 2000-byte rows
    num_rows = num_tokens * top_k
    token_topk_to_pos = rng.permutation(num_rows).astype(np.int32).reshape(num_tokens, top_k)
    expanded = rng.standard_normal((num_rows, hidden)).astype(ml_dtypes.bfloat16)
    weights = rng.random((num_tokens, top_k), dtype=np.float32)
    want = reduce_fused_numpy(expanded, token_topk_to_pos, weights)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = run_with_shape(fenced(expanded, "after"), token_topk_to_pos, weights,
                         vecs_per_thread=1, bulk_stages=2, max_warps=2)
    gpu.check_canaries()
    assert [dict(h.defines).get("COMBINE_BULK_STAGES") for h in gpu.handles] == [2]
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))


def test_reduce_fused_validate_reports_a_slot_of_exactly_x(monkeypatch, rng):
    """validate=True on the GPU path (reduce_fused_first_out_of_range): a
    slot naming row X is out of range, with the CPU's message."""
    expanded = rng.standard_normal((4, 16)).astype(np.float32)
    token_topk_to_pos = np.array([[0, 1], [4, 2]], dtype=np.int32)
    with pytest.raises(ValueError) as cpu_error:
        cupy_moe.reduce_fused(expanded, token_topk_to_pos, validate=True)
    gpu = emulated_gpu(monkeypatch)
    with pytest.raises(ValueError) as emulated_error:
        cupy_moe.reduce_fused(expanded, token_topk_to_pos, validate=True)
    assert "reduce_fused_first_out_of_range" in gpu.launches
    assert str(emulated_error.value) == str(cpu_error.value)


@pytest.mark.parametrize(("num_tokens", "top_k", "num_experts", "alignment"), [
    (1, 8, 384, 24),       # the one-warp plan
    (37, 6, 64, 24),
    (700, 8, 128, 96),
    (4096, 8, 128, 96),    # the cooperative kernel
])
def test_fused_mapping_with_an_alignment_not_a_power_of_two(monkeypatch, rng, num_tokens,
                                                             top_k, num_experts, alignment):
    """align_rows' integer-division branch (the mask serves powers of two):
    empty experts get no rows, full ones no extra segment."""
    from cupy_moe.mapping.reference import fused_mapping_numpy

    ids = rng.integers(-1, num_experts + 3, (num_tokens, top_k)).astype(np.int32)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = cupy_moe.fused_mapping(ids, num_experts, alignment=alignment)
    gpu.check_canaries()
    slots = num_tokens * top_k
    num_rows = (slots + min(num_experts, slots) * (alignment - 1)) // alignment * alignment
    want = fused_mapping_numpy(ids, num_experts, alignment=alignment, num_expanded=num_rows)
    for name, got_field, want_field in zip(want._fields, got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(got_field), want_field, err_msg=name)


def test_quantize_floors_the_amax_of_small_blocks(monkeypatch, rng):
    """A block of zeros, and one whose largest |x| is below 1e-4: both
    quantized with amax = 1e-4 (sf = 1e-4 / 448), as the oracle."""
    from cupy_moe.quantize.launch_shape import QuantizeTuning
    from cupy_moe.quantize.reference import quantize_fp8_numpy

    x = rng.standard_normal((5, 1024)).astype(np.float32)
    x[:, :128] = 0
    x[:, 128:256] *= 1e-6
    want = quantize_fp8_numpy(x)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = quantize_with_tuning(QuantizeTuning(), "quantize_fp8", x)
    gpu.check_canaries()
    np.testing.assert_array_equal(got[0].view(np.uint8), want[0].view(np.uint8))
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])


def test_swiglu_any_kernel_padding_rows_stay_in_their_row(monkeypatch, rng):
    """swiglu_quantize_fp8's *_any kernel (I = 100: no 16-byte chunks): a
    padding row's zero codes end at its row's end, never the next row's
    first code nor past the output."""
    from test_kernels_on_cpu import _swiglu_plan_inputs
    from cupy_moe.quantize.launch_shape import QuantizeTuning
    from cupy_moe.quantize.reference import swiglu_quantize_fp8_numpy

    plan, weights, h, maps = _swiglu_plan_inputs(rng, 100, "bfloat16")
    want_codes, want_sf = swiglu_quantize_fp8_numpy(h, num_per_channels=32, **maps)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    codes, sf = quantize_with_tuning(QuantizeTuning(), "swiglu_quantize_fp8", h, **maps,
                                     num_per_channels=32)
    gpu.check_canaries()
    assert gpu.launches[-1].endswith("_any"), gpu.launches
    np.testing.assert_array_equal(codes.view(np.uint8), want_codes.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(sf), want_sf)


@pytest.mark.parametrize("inter", [96, 2048])
def test_swiglu_a_slot_of_exactly_t_k_is_padding(monkeypatch, rng, inter):
    """pos_to_token_topk naming slot T*K (one past the last weight) makes a
    padding row (zero codes and scale factors), as any slot outside [0, T*K):
    its weight is never read (the weights are a view of a longer array whose
    next element is 1)."""
    from test_kernels_on_cpu import _swiglu_plan_inputs
    from cupy_moe.quantize.launch_shape import QuantizeTuning
    from cupy_moe.quantize.reference import swiglu_quantize_fp8_numpy

    plan, weights, h, maps = _swiglu_plan_inputs(rng, inter, "bfloat16")
    longer = np.ones(weights.size + 1, np.float32)
    longer[:-1] = weights.reshape(-1)
    maps["topk_weights"] = longer[:-1].reshape(weights.shape)
    slots = maps["pos_to_token_topk"].copy()
    live = np.flatnonzero(maps["pos_to_expert"] >= 0)[::3]
    slots[live] = weights.size
    maps["pos_to_token_topk"] = slots
    want_codes, want_sf = swiglu_quantize_fp8_numpy(h, num_per_channels=128, **maps)
    for tuning in (QuantizeTuning(), QuantizeTuning(segment_columns=())):
        gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
        codes, sf = quantize_with_tuning(tuning, "swiglu_quantize_fp8", h, **maps,
                                         num_per_channels=128)
        gpu.check_canaries()
        np.testing.assert_array_equal(codes.view(np.uint8), want_codes.view(np.uint8),
                                      err_msg=gpu.launches[-1])
        np.testing.assert_array_equal(np.asarray(sf), want_sf, err_msg=gpu.launches[-1])
