"""Run ``fused_mapping`` a few times on one shape, for a profiler (ncu) to
pick a launch. GPU only.

    python benchmarks/profile_mapping.py T K E ALIGNMENT [CALLS] [--peer]

``--peer`` runs DeepSeek TileKernels' ``get_fused_mapping`` (no sync, same X)
after ours, where ``benchmarks/peer_setup.sh`` made it importable, so that one
ncu run times both kernels, e.g.

    ncu --metrics gpu__time_duration.sum --launch-skip 4 \\
        python benchmarks/profile_mapping.py 4096 8 384 128 --peer
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import cupy_moe


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--peer"]
    peer = len(args) != len(sys.argv) - 1
    num_tokens, top_k, num_experts, alignment = (int(v) for v in args[:4])
    calls = int(args[4]) if len(args) > 4 else 4
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(0, num_experts, size=(num_tokens, top_k))).cuda()
    for _ in range(calls):
        plan = cupy_moe.fused_mapping(ids, num_experts, alignment=alignment)
    torch.cuda.synchronize()
    if peer:
        from tile_kernels.moe.get_fused_mapping_kernel import get_fused_mapping
        rows = plan.pos_to_expert.shape[0]
        for _ in range(calls):
            get_fused_mapping(ids, num_experts, rows, alignment, force_no_sync=True)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
