"""Arrays the ops refuse, or take with care, on every op (CPU backend).

The kernels and the NumPy backend read an array's raw bytes, so an array
whose bytes do not mean what its dtype's name says must be refused (a
byte-swapped NumPy array, a sparse tensor, a lazily negated torch view). A
size given as a 0-d bool is not an int.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import cupy_moe

torch = pytest.importorskip("torch")

T2P = np.array([[0]], dtype=np.int32)
P2E = np.array([0], dtype=np.int32)


def _op_args(op: str) -> tuple[dict, dict]:
    """A small valid call of ``op``: its array arguments and its other keywords."""
    rng = np.random.default_rng(7)
    if op == "expand_to_fused":
        return {"x": rng.standard_normal((1, 2)).astype(np.float16),
                "token_topk_to_pos": T2P, "pos_to_expert": P2E}, {}
    if op == "expand_to_fused_with_sf":
        return {"x": rng.integers(0, 256, (1, 128), dtype=np.uint8),
                "x_sf": rng.standard_normal((1, 1)).astype(np.float32),
                "token_topk_to_pos": T2P, "pos_to_expert": P2E}, {"num_per_channels": 128}
    if op == "fused_mapping":
        return {"topk_ids": np.array([[0, 3], [1, -1]], dtype=np.int32)}, {"num_experts": 4}
    if op == "reduce_fused":
        return {"expanded": rng.standard_normal((1, 2)).astype(np.float32),
                "token_topk_to_pos": T2P,
                "topk_weights": np.array([[0.5]], dtype=np.float32)}, {}
    if op == "quantize_fp8":
        return {"x": rng.standard_normal((1, 128)).astype(np.float32)}, {}
    assert op == "swiglu_quantize_fp8"
    return {"h": rng.standard_normal((1, 256)).astype(np.float32)}, {}


def _call(op: str, arrays: dict, keywords: dict):
    return getattr(cupy_moe, op)(**arrays, **keywords)


# every multi-byte array argument of every op (one-byte ones have no byte order)
MULTI_BYTE_ARGUMENTS = [(op, name) for op in (
    "expand_to_fused", "expand_to_fused_with_sf", "fused_mapping", "reduce_fused",
    "quantize_fp8", "swiglu_quantize_fp8") for name, array in _op_args(op)[0].items()
    if array.dtype.itemsize > 1]


@pytest.mark.parametrize(("op", "name"), MULTI_BYTE_ARGUMENTS)
def test_byte_swapped_numpy_arrays_are_refused_naming_them(op, name):
    arrays, keywords = _op_args(op)
    native = arrays[name]
    swapped = native.astype(native.dtype.newbyteorder("S"))
    assert np.array_equal(swapped, native)  # the same values, other bytes
    arrays[name] = swapped
    with pytest.raises(ValueError, match=re.escape(
            f"{name} has non-native byte order (dtype '{swapped.dtype.str}'); "
            f"pass {name}.astype('{native.dtype.str}')")):
        _call(op, arrays, keywords)


def test_a_byte_swapped_out_is_refused_too():
    arrays, _ = _op_args("expand_to_fused")
    out = np.zeros((1, 2), dtype=np.dtype(np.float16).newbyteorder("S"))
    with pytest.raises(ValueError, match=re.escape(
            f"out has non-native byte order (dtype '{out.dtype.str}')")):
        cupy_moe.expand_to_fused(**arrays, out=out)


@pytest.mark.parametrize(("op", "name"), [(op, name) for op in (
    "expand_to_fused", "fused_mapping", "reduce_fused", "quantize_fp8")
    for name in _op_args(op)[0]])
def test_sparse_tensors_are_refused_naming_them(op, name):
    arrays, keywords = _op_args(op)
    tensors = {n: torch.from_numpy(a) for n, a in arrays.items()}
    tensors[name] = tensors[name].to_sparse()
    with pytest.raises(ValueError, match=re.escape(
            f"{name} is a sparse_coo tensor; cupy_moe takes dense ones "
            f"(pass {name}.to_dense())")):
        _call(op, tensors, keywords)


def _negated_view(values: torch.Tensor) -> torch.Tensor:
    """``-values`` as a lazily negated view (torch's neg bit set: the stored
    bytes are ``values``'), as ``z.conj().imag`` gives."""
    view = torch.complex(torch.zeros_like(values), values).conj().imag
    assert view.is_neg()
    return view


def test_lazily_negated_views_are_refused_on_the_cpu_as_inputs_and_outputs():
    """The CPU backend views tensors through NumPy, and the GPU kernels read
    raw pointers: both would see the stored (un-negated) values. Refused,
    saying what to call; not resolved for the caller: that copies, and an
    ``out`` so copied would lose the results."""
    x = torch.from_numpy(_op_args("quantize_fp8")[0]["x"])
    with pytest.raises(ValueError, match=re.escape(
            "x is a lazily negated view (torch's negative bit is set): pass x.resolve_neg()")):
        cupy_moe.quantize_fp8(_negated_view(x))
    arrays, _ = _op_args("reduce_fused")
    expanded = torch.from_numpy(arrays["expanded"])
    weights = torch.from_numpy(arrays["topk_weights"])
    t2p = torch.from_numpy(T2P)
    # a contiguous negated view as out (torch's private _neg_view makes one)
    out = torch.zeros((1, 2), dtype=torch.float32)
    negated_out = torch._neg_view(out)
    assert negated_out.is_neg() and negated_out.is_contiguous()
    with pytest.raises(ValueError, match=re.escape(
            "out is a lazily negated view (torch's negative bit is set): pass "
            "out.resolve_neg()")):
        cupy_moe.reduce_fused(expanded, t2p, weights, out=negated_out)


@pytest.mark.parametrize("flag", [torch.tensor(True), np.bool_(True), np.array(True)])
def test_a_bool_size_is_not_an_int(flag):
    ids = _op_args("fused_mapping")[0]["topk_ids"]
    with pytest.raises(TypeError,
                       match=re.escape(f"num_experts must be an int; got bool {flag!r}")):
        cupy_moe.fused_mapping(ids, flag)
    # a 0-d int tensor or array is an int
    want = cupy_moe.fused_mapping(ids, 4)
    for size in (torch.tensor(4), np.array(4), np.int64(4)):
        got = cupy_moe.fused_mapping(ids, size)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
