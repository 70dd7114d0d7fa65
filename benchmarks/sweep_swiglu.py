"""A/B tunings of swiglu_quantize_fp8 (and quantize_fp8) on the manifest's workloads. GPU only.

    python benchmarks/sweep_swiglu.py [--iters N] [--only LABEL ...]

Each ``QuantizeTuning`` below (block size, and the register budget of the
row-major ``*_rows`` kernel: ``rows_min_blocks``) is first checked bit-exact
against the NumPy oracle on the workload's inputs, then timed with its outputs
preallocated: GPU time (CUDA events, L2 flushed) and its share of the
same-run copy bandwidth over the workload's roofline bytes. The first tuning
is the default. Why these: the ``*_rows`` kernel is bound by instruction
issue at 46% occupancy (63 registers; benchmarks/NOTES.md, ninth session);
``rows_min_blocks=5`` compiles it to 46 registers (40 warps an SM) with a few
spills. Its top stall is the first use of the loaded data: ``rows_segments=2``
(two segments a warp, the second's loads issued before the first's
arithmetic) hides that latency inside a warp instead, at the cost of both
segments' data in registers.
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np
import torch  # noqa: F401  (runner._to_torch reads sys.modules["torch"])

from cupy_moe.harness import runner
from cupy_moe.harness.inputs import workload_inputs
from cupy_moe.harness.manifest import load_workloads
from cupy_moe.harness.timing import GpuTimer
from cupy_moe.quantize.api import run_with_tuning
from cupy_moe.quantize.launch_shape import QuantizeTuning

TUNINGS = [("default", QuantizeTuning()),
           *((f"rows_min_blocks={blocks}", QuantizeTuning(rows_min_blocks=blocks))
             for blocks in (5, 6)),
           ("threads=128", QuantizeTuning(threads=128)),
           ("threads=128, rows_min_blocks=10", QuantizeTuning(threads=128, rows_min_blocks=10)),
           # Two segments a warp (NVRTC 13, sm_90, bf16 input): 128 registers,
           # no spills, 16 warps an SM (the second segment's 32 data registers
           # live through the first's arithmetic). rows_min_blocks=3: 80
           # registers, 24 warps, 26 spill stores (few of them loaded data),
           # 4% more instructions; 4: 64 registers, 32 warps (as one segment a
           # warp has), 64 spill stores and 6% more instructions, which an
           # issue-bound kernel pays for. f32 input holds twice the data: 167
           # registers, spills at every budget.
           ("rows_segments=2", QuantizeTuning(rows_segments=2)),
           *((f"rows_segments=2, rows_min_blocks={blocks}",
              QuantizeTuning(rows_segments=2, rows_min_blocks=blocks)) for blocks in (3, 4))]
DEFAULT_LABELS = ["swiglu-kimi-k2-prefill-e384-plan-col-major",
                  "swiglu-kimi-k2-medium-e384-plan-col-major",
                  "swiglu-dsv3-ep8-prefill-8k-plan-col-major",
                  "swiglu-qwen3-30b-a3b-prefill-e128-plan-col-major",
                  "swiglu-kimi-k2-decode-e384-plan-col-major"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--only", nargs="*", metavar="LABEL", default=DEFAULT_LABELS)
    args = parser.parse_args()
    workloads = {w.label: w for op in ("swiglu_quantize_fp8", "quantize_fp8")
                 for w in load_workloads(op)}
    unknown = sorted(set(args.only) - set(workloads))
    if unknown:
        parser.error(f"--only: unknown quantize workload(s) {', '.join(unknown)}")
    timer = GpuTimer()
    copy_tbps = timer.copy_tbps()
    rng = np.random.default_rng()
    print(f"copy {copy_tbps:.2f} TB/s; GPU us (% of copy) per tuning")
    print("| tuning | " + " | ".join(args.only) + " |")
    print("|---" * (len(args.only) + 1) + "|")
    cells: dict[str, list[str]] = {}
    for label in args.only:
        w = workloads[label]
        host = workload_inputs(w, rng)
        expected = runner.reference_outputs(w, host)
        inputs = {name: runner._to_torch(array) for name, array in host.items()}
        names = runner.output_names(w)
        for name, tuning in TUNINGS:
            op = functools.partial(run_with_tuning, tuning, w.op)
            outs = runner._call_newer(w, op, inputs)
            problem = runner._mismatch(outs, expected, runner._torch_to_host, names)
            if problem:
                cells.setdefault(name, []).append(f"MISMATCH {problem}")
                continue
            call = functools.partial(runner._call_newer, w, op, inputs, out=outs[0],
                                     out_sf=outs[1])
            us = timer.median_us(call, args.iters)
            cells.setdefault(name, []).append(
                f"{us:.1f} ({w.bytes / us / 1e6 / copy_tbps * 100:.1f}%)")
        print(label, "done", file=sys.stderr, flush=True)
    for name, row in cells.items():
        print(f"| {name} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
