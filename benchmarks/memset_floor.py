"""The write-only ceiling of each bandwidth-bound workload: a cudaMemsetAsync
of its output bytes, timed like the op (L2 flushed, CUDA events), as a share of
the same-run copy bandwidth over the op's bytes. GPU only.

    python benchmarks/memset_floor.py [--iters N]

A kernel that writes the output cannot finish before a memset of it, so
"% copy" of the memset is the most the op can reach on that shape under this
timing (reads come on top).
"""

from __future__ import annotations

import argparse
import sys

import cupy

from cupy_moe.harness.manifest import OP_NAMES, load_workloads
from cupy_moe.harness.runner import GRAPH_MAX_BYTES
from cupy_moe.harness.timing import GpuTimer
from cupy_moe.runtime.sizes import align_up


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    if args.iters < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    timer = GpuTimer()
    copy_tbps = timer.copy_tbps()
    print(f"copy roofline {copy_tbps:.2f} TB/s")
    print("| workload | MB (op) | output MB | memset µs | memset % copy (op bytes) |")
    print("|---|---|---|---|---|")
    for op in OP_NAMES:
        for w in load_workloads(op):
            if w.bytes <= GRAPH_MAX_BYTES or w.plan is not None:
                continue  # launch-bound shapes: graph time is their figure; plans: the bench's
            out_bytes = w.num_expanded * w.hidden * w.elem_bytes
            if w.sf_columns is not None:
                rows = align_up(w.num_expanded, 4) if w.use_tma_aligned_col_major_sf else w.num_expanded
                out_bytes += rows * w.sf_columns * 4
            buffer = cupy.empty(out_bytes, dtype=cupy.uint8)
            stream = cupy.cuda.get_current_stream().ptr
            us = timer.median_us(
                lambda buffer=buffer, stream=stream: cupy.cuda.runtime.memsetAsync(
                    buffer.data.ptr, 0, buffer.nbytes, stream), args.iters)
            print(f"| {w.label} | {w.bytes / 1e6:.2f} | {out_bytes / 1e6:.2f} | {us:.1f} | "
                  f"{100 * w.bytes / us / 1e6 / copy_tbps:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
