"""The seed's contract cases of the expand ops on the CPU (NumPy arrays and CPU
torch tensors), bit for bit against the loop oracle of ``helpers``."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_cases import (
    DOCUMENTED_HIDDEN_SIZES,
    DOCUMENTED_TOPK,
    KINDS,
    SF_LAYOUTS,
    check_expand,
    check_expand_sf,
    exact,
    expand,
    expand_sf,
    i32,
    routed_case,
    sf_inputs,
    sf_width,
)
from helpers import (
    assert_bits_equal,
    bits,
    from_bits,
    make_expert_major_routing,
    make_manifest_routing,
    make_topk_ids,
    np_dtype,
    random_payload,
)

import cupy_moe

smoke, full = pytest.mark.smoke, pytest.mark.full


# --- the test helpers themselves (the GPU tests rely on them too) ---------------

@smoke
def test_helper_expert_major_routing_hand_example():
    topk_ids = np.array([[1, 0], [1, -1], [0, 1]])
    token_topk_to_pos, pos_to_expert = make_expert_major_routing(
        topk_ids, num_experts=3, block_size=4)
    # expert 0: slots 1, 4 -> rows 0, 1; expert 1: slots 0, 2, 5 -> rows 4, 5, 6;
    # expert 2 has no slot and no rows.
    assert token_topk_to_pos.dtype == pos_to_expert.dtype == np.int32
    np.testing.assert_array_equal(token_topk_to_pos, [[4, 0], [5, -1], [1, 6]])
    np.testing.assert_array_equal(pos_to_expert, [0, 0, -1, -1, 1, 1, 1, -1])


@smoke
def test_helper_assert_bits_equal_names_first_mismatch():
    expected = from_bits([[0x0000, 0x7FC0, 0x3F80], [0x0001, 0x7FC0, 0x7FC1]], "bfloat16")
    assert_bits_equal(expected.copy(), expected)
    actual = expected.copy()
    bits(actual)[1, 2] = 0x7FC0  # another NaN payload: equal as a value, not as bits
    bits(actual)[0, 0] = 0x8000  # -0.0 == 0.0 as a value, not as bits
    with pytest.raises(AssertionError, match=r"2 element\(s\) differ; first at \(0, 0\)"):
        assert_bits_equal(actual, expected)


# === Part 1: the seed's contract cases ===========================================

@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_manual_mapping(kind):
    x = np.array([[1, 2, 3], [10, 20, 30], [100, 200, 300]], dtype=np_dtype("bfloat16"))
    token_topk_to_pos = i32([[0, 3], [1, 4], [2, -1]])
    pos_to_expert = i32([0, 0, 0, 1, 1, -1, -1])

    actual = expand(kind, x, token_topk_to_pos, pos_to_expert)

    expected = np.array([[1, 2, 3], [10, 20, 30], [100, 200, 300], [1, 2, 3], [10, 20, 30],
                         [0, 0, 0], [0, 0, 0]], dtype=np_dtype("bfloat16"))
    assert_bits_equal(actual, expected)


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_invalid_topk_and_padding(kind, rng):
    x, token_topk_to_pos, pos_to_expert = routed_case(
        rng, num_tokens=8, hidden=16, top_k=4, num_experts=4, block_size=8,
        dtype="float16", invalid_every=2)
    assert (token_topk_to_pos < 0).any() and (pos_to_expert < 0).any()

    actual = check_expand(kind, x, token_topk_to_pos, pos_to_expert)

    assert not bits(actual)[pos_to_expert < 0].any()


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_does_not_weight_or_reduce(kind):
    x = np.array([[2, 4], [8, 16]], dtype=np.float16)
    token_topk_to_pos = i32([[0, 2], [1, 3]])
    pos_to_expert = i32([0, 0, 1, 1])

    actual = expand(kind, x, token_topk_to_pos, pos_to_expert)

    assert_bits_equal(actual, np.array([[2, 4], [8, 16], [2, 4], [8, 16]], dtype=np.float16))


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_random_mapping(kind, rng):
    topk_ids = make_topk_ids(13, 6, 8, invalid_every=4, rng=rng)
    token_topk_to_pos, pos_to_expert = make_expert_major_routing(
        topk_ids, num_experts=8, block_size=16)
    x = random_payload(rng, (13, 37), "bfloat16")

    check_expand(kind, x, token_topk_to_pos, pos_to_expert)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_expanded", [
    pytest.param(0, marks=smoke, id="no-expanded-rows"),
    pytest.param(4, marks=full, id="padding-only-rows"),
])
def test_empty_tokens(kind, num_expanded):
    x = np.empty((0, 576), dtype=np_dtype("bfloat16"))
    token_topk_to_pos = np.empty((0, 8), dtype=np.int32)
    pos_to_expert = np.full(num_expanded, -1, dtype=np.int32)

    actual = expand(kind, x, token_topk_to_pos, pos_to_expert)

    assert_bits_equal(actual, np.zeros((num_expanded, 576), dtype=np_dtype("bfloat16")))


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_all_slots_dropped(kind, rng):
    x = random_payload(rng, (3, 16), "bfloat16")
    token_topk_to_pos = np.full((3, 4), -1, dtype=np.int32)
    pos_to_expert = np.full(8, -1, dtype=np.int32)

    actual = expand(kind, x, token_topk_to_pos, pos_to_expert)

    assert_bits_equal(actual, np.zeros((8, 16), dtype=x.dtype))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hidden", [
    pytest.param(h, marks=smoke if h == DOCUMENTED_HIDDEN_SIZES[0] else full, id=f"h{h}")
    for h in DOCUMENTED_HIDDEN_SIZES
])
def test_documented_hidden_sizes(kind, hidden, rng):
    case = routed_case(rng, num_tokens=5, hidden=hidden, top_k=2, num_experts=4, block_size=4)
    check_expand(kind, *case)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("top_k", [
    pytest.param(k, marks=smoke if k == DOCUMENTED_TOPK[0] else full, id=f"topk{k}")
    for k in DOCUMENTED_TOPK
])
def test_documented_topk(kind, top_k, rng):
    case = routed_case(rng, num_tokens=7, hidden=128, top_k=top_k, num_experts=12, block_size=8)
    check_expand(kind, *case)


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_manifest_decode_padding_shape(kind, rng):
    x = random_payload(rng, (1, 64), "bfloat16")
    token_topk_to_pos, pos_to_expert = make_manifest_routing(1, 8, 16)

    actual = check_expand(kind, x, token_topk_to_pos, pos_to_expert)

    assert actual.shape == (16, 64)
    assert not bits(actual)[8:].any()


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_4001_token_boundary(kind, rng):
    case = routed_case(rng, num_tokens=4001, hidden=1, top_k=8, num_experts=16, block_size=64,
                       invalid_every=17)
    check_expand(kind, *case)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [
    pytest.param("bfloat16", marks=smoke, id="bf16"),
    pytest.param("float16", marks=smoke, id="fp16"),
    pytest.param("uint16", marks=smoke, id="uint16-bf16-bits"),
])
def test_supported_dtypes(kind, dtype, rng):
    token_topk_to_pos, pos_to_expert = make_manifest_routing(5, 2, 10)
    check_expand(kind, random_payload(rng, (5, 7), dtype), token_topk_to_pos, pos_to_expert)


def workload_params(op: str):
    return [pytest.param(w, id=w.label, marks=smoke if i == 0 else full)
            for i, w in enumerate(cupy_moe.load_workloads(op))]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("workload", workload_params("expand_to_fused"))
def test_manifest_workload_shapes(kind, workload, rng):
    num_tokens, hidden = workload.shapes["x"]
    top_k = workload.shapes["token_topk_to_pos"][1]
    (num_expanded,) = workload.shapes["pos_to_expert"]
    x = random_payload(rng, (num_tokens, hidden), workload.dtype)
    token_topk_to_pos, pos_to_expert = make_manifest_routing(num_tokens, top_k, num_expanded)

    actual = check_expand(kind, x, token_topk_to_pos, pos_to_expert)

    assert actual.shape == (num_expanded, hidden)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("workload", workload_params("expand_to_fused_with_sf"))
def test_with_sf_manifest_workload_shapes(kind, workload, rng):
    num_tokens, hidden = workload.shapes["x"]
    top_k = workload.shapes["token_topk_to_pos"][1]
    (num_expanded,) = workload.shapes["pos_to_expert"]
    x = random_payload(rng, workload.shapes["x"], workload.dtype)
    x_sf = random_payload(rng, workload.shapes["x_sf"], workload.sf_dtype)
    token_topk_to_pos, pos_to_expert = make_manifest_routing(num_tokens, top_k, num_expanded)

    out, out_sf = check_expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert,
                                  npc=workload.num_per_channels,
                                  col_major=workload.use_tma_aligned_col_major_sf)

    assert out.shape == (num_expanded, hidden)
    assert out_sf.shape == (num_expanded, workload.shapes["x_sf"][1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", [pytest.param(name, marks=smoke) for name in SF_LAYOUTS])
@pytest.mark.parametrize("npc", [pytest.param(32, id="npc32"), pytest.param(128, id="npc128")])
def test_with_sf(kind, layout, npc, rng):
    col_major, sf_dtype = SF_LAYOUTS[layout]
    x, x_sf = sf_inputs(rng, 6, 576, npc, sf_dtype)
    token_topk_to_pos, pos_to_expert = make_manifest_routing(6, 8, 64)

    out, out_sf = check_expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert,
                                  npc=npc, col_major=col_major)

    assert out_sf.shape == (64, sf_width(576, npc, sf_dtype))
    assert not bits(out)[pos_to_expert < 0].any()
    assert not bits(out_sf)[pos_to_expert < 0].any()


# Shape rules of the SF op. Base call: x fp8 [2, 576], npc 128, so float32 S = 5,
# packed S = 2; each case overrides some arguments.
SF_RULE_CASES = [
    pytest.param(dict(npc=64), "unsupported num_per_channels=64; must be one of (32, 128)",
                 id="npc-64"),
    pytest.param(dict(sf=((2, 2), "int32")),
                 "int32 x_sf is packed UE8M0, and packed UE8M0 scale factors require "
                 "use_tma_aligned_col_major_sf=True", id="int32-sf-row-major"),
    pytest.param(dict(sf=((2, 6), "float32")),
                 "x_sf must have shape (T, S) = (2, 5) with S = ceil(H / num_per_channels) "
                 "for float32, H = 576, num_per_channels = 128; got (2, 6)", id="f32-sf-wrong-S"),
    pytest.param(dict(sf=((2, 2), "float32"), col_major=True),
                 "x_sf must have shape (T, S) = (2, 5) with S = ceil(H / num_per_channels) "
                 "for float32, H = 576, num_per_channels = 128; got (2, 2)",
                 id="f32-sf-with-packed-S"),
    pytest.param(dict(sf=((2, 5), "int32"), col_major=True),
                 "x_sf must have shape (T, S) = (2, 2) with S = ceil(ceil(H / num_per_channels) "
                 "/ 4) for packed UE8M0 int32, H = 576, num_per_channels = 128; got (2, 5)",
                 id="int32-sf-wrong-S"),
    pytest.param(dict(sf=((3, 5), "float32")),
                 "x_sf must have shape (T, S) = (2, 5) with S = ceil(H / num_per_channels) "
                 "for float32, H = 576, num_per_channels = 128; got (3, 5)", id="sf-wrong-T"),
    pytest.param(dict(sf=((2, 5), "float16")), "x_sf must be one of float32, int32; got float16",
                 id="sf-dtype-f16"),
    pytest.param(dict(sf=((10,), "float32")), "x_sf must be 2-D [T, S]; got shape (10,)",
                 id="sf-1d"),
    pytest.param(dict(x_dtype="bfloat16"),
                 "x must be one of float8_e4m3fn, uint8, int8; got bfloat16", id="x-bf16"),
]


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("override", "message"), SF_RULE_CASES)
def test_with_sf_rejects_shape_rules(kind, override, message, rng):
    x = random_payload(rng, (2, 576), override.get("x_dtype", "float8_e4m3fn"))
    sf_shape, sf_dtype = override.get("sf", ((2, 5), "float32"))
    x_sf = random_payload(rng, sf_shape, sf_dtype)
    token_topk_to_pos, pos_to_expert = make_manifest_routing(2, 2, 4)

    with pytest.raises(ValueError, match=exact(message)):
        expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert,
                  npc=override.get("npc", 128), col_major=override.get("col_major", False))


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("dtype", "message"), [
    pytest.param("float8_e4m3fn", "x must be one of bfloat16, float16, uint16; got float8_e4m3fn",
                 id="fp8"),
    pytest.param("float32", "x must be one of bfloat16, float16, uint16; got float32", id="f32"),
])
def test_expand_rejects_x_dtype(kind, dtype, message, rng):
    token_topk_to_pos, pos_to_expert = make_manifest_routing(2, 2, 4)
    with pytest.raises(ValueError, match=exact(message)):
        expand(kind, random_payload(rng, (2, 8), dtype), token_topk_to_pos, pos_to_expert)


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_rejects_duplicate_positions(kind, rng):
    x = random_payload(rng, (2, 4), "float16")
    with pytest.raises(ValueError, match=exact(
            "token_topk_to_pos[1, 0] = 1 duplicates a position an earlier slot already "
            "targets (duplicate valid positions)")):
        expand(kind, x, i32([[0, 1], [1, 2]]), i32([0, 0, 1]), validate=True)


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_rejects_padding_target(kind, rng):
    x = random_payload(rng, (1, 4), "float16")
    with pytest.raises(ValueError, match=exact(
            "token_topk_to_pos[0, 0] = 0 targets a padding position (pos_to_expert[0] < 0)")):
        expand(kind, x, i32([[0]]), i32([-1]), validate=True)


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["token_topk_to_pos", "pos_to_expert"])
def test_rejects_int64_maps(kind, which, rng):
    maps = {"token_topk_to_pos": np.array([[0]]), "pos_to_expert": np.array([0])}
    maps = {name: a.astype(np.int64 if name == which else np.int32) for name, a in maps.items()}
    with pytest.raises(ValueError, match=exact(f"{which} must be one of int32; got int64")):
        expand(kind, random_payload(rng, (1, 4), "float16"), **maps)
