"""A/B launch shapes of reduce_fused on the manifest's workloads. GPU only.

    python benchmarks/sweep_combine.py [--iters N] [--only LABEL ...] [--shapes TEXT ...]

Each shape (``combine.launch_shape.combine_shape`` options: vectors a thread
owns, slots whose loads are in flight together, warps of a row chunk) is
first checked bit-exact against the NumPy oracle, then timed with the output
preallocated: GPU time (CUDA events, L2 flushed) and its share of the
same-run copy bandwidth over the workload's roofline bytes
(cupy_moe/harness/ab_sweep.py). The first shape is the default.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch  # noqa: F401  (runner._to_torch reads sys.modules["torch"])

from cupy_moe.combine.api import run_with_shape
from cupy_moe.harness.ab_sweep import pick_variants, pick_workloads, sweep_table
from cupy_moe.harness.timing import GpuTimer

# (vectors a thread owns, slots in flight): 8, 16 or 32 16-byte loads a thread
# in flight; row chunks of 4 or 8 warps
SHAPES = [{}, *({"vecs_per_thread": vecs, "slot_batch": batch, "max_warps": warps}
                for vecs, batch in ((1, 16), (2, 4), (2, 8), (4, 2), (4, 4), (4, 8))
                for warps in (4, 8)),
          # a warp walks its token's live slots only (expert-parallel plans: most
          # slots dropped; twenty-fifth session)
          *({"vecs_per_thread": vecs, "slot_batch": batch, "max_warps": warps,
             "warp_slots": True}
            for vecs, batch, warps in ((1, 8, 8), (1, 4, 4), (2, 2, 4), (2, 4, 4), (2, 8, 4),
                                       (4, 2, 4), (4, 4, 4), (4, 2, 8))),
          # ... and consecutive tokens a warp, in turn
          *({"vecs_per_thread": vecs, "slot_batch": batch, "max_warps": 4,
             "warp_slots": True, "warp_tokens": tokens}
            for vecs, batch, tokens in ((2, 2, 2), (2, 2, 4), (4, 2, 2), (4, 2, 4), (2, 4, 2),
                                        (4, 4, 2))),
          # a warp streams the live rows of rounds of 32 // K tokens
          *({"vecs_per_thread": vecs, "slot_batch": batch, "max_warps": warps,
             "stream_rounds": rounds}
            for vecs, batch, warps, rounds in ((1, 8, 4, 1), (1, 4, 4, 1), (2, 4, 4, 1),
                                               (2, 4, 4, 2), (2, 2, 4, 1), (4, 2, 4, 1),
                                               (2, 4, 8, 1), (1, 8, 8, 2)))]
DEFAULT_LABELS = ["reduce-kimi-k2-decode", "reduce-kimi-k2-medium", "reduce-kimi-k2-prefill",
                  "reduce-qwen3-30b-a3b-prefill", "reduce-dsv3-ep8-prefill-plan"]


def run_shape(w, inputs: dict, options: dict, outs: tuple | None) -> tuple:
    """reduce_fused with launch-shape ``options`` (into ``outs`` when given)."""
    return (run_with_shape(inputs["expanded"], inputs["token_topk_to_pos"],
                           inputs.get("topk_weights"), row_scale=inputs.get("row_scale"),
                           out=outs[0] if outs else None, **options),)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--only", nargs="*", metavar="LABEL", default=DEFAULT_LABELS)
    parser.add_argument("--shapes", nargs="*", metavar="TEXT",
                        help="only the default and the shapes whose name contains a TEXT")
    args = parser.parse_args()
    workloads = pick_workloads(["reduce_fused"], args.only, parser.error)
    timer = GpuTimer()
    shapes = pick_variants([(", ".join(f"{k}={v}" for k, v in options.items()) or "default",
                             options) for options in SHAPES], args.shapes, "--shapes",
                           parser.error)
    print("\n".join(sweep_table(workloads, shapes, run_shape, timer, timer.copy_tbps(),
                                args.iters, "shape", np.random.default_rng())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
