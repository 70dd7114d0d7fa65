"""Does the order of the output rows a batch writes matter? The same prefill
shapes under three routings, % of the same-run copy bandwidth. GPU only.

- expert-major: random experts, block-aligned (what the benchmark uses);
- slot order: slot (t, k) -> row t*K + k (each block writes K adjacent rows);
- slot-major: slot (t, k) -> row k*T + t (a block's K rows are far apart, but
  blocks running side by side write adjacent rows).

    python benchmarks/write_order_probe.py
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import cupy_moe
from cupy_moe import bench, load_workloads
from cupy_moe.workload_inputs import fitted_routing, numpy_dtype, random_bits


def routings(rng, num_tokens: int, top_k: int, num_expanded: int):
    t = np.arange(num_tokens)[:, None]
    k = np.arange(top_k)[None, :]
    experts = np.zeros(num_expanded, dtype=np.int32)
    yield "expert-major", fitted_routing(rng, num_tokens, top_k, num_expanded)
    yield "slot order", ((t * top_k + k).astype(np.int32), experts)
    yield "slot-major", ((k * num_tokens + t).astype(np.int32), experts)


def main() -> int:
    timer = bench.GpuTimer()
    copy_tbps = timer.copy_tbps()
    rng = np.random.default_rng()
    print(f"copy {copy_tbps:.2f} TB/s")
    print("| workload | routing | GPU us | % copy |")
    print("|---|---|---|---|")
    for w in load_workloads("expand_to_fused"):
        if "prefill" not in w.label and "medium" not in w.label:
            continue
        x_host = random_bits(rng, w.shapes["x"], numpy_dtype(w.dtype))
        x = torch.from_numpy(x_host.view(np.int16)).cuda().view(torch.bfloat16)
        for name, (t2p, p2e) in routings(rng, w.num_tokens, w.top_k, w.num_expanded):
            m, p = torch.from_numpy(t2p).cuda(), torch.from_numpy(p2e).cuda()
            out = cupy_moe.expand_to_fused(x, m, p)
            us = timer.median_us(lambda: cupy_moe.expand_to_fused(x, m, p, out=out), 30)
            pct = 100 * w.bytes / us / 1e6 / copy_tbps
            print(f"| {w.label} | {name} | {us:.1f} | {pct:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
