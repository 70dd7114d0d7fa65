"""Time ``fused_mapping`` on the GPU, decode to prefill, beside TileKernels'
``get_fused_mapping`` when it can be imported. GPU only.

    python benchmarks/bench_fused_mapping.py [--iters N] [--json PATH] [--sweep]
                                             [--clusters] [--only LABEL ...]

Per shape, torch int64 ids (what ``torch.topk`` returns), about 2% dropped:
the plan is first checked bit-identical to the NumPy oracle, then timed: GPU
time (median of CUDA-event timings, L2 flushed between them, the GPU kept
busy ~50 us before each so that the host's launch work is queued before the
start event: the kernels' time alone), the same without that spin (the GPU
waits for the host: what an isolated eager call costs the GPU), GPU time per
call replaying a CUDA graph of 100 calls, and eager wall time per call
(allocation included). TileKernels' op (``source benchmarks/peer_setup.sh``
makes it importable) is timed the same way with the same X and no host sync;
its plan is checked against ours where the two contracts agree (the rows each
expert owns; TileKernels orders an expert's slots differently and counts
aligned rows in ``tokens_per_expert``). ``--sweep`` also times other launch
shapes of our kernels (per call in a CUDA graph of kernel launches alone,
preallocated buffer); ``--clusters`` times, the same way, the cooperative
kernel of 8-warp blocks on 16 to 128 blocks, plain and in clusters of 2, 4
and 8 blocks (``MappingShape.cluster_blocks``, sm_90+), beside the default
plan, where the slots are too many for one self-counting launch. ``--only``:
these shapes alone (labels without "mapping-").
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

import cupy_moe
from cupy_moe.harness.manifest import load_workloads
from cupy_moe.harness.timing import GpuTimer, eager_us, torch_graph_us
from cupy_moe.mapping import fused_mapping_numpy, worst_case_rows

# (label, T, K, E, alignment): the manifest's fused_mapping workloads, named
# without their "mapping-" prefix
SHAPES = [(w.label.removeprefix("mapping-"), w.num_tokens, w.top_k, w.num_experts, w.alignment)
          for w in load_workloads("fused_mapping")]


def tilekernels_op():
    """TileKernels' get_fused_mapping, or None where it cannot be imported."""
    try:
        from tile_kernels.moe.get_fused_mapping_kernel import get_fused_mapping
    except Exception as exc:  # noqa: BLE001 - any import failure: no peer column
        print(f"TileKernels not timed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return get_fused_mapping


def tilekernels_agrees(peer_outputs, ours) -> str:
    """Where TileKernels' plan and ours must agree: the expert of every row,
    each expert's first row, and the set of rows each slot maps to."""
    pos_to_expert, _, _, token_topk_to_pos, expert_start = peer_outputs[:5]
    if not torch.equal(pos_to_expert, ours.pos_to_expert):
        return "pos_to_expert differs"
    if not torch.equal(expert_start, ours.expert_start):
        return "expert_start differs"
    if not torch.equal(token_topk_to_pos.flatten().sort().values,
                       ours.token_topk_to_pos.flatten().sort().values):
        return "the rows of the slots differ"
    return "agrees"


def sweep_shapes(device_ids, num_experts, alignment, rows, iters):
    """Other launch shapes of our kernels, each checked bit-identical first:
    {shape text: us per call replaying a CUDA graph of kernel launches alone
    (preallocated buffer)}."""
    from cupy_moe.mapping.gpu import MappingPlan
    from cupy_moe.mapping.launch_shape import (
        COOP_MAX_WARPS,
        WARP_PLAN_MAX_SLOTS,
        mapping_shape,
    )
    from cupy_moe.mapping.rules import MappingProblem
    from cupy_moe.runtime.launch import device_traits

    num_tokens, top_k = device_ids.shape
    slots = num_tokens * top_k
    problem = MappingProblem(num_tokens, top_k, num_experts, alignment, rows, "int64")
    traits = device_traits(device_ids.device.index)
    base = mapping_shape(slots, num_experts, rows, traits.multiprocessors,
                         traits.shared_bytes_optin, cooperative=traits.cooperative_launch)
    default_overlap = MappingPlan(problem, device_ids.device.index, base).overlap
    expected = fused_mapping_numpy(device_ids.cpu().numpy(), num_experts, alignment=alignment,
                                   num_expanded=rows)
    times = {}
    for warps in sorted({4, 8, 16, 32, base.warps}):
        for blocks in sorted({1, max(1, base.blocks // 2), base.blocks, base.blocks * 2,
                              min(base.blocks * 4, 132), 132}):
            for mode in ("warp", "self", "counts", "overlap", "coop"):
                if mode == "warp" and (slots > WARP_PLAN_MAX_SLOTS or warps > 8):
                    continue
                if mode == "self" and slots > 65536:
                    continue
                if mode == "coop" and (blocks > traits.multiprocessors or warps > COOP_MAX_WARPS
                                       or not traits.cooperative_launch):
                    continue
                if mode != "warp" and warps < 8:
                    continue
                shape = mapping_shape(slots, num_experts, rows, traits.multiprocessors,
                                      traits.shared_bytes_optin, warps=warps, blocks=blocks,
                                      one_warp=mode == "warp")
                if mode != "warp":
                    shape = shape._replace(self_counting=mode == "self",
                                           cooperative=mode == "coop",
                                           count_split=1 if mode == "coop"
                                           else shape.count_split)
                overlap = mode == "overlap"
                plan = MappingPlan(problem, device_ids.device.index, shape, overlap)
                default = shape == base and overlap == default_overlap
                text = f"w{warps} b{blocks} {mode}{' (default)' if default else ''}"
                times[text] = checked_graph_us(plan, device_ids, expected)
    return times


def checked_graph_us(plan, device_ids, expected) -> float:
    """``plan``'s launches on ``device_ids`` (a preallocated buffer), checked
    bit-identical to ``expected`` (the oracle's plan) first: us per call
    replaying a CUDA graph of them."""
    buffer = torch.empty(plan.buffer_size, dtype=torch.int32, device="cuda")

    def launch():
        plan.launch(torch.cuda.current_stream().cuda_stream, device_ids.data_ptr(),
                    buffer.data_ptr())

    launch()
    if any(not np.array_equal(got.cpu().numpy(), want)
           for got, want in zip(plan.torch_views(buffer), expected, strict=True)):
        raise AssertionError(f"shape {plan.shape} gives a different plan")
    return torch_graph_us(launch)


def cluster_shapes(device_ids, num_experts, alignment, rows):
    """The default plan, and the cooperative kernel of 8-warp blocks on 16 to
    128 blocks, plain and in clusters of 2, 4 and 8 (also where the default
    takes two launches: the medium batches), each plan checked bit-identical
    first: {shape text: us per call replaying a CUDA graph of kernel launches
    alone (preallocated buffer)}; a grid the GPU cannot hold in clusters says
    so instead of a time. Empty before sm_90, without cooperative launches,
    or where every block counts all slots itself (a single launch)."""
    from cupy_moe.mapping.gpu import MappingPlan
    from cupy_moe.mapping.launch_shape import (
        CLUSTER_SIZES,
        COOP_MAX_BLOCK_SLOTS,
        MEDIUM_WARPS,
        SELF_COUNT_MAX_SLOTS,
        MappingShape,
        mapping_shape,
        place_shared_bytes,
    )
    from cupy_moe.mapping.rules import MappingProblem
    from cupy_moe.runtime.launch import device_traits

    num_tokens, top_k = device_ids.shape
    slots = num_tokens * top_k
    device = device_ids.device.index
    traits = device_traits(device)
    if traits.major < 9 or not traits.cooperative_launch or slots <= SELF_COUNT_MAX_SLOTS:
        return {}
    problem = MappingProblem(num_tokens, top_k, num_experts, alignment, rows, "int64")
    base = mapping_shape(slots, num_experts, rows, traits.multiprocessors,
                         traits.shared_bytes_optin, cooperative=True)
    expected = fused_mapping_numpy(device_ids.cpu().numpy(), num_experts, alignment=alignment,
                                   num_expanded=rows)
    kind = ("coop" if base.cooperative else "self-counting" if base.self_counting
            else "two launches")
    shapes = {f"default (b{base.blocks} {kind})": base}
    warps = MEDIUM_WARPS
    for cluster in (0, *CLUSTER_SIZES):
        for blocks in (16, 32, 64, 128):
            warp_slots = 32 * max(1, -(-slots // (32 * blocks * warps)))
            if (blocks > traits.multiprocessors or blocks % max(1, cluster)
                    or max(1, cluster) * warps * warp_slots > COOP_MAX_BLOCK_SLOTS):
                continue
            shape = MappingShape(warps, blocks, warp_slots, False,
                                 place_shared_bytes(warps, num_experts, cluster), 1, True,
                                 cluster_blocks=cluster)
            if shape != base:
                shapes[f"b{blocks} " + (f"c{cluster}" if cluster else "coop")] = shape
    times = {}
    for text, shape in shapes.items():
        try:
            times[text] = checked_graph_us(MappingPlan(problem, device, shape), device_ids,
                                           expected)
        except AssertionError:
            raise
        except Exception as error:  # noqa: BLE001 - a refused grid or launch is a figure too
            times[text] = f"{type(error).__name__}: {error}"[:160]
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--sweep", action="store_true", help="time other launch shapes too")
    parser.add_argument("--clusters", action="store_true",
                        help="time the cooperative kernel in clusters too")
    parser.add_argument("--only", nargs="+", metavar="LABEL", help="these shapes alone")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    shapes = SHAPES
    if args.only:
        unknown = sorted(set(args.only) - {shape[0] for shape in SHAPES})
        if unknown:
            parser.error(f"no shape {', '.join(unknown)}; the shapes: "
                         + ", ".join(shape[0] for shape in SHAPES))
        shapes = [shape for shape in SHAPES if shape[0] in args.only]
    timer = GpuTimer()
    rng = np.random.default_rng()
    peer = tilekernels_op()
    records = []
    print("| shape | T | K | E | A | X | GPU us | GPU+host us | graph us/call | eager us | "
          "TileKernels GPU us | TK graph us/call | TK eager us | TK plan |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, num_tokens, top_k, num_experts, alignment in shapes:
        ids = rng.integers(0, num_experts, size=(num_tokens, top_k))
        ids[rng.random(ids.shape) < 0.02] = -1
        device_ids = torch.from_numpy(ids).cuda()
        rows = worst_case_rows(ids.size, num_experts, alignment)
        plan = cupy_moe.fused_mapping(device_ids, num_experts, alignment=alignment)
        expected = fused_mapping_numpy(ids, num_experts, alignment=alignment, num_expanded=rows)
        for name, got, want in zip(plan._fields, plan, expected, strict=True):
            if not np.array_equal(got.cpu().numpy(), want):
                print(f"MISMATCH in {name} for {label}", file=sys.stderr)
                return 1

        def call(device_ids=device_ids, num_experts=num_experts, alignment=alignment):
            return cupy_moe.fused_mapping(device_ids, num_experts, alignment=alignment)

        record = {"label": label, "num_tokens": num_tokens, "top_k": top_k,
                  "num_experts": num_experts, "alignment": alignment, "num_expanded": rows,
                  "gpu_us": timer.median_us(call, args.iters, hide_host=True),
                  "gpu_with_host_us": timer.median_us(call, args.iters),
                  "graph_us": torch_graph_us(call),
                  "eager_us": eager_us(call, 100, torch.cuda.synchronize)}
        peer_cells = ["-"] * 4
        if peer is not None:
            def peer_call(device_ids=device_ids, num_experts=num_experts, rows=rows,
                          alignment=alignment):
                return peer(device_ids, num_experts, rows, alignment, force_no_sync=True)
            try:
                record["tilekernels_plan"] = tilekernels_agrees(peer_call(), plan)
                record["tilekernels_gpu_us"] = timer.median_us(peer_call, args.iters,
                                                               hide_host=True)
                record["tilekernels_graph_us"] = torch_graph_us(peer_call)
                record["tilekernels_eager_us"] = eager_us(peer_call, 100, torch.cuda.synchronize)
                peer_cells = [f"{record['tilekernels_gpu_us']:.1f}",
                              f"{record['tilekernels_graph_us']:.2f}",
                              f"{record['tilekernels_eager_us']:.1f}",
                              record["tilekernels_plan"]]
            except Exception as exc:  # noqa: BLE001 - the peer's failure is a figure too
                record["tilekernels_error"] = f"{type(exc).__name__}: {exc}"[:200]
                peer_cells = ["error"] * 3 + [record["tilekernels_error"][:60]]
        if args.sweep:
            record["sweep_graph_us"] = sweep_shapes(device_ids, num_experts, alignment, rows,
                                                    args.iters)
        if args.clusters:
            record["cluster_graph_us"] = cluster_shapes(device_ids, num_experts, alignment, rows)
        records.append(record)
        print(f"| {label} | {num_tokens} | {top_k} | {num_experts} | {alignment} | {rows} | "
              f"{record['gpu_us']:.1f} | {record['gpu_with_host_us']:.1f} | "
              f"{record['graph_us']:.2f} | {record['eager_us']:.1f} | "
              + " | ".join(peer_cells) + " |", flush=True)
    if args.sweep:
        print("\nus per call in a CUDA graph of kernel launches, by launch shape (warps per "
              "block, blocks, counting):")
        for record in records:
            best = min(record["sweep_graph_us"].items(), key=lambda item: item[1])
            cells = ", ".join(f"{k}: {v:.2f}" for k, v in record["sweep_graph_us"].items())
            print(f"- {record['label']}: best {best[0]} {best[1]:.1f}; {cells}")
    if args.clusters:
        print("\nus per call in a CUDA graph of kernel launches, the cooperative kernel plain "
              "and in clusters (blocks, cluster size):")
        for record in records:
            if record["cluster_graph_us"]:
                cells = ", ".join(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}"
                                  for k, v in record["cluster_graph_us"].items())
                print(f"- {record['label']}: {cells}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": timer.device_name, "versions": {
                "cupy_moe": cupy_moe.__version__, "torch": torch.__version__},
                "records": records}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
