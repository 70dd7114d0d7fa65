"""A/B the expand kernels' configuration on every manifest workload, in
interleaved rounds. GPU only.

    python benchmarks/sweep_kernel_config.py [--rounds R] [--iters N] [--only LABEL ...]
                                             [--json PATH]

Each config is a grid policy (cupy_moe._gpu.GRID_POLICY) and kernel defines
(cupy_moe._gpu.KERNEL_CONFIG) changed from the defaults; the first config is
the default. Inputs are drawn once per workload; every config's output is
first checked bit-exact against the NumPy reference (output poisoned before
the run). Rounds run the configs in turn (A B C .. A B C ..), so a slow
stretch of the machine hits every config alike; a cell is the median over
rounds, with the rounds' spread (max - min). Bandwidth-bound shapes: % of the
same-run copy bandwidth (L2 flushed between iterations); decode and small
shapes: GPU µs per call from CUDA-graph replays.

Diagnostic rows replay the default plan's launch changed in one way, to
place the time of a step: "no SF words" moves no scale factors
(sf_columns = 0), "no zero-fill blocks" launches the token blocks only,
"zero-fill blocks find no padding rows" reads a pos_to_expert with none (the
blocks' cost without their stores). Their outputs are wrong by design and
are not checked.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys

import numpy as np
import torch
from cupy.cuda import driver

from cupy_moe import _gpu, bench, load_workloads
from cupy_moe.workload_inputs import workload_inputs

DEFAULT_KERNEL = dict(_gpu.KERNEL_CONFIG)
DEFAULT_POLICY = dict(_gpu.GRID_POLICY)
# (name, grid policy changes, kernel define changes)
# (the rounds of benchmarks/NOTES.md v6 also ran 1 and 8 rows per register
# zero-fill block, 1, 2, 8 and 32 per bulk one, bulk zero-fill by bulk
# stores from a zeroed stage, the bulk kernel without evict-first hints, and
# bulk token blocks doing the zero-fill themselves; v7's, whole-row zero-fill
# blocks by lane stores, zero-fill blocks first in the grid, 1 KiB bulk
# chunks and bulk token blocks looping over 2-8 tokens; the switches of the
# ones that lost are gone from the kernels)
CONFIGS = [
    ("default", {}, {}),
    ("bulk zero-fill by chunks on every row length (v6)",
     {"BULK_WHOLE_ROW_ZERO_FROM": float("inf")}, {}),
    ("bulk zero-fill of whole rows on every row length", {"BULK_WHOLE_ROW_ZERO_FROM": 0}, {}),
    ("1 whole row per bulk zero-fill block", {"ZERO_ROWS_BULK_WHOLE": 1}, {}),
    ("3 whole rows per bulk zero-fill block", {"ZERO_ROWS_BULK_WHOLE": 3}, {}),
    ("bulk slots in 2 planes below 2 x SMs blocks",
     {"BULK_SPLIT_SLOTS_BELOW": 2.0, "BULK_SLOT_PLANES": 2}, {}),
    ("bulk slots in 4 planes below 2 x SMs blocks",
     {"BULK_SPLIT_SLOTS_BELOW": 2.0, "BULK_SLOT_PLANES": 4}, {}),
    ("bulk slots in 8 planes below 2 x SMs blocks",
     {"BULK_SPLIT_SLOTS_BELOW": 2.0, "BULK_SLOT_PLANES": 8}, {}),
]
# tail fields of struct ExpandArgs after the 6 pointers (see _gpu._EXPAND_ARGS)
_SF_COLUMNS_FIELD = 4


def _inputs(w, rng):
    """Torch inputs on the GPU, the reference outputs on the GPU, and out buffers."""
    host = workload_inputs(w, rng)
    args = {name: bench._to_torch(a) for name, a in host.items()}
    expected = [bench._to_torch(e) for e in bench._reference(w, host)]
    outs = bench._call(w, args)
    return args, expected, outs


def _raw_bytes(t):
    """uint8 view of a tensor's whole storage region (column-major SF included)."""
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,)).view(torch.uint8)


def _check(w, args, expected, outs) -> str | None:
    for out in outs:
        _raw_bytes(out).fill_(0xA5)
    bench._call(w, args, **_out_kwargs(outs))
    for name, got, want in zip(("expanded_x", "expanded_x_sf"), outs, expected):
        if not torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)):
            return f"MISMATCH {name}"
    return None


def _out_kwargs(outs):
    return {"out": outs[0]} if len(outs) == 1 else {"out": outs[0], "out_sf": outs[1]}


def _time(w, fn, timer, iters, copy_tbps) -> float:
    if w.bytes <= bench.GRAPH_MAX_BYTES:
        return bench.torch_graph_us(fn)
    return 100 * w.bytes / timer.median_us(fn, iters) / 1e6 / copy_tbps


def _diagnostic_launches(w, args, outs):
    """(name, launch function) pairs replaying the default plan changed in one way."""
    _gpu.configure(kernel=DEFAULT_KERNEL, grid_policy=DEFAULT_POLICY)
    bench._call(w, args, **_out_kwargs(outs))  # makes the plan
    (plan,) = _gpu._plans.values()
    pointers = (args["x"].data_ptr(), args["token_topk_to_pos"].data_ptr(),
                args["pos_to_expert"].data_ptr(), outs[0].data_ptr(),
                args["x_sf"].data_ptr() if "x_sf" in args else 0,
                outs[1].data_ptr() if len(outs) > 1 else 0)
    no_padding = torch.zeros(w.num_expanded, dtype=torch.int32, device="cuda")  # every row an expert's
    bits = plan.row_bytes | 16 | pointers[0] | pointers[3]
    launch = plan.kernel(bits & -bits)
    variants = [("no zero-fill blocks", launch.tail, w.num_tokens, pointers),
                ("zero-fill blocks find no padding rows", launch.tail, launch.grid_x,
                 (*pointers[:2], no_padding.data_ptr(), *pointers[3:]))]
    if "x_sf" in args:
        tail = list(launch.tail)
        tail[_SF_COLUMNS_FIELD] = 0
        variants.append(("no SF words", tuple(tail), launch.grid_x, pointers))
    result = []
    for name, tail, grid_x, pointers in variants:
        buffer = (ctypes.c_uint64 * 16)()
        _gpu._EXPAND_ARGS.pack_into(buffer, 0, *pointers, *tail)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(buffer))

        def run(buffer=buffer, params=params, grid_x=grid_x, keep=no_padding):
            driver.launchKernel(launch.handle, grid_x, launch.grid_y, launch.grid_z, launch.threads,
                                1, 1, launch.shared_bytes, torch.cuda.current_stream().cuda_stream,
                                ctypes.addressof(params), 0)
        result.append((f"diagnostic: {name}", run))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--only", nargs="*", metavar="LABEL", help="workload labels (default: all)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if args.rounds < 1 or args.iters < 1:
        parser.error(f"--rounds and --iters must be >= 1, got {args.rounds} and {args.iters}")
    every = [w for op in ("expand_to_fused", "expand_to_fused_with_sf") for w in load_workloads(op)]
    unknown = sorted(set(args.only or ()) - {w.label for w in every})
    if unknown:
        parser.error(f"--only: unknown workload label(s) {', '.join(unknown)}")
    workloads = [w for w in every if not args.only or w.label in args.only]
    timer = bench.GpuTimer()
    copy_tbps = timer.copy_tbps()
    rng = np.random.default_rng()
    cells: dict[str, dict[str, list | str]] = {name: {} for name, _, _ in CONFIGS}
    for w in workloads:
        inputs, expected, outs = _inputs(w, rng)
        def call(w=w, inputs=inputs, outs=outs):
            return bench._call(w, inputs, **_out_kwargs(outs))
        for round_index in range(args.rounds):
            for name, policy, kernel in CONFIGS:
                _gpu.configure(kernel={**DEFAULT_KERNEL, **kernel},
                               grid_policy={**DEFAULT_POLICY, **policy})
                if isinstance(cells[name].get(w.label), str):
                    continue  # already failed
                problem = _check(w, inputs, expected, outs) if round_index == 0 else None
                if problem:
                    cells[name][w.label] = problem
                    continue
                cells[name].setdefault(w.label, []).append(
                    _time(w, call, timer, args.iters, copy_tbps))
        for name, run in _diagnostic_launches(w, inputs, outs):
            cells.setdefault(name, {})[w.label] = [_time(w, run, timer, args.iters, copy_tbps)
                                                   for _ in range(args.rounds)]
        print(w.label, "done", file=sys.stderr, flush=True)
    _gpu.configure(kernel=DEFAULT_KERNEL, grid_policy=DEFAULT_POLICY)

    def text(values, unit):
        if isinstance(values, str):
            return values
        return (f"{statistics.median(values):.2f} µs ±{(max(values) - min(values)) / 2:.2f}"
                if unit == "us" else
                f"{statistics.median(values):.1f} ±{(max(values) - min(values)) / 2:.1f}")

    units = {w.label: "us" if w.bytes <= bench.GRAPH_MAX_BYTES else "%" for w in workloads}
    print(f"copy roofline {copy_tbps:.2f} TB/s; {args.rounds} rounds; % of it per workload "
          "(decode/small: CUDA-graph replay µs per call); ± half the rounds' spread")
    print("| config | " + " | ".join(w.label for w in workloads) + " |")
    print("|---" * (len(workloads) + 1) + "|")
    for name, row in cells.items():
        print(f"| {name} | " + " | ".join(text(row[w.label], units[w.label]) if w.label in row
                                          else "" for w in workloads) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_tbps": copy_tbps, "rounds": args.rounds, "units": units,
                       "cells": cells}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
