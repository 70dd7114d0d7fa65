"""The ``cupy-moe`` command: ``info`` (what this machine offers), ``bench`` and ``layer``."""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
from pathlib import Path

from cupy_moe import __version__
from cupy_moe.runtime.extras import CUPY_INSTALL

from .manifest import ALL_OP_NAMES
from .timing import device_name

# An option needs an extra that is not installed, or --op names an op this
# build does not have yet (1 is a failed bit-exact check).
EXIT_MISSING_EXTRA = 2
# An output path that cannot be written (argparse's usage errors are 2 too).
EXIT_BAD_OUTPUT = 2


def _module_version(name: str) -> str | None:
    try:
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return None
    return getattr(module, "__version__", "?")


def _gpu_summary() -> list[str]:
    lines = []
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - absent, or present and broken
        if isinstance(exc, ModuleNotFoundError) and exc.name == "cupy":
            return [f"GPU: not looked for (no CuPy: {CUPY_INSTALL})"]
        return [f"GPU: not looked for (cupy: not usable, {type(exc).__name__}: {exc})"]
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device
        return [f"GPU: none ({exc})"]
    if count == 0:
        return ["GPU: none"]
    for ordinal in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(ordinal)
        lines.append(f"GPU {ordinal}: {device_name(props)}, sm_{props['major']}{props['minor']}, "
                     f"{props['totalGlobalMem'] / 2**30:.0f} GiB")
    return lines


def _nvrtc_version() -> str:
    try:
        from cupy.cuda import nvrtc
        major, minor = nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001
        return f"not usable ({type(exc).__name__})"
    return f"{major}.{minor}"


def cmd_info(_args: argparse.Namespace) -> int:
    from cupy_moe.runtime.loader import kernel_dir

    print(f"cupy_moe {__version__} (python {platform.python_version()}, "
          f"{platform.machine()})")
    print(f"kernel sources: {kernel_dir()}")
    for name in ("numpy", "ml_dtypes", "cupy", "torch"):
        version = _module_version(name)
        print(f"{name}: {version if version else 'not installed'}")
    backends = ["cpu (numpy)"]
    if _module_version("torch"):
        backends.append("cpu (torch)")
    print(f"nvrtc: {_nvrtc_version()}")
    gpu_lines = _gpu_summary()
    if any(line.startswith("GPU 0") for line in gpu_lines):
        backends.append("gpu (cupy)")
        if _module_version("torch"):
            backends.append("gpu (torch)")
    for line in gpu_lines:
        print(line)
    print(f"backends: {', '.join(backends)}")
    return 0


def _outputs(json_path: str | None, markdown: str | None,
             plot: str | None) -> tuple[str | None, str | None]:
    """The Markdown table's path (given, else beside the JSON with the suffix
    .md) and why the outputs could not be written, or None: each must name a
    file in an existing, writable folder, and no two the same file. Checked
    before a run of minutes."""
    given = [(flag, path) for flag, path in (("--json", json_path), ("--markdown", markdown),
                                             ("--plot", plot)) if path]
    for flag, path in given:
        where = Path(path)
        if where.is_dir() or not where.name:
            return markdown, f"{flag} {path} is a folder; give a file name"
        folder = where.parent
        if not folder.is_dir():
            return markdown, f"{flag} {path}: no folder {folder}"
        if not os.access(folder, os.W_OK) or (where.exists() and not os.access(where, os.W_OK)):
            return markdown, f"{flag} {path} cannot be written"
    if json_path and markdown is None:
        markdown = str(Path(json_path).with_suffix(".md"))
        if Path(markdown).resolve() == Path(json_path).resolve():
            return markdown, (f"--json {json_path}: the Markdown table goes beside it with the "
                              "suffix .md and would overwrite it; name the JSON file *.json")
    for index, (flag, path) in enumerate(given):
        for other_flag, other in given[index + 1:]:
            if Path(path).resolve() == Path(other).resolve():
                return markdown, f"{flag} and {other_flag} name the same file, {path}"
    return markdown, None


def cmd_bench(args: argparse.Namespace) -> int:
    from . import report, runner

    # Checked first: a run takes minutes, and its figures would be lost.
    if args.plot and not report.can_plot():
        print("cupy-moe bench: --plot needs matplotlib, the plot extra: "
              "pip install 'cupy-moe[plot]'", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    markdown, problem = _outputs(args.json, args.markdown, args.plot)
    if problem:
        print(f"cupy-moe bench: {problem}", file=sys.stderr)
        return EXIT_BAD_OUTPUT
    chosen = args.op or ["all"]
    ops = [op for op in ALL_OP_NAMES if "all" in chosen or op in chosen]  # manifest order
    iters = args.iters or (10 if args.quick else 50)
    result = runner.run(ops, args.workload, args.backend, iters, args.quick)
    print("\n".join(report.summary_lines(result)))
    print("\n".join(report.table_lines(result)))
    report.write_outputs(result, args.json, markdown, args.plot)
    failed = [r["label"] for r in result["records"] if r["status"] != "ok"]
    if failed:
        print(f"bit-exact check failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_layer(args: argparse.Namespace) -> int:
    from . import layer_bench, report, runner

    if args.plot and not report.can_plot():
        print("cupy-moe layer: --plot needs matplotlib, the plot extra: "
              "pip install 'cupy-moe[plot]'", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    markdown, problem = _outputs(args.json, None, args.plot)
    if problem:
        print(f"cupy-moe layer: {problem}", file=sys.stderr)
        return EXIT_BAD_OUTPUT
    paths = ["bf16", "fp8"] if args.path == "both" else [args.path]
    models = args.model or ["qwen3-30b-a3b"]
    backend = runner.resolve_backend(args.backend)
    iters = args.iters or (20 if backend != "cpu" else 3)
    result = layer_bench.run_layer_bench(models, args.tokens, paths, backend, iters,
                                         args.experts, args.seed, args.alignment, args.gemm,
                                         zero_padding=not args.leave_padding)
    print("\n".join(layer_bench.table_lines(result)))
    layer_bench.write_outputs(result, args.json, markdown, args.plot)
    failed = [f"{r['model']} {r['path']}" for r in result["runs"] if not r["ok"]]
    if failed:
        print(f"outside the tolerance of the dense reference: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0


def _int_at_least(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cupy-moe",
        description="CUDA raw kernels for the token-layout steps of MoE layers.",
    )
    parser.add_argument("--version", action="version", version=f"cupy-moe {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="versions, backends found, GPU or not")
    info.set_defaults(run=cmd_info)

    bench = commands.add_parser(
        "bench", help="time the manifest workloads against the torch peers",
        description="Time the ops on the manifest workloads: GPU time (L2 flushed), GB/s, "
                    "share of the same-run copy bandwidth, eager and CUDA-graph time per call, "
                    "and, for the expand ops, the share of a same-run copy of the routed rows "
                    "plus a memset of the padding rows, the seed's torch reference and a "
                    "sync-free torch version (fused_mapping, the routing plan, and the newer "
                    "ops reduce_fused, quantize_fp8 and swiglu_quantize_fp8 have no torch "
                    "peer; an op this build lacks is skipped). Without a GPU, times the CPU "
                    "backend.")
    bench.add_argument("--op", choices=["all", *ALL_OP_NAMES], action="append",
                       help="an op whose workloads run; repeat for several (default: all)")
    bench.add_argument("--workload", action="append", metavar="LABEL",
                       help="a manifest label; repeat for several (default: all)")
    bench.add_argument("--backend", choices=["auto", "cupy", "torch", "cpu"], default="auto")
    bench.add_argument("--iters", type=_positive_int, default=None,
                       help="timed iterations per figure (default 50, 10 with --quick)")
    bench.add_argument("--quick", action="store_true",
                       help="fewer iterations; on the CPU, skip the largest workloads "
                            "(unless named by --workload)")
    bench.add_argument("--json", metavar="PATH", help="write the records as JSON "
                       "(and a Markdown table beside it unless --markdown is given)")
    bench.add_argument("--markdown", metavar="PATH", help="write the table as Markdown")
    bench.add_argument("--plot", metavar="PATH", help="PNG of %% roofline per workload "
                       "(needs matplotlib: the plot extra)")
    bench.set_defaults(run=cmd_bench)

    from cupy_moe.layer.grouped_gemm import GEMM_METHODS
    from cupy_moe.layer.weights import MODELS

    layer = commands.add_parser(
        "layer", help="an end-to-end MoE layer on a model's shapes, checked and timed per step",
        description="Run the MoE layer of cupy_moe.layer (router, fused_mapping, expand, "
                    "grouped GEMM stand-in, SwiGLU, grouped GEMM, reduce_fused; bf16 and/or "
                    "fp8 path) on random inputs of a model's shapes, check it against the "
                    "dense float64 reference within the stated tolerance, and time each step: "
                    "on a GPU, CUDA-event time (L2 flushed), per-call time in a captured CUDA "
                    "graph and eager wall time, next to torch-only equivalents of the "
                    "token-layout steps; without a GPU, the CPU backend's wall time.")
    layer.add_argument("--model", action="append", choices=sorted(MODELS),
                       help="a model's shapes; repeat for several (default: qwen3-30b-a3b)")
    layer.add_argument("--tokens", type=_positive_int, default=256, help="T (default 256)")
    layer.add_argument("--path", choices=["bf16", "fp8", "both"], default="both")
    layer.add_argument("--backend", choices=["auto", "cupy", "torch", "cpu"], default="auto")
    layer.add_argument("--experts", type=_positive_int, default=None,
                       help="override the model's expert count (the CPU backend refuses "
                            "more than 4 GiB of weights)")
    layer.add_argument("--alignment", type=_positive_int, default=128,
                       help="rows per expert segment are a multiple of this (default 128)")
    layer.add_argument("--gemm", choices=list(GEMM_METHODS), default="auto",
                       help="grouped GEMM method (default auto: NumPy on the CPU, else "
                            "torch._grouped_mm where it runs, else a per-expert loop; "
                            "numpy needs the cpu backend, grouped_mm and loop a GPU one)")
    layer.add_argument("--leave-padding", action="store_true",
                       help="expand and (fp8 path) SwiGLU-quantize leave padding rows "
                            "unwritten (zero_padding=False; the output is the same)")
    layer.add_argument("--iters", type=_positive_int, default=None,
                       help="timed iterations per figure (default 20; 3 on the CPU)")
    layer.add_argument("--seed", type=_int_at_least(0), default=0,
                       help="the random inputs' seed, >= 0 (default 0)")
    layer.add_argument("--json", metavar="PATH",
                       help="write the runs as JSON (and a Markdown table beside it)")
    layer.add_argument("--plot", metavar="PATH", help="PNG of the time per step "
                       "(needs matplotlib: the plot extra)")
    layer.set_defaults(run=cmd_layer)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command; returns 0, 1 (a result failed the bit-exact check) or
    2 (--plot without matplotlib, or an output path that cannot be written)."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
