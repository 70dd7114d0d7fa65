"""What the bench's timing gives a plain copy of each size: a device-to-device
copy of the bytes of every combine and fp8-producer workload above 8 MiB
(half read, half written), and of a ladder of sizes, timed as the ops are (L2
flushed, CUDA events, the GPU kept busy before each run so that the host's
launch work is queued), as a share of the 1 GiB copy's bandwidth; and an
empty kernel timed the same way (the method's fixed cost). GPU only.

    python benchmarks/copy_by_size.py [--iters N]

Issue 14 reads its prefill targets against the 1 GiB copy's bandwidth; on
the small prefill shapes (quantize_fp8 at H = 2048: 25 MB) a copy of the
same bytes does not reach it either, and this says by how much.
"""

from __future__ import annotations

import argparse
import sys

import cupy

from cupy_moe.harness.manifest import COMBINE_OP_NAMES, QUANTIZE_OP_NAMES, load_workloads
from cupy_moe.harness.runner import GRAPH_MAX_BYTES
from cupy_moe.harness.timing import GpuTimer

LADDER_MB = (1, 4, 16, 32, 64, 128, 256, 1024)
_EMPTY = cupy.RawKernel(r'extern "C" __global__ void empty_kernel() {}', "empty_kernel")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    if args.iters < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    timer = GpuTimer()
    copy_tbps = timer.copy_tbps()
    empty = timer.median_us(lambda: _EMPTY((1,), (32,), ()), args.iters, hide_host=True)
    print(f"{timer.device_name}: 1 GiB copy {copy_tbps:.2f} TB/s (read + write); "
          f"an empty kernel {empty:.2f} µs")
    print("| bytes of | MB | copy µs | % of the 1 GiB copy |")
    print("|---|---|---|---|")
    sizes = [(f"{mb} MB", mb * 10**6) for mb in LADDER_MB]
    sizes += [(w.label, w.bytes) for op in COMBINE_OP_NAMES + QUANTIZE_OP_NAMES
              for w in load_workloads(op) if w.bytes > GRAPH_MAX_BYTES]
    for name, nbytes in sizes:
        # (half read, half written; the host hidden, as the ops are timed)
        us = timer.copy_us(max(nbytes // 2, 1), args.iters, hide_host=True)
        print(f"| {name} | {nbytes / 1e6:.2f} | {us:.1f} | "
              f"{100 * nbytes / us / 1e6 / copy_tbps:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
