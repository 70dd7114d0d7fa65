"""Time to the first result of each op in a fresh process, with empty kernel
caches (NVRTC compiles the op's module) and with a warm one (the module read
from ``$CUPY_MOE_CACHE_DIR``); then NVRTC's compile time of each kernel file
whole against the module a plan compiles (the kernels it launches alone).
NVRTC 13 keeps a cache of its own, in memory and beside the driver's JIT
cache (``$CUDA_CACHE_PATH``, default ~/.nv/ComputeCache), keyed by the
preprocessed source: the cold process and the compile table get an empty
folder of their own there, so that they time a first use on a new machine.
The ops run in the order of an MoE layer, torch tensors in and out:
fused_mapping (int64 ids), quantize_fp8, expand_to_fused_with_sf,
swiglu_quantize_fp8, reduce_fused. GPU only (the compile table runs
anywhere NVRTC does).

    python benchmarks/first_call.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

OPS = ("fused_mapping", "quantize_fp8", "expand_to_fused_with_sf", "swiglu_quantize_fp8",
       "reduce_fused")

# The child process: import, then each op's first and second call, synchronized.
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, cupy, cupy_moe
t1 = time.perf_counter()
T, K, E, H, I = 64, 8, 128, 7168, 2048
ids = torch.randint(0, E, (T, K), device="cuda")
x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
weights = torch.rand(T, K, device="cuda")
torch.cuda.synchronize()
state = {}


def after_mapping():  # the next ops' inputs, made outside the timing
    rows = state["plan"].pos_to_expert.shape[0]
    state["h"] = torch.randn(rows, 2 * I, device="cuda").to(torch.bfloat16)
    state["y"] = torch.randn(rows, H, device="cuda").to(torch.bfloat16)


steps = {
    "fused_mapping": lambda: state.update(plan=cupy_moe.fused_mapping(ids, E)),
    "quantize_fp8": lambda: state.update(q=cupy_moe.quantize_fp8(x)),
    "expand_to_fused_with_sf": lambda: cupy_moe.expand_to_fused_with_sf(
        *state["q"], state["plan"].token_topk_to_pos, state["plan"].pos_to_expert,
        num_per_channels=128),
    "swiglu_quantize_fp8": lambda: cupy_moe.swiglu_quantize_fp8(
        state["h"], topk_weights=weights, pos_to_token_topk=state["plan"].pos_to_token_topk,
        pos_to_expert=state["plan"].pos_to_expert),
    "reduce_fused": lambda: cupy_moe.reduce_fused(state["y"], state["plan"].token_topk_to_pos,
                                                  weights),
}
record = {"import_s": t1 - t0}
for name in sys.argv[1:]:
    times = []
    for _ in range(2):
        start = time.perf_counter()
        steps[name]()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    record[name] = {"first_ms": times[0] * 1e3, "second_ms": times[1] * 1e3}
    if name == "fused_mapping":
        after_mapping()
        torch.cuda.synchronize()
print(json.dumps(record))
"""

def plan_modules() -> list[tuple[str, tuple, tuple, str]]:
    """(file, the whole file's defines, a plan's module's defines, what that
    module is): the defines from the backends' own helpers, so that the
    table follows their kernel bits."""
    from cupy_moe.mapping.gpu import kernel_defines as mapping_defines
    from cupy_moe.quantize.gpu import kernel_set_defines
    from cupy_moe.quantize.launch_shape import QuantizeTuning
    from cupy_moe.quantize.rules import QuantizeProblem

    tuning = QuantizeTuning().defines()
    modules = [("mapping.cu", (), mapping_defines("int64", ["mapping_coop_cluster_i64"]),
                "int64 ids, mapping_coop_cluster")]
    for swiglu, kernel in ((False, "quantize_fp8_bf16_vec"),
                           (True, "swiglu_quantize_fp8_bf16_rows")):
        problem = QuantizeProblem(1, 1, "bfloat16", 128, False, False, False, swiglu=swiglu)
        modules.append(("quantize.cu", tuning, (*tuning, *kernel_set_defines(problem, kernel)),
                        kernel))
    return modules


def run_child(cache_dir: str, nvrtc_cache_dir: str) -> dict:
    env = dict(os.environ, CUPY_MOE_CACHE_DIR=cache_dir, CUDA_CACHE_PATH=nvrtc_cache_dir)
    out = subprocess.run([sys.executable, "-c", CHILD, *OPS], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compile_seconds(filename: str, defines: tuple, arch: str) -> float:
    from cupy_moe.runtime.loader import compile_for_arch

    start = time.perf_counter()
    compile_for_arch(filename, defines, arch)
    return time.perf_counter() - start


def compile_table(arch: str = "sm_90") -> list[dict]:
    rows = []
    # each whole file compiled once: NVRTC 13 would answer a repeat from its
    # in-process cache (two rows share quantize.cu's)
    whole_seconds: dict[tuple, float] = {}
    for filename, whole, plan, label in plan_modules():
        if (filename, whole) not in whole_seconds:
            whole_seconds[filename, whole] = compile_seconds(filename, whole, arch)
        rows.append({"file": filename, "module": label, "arch": arch,
                     "whole_s": whole_seconds[filename, whole],
                     "plan_s": compile_seconds(filename, plan, arch)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    # this process's NVRTC (the compile table) starts from an empty cache too
    nvrtc_cache = tempfile.TemporaryDirectory()
    os.environ["CUDA_CACHE_PATH"] = nvrtc_cache.name
    result = {}
    try:
        import cupy

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver
        has_gpu = False
    if has_gpu:
        with tempfile.TemporaryDirectory() as cache_dir, \
                tempfile.TemporaryDirectory() as cold_nvrtc_cache:
            result["cold"] = run_child(cache_dir, cold_nvrtc_cache)
            result["warm"] = run_child(cache_dir, nvrtc_cache.name)
        print("| op (in this order) | first call, empty caches ms | first call, warm cache ms "
              "| second call ms |")
        print("|---|---|---|---|")
        for op in OPS:
            cold, warm = result["cold"][op], result["warm"][op]
            print(f"| {op} | {cold['first_ms']:.1f} | {warm['first_ms']:.1f} | "
                  f"{warm['second_ms']:.2f} |")
        print(f"\nimport torch + cupy + cupy_moe: {result['cold']['import_s']:.2f} s "
              f"(empty cache), {result['warm']['import_s']:.2f} s (warm)\n")
    else:
        print("no GPU: the first-call table needs one\n")
    result["compile"] = compile_table()
    print("| NVRTC compile, sm_90 | whole file s | a plan's module s |")
    print("|---|---|---|")
    for row in result["compile"]:
        print(f"| {row['file']} ({row['module']}) | {row['whole_s']:.2f} | {row['plan_s']:.2f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    nvrtc_cache.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
