"""zero_padding=False on the CPU (NumPy arrays and CPU torch tensors): expert
rows bit for bit as with zero_padding=True, padding rows of a caller's outputs
untouched (poisoned first), the column-major SF's pad columns still zero."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_cases import (
    KINDS,
    SF_LAYOUTS,
    as_kind,
    col_major_sf_buffer,
    exact,
    expand,
    expand_sf,
    i32,
    routed_case,
    sf_inputs,
    to_host,
)
from helpers import (
    align_up,
    assert_bits_equal,
    assert_expert_rows_equal,
    bits,
    make_expert_major_routing,
    make_topk_ids,
    np_dtype,
    oracle_expand,
    poisoned,
)

import cupy_moe

smoke = pytest.mark.smoke


def _padded_routing(num_tokens: int, top_k: int, extra_padding: int):
    """Expert-major map (experts padded to 4 rows, some slots dropped) followed by
    ``extra_padding`` padding rows: padding inside X and at its end, X % 4 ==
    extra_padding % 4."""
    topk_ids = make_topk_ids(num_tokens, top_k, 5, invalid_every=3)
    token_topk_to_pos, pos_to_expert = make_expert_major_routing(topk_ids, 5, 4)
    pos_to_expert = np.concatenate([pos_to_expert, np.full(extra_padding, -1, np.int32)])
    assert (pos_to_expert[:pos_to_expert.shape[0] - extra_padding] < 0).any()
    return token_topk_to_pos, pos_to_expert


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_plain_op_leaves_padding_rows_of_out(kind, rng):
    x, token_topk_to_pos, pos_to_expert = routed_case(
        rng, num_tokens=9, hidden=24, top_k=3, num_experts=5, block_size=4, invalid_every=3)
    assert (pos_to_expert < 0).any()
    before = poisoned((pos_to_expert.shape[0], 24), x.dtype)
    out = as_kind(kind, before.copy())

    result = cupy_moe.expand_to_fused(as_kind(kind, x), as_kind(kind, token_topk_to_pos),
                                      as_kind(kind, pos_to_expert), out=out, zero_padding=False)

    assert result is out
    assert_bits_equal(to_host(kind, out, "bfloat16"),
                      oracle_expand(x, token_topk_to_pos, pos_to_expert,
                                    padding_rows_from=before), "expanded_x")


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_plain_op_fresh_output_has_the_expert_rows(kind, rng):
    x, token_topk_to_pos, pos_to_expert = routed_case(
        rng, num_tokens=9, hidden=24, top_k=3, num_experts=5, block_size=4, invalid_every=3)

    actual = expand(kind, x, token_topk_to_pos, pos_to_expert, zero_padding=False)

    assert_expert_rows_equal(actual, oracle_expand(x, token_topk_to_pos, pos_to_expert),
                             pos_to_expert, "expanded_x")


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("zero_padding", [None, True], ids=["default", "True"])
def test_zero_padding_true_is_the_default_and_zeroes_padding_rows(kind, zero_padding, rng):
    x, token_topk_to_pos, pos_to_expert = routed_case(
        rng, num_tokens=9, hidden=24, top_k=3, num_experts=5, block_size=4, invalid_every=3)
    out = as_kind(kind, poisoned((pos_to_expert.shape[0], 24), x.dtype))
    flag = {} if zero_padding is None else {"zero_padding": zero_padding}

    cupy_moe.expand_to_fused(as_kind(kind, x), as_kind(kind, token_topk_to_pos),
                             as_kind(kind, pos_to_expert), out=out, **flag)

    assert_bits_equal(to_host(kind, out, "bfloat16"),
                      oracle_expand(x, token_topk_to_pos, pos_to_expert), "expanded_x")


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", list(SF_LAYOUTS))
@pytest.mark.parametrize("extra_padding", [0, 1, 2, 3], ids=lambda n: f"pad{n}")
def test_with_sf_leaves_padding_rows_of_outputs_and_zeroes_pad_columns(
        kind, layout, extra_padding, rng):
    """Padding rows of out and out_sf keep the poison; the column-major buffer's
    pad columns X .. align(X, 4) (no row's scale factors) are zero."""
    col_major, sf_dtype = SF_LAYOUTS[layout]
    x, x_sf = sf_inputs(rng, 7, 200, 32, sf_dtype)
    token_topk_to_pos, pos_to_expert = _padded_routing(7, 2, extra_padding)
    num_expanded, s = pos_to_expert.shape[0], x_sf.shape[1]
    out_before = poisoned((num_expanded, 200), x.dtype)
    out = as_kind(kind, out_before.copy())
    if col_major:
        buffer_before = poisoned((s, align_up(num_expanded, 4)), sf_dtype)
        buffer = as_kind(kind, buffer_before.copy())
        out_sf = buffer[:, :num_expanded].T
    else:
        buffer_before = poisoned((num_expanded, s), sf_dtype)
        buffer = out_sf = as_kind(kind, buffer_before.copy())

    result, result_sf = cupy_moe.expand_to_fused_with_sf(
        *(as_kind(kind, a) for a in (x, x_sf, token_topk_to_pos, pos_to_expert)),
        num_per_channels=32, use_tma_aligned_col_major_sf=col_major, out=out, out_sf=out_sf,
        zero_padding=False)

    assert result is out and result_sf is out_sf
    assert_bits_equal(to_host(kind, out, x.dtype.name),
                      oracle_expand(x, token_topk_to_pos, pos_to_expert,
                                    padding_rows_from=out_before), "expanded_x")
    buffer = to_host(kind, buffer, sf_dtype)
    if col_major:
        expected_rows = oracle_expand(x_sf, token_topk_to_pos, pos_to_expert,
                                      padding_rows_from=buffer_before[:, :num_expanded].T)
        expected_buffer = np.zeros(buffer_before.shape, x_sf.dtype)
        bits(expected_buffer)[:, :num_expanded] = bits(expected_rows).T
        assert_bits_equal(buffer, expected_buffer, "out_sf buffer with pad columns")
    else:
        assert_bits_equal(buffer, oracle_expand(x_sf, token_topk_to_pos, pos_to_expert,
                                                padding_rows_from=buffer_before),
                          "expanded_x_sf")


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", list(SF_LAYOUTS))
@pytest.mark.parametrize("extra_padding", [0, 1, 3], ids=lambda n: f"pad{n}")
def test_with_sf_fresh_outputs_have_the_expert_rows_and_zero_pad_columns(
        kind, layout, extra_padding, rng):
    col_major, sf_dtype = SF_LAYOUTS[layout]
    x, x_sf = sf_inputs(rng, 7, 200, 32, sf_dtype)
    token_topk_to_pos, pos_to_expert = _padded_routing(7, 2, extra_padding)
    num_expanded = pos_to_expert.shape[0]

    out, out_sf = expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=32,
                            col_major=col_major, zero_padding=False)

    assert_expert_rows_equal(out, oracle_expand(x, token_topk_to_pos, pos_to_expert),
                             pos_to_expert, "expanded_x")
    assert_expert_rows_equal(out_sf, oracle_expand(x_sf, token_topk_to_pos, pos_to_expert),
                             pos_to_expert, "expanded_x_sf")
    if col_major:
        pad_columns = col_major_sf_buffer(out_sf)[:, num_expanded:]
        assert pad_columns.shape[1] == align_up(num_expanded, 4) - num_expanded
        assert not bits(pad_columns).any(), "pad columns of the SF buffer are not zero"


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["none", *SF_LAYOUTS])
def test_zero_tokens_zero_the_expert_rows_and_leave_padding_rows(kind, layout, rng):
    """T == 0: expert rows (no slot writes them) are zeros as with zero_padding=True;
    padding rows keep the poison; the column-major pad column is zero."""
    pos_to_expert = i32([0, 0, 1, 1, -1, 2, -1])  # X = 7: one pad column
    expert_rows = pos_to_expert >= 0
    token_topk_to_pos = np.empty((0, 4), np.int32)
    if layout == "none":
        x = np.empty((0, 40), np_dtype("bfloat16"))
        before = poisoned((7, 40), x.dtype)
        out = as_kind(kind, before.copy())
        cupy_moe.expand_to_fused(as_kind(kind, x), as_kind(kind, token_topk_to_pos),
                                 as_kind(kind, pos_to_expert), out=out, zero_padding=False)
        bits(before)[expert_rows] = 0
        assert_bits_equal(to_host(kind, out, "bfloat16"), before, "expanded_x")
        return
    col_major, sf_dtype = SF_LAYOUTS[layout]
    x, x_sf = sf_inputs(rng, 0, 256, 128, sf_dtype)
    s = x_sf.shape[1]
    out_before = poisoned((7, 256), x.dtype)
    out = as_kind(kind, out_before.copy())
    buffer_before = poisoned((s, 8) if col_major else (7, s), sf_dtype)
    buffer = as_kind(kind, buffer_before.copy())
    out_sf = buffer[:, :7].T if col_major else buffer

    cupy_moe.expand_to_fused_with_sf(
        *(as_kind(kind, a) for a in (x, x_sf, token_topk_to_pos, pos_to_expert)),
        num_per_channels=128, use_tma_aligned_col_major_sf=col_major, out=out, out_sf=out_sf,
        zero_padding=False)

    bits(out_before)[expert_rows] = 0
    assert_bits_equal(to_host(kind, out, x.dtype.name), out_before, "expanded_x")
    if col_major:
        bits(buffer_before)[:, :7][:, expert_rows] = 0
        bits(buffer_before)[:, 7:] = 0
    else:
        bits(buffer_before)[expert_rows] = 0
    assert_bits_equal(to_host(kind, buffer, sf_dtype), buffer_before, "out_sf buffer")


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_validate_checks_the_map_before_leaving_padding_rows(kind, rng):
    x, token_topk_to_pos, pos_to_expert = routed_case(
        rng, num_tokens=9, hidden=24, top_k=3, num_experts=5, block_size=4, invalid_every=3)
    padding_row = int(np.flatnonzero(pos_to_expert < 0)[0])
    before = poisoned((pos_to_expert.shape[0], 24), x.dtype)
    out = as_kind(kind, before.copy())
    args = [as_kind(kind, a) for a in (x, token_topk_to_pos, pos_to_expert)]

    cupy_moe.expand_to_fused(*args, out=out, validate=True, zero_padding=False)

    assert_bits_equal(to_host(kind, out, "bfloat16"),
                      oracle_expand(x, token_topk_to_pos, pos_to_expert,
                                    padding_rows_from=before), "expanded_x")
    bad = token_topk_to_pos.copy()
    bad[0, 0] = padding_row
    with pytest.raises(ValueError, match=exact(
            f"token_topk_to_pos[0, 0] = {padding_row} targets a padding position "
            f"(pos_to_expert[{padding_row}] < 0)")):
        cupy_moe.expand_to_fused(args[0], as_kind(kind, bad), args[2], out=out, validate=True,
                                 zero_padding=False)
