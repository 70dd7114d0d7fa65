"""Expert parallelism on torch.distributed, on the CPU with gloo.

2 and 4 processes (tests/distributed_cases.py starts them and runs every
check of ``CHECKS`` in one job per group size: a process start costs time):
dispatch against a NumPy oracle of which token goes where (bf16, fp8 with
float32 and packed scale factors, dropped and out-of-range ids, T = 0 on a
rank, ranks that receive nothing), combine against its oracle and run twice,
ranks that disagree, and the expert-parallel layer against the one-process
layer (bit-exact where the summation order allows, within rounding elsewhere).

In this process, a one-rank gloo group: the partition, the layer with R = 1
(bit-exact everywhere), and every argument error.
"""

from __future__ import annotations

import importlib
import os
import tempfile

import numpy as np
import pytest
from distributed_cases import CHECKS, run_checks
from helpers import from_torch

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with gloo", allow_module_level=True)

from cupy_moe.distributed import (
    DispatchHandle,
    ExpertPartition,
    combine,
    dispatch,
    ep_moe_layer,
    partition_experts,
)
from cupy_moe.layer import MoeShape, moe_layer, random_moe_inputs

# --- several processes -----------------------------------------------------------

@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def gloo_job(request):
    """Every check of CHECKS, run once per group size; per check None or the failure."""
    return run_checks(request.param, list(CHECKS))


@pytest.mark.parametrize("check", list(CHECKS))
def test_gloo(gloo_job, check):
    failure = gloo_job[check]
    if failure is not None:
        pytest.fail(failure, pytrace=False)


# --- one rank, in this process ---------------------------------------------------

@pytest.fixture
def one_rank():
    """A gloo group of this process alone, destroyed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"),
                                rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


SMALL = MoeShape("small", hidden=64, intermediate=32, num_experts=8, top_k=4)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_one_rank_layer_is_the_one_process_layer(one_rank, fp8):
    """R = 1: the same plan, rows, expert outputs and output, bit for bit."""
    inputs = random_moe_inputs(SMALL, 19, seed=2, device="cpu")
    out, ep = ep_moe_layer(*inputs, top_k=4, num_experts=8, alignment=8, fp8=fp8,
                           return_intermediates=True)
    ref, one = moe_layer(*inputs, top_k=4, alignment=8, fp8=fp8, return_intermediates=True)
    assert np.array_equal(from_torch(out).view(np.uint16), from_torch(ref).view(np.uint16))
    assert torch.equal(ep["plan"].token_topk_to_pos, one["plan"].token_topk_to_pos)
    routed = (one["plan"].pos_to_expert >= 0).numpy()
    for name in ("expanded", "act", "y"):
        a, b = from_torch(ep[name]), from_torch(one[name])
        assert np.array_equal(a[routed].view(np.uint8), b[routed].view(np.uint8)), name
    assert ep["handle"].send_splits == ep["handle"].recv_splits == (19,)
    # zero_padding=False: dispatch's expand and the SwiGLU leave padding rows;
    # the output is the same
    left = ep_moe_layer(*inputs, top_k=4, num_experts=8, alignment=8, fp8=fp8,
                        zero_padding=False)
    assert np.array_equal(from_torch(left).view(np.uint16), from_torch(ref).view(np.uint16))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_dispatch_passes_zero_padding_to_the_expand(one_rank, fp8, monkeypatch):
    import importlib

    dispatch_module = importlib.import_module("cupy_moe.distributed.dispatch")

    name = "expand_to_fused_with_sf" if fp8 else "expand_to_fused"
    passed, hinted = [], []
    op = getattr(dispatch_module, name)

    def spy(*args, **kwargs):
        passed.append(kwargs.get("zero_padding"))
        hinted.append(kwargs.get("pos_to_token") is not None)  # the local plan's
        return op(*args, **kwargs)

    monkeypatch.setattr(dispatch_module, name, spy)
    # fp8: the local plan's token_topk_to_pos reaches SwiGLU too, and agrees
    # with its maps (validate=True raises where it does not)
    layer_module = importlib.import_module("cupy_moe.layer.moe_layer")
    swiglu, slot_hinted = layer_module.swiglu_quantize_fp8, []

    def swiglu_spy(*args, **kwargs):
        slot_hinted.append(kwargs.get("token_topk_to_pos") is not None)
        return swiglu(*args, **kwargs, validate=True)

    monkeypatch.setattr(layer_module, "swiglu_quantize_fp8", swiglu_spy)
    inputs = random_moe_inputs(SMALL, 19, seed=2, device="cpu")
    for zero_padding in (True, False):
        ep_moe_layer(*inputs, top_k=4, num_experts=8, alignment=8, fp8=fp8,
                     zero_padding=zero_padding)
    assert passed == [True, False]
    assert hinted == [True, True]
    assert slot_hinted == ([True, True] if fp8 else [])


@pytest.mark.parametrize("flags", [[], [False, False], [True, False, True, True, False],
                                   [True] * 5], ids=["empty", "none", "some", "all"])
def test_first_true_with_and_without_nonzero_static(flags, monkeypatch):
    """The sent pairs and routed slots, in ascending order: by
    ``nonzero_static``, or by the stable sort where a torch lacks it."""
    exchange = importlib.import_module("cupy_moe.distributed.exchange")
    tensor = torch.tensor(flags, dtype=torch.bool)
    expected = [i for i, flag in enumerate(flags) if flag]
    found = exchange.first_true(torch, tensor, len(expected))
    assert found.dtype == torch.int64 and found.tolist() == expected

    def missing(*args, **kwargs):
        raise NotImplementedError("no nonzero_static for this device")

    monkeypatch.setattr(torch, "nonzero_static", missing)
    found = exchange.first_true(torch, tensor, len(expected))
    assert found.dtype == torch.int64 and found.tolist() == expected


def test_dispatch_and_combine_without_nonzero_static(one_rank, monkeypatch):
    """The stable-sort fallback gives dispatch and combine the same bits."""
    inputs = random_moe_inputs(SMALL, 19, seed=3, device="cpu")
    ids = torch.topk(inputs.router_logits, 4).indices
    ids[::3, 1] = -1  # dropped slots
    weights = torch.rand(ids.shape)
    results = []
    for patched in (False, True):
        if patched:
            def missing(*args, **kwargs):
                raise NotImplementedError("no nonzero_static for this device")

            monkeypatch.setattr(torch, "nonzero_static", missing)
        sent = dispatch(inputs.x, ids, weights, 8, alignment=8)
        results.append((sent, combine(sent.expanded_x, sent.handle)))
    (first, first_out), (second, second_out) = results
    assert torch.equal(first.expanded_x.view(torch.int16), second.expanded_x.view(torch.int16))
    assert torch.equal(first.handle.send_token_index, second.handle.send_token_index)
    assert torch.equal(first_out.view(torch.int16), second_out.view(torch.int16))


def test_partition():
    part = partition_experts(12, 3)
    assert part == ExpertPartition(12, 3) and part.local_experts == 4
    assert part.experts_of(2) == range(8, 12)
    assert [part.owner(e) for e in (0, 3, 4, 11)] == [0, 0, 1, 2]
    assert part.to_local(9) == (2, 1)
    weights = torch.arange(24).view(12, 2)
    assert torch.equal(part.shard(weights, 1), weights[4:8])


@pytest.mark.parametrize(("args", "error", "message"), [
    ((10, 4), ValueError, r"num_experts = 10 is not divisible by the 4 ranks of the group"),
    ((0, 1), ValueError, r"num_experts must be >= 1; got 0"),
    ((4, 0), ValueError, r"world_size must be >= 1; got 0"),
    ((4.0, 1), TypeError, r"num_experts must be an int; got float 4.0"),
], ids=["indivisible", "no-experts", "no-ranks", "float"])
def test_partition_errors(args, error, message):
    with pytest.raises(error, match=message):
        partition_experts(*args)


def test_partition_index_errors():
    part = partition_experts(8, 2)
    with pytest.raises(ValueError, match=r"expert must be in \[0, num_experts = 8\); got 8"):
        part.owner(8)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size = 2\); got 2"):
        part.experts_of(2)
    with pytest.raises(ValueError, match=r"weights must have E = 8 experts in dimension 0; "
                                         r"got shape \(4, 2\)"):
        part.shard(torch.zeros(4, 2), 0)


def test_not_initialized():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        dispatch(torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(2, 1, dtype=torch.int64),
                 torch.ones(2, 1), 2)


def _dispatch_args(**changes):
    args = {"x": torch.zeros(3, 16, dtype=torch.bfloat16),
            "topk_ids": torch.zeros(3, 2, dtype=torch.int64),
            "topk_weights": torch.ones(3, 2), "num_experts": 4}
    args.update(changes)
    return args


FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
# case -> (changed arguments, error, message)
DISPATCH_ERRORS = {
    "numpy-x": (
        {"x": np.zeros((3, 16), np.float32)}, TypeError,
        r"all arrays must be of one kind: x is numpy.ndarray, topk_ids is torch"),
    "all-numpy": (
        {"x": np.zeros((3, 16)), "topk_ids": np.zeros((3, 2), np.int64),
         "topk_weights": np.ones((3, 2), np.float32)}, TypeError,
        r"dispatch takes torch tensors \(torch.distributed moves them\); x is a numpy.ndarray"),
    "none-ids": (
        {"topk_ids": None}, TypeError,
        r"topk_ids must be a numpy.ndarray, cupy.ndarray or torch.Tensor; got None"),
    "float-experts": (
        {"num_experts": 4.0}, TypeError, r"num_experts must be an int; got float 4.0"),
    "ids-1d": (
        {"topk_ids": torch.zeros(3, dtype=torch.int64)}, ValueError,
        r"topk_ids must be 2-D \[T, K\]; got shape \(3,\)"),
    "ids-float": (
        {"topk_ids": torch.zeros(3, 2)}, ValueError,
        r"topk_ids must be one of int32, int64; got float32"),
    "no-slots": (
        {"topk_ids": torch.zeros(3, 0, dtype=torch.int64), "topk_weights": torch.ones(3, 0)},
        ValueError, r"topk_ids must have K = shape\[1\] >= 1 slots; got shape \(3, 0\)"),
    "x-rows": (
        {"x": torch.zeros(4, 16, dtype=BF16)}, ValueError,
        r"x must have one row per token of topk_ids, T = 3; got shape \(4, 16\)"),
    "x-float32": (
        {"x": torch.zeros(3, 16)}, ValueError,
        r"x must be one of bfloat16, float16, uint16; got float32"),
    "x-no-columns": (
        {"x": torch.zeros(3, 0, dtype=BF16)}, ValueError,
        r"x must have H = x.shape\[1\] >= 1 columns"),
    "weights-shape": (
        {"topk_weights": torch.ones(3, 3)}, ValueError,
        r"topk_weights must have the shape of topk_ids, \(T, K\) = \(3, 2\); got \(3, 3\)"),
    "weights-dtype": (
        {"topk_weights": torch.ones(3, 2, dtype=torch.float64)}, ValueError,
        r"topk_weights must be one of float32; got float64"),
    "no-experts": ({"num_experts": 0}, ValueError, r"num_experts must be >= 1; got 0"),
    "alignment": ({"alignment": 0}, ValueError, r"alignment must be in 1 \.\. 715827882; got 0"),
    "alignment-huge": ({"alignment": 2**30}, ValueError,
                       r"alignment must be in 1 \.\. 715827882; got 1073741824"),
    "fp8-without-sf": (
        {"x": torch.zeros(3, 16, dtype=FP8)}, ValueError,
        r"x must be one of bfloat16, float16, uint16; got float8_e4m3fn"),
    "sf-with-bf16": (
        {"x_sf": torch.ones(3, 1)}, ValueError,
        r"x must be one of float8_e4m3fn, uint8, int8; got bfloat16"),
    "sf-shape": (
        {"x": torch.zeros(3, 256, dtype=FP8), "x_sf": torch.ones(3, 3)}, ValueError,
        (r"x_sf must have shape \(T, S\) = \(3, 2\) with S = ceil\(H / num_per_channels\) "
         r"for float32, H = 256, num_per_channels = 128; got \(3, 3\)")),
    "sf-packed-row-major": (
        {"x": torch.zeros(3, 256, dtype=FP8), "x_sf": torch.ones(3, 1, dtype=torch.int32)},
        ValueError,
        r"packed UE8M0 scale factors require use_tma_aligned_col_major_sf=True"),
    "sf-channels": (
        {"x": torch.zeros(3, 256, dtype=FP8), "x_sf": torch.ones(3, 4),
         "num_per_channels": 64}, ValueError,
        r"unsupported num_per_channels=64; must be one of \(32, 128\)"),
    "flag": (
        {"use_tma_aligned_col_major_sf": 1}, TypeError,
        r"use_tma_aligned_col_major_sf must be True or False; got int 1"),
    "zero-padding-flag": (
        {"zero_padding": "no"}, TypeError, r"zero_padding must be True or False; got str 'no'"),
    # fused_mapping's limit on the local experts, before the exchange (it once
    # failed inside dispatch, after it, and put the group out of step)
    "local-experts-past-int32": (
        {"num_experts": 2**32}, ValueError,
        r"num_experts / world_size must be <= 2147483647 \(fused_mapping's int32 expert ids\); "
        r"got 4294967296"),
}


@pytest.mark.parametrize("case", list(DISPATCH_ERRORS))
def test_dispatch_errors(one_rank, case):
    changes, error, message = DISPATCH_ERRORS[case]
    with pytest.raises(error, match=message):
        dispatch(**_dispatch_args(**changes))


def test_dispatch_rejects_a_cpu_tensor_on_nccl(one_rank, monkeypatch):
    """An NCCL group takes CUDA tensors: the check runs before any collective."""
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    with pytest.raises(ValueError, match=r"the group's backend is nccl, which moves CUDA "
                                         r"tensors; x is on cpu"):
        dispatch(**_dispatch_args())


def test_combine_errors(one_rank):
    result = dispatch(**_dispatch_args(), alignment=4)
    rows = result.expanded_x.shape[0]
    handle = result.handle
    y = torch.zeros(rows, 16, dtype=BF16)
    cases = [
        ((y, handle.plan), TypeError,
         r"handle must be the DispatchHandle dispatch returned; got cupy_moe.mapping"),
        ((np.zeros((rows, 16), np.float32), handle), TypeError,
         r"all arrays must be of one kind: y_expanded is numpy.ndarray"),
        ((torch.zeros(rows + 1, 16, dtype=BF16), handle), ValueError,
         (rf"y_expanded must have the plan's X rows and dispatch's H columns, \(X, H\) = "
          rf"\({rows}, 16\): combine returns rows where dispatch took them from; got "
          rf"\({rows + 1}, 16\)")),
        ((torch.zeros(rows, 8, dtype=BF16), handle), ValueError,
         r"y_expanded must have the plan's X rows and dispatch's H columns"),
        ((torch.zeros(rows, 16, dtype=torch.int32), handle), ValueError,
         r"y_expanded must be one of bfloat16, float16, float32; got int32"),
        ((y, handle._replace(world_size=2)), ValueError,
         (r"combine's group must be dispatch's: dispatch ran as rank 0 of 2, this group has "
          r"rank 0 of 1")),
        ((y, handle._replace(rank=1)), ValueError,  # the rank, not only the size
         (r"combine's group must be dispatch's: dispatch ran as rank 1 of 1, this group has "
          r"rank 0 of 1")),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            combine(*args)
    with pytest.raises(TypeError, match=r"weighted must be True or False; got str 'yes'"):
        combine(y, handle, weighted="yes")
    assert isinstance(handle, DispatchHandle)


def _layer_args(**changes):
    inputs = random_moe_inputs(SMALL, 3, seed=0, device="cpu")
    args = {"x": inputs.x, "router_logits": inputs.router_logits,
            "w_gate_up_local": inputs.w_gate_up, "w_down_local": inputs.w_down,
            "top_k": 4, "num_experts": 8}
    args.update(changes)
    return args


LAYER_ERRORS = {
    "numpy": (
        {"x": np.zeros((3, 64), np.float32), "router_logits": np.zeros((3, 8), np.float32),
         "w_gate_up_local": np.zeros((8, 64, 64), np.float32),
         "w_down_local": np.zeros((8, 64, 32), np.float32)}, TypeError,
        (r"ep_moe_layer takes torch tensors \(torch.distributed moves them\); x is a "
         r"numpy.ndarray")),
    "x-float32": ({"x": torch.zeros(3, 64)}, ValueError, r"x must be one of bfloat16; got float32"),
    "logits-int": (
        {"router_logits": torch.zeros(3, 8, dtype=torch.int32)}, ValueError,
        r"router_logits must be one of float32, bfloat16, float16; got int32"),
    "x-1d": (
        {"x": torch.zeros(64, dtype=BF16)}, ValueError,
        r"x must be 2-D \[T, H\]; got shape \(64,\)"),
    "shard-experts": (
        {"w_gate_up_local": torch.zeros(4, 64, 64, dtype=BF16)}, ValueError,
        (r"w_gate_up_local must have shape \(8, 64, 64\) \(x \(3, 64\), num_experts 8 over 1 "
         r"ranks: E / R = 8 experts here, I = 32\); got \(4, 64, 64\)")),
    "down-shape": (
        {"w_down_local": torch.zeros(8, 64, 16, dtype=BF16)}, ValueError,
        r"w_down_local must have shape \(8, 64, 32\)"),
    "odd-gate-up": (
        {"w_gate_up_local": torch.zeros(8, 63, 64, dtype=BF16)}, ValueError,
        r"w_gate_up_local must be \[E / R, 2I, H\] with I >= 1"),
    "logits-experts": (
        {"num_experts": 16}, ValueError, r"router_logits must have shape \(3, 16\)"),
    "top-k": ({"top_k": 9}, ValueError, r"top_k must be in \[1, E = 8\]; got 9"),
    "top-k-type": ({"top_k": 4.0}, TypeError, r"top_k must be an int; got float 4.0"),
    "alignment": ({"alignment": 0}, ValueError, r"alignment must be in 1 \.\. 715827882; got 0"),
    "alignment-huge": ({"alignment": 2**30}, ValueError,
                       r"alignment must be in 1 \.\. 715827882; got 1073741824"),
    "channels": (
        {"num_per_channels": 64}, ValueError, r"num_per_channels must be 32 or 128; got 64"),
    "gemm": ({"gemm": "numpy"}, ValueError, r"gemm='numpy' needs NumPy arrays"),
    "fp8-flag": ({"fp8": 1}, TypeError, r"fp8 must be True or False; got int 1"),
}


@pytest.mark.parametrize("case", list(LAYER_ERRORS))
def test_layer_errors(one_rank, case):
    changes, error, message = LAYER_ERRORS[case]
    with pytest.raises(error, match=message):
        ep_moe_layer(**_layer_args(**changes))


def test_layer_step_names(one_rank):
    from cupy_moe.distributed import EpMoeLayer

    layer = EpMoeLayer(**_layer_args())
    with pytest.raises(ValueError, match=r"the bf16 path has no step 'reduce'; its steps: "
                                         r"route, dispatch, gemm_gate_up"):
        layer.run_step("reduce")


@pytest.mark.parametrize(("config", "device"), [
    ("gloo", "cpu"), ("cpu:gloo,cuda:nccl", "cpu"), ("nccl", "cuda:3"), ("cuda:nccl", "cuda:3"),
])
def test_a_refusing_rank_sends_its_header_where_the_others_send_theirs(monkeypatch, config,
                                                                       device):
    """With no CUDA tensor among its arguments, a refusing rank picks the
    device from the group's backends: init_process_group() with no backend
    named reports "undefined" from get_backend, so its config decides (a
    CPU header on a pure-NCCL group, or a CUDA one where gloo moves CPU
    tensors, would never meet the others' headers)."""
    import importlib

    from cupy_moe.distributed.exchange import GroupInfo

    dispatch_module = importlib.import_module("cupy_moe.distributed.dispatch")
    monkeypatch.setattr(dist, "get_backend_config", lambda group: config)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    info = GroupInfo(None, 0, 2, "undefined")
    cpu_args = (torch.zeros((2, 8)), torch.zeros((2, 2), dtype=torch.int64))
    assert str(dispatch_module._refusal_device(torch, info, cpu_args)) == device


def test_a_layer_step_failing_after_dispatch_puts_the_rank_out_of_step(one_rank, monkeypatch):
    """Between dispatch and combine the other ranks go on to combine's
    collective: a rank whose step fails there refuses its later dispatch and
    combine calls on the group (a RuntimeError before any collective),
    until the group is made anew. A step failing before dispatch does not."""
    from cupy_moe.distributed.ep_layer import EpMoeLayer

    inputs = random_moe_inputs(SMALL, 7, seed=3, device="cpu")

    def broken(self):
        raise MemoryError("the GEMM ran out of memory")

    with monkeypatch.context() as patch:
        patch.setattr(EpMoeLayer, "_step_route", broken)
        with pytest.raises(MemoryError):  # before the exchange: the rank stays in step
            ep_moe_layer(*inputs, top_k=4, num_experts=8, alignment=8)
    ep_moe_layer(*inputs, top_k=4, num_experts=8, alignment=8)
    with monkeypatch.context() as patch:
        patch.setattr(EpMoeLayer, "_step_gemm_down", broken)
        with pytest.raises(MemoryError):
            ep_moe_layer(*inputs, top_k=4, num_experts=8, alignment=8)
    with pytest.raises(RuntimeError, match="this rank is out of step with the others"):
        ep_moe_layer(*inputs, top_k=4, num_experts=8, alignment=8)
    with pytest.raises(RuntimeError, match="destroy the process group and make a new one"):
        combine(torch.zeros((0, 64), dtype=torch.bfloat16), None)


def test_a_refused_combine_is_owed_before_the_next_dispatch(one_rank):
    """The other ranks may wait in combine's exchange when this rank's combine
    is refused: only a combine meets it (a dispatch's count exchange once
    paired with it, and a peer's combine returned wrong rows without an
    error). dispatch is refused until a combine gets through; the group is
    not out of step."""
    result = dispatch(**_dispatch_args(), alignment=4)
    y = torch.ones(result.expanded_x.shape[0], 16, dtype=BF16)
    with pytest.raises(ValueError, match="y_expanded must be one of bfloat16"):
        combine(y.to(torch.int32), result.handle)
    with pytest.raises(RuntimeError, match=(
            "a combine failed on this rank before its exchange, in which the other ranks may "
            "wait .* call combine again with the same handle and the right arguments first")):
        dispatch(**_dispatch_args(), alignment=4)
    out = combine(y, result.handle)
    assert torch.equal(out, torch.full((3, 16), 2.0, dtype=BF16))  # 2 slots of 1.0, weights 1
    again = dispatch(**_dispatch_args(), alignment=4)  # nothing owed
    assert torch.equal(combine(y, again.handle), out)


def test_combine_keeps_a_negative_zero_partial(one_rank):
    """A token whose products all underflow from below sums to -0 in the
    one-process reduce_fused (an fma chain from +0); combine's sum starts
    at -0, addition's identity, so it gives -0 too (from +0 it gave +0). A
    token with no valid slot is +0, reduce_fused's zeros."""
    from cupy_moe import fused_mapping, reduce_fused

    ids = torch.tensor([[0, 1], [2, -1], [-1, -1]], dtype=torch.int64)
    weights = torch.full((3, 2), 1e-30)
    result = dispatch(torch.zeros(3, 16, dtype=BF16), ids, weights, 4, alignment=4)
    y = torch.full((result.expanded_x.shape[0], 16), -1e-30, dtype=BF16)
    got = combine(y, result.handle).view(torch.int16)
    plan = fused_mapping(ids, 4, alignment=4)
    y_one = torch.full((plan.pos_to_expert.shape[0], 16), -1e-30, dtype=BF16)
    one_process = reduce_fused(y_one, plan.token_topk_to_pos, weights)
    assert torch.equal(got, one_process.view(torch.int16))
    assert got[:2].eq(-0x8000).all() and got[2].eq(0).all()


def test_a_combine_owed_on_dispatchs_group_whatever_group_combine_was_given(one_rank):
    """The ranks that wait are dispatch's: a combine refused while given
    another group (here with a wrong dtype too) marks dispatch's group, so the
    next dispatch there is refused (only the given group was marked, and the
    dispatch's exchange paired with the others' combine)."""
    result = dispatch(**_dispatch_args(), alignment=4)
    assert result.handle.group is None  # the default group, as given
    other = dist.new_group([0])
    y = torch.ones(result.expanded_x.shape[0], 16, dtype=BF16)
    with pytest.raises(ValueError, match="y_expanded must be one of bfloat16"):
        combine(y.to(torch.int32), result.handle, group=other)
    with pytest.raises(RuntimeError, match="a combine failed on this rank before its exchange"):
        dispatch(**_dispatch_args(), alignment=4)
    combine(y, result.handle)
    dispatch(**_dispatch_args(), alignment=4)


def test_a_rank_owing_a_combine_refuses_without_an_exchange(one_rank, monkeypatch):
    """ep_moe_layer's refusal header (its arguments or router failing) goes to
    the count exchange; from a rank that owes a combine it would pair with
    the others' combine instead (which returned wrong rows): no header then,
    the rank raises its own error alone."""
    dispatch_module = importlib.import_module("cupy_moe.distributed.dispatch")
    result = dispatch(**_dispatch_args(), alignment=4)
    y = torch.ones(result.expanded_x.shape[0], 16, dtype=BF16)
    with pytest.raises(ValueError, match="y_expanded must be one of bfloat16"):
        combine(y.to(torch.int32), result.handle)

    exchanged = []  # (refuse_dispatch swallows an exchange's own failure)
    monkeypatch.setattr(dispatch_module, "all_to_all_rows",
                        lambda *args, **kwargs: exchanged.append(args))
    inputs = random_moe_inputs(SMALL, 3, seed=0, device="cpu")
    with pytest.raises(ValueError, match=r"top_k must be in \[1, E = 8\]; got 0"):
        ep_moe_layer(*inputs, top_k=0, num_experts=8)
    assert exchanged == []
    monkeypatch.undo()
    combine(y, result.handle)
