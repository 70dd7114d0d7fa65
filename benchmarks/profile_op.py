"""Run one manifest workload's op a few times on the GPU, for a profiler (ncu)
to pick a launch. GPU only.

    python benchmarks/profile_op.py LABEL [CALLS]

e.g. the SwiGLU-quantize kernel of Kimi-K2 prefill, its 3rd launch:

    ncu --set full --kernel-name regex:swiglu --launch-skip 2 --launch-count 1 \\
        -o swiglu python benchmarks/profile_op.py swiglu-kimi-k2-prefill-e384-plan-col-major
    python benchmarks/ncu_top_sass.py swiglu.ncu-rep

The inputs are the bench's (random payload, the workload's plan), on torch
CUDA tensors with preallocated outputs; nothing is checked here (the bench
and the tests do that).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from cupy_moe.harness import runner
from cupy_moe.harness.inputs import workload_inputs
from cupy_moe.harness.manifest import ALL_OP_NAMES, load_workloads


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    label, calls = sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 4
    workloads = {w.label: w for op in ALL_OP_NAMES for w in load_workloads(op)}
    if label not in workloads:
        print(f"unknown workload {label!r}", file=sys.stderr)
        return 2
    w = workloads[label]
    host = workload_inputs(w, np.random.default_rng(0))
    args = {name: runner._to_torch(array) for name, array in host.items()}
    results = runner._call(w, args)
    kwargs = {}
    if w.op not in runner.MAPPING_OP_NAMES:  # fused_mapping has no out=
        out = results[0] if len(results) == 1 else results
        kwargs = {"out": out} if len(results) == 1 else {"out": out[0], "out_sf": out[1]}
    for _ in range(calls):
        runner._call(w, args, **kwargs)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
