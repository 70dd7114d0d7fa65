"""Time the experimental scatter kernels of prefill_variants.cu against the
library on the prefill workloads: % of the same-run copy bandwidth. GPU only.

    python benchmarks/prefill_variants.py [--iters N]

Each variant's output is first checked bit-exact against the library's
(output poisoned before the run). The memset row is the write-only ceiling
of a contiguous region of the output's size. Decode and small shapes report
GPU µs per call from CUDA-graph replays (as `cupy-moe bench` does).
"""

from __future__ import annotations

import argparse
import ctypes
import pathlib
import struct
import sys

import cupy
import numpy as np
import torch
from cupy.cuda import driver

import cupy_moe
from cupy_moe import bench, load_workloads
from cupy_moe.workload_inputs import workload_inputs

SOURCE = pathlib.Path(__file__).with_name("prefill_variants.cu")
LABELS = ["kimi-k2-prefill", "qwen3-30b-prefill", "kimi-k2-medium", "qwen3-30b-medium",
          "kimi-k2-small", "qwen3-30b-small", "kimi-k2-decode"]
ARGS = struct.Struct("<4Qq6i")
ROWS_PER_ZERO_BLOCK = 8
# (kernel, threads, blocks per SM for persistent kernels or None). The first
# run in results/prefill_variants.md also listed regs_128_8_1, regs_128_4_1,
# regs_64_14_1, persist_256_4 (4), persist_128_8 (16), bulk_1 and bulk_2 (16);
# add them back to repeat it (their kernels are still in the .cu file).
VARIANTS = [
    ("regs_256_4_1", 256, None), ("regs_256_4_0", 256, None),
]
# chunked bulk copy: (kernel, chunk bytes; 0 = the whole row)
# (bulkz: zero-fill blocks first in the grid)
BULK_CHUNKS = [("bulkc_0", 0), ("bulkc_0", 4096), ("bulkc_0", 3584), ("bulkc_0", 2048),
               ("bulkc_0", 1536), ("bulkc_0", 1024),
               ("bulkz_0", 0), ("bulkz_0", 4096), ("bulkz_0", 3584), ("bulkz_0", 2048),
               ("bulkz_1", 0), ("bulkz_1", 3584), ("bulkz_1", 2048)]


def bench_workload(w, module, timer, copy_tbps, sms, rng, iters, results) -> None:
    """One row cell per variant for workload ``w`` into ``results``."""
    host = workload_inputs(w, rng)
    x = cupy.asarray(host["x"].view(np.uint16))
    m = cupy.asarray(host["token_topk_to_pos"])
    p = cupy.asarray(host["pos_to_expert"])
    nbytes = w.bytes
    expected = cupy_moe.expand_to_fused(x, m, p)
    out = cupy.empty_like(expected)
    T, H = host["x"].shape
    X = p.shape[0]
    n_vec = H * 2 // 16

    small = nbytes <= bench.GRAPH_MAX_BYTES

    def pct(us):
        return f"{us:.1f} µs {nbytes / us / 1e6 / copy_tbps * 100:.1f}%"

    def timed(fn):
        if small:
            return f"{bench.torch_graph_us(fn):.2f} µs"
        return pct(timer.median_us(fn, iters))

    xt, mt, pt, outt = (torch.from_dlpack(a) for a in (x, m, p, out))
    results.setdefault(("library", ""), {})[w.label] = timed(
        lambda: cupy_moe.expand_to_fused(xt, mt, pt, out=outt))
    results.setdefault(("memset out", ""), {})[w.label] = pct(timer.median_us(
        lambda: out.fill(0), iters))
    for name, threads, per_sm in VARIANTS + [(n, 32, c) for n, c in BULK_CHUNKS]:
        key = (name, per_sm or "")
        chunk_vec = n_vec
        if name.startswith(("bulkc", "bulkz")):
            chunk_vec = min(n_vec, per_sm // 16) if per_sm else n_vec
            per_sm = None
        kernel = module.get_function(name)
        zero_blocks = -(-X // ROWS_PER_ZERO_BLOCK)
        grid = per_sm * sms if per_sm else T + zero_blocks
        grid_y = -(-n_vec // chunk_vec)
        smem = chunk_vec * 16 if name.startswith(("bulkc", "bulkz")) else 0
        if name.startswith("bulk_"):
            smem = n_vec * 16 * int(name[-1])
            kernel.max_dynamic_shared_size_bytes = smem
        buffer = (ctypes.c_uint64 * 8)()
        ARGS.pack_into(buffer, 0, x.data.ptr, m.data.ptr, p.data.ptr, out.data.ptr, n_vec,
                       T, m.shape[1], X, ROWS_PER_ZERO_BLOCK, chunk_vec, 0)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(buffer))
        handle = kernel.kernel.ptr

        def launch(handle=handle, grid=grid, grid_y=grid_y, threads=threads, smem=smem,
                   params=params, buffer=buffer):
            driver.launchKernel(handle, grid, grid_y, 1, threads, 1, 1, smem,
                                torch.cuda.current_stream().cuda_stream,
                                ctypes.addressof(params), 0)

        if name.startswith("persist") and n_vec > threads * int(name.split("_")[-1]):
            results.setdefault(key, {})[w.label] = "n/a"
            continue
        out.fill(0xA5)
        launch()
        # the write-only diagnostic stores wrong bytes by design
        if not name.endswith("_0") and not bool((out == expected).all()):
            results.setdefault(key, {})[w.label] = "MISMATCH"
            continue
        results.setdefault(key, {})[w.label] = timed(launch)

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    module = cupy.RawModule(code=SOURCE.read_text(), options=("-std=c++17",))
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    timer = bench.GpuTimer()
    copy_tbps = timer.copy_tbps()
    rng = np.random.default_rng(1)
    workloads = [w for w in load_workloads("expand_to_fused") if w.label in LABELS]
    results: dict[tuple, dict[str, str]] = {}
    for w in workloads:
        bench_workload(w, module, timer, copy_tbps, sms, rng, args.iters, results)
        print(w.label, "done", file=sys.stderr, flush=True)
    print(f"copy roofline {copy_tbps:.2f} TB/s; µs and % of it")
    print("| variant | blocks/SM or chunk bytes | " + " | ".join(w.label for w in workloads) + " |")
    print("|---|---|" + "---|" * len(workloads))
    for (name, per_sm), cells in results.items():
        print(f"| {name} | {per_sm} | " + " | ".join(cells.get(w.label, "") for w in workloads) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
