"""swiglu_quantize_fp8 by slot against by row, over batch sizes. GPU only.

    python benchmarks/sweep_swiglu_slots.py [--tokens T ...] [--models NAME ...]

The calls a layer makes with the plan's hint: zero_padding=False, given
``token_topk_to_pos`` (bf16 h, column-major float32 SF, topk_weights,
pos_to_expert), on the real routing plans of three models, at each T.
Columns, µs per call replaying a CUDA graph:
  rows visited   the default kernels over the X rows (by slot off:
                 ``by_slot_from_rows_per_slot = inf``)
  slots, vec1    the ``*_slots`` kernels on ``*_vec1_slots`` (a lane a
                 16-byte chunk), whatever the slot count
  slots, wide    the ``*_slots`` kernels on the wide ones (``*_rows_slots`` /
                 ``*_rows768_slots`` / ``*_vec_slots``), whatever the count
  default        the default tuning's own choice (``kernel``: which)
so that the defaults' two rules, by slot from a number of rows a slot and
vec1 for the slots up to an amount of work an SM, can be read off the
crossovers. Each variant's live rows are first checked bit-exact against the
NumPy oracle. Timings only; the tests check the values further.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from dataclasses import replace

import numpy as np
import torch

from cupy_moe.harness import runner
from cupy_moe.harness.inputs import workload_inputs
from cupy_moe.harness.manifest import Workload, workload_from_entry
from cupy_moe.harness.timing import torch_graph_us
from cupy_moe.quantize.api import run_with_tuning
from cupy_moe.quantize.launch_shape import DEFAULT_TUNING, QuantizeTuning
from cupy_moe.quantize.rules import QuantizeProblem

# (name, intermediate I, plan) of the manifest's SwiGLU plan workloads
MODELS = {
    "kimi-k2": (2048, {"num_experts": 384, "alignment": 128, "seed": 0}),
    "dsv3-ep8": (2048, {"num_experts": 32, "alignment": 128, "ep_ranks": 8, "seed": 0}),
    "qwen3-30b-a3b": (768, {"num_experts": 128, "alignment": 128, "seed": 0}),
}
ROWS = replace(DEFAULT_TUNING, by_slot_from_rows_per_slot=math.inf)
VARIANTS: dict[str, QuantizeTuning] = {
    "rows visited": ROWS,
    "slots, vec1": replace(DEFAULT_TUNING, by_slot_from_rows_per_slot=0,
                           narrow_slot_columns_per_sm=math.inf),
    "slots, wide": replace(DEFAULT_TUNING, by_slot_from_rows_per_slot=0,
                           narrow_slot_columns_per_sm=0),
    "default": DEFAULT_TUNING,
}


def workload(model: str, tokens: int) -> Workload:
    intermediate, plan = MODELS[model]
    return workload_from_entry("swiglu_quantize_fp8", {
        "label": f"swiglu-{model}-t{tokens}-unzeroed", "tokens": tokens, "top_k": 8,
        "intermediate": intermediate, "plan": plan, "topk_weights": True,
        "pos_to_expert": True, "num_per_channels": 128, "round_sf": False,
        "packed_ue8m0": False, "use_tma_aligned_col_major_sf": True, "dtype": "bfloat16",
        "zero_padding": False, "token_topk_to_pos": True})


def _call(w: Workload, dev: dict, tuning: QuantizeTuning, **outs):
    return run_with_tuning(
        tuning, "swiglu_quantize_fp8", dev["h"], topk_weights=dev["topk_weights"],
        pos_to_token_topk=dev["pos_to_token_topk"], pos_to_expert=dev["pos_to_expert"],
        token_topk_to_pos=dev["token_topk_to_pos"], zero_padding=False,
        num_per_channels=w.num_per_channels, round_sf=w.round_sf,
        packed_ue8m0=w.packed_ue8m0,
        use_tma_aligned_col_major_sf=w.use_tma_aligned_col_major_sf, **outs)


def _default_kernel(w: Workload, gpu) -> str:
    """The coalesced kernel the default tuning takes for ``w``'s calls."""
    problem = QuantizeProblem(
        num_rows=w.num_expanded, hidden=w.hidden, in_dtype=w.dtype,
        num_per_channels=w.num_per_channels, round_sf=w.round_sf,
        packed_ue8m0=w.packed_ue8m0, col_major=w.use_tma_aligned_col_major_sf, swiglu=True,
        num_weights=w.num_tokens * w.top_k, has_pos_to_expert=True, zero_padding=False,
        has_token_topk_to_pos=True)
    return gpu.plan_for(problem, torch.cuda.current_device(), DEFAULT_TUNING).kernel_name(True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="*",
                        default=[1, 8, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    from cupy_moe.quantize import gpu  # (imports cupy: GPU only)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"µs per call in a CUDA graph; {sms} SMs; columns an SM = T * K * I / SMs")
    print("| workload | X | slots | rows a slot | columns an SM | "
          + " | ".join(VARIANTS) + " | default's kernel |")
    print("|---" * (6 + len(VARIANTS)) + "|")
    for model in args.models:
        for tokens in args.tokens:
            w = workload(model, tokens)
            host = workload_inputs(w, np.random.default_rng(tokens))
            dev = {name: runner._to_torch(a) for name, a in host.items()}
            expected = runner.reference_outputs(w, host)
            live = runner.compared_rows(w, host)
            times = []
            for name, tuning in VARIANTS.items():
                y, y_sf = _call(w, dev, tuning)
                # the live rows only: padding rows are left unwritten
                problem = runner._mismatch((y, y_sf), expected, runner._torch_to_host,
                                           runner.output_names(w), live)
                if problem:
                    print(f"{w.label} {name}: {problem}", file=sys.stderr)
                    return 1
                times.append(torch_graph_us(functools.partial(_call, w, dev, tuning, out=y,
                                                              out_sf=y_sf)))
            slots = tokens * 8
            print(f"| {w.label} | {w.num_expanded} | {slots} | {w.num_expanded / slots:.1f} | "
                  f"{slots * MODELS[model][0] / sms:.0f} | "
                  + " | ".join(f"{t:.2f}" for t in times)
                  + f" | {_default_kernel(w, gpu)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
