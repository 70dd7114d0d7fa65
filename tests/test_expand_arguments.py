"""Arguments a new user gets wrong, on the CPU: each must raise an error that
names the argument (NumPy arrays and CPU torch tensors)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import torch

import cupy_moe
from cupy_moe.expand.api import run_with_tuning
from cupy_moe.expand.tuning import DEFAULT_TUNING
from cpu_cases import KINDS, as_kind, expand, expand_sf, i32, sf_inputs
from helpers import assert_bits_equal, oracle_expand, random_payload

T2P = i32([[0, 3], [1, 4], [2, -1]])
P2E = i32([0, 0, 0, 1, 1, -1, -1])


def _sf_args(kind, rng):
    x, x_sf = sf_inputs(rng, 3, 256, 128, "float32")
    return {"x": as_kind(kind, x), "x_sf": as_kind(kind, x_sf),
            "token_topk_to_pos": as_kind(kind, T2P), "pos_to_expert": as_kind(kind, P2E)}


def _plain_args(kind, rng):
    return {"x": as_kind(kind, random_payload(rng, (3, 8), "bfloat16")),
            "token_topk_to_pos": as_kind(kind, T2P), "pos_to_expert": as_kind(kind, P2E)}


def _call(args, **kwargs):
    if "x_sf" in args:
        return cupy_moe.expand_to_fused_with_sf(*args.values(), num_per_channels=128, **kwargs)
    return cupy_moe.expand_to_fused(*args.values(), **kwargs)


@pytest.mark.parametrize(("op", "name"), [
    *[("plain", name) for name in ("x", "token_topk_to_pos", "pos_to_expert")],
    *[("sf", name) for name in ("x", "x_sf", "token_topk_to_pos", "pos_to_expert")]])
def test_none_for_an_array_is_a_type_error_naming_it(op, name, rng):
    args = (_sf_args if op == "sf" else _plain_args)("numpy", rng)
    args[name] = None
    with pytest.raises(TypeError, match=re.escape(
            f"{name} must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got None")):
        _call(args)


@pytest.mark.parametrize("kind", KINDS)
def test_out_overlapping_x_is_rejected(kind, rng):
    # the case: x = out[:T]
    out = as_kind(kind, random_payload(rng, (7, 8), "bfloat16"))
    args = _plain_args(kind, rng)
    args["x"] = out[:3]
    with pytest.raises(ValueError, match="out overlaps x in memory"):
        _call(args, out=out)


def _overlapping_call(output: str, other: str, rng) -> dict:
    """Arguments of the SF op (uint8 payload) where ``other`` lives inside
    ``output``'s memory."""
    out = np.zeros((7, 256), dtype=np.uint8)
    out_sf = np.zeros((7, 2), dtype=np.float32)
    args = {"x": random_payload(rng, (3, 256), "uint8"),
            "x_sf": random_payload(rng, (3, 2), "float32"),
            "token_topk_to_pos": T2P.copy(), "pos_to_expert": P2E.copy()}
    if (output, other) == ("out", "out_sf"):
        out_sf = out.reshape(-1)[:56].view(np.float32).reshape(7, 2)
    else:
        holder = out if output == "out" else out_sf
        inside = holder.reshape(-1).view(np.uint8)[:args[other].nbytes]
        inside = inside.view(args[other].dtype).reshape(args[other].shape)
        inside[...] = args[other]
        args[other] = inside
    return {**args, "out": out, "out_sf": out_sf}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("output", "other"), [
    ("out", "x"), ("out_sf", "x_sf"), ("out_sf", "pos_to_expert"), ("out", "out_sf")])
def test_outputs_overlapping_inputs_or_each_other_are_rejected(kind, output, other, rng):
    arrays = _overlapping_call(output, other, rng)
    if kind == "torch":
        arrays = {name: torch.from_numpy(a) for name, a in arrays.items()}  # same memory
    with pytest.raises(ValueError, match=f"{output} overlaps {other} in memory"):
        cupy_moe.expand_to_fused_with_sf(
            arrays["x"], arrays["x_sf"], arrays["token_topk_to_pos"], arrays["pos_to_expert"],
            num_per_channels=128, out=arrays["out"], out_sf=arrays["out_sf"])


def test_disjoint_views_of_one_buffer_are_accepted(rng):
    # np.shares_memory is exact: interleaved columns of one buffer do not overlap
    buffer = np.zeros((7, 16), dtype=np.uint16)
    x = buffer[:3, 1::2]
    x[...] = random_payload(rng, (3, 8), "uint16")
    out = np.zeros((7, 8), dtype=np.uint16)
    result = cupy_moe.expand_to_fused(x, T2P, P2E, out=out)
    assert_bits_equal(result, oracle_expand(np.ascontiguousarray(x), T2P, P2E))


@pytest.mark.parametrize("name", ["out", "out_sf"])
def test_read_only_outputs_are_rejected_naming_them(name, rng):
    args = _sf_args("numpy", rng)
    outs = {"out": np.zeros((7, 256), dtype=args["x"].dtype),
            "out_sf": np.zeros((7, 2), dtype=np.float32)}
    outs[name].flags.writeable = False
    with pytest.raises(ValueError, match=f"{name} is read-only; an output must be writeable"):
        _call(args, **outs)


@pytest.mark.parametrize("name", ["x", "x_sf", "token_topk_to_pos", "pos_to_expert", "out",
                                  "out_sf"])
def test_meta_tensors_are_rejected_naming_them(name, rng):
    args = _sf_args("torch", rng)
    outs = {}
    if name.startswith("out"):
        outs[name] = torch.empty((7, 256) if name == "out" else (7, 2), device="meta",
                                 dtype=args["x"].dtype if name == "out" else torch.float32)
    else:
        args[name] = args[name].to("meta")
    with pytest.raises(ValueError, match=re.escape(
            f"{name} is a tensor on device 'meta'; cupy_moe takes CPU and CUDA tensors")):
        _call(args, **outs)


@pytest.mark.parametrize("name", ["x", "x_sf"])
def test_tensors_requiring_grad_are_rejected_unless_grad_mode_is_off(name, rng):
    x = random_payload(rng, (3, 256), "bfloat16")
    x_sf = random_payload(rng, (3, 2), "float32")
    tensors = {"x": torch.from_numpy(x.view(np.int16)).view(torch.bfloat16),
               "x_sf": torch.from_numpy(x_sf)}
    tensors[name] = tensors[name].clone().requires_grad_(True)
    t2p, p2e = torch.from_numpy(T2P), torch.from_numpy(P2E)

    def call():
        if name == "x":
            return (cupy_moe.expand_to_fused(tensors["x"], t2p, p2e),)
        # the SF op takes 1-byte payloads: x_sf alone carries the grad here
        x8 = torch.zeros(3, 256, dtype=torch.uint8)
        return cupy_moe.expand_to_fused_with_sf(x8, tensors["x_sf"], t2p, p2e,
                                                num_per_channels=128)

    with pytest.raises(TypeError, match=re.escape(
            f"{name} requires grad, but cupy_moe ops are inference-only (no autograd): "
            f"pass {name}.detach() or call under torch.no_grad()")):
        call()
    with torch.no_grad():
        result = call()[-1]
    expected = oracle_expand(x if name == "x" else x_sf, T2P, P2E)
    got = result.view(torch.int16).numpy() if name == "x" else result.numpy()
    assert_bits_equal(got.view(expected.dtype), expected)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_per_channels": 128.0}, "num_per_channels must be an int; got float 128.0"),
    ({"num_per_channels": True}, "num_per_channels must be an int; got bool True"),
    ({"num_per_channels": "128"}, "num_per_channels must be an int; got str '128'"),
    ({"num_per_channels": 128, "validate": "yes"}, "validate must be True or False; got str 'yes'"),
    ({"num_per_channels": 128, "validate": 1}, "validate must be True or False; got int 1"),
    ({"num_per_channels": 128, "use_tma_aligned_col_major_sf": "no"},
     "use_tma_aligned_col_major_sf must be True or False; got str 'no'"),
    ({"num_per_channels": 128, "zero_padding": "no"},
     "zero_padding must be True or False; got str 'no'"),
    ({"num_per_channels": 128, "zero_padding": 0}, "zero_padding must be True or False; got int 0"),
    ({"num_per_channels": 128, "zero_padding": None},
     "zero_padding must be True or False; got NoneType None"),
])
def test_scalar_arguments_of_the_wrong_type_are_rejected(kwargs, message, rng):
    args = _sf_args("numpy", rng)
    with pytest.raises(TypeError, match=re.escape(message)):
        cupy_moe.expand_to_fused_with_sf(*args.values(), **kwargs)


def test_plain_op_rejects_a_non_bool_validate(rng):
    with pytest.raises(TypeError, match=re.escape("validate must be True or False; got str 'yes'")):
        _call(_plain_args("numpy", rng), validate="yes")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("value", "message"), [
    (1, "zero_padding must be True or False; got int 1"),
    ("False", "zero_padding must be True or False; got str 'False'"),
    (None, "zero_padding must be True or False; got NoneType None"),
])
def test_plain_op_rejects_a_non_bool_zero_padding(kind, value, message, rng):
    with pytest.raises(TypeError, match=re.escape(message)):
        _call(_plain_args(kind, rng), zero_padding=value)


@pytest.mark.parametrize("kind", KINDS)
def test_numpy_integer_and_bool_scalars_are_accepted(kind, rng):
    x, x_sf = sf_inputs(rng, 3, 256, 128, "float32")
    out, out_sf = expand_sf(kind, x, x_sf, T2P, P2E, npc=np.int64(128), col_major=np.bool_(False),
                            validate=np.bool_(True), zero_padding=np.bool_(True))
    assert_bits_equal(out, oracle_expand(x, T2P, P2E))
    assert_bits_equal(out_sf, oracle_expand(x_sf, T2P, P2E))
    assert_bits_equal(expand(kind, x.view(np.uint16).reshape(3, 128), T2P, P2E),
                      oracle_expand(x.view(np.uint16).reshape(3, 128), T2P, P2E))


# -- pos_to_token (both ops' hint) ---------------------------------------------------

def _call_with_pos_to_token(op, pos_to_token, **kwargs):
    """A small call of ``op`` ("plain" or "sf") given ``pos_to_token``."""
    t2p, p2e = np.array([[0, 1], [2, 3]], np.int32), np.zeros(4, np.int32)
    if op == "plain":
        return cupy_moe.expand_to_fused(np.zeros((2, 128), np.uint16), t2p, p2e,
                                        pos_to_token=pos_to_token, **kwargs)
    return cupy_moe.expand_to_fused_with_sf(
        np.zeros((2, 128), ml_dtypes.float8_e4m3fn), np.zeros((2, 1), np.int32), t2p, p2e,
        num_per_channels=128, use_tma_aligned_col_major_sf=True, pos_to_token=pos_to_token,
        **kwargs)


@pytest.mark.parametrize("op", ["plain", "sf"])
@pytest.mark.parametrize(("pos_to_token", "error", "message"), [
    (np.zeros((4, 1), np.int32), ValueError, "pos_to_token must be 1-D [X]; got shape (4, 1)"),
    (np.zeros(4, np.int64), ValueError, "pos_to_token must be one of int32; got int64"),
    (np.zeros(5, np.int32), ValueError,
     "pos_to_token.shape[0] must equal pos_to_expert.shape[0] (X = 4); got 5"),
    ([0, 0, 1, 1], TypeError,
     "pos_to_token must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got builtins.list"),
    (torch.zeros(4, dtype=torch.int32), TypeError,
     "all arrays must be of one kind: x is numpy.ndarray, pos_to_token is torch.Tensor"),
])
def test_pos_to_token_rules(op, pos_to_token, error, message):
    with pytest.raises(error, match=re.escape(message)):
        _call_with_pos_to_token(op, pos_to_token)


def test_out_overlapping_pos_to_token_is_rejected():
    out = np.zeros((4, 128), np.uint16)
    with pytest.raises(ValueError, match="out overlaps pos_to_token in memory"):
        _call_with_pos_to_token("plain", out.reshape(-1)[:8].view(np.int32), out=out)


def test_run_with_tuning_passes_pos_to_token_to_the_plain_op():
    with pytest.raises(ValueError, match=re.escape(
            "pos_to_token.shape[0] must equal pos_to_expert.shape[0] (X = 2); got 3")):
        run_with_tuning(DEFAULT_TUNING, np.zeros((1, 8), np.uint16), np.array([[0, 1]], np.int32),
                        np.zeros(2, np.int32), pos_to_token=np.zeros(3, np.int32))


def test_out_sf_overlapping_pos_to_token_is_rejected():
    x = np.zeros((2, 128), ml_dtypes.float8_e4m3fn)
    x_sf = np.zeros((2, 1), np.float32)
    t2p, p2e = np.array([[0, 1], [2, 3]], np.int32), np.zeros(4, np.int32)
    out_sf = np.zeros((4, 1), np.float32)
    with pytest.raises(ValueError, match="out_sf overlaps pos_to_token in memory"):
        cupy_moe.expand_to_fused_with_sf(x, x_sf, t2p, p2e, num_per_channels=128, out_sf=out_sf,
                                         pos_to_token=out_sf.reshape(-1).view(np.int32))


# -- sizes past what one launch takes (zero-stride views: nothing is allocated) -------------------

@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("too_big", ["tokens", "rows", "slots"])
def test_sizes_past_the_kernels_int32_and_grid_limits_are_refused(kind, too_big):
    """T and X up to fused_mapping's bound (int32 sizes; one grid's tokens and
    zero-fill blocks), K up to a grid's z: refused by the rules, on every
    kind, before any output exists."""
    from cupy_moe.expand.rules import MAX_ROWS, MAX_TOP_K

    def broadcast(value, shape):
        array = np.broadcast_to(value, shape)
        return (torch.from_numpy(np.zeros((), value.dtype)).expand(*shape) if kind == "torch"
                else array)

    num_tokens = MAX_ROWS + 1 if too_big == "tokens" else 2
    top_k = MAX_TOP_K + 1 if too_big == "slots" else 1
    num_rows = MAX_ROWS + 1 if too_big == "rows" else 4
    message = {"tokens": f"x has T = {MAX_ROWS + 1} rows; at most {MAX_ROWS} are supported",
               "rows": f"pos_to_expert has X = {MAX_ROWS + 1} rows; at most {MAX_ROWS} are "
                       "supported",
               "slots": f"token_topk_to_pos has K = {MAX_TOP_K + 1} slots a token; at most "
                        f"{MAX_TOP_K} are supported"}[too_big]
    args = (broadcast(np.float16(0), (num_tokens, 8)), broadcast(np.int32(0), (num_tokens, top_k)),
            broadcast(np.int32(0), (num_rows,)))
    with pytest.raises(ValueError, match=re.escape(message)):
        cupy_moe.expand_to_fused(*args)
    with pytest.raises(ValueError, match=re.escape(message)):
        cupy_moe.expand_to_fused_with_sf(
            broadcast(np.uint8(0), (num_tokens, 128)), broadcast(np.float32(0), (num_tokens, 1)),
            *args[1:], num_per_channels=128)


def test_the_largest_sizes_pass_the_rules():
    from cupy_moe.expand.rules import MAX_ROWS, MAX_TOP_K, check_expand
    from cupy_moe.runtime.arrays import ArrayDesc, ArrayKind

    def desc(shape, dtype):
        return ArrayDesc(ArrayKind.CUPY, shape, dtype, 0, True, False, True)

    problem = check_expand(desc((MAX_ROWS, 8), "bfloat16"), desc((MAX_ROWS, MAX_TOP_K), "int32"),
                           desc((MAX_ROWS,), "int32"))
    assert (problem.num_tokens, problem.top_k, problem.num_expanded) == (MAX_ROWS, MAX_TOP_K,
                                                                          MAX_ROWS)
