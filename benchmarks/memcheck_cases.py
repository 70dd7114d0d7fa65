"""A representative subset of calls for compute-sanitizer (memcheck, initcheck).

Every kernel variant and access width (the bulk-copy kernel forced on small
batches too, by a tuning whose bulk_min_blocks is 0; the padding rows'
kernel of its own, by one that asks for it on every call), odd H, T == 0, X == 0,
a malformed map with positions past X, the column-major pad columns and
validate=True; fused_mapping; reduce_fused, quantize_fp8 and
swiglu_quantize_fp8 (by slot too, with a hint that disagrees); each result is
also checked bit-exact against the NumPy reference. Run it under the
sanitizer from benchmarks/gpu_check.sh.

    python benchmarks/memcheck_cases.py [--registers-only]
                                        [--mapping-only | --combine-only | --rows-only]

--mapping-only and --combine-only run only fused_mapping's calls, or only
those of reduce_fused, quantize_fp8 and swiglu_quantize_fp8 (a quick check
of one op family, in a device call that has other work); --rows-only only
the lean rows kernel's calls (token blocks and by position).

--registers-only keeps every call on the register kernel (a tuning whose
bulk_min_blocks is infinite): initcheck does not
see the bulk-copy engine's writes, so it reports the bulk kernel's outputs as
uninitialised when they are copied to the host. Whether memcheck instruments
the bulk engine's own accesses is not documented either; what shows that the
bulk kernel writes every output byte and nothing past the outputs are the GPU
tests (poisoned outputs, guard rows behind malformed maps, both kernels).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import cupy
import ml_dtypes
import numpy as np

import cupy_moe
from cupy_moe import reference
from cupy_moe.combine.api import run_with_shape as run_combine_with_shape
from cupy_moe.expand.api import run_with_tuning
from cupy_moe.expand.rules import sf_columns
from cupy_moe.expand.tuning import DEFAULT_TUNING, ExpandTuning
from cupy_moe.quantize.api import run_with_tuning as run_quantize_with_tuning
from cupy_moe.quantize.launch_shape import QuantizeTuning
from cupy_moe.mapping import worst_case_rows

# the register kernel on every call; the bulk-copy kernel (sm_90+, 16-byte
# rows) on every batch size
REGISTERS_ONLY = dataclasses.replace(DEFAULT_TUNING, bulk_min_blocks=math.inf)
# ... compiled for each call's row (EXPAND_ROW_BYTES, EXPAND_VECS_PER_THREAD)
COMPILED_ROW = dataclasses.replace(REGISTERS_ONLY, compiled_row=1)
# zero-fill blocks of 32 rows by runs (full masks), the runs' loops unrolled,
# and row by row (zero_fill_runs 0)
ZERO_RUNS_32 = dataclasses.replace(REGISTERS_ONLY, zero_rows_registers=32)
ZERO_RUNS_UNROLLED = dataclasses.replace(ZERO_RUNS_32, zero_fill_runs=2)
ROW_BY_ROW = dataclasses.replace(REGISTERS_ONLY, zero_fill_runs=0)
BULK_ALWAYS = dataclasses.replace(DEFAULT_TUNING, bulk_min_blocks=0.0,
                                  padding_share_registers=math.inf,
                                  medium_padding_share_registers=math.inf)
# the bulk kernel with zero-fill blocks of whole rows by 16-byte stores
BULK_ZERO_PLAIN = dataclasses.replace(BULK_ALWAYS, bulk_whole_row_zero_from=0,
                                      bulk_zero_rows_plain=1)
# every call with tokens padding-heavy, its padding rows by expand_zero_padding_rows
ZERO_KERNEL = dataclasses.replace(DEFAULT_TUNING, padding_share_registers=0.0,
                                  padding_whole_chunks_from=math.inf,
                                  zero_kernel_from_bytes=0, sf_pass_beside_zero_kernel=0)
# beside it, column-major scale factors by SF pass blocks at the end of its grid
ZERO_KERNEL_SF_PASS = dataclasses.replace(ZERO_KERNEL, sf_pass_beside_zero_kernel=1)
# rows by position (expand_to_fused_gather) on every call that passes
# pos_to_token; 40 rows a block: 5 a warp, the last block short
GATHER = dataclasses.replace(DEFAULT_TUNING, gather_x_bytes_below=math.inf, gather_rows=40,
                             rows_by_position_tokens_below=0)

# swiglu_quantize_fp8's *_block_rows with up to 32 rows a block
FEW_ROW_BLOCKS = QuantizeTuning(block_rows_from_bytes=0, block_rows_blocks_per_sm=0.01)
# swiglu_quantize_fp8's row-major kernels at any live rows, 768-column
# segments first (*_rows768 for I = 768, *_rows for 2048 and 7168)
SHORT_SEGMENTS = QuantizeTuning(segment_columns=(768, 1024), narrow_live_rows=0)
# quantize_fp8's column-major float32 SF on *_vec (the default: *_tiles, 8 x 128
# tiles a warp, where H % 128 == 0)
VEC_COLUMNS = QuantizeTuning(sf_column_tiles=False)
# packed UE8M0 SF on *_vec (the default: *_tiles), the last word's bytes in
# one store (off by default)
PACKED_VEC = QuantizeTuning(packed_sf_tiles=False, packed_sf_word_stores=True)
PACKED_WORDS = QuantizeTuning(packed_sf_word_stores=True)


# swiglu_quantize_fp8's *_slots kernels on every call given token_topk_to_pos
# with zero_padding=False: by I (*_rows_slots, *_rows768_slots, *_vec_slots)
# and with one chunk a lane (*_vec1_slots)
BY_SLOT = QuantizeTuning(by_slot_from_rows_per_slot=0, narrow_slot_columns_per_sm=0)
BY_SLOT_VEC1 = QuantizeTuning(by_slot_from_rows_per_slot=0,
                              narrow_slot_columns_per_sm=float("inf"))


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(f"u{a.itemsize}")


def run_case(rng, tuning: ExpandTuning, num_tokens, hidden, top_k, num_expanded, *, layout,
             npc=128, malformed=False, given_tokens=False):
    fp8 = np.dtype(ml_dtypes.float8_e4m3fn)
    x = rng.integers(0, 256, (num_tokens, hidden), dtype=np.uint8)
    slots = np.full(num_tokens * top_k, -1, dtype=np.int32)
    used = min(num_tokens * top_k, num_expanded)
    slots[rng.permutation(num_tokens * top_k)[:used]] = rng.permutation(num_expanded)[:used]
    token_topk_to_pos = slots.reshape(num_tokens, top_k)
    if malformed and token_topk_to_pos.size:
        token_topk_to_pos.reshape(-1)[:: 3] = num_expanded + 7
    # rows no valid slot targets are padding: a well-formed map but for the
    # deliberately out-of-range slots
    pos_to_expert = np.full(num_expanded, -1, dtype=np.int32)
    in_range = (token_topk_to_pos >= 0) & (token_topk_to_pos < num_expanded)
    pos_to_expert[token_topk_to_pos[in_range]] = 1
    dmap, dp2e = cupy.asarray(token_topk_to_pos), cupy.asarray(pos_to_expert)
    pos_to_token = None
    if given_tokens:  # each row's token, as fused_mapping gives it
        pos_to_token = np.full(num_expanded, -1, dtype=np.int32)
        valid = (token_topk_to_pos >= 0) & (token_topk_to_pos < num_expanded)
        pos_to_token[token_topk_to_pos[valid]] = np.nonzero(valid)[0]
        pos_to_token = cupy.asarray(pos_to_token)
    if layout == "none":
        got, _ = run_with_tuning(tuning, cupy.asarray(x.astype(np.uint16)), dmap, dp2e,
                                 pos_to_token=pos_to_token)
        want = reference.expand_to_fused_numpy(x.astype(np.uint16), token_topk_to_pos,
                                               pos_to_expert)
        assert np.array_equal(cupy.asnumpy(got), want)
        return
    col_major, sf_dtype = {"row": (False, np.float32), "col-f32": (True, np.float32),
                           "col-ue8m0": (True, np.int32)}[layout]
    s = sf_columns(hidden, npc, packed_ue8m0=sf_dtype is np.int32)
    x_sf = rng.integers(0, 2**32, (num_tokens, s), dtype=np.uint32).view(sf_dtype)
    got_x, got_sf = run_with_tuning(
        tuning, cupy.asarray(x), dmap, dp2e, x_sf=cupy.asarray(x_sf), num_per_channels=npc,
        use_tma_aligned_col_major_sf=col_major, pos_to_token=pos_to_token)
    want_x, want_sf = reference.expand_to_fused_with_sf_numpy(
        x.view(fp8), x_sf, token_topk_to_pos, pos_to_expert, col_major=col_major)
    assert np.array_equal(cupy.asnumpy(got_x), bits(want_x))
    assert np.array_equal(bits(cupy.asnumpy(got_sf)), bits(want_sf))


def rows_tunings(base: ExpandTuning) -> tuple[ExpandTuning, ...]:
    """``base`` with the lean rows kernel on every call it can take (no SF,
    16-byte rows of at most 16 KiB): token blocks of all K slots, of one
    slot at 64 threads, and of 3 slots; and the long rows' layout
    (``long_rows``: 128 threads, 4 slots) on every such call. (Under
    initcheck ``base`` is REGISTERS_ONLY: the calls it cannot take fall back
    to kernels whose stores initcheck sees.)"""
    rows = dataclasses.replace(base, rows_kernel_tokens_below=math.inf)
    return (rows, dataclasses.replace(rows, rows_kernel_slot_blocks_below=math.inf,
                                      rows_kernel_threads=64),
            dataclasses.replace(rows, rows_kernel_slot_group=3),
            dataclasses.replace(base, long_rows_tokens_from=1, long_rows_tokens_below=math.inf,
                                long_rows_row_bytes_above=0, long_rows_bytes_below=math.inf))


def rows_by_position(base: ExpandTuning) -> ExpandTuning:
    """``base`` with the rows kernel writing by position on every call it can
    take that passes pos_to_token."""
    return dataclasses.replace(base, rows_by_position_tokens_below=math.inf,
                               rows_by_position_bytes_below=math.inf)


def run_cases(rng, tuning: ExpandTuning, hiddens, sizes, *,
              layouts=("none", "row", "col-f32", "col-ue8m0"), given_tokens=False) -> int:
    """Every layout, row length and (T, K, X) of ``sizes``, with a well-formed
    and a malformed map; returns the number of calls."""
    cases = 0
    for layout in layouts:
        for hidden in hiddens:
            for num_tokens, top_k, num_expanded in sizes:
                for malformed in (False, True):
                    run_case(rng, tuning, num_tokens, hidden, top_k, num_expanded, layout=layout,
                             malformed=malformed, given_tokens=given_tokens)
                    cases += 1
    return cases


def run_wrong_hint_cases(rng, tuning: ExpandTuning, layouts=("none", "row", "col-f32")) -> int:
    """Rows by position (the gather kernel; the rows kernel by position)
    given a pos_to_token that disagrees with the map: tokens past T,
    negative, huge. Each expert row must hold x[pos_to_token[p]] where that
    is a token, else zeros (the kernels' documented choice); the sanitizer
    looks for reads outside x and x_sf."""
    cases = 0
    for layout in layouts:
        for num_tokens, top_k, num_expanded in ((5, 3, 17), (33, 9, 301)):
            x = rng.integers(0, 256, (num_tokens, 64), dtype=np.uint8)
            pos_to_expert = rng.integers(-1, 2, num_expanded).astype(np.int32)
            pos_to_token = rng.integers(-3, num_tokens + 3, num_expanded).astype(np.int32)
            pos_to_token[::7] = np.iinfo(np.int32).max
            token_topk_to_pos = np.full((num_tokens, top_k), -1, dtype=np.int32)
            args = (cupy.asarray(token_topk_to_pos), cupy.asarray(pos_to_expert))
            kwargs = {"pos_to_token": cupy.asarray(pos_to_token)}
            if layout != "none":
                x_sf = rng.integers(0, 2**32, (num_tokens, 1), dtype=np.uint32).view(np.float32)
                kwargs.update(x_sf=cupy.asarray(x_sf), num_per_channels=128,
                              use_tma_aligned_col_major_sf=layout == "col-f32")
            # the plain op takes 2-byte rows: the same bytes as uint16
            payload = x.view(np.uint16) if layout == "none" else x
            got, got_sf = run_with_tuning(tuning, cupy.asarray(payload), *args, **kwargs)
            has_token = (pos_to_expert >= 0) & (pos_to_token >= 0) & (pos_to_token < num_tokens)
            sources = np.where(has_token, pos_to_token, 0)
            want = np.where(has_token[:, None], x[sources], 0)
            assert np.array_equal(cupy.asnumpy(got).view(np.uint8), want)
            if got_sf is not None:
                want_sf = np.where(has_token[:, None], bits(x_sf)[sources], 0)
                assert np.array_equal(bits(cupy.asnumpy(got_sf)), want_sf)
            cases += 1
    return cases


def run_rows_cases(rng, base: ExpandTuning) -> int:
    """The lean rows kernel (plain stores: initcheck sees them) over ``base``;
    16400-byte rows are past its 16 KiB, so they check the fallback's
    choice; by position given pos_to_token (without scale factors and with
    row-major ones), and given one that disagrees with the map."""
    cases = 0
    sizes = ((5, 3, 17), (0, 8, 6), (33, 9, 301), (4, 2, 0), (1, 8, 40))
    for tuning in rows_tunings(base):
        cases += run_cases(rng, tuning, (16, 2064, 7168, 16400), sizes, layouts=("none",))
    cases += run_cases(rng, rows_by_position(base), (16, 2064, 7168, 16400), sizes,
                       layouts=("none", "row"), given_tokens=True)
    return cases + run_wrong_hint_cases(rng, rows_by_position(base), layouts=("none", "row"))


def run_mapping_cases(rng) -> int:
    """fused_mapping: the one-warp plan, one launch and two, short X, T = 0,
    dropped and remote ids, int32 and int64, the 4096-expert limit (opt-in
    shared memory); returns the number of calls."""
    cases = 0
    for num_tokens, top_k, num_experts, alignment, short in (
            (1, 8, 384, 128, False), (4, 8, 4096, 200, True), (3, 10, 50, 1, False),
            (32, 8, 256, 128, True), (0, 8, 16, 64, False),
            (700, 6, 100, 16, True), (4096, 8, 384, 128, False), (4100, 10, 1000, 256, True),
            (2000, 9, 4096, 64, False)):
        for dtype in (np.int32, np.int64):
            ids = rng.integers(-1, num_experts + 2, size=(num_tokens, top_k)).astype(dtype)
            rows = worst_case_rows(ids.size, num_experts, alignment)
            if short:
                rows //= 3
            plan = cupy_moe.fused_mapping(cupy.asarray(ids), num_experts, alignment=alignment,
                                          num_expanded=rows)
            want = reference.fused_mapping_numpy(ids, num_experts, alignment=alignment,
                                                 num_expanded=rows)
            for got, expected in zip(plan, want, strict=True):
                assert np.array_equal(cupy.asnumpy(got), expected)
            cases += 1
    return cases


# reduce_fused's launch shapes beside the default, each an access pattern of
# its own: a warp walking its tokens' live slots (lane k reads slot k), 4
# tokens a warp (no access past the last slot or the last token); a warp
# streaming the live rows of 2 rounds of 32 // K tokens; a block's live rows
# landed in shared memory by bulk copies, 2 rounds a block (16-byte rows
# only: the others take the plain shape)
COMBINE_SHAPES = (
    {"vecs_per_thread": 2, "slot_batch": 2, "warp_slots": True, "warp_tokens": 4},
    {"vecs_per_thread": 2, "slot_batch": 4, "stream_rounds": 2},
    {"vecs_per_thread": 2, "bulk_stages": 2, "bulk_rounds": 2},
    # a group a token, K compiled in (full rows where H fills the vectors)
    {"vecs_per_thread": 7, "max_warps": 4, "token_rows": True},
    {"vecs_per_thread": 2, "max_warps": 8, "token_rows": True},
)


def run_combine_quantize_cases(rng) -> int:
    """reduce_fused, quantize_fp8, swiglu_quantize_fp8: odd and aligned widths,
    every SF layout, T = 0, slots past X (skipped, never read), padding rows;
    each result bit-exact against the NumPy backend. Returns the number of
    calls."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    cases = 0
    for num_tokens, hidden, top_k, num_expanded in ((5, 7, 3, 17), (33, 2048, 8, 300),
                                                    (0, 256, 8, 4), (3, 7168, 8, 24)):
        expanded = rng.standard_normal((num_expanded, hidden)).astype(np.float32)
        token_topk_to_pos = rng.integers(-1, num_expanded + 3, (num_tokens, top_k)).astype(
            np.int32)
        weights = rng.random((num_tokens, top_k)).astype(np.float32)
        for dtype in (np.float32, bf16):
            rows = expanded.astype(dtype)
            args = (cupy.asarray(rows.view(f"u{rows.itemsize}") if dtype is bf16 else rows),
                    cupy.asarray(token_topk_to_pos), cupy.asarray(weights))
            want = cupy_moe.reduce_fused(rows, token_topk_to_pos, weights)
            got = cupy_moe.reduce_fused(*args)
            assert np.array_equal(bits(cupy.asnumpy(got)), bits(want))
            for shape in COMBINE_SHAPES:
                got = run_combine_with_shape(*args, **shape)
                assert np.array_equal(bits(cupy.asnumpy(got)), bits(want)), shape
            cases += 1 + len(COMBINE_SHAPES)
    for num_rows, hidden in ((5, 300), (40, 2048), (0, 128), (3, 7168), (70, 768)):
        x = (rng.standard_normal((num_rows, hidden)) * 4).astype(bf16)
        for npc, packed, col_major in ((128, False, False), (32, False, True), (128, True, True)):
            settings = {"num_per_channels": npc, "round_sf": packed, "packed_ue8m0": packed,
                        "use_tma_aligned_col_major_sf": col_major}
            got = cupy_moe.quantize_fp8(cupy.asarray(x.view(np.uint16)), **settings)
            want = cupy_moe.quantize_fp8(x, **settings)
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(bits(cupy.asnumpy(g)), bits(np.asarray(w)))
            if col_major:
                got = run_quantize_with_tuning(PACKED_VEC if packed else VEC_COLUMNS,
                                               "quantize_fp8",
                                               cupy.asarray(x.view(np.uint16)), **settings)
                for g, w in zip(got, want, strict=True):
                    assert np.array_equal(bits(cupy.asnumpy(g)), bits(np.asarray(w)))
                cases += 1
            h = (rng.standard_normal((num_rows, 2 * hidden)) * 3).astype(bf16)
            pos_to_expert = np.where(rng.random(num_rows) < 0.3, -1, 0).astype(np.int32)
            got = cupy_moe.swiglu_quantize_fp8(cupy.asarray(h.view(np.uint16)),
                                               pos_to_expert=cupy.asarray(pos_to_expert),
                                               **settings)
            want = cupy_moe.swiglu_quantize_fp8(h, pos_to_expert=pos_to_expert, **settings)
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(bits(cupy.asnumpy(g)), bits(np.asarray(w)))
            # *_block_rows, up to 32 rows a block (the last block partial)
            got = run_quantize_with_tuning(FEW_ROW_BLOCKS, "swiglu_quantize_fp8",
                                           cupy.asarray(h.view(np.uint16)),
                                           pos_to_expert=cupy.asarray(pos_to_expert),
                                           **settings)
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(bits(cupy.asnumpy(g)), bits(np.asarray(w)))
            for tuning in (SHORT_SEGMENTS, PACKED_WORDS):
                got = run_quantize_with_tuning(tuning, "swiglu_quantize_fp8",
                                               cupy.asarray(h.view(np.uint16)),
                                               pos_to_expert=cupy.asarray(pos_to_expert),
                                               **settings)
                for g, w in zip(got, want, strict=True):
                    assert np.array_equal(bits(cupy.asnumpy(g)), bits(np.asarray(w)))
            # zero_padding=False (the default and the few-row kernels) into
            # poisoned outputs (so initcheck sees no unwritten bytes copied
            # back): live rows as above, padding rows' codes still poison,
            # nothing written outside the outputs
            live = pos_to_expert >= 0
            for tuning in (None, FEW_ROW_BLOCKS):
                out = cupy.full(want[0].shape, 0x7F, dtype=cupy.uint8)
                sf_rows, sf_columns = want[1].shape
                sf_dtype = np.asarray(want[1]).dtype
                out_sf = (cupy.full((sf_columns, -(-sf_rows // 4) * 4), -1, sf_dtype)[:, :sf_rows].T
                          if col_major else cupy.full((sf_rows, sf_columns), -1, sf_dtype))
                kwargs = dict(pos_to_expert=cupy.asarray(pos_to_expert), zero_padding=False,
                              out=out, out_sf=out_sf, **settings)
                h_dev = cupy.asarray(h.view(np.uint16))
                if tuning is None:
                    cupy_moe.swiglu_quantize_fp8(h_dev, **kwargs)
                else:
                    run_quantize_with_tuning(tuning, "swiglu_quantize_fp8", h_dev, **kwargs)
                codes = cupy.asnumpy(out)
                assert np.array_equal(bits(codes)[live], bits(np.asarray(want[0]))[live])
                assert (codes[~live] == 0x7F).all()
            cases += 7
    return cases


def run_slot_cases(rng) -> int:
    """swiglu_quantize_fp8 by slot: a real plan's token_topk_to_pos (remote
    experts, slots past X), then one that disagrees with the maps (rows
    past X, negative, INT_MAX; in-range rows named once). Each row a slot
    names must be that slot's (h of the row, the slot's weight), every other
    row left as poisoned, the column-major SF pad columns zero; the
    sanitizer looks for accesses outside h and the outputs."""
    cases = 0
    # I: *_rows_slots, *_rows768_slots, *_vec_slots (1280: no whole segments);
    # every I a multiple of 128, so that every call takes a *_slots kernel
    for num_tokens, hidden, alignment, cut in ((7, 2048, 8, 0), (33, 768, 4, 20),
                                               (5, 1280, 1, 3), (2, 256, 16, 0)):
        top_k = 4
        topk_ids = rng.integers(0, 16, (num_tokens, top_k)).astype(np.int32)
        worst = worst_case_rows(num_tokens * top_k, 8, alignment)
        plan = cupy_moe.fused_mapping(topk_ids, 8, alignment=alignment,
                                      num_expanded=max(0, worst - cut))
        num_rows = plan.pos_to_expert.shape[0]
        weights = rng.standard_normal((num_tokens, top_k)).astype(np.float32)
        h = (rng.standard_normal((num_rows, 2 * hidden)) * 3).astype(ml_dtypes.bfloat16)
        wrong = rng.integers(-3, num_rows + 3, num_tokens * top_k).astype(np.int32)
        wrong[::5] = np.iinfo(np.int32).max
        in_range = (wrong >= 0) & (wrong < num_rows)
        _, first = np.unique(wrong, return_index=True)
        repeated = np.ones(wrong.size, bool)
        repeated[first] = False
        wrong[in_range & repeated] = -1
        for hint in (plan.token_topk_to_pos, wrong.reshape(num_tokens, top_k)):
            # the rows the hint names, as maps of their own: the oracle's input
            named = np.flatnonzero((hint.reshape(-1) >= 0) & (hint.reshape(-1) < num_rows))
            slots = np.full(num_rows, -1, np.int32)
            slots[hint.reshape(-1)[named]] = named
            for tuning, (npc, packed, col_major) in ((BY_SLOT, (128, False, False)),
                                                     (BY_SLOT, (32, False, True)),
                                                     (BY_SLOT_VEC1, (128, True, True))):
                settings = {"num_per_channels": npc, "round_sf": packed, "packed_ue8m0": packed,
                            "use_tma_aligned_col_major_sf": col_major}
                want = cupy_moe.swiglu_quantize_fp8(h, topk_weights=weights,
                                                    pos_to_token_topk=slots, **settings)
                out = cupy.full(want[0].shape, 0x7F, dtype=cupy.uint8)
                sf_rows, sf_cols = want[1].shape
                sf_dtype = np.asarray(want[1]).dtype
                shape = (sf_cols, -(-sf_rows // 4) * 4) if col_major else (sf_rows, sf_cols)
                buffer = cupy.full(shape, -1, np.int32).view(sf_dtype)  # all bits set
                out_sf = buffer[:, :sf_rows].T if col_major else buffer
                run_quantize_with_tuning(
                    tuning, "swiglu_quantize_fp8", cupy.asarray(h.view(np.uint16)),
                    topk_weights=cupy.asarray(weights),
                    pos_to_token_topk=cupy.asarray(plan.pos_to_token_topk),
                    pos_to_expert=cupy.asarray(plan.pos_to_expert),
                    token_topk_to_pos=cupy.asarray(hint), zero_padding=False, out=out,
                    out_sf=out_sf, **settings)
                live = slots >= 0
                codes = cupy.asnumpy(out)
                assert np.array_equal(bits(codes)[live], bits(np.asarray(want[0]))[live])
                assert (codes[~live] == 0x7F).all()
                got_sf = bits(cupy.asnumpy(out_sf))
                assert np.array_equal(got_sf[live], bits(np.asarray(want[1]))[live])
                assert (got_sf[~live] == 0xFFFFFFFF).all()
                if col_major:  # the pad columns of the buffer behind out_sf: zero
                    assert not bits(cupy.asnumpy(buffer))[:, num_rows:].any()
                cases += 1
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registers-only", action="store_true",
                        help="keep every call on the register kernel (for initcheck)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--mapping-only", action="store_true",
                      help="only the fused_mapping calls")
    only.add_argument("--combine-only", action="store_true",
                      help="only the reduce_fused, quantize_fp8 and swiglu_quantize_fp8 calls")
    only.add_argument("--rows-only", action="store_true",
                      help="only the lean rows kernel's calls")
    args = parser.parse_args()
    registers_only = args.registers_only
    rng = np.random.default_rng(7)
    if args.mapping_only or args.combine_only or args.rows_only:
        cases = (run_mapping_cases(rng) if args.mapping_only
                 else run_rows_cases(rng, REGISTERS_ONLY if registers_only else DEFAULT_TUNING)
                 if args.rows_only
                 else run_combine_quantize_cases(rng) + run_slot_cases(rng))
        cupy.cuda.Device().synchronize()
        print(f"memcheck cases: {cases} calls, all bit-exact")
        return 0
    # the default tuning: the bulk kernel where its policy picks it
    cases = run_cases(rng, REGISTERS_ONLY if registers_only else DEFAULT_TUNING,
                      (1, 7, 37, 577, 7168), ((5, 3, 17), (0, 8, 6), (4, 2, 0), (33, 9, 301)))
    # the bulk-copy kernels (sm_90+) on every batch size: 16-byte rows, whole
    # or split into chunks with a short last one; rows of 8 KiB and more
    # (16400) take the whole-row zero-fill kernel
    cases += run_cases(rng, REGISTERS_ONLY if registers_only else BULK_ALWAYS,
                       (16, 2064, 7168, 16400), ((5, 3, 17), (0, 8, 6), (33, 9, 301)))
    cases += run_cases(rng, REGISTERS_ONLY if registers_only else BULK_ZERO_PLAIN,
                       (16, 2064, 7168), ((5, 3, 17), (0, 8, 6), (33, 9, 301)))
    # padding rows by expand_zero_padding_rows beside the copy kernel (16-byte
    # rows, sm_90+; the register kernel's zero-fill blocks under initcheck)
    cases += run_cases(rng, REGISTERS_ONLY if registers_only else ZERO_KERNEL,
                       (16, 2064, 7168), ((5, 3, 17), (0, 8, 6), (33, 9, 301)))
    # column-major scale factors: every one by the SF pass blocks where the call
    # passes pos_to_token (the calls above: the zeros only); beside the zero
    # kernel, its pass blocks; and in line, by the token and zero-fill blocks
    sizes = ((5, 3, 17), (0, 8, 6), (33, 9, 301))
    for tuning in ((REGISTERS_ONLY,) if registers_only
                   else (DEFAULT_TUNING, BULK_ZERO_PLAIN, ZERO_KERNEL_SF_PASS)):
        cases += run_cases(rng, tuning, (16, 2064, 7168), sizes,
                           layouts=("col-f32", "col-ue8m0"), given_tokens=True)
    if not registers_only:
        cases += run_cases(rng, ZERO_KERNEL_SF_PASS, (16, 2064, 7168), sizes,
                           layouts=("col-f32", "col-ue8m0"))
    for tuning in ((REGISTERS_ONLY,) if registers_only else (DEFAULT_TUNING, BULK_ZERO_PLAIN)):
        cases += run_cases(rng, dataclasses.replace(tuning, sf_by_position=0), (16, 2064, 7168),
                           sizes, layouts=("col-f32", "col-ue8m0"))
    # the register kernel compiled for the row: rows of one access a thread
    # or several, a short last chunk, 8-byte rows (the v8 kernel)
    cases += run_cases(rng, COMPILED_ROW, (4, 1536, 2064, 7168), sizes)
    cases += run_cases(rng, COMPILED_ROW, (16, 2064), sizes, layouts=("row", "col-ue8m0"))
    # zero-fill by runs (rows of one chunk) in 32-row blocks, unrolled, and
    # row by row
    for tuning in (ZERO_RUNS_32, ZERO_RUNS_UNROLLED, ROW_BY_ROW):
        cases += run_cases(rng, tuning, (4, 1536), sizes, layouts=("none", "row", "col-f32"))
    # rows by position, given pos_to_token (plain stores only: initcheck sees them);
    # X == 0 and T == 0 too, then a hint that disagrees with the map
    cases += run_cases(rng, GATHER, (16, 2064, 7168), (*sizes, (4, 2, 0)), given_tokens=True)
    cases += run_wrong_hint_cases(rng, GATHER)
    cases += run_rows_cases(rng, REGISTERS_ONLY if registers_only else DEFAULT_TUNING)
    # validate=True: the routing kernels, on a good map and on a bad one
    x = cupy.zeros((3, 64), dtype=cupy.uint16)
    good = cupy.asarray(np.array([[0, 1], [2, -1], [3, 4]], dtype=np.int32))
    good_experts = cupy.asarray(np.array([0, 0, 1, 1, 1], np.int32))
    cupy_moe.expand_to_fused(x, good, good_experts, validate=True)
    try:
        bad_experts = cupy.asarray(np.array([0, 0, 1, -1], np.int32))
        cupy_moe.expand_to_fused(x, good, bad_experts, validate=True)
    except ValueError:
        pass
    else:
        raise AssertionError("validate=True accepted a map with an out-of-range slot")
    cases += run_mapping_cases(rng)
    cases += run_combine_quantize_cases(rng)
    cases += run_slot_cases(rng)
    cupy.cuda.Device().synchronize()
    print(f"memcheck cases: {cases + 2} calls, all bit-exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
