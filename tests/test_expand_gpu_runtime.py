"""The expand ops on the GPU: validate=True, layouts, streams, CUDA graphs,
torch dtypes and the torch fast path (marker ``gpu``)."""

from __future__ import annotations


import numpy as np
import pytest

import cupy_moe
from cupy_moe import reference
from cupy_moe.expand.rules import sf_columns
from cupy_moe.harness.inputs import fitted_routing, numpy_dtype, random_bits
from cupy_moe.runtime.sizes import align_up
from gpu_cases import (
    GPU_MARKS, KINDS, cupy, expand_sf_op, padded_sf_bits,
    map_to_device, needs_torch_cuda, to_device, to_host_bits, torch,
)
from helpers import assert_bits_equal

pytestmark = GPU_MARKS


# -- validate=True -----------------------------------------------------------------

MALFORMED = {
    "out-of-range": ([[0, 1], [9, 2]], [0, 0, 1, -1]),
    "padding-target": ([[0, 1], [2, 3]], [0, 0, 1, -1]),
    "duplicate": ([[0, 1], [2, 1]], [0, 0, 1, -1]),
    "untargeted": ([[0, -1], [2, -1]], [0, 0, 1, -1]),
    "all-at-once": ([[1, 7], [1, 3]], [0, 0, 1, -1]),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_validate_reports_what_the_cpu_reports(case, kind):
    token_topk_to_pos = np.array(MALFORMED[case][0], dtype=np.int32)
    pos_to_expert = np.array(MALFORMED[case][1], dtype=np.int32)
    x = np.arange(2 * 16, dtype=np.uint16).reshape(2, 16).view(numpy_dtype("bfloat16"))
    with pytest.raises(ValueError) as cpu_error:
        cupy_moe.expand_to_fused(x, token_topk_to_pos, pos_to_expert, validate=True)
    with pytest.raises(ValueError) as gpu_error:
        cupy_moe.expand_to_fused(to_device(kind, x, "bfloat16"),
                                 map_to_device(kind, token_topk_to_pos),
                                 map_to_device(kind, pos_to_expert), validate=True)
    assert str(gpu_error.value) == str(cpu_error.value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pos_to_token", [[0, 0, 0, -1], [0, 0, 7, -1], [0, -1, 1, -1]])
def test_validate_checks_pos_to_token_as_the_cpu_does(pos_to_token, kind):
    token_topk_to_pos = np.array([[0, 1], [2, -1]], dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, -1], dtype=np.int32)
    pos_to_token = np.array(pos_to_token, dtype=np.int32)
    x = np.arange(2 * 128, dtype=np.uint8).reshape(2, 128)
    x_sf = np.arange(2, dtype=np.int32).reshape(2, 1)
    kwargs = {"num_per_channels": 128, "use_tma_aligned_col_major_sf": True, "validate": True}
    with pytest.raises(ValueError, match="pos_to_token") as cpu_error:
        cupy_moe.expand_to_fused_with_sf(x, x_sf, token_topk_to_pos, pos_to_expert,
                                         pos_to_token=pos_to_token, **kwargs)
    with pytest.raises(ValueError) as gpu_error:
        cupy_moe.expand_to_fused_with_sf(
            to_device(kind, x, "uint8"), to_device(kind, x_sf, "int32"),
            map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert),
            pos_to_token=map_to_device(kind, pos_to_token), **kwargs)
    assert str(gpu_error.value) == str(cpu_error.value)


HINT_TOKENS = 300


def _plan_with_dropped_slots(rng):
    """The NumPy plan of HINT_TOKENS tokens, top-4 of 7 experts, every fifth
    token's first slot dropped, experts aligned to 64 rows."""
    topk_ids = rng.integers(0, 7, size=(HINT_TOKENS, 4))
    topk_ids[::5, 0] = -1
    return reference.fused_mapping_numpy(topk_ids, 7, alignment=64)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("zero_padding", [True, False])
def test_public_op_given_pos_to_token(kind, zero_padding):
    """The hint through the public op (and, for torch, its fast path on the
    second call): the same bits as without it, validate=True accepting it."""
    rng = np.random.default_rng()
    plan = _plan_with_dropped_slots(rng)
    x = random_bits(rng, (HINT_TOKENS, 2048), numpy_dtype("float8_e4m3fn"))
    x_sf = random_bits(rng, (HINT_TOKENS, 4), np.dtype("int32"))
    want_x, want_sf = reference.expand_to_fused_with_sf_numpy(
        x, x_sf, plan.token_topk_to_pos, plan.pos_to_expert, col_major=True)
    args = (to_device(kind, x, "float8_e4m3fn"), to_device(kind, x_sf, "int32"),
            map_to_device(kind, plan.token_topk_to_pos), map_to_device(kind, plan.pos_to_expert))
    expert_rows = plan.pos_to_expert >= 0 if not zero_padding else slice(None)
    for validate in (True, False, False):
        got_x, got_sf = cupy_moe.expand_to_fused_with_sf(
            *args, num_per_channels=128, use_tma_aligned_col_major_sf=True,
            pos_to_token=map_to_device(kind, plan.pos_to_token), validate=validate,
            zero_padding=zero_padding)
        assert_bits_equal(to_host_bits(kind, got_x)[expert_rows], want_x[expert_rows],
                          "expanded_x")
        full = padded_sf_bits(kind, got_sf, plan.pos_to_expert.shape[0], 4)
        assert_bits_equal(full[:, :plan.pos_to_expert.shape[0]].T[expert_rows],
                          want_sf[expert_rows], "expanded_x_sf")
        assert not full[:, plan.pos_to_expert.shape[0]:].any()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pos_to_token", [[0, 0, 0, -1], [0, -1, 1, -1]])
def test_plain_op_validate_checks_pos_to_token_as_the_cpu_does(pos_to_token, kind):
    token_topk_to_pos = np.array([[0, 1], [2, -1]], dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, -1], dtype=np.int32)
    pos_to_token = np.array(pos_to_token, dtype=np.int32)
    x = np.arange(2 * 64, dtype=np.uint16).reshape(2, 64).view(numpy_dtype("bfloat16"))
    with pytest.raises(ValueError, match="pos_to_token") as cpu_error:
        cupy_moe.expand_to_fused(x, token_topk_to_pos, pos_to_expert, validate=True,
                                 pos_to_token=pos_to_token)
    with pytest.raises(ValueError) as gpu_error:
        cupy_moe.expand_to_fused(to_device(kind, x, "bfloat16"),
                                 map_to_device(kind, token_topk_to_pos),
                                 map_to_device(kind, pos_to_expert), validate=True,
                                 pos_to_token=map_to_device(kind, pos_to_token))
    assert str(gpu_error.value) == str(cpu_error.value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("zero_padding", [True, False])
def test_public_plain_op_given_pos_to_token(kind, zero_padding):
    """As the SF op's test above: the same bits with the hint as without, through
    the full path and (torch) the fast path."""
    rng = np.random.default_rng()
    plan = _plan_with_dropped_slots(rng)
    x = random_bits(rng, (HINT_TOKENS, 2048), numpy_dtype("bfloat16"))
    want = reference.expand_to_fused_numpy(x, plan.token_topk_to_pos, plan.pos_to_expert)
    args = (to_device(kind, x, "bfloat16"), map_to_device(kind, plan.token_topk_to_pos),
            map_to_device(kind, plan.pos_to_expert))
    expert_rows = plan.pos_to_expert >= 0 if not zero_padding else slice(None)
    for validate in (True, False, False):
        got = cupy_moe.expand_to_fused(*args, pos_to_token=map_to_device(kind, plan.pos_to_token),
                                       validate=validate, zero_padding=zero_padding)
        assert_bits_equal(to_host_bits(kind, got)[expert_rows], want[expert_rows], "expanded_x")


@pytest.mark.parametrize("kind", KINDS)
def test_validate_accepts_a_well_formed_map(kind):
    rng = np.random.default_rng()
    x = random_bits(rng, (300, 64), numpy_dtype("bfloat16"))
    topk_ids = rng.integers(0, 7, size=(300, 4))
    topk_ids[::5, 0] = -1
    plan = reference.fused_mapping_numpy(topk_ids, 7, alignment=8)
    token_topk_to_pos, pos_to_expert = plan.token_topk_to_pos, plan.pos_to_expert
    result = cupy_moe.expand_to_fused(to_device(kind, x, "bfloat16"),
                                      map_to_device(kind, token_topk_to_pos),
                                      map_to_device(kind, pos_to_expert), validate=True)
    assert_bits_equal(to_host_bits(kind, result),
                reference.expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert),
                "expanded_x")


# -- layouts, streams, graphs --------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_inputs(kind):
    rng = np.random.default_rng()
    wide = random_bits(rng, (12, 2 * 48), numpy_dtype("bfloat16"))
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 12, 3, 44, num_experts=4, max_alignment=2)
    d_wide = to_device(kind, wide, "bfloat16")
    dx = d_wide[:, ::2]  # every other column
    dmap = map_to_device(kind, np.asfortranarray(token_topk_to_pos))
    dmap = dmap.T.copy().T if kind == "cupy" else dmap.t().contiguous().t()
    assert not (dmap.flags.c_contiguous if kind == "cupy" else dmap.is_contiguous())
    result = cupy_moe.expand_to_fused(dx, dmap, map_to_device(kind, pos_to_expert))
    expected = reference.expand_to_fused_numpy(np.ascontiguousarray(wide[:, ::2]),
                                               token_topk_to_pos, pos_to_expert)
    assert_bits_equal(to_host_bits(kind, result), expected, "expanded_x")


def test_cupy_non_default_stream():
    rng = np.random.default_rng()
    x = random_bits(rng, (64, 512), numpy_dtype("bfloat16"))
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 64, 8, 600)
    with cupy.cuda.Stream(non_blocking=True) as stream:
        result = cupy_moe.expand_to_fused(to_device("cupy", x, "bfloat16"),
                                          cupy.asarray(token_topk_to_pos),
                                          cupy.asarray(pos_to_expert))
        host = cupy.asnumpy(result, stream=stream)
        stream.synchronize()
    assert_bits_equal(host.view(np.uint16), reference.expand_to_fused_numpy(
        x, token_topk_to_pos, pos_to_expert), "expanded_x")


@needs_torch_cuda
def test_torch_side_stream_waits_for_its_producer():
    # The op must run on torch's current stream: here a side stream whose long
    # producer kernel writes x just before the call.
    rng = np.random.default_rng()
    x = random_bits(rng, (256, 2048), numpy_dtype("bfloat16"))
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 256, 8, 2300)
    source = to_device("torch", x, "bfloat16")
    dmap, dp2e = map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert)
    target = torch.zeros_like(source)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25 ms of spinning before the producer
        target.copy_(source)
        result = cupy_moe.expand_to_fused(target, dmap, dp2e)
    side.synchronize()
    assert_bits_equal(to_host_bits("torch", result),
                reference.expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert),
                "expanded_x")


@needs_torch_cuda
@pytest.mark.parametrize("col_major", [False, True])
def test_cuda_graph_capture_and_replay_with_new_inputs(col_major, kernel_path):
    rng = np.random.default_rng()
    num_tokens, top_k, hidden, num_expanded, npc = 32, 8, 3072, 300, 128
    sf_dtype = np.dtype("int32" if col_major else "float32")
    s = sf_columns(hidden, npc, packed_ue8m0=col_major)

    def draw():
        x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
        x_sf = random_bits(rng, (num_tokens, s), sf_dtype)
        return (x, x_sf, *fitted_routing(rng, num_tokens, top_k, num_expanded))

    first = draw()
    static = [to_device("torch", first[0], "float8_e4m3fn"),
              to_device("torch", first[1], sf_dtype.name),
              map_to_device("torch", first[2]), map_to_device("torch", first[3])]
    out = torch.empty((num_expanded, hidden), dtype=torch.float8_e4m3fn, device="cuda")
    ld = align_up(num_expanded, 4)
    sf_buf = torch.empty((s, ld) if col_major else (num_expanded, s),
                         dtype=getattr(torch, sf_dtype.name), device="cuda")
    out_sf = sf_buf[:, :num_expanded].T if col_major else sf_buf

    def call():
        expand_sf_op(kernel_path, *static, num_per_channels=npc,
                                         use_tma_aligned_col_major_sf=col_major,
                                         out=out, out_sf=out_sf)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up: compiles and loads the module outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(3):
        x, x_sf, token_topk_to_pos, pos_to_expert = draw()
        static[0].copy_(to_device("torch", x, "float8_e4m3fn"))
        static[1].copy_(to_device("torch", x_sf, sf_dtype.name))
        static[2].copy_(map_to_device("torch", token_topk_to_pos))
        static[3].copy_(map_to_device("torch", pos_to_expert))
        out.view(torch.uint8).fill_(0xAB)
        sf_buf.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        expected_x, expected_sf = reference.expand_to_fused_with_sf_numpy(
            x, x_sf, token_topk_to_pos, pos_to_expert, col_major=col_major)
        assert_bits_equal(to_host_bits("torch", out), expected_x, "expanded_x")
        if col_major:
            full = to_host_bits("torch", sf_buf)
            assert_bits_equal(full[:, :num_expanded], np.ascontiguousarray(expected_sf.T),
                        "expanded_x_sf")
            assert not full[:, num_expanded:].any()
        else:
            assert_bits_equal(to_host_bits("torch", out_sf), expected_sf, "expanded_x_sf")


@needs_torch_cuda
def test_torch_results_keep_native_dtypes():
    rng = np.random.default_rng()
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 4, 2, 10, num_experts=2, max_alignment=2)
    dmap, dp2e = map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert)
    bf16 = to_device("torch", random_bits(rng, (4, 64), numpy_dtype("bfloat16")), "bfloat16")
    assert cupy_moe.expand_to_fused(bf16, dmap, dp2e).dtype == torch.bfloat16
    fp8 = to_device("torch", random_bits(rng, (4, 256), numpy_dtype("float8_e4m3fn")),
                    "float8_e4m3fn")
    for sf_dtype, col_major, s in ((torch.float32, False, 2), (torch.int32, True, 1)):
        x_sf = torch.zeros((4, s), dtype=sf_dtype, device="cuda")
        out_x, out_sf = cupy_moe.expand_to_fused_with_sf(
            fp8, x_sf, dmap, dp2e, num_per_channels=128, use_tma_aligned_col_major_sf=col_major)
        assert out_x.dtype == torch.float8_e4m3fn and out_sf.dtype == sf_dtype
        assert out_x.is_cuda and out_x.device == fp8.device


# -- the torch fast path (signature already checked) -------------------------------

@needs_torch_cuda
def test_torch_fast_path_stays_exact_and_falls_back_when_the_signature_changes():
    from cupy_moe.expand import api

    rng = np.random.default_rng()
    num_tokens, hidden, top_k, num_expanded = 16, 256, 4, 80
    fp8 = numpy_dtype("float8_e4m3fn")

    def call(x, x_sf, token_topk_to_pos, pos_to_expert, *, x_view=None, sf_view=None, out=None):
        dx = x_view if x_view is not None else to_device("torch", x, "float8_e4m3fn")
        dsf = sf_view if sf_view is not None else to_device("torch", x_sf, "float32")
        got_x, got_sf = cupy_moe.expand_to_fused_with_sf(
            dx, dsf, map_to_device("torch", token_topk_to_pos),
            map_to_device("torch", pos_to_expert), num_per_channels=128, out=out)
        want_x, want_sf = reference.expand_to_fused_with_sf_numpy(
            x, x_sf, token_topk_to_pos, pos_to_expert, col_major=False)
        assert_bits_equal(to_host_bits("torch", got_x), want_x, "expanded_x")
        assert_bits_equal(to_host_bits("torch", got_sf), want_sf, "expanded_x_sf")
        return got_x

    def draw():
        return (random_bits(rng, (num_tokens, hidden), fp8),
                random_bits(rng, (num_tokens, 2), np.dtype("float32")),
                *fitted_routing(rng, num_tokens, top_k, num_expanded))

    call(*draw())  # full path: checks, then remembers the signature
    assert len(api._sf_fast_path)
    hits_before = len(api._sf_fast_path)
    call(*draw())  # fast path, fresh data
    assert len(api._sf_fast_path) == hits_before
    # same shapes, non-contiguous x and x_sf: the fast path must not take them
    x, x_sf, token_topk_to_pos, pos_to_expert = draw()
    wide = to_device("torch", np.concatenate([x, x], axis=1), "float8_e4m3fn")
    wide_sf = to_device("torch", np.concatenate([x_sf, x_sf], axis=1), "float32")
    call(x, x_sf, token_topk_to_pos, pos_to_expert, x_view=wide[:, :hidden],
         sf_view=wide_sf[:, :2])
    # an out= of the wrong dtype after a good one: still rejected
    out = torch.empty((num_expanded, hidden), dtype=torch.float8_e4m3fn, device="cuda")
    call(*draw(), out=out)
    with pytest.raises(ValueError, match="out must have dtype float8_e4m3fn"):
        cupy_moe.expand_to_fused_with_sf(
            to_device("torch", x, "float8_e4m3fn"), to_device("torch", x_sf, "float32"),
            map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert),
            num_per_channels=128, out=out.view(torch.uint8))


# -- offsets past 2^31 elements ----------------------------------------------------------

def test_offsets_past_two_to_the_31_elements():
    """A > 4 GiB output (64-bit offsets) on every kernel path: the routed rows
    (half of them past element 2^31) are their tokens' rows, every other row
    sampled around element 2^31 and at the end is zero, on a poisoned out."""
    from conftest import KERNEL_PATHS
    from gpu_cases import expand_op

    rng = np.random.default_rng()
    hidden, num_expanded, num_tokens, top_k = 4096, 2**31 // 4096 + 4000, 48, 4
    crossing = 2**31 // hidden  # the first row past element 2^31
    routed = np.r_[rng.choice(crossing, 96, replace=False),
                   crossing + rng.choice(num_expanded - crossing, 96, replace=False)]
    token_topk_to_pos = rng.permutation(routed).astype(np.int32).reshape(num_tokens, top_k)
    pos_to_expert = cupy.full(num_expanded, -1, dtype=cupy.int32)
    pos_to_expert[cupy.asarray(routed)] = 0
    x_host = random_bits(rng, (num_tokens, hidden), np.uint16)
    x, t2p = cupy.asarray(x_host), cupy.asarray(token_topk_to_pos)
    out = cupy.empty((num_expanded, hidden), dtype=cupy.uint16)
    sampled = np.r_[crossing - 2:crossing + 2, num_expanded - 2:num_expanded]
    sampled = sampled[~np.isin(sampled, routed)]
    token_of_row = {row: slot // top_k for slot, row in enumerate(token_topk_to_pos.flat)}
    want = x_host[[token_of_row[row] for row in routed]]
    for name, tuning in sorted(KERNEL_PATHS.items()):
        out.fill(0xFFFF)
        result = expand_op(tuning, x, t2p, pos_to_expert, out=out)
        assert result is out, name
        assert np.array_equal(cupy.asnumpy(out[cupy.asarray(routed)]), want), name
        assert not cupy.asnumpy(out[cupy.asarray(sampled)]).any(), name
    del out
