"""The kernels of kernels_cu/ run on the CPU (tests/cuda_on_cpu: each CUDA
thread a fiber), through the ops' own GPU code: plans, argument blocks and
launch shapes as on an H200. Bit-exact against the NumPy oracle, outputs
poisoned, canaries around them.

These run everywhere a C++ compiler is (CI included): they check the kernels'
logic, which rows and columns each writes and what, not their speed, and not
what only the hardware decides (NaN payloads, memory ordering between
blocks). Kernels not yet run on a GPU are covered here first.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from conftest import KERNEL_PATHS
from cuda_on_cpu import build
from cuda_on_cpu.device import POISON, emulated_gpu, fenced

pytestmark = pytest.mark.skipif(not build.compiler_available(),
                                reason=f"no C++ compiler ({build.CXX}) to build the kernels with")

from cupy_moe.expand.api import run_with_tuning as expand_with_tuning  # noqa: E402
from cupy_moe.combine.reference import reduce_fused_numpy  # noqa: E402
from cupy_moe.expand.reference import (  # noqa: E402
    expand_to_fused_numpy,
    expand_to_fused_with_sf_numpy,
)
from cupy_moe.expand.tuning import ExpandTuning  # noqa: E402
from cupy_moe.mapping.reference import fused_mapping_numpy  # noqa: E402
from cupy_moe.quantize.api import run_with_tuning as quantize_with_tuning  # noqa: E402
from cupy_moe.quantize.launch_shape import QuantizeTuning  # noqa: E402
from cupy_moe.quantize.reference import (  # noqa: E402
    quantize_fp8_numpy,
    swiglu_padding_rows,
    swiglu_quantize_fp8_numpy,
)

SF_LAYOUTS = {  # (packed_ue8m0, use_tma_aligned_col_major_sf, round_sf)
    "row-f32": (False, False, False),
    "col-f32": (False, True, False),
    "col-ue8m0": (True, True, True),
}


def _plan(rng, num_tokens, top_k, num_experts, local_experts, alignment, extra_rows=3):
    """A padded plan of random routing: expert ids past ``local_experts``
    are remote (dropped), one slot in eight dropped outright; ``extra_rows``
    of padding past the tight bound (X not a multiple of 4: the column-major
    scale factors have pad columns)."""
    ids = rng.integers(0, num_experts, (num_tokens, top_k)).astype(np.int32)
    ids[rng.random(ids.shape) < 0.125] = -1
    tight = fused_mapping_numpy(ids, local_experts, alignment=alignment).pos_to_expert.shape[0]
    plan = fused_mapping_numpy(ids, local_experts, alignment=alignment,
                               num_expanded=tight + extra_rows)
    weights = rng.random((num_tokens, top_k), dtype=np.float32)
    return plan, weights


def _sf_pad_columns(sf: np.ndarray) -> np.ndarray:
    """The pad columns R .. align(R, 4) of each column of a column-major SF
    view ``[R, S]`` (strides (1, align(R, 4)) elements): they lie past the
    view's last element, in the buffer behind it."""
    num_rows = sf.shape[0]
    leading_dim = -(-num_rows // 4) * 4
    full = np.lib.stride_tricks.as_strided(sf.T, (sf.shape[1], leading_dim), sf.T.strides)
    return full[:, num_rows:]


def _swiglu_plan_inputs(rng, inter: int, dtype: str):
    """A padded plan of 11 tokens (K = 4, 16 of 24 experts local, alignment
    8), its weights, an ``h`` [X, 2 * inter] of ``dtype`` and the maps
    swiglu_quantize_fp8 takes."""
    plan, weights = _plan(rng, 11, 4, 24, 16, 8)
    h = rng.standard_normal((plan.pos_to_expert.shape[0], 2 * inter)).astype(np.float32)
    h = h.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else h
    maps = {"topk_weights": weights, "pos_to_token_topk": plan.pos_to_token_topk,
            "pos_to_expert": plan.pos_to_expert}
    return plan, weights, h, maps


BY_SLOT = {
    "rows": QuantizeTuning(by_slot_from_rows_per_slot=0, narrow_slot_columns_per_sm=0),
    "vec1": QuantizeTuning(by_slot_from_rows_per_slot=0, narrow_slot_columns_per_sm=math.inf),
    "vec": QuantizeTuning(by_slot_from_rows_per_slot=0, segment_columns=(),
                          narrow_slot_columns_per_sm=0),
}


@pytest.mark.parametrize("layout", sorted(SF_LAYOUTS))
@pytest.mark.parametrize("tuning_name", sorted(BY_SLOT))
@pytest.mark.parametrize(("inter", "dtype"), [(2048, "bfloat16"), (768, "bfloat16"),
                                              (1024, "float32"), (96, "bfloat16")])
def test_swiglu_by_slot_writes_the_live_rows_only(monkeypatch, rng, layout, tuning_name, inter,
                                                  dtype):
    """The ``*_slots`` kernels (swiglu given token_topk_to_pos, zero_padding
    off): every live row as the oracle's, padding rows untouched (still
    poison), the column-major SF pad columns zeroed, nothing outside the
    outputs written."""
    packed, col_major, round_sf = SF_LAYOUTS[layout]
    npc = 32 if inter == 96 else int(rng.choice([32, 128]))
    plan, weights, h, maps = _swiglu_plan_inputs(rng, inter, dtype)
    num_rows = plan.pos_to_expert.shape[0]
    settings = {"num_per_channels": npc, "round_sf": round_sf, "packed_ue8m0": packed,
                "use_tma_aligned_col_major_sf": col_major}
    want_codes, want_sf = swiglu_quantize_fp8_numpy(h, **maps, **settings)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    codes, sf = quantize_with_tuning(BY_SLOT[tuning_name], "swiglu_quantize_fp8", h, **maps,
                                     **settings, zero_padding=False,
                                     token_topk_to_pos=plan.token_topk_to_pos)
    assert gpu.launches[-1].endswith("_slots")
    gpu.check_canaries()
    padding = swiglu_padding_rows(num_rows, pos_to_expert=plan.pos_to_expert,
                                  pos_to_token_topk=plan.pos_to_token_topk,
                                  num_slots=weights.size)
    assert padding.any() and (~padding).any()
    codes = codes.view(np.uint8)
    np.testing.assert_array_equal(codes[~padding], want_codes.view(np.uint8)[~padding])
    assert (codes[padding] == POISON).all()
    sf_rows = np.ascontiguousarray(sf).view(np.uint8).reshape(num_rows, -1)
    want_rows = np.ascontiguousarray(want_sf).view(np.uint8).reshape(num_rows, -1)
    np.testing.assert_array_equal(sf_rows[~padding], want_rows[~padding])
    assert (sf_rows[padding] == POISON).all()
    if col_major:
        pad = _sf_pad_columns(sf)
        assert pad.size and (pad == 0).all()


# every kernel's packed scale factors through store_packed_sf_pad_words
# (QuantizeTuning.packed_sf_pad_words), by the kernel the tuning picks
PAD_WORDS_EVERYWHERE = {
    "rows": QuantizeTuning(packed_sf_pad_words=True, narrow_live_rows=0),
    "vec": QuantizeTuning(packed_sf_pad_words=True, narrow_live_rows=0, segment_columns=()),
    "vec1": QuantizeTuning(packed_sf_pad_words=True, block_rows_from_bytes=math.inf),
    "block_rows": QuantizeTuning(packed_sf_pad_words=True, block_rows_from_bytes=0.0),
}


@pytest.mark.parametrize("zero_padding", [True, False])
@pytest.mark.parametrize("tuning_name", sorted(PAD_WORDS_EVERYWHERE))
@pytest.mark.parametrize(("inter", "npc"), [(2048, 128), (768, 32), (640, 128)])
def test_swiglu_packed_sf_pad_words(monkeypatch, rng, zero_padding, tuning_name, inter, npc):
    """swiglu_quantize_fp8's row kernels with packed UE8M0 scale factors
    stored by store_packed_sf_pad_words: live rows as the oracle's, padding
    rows zero (or, zero_padding off, still poison), the pad columns zero."""
    plan, weights, h, maps = _swiglu_plan_inputs(rng, inter, "bfloat16")
    settings = {"num_per_channels": npc, "round_sf": True, "packed_ue8m0": True,
                "use_tma_aligned_col_major_sf": True}
    want_codes, want_sf = swiglu_quantize_fp8_numpy(h, **maps, **settings)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    codes, sf = quantize_with_tuning(PAD_WORDS_EVERYWHERE[tuning_name], "swiglu_quantize_fp8",
                                     h, **maps, **settings, zero_padding=zero_padding)
    gpu.check_canaries()
    kernel = "vec" if tuning_name == "rows" and inter == 640 else tuning_name
    kernel = f"{kernel}512" if kernel == "rows" and inter == 2048 else kernel
    kernel = f"{kernel}768" if kernel == "rows" and inter == 768 else kernel
    assert gpu.launches[-1].endswith(f"_{kernel}"), gpu.launches
    _check_swiglu_rows(plan, weights, (codes, sf), (want_codes, want_sf), zero_padding)
    assert (_sf_pad_columns(sf) == 0).all()


def _check_swiglu_rows(plan, weights, got: tuple, want: tuple, zero_padding: bool) -> None:
    """A swiglu call's codes and scale factors (``got``) against the oracle's
    (``want``): every row where padding rows are zeroed, else the live rows,
    with the padding rows' codes and scale factors still poison."""
    (codes, sf), (want_codes, want_sf) = got, want
    num_rows = plan.pos_to_expert.shape[0]
    padding = swiglu_padding_rows(num_rows, pos_to_expert=plan.pos_to_expert,
                                  pos_to_token_topk=plan.pos_to_token_topk,
                                  num_slots=weights.size)
    assert padding.any() and (~padding).any()
    live = slice(None) if zero_padding else ~padding
    np.testing.assert_array_equal(codes.view(np.uint8)[live], want_codes.view(np.uint8)[live])
    sf_rows = np.ascontiguousarray(sf).view(np.uint8).reshape(num_rows, -1)
    want_rows = np.ascontiguousarray(want_sf).view(np.uint8).reshape(num_rows, -1)
    np.testing.assert_array_equal(sf_rows[live], want_rows[live])
    if not zero_padding:
        assert (codes.view(np.uint8)[padding] == POISON).all()
        assert (sf_rows[padding] == POISON).all()


@pytest.mark.parametrize("by_slot", [False, True])
@pytest.mark.parametrize("zero_padding", [True, False])
@pytest.mark.parametrize("layout", sorted(SF_LAYOUTS))
@pytest.mark.parametrize("width", [256, 512])
@pytest.mark.parametrize(("inter", "dtype"), [(1024, "bfloat16"), (512, "float32")])
def test_swiglu_narrow_row_segments(monkeypatch, rng, by_slot, zero_padding, layout, width,
                                    inter, dtype):
    """``*_rows256`` / ``*_rows512`` (and their ``_slots`` twins): live rows
    as the oracle's, padding rows zero (or, zero_padding off, still poison),
    the column-major SF pad columns zero."""
    if by_slot and zero_padding:
        pytest.skip("the *_slots kernels need zero_padding off")
    packed, col_major, round_sf = SF_LAYOUTS[layout]
    npc = int(rng.choice([32, 128]))
    plan, weights, h, maps = _swiglu_plan_inputs(rng, inter, dtype)
    settings = {"num_per_channels": npc, "round_sf": round_sf, "packed_ue8m0": packed,
                "use_tma_aligned_col_major_sf": col_major}
    want_codes, want_sf = swiglu_quantize_fp8_numpy(h, **maps, **settings)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    tuning = QuantizeTuning(segment_columns=(width,), narrow_live_rows=0,
                            unzeroed_block_rows_from_bytes=math.inf,
                            by_slot_from_rows_per_slot=0 if by_slot else math.inf,
                            narrow_slot_columns_per_sm=0)
    hint = {"token_topk_to_pos": plan.token_topk_to_pos} if by_slot else {}
    codes, sf = quantize_with_tuning(tuning, "swiglu_quantize_fp8", h, **maps, **settings,
                                     zero_padding=zero_padding, **hint)
    gpu.check_canaries()
    assert gpu.launches[-1].endswith(f"_rows{width}{'_slots' if by_slot else ''}"), gpu.launches
    _check_swiglu_rows(plan, weights, (codes, sf), (want_codes, want_sf), zero_padding)
    if col_major:
        assert (_sf_pad_columns(sf) == 0).all()


@pytest.mark.parametrize("side", ["after", "before"])
@pytest.mark.parametrize("layout", sorted(SF_LAYOUTS))
@pytest.mark.parametrize("tuning_name", sorted(BY_SLOT))
def test_swiglu_by_slot_with_a_wrong_hint_stays_inside(monkeypatch, rng, layout, tuning_name,
                                                       side):
    """A hint that disagrees with the maps (rows past X, INT_MAX, negative,
    two slots trading rows), unvalidated: which rows are written is
    unspecified, but nothing outside the outputs is written (the canaries)
    nor anything outside the inputs read (each against an inaccessible page,
    after or before it), and a slot whose hint names a row in range writes
    that row its own values."""
    packed, col_major, round_sf = SF_LAYOUTS[layout]
    plan, weights = _plan(rng, 13, 4, 24, 16, 8)
    num_rows = plan.pos_to_expert.shape[0]
    hint = plan.token_topk_to_pos.copy()
    flat = hint.reshape(-1)
    named = np.flatnonzero(flat >= 0)
    flat[named[:4]] = [num_rows, num_rows + 5, 2**31 - 1, -7]
    flat[named[4:6]] = flat[named[5:3:-1]]  # two slots trade rows
    h = rng.standard_normal((num_rows, 2048)).astype(ml_dtypes.bfloat16)  # I = 1024
    maps = {"topk_weights": weights, "pos_to_token_topk": plan.pos_to_token_topk,
            "pos_to_expert": plan.pos_to_expert}
    settings = {"num_per_channels": 128, "round_sf": round_sf, "packed_ue8m0": packed,
                "use_tma_aligned_col_major_sf": col_major}
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    fenced_maps = {name: fenced(a, side) for name, a in maps.items()}
    codes, _ = quantize_with_tuning(BY_SLOT[tuning_name], "swiglu_quantize_fp8",
                                    fenced(h, side), **fenced_maps, **settings,
                                    zero_padding=False, token_topk_to_pos=fenced(hint, side))
    assert gpu.launches[-1].endswith("_slots")
    gpu.check_canaries()
    # the slots left alone still write their rows exactly
    want = swiglu_quantize_fp8_numpy(h, **maps, **settings)[0].view(np.uint8)
    kept = named[6:]
    rows = flat[kept]
    np.testing.assert_array_equal(codes.view(np.uint8)[rows], want[rows])


@pytest.mark.parametrize("tuning_name", sorted(BY_SLOT))
def test_swiglu_by_slot_equals_the_rows_kernels(monkeypatch, rng, tuning_name):
    """Visiting slots or rows (zero_padding off both ways, the same tuning
    but for the hint), the outputs come out byte for byte the same, the
    untouched padding rows' poison included."""
    plan, weights = _plan(rng, 7, 8, 40, 40, 4)
    h = rng.standard_normal((plan.pos_to_expert.shape[0], 2048)).astype(ml_dtypes.bfloat16)
    maps = {"topk_weights": weights, "pos_to_token_topk": plan.pos_to_token_topk,
            "pos_to_expert": plan.pos_to_expert}
    settings = {"use_tma_aligned_col_major_sf": True, "zero_padding": False}
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    tuning = BY_SLOT[tuning_name]
    by_slot = quantize_with_tuning(tuning, "swiglu_quantize_fp8", h, **maps, **settings,
                                   token_topk_to_pos=plan.token_topk_to_pos)
    by_rows = quantize_with_tuning(tuning, "swiglu_quantize_fp8", h, **maps, **settings)
    assert gpu.launches[0].endswith("_slots") and not gpu.launches[1].endswith("_slots")
    gpu.check_canaries()
    np.testing.assert_array_equal(by_slot[0].view(np.uint8), by_rows[0].view(np.uint8))
    np.testing.assert_array_equal(np.ascontiguousarray(by_slot[1]).view(np.uint8),
                                  np.ascontiguousarray(by_rows[1]).view(np.uint8))


def _quantize_emulated(monkeypatch, rng, x: np.ndarray, layout: str,
                       tuning: QuantizeTuning, num_per_channels: int = 128):
    """quantize_fp8 of ``x`` (blocks of ``num_per_channels``, the SF layout
    ``layout``) on the
    emulated GPU under ``tuning``, codes and scale factors checked bit for
    bit against the oracle and the canaries checked; returns the GPU (its
    launches) and the scale factors (a view over the buffer)."""
    packed, col_major, round_sf = SF_LAYOUTS[layout]
    settings = {"num_per_channels": num_per_channels, "round_sf": round_sf,
                "packed_ue8m0": packed, "use_tma_aligned_col_major_sf": col_major}
    want = quantize_fp8_numpy(x, **settings)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = quantize_with_tuning(tuning, "quantize_fp8", x, **settings)
    gpu.check_canaries()
    np.testing.assert_array_equal(got[0].view(np.uint8), want[0].view(np.uint8))
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])
    return gpu, np.asarray(got[1])


@pytest.mark.parametrize("layout", sorted(SF_LAYOUTS))
@pytest.mark.parametrize(("hidden", "dtype", "tuning"), [
    (7168, "bfloat16", QuantizeTuning()),   # 37 rows: 2,009 columns an SM, *_vec / *_tiles
    (2048, "float32", QuantizeTuning()),    # 574 columns an SM: *_vec1
    (7168, "bfloat16", QuantizeTuning(vec1_columns_per_sm=math.inf)),   # *_vec1
    (2048, "float32", QuantizeTuning(vec1_columns_per_sm=0)),   # *_vec / *_tiles
    (4096, "bfloat16", QuantizeTuning(packed_sf_tiles=False, vec1_columns_per_sm=0)),
    (100, "bfloat16", QuantizeTuning()),   # H % npc != 0: the element-access kernel
])
def test_quantize_matches_the_oracle(monkeypatch, rng, layout, hidden, dtype, tuning):
    """quantize_fp8's kernels (run on the GPU before: a check of the
    emulation as much as of them)."""
    packed, col_major, _ = SF_LAYOUTS[layout]
    x = rng.standard_normal((37, hidden)).astype(np.float32) * 10
    x = x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x
    gpu, _ = _quantize_emulated(monkeypatch, rng, x, layout, tuning)
    wide = 37 * hidden > tuning.vec1_columns_per_sm * gpu.multiprocessors
    tiles = tuning.packed_sf_tiles if packed else col_major and tuning.sf_column_tiles
    kernel = "any" if hidden % 128 else "vec1" if not wide else "tiles" if tiles else "vec"
    assert gpu.launches[-1].endswith(f"_{kernel}"), gpu.launches


@pytest.mark.parametrize("layout", ["col-f32", "col-ue8m0"])
@pytest.mark.parametrize("num_rows", [1, 2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("tuning", [QuantizeTuning(), QuantizeTuning(vec1_packed_pad_words=False),
                                    QuantizeTuning(vec1_columns_per_sm=0),
                                    QuantizeTuning(vec1_columns_per_sm=0,
                                                   tiles_packed_pad_words=False)],
                         ids=["vec1", "vec1-packed-pad-bytes", "tiles", "tiles-packed-pad-bytes"])
def test_quantize_last_row_and_pad_columns(monkeypatch, rng, layout, num_rows, tuning):
    """Row R-1's column-major scale factors and the pad columns after it (0
    to 3 of them), in a poisoned SF buffer."""
    x = (rng.standard_normal((num_rows, 640)).astype(np.float32) * 10).astype(ml_dtypes.bfloat16)
    gpu, sf = _quantize_emulated(monkeypatch, rng, x, layout, tuning)
    # (at most 7 rows of 640 columns: 34 an SM, *_vec1 by default)
    assert gpu.launches[-1].endswith("_vec1" if tuning.vec1_columns_per_sm else "_tiles")
    assert (_sf_pad_columns(sf) == 0).all()   # written over the poison


@pytest.mark.parametrize("kernel", ["vec1", "tiles"])
@pytest.mark.parametrize("num_rows", [1, 3, 6])
@pytest.mark.parametrize(("hidden", "dtype", "num_per_channels"), [
    (640, "bfloat16", 128),    # 5 blocks a row: the last word one block and zeros
    (384, "bfloat16", 128),    # 3 blocks: the last word's block not its first
    (1152, "bfloat16", 32),    # 36 blocks: whole words
    (544, "bfloat16", 32),     # 17 blocks
    (1152, "float32", 128),    # 9 blocks
    (416, "float32", 32),      # 13 blocks
])
def test_quantize_packed_scale_factors(monkeypatch, rng, kernel, num_rows, hidden, dtype,
                                      num_per_channels):
    """quantize_fp8's *_vec1 and *_tiles with packed UE8M0 scale factors
    (row R-1's pad-column words whole, by each word's first block), in a
    poisoned buffer: every byte of the words and of the pad columns
    written. (*_tiles takes H % 128 == 0; the others go to *_vec.)"""
    x = rng.standard_normal((num_rows, hidden)).astype(np.float32) * 10
    x = x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x
    tuning = QuantizeTuning() if kernel == "vec1" else QuantizeTuning(vec1_columns_per_sm=0)
    gpu, sf = _quantize_emulated(monkeypatch, rng, x, "col-ue8m0", tuning, num_per_channels)
    if kernel == "tiles" and hidden % 128:
        kernel = "vec"
    assert gpu.launches[-1].endswith(f"_{kernel}"), gpu.launches
    assert (_sf_pad_columns(sf) == 0).all()


# The oracle cases pass pos_to_token to every tuning; the default writes small
# calls given it by position (rows_by_position_tokens_below), so the tunings
# of the other kernels turn that off to keep their kernels under test.
BY_POSITION_OFF = {"rows_by_position_tokens_below": 0}
GATHER = ExpandTuning(**BY_POSITION_OFF, gather_x_bytes_below=float("inf"))
# a block a row of one warp (the seed's grid: a block an output row)
GATHER_A_BLOCK_A_ROW = ExpandTuning(**BY_POSITION_OFF, gather_x_bytes_below=float("inf"),
                                    gather_rows=1, threads=32)
# the register kernel compiled for the call's row (EXPAND_ROW_BYTES)
COMPILED_ROW = ExpandTuning(**BY_POSITION_OFF, bulk_min_blocks=float("inf"), compiled_row=1)
# zero-fill blocks of 32 rows, by runs of rows where a row is one chunk (fp8
# rows of 3 KiB: 192 accesses of 256 threads); the SF by the zero-fill blocks
ZERO_RUNS = ExpandTuning(**BY_POSITION_OFF, bulk_min_blocks=float("inf"), zero_fill_runs=1,
                         zero_rows_registers=32)
ZERO_RUNS_SF_IN_LINE = ExpandTuning(**BY_POSITION_OFF, bulk_min_blocks=float("inf"),
                                    zero_fill_runs=1, zero_rows_registers=32, sf_by_position=0)
# ... the runs' loops unrolled by 4
ZERO_RUNS_UNROLLED = ExpandTuning(**BY_POSITION_OFF, bulk_min_blocks=float("inf"),
                                  zero_fill_runs=2, zero_rows_registers=32)
# ... and row by row (zero_fill_runs 0, the default before the twenty-ninth session)
ROW_BY_ROW = ExpandTuning(**BY_POSITION_OFF, bulk_min_blocks=float("inf"), zero_fill_runs=0)
BULK = ExpandTuning(**BY_POSITION_OFF, bulk_min_blocks=0.0, padding_share_registers=float("inf"),
                    medium_padding_share_registers=float("inf"),
                    bulk_whole_row_zero_from=float("inf"))
# every call padding-heavy, its padding rows zeroed by expand_zero_padding_rows
# beside the copy kernel (scale factors by its row blocks, or by the SF pass
# as its last blocks): the GPU tests' kernel paths of those names
ZERO_KERNEL = replace(KERNEL_PATHS["zero-kernel"], **BY_POSITION_OFF)
ZERO_KERNEL_SF_PASS = replace(KERNEL_PATHS["zero-kernel-sf-pass"], **BY_POSITION_OFF)
# the lean rows kernel: token blocks of all K slots; of one slot at 64 threads
ROWS = replace(KERNEL_PATHS["rows"], **BY_POSITION_OFF)
ROWS_BY_SLOT = replace(KERNEL_PATHS["rows-by-slot"], **BY_POSITION_OFF)
# ... at a block size that does not divide 1,024 vectors (96: 11 a thread)
ROWS_96 = ExpandTuning(**BY_POSITION_OFF, rows_kernel_tokens_below=float("inf"),
                       rows_kernel_threads=96)
# ... token blocks of 3 slots (K = 8: groups of 3, 3 and 2)
ROWS_GROUPS_OF_3 = ExpandTuning(**BY_POSITION_OFF, rows_kernel_tokens_below=float("inf"),
                                rows_kernel_slot_group=3)
# ... the long rows' layout on every call it fits: 128 threads, token blocks of 4 slots
ROWS_LONG = replace(KERNEL_PATHS["rows-long"], **BY_POSITION_OFF)
# ... by position, a block a row (the call passes pos_to_token); before the
# warp-a-row gather where both are asked; at 96 threads (11 vectors a thread)
ROWS_BY_POSITION = KERNEL_PATHS["rows-by-position"].tuning
ROWS_BY_POSITION_OVER_GATHER = ExpandTuning(rows_by_position_tokens_below=float("inf"),
                                            gather_x_bytes_below=float("inf"))
ROWS_BY_POSITION_96 = ExpandTuning(rows_by_position_tokens_below=float("inf"),
                                   rows_kernel_threads=96)
# ... with room for 16 KiB rows whatever the call's row (rows_kernel_fitted_unroll 0)
ROWS_BY_POSITION_ROOM = ExpandTuning(rows_by_position_tokens_below=float("inf"),
                                     rows_kernel_fitted_unroll=0)
ROWS_96_ROOM = ExpandTuning(**BY_POSITION_OFF, rows_kernel_tokens_below=float("inf"),
                            rows_kernel_threads=96, rows_kernel_fitted_unroll=0)


@pytest.mark.parametrize("zero_padding", [True, False])
@pytest.mark.parametrize(("hidden", "item", "tuning"), [
    (3072, 2, GATHER),                   # the gather kernel (Qwen3's rows)
    (3072, 2, GATHER_A_BLOCK_A_ROW),
    (7168, 2, GATHER),
    (1004, 2, GATHER),                   # rows not of 16-byte chunks: no gather
    (3072, 2, ExpandTuning()),           # the default: by position (T = 29, given pos_to_token)
    (3072, 2, ExpandTuning(**BY_POSITION_OFF)),  # the default's other kernels
    (3072, 2, COMPILED_ROW),             # one access a thread of 192 threads' row
    (7172, 2, COMPILED_ROW),             # 8-byte rows: the v8 kernel, chunks and a short one
    (1536, 2, ZERO_RUNS),                # zero-fill by runs: 3 KiB rows of one chunk
    (3072, 2, ZERO_RUNS),                # ... rows of two chunks: row by row as before
    (1536, 2, ROW_BY_ROW),               # zero_fill_runs 0: row by row
    (1536, 2, ZERO_RUNS_UNROLLED),
    (7168, 2, BULK),                     # Hopper's bulk copies (cp.async.bulk)
    (3072, 2, ZERO_KERNEL),              # padding rows by the zero kernel: 6 KiB, 2 a block
    (1544, 2, ZERO_KERNEL),              # ... rows not of whole blocks' accesses
    (3072, 2, ROWS),                     # the lean rows kernel: 6 KiB rows
    (7168, 2, ROWS),                     # ... 14 KiB rows (every vector a thread holds)
    (8200, 2, ROWS),                     # ... 16,400-byte rows: past it, another kernel
    (1004, 2, ROWS),                     # ... rows not of 16-byte chunks: another kernel
    (3072, 2, ROWS_BY_SLOT),             # ... a slot a token block, 64 threads
    (8192, 2, ROWS_96),                  # ... 16 KiB rows at 96 threads
    (3072, 2, ROWS_GROUPS_OF_3),         # ... token blocks of 3 slots, the last of 2
    (7168, 2, ROWS_LONG),                # ... long rows: 14 KiB, 128 threads, 4 slots a block
    (8200, 2, ROWS_LONG),                # ... past 16 KiB: another kernel
    (3072, 2, ROWS_BY_POSITION),         # ... by position: a block a row
    (8192, 2, ROWS_BY_POSITION_96),      # ... 16 KiB rows at 96 threads
    (3584, 2, ROWS_BY_POSITION_96),      # ... 448 vectors at 96 threads: 5 a thread, a short 5th
    (3072, 2, ROWS_BY_POSITION_ROOM),    # ... room for 16 KiB rows (4 vectors a thread)
    (3584, 2, ROWS_96_ROOM),             # ... token blocks, room for 16 KiB at 96 threads
    (7168, 2, ROWS_BY_POSITION_OVER_GATHER),  # ... before the warp-a-row gather
    (8200, 2, ROWS_BY_POSITION_OVER_GATHER),  # ... past 16 KiB: the gather
    (1004, 2, ROWS_BY_POSITION),         # ... rows not of 16-byte chunks: another kernel
])
def test_expand_matches_the_oracle(monkeypatch, rng, zero_padding, hidden, item, tuning):
    """expand_to_fused on a padded plan, given pos_to_token: rows as the
    oracle's; with zero_padding off, padding rows untouched."""
    plan, _ = _plan(rng, 29, 8, 32, 24, 16)
    x = rng.integers(0, 256, (29, hidden), dtype=np.uint8) if item == 1 else \
        rng.integers(0, 2**16, (29, hidden), dtype=np.uint16)
    want = expand_to_fused_numpy(x, plan.token_topk_to_pos, plan.pos_to_expert)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    # every input against an inaccessible page: nothing outside them is read
    side = "after" if hidden * item % 16 == 0 else "before"
    got, _ = expand_with_tuning(tuning, fenced(x, side), fenced(plan.token_topk_to_pos, side),
                                fenced(plan.pos_to_expert, side), zero_padding=zero_padding,
                                pos_to_token=fenced(plan.pos_to_token, side))
    gpu.check_canaries()
    whole_vectors = hidden * item % 16 == 0
    fits_rows = whole_vectors and hidden * item <= 16384
    by_position = (fits_rows and tuning.rows_by_position_tokens_below > 29
                   and plan.pos_to_expert.shape[0] * hidden * item
                   < tuning.rows_by_position_bytes_below)
    gathers = tuning.gather_x_bytes_below > 0 and whole_vectors and not by_position
    assert ("expand_to_fused_gather" in gpu.launches) == gathers
    assert ("expand_to_fused_rows" in gpu.launches) == (
        by_position or (fits_rows and not gathers and (
            tuning.rows_kernel_tokens_below > 29
            or (hidden * item > tuning.long_rows_row_bytes_above
                and plan.pos_to_expert.shape[0] * hidden * item < tuning.long_rows_bytes_below
                and tuning.long_rows_tokens_from <= 29 < tuning.long_rows_tokens_below))))
    padding = plan.pos_to_expert < 0
    np.testing.assert_array_equal(got[~padding], want[~padding])
    if zero_padding:
        assert (got[padding] == 0).all()
    else:
        assert (got[padding].view(np.uint8) == POISON).all()


# -- the families run on a GPU before: the emulation keeps CI watching their kernels ------

@pytest.mark.parametrize(("layout", "hidden", "tuning"), [
    ("col-f32", 7168, BULK),
    ("col-ue8m0", 7168, ExpandTuning()),
    ("row-f32", 2048, ExpandTuning(**BY_POSITION_OFF)),  # the default's register kernel
    ("row-f32", 3072, COMPILED_ROW),
    ("row-f32", 3072, ZERO_RUNS),       # a run's scale factors as one range of words
    ("col-f32", 3072, ZERO_RUNS_SF_IN_LINE),  # ... column-major: row by row, pad columns too
    ("row-f32", 3072, ROW_BY_ROW),
    ("row-f32", 3072, ZERO_RUNS_UNROLLED),
    ("col-ue8m0", 3072, GATHER),
    ("row-f32", 3072, ZERO_KERNEL),          # the zero kernel: SF by its row blocks
    ("col-f32", 3072, ZERO_KERNEL),          # ... column-major, the pad columns too
    ("col-ue8m0", 1536, ZERO_KERNEL_SF_PASS),  # ... the SF pass as its last blocks
])
def test_expand_with_sf_matches_the_oracle(monkeypatch, rng, layout, hidden, tuning):
    """expand_to_fused_with_sf on a padded plan: fp8 rows and their scale
    factors (both layouts), the column-major SF pad columns zeroed."""
    packed, col_major, _ = SF_LAYOUTS[layout]
    plan, _ = _plan(rng, 23, 8, 32, 32, 16)
    x = rng.integers(0, 256, (23, hidden), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    blocks = hidden // 128
    if packed:
        x_sf = rng.integers(0, 2**31, (23, -(-blocks // 4)), dtype=np.int64).astype(np.int32)
    else:
        x_sf = rng.random((23, blocks), dtype=np.float32)
    want = expand_to_fused_with_sf_numpy(x, x_sf, plan.token_topk_to_pos, plan.pos_to_expert,
                                         col_major=col_major)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = expand_with_tuning(tuning, x, plan.token_topk_to_pos, plan.pos_to_expert, x_sf=x_sf,
                             num_per_channels=128, use_tma_aligned_col_major_sf=col_major,
                             pos_to_token=plan.pos_to_token)
    gpu.check_canaries()
    np.testing.assert_array_equal(got[0].view(np.uint8), want[0].view(np.uint8))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    if col_major:
        assert (_sf_pad_columns(got[1]) == 0).all()


@pytest.mark.parametrize("zero_padding", [True, False])
@pytest.mark.parametrize(("hidden", "tuning", "by_position"), [
    (2048, ExpandTuning(), True),          # the default given pos_to_token (T = 23): 16 words
    (7168, ROWS_BY_POSITION, True),        # Kimi-K2's fp8 rows: 56 words a row
    (16384, ROWS_BY_POSITION_96, True),    # 128 words on 96 threads: two rounds
    (16400, ROWS_BY_POSITION, False),      # rows past 16 KiB: another kernel
])
def test_expand_with_row_major_sf_by_position(monkeypatch, rng, zero_padding, hidden, tuning,
                                              by_position):
    """The rows kernel by position with row-major scale factors: block p
    writes row p's data and S words (x_sf[token]'s, zeros on padding rows; with
    zero_padding off, neither on a padding row), nothing outside the inputs
    read."""
    plan, _ = _plan(rng, 23, 8, 32, 32, 16)
    x = rng.integers(0, 256, (23, hidden), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    x_sf = rng.random((23, -(-hidden // 128)), dtype=np.float32)
    want = expand_to_fused_with_sf_numpy(x, x_sf, plan.token_topk_to_pos, plan.pos_to_expert,
                                         col_major=False)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = expand_with_tuning(tuning, fenced(x, "after"), fenced(plan.token_topk_to_pos, "after"),
                             fenced(plan.pos_to_expert, "after"), x_sf=fenced(x_sf, "after"),
                             num_per_channels=128, zero_padding=zero_padding,
                             pos_to_token=fenced(plan.pos_to_token, "after"))
    gpu.check_canaries()
    assert ("expand_to_fused_rows" in gpu.launches) == by_position
    padding = plan.pos_to_expert < 0
    for got_part, want_part in zip(got, want, strict=True):
        got_bytes, want_bytes = np.asarray(got_part).view(np.uint8), want_part.view(np.uint8)
        np.testing.assert_array_equal(got_bytes[~padding], want_bytes[~padding])
        if zero_padding:
            assert (got_bytes[padding] == 0).all()
        else:
            assert (got_bytes[padding] == POISON).all()


@pytest.mark.parametrize(("num_tokens", "top_k", "num_experts", "alignment"), [
    (1, 8, 384, 128),      # decode: the one-warp plan
    (37, 6, 64, 16),
    (700, 8, 128, 128),
    (4096, 8, 128, 128),   # prefill: the cooperative kernel
    (9, 10, 1024, 1),
])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_fused_mapping_matches_the_oracle(monkeypatch, rng, num_tokens, top_k, num_experts,
                                          alignment, dtype):
    """The routing plan, -1 and out-of-range ids among the slots."""
    import cupy_moe

    ids = rng.integers(-1, num_experts + 3, (num_tokens, top_k)).astype(dtype)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = cupy_moe.fused_mapping(ids, num_experts, alignment=alignment)
    gpu.check_canaries()
    slots = num_tokens * top_k  # X: the tight worst case
    num_rows = (slots + min(num_experts, slots) * (alignment - 1)) // alignment * alignment
    want = fused_mapping_numpy(ids, num_experts, alignment=alignment, num_expanded=num_rows)
    assert gpu.launches
    for name, got_field, want_field in zip(want._fields, got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(got_field), want_field, err_msg=name)


@pytest.mark.parametrize(("num_tokens", "top_k", "num_experts", "alignment", "num_expanded"), [
    # X a segment's start: the first row dropped is exactly X
    (1, 8, 384, 128, 128),   # decode, the one-warp plan
    (1, 8, 16, 4, 12),
    (37, 6, 64, 16, 304),
    (700, 8, 128, 128, 4992),
])
def test_fused_mapping_drops_the_slots_at_or_past_a_given_x(monkeypatch, rng, num_tokens,
                                                            top_k, num_experts, alignment,
                                                            num_expanded):
    """num_expanded below the worst case: slots whose rows would fall at or
    past X are dropped (-1), as the oracle drops them, and nothing lands
    past X."""
    import cupy_moe

    ids = rng.integers(0, num_experts, (num_tokens, top_k)).astype(np.int32)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = cupy_moe.fused_mapping(ids, num_experts, alignment=alignment,
                                 num_expanded=num_expanded)
    gpu.check_canaries()
    want = fused_mapping_numpy(ids, num_experts, alignment=alignment, num_expanded=num_expanded)
    assert gpu.launches and (want.token_topk_to_pos < 0).any()  # some slots were dropped
    for name, got_field, want_field in zip(want._fields, got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(got_field), want_field, err_msg=name)


@pytest.mark.parametrize(("num_tokens", "top_k", "num_experts", "alignment", "blocks", "warps",
                          "cluster", "dtype"), [
    (4096, 8, 128, 128, 16, 8, 8, "int64"),
    (1500, 6, 384, 64, 8, 4, 4, "int32"),
    (2000, 5, 100, 16, 12, 3, 2, "int64"),   # E not a multiple of 8: pad columns
    (1700, 7, 33, 1, 6, 2, 2, "int32"),
])
def test_fused_mapping_in_clusters_matches_the_oracle(monkeypatch, rng, num_tokens, top_k,
                                                      num_experts, alignment, blocks, warps,
                                                      cluster, dtype):
    """The cooperative kernel in clusters (MappingShape.cluster_blocks): the
    blocks of a cluster add up their counts through each other's shared
    memory before the grid barrier; the plan is the oracle's."""
    from cupy_moe.mapping.gpu import MappingPlan
    from cupy_moe.mapping.launch_shape import mapping_shape
    from cupy_moe.mapping.rules import MappingProblem

    ids = rng.integers(-1, num_experts + 3, (num_tokens, top_k)).astype(dtype)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    slots = ids.size
    rows = (slots + min(num_experts, slots) * (alignment - 1)) // alignment * alignment
    shape = mapping_shape(slots, num_experts, rows, 132, 232448, warps=warps, blocks=blocks,
                          cooperative=True, cluster_blocks=cluster)
    assert shape.cooperative and shape.cluster_blocks == cluster
    plan = MappingPlan(MappingProblem(num_tokens, top_k, num_experts, alignment, rows, dtype),
                       0, shape)
    buffer = gpu.empty((plan.buffer_size,), np.int32)
    plan.launch(0, ids.ctypes.data, buffer.ctypes.data)
    gpu.check_canaries()
    assert gpu.launches == [f"mapping_coop_cluster_i{dtype[3:]}"]
    want = fused_mapping_numpy(ids, num_experts, alignment=alignment, num_expanded=rows)
    for name, got_field, want_field in zip(want._fields, plan.views(buffer), want, strict=True):
        np.testing.assert_array_equal(got_field, want_field, err_msg=name)
    # the total of the rows (trim's), every expert's aligned rows
    aligned = -(-want.tokens_per_expert // alignment) * alignment
    assert buffer[plan.total_index] == aligned.sum()


@pytest.mark.parametrize(("dtype", "hidden"), [("bfloat16", 7168), ("float16", 2048),
                                               ("float32", 1024), ("bfloat16", 100)])
@pytest.mark.parametrize("row_scale", [False, True])
@pytest.mark.parametrize(("shape", "top_k"), [
    (None, 8), ({"vecs_per_thread": 2, "slot_batch": 2, "warp_slots": True}, 8),
    ({"vecs_per_thread": 1, "slot_batch": 4, "max_warps": 1, "warp_slots": True,
      "warp_tokens": 4}, 40),
    ({"vecs_per_thread": 2, "slot_batch": 4, "stream_rounds": 2}, 8),
    ({"vecs_per_thread": 1, "slot_batch": 2, "max_warps": 1, "stream_rounds": 1}, 3),
    ({"vecs_per_thread": 4, "slot_batch": 2, "stream_rounds": 4}, 32),
    ({"vecs_per_thread": 1, "bulk_stages": 2, "fill_blocks_per_sm": 0}, 8),
    ({"vecs_per_thread": 2, "bulk_stages": 4, "max_warps": 1}, 3),
    ({"vecs_per_thread": 4, "bulk_stages": 8, "fill_blocks_per_sm": 0}, 40),
    ({"vecs_per_thread": 2, "bulk_stages": 2, "bulk_rounds": 4, "max_warps": 1}, 8),
    ({"vecs_per_thread": 7, "max_warps": 4, "token_rows": True}, 8),
    ({"vecs_per_thread": 8, "max_warps": 1, "token_rows": True}, 3)],
    ids=["auto", "warp-slots", "warp-slots-k40-4-tokens", "stream-k8", "stream-k3",
         "stream-k32", "bulk-k8", "bulk-k3", "bulk-k40", "bulk-k8-4-rounds",
         "token-rows-7", "token-rows-8-k3"])
def test_reduce_fused_matches_the_oracle(monkeypatch, rng, dtype, hidden, row_scale, shape,
                                         top_k):
    """The combine: each token's slots weighted and summed in k order, one
    rounding, as the oracle's emulated fma; also with a warp walking its
    token's live slots (a quarter of them remote, an eighth dropped; batches of
    2 live rows; K = 40: two rounds of 32 lanes' slots, one-warp chunks so that
    lanes past the row take part in the shuffles, 4 tokens a warp: 19 leaves
    the last warp 3); and with a warp streaming the live rows of rounds of
    32 // K tokens (K = 8: 2 rounds of 4, the last warp 3 tokens; K = 3: 10
    tokens a round, two lanes without a slot; K = 32: a token a round); and
    with a block's live rows landed in shared memory by bulk copies (2 stages
    reused over the 19 tokens' list at K = 8; one-warp blocks of 10 tokens at
    K = 3, the last 9; K = 40: 5 tokens a block of 224 threads, 1 where a
    block has 64; 4 rounds of 4 tokens a one-warp block, 2 stages numbered
    across the rounds, the second block's last rounds empty; unaligned rows
    fall back to the register walk)."""
    import cupy_moe
    from cupy_moe.combine.api import run_with_shape

    plan, weights = _plan(rng, 19, top_k, 32, 24, 8)
    num_rows = plan.pos_to_expert.shape[0]
    expanded = rng.standard_normal((num_rows, hidden)).astype(np.float32)
    expanded = expanded.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    scale = rng.random(num_rows, dtype=np.float32) if row_scale else None
    want = reduce_fused_numpy(expanded, plan.token_topk_to_pos, weights, row_scale=scale)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    if shape is None:
        got = cupy_moe.reduce_fused(expanded, plan.token_topk_to_pos, weights, row_scale=scale)
    else:
        got = run_with_shape(expanded, plan.token_topk_to_pos, weights, row_scale=scale,
                             **shape)
    gpu.check_canaries()
    assert gpu.launches  # the kernel ran (not the NumPy path)
    if shape is not None and shape.get("bulk_stages"):  # bulk copies of 16-byte rows only
        bulk = [dict(handle.defines).get("COMBINE_BULK_STAGES") for handle in gpu.handles]
        aligned = hidden * np.dtype(expanded.dtype).itemsize % 16 == 0
        assert bulk == [shape["bulk_stages"] if aligned else None]
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("shape", [None, {"vecs_per_thread": 2, "slot_batch": 2, "warp_slots": True},
                                   {"vecs_per_thread": 2, "bulk_stages": 2, "max_warps": 1},
                                   {"vecs_per_thread": 8, "max_warps": 1, "token_rows": True}],
                         ids=["auto", "warp-slots", "bulk", "token-rows"])
def test_reduce_fused_skips_slots_of_exactly_x(monkeypatch, rng, shape):
    """A slot naming row X (one past the last) is skipped, as any slot past
    X, on every kernel: never read (a read there is past the buffer)."""
    import cupy_moe
    from cupy_moe.combine.api import run_with_shape

    plan, weights = _plan(rng, 19, 8, 32, 24, 8)
    num_rows = plan.pos_to_expert.shape[0]
    token_topk_to_pos = plan.token_topk_to_pos.copy()
    token_topk_to_pos[::3, 1] = num_rows
    token_topk_to_pos[1::4, 5] = num_rows
    expanded = rng.standard_normal((num_rows, 256)).astype(ml_dtypes.bfloat16)
    want = reduce_fused_numpy(expanded, token_topk_to_pos, weights)
    gpu = emulated_gpu(monkeypatch, seed=int(rng.integers(1, 2**62)))
    got = (cupy_moe.reduce_fused(expanded, token_topk_to_pos, weights) if shape is None
           else run_with_shape(expanded, token_topk_to_pos, weights, **shape))
    gpu.check_canaries()
    assert gpu.launches
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))


# -- the emulation's own stand-ins for PTX conversions -------------------------------------

def _convert(function: str, values: np.ndarray, out_dtype, count: int) -> np.ndarray:
    import ctypes

    out = np.empty(count, out_dtype)
    getattr(build.conversions(), function)(ctypes.c_void_p(values.ctypes.data),
                                           ctypes.c_void_p(out.ctypes.data),
                                           ctypes.c_long(count))
    return out


def _hard_floats(rng) -> np.ndarray:
    """float32 around every half's and e4m3's boundaries: random bits, each
    half and its neighbours, the midpoints between halves, and specials."""
    halves = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = halves[np.isfinite(halves)].astype(np.float32)
    bits = finite.view(np.uint32)
    around = np.concatenate([bits - 1, bits, bits + 1]).view(np.float32)
    ordered = np.unique(finite[finite >= 0])
    midpoints = ((ordered[:-1].astype(np.float64) + ordered[1:]) / 2).astype(np.float32)
    special = np.array([np.inf, -np.inf, 65504, 65519.996, 65520, 65536, 448, 464, 480, 1e38,
                        2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-9, 2.0**-10, 1e-45],
                       np.float32)
    noise = rng.integers(0, 2**32, 2**18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([around, midpoints, -midpoints, special, -special, noise])
    return np.ascontiguousarray(values[~np.isnan(values)])


def test_the_half_conversions_are_numpys(rng):
    """cvt.f32.f16 on every half, cvt.rn.f16.f32 on hard floats: NumPy's
    float16 (round to nearest even, subnormals, overflow to inf)."""
    halves = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    widened = _convert("emu_f16_to_f32", halves, np.float32, halves.size)
    want = halves.view(np.float16).astype(np.float32)
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(widened.view(np.uint32)[finite],
                                  want.view(np.uint32)[finite])
    assert np.isnan(widened[~finite]).all()
    values = _hard_floats(rng)
    narrowed = _convert("emu_f32_to_f16", values, np.uint16, values.size)
    with np.errstate(over="ignore"):  # overflow to inf is what is checked
        want_halves = values.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(narrowed, want_halves)


def test_the_e4m3_conversion_is_the_oracles(rng):
    """cvt.rn.satfinite.e4m3x2.f32: ml_dtypes' e4m3fn (nearest even) inside
    +-448, saturated to +-448 beyond, NaN 0x7F; the first value in the upper
    byte."""
    values = _hard_floats(rng)
    values = np.concatenate([values, [np.nan, -np.nan]]).astype(np.float32)
    values = values[: values.size // 2 * 2]
    pairs = _convert("emu_f32_to_e4m3x2", values, np.uint16, values.size // 2)
    codes = np.empty(values.size, np.uint8)
    codes[0::2], codes[1::2] = pairs >> 8, pairs & 0xFF
    clamped = np.clip(values, -448, 448)
    want = clamped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).copy()
    want[np.isnan(values)] = 0x7F
    np.testing.assert_array_equal(codes, want)


@pytest.mark.parametrize("first", [0x7F7FFFE0, 0xFF7FFFE0, 0x43DFFFF0, 0x7FBFFFE0],
                         ids=["to-+inf", "to--inf", "at-448", "nans"])
def test_the_software_e4m3_is_the_hardwares_at_the_edges(first):
    """quantize.cu's self-test kernel (software codes against the conversion
    instruction, here its emulation) over the patterns that end at +-inf, at
    448 and among the NaNs: the GPU suite runs it over all 2^32 patterns,
    this one in CI (an infinity coded as NaN instead of +-448 is caught
    here)."""
    import ctypes

    from cupy_moe.quantize.launch_shape import QuantizeTuning

    count = 64
    module = build.module("quantize.cu", (*QuantizeTuning().defines(), ("QUANTIZE_OPS", 0)), 900)
    mismatch = np.full(1, 0xFFFFFFFF, np.uint32)
    args = [ctypes.c_uint(first), ctypes.c_uint(count),
            ctypes.c_void_p(mismatch.ctypes.data), ctypes.c_float(1.0)]
    params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
    module.launch("quantize_selftest_e4m3", (1, 1, 1), (64, 1, 1), 0, ctypes.addressof(params))
    assert mismatch[0] == 0xFFFFFFFF, f"first mismatch at {int(mismatch[0]):#010x}"


def test_before_hopper(monkeypatch, rng):
    """An sm_80 device: no bulk copies, the e4m3 codes by integer rounding
    (the kernels built with __CUDA_ARCH__ 800)."""
    x = rng.standard_normal((21, 2048)).astype(ml_dtypes.bfloat16)
    plan, weights = _plan(rng, 21, 8, 32, 32, 16)
    want_codes, want_sf = quantize_fp8_numpy(x, use_tma_aligned_col_major_sf=True)
    want_rows = expand_to_fused_numpy(x.view(np.uint16), plan.token_topk_to_pos,
                                      plan.pos_to_expert)
    gpu = emulated_gpu(monkeypatch, major=8, seed=int(rng.integers(1, 2**62)))
    codes, sf = quantize_with_tuning(QuantizeTuning(), "quantize_fp8", x,
                                     use_tma_aligned_col_major_sf=True)
    rows, _ = expand_with_tuning(BULK, x.view(np.uint16), plan.token_topk_to_pos,
                                 plan.pos_to_expert)
    gpu.check_canaries()
    assert not any("bulk" in name for name in gpu.launches)
    np.testing.assert_array_equal(codes.view(np.uint8), want_codes.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(sf), want_sf)
    np.testing.assert_array_equal(rows, want_rows)


def test_inline_ptx_is_rewritten_or_refused():
    """Each asm statement becomes its stand-in, operands in PTX's order; a
    template the table lacks fails the build, naming it (new PTX cannot run
    unmodelled)."""
    source = ('unsigned short low;\n'
              'asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(low) : "f"(b), "f"(a[1]));\n'
              'asm volatile("griddepcontrol.wait;" ::: "memory");\n')
    assert build.translate(source) == (
        'unsigned short low;\n'
        '((low) = emu::cvt_e4m3x2((b), (a[1])));\n'
        '((void)0);\n')
    with pytest.raises(build.TranslationError, match=r"no CPU stand-in for the PTX "
                                                     r"'mov.u64 %0, %%globaltimer;'"):
        build.translate('asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));')
    shared = build.translate("extern __shared__ __align__(128) unsigned char stage[];")
    assert shared == ("unsigned char* const stage = "
                      "reinterpret_cast<unsigned char*>(emu::dynamic_shared());")


def _launch_selftest(name: str, blocks: int, threads: int, *arrays,
                     shared_bytes: int = 0, seed: int = 7, cluster: int = 0) -> None:
    """Launch selftest.cu's ``name``; each argument an array (its pointer) or
    a Python int (an int64); ``cluster``: cooperative, in clusters of that many."""
    import ctypes

    pointers = [ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray)
                else ctypes.c_longlong(a) for a in arrays]
    params = (ctypes.c_void_p * len(pointers))(*[ctypes.addressof(p) for p in pointers])
    build.module("selftest.cu").launch(name, (blocks, 1, 1), (threads, 1, 1), shared_bytes,
                                       ctypes.addressof(params), seed=seed,
                                       cooperative=cluster > 0, cluster=cluster)


@pytest.mark.parametrize(("cluster", "seed"), [(2, 1), (4, 2), (8, 3)])
def test_a_cluster_reads_its_blocks_shared_memory_after_its_barrier(cluster, seed):
    """barrier.cluster and ld.shared::cluster: each block reads what the next
    block of its cluster wrote before the barrier, in any order of blocks and
    threads; a block that leaves before the barrier does not hold it up
    (PTX: the wait is for threads that have not exited), and the read of its
    shared memory is reported; a launch in clusters that do not divide the
    grid is refused."""
    blocks, threads = 4 * cluster, 64  # whole warps (.aligned)
    out = np.zeros(blocks * threads, np.int32)
    shared_bytes = 4 * threads
    _launch_selftest("selftest_cluster", blocks, threads, out, -1, 1, shared_bytes=shared_bytes,
                     seed=seed, cluster=cluster)
    block = np.arange(blocks)[:, None]
    peer = block - block % cluster + (block % cluster + 1) % cluster
    np.testing.assert_array_equal(out.reshape(blocks, threads),
                                  peer * 1000 + np.arange(threads))
    # block cluster + 1 leaves; block cluster reads it (its next)
    with pytest.raises(RuntimeError, match=rf"selftest_cluster: ld.shared::cluster of block "
                                           rf"{cluster + 1}, which has not started or has ended"):
        _launch_selftest("selftest_cluster", blocks, threads, out, cluster + 1, 1,
                         shared_bytes=shared_bytes, seed=seed, cluster=cluster)
    with pytest.raises(RuntimeError, match=rf"bad launch in clusters of {cluster}: grid "
                                           rf"\({blocks + 1},1,1\), cooperative"):
        _launch_selftest("selftest_cluster", blocks + 1, threads, out, -1, 1,
                         shared_bytes=shared_bytes, cluster=cluster)


def test_a_read_of_a_cluster_block_that_has_ended_is_reported():
    """Without the last barrier, a block's peer may end before it reads: the
    emulation reports the read (the GPU would read freed shared memory)."""
    out = np.zeros(2 * 32, np.int32)
    for seed in range(1, 200):  # until a peer ends first (the orders vary by seed)
        try:
            _launch_selftest("selftest_cluster", 2, 32, out, -1, 0, shared_bytes=128,
                             seed=seed, cluster=2)
        except RuntimeError as error:
            assert re.search(r"selftest_cluster: ld.shared::cluster of block [01], which has "
                             r"not started or has ended", str(error))
            return
    pytest.fail("no order of 199 seeds had a block end before its peer's read")


@pytest.mark.parametrize("seed", [1, 2, 3, 7])
def test_an_mbarrier_wait_waits_for_the_load_of_another_thread(seed):
    """A wait yields until its phase completes (thread 5's bulk copy), in any
    order of the threads; a wait for a copy never issued is a deadlock."""
    values = np.arange(100, 116, dtype=np.int32)
    out = np.zeros(32, np.int32)
    _launch_selftest("selftest_mbarrier", 1, 32, values, out, 0, shared_bytes=64, seed=seed)
    np.testing.assert_array_equal(out, np.tile(values, 2))
    with pytest.raises(RuntimeError, match=r"selftest_mbarrier: deadlock in block \(0,0,0\)"):
        _launch_selftest("selftest_mbarrier", 1, 32, values, out, 1, shared_bytes=64,
                         seed=seed)


def test_static_shared_memory_starts_each_block_as_garbage():
    """As on the GPU: a block reading a static __shared__ variable before
    writing it finds garbage, not what an earlier block left there."""
    out = np.zeros(40, np.int32)
    _launch_selftest("selftest_shared_garbage", 40, 1, out)
    assert (out.view(np.uint32) == 0xA5A5A5A5).all()


def test_misuse_is_reported_not_hung():
    """A barrier that can never complete, __trap(), a warp op naming lanes
    that left: each a RuntimeError naming the kernel and the fault."""
    out = np.zeros(32, np.int32)
    with pytest.raises(RuntimeError, match=r"selftest_deadlock: deadlock in block \(0,0,0\)"):
        _launch_selftest("selftest_deadlock", 1, 32, out)
    flag = np.zeros(64, np.int32)
    flag[37] = 1
    with pytest.raises(RuntimeError, match=r"selftest_trap: __trap\(\)"):
        _launch_selftest("selftest_trap", 1, 64, flag)
    # (which upper lanes have left by then depends on the threads' order)
    with pytest.raises(RuntimeError, match=r"selftest_exited_lanes: warp op: mask 0xffffffff "
                                           r"names lanes that exited \(0x[0-9a-f]{4}0000\)"):
        _launch_selftest("selftest_exited_lanes", 1, 32, out)
    with pytest.raises(RuntimeError, match="no kernel named selftest_missing"):
        _launch_selftest("selftest_missing", 1, 32, out)
    total = np.zeros(1, np.uint64)
    _launch_selftest("selftest_sum", 300, 64, total)
    assert int(total[0]) == 64 * 300 * 301 // 2


@pytest.mark.parametrize("side", ["after", "before"])
def test_a_read_past_a_fenced_input_faults(side):
    """fenced(): the page beside the copy is inaccessible, so a kernel reading
    one element past it (or before it) stops the process (run apart here);
    the element just inside reads back."""
    import subprocess
    import sys
    from pathlib import Path

    values = np.arange(1024, dtype=np.int32)
    inside = fenced(values, side)
    out = np.zeros(1, np.int32)
    _launch_selftest("selftest_read", 1, 1, inside, 1023 if side == "after" else 0, out)
    assert out[0] == (1023 if side == "after" else 0)
    program = (
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_kernels_on_cpu import _launch_selftest\n"
        "from cuda_on_cpu.device import fenced\n"
        f"a = fenced(np.arange(1024, dtype=np.int32), {side!r})\n"
        f"_launch_selftest('selftest_read', 1, 1, a, {1024 if side == 'after' else -1}, "
        "np.zeros(1, np.int32))\n")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == -11, (result.returncode, result.stderr[-2000:])
