"""Which store pattern writes zeros at cudaMemsetAsync speed? A sweep of
write-only zero-fill kernels against a memset of the same bytes. GPU only.

    python benchmarks/zero_fill_sweep.py [--sizes-mb 8 32 ...] [--iters N]
                                         [--only SUBSTR ...] [--skip SUBSTR ...]
                                         [--md PATH] [--json PATH]
    python benchmarks/zero_fill_sweep.py --compile-only   # NVRTC sm_90, no GPU needed

Why: on padding-heavy expand plans (e.g. 14592 padding rows x 14336 bytes =
209 MB of zeros, 4 MB copied) the expand kernel takes 55.8 µs where a memset
of the zero bytes alone takes ~47-49 µs on an H200. The expand zero-fill is
to be rebuilt on whichever store pattern reaches memset speed; this finds it.

Variants (kernels in benchmarks/zero_fill_sweep.cu):
  1. gs/*        16-byte stores, grid-stride loop, 256 threads, k * SMs
                 blocks; plain st.global, __stcs (.cs), .L1::no_allocate,
                 .L2::cache_hint (evict_first policy), both hints.
  2. chunk/*     one block per 4-64 KiB chunk, no loop, 128-1024 threads,
                 unrolled 16-byte stores (plain and .cs).
  3. rows<B>/*   R back-to-back rows of B = 14336, 6144, 4096, 1024 bytes
                 zeroed row by row: a warp per row, a block per row, a block
                 per ~16 KiB of rows (the expand registers path's rule).
  4. bulk-*      cp.async.bulk stores (TMA) of a zeroed 4-32 KiB shared
                 buffer, one issuing thread; grid-stride and chunk per block,
                 with and without an L2 evict_first hint. sm_90+.
  5. gs2/*, gs4/*  2 (or 4) 16-byte stores per thread per loop step,
                 adjacent (32 contiguous bytes a thread) vs interleaved.

Each (variant, size) is first checked on a buffer poisoned with 0xAB, with
64 KiB guards on both sides: the zeroed range must be all zero and the guards
(and, for rows variants, the bytes after the last whole row) still 0xAB.
Then it is timed with GpuTimer.median_us (CUDA events, L2 flushed before
each run, median of --iters). The memset figure is GpuTimer.memset_us of the
size, timed before and after the size's variants (their mean is the
reference; both are printed, as a drift check).

"% memset" is the variant's write rate over memset's (100 = memset speed,
above 100 = faster); rows variants zero whole rows only (up to one row less
than the size), which the rate accounts for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

SOURCE_PATH = Path(__file__).with_name("zero_fill_sweep.cu")
REPO = Path(__file__).resolve().parent.parent

DEFAULT_SIZES_MB = (8, 32, 64, 128, 209, 400, 700)
MB = 1_000_000  # decimal: 209 MB ~ the expand plan's 209.19 MB of padding rows
GUARD = 64 * 1024  # poison bytes kept on each side of the zeroed range
POISON = 0xAB
COMPILE_OPTIONS = ("-std=c++17",)

STORES = {"plain": 0, "cs": 1, "l1na": 2, "l2ef": 3, "l1na+l2ef": 4}
STORE_MIN_CC = {"plain": 0, "cs": 0, "l1na": 80, "l2ef": 80, "l1na+l2ef": 80}
GRID_MULTIPLES = (1, 2, 4, 8, 16)
CHUNK_KIB = (4, 8, 16, 32, 64)
CHUNK_THREADS = (128, 256, 512, 1024)
ROW_BYTES = (14336, 6144, 4096, 1024)
BULK_SMEM_KIB = (4, 8, 16, 32)
BULK_GRID_MULTIPLES = (1, 2, 4, 8)
BULK_PIECES_PER_BLOCK = (1, 4)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch: grid and block sizes, the arguments after the output
    pointer, and how many bytes from the start it zeroes."""
    grid: int
    block: int
    args: tuple
    zeroed: int


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    family: str
    kernel: str  # a name expression of zero_fill_sweep.cu
    plan: Callable[[int, int], Launch]  # (nbytes, SM count) -> launch
    min_cc: int = 0  # compute capability (major * 10 + minor) it needs


# CuPy packs a numpy scalar argument by its dtype: these give each kernel
# parameter the width the .cu declares (i64 / int).
def _i64(x: int) -> np.int64:
    return np.int64(x)


def _i32(x: int) -> np.int32:
    return np.int32(x)


# -- the variants -------------------------------------------------------------

def grid_stride_variants() -> list[Variant]:
    """Families 1 and 5: grid-stride loops of 256 threads, k * SMs blocks."""
    shapes = [(1, True, "gs", tuple(STORES))]
    shapes += [(per, adjacent, f"gs{per}/{'adjacent' if adjacent else 'interleaved'}",
                ("plain", "cs"))
               for per, adjacent in ((2, True), (2, False), (4, True), (4, False))]
    variants = []
    for per, adjacent, prefix, stores in shapes:
        family = "1 gs 16B" if per == 1 else "5 gs multi-store"
        for store in stores:
            kernel = f"zero_grid_stride<{STORES[store]}, {per}, {str(adjacent).lower()}>"
            for k in GRID_MULTIPLES:
                def plan(nbytes, sms, k=k):
                    return Launch(k * sms, 256, (_i64(nbytes // 16),), nbytes)
                variants.append(Variant(f"{prefix}/{store}/k{k}", family, kernel, plan,
                                        STORE_MIN_CC[store]))
    return variants


def chunk_variants() -> list[Variant]:
    """Family 2: a block per fixed chunk; only shapes where every thread
    stores at least once."""
    variants = []
    for kib in CHUNK_KIB:
        for threads in CHUNK_THREADS:
            if kib * 1024 // 16 < threads:
                continue
            for store in ("plain", "cs"):
                kernel = f"zero_chunk<{kib * 1024}, {threads}, {STORES[store]}>"

                def plan(nbytes, sms, kib=kib, threads=threads):
                    return Launch(math.ceil(nbytes / (kib * 1024)), threads,
                                  (_i64(nbytes // 16),), nbytes)
                variants.append(Variant(f"chunk/{kib}K/t{threads}/{store}", "2 chunk per block",
                                        kernel, plan))
    return variants


def expand_rows_per_block(row_bytes: int) -> int:
    """Rows per zero-fill block of the expand registers path
    (cupy_moe/expand/plan.py with the default tuning): enough rows of a
    <= 16 KiB column chunk for about 16 KiB, at least 2, at most 32."""
    chunk = min(row_bytes, 16 * 1024)
    return min(32, max(2, math.ceil(16 * 1024 / chunk)))


def row_variants() -> list[Variant]:
    """Family 3: back-to-back rows zeroed row by row."""
    variants = []
    for row_bytes in ROW_BYTES:
        per_block = expand_rows_per_block(row_bytes)
        for store in ("cs", "plain"):
            st = STORES[store]

            def warp_plan(nbytes, sms, row_bytes=row_bytes):
                rows = nbytes // row_bytes
                return Launch(math.ceil(rows / 8), 256, (_i64(rows), _i32(row_bytes // 16)),
                              rows * row_bytes)

            def block_plan(nbytes, sms, row_bytes=row_bytes, per=1):
                rows = nbytes // row_bytes
                return Launch(math.ceil(rows / per), 256,
                              (_i64(rows), _i32(row_bytes // 16), _i32(per)), rows * row_bytes)

            prefix = f"rows{row_bytes}"
            family = "3 rows"
            variants.append(Variant(f"{prefix}/warp-per-row/{store}", family,
                                    f"zero_rows_warp<{st}>", warp_plan))
            variants.append(Variant(f"{prefix}/block-per-row/{store}", family,
                                    f"zero_rows_block<{st}>", block_plan))
            variants.append(Variant(
                f"{prefix}/block-per-{per_block}-rows/{store}", family, f"zero_rows_block<{st}>",
                lambda nbytes, sms, f=block_plan, per=per_block: f(nbytes, sms, per=per)))
    return variants


def bulk_variants() -> list[Variant]:
    """Family 4: TMA bulk stores from a zeroed shared buffer (sm_90+)."""
    variants = []
    for kib in BULK_SMEM_KIB:
        piece = kib * 1024
        for hint in (False, True):
            kernel = f"zero_bulk<{piece}, {str(hint).lower()}>"
            suffix = "/ef" if hint else ""
            for k in BULK_GRID_MULTIPLES:
                def gs_plan(nbytes, sms, k=k):
                    return Launch(k * sms, 128, (_i64(nbytes), _i32(1)), nbytes)
                variants.append(Variant(f"bulk-gs/{kib}K/k{k}{suffix}", "4 bulk (TMA)", kernel,
                                        gs_plan, 90))
            for pieces in BULK_PIECES_PER_BLOCK:
                def chunk_plan(nbytes, sms, piece=piece, pieces=pieces):
                    return Launch(math.ceil(math.ceil(nbytes / piece) / pieces), 128,
                                  (_i64(nbytes), _i32(pieces)), nbytes)
                variants.append(Variant(f"bulk-chunk/{pieces}x{kib}K{suffix}", "4 bulk (TMA)",
                                        kernel, chunk_plan, 90))
    return variants


def all_variants() -> list[Variant]:
    return grid_stride_variants() + chunk_variants() + row_variants() + bulk_variants()


def select(variants: Sequence[Variant], only: Sequence[str], skip: Sequence[str]) -> list[Variant]:
    return [v for v in variants
            if (not only or any(s in v.name for s in only)) and not any(s in v.name for s in skip)]


# -- compiling -------------------------------------------------------------------

def name_expressions(variants: Sequence[Variant]) -> list[str]:
    return sorted({v.kernel for v in variants})


def compile_only(variants: Sequence[Variant]) -> int:
    """Compile every kernel to sm_90 SASS with NVRTC, without a GPU: ptxas
    runs, so bad inline PTX fails here too."""
    from cupy_backends.cuda.libs import nvrtc
    names = name_expressions(variants)
    source = SOURCE_PATH.read_text()
    # CuPy adds --device-as-default-execution-space to RawModule compiles.
    options = (*COMPILE_OPTIONS, "-arch=sm_90", "--device-as-default-execution-space")
    start = time.perf_counter()
    prog = nvrtc.createProgram(source, SOURCE_PATH.name, (), ())
    try:
        for name in names:
            nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError:
            print(nvrtc.getProgramLog(prog))
            return 1
        cubin = nvrtc.getCUBIN(prog)
        lowered = {name: nvrtc.getLoweredName(prog, name) for name in names}
    finally:
        nvrtc.destroyProgram(prog)
    print(f"compiled {len(lowered)} kernels for sm_90 ({len(variants)} variants): "
          f"{len(cubin)} bytes of cubin in {time.perf_counter() - start:.1f} s "
          f"(NVRTC {'.'.join(map(str, nvrtc.getVersion()))})")
    return 0


def load_kernels(cupy, variants: Sequence[Variant]) -> dict:
    names = name_expressions(variants)
    module = cupy.RawModule(code=SOURCE_PATH.read_text(), options=COMPILE_OPTIONS,
                            name_expressions=names)
    return {name: module.get_function(name) for name in names}


# -- the run ----------------------------------------------------------------------

def gpu_available():
    """cupy when it is importable and sees a GPU; else (None, why)."""
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no cupy, no driver, no device: all mean "not here"
        return None, f"{type(e).__name__}: {e}".splitlines()[0]
    if count < 1:
        return None, "no CUDA device"
    return cupy, ""


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def device_info(cupy) -> dict:
    """Name, SM count, L2 and clocks (where the props or nvidia-smi give them cheaply)."""
    from cupy_moe.harness.timing import device_name
    dev = cupy.cuda.runtime.getDevice()
    props = cupy.cuda.runtime.getDeviceProperties(dev)
    info = {"name": device_name(props), "sms": int(props["multiProcessorCount"]),
            "cc": int(props["major"]) * 10 + int(props["minor"]),
            "l2_bytes": int(props["l2CacheSize"])}
    for key in ("clockRate", "memoryClockRate", "memoryBusWidth"):
        if key in props:  # clockRate and memoryClockRate are gone from CUDA 13's props
            info[key] = int(props[key])
    try:
        smi = subprocess.run(["nvidia-smi", "-i", str(dev), "--format=csv,noheader",
                              "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem"],
                             capture_output=True, text=True, timeout=10)
        if smi.returncode == 0:
            info["nvidia_smi_clocks"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def check_zeroes(cupy, buf, nbytes: int, kernel, launch: Launch) -> str:
    """Run once on a poisoned buffer: '' when exactly [0, launch.zeroed) is
    zero, else what is wrong."""
    buf.fill(POISON)
    view = buf[GUARD:GUARD + nbytes]
    kernel((launch.grid,), (launch.block,), (view, *launch.args))
    zeroed = buf[GUARD:GUARD + launch.zeroed]
    nonzero = int(cupy.count_nonzero(zeroed))
    before_ok = bool((buf[:GUARD] == POISON).all())
    after_ok = bool((buf[GUARD + launch.zeroed:] == POISON).all())
    problems = []
    if nonzero:
        problems.append(f"{nonzero} nonzero bytes in the range")
    if not before_ok:
        problems.append("guard before the range written")
    if not after_ok:
        problems.append("bytes after the range written")
    return "; ".join(problems)


def measure_size(cupy, timer, kernels: dict, variants: Sequence[Variant], size_mb: float,
                 info: dict, iters: int, t0: float) -> dict:
    nbytes = int(size_mb * MB) // 16 * 16
    buf = cupy.empty(nbytes + 2 * GUARD, dtype=cupy.uint8)
    view = buf[GUARD:GUARD + nbytes]
    memset_before = timer.memset_us(nbytes, iters)
    results = []
    for v in variants:
        launch = v.plan(nbytes, info["sms"])
        kernel = kernels[v.kernel]
        try:
            problem = check_zeroes(cupy, buf, nbytes, kernel, launch)
        except Exception:
            print(f"  {v.name} failed at {size_mb} MB (launch {launch})", file=sys.stderr)
            raise
        row = {"variant": v.name, "family": v.family, "kernel": v.kernel, "grid": launch.grid,
               "block": launch.block, "bytes": launch.zeroed}
        if problem:
            print(f"  WRONG {v.name} at {size_mb} MB: {problem}")
            results.append({**row, "us": None, "error": problem})
            continue

        def run(kernel=kernel, launch=launch):
            kernel((launch.grid,), (launch.block,), (view, *launch.args))
        results.append({**row, "us": timer.median_us(run, iters)})
    memset_after = timer.memset_us(nbytes, iters)
    memset = (memset_before + memset_after) / 2
    for r in results:
        if r["us"] is not None:
            # write rates compared: a rows variant may zero a little less than nbytes
            r["pct_memset"] = 100 * (r["bytes"] / r["us"]) / (nbytes / memset)
            r["tbps"] = r["bytes"] / r["us"] / 1e6
    results.sort(key=lambda r: (r["us"] is None, -r.get("pct_memset", 0.0)))
    timed = [r for r in results if r["us"] is not None]
    best = f"best {timed[0]['variant']} {timed[0]['us']:.1f} µs ({timed[0]['pct_memset']:.1f}%)" \
        if timed else "nothing timed"
    print(f"[{time.perf_counter() - t0:6.1f} s] {size_mb:g} MB: memset {memset_before:.1f} / "
          f"{memset_after:.1f} µs (before / after); {best}", flush=True)
    return {"size_mb": size_mb, "nbytes": nbytes, "memset_us": memset,
            "memset_us_before": memset_before, "memset_us_after": memset_after,
            "memset_tbps": nbytes / memset / 1e6, "results": results}


# -- the report ---------------------------------------------------------------------

def family_summary(sizes: Sequence[dict]) -> list[str]:
    """Best variant of each family at each size, % memset."""
    families = sorted({r["family"] for s in sizes for r in s["results"]})
    head = "| family | " + " | ".join(f"{s['size_mb']:g} MB" for s in sizes) + " |"
    lines = [head, "|---|" + "---|" * len(sizes)]
    for family in families:
        cells = []
        for s in sizes:
            timed = [r for r in s["results"] if r["family"] == family and r["us"] is not None]
            cells.append(f"{timed[0]['pct_memset']:.1f}% {timed[0]['variant']}" if timed else "-")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    best = [next((r for r in s["results"] if r["us"] is not None), None) for s in sizes]
    lines.append("| **best** | " + " | ".join(
        f"**{r['pct_memset']:.1f}%** {r['variant']}" if r else "-" for r in best) + " |")
    lines.append("| memset µs | " + " | ".join(f"{s['memset_us']:.1f}" for s in sizes) + " |")
    return lines


def size_table(s: dict) -> list[str]:
    lines = [f"### {s['size_mb']:g} MB ({s['nbytes']} bytes): memset {s['memset_us']:.1f} µs "
             f"({s['memset_tbps']:.2f} TB/s; {s['memset_us_before']:.1f} before, "
             f"{s['memset_us_after']:.1f} after the variants)", "",
             "| # | variant | family | grid x block | µs | % memset | TB/s |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(s["results"], 1):
        if r["us"] is None:
            lines.append(f"| {i} | {r['variant']} | {r['family']} | {r['grid']} x {r['block']} | "
                         f"WRONG: {r['error']} | | |")
        else:
            lines.append(f"| {i} | {r['variant']} | {r['family']} | {r['grid']} x {r['block']} | "
                         f"{r['us']:.1f} | {r['pct_memset']:.1f} | {r['tbps']:.2f} |")
    return lines


def markdown(report: dict) -> str:
    info = report["device"]
    clocks = ", ".join(f"{k} {info[k]}" for k in
                       ("clockRate", "memoryClockRate", "memoryBusWidth", "nvidia_smi_clocks")
                       if k in info)
    lines = ["# Zero-fill store patterns vs cudaMemsetAsync", "",
             f"{info['name']} (sm_{info['cc']}, {info['sms']} SMs, L2 {info['l2_bytes'] >> 20} MiB"
             f"{'; ' + clocks if clocks else ''}); commit {report['commit']}; "
             f"median of {report['iters']} runs, L2 flushed before each; "
             f"{report['elapsed_s']:.0f} s.", "",
             "% memset: the variant's write rate over cudaMemsetAsync's on the same bytes "
             "(100 = memset speed).", "", "## Best of each family", ""]
    lines += family_summary(report["sizes"])
    for s in report["sizes"]:
        lines += ["", *size_table(s)]
    return "\n".join(lines) + "\n"


# -- main ------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=list(DEFAULT_SIZES_MB),
                        help="buffer sizes in MB (10^6 bytes), rounded down to 16 bytes")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--only", nargs="+", default=[], metavar="SUBSTR",
                        help="keep variants whose name contains one of these")
    parser.add_argument("--skip", nargs="+", default=[], metavar="SUBSTR",
                        help="drop variants whose name contains one of these")
    parser.add_argument("--md", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the kernels for sm_90 with NVRTC and exit (no GPU needed)")
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    if any(mb * MB < 16 for mb in args.sizes_mb):
        parser.error("every size must be at least 16 bytes")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    variants = select(all_variants(), args.only, args.skip)
    if not variants:
        print("zero_fill_sweep: no variant left after --only/--skip")
        return 1
    if args.compile_only:
        return compile_only(variants)
    cupy, why = gpu_available()
    if cupy is None:
        print(f"zero_fill_sweep: no GPU/cupy here ({why}); nothing measured")
        return 0

    from cupy_moe.harness.timing import GpuTimer
    t0 = time.perf_counter()
    info = device_info(cupy)
    skipped = [v.name for v in variants if v.min_cc > info["cc"]]
    variants = [v for v in variants if v.min_cc <= info["cc"]]
    if skipped:
        print(f"skipping {len(skipped)} variants that need a newer GPU than sm_{info['cc']}")
    print(f"{info['name']}: {info['sms']} SMs, sm_{info['cc']}; commit {git_commit()}; "
          f"{len(variants)} variants x {len(args.sizes_mb)} sizes, {args.iters} iters", flush=True)
    kernels = load_kernels(cupy, variants)
    print(f"[{time.perf_counter() - t0:6.1f} s] compiled {len(kernels)} kernels", flush=True)
    timer = GpuTimer()
    sizes = []
    for mb in args.sizes_mb:
        sizes.append(measure_size(cupy, timer, kernels, variants, mb, info, args.iters, t0))
        cupy.get_default_memory_pool().free_all_blocks()  # the next size's buffers are new
    report = {"device": info, "commit": git_commit(), "iters": args.iters, "sizes": sizes,
              "elapsed_s": time.perf_counter() - t0}
    text = markdown(report)
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    wrong = sum(r["us"] is None for s in sizes for r in s["results"])
    if wrong:
        print(f"{wrong} (variant, size) runs zeroed the wrong bytes", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
