"""How the quantize kernels cut a call into warps and lanes (pure Python, no
GPU): the grid of every shape covers each output column and each scale
factor exactly once, as kernels_cu/quantize.cu computes its indices."""

from __future__ import annotations

import contextlib
import itertools
import math
import re

import numpy as np
import pytest

from cupy_moe.quantize.launch_shape import (
    DEFAULT_TUNING,
    LANE_COLUMNS,
    SEGMENT_COLUMNS,
    SF_COL_MAJOR_F32,
    SF_COL_MAJOR_UE8M0,
    SF_ROW_MAJOR_F32,
    TILE_COLUMNS,
    TILE_ROWS,
    QuantizeTuning,
    division_magic,
    launch_shape,
)

SF_LAYOUT_NAMES = {"row-f32": SF_ROW_MAJOR_F32, "col-f32": SF_COL_MAJOR_F32,
                   "packed": SF_COL_MAJOR_UE8M0}


@pytest.mark.parametrize("divisor", [*range(1, 300), 1023, 1024, 1025, 65535, 2**20 + 7,
                                     2**30, 2**31 - 1])
def test_division_magic_is_exact_below_2_pow_31(divisor, rng):
    magic, shift = division_magic(divisor)
    assert magic < 2**32
    n = np.concatenate([np.arange(0, 3000), rng.integers(0, 2**31, 3000),
                        np.arange(2**31 - 3000, 2**31),
                        np.arange(1, 50) * divisor - 1, np.arange(1, 50) * divisor])
    n = n[(n >= 0) & (n < 2**31)].astype(object)  # exact integers: the kernel's 64-bit product
    assert [(v * magic) >> shift for v in n] == [v // divisor for v in n]


def test_division_magic_rejects_out_of_range_divisors():
    with pytest.raises(ValueError, match=re.escape("divisor must be in 1 .. 2**31 - 1; got 0")):
        division_magic(0)


def _count_sf_store(counts, packed_bytes, row, block, num_rows, blocks_per_row):
    """One scale-factor store as store_scale_factor makes it (packed: its bytes,
    the last block's zero bytes, row R-1's pad columns)."""
    counts[row, block] += 1
    zero_after = 3 - block % 4 if block == blocks_per_row - 1 else 0
    ld = packed_bytes.shape[1]
    for r in range(row, ld if row == num_rows - 1 else row + 1):
        for j in range(zero_after + 1):
            packed_bytes[block // 4, r, block % 4 + j] += 1


def emulate_grid(num_rows: int, hidden: int, npc: int, multiprocessors: int = 132,
                 tuning: QuantizeTuning = DEFAULT_TUNING, *, vector: bool = False,
                 chunk: int = 8, swiglu: bool = False, narrow: bool = False, live=None,
                 sf_layout: int = SF_ROW_MAJOR_F32):
    """What every lane of a kernel's grid does, computed as the kernel computes
    it: how often each output column, each scale factor and each byte of the
    packed SF buffer (pad columns included) is written. ``vector``: the *_vec
    kernel, whose input chunks hold ``chunk`` columns (8: bf16, 4: float32);
    with ``swiglu`` and whole segments (of ``tuning.segment_columns``),
    swiglu's *_rows (*_rows768, ...); with
    ``swiglu`` and ``narrow``, *_vec1 (one chunk a lane) or, from
    ``tuning.block_rows_from_bytes`` of codes, *_block_rows (``live``: which
    rows are live, a bool per row; default every other); quantize_fp8 with
    ``sf_layout`` SF_COL_MAJOR_F32 and ``tuning.sf_column_tiles`` (or
    SF_COL_MAJOR_UE8M0 and ``tuning.packed_sf_tiles``), *_tiles."""
    shape = launch_shape(num_rows, hidden, npc, multiprocessors, tuning, swiglu=swiglu,
                         narrow_columns=chunk if narrow else 0, sf_layout=sf_layout)
    blocks_per_row = -(-hidden // npc)
    ld = -(-num_rows // 4) * 4
    written = np.zeros((num_rows, hidden), dtype=np.int64)
    sf_stores = np.zeros((num_rows, blocks_per_row), dtype=np.int64)
    packed_bytes = np.zeros((-(-blocks_per_row // 4), ld, 4), dtype=np.int64)
    blocks, threads = shape.grid(vector)
    width = next((w for w in tuning.segment_columns if hidden % w == 0), 0)
    assert shape.rows == (swiglu and not narrow and width > 0)
    assert shape.segment_columns == (width if shape.rows else SEGMENT_COLUMNS)
    assert shape.narrow == (swiglu and narrow)
    assert (shape.block_rows > 0) == (shape.narrow and hidden % npc == 0
                                      and num_rows * hidden >= tuning.block_rows_from_bytes)
    assert shape.tiles == (((sf_layout == SF_COL_MAJOR_F32 and tuning.sf_column_tiles)
                            or (sf_layout == SF_COL_MAJOR_UE8M0 and tuning.packed_sf_tiles))
                           and not swiglu
                           and hidden % 128 == 0 and hidden % npc == 0)
    if vector and shape.tiles:
        return (shape, *_emulate_tiles(shape, num_rows, hidden, npc, chunk, blocks * threads,
                                       written, sf_stores, packed_bytes))
    if vector and shape.rows:
        return (shape, *_emulate_swiglu_rows(shape, num_rows, hidden, npc, chunk, blocks * threads,
                                             written, sf_stores, packed_bytes))
    if vector and shape.block_rows:
        if live is None:
            live = [r % 2 == 1 for r in range(num_rows)]
        return (shape, *_emulate_block_rows(shape, num_rows, hidden, npc, chunk, live, written,
                                            sf_stores, packed_bytes))
    if vector:
        loads = 1 if shape.narrow else LANE_COLUMNS // chunk
        group_log2 = shape.group_log2 + {8: 2, 4: 3}[chunk]  # + log2(32 / chunk)
        group = 1 << group_log2
        assert group == npc // chunk and group >= loads
        total = num_rows * hidden // chunk
        for warp in range(blocks * threads // 32):
            chunks = [[warp * 32 * loads + 32 * k + lane for lane in range(32)]
                      for k in range(loads)]
            for k in range(loads):
                for lane, g in enumerate(chunks[k]):
                    # a shuffle group: one block, all live or all past the end
                    first = lane - lane % group
                    assert len({c >> group_log2 for c in chunks[k][first:first + group]}) == 1
                    assert len({c < total for c in chunks[k][first:first + group]}) == 1
                    if g >= total:
                        continue
                    written.reshape(-1)[g * chunk:(g + 1) * chunk] += 1
            for lane in range(32):
                j = lane % group
                if j >= loads or chunks[j][lane] >= total:
                    continue
                block = chunks[j][lane] >> group_log2
                row = (block * shape.block_magic) >> shape.block_shift
                assert row == block // blocks_per_row
                _count_sf_store(sf_stores, packed_bytes, row, block - row * blocks_per_row,
                                num_rows, blocks_per_row)
        return shape, written, sf_stores, packed_bytes
    group = 1 << shape.group_log2
    assert group == npc // LANE_COLUMNS
    lanes = np.arange(blocks * threads, dtype=object)
    rows = [(lane * shape.row_magic) >> shape.row_shift for lane in lanes]
    assert rows == [lane // shape.lanes_per_row for lane in lanes]
    for warp in range(len(lanes) // 32):
        warp_rows = rows[32 * warp:32 * warp + 32]
        tasks = [int(lanes[32 * warp + i]) - warp_rows[i] * shape.lanes_per_row
                 for i in range(32)]
        for lane in range(32):
            # a shuffle group (aligned lanes) is one block of one row, or idle
            first = lane - lane % group
            assert len({warp_rows[first + j] for j in range(group)}) == 1
            assert len({tasks[first + j] >> shape.group_log2 for j in range(group)}) == 1
            row, task = warp_rows[lane], tasks[lane]
            if row >= num_rows:
                continue
            col, block = task * LANE_COLUMNS, task >> shape.group_log2
            written[row, col:min(hidden, col + LANE_COLUMNS)] += 1
            if task % group == 0 and block < blocks_per_row:
                _count_sf_store(sf_stores, packed_bytes, row, block, num_rows, blocks_per_row)
    return shape, written, sf_stores, packed_bytes


def _emulate_swiglu_rows(shape, num_rows, hidden, npc, chunk, lanes, written, sf_stores,
                         packed_bytes):
    """swiglu_rows_one_segment of quantize.cu: warp w, segment w, segment s
    being segment s % passes of row s // passes (every segment whole: H a
    multiple of the segment width). A warp past the last row does nothing."""
    loads = shape.segment_columns // (32 * chunk)
    group_log2 = shape.group_log2 + {8: 2, 4: 3}[chunk]
    group = 1 << group_log2
    assert group == npc // chunk and group >= loads
    row_chunks = hidden // chunk
    blocks_per_row = hidden // npc
    assert shape.passes * shape.segment_columns == hidden

    def segment_lanes(row, segment_first):
        for lane in range(32):
            first = segment_first + lane
            for k in range(loads):
                c = first + 32 * k
                # a shuffle group's chunks: all below the row's end or all past it
                base = segment_first + 32 * k + lane - lane % group
                assert len({b < row_chunks for b in range(base, base + group)}) == 1
                if c < row_chunks:
                    written[row, c * chunk:(c + 1) * chunk] += 1
            in_group = lane % group
            sf_chunk = segment_first + 32 * in_group + lane - in_group
            if in_group < loads and sf_chunk < row_chunks:
                _count_sf_store(sf_stores, packed_bytes, row, sf_chunk >> group_log2, num_rows,
                                blocks_per_row)

    warps = lanes // 32
    assert num_rows * shape.passes <= warps  # every segment has a warp
    for segment in range(warps):
        assert segment < 2**31  # the magic number's range
        row = (segment * shape.pass_magic) >> shape.pass_shift
        assert row == segment // shape.passes
        if row >= num_rows:
            continue  # past the end (warp-uniform: shuffles and all)
        segment_lanes(row, (segment - row * shape.passes) * 32 * loads)
    return written, sf_stores, packed_bytes


def _emulate_tiles(shape, num_rows, hidden, npc, chunk, lanes, written, sf_stores,
                   packed_bytes):
    """quantize_tiles_body of quantize.cu: warp w, tile w, column tile w %
    passes of row group w // passes; lane l's chunk l % ROW_LANES of the
    tile's columns, of row l // ROW_LANES + k * ROWS_A_LOAD in load k; lane j
    < LOADS of a group stores load j's scale factor."""
    loads = LANE_COLUMNS // chunk
    row_lanes = TILE_COLUMNS // chunk
    rows_a_load = 32 // row_lanes
    assert loads * rows_a_load == TILE_ROWS
    group_log2 = shape.group_log2 + {8: 2, 4: 3}[chunk]
    group = 1 << group_log2
    assert group == npc // chunk and loads <= group <= row_lanes
    row_chunks, blocks_per_row = hidden // chunk, hidden // npc
    assert shape.passes == hidden // TILE_COLUMNS
    warps = lanes // 32
    assert -(-num_rows // TILE_ROWS) * shape.passes <= warps  # every tile has a warp
    for tile in range(warps):
        row_group = (tile * shape.pass_magic) >> shape.pass_shift
        assert row_group == tile // shape.passes
        if row_group * TILE_ROWS >= num_rows:
            continue  # past the end (warp-uniform)
        column_tile = tile - row_group * shape.passes
        for lane in range(32):
            c = column_tile * row_lanes + lane % row_lanes
            for k in range(loads):
                row = row_group * TILE_ROWS + lane // row_lanes + k * rows_a_load
                # a shuffle group's lanes: one row and one block in every load
                first = lane - lane % group
                assert first // row_lanes == lane // row_lanes
                assert (column_tile * row_lanes + first % row_lanes) >> group_log2 == (
                    c >> group_log2)
                if row < num_rows:
                    written[row, c * chunk:(c + 1) * chunk] += 1
            in_group = lane % group
            if in_group >= loads:
                continue
            first = lane - in_group
            row = row_group * TILE_ROWS + first // row_lanes + in_group * rows_a_load
            if row < num_rows:
                block = (column_tile * row_lanes + first % row_lanes) >> group_log2
                assert block < blocks_per_row and row_chunks % (npc // chunk) == 0
                _count_sf_store(sf_stores, packed_bytes, row, block, num_rows, blocks_per_row)
    return written, sf_stores, packed_bytes


def _emulate_block_rows(shape, num_rows, hidden, npc, chunk, live, written, sf_stores,
                        packed_bytes):
    """swiglu_block_rows_body of quantize.cu: block b, rows [b R, b R + R)
    (the last block's part of them); its padding rows' 16-byte zero stores
    and scale factors by for_rows_columns' walk (one division a thread, then
    steps of the block), each live row's chunks a thread each, warps past
    the row's end skipped."""
    threads, rows_a_block = shape.vec_threads, shape.block_rows
    assert 1 <= rows_a_block <= 32 and threads % 32 == 0 and threads <= 1024
    group_log2 = shape.group_log2 + {8: 2, 4: 3}[chunk]
    group = 1 << group_log2
    assert group == npc // chunk
    row_chunks, row_vecs, blocks_per_row = hidden // chunk, hidden // 16, hidden // npc
    assert threads >= min(row_chunks, 1024)  # a live row in one pass where it can be
    assert shape.vec_blocks * rows_a_block >= num_rows > (shape.vec_blocks - 1) * rows_a_block

    def walk(rows, per_row, visit):  # for_rows_columns, thread by thread
        step_rows, step_columns = threads // per_row, threads % per_row
        for thread in range(threads):
            r, c = divmod(thread, per_row)
            while r < rows:
                visit(r, c)
                r, c = r + step_rows, c + step_columns
                if c >= per_row:
                    r, c = r + 1, c - per_row

    for block in range(shape.vec_blocks):
        row0 = block * rows_a_block
        rows = min(rows_a_block, num_rows - row0)

        def zero_codes(r, v, row0=row0):
            if not live[row0 + r]:
                written[row0 + r, 16 * v:16 * (v + 1)] += 1

        def zero_sf(r, b, row0=row0):
            if not live[row0 + r]:
                _count_sf_store(sf_stores, packed_bytes, row0 + r, b, num_rows, blocks_per_row)

        walk(rows, row_vecs, zero_codes)
        walk(rows, blocks_per_row, zero_sf)
        for r in range(rows):
            if not live[row0 + r]:
                continue
            for warp in range(threads // 32):
                for c0 in range(32 * warp, row_chunks, threads):
                    for lane in range(32):
                        c = c0 + lane
                        # a shuffle group: all in the row or all past it
                        first = c - lane % group
                        assert len({b < row_chunks for b in range(first, first + group)}) == 1
                        if c >= row_chunks:
                            continue
                        written[row0 + r, c * chunk:(c + 1) * chunk] += 1
                        if lane % group == 0:
                            _count_sf_store(sf_stores, packed_bytes, row0 + r, c >> group_log2,
                                            num_rows, blocks_per_row)
    return written, sf_stores, packed_bytes


@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize(("num_rows", "hidden"), [
    (1, 1), (1, 31), (3, 32), (5, 33), (2, 127), (7, 128), (3, 129), (1, 1000), (4, 1024),
    (9, 1025), (2, 7168), (3, 2048), (6, 768), (33, 96), (1, 4097)])
def test_every_column_and_scale_factor_is_written_once(num_rows, hidden, npc):
    shape, written, sf_stores, packed_bytes = emulate_grid(num_rows, hidden, npc)
    assert (written == 1).all()
    assert (sf_stores == 1).all()
    assert (packed_bytes == 1).all()
    assert shape.threads in (DEFAULT_TUNING.small_threads, DEFAULT_TUNING.threads)
    assert shape.blocks >= 1
    assert (shape.vec_blocks > 0) == (hidden % npc == 0)


@pytest.mark.parametrize("swiglu", [False, True], ids=["quantize", "swiglu"])
@pytest.mark.parametrize("chunk", [8, 4], ids=["bf16", "f32"])
@pytest.mark.parametrize(("num_rows", "hidden", "npc"), [
    *[(r, h, npc) for npc in (32, 128) for r, h in (
        (1, 128), (3, 128), (5, 384), (2, 768), (7, 1024), (3, 1152), (1, 7168), (9, 2048),
        (33, 256), (2, 3072), (3, 2176), (4, 1536), (2, 2304))],
    (2, 160, 32), (5, 32, 32), (3, 96, 32), (2, 1056, 32)])  # H % 128 != 0: npc 32 only
@pytest.mark.parametrize("widths", [(1024, 768), (768,), ()],
                         ids=["default-widths", "768-only", "no-rows"])
def test_the_coalesced_kernel_writes_everything_once(num_rows, hidden, npc, chunk, swiglu,
                                                     widths):
    shape, written, sf_stores, packed_bytes = emulate_grid(
        num_rows, hidden, npc, tuning=QuantizeTuning(segment_columns=widths), vector=True,
        chunk=chunk, swiglu=swiglu)
    assert shape.vec_blocks * shape.vec_threads >= num_rows * hidden // LANE_COLUMNS
    assert (written == 1).all()
    assert (sf_stores == 1).all()
    assert (packed_bytes == 1).all()


TILES = QuantizeTuning(sf_column_tiles=True, packed_sf_tiles=False)  # column-major float32 only
PACKED_TILES = QuantizeTuning(packed_sf_tiles=True)


@pytest.mark.parametrize("packed", [False, True], ids=["col-f32", "packed"])
@pytest.mark.parametrize("chunk", [8, 4], ids=["bf16", "f32"])
@pytest.mark.parametrize(("num_rows", "hidden", "npc"), [
    (1, 128, 128), (7, 128, 32), (8, 256, 128), (9, 7168, 128), (13, 2048, 32), (16, 384, 128),
    (17, 1024, 32), (3, 3072, 128)])
def test_tiles_write_everything_once(num_rows, hidden, npc, chunk, packed):
    """quantize_fp8's *_tiles (8 x 128 tiles a warp), partial row groups too;
    column-major float32 or packed UE8M0 scale factors (every byte of the
    packed words, pad columns included, written once)."""
    shape, written, sf_stores, packed_bytes = emulate_grid(
        num_rows, hidden, npc, tuning=PACKED_TILES if packed else TILES, vector=True,
        chunk=chunk, sf_layout=SF_COL_MAJOR_UE8M0 if packed else SF_COL_MAJOR_F32)
    assert shape.tiles and not shape.rows
    assert (written == 1).all()
    assert (sf_stores == 1).all()
    assert (packed_bytes == 1).all()


@pytest.mark.parametrize(("hidden", "npc", "swiglu", "sf", "tuning", "tiles"), [
    (7168, 128, False, "col-f32", TILES, True),
    (7168, 32, False, "col-f32", TILES, True),
    (7168, 128, False, "col-f32", DEFAULT_TUNING, True),   # on by default
    (7168, 128, False, "col-f32", QuantizeTuning(sf_column_tiles=False), False),
    (7168, 128, False, "row-f32", TILES, False),           # row-major SF: *_vec
    (7168, 128, False, "packed", QuantizeTuning(sf_column_tiles=True,
                                                packed_sf_tiles=False), False),  # own switch
    (7168, 128, False, "packed", DEFAULT_TUNING, True),    # on by default
    (7168, 128, False, "packed", QuantizeTuning(packed_sf_tiles=False), False),
    (7168, 128, False, "packed", PACKED_TILES, True),
    (7168, 32, False, "packed", PACKED_TILES, True),
    (7168, 128, False, "col-f32", QuantizeTuning(sf_column_tiles=False), False),
    (2080, 32, False, "col-f32", TILES, False),            # H % 128 != 0
    (2080, 32, False, "packed", PACKED_TILES, False),
    (2048, 128, True, "col-f32", TILES, False),            # swiglu: never
    (2048, 128, True, "packed", PACKED_TILES, False),
])
def test_tiles_only_where_asked_for(hidden, npc, swiglu, sf, tuning, tiles):
    shape = launch_shape(4096, hidden, npc, 132, tuning, swiglu=swiglu,
                         sf_layout=SF_LAYOUT_NAMES[sf])
    assert shape.tiles == tiles
    if tiles:  # a warp a tile: 512 row groups x 56 column tiles
        assert shape.passes == hidden // 128
        assert shape.vec_blocks * shape.vec_threads == 512 * (hidden // 128) * 32


@pytest.mark.parametrize("sf", ["col-f32", "packed"])
def test_tiles_from_rows_keeps_smaller_calls_on_vec(sf):
    """tiles_from_rows: *_tiles from that many rows on, *_vec below (its
    grid: a warp 32 lanes x 32 columns of the [R, H] output)."""
    tuning = QuantizeTuning(tiles_from_rows=1024)
    for num_rows, tiles in ((1, False), (512, False), (1023, False), (1024, True),
                            (4096, True)):
        shape = launch_shape(num_rows, 7168, 128, 132, tuning, sf_layout=SF_LAYOUT_NAMES[sf])
        assert shape.tiles == tiles
        assert shape == launch_shape(num_rows, 7168, 128, 132, QuantizeTuning(
            sf_column_tiles=tiles, packed_sf_tiles=tiles, tiles_from_rows=1024),
            sf_layout=SF_LAYOUT_NAMES[sf])
    assert launch_shape(1, 7168, 128, 132, DEFAULT_TUNING,
                        sf_layout=SF_LAYOUT_NAMES[sf]).tiles  # 0: every call


def test_a_plan_launches_tiles_for_column_major_float32_sf(monkeypatch):
    from cupy_moe.quantize.rules import QuantizeProblem

    gpu, launches = _fake_device(monkeypatch)
    for packed, col_major, kernel in ((False, True, "tiles"), (True, True, "vec"),
                                      (False, False, "vec")):
        problem = QuantizeProblem(num_rows=4096, hidden=7168, in_dtype="bfloat16",
                                  num_per_channels=128, round_sf=packed, packed_ue8m0=packed,
                                  col_major=col_major)
        plan = gpu.QuantizePlan(problem, 0, TILES)
        plan.launch(7, 0x1000, 0x2000, 0x3000, 0, 0, 0, 0)
        assert launches[-1][0] == f"quantize_fp8_bf16_{kernel}"
        assert _packed_fields(gpu, plan)["passes"] == (56 if kernel == "tiles" else 7)
    # packed UE8M0 with packed_sf_tiles: *_tiles too
    problem = QuantizeProblem(num_rows=4096, hidden=7168, in_dtype="bfloat16",
                              num_per_channels=128, round_sf=True, packed_ue8m0=True,
                              col_major=True)
    plan = gpu.QuantizePlan(problem, 0, PACKED_TILES)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0, 0, 0, 0)
    assert launches[-1][0] == "quantize_fp8_bf16_tiles"
    assert _packed_fields(gpu, plan)["sf_layout"] == 2


BLOCK_ROWS = QuantizeTuning(block_rows_from_bytes=0)
FEW_BLOCKS = QuantizeTuning(block_rows_from_bytes=0, block_rows_blocks_per_sm=0.01)


@pytest.mark.parametrize("tuning", [DEFAULT_TUNING, BLOCK_ROWS, FEW_BLOCKS],
                         ids=["vec1", "block_rows", "block_rows-32"])
@pytest.mark.parametrize("chunk", [8, 4], ids=["bf16", "f32"])
@pytest.mark.parametrize(("num_rows", "hidden", "npc"), [
    *[(r, h, npc) for npc in (32, 128) for r, h in (
        (1, 128), (3, 128), (5, 384), (2, 768), (7, 1024), (9, 2048), (33, 256), (3, 2176))],
    (2, 160, 32), (5, 32, 32), (3, 96, 32), (70, 64, 32)])
def test_the_few_live_rows_kernels_write_everything_once(num_rows, hidden, npc, chunk, tuning):
    shape, written, sf_stores, packed_bytes = emulate_grid(
        num_rows, hidden, npc, tuning=tuning, vector=True, chunk=chunk, swiglu=True, narrow=True)
    assert not shape.rows
    if not shape.block_rows:
        assert shape.vec_blocks * shape.vec_threads >= num_rows * hidden // chunk
    assert (written == 1).all()
    assert (sf_stores == 1).all()
    assert (packed_bytes == 1).all()


@pytest.mark.parametrize("live", ["none", "all", "first", "last"])
def test_block_rows_write_everything_once_whatever_rows_are_live(live):
    num_rows = 45  # 32 + 13: a full block and a partial one
    pick = {"none": lambda r: False, "all": lambda r: True, "first": lambda r: r % 32 == 0,
            "last": lambda r: r == num_rows - 1}[live]
    shape, written, sf_stores, packed_bytes = emulate_grid(
        num_rows, 256, 32, tuning=FEW_BLOCKS, vector=True, chunk=8, swiglu=True, narrow=True,
        live=[pick(r) for r in range(num_rows)])
    assert shape.block_rows == 32 and shape.vec_blocks == 2 and shape.vec_threads == 32
    assert (written == 1).all() and (sf_stores == 1).all() and (packed_bytes == 1).all()


def test_block_rows_grid():
    # Kimi-K2 decode plan, X = 1024 rows of I = 2048: 8 rows a block, 128
    # blocks, a thread a 16-byte chunk of a live row (256 of bf16, 512 of f32)
    kimi = launch_shape(1024, 2048, 128, 132, BLOCK_ROWS, swiglu=True, narrow_columns=8)
    assert (kimi.block_rows, kimi.vec_blocks, kimi.vec_threads) == (8, 128, 256)
    assert launch_shape(1024, 2048, 128, 132, BLOCK_ROWS, swiglu=True,
                        narrow_columns=4).vec_threads == 512
    # rows of more than 1024 chunks: a live row in passes of 1024 threads
    assert launch_shape(3, 16384, 128, 132, BLOCK_ROWS, swiglu=True,
                        narrow_columns=8).vec_threads == 1024
    # few rows: a row a block; many: at most 32 a block
    assert launch_shape(9, 2048, 128, 132, BLOCK_ROWS, swiglu=True,
                        narrow_columns=8)[3:4] == (9,)
    huge = launch_shape(10**6, 2048, 128, 132, BLOCK_ROWS, swiglu=True, narrow_columns=8)
    assert huge.block_rows == 32 and huge.vec_blocks == -(-10**6 // 32)
    assert launch_shape(0, 2048, 128, 132, BLOCK_ROWS, swiglu=True,
                        narrow_columns=8).vec_blocks == 0
    # H % npc != 0: no coalesced kernel at all
    assert launch_shape(4, 200, 128, 132, BLOCK_ROWS, swiglu=True,
                        narrow_columns=8).vec_blocks == 0
    # quantize_fp8 never takes it
    assert not launch_shape(9, 2048, 128, 132, BLOCK_ROWS, narrow_columns=8).block_rows


def test_many_rows_with_both_block_sizes():
    # more warps than the small-block threshold: full blocks
    full = DEFAULT_TUNING.threads
    shape, written, sf_stores, _ = emulate_grid(300, 130, 32, multiprocessors=2)
    assert shape.threads == full
    assert (written == 1).all() and (sf_stores == 1).all()
    shape, written, _, _ = emulate_grid(300, 130, 32, multiprocessors=132)
    assert shape.threads == 64 and (written == 1).all()
    shape, written, sf_stores, _ = emulate_grid(400, 256, 32, multiprocessors=2, vector=True)
    assert shape.vec_threads == full and (written == 1).all() and (sf_stores == 1).all()


def test_no_rows_launch_nothing():
    assert launch_shape(0, 7168, 128, 132).blocks == 0


def test_decode_and_prefill_shapes():
    decode = launch_shape(1, 7168, 128, 132)
    assert decode.lanes_per_row == 224 and decode.threads == 64 and decode.blocks == 4
    assert (decode.vec_threads, decode.vec_blocks) == (64, 4)
    full = DEFAULT_TUNING.threads  # 128: a block of 4 warps
    prefill = launch_shape(8192, 7168, 128, 132)
    assert prefill.threads == full and prefill.blocks == 8192 * 224 // full
    assert prefill.vec_blocks == prefill.blocks  # 32 columns a lane either way
    qwen = launch_shape(8192 * 8, 768, 128, 132)  # swiglu rows: T * K, I = 768
    assert qwen.lanes_per_row == 24 and qwen.vec_blocks == 8192 * 8 * 24 // full
    assert launch_shape(5, 200, 128, 132).vec_blocks == 0  # a partial block: *_any only
    # swiglu, I % 512 == 0: *_rows512, a warp a 512-column segment of a row
    kimi = launch_shape(4096 * 8, 2048, 128, 132, swiglu=True)
    assert kimi.rows and kimi.segment_columns == 512 and kimi.passes == 4
    assert kimi.vec_blocks == 4096 * 8 * 4 // (full // 32)
    # ... and a call that zero-fills 16 MiB of padding rows' codes: *_rows,
    # 1024-column segments
    for fill_bytes, width in ((16 << 20, 1024), ((16 << 20) - 1, 512)):
        filling = launch_shape(4096 * 8, 2048, 128, 132, swiglu=True, fill_bytes=fill_bytes)
        assert filling.rows and filling.segment_columns == width
        assert filling.passes == 2048 // width
    decode = launch_shape(1024, 2048, 128, 132, swiglu=True)
    # (4096 warps: at least 2 full blocks an SM, so full blocks)
    assert decode.rows and (decode.vec_threads, decode.vec_blocks) == (full, 4096 * 32 // full)
    # I = 768: *_rows768, a warp a row (768-column segments)
    qwen_swiglu = launch_shape(8192 * 8, 768, 128, 132, swiglu=True)
    assert qwen_swiglu.rows and qwen_swiglu.segment_columns == 768
    assert qwen_swiglu.passes == 1 and qwen_swiglu.vec_blocks == 8192 * 8 // (full // 32)
    assert not launch_shape(9, 2048, 128, 132).rows  # quantize_fp8: never
    # swiglu at decode (few live rows): *_vec1, a lane one 16-byte chunk of
    # bf16, below 1 MiB of codes (DeepSeek-V3 EP8: X = 384, I = 2048) ...
    narrow = launch_shape(384, 2048, 128, 132, swiglu=True, narrow_columns=8)
    assert narrow.narrow and not narrow.rows and not narrow.block_rows
    assert narrow.vec_blocks * narrow.vec_threads == 384 * 2048 // 8
    # ... from 1 MiB, *_block_rows (Kimi-K2: X = 1024, I = 2048)
    kimi = launch_shape(1024, 2048, 128, 132, swiglu=True, narrow_columns=8)
    assert kimi.narrow and (kimi.block_rows, kimi.vec_blocks, kimi.vec_threads) == (8, 128, 256)
    # quantize_fp8 given narrow_columns (few columns an SM): *_vec1, never
    # *_block_rows (even from 1 MiB), never *_tiles, whatever the SF layout
    for layout in (SF_ROW_MAJOR_F32, SF_COL_MAJOR_F32, SF_COL_MAJOR_UE8M0):
        for rows in (9, 1024):
            few = launch_shape(rows, 2048, 128, 132, narrow_columns=8, sf_layout=layout)
            assert few.narrow and not few.block_rows and not few.tiles and not few.rows
            assert few.vec_blocks * few.vec_threads == rows * 2048 // 8


@pytest.mark.parametrize("bad", [3, -1, True, None])
def test_an_unknown_sf_layout_is_refused(bad):
    with pytest.raises(ValueError, match=re.escape(
            f"sf_layout must be one of (0, 1, 2); got {bad!r}")):
        launch_shape(4, 7168, 128, 132, sf_layout=bad)


def test_too_many_warps_for_one_launch():
    with pytest.raises(ValueError, match=re.escape(
            "67108864 rows of 1024 columns are too many for one launch (at most 2147483647 "
            "lanes of 32 columns)")):
        launch_shape(2**26, 1024, 128, 132)  # 2^31 lanes
    launch_shape(2**26 - 8, 1024, 128, 132)
    # *_rows: 2 warps a row of 2048 columns, where *_any has 64 lanes a row: its
    # grid reaches the limit first
    rows1024 = QuantizeTuning(segment_columns=(1024,))
    with pytest.raises(ValueError, match=re.escape(
            "33554432 rows of 2048 columns are too many for one launch (at most 2147483647 "
            "lanes of 32 columns)")):
        launch_shape(2**25, 2048, 128, 132, rows1024, swiglu=True)
    assert launch_shape(2**25 - 8, 2048, 128, 132, rows1024, swiglu=True).rows
    # *_rows512: 4 warps a row, 128 lanes: its own limit, half as many rows
    with pytest.raises(ValueError, match=re.escape(
            "16777216 rows of 2048 columns are too many for one launch (at most 67108863 "
            "warps)")):
        launch_shape(2**24, 2048, 128, 132, swiglu=True)
    assert launch_shape(2**24 - 8, 2048, 128, 132, swiglu=True).rows


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"threads": 48}, "QuantizeTuning.threads must be whole warps in 32 .. 256; got 48"),
    ({"threads": 512}, "QuantizeTuning.threads must be whole warps in 32 .. 256; got 512"),
    ({"small_threads": True}, "QuantizeTuning.small_threads must be whole warps"),
    ({"full_blocks_from": -1}, "QuantizeTuning.full_blocks_from must be a number >= 0"),
    ({"rows_min_blocks": 33}, "QuantizeTuning.rows_min_blocks must be an int in 0 .. 32; got 33"),
    ({"rows_min_blocks": True},
     "QuantizeTuning.rows_min_blocks must be an int in 0 .. 32; got True"),
    ({"segment_columns": (768, 384)},
     "QuantizeTuning.segment_columns must be a tuple of widths in (256, 512, 768, 1024); got "
     "(768, 384)"),
    ({"segment_columns": [1024]},
     "QuantizeTuning.segment_columns must be a tuple of widths in (256, 512, 768, 1024); got "
     "[1024]"),
    ({"segment_columns": (True,)},
     "QuantizeTuning.segment_columns must be a tuple of widths in (256, 512, 768, 1024); got "
     "(True,)"),
    ({"fill_segment_columns": (2048,)},
     "QuantizeTuning.fill_segment_columns must be a tuple of widths in (256, 512, 768, 1024); "
     "got (2048,)"),
    ({"fill_segment_columns": 1024},
     "QuantizeTuning.fill_segment_columns must be a tuple of widths in (256, 512, 768, 1024); "
     "got 1024"),
    ({"fill_segments_from_bytes": -1},
     "QuantizeTuning.fill_segments_from_bytes must be a number >= 0; got -1"),
    ({"fill_segments_from_bytes": float("nan")},
     "QuantizeTuning.fill_segments_from_bytes must be a number >= 0; got nan"),
    ({"fill_segments_from_bytes": True},
     "QuantizeTuning.fill_segments_from_bytes must be a number >= 0; got True"),
    ({"by_slot_from_rows_per_slot": -1},
     "QuantizeTuning.by_slot_from_rows_per_slot must be a number >= 0; got -1"),
    ({"by_slot_from_rows_per_slot": float("nan")},
     "QuantizeTuning.by_slot_from_rows_per_slot must be a number >= 0; got nan"),
    ({"by_slot_from_rows_per_slot": True},
     "QuantizeTuning.by_slot_from_rows_per_slot must be a number >= 0; got True"),
    ({"vec1_columns_per_sm": -1},
     "QuantizeTuning.vec1_columns_per_sm must be a number >= 0; got -1"),
    ({"vec1_columns_per_sm": True},
     "QuantizeTuning.vec1_columns_per_sm must be a number >= 0; got True"),
    ({"narrow_slot_columns_per_sm": -0.5},
     "QuantizeTuning.narrow_slot_columns_per_sm must be a number >= 0; got -0.5"),
    ({"narrow_slot_columns_per_sm": float("nan")},
     "QuantizeTuning.narrow_slot_columns_per_sm must be a number >= 0; got nan"),
    ({"narrow_slot_columns_per_sm": "8192"},
     "QuantizeTuning.narrow_slot_columns_per_sm must be a number >= 0; got '8192'"),
    ({"tiles_from_rows": -1}, "QuantizeTuning.tiles_from_rows must be an int >= 0; got -1"),
    ({"tiles_from_rows": 1.5}, "QuantizeTuning.tiles_from_rows must be an int >= 0; got 1.5"),
    ({"resident_load_hint": 4}, "QuantizeTuning.resident_load_hint must be 0, 1, 2 or 3; got 4"),
    ({"load_hint": -1}, "QuantizeTuning.load_hint must be 0, 1, 2 or 3; got -1"),
    ({"load_hint": True}, "QuantizeTuning.load_hint must be 0, 1, 2 or 3; got True"),
    ({"store_hint": 3}, "QuantizeTuning.store_hint must be 0, 1 or 2; got 3"),
    ({"store_hint": "cs"}, "QuantizeTuning.store_hint must be 0, 1 or 2; got 'cs'"),
])
def test_bad_tunings(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        QuantizeTuning(**kwargs)


@pytest.mark.parametrize(("name", "value", "shown"), [
    ("software_e4m3", 1, "1"), ("sf_column_tiles", "yes", "'yes'"), ("packed_sf_tiles", 0, "0"),
    ("packed_sf_word_stores", None, "None"), ("vec1_packed_pad_words", 1, "1"),
    ("tiles_packed_pad_words", "no", "'no'"), ("packed_sf_pad_words", None, "None")])
def test_bool_tunings_take_only_bools(name, value, shown):
    with pytest.raises(TypeError, match=re.escape(
            f"QuantizeTuning.{name} must be True or False; got {shown}")):
        QuantizeTuning(**{name: value})


def test_tuning_defines():
    assert QuantizeTuning().defines() == (("QUANTIZE_SOFTWARE_E4M3", 0),
                                          ("QUANTIZE_ROWS_MIN_BLOCKS", 0),
                                          ("QUANTIZE_PACKED_WORD_STORES", 0))
    assert QuantizeTuning(software_e4m3=True, rows_min_blocks=5,
                          packed_sf_word_stores=True).defines() == (
        ("QUANTIZE_SOFTWARE_E4M3", 1), ("QUANTIZE_ROWS_MIN_BLOCKS", 5),
        ("QUANTIZE_PACKED_WORD_STORES", 1))
    # vec1_packed_pad_words: a define only when off (the source's default is on)
    assert QuantizeTuning(vec1_packed_pad_words=False).defines() == (
        *QuantizeTuning().defines(), ("QUANTIZE_VEC1_PACKED_PAD_WORDS", 0))
    assert QuantizeTuning(tiles_packed_pad_words=False).defines() == (
        *QuantizeTuning().defines(), ("QUANTIZE_TILES_PACKED_PAD_WORDS", 0))
    assert QuantizeTuning(packed_sf_pad_words=True).defines() == (
        *QuantizeTuning().defines(), ("QUANTIZE_PACKED_SF_PAD_WORDS", 1))
    # the *_rows256 kernels: a define only where either widths name 256
    for widths in ({"segment_columns": (256, 768)}, {"fill_segment_columns": (256,)}):
        assert QuantizeTuning(**widths).defines() == (
            *QuantizeTuning().defines(), ("QUANTIZE_ROWS256", 1))
    assert QuantizeTuning(segment_columns=(512,), fill_segment_columns=(768,)).defines() == (
        QuantizeTuning().defines())
    # the cache hints: .cs takes no define; a call in half the L2 loads by
    # resident_load_hint (.nc by default)
    base = QuantizeTuning().defines()
    assert QuantizeTuning().defines(resident=True) == (*base, ("VECTOR_LOAD_HINT", 3))
    assert QuantizeTuning(resident_load_hint=0).defines(resident=True) == base
    assert QuantizeTuning(load_hint=2, store_hint=1).defines() == (
        *base, ("VECTOR_LOAD_HINT", 2), ("VECTOR_STORE_HINT", 1))


# -- the host side of a launch, without a GPU -------------------------------------------

def _packed_fields(gpu, plan) -> dict:
    """The plan's argument block as the kernel reads it, field by name."""
    return dict(zip(gpu.QUANTIZE_ARGS.names,
                    gpu.QUANTIZE_ARGS.packer.unpack_from(plan.args.buffer), strict=True))


def _swiglu_problem(num_rows: int, hidden: int, num_weights: int):
    """A bf16 swiglu_quantize_fp8 problem (npc 128, float32 column-major scale
    factors) with its routing maps."""
    from cupy_moe.quantize.rules import QuantizeProblem

    return QuantizeProblem(num_rows=num_rows, hidden=hidden, in_dtype="bfloat16",
                           num_per_channels=128, round_sf=False, packed_ue8m0=False,
                           col_major=True, swiglu=True, num_weights=num_weights,
                           has_pos_to_expert=True)


def _fake_device(monkeypatch):
    """gpu.py's device queries and launches replaced: handles are kernel names,
    launches are recorded. (gpu.py imports CuPy's driver bindings: without
    CuPy these tests skip, as the GPU tests do.)"""
    pytest.importorskip("cupy")
    from cupy_moe.quantize import gpu
    from cupy_moe.runtime.launch import DeviceTraits

    monkeypatch.setattr(gpu, "device_traits", lambda device: DeviceTraits(132, 9, 232448))
    monkeypatch.setattr(gpu, "function_handle", lambda source, defines, device, name: name)
    monkeypatch.setattr(gpu, "OnDevice", lambda device: contextlib.nullcontext())
    launches = []
    monkeypatch.setattr(gpu.driver, "launchKernel", lambda *args: launches.append(args))
    return gpu, launches


@pytest.mark.parametrize("swiglu", [False, True])
def test_a_plan_packs_what_the_kernel_reads(monkeypatch, swiglu):
    from cupy_moe.quantize.rules import QuantizeProblem

    gpu, launches = _fake_device(monkeypatch)
    problem = QuantizeProblem(num_rows=9, hidden=7168, in_dtype="bfloat16", num_per_channels=128,
                              round_sf=True, packed_ue8m0=True, col_major=True, swiglu=swiglu,
                              num_weights=24 if swiglu else -1, has_pos_to_expert=swiglu)
    # (narrow_live_rows=0 / vec1_columns_per_sm=0: 9 rows would take
    # *_vec1, the tests below; packed_sf_tiles=False: quantize_fp8's packed
    # SF would take *_tiles, tested above; 1024-column segments: the tests
    # below pick the widths)
    tuning = QuantizeTuning(narrow_live_rows=0, vec1_columns_per_sm=0, packed_sf_tiles=False,
                            segment_columns=(1024,))
    plan = gpu.QuantizePlan(problem, 0, tuning)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000)
    op = "swiglu_quantize_fp8" if swiglu else "quantize_fp8"
    handle, grid_x, grid_y, grid_z, threads, _, _, shared, stream, _, _ = launches[0]
    # swiglu with 7168 = 7 segments of 1024 columns: the row-major kernel
    coalesced = f"{op}_bf16_rows" if swiglu else f"{op}_bf16_vec"
    assert handle == coalesced and (grid_y, grid_z, shared, stream) == (1, 1, 0, 7)
    shape = launch_shape(9, 7168, 128, 132, tuning, swiglu=swiglu)
    assert (grid_x, threads) == (shape.vec_blocks, shape.vec_threads)
    assert shape.passes == 7 and shape.vec_blocks == 32  # 63 warps, 2 a block, either way
    assert shape.rows == swiglu
    fields = _packed_fields(gpu, plan)
    assert fields == {
        "x": 0x1000, "out": 0x2000, "out_sf": 0x3000, "topk_weights": 0x4000,
        "pos_to_token_topk": 0x5000, "pos_to_expert": 0x6000, "slot_to_row": 0x7000,
        "num_rows": 9,
        "num_weights": 24 if swiglu else 0, "row_magic": shape.row_magic,
        "block_magic": shape.block_magic, "hidden": 7168, "sf_blocks": 56, "sf_ld": 12,
        "group_log2": 2, "lanes_per_row": 224, "row_shift": shape.row_shift,
        "block_shift": shape.block_shift, "pass_magic": shape.pass_magic,
        "pass_shift": shape.pass_shift, "passes": 7, "sf_layout": 2, "round_sf": 1,
        "block_rows": 0, "zero_padding": 1}
    # a pointer off 16-byte alignment takes the element-access kernel, its grid
    plan.launch(7, 0x1002, 0x2000, 0x3000, 0, 0, 0, 0)
    assert launches[-1][0] == f"{op}_bf16_any"
    assert launches[-1][1] == shape.blocks and launches[-1][4] == shape.threads
    plan.launch(7, 0x1000, 0x2008, 0x3000, 0, 0, 0, 0)
    assert launches[-1][0] == f"{op}_bf16_any"


@pytest.mark.parametrize(("num_rows", "hidden", "dtype", "swiglu", "resident"), [
    # Qwen3-30B-A3B T = 4096: 16 MiB of bf16 rows, 8 MiB of codes, 256 KiB of
    # scale factors: 24.25 MiB, within half of a 50 MiB L2
    (4096, 2048, "bfloat16", False, True),
    (4096, 2048, "float32", False, False),   # 40.25 MiB of rows and codes
    (4096, 7168, "bfloat16", False, False),  # Kimi-K2 T = 4096: 85 MiB
    (512, 7168, "bfloat16", False, True),
    (2048, 2048, "bfloat16", True, True),    # h [X, 2I]: X * (8 + 2) KiB
    (4096, 2048, "bfloat16", True, False),
])
def test_calls_in_half_the_l2_load_by_the_read_only_path(monkeypatch, num_rows, hidden, dtype,
                                                          swiglu, resident):
    """QuantizeTuning.resident_load_hint (.nc) where the rows read and the
    codes and scale factors written fit in half the L2; evict-first
    elsewhere, and wherever the L2's size is unknown."""
    from cupy_moe.quantize.rules import QuantizeProblem
    from cupy_moe.runtime.launch import DeviceTraits

    gpu, _ = _fake_device(monkeypatch)
    modules = []
    monkeypatch.setattr(gpu, "function_handle",
                        lambda source, defines, device, name: modules.append(dict(defines)))
    problem = QuantizeProblem(num_rows=num_rows, hidden=hidden, in_dtype=dtype,
                              num_per_channels=128, round_sf=False, packed_ue8m0=False,
                              col_major=False, swiglu=swiglu)
    for l2_bytes, expected in ((50 * 2**20, 3 if resident else None), (0, None)):
        monkeypatch.setattr(gpu, "device_traits",
                            lambda device, l2=l2_bytes: DeviceTraits(132, 9, 232448, False, l2))
        plan = gpu.QuantizePlan(problem, 0, DEFAULT_TUNING)
        for x in (0x1000, 0x1002):  # both kernels: aligned, then misaligned rows
            plan.launch(7, x, 0x2000, 0x3000, 0, 0, 0, 0)
        assert {m.get("VECTOR_LOAD_HINT") for m in modules[-2:]} == {expected}


@pytest.mark.parametrize(("num_rows", "num_weights", "dtype", "kernel"), [
    # decode: T * K = 8 live rows at most; 2 MiB of codes: whole rows a block
    (1024, 8, "bfloat16", "block_rows"),
    (1024, 8, "float32", "block_rows"),
    (511, 8, "bfloat16", "vec1"),        # just under 1 MiB of codes
    (512, 8, "bfloat16", "block_rows"),  # 1 MiB
    (9, 1000, "bfloat16", "vec1"),       # X = 9 rows, however many slots
    (1024, 512, "bfloat16", "rows512"),  # 512 live rows, at most
    (1024, -1, "bfloat16", "rows512"),   # no weights: any of the X rows may be live
    (64, -1, "bfloat16", "vec1"),
])
def test_swiglu_takes_one_chunk_a_lane_where_few_rows_are_live(monkeypatch, num_rows,
                                                                num_weights, dtype, kernel):
    from cupy_moe.quantize.rules import QuantizeProblem

    gpu, launches = _fake_device(monkeypatch)
    problem = QuantizeProblem(num_rows=num_rows, hidden=2048, in_dtype=dtype,
                              num_per_channels=128, round_sf=False, packed_ue8m0=False,
                              col_major=True, swiglu=True, num_weights=num_weights,
                              has_pos_to_expert=True)
    plan = gpu.QuantizePlan(problem, 0, DEFAULT_TUNING)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    suffix = "f32" if dtype == "float32" else "bf16"
    assert launches[0][0] == f"swiglu_quantize_fp8_{suffix}_{kernel}"
    chunk = 4 if dtype == "float32" else 8
    if kernel == "vec1":  # a lane a 16-byte chunk: 4x (bf16) or 8x (float32) the warps
        assert launches[0][1] * launches[0][4] == num_rows * 2048 // chunk
    if kernel == "block_rows":  # about a block an SM, a thread a chunk of a live row
        assert launches[0][1] == -(-num_rows // -(-num_rows // 132))
        assert launches[0][4] == 2048 // chunk


@pytest.mark.parametrize(("num_rows", "hidden", "num_weights", "zero_padding", "kernel"), [
    # Kimi-K2 T = 32, E = 384: 23808 rows, 256 slots (186 KiB of codes a slot)
    (23808, 2048, 256, False, "block_rows"),
    (23808, 2048, 256, True, "rows"),       # zeroing every row: the wide kernel
    (16384, 2048, 256, False, "block_rows"),  # exactly 128 KiB a slot
    (16383, 2048, 256, False, "rows512"),  # (no zero fill: 512-column segments)
    # Qwen3 T = 32, E = 128 (43 KiB a slot), a medium plan, no weights
    (14848, 768, 256, False, "rows768"),
    (49152, 2048, 4096, False, "rows512"),
    (23808, 2048, -1, False, "rows512"),
    # few live rows: the decode rule, either way
    (1024, 2048, 8, False, "block_rows"),
    (511, 2048, 8, False, "vec1"),
])
def test_unzeroed_sparse_plans_take_whole_rows_blocks(monkeypatch, num_rows, hidden,
                                                      num_weights, zero_padding, kernel):
    from cupy_moe.quantize.rules import QuantizeProblem

    gpu, launches = _fake_device(monkeypatch)
    problem = QuantizeProblem(num_rows=num_rows, hidden=hidden, in_dtype="bfloat16",
                              num_per_channels=128, round_sf=False, packed_ue8m0=False,
                              col_major=True, swiglu=True, num_weights=num_weights,
                              has_pos_to_expert=True, zero_padding=zero_padding)
    plan = gpu.QuantizePlan(problem, 0, DEFAULT_TUNING)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    assert launches[0][0] == f"swiglu_quantize_fp8_bf16_{kernel}"
    never = QuantizeTuning(unzeroed_block_rows_from_bytes=math.inf)
    if kernel == "block_rows" and num_weights > 64:
        gpu.QuantizePlan(problem, 0, never).launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000,
                                                   0x6000, 0)
        assert launches[-1][0] == "swiglu_quantize_fp8_bf16_rows512"


def test_narrow_tunings_are_checked():
    with pytest.raises(ValueError, match=r"narrow_live_rows must be an int >= 0; got -1"):
        QuantizeTuning(narrow_live_rows=-1)
    for bad in (-1, None, False):
        with pytest.raises(ValueError, match=r"block_rows_from_bytes must be a number >= 0"):
            QuantizeTuning(block_rows_from_bytes=bad)
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(ValueError, match=r"block_rows_blocks_per_sm must be a number > 0"):
            QuantizeTuning(block_rows_blocks_per_sm=bad)
    for bad in (-1, None, True, math.nan):
        with pytest.raises(ValueError,
                           match=r"unzeroed_block_rows_from_bytes must be a number >= 0"):
            QuantizeTuning(unzeroed_block_rows_from_bytes=bad)


def test_block_rows_where_the_tuning_asks(monkeypatch):
    from cupy_moe.quantize.rules import QuantizeProblem

    gpu, launches = _fake_device(monkeypatch)
    problem = QuantizeProblem(num_rows=1024, hidden=2048, in_dtype="bfloat16",
                              num_per_channels=128, round_sf=False, packed_ue8m0=False,
                              col_major=True, swiglu=True, num_weights=8, has_pos_to_expert=True)
    plan = gpu.QuantizePlan(problem, 0, BLOCK_ROWS)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    assert launches[0][0] == "swiglu_quantize_fp8_bf16_block_rows"
    assert (launches[0][1], launches[0][4]) == (128, 256)  # 8 rows a block
    fields = _packed_fields(gpu, plan)
    assert fields["block_rows"] == 8
    # many live rows at most: the wide kernel, its block_rows field 0
    wide = QuantizeProblem(num_rows=1024, hidden=2048, in_dtype="bfloat16", num_per_channels=128,
                           round_sf=False, packed_ue8m0=False, col_major=True, swiglu=True,
                           num_weights=4096, has_pos_to_expert=True)
    plan = gpu.QuantizePlan(wide, 0, BLOCK_ROWS)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    assert launches[-1][0] == "swiglu_quantize_fp8_bf16_rows512"
    assert _packed_fields(gpu, plan)["block_rows"] == 0


@pytest.mark.parametrize(("hidden", "tuning", "kernel", "passes"), [
    (768, DEFAULT_TUNING, "rows768", 1),      # Qwen3: 768-column segments, a warp one
    (1536, DEFAULT_TUNING, "rows512", 3),     # 512 first
    (2048, DEFAULT_TUNING, "rows512", 4),
    (3072, QuantizeTuning(segment_columns=(768, 1024)), "rows768", 4),  # the order given
    (2048, QuantizeTuning(segment_columns=(768,)), "vec", 2),           # no width divides I
    (2048, QuantizeTuning(segment_columns=(256,)), "rows256", 8),
    (1152, DEFAULT_TUNING, "vec", 2),
    (768, QuantizeTuning(segment_columns=()), "vec", 1),
])
def test_segment_width_picks_the_row_major_kernel(monkeypatch, hidden, tuning, kernel, passes):
    gpu, launches = _fake_device(monkeypatch)
    problem = _swiglu_problem(40960, hidden, 40960 - 4096)  # 4096 padding rows, at least
    plan = gpu.QuantizePlan(problem, 0, tuning)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    assert launches[-1][0] == f"swiglu_quantize_fp8_bf16_{kernel}"
    fields = _packed_fields(gpu, plan)
    assert fields["passes"] == passes
    if kernel.startswith("rows"):  # blocks: a warp a segment
        assert launches[-1][1] == -(-32 * 40960 * passes // launches[-1][4])


def test_a_tuned_plan_compiles_and_launches_its_variant(monkeypatch):
    from cupy_moe.quantize.rules import QuantizeProblem

    gpu, launches = _fake_device(monkeypatch)
    compiled = []
    monkeypatch.setattr(gpu, "function_handle",
                        lambda source, defines, device, name: compiled.append(defines) or name)
    problem = QuantizeProblem(num_rows=9, hidden=7168, in_dtype="bfloat16", num_per_channels=128,
                              round_sf=True, packed_ue8m0=True, col_major=True, swiglu=True,
                              num_weights=24, has_pos_to_expert=True)
    tuning = QuantizeTuning(rows_min_blocks=5, narrow_live_rows=0)
    plan = gpu.QuantizePlan(problem, 0, tuning)
    assert compiled == []  # nothing compiled before a launch needs it
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    # the coalesced kernel alone, once: the variant's module, of swiglu's bf16
    # *_rows512 alone (QUANTIZE_KERNELS bit 7)
    variant = (*tuning.defines(), ("QUANTIZE_OPS", 2), ("QUANTIZE_INPUTS", 1))
    assert compiled == [(*variant, ("QUANTIZE_KERNELS", 1 << 7))]
    # misaligned rows: the element-access kernel, a module of its own (bit 2)
    plan.launch(7, 0x1002, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    assert compiled[1:] == [(*variant, ("QUANTIZE_KERNELS", 1 << 2))]
    assert launches[-1][0] == "swiglu_quantize_fp8_bf16_any"
    handle, grid_x, _, _, threads = launches[0][:5]
    # 9 rows x 14 segments of 512 columns = 126 warps, 2 a 64-thread block
    assert handle == "swiglu_quantize_fp8_bf16_rows512" and (grid_x, threads) == (63, 64)


def test_plan_kernels_by_dtype_width_and_layout(monkeypatch):
    from cupy_moe.quantize.rules import QuantizeProblem

    gpu, launches = _fake_device(monkeypatch)
    wide = QuantizeTuning(vec1_columns_per_sm=0)  # no call takes *_vec1
    for (hidden, dtype, layout, col_major, packed), tuning in itertools.product((
            (1000, "float32", 0, False, False), (1024, "uint16", 1, True, False),
            (1024, "float32", 2, True, True)), (DEFAULT_TUNING, wide)):
        problem = QuantizeProblem(5, hidden, dtype, 32, packed, packed, col_major)
        plan = gpu.QuantizePlan(problem, 0, tuning)
        plan.launch(0, 0x1000, 0x2000, 0x3000, 0, 0, 0, 0)
        name = f"quantize_fp8_{'f32' if dtype == 'float32' else 'bf16'}_"
        # 5 rows: *_vec1 by default, whatever the layout; else column-major
        # SF with H % 128 == 0 take *_tiles (the default), row-major *_vec
        assert launches[-1][0] == name + ("any" if hidden % 32 else "vec1" if tuning is not wide
                                          else "tiles" if col_major else "vec")
        fields = _packed_fields(gpu, plan)
        assert fields["sf_layout"] == layout and fields["group_log2"] == 0
        assert fields["sf_ld"] == 8 and fields["sf_blocks"] == -(-hidden // 32)
    # *_vec1 up to vec1_columns_per_sm columns an SM (132 SMs here), *_vec past them
    tuning = QuantizeTuning(vec1_columns_per_sm=64.0)
    for rows, kernel in ((66, "vec1"), (67, "vec")):
        problem = QuantizeProblem(rows, 128, "uint16", 128, False, False, False)
        gpu.QuantizePlan(problem, 0, tuning).launch(0, 0x1000, 0x2000, 0x3000, 0, 0, 0, 0)
        assert launches[-1][0] == f"quantize_fp8_bf16_{kernel}", rows
    problem = QuantizeProblem(0, 100, "float32", 128, False, False, True)
    count = len(launches)
    gpu.QuantizePlan(problem, 0, DEFAULT_TUNING).launch(0, 0x1000, 0x2000, 0x3000, 0, 0, 0, 0)
    assert len(launches) == count  # no rows: nothing launched


@pytest.mark.parametrize(("packed", "col_major", "num_rows"), [
    (False, False, 5), (False, True, 5), (True, True, 5), (False, True, 8), (True, True, 0)])
def test_torch_outputs_are_allocated_in_the_layouts(packed, col_major, num_rows):
    """gpu._allocate_torch, with a CPU tensor standing in for the device one."""
    import torch

    from cupy_moe.quantize import gpu
    from cupy_moe.quantize.rules import QuantizeProblem

    problem = QuantizeProblem(num_rows, 1000, "bfloat16", 128, packed, packed, col_major)
    like = torch.zeros((num_rows, 1000), dtype=torch.bfloat16)
    out, out_sf = gpu._allocate_torch(problem, like, None, None)
    assert out.dtype == torch.float8_e4m3fn and tuple(out.shape) == (num_rows, 1000)
    assert out_sf.dtype == (torch.int32 if packed else torch.float32)
    assert tuple(out_sf.shape) == (num_rows, 2 if packed else 8)
    ld = -(-num_rows // 4) * 4
    if col_major:
        assert out_sf.stride() == (1, ld)
        assert out_sf.untyped_storage().nbytes() == out_sf.shape[1] * ld * 4
    else:
        assert out_sf.is_contiguous()


def test_a_narrow_grid_too_large_for_one_launch_takes_the_wide_one(monkeypatch):
    """8 live rows at most, but X * I / 8 lanes past one launch's 2^31: on
    *_vec1 (a tuning that never takes *_block_rows) the wide grid (X * I /
    32 lanes) still fits, and runs; by default such a call takes
    *_block_rows, whose grid is X / 32 blocks."""
    from cupy_moe.quantize.rules import QuantizeProblem

    gpu, launches = _fake_device(monkeypatch)
    problem = QuantizeProblem(num_rows=2**21, hidden=16384, in_dtype="bfloat16",
                              num_per_channels=128, round_sf=False, packed_ue8m0=False,
                              col_major=True, swiglu=True, num_weights=8, has_pos_to_expert=True)
    vec1 = QuantizeTuning(block_rows_from_bytes=math.inf)
    with pytest.raises(ValueError, match=re.escape(  # the *_vec grid's rule, not *_any's
            "2097152 rows of 16384 columns are too many for one launch (at most 67108863 "
            "warps)")):
        launch_shape(2**21, 16384, 128, 132, vec1, swiglu=True, narrow_columns=8)
    plan = gpu.QuantizePlan(problem, 0, vec1)
    assert not plan.shape.narrow and plan.shape.rows
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    assert launches[0][0] == "swiglu_quantize_fp8_bf16_rows"
    plan = gpu.QuantizePlan(problem, 0, DEFAULT_TUNING)
    assert plan.shape.narrow and plan.shape.block_rows == 32
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0)
    assert launches[-1][0] == "swiglu_quantize_fp8_bf16_block_rows"
    assert (launches[-1][1], launches[-1][4]) == (2**21 // 32, 1024)


# -- token_topk_to_pos: the *_slots kernels -----------------------------------------------

BY_SLOT = QuantizeTuning(by_slot_from_rows_per_slot=0)
BY_SLOT_WIDE = QuantizeTuning(by_slot_from_rows_per_slot=0, narrow_slot_columns_per_sm=0)


def _slot_problem(num_rows: int, hidden: int, num_slots: int, *, zero_padding: bool = False,
                  hint: bool = True, dtype: str = "bfloat16", npc: int = 128):
    from cupy_moe.quantize.rules import QuantizeProblem

    return QuantizeProblem(num_rows=num_rows, hidden=hidden, in_dtype=dtype,
                           num_per_channels=npc, round_sf=False, packed_ue8m0=False,
                           col_major=True, swiglu=True, num_weights=num_slots,
                           has_pos_to_expert=True, zero_padding=zero_padding,
                           has_token_topk_to_pos=hint)


@pytest.mark.parametrize(("num_rows", "hidden", "num_slots", "npc", "tuning", "kernel"), [
    # the wide kernels by I: Qwen3 T = 32 (14848 rows, 256 slots of I = 768),
    # Kimi-K2 and DeepSeek-V3 EP8 T = 32
    (14848, 768, 256, 128, BY_SLOT_WIDE, "rows768_slots"),
    (23808, 2048, 256, 128, BY_SLOT_WIDE, "rows512_slots"),
    (3072, 2048, 256, 128, BY_SLOT_WIDE, "rows512_slots"),
    (3072, 1056, 256, 32, BY_SLOT_WIDE, "vec_slots"),     # no whole segments
    (1024, 2048, 8, 128, BY_SLOT, "vec1_slots"),          # decode: never *_block_rows
    (4096, 16384, 64, 128, BY_SLOT, "vec1_slots"),        # 1 MiB of slots' codes too
    # the default: from 2 rows a slot, *_vec1_slots up to 8192 columns an SM
    # (132 SMs: 528 slots of I = 2048)
    (14848, 768, 256, 128, DEFAULT_TUNING, "vec1_slots"),   # Qwen3 T = 32
    (23808, 2048, 256, 128, DEFAULT_TUNING, "vec1_slots"),  # Kimi-K2 T = 32
    (49152, 2048, 4096, 128, DEFAULT_TUNING, "rows512_slots"),  # Kimi-K2 T = 512
    (16384, 768, 4096, 128, DEFAULT_TUNING, "rows768_slots"),  # Qwen3 T = 512
    (4096, 2048, 4096, 128, DEFAULT_TUNING, "rows512"),   # DeepSeek-V3 EP8 T = 512: 1 a slot
    (8192, 768, 4096, 128, DEFAULT_TUNING, "rows768_slots"),  # 2 rows a slot
    (8191, 768, 4096, 128, DEFAULT_TUNING, "rows768"),
    (2048, 2048, 528, 128, DEFAULT_TUNING, "vec1_slots"),
    (2048, 2048, 529, 128, DEFAULT_TUNING, "rows512_slots"),
    # the threshold: 58 rows a slot
    (14848, 768, 256, 128, QuantizeTuning(by_slot_from_rows_per_slot=58), "vec1_slots"),
    (14848, 768, 256, 128, QuantizeTuning(by_slot_from_rows_per_slot=58.5), "rows768"),
    (14848, 768, 256, 128, QuantizeTuning(by_slot_from_rows_per_slot=math.inf), "rows768"),
    (3072, 100, 256, 32, BY_SLOT, "any"),                 # H % npc != 0: no coalesced kernel
])
def test_the_hint_picks_the_slots_kernels(monkeypatch, num_rows, hidden, num_slots, npc, tuning,
                                          kernel):
    gpu, launches = _fake_device(monkeypatch)
    plan = gpu.QuantizePlan(_slot_problem(num_rows, hidden, num_slots, npc=npc), 0, tuning)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000)
    assert launches[-1][0] == f"swiglu_quantize_fp8_bf16_{kernel}"
    assert plan.by_slot == kernel.endswith("_slots")
    fields = _packed_fields(gpu, plan)
    assert (fields["num_rows"], fields["num_weights"]) == (num_rows, num_slots)
    assert fields["slot_to_row"] == 0x7000 and fields["zero_padding"] == 0
    if plan.by_slot:
        # the coalesced grid over the slots: a warp a segment of a slot's row,
        # or (vec1) a lane a 16-byte chunk, or (vec) a lane 32 columns
        warps = {"rows768_slots": num_slots, "rows_slots": num_slots * hidden // 1024,
                 "rows512_slots": num_slots * hidden // 512,
                 "vec_slots": num_slots * hidden // 1024,
                 "vec1_slots": num_slots * hidden // 256}[kernel]
        assert launches[-1][1] == -(-warps * 32 // launches[-1][4])  # whole blocks
        # misaligned: the element-access kernel over the X rows (the hint unread)
        plan.launch(7, 0x1008, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000)
        rows_shape = launch_shape(num_rows, hidden, npc, 132, swiglu=True)
        assert launches[-1][0] == "swiglu_quantize_fp8_bf16_any"
        assert (launches[-1][1], launches[-1][4]) == (rows_shape.blocks, rows_shape.threads)


@pytest.mark.parametrize("problem_kwargs", [
    {"zero_padding": True},   # padding rows must be zeroed: every row is visited
    {"hint": False},          # no token_topk_to_pos
    {"num_slots": 0},         # T = 0: the rows' kernel zeroes the SF pad columns
], ids=["zero-padding", "no-hint", "no-slots"])
def test_the_slots_kernels_only_where_they_apply(monkeypatch, problem_kwargs):
    gpu, launches = _fake_device(monkeypatch)
    kwargs = {"num_slots": 256, **problem_kwargs}
    plan = gpu.QuantizePlan(_slot_problem(14848, 768, **kwargs), 0, BY_SLOT)
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000)
    assert not plan.by_slot
    assert not launches[-1][0].endswith("_slots")


@pytest.mark.parametrize(("hidden", "npc", "narrow", "widths"), [
    (2048, 128, False, (1024, 768)),   # *_rows_slots
    (768, 32, False, (1024, 768)),     # *_rows768_slots
    (1280, 128, False, (1024, 768)),   # *_vec_slots (no whole segments)
    (2048, 128, False, ()),            # *_vec_slots
    (2048, 32, True, (1024, 768)),     # *_vec1_slots
    (96, 32, True, (1024, 768)),
])
@pytest.mark.parametrize("chunk", [8, 4], ids=["bf16", "f32"])
def test_the_slots_kernels_write_each_named_row_once(hidden, npc, narrow, widths, chunk, rng):
    """The *_slots grids: the coalesced kernel's over T * K work rows (as
    quantize.cu numbers them: slot after slot), each slot's columns and
    scale factors moved to the row token_topk_to_pos names. Every named row
    gets each column and scale factor once; rows no slot names (padding,
    dropped slots, names outside [0, X)) nothing."""
    num_slots, num_rows = 37, 150
    rows = rng.permutation(num_rows)[:num_slots].astype(np.int64)
    rows[rng.random(num_slots) < 0.3] = -1
    rows[[3, 9]] = [num_rows, 2**31 - 1]  # outside [0, X): written nowhere
    tuning = QuantizeTuning(segment_columns=widths, block_rows_from_bytes=float("inf"))
    shape, written, sf_stores, _ = emulate_grid(num_slots, hidden, npc, tuning=tuning,
                                                vector=True, chunk=chunk, swiglu=True,
                                                narrow=narrow)
    assert (written == 1).all() and (sf_stores == 1).all()  # every slot's work, once
    named = (rows >= 0) & (rows < num_rows)
    row_written = np.zeros((num_rows, hidden), np.int64)
    row_sf = np.zeros((num_rows, hidden // npc), np.int64)
    np.add.at(row_written, rows[named], written[named])
    np.add.at(row_sf, rows[named], sf_stores[named])
    live = np.zeros(num_rows, bool)
    live[rows[named]] = True
    assert (row_written[live] == 1).all() and (row_written[~live] == 0).all()
    assert (row_sf[live] == 1).all() and (row_sf[~live] == 0).all()


def test_too_many_slots_for_one_launch_keep_the_rows_grid(monkeypatch):
    """A slot grid past one launch's lanes (here with rows per slot 0.5: the
    tuning allows it) falls back to the rows' kernels, which fit."""
    gpu, launches = _fake_device(monkeypatch)
    tuning = QuantizeTuning(by_slot_from_rows_per_slot=0.5, narrow_live_rows=0,
                            segment_columns=(1024,))
    # 2^22 slots of 2^14 columns: 2^31 lanes of 32 columns, one more than a
    # launch takes; the X = 2^21 rows: 2^30
    plan = gpu.QuantizePlan(_slot_problem(2**21, 2**14, 2**22), 0, tuning)
    assert not plan.by_slot
    plan.launch(7, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000)
    assert launches[-1][0] == "swiglu_quantize_fp8_bf16_rows"


@pytest.mark.parametrize("op", ["quantize_fp8", "swiglu_quantize_fp8"])
def test_a_fast_path_hit_calls_the_launcher_with_its_arguments(monkeypatch, op):
    """A torch fast-path hit hands run_torch_fast exactly its parameters (the
    hint added to SwiGLU's once left quantize_fp8's call one short: a
    TypeError on every second eager torch call)."""
    import inspect

    from cupy_moe.quantize import api, gpu

    signature = inspect.signature(gpu.run_torch_fast)
    calls = []
    monkeypatch.setattr(api, "_run_torch_fast",
                        lambda *args: calls.append(signature.bind(*args)) or ("out", "sf"))
    for path in (api._quantize_fast_path, api._swiglu_fast_path):
        monkeypatch.setattr(path, "lookup", lambda key, arrays: "plan")
    x = np.zeros((2, 256), np.float32)
    assert getattr(api, op)(x) == ("out", "sf")
    assert len(calls) == 1 and calls[0].arguments["plan"] == "plan"
