"""A/B tunings of swiglu_quantize_fp8 (and quantize_fp8) on the manifest's workloads. GPU only.

    python benchmarks/sweep_swiglu.py [--iters N] [--only LABEL ...] [--tunings TEXT ...] [--warm]
                                      [--dtype float32]

Each ``QuantizeTuning`` below (block size, and the register budget of the
row-major ``*_rows`` kernel: ``rows_min_blocks``) is first checked bit-exact
against the NumPy oracle on the workload's inputs, then timed with its outputs
preallocated: GPU time (CUDA events, L2 flushed) and its share of the
same-run copy bandwidth over the workload's roofline bytes. The first tuning
is the default. Why these: the ``*_rows`` kernel is bound by instruction
issue at 46% occupancy (63 registers; benchmarks/NOTES.md, ninth session);
``rows_min_blocks=5`` compiles it to 46 registers (40 warps an SM) with a few
spills. (Two segments a warp lost 11-16 points and were removed:
benchmarks/NOTES.md, tenth session; results/sweep_swiglu_h200.md.)
``--dtype float32``: the workloads with float32 inputs in place of their
bfloat16 ones (the manifest has none; its labels get ``-f32``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys

import numpy as np
import torch  # noqa: F401  (runner._to_torch reads sys.modules["torch"])

from cupy_moe.harness import runner
from cupy_moe.harness.ab_sweep import pick_variants, pick_workloads, sweep_table
from cupy_moe.harness.timing import GpuTimer, WarmTimer
from cupy_moe.quantize.api import run_with_tuning
from cupy_moe.quantize.launch_shape import QuantizeTuning

TUNINGS = [("default", QuantizeTuning()),
           # the row-major kernels' segment widths (the first that divides I),
           # and never (*_vec for every I); (1024, 768): the default before
           # the thirty-seventh session's *_rows512; 256: shorter still
           *((f"segment_columns={widths}", QuantizeTuning(segment_columns=widths))
             for widths in ((768, 1024), (), (1024, 768), (256, 768))),
           # the calls that zero-fill many padding rows on 512-column segments
           # too (the default: 1024 from 16 MiB of their codes)
           ("fill_segments_from_bytes=inf",
            QuantizeTuning(fill_segments_from_bytes=float("inf"))),
           # quantize_fp8, column-major float32 SF: *_vec (8 columns' scale
           # factors a row, a sector each) against the default's *_tiles
           ("sf_column_tiles=False", QuantizeTuning(sf_column_tiles=False)),
           # ... and packed UE8M0 SF on *_vec against the default's *_tiles
           ("packed_sf_tiles=False", QuantizeTuning(packed_sf_tiles=False)),
           # packed UE8M0: a row's last word in one store (QUANTIZE_PACKED_WORD_STORES)
           ("packed_sf_word_stores", QuantizeTuning(packed_sf_word_stores=True)),
           ("packed_sf_tiles=False+word_stores", QuantizeTuning(packed_sf_tiles=False,
                                                                packed_sf_word_stores=True)),
           *((f"rows_min_blocks={blocks}", QuantizeTuning(rows_min_blocks=blocks))
             for blocks in (5, 6, 8, 10)),
           # quantize_fp8's column-major / packed SF: *_vec below this many
           # rows instead of *_tiles (thirty-fourth session: Kimi-K2 T = 1
           # and 512 behind TileKernels on *_tiles)
           *((f"tiles_from_rows={rows}", QuantizeTuning(tiles_from_rows=rows))
             for rows in (8, 1024, 8192)),
           # quantize_fp8: *_vec1 (a lane a 16-byte chunk) up to this many
           # columns an SM (default 4096), never, always
           *((f"vec1_columns_per_sm={columns}", QuantizeTuning(vec1_columns_per_sm=columns))
             for columns in (0, 1024, 16384, float("inf"))),
           # quantize_fp8's *_vec1, packed: row R-1's pad-column words byte by
           # byte, every block its byte (the default: whole words)
           ("vec1_packed_pad_words=False", QuantizeTuning(vec1_packed_pad_words=False)),
           # ... and in *_tiles, where rows before R-1 also go through the loop
           ("tiles_packed_pad_words=False", QuantizeTuning(tiles_packed_pad_words=False)),
           # ... and in every kernel, SwiGLU's included (store_scale_factor)
           ("packed_sf_pad_words", QuantizeTuning(packed_sf_pad_words=True)),
           # swiglu: the few-live-rows kernels for every call, *_vec1 (a lane
           # a chunk) or *_block_rows (its calls from block_rows_from_bytes):
           # the padding-heavy plans where TileKernels gives a live row 8
           # warps (thirty-sixth session, results/swiglu_tk_h100.md)
           ("narrow_live_rows=all,vec1", QuantizeTuning(narrow_live_rows=1 << 30,
                                                        block_rows_from_bytes=float("inf"))),
           ("narrow_live_rows=all", QuantizeTuning(narrow_live_rows=1 << 30)),
           # row loads of the calls in half the L2 evict-first, as every other
           # call's (the default before the thirty-fourth session), or plain
           ("resident_load_hint=0", QuantizeTuning(resident_load_hint=0)),
           ("resident_load_hint=1", QuantizeTuning(resident_load_hint=1)),
           # zero_padding off with token_topk_to_pos: the *_slots kernels at
           # any rows a slot (DeepSeek-V3 EP8 T = 512 has one; it lost there
           # on the twenty-third session's kernels), and never
           ("by_slot_from_rows_per_slot=0",
            QuantizeTuning(by_slot_from_rows_per_slot=0, narrow_slot_columns_per_sm=0)),
           ("by_slot_from_rows_per_slot=inf",
            QuantizeTuning(by_slot_from_rows_per_slot=float("inf"))),
           # the default's 128 against the other block sizes (256 was the
           # default before the tenth session)
           *((f"threads={threads}", QuantizeTuning(threads=threads))
             for threads in (64, 192, 256))]
DEFAULT_LABELS = ["swiglu-kimi-k2-prefill-e384-plan-col-major",
                  "swiglu-kimi-k2-medium-e384-plan-col-major",
                  "swiglu-dsv3-ep8-prefill-8k-plan-col-major",
                  "swiglu-qwen3-30b-a3b-prefill-e128-plan-col-major",
                  "swiglu-kimi-k2-decode-e384-plan-col-major"]


def run_tuning(w, inputs: dict, tuning: QuantizeTuning, outs: tuple | None) -> tuple:
    """The workload's op under ``tuning`` (into ``outs`` when given)."""
    op = functools.partial(run_with_tuning, tuning, w.op)
    if outs is None:
        return runner._call_newer(w, op, inputs)
    return runner._call_newer(w, op, inputs, out=outs[0], out_sf=outs[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--only", nargs="*", metavar="LABEL", default=DEFAULT_LABELS)
    parser.add_argument("--tunings", nargs="*", metavar="TEXT",
                        help="only the tunings whose label contains one of these (the default "
                             "always runs)")
    parser.add_argument("--dtype", choices=["float32"],
                        help="the workloads' input dtype in place of the manifest's")
    parser.add_argument("--warm", action="store_true",
                        help="µs a call replaying a CUDA graph, no L2 flush (inputs that fit "
                             "in L2 stay there from one call to the next)")
    args = parser.parse_args()
    tunings = pick_variants(TUNINGS, args.tunings, "--tunings", parser.error)
    workloads = pick_workloads(["swiglu_quantize_fp8", "quantize_fp8"], args.only,
                               parser.error)
    if args.dtype:
        workloads = [dataclasses.replace(w, dtype=args.dtype, label=f"{w.label}-f32")
                     for w in workloads]
    timer = WarmTimer() if args.warm else GpuTimer()
    # the L2-flushed copy either way (a WarmTimer would time it in a graph)
    copy_tbps = GpuTimer().copy_tbps() if args.warm else timer.copy_tbps()
    print("\n".join(sweep_table(workloads, tunings, run_tuning, timer, copy_tbps,
                                args.iters, "tuning", np.random.default_rng())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
