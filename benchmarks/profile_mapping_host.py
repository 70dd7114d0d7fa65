"""Where an eager ``fused_mapping`` call's host time goes (torch, fast path).
GPU only.

    python benchmarks/profile_mapping_host.py [T K E ALIGNMENT] ...

Shapes as groups of four numbers (default: 4096 8 256 128).

Per step, the median over rounds of the mean wall time of 2000 repetitions
(the launches are queued on the GPU, which is far faster than the host here).
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

import cupy_moe
from cupy_moe.mapping import api, gpu


def per_call_us(fn, calls: int = 2000, rounds: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def profile(num_tokens: int, top_k: int, num_experts: int, alignment: int) -> None:
    ids = torch.from_numpy(np.random.default_rng(0).integers(
        0, num_experts, size=(num_tokens, top_k))).cuda()
    cupy_moe.fused_mapping(ids, num_experts, alignment=alignment)
    key = (num_experts, alignment, None)
    plan = api._fast_path.lookup(key, (ids,))
    assert plan is not None, "the fast path did not remember the call"
    stream = torch.cuda.current_stream().cuda_stream
    buffer = ids.new_empty(plan.buffer_size, dtype=torch.int32)
    steps = {
        "whole call": lambda: cupy_moe.fused_mapping(ids, num_experts, alignment=alignment),
        "fast-path lookup": lambda: api._fast_path.lookup(key, (ids,)),
        "new_empty": lambda: ids.new_empty(plan.buffer_size, dtype=torch.int32),
        "launches": lambda: plan.launch(stream, ids.data_ptr(), buffer.data_ptr()),
        "torch_views (split)": lambda: plan.torch_views(buffer),
        "run_torch_fast": lambda: gpu.run_torch_fast(plan, ids),
        "torch memset launch": lambda: buffer.zero_(),
    }
    print(f"T={num_tokens} K={top_k} E={num_experts} A={alignment}: {len(plan.launches)} "
          f"launch(es), overlap={plan.overlap}")
    for name, fn in steps.items():
        print(f"  {name:22s} {per_call_us(fn):6.2f} us")


def main() -> int:
    numbers = [int(v) for v in sys.argv[1:]] or [4096, 8, 256, 128]
    if len(numbers) % 4:
        raise SystemExit("shapes come as groups of four: T K E ALIGNMENT")
    for i in range(0, len(numbers), 4):
        profile(*numbers[i:i + 4])
    return 0


if __name__ == "__main__":
    sys.exit(main())
