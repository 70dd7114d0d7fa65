"""Run the seed's TileLang "expand to fused" kernel on one plan workload a few
times, for a profiler (ncu) to pick a launch; the counterpart of
profile_op.py, which runs ours. GPU only; needs the carried .peers/ bundle.

    source benchmarks/peer_setup.sh
    ncu --set full --kernel-name regex:expand_to_fused --launch-skip 2 --launch-count 1 \\
        -o seed python benchmarks/profile_seed.py qwen3-30b-medium-e128-plan-sf-row-major
    python benchmarks/ncu_top_sass.py seed.ncu-rep

The inputs are the bench's (``workload_inputs``: random payload, the
workload's seeded plan) as bench_expand_seed.py passes them to the seed's op.
Nothing is checked here (bench_expand_seed.py does that). The first call
compiles the kernel (TileLang, nvcc): ncu's launch counting starts at it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import bench_expand_seed as seed_bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("label", help="a plan workload of the manifest")
    parser.add_argument("calls", type=int, nargs="?", default=4)
    parser.add_argument("--diff", default=str(seed_bench.DEFAULT_DIFF), help="the seed's PR text")
    args = parser.parse_args()
    import torch

    from cupy_moe.harness import runner
    from cupy_moe.harness.inputs import workload_inputs

    (w,) = seed_bench.plan_workloads([args.label])
    seed_classes = seed_bench.prepare_seed(Path(args.diff))
    host = workload_inputs(w, np.random.default_rng(0))
    targs = {name: runner._to_torch(array) for name, array in host.items()}
    op = seed_bench.make_seed_op(w, seed_classes)
    inputs = seed_bench.seed_inputs(w, targs)
    for _ in range(args.calls):
        op(*inputs)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
