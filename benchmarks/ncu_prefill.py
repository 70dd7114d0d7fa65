"""One kimi-k2-prefill call, for Nsight Compute (the kernel of interest is the
second launch; the first warms the module up). GPU only.

    ncu --clock-control none -k regex:expand_to_fused -s 1 -c 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        python3 benchmarks/ncu_prefill.py
"""

import numpy as np
import torch

import cupy_moe
from cupy_moe.workload_inputs import workload_inputs

workload = next(w for w in cupy_moe.load_workloads("expand_to_fused") if w.label == "kimi-k2-prefill")
host = workload_inputs(workload, np.random.default_rng(0))
x = torch.from_numpy(host["x"].view(np.int16)).cuda().view(torch.bfloat16)
m = torch.from_numpy(host["token_topk_to_pos"]).cuda()
p = torch.from_numpy(host["pos_to_expert"]).cuda()
out = cupy_moe.expand_to_fused(x, m, p)
cupy_moe.expand_to_fused(x, m, p, out=out)
torch.cuda.synchronize()
