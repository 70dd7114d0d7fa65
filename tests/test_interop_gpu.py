"""Zero-copy exchange between torch and CuPy on the GPU (marker ``gpu``)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import cupy_moe
from gpu_cases import GPU_MARKS, cupy, needs_torch_cuda, torch

pytestmark = [*GPU_MARKS, needs_torch_cuda]



@pytest.mark.parametrize(("torch_dtype", "carrier"), [
    ("bfloat16", "uint16"), ("float8_e4m3fn", "uint8"), ("float16", "float16"),
    ("float32", "float32"), ("int32", "int32")])
def test_round_trip_shares_memory_and_restores_the_dtype(torch_dtype, carrier):
    bits = torch.randint(0, 256, (6, 16), dtype=torch.uint8, device="cuda")
    tensor = bits.view(getattr(torch, torch_dtype))[1:5]  # a view with an offset
    array = cupy_moe.as_cupy(tensor)
    assert isinstance(array, cupy.ndarray) and array.dtype == np.dtype(carrier)
    assert array.data.ptr == tensor.data_ptr() and array.shape == tuple(tensor.shape)
    back = cupy_moe.as_torch(array, dtype=tensor.dtype)
    assert back.dtype == tensor.dtype and back.data_ptr() == tensor.data_ptr()
    assert torch.equal(back.view(torch.uint8), tensor.view(torch.uint8))
    array[0] = 0  # writes are seen by the tensor: the same memory
    assert not tensor.view(torch.uint8)[0].any()


def test_as_torch_dtype_names_and_sizes():
    array = cupy.arange(8, dtype=cupy.uint16)
    assert cupy_moe.as_torch(array).dtype == torch.uint16
    assert cupy_moe.as_torch(array, dtype="bfloat16").dtype == torch.bfloat16
    assert cupy_moe.as_torch(array, dtype=ml_dtypes.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=re.escape("dtype torch.float32 has 4-byte items, array "
                                                   "uint16 has 2-byte items")):
        cupy_moe.as_torch(array, dtype=torch.float32)
    with pytest.raises(TypeError, match="dtype 'no_such_type' names no torch dtype"):
        cupy_moe.as_torch(array, dtype="no_such_type")


def test_ops_agree_across_the_exchange():
    rng = np.random.default_rng()
    x = torch.from_numpy(rng.integers(0, 2**16, (4, 32), dtype=np.uint16).view(np.int16)) \
        .cuda().view(torch.bfloat16)
    token_topk_to_pos = torch.tensor([[0, 2], [1, -1], [3, 4], [-1, 5]], dtype=torch.int32,
                                     device="cuda")
    pos_to_expert = torch.tensor([0, 0, 1, 1, 2, 2, -1, -1], dtype=torch.int32, device="cuda")
    from_torch = cupy_moe.expand_to_fused(x, token_topk_to_pos, pos_to_expert)
    from_cupy = cupy_moe.expand_to_fused(cupy_moe.as_cupy(x), cupy_moe.as_cupy(token_topk_to_pos),
                                         cupy_moe.as_cupy(pos_to_expert))
    assert from_cupy.dtype == np.uint16
    assert torch.equal(cupy_moe.as_torch(from_cupy, dtype=torch.bfloat16).view(torch.int16),
                       from_torch.view(torch.int16))


def test_a_column_major_out_sf_imported_by_dlpack_is_judged_by_its_own_extent():
    """CuPy knows no allocation size for memory imported by DLPack (its
    DLPackMemory.size sums the shape's extents: 40 bytes for an [8, 2]
    float32 view, which once refused a whole buffer). What the imported array
    reaches is what counts: the whole [S, align(X, 4)] buffer imported, then
    viewed column-major in CuPy, is taken and written as torch's own; the
    transposed view imported alone lacks the last column's pad rows."""
    x = torch.randn(6, 256, device="cuda")
    settings = dict(round_sf=True, use_tma_aligned_col_major_sf=True)
    want_codes, want_sf = cupy_moe.quantize_fp8(x, **settings)
    buffer = torch.full((2, 8), float("nan"), device="cuda")  # [S, align(X, 4)]
    out_sf = cupy_moe.as_cupy(buffer).T[:6]  # [X, S], strides (1, 8) elements
    codes, got_sf = cupy_moe.quantize_fp8(cupy_moe.as_cupy(x), out_sf=out_sf, **settings)
    assert got_sf is out_sf
    assert torch.equal(cupy_moe.as_torch(codes, dtype=torch.float8_e4m3fn).view(torch.uint8),
                       want_codes.view(torch.uint8))
    assert torch.equal(buffer[:, :6].T, want_sf) and not buffer[:, 6:].any()  # pad rows zero
    with pytest.raises(ValueError, match=re.escape(
            "out_sf must view a buffer of [S, align(R, 4)] = [2, 8] elements (64 bytes, pad "
            "columns included); only 56 bytes follow its first element")):
        cupy_moe.quantize_fp8(cupy_moe.as_cupy(x), out_sf=cupy_moe.as_cupy(buffer[:, :6].T),
                              **settings)
