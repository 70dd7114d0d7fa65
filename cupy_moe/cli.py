"""The ``cupy-moe`` command: ``info`` (what this machine offers) and ``bench``."""

from __future__ import annotations

import argparse
import importlib
import platform
import sys


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
    except Exception as exc:  # noqa: BLE001
        return [f"cupy: not usable ({type(exc).__name__})"]
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device
        return [f"GPU: none ({exc})"]
    if count == 0:
        return ["GPU: none"]
    for ordinal in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(ordinal)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        lines.append(f"GPU {ordinal}: {name}, sm_{props['major']}{props['minor']}, "
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
    import cupy_moe
    from .loader import kernel_dir

    print(f"cupy_moe {cupy_moe.__version__} (python {platform.python_version()}, "
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cupy-moe",
        description="CUDA raw kernels for the token-layout steps of MoE layers.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="versions, backends found, GPU or not")
    info.set_defaults(run=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
