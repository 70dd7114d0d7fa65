"""Kernel loader: CUDA C sources of kernels_cu/, compiled by NVRTC at first use.

One ``cupy.RawModule`` per (device, source, variant), built lazily under a
lock. CuPy's disk cache keys only the source string and the options it is
given, so the options carry a hash of every file in kernels_cu/ (subfolders
included): an edited header can never bring back a stale binary.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from pathlib import Path
from typing import Any

__all__ = ["kernel_dir", "kernel_source", "sources_hash", "compile_options",
           "get_module", "compile_for_arch", "KernelCompileError"]

# the cupy_moe package (this file is cupy_moe/runtime/loader.py)
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel source; the message carries the file and the log."""


@functools.cache
def kernel_dir() -> Path:
    """kernels_cu/: inside the installed package, else beside it in a checkout."""
    for candidate in (_PACKAGE_DIR / "kernels_cu", _PACKAGE_DIR.parent / "kernels_cu"):
        if candidate.is_dir() and any(candidate.glob("*.cu")):
            return candidate
    raise FileNotFoundError(
        f"kernels_cu/ not found inside {_PACKAGE_DIR} nor beside it; "
        "the installation is incomplete"
    )


@functools.cache
def sources_hash() -> str:
    """Hash of the relative paths and contents of every .cu/.cuh file under
    kernels_cu/, subfolders included."""
    root = kernel_dir()
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".cu", ".cuh") and path.is_file():
            name = path.relative_to(root).as_posix()
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def kernel_source(filename: str) -> str:
    return (kernel_dir() / filename).read_text()


def compile_options(defines: tuple[tuple[str, int], ...] = ()) -> tuple[str, ...]:
    """NVRTC options: C++17, the sources' hash, the variant's defines.

    No fast-math: the kernels only move bits, and must stay bit-exact.
    """
    return (
        "-std=c++17",
        f"-I{kernel_dir()}",
        f"-DCUPY_MOE_SOURCES_HASH=0x{sources_hash()}ULL",
        *(f"-D{name}={value}" for name, value in defines),
    )


_modules: dict[tuple, Any] = {}
_modules_lock = threading.Lock()


def get_module(filename: str, defines: tuple[tuple[str, int], ...], device: int) -> Any:
    """The compiled module of ``filename`` with ``defines`` on CUDA ``device``.

    The caller makes ``device`` current. Raises KernelCompileError with the
    NVRTC log when the source does not compile.
    """
    key = (device, filename, defines)
    module = _modules.get(key)
    if module is not None:
        return module
    with _modules_lock:
        module = _modules.get(key)
        if module is None:
            import cupy

            module = cupy.RawModule(code=kernel_source(filename),
                                    options=compile_options(defines))
            try:
                module.compile()
            except cupy.cuda.compiler.CompileException as exc:
                raise KernelCompileError(
                    f"NVRTC failed to compile {kernel_dir() / filename} with "
                    f"{dict(defines)}:\n{exc}") from exc
            _modules[key] = module
    return module


def compile_for_arch(filename: str, defines: tuple[tuple[str, int], ...], arch: str) -> bytes:
    """Compile to a cubin for ``arch`` (e.g. ``"sm_90"``) with no GPU present.

    Goes straight to NVRTC (CuPy's own compile path asks the driver for the
    current device); used by the test that keeps every variant compiling.
    """
    from cupy.cuda import nvrtc

    program = nvrtc.createProgram(kernel_source(filename), filename, [], [])
    try:
        try:
            nvrtc.compileProgram(program, [*compile_options(defines), f"-arch={arch}"])
        except nvrtc.NVRTCError as exc:
            raise KernelCompileError(
                f"NVRTC failed to compile {kernel_dir() / filename} for {arch} with "
                f"{dict(defines)}:\n{nvrtc.getProgramLog(program)}") from exc
        return nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)
