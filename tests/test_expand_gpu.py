"""GPU backend against the NumPy reference, bit for bit (marker ``gpu``).

Every test draws fresh random bits for its payloads (all fp8/bf16 codes,
NaN encodings, arbitrary float32 SF patterns) and, where it passes ``out=``,
poisons the buffer first. Runs with CuPy arrays and with CUDA torch tensors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cupy_moe._checks import align_up, sf_columns
from cupy_moe.workload_inputs import (
    fitted_routing,
    numpy_dtype,
    random_bits,
    workload_inputs,
)
from helpers import assert_bits_equal, bits

import cupy_moe
from cupy_moe import reference

cupy = pytest.importorskip("cupy")

from cupy_moe import _gpu  # noqa: E402


def _gpu_count() -> int:
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver
        return 0


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_gpu_count() == 0, reason="needs a CUDA GPU")]

try:
    import torch
    _HAS_TORCH_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    torch = None
    _HAS_TORCH_CUDA = False


# grid policies that force one kernel (the bulk ones wherever the device and
# the row's alignment allow them) whatever the batch size
_KERNEL_PATHS = {
    "bulk": {"BULK_MIN_BLOCKS": 0.0, "BULK_WHOLE_ROW_ZERO_FROM": math.inf},
    # whole-row zero-fill blocks on every row length, rows cut into 512-byte
    # chunks so that even short test rows span several y planes, the slots
    # split into 3 z planes (uneven for most K)
    "bulk-zero-rows": {"BULK_MIN_BLOCKS": 0.0, "BULK_WHOLE_ROW_ZERO_FROM": 0,
                       "BULK_MIN_CHUNK_BYTES": 512, "BULK_SPLIT_SLOTS_BELOW": math.inf,
                       "BULK_SLOT_PLANES": 3},
    "registers": {"BULK_MIN_BLOCKS": math.inf},
}


@pytest.fixture(params=sorted(_KERNEL_PATHS))
def kernel_path(request):
    """Force the bulk-copy kernel with either zero-fill layout, or the register kernel."""
    saved = dict(_gpu.GRID_POLICY)
    _gpu.configure(grid_policy=_KERNEL_PATHS[request.param])
    yield request.param
    _gpu.configure(grid_policy=saved)


KINDS = ["cupy", pytest.param("torch", marks=pytest.mark.skipif(
    not _HAS_TORCH_CUDA, reason="needs torch with CUDA"))]

# NumPy bit carriers of the payload dtypes, and their torch names.
_TORCH_DTYPE = {"bfloat16": "bfloat16", "float16": "float16", "float8_e4m3fn": "float8_e4m3fn",
                "float32": "float32", "int32": "int32", "uint8": "uint8"}


def to_device(kind: str, array: np.ndarray, dtype: str):
    """A device copy of ``array``'s bits, typed ``dtype`` (CuPy: bits where it has no such dtype)."""
    bits = np.ascontiguousarray(array).view(f"u{array.itemsize}" if dtype not in ("int32",) else "i4")
    if kind == "torch":
        bits_t = torch.from_numpy(bits.view(f"i{array.itemsize}") if array.itemsize > 1 else bits)
        return bits_t.cuda().view(getattr(torch, _TORCH_DTYPE[dtype]))
    if dtype in ("float16", "float32", "int32"):
        return cupy.asarray(bits).view(dtype)
    return cupy.asarray(bits)  # bf16 as uint16 bits, fp8 as uint8


def to_host_bits(kind: str, array) -> np.ndarray:
    """Raw bits of a device array, as unsigned ints, same shape and strides."""
    if kind == "torch":
        size = array.element_size()
        carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]
        host = array.view(carrier).cpu().numpy()
    else:
        host = cupy.asnumpy(array)
    return host.view(f"u{host.itemsize}")


def map_to_device(kind: str, array: np.ndarray):
    array = np.ascontiguousarray(array, dtype=np.int32)
    return torch.from_numpy(array).cuda() if kind == "torch" else cupy.asarray(array)


def padded_sf_bits(kind: str, out_sf, num_expanded: int, sf_cols: int) -> np.ndarray:
    """The whole [S, align(X, 4)] buffer behind a column-major SF view, as bits."""
    ld = align_up(num_expanded, 4)
    if kind == "torch":
        full = torch.as_strided(out_sf, (sf_cols, ld), (ld, 1))
    else:
        full = cupy.lib.stride_tricks.as_strided(out_sf, (sf_cols, ld), (ld * 4, 4))
    return to_host_bits(kind, full)


def check_expand(kind, x, token_topk_to_pos, pos_to_expert, *, out=None):
    dx = to_device(kind, x, x.dtype.name)
    dmap, dp2e = map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert)
    expected = reference.expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert)
    result = cupy_moe.expand_to_fused(dx, dmap, dp2e, out=out)
    if out is not None:
        assert result is out
    assert_bits_equal(to_host_bits(kind, result), expected, "expanded_x")
    return result


def check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, *, npc, col_major,
                         poison_outputs=False, rng=None):
    num_expanded = pos_to_expert.shape[0]
    dx, dsf = to_device(kind, x, x.dtype.name), to_device(kind, x_sf, x_sf.dtype.name)
    dmap, dp2e = map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert)
    out = out_sf = None
    if poison_outputs:
        out = to_device(kind, random_bits(rng, (num_expanded, x.shape[1]), x.dtype), x.dtype.name)
        ld = align_up(num_expanded, 4) if col_major else None
        buf_shape = (x_sf.shape[1], ld) if col_major else (num_expanded, x_sf.shape[1])
        buf = to_device(kind, random_bits(rng, buf_shape, x_sf.dtype), x_sf.dtype.name)
        out_sf = buf[:, :num_expanded].T if col_major else buf
    expected_x, expected_sf = reference.expand_to_fused_with_sf_numpy(
        x, x_sf, token_topk_to_pos, pos_to_expert, col_major=col_major)
    result_x, result_sf = cupy_moe.expand_to_fused_with_sf(
        dx, dsf, dmap, dp2e, num_per_channels=npc, use_tma_aligned_col_major_sf=col_major,
        out=out, out_sf=out_sf)
    if poison_outputs:
        assert result_x is out and result_sf is out_sf
    assert_bits_equal(to_host_bits(kind, result_x), expected_x, "expanded_x")
    assert tuple(result_sf.shape) == (num_expanded, x_sf.shape[1])
    if col_major:
        ld = align_up(num_expanded, 4)
        strides = tuple(result_sf.stride()) if kind == "torch" else tuple(
            s // 4 for s in result_sf.strides)
        if num_expanded > 1 and x_sf.shape[1] > 1:
            assert strides == (1, ld)
        full = padded_sf_bits(kind, result_sf, num_expanded, x_sf.shape[1])
        assert_bits_equal(full[:, :num_expanded], np.ascontiguousarray(expected_sf.T), "expanded_x_sf")
        assert not full[:, num_expanded:].any(), "pad columns of the SF buffer are not zero"
    else:
        assert_bits_equal(to_host_bits(kind, result_sf), expected_sf, "expanded_x_sf")


# -- the manifest workloads ---------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("workload", cupy_moe.load_workloads("expand_to_fused"),
                         ids=lambda w: w.label)
def test_manifest_expand(workload, kind, kernel_path):
    rng = np.random.default_rng()
    inputs = workload_inputs(workload, rng)
    x, token_topk_to_pos, pos_to_expert = (
        inputs["x"], inputs["token_topk_to_pos"], inputs["pos_to_expert"])
    check_expand(kind, x, token_topk_to_pos, pos_to_expert)
    poisoned = to_device(kind, random_bits(rng, (workload.num_expanded, workload.hidden),
                                              x.dtype), x.dtype.name)
    check_expand(kind, x, token_topk_to_pos, pos_to_expert, out=poisoned)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("workload", cupy_moe.load_workloads("expand_to_fused_with_sf"),
                         ids=lambda w: w.label)
def test_manifest_expand_with_sf(workload, kind, kernel_path):
    rng = np.random.default_rng()
    inputs = workload_inputs(workload, rng)
    for poison in (False, True):
        check_expand_with_sf(kind, inputs["x"], inputs["x_sf"], inputs["token_topk_to_pos"],
                             inputs["pos_to_expert"],
                             npc=workload.num_per_channels,
                             col_major=workload.use_tma_aligned_col_major_sf,
                             poison_outputs=poison, rng=rng)


# -- odd shapes, every vector width ----------------------------------------------
# The last three sizes of each list give rows of whole 16-byte vectors that the
# bulk kernel splits into chunks with a short last one (or takes whole).

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("top_k", [1, 9])
@pytest.mark.parametrize("hidden", [1, 7, 37, 577, 7169, 8, 1032, 8200])
def test_odd_hidden_bf16(hidden, top_k, kind, kernel_path):
    rng = np.random.default_rng()
    x = random_bits(rng, (23, hidden), numpy_dtype("bfloat16"))
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 23, top_k, 23 * top_k + 13,
                                                   num_experts=5, max_alignment=4)
    check_expand(kind, x, token_topk_to_pos, pos_to_expert)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["row-f32", "col-f32", "col-ue8m0"])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("top_k", [1, 9])
@pytest.mark.parametrize("hidden", [1, 7, 37, 577, 7169, 16, 2064, 16400])
def test_odd_hidden_with_sf(hidden, top_k, npc, layout, kind, kernel_path):
    rng = np.random.default_rng()
    col_major, sf_dtype = {"row-f32": (False, "float32"), "col-f32": (True, "float32"),
                           "col-ue8m0": (True, "int32")}[layout]
    num_tokens = 11
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
    s = sf_columns(hidden, npc, packed_ue8m0=sf_dtype == "int32")
    x_sf = random_bits(rng, (num_tokens, s), np.dtype(sf_dtype))
    for num_expanded in (num_tokens * top_k + 1, num_tokens * top_k + 6):  # X % 4 varies
        token_topk_to_pos, pos_to_expert = fitted_routing(rng, num_tokens, top_k, num_expanded,
                                                       num_experts=3, max_alignment=2)
        check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=npc,
                             col_major=col_major, poison_outputs=True, rng=rng)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["none", "row-f32", "col-ue8m0"])
@pytest.mark.parametrize("zero_rows", [1, 5, 32])
@pytest.mark.parametrize("num_tokens", [3, 40])
def test_zero_fill_block_sizes(zero_rows, num_tokens, layout, kind, kernel_path):
    # Padding scattered through X (alignment 4, dropped slots) and a tail; X
    # neither a multiple of the rows per zero-fill block nor of 4. Every row
    # count a warp ballot can cover, the last block short.
    saved = dict(_gpu.GRID_POLICY)
    _gpu.configure(grid_policy={"ZERO_ROWS_BULK": zero_rows, "ZERO_ROWS_REGISTERS": zero_rows})
    try:
        rng = np.random.default_rng()
        top_k, hidden = 4, 1024
        token_topk_to_pos, pos_to_expert = fitted_routing(rng, num_tokens, top_k, 263,
                                                          num_experts=7, max_alignment=4,
                                                          drop=0.3)
        assert (pos_to_expert < 0).sum() > 40
        if layout == "none":
            x = random_bits(rng, (num_tokens, hidden), numpy_dtype("bfloat16"))
            poisoned = to_device(kind, random_bits(rng, (263, hidden), x.dtype), "bfloat16")
            check_expand(kind, x, token_topk_to_pos, pos_to_expert, out=poisoned)
            return
        sf_dtype = "float32" if layout == "row-f32" else "int32"
        x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
        x_sf = random_bits(rng, (num_tokens, sf_columns(hidden, 128, packed_ue8m0=sf_dtype == "int32")),
                           np.dtype(sf_dtype))
        check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128,
                             col_major=layout != "row-f32", poison_outputs=True, rng=rng)
    finally:
        _gpu.configure(grid_policy=saved)


@pytest.mark.parametrize("offset_bytes", [0, 1, 2, 4, 8])
def test_misaligned_base_pointer_cupy(offset_bytes):
    # A contiguous x that starts off a 16-byte boundary takes a narrower access.
    rng = np.random.default_rng()
    num_tokens, hidden = 9, 64
    raw = cupy.asarray(rng.integers(0, 256, num_tokens * hidden + 16, dtype=np.uint8))
    dx = raw[offset_bytes:offset_bytes + num_tokens * hidden].reshape(num_tokens, hidden)
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, num_tokens, 3, 40, num_experts=4,
                                                   max_alignment=2)
    x_sf = random_bits(rng, (num_tokens, 1), np.dtype("float32"))
    out_x, out_sf = cupy_moe.expand_to_fused_with_sf(
        dx, cupy.asarray(x_sf), cupy.asarray(token_topk_to_pos), cupy.asarray(pos_to_expert),
        num_per_channels=128)
    expected_x, expected_sf = reference.expand_to_fused_with_sf_numpy(
        cupy.asnumpy(dx), x_sf, token_topk_to_pos, pos_to_expert, col_major=False)
    assert_bits_equal(cupy.asnumpy(out_x), expected_x, "expanded_x")
    assert_bits_equal(cupy.asnumpy(out_sf).view(np.uint32), expected_sf, "expanded_x_sf")


@pytest.mark.parametrize("kind", KINDS)
def test_fp8_every_byte_code(kind):
    x = np.arange(256, dtype=np.uint8).reshape(2, 128).view(numpy_dtype("float8_e4m3fn"))
    x_sf = np.array([[np.nan], [-0.0]], dtype=np.float32)
    token_topk_to_pos = np.array([[3, 0, -1], [1, -1, 2]], dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, 2, -1], dtype=np.int32)
    check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128,
                         col_major=False)


# -- empty and degenerate --------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("col_major", [False, True])
def test_no_tokens_gives_zeros(kind, col_major, kernel_path):
    rng = np.random.default_rng()
    x = np.zeros((0, 256), dtype=numpy_dtype("float8_e4m3fn"))
    x_sf = np.zeros((0, 1 if col_major else 2), dtype=np.int32 if col_major else np.float32)
    token_topk_to_pos = np.zeros((0, 8), dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, -1, 2, 2, -1], dtype=np.int32)  # expert rows too
    check_expand_with_sf(kind, x, x_sf, token_topk_to_pos, pos_to_expert, npc=128,
                         col_major=col_major, poison_outputs=True, rng=rng)
    check_expand(kind, np.zeros((0, 256), dtype=numpy_dtype("bfloat16")), token_topk_to_pos,
                 pos_to_expert)


@pytest.mark.parametrize("kind", KINDS)
def test_no_expanded_rows(kind):
    rng = np.random.default_rng()
    x = random_bits(rng, (3, 40), numpy_dtype("bfloat16"))
    token_topk_to_pos = np.array([[-1, 0], [2, -1], [-1, -1]], dtype=np.int32)  # all >= X
    result = check_expand(kind, x, token_topk_to_pos, np.zeros(0, dtype=np.int32))
    assert tuple(result.shape) == (0, 40)


# -- malformed maps stay inside the buffers --------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("col_major", [False, True])
def test_malformed_map_never_writes_past_outputs(kind, col_major, kernel_path):
    rng = np.random.default_rng()
    num_tokens, hidden, num_expanded, guard = 6, 96, 10, 64
    x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
    sf_dtype = np.dtype("int32" if col_major else "float32")
    s = sf_columns(hidden, 32, packed_ue8m0=col_major)
    x_sf = random_bits(rng, (num_tokens, s), sf_dtype)
    token_topk_to_pos = np.array(
        [[num_expanded, 0], [num_expanded + 1, -5], [2**31 - 1, 1], [-2**31, 2],
         [num_expanded + guard, 3], [4, 5]], dtype=np.int32)
    pos_to_expert = np.array([0, 0, 1, 1, 2, 2, -1, -1, -1, -1], dtype=np.int32)
    # outputs are the head of larger poisoned buffers; the tails are guards
    out_buf = to_device(kind, random_bits(rng, (num_expanded + guard, hidden), x.dtype),
                        "float8_e4m3fn")
    ld = align_up(num_expanded, 4)
    sf_rows = s * ld + guard if col_major else (num_expanded + guard) * s
    sf_buf = to_device(kind, random_bits(rng, (sf_rows,), sf_dtype), sf_dtype.name)
    guard_before = to_host_bits(kind, out_buf[num_expanded:]).copy()
    sf_guard_before = to_host_bits(kind, sf_buf[sf_rows - guard:]).copy()
    out = out_buf[:num_expanded]
    out_sf = (sf_buf[:s * ld].reshape(s, ld)[:, :num_expanded].T if col_major
              else sf_buf[:num_expanded * s].reshape(num_expanded, s))
    cupy_moe.expand_to_fused_with_sf(
        to_device(kind, x, "float8_e4m3fn"), to_device(kind, x_sf, sf_dtype.name),
        map_to_device(kind, token_topk_to_pos), map_to_device(kind, pos_to_expert),
        num_per_channels=32, use_tma_aligned_col_major_sf=col_major, out=out, out_sf=out_sf)
    assert np.array_equal(to_host_bits(kind, out_buf[num_expanded:]), guard_before)
    assert np.array_equal(to_host_bits(kind, sf_buf[sf_rows - guard:]), sf_guard_before)
    # the well-formed part of the map was still honoured
    got = to_host_bits(kind, out)
    assert np.array_equal(got[4], bits(x)[5]) and np.array_equal(got[5], bits(x)[5])
    assert not got[6:].any()


# -- validate=True -----------------------------------------------------------------

MALFORMED = {
    "out-of-range": ([[0, 1], [9, 2]], [0, 0, 1, -1]),
    "padding-target": ([[0, 1], [2, 3]], [0, 0, 1, -1]),
    "duplicate": ([[0, 1], [2, 1]], [0, 0, 1, -1]),
    "untargeted": ([[0, -1], [2, -1]], [0, 0, 1, -1]),
    "all-at-once": ([[1, 7], [1, 3]], [0, 0, 1, -1]),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_validate_reports_what_the_cpu_reports(case, kind):
    token_topk_to_pos = np.array(MALFORMED[case][0], dtype=np.int32)
    pos_to_expert = np.array(MALFORMED[case][1], dtype=np.int32)
    x = np.arange(2 * 16, dtype=np.uint16).reshape(2, 16).view(numpy_dtype("bfloat16"))
    with pytest.raises(ValueError) as cpu_error:
        cupy_moe.expand_to_fused(x, token_topk_to_pos, pos_to_expert, validate=True)
    with pytest.raises(ValueError) as gpu_error:
        cupy_moe.expand_to_fused(to_device(kind, x, "bfloat16"),
                                 map_to_device(kind, token_topk_to_pos),
                                 map_to_device(kind, pos_to_expert), validate=True)
    assert str(gpu_error.value) == str(cpu_error.value)


@pytest.mark.parametrize("kind", KINDS)
def test_validate_accepts_a_well_formed_map(kind):
    rng = np.random.default_rng()
    x = random_bits(rng, (300, 64), numpy_dtype("bfloat16"))
    topk_ids = rng.integers(0, 7, size=(300, 4))
    topk_ids[::5, 0] = -1
    token_topk_to_pos, pos_to_expert = reference.fused_mapping_numpy(topk_ids, 7, alignment=8)
    result = cupy_moe.expand_to_fused(to_device(kind, x, "bfloat16"),
                                      map_to_device(kind, token_topk_to_pos),
                                      map_to_device(kind, pos_to_expert), validate=True)
    assert_bits_equal(to_host_bits(kind, result),
                reference.expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert),
                "expanded_x")


# -- layouts, streams, graphs --------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_inputs(kind):
    rng = np.random.default_rng()
    wide = random_bits(rng, (12, 2 * 48), numpy_dtype("bfloat16"))
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 12, 3, 44, num_experts=4, max_alignment=2)
    d_wide = to_device(kind, wide, "bfloat16")
    dx = d_wide[:, ::2]  # every other column
    dmap = map_to_device(kind, np.asfortranarray(token_topk_to_pos))
    dmap = dmap.T.copy().T if kind == "cupy" else dmap.t().contiguous().t()
    assert not (dmap.flags.c_contiguous if kind == "cupy" else dmap.is_contiguous())
    result = cupy_moe.expand_to_fused(dx, dmap, map_to_device(kind, pos_to_expert))
    expected = reference.expand_to_fused_numpy(np.ascontiguousarray(wide[:, ::2]),
                                               token_topk_to_pos, pos_to_expert)
    assert_bits_equal(to_host_bits(kind, result), expected, "expanded_x")


def test_cupy_non_default_stream():
    rng = np.random.default_rng()
    x = random_bits(rng, (64, 512), numpy_dtype("bfloat16"))
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 64, 8, 600)
    with cupy.cuda.Stream(non_blocking=True) as stream:
        result = cupy_moe.expand_to_fused(to_device("cupy", x, "bfloat16"),
                                          cupy.asarray(token_topk_to_pos),
                                          cupy.asarray(pos_to_expert))
        host = cupy.asnumpy(result, stream=stream)
        stream.synchronize()
    assert_bits_equal(host.view(np.uint16), reference.expand_to_fused_numpy(
        x, token_topk_to_pos, pos_to_expert), "expanded_x")


@pytest.mark.skipif(not _HAS_TORCH_CUDA, reason="needs torch with CUDA")
def test_torch_side_stream_waits_for_its_producer():
    # The op must run on torch's current stream: here a side stream whose long
    # producer kernel writes x just before the call.
    rng = np.random.default_rng()
    x = random_bits(rng, (256, 2048), numpy_dtype("bfloat16"))
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 256, 8, 2300)
    source = to_device("torch", x, "bfloat16")
    dmap, dp2e = map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert)
    target = torch.zeros_like(source)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25 ms of spinning before the producer
        target.copy_(source)
        result = cupy_moe.expand_to_fused(target, dmap, dp2e)
    side.synchronize()
    assert_bits_equal(to_host_bits("torch", result),
                reference.expand_to_fused_numpy(x, token_topk_to_pos, pos_to_expert),
                "expanded_x")


@pytest.mark.skipif(not _HAS_TORCH_CUDA, reason="needs torch with CUDA")
@pytest.mark.parametrize("col_major", [False, True])
def test_cuda_graph_capture_and_replay_with_new_inputs(col_major, kernel_path):
    rng = np.random.default_rng()
    num_tokens, top_k, hidden, num_expanded, npc = 32, 8, 3072, 300, 128
    sf_dtype = np.dtype("int32" if col_major else "float32")
    s = sf_columns(hidden, npc, packed_ue8m0=col_major)

    def draw():
        x = random_bits(rng, (num_tokens, hidden), numpy_dtype("float8_e4m3fn"))
        x_sf = random_bits(rng, (num_tokens, s), sf_dtype)
        return (x, x_sf, *fitted_routing(rng, num_tokens, top_k, num_expanded))

    first = draw()
    static = [to_device("torch", first[0], "float8_e4m3fn"),
              to_device("torch", first[1], sf_dtype.name),
              map_to_device("torch", first[2]), map_to_device("torch", first[3])]
    out = torch.empty((num_expanded, hidden), dtype=torch.float8_e4m3fn, device="cuda")
    ld = align_up(num_expanded, 4)
    sf_buf = torch.empty((s, ld) if col_major else (num_expanded, s),
                         dtype=getattr(torch, sf_dtype.name), device="cuda")
    out_sf = sf_buf[:, :num_expanded].T if col_major else sf_buf

    def call():
        cupy_moe.expand_to_fused_with_sf(*static, num_per_channels=npc,
                                         use_tma_aligned_col_major_sf=col_major,
                                         out=out, out_sf=out_sf)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up: compiles and loads the module outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(3):
        x, x_sf, token_topk_to_pos, pos_to_expert = draw()
        static[0].copy_(to_device("torch", x, "float8_e4m3fn"))
        static[1].copy_(to_device("torch", x_sf, sf_dtype.name))
        static[2].copy_(map_to_device("torch", token_topk_to_pos))
        static[3].copy_(map_to_device("torch", pos_to_expert))
        out.view(torch.uint8).fill_(0xAB)
        sf_buf.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        expected_x, expected_sf = reference.expand_to_fused_with_sf_numpy(
            x, x_sf, token_topk_to_pos, pos_to_expert, col_major=col_major)
        assert_bits_equal(to_host_bits("torch", out), expected_x, "expanded_x")
        if col_major:
            full = to_host_bits("torch", sf_buf)
            assert_bits_equal(full[:, :num_expanded], np.ascontiguousarray(expected_sf.T),
                        "expanded_x_sf")
            assert not full[:, num_expanded:].any()
        else:
            assert_bits_equal(to_host_bits("torch", out_sf), expected_sf, "expanded_x_sf")


@pytest.mark.skipif(not _HAS_TORCH_CUDA, reason="needs torch with CUDA")
def test_torch_results_keep_native_dtypes():
    rng = np.random.default_rng()
    token_topk_to_pos, pos_to_expert = fitted_routing(rng, 4, 2, 10, num_experts=2, max_alignment=2)
    dmap, dp2e = map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert)
    bf16 = to_device("torch", random_bits(rng, (4, 64), numpy_dtype("bfloat16")), "bfloat16")
    assert cupy_moe.expand_to_fused(bf16, dmap, dp2e).dtype == torch.bfloat16
    fp8 = to_device("torch", random_bits(rng, (4, 256), numpy_dtype("float8_e4m3fn")),
                    "float8_e4m3fn")
    for sf_dtype, col_major, s in ((torch.float32, False, 2), (torch.int32, True, 1)):
        x_sf = torch.zeros((4, s), dtype=sf_dtype, device="cuda")
        out_x, out_sf = cupy_moe.expand_to_fused_with_sf(
            fp8, x_sf, dmap, dp2e, num_per_channels=128, use_tma_aligned_col_major_sf=col_major)
        assert out_x.dtype == torch.float8_e4m3fn and out_sf.dtype == sf_dtype
        assert out_x.is_cuda and out_x.device == fp8.device


# -- the torch fast path (signature already checked) -------------------------------

@pytest.mark.skipif(not _HAS_TORCH_CUDA, reason="needs torch with CUDA")
def test_torch_fast_path_stays_exact_and_falls_back_when_the_signature_changes():
    from cupy_moe import _gpu

    rng = np.random.default_rng()
    num_tokens, hidden, top_k, num_expanded = 16, 256, 4, 80
    fp8 = numpy_dtype("float8_e4m3fn")

    def call(x, x_sf, token_topk_to_pos, pos_to_expert, *, x_view=None, sf_view=None, out=None):
        dx = x_view if x_view is not None else to_device("torch", x, "float8_e4m3fn")
        dsf = sf_view if sf_view is not None else to_device("torch", x_sf, "float32")
        got_x, got_sf = cupy_moe.expand_to_fused_with_sf(
            dx, dsf, map_to_device("torch", token_topk_to_pos),
            map_to_device("torch", pos_to_expert), num_per_channels=128, out=out)
        want_x, want_sf = reference.expand_to_fused_with_sf_numpy(
            x, x_sf, token_topk_to_pos, pos_to_expert, col_major=False)
        assert_bits_equal(to_host_bits("torch", got_x), want_x, "expanded_x")
        assert_bits_equal(to_host_bits("torch", got_sf), want_sf, "expanded_x_sf")
        return got_x

    def draw():
        return (random_bits(rng, (num_tokens, hidden), fp8),
                random_bits(rng, (num_tokens, 2), np.dtype("float32")),
                *fitted_routing(rng, num_tokens, top_k, num_expanded))

    call(*draw())  # full path: checks, then remembers the signature
    assert _gpu._torch_plans
    hits_before = len(_gpu._torch_plans)
    call(*draw())  # fast path, fresh data
    assert len(_gpu._torch_plans) == hits_before
    # same shapes, non-contiguous x and x_sf: the fast path must not take them
    x, x_sf, token_topk_to_pos, pos_to_expert = draw()
    wide = to_device("torch", np.concatenate([x, x], axis=1), "float8_e4m3fn")
    wide_sf = to_device("torch", np.concatenate([x_sf, x_sf], axis=1), "float32")
    call(x, x_sf, token_topk_to_pos, pos_to_expert, x_view=wide[:, :hidden],
         sf_view=wide_sf[:, :2])
    # an out= of the wrong dtype after a good one: still rejected
    out = torch.empty((num_expanded, hidden), dtype=torch.float8_e4m3fn, device="cuda")
    call(*draw(), out=out)
    with pytest.raises(ValueError, match="out must have dtype float8_e4m3fn"):
        cupy_moe.expand_to_fused_with_sf(
            to_device("torch", x, "float8_e4m3fn"), to_device("torch", x_sf, "float32"),
            map_to_device("torch", token_topk_to_pos), map_to_device("torch", pos_to_expert),
            num_per_channels=128, out=out.view(torch.uint8))
