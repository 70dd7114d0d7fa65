"""Where the host time of one eager call goes (torch tensors, decode shape).

Times each step of the torch fast path in isolation (mean of many back-to-back
calls, one synchronisation at the end), next to the whole call and to torch's
own index_select of the same rows. GPU only.

    python benchmarks/profile_host_path.py

Prints a Markdown table. The steps are those of ``expand_to_fused`` on a
fast-path hit: the lookup (``torch_fields`` of each tensor, the key, the
current device), then ``run_torch_fast`` (output allocation or overlap test,
stream, ``plan.launch``).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

import cupy_moe
from cupy_moe.expand.api import _plain_fast_path, _sf_fast_path
from cupy_moe.expand.gpu import run_torch_fast
from cupy_moe.harness.inputs import fitted_routing
from cupy_moe.runtime.arrays import describe, torch_fields
from cupy_moe.runtime.gpu_arrays import raw_torch_stream_getter
from cupy_moe.runtime.launch import current_device

CALLS = 5000


def per_call_us(fn, calls: int = CALLS) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    rng = np.random.default_rng(0)
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 1, 8, 16)
    x = torch.randn(1, 7168, device="cuda").to(torch.bfloat16)
    m = torch.from_numpy(token_topk_to_pos).cuda()
    p = torch.from_numpy(pos_to_expert).cuda()
    cupy_moe.expand_to_fused(x, m, p)  # full path once: compiles, remembers the call's key
    # the keys as expand/api.py builds them: (zero_padding,) and x,
    # token_topk_to_pos, pos_to_expert, pos_to_token, out; the SF op's
    # (num_per_channels, col-major, zero_padding) and its arrays, out_sf last
    plain_key = ((True,), (x, m, p, None, None))
    plan = _plain_fast_path.lookup(*plain_key)
    out = torch.empty((16, 7168), dtype=torch.bfloat16, device="cuda")
    rows = torch.arange(1, device="cuda").repeat_interleave(8)[m.reshape(-1) >= 0]
    # the SF op on kimi-k2-decode-sf-row-major: fp8 rows, 56 float32 scale factors
    x8 = torch.randint(0, 256, (1, 7168), dtype=torch.uint8, device="cuda").view(
        torch.float8_e4m3fn)
    x_sf = torch.rand(1, 56, device="cuda")
    cupy_moe.expand_to_fused_with_sf(x8, x_sf, m, p, num_per_channels=128)
    sf_key = ((128, False, True), (x8, x_sf, m, p, None, None, None))
    sf_plan = _sf_fast_path.lookup(*sf_key)
    if plan is None or sf_plan is None:
        raise SystemExit("the torch fast path did not remember the first calls' keys")
    stream = raw_torch_stream_getter()
    steps = {
        "python call of a no-op": lambda: None,
        "torch.empty(shape, dtype, device)": lambda: torch.empty((16, 7168), dtype=torch.bfloat16,
                                                                 device="cuda"),
        "x.new_empty(16, 7168) (the fast path's allocation)": lambda: x.new_empty(16, 7168),
        "raw stream getter": lambda: stream(0),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "cudaGetDevice (runtime.launch.current_device)": current_device,
        "torch_fields(x) (one tensor's part of the fast-path key)": lambda: torch_fields("x", x),
        "describe(x) (the full path's description of a tensor)": lambda: describe("x", x),
        "fast-path lookup (3 tensors' fields, key, device; finds the plan)":
            lambda: _plain_fast_path.lookup(*plain_key),
        "x.data_ptr()": x.data_ptr,
        "pack pointers + cuLaunchKernel (plan.launch)": lambda: plan.launch(
            0, x.data_ptr(), m.data_ptr(), p.data_ptr(), out.data_ptr(), 0, 0),
        "run_torch_fast, out= given (overlap test, stream, launch)":
            lambda: run_torch_fast(plan, x, None, m, p, out),
        "run_torch_fast, allocating": lambda: run_torch_fast(plan, x, None, m, p, None),
        "whole call, out= given": lambda: cupy_moe.expand_to_fused(x, m, p, out=out),
        "whole call, allocating": lambda: cupy_moe.expand_to_fused(x, m, p),
        "torch index_select of the same rows": lambda: x.index_select(0, rows),
        "SF op fast-path lookup (4 tensors' fields, key, device)":
            lambda: _sf_fast_path.lookup(*sf_key),
        "SF op (row-major SF), run_torch_fast, allocating":
            lambda: run_torch_fast(sf_plan, x8, x_sf, m, p, None),
        "SF op (row-major SF), whole call, allocating": lambda: cupy_moe.expand_to_fused_with_sf(
            x8, x_sf, m, p, num_per_channels=128),
        "x_sf.new_empty(16, 56) (the SF op's second output)": lambda: x_sf.new_empty(16, 56),
        "torch index_select of the fp8 rows (what the bench compares the SF op with)":
            lambda: x8.index_select(0, rows),
        "torch index_select of the fp8 rows and of their scale factors":
            lambda: (x8.index_select(0, rows), x_sf.index_select(0, rows)),
        # torch's own launch path for a trivial kernel: the floor under any
        # torch op on this machine
        "torch.cuda._sleep(0) (a bare torch kernel launch)": lambda: torch.cuda._sleep(0),
        "out.zero_() (torch memset launch)": out.zero_,
    }
    print("| step | us per call |")
    print("| --- | --- |")
    for name, fn in steps.items():
        print(f"| {name} | {per_call_us(fn):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
