"""A/B launch shapes of reduce_fused on the manifest's workloads. GPU only.

    python benchmarks/sweep_combine.py [--iters N] [--only LABEL ...] [--shapes TEXT ...]
                                       [--floor] [--warm]

Each shape (``combine.launch_shape.combine_shape`` options: vectors a thread
owns, slots whose loads are in flight together, warps of a row chunk) is
first checked bit-exact against the NumPy oracle, then timed with the output
preallocated: GPU time (CUDA events, L2 flushed) and its share of the
same-run copy bandwidth over the workload's roofline bytes
(cupy_moe/harness/ab_sweep.py). The first shape is the default.

``--warm`` times replays of a CUDA graph of 100 calls instead (the bench's
graph column): no L2 flush, so inputs that fit in L2 (T = 512 at H = 2048:
19 MB) stay there from one call to the next.
Options that are cache hints alone (``load_hint``, ``store_hint``) apply to
the shape reduce_fused would choose by itself.

``--floor`` adds a row timed the same way on each workload's inputs: torch's
``index_select`` of every live slot's row of ``expanded`` into a compact
buffer, then a zero fill of one row per token with no live slot. It moves at
least the bytes reduce_fused must (each live row read once, a row written per
live slot and per all-dropped token) with no arithmetic: what a gather of
those rows reaches on this GPU (expert-parallel plans: scattered 14 KiB rows).
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np
import torch

from cupy_moe.combine.api import run_with_shape
from cupy_moe.harness.ab_sweep import pick_variants, pick_workloads, sweep_table
from cupy_moe.harness.timing import GpuTimer, WarmTimer

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
          # a group a token, K compiled in, few instructions a token
          # (TileKernels' reduce_fused layout: 128 threads, 7 vectors each;
          # thirty-second session)
          *({"vecs_per_thread": vecs, "max_warps": warps, "token_rows": True}
            for vecs, warps in ((7, 4), (8, 4), (4, 4), (4, 8), (2, 8))),
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
                                               (2, 4, 8, 1), (1, 8, 8, 2))),
          # a block's live rows land in shared memory by bulk copies, this many
          # column chunks in flight (twenty-sixth session; sm_90, 16-byte rows)
          *({"vecs_per_thread": vecs, "max_warps": warps, "bulk_stages": stages}
            for vecs, warps, stages in ((1, 4, 4), (1, 4, 8), (1, 8, 4), (2, 4, 2), (2, 4, 4),
                                        (2, 4, 8), (4, 4, 2), (4, 4, 4), (2, 8, 4), (4, 8, 2))),
          # ... and consecutive groups of tokens a block, in turn (a shorter grid)
          *({"vecs_per_thread": vecs, "max_warps": 4, "bulk_stages": 4, "bulk_rounds": rounds}
            for vecs, rounds in ((1, 2), (1, 4), (2, 2))),
          # the default shape's accesses under other cache hints than .cs
          # (evict-first; L2-resident calls in a graph: --warm; thirty-third session)
          *({"load_hint": load, "store_hint": store}
            for load, store in (("plain", "cs"), ("cg", "cs"), ("nc", "cs"), ("cs", "plain"),
                                ("cs", "cg"), ("plain", "plain"), ("cg", "cg"),
                                ("nc", "plain"))),
          # the default but for the row loads of tokens with at most half their
          # slots live: evict-first (where the call's own loads are .cs, the
          # default before the thirty-fourth session's FEW_LIVE_LOAD_HINT; on
          # sparse plans, whose loads are .nc, those tokens' alone .cs)
          {"few_live_load_hint": "cs"},
          # token_rows on TileKernels' grid at T = 512 (a 128-thread group a
          # token, rows never cut finer to fill the chip), evict-first and
          # read-only row loads (thirty-fourth session: graph replays of the
          # L2-resident T = 512 calls)
          *({"vecs_per_thread": vecs, "max_warps": warps, "token_rows": True,
             "fill_blocks_per_sm": 0, "load_hint": load}
            for vecs, warps in ((7, 4), (2, 8)) for load in ("cs", "nc"))]
DEFAULT_LABELS = ["reduce-kimi-k2-decode", "reduce-kimi-k2-medium", "reduce-kimi-k2-prefill",
                  "reduce-qwen3-30b-a3b-prefill", "reduce-dsv3-ep8-prefill-plan"]


def run_shape(w, inputs: dict, options: dict, outs: tuple | None) -> tuple:
    """reduce_fused with launch-shape ``options`` (into ``outs`` when given)."""
    return (run_with_shape(inputs["expanded"], inputs["token_topk_to_pos"],
                           inputs.get("topk_weights"), row_scale=inputs.get("row_scale"),
                           out=outs[0] if outs else None, **options),)


FLOOR_ROW = "floor: index_select of the live rows + zeros of the all-dropped tokens"


def _gather_floor(expanded, rows, gathered, zeros) -> None:
    torch.index_select(expanded, 0, rows, out=gathered)
    zeros.zero_()


def floor_cells(workloads, timer: GpuTimer, copy_tbps: float, iters: int,
                rng: np.random.Generator) -> list[str]:
    """The ``--floor`` row's cells: µs (% of the copy over each workload's
    roofline bytes), on inputs drawn as the sweep draws them."""
    from cupy_moe.harness import runner
    from cupy_moe.harness.inputs import workload_inputs

    cells = []
    for w in workloads:
        host = workload_inputs(w, rng)
        slots = host["token_topk_to_pos"]
        live = (slots >= 0) & (slots < host["expanded"].shape[0])
        expanded = runner._to_torch(host["expanded"])
        rows = torch.as_tensor(slots[live].astype(np.int64), device=expanded.device)
        gathered = expanded.new_empty((rows.numel(), expanded.shape[1]))
        zeros = expanded.new_empty((int((~live.any(axis=1)).sum()), expanded.shape[1]))

        us = timer.median_us(functools.partial(_gather_floor, expanded, rows, gathered, zeros),
                             iters)
        cells.append(f"{us:.1f} ({w.bytes / us / 1e6 / copy_tbps * 100:.1f}%)")
    return cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--only", nargs="*", metavar="LABEL", default=DEFAULT_LABELS)
    parser.add_argument("--shapes", nargs="*", metavar="TEXT",
                        help="only the default and the shapes whose name contains a TEXT")
    parser.add_argument("--floor", action="store_true",
                        help="add the row of a gather of the live rows (index_select)")
    parser.add_argument("--warm", action="store_true",
                        help="no L2 flush between calls (a graph's back-to-back calls: "
                             "inputs that fit in L2 stay there)")
    args = parser.parse_args()
    workloads = pick_workloads(["reduce_fused"], args.only, parser.error)
    timer = WarmTimer() if args.warm else GpuTimer()
    shapes = pick_variants([(", ".join(f"{k}={v}" for k, v in options.items()) or "default",
                             options) for options in SHAPES], args.shapes, "--shapes",
                           parser.error)
    # the L2-flushed 1 GiB copy, --warm or not (a WarmTimer would time it in a graph)
    copy_tbps = (GpuTimer() if args.warm else timer).copy_tbps()
    lines = sweep_table(workloads, shapes, run_shape, timer, copy_tbps, args.iters, "shape",
                        np.random.default_rng())
    if args.floor:
        cells = floor_cells(workloads, timer, copy_tbps, args.iters, np.random.default_rng())
        lines.append(f"| {FLOOR_ROW} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
