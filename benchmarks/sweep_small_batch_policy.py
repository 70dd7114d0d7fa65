"""Sweep the small-batch grid policy (cupy_moe._gpu.GRID_POLICY) on decode and
small workloads: GPU time per call from CUDA-graph replays. GPU only.

    python benchmarks/sweep_small_batch_policy.py
"""

from __future__ import annotations

import sys

import numpy as np

from cupy_moe import _gpu, bench, load_workloads

POLICIES = [
    {"SHRINK_CHUNKS_BELOW": 2.0, "SPLIT_SLOTS_BELOW": 1.0},  # the default
    {"SHRINK_CHUNKS_BELOW": 0.0, "SPLIT_SLOTS_BELOW": 0.0},  # never
    {"SHRINK_CHUNKS_BELOW": 2.0, "SPLIT_SLOTS_BELOW": 0.0},  # shrink chunks only
    {"SHRINK_CHUNKS_BELOW": 0.0, "SPLIT_SLOTS_BELOW": 2.0},  # split slots only
    {"SHRINK_CHUNKS_BELOW": 4.0, "SPLIT_SLOTS_BELOW": 0.5},
]
LABELS = ["kimi-k2-decode", "kimi-k2-small", "qwen3-30b-small", "kimi-k2-decode-sf-packed",
          "qwen3-30b-small-sf-row-major", "qwen3-30b-small-sf-packed"]


def main() -> int:
    workloads = [w for op in ("expand_to_fused", "expand_to_fused_with_sf")
                 for w in load_workloads(op) if w.label in LABELS]
    timer = bench.GpuTimer()
    rng = np.random.default_rng()
    default = dict(_gpu.GRID_POLICY)
    print("| shrink below, split below (x SMs) | " + " | ".join(w.label for w in workloads) + " |")
    print("|---" * (len(workloads) + 1) + "|")
    for policy in POLICIES:
        _gpu.configure(grid_policy=policy)
        cells = []
        for w in workloads:
            record = bench.bench_gpu_workload(w, timer, "torch", 20, 1.0, rng, kernel_only=True)
            cells.append(f"{record.graph_us:.2f}" if record.status == "ok" else record.status)
        print(f"| {policy['SHRINK_CHUNKS_BELOW']}, {policy['SPLIT_SLOTS_BELOW']} | "
              + " | ".join(cells) + " |", flush=True)
    _gpu.configure(grid_policy=default)
    return 0


if __name__ == "__main__":
    sys.exit(main())
