"""Host-side bookkeeping of the GPU backend that needs CuPy but no GPU."""

import pytest

pytest.importorskip("cupy")

from cupy_moe import _gpu  # noqa: E402


def test_configure_forgets_plans_made_under_other_settings():
    kernel, policy = dict(_gpu.KERNEL_CONFIG), dict(_gpu.GRID_POLICY)
    _gpu._plans["stale"] = object()
    _gpu._torch_plans["stale"] = object()
    try:
        _gpu.configure(kernel={"EXPAND_UNROLL": 2}, grid_policy={"SPLIT_SLOTS_BELOW": 0.0})
        assert _gpu.KERNEL_CONFIG["EXPAND_UNROLL"] == 2
        assert _gpu.GRID_POLICY["SPLIT_SLOTS_BELOW"] == 0.0
        assert "stale" not in _gpu._plans and "stale" not in _gpu._torch_plans
        assert ("EXPAND_UNROLL", 2) in _gpu._defines(0)
    finally:
        _gpu.configure(kernel=kernel, grid_policy=policy)
    assert _gpu.KERNEL_CONFIG == kernel and _gpu.GRID_POLICY == policy


def test_argument_blocks_match_the_kernel_structs():
    # struct ExpandArgs: 6 pointers, an int64, 8 int32; RoutingArgs: 4
    # pointers, an int64, an int32 padded to the struct's 8-byte alignment.
    assert _gpu._EXPAND_ARGS.size == 6 * 8 + 8 + 8 * 4
    assert _gpu._ROUTING_ARGS.size == 4 * 8 + 8 + 8
