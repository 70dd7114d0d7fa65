"""Run one manifest workload's op a few times on the GPU, for a profiler (ncu)
to pick a launch. GPU only.

    python benchmarks/profile_op.py LABEL [CALLS] [--combine-shape NAME=VALUE ...]
                                    [--quantize-tuning NAME=VALUE ...] [--tilekernels]

e.g. the SwiGLU-quantize kernel of Kimi-K2 prefill, its 3rd launch:

    ncu --set full --kernel-name regex:swiglu --launch-skip 2 --launch-count 1 \\
        -o swiglu python benchmarks/profile_op.py swiglu-kimi-k2-prefill-e384-plan-col-major
    python benchmarks/ncu_top_sass.py swiglu.ncu-rep

The inputs are the bench's (random payload, the workload's plan), on torch
CUDA tensors with preallocated outputs; nothing is checked here (the bench
and the tests do that). ``--combine-shape`` (reduce_fused workloads only):
launch-shape options of ``combine.launch_shape.combine_shape``, as
sweep_combine.py names them, e.g. ``--combine-shape vecs_per_thread=2
max_warps=4 bulk_stages=4`` for the bulk layout. ``--quantize-tuning`` (quantize_fp8 and
swiglu_quantize_fp8 workloads): fields of ``quantize.launch_shape.QuantizeTuning``,
e.g. ``--quantize-tuning narrow_live_rows=1073741824 block_rows_from_bytes=inf``
for ``*_vec1`` on every call. ``--tilekernels``
(reduce_fused, quantize_fp8 and swiglu_quantize_fp8 workloads): DeepSeek
TileKernels' op on the same inputs instead of ours, called as
bench_combine_quantize.py calls it (its sources importable:
benchmarks/peer_setup.sh with .peers/tile_kernels/ carried), for a profile
beside ours.
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np
import torch

from cupy_moe.harness import runner
from cupy_moe.harness.inputs import workload_inputs
from cupy_moe.harness.manifest import ALL_OP_NAMES, load_workloads


def shape_option(text: str) -> tuple[str, object]:
    """NAME=VALUE, the value an int, a float or True / False."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE; got {text!r}")
    if value in ("True", "False"):
        return name, value == "True"
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"{name}: expected a number, True or False; got {value!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("label")
    parser.add_argument("calls", type=int, nargs="?", default=4)
    parser.add_argument("--combine-shape", type=shape_option, nargs="+", default=[],
                        metavar="NAME=VALUE")
    parser.add_argument("--quantize-tuning", type=shape_option, nargs="+", default=[],
                        metavar="NAME=VALUE")
    parser.add_argument("--tilekernels", action="store_true",
                        help="TileKernels' op (reduce_fused, per_token_cast, "
                             "swiglu_forward_and_per_token_cast) instead of ours")
    args_in = parser.parse_args()
    workloads = {w.label: w for op in ALL_OP_NAMES for w in load_workloads(op)}
    if args_in.label not in workloads:
        parser.error(f"unknown workload {args_in.label!r}")
    w = workloads[args_in.label]
    if args_in.combine_shape and w.op != "reduce_fused":
        parser.error(f"--combine-shape is for reduce_fused workloads; {w.label} is {w.op}")
    if args_in.quantize_tuning and w.op not in ("quantize_fp8", "swiglu_quantize_fp8"):
        parser.error(f"--quantize-tuning is for quantize_fp8 and swiglu_quantize_fp8 "
                     f"workloads; {w.label} is {w.op}")
    if args_in.quantize_tuning:
        from cupy_moe.quantize.launch_shape import QuantizeTuning

        try:
            tuning = QuantizeTuning(**dict(args_in.quantize_tuning))
        except (TypeError, ValueError) as error:  # an unknown field, a bad value
            parser.error(f"--quantize-tuning: {error}")
    if args_in.tilekernels:
        # the bench's TileKernels calls (a sibling script: this one's folder is on sys.path)
        from bench_combine_quantize import PEERS, peer_call, tilekernels_ops

        if w.op not in PEERS:
            parser.error(f"--tilekernels is for {', '.join(PEERS)} workloads; "
                         f"{w.label} is {w.op}")
    host = workload_inputs(w, np.random.default_rng(0))
    args = {name: runner._to_torch(array) for name, array in host.items()}
    if args_in.tilekernels:
        peer = tilekernels_ops()[w.op]
        if isinstance(peer, str):
            parser.error(f"TileKernels' {PEERS[w.op][1]} cannot be imported: {peer}")
        timed, _ = peer_call(w.op, peer, w, args)
        for _ in range(args_in.calls):
            timed()
        torch.cuda.synchronize()
        return 0
    if args_in.combine_shape:
        from cupy_moe.combine.api import run_with_shape

        shaped = functools.partial(run_with_shape, **dict(args_in.combine_shape))
        call = functools.partial(runner._call_newer, w, shaped)
    elif args_in.quantize_tuning:
        from cupy_moe.quantize.api import run_with_tuning

        tuned = functools.partial(run_with_tuning, tuning, w.op)
        call = functools.partial(runner._call_newer, w, tuned)
    else:
        call = functools.partial(runner._call, w)
    results = call(args)
    kwargs = {}
    if w.op not in runner.MAPPING_OP_NAMES:  # fused_mapping has no out=
        out = results[0] if len(results) == 1 else results
        kwargs = {"out": out} if len(results) == 1 else {"out": out[0], "out_sf": out[1]}
    for _ in range(args_in.calls):
        call(args, **kwargs)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
