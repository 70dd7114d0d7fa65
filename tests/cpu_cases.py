"""Shared pieces of the CPU expand tests: the kinds, the SF layouts, calling the
ops on NumPy arrays or CPU tensors and checking them against the loop oracle."""

from __future__ import annotations

import re

import numpy as np
import torch
from helpers import (
    align_up,
    assert_bits_equal,
    ceil_div,
    from_torch,
    make_expert_major_routing,
    make_topk_ids,
    np_dtype,
    oracle_expand,
    random_payload,
    to_torch,
)

import cupy_moe
from cupy_moe.runtime import arrays as runtime_arrays
from cupy_moe.runtime.arrays import ArrayKind

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


def element_strides(array: np.ndarray) -> tuple[int | float, ...]:
    """Strides in elements (a fraction where a byte stride is no whole element)."""
    return runtime_arrays.element_strides(ArrayKind.NUMPY, array)


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
                   for n, got, want in zip(out_sf.shape, element_strides(out_sf), expected,
                                           strict=True))
    else:
        assert out_sf.flags.c_contiguous
    return out, out_sf


def col_major_sf_buffer(out_sf: np.ndarray) -> np.ndarray:
    """The whole [S, align(X, 4)] buffer behind a column-major SF result, pad
    columns included; ``out_sf`` is the NumPy view ``to_host`` gives (for a
    tensor it shares the tensor's memory, which holds the pad columns)."""
    num_expanded, s = out_sf.shape
    lead = align_up(num_expanded, 4)
    return np.lib.stride_tricks.as_strided(out_sf, (s, lead),
                                           (lead * out_sf.itemsize, out_sf.itemsize))


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


