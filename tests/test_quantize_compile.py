"""kernels_cu/quantize.cu compiles with NVRTC for sm_80 and sm_90, GPU or not,
in every variant the GPU backend can ask the loader for; and the kernels'
argument struct is laid out as the host packs it. Where CI=true a missing
CuPy/NVRTC is an error, not a skip (as in test_nvrtc_compile.py)."""

from __future__ import annotations

import re

import pytest
from helpers import cubin_code, nvrtc_or_skip

from cupy_moe.quantize.launch_shape import SEGMENT_WIDTHS, QuantizeTuning
from cupy_moe.runtime.loader import compile_for_arch, compile_options, kernel_dir

KERNELS = [*(f"{op}_{dtype}_{access}" for op in ("quantize_fp8", "swiglu_quantize_fp8")
             for dtype in ("bf16", "f32") for access in ("vec", "any")),
           "quantize_fp8_bf16_tiles", "quantize_fp8_f32_tiles",
           "quantize_fp8_bf16_vec1", "quantize_fp8_f32_vec1",
           *(f"swiglu_quantize_fp8_{dtype}_{rows}" for dtype in ("bf16", "f32")
             for rows in ("rows", "rows768", "rows512", "rows256"))]
# the few-live-rows kernels, and the *_slots twins of the coalesced swiglu ones
SWIGLU_EXTRA = [f"swiglu_quantize_fp8_{dtype}_{name}" for dtype in ("bf16", "f32")
                for name in ("vec1", "block_rows", "vec_slots", "vec1_slots", "rows_slots",
                             "rows768_slots", "rows512_slots", "rows256_slots")]
# compiled only where a tuning's segment widths name 256 (QUANTIZE_ROWS256)
ROWS256 = [name for name in KERNELS + SWIGLU_EXTRA if "_rows256" in name]
SELFTESTS = ["quantize_selftest_reciprocal", "quantize_selftest_e4m3",
             "quantize_selftest_product_nan", "quantize_selftest_swiglu"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(("software_e4m3", "rows_min_blocks", "word_stores", "pad_words"), [
    (False, 0, False, (True, True)), (True, 0, False, (True, True)),
    (False, 5, False, (True, True)), (False, 0, True, (True, True)),
    (False, 0, False, (False, True)), (False, 0, False, (True, False)),
    (False, 0, True, (False, False)), (False, 0, True, (True, True, True))],
    ids=["e4m3-default", "e4m3-software", "rows-min-blocks-5", "packed-word-stores",
         "vec1-packed-pad-bytes", "tiles-packed-pad-bytes", "packed-word-stores-everywhere",
         "packed-sf-pad-words-everywhere"])
def test_every_quantize_variant_compiles(arch, software_e4m3, rows_min_blocks, word_stores,
                                         pad_words):
    nvrtc_or_skip()
    tuning = QuantizeTuning(software_e4m3=software_e4m3, rows_min_blocks=rows_min_blocks,
                            packed_sf_word_stores=word_stores,
                            vec1_packed_pad_words=pad_words[0],
                            tiles_packed_pad_words=pad_words[1],
                            packed_sf_pad_words=len(pad_words) > 2 and pad_words[2])
    cubin = compile_for_arch("quantize.cu", tuning.defines(), arch)
    assert cubin[:4] == b"\x7fELF"
    for name in KERNELS + SWIGLU_EXTRA + SELFTESTS:
        # *_rows256 only where a tuning's widths name 256 (below)
        assert (name.encode() in cubin) == (name not in ROWS256), name


@pytest.mark.parametrize("widths", [{"segment_columns": (256, 768)},
                                    {"fill_segment_columns": (256,)}])
def test_the_rows256_kernels_compile_where_a_tuning_names_them(widths):
    nvrtc_or_skip()
    cubin = compile_for_arch("quantize.cu", QuantizeTuning(**widths).defines(), "sm_90")
    for name in KERNELS + SWIGLU_EXTRA + SELFTESTS:
        assert name.encode() in cubin, name


def _held(name: str, cubin: bytes) -> bool:
    # the whole name ("quantize_fp8_bf16_vec" is inside "..._vec1" and
    # "swiglu_quantize_fp8_bf16_vec"): NUL-terminated, no letter before
    return re.search(rb"(?<![a-z_])" + name.encode() + rb"\0", cubin) is not None


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("in_dtype", ["bfloat16", "float32"])
def test_a_plan_module_holds_its_own_op_and_input_dtype_alone(swiglu, in_dtype):
    """kernel_set_defines without a kernel (QUANTIZE_OPS / QUANTIZE_INPUTS):
    every kernel of the op and input dtype, the self-tests, and no other op's
    or dtype's kernel."""
    nvrtc_or_skip()
    from cupy_moe.quantize.gpu import kernel_set_defines
    from cupy_moe.quantize.rules import QuantizeProblem

    problem = QuantizeProblem(1, 1, in_dtype, 128, False, False, False, swiglu=swiglu)
    defines = (*QuantizeTuning().defines(), *kernel_set_defines(problem))
    cubin = compile_for_arch("quantize.cu", defines, "sm_90")
    prefix = f"{'swiglu_quantize_fp8' if swiglu else 'quantize_fp8'}_"
    dtype = "f32" if in_dtype == "float32" else "bf16"
    for name in KERNELS + SWIGLU_EXTRA:
        own = name.startswith(prefix + dtype + "_")
        assert _held(name, cubin) == (own and name not in ROWS256), name
    for name in SELFTESTS:
        assert name.encode() in cubin, name


@pytest.mark.parametrize("name", KERNELS + SWIGLU_EXTRA)
def test_a_plan_module_holds_the_one_kernel_it_launches(name):
    """kernel_set_defines(problem, name) (QUANTIZE_KERNELS: KERNEL_FORMS'
    bit of the name's form): that kernel, the self-tests, and no other op
    kernel; the *_rows256 ones where the tuning names 256 (QUANTIZE_ROWS256)."""
    nvrtc_or_skip()
    from cupy_moe.quantize.gpu import kernel_set_defines
    from cupy_moe.quantize.rules import QuantizeProblem

    problem = QuantizeProblem(1, 1, "float32" if "_f32_" in name else "bfloat16", 128, False,
                              False, False, swiglu=name.startswith("swiglu_"))
    tuning = QuantizeTuning(segment_columns=(256,)) if name in ROWS256 else QuantizeTuning()
    cubin = compile_for_arch("quantize.cu",
                             (*tuning.defines(), *kernel_set_defines(problem, name)), "sm_90")
    assert [other for other in KERNELS + SWIGLU_EXTRA if _held(other, cubin)] == [name]
    assert all(selftest.encode() in cubin for selftest in SELFTESTS)


def test_a_kernel_alone_is_the_same_code_as_in_the_whole_module():
    """QUANTIZE_KERNELS only leaves kernels out: swiglu's bf16 kernels (the
    most of one module), each compiled alone, are byte for byte the machine
    code of the module of all of them, so a plan's speed does not depend on
    the split."""
    nvrtc_or_skip()
    from cupy_moe.quantize.gpu import kernel_set_defines
    from cupy_moe.quantize.rules import QuantizeProblem

    problem = QuantizeProblem(1, 1, "bfloat16", 128, False, False, False, swiglu=True)
    tuning = QuantizeTuning().defines()
    whole = cubin_code(compile_for_arch("quantize.cu", (*tuning, *kernel_set_defines(problem)),
                                        "sm_90"))
    names = [name for name in SWIGLU_EXTRA + KERNELS
             if name.startswith("swiglu_quantize_fp8_bf16_") and name not in ROWS256]
    assert len(names) == 12
    for name in names:
        alone = cubin_code(compile_for_arch(
            "quantize.cu", (*tuning, *kernel_set_defines(problem, name)), "sm_90"))
        assert alone[name] == whole[name], name


def test_the_self_tests_compile_alone():
    """QUANTIZE_OPS=0 (the GPU tests' self-test module): no op kernel."""
    nvrtc_or_skip()
    cubin = compile_for_arch("quantize.cu", (*QuantizeTuning().defines(), ("QUANTIZE_OPS", 0)),
                             "sm_90")
    assert all(name.encode() in cubin for name in SELFTESTS)
    assert not any(name.encode() in cubin for name in KERNELS + SWIGLU_EXTRA)


def test_the_gpu_backend_names_only_compiled_kernels():
    from cupy_moe.quantize.gpu import kernel_name
    from cupy_moe.quantize.rules import QuantizeProblem

    names = {kernel_name(QuantizeProblem(1, 1, dtype, 128, False, False, False, swiglu=swiglu),
                         vector, rows=swiglu and vector and rows, segment_columns=width,
                         tiles=tiles and not swiglu)
             for dtype in ("bfloat16", "uint16", "float32") for swiglu in (False, True)
             for vector in (False, True) for rows in (False, True) for width in SEGMENT_WIDTHS
             for tiles in (False, True)}
    # quantize_fp8's few-columns kernel
    names |= {kernel_name(QuantizeProblem(1, 1, dtype, 128, False, False, col_major), True,
                          narrow="vec1")
              for dtype in ("bfloat16", "float32") for col_major in (False, True)}
    assert names == set(KERNELS)
    # swiglu's few-live-rows kernels and the *_slots twins (never of *_block_rows)
    swiglu_names = {kernel_name(QuantizeProblem(1, 1, dtype, 128, False, False, False,
                                                swiglu=True),
                                True, rows=rows, narrow="" if rows else narrow,
                                segment_columns=width, by_slot=by_slot)
                    for dtype in ("bfloat16", "float32") for rows in (False, True)
                    for width in SEGMENT_WIDTHS for by_slot in (False, True)
                    for narrow in ("", "vec1", "block_rows")
                    if not (by_slot and narrow == "block_rows")}
    assert swiglu_names - set(KERNELS) == set(SWIGLU_EXTRA)
    # the element-access kernel has no *_slots twin
    assert kernel_name(QuantizeProblem(1, 1, "bfloat16", 128, False, False, False, swiglu=True),
                       False, by_slot=True) == "swiglu_quantize_fp8_bf16_any"


def _c_field_type(declaration: str) -> str:
    if "*" in declaration:
        return "ptr"
    return {"i64": "i64", "int": "i32"}[declaration.split()[-2]]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_argument_struct_matches_the_host_packing(arch):
    """QuantizeArgs's fields (names and types, in order) are the host's
    (gpu.QUANTIZE_ARGS), and NVRTC agrees on the struct's size: a field
    added, moved or retyped on one side only fails here."""
    nvrtc_or_skip()
    from cupy.cuda import nvrtc

    from cupy_moe.quantize import gpu

    source = (kernel_dir() / "quantize.cu").read_text()
    body = re.search(r"struct QuantizeArgs \{(.*?)\};", source, re.DOTALL).group(1)
    declarations = [line.split("//")[0].strip().rstrip(";") for line in body.splitlines()]
    declarations = [d for d in declarations if d]
    c_fields = [(d.replace("*", " * ").split()[-1], _c_field_type(d)) for d in declarations]
    host_types = {"Q": "ptr", "q": "i64", "i": "i32"}
    host_fields = list(zip(gpu.QUANTIZE_ARGS.names,
                           [host_types[c] for c in gpu.QUANTIZE_ARGS.packer.format if c in "Qqi"],
                           strict=True))
    assert c_fields == host_fields
    program_source = ('#include "quantize.cu"\n'
                      f'static_assert(sizeof(QuantizeArgs) == {gpu.QUANTIZE_ARGS.size}, '
                      '"QuantizeArgs size");\n')
    program = nvrtc.createProgram(program_source, "quantize_layout.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, [*compile_options(()), f"-arch={arch}"])
        except nvrtc.NVRTCError:
            pytest.fail(nvrtc.getProgramLog(program))
    finally:
        nvrtc.destroyProgram(program)
