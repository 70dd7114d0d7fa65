"""Time ``fused_mapping`` on the GPU: decode to prefill shapes. GPU only.

    python benchmarks/bench_fused_mapping.py [--iters N] [--json PATH]

Per shape, torch int64 ids (what ``torch.topk`` returns): the plan is first
checked bit-identical to the NumPy oracle, then timed: GPU time (median of
CUDA-event timings, L2 flushed between them), GPU time per call replaying a
CUDA graph of 100 calls, and eager wall time per call (allocation included).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

import cupy_moe
from cupy_moe.harness.timing import GpuTimer, eager_us, torch_graph_us
from cupy_moe.mapping import fused_mapping_numpy, worst_case_rows

# (label, T, K, E, alignment)
SHAPES = [
    ("decode", 1, 8, 384, 128),
    ("small", 32, 8, 256, 128),
    ("medium", 512, 8, 256, 128),
    ("prefill-e128", 4096, 8, 128, 128),
    ("prefill-e256", 4096, 8, 256, 128),
    ("prefill-e384", 4096, 8, 384, 128),
    ("prefill-8k-e384", 8192, 8, 384, 128),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    timer = GpuTimer()
    rng = np.random.default_rng()
    records = []
    print("| shape | T | K | E | A | X | GPU us | graph us/call | eager us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, num_tokens, top_k, num_experts, alignment in SHAPES:
        ids = rng.integers(0, num_experts, size=(num_tokens, top_k))
        ids[rng.random(ids.shape) < 0.02] = -1
        device_ids = torch.from_numpy(ids).cuda()
        rows = worst_case_rows(ids.size, num_experts, alignment)
        plan = cupy_moe.fused_mapping(device_ids, num_experts, alignment=alignment)
        expected = fused_mapping_numpy(ids, num_experts, alignment=alignment, num_expanded=rows)
        for name, got, want in zip(plan._fields, plan, expected):
            if not np.array_equal(got.cpu().numpy(), want):
                print(f"MISMATCH in {name} for {label}", file=sys.stderr)
                return 1

        def call():
            return cupy_moe.fused_mapping(device_ids, num_experts, alignment=alignment)

        record = {"label": label, "num_tokens": num_tokens, "top_k": top_k,
                  "num_experts": num_experts, "alignment": alignment, "num_expanded": rows,
                  "gpu_us": timer.median_us(call, args.iters),
                  "graph_us": torch_graph_us(call),
                  "eager_us": eager_us(call, 100, torch.cuda.synchronize)}
        records.append(record)
        print(f"| {label} | {num_tokens} | {top_k} | {num_experts} | {alignment} | {rows} | "
              f"{record['gpu_us']:.1f} | {record['graph_us']:.2f} | {record['eager_us']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": timer.device_name, "versions": {
                "cupy_moe": cupy_moe.__version__, "torch": torch.__version__},
                "records": records}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
