"""Kernel loader: CUDA C sources of kernels_cu/, compiled by NVRTC at first use.

One ``cupy.RawModule`` per (device, source, variant), built lazily under a
lock. The loader runs NVRTC itself and hands the binary to ``cupy.RawModule``
by path, rather than letting CuPy compile the source: CuPy appends
``-ftz=true`` to every compile, and flushing denormals to zero breaks the
bit-exact float32 arithmetic of reduce_fused and the fp8 producers (IEEE
denormals, as NumPy computes them). The options here ask for IEEE float32
explicitly (no flush, IEEE division and square root, no contraction of a
multiply and an add into an fma that the source did not write).

Compiled modules are kept on disk (``$CUPY_MOE_CACHE_DIR``, ``~`` expanded,
else ``~/.cache/cupy_moe``), keyed by a hash of the source, the options (which
carry a hash of every file in kernels_cu/, subfolders included: an edited
header can never bring back a stale binary), the target and NVRTC's version.
A cached file that is not a whole binary (empty, cut short) is compiled
again. Files are readable by all (as the umask allows), so one cache folder
can serve several users. Where the cache cannot be written (or no home
folder is known) a private temporary folder serves the process, with a
warning, and is removed at exit. Nothing prunes the cache: delete the folder
to reclaim it. A device NVRTC cannot target gets PTX for the newest
architecture NVRTC knows below it, which the driver compiles.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import tempfile
import threading
import warnings
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


# IEEE float32 everywhere: denormals kept, correctly rounded division and
# square root, no contraction of a * b + c into an fma (the kernels write
# their fmas out). These are NVRTC's defaults but for -fmad; they are spelled
# out because CuPy's own compile path sets -ftz=true.
IEEE_FLOAT_OPTIONS = ("-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=false")


def compile_options(defines: tuple[tuple[str, int], ...] = ()) -> tuple[str, ...]:
    """NVRTC options: C++17, IEEE float32, the sources' hash, the variant's defines."""
    return (
        "-std=c++17",
        *IEEE_FLOAT_OPTIONS,
        f"-I{kernel_dir()}",
        f"-DCUPY_MOE_SOURCES_HASH=0x{sources_hash()}ULL",
        *(f"-D{name}={value}" for name, value in defines),
    )


def _cache_dir() -> Path | None:
    """The disk cache's folder; None where no home folder is known (a
    container's user without a passwd entry and no HOME)."""
    configured = os.environ.get("CUPY_MOE_CACHE_DIR")
    try:
        if configured:
            return Path(configured).expanduser()
        return Path.home() / ".cache" / "cupy_moe"
    except RuntimeError:  # "~" or the default, and no home folder known
        return None


def device_target(device: int) -> tuple[str, bool]:
    """NVRTC's ``-arch`` for CUDA ``device`` and whether it makes a cubin:
    ``sm_XY`` where NVRTC supports the device, else ``compute_XY`` (PTX) of
    the newest architecture it supports below it."""
    from cupy.cuda import nvrtc, runtime

    props = runtime.getDeviceProperties(device)
    capability = 10 * props["major"] + props["minor"]
    supported = [arch for arch in nvrtc.getSupportedArchs() if arch <= capability]
    if not supported:
        raise KernelCompileError(f"NVRTC {nvrtc.getVersion()} supports no architecture up to "
                                 f"the device's compute capability {capability}")
    if capability in supported:
        return f"sm_{capability}", True
    return f"compute_{max(supported)}", False


_private_dir: Path | None = None  # where binaries go when the cache cannot be written


def _compile(filename: str, defines: tuple[tuple[str, int], ...], arch: str,
             cubin: bool) -> Path:
    """The file holding NVRTC's output (cubin, or PTX text) of ``filename`` for
    ``arch``: the disk cache's, compiled first when the cache lacks it."""
    global _private_dir
    from cupy.cuda import nvrtc

    options = [*compile_options(defines), f"-arch={arch}"]
    key = hashlib.sha256("\0".join([repr(nvrtc.getVersion()), *options,
                                     kernel_source(filename)]).encode()).hexdigest()[:32]
    name = f"{Path(filename).stem}-{key}.{'cubin' if cubin else 'ptx'}"
    cache = _cache_dir()
    if cache is not None and _holds_whole_binary(cache / name, cubin):
        return cache / name
    program = nvrtc.createProgram(kernel_source(filename), filename, [], [])
    try:
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as exc:
            raise KernelCompileError(
                f"NVRTC failed to compile {kernel_dir() / filename} for {arch} with "
                f"{dict(defines)}:\n{nvrtc.getProgramLog(program)}") from exc
        if cubin:
            binary = nvrtc.getCUBIN(program)
        else:  # PTX text, NUL-terminated for cuModuleLoadData
            ptx = nvrtc.getPTX(program)
            binary = (ptx if isinstance(ptx, bytes) else ptx.encode()).rstrip(b"\0") + b"\0"
    finally:
        nvrtc.destroyProgram(program)
    if cache is not None:
        try:
            _write_atomically(cache / name, binary)
            return cache / name
        except OSError as error:
            cache_error = error
    else:
        cache_error = RuntimeError("no home folder is known and CUPY_MOE_CACHE_DIR is unset")
    # no writable cache: a private folder, compiled again next process
    if _private_dir is None:
        try:
            _private_dir = Path(tempfile.mkdtemp(prefix="cupy_moe-"))
        except OSError as error:
            raise _nowhere_to_write(cache, cache_error, "a temporary folder", error) from error
        atexit.register(shutil.rmtree, _private_dir, ignore_errors=True)
        warnings.warn(f"cupy_moe: the kernel cache {cache} cannot be written ({cache_error}); "
                      f"this process compiles into {_private_dir} (removed at exit). Set "
                      "CUPY_MOE_CACHE_DIR to a writable folder to keep compiled kernels.",
                      RuntimeWarning, stacklevel=2)
    try:
        _write_atomically(_private_dir / name, binary)
    except OSError as error:
        raise _nowhere_to_write(cache, cache_error, _private_dir, error) from error
    return _private_dir / name


def _nowhere_to_write(cache: Path | None, cache_error: Exception, fallback: Any,
                      error: OSError) -> OSError:
    return OSError(f"cupy_moe cannot write compiled kernels to its cache ({cache}: "
                   f"{cache_error}) nor to {fallback} ({error}); set CUPY_MOE_CACHE_DIR to a "
                   "writable folder")


def _holds_whole_binary(path: Path, cubin: bool) -> bool:
    """Whether ``path`` holds a whole compiled binary: a 64-bit ELF cubin that
    reaches its section header table's end, or PTX text ending in its NUL.
    A file cut short (a full disk, a power loss, a copy) or unreadable counts
    as missing."""
    try:
        with path.open("rb") as file:
            if cubin:
                header = file.read(64)  # ELF64: e_shoff at 40, e_shentsize, e_shnum at 58
                if len(header) < 64 or header[:5] != b"\x7fELF\x02":
                    return False
                table_end = (int.from_bytes(header[40:48], "little")
                             + int.from_bytes(header[58:60], "little")
                             * int.from_bytes(header[60:62], "little"))
                return os.fstat(file.fileno()).st_size >= table_end
            file.seek(-1, os.SEEK_END)
            return file.read(1) == b"\0"
    except OSError:  # absent, unreadable (another user's private file), or empty PTX
        return False


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it, which
    would race with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader sees a partial file, readable
    by all users as the umask allows (a temporary file is private: 0600);
    the temporary file is removed when the write fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
        try:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
            os.fchmod(tmp.fileno(), 0o666 & ~_umask())
        except BaseException:
            tmp.close()
            os.unlink(tmp.name)
            raise
    try:
        os.replace(tmp.name, path)
    except BaseException:
        os.unlink(tmp.name)
        raise


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

            arch, cubin = device_target(device)
            module = cupy.RawModule(path=str(_compile(filename, defines, arch, cubin)))
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
