"""Padding-row zero-fill that reads the map first, against memset (issue 13).

The zero kernel (expand.cu's ``expand_zero_padding_rows``) runs at ~85% of
memset speed on the padding-heavy plans, where the same store patterns with
no map reach 97-103% (results/zero_fill_sweep.md). ncu (forty-seventh
session) put a third of its stall samples on the compare that waits for
the map word. This probe times, on plan-like layouts (segments of 128 rows,
each starting with a few data rows, the rest padding), the kernels of
benchmarks/zero_map_probe.cu: the zero kernel's pattern, the seed's (a
block a row), and persistent ones that load the next row's word before
this row's stores; each with the map read and with the answer known (no
load), beside a memset of the padding bytes. GPU time: CUDA events, L2
flushed, the host hidden (the GPU spins first), median of ``--iters``; or
with ``--graph`` per call in replays of a CUDA graph of 100 calls (torch's
capture, L2 not flushed: bench_expand_seed.py's ``--graph``; needs torch).

Every kernel is checked first on a poisoned buffer: padding rows zero,
data rows untouched.

    PYTHONPATH=. python3 benchmarks/zero_map_probe.py [--graph] [--shape LABEL ...]
        --md OUT.md --json OUT.json
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
from probe_report import cupy_stream, finish, stream_of_the_timer

SOURCE = pathlib.Path(__file__).with_name("zero_map_probe.cu")
SEGMENT = 128  # the plans' alignment: each expert's rows padded to 128

# (label, 16-byte vectors a row, segments, data rows a segment): the plan
# workloads' row sizes and padding shares (Qwen3-30B bf16 6 KiB rows,
# Kimi-K2 14 KiB; T = 32, K = 8 over 116 or 186 experts, an EP8 rank's 24;
# T = 512 on an EP8 rank: 516 slots over 32 experts)
SHAPES = [
    ("qwen3-like e128", 384, 116, 2),
    ("qwen3-like e384", 384, 186, 1),
    ("qwen3-like ep8", 384, 24, 1),
    ("qwen3-like ep8 medium", 384, 32, 16),
    ("kimi-k2-like e128", 896, 116, 2),
]


def variants() -> list[tuple[str, str, str, int | None]]:
    """(name, template, grid kind, blocks an SM of a persistent grid or None)
    for each kernel launch to time."""
    out = []
    for mapped in ("true", "false"):
        tag = "" if mapped == "true" else ", no map"
        out += [
            (f"zero kernel: 256 thr, ~16 KiB a block, .cs{tag}",
             f"rows_by_block<256, 1, {mapped}>", "rows", None),
            (f"zero kernel: 256 thr, ~16 KiB a block, plain{tag}",
             f"rows_by_block<256, 0, {mapped}>", "rows", None),
            (f"a block a row: 64 thr{tag}", f"row_a_block<64, 0, {mapped}>", "row", None),
            (f"a block a row: 32 thr{tag}", f"row_a_block<32, 0, {mapped}>", "row", None),
            (f"persistent warps, next word first: 8 blocks an SM{tag}",
             f"rows_by_warp_pipelined<0, {mapped}>", "persist", 8),
            (f"persistent blocks, next word first: 8 blocks an SM{tag}",
             f"rows_by_block_pipelined<0, {mapped}>", "persist", 8),
        ]
    out += [
        ("a block a row: 128 thr", "row_a_block<128, 0, true>", "row", None),
        ("a block a row: 256 thr", "row_a_block<256, 0, true>", "row", None),
        ("persistent warps, next word first: 4 blocks an SM",
         "rows_by_warp_pipelined<0, true>", "persist", 4),
        ("persistent blocks, next word first: 4 blocks an SM",
         "rows_by_block_pipelined<0, true>", "persist", 4),
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--md", type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--graph", action="store_true",
                        help="time per call in replays of a CUDA graph of 100 calls")
    parser.add_argument("--shape", action="append", default=[],
                        help="only the shape of this label (repeatable)")
    args = parser.parse_args(argv)
    unknown = set(args.shape) - {label for label, *_ in SHAPES}
    if unknown:
        parser.error(f"unknown shapes {sorted(unknown)}; known: {[s[0] for s in SHAPES]}")
    shapes = [s for s in SHAPES if not args.shape or s[0] in args.shape]

    import cupy

    from cupy_moe.harness.timing import GpuTimer, WarmTimer

    timer = WarmTimer() if args.graph else GpuTimer()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    sms = int(props["multiProcessorCount"])
    names = [template for _, template, _, _ in variants()]
    module = cupy.RawModule(code=SOURCE.read_text(), options=("-std=c++17",),
                            name_expressions=names)
    on_stream = stream_of_the_timer(args.graph)
    records = []
    for label, n_vec, segments, data_rows in shapes:
        x_rows = segments * SEGMENT
        row_bytes = n_vec * 16
        in_segment = np.arange(x_rows) % SEGMENT
        pos_to_expert = np.where(in_segment < data_rows, np.arange(x_rows) // SEGMENT, -1)
        padding = pos_to_expert < 0
        zero_bytes = int(padding.sum()) * row_bytes
        map_gpu = cupy.asarray(pos_to_expert.astype(np.int32))
        out = cupy.empty((x_rows, row_bytes), dtype=cupy.uint8)
        scratch = cupy.empty(zero_bytes, dtype=cupy.uint8)
        memset_us = timer.median_us(
            on_stream(lambda stream: cupy.cuda.runtime.memsetAsync(scratch.data.ptr, 0,
                                                                   zero_bytes, stream)),
            args.iters, hide_host=True)
        rows_a_block = max(1, 16384 // row_bytes)  # the zero kernel's ~16 KiB blocks
        record = {"shape": label, "row_bytes": row_bytes, "x_rows": x_rows,
                  "padding_rows": int(padding.sum()), "zero_bytes": zero_bytes,
                  "memset_us": memset_us, "variants": {}}
        for name, template, kind, per_sm in variants():
            kernel = module.get_function(template)
            threads = int(template.split("<")[1].split(",")[0]) if kind != "persist" else 256
            common = (out, map_gpu, np.int32(data_rows), np.int32(x_rows), np.int32(n_vec))
            if kind == "rows":
                grid = -(-x_rows // rows_a_block)
                launch_args = (*common, np.int32(rows_a_block), np.int32(SEGMENT))
            elif kind == "row":
                grid = x_rows
                launch_args = (*common, np.int32(SEGMENT))
            else:
                grid = sms * per_sm
                launch_args = (*common, np.int32(SEGMENT))

            def launch(stream, kernel=kernel, grid=grid, threads=threads,
                       launch_args=launch_args):
                with cupy_stream(stream):
                    kernel((grid,), (threads,), launch_args)

            run = on_stream(launch)

            out.fill(0xFF)
            run()
            got = cupy.asnumpy(out)
            ok = bool((got[padding] == 0).all() and (got[~padding] == 0xFF).all())
            us = timer.median_us(run, args.iters, hide_host=True) if ok else float("nan")
            record["variants"][name] = {"us": us, "grid": grid, "threads": threads, "ok": ok}
        records.append(record)
        print(f"{label}: memset {memset_us:.2f} us", file=sys.stderr)

    timing = ("per call in replays of a CUDA graph of 100 calls, L2 not flushed"
              if args.graph else
              f"CUDA events, L2 flushed, host hidden, median of {args.iters}")
    lines = [f"# Zero-fill after the map, against memset ({timer.device_name})", "",
             f"{timing}. "
             "% memset: the memset's time of the padding bytes over the variant's "
             "(100 = memset speed). Segments of 128 rows, each starting with its data "
             "rows; every variant checked on a poisoned buffer first.", ""]
    header = "| variant | " + " | ".join(
        f"{r['shape']} ({r['zero_bytes'] / 1e6:.1f} MB)" for r in records) + " |"
    lines += [header, "|---|" + "---|" * len(records)]
    lines.append("| memset of the padding bytes | " + " | ".join(
        f"{r['memset_us']:.2f} µs" for r in records) + " |")
    for name in records[0]["variants"]:
        cells = []
        for r in records:
            v = r["variants"][name]
            cells.append("WRONG" if not v["ok"] else
                         f"{v['us']:.2f} µs, {100 * r['memset_us'] / v['us']:.1f}%")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return finish("\n".join(lines) + "\n", args.md, args.json,
                  {"device": timer.device_name, "graph": args.graph, "records": records})


if __name__ == "__main__":
    sys.exit(main())
