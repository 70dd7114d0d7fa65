"""``swiglu_quantize_fp8`` on the GPU against the NumPy oracle, bit for bit
(marker ``gpu``): over a thousand fresh random cases per array kind (weights,
padding rows and out-of-range slots, any I, both block sizes, every SF
layout, NaN / infinity / saturating-exp inputs, poisoned outputs, misaligned
arrays, the software e4m3 variant), the activations themselves against
``numerics.swiglu_f32``, a CUDA-graph capture of a decode shape and the torch
fast path."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gpu_cases import GPU_MARKS, KINDS, cupy, needs_torch_cuda, to_host_bits, torch
from quantize_cases import LAYOUTS, SPECIALS, as_input_dtype
from helpers import assert_bits_equal
from test_quantize_gpu import (
    TUNINGS,
    call_op,
    check_result,
    device_array,
    expected_sf_bits,
    input_dtype_name,
    map_array,
    poisoned_outputs,
    random_settings,
    random_values,
    sf_bits,
)

import cupy_moe
from cupy_moe.quantize import swiglu_quantize_fp8_numpy
from cupy_moe.quantize.launch_shape import QuantizeTuning
from cupy_moe.quantize.numerics import swiglu_f32
from cupy_moe.quantize.reference import swiglu_values_numpy

pytestmark = GPU_MARKS

CASES_PER_KIND = 600  # x 2 kinds: over a thousand


def random_h(rng, num_rows: int, inter: int, npc: int) -> np.ndarray:
    """float32 [X, 2I]: gates with hard blocks, some beyond the exp's clamps."""
    gate = random_values(rng, num_rows, inter, npc)
    with np.errstate(all="ignore"):  # infinities and NaN stay: wanted
        gate[rng.random(gate.shape) < 0.02] *= 1e3
    return np.concatenate([gate, random_values(rng, num_rows, inter, npc)], axis=1)


def random_maps(rng, num_rows: int) -> dict:
    """Some of topk_weights + pos_to_token_topk and pos_to_expert: a real
    routing plan's, or random maps with out-of-range slots."""
    kwargs = {}
    if rng.random() < 0.5:
        num_tokens, top_k = int(rng.integers(1, 20)), int(rng.integers(1, 9))
        weights = rng.standard_normal((num_tokens, top_k)).astype(np.float32)
        if rng.random() < 0.1:
            weights.reshape(-1)[0] = rng.choice([np.inf, np.nan, 0.0, -0.0])
        slots = rng.integers(-2, num_tokens * top_k + 3, size=num_rows).astype(np.int32)
        kwargs.update(topk_weights=weights, pos_to_token_topk=slots)
    if rng.random() < 0.5:
        kwargs["pos_to_expert"] = rng.integers(-1, 8, size=num_rows).astype(np.int32)
    return kwargs


def plan_maps(rng, num_tokens: int, top_k: int, num_experts: int, alignment: int):
    """A real routing plan's maps (host), its X, and random weights."""
    topk_ids = rng.integers(0, num_experts, size=(num_tokens, top_k))
    topk_ids[rng.random(topk_ids.shape) < 0.05] = -1
    plan = cupy_moe.fused_mapping(topk_ids.astype(np.int32), num_experts, alignment=alignment)
    weights = rng.random((num_tokens, top_k)).astype(np.float32)
    return {"topk_weights": weights, "pos_to_token_topk": plan.pos_to_token_topk,
            "pos_to_expert": plan.pos_to_expert}, plan.pos_to_expert.shape[0]


def maps_on_device(kind: str, maps: dict) -> dict:
    return {name: device_array(kind, array, "float32") if name == "topk_weights"
            else map_array(kind, array) for name, array in maps.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_random_cases_are_bit_identical_to_the_oracle(kind):
    rng = np.random.default_rng()
    for case in range(CASES_PER_KIND):
        if rng.integers(40) == 0:
            maps, num_rows = plan_maps(rng, int(rng.integers(50, 400)), 8, 16, 32)
            inter = int(rng.choice([768, 2048, 1040]))
        else:
            num_rows = 0 if rng.integers(30) == 0 else int(rng.integers(1, 40))
            # 1024, 2048, 3072: the row-major coalesced kernel (*_rows); 768,
            # 1536, 2304: *_rows768; 1056, 1152: the chunk-numbered one
            # (*_vec; I % npc == 0)
            inter = int(rng.choice([1, 16, 32, 100, 128, 129, 768, 1000, 1024, 1056, 1152, 1536,
                                      2048, 2304, 3072])
                        if rng.random() < 0.6 else rng.integers(1, 1500))
            maps = random_maps(rng, num_rows)
        layout, settings = random_settings(rng)
        npc = settings["num_per_channels"]
        dtype = "float32" if rng.random() < 0.4 else "bfloat16"
        h = as_input_dtype(random_h(rng, num_rows, inter, npc), dtype)
        expected = swiglu_quantize_fp8_numpy(h, **maps, **settings)
        tuning = TUNINGS[rng.integers(len(TUNINGS))]
        misalign = rng.integers(8) == 0
        kwargs = {**settings, **maps_on_device(kind, maps)}
        given = None
        if rng.random() < 0.5:
            given = poisoned_outputs(kind, rng, num_rows, inter, expected[1].shape[1],
                                     packed=settings["packed_ue8m0"],
                                     col_major=settings["use_tma_aligned_col_major_sf"],
                                     misalign=misalign)
            kwargs.update(out=given[0], out_sf=given[1])
        dh = device_array(kind, h, input_dtype_name(h), misalign=misalign)
        try:
            result = call_op("swiglu_quantize_fp8", tuning, dh, **kwargs)
            check_result(kind, result, expected, given=given,
                         col_major=settings["use_tma_aligned_col_major_sf"])
        except AssertionError as error:
            raise AssertionError(
                f"case {case}: X={num_rows} I={inter} {dtype} {layout} npc={npc} "
                f"maps={sorted(maps)} tuning={tuning} misalign={misalign} "
                f"out={given is not None}: {error}") from None


@pytest.mark.parametrize("kind", KINDS)
# 3072: *_rows under the default widths, *_rows768 (4 segments a row) under
# rows768-first; 768 and 1536: *_rows768 under both
@pytest.mark.parametrize("inter", [2048, 768, 1536, 3072])
@pytest.mark.parametrize("tuning", [None, QuantizeTuning(segment_columns=(768, 1024)),
                                    QuantizeTuning(segment_columns=()),
                                    QuantizeTuning(segment_columns=(512, 768)),
                                    QuantizeTuning(segment_columns=(256, 768))],
                         ids=["default", "rows768-first", "vec", "rows512", "rows256"])
def test_prefill_shapes_with_a_real_plan(kind, inter, tuning):
    rng = np.random.default_rng()
    maps, num_rows = plan_maps(rng, 256, 8, 64, 32)
    h = as_input_dtype(random_h(rng, num_rows, inter, 128), "bfloat16")
    for layout in ("row-f32", "col-ue8m0"):
        packed, col_major, round_sf = LAYOUTS[layout]
        settings = {"round_sf": round_sf, "packed_ue8m0": packed,
                    "use_tma_aligned_col_major_sf": col_major}
        check_result(kind, call_op(
            "swiglu_quantize_fp8", tuning, device_array(kind, h, "bfloat16"),
            **maps_on_device(kind, maps), **settings),
            swiglu_quantize_fp8_numpy(h, **maps, **settings), col_major=col_major,
            what=f"X={num_rows} I={inter} {layout}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("inter", [2048, 1000, 96])
def test_padding_heavy_plans(kind, inter):
    """Decode-like plans, most rows padding: whole warps of padding rows take
    the kernels' zero-store path (no arithmetic), next to warps that mix live
    and padding rows; poisoned outputs, every layout, both block sizes."""
    rng = np.random.default_rng()
    for num_tokens in (1, 3, 16):
        maps, num_rows = plan_maps(rng, num_tokens, 8, 64, 128)
        h = as_input_dtype(random_h(rng, num_rows, inter, 128), "bfloat16")
        for layout, (packed, col_major, round_sf) in LAYOUTS.items():
            npc = 32 if rng.random() < 0.5 else 128
            settings = {"num_per_channels": npc, "round_sf": round_sf,
                        "packed_ue8m0": packed, "use_tma_aligned_col_major_sf": col_major}
            expected = swiglu_quantize_fp8_numpy(h, **maps, **settings)
            given = poisoned_outputs(kind, rng, num_rows, inter, expected[1].shape[1],
                                     packed=packed, col_major=col_major, misalign=False)
            result = cupy_moe.quantize.swiglu_quantize_fp8(
                device_array(kind, h, "bfloat16"), **maps_on_device(kind, maps), **settings,
                out=given[0], out_sf=given[1])
            check_result(kind, result, expected, given=given, col_major=col_major,
                         what=f"T={num_tokens} X={num_rows} I={inter} {layout} npc={npc}")


def test_activations_are_those_of_the_oracle():
    """quant_swiglu_f32 (the kernels' exp, reciprocal and multiplies) against
    numerics.swiglu_f32 on 4 million gates spread over the float32 range and
    the specials, bit for bit (every NaN counted as one)."""
    from cupy_moe.runtime.launch import current_device
    from cupy_moe.runtime.loader import get_module

    rng = np.random.default_rng()
    count = 1 << 22
    gate = np.concatenate([
        rng.integers(0, 1 << 32, size=count // 2, dtype=np.uint64).astype(np.uint32).view(
            np.float32),
        (rng.standard_normal(count // 2 - SPECIALS.size) * 10.0 ** rng.uniform(
            -3, 2.2, count // 2 - SPECIALS.size)).astype(np.float32),
        SPECIALS])
    up = (rng.standard_normal(count) * 4).astype(np.float32)
    weight = rng.random(count).astype(np.float32)
    weight[::7] = 1.0
    # QUANTIZE_OPS=0: the self-test kernels alone (a shorter compile)
    kernel = get_module("quantize.cu", (*QuantizeTuning().defines(), ("QUANTIZE_OPS", 0)),
                        current_device()).get_function("quantize_selftest_swiglu")
    out = cupy.empty(count, dtype=cupy.float32)
    kernel((1024,), (256,), (cupy.asarray(gate), cupy.asarray(up), cupy.asarray(weight), out,
                             np.int64(count)))
    got, want = cupy.asnumpy(out), swiglu_f32(gate, up, weight)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        i = int(np.flatnonzero(~same)[0])
        raise AssertionError(f"{int((~same).sum())} activations differ; first: gate "
                             f"{gate[i]!r} up {up[i]!r} weight {weight[i]!r}: got {got[i]!r}, "
                             f"expected {want[i]!r}")


@needs_torch_cuda
@pytest.mark.parametrize("layout", ["row-f32", "col-f32", "col-ue8m0"])
def test_cuda_graph_capture_of_a_decode_shape(layout):
    """Decode: one token, top-8, experts padded to 8 rows each."""
    rng = np.random.default_rng()
    packed, col_major, round_sf = LAYOUTS[layout]
    num_tokens, top_k, inter = 1, 8, 2048
    maps, num_rows = plan_maps(rng, num_tokens, top_k, 64, 8)
    settings = {"round_sf": round_sf, "packed_ue8m0": packed,
                "use_tma_aligned_col_major_sf": col_major}
    h = torch.zeros((num_rows, 2 * inter), dtype=torch.bfloat16, device="cuda")
    static_maps = maps_on_device("torch", maps)
    out = torch.empty((num_rows, inter), dtype=torch.float8_e4m3fn, device="cuda")
    columns = 4 if packed else 16
    ld = -(-num_rows // 4) * 4
    sf_dtype = torch.int32 if packed else torch.float32
    buffer = torch.empty((columns, ld) if col_major else (num_rows, columns), dtype=sf_dtype,
                         device="cuda")
    out_sf = buffer[:, :num_rows].T if col_major else buffer

    def call():
        cupy_moe.quantize.swiglu_quantize_fp8(h, **static_maps, out=out, out_sf=out_sf,
                                              **settings)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(3):
        host = as_input_dtype(random_h(rng, num_rows, inter, 128), "bfloat16")
        new_maps, new_rows = plan_maps(rng, num_tokens, top_k, 64, 8)
        assert new_rows == num_rows  # X depends on T, K, E and the alignment only
        h.copy_(device_array("torch", host, "bfloat16"))
        for name, array in maps_on_device("torch", new_maps).items():
            static_maps[name].copy_(array)
        out.view(torch.uint8).fill_(0xAB)
        buffer.view(torch.int32).fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        check_result("torch", (out, out_sf),
                     swiglu_quantize_fp8_numpy(host, **new_maps, **settings),
                     col_major=col_major)


@needs_torch_cuda
def test_torch_fast_path_stays_exact(monkeypatch):
    from cupy_moe.quantize import api

    rng = np.random.default_rng()
    settings = {"num_per_channels": 128, "round_sf": True}
    maps, num_rows = plan_maps(rng, 6, 4, 8, 16)
    device_maps = maps_on_device("torch", maps)
    first = as_input_dtype(random_h(rng, num_rows, 512, 128), "bfloat16")
    cupy_moe.quantize.swiglu_quantize_fp8(device_array("torch", first, "bfloat16"),
                                          **device_maps, **settings)

    def full_path(*args, **kwargs):
        raise AssertionError("the fast path should have taken this call")

    monkeypatch.setattr(api, "check_swiglu", full_path)
    for _ in range(3):
        h = as_input_dtype(random_h(rng, num_rows, 512, 128), "bfloat16")
        check_result("torch", cupy_moe.quantize.swiglu_quantize_fp8(
            device_array("torch", h, "bfloat16"), **device_maps, **settings),
            swiglu_quantize_fp8_numpy(h, **maps, **settings), col_major=False)
    # without the weights, or with zero_padding=False: other keys, so the full
    # path (patched) is taken
    with pytest.raises(AssertionError, match="the fast path should have taken this call"):
        cupy_moe.quantize.swiglu_quantize_fp8(device_array("torch", first, "bfloat16"),
                                              pos_to_expert=device_maps["pos_to_expert"],
                                              **settings)
    with pytest.raises(AssertionError, match="the fast path should have taken this call"):
        cupy_moe.quantize.swiglu_quantize_fp8(device_array("torch", first, "bfloat16"),
                                              **device_maps, **settings, zero_padding=False)
    # with token_topk_to_pos, or validate=True: the full path too
    slot_rows = map_array("torch", np.full((6, 4), -1, np.int32))
    for extra in ({"token_topk_to_pos": slot_rows}, {"validate": True}):
        with pytest.raises(AssertionError, match="the fast path should have taken this call"):
            cupy_moe.quantize.swiglu_quantize_fp8(device_array("torch", first, "bfloat16"),
                                                  **device_maps, **settings, **extra)


# -- token_topk_to_pos: the *_slots kernels ---------------------------------------------

def slot_plan(rng, num_tokens: int, top_k: int, num_experts: int, local_experts: int,
              alignment: int, extra_rows: int):
    """A routing plan with remote experts (ids >= local_experts dropped) and X
    the default (worst-case) X plus ``extra_rows`` (< 0: fewer rows, the
    slots past them dropped): its maps, weights and ``token_topk_to_pos``
    (host), and X."""
    topk_ids = rng.integers(0, num_experts, size=(num_tokens, top_k)).astype(np.int32)
    topk_ids[rng.random(topk_ids.shape) < 0.05] = -1
    worst = cupy_moe.fused_mapping(topk_ids, local_experts, alignment=alignment)
    num_rows = max(0, worst.pos_to_expert.shape[0] + extra_rows)
    plan = cupy_moe.fused_mapping(topk_ids, local_experts, alignment=alignment,
                                  num_expanded=num_rows)
    maps = {"topk_weights": rng.standard_normal((num_tokens, top_k)).astype(np.float32),
            "pos_to_token_topk": plan.pos_to_token_topk, "pos_to_expert": plan.pos_to_expert}
    return maps, plan.token_topk_to_pos, num_rows


# by_slot_from_rows_per_slot=0: every call with the hint and zero_padding off;
# the wide coalesced kernel by I (*_rows_slots 2048, *_rows768_slots 768,
# *_vec_slots 1056), or *_vec1_slots, or *_vec_slots alone
BY_SLOT_TUNINGS = {
    "slots": QuantizeTuning(by_slot_from_rows_per_slot=0, narrow_slot_columns_per_sm=0),
    "slots-vec1": QuantizeTuning(by_slot_from_rows_per_slot=0,
                                 narrow_slot_columns_per_sm=float("inf")),
    "slots-vec": QuantizeTuning(by_slot_from_rows_per_slot=0, segment_columns=(),
                                narrow_slot_columns_per_sm=0),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tuning_name", sorted(BY_SLOT_TUNINGS))
@pytest.mark.parametrize("inter", [2048, 768, 1056, 100])
@pytest.mark.parametrize("misalign", [False, True], ids=["aligned", "misaligned"])
def test_by_slot_kernels_write_the_live_rows_only(kind, tuning_name, inter, misalign):
    """Given token_topk_to_pos with zero_padding=False: every live row bit-
    exact, padding rows (inside segments, past the last one) and dropped
    slots (remote experts, rows past X) leave the poisoned outputs as they
    were, the column-major SF pad columns are zeroed (by block 0, whichever
    rows are live); T = 0 (no slots) falls back to the rows. I = 100 with
    32-column blocks and misaligned h take the element-access kernel."""
    rng = np.random.default_rng()
    tuning = BY_SLOT_TUNINGS[tuning_name]
    for num_tokens, num_experts, local, alignment, extra in (
            (3, 16, 16, 8, 0), (9, 64, 16, 4, 1), (40, 32, 32, 1, -21), (5, 16, 8, 3, 3),
            (0, 8, 8, 4, 6)):
        maps, slot_rows, num_rows = slot_plan(rng, num_tokens, 4, num_experts, local,
                                              alignment, extra)
        h = as_input_dtype(random_h(rng, num_rows, inter, 128), "bfloat16")
        list(unzeroed_in_every_layout(kind, rng, tuning, h, maps, misalign,
                                      f"{tuning_name} T={num_tokens}",
                                      token_topk_to_pos=map_array(kind, slot_rows)))


@pytest.mark.parametrize("kind", KINDS)
def test_by_slot_validate_gives_the_cpus_message(kind):
    """validate=True on the GPU finds each kind of disagreeing hint with the
    CPU's message, before anything is written; a plan's own hint passes."""
    rng = np.random.default_rng()
    maps, slot_rows, num_rows = slot_plan(rng, 6, 4, 16, 16, 4, 2)
    h = as_input_dtype(random_h(rng, num_rows, 256, 128), "bfloat16")
    live_slot = int(np.flatnonzero(slot_rows.reshape(-1) >= 0)[0])
    padding_row = int(np.flatnonzero(maps["pos_to_expert"] < 0)[0])
    faults = []
    for value in (num_rows, padding_row):
        wrong = slot_rows.copy()
        wrong.reshape(-1)[live_slot] = value
        faults.append(wrong)
    swapped = slot_rows.copy().reshape(-1)
    named = np.flatnonzero(swapped >= 0)
    swapped[named[:2]] = swapped[named[1::-1]]  # two slots trade rows
    faults.append(swapped.reshape(slot_rows.shape))
    dropped = slot_rows.copy()
    dropped.reshape(-1)[live_slot] = -1  # a live row no slot names
    faults.append(dropped)
    for wrong in faults:
        with pytest.raises(ValueError) as on_cpu:
            cupy_moe.quantize.swiglu_quantize_fp8(h, **maps, token_topk_to_pos=wrong,
                                                  validate=True)
        out = device_array(kind, np.full((num_rows, 256), 0x5A, np.uint8), "uint8")
        with pytest.raises(ValueError, match=re.escape(str(on_cpu.value))):
            cupy_moe.quantize.swiglu_quantize_fp8(
                device_array(kind, h, "bfloat16"), **maps_on_device(kind, maps),
                token_topk_to_pos=map_array(kind, wrong), validate=True, out=out)
        assert (to_host_bits(kind, out) == 0x5A).all()  # nothing written
    result = cupy_moe.quantize.swiglu_quantize_fp8(
        device_array(kind, h, "bfloat16"), **maps_on_device(kind, maps),
        token_topk_to_pos=map_array(kind, slot_rows), validate=True)
    check_result(kind, result, swiglu_quantize_fp8_numpy(h, **maps), col_major=False)


@pytest.mark.parametrize("kind", KINDS)
def test_padding_rows_skip_their_inputs(kind):
    """A padding row's h may hold anything (NaN here): zeros come out."""
    rng = np.random.default_rng()
    h = rng.standard_normal((8, 512)).astype(np.float32)
    h[1::2] = np.nan
    experts = np.array([0, -1, 0, -1, 1, -1, 2, -1], dtype=np.int32)
    for layout in LAYOUTS:
        packed, col_major, round_sf = LAYOUTS[layout]
        settings = {"round_sf": round_sf, "packed_ue8m0": packed,
                    "use_tma_aligned_col_major_sf": col_major}
        check_result(kind, cupy_moe.quantize.swiglu_quantize_fp8(
            device_array(kind, h, "float32"), pos_to_expert=map_array(kind, experts),
            **settings),
            swiglu_quantize_fp8_numpy(h, pos_to_expert=experts, **settings),
            col_major=col_major, what=layout)


def check_padding_left(kind, result, given, oracle, padding, poison_codes, poison_sf,
                       col_major: bool, what: str) -> np.ndarray:
    """A zero_padding=False result written into the poisoned ``given``: live
    rows the oracle's bit for bit, padding rows' codes and scale factors the
    poison, the column-major SF pad columns zero. Returns the codes wanted."""
    num_rows = padding.shape[0]
    assert result[0] is given[0] and result[1] is given[1]
    want_codes = np.where(padding[:, None], poison_codes, oracle[0].view(np.uint8))
    assert_bits_equal(to_host_bits(kind, result[0]), want_codes, f"{what} codes")
    want_sf = expected_sf_bits(oracle[1], col_major=col_major)
    if col_major:  # [S, align(X, 4)]: rows are columns, the pad columns zero
        keep = np.zeros(want_sf.shape[1], bool)
        keep[:num_rows] = padding
        want_sf = np.where(keep[None, :], poison_sf, want_sf)
    else:
        want_sf = np.where(padding[:, None], poison_sf, want_sf)
    assert_bits_equal(sf_bits(kind, result[1], num_rows, col_major=col_major),
                      want_sf, f"{what} scale factors")
    return want_codes


def unzeroed_in_every_layout(kind, rng, tuning, h, maps: dict, misalign: bool, what: str,
                             **extra):
    """``h`` (bf16, host) through swiglu_quantize_fp8(zero_padding=False,
    **extra) under ``tuning`` in each SF layout (random block size) into
    poisoned outputs, checked by check_padding_left; yields each layout's
    settings, the codes wanted, the poison and a label."""
    num_rows, inter = h.shape[0], h.shape[1] // 2
    _, padding = swiglu_values_numpy(np.zeros((num_rows, 2), np.float32), **maps)
    for layout in ("row-f32", "col-f32", "col-ue8m0"):
        packed, col_major, round_sf = LAYOUTS[layout]
        settings = {"num_per_channels": int(rng.choice([32, 128])), "round_sf": round_sf,
                    "packed_ue8m0": packed, "use_tma_aligned_col_major_sf": col_major}
        oracle = swiglu_quantize_fp8_numpy(h, **maps, **settings)
        given = poisoned_outputs(kind, rng, num_rows, inter, oracle[1].shape[1],
                                 packed=packed, col_major=col_major, misalign=misalign)
        poison_codes = to_host_bits(kind, given[0])
        poison_sf = sf_bits(kind, given[1], num_rows, col_major=col_major)
        result = call_op("swiglu_quantize_fp8", tuning,
                         device_array(kind, h, "bfloat16", misalign=misalign),
                         **maps_on_device(kind, maps), **extra, **settings, zero_padding=False,
                         out=given[0], out_sf=given[1])
        label = f"{what} X={num_rows} I={inter} {layout} npc={settings['num_per_channels']}"
        want_codes = check_padding_left(kind, result, given, oracle, padding, poison_codes,
                                        poison_sf, col_major, label)
        yield settings, want_codes, poison_codes, label


# every kernel's padding path: the default's (wide at these X: *_rows,
# *_rows768, *_vec by I), *_vec (never row-major), *_vec1 and *_block_rows
# (few live rows), and *_any (misaligned h)
ZERO_PADDING_TUNINGS = {
    "default": None,
    "vec": QuantizeTuning(segment_columns=(), narrow_live_rows=0),
    "vec1": QuantizeTuning(narrow_live_rows=2**31, block_rows_from_bytes=float("inf")),
    "block_rows": QuantizeTuning(narrow_live_rows=2**31, block_rows_from_bytes=0,
                                 block_rows_blocks_per_sm=0.01),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tuning_name", sorted(ZERO_PADDING_TUNINGS))
@pytest.mark.parametrize("inter", [2048, 768, 1056, 100])
@pytest.mark.parametrize("misalign", [False, True], ids=["aligned", "misaligned"])
def test_zero_padding_off_leaves_padding_rows(kind, tuning_name, inter, misalign):
    """zero_padding=False: live rows bit-exact, padding rows' codes and scale
    factors left as they were (poisoned), the column-major SF pad columns
    zeroed (X = 37 and 38: a padding last row owns them in some cases)."""
    rng = np.random.default_rng()
    tuning = ZERO_PADDING_TUNINGS[tuning_name]
    for num_rows in (37, 38):
        maps = random_maps(rng, num_rows)
        maps["pos_to_expert"] = np.where(rng.random(num_rows) < 0.6, -1,
                                         rng.integers(0, 8, num_rows)).astype(np.int32)
        maps["pos_to_expert"][-1] = -1 if num_rows == 37 else 3
        h = as_input_dtype(random_h(rng, num_rows, inter, 128), "bfloat16")
        for settings, want_codes, poison_codes, what in unzeroed_in_every_layout(
                kind, rng, tuning, h, maps, misalign, tuning_name):
            # the oracle agrees: given the poisoned outputs, it keeps them too
            host_out = poison_codes.copy().view(np.uint8)
            numpy_codes, _ = swiglu_quantize_fp8_numpy(h, **maps, **settings,
                                                       zero_padding=False, out=host_out)
            assert_bits_equal(numpy_codes.view(np.uint8), want_codes, f"{what} oracle codes")
