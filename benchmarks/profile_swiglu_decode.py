"""Where swiglu_quantize_fp8's decode time goes: the op per call in a CUDA
graph on a decode plan, beside variants that each take one part away. GPU
only.

    python benchmarks/profile_swiglu_decode.py [LABEL ...]

(default: the manifest's swiglu decode workloads). Variants, all with the
workload's shapes and SF layout unless named:
  plan          the workload as the bench times it
  vec1          the plan on *_vec1, however many rows may be live
                (QuantizeTuning narrow_live_rows = 2^31,
                block_rows_from_bytes = inf)
  block rows    ... on *_block_rows (block_rows_from_bytes = 0): a block
                whole rows, about one block an SM
  block rows x2 the same with about two blocks an SM
  block rows, all padding   and with pos_to_expert all -1
  no weights    topk_weights and pos_to_token_topk left out (one load less
                on a live row's chain)
  padding not written   zero_padding=False: the padding rows' codes and
                scale factors are not stored; "..." the same on the wide
                kernels (narrow_live_rows = 0, unzeroed_block_rows_from_bytes
                = inf), *_vec1, *_block_rows (about
                one, two, four blocks an SM)
  by slot       zero_padding=False given the plan's token_topk_to_pos, on
                the *_slots kernels (QuantizeTuning by_slot_from_rows_per_slot
                = 0): the T * K slots visited, not the X rows; "by slot,
                vec1" on *_vec1_slots, "by slot, wide" on *_rows_slots / *_rows768_slots
                / *_vec_slots, whatever the slot count
  all padding   pos_to_expert all -1: only the zero codes and scale factors
                (no h loads, no arithmetic)
  live rows     only the plan's live rows (X = their count): the chain of a
                live row without the padding rows' stores
  zero out      torch's zero_ of the same output bytes (y and its SF): the
                store floor
  quantize      quantize_fp8 of the live rows' activations ([rows, I]): the
                arithmetic without SwiGLU's maps and exp
Results are timings only; the tests check the values.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import numpy as np
import torch

import cupy_moe
from cupy_moe.harness import runner
from cupy_moe.quantize.api import run_with_tuning
from cupy_moe.quantize.launch_shape import QuantizeTuning
from cupy_moe.harness.inputs import plan_mapping, workload_inputs
from cupy_moe.harness.manifest import load_workloads
from cupy_moe.harness.timing import torch_graph_us


# the few-live-rows kernels on every call (at decode the plan's own choice
# anyway; on small batches, T * K > 64 rows may be live, the wide kernel's)
BLOCK_ROWS = QuantizeTuning(narrow_live_rows=2**31, block_rows_from_bytes=0)
# the *_slots kernels on every call given token_topk_to_pos, zero_padding=False
BY_SLOT = QuantizeTuning(by_slot_from_rows_per_slot=0)


def variants(w, host: dict[str, np.ndarray]) -> dict[str, object]:
    dev = {name: runner._to_torch(array) for name, array in host.items()}
    slot_rows = runner._to_torch(plan_mapping(w).token_topk_to_pos)
    options = dict(num_per_channels=w.num_per_channels, round_sf=w.round_sf,
                   packed_ue8m0=w.packed_ue8m0,
                   use_tma_aligned_col_major_sf=w.use_tma_aligned_col_major_sf)

    def op(h, pos_to_expert, weights=True, tuning=None, zero_padding=True, by_slot=False):
        """One variant's call into preallocated outputs (the plan's own tuning
        unless ``tuning`` is given; ``by_slot``: given the plan's
        token_topk_to_pos)."""
        maps = dict(pos_to_expert=pos_to_expert, zero_padding=zero_padding, **options)
        if weights:
            maps.update(topk_weights=dev["topk_weights"],
                        pos_to_token_topk=dev["pos_to_token_topk"])
        if by_slot:
            maps.update(token_topk_to_pos=slot_rows)
        if tuning is None:
            run = cupy_moe.swiglu_quantize_fp8
        else:
            def run(x, **kwargs):
                return run_with_tuning(tuning, "swiglu_quantize_fp8", x, **kwargs)
        y, y_sf = run(h, **maps)
        return lambda: run(h, out=y, out_sf=y_sf, **maps)

    live = np.flatnonzero(host["pos_to_expert"] >= 0)
    h_live = dev["h"][torch.from_numpy(live).to(dev['h'].device)].contiguous()
    y, y_sf = cupy_moe.swiglu_quantize_fp8(dev["h"], pos_to_expert=dev["pos_to_expert"],
                                           **options)
    act = h_live[:, : h_live.shape[1] // 2].contiguous()
    q, q_sf = cupy_moe.quantize_fp8(act, **options)
    return {
        "plan": op(dev["h"], dev["pos_to_expert"]),
        "vec1": op(dev["h"], dev["pos_to_expert"],
                   tuning=replace(BLOCK_ROWS, block_rows_from_bytes=math.inf)),
        "block rows": op(dev["h"], dev["pos_to_expert"], tuning=BLOCK_ROWS),
        "block rows x2": op(dev["h"], dev["pos_to_expert"],
                            tuning=replace(BLOCK_ROWS, block_rows_blocks_per_sm=2.0)),
        "block rows, all padding": op(dev["h"], torch.full_like(dev["pos_to_expert"], -1),
                                      tuning=BLOCK_ROWS),
        "no weights": op(dev["h"], dev["pos_to_expert"], weights=False),
        "padding not written": op(dev["h"], dev["pos_to_expert"], zero_padding=False),
        "... wide": op(dev["h"], dev["pos_to_expert"], zero_padding=False,
                       tuning=QuantizeTuning(narrow_live_rows=0,
                                             unzeroed_block_rows_from_bytes=math.inf)),
        "... vec1": op(dev["h"], dev["pos_to_expert"], zero_padding=False,
                       tuning=replace(BLOCK_ROWS, block_rows_from_bytes=math.inf)),
        "... block rows": op(dev["h"], dev["pos_to_expert"], zero_padding=False,
                             tuning=BLOCK_ROWS),
        "... block rows x2": op(dev["h"], dev["pos_to_expert"], zero_padding=False,
                                tuning=replace(BLOCK_ROWS, block_rows_blocks_per_sm=2.0)),
        "... block rows x4": op(dev["h"], dev["pos_to_expert"], zero_padding=False,
                                tuning=replace(BLOCK_ROWS, block_rows_blocks_per_sm=4.0)),
        "by slot": op(dev["h"], dev["pos_to_expert"], zero_padding=False, tuning=BY_SLOT,
                      by_slot=True),
        "by slot, vec1": op(dev["h"], dev["pos_to_expert"], zero_padding=False, by_slot=True,
                            tuning=replace(BY_SLOT, narrow_slot_columns_per_sm=math.inf)),
        "by slot, wide": op(dev["h"], dev["pos_to_expert"], zero_padding=False, by_slot=True,
                            tuning=replace(BY_SLOT, narrow_slot_columns_per_sm=0)),
        "all padding": op(dev["h"], torch.full_like(dev["pos_to_expert"], -1)),
        "live rows": op(h_live, dev["pos_to_expert"][torch.from_numpy(live).to(dev['h'].device)],
                        weights=False),
        "zero out": lambda: (y.zero_(), y_sf.zero_()),
        "quantize": lambda: cupy_moe.quantize_fp8(act, out=q, out_sf=q_sf, **options),
    }


def main() -> int:
    labels = sys.argv[1:]
    workloads = [w for w in load_workloads("swiglu_quantize_fp8")
                 if (w.label in labels if labels else "-decode-" in w.label)]
    if not workloads:
        print(f"no such workloads: {labels}", file=sys.stderr)
        return 2
    for w in workloads:
        host = workload_inputs(w, np.random.default_rng(0))
        rows = int((host["pos_to_expert"] >= 0).sum())
        print(f"{w.label}: X={host['h'].shape[0]} I={host['h'].shape[1] // 2} "
              f"live rows={rows}; us per call in a CUDA graph")
        for name, fn in variants(w, host).items():
            print(f"  {name:24s} {torch_graph_us(fn):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
