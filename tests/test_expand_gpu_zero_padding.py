"""zero_padding on the GPU (marker ``gpu``), every kernel path of the
``kernel_path`` fixture: expert rows bit for bit as with zero_padding=True,
padding rows of poisoned outputs untouched with False and zero with True, the
column-major SF's pad columns zero either way, nothing written past the
outputs, and the torch fast path keyed by the flag.

Poisoned outputs are compared whole with the NumPy reference run on a host
copy of the poison (``gpu_cases.check_expand*``); fresh outputs of a
zero_padding=False call on their expert rows only.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from gpu_cases import (
    GPU_MARKS,
    KINDS,
    check_expand,
    check_expand_with_sf,
    expand_sf_op,
    map_to_device,
    needs_torch_cuda,
    padded_sf_bits,
    to_device,
    to_host_bits,
    torch,
)
from helpers import assert_bits_equal, assert_expert_rows_equal, bits, poisoned

import cupy_moe
from cupy_moe import reference
from cupy_moe.expand import api
from cupy_moe.expand.rules import sf_columns
from cupy_moe.harness.inputs import fitted_routing, numpy_dtype, random_bits
from cupy_moe.runtime.sizes import align_up

pytestmark = GPU_MARKS

ZERO_PADDING = [pytest.param(True, id="zero-padding"), pytest.param(False, id="leave-padding")]
SF_LAYOUTS = {"row-f32": (False, "float32"), "col-f32": (True, "float32"),
              "col-ue8m0": (True, "int32")}


def _routing(rng, num_tokens, top_k, num_expanded):
    """Expert-major map with padding inside X (alignment 4, dropped slots) and a tail."""
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, num_tokens, top_k, num_expanded,
                                                      num_experts=5, max_alignment=4, drop=0.3)
    assert (pos_to_expert < 0).any()
    return token_topk_to_pos, pos_to_expert


# Row lengths of every access width (bf16: 2, 4, 8 and 2 bytes; then 16-byte
# rows that the bulk kernels cut into chunks, the last one short, or take whole).
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("zero_padding", ZERO_PADDING)
@pytest.mark.parametrize("hidden", [1, 2, 4, 577, 1032, 8200])
def test_plain_op(hidden, zero_padding, kind, kernel_path):
    rng = np.random.default_rng()
    num_tokens, top_k, num_expanded = 23, 4, 23 * 4 + 13
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("bfloat16"))
    token_topk_to_pos, pos_to_expert = _routing(rng, num_tokens, top_k, num_expanded)
    check_expand(kind, x, token_topk_to_pos, pos_to_expert, tuning=kernel_path,
                 zero_padding=zero_padding)
    out = to_device(kind, poisoned((num_expanded, hidden), x.dtype), "bfloat16")
    check_expand(kind, x, token_topk_to_pos, pos_to_expert, out=out, tuning=kernel_path,
                 zero_padding=zero_padding)


# fp8 rows of 1, 4, 8 and 1 bytes a vector, then 16-byte rows as above; X % 4
# is 1, 2, 3 and 0 (the column-major buffer has 3, 2, 1 and no pad columns).
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("zero_padding", ZERO_PADDING)
@pytest.mark.parametrize("layout", list(SF_LAYOUTS))
@pytest.mark.parametrize("hidden", [1, 4, 8, 37, 2064, 16400])
def test_with_sf(hidden, layout, zero_padding, kind, kernel_path):
    rng = np.random.default_rng()
    col_major, sf_dtype = SF_LAYOUTS[layout]
    num_tokens, top_k, npc = 11, 4, 128
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
    s = sf_columns(hidden, npc, packed_ue8m0=sf_dtype == "int32")
    x_sf = random_bits(rng, (num_tokens, s), np.dtype(sf_dtype))
    for num_expanded in (45, 50, 47, 52):
        token_topk_to_pos, pos_to_expert = _routing(rng, num_tokens, top_k, num_expanded)
        for poison in (False, True):
            check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=npc,
                                 col_major=col_major, poison_outputs=poison, rng=rng,
                                 tuning=kernel_path, zero_padding=zero_padding)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("zero_padding", ZERO_PADDING)
@pytest.mark.parametrize("layout", ["none", *SF_LAYOUTS])
def test_no_tokens(layout, zero_padding, kind, kernel_path):
    # T == 0: expert rows are zeros either way; padding rows zero or left alone
    rng = np.random.default_rng()
    token_topk_to_pos = np.zeros((0, 8), dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, -1, 2, 2, -1], dtype=np.int32)  # X = 7: a pad column
    if layout == "none":
        x = np.zeros((0, 256), dtype=numpy_dtype("bfloat16"))
        out = to_device(kind, poisoned((7, 256), x.dtype), "bfloat16")
        check_expand(kind, x, token_topk_to_pos, pos_to_expert, out=out, tuning=kernel_path,
                     zero_padding=zero_padding)
        return
    col_major, sf_dtype = SF_LAYOUTS[layout]
    x = np.zeros((0, 256), dtype=numpy_dtype("float8_e4m3fn"))
    x_sf = np.zeros((0, sf_columns(256, 128, packed_ue8m0=sf_dtype == "int32")), sf_dtype)
    check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128,
                         col_major=col_major, poison_outputs=True, rng=rng, tuning=kernel_path,
                         zero_padding=zero_padding)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("col_major", [False, True])
def test_leaving_padding_writes_nothing_past_the_outputs(col_major, kind, kernel_path):
    rng = np.random.default_rng()
    num_tokens, top_k, hidden, num_expanded, guard = 9, 3, 2064, 41, 64
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
    sf_dtype = np.dtype("int32" if col_major else "float32")
    s = sf_columns(hidden, 128, packed_ue8m0=col_major)
    x_sf = random_bits(rng, (num_tokens, s), sf_dtype)
    token_topk_to_pos, pos_to_expert = _routing(rng, num_tokens, top_k, num_expanded)
    # outputs are the heads of larger poisoned buffers; the tails are guards
    out_buf = to_device(kind, poisoned((num_expanded + guard, hidden), x.dtype), "float8_e4m3fn")
    ld = align_up(num_expanded, 4)
    sf_used = s * ld if col_major else num_expanded * s  # pad columns included
    sf_buf = to_device(kind, poisoned((sf_used + guard,), sf_dtype), sf_dtype.name)
    out = out_buf[:num_expanded]
    out_sf = (sf_buf[:s * ld].reshape(s, ld)[:, :num_expanded].T if col_major
              else sf_buf[:num_expanded * s].reshape(num_expanded, s))
    expand_sf_op(
        kernel_path, to_device(kind, x, "float8_e4m3fn"), to_device(kind, x_sf, sf_dtype.name),
        map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert),
        num_per_channels=128, use_tma_aligned_col_major_sf=col_major, out=out, out_sf=out_sf,
        zero_padding=False)
    guard_bits = poisoned((guard, hidden), x.dtype)
    assert_bits_equal(to_host_bits(kind, out_buf[num_expanded:]), bits(guard_bits), "out guard")
    assert_bits_equal(to_host_bits(kind, sf_buf[sf_used:]), bits(poisoned((guard,), sf_dtype)),
                      "out_sf guard")
    padding = pos_to_expert < 0
    got = to_host_bits(kind, out)
    assert_bits_equal(got[padding], bits(poisoned((int(padding.sum()), hidden), x.dtype)),
                      "padding rows")
    want_x, want_sf = reference.expand_to_fused_with_sf_numpy(
        x, x_sf, token_topk_to_pos, pos_to_expert, col_major=col_major)
    assert_expert_rows_equal(got, want_x, pos_to_expert, "expanded_x")
    sf_head = to_host_bits(kind, sf_buf[:sf_used])
    if col_major:
        full = sf_head.reshape(s, ld)
        assert not full[:, num_expanded:].any(), "pad columns of the SF buffer are not zero"
        rows = full[:, :num_expanded].T
    else:
        rows = sf_head.reshape(num_expanded, s)
    assert_bits_equal(rows[padding], bits(poisoned((int(padding.sum()), s), sf_dtype)),
                      "padding rows' scale factors")
    assert_expert_rows_equal(rows, want_sf, pos_to_expert, "expanded_x_sf")


# -- the torch fast path is keyed by zero_padding ------------------------------------

def _fast_path_case(rng):
    # X = 83: the column-major SF buffer has a pad column
    num_tokens, top_k, hidden, num_expanded = 16, 4, 256, 83
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
    x_sf = random_bits(rng, (num_tokens, 1), np.dtype("int32"))
    token_topk_to_pos, pos_to_expert = _routing(rng, num_tokens, top_k, num_expanded)
    return x, x_sf, token_topk_to_pos, pos_to_expert


@needs_torch_cuda
def test_torch_fast_path_keys_zero_padding_plain_op(monkeypatch):
    rng = np.random.default_rng()
    _, _, token_topk_to_pos, pos_to_expert = _fast_path_case(rng)
    x = random_bits(rng, (token_topk_to_pos.shape[0], 128), numpy_dtype("bfloat16"))
    dx = to_device("torch", x, "bfloat16")
    dmap, dp2e = map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert)
    out = torch.empty((pos_to_expert.shape[0], 128), dtype=torch.bfloat16, device="cuda")
    padding = pos_to_expert < 0
    expected = reference.expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert)

    def call(zero_padding):
        out.view(torch.uint8).fill_(0xAB)
        assert cupy_moe.expand_to_fused(dx, dmap, dp2e, out=out, zero_padding=zero_padding) is out
        got = to_host_bits("torch", out)
        assert_expert_rows_equal(got, expected, pos_to_expert, "expanded_x")
        return got[padding]

    def full_path(*args, **kwargs):
        raise AssertionError("the fast path should have taken this call")

    api._plain_fast_path.clear()
    assert (call(False) == 0xABAB).all()  # full path: remembers False's plan
    assert len(api._plain_fast_path) == 1
    with monkeypatch.context() as patched:
        patched.setattr(api, "_expand", full_path)
        assert (call(False) == 0xABAB).all()  # fast path
    # True has no plan yet: the full path takes it, zero-fills, remembers it
    assert not call(True).any()
    assert len(api._plain_fast_path) == 2
    with monkeypatch.context() as patched:
        patched.setattr(api, "_expand", full_path)
        assert not call(True).any()
        assert (call(False) == 0xABAB).all()
    # 1 == True as a key; it must still be refused, not replay True's plan
    with pytest.raises(TypeError, match=re.escape(
            "zero_padding must be True or False; got int 1")):
        cupy_moe.expand_to_fused(dx, dmap, dp2e, out=out, zero_padding=1)


@needs_torch_cuda
def test_torch_fast_path_keys_zero_padding_with_sf(monkeypatch):
    rng = np.random.default_rng()
    x, x_sf, token_topk_to_pos, pos_to_expert = _fast_path_case(rng)
    dx, dsf = to_device("torch", x, "float8_e4m3fn"), to_device("torch", x_sf, "int32")
    dmap, dp2e = map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert)
    num_expanded = pos_to_expert.shape[0]
    out = torch.empty((num_expanded, x.shape[1]), dtype=torch.float8_e4m3fn, device="cuda")
    padding = pos_to_expert < 0
    want_x, want_sf = reference.expand_to_fused_with_sf_numpy(
        x, x_sf, token_topk_to_pos, pos_to_expert, col_major=True)

    def call(zero_padding):
        # out_sf fresh: the SF fast path takes no out_sf
        out.view(torch.uint8).fill_(0xAB)
        got_x, got_sf = cupy_moe.expand_to_fused_with_sf(
            dx, dsf, dmap, dp2e, num_per_channels=128, use_tma_aligned_col_major_sf=True,
            out=out, zero_padding=zero_padding)
        assert got_x is out
        host_x = to_host_bits("torch", out)
        assert_expert_rows_equal(host_x, want_x, pos_to_expert, "expanded_x")
        full = padded_sf_bits("torch", got_sf, num_expanded, 1)
        assert not full[:, num_expanded:].any(), "pad columns of the SF buffer are not zero"
        assert_expert_rows_equal(full[:, :num_expanded].T, want_sf, pos_to_expert,
                                 "expanded_x_sf")
        if zero_padding:  # fresh SF memory or not, padding rows' scale factors are zero
            assert not full[:, :num_expanded].T[padding].any()
        return host_x[padding]

    def full_path(*args, **kwargs):
        raise AssertionError("the fast path should have taken this call")

    api._sf_fast_path.clear()
    assert (call(False) == 0xAB).all()
    with monkeypatch.context() as patched:
        patched.setattr(api, "_expand", full_path)
        assert (call(False) == 0xAB).all()
    assert not call(True).any()
    assert len(api._sf_fast_path) == 2
    with monkeypatch.context() as patched:
        patched.setattr(api, "_expand", full_path)
        assert not call(True).any()
        assert (call(False) == 0xAB).all()
    with pytest.raises(TypeError, match=re.escape(
            "zero_padding must be True or False; got int 0")):
        cupy_moe.expand_to_fused_with_sf(dx, dsf, dmap, dp2e, num_per_channels=128,
                                         use_tma_aligned_col_major_sf=True, zero_padding=0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_non_bool_zero_padding_is_rejected_on_the_gpu(kind):
    rng = np.random.default_rng()
    x8, x_sf, token_topk_to_pos, pos_to_expert = _fast_path_case(rng)
    x16 = random_bits(rng, (x8.shape[0], 128), numpy_dtype("bfloat16"))
    routing = (map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert))
    with pytest.raises(TypeError, match=re.escape(
            "zero_padding must be True or False; got str 'no'")):
        cupy_moe.expand_to_fused(to_device(kind, x16, "bfloat16"), *routing, zero_padding="no")
    with pytest.raises(TypeError, match=re.escape(
            "zero_padding must be True or False; got NoneType None")):
        cupy_moe.expand_to_fused_with_sf(
            to_device(kind, x8, "float8_e4m3fn"), to_device(kind, x_sf, "int32"), *routing,
            num_per_channels=128, use_tma_aligned_col_major_sf=True, zero_padding=None)
