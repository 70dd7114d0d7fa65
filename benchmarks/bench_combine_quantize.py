"""Time reduce_fused, quantize_fp8 and swiglu_quantize_fp8 on the GPU beside
DeepSeek TileKernels' reduce_fused, per_token_cast and
swiglu_forward_and_per_token_cast, when those can be imported. GPU only.

    source benchmarks/peer_setup.sh   # optional: makes TileKernels importable
    python benchmarks/bench_combine_quantize.py [--op OP] [--workload LABEL ...]
                                                [--iters N] [--json PATH]

The shapes are the manifest's workloads of the three ops, their inputs the
harness's (cupy_moe.harness.inputs), torch tensors on the GPU. Per workload,
our result is first checked bit for bit against the NumPy oracle (the op on
the host arrays, as ``cupy-moe bench`` checks it), then timed with the
outputs preallocated (``out=``, ``out_sf=``), with cupy_moe.harness.timing:
GPU time (CUDA events, L2 flushed, the GPU kept busy ~50 us before each call
so that the host's launch work is queued: the kernels' time alone), GPU time
per call replaying a CUDA graph of 100 calls, and eager wall time per call
(allocation included); GB/s and % of the same-run copy bandwidth from the
manifest's roofline bytes. TileKernels' op is timed the same way on the same
tensors (its reduce with ``out=``; its casts allocate, as they must) and
compared with ours where the two contracts agree:

- reduce_fused: the same numerics (a float32 fma a slot, one rounding at the
  end; ``row_scale`` is its per-row ``x_sf``): bit for bit.
- per_token_cast: e4m3 codes and scale factors bit for bit, in the layout
  asked for (packed UE8M0: the exponent bytes of real blocks only; TileKernels
  leaves the unused bytes of a last word unwritten).
- swiglu_forward_and_per_token_cast: the routed rows only (TileKernels leaves
  padding rows unwritten; ours are zero). Its SiLU divides (``g / (1 +
  exp(-g))``) where ours multiplies by the reciprocal, and its ``exp`` is
  TileLang's: codes may differ by a step, so the cell counts the codes and
  scale factors that differ (and the largest difference in e4m3 steps)
  rather than asserting.

A peer's failure (an import error, an assertion on a shape it does not take)
is a cell of the table, not the end of the run. Exits 1 if one of our
results differs from the oracle, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import cupy_moe
from cupy_moe.harness import runner
from cupy_moe.harness.inputs import workload_inputs
from cupy_moe.harness.manifest import (
    COMBINE_OP_NAMES,
    QUANTIZE_OP_NAMES,
    Workload,
    load_workloads,
)
from cupy_moe.harness.timing import GpuTimer, eager_us, torch_graph_us

OPS = COMBINE_OP_NAMES + QUANTIZE_OP_NAMES
# TileKernels' op of each of ours: (module, function)
PEERS = {"reduce_fused": ("tile_kernels.moe.reduce_fused_kernel", "reduce_fused"),
         "quantize_fp8": ("tile_kernels.quant.per_token_cast_kernel", "per_token_cast"),
         "swiglu_quantize_fp8": ("tile_kernels.quant.swiglu_forward_and_per_token_cast_kernel",
                                 "swiglu_forward_and_per_token_cast")}


def tilekernels_ops() -> dict[str, Callable[..., Any] | str]:
    """TileKernels' function for each op, or why it cannot be imported."""
    import importlib

    found: dict[str, Callable[..., Any] | str] = {}
    for op, (module_name, name) in PEERS.items():
        try:
            found[op] = getattr(importlib.import_module(module_name), name)
        except Exception as exc:  # noqa: BLE001 - any import failure: no peer column
            found[op] = f"{type(exc).__name__}: {exc}"[:160]
            print(f"TileKernels' {name} not timed: {found[op]}", file=sys.stderr)
    return found


def peer_call(op: str, peer: Callable[..., Any], w: Workload,
              args: dict[str, Any]) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(timed, eager) calls of TileKernels' op on our workload's tensors: the
    timed one writes a preallocated output where the peer takes one."""
    if op == "reduce_fused":
        x = (args["expanded"], args["row_scale"]) if "row_scale" in args else args["expanded"]
        weights, slots = args.get("topk_weights"), args["token_topk_to_pos"]
        out = torch.empty((w.num_tokens, w.hidden), dtype=args["expanded"].dtype,
                          device=args["expanded"].device)
        return (lambda: peer(x, weights, slots, out=out)), (lambda: peer(x, weights, slots))
    sf = {"use_tma_aligned_col_major_sf": w.use_tma_aligned_col_major_sf,
          "round_sf": w.round_sf, "use_packed_ue8m0": w.packed_ue8m0}
    if op == "quantize_fp8":
        def call():
            return peer(args["x"], "e4m3", w.num_per_channels, **sf)
    else:
        def call():
            return peer(args["h"], "e4m3", w.num_per_channels,
                        pos_to_token_topk=args.get("pos_to_token_topk"),
                        topk_weights=args.get("topk_weights"),
                        pos_to_expert=args.get("pos_to_expert"), **sf)
    return call, call


def _sf_bytes(sf: torch.Tensor, w: Workload) -> torch.Tensor:
    """The scale factors as bytes ``[rows, n]`` holding only real blocks'
    values (a packed word's unused exponent bytes left out)."""
    blocks = -(-w.hidden // w.num_per_channels)
    as_bytes = sf.contiguous().view(torch.uint8)
    return as_bytes[:, :blocks] if w.packed_ue8m0 else as_bytes


def _e4m3_steps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between two e4m3 codes, in representable steps."""
    def ordinal(codes):
        codes = codes.view(torch.uint8).to(torch.int32)
        magnitude = codes & 0x7F
        return torch.where(codes >= 0x80, -magnitude, magnitude)
    return int((ordinal(a) - ordinal(b)).abs().max()) if a.numel() else 0


def agreement(op: str, w: Workload, args: dict[str, Any], peer_result, ours: tuple) -> str:
    """Where TileKernels' result and ours must agree (module docstring)."""
    if op == "reduce_fused":
        bits = {2: torch.int16, 4: torch.int32}[ours[0].element_size()]
        wrong = (peer_result.view(bits) != ours[0].view(bits)).nonzero()
        return ("bit-exact" if wrong.numel() == 0 else
                f"{wrong.shape[0]} elements differ, first at {tuple(wrong[0].tolist())}")
    codes, sf = peer_result
    our_codes, our_sf = ours
    rows = slice(None)
    if op == "swiglu_quantize_fp8" and "pos_to_expert" in args:
        rows = args["pos_to_expert"] >= 0  # padding rows: TileKernels does not write them
    got_codes, want_codes = codes.view(torch.uint8)[rows], our_codes.view(torch.uint8)[rows]
    got_sf, want_sf = _sf_bytes(sf, w)[rows], _sf_bytes(our_sf, w)[rows]
    if tuple(codes.shape) != tuple(our_codes.shape) or tuple(sf.shape) != tuple(our_sf.shape):
        return f"shapes differ: {tuple(codes.shape)}, {tuple(sf.shape)}"
    code_diff = int((got_codes != want_codes).sum())
    sf_diff = int((got_sf != want_sf).sum())
    if code_diff == 0 and sf_diff == 0:
        return "bit-exact"
    return (f"{code_diff} of {want_codes.numel()} codes (max {_e4m3_steps(got_codes, want_codes)}"
            f" steps), {sf_diff} SF bytes differ")


def time_call(timer: GpuTimer, timed: Callable[[], Any], eager: Callable[[], Any], iters: int,
              w: Workload, copy_tbps: float) -> dict[str, Any]:
    """GPU time (kernels alone), % of the copy bandwidth, GPU time per call in
    a CUDA graph (None, and ``graph_error``, where the calls cannot be
    captured) and eager wall time per call."""
    calls = 100 if w.bytes <= runner.GRAPH_MAX_BYTES else 10
    figures: dict[str, Any] = {"gpu_us": timer.median_us(timed, iters, hide_host=True)}
    figures["pct_copy"] = 100 * w.bytes / figures["gpu_us"] / 1e3 / (copy_tbps * 1e3)
    try:
        figures["graph_us"] = torch_graph_us(timed)
    except Exception as exc:  # noqa: BLE001 - e.g. a launch on a stream capture does not see
        torch.cuda.synchronize()
        figures["graph_us"], figures["graph_error"] = None, f"{type(exc).__name__}: {exc}"[:160]
    figures["eager_us"] = eager_us(eager, calls, torch.cuda.synchronize)
    return figures


def bench_workload(w: Workload, timer: GpuTimer, peers: dict, iters: int, copy_tbps: float,
                   rng: np.random.Generator) -> dict[str, Any]:
    record: dict[str, Any] = {"op": w.op, "label": w.label, "shapes": runner._shapes_text(w),
                              "bytes": w.bytes}
    host = workload_inputs(w, rng)
    args = {name: runner._to_torch(array) for name, array in host.items()}
    # the harness's own call and check: what is timed is what `cupy-moe bench` times
    ours = runner._call(w, args)
    problem = runner._mismatch(ours, runner.reference_outputs(w, host),
                               runner._torch_to_host, runner.output_names(w),
                               runner.compared_rows(w, host))
    if problem:
        record["status"] = f"MISMATCH {problem}"
        return record
    out_kwargs = {"out": ours[0]} if len(ours) == 1 else {"out": ours[0], "out_sf": ours[1]}
    record.update(time_call(timer, lambda: runner._call(w, args, **out_kwargs),
                            lambda: runner._call(w, args), iters, w, copy_tbps))
    record["status"] = "ok"
    peer = peers.get(w.op)
    if not callable(peer):
        record["tilekernels"] = peer or "not imported"
        return record
    try:
        timed, eager = peer_call(w.op, peer, w, args)
        result = eager()
        record["tilekernels_agrees"] = agreement(w.op, w, args, result, ours)
        record["tilekernels"] = time_call(timer, timed, eager, iters, w, copy_tbps)
    except Exception as exc:  # noqa: BLE001 - the peer's failure is a figure too
        record["tilekernels"] = f"{type(exc).__name__}: {exc}"[:200]
    return record


def _cells(figures: Any) -> list[str]:
    if not isinstance(figures, dict):
        return ["-"] * 4
    graph = figures["graph_us"]
    return [f"{figures['gpu_us']:.1f}", f"{figures['pct_copy']:.1f}",
            "-" if graph is None else f"{graph:.2f}", f"{figures['eager_us']:.1f}"]


def table_row(record: dict[str, Any]) -> str:
    base = [record["op"], record["label"], record["shapes"], f"{record['bytes'] / 1e6:.2f}"]
    if record["status"] != "ok":
        return "| " + " | ".join(base + [record["status"]] + [""] * 8) + " |"
    peer = record.get("tilekernels")
    note = record.get("tilekernels_agrees", peer if isinstance(peer, str) else "-")
    ours = record if "gpu_us" in record else None
    return "| " + " | ".join(base + _cells(ours) + _cells(peer) + [note]) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=["all", *OPS], default="all")
    parser.add_argument("--workload", action="append", metavar="LABEL",
                        help="a manifest label of one of the three ops; repeat for several")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    if not torch.cuda.is_available():
        print("bench_combine_quantize: needs a CUDA GPU (torch.cuda); none here",
              file=sys.stderr)
        return 2
    ops = list(OPS) if args.op == "all" else [args.op]
    workloads = [w for op in ops for w in load_workloads(op)
                 if not args.workload or w.label in args.workload]
    unknown = set(args.workload or ()) - {w.label for w in workloads}
    if unknown:
        parser.error(f"unknown workload label(s) for {ops}: {sorted(unknown)}")
    timer = GpuTimer()
    copy_tbps = timer.copy_tbps()
    peers = tilekernels_ops()
    rng = np.random.default_rng()
    print(f"{timer.device_name}: device-to-device copy {copy_tbps:.2f} TB/s (read + write)")
    print("| op | workload | shapes | MB | GPU us | % copy | graph us/call | eager us "
          "| TK GPU us | TK % copy | TK graph us/call | TK eager us | TK vs ours |")
    print("|---" * 13 + "|")
    records = []
    for w in workloads:
        record = bench_workload(w, timer, peers, args.iters, copy_tbps, rng)
        records.append(record)
        print(table_row(record), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": timer.device_name, "copy_tbps": copy_tbps,
                       "versions": {"cupy_moe": cupy_moe.__version__,
                                    "torch": torch.__version__},
                       "records": records}, f, indent=1)
            f.write("\n")
    return 1 if any(r["status"] != "ok" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
