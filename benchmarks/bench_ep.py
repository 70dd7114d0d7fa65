"""Time expert-parallel dispatch and combine on N GPUs (NCCL) beside a bare
``all_to_all_single`` of the same bytes.

    torchrun --nproc-per-node N benchmarks/bench_ep.py [--model NAME ...]
        [--tokens T ...] [--iters N] [--warmup N] [--json PATH]
    torchrun --nproc-per-node 2 benchmarks/bench_ep.py --cpu --tokens 16   # smoke run
    torchrun --nproc-per-node 1 benchmarks/bench_ep.py --single-rank         # one GPU

Shapes: the models of ``cupy_moe.layer.MODELS`` (Kimi-K2: H = 7168, E = 384,
K = 8; Qwen3-30B-A3B: H = 2048, E = 128, K = 8), T tokens per rank, the
router on random logits (softmax top-K, renormalized), E / N experts a rank.
Per (model, T), on every rank:

- ``dispatch bf16``: ``dispatch(x, ids, weights, E, alignment=128)``, the
  whole call: the count exchange and its host synchronisation, the row,
  metadata all-to-alls, ``fused_mapping`` and ``expand_to_fused``.
- ``dispatch fp8``: the same with e4m3 rows and float32 scale factors (one
  per 128 channels, from ``quantize_fp8`` outside the timing).
- ``combine``: ``combine(y, handle)`` with y = the bf16 dispatch's expanded
  rows (identity experts): ``reduce_fused`` of the float32 partials, their
  all-to-all back (4 bytes an element), the rank-ordered sum.
- ``bare a2a``: one ``all_to_all_single`` of a uint8 tensor with the same
  split sizes and row bytes as the op's data (dispatch: row payload +
  metadata + scale factors; combine: the float32 partials), its splits known
  beforehand: the transport alone.
- ``counts``: the count exchange alone (an [N, 8] int64 all-to-all and its
  read on the host), the latency floor of any dispatch.

Before timing, combine(dispatch(x)) is checked against x (the weights sum to
1: within bf16 rounding), and the fp8 dispatch must give the bf16 one's plan.

Timing: per iteration a barrier (the ranks start together), then CUDA events
around the call on the current stream (the GPU time from the call's first
launch to its last, host synchronisations included), ``--warmup`` untimed
calls first (NCCL set-up, NVRTC compiles); per rank the median of
``--iters``, and the table shows the slowest rank's. No L2 flush: the
all-to-alls, not cache hits, dominate. GB/s: the bytes a rank sends to other
ranks (its self-share is a local copy), averaged over ranks, per second of
that time. ``--cpu`` runs the same program on CPU tensors over gloo with wall
clock timing: a check that the program runs, not a measurement.

``--single-rank``: one process on one GPU over NCCL (where only one GPU is
lent). Nothing leaves the rank (its all-to-alls are copies to itself, GB/s
is 0), so the times are each call's fixed cost beside the transport's: the
count exchange and its host synchronisation, the plan, the expand, the
reduce; not the issue's bandwidth figure.

Exits 2 where fewer than 2 GPUs are visible (without ``--cpu`` or
``--single-rank``) or the program was not started by torchrun with 2 or
more processes (1 with ``--single-rank``), 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from cupy_moe import quantize_fp8
from cupy_moe.distributed import combine, dispatch
from cupy_moe.layer import MODELS, relative_error, route

DEFAULT_TOKENS = (128, 512, 4096)
ALIGNMENT = 128
NUM_PER_CHANNELS = 128
ROUNDTRIP_TOLERANCE = 2.0 ** -7  # combine(dispatch(x)) against x: a few bf16 roundings


def fail(message: str, code: int) -> None:
    print(f"bench_ep: {message}", file=sys.stderr)
    raise SystemExit(code)


def setup(cpu: bool, single_rank: bool = False) -> tuple[int, int, torch.device]:
    """Join the group torchrun describes: (rank, world size, device)."""
    least = 1 if single_rank else 2
    if not cpu:
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible < least:
            fail(f"needs at least {least} GPU(s), {visible} visible: expert parallelism over "
                 "NCCL (use --cpu for a gloo smoke run on CPUs)", 2)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        fail(f"start it with torchrun --nproc-per-node N benchmarks/bench_ep.py "
             f"(N >= {least})", 2)
    world = int(os.environ["WORLD_SIZE"])
    if single_rank and world != 1:
        fail(f"--single-rank takes one process; torchrun started {world}", 2)
    if world < least:
        fail(f"needs 2 or more processes; torchrun started {world} (--single-rank: one "
             "process on one GPU)", 2)
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    if cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        if local_rank >= torch.cuda.device_count():
            fail(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible)", 2)
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    return dist.get_rank(), dist.get_world_size(), device


def barrier(device: torch.device) -> None:
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def time_us(call: Callable[[], Any], device: torch.device, iters: int, warmup: int) -> float:
    """This rank's median time of ``call`` in microseconds (module docstring)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iters):
        barrier(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            began = time.perf_counter()
            call()
            times.append((time.perf_counter() - began) * 1e6)
    return statistics.median(times)


def slowest(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def mean_over_ranks(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item()) / dist.get_world_size()


def bare_all_to_all(send_splits: tuple[int, ...], recv_splits: tuple[int, ...],
                    row_bytes: int, device: torch.device) -> Callable[[], Any]:
    """One all_to_all_single of uint8 rows with these splits (buffers made once)."""
    send = torch.randint(0, 256, (sum(send_splits), row_bytes), dtype=torch.uint8,
                         device=device)
    recv = torch.empty((sum(recv_splits), row_bytes), dtype=torch.uint8, device=device)

    def call():
        dist.all_to_all_single(recv, send, output_split_sizes=list(recv_splits),
                               input_split_sizes=list(send_splits))
    return call


def count_exchange(world: int, device: torch.device) -> Callable[[], Any]:
    """The count exchange alone: an [R, 8] int64 all-to-all read on the host."""
    header = torch.ones((world, 8), dtype=torch.int64, device=device)
    received = torch.empty_like(header)

    def call():
        dist.all_to_all_single(received, header)
        return received.tolist()
    return call


def off_rank_bytes(splits: tuple[int, ...], rank: int, row_bytes: int) -> int:
    return sum(count for dest, count in enumerate(splits) if dest != rank) * row_bytes


def bench_shape(model: str, tokens: int, rank: int, world: int, device: torch.device,
                iters: int, warmup: int) -> list[dict[str, Any]]:
    shape = MODELS[model]
    hidden, experts, top_k = shape.hidden, shape.num_experts, shape.top_k
    if experts % world:
        if rank == 0:
            print(f"skipping {model}: E = {experts} is not a multiple of {world} ranks",
                  file=sys.stderr)
        return []
    gen = torch.Generator(device=device).manual_seed(1000 * rank + tokens)
    x = torch.randn((tokens, hidden), generator=gen, device=device).to(torch.bfloat16)
    logits = torch.randn((tokens, experts), generator=gen, device=device)
    ids, weights = route(logits, top_k)
    x8, x_sf = quantize_fp8(x, num_per_channels=NUM_PER_CHANNELS)

    def run_bf16():
        return dispatch(x, ids, weights, experts, alignment=ALIGNMENT)

    def run_fp8():
        return dispatch(x8, ids, weights, experts, x_sf=x_sf, alignment=ALIGNMENT,
                        num_per_channels=NUM_PER_CHANNELS)

    # checks, before any timing
    bf16 = run_bf16()
    handle = bf16.handle
    roundtrip = combine(bf16.expanded_x, handle)
    error = relative_error(roundtrip, x) if tokens else 0.0
    fp8_plan = run_fp8().handle.plan
    same_plan = torch.equal(fp8_plan.token_topk_to_pos, handle.plan.token_topk_to_pos)
    ok = torch.tensor([1.0 if error <= ROUNDTRIP_TOLERANCE and same_plan else 0.0],
                      device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() != 1.0:
        fail(f"{model} T={tokens}: rank {rank}: combine(dispatch(x)) is {error:.3g} from x "
             f"(limit {ROUNDTRIP_TOLERANCE:.3g}), fp8 plan equal: {same_plan}", 1)

    meta_bytes = (2 * top_k + 1) * 4
    sf_bytes = x_sf.shape[1] * 4
    phases = {
        "dispatch bf16": (run_bf16, handle.send_splits, handle.recv_splits,
                          hidden * 2 + meta_bytes),
        "dispatch fp8": (run_fp8, handle.send_splits, handle.recv_splits,
                         hidden + sf_bytes + meta_bytes),
        "combine": (lambda: combine(bf16.expanded_x, handle), handle.recv_splits,
                    handle.send_splits, hidden * 4),
    }
    counts_us = slowest(time_us(count_exchange(world, device), device, iters, warmup), device)
    records = []
    for phase, (call, send_splits, recv_splits, row_bytes) in phases.items():
        ours = slowest(time_us(call, device, iters, warmup), device)
        bare_call = bare_all_to_all(send_splits, recv_splits, row_bytes, device)
        bare = slowest(time_us(bare_call, device, iters, warmup), device)
        sent = mean_over_ranks(off_rank_bytes(send_splits, rank, row_bytes), device)
        records.append({
            "model": model, "tokens_per_rank": tokens, "ranks": world, "phase": phase,
            "hidden": hidden, "experts": experts, "top_k": top_k,
            "rows_sent_per_rank": mean_over_ranks(sum(send_splits), device),
            "off_rank_mb_per_rank": sent / 1e6, "us": ours, "bare_us": bare,
            "gbps": sent / ours / 1e3 if ours else 0.0,
            "bare_gbps": sent / bare / 1e3 if bare else 0.0,
            "counts_us": counts_us if phase.startswith("dispatch") else None,
            "roundtrip_error": error,
        })
        del bare_call
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return records


def table(records: list[dict[str, Any]], device_name: str) -> str:
    ranks = records[0]["ranks"] if records else "?"
    title = (f"Expert-parallel dispatch / combine on {device_name}, {ranks} ranks; time = the "
             "slowest rank's median; GB/s = off-rank bytes a rank sends per second.")
    header = ("| model | T/rank | phase | rows sent/rank | off-rank MB/rank | µs | bare a2a µs "
              "| GB/s | bare GB/s | × bare | counts µs |")
    lines = [title, "", header, "|---" * 11 + "|"]
    for r in records:
        ratio = r["us"] / r["bare_us"] if r["bare_us"] else float("nan")
        counts = "-" if r["counts_us"] is None else f"{r['counts_us']:.1f}"
        lines.append(f"| {r['model']} | {r['tokens_per_rank']} | {r['phase']} | "
                     f"{r['rows_sent_per_rank']:.0f} | {r['off_rank_mb_per_rank']:.2f} | "
                     f"{r['us']:.1f} | {r['bare_us']:.1f} | {r['gbps']:.1f} | "
                     f"{r['bare_gbps']:.1f} | {ratio:.2f} | {counts} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(DEFAULT_TOKENS),
                        help="tokens per rank")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write the records (rank 0)")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU tensors over gloo, wall clock: a smoke run, not a benchmark")
    parser.add_argument("--single-rank", action="store_true",
                        help="one process on one GPU over NCCL: each call's fixed cost, "
                             "no off-rank traffic")
    args = parser.parse_args(argv)
    rank, world, device = setup(args.cpu, args.single_rank)
    try:
        records = []
        with torch.no_grad():
            for model in args.model:
                for tokens in args.tokens:
                    records += bench_shape(model, tokens, rank, world, device, args.iters,
                                           args.warmup)
        if rank == 0:
            name = ("CPU (gloo, wall clock: not a measurement)" if args.cpu
                    else torch.cuda.get_device_name(device))
            print(table(records, name))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"device": name, "ranks": world, "records": records}, f,
                              indent=1)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
