"""Translate kernels_cu/ for the host compiler, compile, load, launch."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from cupy_moe.runtime.loader import kernel_dir, sources_hash

HERE = Path(__file__).resolve().parent
CXX = os.environ.get("CXX", "g++")

# Each inline PTX statement of the sources, by its template (whitespace
# collapsed), and the C++ that stands in for it: {0}, {1}, ... are the
# operands in PTX's numbering (outputs first). A template not listed here
# fails the build, naming it.
PTX_STAND_INS = {
    "mov.u32 %0, %%dynamic_smem_size;": "{0} = emu::dynamic_smem_size()",
    "createpolicy.fractional.L2::evict_first.b64 %0, 1.0;": "{0} = 0",
    "mbarrier.init.shared::cta.b64 [%0], 1;": "emu::mbarrier_init({0})",
    "fence.mbarrier_init.release.cluster;": "(void)0",
    "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;":
        "emu::mbarrier_arrive_expect({0}, {1})",
    # a bulk copy lands when issued; a wait yields until its phase completed
    "{ .reg .pred done; WAIT_LOADED_%=: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;"
    " @!done bra WAIT_LOADED_%=; }": "emu::mbarrier_wait({0}, 0)",
    "{ .reg .pred done; WAIT_PHASE_%=: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;"
    " @!done bra WAIT_PHASE_%=; }": "emu::mbarrier_wait({0}, {1})",
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
    " [%0], [%1], %2, [%3], %4;": "emu::bulk_load({0}, {1}, {2}, {3})",
    "cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;":
        "emu::bulk_store({0}, {1}, {2})",
    "cp.async.bulk.commit_group;": "(void)0",
    "cp.async.bulk.wait_group.read 0;": "emu::bulk_wait_read()",
    "fence.proxy.async.shared::cta;": "(void)0",
    "cvt.f32.f16 %0, %1;": "{0} = emu::cvt_f32_f16({1})",
    "cvt.rn.f16.f32 %0, %1;": "{0} = emu::cvt_rn_f16_f32({1})",
    "cvt.rn.bf16x2.f32 %0, %1, %2;": "{0} = emu::cvt_rn_bf16x2_f32({1}, {2})",
    "griddepcontrol.launch_dependents;": "(void)0",  # launches run one after another
    "griddepcontrol.wait;": "(void)0",
    "mov.u32 %0, %%envreg1;": "{0} = emu::envreg(1)",
    "mov.u32 %0, %%envreg2;": "{0} = emu::envreg(2)",
    "atom.add.release.gpu.u32 %0, [%1], %2;": "{0} = emu::atom_add_release({1}, {2})",
    # thread block clusters (a cooperative launch's blocks, consecutive along x)
    "mov.u32 %0, %%cluster_ctarank;": "{0} = emu::cluster_rank()",
    "mov.u32 %0, %%cluster_nctarank;": "{0} = emu::cluster_size()",
    "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;":
        "emu::cluster_sync()",
    "mapa.shared::cluster.u32 %0, %1, %2;": "{0} = emu::map_to_cluster_block({1}, {2})",
    "ld.shared::cluster.u32 %0, [%1];": "{0} = emu::load_shared_cluster({1})",
    "ld.acquire.gpu.u32 %0, [%1];": "{0} = emu::ld_acquire({1})",
    "": "(void)({0})",  # an empty asm that only pins a value
    "ld.global.nc.b32 %0, [%1];": "{0} = *reinterpret_cast<const int*>({1})",
    "cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;": "{0} = emu::cvt_e4m3x2({1}, {2})",
    "rcp.approx.ftz.f32 %0, %1;": "{0} = emu::rcp_approx_ftz({1})",
}


class TranslationError(RuntimeError):
    pass


def _matching(text: str, start: int) -> int:
    """Index just past the parenthesis closing the one at ``start``."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == '"':
            i = _string_end(text, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise TranslationError("unbalanced parentheses in an asm statement")


def _string_end(text: str, start: int) -> int:
    i = start + 1
    while text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _split_top(text: str, separator: str) -> list[str]:
    """Split at ``separator`` outside strings and parentheses."""
    parts, depth, current, i = [], 0, [], 0
    while i < len(text):
        c = text[i]
        if c == '"':
            end = _string_end(text, i)
            current.append(text[i:end])
            i = end
            continue
        depth += c == "("
        depth -= c == ")"
        if c == separator and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    parts.append("".join(current))
    return parts


def _operand_expressions(section: str) -> list[str]:
    expressions = []
    for operand in _split_top(section, ","):
        operand = operand.strip().rstrip("\\").strip()
        if not operand:
            continue
        match = re.fullmatch(r'"[^"]*"\s*\((.*)\)', operand, re.S)
        if not match:
            raise TranslationError(f"unreadable asm operand {operand!r}")
        expressions.append(f"({match.group(1)})")
    return expressions


_ASM = re.compile(r"\basm\s*(?:volatile\s*)?\(")


def translate_asm(text: str) -> str:
    out, pos = [], 0
    for match in _ASM.finditer(text):
        if match.start() < pos:
            continue
        end = _matching(text, match.end() - 1)
        body = text[match.end():end - 1]
        sections = _split_top(body, ":")
        template = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', sections[0]))
        template = " ".join(template.replace("\\n", " ").split())
        if template not in PTX_STAND_INS:
            raise TranslationError(f"no CPU stand-in for the PTX {template!r}")
        operands = []
        for section in sections[1:3]:
            operands += _operand_expressions(section)
        out.append(text[pos:match.start()])
        out.append("(" + PTX_STAND_INS[template].format(*operands) + ")")
        pos = end
    out.append(text[pos:])
    return "".join(out)


_DYNAMIC_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w ]*?)\s+(\w+)\s*\[\s*\]\s*;")


# a static __shared__ declaration (after the dynamic ones are rewritten): its
# alignment, then the type and declarators, e.g. "int segments, total_rows".
# Inside a function only: the call that poisons it is a statement (one at
# namespace scope fails to compile, naming it).
_STATIC_SHARED = re.compile(r"__shared__\s+(__align__\(\s*\d+\s*\)\s+)?([^;{}()]+);")
_DECLARATOR = re.compile(r"(\w+)\s*((?:\[[^\]]*\]\s*)*)$")


def _static_shared(match: re.Match) -> str:
    """Each variable of a static __shared__ declaration as a static
    thread_local, poisoned where a block first passes it
    (emu::poison_shared_once)."""
    align = (match.group(1) or "").strip()
    parts = [part.strip() for part in match.group(2).split(",")]
    first = _DECLARATOR.search(parts[0])
    if first is None:
        raise TranslationError(f"unreadable __shared__ declaration {match.group(0)!r}")
    type_name = parts[0][:first.start()].strip()
    parts[0] = parts[0][first.start():]
    out = []
    for part in parts:
        declarator = _DECLARATOR.fullmatch(part)
        if declarator is None or not type_name:
            raise TranslationError(f"unreadable __shared__ declaration {match.group(0)!r}")
        name, dims = declarator.groups()
        out.append(f"static thread_local {type_name} {name}{dims.strip()} {align}; "
                   f"static thread_local unsigned long long {name}__poisoned_for = 0; "
                   f"emu::poison_shared_once(&{name}, sizeof({name}), {name}__poisoned_for);")
    return " ".join(out)


def translate(text: str) -> str:
    text = translate_asm(text)
    text = _DYNAMIC_SHARED.sub(
        lambda m: f"{m.group(1)}* const {m.group(2)} = "
                  f"reinterpret_cast<{m.group(1)}*>(emu::dynamic_shared());", text)
    return _STATIC_SHARED.sub(_static_shared, text)


_KERNEL = re.compile(r'extern\s+"C"\s+void\s+(\w+)\s*\(')


def _cache_dir() -> Path:
    configured = os.environ.get("CUPY_MOE_CACHE_DIR")
    root = Path(configured) if configured else Path.home() / ".cache" / "cupy_moe"
    return root / "cuda_on_cpu"


def _sources() -> dict[str, str]:
    """Every file a module may include, translated: kernels_cu/'s, and the
    emulation's own self-test kernels (selftest.cu) beside this file."""
    paths = [*kernel_dir().glob("*.cu*"), *HERE.glob("*.cu")]
    return {path.name: translate(path.read_text()) for path in sorted(paths)}


def _compile(source: str, defines: tuple[tuple[str, int], ...], arch: int) -> Path:
    sources = _sources()
    if source not in sources:
        raise FileNotFoundError(f"no kernel source {source} in {kernel_dir()} or {HERE}")
    runtime = {name: (HERE / name).read_text() for name in ("cuda_on_cpu.h", "runtime.inc")}
    language = ["-std=c++17", "-w", f"-D__CUDA_ARCH__={arch}",
                f"-DCUPY_MOE_SOURCES_HASH=0x{sources_hash()}ULL",
                *(f"-D{name}={value}" for name, value in defines)]
    # IEEE float32 as the kernels' NVRTC options ask: no contraction into fmas
    flags = [*language, "-O2", "-fno-strict-aliasing", "-ffp-contract=off", "-fno-fast-math",
             "-fPIC", "-shared", "-pthread"]
    key = hashlib.sha256("\0".join([CXX, *flags, source, *sources, *sources.values(),
                                     *runtime.values()]).encode()).hexdigest()[:24]
    target = _cache_dir() / f"{Path(source).stem}-{key}.so"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="cuda_on_cpu-") as work:
        work_dir = Path(work)
        for name, text in {**sources, **runtime}.items():
            (work_dir / name).write_text(text)
        # the kernels' names, from the preprocessed source
        preprocessed = subprocess.run(
            [CXX, *language, "-x", "c++", "-E", "-P", "-include", "cuda_on_cpu.h", source],
            cwd=work_dir, capture_output=True, text=True)
        if preprocessed.returncode:
            raise TranslationError(f"preprocessing {source} failed:\n{preprocessed.stderr}")
        names = sorted(set(_KERNEL.findall(preprocessed.stdout)))
        module = work_dir / "module.cpp"
        module.write_text(
            '#include "cuda_on_cpu.h"\n#include <string>\n'
            f'#include "{source}"\n#include "runtime.inc"\n'
            "extern const KernelEntry emu_kernels[] = {\n"
            + "".join(f'    {{"{n}", &Trampoline<decltype(&{n}), &{n}>::call}},\n'
                      for n in names)
            + "};\n"
            f"extern const int emu_kernel_count = {len(names)};\n")
        built = work_dir / "module.so"
        result = subprocess.run([CXX, *flags, "-o", str(built), str(module)], cwd=work_dir,
                                capture_output=True, text=True)
        if result.returncode:
            raise TranslationError(f"compiling {source} for the CPU failed:\n"
                                   f"{result.stderr[-6000:]}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            shutil.copy(built, tmp)
            os.replace(tmp, target)
        except OSError:  # no writable cache: a private folder, built again next process
            target = Path(tempfile.mkdtemp(prefix="cuda_on_cpu-")) / target.name
            shutil.copy(built, target)
    return target


class Module:
    """One compiled source+defines; ``launch`` runs a kernel to completion."""

    def __init__(self, path: Path) -> None:
        self.library = ctypes.CDLL(str(path))
        self.library.emu_launch.argtypes = (
            ctypes.c_char_p, *(ctypes.c_uint,) * 7, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
            ctypes.c_int, ctypes.c_ulonglong, ctypes.c_char_p, ctypes.c_int)
        self.library.emu_launch.restype = ctypes.c_int

    def launch(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, params_address: int, cooperative: bool = False,
               seed: int = 0, cluster: int = 0) -> None:
        """Run ``name`` to completion; ``seed`` nonzero: blocks and threads in
        random orders drawn from it (else in index order); ``cluster`` > 1:
        clusters of that many consecutive blocks (cooperative launches only)."""
        error = ctypes.create_string_buffer(512)
        status = self.library.emu_launch(name.encode(), *grid, *block, shared_bytes,
                                         params_address, int(cooperative), cluster,
                                         os.cpu_count() or 1, seed, error, len(error))
        if status:
            raise RuntimeError(f"cuda_on_cpu: {name}: {error.value.decode()}")


_modules: dict[tuple, Module] = {}
_lock = threading.Lock()


def module(source: str, defines: tuple[tuple[str, int], ...] = (), arch: int = 900) -> Module:
    """The CPU build of kernels_cu/``source`` with ``defines``, for ``__CUDA_ARCH__ = arch``."""
    key = (source, defines, arch)
    with _lock:
        if key not in _modules:
            _modules[key] = Module(_compile(source, defines, arch))
        return _modules[key]


def conversions() -> ctypes.CDLL:
    """conversions.cpp built: the PTX conversions' stand-ins, callable on arrays."""
    source = HERE / "conversions.cpp"
    key = hashlib.sha256("\0".join([CXX, source.read_text(),
                                     (HERE / "cuda_on_cpu.h").read_text()]).encode())
    target = _cache_dir() / f"conversions-{key.hexdigest()[:24]}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        result = subprocess.run([CXX, "-std=c++17", "-O2", "-ffp-contract=off", "-fPIC",
                                 "-shared", "-w", "-o", str(tmp), str(source)],
                                cwd=HERE, capture_output=True, text=True)
        if result.returncode:
            raise TranslationError(f"compiling conversions.cpp failed:\n{result.stderr}")
        os.replace(tmp, target)
    return ctypes.CDLL(str(target))


def compiler_available() -> bool:
    """A C++ compiler, on x86-64 (the fiber switch of runtime.inc is written for it)."""
    return shutil.which(CXX) is not None and platform.machine() in ("x86_64", "AMD64")
