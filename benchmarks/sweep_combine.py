"""A/B launch shapes of reduce_fused on the manifest's workloads. GPU only.

    python benchmarks/sweep_combine.py [--iters N] [--only LABEL ...]

Each shape (``combine.launch_shape.combine_shape`` options: vectors a thread
owns, slots whose loads are in flight together, warps of a row chunk) is
first checked bit-exact against the NumPy oracle, then timed with the output preallocated: GPU time (CUDA events, L2
flushed) and its share of the same-run copy bandwidth over the workload's
roofline bytes. The first shape is the default.
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np
import torch  # noqa: F401  (runner._to_torch reads sys.modules["torch"])

from cupy_moe.combine.api import run_with_shape
from cupy_moe.harness import runner
from cupy_moe.harness.inputs import workload_inputs
from cupy_moe.harness.manifest import load_workloads
from cupy_moe.harness.timing import GpuTimer

# (vectors a thread owns, slots in flight): 8, 16 or 32 16-byte loads a thread
# in flight; row chunks of 4 or 8 warps
SHAPES = [{}, *({"vecs_per_thread": vecs, "slot_batch": batch, "max_warps": warps}
                for vecs, batch in ((1, 16), (2, 4), (2, 8), (4, 2), (4, 4), (4, 8))
                for warps in (4, 8))]
DEFAULT_LABELS = ["reduce-kimi-k2-decode", "reduce-kimi-k2-medium", "reduce-kimi-k2-prefill",
                  "reduce-qwen3-30b-a3b-prefill", "reduce-dsv3-ep8-prefill-plan"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--only", nargs="*", metavar="LABEL", default=DEFAULT_LABELS)
    args = parser.parse_args()
    workloads = {w.label: w for w in load_workloads("reduce_fused")}
    unknown = sorted(set(args.only) - set(workloads))
    if unknown:
        parser.error(f"--only: unknown reduce_fused workload(s) {', '.join(unknown)}")
    timer = GpuTimer()
    copy_tbps = timer.copy_tbps()
    rng = np.random.default_rng()
    print(f"copy {copy_tbps:.2f} TB/s; GPU us (% of copy) per shape")
    print("| shape | " + " | ".join(args.only) + " |")
    print("|---" * (len(args.only) + 1) + "|")
    cells: dict[str, list[str]] = {}
    for label in args.only:
        w = workloads[label]
        host = workload_inputs(w, rng)
        expected = runner.reference_outputs(w, host)
        inputs = {name: runner._to_torch(array) for name, array in host.items()}
        call_args = (inputs["expanded"], inputs["token_topk_to_pos"], inputs.get("topk_weights"))
        for options in SHAPES:
            name = ", ".join(f"{k}={v}" for k, v in options.items()) or "default"
            out = run_with_shape(*call_args, row_scale=inputs.get("row_scale"), **options)
            problem = runner._mismatch((out,), expected, runner._torch_to_host, ("out",))
            if problem:
                cells.setdefault(name, []).append(f"MISMATCH {problem}")
                continue
            call = functools.partial(run_with_shape, *call_args,
                                     row_scale=inputs.get("row_scale"), out=out, **options)
            us = timer.median_us(call, args.iters)
            cells.setdefault(name, []).append(
                f"{us:.1f} ({w.bytes / us / 1e6 / copy_tbps * 100:.0f}%)")
        print(label, "done", file=sys.stderr, flush=True)
    for name, row in cells.items():
        print(f"| {name} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
