"""The expand-to-fused ops on the CPU: NumPy arrays and CPU torch tensors.

Part 1 restates the seed's contract cases against our public API; part 2
covers the decisions DESIGN.md adds on top of the seed (T == 0, the padded
column-major SF buffer, ``out=``, ``validate=``, array kinds, error wording).
Every result is compared bit for bit with the loop oracle of ``helpers``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import cupy_moe
from helpers import (
    align_up,
    assert_bits_equal,
    bits,
    ceil_div,
    from_bits,
    from_torch,
    make_expert_major_routing,
    make_manifest_routing,
    make_topk_ids,
    np_dtype,
    oracle_expand,
    random_payload,
    to_torch,
)

smoke, full = pytest.mark.smoke, pytest.mark.full

DOCUMENTED_HIDDEN_SIZES = [576, 2048, 2560, 3072, 4096, 6144, 7168]
DOCUMENTED_TOPK = [2, 6, 8, 9]
KINDS = ["numpy", "torch"]

# (use_tma_aligned_col_major_sf, sf_dtype) of each scale-factor layout.
SF_LAYOUTS = {
    "row-major-f32": (False, "float32"),
    "col-major-packed-ue8m0": (True, "int32"),
    "col-major-f32": (True, "float32"),
}


def exact(message: str) -> str:
    """A ``match=`` pattern for a literal piece of an error message."""
    return re.escape(message)


def sf_width(hidden: int, npc: int, sf_dtype: str) -> int:
    blocks = ceil_div(hidden, npc)
    return ceil_div(blocks, 4) if sf_dtype == "int32" else blocks


def element_strides(array: np.ndarray) -> tuple[int, ...]:
    return tuple(s // array.itemsize for s in array.strides)


# --- calling the ops on either kind ---------------------------------------------

def as_kind(kind: str, array):
    return to_torch(array) if kind == "torch" else array


def to_host(kind: str, result, dtype_name: str) -> np.ndarray:
    """Check that ``result`` is of ``kind`` and dtype; a NumPy view of its bits."""
    if kind == "torch":
        assert isinstance(result, torch.Tensor) and result.device.type == "cpu"
        assert result.dtype == getattr(torch, dtype_name)
        return from_torch(result)
    assert isinstance(result, np.ndarray)
    assert result.dtype == np_dtype(dtype_name)
    return result


def expand(kind, x, token_topk_to_pos, pos_to_expert, **kwargs) -> np.ndarray:
    result = cupy_moe.expand_to_fused(as_kind(kind, x), as_kind(kind, token_topk_to_pos),
                                      as_kind(kind, pos_to_expert), **kwargs)
    return to_host(kind, result, x.dtype.name)


def expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, *, npc, col_major=False,
              **kwargs) -> tuple[np.ndarray, np.ndarray]:
    out, out_sf = cupy_moe.expand_to_fused_with_sf(
        as_kind(kind, x), as_kind(kind, x_sf), as_kind(kind, token_topk_to_pos),
        as_kind(kind, pos_to_expert), num_per_channels=npc,
        use_tma_aligned_col_major_sf=col_major, **kwargs)
    return to_host(kind, out, x.dtype.name), to_host(kind, out_sf, x_sf.dtype.name)


def check_expand(kind, x, token_topk_to_pos, pos_to_expert) -> np.ndarray:
    actual = expand(kind, x, token_topk_to_pos, pos_to_expert)
    assert_bits_equal(actual, oracle_expand(x, token_topk_to_pos, pos_to_expert), "expanded_x")
    return actual


def check_expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, *, npc, col_major):
    out, out_sf = expand_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert,
                            npc=npc, col_major=col_major)
    assert_bits_equal(out, oracle_expand(x, token_topk_to_pos, pos_to_expert), "expanded_x")
    assert_bits_equal(out_sf, oracle_expand(x_sf, token_topk_to_pos, pos_to_expert),
                      "expanded_x_sf")
    num_expanded, s = out_sf.shape
    if col_major:
        expected = (1, align_up(num_expanded, 4))
        assert all(n <= 1 or got == want
                   for n, got, want in zip(out_sf.shape, element_strides(out_sf), expected))
    else:
        assert out_sf.flags.c_contiguous
    return out, out_sf


def sf_inputs(rng, num_tokens: int, hidden: int, npc: int, sf_dtype: str):
    """Random fp8 rows and random-bit scale factors of the right width."""
    x = random_payload(rng, (num_tokens, hidden), "float8_e4m3fn")
    x_sf = random_payload(rng, (num_tokens, sf_width(hidden, npc, sf_dtype)), sf_dtype)
    return x, x_sf


def routed_case(rng, *, num_tokens, hidden, top_k, num_experts, block_size,
                dtype="bfloat16", invalid_every=None):
    """Random-bit rows and the deterministic expert-major map of the seed's cases."""
    topk_ids = make_topk_ids(num_tokens, top_k, num_experts, invalid_every=invalid_every)
    token_topk_to_pos, pos_to_expert = make_expert_major_routing(
        topk_ids, num_experts=num_experts, block_size=block_size)
    return random_payload(rng, (num_tokens, hidden), dtype), token_topk_to_pos, pos_to_expert


def i32(values) -> np.ndarray:
    return np.array(values, dtype=np.int32)


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


# === Part 2: our decisions beyond the seed ========================================

@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("poisoned_out", [False, True], ids=["fresh-out", "poisoned-out"])
def test_zero_tokens_with_expert_rows_gives_zeros(kind, poisoned_out, rng):
    """T == 0 (an EP rank with no tokens): zeros, even where pos_to_expert >= 0."""
    pos_to_expert = i32([0, 0, 1, 1, -1, 2])
    x = np.empty((0, 40), dtype=np_dtype("bfloat16"))
    token_topk_to_pos = np.empty((0, 8), dtype=np.int32)
    out = as_kind(kind, random_payload(rng, (6, 40), "bfloat16")) if poisoned_out else None

    result = cupy_moe.expand_to_fused(as_kind(kind, x), as_kind(kind, token_topk_to_pos),
                                      as_kind(kind, pos_to_expert), out=out)

    if poisoned_out:
        assert result is out
    assert_bits_equal(to_host(kind, result, "bfloat16"), np.zeros((6, 40), x.dtype))


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", list(SF_LAYOUTS))
def test_zero_tokens_with_sf_gives_zeros(kind, layout, rng):
    col_major, sf_dtype = SF_LAYOUTS[layout]
    x, x_sf = sf_inputs(rng, 0, 300, 128, sf_dtype)
    pos_to_expert = i32([3, 3, 0, 1, -1])

    out, out_sf = expand_sf(kind, x, x_sf, np.empty((0, 4), np.int32), pos_to_expert,
                            npc=128, col_major=col_major)

    assert_bits_equal(out, np.zeros((5, 300), x.dtype))
    assert_bits_equal(out_sf, np.zeros((5, x_sf.shape[1]), x_sf.dtype))


@full
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_expanded", [pytest.param(x, id=f"X{x}") for x in range(1, 9)])
@pytest.mark.parametrize("sf_dtype", ["float32", "int32"])
def test_col_major_sf_is_view_of_padded_buffer(kind, num_expanded, sf_dtype, rng):
    """[X, S] view, element strides (1, align(X, 4)), of an [S, align(X, 4)] buffer
    whose pad columns are zero; X need not be a multiple of 4."""
    hidden, npc = 1152, 32  # 36 blocks: float32 S = 36, packed S = 9
    x, x_sf = sf_inputs(rng, 3, hidden, npc, sf_dtype)
    token_topk_to_pos, pos_to_expert = make_manifest_routing(3, 2, num_expanded)
    s, lead = x_sf.shape[1], align_up(num_expanded, 4)

    out, out_sf = cupy_moe.expand_to_fused_with_sf(
        as_kind(kind, x), as_kind(kind, x_sf), as_kind(kind, token_topk_to_pos),
        as_kind(kind, pos_to_expert), num_per_channels=npc, use_tma_aligned_col_major_sf=True)

    strides = tuple(out_sf.stride()) if kind == "torch" else element_strides(out_sf)
    assert tuple(out_sf.shape) == (num_expanded, s) and strides[1] == lead
    assert num_expanded == 1 or strides[0] == 1
    if kind == "torch":  # the storage must hold the whole buffer, pad columns included
        buffer = from_torch(torch.as_strided(out_sf, (s, lead), (lead, 1)))
    else:
        buffer = out_sf.base
        assert buffer is not None and buffer.shape == (s, lead) and buffer.dtype == x_sf.dtype
        assert np.shares_memory(buffer, out_sf)
    expected = oracle_expand(x_sf, token_topk_to_pos, pos_to_expert)
    assert_bits_equal(buffer[:, :num_expanded].T, expected, "buffer columns :X")
    assert_bits_equal(buffer[:, num_expanded:], np.zeros((s, lead - num_expanded), x_sf.dtype),
                      "pad columns")


@full
@pytest.mark.parametrize("kind", KINDS)
def test_col_major_sf_result_reusable_as_out_sf(kind, rng):
    """A column-major SF result is itself a valid ``out_sf`` for the next call
    (regressions: NumPy 2 has no np.byte_bounds; a torch result's storage once
    ended at the view's last element, without the pad columns)."""
    x, x_sf = sf_inputs(rng, 3, 384, 128, "float32")
    token_topk_to_pos, pos_to_expert = make_manifest_routing(3, 2, 5)
    args = [as_kind(kind, a) for a in (x, x_sf, token_topk_to_pos, pos_to_expert)]
    kwargs = dict(num_per_channels=128, use_tma_aligned_col_major_sf=True)
    out, out_sf = cupy_moe.expand_to_fused_with_sf(*args, **kwargs)

    again, again_sf = cupy_moe.expand_to_fused_with_sf(*args, **kwargs, out=out, out_sf=out_sf)

    assert again is out and again_sf is out_sf
    assert_bits_equal(to_host(kind, again_sf, "float32"),
                      oracle_expand(x_sf, token_topk_to_pos, pos_to_expert))


@smoke
@pytest.mark.parametrize("kind", KINDS)
def test_out_written_in_place(kind, rng):
    x, token_topk_to_pos, pos_to_expert = routed_case(
        rng, num_tokens=9, hidden=24, top_k=3, num_experts=5, block_size=4, invalid_every=3)
    out = as_kind(kind, random_payload(rng, (pos_to_expert.shape[0], 24), "bfloat16"))

    result = cupy_moe.expand_to_fused(as_kind(kind, x), as_kind(kind, token_topk_to_pos),
                                      as_kind(kind, pos_to_expert), out=out)

    assert result is out
    assert_bits_equal(to_host(kind, out, "bfloat16"),
                      oracle_expand(x, token_topk_to_pos, pos_to_expert))


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", list(SF_LAYOUTS))
def test_out_and_out_sf_written_in_place(kind, layout, rng):
    """Poisoned outputs are overwritten everywhere, the col-major pad columns too."""
    col_major, sf_dtype = SF_LAYOUTS[layout]
    x, x_sf = sf_inputs(rng, 7, 200, 32, sf_dtype)
    token_topk_to_pos, pos_to_expert = make_manifest_routing(7, 2, 10)  # X = 10, pad 2
    num_expanded, s = 10, x_sf.shape[1]
    out = as_kind(kind, random_payload(rng, (num_expanded, 200), x.dtype))
    if col_major:
        buffer = as_kind(kind, random_payload(rng, (s, align_up(num_expanded, 4)), sf_dtype))
        out_sf = buffer[:, :num_expanded].T
    else:
        buffer = out_sf = as_kind(kind, random_payload(rng, (num_expanded, s), sf_dtype))

    result, result_sf = cupy_moe.expand_to_fused_with_sf(
        *(as_kind(kind, a) for a in (x, x_sf, token_topk_to_pos, pos_to_expert)),
        num_per_channels=32, use_tma_aligned_col_major_sf=col_major, out=out, out_sf=out_sf)

    assert result is out and result_sf is out_sf
    assert_bits_equal(to_host(kind, out, x.dtype.name),
                      oracle_expand(x, token_topk_to_pos, pos_to_expert))
    expected_sf = oracle_expand(x_sf, token_topk_to_pos, pos_to_expert)
    buffer = to_host(kind, buffer, sf_dtype)
    if col_major:
        expected_buffer = np.zeros(buffer.shape, x_sf.dtype)
        expected_buffer[:, :num_expanded] = expected_sf.T
        assert_bits_equal(buffer, expected_buffer, "out_sf buffer with pad columns")
    else:
        assert_bits_equal(buffer, expected_sf)


# Rejected outputs. X = 6, H = 256, npc 128: S = 2 (float32), align(X, 4) = 8.
def _out_cases():
    def sf_view(kind, sf_len):
        """An [X, S] column-major view of a buffer of ``sf_len`` float32 elements."""
        if kind == "torch":
            return torch.zeros(sf_len).as_strided((6, 2), (1, 8))
        flat = np.zeros(sf_len, np.float32)
        return np.ndarray((6, 2), np.float32, buffer=flat, strides=(4, 32))

    return [
        pytest.param("out", lambda k: as_kind(k, np.zeros((7, 256), np_dtype("float8_e4m3fn"))),
                     False, "out must have shape (6, 256); got (7, 256)", id="out-shape"),
        pytest.param("out", lambda k: as_kind(k, np.zeros((6, 256), np.uint8)), False,
                     "out must have dtype float8_e4m3fn (that of the input); got uint8",
                     id="out-dtype"),
        pytest.param("out",
                     lambda k: as_kind(k, np.zeros((6, 512), np_dtype("float8_e4m3fn")))[:, :256],
                     False, "out must be C-contiguous, element strides (256, 1); got (512, 1)",
                     id="out-strides"),
        pytest.param("out_sf", lambda k: as_kind(k, np.zeros((6, 3), np.float32)), False,
                     "out_sf must have shape (6, 2); got (6, 3)", id="out_sf-shape"),
        pytest.param("out_sf", lambda k: as_kind(k, np.zeros((6, 2), np.int32)), False,
                     "out_sf must have dtype float32 (that of the input); got int32",
                     id="out_sf-dtype"),
        pytest.param("out_sf", lambda k: sf_view(k, 16), False,
                     "out_sf must be C-contiguous, element strides (2, 1); got (1, 8)",
                     id="out_sf-col-major-for-row-major"),
        pytest.param("out_sf", lambda k: as_kind(k, np.zeros((6, 2), np.float32)), True,
                     "out_sf must be the transposed view of an [S, align(X, 4)] = [2, 8] buffer, "
                     "element strides (1, 8); got (2, 1)", id="out_sf-row-major-for-col-major"),
        pytest.param("out_sf", lambda k: sf_view(k, 14), True,
                     "out_sf must view a buffer of [S, align(X, 4)] = [2, 8] elements (64 bytes, "
                     "pad columns included); only 56 bytes follow its first element",
                     id="out_sf-buffer-lacks-pad-columns"),
    ]


@smoke
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("name", "make", "col_major", "message"), _out_cases())
def test_rejects_bad_outputs(kind, name, make, col_major, message, rng):
    x, x_sf = sf_inputs(rng, 3, 256, 128, "float32")
    token_topk_to_pos, pos_to_expert = make_manifest_routing(3, 2, 6)
    with pytest.raises(ValueError, match=exact(message)):
        cupy_moe.expand_to_fused_with_sf(
            *(as_kind(kind, a) for a in (x, x_sf, token_topk_to_pos, pos_to_expert)),
            num_per_channels=128, use_tma_aligned_col_major_sf=col_major,
            **{name: make(kind)})


@full
def test_numpy_as_strided_out_sf_over_full_buffer_is_accepted(rng):
    """as_strided hides the owner behind a non-ndarray base; the pad-column check
    must still find the whole buffer (regression: it saw only the view)."""
    x, x_sf = sf_inputs(rng, 3, 256, 128, "float32")
    token_topk_to_pos, pos_to_expert = make_manifest_routing(3, 2, 6)
    buffer = random_payload(rng, (2, 8), "float32")
    out_sf = np.lib.stride_tricks.as_strided(buffer, (6, 2), (4, 32))

    _, result_sf = cupy_moe.expand_to_fused_with_sf(
        x, x_sf, token_topk_to_pos, pos_to_expert, num_per_channels=128,
        use_tma_aligned_col_major_sf=True, out_sf=out_sf)

    assert result_sf is out_sf
    assert not bits(buffer)[:, 6:].any()


# validate=True: (map, pos_to_expert, message naming the first offending index).
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
    """validate=False: no error, and nothing written outside the outputs."""
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

    for buffer, old in zip(buffers, before):
        now = to_host(kind, buffer, old.dtype.name)
        for rows in (slice(0, guard), slice(guard + num_expanded, None)):
            assert_bits_equal(now[rows], old[rows], "guard rows")


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
