"""``validate=True``, malformed maps, array kinds, strides and error wording on
the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cpu_cases import (
    KINDS,
    SF_LAYOUTS,
    as_kind,
    check_expand,
    check_expand_sf,
    exact,
    expand,
    expand_sf,
    i32,
    routed_case,
    sf_inputs,
    sf_width,
    to_host,
)
from helpers import (
    assert_bits_equal,
    bits,
    make_expert_major_routing,
    make_manifest_routing,
    make_topk_ids,
    np_dtype,
    oracle_expand,
    random_payload,
    to_torch,
)

import cupy_moe

smoke, full = pytest.mark.smoke, pytest.mark.full


VALIDATE_CASES = [
    pytest.param([[0, 1], [2, 4]], [0, 0, 1, 1],
                 "token_topk_to_pos[1, 1] = 4 is out of range: pos_to_expert has X = 4 rows",
                 id="out-of-range"),
    pytest.param([[0, 1], [3, 2]], [0, 0, 1, -1],
                 "token_topk_to_pos[1, 0] = 3 targets a padding position (pos_to_expert[3] < 0)",
                 id="padding-target"),
    pytest.param([[0, 1], [1, 2]], [0, 0, 1],
                 "token_topk_to_pos[1, 0] = 1 duplicates a position an earlier slot already "
                 "targets (duplicate valid positions)", id="duplicate"),
    pytest.param([[0, -1], [2, -1]], [0, 0, 1],
                 "pos_to_expert[1] >= 0 marks an expert row that no slot of token_topk_to_pos "
                 "targets (row never targeted)", id="never-targeted"),
    pytest.param([[0, 7], [9, 1]], [0, 0],
                 "token_topk_to_pos[0, 1] = 7 is out of range", id="first-of-two-out-of-range"),
    pytest.param([[-1, 0], [2, 2]], [0, -1, 1],
                 "token_topk_to_pos[1, 1] = 2 duplicates", id="first-duplicate-is-second-use"),
    # Several kinds of fault: out of range > padding target > duplicate > never targeted.
    pytest.param([[3, 0], [1, 5]], [0, 0, 0, -1],
                 "token_topk_to_pos[1, 1] = 5 is out of range", id="out-of-range-before-padding"),
    pytest.param([[0, 0], [2, -1]], [0, 1, -1],
                 "token_topk_to_pos[1, 0] = 2 targets a padding position",
                 id="padding-before-duplicate"),
    pytest.param([[0, -1], [0, -1]], [0, 0],
                 "token_topk_to_pos[1, 0] = 0 duplicates", id="duplicate-before-never-targeted"),
    pytest.param(np.empty((0, 2)), [-1, 3], "pos_to_expert[1] >= 0 marks an expert row",
                 id="zero-tokens-with-expert-row"),
]


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("token_topk_to_pos", "pos_to_expert", "message"), VALIDATE_CASES)
def test_validate_names_first_offending_index(kind, token_topk_to_pos, pos_to_expert, message,
                                              rng):
    token_topk_to_pos, pos_to_expert = i32(token_topk_to_pos), i32(pos_to_expert)
    x = random_payload(rng, (token_topk_to_pos.shape[0], 8), "bfloat16")
    with pytest.raises(ValueError, match=exact(message)):
        expand(kind, x, token_topk_to_pos, pos_to_expert, validate=True)


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_validate_with_sf(kind, rng):
    x, x_sf = sf_inputs(rng, 2, 128, 128, "float32")
    with pytest.raises(ValueError, match=exact("token_topk_to_pos[1, 0] = 3 targets a padding")):
        expand_sf(kind, x, x_sf, i32([[0, 1], [3, 2]]), i32([0, 0, 1, -1]), npc=128,
                  validate=True)


# pos_to_token (both ops' hint): checked after every other kind of fault
POS_TO_TOKEN_CASES = [
    pytest.param([[0, 1], [2, 3]], [0, 0, 1, 1], [0, 0, 0, 1],
                 "pos_to_token[2] = 0 disagrees with token_topk_to_pos[1, 0] = 2: row 2 holds "
                 "token 1", id="wrong-token"),
    pytest.param([[0, -1], [2, 1]], [0, 0, 1, -1], [0, -1, 1, -1],
                 "pos_to_token[1] = -1 disagrees with token_topk_to_pos[1, 1] = 1: row 1 holds "
                 "token 1", id="minus-one-on-an-expert-row"),
    pytest.param([[0, 1], [2, 2]], [0, 0, 1, -1], [9, 9, 9, 9],
                 "token_topk_to_pos[1, 1] = 2 duplicates", id="duplicate-first"),
]


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", ["plain", "sf"])
@pytest.mark.parametrize(("token_topk_to_pos", "pos_to_expert", "pos_to_token", "message"),
                         POS_TO_TOKEN_CASES)
def test_validate_checks_pos_to_token(kind, op, token_topk_to_pos, pos_to_expert, pos_to_token,
                                      message, rng):
    x, x_sf = sf_inputs(rng, 2, 128, 128, "int32")
    hint = {"pos_to_token": as_kind(kind, i32(pos_to_token))}
    with pytest.raises(ValueError, match=exact(message)):
        if op == "plain":
            expand(kind, x.view(np.uint16), i32(token_topk_to_pos), i32(pos_to_expert),
                   validate=True, **hint)
        else:
            expand_sf(kind, x, x_sf, i32(token_topk_to_pos), i32(pos_to_expert), npc=128,
                      col_major=True, validate=True, **hint)


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_pos_to_token_is_a_hint_the_results_do_not_follow(kind, rng):
    """The CPU ignores it (but for validate); padding rows' values never matter."""
    plan = cupy_moe.reference.fused_mapping_numpy(make_topk_ids(9, 3, 4, rng=rng), 4,
                                                  alignment=8)
    token_topk_to_pos, pos_to_expert = plan.token_topk_to_pos, plan.pos_to_expert
    x, x_sf = sf_inputs(rng, 9, 256, 128, "int32")
    want = expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128, col_major=True)
    pos_to_token = plan.pos_to_token.copy()
    pos_to_token[pos_to_expert < 0] = 12345  # padding rows: anything
    got = expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128, col_major=True,
                    validate=True, pos_to_token=as_kind(kind, pos_to_token))
    for name, a, b in zip(("expanded_x", "expanded_x_sf"), got, want, strict=True):
        assert_bits_equal(a, b, name)
    rows = x.view(np.uint16)
    assert_bits_equal(expand(kind, rows, token_topk_to_pos, pos_to_expert, validate=True,
                             pos_to_token=as_kind(kind, pos_to_token)),
                      expand(kind, rows, token_topk_to_pos, pos_to_expert), "expanded_x")


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_validate_accepts_well_formed_map(kind, rng):
    """Any negative slot is a dropped slot, not a fault."""
    x, token_topk_to_pos, pos_to_expert = routed_case(
        rng, num_tokens=11, hidden=40, top_k=4, num_experts=6, block_size=8, invalid_every=3)
    dropped = token_topk_to_pos < 0
    token_topk_to_pos[dropped] = -5
    token_topk_to_pos[np.nonzero(dropped)[0][0], -1] = np.iinfo(np.int32).min

    actual = expand(kind, x, token_topk_to_pos, pos_to_expert, validate=True)

    assert_bits_equal(actual, oracle_expand(x, token_topk_to_pos, pos_to_expert))


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_unvalidated_malformed_map_stays_in_bounds(kind, rng):
    """validate=False: no error, nothing written outside the outputs, and the
    padding row a slot names (row 3) zero, as every padding row: the public
    ops leave such rows unspecified, but the CPU backend is the oracle, whose
    reference promises zeros there."""
    num_tokens, hidden, num_expanded, guard = 4, 64, 6, 2
    # Positions >= X (6, 9, INT32_MAX), a duplicate (2), a padding target (3) and
    # an odd negative (-5, merely a dropped slot).
    token_topk_to_pos = i32([[0, 6], [9, -5], [2**31 - 1, 2], [3, 2]])
    pos_to_expert = i32([0, 0, 1, -1, 2, 2])
    x, x_sf = sf_inputs(rng, num_tokens, hidden, 32, "float32")
    bf16 = random_payload(rng, (num_tokens, 8), "bfloat16")
    guarded = [random_payload(rng, (num_expanded + 2 * guard, cols), a.dtype)
               for a, cols in ((x, hidden), (x_sf, x_sf.shape[1]), (bf16, 8))]
    before = [g.copy() for g in guarded]
    buffers = [as_kind(kind, g) for g in guarded]
    inner = [b[guard:guard + num_expanded] for b in buffers]

    cupy_moe.expand_to_fused_with_sf(
        *(as_kind(kind, a) for a in (x, x_sf, token_topk_to_pos, pos_to_expert)),
        num_per_channels=32, out=inner[0], out_sf=inner[1])
    cupy_moe.expand_to_fused(*(as_kind(kind, a) for a in (bf16, token_topk_to_pos,
                                                           pos_to_expert)), out=inner[2])

    for buffer, old in zip(buffers, before, strict=True):
        now = to_host(kind, buffer, old.dtype.name)
        for rows in (slice(0, guard), slice(guard + num_expanded, None)):
            assert_bits_equal(now[rows], old[rows], "guard rows")
        assert not now[guard + 3].view(np.uint8).any(), "the padding row a slot names"


def _strided(kind: str, array: np.ndarray, how: str):
    """A non-contiguous array (of ``kind``) with the values of ``array``."""
    if how == "transposed-copy" and array.ndim == 2:
        return as_kind(kind, np.ascontiguousarray(array.T)).T
    # Every other element (every other column of a 2-D array), after one leading one.
    big = np.zeros(array.shape[:-1] + (2 * array.shape[-1] + 1,), array.dtype)
    bits(big)[..., 1::2] = bits(array)
    return as_kind(kind, big)[..., 1::2]


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["column-slice", "transposed-copy"])
def test_non_contiguous_inputs(kind, how, rng):
    x, token_topk_to_pos, pos_to_expert = routed_case(
        rng, num_tokens=9, hidden=20, top_k=3, num_experts=4, block_size=4, invalid_every=2)
    inputs = [_strided(kind, a, how) for a in (x, token_topk_to_pos, pos_to_expert)]
    assert not any(a.flags.c_contiguous if kind == "numpy" else a.is_contiguous()
                   for a in inputs[:2])

    actual = to_host(kind, cupy_moe.expand_to_fused(*inputs), "bfloat16")
    assert_bits_equal(actual, oracle_expand(x, token_topk_to_pos, pos_to_expert))

    fp8, x_sf = sf_inputs(rng, 9, 256, 128, "float32")
    out, out_sf = cupy_moe.expand_to_fused_with_sf(
        _strided(kind, fp8, how), _strided(kind, x_sf, how), *inputs[1:],
        num_per_channels=128, use_tma_aligned_col_major_sf=True)
    assert_bits_equal(to_host(kind, out, "float8_e4m3fn"),
                      oracle_expand(fp8, token_topk_to_pos, pos_to_expert))
    assert_bits_equal(to_host(kind, out_sf, "float32"),
                      oracle_expand(x_sf, token_topk_to_pos, pos_to_expert))


@smoke
@pytest.mark.parametrize(("x_dtype", "sf_dtype"), [
    pytest.param("bfloat16", None, id="bf16"),
    pytest.param("float16", None, id="fp16"),
    pytest.param("float8_e4m3fn", "float32", id="fp8-f32-sf"),
    pytest.param("float8_e4m3fn", "int32", id="fp8-ue8m0-sf"),
    pytest.param("uint8", "float32", id="u8-payload-f32-sf"),
])
def test_torch_in_torch_out_native_dtypes(x_dtype, sf_dtype, rng):
    token_topk_to_pos, pos_to_expert = make_manifest_routing(4, 2, 9)
    x = random_payload(rng, (4, 256), x_dtype)
    args = [to_torch(a) for a in (token_topk_to_pos, pos_to_expert)]
    if sf_dtype is None:
        results = [cupy_moe.expand_to_fused(to_torch(x), *args)]
        expected_dtypes = [x_dtype]
    else:
        x_sf = random_payload(rng, (4, sf_width(256, 128, sf_dtype)), sf_dtype)
        results = cupy_moe.expand_to_fused_with_sf(
            to_torch(x), to_torch(x_sf), *args, num_per_channels=128,
            use_tma_aligned_col_major_sf=sf_dtype == "int32")
        expected_dtypes = [x_dtype, sf_dtype]
    assert [type(r) for r in results] == [torch.Tensor] * len(results)
    assert [r.dtype for r in results] == [getattr(torch, d) for d in expected_dtypes]
    assert all(r.device.type == "cpu" for r in results)


@smoke
@pytest.mark.parametrize(("torch_args", "first", "second"), [
    pytest.param({"token_topk_to_pos"}, "x is numpy.ndarray",
                 "token_topk_to_pos is torch.Tensor (cpu)", id="numpy-x-torch-map"),
    pytest.param({"x", "x_sf", "token_topk_to_pos"}, "x is torch.Tensor (cpu)",
                 "pos_to_expert is numpy.ndarray", id="torch-x-numpy-p2e"),
    pytest.param({"x_sf"}, "x is numpy.ndarray", "x_sf is torch.Tensor (cpu)", id="torch-x_sf"),
    pytest.param({"out_sf"}, "x is numpy.ndarray", "out_sf is torch.Tensor (cpu)",
                 id="torch-out_sf"),
    pytest.param({"x", "x_sf", "token_topk_to_pos", "pos_to_expert"}, "x is torch.Tensor (cpu)",
                 "out is numpy.ndarray", id="numpy-out"),
])
def test_mixed_kinds_rejected_naming_both(torch_args, first, second, rng):
    x, x_sf = sf_inputs(rng, 2, 128, 128, "float32")
    token_topk_to_pos, pos_to_expert = make_manifest_routing(2, 2, 4)
    arrays = dict(x=x, x_sf=x_sf, token_topk_to_pos=token_topk_to_pos,
                  pos_to_expert=pos_to_expert, out=np.zeros((4, 128), x.dtype),
                  out_sf=np.zeros((4, 1), x_sf.dtype))
    arrays = {n: to_torch(a) if n in torch_args else a for n, a in arrays.items()}
    message = f"all arrays must be of one kind: {first}, {second}"
    with pytest.raises(TypeError, match=exact(message)):
        cupy_moe.expand_to_fused_with_sf(**arrays, num_per_channels=128)


@smoke
@pytest.mark.parametrize("name", ["x", "token_topk_to_pos", "pos_to_expert", "out"])
def test_non_array_argument_rejected_naming_it(name, rng):
    token_topk_to_pos, pos_to_expert = make_manifest_routing(2, 2, 4)
    arrays = dict(x=random_payload(rng, (2, 8), "float16"), token_topk_to_pos=token_topk_to_pos,
                  pos_to_expert=pos_to_expert, out=np.zeros((4, 8), np.float16))
    arrays[name] = arrays[name].tolist()
    with pytest.raises(TypeError, match=exact(
            f"{name} must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got builtins.list")):
        cupy_moe.expand_to_fused(**arrays)


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("x_shape", "map_shape", "p2e_shape", "message"), [
    pytest.param((2, 8), (2, 0), (4,), "token_topk_to_pos must have K = shape[1] >= 1 slots; got 0",
                 id="K0"),
    pytest.param((16,), (2, 2), (4,), "x must be 2-D [T, H]; got shape (16,)", id="x-1d"),
    pytest.param((2, 8), (4,), (4,), "token_topk_to_pos must be 2-D [T, K]; got shape (4,)",
                 id="map-1d"),
    pytest.param((2, 8), (2, 2, 1), (4,),
                 "token_topk_to_pos must be 2-D [T, K]; got shape (2, 2, 1)", id="map-3d"),
    pytest.param((2, 8), (2, 2), (2, 2), "pos_to_expert must be 1-D [X]; got shape (2, 2)",
                 id="p2e-2d"),
    pytest.param((3, 8), (2, 2), (4,),
                 "token_topk_to_pos.shape[0] must equal x.shape[0] (T = 3); got 2",
                 id="map-rows-not-T"),
    pytest.param((2, 0), (2, 2), (4,), "x must have H = x.shape[1] >= 1 columns; got shape (2, 0)",
                 id="H0"),
])
def test_shape_rules_rejected(kind, x_shape, map_shape, p2e_shape, message):
    x = np.zeros(x_shape, np_dtype("bfloat16"))
    token_topk_to_pos = np.zeros(map_shape, np.int32)
    pos_to_expert = np.zeros(p2e_shape, np.int32)
    with pytest.raises(ValueError, match=exact(message)):
        expand(kind, x, token_topk_to_pos, pos_to_expert)


@full
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hidden", [1, 37])
def test_odd_hidden(kind, hidden, rng):
    case = routed_case(rng, num_tokens=10, hidden=hidden, top_k=3, num_experts=5, block_size=4,
                       invalid_every=4)
    check_expand(kind, *case)
    _, token_topk_to_pos, pos_to_expert = case
    for layout, (col_major, sf_dtype) in SF_LAYOUTS.items():
        x, x_sf = sf_inputs(rng, 10, hidden, 32, sf_dtype)
        check_expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=32,
                        col_major=col_major)


# Codes a value-based copy could change: -0.0, NaN payloads (quiet, signalling,
# negative), infinities, subnormals.
SPECIAL_CODES = {
    "bfloat16": [0x8000, 0x7FC1, 0xFFFF, 0x7F81, 0x7F80, 0xFF80, 0x0001],
    "float8_e4m3fn": [0x80, 0x7F, 0xFF, 0x01, 0x81],
    "float32": [0x80000000, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0xFF800000, 0x00000001],
}


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_bit_exact_random_and_special_codes(kind, rng):
    token_topk_to_pos, pos_to_expert = make_expert_major_routing(
        make_topk_ids(16, 4, 8, rng=rng), 8, 4)

    def payload(shape, dtype):
        array = random_payload(rng, shape, dtype)
        codes = SPECIAL_CODES[dtype]
        bits(array)[0, : len(codes)] = codes  # token 0 is routed to 4 rows
        return array

    x = payload((16, 32), "bfloat16")
    actual = check_expand(kind, x, token_topk_to_pos, pos_to_expert)
    row = token_topk_to_pos[0, 0]
    assert list(bits(actual)[row, :7]) == SPECIAL_CODES["bfloat16"]

    fp8, x_sf = payload((16, 256), "float8_e4m3fn"), payload((16, 8), "float32")
    out, out_sf = check_expand_sf(kind, fp8, x_sf, token_topk_to_pos, pos_to_expert, npc=32,
                                  col_major=True)
    assert list(bits(out)[row, :5]) == SPECIAL_CODES["float8_e4m3fn"]
    assert list(bits(out_sf)[row, :6]) == SPECIAL_CODES["float32"]
