"""``fused_mapping`` on the CPU (NumPy arrays and CPU tensors), against an
independent loop oracle; its rules and messages."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import cupy_moe
from cupy_moe.mapping import worst_case_rows
from cupy_moe.mapping.rules import MAX_ROWS
from helpers import assert_bits_equal
from mapping_cases import loop_mapping, random_case

FIELDS = cupy_moe.FusedMapping._fields


def check_plan(plan, topk_ids, num_experts, alignment, num_expanded):
    expected = loop_mapping(topk_ids, num_experts, alignment, num_expanded)
    for name, got, want in zip(FIELDS, plan, expected, strict=True):
        assert_bits_equal(np.asarray(got), want, name)


@pytest.mark.parametrize("seed", range(200))
def test_random_plans_match_the_loop_oracle(seed):
    rng = np.random.default_rng(seed)
    topk_ids, num_experts, alignment, num_expanded = random_case(rng, max_tokens=120,
                                                                 max_experts=300)
    plan = cupy_moe.fused_mapping(topk_ids, num_experts, alignment=alignment,
                                  num_expanded=num_expanded)
    x = num_expanded if num_expanded is not None else worst_case_rows(
        topk_ids.size, num_experts, alignment)
    check_plan(plan, topk_ids, num_experts, alignment, x)


def test_hand_example():
    topk_ids = np.array([[1, 0], [1, -1], [0, 7]], dtype=np.int64)  # 7: a remote expert
    plan = cupy_moe.fused_mapping(topk_ids, 2, alignment=4)
    # X = (6 slots + 2 experts * 3) // 4 * 4 = 12 rows; the last 4 are spare
    assert plan.token_topk_to_pos.tolist() == [[4, 0], [5, -1], [1, -1]]
    assert plan.pos_to_expert.tolist() == [0, 0, -1, -1, 1, 1, -1, -1] + [-1] * 4
    assert plan.pos_to_token.tolist() == [0, 2, -1, -1, 0, 1, -1, -1] + [-1] * 4
    assert plan.pos_to_token_topk.tolist() == [1, 4, -1, -1, 0, 2, -1, -1] + [-1] * 4
    assert plan.expert_start.tolist() == [0, 4] and plan.expert_end.tolist() == [2, 6]
    assert plan.tokens_per_expert.tolist() == [2, 2]
    assert all(a.dtype == np.int32 for a in plan)


@pytest.mark.parametrize(("num_tokens", "top_k", "num_experts", "alignment", "rows"), [
    (1, 8, 384, 128, 1024),     # decode: 8 experts at most, not 384 (48768 rows)
    (0, 8, 384, 128, 0),
    (4096, 8, 128, 128, 49024),  # (32768 + 128 * 127) // 128 * 128
    (3, 2, 5, 1, 6),
])
def test_default_rows_are_the_tight_worst_case(num_tokens, top_k, num_experts, alignment, rows):
    assert worst_case_rows(num_tokens * top_k, num_experts, alignment) == rows
    topk_ids = np.zeros((num_tokens, top_k), dtype=np.int32)
    plan = cupy_moe.fused_mapping(topk_ids, num_experts, alignment=alignment)
    assert plan.pos_to_expert.shape == (rows,)


def test_trim_gives_the_exact_rows_and_num_expanded_drops_what_does_not_fit():
    topk_ids = np.array([[0, 1], [1, 1], [2, -1]], dtype=np.int32)
    trimmed = cupy_moe.fused_mapping(topk_ids, 3, alignment=4, trim=True)
    assert trimmed.pos_to_expert.tolist() == [0, -1, -1, -1, 1, 1, 1, -1, 2, -1, -1, -1]
    short = cupy_moe.fused_mapping(topk_ids, 3, alignment=4, num_expanded=6)
    assert short.token_topk_to_pos.tolist() == [[0, 4], [5, -1], [-1, -1]]
    assert short.expert_start.tolist() == [0, 4, 8]  # segments do not depend on X
    assert cupy_moe.fused_mapping(topk_ids, 3, alignment=4, num_expanded=6,
                                  trim=True).pos_to_expert.shape == (6,)


def test_torch_cpu_in_torch_out():
    topk_ids = torch.tensor([[2, 0], [0, -1]], dtype=torch.int64)
    plan = cupy_moe.fused_mapping(topk_ids, 3, alignment=2)
    assert all(isinstance(a, torch.Tensor) and a.dtype == torch.int32 for a in plan)
    check_plan(plan, topk_ids.numpy(), 3, 2, worst_case_rows(4, 3, 2))


def test_plan_feeds_expand_to_fused(rng):
    topk_ids = rng.integers(-1, 6, size=(40, 4)).astype(np.int32)
    plan = cupy_moe.fused_mapping(topk_ids, 6, alignment=8, trim=True)
    x = rng.integers(0, 2**16, size=(40, 16)).astype(np.uint16)
    y = cupy_moe.expand_to_fused(x, plan.token_topk_to_pos, plan.pos_to_expert, validate=True)
    rows = plan.pos_to_token.astype(np.int64)
    assert np.array_equal(y[rows >= 0], x[rows[rows >= 0]])
    assert not y[rows < 0].any()


@pytest.mark.parametrize(("topk_ids", "kwargs", "message", "dropped"), [
    ([[0, 5]], {}, "topk_ids[0, 1] = 5 is not an expert: num_experts = 3", (0, 1)),
    ([[0, 1], [1, 1]], {"num_expanded": 2},
     "topk_ids[1, 0] = 1 found no row: its expert's segment reaches past num_expanded = 2",
     (1, 0)),
])
def test_validate_names_the_first_fault(topk_ids, kwargs, message, dropped):
    ids = np.array(topk_ids, dtype=np.int32)
    with pytest.raises(ValueError, match=re.escape(message)):
        cupy_moe.fused_mapping(ids, 3, alignment=1, validate=True, **kwargs)
    # without validate the same slot is dropped, and nothing names it
    plan = cupy_moe.fused_mapping(ids, 3, alignment=1, **kwargs)
    assert plan.token_topk_to_pos[dropped] == -1
    assert dropped[0] * ids.shape[1] + dropped[1] not in plan.pos_to_token_topk


def test_gpu_expert_limit_is_a_value_error():
    # the rule reads the description alone: a CuPy-kind one needs no GPU
    from cupy_moe.mapping.rules import MAX_EXPERTS_GPU, check_fused_mapping
    from cupy_moe.runtime.arrays import ArrayDesc, ArrayKind

    desc = ArrayDesc(ArrayKind.CUPY, (4, 2), "int32", 0, True, False, True)
    assert check_fused_mapping(desc, MAX_EXPERTS_GPU, 1, None).num_experts == MAX_EXPERTS_GPU
    with pytest.raises(ValueError, match=re.escape(
            f"num_experts must be <= {MAX_EXPERTS_GPU} on the GPU; got {MAX_EXPERTS_GPU + 1}")):
        check_fused_mapping(desc, MAX_EXPERTS_GPU + 1, 1, None)


@pytest.mark.parametrize(("topk_ids", "kwargs", "error", "message"), [
    (None, {}, TypeError, "topk_ids must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got None"),
    (np.zeros(4, np.int32), {}, ValueError, "topk_ids must be 2-D [T, K]; got shape (4,)"),
    (np.zeros((2, 2), np.float32), {}, ValueError, "topk_ids must be one of int32, int64; got float32"),
    (np.zeros((2, 0), np.int32), {}, ValueError, "topk_ids must have K = shape[1] >= 1 slots"),
    (np.zeros((2, 2), np.int32), {"num_experts": 0}, ValueError, "num_experts must be >= 1; got 0"),
    (np.zeros((2, 2), np.int32), {"num_experts": 4.0}, TypeError, "num_experts must be an int; got float"),
    (np.zeros((2, 2), np.int32), {"alignment": 0}, ValueError, "alignment must be >= 1; got 0"),
    (np.zeros((2, 2), np.int32), {"num_expanded": -1}, ValueError, "num_expanded must be >= 0; got -1"),
    (np.zeros((2, 2), np.int32), {"trim": "yes"}, TypeError, "trim must be True or False; got str"),
    (np.zeros((2, 2), np.int32), {"validate": 1}, TypeError, "validate must be True or False; got int"),
    (np.zeros((2, 2), np.int32), {"num_expanded": 2**30}, ValueError,
     f"T * K = 4 slots with alignment 128 may need 512 rows and num_expanded is {2**30}; "
     f"at most {(2**31 - 1) // 3} rows are supported"),
    # the default num_expanded is named as such (not as if the caller gave it)
    (np.zeros((2, 2), np.int32), {"alignment": 2**29}, ValueError,
     f"T * K = 4 slots with alignment {2**29} may need {2**31} rows (the default "
     f"num_expanded); at most {(2**31 - 1) // 3} rows are supported"),
    (np.zeros((2, 2), np.int32), {"num_experts": 2**63}, ValueError,
     f"num_experts must be <= {2**31 - 1} (int32 ids); got {2**63}"),
    (np.zeros((0, 2), np.int32), {"alignment": 2**70}, ValueError,
     f"alignment must be <= {(2**31 - 1) // 3} rows; got {2**70}"),
])
def test_bad_arguments(topk_ids, kwargs, error, message):
    kwargs = {"num_experts": 4, **kwargs}
    with pytest.raises(error, match=re.escape(message)):
        cupy_moe.fused_mapping(topk_ids, kwargs.pop("num_experts"), **kwargs)


# -- bounds at their edges (each test killed a mutant the suite let through) --------------------

def test_validate_calls_an_id_of_exactly_e_no_expert():
    with pytest.raises(ValueError, match=re.escape(
            "topk_ids[0, 1] = 3 is not an expert: num_experts = 3")):
        cupy_moe.fused_mapping(np.array([[0, 3]], np.int32), 3, alignment=1, validate=True)


def test_a_small_num_expanded_does_not_hide_the_segment_bound():
    """Segment starts must fit int32 whatever X is given."""
    with pytest.raises(ValueError, match=re.escape(
            f"T * K = 4 slots with alignment {2**29} may need {2**31} rows and num_expanded "
            f"is 0; at most {MAX_ROWS} rows are supported")):
        cupy_moe.fused_mapping(np.zeros((2, 2), np.int32), 4, alignment=2**29, num_expanded=0)


def test_alignment_at_and_one_past_the_row_limit():
    with pytest.raises(ValueError, match=re.escape(
            f"alignment must be <= {MAX_ROWS} rows; got {MAX_ROWS + 1}")):
        cupy_moe.fused_mapping(np.zeros((0, 2), np.int32), 4, alignment=MAX_ROWS + 1)
    plan = cupy_moe.fused_mapping(np.zeros((0, 2), np.int32), 4, alignment=MAX_ROWS)
    assert plan.pos_to_expert.shape == (0,)
