"""Every kernel variant compiles with NVRTC for sm_80 and sm_90, GPU or not.

NVRTC needs no GPU, so CI (which has none) still fails on a kernel that does
not compile. Where CI=true a missing CuPy/NVRTC is an error, not a skip.
"""


import functools
import os
import re
import tempfile

import pytest
from helpers import cubin_code, nvrtc_or_skip

from cupy_moe.runtime.loader import KernelCompileError, compile_for_arch, kernel_dir

# (source, SF mode): every module the GPU backend can ask the loader for,
# with the default tuning's defines.
VARIANTS = [
    pytest.param("expand.cu", mode, id=f"expand-sf-mode-{mode}") for mode in (0, 1, 2)
]
MAPPING_KERNELS = ("mapping_count_i32", "mapping_count_i64",
                   "mapping_place_i32", "mapping_place_i64",
                   "mapping_coop_i32", "mapping_coop_i64",
                   "mapping_coop_cluster_i32", "mapping_coop_cluster_i64",
                   "mapping_warp_i32", "mapping_warp_i64")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(("source", "sf_mode"), VARIANTS)
def test_kernel_variant_compiles(source, sf_mode, arch):
    nvrtc_or_skip()
    from cupy_moe.expand.plan import kernel_defines
    from cupy_moe.expand.tuning import DEFAULT_TUNING

    cubin = compile_for_arch(source, kernel_defines(sf_mode, DEFAULT_TUNING), arch)
    assert cubin[:4] == b"\x7fELF"
    for vec_bytes in (16, 8, 4, 2, 1):
        assert f"expand_to_fused_v{vec_bytes}".encode() in cubin
    assert b"expand_to_fused_bulk" in cubin and b"expand_to_fused_bulk_zero_rows" in cubin
    assert b"expand_zero_padding_rows" in cubin and b"expand_to_fused_gather" in cubin
    assert b"expand_to_fused_v16_overlapped" in cubin and b"expand_to_fused_bulk_overlapped" in cubin
    assert b"routing_first_slots" in cubin and b"routing_repeats_and_gaps" in cubin
    assert b"expand_to_fused_rows" in cubin


EXPAND_KERNELS = ("expand_to_fused_v16", "expand_to_fused_v8", "expand_to_fused_v16_overlapped",
                  "expand_to_fused_v4", "expand_to_fused_v2", "expand_to_fused_v1",
                  "expand_to_fused_bulk", "expand_to_fused_bulk_zero_rows",
                  "expand_to_fused_bulk_zero_rows_plain", "expand_to_fused_bulk_overlapped",
                  "expand_zero_padding_rows", "expand_to_fused_gather", "expand_to_fused_rows",
                  "routing_first_slots", "routing_repeats_and_gaps")


@pytest.mark.parametrize("sf_mode", [0, 2])
@pytest.mark.parametrize("kernel", [*EXPAND_KERNELS[:-2], "routing"])
def test_an_expand_launch_module_holds_its_kernel_alone(kernel, sf_mode):
    """EXPAND_KERNELS (kernel_defines with a kernel): that kernel alone ("routing":
    both checks), so that a first call compiles what it launches."""
    nvrtc_or_skip()
    from cupy_moe.expand.plan import kernel_defines
    from cupy_moe.expand.tuning import DEFAULT_TUNING

    cubin = compile_for_arch("expand.cu", kernel_defines(sf_mode, DEFAULT_TUNING, kernel),
                             "sm_90")
    held = [name for name in EXPAND_KERNELS if name.encode() + b"\0" in cubin]
    assert held == (list(EXPAND_KERNELS[-2:]) if kernel == "routing" else [kernel])
    # the same machine code as in the module of all of them: the split
    # changes no launch's speed
    whole = cubin_code(_whole_expand_module(sf_mode))
    assert all(cubin_code(cubin)[name] == whole[name] for name in held)


@functools.cache
def _whole_expand_module(sf_mode: int) -> bytes:
    from cupy_moe.expand.plan import kernel_defines
    from cupy_moe.expand.tuning import DEFAULT_TUNING

    return compile_for_arch("expand.cu", kernel_defines(sf_mode, DEFAULT_TUNING), "sm_90")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_mapping_kernels_compile(arch):
    nvrtc_or_skip()
    cubin = compile_for_arch("mapping.cu", (), arch)
    assert cubin[:4] == b"\x7fELF"
    for name in MAPPING_KERNELS:
        assert name.encode() in cubin


@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
@pytest.mark.parametrize("kernels", [["count", "place"], ["coop"], ["coop_cluster"], ["warp"]])
def test_a_mapping_module_holds_its_plan_kernels_alone(id_dtype, kernels):
    """MAPPING_IDS and MAPPING_KERNELS (a plan's kernel_defines): the kernels
    a plan launches, for its id dtype, and no other."""
    nvrtc_or_skip()
    from cupy_moe.mapping.gpu import kernel_defines

    suffix = "_i64" if id_dtype == "int64" else "_i32"
    names = [f"mapping_{kernel}{suffix}" for kernel in kernels]
    cubin = compile_for_arch("mapping.cu", kernel_defines(id_dtype, names), "sm_90")
    assert [name for name in MAPPING_KERNELS if name.encode() + b"\0" in cubin] == sorted(
        names, key=MAPPING_KERNELS.index)


def test_every_source_is_covered():
    # combine.cu and quantize.cu: tests/test_combine_compile.py, test_quantize_compile.py
    sources = {path.name for path in kernel_dir().glob("*.cu")}
    assert sources == {param.values[0] for param in VARIANTS} | {
        "mapping.cu", "combine.cu", "quantize.cu"}


def test_compile_error_carries_file_and_log(tmp_path, monkeypatch):
    nvrtc_or_skip()
    import cupy_moe.runtime.loader as loader

    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void k() { this_is_not_declared(); }\n')
    monkeypatch.setattr(loader, "kernel_dir", lambda: tmp_path)
    loader.kernel_source.cache_clear()
    loader.sources_hash.cache_clear()
    try:
        with pytest.raises(KernelCompileError, match=r"broken\.cu.*sm_90(.|\n)*this_is_not_declared"):
            compile_for_arch("broken.cu", (), "sm_90")
    finally:
        loader.kernel_source.cache_clear()
        loader.sources_hash.cache_clear()


def test_sources_hash_tracks_every_file(tmp_path, monkeypatch):
    import cupy_moe.runtime.loader as loader

    (tmp_path / "a.cu").write_text("// a\n")
    (tmp_path / "common.cuh").write_text("// v1\n")
    (tmp_path / "detail").mkdir()
    (tmp_path / "detail" / "deep.cuh").write_text("// v1\n")
    monkeypatch.setattr(loader, "kernel_dir", lambda: tmp_path)
    loader.sources_hash.cache_clear()
    try:
        before = loader.sources_hash()
        (tmp_path / "common.cuh").write_text("// v2\n")
        loader.sources_hash.cache_clear()
        after = loader.sources_hash()
        assert before != after
        assert f"-DCUPY_MOE_SOURCES_HASH=0x{after}ULL" in loader.compile_options()
        # a header in a subfolder counts too
        (tmp_path / "detail" / "deep.cuh").write_text("// v2\n")
        loader.sources_hash.cache_clear()
        assert loader.sources_hash() not in (before, after)
    finally:
        loader.sources_hash.cache_clear()


def test_compiles_ask_for_ieee_float32():
    # CuPy's own compile path adds -ftz=true; the loader compiles with NVRTC
    # itself, so that denormals survive (reduce_fused, the fp8 producers)
    from cupy_moe.runtime import loader

    options = loader.compile_options()
    for option in ("-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=false"):
        assert option in options
    assert not any(option.startswith("-ftz=true") or "fast-math" in option for option in options)


def test_compiled_modules_are_cached_on_disk(tmp_path, monkeypatch):
    nvrtc_or_skip()
    from cupy_moe.runtime import loader

    monkeypatch.setenv("CUPY_MOE_CACHE_DIR", str(tmp_path))
    umask = os.umask(0o027)  # the loader reads it from /proc (os.umask sets it)
    try:
        assert loader._umask() == 0o027
        first = loader._compile("mapping.cu", (), "sm_90", True)
    finally:
        os.umask(umask)
    assert first.parent == tmp_path and first.read_bytes()[:4] == b"\x7fELF"
    # readable as the umask allows (a shared cache), not a temporary file's 0600
    assert first.stat().st_mode & 0o777 == 0o640
    whole = first.read_bytes()
    ptx = loader._compile("mapping.cu", (), "compute_90", False)
    assert ptx.suffix == ".ptx" and b".target sm_90" in ptx.read_bytes()
    assert ptx.read_bytes().endswith(b"\0")  # cuModuleLoadData reads PTX up to a NUL
    from cupy.cuda import nvrtc

    def no_nvrtc(*args):
        raise AssertionError("compiled although the cache holds the binary")
    with monkeypatch.context() as patch:  # the next calls find the files, no NVRTC
        patch.setattr(nvrtc, "createProgram", no_nvrtc)
        assert loader._compile("mapping.cu", (), "sm_90", True) == first
        assert loader._compile("mapping.cu", (), "compute_90", False) == ptx
    # a file cut short (empty, or short of its section headers; PTX without
    # its NUL) is compiled again, not handed to the driver
    for path, cut, cubin in ((first, b"", True), (first, whole[:len(whole) // 2], True),
                             (ptx, ptx.read_bytes()[:-1], False), (ptx, b"", False)):
        path.write_bytes(cut)
        again = loader._compile("mapping.cu", (), "sm_90" if cubin else "compute_90", cubin)
        assert again == path and loader._holds_whole_binary(path, cubin)
    assert first.read_bytes() == whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, ptx.name])


def test_a_cache_dir_with_a_tilde_is_under_home(tmp_path, monkeypatch):
    from cupy_moe.runtime import loader

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CUPY_MOE_CACHE_DIR", "~/kernels")
    assert loader._cache_dir() == tmp_path / "kernels"


def test_a_failed_cache_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    from cupy_moe.runtime import loader

    def full_disk(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(loader.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        loader._write_atomically(tmp_path / "k.cubin", b"\x7fELF")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cache", ["unwritable", "no-home"])
def test_without_a_cache_a_private_folder_serves_and_is_removed_at_exit(cache, tmp_path,
                                                                        monkeypatch):
    """A cache folder that cannot be made, or no home folder known (a
    container's user without a passwd entry and no HOME): a private folder,
    with a warning, removed at exit (they once piled up in /tmp, one a
    test run)."""
    nvrtc_or_skip()
    from cupy_moe.runtime import loader

    if cache == "unwritable":
        blocked = tmp_path / "file"
        blocked.write_text("not a folder")
        monkeypatch.setenv("CUPY_MOE_CACHE_DIR", str(blocked / "cache"))
    else:
        monkeypatch.delenv("CUPY_MOE_CACHE_DIR", raising=False)

        def no_home():
            raise RuntimeError("Could not determine home directory.")
        monkeypatch.setattr(loader.Path, "home", no_home)
    monkeypatch.setattr(loader, "_private_dir", None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # mkdtemp's folder
    at_exit = []
    monkeypatch.setattr(loader.atexit, "register",
                        lambda *call, **options: at_exit.append((call, options)))
    with pytest.warns(RuntimeWarning, match="this process compiles into .* \\(removed at exit\\)"):
        path = loader._compile("mapping.cu", (), "sm_80", True)
    assert path.parent == loader._private_dir and path.parent.parent == tmp_path
    assert path.read_bytes()[:4] == b"\x7fELF"
    [((remove, folder), options)] = at_exit
    assert folder == path.parent and options == {"ignore_errors": True}
    remove(folder, **options)
    assert not folder.exists()


def test_a_package_without_its_kernel_sources_says_so(tmp_path, monkeypatch):
    import cupy_moe.runtime.loader as loader

    monkeypatch.setattr(loader, "_PACKAGE_DIR", tmp_path / "cupy_moe")
    loader.kernel_dir.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match=re.escape(
                f"kernels_cu/ not found inside {tmp_path / 'cupy_moe'} nor beside it; the "
                "installation is incomplete")):
            loader.kernel_dir()
    finally:
        loader.kernel_dir.cache_clear()  # the real one again for the other tests


@pytest.mark.parametrize("sf_mode", [0, 1, 2])
def test_the_row_by_row_zero_fill_compiles(sf_mode):
    """ExpandTuning.zero_fill_runs=0 (no EXPAND_ZERO_RUNS: zero-fill row by
    row), alone and with the register kernel compiled for a 3 KiB row (one
    access a thread); the default (runs) compiles above."""
    nvrtc_or_skip()
    from cupy_moe.expand.plan import kernel_defines
    from cupy_moe.expand.tuning import DEFAULT_TUNING, ExpandTuning

    assert ("EXPAND_ZERO_RUNS", 1) in kernel_defines(sf_mode, DEFAULT_TUNING)
    defines = kernel_defines(sf_mode, ExpandTuning(zero_fill_runs=0))
    assert not any(name == "EXPAND_ZERO_RUNS" for name, _ in defines)
    for extra in ((), (("EXPAND_ROW_BYTES", 3072), ("EXPAND_VECS_PER_THREAD", 1))):
        cubin = compile_for_arch("expand.cu", defines + extra, "sm_90")
        assert b"expand_to_fused_v16" in cubin


@pytest.mark.parametrize("sf_mode", [0, 1, 2])
def test_the_unrolled_runs_compile(sf_mode):
    """ExpandTuning.zero_fill_runs=2 (EXPAND_ZERO_RUNS 2: each run's store
    loop unrolled by 4)."""
    nvrtc_or_skip()
    from cupy_moe.expand.plan import kernel_defines
    from cupy_moe.expand.tuning import ExpandTuning

    defines = kernel_defines(sf_mode, ExpandTuning(zero_fill_runs=2))
    assert ("EXPAND_ZERO_RUNS", 2) in defines
    cubin = compile_for_arch("expand.cu", defines, "sm_90")
    assert b"expand_to_fused_v16" in cubin


@pytest.mark.parametrize("sf_mode", [0, 1, 2])
def test_the_bounded_register_kernels_compile(sf_mode):
    """ExpandTuning.register_min_blocks=8 (EXPAND_MIN_BLOCKS): the register
    kernels compile under __launch_bounds__(256, 8)."""
    nvrtc_or_skip()
    from cupy_moe.expand.plan import kernel_defines
    from cupy_moe.expand.tuning import ExpandTuning

    defines = kernel_defines(sf_mode, ExpandTuning(register_min_blocks=8))
    assert ("EXPAND_MIN_BLOCKS", 8) in defines
    cubin = compile_for_arch("expand.cu", defines, "sm_90")
    assert b"expand_to_fused_v16" in cubin and b"expand_to_fused_v16_overlapped" in cubin


@pytest.mark.parametrize("unroll", [(), (("EXPAND_ROWS_UNROLL", 3),)])
@pytest.mark.parametrize("sf_mode", [0, 1, 2])
def test_the_rows_kernel_by_position_compiles(sf_mode, unroll):
    """EXPAND_ROWS_BY_POSITION 1 in every SF mode (the host launches it with
    none or row-major scale factors; column-major ones compile to a trap),
    with room for 16 KiB rows or fitted to a row (3 vectors a thread)."""
    nvrtc_or_skip()
    from cupy_moe.expand.plan import kernel_defines
    from cupy_moe.expand.tuning import DEFAULT_TUNING

    defines = (*kernel_defines(sf_mode, DEFAULT_TUNING, "expand_to_fused_rows"),
               ("EXPAND_ROWS_THREADS", 256), ("EXPAND_ROWS_BY_POSITION", 1), *unroll)
    assert b"expand_to_fused_rows" in compile_for_arch("expand.cu", defines, "sm_90")


def test_nowhere_to_write_compiled_kernels_is_one_clear_error(tmp_path, monkeypatch):
    """No writable cache and no temporary folder: an OSError naming both and
    the variable that fixes it (not a bare errno from deep inside)."""
    nvrtc_or_skip()
    from cupy_moe.runtime import loader

    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("CUPY_MOE_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.setattr(loader, "_private_dir", None)

    def full_tmp(**kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(tempfile, "mkdtemp", full_tmp)
    with pytest.raises(OSError, match=(
            r"cupy_moe cannot write compiled kernels to its cache \(.*cache: .*\) nor to a "
            r"temporary folder \(\[Errno 28\] No space left on device\); set "
            r"CUPY_MOE_CACHE_DIR to a writable folder")):
        loader._compile("mapping.cu", (), "sm_80", True)
