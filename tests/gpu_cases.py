"""Shared pieces of the GPU expand tests: skip marks, the kernel paths (tunings
that force each kernel), moving bits to and from the device, calling the ops
and checking them bit for bit against the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_moe
from cupy_moe import reference
from cupy_moe.harness.inputs import random_bits
from cupy_moe.runtime.sizes import align_up
from helpers import GivenPosToToken, assert_bits_equal

cupy = pytest.importorskip("cupy")

from cupy_moe.expand.api import run_with_tuning  # noqa: E402


def _gpu_count() -> int:
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver
        return 0


GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(_gpu_count() == 0, reason="needs a CUDA GPU")]

try:
    import torch
    HAS_TORCH_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    torch = None
    HAS_TORCH_CUDA = False

needs_torch_cuda = pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs torch with CUDA")
KINDS = ["cupy", pytest.param("torch", marks=needs_torch_cuda)]

# NumPy bit carriers of the payload dtypes, and their torch names.
_TORCH_DTYPE = {"bfloat16": "bfloat16", "float16": "float16", "float8_e4m3fn": "float8_e4m3fn",
                "float32": "float32", "int32": "int32", "uint8": "uint8"}


def to_device(kind: str, array: np.ndarray, dtype: str):
    """A device copy of ``array``'s bits, typed ``dtype`` (CuPy: bits where it has no such dtype)."""
    bits = np.ascontiguousarray(array).view(f"u{array.itemsize}" if dtype not in ("int32",) else "i4")
    if kind == "torch":
        bits_t = torch.from_numpy(bits.view(f"i{array.itemsize}") if array.itemsize > 1 else bits)
        return bits_t.cuda().view(getattr(torch, _TORCH_DTYPE[dtype]))
    if dtype in ("float16", "float32", "int32"):
        return cupy.asarray(bits).view(dtype)
    return cupy.asarray(bits)  # bf16 as uint16 bits, fp8 as uint8


def to_host_bits(kind: str, array) -> np.ndarray:
    """Raw bits of a device array, as unsigned ints, same shape and strides."""
    if kind == "torch":
        size = array.element_size()
        carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]
        host = array.view(carrier).cpu().numpy()
    else:
        host = cupy.asnumpy(array)
    return host.view(f"u{host.itemsize}")


def map_to_device(kind: str, array: np.ndarray):
    array = np.ascontiguousarray(array, dtype=np.int32)
    return torch.from_numpy(array).cuda() if kind == "torch" else cupy.asarray(array)


def padded_sf_bits(kind: str, out_sf, num_expanded: int, sf_cols: int) -> np.ndarray:
    """The whole [S, align(X, 4)] buffer behind a column-major SF view, as bits."""
    ld = align_up(num_expanded, 4)
    if kind == "torch":
        full = torch.as_strided(out_sf, (sf_cols, ld), (ld, 1))
    else:
        full = cupy.lib.stride_tricks.as_strided(out_sf, (sf_cols, ld), (ld * 4, 4))
    return to_host_bits(kind, full)


def pos_to_token_of(token_topk_to_pos, num_expanded: int):
    """[X] int32 on the map's device: the token of each row some slot targets
    (one of them, for a malformed map), -1 elsewhere. No host sync (a CUDA
    graph may capture it): dropped and out-of-range slots land in a row X that
    is cut off."""
    t2p = token_topk_to_pos
    if isinstance(t2p, torch.Tensor):
        p2t = torch.full((num_expanded + 1,), -1, dtype=torch.int32, device=t2p.device)
        tokens = torch.arange(t2p.shape[0], dtype=torch.int32, device=t2p.device)
        rows = torch.where((t2p >= 0) & (t2p < num_expanded), t2p, num_expanded).long()
        p2t[rows.reshape(-1)] = tokens[:, None].expand(t2p.shape).reshape(-1)
    else:
        p2t = cupy.full((num_expanded + 1,), -1, dtype=cupy.int32)
        tokens = cupy.arange(t2p.shape[0], dtype=cupy.int32)
        rows = cupy.where((t2p >= 0) & (t2p < num_expanded), t2p, num_expanded)
        p2t[rows.reshape(-1)] = cupy.broadcast_to(tokens[:, None], t2p.shape).reshape(-1)
    return p2t[:num_expanded]


def expand_op(tuning, x, token_topk_to_pos, pos_to_expert, **kwargs):
    """``expand_to_fused``: the public op when ``tuning`` is None, else under
    ``tuning`` (with ``pos_to_token`` drawn from the map for a ``GivenPosToToken``)."""
    if tuning is None:
        return cupy_moe.expand_to_fused(x, token_topk_to_pos, pos_to_expert, **kwargs)
    if isinstance(tuning, GivenPosToToken):
        kwargs["pos_to_token"] = pos_to_token_of(token_topk_to_pos, pos_to_expert.shape[0])
        tuning = tuning.tuning
    return run_with_tuning(tuning, x, token_topk_to_pos, pos_to_expert, **kwargs)[0]


def expand_sf_op(tuning, x, x_sf, *args, **kwargs):
    """``expand_to_fused_with_sf``: the public op when ``tuning`` is None, else under
    ``tuning`` (with ``pos_to_token`` drawn from the map for a ``GivenPosToToken``)."""
    if tuning is None:
        return cupy_moe.expand_to_fused_with_sf(x, x_sf, *args, **kwargs)
    if isinstance(tuning, GivenPosToToken):
        token_topk_to_pos, pos_to_expert = args[:2]
        kwargs["pos_to_token"] = pos_to_token_of(token_topk_to_pos, pos_to_expert.shape[0])
        tuning = tuning.tuning
    return run_with_tuning(tuning, x, *args, x_sf=x_sf, **kwargs)


def check_expand(kind, x, token_topk_to_pos, pos_to_expert, *, out=None, tuning=None,
                 zero_padding=True):
    """One call against the reference. With ``out`` the reference starts from a
    host copy of its bits, so that the whole result is exact, padding rows left
    alone by ``zero_padding=False`` included; a fresh output of such a call is
    compared on its expert rows only."""
    dx = to_device(kind, x, x.dtype.name)
    dmap, dp2e = map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert)
    before = None if out is None else to_host_bits(kind, out).copy()
    expected = reference.expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert, before,
                                               zero_padding=zero_padding)
    result = expand_op(tuning, dx, dmap, dp2e, out=out, zero_padding=zero_padding)
    if out is not None:
        assert result is out
    rows = _compared_rows(pos_to_expert, zero_padding, fresh=out is None)
    assert_bits_equal(to_host_bits(kind, result)[rows], expected[rows], "expanded_x")
    return result


def _compared_rows(pos_to_expert: np.ndarray, zero_padding: bool, *, fresh: bool):
    """Rows whose bits the reference knows: all of them, except the padding rows
    of a fresh output that zero_padding=False leaves as allocated."""
    return pos_to_expert >= 0 if fresh and not zero_padding else slice(None)


def check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, *, npc, col_major,
                         poison_outputs=False, rng=None, tuning=None, zero_padding=True,
                         pos_to_token=None):
    """Both outputs against the reference, as ``check_expand``; poisoned outputs
    are random bits, the column-major SF buffer's pad columns included (which
    must come back zero whatever ``zero_padding`` says). ``pos_to_token`` (host
    int32) is passed on as the hint."""
    num_expanded, sf_cols = pos_to_expert.shape[0], x_sf.shape[1]
    ld = align_up(num_expanded, 4)
    dx, dsf = to_device(kind, x, x.dtype.name), to_device(kind, x_sf, x_sf.dtype.name)
    dmap, dp2e = map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert)
    out = out_sf = expected_x = expected_sf = None
    if poison_outputs:
        out_bits = random_bits(rng, (num_expanded, x.shape[1]), x.dtype)
        buf_bits = random_bits(rng, (sf_cols, ld) if col_major else (num_expanded, sf_cols),
                               x_sf.dtype)
        out = to_device(kind, out_bits, x.dtype.name)
        buf = to_device(kind, buf_bits, x_sf.dtype.name)
        out_sf = buf[:, :num_expanded].T if col_major else buf
        # the reference writes host copies of the same bits
        expected_x = out_bits.copy()
        expected_sf = buf_bits.copy()[:, :num_expanded].T if col_major else buf_bits.copy()
    expected_x, expected_sf = reference.expand_to_fused_with_sf_numpy(
        x, x_sf, token_topk_to_pos, pos_to_expert, col_major=col_major, out=expected_x,
        out_sf=expected_sf, zero_padding=zero_padding)
    result_x, result_sf = expand_sf_op(
        tuning, dx, dsf, dmap, dp2e, num_per_channels=npc, use_tma_aligned_col_major_sf=col_major,
        out=out, out_sf=out_sf, zero_padding=zero_padding,
        **({} if pos_to_token is None else {"pos_to_token": map_to_device(kind, pos_to_token)}))
    if poison_outputs:
        assert result_x is out and result_sf is out_sf
    rows = _compared_rows(pos_to_expert, zero_padding, fresh=not poison_outputs)
    assert_bits_equal(to_host_bits(kind, result_x)[rows], expected_x[rows], "expanded_x")
    assert tuple(result_sf.shape) == (num_expanded, sf_cols)
    if col_major:
        strides = tuple(result_sf.stride()) if kind == "torch" else tuple(
            s // 4 for s in result_sf.strides)
        if num_expanded > 1 and sf_cols > 1:
            assert strides == (1, ld)
        full = padded_sf_bits(kind, result_sf, num_expanded, sf_cols)
        assert_bits_equal(full[:, :num_expanded].T[rows], expected_sf[rows], "expanded_x_sf")
        assert not full[:, num_expanded:].any(), "pad columns of the SF buffer are not zero"
    else:
        assert_bits_equal(to_host_bits(kind, result_sf)[rows], expected_sf[rows],
                          "expanded_x_sf")
