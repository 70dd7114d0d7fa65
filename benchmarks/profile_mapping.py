"""Run ``fused_mapping`` a few times on one shape, for a profiler (ncu) to
pick a launch. GPU only.

    python benchmarks/profile_mapping.py T K E ALIGNMENT [CALLS]

e.g. ncu --kernel-name regex:mapping_place --launch-skip 2 --launch-count 1
         --section SourceCounters python benchmarks/profile_mapping.py 4096 8 384 128
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import cupy_moe


def main() -> int:
    num_tokens, top_k, num_experts, alignment = (int(v) for v in sys.argv[1:5])
    calls = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(0, num_experts, size=(num_tokens, top_k))).cuda()
    for _ in range(calls):
        cupy_moe.fused_mapping(ids, num_experts, alignment=alignment)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
