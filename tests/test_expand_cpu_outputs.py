"""Our decisions beyond the seed, on the CPU: T == 0, the padded column-major SF
buffer, caller-provided outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cpu_cases import (
    KINDS,
    SF_LAYOUTS,
    as_kind,
    element_strides,
    exact,
    expand_sf,
    i32,
    routed_case,
    sf_inputs,
    to_host,
)
from helpers import (
    align_up,
    assert_bits_equal,
    bits,
    from_torch,
    make_manifest_routing,
    np_dtype,
    oracle_expand,
    random_payload,
)

import cupy_moe

smoke, full = pytest.mark.smoke, pytest.mark.full


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
def test_empty_out_of_any_strides_is_accepted(kind):
    """X == 0: an empty out is contiguous whatever its strides (NumPy 2 gives
    empty arrays zero strides)."""
    x = np.empty((0, 40), dtype=np_dtype("bfloat16"))
    token_topk_to_pos = np.empty((0, 8), dtype=np.int32)
    out = as_kind(kind, np.empty((0, 40), dtype=np_dtype("bfloat16")))
    result = cupy_moe.expand_to_fused(as_kind(kind, x), as_kind(kind, token_topk_to_pos),
                                      as_kind(kind, i32([])), out=out)
    assert result is out and tuple(result.shape) == (0, 40)


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


@smoke
def test_an_out_stepping_no_whole_element_is_refused():
    """NumPy byte strides of no whole element ((7, 3) for 2-byte bf16): a
    floor division read them as C-contiguous (3, 1), and this out, whose
    rows overlap, came back with row 0's last element overwritten."""
    bf16 = np_dtype("bfloat16")
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3).astype(bf16)
    buffer = np.zeros(64, np.uint8)
    out = np.ndarray((2, 3), bf16, buffer=buffer, strides=(7, 3))
    with pytest.raises(ValueError, match=exact(
            "out must be C-contiguous, element strides (3, 1); got (3.5, 1.5)")):
        cupy_moe.expand_to_fused(x, i32([[0], [1]]), i32([0, 0]), out=out)
    assert not buffer.any()


# validate=True: (map, pos_to_expert, message naming the first offending index).


@smoke
def test_an_out_reaching_into_the_col_major_sf_pad_columns_is_refused():
    """The op zeroes the column-major SF's pad columns, past the out_sf view:
    an out that overlaps only them still overlaps what the op writes."""
    x = np.zeros((1, 256), dtype=np.uint8)
    x_sf = np.zeros((1, 2), dtype=np.float32)
    token_topk_to_pos = i32([[0, 2]])
    pos_to_expert = i32([0, -1, 1])
    buffer = np.zeros(4 * 2 + 3 * 256 // 4, dtype=np.float32)
    out_sf = buffer[:8].reshape(2, 4)[:, :3].T          # [3, 2], pad column 3 of each row
    out = buffer[8:].view(np.uint8).reshape(3, 256)       # disjoint: accepted
    cupy_moe.expand_to_fused_with_sf(x, x_sf, token_topk_to_pos, pos_to_expert,
                                     num_per_channels=128, use_tma_aligned_col_major_sf=True,
                                     out=out, out_sf=out_sf)
    sliver = buffer[7:7 + 192].view(np.uint8).reshape(3, 256)  # starts on row 1's pad column
    with pytest.raises(ValueError, match="overlaps .* in memory"):
        cupy_moe.expand_to_fused_with_sf(x, x_sf, token_topk_to_pos, pos_to_expert,
                                         num_per_channels=128, use_tma_aligned_col_major_sf=True,
                                         out=sliver, out_sf=out_sf)
