"""``quantize_fp8`` on the GPU against the NumPy oracle, bit for bit (marker
``gpu``): over a thousand fresh random cases per array kind (any H, partial
blocks, both block sizes, every SF layout, NaN / infinity / denormal inputs,
poisoned outputs, misaligned arrays, the software e4m3 variant), the kernels'
building blocks checked exhaustively, a CUDA-graph capture of a decode shape,
the torch fast path, and the round trip through expand_to_fused_with_sf.

The helpers here also serve test_swiglu_gpu.py.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from gpu_cases import (
    GPU_MARKS,
    KINDS,
    cupy,
    needs_torch_cuda,
    padded_sf_bits,
    to_host_bits,
    torch,
)
from helpers import assert_bits_equal
from quantize_cases import LAYOUTS, SPECIALS, as_input_dtype, hard_rows

import cupy_moe
from cupy_moe.harness.inputs import random_bits
from cupy_moe.quantize import (
    dequantize_fp8_numpy,
    quantize_fp8_numpy,
    swiglu_quantize_fp8_numpy,
)
from cupy_moe.quantize.api import run_with_tuning
from cupy_moe.quantize.launch_shape import QuantizeTuning

pytestmark = GPU_MARKS

SOFTWARE = QuantizeTuning(software_e4m3=True)
# quantize_fp8 with no call on *_vec1: most cases here are small enough for
# it by default (vec1_columns_per_sm), so the wide kernels' tunings take this
WIDE = {"vec1_columns_per_sm": 0}
# the software e4m3 variant and both block sizes on every grid
# (rows_min_blocks=5: SwiGLU's *_rows compiled to 46 registers)
TUNINGS = [None, SOFTWARE, QuantizeTuning(software_e4m3=True, **WIDE),
           QuantizeTuning(threads=32, small_threads=32),
           QuantizeTuning(threads=32, small_threads=32, **WIDE),
           QuantizeTuning(threads=256, small_threads=256, full_blocks_from=0.0, **WIDE),
           QuantizeTuning(rows_min_blocks=5),
           # quantize_fp8's *_vec1 with row R-1's packed pad-column words byte
           # by byte, as the other kernels (the default: whole words)
           QuantizeTuning(vec1_packed_pad_words=False),
           QuantizeTuning(vec1_packed_pad_words=False, vec1_columns_per_sm=math.inf),
           # ... and in *_tiles; the pad words in every kernel
           QuantizeTuning(tiles_packed_pad_words=False, **WIDE),
           QuantizeTuning(packed_sf_pad_words=True),
           QuantizeTuning(packed_sf_pad_words=True, **WIDE),
           # quantize_fp8: never / always *_vec1
           QuantizeTuning(**WIDE),
           QuantizeTuning(vec1_columns_per_sm=math.inf),
           # swiglu's row-major kernels, 768-column segments first (*_rows768 for
           # I = 3072 too), and never (*_vec)
           QuantizeTuning(segment_columns=(768, 1024), narrow_live_rows=0),
           QuantizeTuning(segment_columns=(), narrow_live_rows=0),
           # ... 512- and 256-column segments (*_rows512, *_rows256)
           QuantizeTuning(segment_columns=(512, 768), narrow_live_rows=0),
           QuantizeTuning(segment_columns=(256, 768), narrow_live_rows=0),
           # quantize_fp8's column-major float32 SF on *_vec (the default takes
           # *_tiles where H % 128 == 0)
           QuantizeTuning(sf_column_tiles=False, **WIDE),
           # ... packed UE8M0 SF on *_vec (the default: *_tiles), and its last
           # word's bytes in one store (off by default)
           QuantizeTuning(packed_sf_tiles=False, **WIDE),
           QuantizeTuning(packed_sf_word_stores=True),
           QuantizeTuning(packed_sf_word_stores=True, **WIDE),
           QuantizeTuning(packed_sf_tiles=False, packed_sf_word_stores=True, **WIDE),
           # swiglu: never / always the few-live-rows kernels (*_vec1; *_block_rows,
           # a row a block on small X, and up to 32 rows a block, the last partial)
           QuantizeTuning(narrow_live_rows=0),
           QuantizeTuning(narrow_live_rows=2**31, block_rows_from_bytes=math.inf),
           QuantizeTuning(narrow_live_rows=2**31, block_rows_from_bytes=0),
           QuantizeTuning(narrow_live_rows=2**31, block_rows_from_bytes=0,
                          block_rows_blocks_per_sm=0.01)]
CASES_PER_KIND = 600  # x 2 kinds: over a thousand per op


# -- device arrays ----------------------------------------------------------------------

_TORCH_DTYPES = {"bfloat16": "bfloat16", "float32": "float32", "int32": "int32",
                 "uint8": "uint8", "float8_e4m3fn": "float8_e4m3fn"}


def device_array(kind: str, host: np.ndarray, dtype: str, *, misalign: bool = False):
    """A contiguous device copy of ``host``'s bits, typed ``dtype`` (CuPy: bf16 as
    uint16, fp8 as uint8); ``misalign`` starts it one element into its
    allocation (so no 16-byte accesses are possible)."""
    host = np.ascontiguousarray(host)
    count, shape = host.size, host.shape
    offset = 1 if misalign else 0
    carrier = {1: np.uint8, 2: np.int16, 4: np.int32}[host.itemsize]
    bits = host.view(carrier).reshape(-1)
    if kind == "torch":
        base = torch.empty(count + offset + 8, dtype=getattr(torch, carrier.__name__),
                           device="cuda")
        base[offset:offset + count].copy_(torch.from_numpy(bits))
        return base[offset:offset + count].view(getattr(torch, _TORCH_DTYPES[dtype])).view(
            *shape)
    cupy_dtype = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8}.get(dtype, np.dtype(dtype))
    base = cupy.empty(count + offset + 8, dtype=carrier)
    base[offset:offset + count] = cupy.asarray(bits)
    return base[offset:offset + count].view(cupy_dtype).reshape(shape)


def map_array(kind: str, host: np.ndarray):
    return device_array(kind, np.ascontiguousarray(host, dtype=np.int32), "int32")


def input_dtype_name(x: np.ndarray) -> str:
    return "float32" if x.dtype == np.float32 else "bfloat16"


def poisoned_outputs(kind: str, rng, num_rows: int, hidden: int, sf_columns: int, *,
                     packed: bool, col_major: bool, misalign: bool = False):
    """Random-bit ``out`` and ``out_sf`` (the column-major buffer's pad columns
    too), and the SF buffer behind ``out_sf``."""
    out_dtype = "float8_e4m3fn" if kind == "torch" and rng.random() < 0.5 else "uint8"
    out = device_array(kind, random_bits(rng, (num_rows, hidden), np.uint8), out_dtype,
                       misalign=misalign)
    sf_dtype = "int32" if packed else "float32"
    ld = -(-num_rows // 4) * 4
    shape = (sf_columns, ld) if col_major else (num_rows, sf_columns)
    buffer = device_array(kind, random_bits(rng, shape, np.dtype(sf_dtype)), sf_dtype)
    return out, (buffer[:, :num_rows].T if col_major else buffer)


def sf_bits(kind: str, out_sf, num_rows: int, *, col_major: bool) -> np.ndarray:
    """The bits of the SF output: the whole column-major buffer, pad columns
    included, or the row-major array."""
    if col_major:
        return padded_sf_bits(kind, out_sf, num_rows, out_sf.shape[1])
    return to_host_bits(kind, out_sf)


def expected_sf_bits(out_sf: np.ndarray, *, col_major: bool) -> np.ndarray:
    """The same from the oracle's NumPy output."""
    if col_major:
        num_rows, columns = out_sf.shape
        ld = -(-num_rows // 4) * 4
        full = np.lib.stride_tricks.as_strided(out_sf, (columns, ld),
                                               (ld * out_sf.itemsize, out_sf.itemsize))
        return full.view(np.uint32)
    return out_sf.view(np.uint32)


def check_result(kind, result, expected, *, col_major: bool, given=None, what=""):
    """Codes and SF of ``result`` (device) against ``expected`` (oracle, NumPy);
    ``given``: the (out, out_sf) passed in, which must come back."""
    codes, out_sf = result
    want_codes, want_sf = expected
    if given is not None:
        assert codes is given[0] and out_sf is given[1]
    assert tuple(codes.shape) == want_codes.shape and tuple(out_sf.shape) == want_sf.shape
    if kind == "torch" and given is None:
        assert codes.dtype == torch.float8_e4m3fn
    assert_bits_equal(to_host_bits(kind, codes), want_codes.view(np.uint8), f"{what} codes")
    assert_bits_equal(sf_bits(kind, out_sf, want_sf.shape[0], col_major=col_major),
                      expected_sf_bits(want_sf, col_major=col_major), f"{what} scale factors")


def call_op(op: str, tuning, x, **kwargs):
    if tuning is None:
        return getattr(cupy_moe.quantize, op)(x, **kwargs)
    return run_with_tuning(tuning, op, x, **kwargs)


# -- random inputs ----------------------------------------------------------------------

HIDDEN_CHOICES = [1, 3, 16, 31, 32, 48, 100, 127, 128, 129, 200, 255, 256, 384, 768, 1000,
                  1024, 1040, 2048, 2056, 3000, 7168]


def random_values(rng, num_rows: int, hidden: int, npc: int) -> np.ndarray:
    """float32 rows: hard blocks (small cases), random bits of float32 or of
    bfloat16, or scaled normals with specials sprinkled in (large cases)."""
    style = rng.integers(4)
    if style == 0 and num_rows * hidden <= 40000:
        return hard_rows(rng, num_rows, hidden, npc)
    if style == 1:
        return random_bits(rng, (num_rows, hidden), np.float32)
    if style == 2:
        bits = random_bits(rng, (num_rows, hidden), np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    values = (rng.standard_normal((num_rows, hidden)) *
              10.0 ** rng.uniform(-8, 8, (num_rows, 1))).astype(np.float32)
    specials = rng.random(values.shape) < 0.01
    values[specials] = rng.choice(SPECIALS, int(specials.sum()))
    return values


def random_settings(rng):
    layout = sorted(LAYOUTS)[rng.integers(len(LAYOUTS))]
    packed, col_major, round_sf = LAYOUTS[layout]
    return layout, {"num_per_channels": int(rng.choice([32, 128])), "round_sf": round_sf,
                    "packed_ue8m0": packed, "use_tma_aligned_col_major_sf": col_major}


def random_shape(rng, big_every: int = 40):
    if rng.integers(big_every) == 0:
        return int(rng.integers(100, 1200)), int(rng.choice([2048, 7168, 4112, 768]))
    num_rows = 0 if rng.integers(30) == 0 else int(rng.integers(1, 40))
    hidden = (int(rng.choice(HIDDEN_CHOICES)) if rng.random() < 0.6
              else int(rng.integers(1, 3000)))
    return num_rows, hidden


# -- the random cases -----------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_random_cases_are_bit_identical_to_the_oracle(kind):
    rng = np.random.default_rng()
    for case in range(CASES_PER_KIND):
        num_rows, hidden = random_shape(rng)
        layout, settings = random_settings(rng)
        npc = settings["num_per_channels"]
        dtype = "float32" if rng.random() < 0.4 else "bfloat16"
        x = as_input_dtype(random_values(rng, num_rows, hidden, npc), dtype)
        expected = quantize_fp8_numpy(x, **settings)
        tuning = TUNINGS[rng.integers(len(TUNINGS))]
        misalign = rng.integers(8) == 0
        kwargs = dict(settings)
        given = None
        if rng.random() < 0.5:
            given = poisoned_outputs(kind, rng, num_rows, hidden, expected[1].shape[1],
                                     packed=settings["packed_ue8m0"],
                                     col_major=settings["use_tma_aligned_col_major_sf"],
                                     misalign=misalign)
            kwargs.update(out=given[0], out_sf=given[1])
        dx = device_array(kind, x, input_dtype_name(x), misalign=misalign)
        try:
            result = call_op("quantize_fp8", tuning, dx, **kwargs)
            check_result(kind, result, expected, given=given,
                         col_major=settings["use_tma_aligned_col_major_sf"])
        except AssertionError as error:
            raise AssertionError(
                f"case {case}: T={num_rows} H={hidden} {dtype} {layout} npc={npc} "
                f"tuning={tuning} misalign={misalign} out={given is not None}: {error}") from None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_prefill_and_decode_shapes(kind, layout):
    rng = np.random.default_rng()
    packed, col_major, round_sf = LAYOUTS[layout]
    for num_rows, hidden in ((1, 7168), (7, 7168), (64, 2048), (1031, 7168)):
        x = as_input_dtype(random_values(rng, num_rows, hidden, 128), "bfloat16")
        settings = {"round_sf": round_sf, "packed_ue8m0": packed,
                    "use_tma_aligned_col_major_sf": col_major}
        check_result(kind, cupy_moe.quantize.quantize_fp8(device_array(kind, x, "bfloat16"),
                                                          **settings),
                     quantize_fp8_numpy(x, **settings), col_major=col_major,
                     what=f"T={num_rows} H={hidden}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", ["quantize_fp8", "swiglu_quantize_fp8"])
def test_one_plan_aligned_then_misaligned(kind, op):
    """A plan compiles each of its two kernels at the first launch that needs
    it: the same shape called aligned, misaligned (the element-access kernel,
    compiled then; torch's second call takes the fast path), and aligned
    again, each bit-exact. A shape of its own, so that its plan is new."""
    rng = np.random.default_rng()
    num_rows, hidden = 37, 1664  # 13 blocks of 128; the swiglu input 2 * 1664 wide
    settings = {"round_sf": True, "packed_ue8m0": False, "use_tma_aligned_col_major_sf": False}
    for misalign in (False, True, False, True):
        if op == "quantize_fp8":
            x = as_input_dtype(random_values(rng, num_rows, hidden, 128), "bfloat16")
            expected = quantize_fp8_numpy(x, **settings)
        else:
            x = as_input_dtype(random_values(rng, num_rows, 2 * hidden, 128), "bfloat16")
            expected = swiglu_quantize_fp8_numpy(x, **settings)
        result = getattr(cupy_moe.quantize, op)(
            device_array(kind, x, "bfloat16", misalign=misalign), **settings)
        check_result(kind, result, expected, col_major=False, what=f"misalign={misalign}")


# *_tiles for column-major float32 SF (the default's, said outright) and for
# packed UE8M0 SF (off by default)
TILES = QuantizeTuning(sf_column_tiles=True, packed_sf_tiles=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("npc", [128, 32])
@pytest.mark.parametrize("packed", [False, True], ids=["col-f32", "packed"])
def test_tiles_of_eight_rows(kind, dtype, npc, packed):
    """quantize_fp8's *_tiles (a warp an 8 x 128 tile; column-major float32 or
    packed UE8M0 SF): row counts that leave the last tile part full, poisoned
    outputs (the SF buffer's pad columns too), bit-exact."""
    rng = np.random.default_rng()
    for num_rows, hidden in ((1, 128), (7, 7168), (8, 256), (13, 2048), (1031, 7168),
                             (4097, 384)):
        x = as_input_dtype(random_values(rng, num_rows, hidden, npc), dtype)
        for round_sf in (True,) if packed else (False, True):
            settings = {"num_per_channels": npc, "round_sf": round_sf, "packed_ue8m0": packed,
                        "use_tma_aligned_col_major_sf": True}
            expected = quantize_fp8_numpy(x, **settings)
            given = poisoned_outputs(kind, rng, num_rows, hidden, expected[1].shape[1],
                                     packed=packed, col_major=True)
            check_result(kind, call_op("quantize_fp8", TILES, device_array(kind, x, dtype),
                                       **settings, out=given[0], out_sf=given[1]),
                         expected, col_major=True, given=given,
                         what=f"T={num_rows} H={hidden} {dtype} npc={npc} round={round_sf}")


# -- the kernels' building blocks, exhaustively ------------------------------------------

def _selftest(tuning: QuantizeTuning, name: str, first: int, count: int,
              *extra) -> int | None:
    """Run a quantize_selftest_* kernel over [first, first + count) (then its
    ``extra`` arguments); the first mismatching bit pattern, or None."""
    from cupy_moe.runtime.launch import current_device
    from cupy_moe.runtime.loader import get_module

    # QUANTIZE_OPS=0: the self-test kernels alone (a shorter compile)
    kernel = get_module("quantize.cu", (*tuning.defines(), ("QUANTIZE_OPS", 0)),
                        current_device()).get_function(name)
    mismatch = cupy.full(1, 0xFFFFFFFF, dtype=cupy.uint32)
    kernel((4096,), (256,), (np.uint32(first), np.uint32(count), mismatch, *extra))
    found = int(mismatch.get()[0])
    return None if found == 0xFFFFFFFF else found


def test_reciprocal_fast_path_is_correctly_rounded_on_its_whole_range():
    """quant_rcp_1_to_2p126 against __frcp_rn on every float32 in [1, 2^126)."""
    first, end = 0x3F800000, 0x7E800000
    assert _selftest(QuantizeTuning(), "quantize_selftest_reciprocal", first, end - first) is None


@pytest.mark.parametrize("tuning", [QuantizeTuning(), SOFTWARE], ids=["default", "software"])
def test_e4m3_conversion_on_every_float32(tuning):
    """The module's conversion (the hardware one on sm_89+) against the integer
    rounding, on all 2^32 bit patterns (the software module: trivially)."""
    one = np.float32(1.0)
    for first in (0, 1 << 31):
        found = _selftest(tuning, "quantize_selftest_e4m3", first, (1 << 31) - 1, one)
        assert found is None, f"codes differ at {found:#010x}"
    # the last pattern of each half
    for pattern in (0x7FFFFFFF, 0xFFFFFFFF):
        assert _selftest(tuning, "quantize_selftest_e4m3", pattern, 1, one) is None


@pytest.mark.parametrize("scale", [1.0, 0.0, 3.5, 448.0 / 1e-4, float("inf"), -2.0])
def test_a_product_that_is_nan_is_the_one_nan(scale):
    """Every NaN pattern (both signs, every payload) times a scale gives
    0x7FFFFFFF: the e4m3 codes of the ops' NaNs (0x7F) rest on it."""
    for first in (0x7F800001, 0xFF800001):
        found = _selftest(QuantizeTuning(), "quantize_selftest_product_nan", first,
                          (1 << 23) - 1, np.float32(scale))
        assert found is None, f"NaN product not canonical at {found:#010x}"


# -- special values ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tuning", [None, SOFTWARE], ids=["default", "software"])
def test_every_bfloat16_value_in_blocks_of_every_scale(kind, tuning):
    """All 65536 bf16 patterns (NaNs, infinities, subnormals), in blocks with
    and without a large value, each layout."""
    rng = np.random.default_rng()
    codes = np.arange(1 << 16, dtype=np.uint16)
    rng.shuffle(codes)
    x = codes.reshape(256, 256)
    for layout in LAYOUTS:
        packed, col_major, round_sf = LAYOUTS[layout]
        for npc in (32, 128):
            settings = {"num_per_channels": npc, "round_sf": round_sf, "packed_ue8m0": packed,
                        "use_tma_aligned_col_major_sf": col_major}
            check_result(kind, call_op("quantize_fp8", tuning,
                                       device_array(kind, x, "bfloat16"), **settings),
                         quantize_fp8_numpy(x, **settings), col_major=col_major, what=layout)


# -- graphs, streams, fast path ---------------------------------------------------------

@needs_torch_cuda
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_cuda_graph_capture_of_a_decode_shape(layout):
    rng = np.random.default_rng()
    packed, col_major, round_sf = LAYOUTS[layout]
    num_rows, hidden = 3, 7168
    settings = {"num_per_channels": 128, "round_sf": round_sf, "packed_ue8m0": packed,
                "use_tma_aligned_col_major_sf": col_major}
    x = torch.zeros((num_rows, hidden), dtype=torch.bfloat16, device="cuda")
    out = torch.empty((num_rows, hidden), dtype=torch.float8_e4m3fn, device="cuda")
    columns = 14 if packed else 56
    sf_dtype = torch.int32 if packed else torch.float32
    buffer = torch.empty((columns, 4) if col_major else (num_rows, columns), dtype=sf_dtype,
                         device="cuda")
    out_sf = buffer[:, :num_rows].T if col_major else buffer

    def call():
        cupy_moe.quantize.quantize_fp8(x, out=out, out_sf=out_sf, **settings)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # compiles and loads outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(3):
        host = as_input_dtype(random_values(rng, num_rows, hidden, 128), "bfloat16")
        x.copy_(device_array("torch", host, "bfloat16"))
        out.view(torch.uint8).fill_(0xAB)
        buffer.view(torch.int32).fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        check_result("torch", (out, out_sf), quantize_fp8_numpy(host, **settings),
                     col_major=col_major)


def test_cupy_non_default_stream():
    rng = np.random.default_rng()
    x = as_input_dtype(random_values(rng, 64, 1024, 128), "bfloat16")
    with cupy.cuda.Stream(non_blocking=True) as stream:
        codes, sf = cupy_moe.quantize.quantize_fp8(device_array("cupy", x, "bfloat16"))
        host_codes, host_sf = cupy.asnumpy(codes, stream=stream), cupy.asnumpy(sf, stream=stream)
        stream.synchronize()
    want_codes, want_sf = quantize_fp8_numpy(x)
    assert_bits_equal(host_codes, want_codes.view(np.uint8))
    assert_bits_equal(host_sf, want_sf)


@needs_torch_cuda
def test_torch_fast_path_stays_exact(monkeypatch):
    from cupy_moe.quantize import api

    rng = np.random.default_rng()
    settings = {"num_per_channels": 32, "round_sf": True, "packed_ue8m0": True,
                "use_tma_aligned_col_major_sf": True}
    first = as_input_dtype(random_values(rng, 9, 520, 32), "bfloat16")
    cupy_moe.quantize.quantize_fp8(device_array("torch", first, "bfloat16"), **settings)

    def full_path(*args, **kwargs):
        raise AssertionError("the fast path should have taken this call")

    monkeypatch.setattr(api, "check_quantize", full_path)
    for _ in range(3):
        x = as_input_dtype(random_values(rng, 9, 520, 32), "bfloat16")
        check_result("torch", cupy_moe.quantize.quantize_fp8(
            device_array("torch", x, "bfloat16"), **settings),
            quantize_fp8_numpy(x, **settings), col_major=True)
    monkeypatch.undo()
    # another signature takes the full path again, and is remembered in turn
    x = as_input_dtype(random_values(rng, 10, 520, 32), "bfloat16")
    check_result("torch", cupy_moe.quantize.quantize_fp8(
        device_array("torch", x, "bfloat16"), **settings),
        quantize_fp8_numpy(x, **settings), col_major=True)


@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_input_and_no_rows(kind):
    rng = np.random.default_rng()
    x = as_input_dtype(random_values(rng, 12, 800, 128), "float32")
    dx = device_array(kind, x, "float32")[::3, 16:]
    check_result(kind, cupy_moe.quantize.quantize_fp8(dx, num_per_channels=32),
                 quantize_fp8_numpy(np.ascontiguousarray(x[::3, 16:]), num_per_channels=32),
                 col_major=False)
    for layout in LAYOUTS:
        packed, col_major, round_sf = LAYOUTS[layout]
        codes, sf = cupy_moe.quantize.quantize_fp8(
            device_array(kind, np.zeros((0, 300), np.float32), "float32"), round_sf=round_sf,
            packed_ue8m0=packed, use_tma_aligned_col_major_sf=col_major)
        assert tuple(codes.shape) == (0, 300) and tuple(sf.shape) == (0, 1 if packed else 3)


def test_mixed_kinds_are_refused():
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    x = cupy.zeros((2, 64), dtype=cupy.float32)
    with pytest.raises(TypeError, match="all arrays must be of one kind: x is cupy.ndarray, "
                                        r"out is torch.Tensor \(cuda\)"):
        cupy_moe.quantize.quantize_fp8(x, out=torch.zeros((2, 64), dtype=torch.uint8,
                                                          device="cuda"))


# -- the round trip through expand --------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_quantize_expand_dequantize_equals_expand_quantize(kind, layout):
    """Quantize, then expand_to_fused_with_sf, then dequantize (on the host):
    the same as expand_to_fused then quantize, bit for bit (and the expert rows'
    codes and scale factors themselves)."""
    rng = np.random.default_rng()
    packed, col_major, round_sf = LAYOUTS[layout]
    num_tokens, top_k, hidden, npc = 300, 8, 2048, 128
    settings = {"num_per_channels": npc, "round_sf": round_sf, "packed_ue8m0": packed,
                "use_tma_aligned_col_major_sf": col_major}
    x = as_input_dtype(random_values(rng, num_tokens, hidden, npc), "bfloat16")
    topk_ids = rng.integers(0, 16, size=(num_tokens, top_k)).astype(np.int32)
    dx = device_array(kind, x, "bfloat16")
    plan = cupy_moe.fused_mapping(map_array(kind, topk_ids), 16, alignment=32)
    codes, x_sf = cupy_moe.quantize.quantize_fp8(dx, **settings)
    moved, moved_sf = cupy_moe.expand_to_fused_with_sf(
        codes, x_sf, plan.token_topk_to_pos, plan.pos_to_expert, num_per_channels=npc,
        use_tma_aligned_col_major_sf=col_major)
    direct, direct_sf = cupy_moe.quantize.quantize_fp8(
        cupy_moe.expand_to_fused(dx, plan.token_topk_to_pos, plan.pos_to_expert), **settings)
    experts = to_host_bits(kind, plan.pos_to_expert).view(np.int32) >= 0
    host = {}
    for name, array in (("moved", moved), ("direct", direct)):
        host[name] = to_host_bits(kind, array)
    for name, array in (("moved_sf", moved_sf), ("direct_sf", direct_sf)):
        bits = np.ascontiguousarray(to_host_bits(kind, array))
        host[name] = bits.view(np.int32 if packed else np.float32)
    assert_bits_equal(host["moved"][experts], host["direct"][experts], "expert rows' codes")
    assert_bits_equal(host["moved_sf"][experts], host["direct_sf"][experts],
                      "expert rows' scale factors")
    assert_bits_equal(dequantize_fp8_numpy(host["moved"], host["moved_sf"], num_per_channels=npc),
                      dequantize_fp8_numpy(host["direct"], host["direct_sf"],
                                           num_per_channels=npc), "dequantized")


# -- offsets past 2^31 elements -------------------------------------------------------------

@pytest.mark.parametrize("op", ["quantize_fp8", "swiglu_quantize_fp8"])
@pytest.mark.parametrize("packed", [False, True], ids=["row-f32", "packed"])
def test_offsets_past_two_to_the_31_elements(op, packed):
    """Rows far into a > 4 GiB input (64-bit offsets): the rows around element
    2^31 and the last rows, as the oracle gives them (the kernels are row by
    row; the other rows hold whatever the allocation held)."""
    rng = np.random.default_rng()
    swiglu = op == "swiglu_quantize_fp8"
    width = 8192 if swiglu else 4096  # 2I, or H
    num_rows = 2**31 // width + 200  # ~0.3 M rows, 2.15e9 elements + 200 rows
    crossing = 2**31 // width
    rows = np.r_[0, crossing - 3:crossing + 3, num_rows - 3:num_rows]
    x = cupy.empty((num_rows, width), dtype=cupy.uint16)  # bf16 bits
    host = rng.standard_normal((rows.size, width)).astype(ml_dtypes.bfloat16)
    x[cupy.asarray(rows)] = cupy.asarray(host.view(np.uint16))
    settings = {"round_sf": packed, "packed_ue8m0": packed,
                "use_tma_aligned_col_major_sf": packed}
    out, out_sf = getattr(cupy_moe, op)(x, **settings)
    want, want_sf = getattr(cupy_moe, op)(host, **settings)
    assert_bits_equal(cupy.asnumpy(out[cupy.asarray(rows)]).view(np.uint8),
                      want.view(np.uint8), f"{op} rows")
    assert_bits_equal(cupy.asnumpy(out_sf[cupy.asarray(rows)]), np.asarray(want_sf),
                      f"{op} scale factors")
    del x, out, out_sf
