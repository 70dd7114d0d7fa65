"""Where ``fused_mapping``'s kernel spends its time, phase by phase: the
kernels compiled with ``MAP_TRACE`` record each block's SM clock at every
``MAP_PHASE`` point (kernels_cu/mapping.cu); this prints, per phase, the
cycles since the block started (median and slowest block). GPU only.

    python benchmarks/profile_mapping_phases.py [-D NAME=VALUE ...] [--cluster C] [SHAPES]

SHAPES are groups of four numbers, T K E ALIGNMENT (default: the manifest's
mapping workloads); ``-D`` adds a define to the traced build (a variant of
the kernel source, e.g. ``-D SUM_VECS=16``). The traced launch is the last
of several back to back, as in a CUDA graph (ids and code warm in the
caches). ``--cluster C``: the cooperative kernel in clusters of C blocks
(its default grid for them; sm_90+). Phases of the general kernel:
0 start, 1 counters zeroed, 2 warps counted, (in clusters: 12 past the
cluster barrier, 13 the cluster's counts added up,) 3 block totals written,
4 past the grid barrier, 10 (cooperative kernel) thread 0's column-sum loads
summed, 5 column sums (every thread's, added), 11 thread 0's first
shared counter read back (its value known), 6 expert scan, 7 slots
placed, 8 segment tails padded, 9 end; of the one-warp kernel: 0 start, 1
the warp's plan shared, 2 end. Phases print in time order.
``-D MAP_TRACE_DROP_STORES=1`` (traced builds only: the plans are wrong)
leaves out the place phase's three scattered pos-row stores, ``=2`` its
token_topk_to_pos store too: what the phase costs without them.
"""

from __future__ import annotations

import sys

import cupy
import numpy as np
import torch

from cupy_moe.harness.manifest import load_workloads
from cupy_moe.mapping import worst_case_rows
from cupy_moe.mapping.gpu import SOURCE, MappingPlan, kernel_names
from cupy_moe.mapping.launch_shape import mapping_shape
from cupy_moe.mapping.rules import MappingProblem
from cupy_moe.runtime.launch import allow_dynamic_shared, device_traits, function_handle
from cupy_moe.runtime.loader import get_module

TRACE_DEFINES = (("MAP_TRACE", 1),)
PHASES = 16        # MAP_TRACE_PHASES
TRACED_BLOCKS = 1024
LAUNCHES = 8       # back to back; the last is traced


def traced_plan(problem: MappingProblem, device: int, extra_defines: tuple = (),
                cluster: int = 0) -> tuple[MappingPlan, tuple]:
    """The default plan of ``problem`` (``cluster``: the cooperative one in
    clusters of that many blocks) with its kernels swapped for traced builds
    (with ``extra_defines`` too)."""
    shape = None
    if cluster:
        traits = device_traits(device)
        shape = mapping_shape(problem.num_slots, problem.num_experts, problem.num_expanded,
                              traits.multiprocessors, traits.shared_bytes_optin,
                              cooperative=traits.cooperative_launch, cluster_blocks=cluster)
        if shape.cluster_blocks != cluster:
            raise SystemExit(f"no clusters of {cluster} for {problem}: {shape}")
    plan = MappingPlan(problem, device, shape)
    names = kernel_names(plan.shape, problem.id_dtype)
    defines = TRACE_DEFINES + tuple(extra_defines)
    traced = []
    for name, (_, blocks, threads, shared_bytes) in zip(names, plan.launches, strict=True):
        handle = function_handle(SOURCE, defines, device, name)
        if shared_bytes > 48 * 1024:
            allow_dynamic_shared(handle, shared_bytes)
        traced.append((handle, blocks, threads, shared_bytes))
    plan.launches = traced
    return plan, defines


def profile(num_tokens: int, top_k: int, num_experts: int, alignment: int,
            extra_defines: tuple = (), cluster: int = 0) -> str:
    device = torch.cuda.current_device()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, num_experts, size=(num_tokens, top_k))
    ids[rng.random(ids.shape) < 0.02] = -1
    device_ids = torch.from_numpy(ids).cuda()
    rows = worst_case_rows(ids.size, num_experts, alignment)
    problem = MappingProblem(num_tokens, top_k, num_experts, alignment, rows, "int64")
    plan, defines = traced_plan(problem, device, extra_defines, cluster)
    module = get_module(SOURCE, defines, device)
    trace = cupy.ndarray((TRACED_BLOCKS, PHASES), dtype=cupy.int64,
                         memptr=module.get_global("map_trace"))
    buffer = torch.empty(plan.buffer_size, dtype=torch.int32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    trace.fill(-1)
    torch.cuda.synchronize()
    for _ in range(LAUNCHES):
        plan.launch(stream, device_ids.data_ptr(), buffer.data_ptr())
    torch.cuda.synchronize()
    blocks = min(plan.shape.blocks, TRACED_BLOCKS)
    clocks = cupy.asnumpy(trace[:blocks])
    kernel = kernel_names(plan.shape, problem.id_dtype)[-1].removeprefix("mapping_")[:-4]
    built = " ".join(f"{name}={value}" for name, value in extra_defines)
    lines = [f"T={num_tokens} K={top_k} E={num_experts} A={alignment} X={rows}: {kernel}, "
             f"{plan.shape.blocks} blocks x {plan.shape.threads} threads"
             + (f" in clusters of {cluster}" if cluster else "")
             + (f" [{built}]" if built else "")]
    recorded = [p for p in range(PHASES) if (clocks[:, p] >= 0).all()]
    since_start = clocks[:, recorded] - clocks[:, :1]
    # in time order: marks inside a phase (e.g. 10, inside the sums) print
    # between the phases around them
    order = np.argsort(np.median(since_start, axis=0), kind="stable")
    recorded, since_start = [recorded[i] for i in order], since_start[:, order]
    rate_mhz = cupy.cuda.runtime.getDeviceProperties(device)["clockRate"] / 1e3
    previous = 0.0
    for column, phase in enumerate(recorded):
        median = float(np.median(since_start[:, column]))
        worst = float(since_start[:, column].max())
        lines.append(f"  phase {phase}: median {median:7.0f} cycles (+{median - previous:6.0f}), "
                     f"slowest block {worst:7.0f}; {median / rate_mhz:5.2f} us at "
                     f"{rate_mhz:.0f} MHz")
        previous = median
    return "\n".join(lines)


def main() -> int:
    args, extra_defines, cluster = sys.argv[1:], [], 0
    while len(args) >= 2 and (args[0] == "-D" and "=" in args[1] or args[0] == "--cluster"):
        if args[0] == "--cluster":
            cluster = int(args[1])
        else:
            name, value = args[1].split("=", 1)
            extra_defines.append((name, int(value)))
        args = args[2:]
    try:
        numbers = [int(v) for v in args]
    except ValueError:
        numbers = [0]  # not four numbers a shape: the usage
    if len(numbers) % 4:
        usage = next(line for line in __doc__.splitlines() if "python benchmarks" in line)
        print("usage: " + usage.strip(), file=sys.stderr)
        return 2
    shapes = [tuple(numbers[i:i + 4]) for i in range(0, len(numbers), 4)] or [
        (w.num_tokens, w.top_k, w.num_experts, w.alignment)
        for w in load_workloads("fused_mapping")]
    for shape in shapes:
        try:
            print(profile(*shape, tuple(extra_defines), cluster))
        except ValueError as error:  # a grid the GPU cannot hold in clusters: the next shape
            print(f"T K E A = {' '.join(map(str, shape))}: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
