"""Rules that depend on the GPU path (marker ``gpu``): overlapping outputs by
address ranges, grad-requiring tensors, and what the torch fast path may and
may not skip."""

from __future__ import annotations

import re

import numpy as np
import pytest

import cupy_moe
from cupy_moe import reference
from cupy_moe.expand import api
from cupy_moe.harness.inputs import fitted_routing, numpy_dtype, random_bits
from gpu_cases import GPU_MARKS, KINDS, cupy, map_to_device, needs_torch_cuda, to_device, \
    to_host_bits, torch
from helpers import assert_bits_equal

pytestmark = GPU_MARKS


def _case(rng, num_tokens=8, hidden=64, top_k=2, num_expanded=24):
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("bfloat16"))
    return (x, *fitted_routing(rng, num_tokens, top_k, num_expanded, num_experts=3,
                               max_alignment=2))


@pytest.mark.parametrize("kind", KINDS)
def test_out_overlapping_an_input_is_rejected(kind):
    rng = np.random.default_rng()
    x, token_topk_to_pos, pos_to_expert = _case(rng)
    out = to_device(kind, random_bits(rng, (24, 64), x.dtype), "bfloat16")
    out[:8] = to_device(kind, x, "bfloat16")
    dmap, dp2e = map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert)
    with pytest.raises(ValueError, match="out overlaps x in memory"):
        cupy_moe.expand_to_fused(out[:8], dmap, dp2e, out=out)
    # the map's 64 bytes inside out's first row
    int32 = torch.int32 if kind == "torch" else cupy.int32
    inside = out.view(int32).reshape(-1)[:16].reshape(8, 2)
    inside[...] = dmap
    with pytest.raises(ValueError, match="out overlaps token_topk_to_pos in memory"):
        cupy_moe.expand_to_fused(to_device(kind, x, "bfloat16"), inside, dp2e, out=out)


@pytest.mark.parametrize("kind", KINDS)
def test_column_major_out_sf_pad_columns_count_as_written(kind):
    # out_sf's view ends before its pad columns; x_sf placed in them overlaps
    rng = np.random.default_rng()
    x8 = random_bits(rng, (2, 128), numpy_dtype("float8_e4m3fn"))
    token_topk_to_pos = np.array([[0, 1], [2, -1]], dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, -1, -1], dtype=np.int32)  # X = 5, align(X, 4) = 8
    buffer = to_device(kind, np.zeros((1, 8 + 2), dtype=np.int32), "int32")
    out_sf = buffer[:, :5].T
    x_sf = buffer[0, 8:10].reshape(2, 1)  # the pad columns X..8 end at 8: next to them
    x_sf[...] = to_device(kind, np.array([[7], [9]], dtype=np.int32), "int32")
    args = (to_device(kind, x8, "float8_e4m3fn"), None, map_to_device(kind, token_topk_to_pos),
            map_to_device(kind, pos_to_expert))
    result = cupy_moe.expand_to_fused_with_sf(args[0], x_sf, *args[2:], num_per_channels=128,
                                              use_tma_aligned_col_major_sf=True, out_sf=out_sf)
    assert result[1] is out_sf
    # rows 0, 1 from token 0, row 2 from token 1, padding rows and pad columns
    # zero, and x_sf (just past the pad columns) untouched
    assert to_host_bits(kind, buffer).tolist() == [[7, 7, 9, 0, 0, 0, 0, 0, 7, 9]]
    with pytest.raises(ValueError, match="out_sf overlaps x_sf in memory"):
        cupy_moe.expand_to_fused_with_sf(args[0], buffer[0, 6:8].reshape(2, 1), *args[2:],
                                         num_per_channels=128,
                                         use_tma_aligned_col_major_sf=True, out_sf=out_sf)


@needs_torch_cuda
def test_fast_path_takes_repeat_calls_and_still_rejects_an_overlapping_out(monkeypatch):
    rng = np.random.default_rng()
    x, token_topk_to_pos, pos_to_expert = _case(rng)
    dx = to_device("torch", x, "bfloat16")
    dmap, dp2e = map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert)
    out = torch.empty((24, 64), dtype=torch.bfloat16, device="cuda")
    cupy_moe.expand_to_fused(dx, dmap, dp2e, out=out)  # full path: remembers the call

    def full_path(*args, **kwargs):
        raise AssertionError("the fast path should have taken this call")

    monkeypatch.setattr(api, "_expand", full_path)
    out.fill_(1.0)
    assert cupy_moe.expand_to_fused(dx, dmap, dp2e, out=out) is out
    assert_bits_equal(to_host_bits("torch", out),
                      reference.expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert))
    monkeypatch.undo()
    # same descriptions, but x now lives inside out: the fast path hands it back
    inside = out[:8]
    inside.copy_(dx)
    with pytest.raises(ValueError, match="out overlaps x in memory"):
        cupy_moe.expand_to_fused(inside, dmap, dp2e, out=out)


@needs_torch_cuda
def test_grad_requiring_tensors_never_take_the_fast_path():
    rng = np.random.default_rng()
    x, token_topk_to_pos, pos_to_expert = _case(rng)
    dx = to_device("torch", x, "bfloat16").requires_grad_(True)
    dmap, dp2e = map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert)
    with torch.no_grad():
        result = cupy_moe.expand_to_fused(dx, dmap, dp2e)
    assert not result.requires_grad
    assert_bits_equal(to_host_bits("torch", result),
                      reference.expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert))
    # grad mode back on: the same call must be refused, not replayed
    with pytest.raises(TypeError, match=re.escape("x requires grad, but cupy_moe ops are "
                                                  "inference-only")):
        cupy_moe.expand_to_fused(dx, dmap, dp2e)
