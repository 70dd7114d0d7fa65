"""Sweep the expand kernels' compile-time configuration on the bandwidth-bound
workloads: % of the same-run copy bandwidth per (config, workload).

    python benchmarks/sweep_kernel_config.py [--iters N] [--json PATH]

Each config is a set of defines of the kernel variant (cupy_moe._gpu.KERNEL_CONFIG);
the default config is the first row. GPU only.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from cupy_moe import _gpu, bench, load_workloads

CONFIGS = [
    {"EXPAND_THREADS": 256, "EXPAND_UNROLL": 4, "EXPAND_STREAMING": 1},
    {"EXPAND_THREADS": 256, "EXPAND_UNROLL": 4, "EXPAND_STREAMING": 0},
    {"EXPAND_THREADS": 128, "EXPAND_UNROLL": 8, "EXPAND_STREAMING": 1},
    {"EXPAND_THREADS": 512, "EXPAND_UNROLL": 2, "EXPAND_STREAMING": 1},
]
LABELS = ["kimi-k2-prefill", "qwen3-30b-prefill", "kimi-k2-medium", "qwen3-30b-medium",
          "kimi-k2-medium-sf-row-major", "kimi-k2-medium-sf-packed", "kimi-k2-small",
          "kimi-k2-decode", "kimi-k2-decode-sf-packed"]


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
    for config in CONFIGS:
        _gpu.configure(kernel=config)
        row = {"config": dict(config)}
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
    _gpu.configure(kernel=CONFIGS[0])
    print(f"copy roofline {copy_tbps:.2f} TB/s; % of it per workload "
          "(small shapes: CUDA-graph replay time per call)")
    print("| threads x unroll, streaming | " + " | ".join(w.label for w in workloads) + " |")
    for row in rows:
        c = row["config"]
        name = f"{c['EXPAND_THREADS']} x {c['EXPAND_UNROLL']}, {c['EXPAND_STREAMING']}"
        print(f"| {name} | " + " | ".join(str(row[w.label]) for w in workloads) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_tbps": copy_tbps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
