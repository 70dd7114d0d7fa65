"""kernels_cu/combine.cu compiles with NVRTC for sm_80 and sm_90, GPU or not,
and its PTX keeps the numerics and the argument layout the host relies on.

As tests/test_nvrtc_compile.py: where CI=true a missing CuPy/NVRTC is an
error, not a skip.
"""

from __future__ import annotations

import re
import uuid

import pytest
from helpers import nvrtc_or_skip

from cupy_moe.combine.launch_shape import (
    SPARSE_WIDE_OPTIONS,
    WIDE_OPTIONS,
    auto_combine_shape,
    token_rows_options,
)
from cupy_moe.runtime.loader import compile_for_arch, compile_options, kernel_source

SOURCE = "combine.cu"


def _kernel_names() -> list[str]:
    from cupy_moe.combine.gpu import KERNEL_PREFIX, VEC_WIDTHS

    return [f"{KERNEL_PREFIX[fmt]}_v{width}" for fmt in KERNEL_PREFIX
            for width in VEC_WIDTHS[fmt]]


def _ptx(arch: str, defines: tuple[tuple[str, int], ...] = ()) -> str:
    from cupy.cuda import nvrtc

    program = nvrtc.createProgram(kernel_source(SOURCE), SOURCE, [], [])
    try:
        nvrtc.compileProgram(program, [*compile_options(defines), f"-arch={arch}"])
        ptx = nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def _entry(ptx: str, name: str) -> str:
    match = re.search(rf"\.entry {name}\((.|\n)*?\n}}", ptx)
    assert match, f"{name} is not in the PTX"
    return match.group(0)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_combine_kernel_compiles(arch):
    nvrtc_or_skip()
    cubin = compile_for_arch(SOURCE, (), arch)
    assert cubin[:4] == b"\x7fELF"
    for name in [*_kernel_names(), "reduce_fused_first_out_of_range"]:
        assert name.encode() in cubin, name


@pytest.mark.parametrize("kernel", ["reduce_fused_bf16_v16", "reduce_fused_f16_v2",
                                    "reduce_fused_f32_v4", "reduce_fused_first_out_of_range"])
def test_a_plan_module_holds_one_kernel_and_the_validate_kernel(kernel):
    """kernel_defines(format, width) (a plan's module): that reduce_fused
    kernel alone beside the validate kernel; the validate call's module
    (COMBINE_ONE_FORMAT=-1): the validate kernel alone."""
    nvrtc_or_skip()
    from cupy_moe.combine.gpu import _CHECK_ONLY, kernel_defines

    if kernel == "reduce_fused_first_out_of_range":
        defines = _CHECK_ONLY
    else:
        defines = kernel_defines(kernel.split("_")[2], int(kernel.rsplit("_v", 1)[1]))
    cubin = compile_for_arch(SOURCE, defines, "sm_90")
    for name in [*_kernel_names(), "reduce_fused_first_out_of_range"]:
        held = name.encode() + b"\0" in cubin
        assert held == (name in (kernel, "reduce_fused_first_out_of_range")), name


@pytest.mark.parametrize("slot_batch", [1, 3, 16])
def test_other_slot_batches_compile(slot_batch):
    """COMBINE_SLOT_BATCH only trades registers for loads in flight: any
    value compiles (the host does not depend on it)."""
    nvrtc_or_skip()
    cubin = compile_for_arch(SOURCE, (("COMBINE_SLOT_BATCH", slot_batch),), "sm_90")
    assert b"reduce_fused_bf16_v16" in cubin


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_ptx_rounds_as_the_numpy_oracle(arch):
    """Every float operation of the reduce kernels is an explicitly rounded
    fma.rn.f32 / mul.rn.f32 (nothing contracted or fused differently), and
    nothing flushes denormals to zero."""
    nvrtc_or_skip()
    ptx = _ptx(arch)
    assert ".ftz" not in ptx
    for name in _kernel_names():
        body = _entry(ptx, name)
        float_ops = set(re.findall(r"\b((?:fma|mul|add|sub|div|neg)(?:\.[a-z0-9]+)*\.f32)\b",
                                   body))
        assert float_ops <= {"fma.rn.f32", "mul.rn.f32"}, (name, float_ops)
        assert "fma.rn.f32" in float_ops, name


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_float32_out_kernels_store_the_sums_unrounded(arch):
    """COMBINE_OUT_F32 (a bf16 / fp16 call's float32 out): the 2-byte kernels
    keep the fma chain and convert nothing back to their dtype; the float32
    kernels are the same code as without it."""
    nvrtc_or_skip()
    ptx = _ptx(arch, (("COMBINE_OUT_F32", 1),))
    plain = _ptx(arch)
    for name in _kernel_names():
        body = _entry(ptx, name)
        assert "fma.rn.f32" in body, name
        if name.startswith("reduce_fused_f32"):
            assert body == _entry(plain, name), name
            continue
        assert not re.search(r"cvt\.rn\.(bf16|f16|bf16x2)\.f32", body), name
        assert re.search(r"cvt\.rn\.(bf16|f16|bf16x2)\.f32|and\.b32.*-65536|shr\.u32",
                         _entry(plain, name)), name


def _host_offsets(layout) -> list[int]:
    """Byte offset of each field of an ArgStruct, as the host packs it."""
    offsets = []
    for i in range(len(layout.names)):
        values = [0] * len(layout.names)
        values[i] = 0x7B
        offsets.append(layout.packer.pack(*values).index(0x7B))
    return offsets


# ld.param[.v2|.v4].{u,s,b}BITS dest, [NAME_param_0+OFFSET]
_PARAM_LOAD = re.compile(
    r"ld\.param\.(?:(v[24])\.)?[usb](\d+)\s+[^\[]*\[(\w+)_param_0(?:\+(\d+))?\]")


@pytest.mark.parametrize("kernel", ["reduce_fused_bf16_v16", "reduce_fused_f32_v4",
                                    "reduce_fused_f16_v2", "reduce_fused_first_out_of_range"])
def test_argument_block_matches_the_host_packing(kernel):
    """The kernel's by-value struct has the size the host packs, and every
    field the kernel reads starts where the host writes one."""
    nvrtc_or_skip()
    from cupy_moe.combine.gpu import CHECK_ARGS, COMBINE_ARGS

    layout = CHECK_ARGS if kernel == "reduce_fused_first_out_of_range" else COMBINE_ARGS
    body = _entry(_ptx("compute_90"), kernel)
    size = re.search(rf"\.param \.align \d+ \.b8 {kernel}_param_0\[(\d+)\]", body)
    assert size and int(size.group(1)) == layout.size
    fields = set(_host_offsets(layout))
    read = set()
    for vector, bits, _, offset in _PARAM_LOAD.findall(body):
        count = int(vector[1]) if vector else 1
        read |= {int(offset or 0) + j * int(bits) // 8 for j in range(count)}
    assert read and read <= fields, (sorted(read), sorted(fields))


@pytest.mark.parametrize("vecs,batch,warp_slots", [(2, 8, 0), (4, 8, 0), (4, 2, 0), (1, 16, 0),
                                                   (4, 4, 1), (1, 8, 1), (2, 16, 1)])
def test_the_multi_vector_variants_compile(vecs, batch, warp_slots):
    """COMBINE_VECS, COMBINE_SLOT_BATCH and COMBINE_WARP_SLOTS (launch_shape's
    vecs_per_thread, slot_batch, warp_slots) are compiled on demand."""
    nvrtc_or_skip()
    cubin = compile_for_arch(SOURCE, (("COMBINE_VECS", vecs), ("COMBINE_SLOT_BATCH", batch),
                                      ("COMBINE_WARP_SLOTS", warp_slots)), "sm_90")
    assert b"reduce_fused_bf16_v16" in cubin and b"reduce_fused_f32_v4" in cubin


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("variant", ["default", "wide", "sparse", "rows-7168", "rows-2048",
                                     "rows-2048-nc", "rows-7168-few-live"])
def test_no_kernel_spills_registers(arch, variant):
    """Spilled registers would put local-memory traffic beside the row loads
    (the thread bound alone once made ptxas spill: see COMBINE_MIN_BLOCKS).
    The variants reduce_fused picks by itself (auto_combine_shape): the
    default, the many-token one (its warps walking live slots: with a lane
    test in the FMA loop it spilled 8 bytes in the 16-byte bf16 kernel), the
    streamed one of sparse plans, and token_rows on 7168- and 2048-column
    rows (7 and 2 vectors a thread, K = 8), the latter with its row loads by
    the read-only path too (calls in half the L2), the former with the
    read-only path for tokens with few live slots (its slot loop twice); the
    others are sweep options."""
    nvrtc_or_skip()
    row_vecs, options = {"default": (896, None), "wide": (896, WIDE_OPTIONS),
                         "sparse": (896, SPARSE_WIDE_OPTIONS),
                         "rows-7168": (896, token_rows_options(896, 8)),
                         "rows-2048": (256, token_rows_options(256, 8)),
                         "rows-2048-nc": (256, {**token_rows_options(256, 8),
                                                "load_hint": "nc"}),
                         "rows-7168-few-live": (896, {**token_rows_options(896, 8),
                                                      "few_live_load_hint": "nc"})}[variant]
    defines = () if options is None else auto_combine_shape(4096, row_vecs, 132, top_k=8,
                                                            **options).defines()
    _assert_no_spills(defines, arch)


def _assert_no_spills(defines: tuple[tuple[str, int], ...], arch: str) -> None:
    """ptxas's report of every kernel of the module: no spill stores or loads.

    The source gets a variable of a name of its own each time: NVRTC 13.0
    (the lent H100's) serves a PTX it has assembled before, in this process
    or an earlier one, from a cache, and then ptxas reports nothing; on
    sm_80 the bulk variants' kernels are all ``__trap()``, the same PTX
    whatever their defines. The variable makes every PTX new and changes no
    kernel."""
    from cupy.cuda import nvrtc

    nonce = f"\n__device__ int spill_check_{uuid.uuid4().hex};\n"
    program = nvrtc.createProgram(kernel_source(SOURCE) + nonce, SOURCE, [], [])
    try:
        nvrtc.compileProgram(program, [*compile_options(defines), f"-arch={arch}",
                                       "--ptxas-options=-v"])
        log = nvrtc.getProgramLog(program)
    finally:
        nvrtc.destroyProgram(program)
    log = (log.decode(errors="replace") if isinstance(log, bytes) else log).replace("\0", "")
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(spills) == len(_kernel_names()) + 1, log
    assert all(stores == "0" and loads == "0" for stores, loads in spills), log


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(("vecs", "stages", "rounds"), [(1, 4, 1), (2, 2, 2), (4, 8, 4)])
def test_the_bulk_variants_compile_without_spills(arch, vecs, stages, rounds):
    """COMBINE_BULK_STAGES and COMBINE_BULK_ROUNDS (launch_shape's
    bulk_stages and bulk_rounds, sweep options): every kernel compiles for
    both architectures (before sm_90 the bulk body is a trap the host never
    launches), none spills, and the 16-byte kernels' float operations are
    the oracle's fma.rn / mul.rn alone."""
    nvrtc_or_skip()
    defines = (("COMBINE_VECS", vecs), ("COMBINE_BULK_STAGES", stages),
               ("COMBINE_BULK_ROUNDS", rounds))
    _assert_no_spills(defines, arch)
    if arch == "sm_90":
        ptx = _ptx("compute_90", defines)
        assert ".ftz" not in ptx and "cp.async.bulk.shared" in ptx
        for name in ("reduce_fused_f32_v16", "reduce_fused_bf16_v16", "reduce_fused_f16_v16"):
            # to the next entry: the mbarrier wait's own { } block ends a line in "}"
            body = ptx[ptx.index(f".entry {name}("):]
            end = body.find(".entry", 1)
            body = body if end < 0 else body[:end]
            float_ops = set(re.findall(
                r"\b((?:fma|mul|add|sub|div|neg)(?:\.[a-z0-9]+)*\.f32)\b", body))
            assert float_ops == {"fma.rn.f32", "mul.rn.f32"}, (name, float_ops)
