"""Sweep the expand kernels' configuration on the bandwidth-bound workloads:
% of the same-run copy bandwidth per (config, workload).

    python benchmarks/sweep_kernel_config.py [--iters N] [--json PATH]

Each config is a grid policy (cupy_moe._gpu.GRID_POLICY: bulk-copy kernel on
or off, its target block count) and a set of defines of the register kernel
(cupy_moe._gpu.KERNEL_CONFIG); the default is the first row. GPU only.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from cupy_moe import _gpu, bench, load_workloads

DEFAULT_KERNEL = dict(_gpu.KERNEL_CONFIG)
DEFAULT_POLICY = dict(_gpu.GRID_POLICY)
NO_BULK = {"BULK_MIN_BLOCKS": float("inf")}
# (name, grid policy changes, register-kernel defines)
CONFIGS = [
    ("default", {}, {}),
    ("bulk, target 6 x SMs", {"BULK_TARGET_BLOCKS": 6.0}, {}),
    ("bulk, target 24 x SMs", {"BULK_TARGET_BLOCKS": 24.0}, {}),
    ("registers 256 x 4, streaming", NO_BULK, {}),
    ("registers 256 x 4, plain", NO_BULK, {"EXPAND_STREAMING": 0}),
    ("registers 128 x 8, streaming", NO_BULK, {"EXPAND_THREADS": 128, "EXPAND_UNROLL": 8}),
]
LABELS = ["kimi-k2-prefill", "qwen3-30b-prefill", "kimi-k2-medium", "qwen3-30b-medium",
          "kimi-k2-medium-sf-row-major", "kimi-k2-medium-sf-packed", "kimi-k2-small",
          "qwen3-30b-small"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    workloads = [w for op in ("expand_to_fused", "expand_to_fused_with_sf")
                 for w in load_workloads(op) if w.label in LABELS]
    timer = bench.GpuTimer()
    copy_tbps = timer.copy_tbps()
    rng = np.random.default_rng()
    rows = []
    for name, policy, kernel in CONFIGS:
        _gpu.configure(kernel={**DEFAULT_KERNEL, **kernel}, grid_policy={**DEFAULT_POLICY, **policy})
        row = {"config": name}
        for w in workloads:
            record = bench.bench_gpu_workload(w, timer, "torch", args.iters, copy_tbps, rng,
                                              kernel_only=True)
            if record.status != "ok":
                row[w.label] = record.status
            elif record.graph_us is not None:  # small shapes: graph-replay us per call
                row[w.label] = f"{record.graph_us:.2f} us"
            else:
                row[w.label] = round(record.pct_copy_roofline, 1)
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    _gpu.configure(kernel=DEFAULT_KERNEL, grid_policy=DEFAULT_POLICY)
    print(f"copy roofline {copy_tbps:.2f} TB/s; % of it per workload "
          "(small shapes: CUDA-graph replay time per call)")
    print("| config | " + " | ".join(w.label for w in workloads) + " |")
    print("|---" * (len(workloads) + 1) + "|")
    for row in rows:
        print(f"| {row['config']} | " + " | ".join(str(row[w.label]) for w in workloads) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_tbps": copy_tbps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
