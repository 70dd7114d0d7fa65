"""The expand ops on the GPU against the NumPy reference, bit for bit (marker
``gpu``): manifest workloads, odd shapes, every kernel path, malformed maps.

Every test draws fresh random bits for its payloads (all fp8/bf16 codes, NaN
encodings, arbitrary float32 SF patterns) and, where it passes ``out=``,
poisons the buffer first. Runs with CuPy arrays and with CUDA torch tensors.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import cupy_moe
from cupy_moe import reference
from cupy_moe.expand.rules import sf_columns
from cupy_moe.expand.tuning import DEFAULT_TUNING
from cupy_moe.harness.inputs import fitted_routing, numpy_dtype, random_bits, workload_inputs
from cupy_moe.runtime.sizes import align_up
from gpu_cases import (
    GPU_MARKS, KINDS, check_expand, check_expand_with_sf, cupy, expand_sf_op,
    map_to_device, to_device, to_host_bits,
)
from helpers import GivenPosToToken, assert_bits_equal, bits

pytestmark = GPU_MARKS


# -- the manifest workloads ---------------------------------------------------
# Real padded plans (plan workloads) above this size run on the public path
# only: the forced kernel paths are covered by the smaller ones, and checking
# outputs of hundreds of MB on the host four times costs minutes.
PLAN_ALL_PATHS_MAX_BYTES = 64 << 20


def _skip_large_plan_on_forced_path(workload, kernel_path):
    if (workload.plan is not None and workload.bytes > PLAN_ALL_PATHS_MAX_BYTES
            and kernel_path is not None):
        pytest.skip("large plan workload: public kernel path only")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("workload", cupy_moe.load_workloads("expand_to_fused"),
                         ids=lambda w: w.label)
def test_manifest_expand(workload, kind, kernel_path):
    _skip_large_plan_on_forced_path(workload, kernel_path)
    rng = np.random.default_rng()
    inputs = workload_inputs(workload, rng)
    x, token_topk_to_pos, pos_to_expert = (
        inputs["x"], inputs["token_topk_to_pos"], inputs["pos_to_expert"])
    check_expand(kind, x, token_topk_to_pos, pos_to_expert, tuning=kernel_path)
    poisoned = to_device(kind, random_bits(rng, (workload.num_expanded, workload.hidden),
                                              x.dtype), x.dtype.name)
    check_expand(kind, x, token_topk_to_pos, pos_to_expert, out=poisoned, tuning=kernel_path)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("workload", cupy_moe.load_workloads("expand_to_fused_with_sf"),
                         ids=lambda w: w.label)
def test_manifest_expand_with_sf(workload, kind, kernel_path):
    _skip_large_plan_on_forced_path(workload, kernel_path)
    rng = np.random.default_rng()
    inputs = workload_inputs(workload, rng)
    # with the plan's pos_to_token and without, where the default kernels read
    # it (column-major plan workloads; the "gather" kernel path gives every call one)
    given = "pos_to_token" in inputs and workload.use_tma_aligned_col_major_sf
    hints = (None, inputs["pos_to_token"]) if given else (None,)
    for poison, hint in [(False, None), *((True, hint) for hint in hints)]:
        check_expand_with_sf(kind, inputs["x"], inputs["x_sf"], inputs["token_topk_to_pos"],
                             inputs["pos_to_expert"],
                             npc=workload.num_per_channels,
                             col_major=workload.use_tma_aligned_col_major_sf,
                             poison_outputs=poison, rng=rng, tuning=kernel_path,
                             pos_to_token=hint)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_sf", [False, True])
def test_tokens_whose_slots_are_all_dropped(with_sf, kind, kernel_path):
    # Expert parallelism: many tokens route nowhere on this rank (about half
    # here have no slot left); the bulk kernel does not read their rows.
    rng = np.random.default_rng()
    num_tokens, top_k, hidden = 96, 8, 4096
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, num_tokens, top_k, 160,
                                                      num_experts=6, max_alignment=4,
                                                      drop=0.93)
    assert (token_topk_to_pos < 0).all(axis=1).sum() > num_tokens // 3
    if not with_sf:
        x = random_bits(rng, (num_tokens, hidden), numpy_dtype("bfloat16"))
        check_expand(kind, x, token_topk_to_pos, pos_to_expert, tuning=kernel_path)
        return
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
    x_sf = random_bits(rng, (num_tokens, sf_columns(hidden, 128, packed_ue8m0=False)),
                       np.dtype("float32"))
    check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128,
                         col_major=False, poison_outputs=True, rng=rng, tuning=kernel_path)


# -- odd shapes, every vector width ----------------------------------------------
# The last three sizes of each list give rows of whole 16-byte vectors that the
# bulk kernel splits into chunks with a short last one (or takes whole).

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("top_k", [1, 9])
@pytest.mark.parametrize("hidden", [1, 7, 37, 577, 7169, 8, 1032, 8200])
def test_odd_hidden_bf16(hidden, top_k, kind, kernel_path):
    rng = np.random.default_rng()
    x = random_bits(rng, (23, hidden), numpy_dtype("bfloat16"))
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 23, top_k, 23 * top_k + 13,
                                                   num_experts=5, max_alignment=4)
    check_expand(kind, x, token_topk_to_pos, pos_to_expert, tuning=kernel_path)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["row-f32", "col-f32", "col-ue8m0"])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("top_k", [1, 9])
@pytest.mark.parametrize("hidden", [1, 7, 37, 577, 7169, 16, 2064, 16400])
def test_odd_hidden_with_sf(hidden, top_k, npc, layout, kind, kernel_path):
    rng = np.random.default_rng()
    col_major, sf_dtype = {"row-f32": (False, "float32"), "col-f32": (True, "float32"),
                           "col-ue8m0": (True, "int32")}[layout]
    num_tokens = 11
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
    s = sf_columns(hidden, npc, packed_ue8m0=sf_dtype == "int32")
    x_sf = random_bits(rng, (num_tokens, s), np.dtype(sf_dtype))
    for num_expanded in (num_tokens * top_k + 1, num_tokens * top_k + 6):  # X % 4 varies
        token_topk_to_pos, pos_to_expert = fitted_routing(rng, num_tokens, top_k, num_expanded,
                                                       num_experts=3, max_alignment=2)
        check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=npc,
                             col_major=col_major, poison_outputs=True, rng=rng,
                             tuning=kernel_path)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("zero_padding", [True, False])
@pytest.mark.parametrize("layout", ["none", "row-f32", "col-ue8m0"])
@pytest.mark.parametrize("zero_rows", [1, 5, 32])
@pytest.mark.parametrize("num_tokens", [3, 40])
def test_zero_fill_block_sizes(zero_rows, num_tokens, layout, zero_padding, kind, kernel_path):
    # Padding scattered through X (alignment 4, dropped slots) and a tail; X
    # neither a multiple of the rows per zero-fill block nor of 4. Every row
    # count a warp ballot can cover, the last block short. zero_padding=False:
    # padding rows keep the poison, and blocks of every size still zero the
    # column-major SF's 1 pad column (align(263, 4) = 264).
    given = isinstance(kernel_path, GivenPosToToken)
    tuning = dataclasses.replace((kernel_path.tuning if given else kernel_path) or DEFAULT_TUNING,
                                 zero_rows_bulk=zero_rows, zero_rows_registers=zero_rows,
                                 zero_rows_bulk_whole=zero_rows, zero_block_bytes_registers=0)
    if given:
        tuning = GivenPosToToken(tuning)
    rng = np.random.default_rng()
    top_k, hidden = 4, 1024
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, num_tokens, top_k, 263,
                                                      num_experts=7, max_alignment=4,
                                                      drop=0.3)
    assert (pos_to_expert < 0).sum() > 40
    if layout == "none":
        x = random_bits(rng, (num_tokens, hidden), numpy_dtype("bfloat16"))
        poisoned = to_device(kind, random_bits(rng, (263, hidden), x.dtype), "bfloat16")
        check_expand(kind, x, token_topk_to_pos, pos_to_expert, out=poisoned, tuning=tuning,
                     zero_padding=zero_padding)
        return
    sf_dtype = "float32" if layout == "row-f32" else "int32"
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
    x_sf = random_bits(rng, (num_tokens, sf_columns(hidden, 128, packed_ue8m0=sf_dtype == "int32")),
                       np.dtype(sf_dtype))
    check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128,
                         col_major=layout != "row-f32", poison_outputs=True, rng=rng,
                         tuning=tuning, zero_padding=zero_padding)


@pytest.mark.parametrize("offset_bytes", [0, 1, 2, 4, 8])
def test_misaligned_base_pointer_cupy(offset_bytes):
    # A contiguous x that starts off a 16-byte boundary takes a narrower access.
    rng = np.random.default_rng()
    num_tokens, hidden = 9, 64
    raw = cupy.asarray(rng.integers(0, 256, num_tokens * hidden + 16, dtype=np.uint8))
    dx = raw[offset_bytes:offset_bytes + num_tokens * hidden].reshape(num_tokens, hidden)
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, num_tokens, 3, 40, num_experts=4,
                                                   max_alignment=2)
    x_sf = random_bits(rng, (num_tokens, 1), np.dtype("float32"))
    out_x, out_sf = cupy_moe.expand_to_fused_with_sf(
        dx, cupy.asarray(x_sf), cupy.asarray(token_topk_to_pos), cupy.asarray(pos_to_expert),
        num_per_channels=128)
    expected_x, expected_sf = reference.expand_to_fused_with_sf_numpy(
        cupy.asnumpy(dx), x_sf, token_topk_to_pos, pos_to_expert, col_major=False)
    assert_bits_equal(cupy.asnumpy(out_x), expected_x, "expanded_x")
    assert_bits_equal(cupy.asnumpy(out_sf).view(np.uint32), expected_sf, "expanded_x_sf")


@pytest.mark.parametrize("kind", KINDS)
def test_fp8_every_byte_code(kind):
    x = np.arange(256, dtype=np.uint8).reshape(2, 128).view(numpy_dtype("float8_e4m3fn"))
    x_sf = np.array([[np.nan], [-0.0]], dtype=np.float32)
    token_topk_to_pos = np.array([[3, 0, -1], [1, -1, 2]], dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, 2, -1], dtype=np.int32)
    check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128,
                         col_major=False)


# -- empty and degenerate --------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("col_major", [False, True])
def test_no_tokens_gives_zeros(kind, col_major, kernel_path):
    rng = np.random.default_rng()
    x = np.zeros((0, 256), dtype=numpy_dtype("float8_e4m3fn"))
    x_sf = np.zeros((0, 1 if col_major else 2), dtype=np.int32 if col_major else np.float32)
    token_topk_to_pos = np.zeros((0, 8), dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, -1, 2, 2, -1], dtype=np.int32)  # expert rows too
    check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128,
                         col_major=col_major, poison_outputs=True, rng=rng, tuning=kernel_path)
    check_expand(kind, np.zeros((0, 256), dtype=numpy_dtype("bfloat16")), token_topk_to_pos,
                 pos_to_expert, tuning=kernel_path)


@pytest.mark.parametrize("kind", KINDS)
def test_no_expanded_rows(kind):
    rng = np.random.default_rng()
    x = random_bits(rng, (3, 40), numpy_dtype("bfloat16"))
    token_topk_to_pos = np.array([[-1, 0], [2, -1], [-1, -1]], dtype=np.int32)  # all >= X
    result = check_expand(kind, x, token_topk_to_pos, np.zeros(0, dtype=np.int32))
    assert tuple(result.shape) == (0, 40)


# -- malformed maps stay inside the buffers --------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("col_major", [False, True])
def test_malformed_map_never_writes_past_outputs(kind, col_major, kernel_path):
    rng = np.random.default_rng()
    num_tokens, hidden, num_expanded, guard = 6, 96, 10, 64
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
    sf_dtype = np.dtype("int32" if col_major else "float32")
    s = sf_columns(hidden, 32, packed_ue8m0=col_major)
    x_sf = random_bits(rng, (num_tokens, s), sf_dtype)
    token_topk_to_pos = np.array(
        [[num_expanded, 0], [num_expanded + 1, -5], [2**31 - 1, 1], [-2**31, 2],
         [num_expanded + guard, 3], [4, 5]], dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, 1, 2, 2, -1, -1, -1, -1], dtype=np.int32)
    # outputs are the head of larger poisoned buffers; the tails are guards
    out_buf = to_device(kind, random_bits(rng, (num_expanded + guard, hidden), x.dtype),
                        "float8_e4m3fn")
    ld = align_up(num_expanded, 4)
    sf_rows = s * ld + guard if col_major else (num_expanded + guard) * s
    sf_buf = to_device(kind, random_bits(rng, (sf_rows,), sf_dtype), sf_dtype.name)
    guard_before = to_host_bits(kind, out_buf[num_expanded:]).copy()
    sf_guard_before = to_host_bits(kind, sf_buf[sf_rows - guard:]).copy()
    out = out_buf[:num_expanded]
    out_sf = (sf_buf[:s * ld].reshape(s, ld)[:, :num_expanded].T if col_major
              else sf_buf[:num_expanded * s].reshape(num_expanded, s))
    expand_sf_op(
        kernel_path, to_device(kind, x, "float8_e4m3fn"), to_device(kind, x_sf, sf_dtype.name),
        map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert),
        num_per_channels=32, use_tma_aligned_col_major_sf=col_major, out=out, out_sf=out_sf)
    assert np.array_equal(to_host_bits(kind, out_buf[num_expanded:]), guard_before)
    assert np.array_equal(to_host_bits(kind, sf_buf[sf_rows - guard:]), sf_guard_before)
    # the well-formed part of the map was still honoured
    got = to_host_bits(kind, out)
    assert np.array_equal(got[4], bits(x)[5]) and np.array_equal(got[5], bits(x)[5])
    assert not got[6:].any()
