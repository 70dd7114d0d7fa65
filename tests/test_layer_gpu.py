"""The MoE layer on the GPU (marker ``gpu``): Kimi-K2 and Qwen3-30B-A3B shapes
at a few hundred tokens, bf16 and fp8 paths, torch and CuPy arrays, against
the dense float64 reference (computed on the GPU) within the stated
tolerances; the routing plan the same as the NumPy backend's; the whole layer
captured in a CUDA graph gives the eager output's bits."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_cases import GPU_MARKS, HAS_TORCH_CUDA, cupy, torch

from cupy_moe import as_cupy
from cupy_moe.layer import (
    MoeLayer,
    dense_moe_reference,
    model_shape,
    random_moe_inputs,
    relative_error,
    tolerance,
)
from cupy_moe.reference import fused_mapping_numpy

# big_memory: Kimi-K2's weights are 10.5 GiB a process (eight parallel
# workers ran an 80 GB H100 out of memory; gpu_check.sh --workers runs these alone)
pytestmark = GPU_MARKS + [pytest.mark.big_memory,
                          pytest.mark.skipif(not HAS_TORCH_CUDA, reason="the layer's GEMMs "
                                             "need torch with CUDA")]
TOKENS = 384


@pytest.fixture(scope="module", params=["qwen3-30b-a3b", "kimi-k2"])
def model(request):
    """(shape, torch inputs on the GPU); Kimi-K2's weights are 34 GB, drawn once."""
    shape = model_shape(request.param)
    inputs = random_moe_inputs(shape, TOKENS, seed=1, device="cuda")
    yield shape, inputs
    del inputs
    torch.cuda.empty_cache()


@pytest.mark.parametrize("kind", ["torch", "cupy"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_layer_matches_dense_reference(model, fp8, kind):
    shape, inputs = model
    args = inputs if kind == "torch" else [as_cupy(a) for a in inputs]
    layer = MoeLayer(*args, top_k=shape.top_k, fp8=fp8)
    out = layer.run()
    if kind == "cupy":
        assert isinstance(out, cupy.ndarray) and out.dtype == np.uint16
        out = torch.from_dlpack(out.view(np.int16)).view(torch.bfloat16)
    assert tuple(out.shape) == (TOKENS, shape.hidden)
    state = layer.state
    reference = dense_moe_reference(inputs.x, state["topk_ids"], state["topk_weights"],
                                    inputs.w_gate_up, inputs.w_down)
    error = relative_error(out, reference)
    assert error <= tolerance(fp8), (f"{shape.name} {layer.path} {kind} ({layer.gemm}): "
                                     f"relative error {error:.4f} > {tolerance(fp8):.4f}")
    # the plan is the NumPy backend's, bit for bit
    expected = fused_mapping_numpy(state["topk_ids"].cpu().numpy(), shape.num_experts,
                                   alignment=128)
    assert np.array_equal(state["plan"].token_topk_to_pos.cpu().numpy(),
                          expected.token_topk_to_pos)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_layer_graph_capture(model, fp8):
    shape, inputs = model
    layer = MoeLayer(*inputs, top_k=shape.top_k, fp8=fp8)
    if layer.gemm == "loop":
        pytest.skip("the per-expert-loop GEMM reads segment bounds on the host")
    eager = layer.run().clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer.run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer.run()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.view(torch.int16), eager.view(torch.int16))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_layer_leaving_padding_gives_the_same_bits(model, fp8):
    """zero_padding=False: expand and SwiGLU leave padding rows unwritten (here
    poisoned with NaN first: the step outputs are fresh allocations from the
    caching allocator, so NaN is written into the expanded rows by hand); the
    output is the zero-padded layer's, bit for bit."""
    shape, inputs = model
    zeroed = MoeLayer(*inputs, top_k=shape.top_k, fp8=fp8).run().clone()
    layer = MoeLayer(*inputs, top_k=shape.top_k, fp8=fp8, zero_padding=False)
    out = layer.run()
    assert torch.equal(out.view(torch.int16), zeroed.view(torch.int16))
    # the GEMM and later steps again, with the padding rows' inputs NaN
    padding = layer.state["plan"].pos_to_expert < 0
    assert bool(padding.any())
    if fp8:
        layer.state["gate_up_input"][padding] = float("nan")
        steps = layer.steps[layer.steps.index("gemm_gate_up"):]
    else:
        layer.state["expanded"][padding] = float("nan")
        steps = layer.steps[layer.steps.index("gemm_gate_up"):]
    for name in steps:
        layer.run_step(name)
    assert torch.equal(layer.output().view(torch.int16), zeroed.view(torch.int16))
