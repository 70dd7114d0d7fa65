"""Sweep the small-batch grid policy (cupy_moe._gpu.GRID_POLICY) on decode and
small workloads: GPU time per call from CUDA-graph replays. GPU only.

    python benchmarks/sweep_small_batch_policy.py
"""

from __future__ import annotations

import sys

import numpy as np

from cupy_moe import _gpu, bench, load_workloads

# changes to the default policy (the first row)
POLICIES = [
    {},
    {"SHRINK_CHUNKS_BELOW": 0.0, "SPLIT_SLOTS_BELOW": 0.0},  # never
    {"SHRINK_CHUNKS_BELOW": 2.0, "SPLIT_SLOTS_BELOW": 0.0},  # shrink chunks only
    {"SHRINK_CHUNKS_BELOW": 0.0, "SPLIT_SLOTS_BELOW": 2.0},  # split slots only
    {"BULK_MIN_BLOCKS": 0.0},  # bulk-copy kernel at every size
    {"BULK_MIN_BLOCKS": 0.0, "BULK_TARGET_BLOCKS": 1.0},
]
LABELS = ["kimi-k2-decode", "kimi-k2-small", "qwen3-30b-small", "kimi-k2-decode-sf-row-major",
          "kimi-k2-decode-sf-packed", "qwen3-30b-small-sf-row-major", "qwen3-30b-small-sf-packed"]


def main() -> int:
    workloads = [w for op in ("expand_to_fused", "expand_to_fused_with_sf")
                 for w in load_workloads(op) if w.label in LABELS]
    timer = bench.GpuTimer()
    rng = np.random.default_rng()
    default = dict(_gpu.GRID_POLICY)
    print("| policy (changes to the default) | " + " | ".join(w.label for w in workloads) + " |")
    print("|---" * (len(workloads) + 1) + "|")
    for policy in POLICIES:
        _gpu.configure(grid_policy={**default, **policy})
        cells = []
        for w in workloads:
            record = bench.bench_gpu_workload(w, timer, "torch", 20, 1.0, rng, kernel_only=True)
            cells.append(f"{record.graph_us:.2f}" if record.status == "ok" else record.status)
        name = ", ".join(f"{k} {v}" for k, v in policy.items()) or "default"
        print(f"| {name} | "
              + " | ".join(cells) + " |", flush=True)
    _gpu.configure(grid_policy=default)
    return 0


if __name__ == "__main__":
    sys.exit(main())
