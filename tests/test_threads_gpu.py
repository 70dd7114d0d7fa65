"""The ops from threads other than the one that made their plans (marker ``gpu``).

A serving process hands tensors to worker threads; torch runs backward on
its own thread. Such a thread may have made no CUDA runtime call, so no
context is bound to it, and a driver launch there fails unless the library
binds one (a plan's argument block does, the first time a thread without a
context touches it). The torch calls below take the fast path in the worker
(their plans were made on the main thread), which makes no runtime call of
its own before launching: the case that failed.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cupy_moe
from cupy_moe.harness.inputs import fitted_routing
from gpu_cases import GPU_MARKS, needs_torch_cuda, torch
from helpers import assert_bits_equal

pytestmark = [*GPU_MARKS, needs_torch_cuda]


def _calls():
    """Each op once on small torch tensors, as zero-argument callables."""
    rng = np.random.default_rng(11)
    num_tokens, top_k, hidden, experts = 64, 4, 256, 8
    ids = torch.from_numpy(rng.integers(-1, experts, (num_tokens, top_k))).cuda()
    plan = cupy_moe.fused_mapping(ids, experts, alignment=16)
    x = torch.from_numpy(rng.standard_normal((num_tokens, hidden), dtype=np.float32)).cuda()
    x16 = x.to(torch.bfloat16)
    weights = torch.from_numpy(rng.random((num_tokens, top_k), dtype=np.float32)).cuda()
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, num_tokens, top_k,
                                                      2 * num_tokens * top_k)
    t2p, p2e = (torch.from_numpy(a).cuda() for a in (token_topk_to_pos, pos_to_expert))
    expanded = cupy_moe.expand_to_fused(x16, t2p, p2e)
    h = torch.cat([x, x], dim=1)  # [T, 2H]: T rows of gate and up
    return {
        "fused_mapping": lambda: cupy_moe.fused_mapping(ids, experts, alignment=16),
        "expand_to_fused": lambda: cupy_moe.expand_to_fused(x16, t2p, p2e),
        "reduce_fused": lambda: cupy_moe.reduce_fused(expanded, t2p, weights),
        "quantize_fp8": lambda: cupy_moe.quantize_fp8(x),
        "swiglu_quantize_fp8": lambda: cupy_moe.swiglu_quantize_fp8(
            h, pos_to_expert=plan.pos_to_expert[:num_tokens]),
    }


def _host(result):
    """Every output's bytes (any dtype, any layout), on the host."""
    parts = result if isinstance(result, tuple) else (result,)
    return [p.cpu().contiguous().view(torch.uint8).numpy() for p in parts]


@pytest.mark.parametrize("op", ["fused_mapping", "expand_to_fused", "reduce_fused",
                                "quantize_fp8", "swiglu_quantize_fp8"])
def test_a_fresh_thread_gets_the_main_threads_results(op):
    call = _calls()[op]
    want = _host(call())  # the plan is made here, and the fast path primed
    call()
    torch.cuda.synchronize()
    got, errors = [], []

    def worker():
        try:
            got.append(_host(call()))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert errors == []
    for g, w in zip(got[0], want, strict=True):
        assert_bits_equal(g, w, op)
