"""Time to the first result in a fresh process: with an empty kernel cache
(NVRTC compiles the variant) and with a warm one (CuPy's disk cache). GPU only.

    python benchmarks/first_call.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, time
t0 = time.perf_counter()
import torch, cupy, cupy_moe
t1 = time.perf_counter()
x = torch.randn(4, 7168, device="cuda").to(torch.bfloat16)
m = torch.tensor([[0, 1], [2, 3], [4, -1], [5, 6]], dtype=torch.int32, device="cuda")
p = torch.tensor([0, 0, 1, 1, 2, 2, 3, -1], dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
t2 = time.perf_counter()
cupy_moe.expand_to_fused(x, m, p)
torch.cuda.synchronize()
t3 = time.perf_counter()
cupy_moe.expand_to_fused(x, m, p)
torch.cuda.synchronize()
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_call_ms": (t3 - t2) * 1e3,
                  "second_call_ms": (t4 - t3) * 1e3}))
"""


def run(cache_dir: str) -> dict:
    env = dict(os.environ, CUPY_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    with tempfile.TemporaryDirectory() as cache_dir:
        cold = run(cache_dir)
        warm = run(cache_dir)
    print("| process | import torch+cupy+cupy_moe s | first call ms | second call ms |")
    print("|---|---|---|---|")
    for name, r in (("empty kernel cache (NVRTC compile)", cold), ("warm kernel cache", warm)):
        print(f"| {name} | {r['import_s']:.2f} | {r['first_call_ms']:.1f} | "
              f"{r['second_call_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
