"""Where an expert-parallel call's host time goes: cProfile of ``dispatch``
and ``combine`` on one rank (NCCL on one GPU, or gloo on the CPU).

    python benchmarks/profile_ep_host.py [--model NAME] [--tokens T] [--calls N] [--cpu]

One process, a one-rank group (its all-to-alls are copies to itself): on a
GPU every library step runs as in a real group; what a call costs beyond the
transport is host work (the GPU waits for it), which this shows per Python
function. Prints the wall time per call (synchronised at the end of each
loop) and the top functions by own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time

import torch
import torch.distributed as dist

from cupy_moe.distributed import combine, dispatch
from cupy_moe.layer import MODELS, route


def per_call_us(call, calls: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    for _ in range(calls):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - began) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-30b-a3b")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--cpu", action="store_true", help="gloo and CPU tensors")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.cpu else "cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo" if args.cpu else "nccl", init_method=f"file://{tmp}/store",
                                rank=0, world_size=1)
        try:
            shape = MODELS[args.model]
            gen = torch.Generator(device=device).manual_seed(1)
            x = torch.randn((args.tokens, shape.hidden), generator=gen,
                            device=device).to(torch.bfloat16)
            ids, weights = route(torch.randn((args.tokens, shape.num_experts), generator=gen,
                                             device=device), shape.top_k)
            result = dispatch(x, ids, weights, shape.num_experts)

            def run_dispatch():
                return dispatch(x, ids, weights, shape.num_experts)

            def run_combine():
                return combine(result.expanded_x, result.handle)

            for call in (run_dispatch, run_combine):
                call()  # compiles, plans
                print(f"{call.__name__}: {per_call_us(call, args.calls, device):.1f} us a call "
                      f"(wall, {args.calls} calls)")
            for call in (run_dispatch, run_combine):
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(args.calls):
                    call()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                profile.disable()
                for key in ("tottime", "cumtime"):
                    text = io.StringIO()
                    pstats.Stats(profile, stream=text).sort_stats(key).print_stats(args.top)
                    print(f"--- {call.__name__}, by {key} ---")
                    print(text.getvalue())
        finally:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
