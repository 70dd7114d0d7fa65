"""``reduce_fused``'s launch shape (pure Python, no GPU): every thread of the
grid maps to at most one (token, vector), every (token, vector) to exactly
one thread, and the shapes the design note promises."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cupy_moe.combine.launch_shape import (
    FEW_LIVE_LOAD_HINT,
    FILL_BLOCKS_PER_SM,
    MAX_GRID_Y,
    PACK_THREADS,
    SPARSE_WIDE_OPTIONS,
    WIDE_OPTIONS,
    CombineShape,
    auto_combine_shape,
    combine_shape,
    fits_half_l2,
    sparse_slots,
    token_rows_options,
)


def covered(shape: CombineShape, num_tokens: int, row_vecs: int) -> np.ndarray:
    """How many threads land on each (token, vector), replaying the kernel's
    index arithmetic over the whole grid."""
    hits = np.zeros((num_tokens, row_vecs), dtype=np.int64)
    thread = np.arange(shape.threads)
    group, lane = thread // shape.row_threads, thread % shape.row_threads
    for bx in range(shape.token_blocks):
        for by in range(shape.chunks):
            t = bx * shape.tokens_per_block + group
            first = by * shape.row_threads * shape.vecs_per_thread + lane
            if_first = first < row_vecs  # the kernel's early return
            for c in range(shape.vecs_per_thread):
                v = first + c * shape.row_threads
                inside = (t < num_tokens) & if_first & (v < row_vecs)
                np.add.at(hits, (t[inside], v[inside]), 1)
    return hits


@pytest.mark.parametrize("seed", range(60))
def test_every_output_vector_has_exactly_one_thread(seed):
    rng = np.random.default_rng(seed)
    num_tokens = int(rng.integers(0, 300))
    row_vecs = int(rng.integers(1, 2000)) if seed % 3 else int(rng.integers(1, 40))
    multiprocessors = int(rng.choice([1, 8, 108, 132]))
    vecs = int(rng.choice([1, 2, 4]))
    shape = combine_shape(num_tokens, row_vecs, multiprocessors,
                          max_warps=int(rng.integers(1, 9)),
                          fill_blocks_per_sm=float(rng.choice([0.0, 1.0, 4.0, 16.0])),
                          vecs_per_thread=vecs)
    assert 1 <= shape.threads <= 256 and shape.vecs_per_thread == vecs
    assert shape.row_threads * shape.tokens_per_block == shape.threads
    assert shape.row_threads < 32 or shape.row_threads % 32 == 0
    # no empty chunk, no empty block of tokens
    assert shape.row_threads * vecs * (shape.chunks - 1) < row_vecs
    assert shape.token_blocks == -(-num_tokens // shape.tokens_per_block)
    assert (covered(shape, num_tokens, row_vecs) == 1).all()


@pytest.mark.parametrize(("num_tokens", "row_vecs", "expected"), [
    # prefill, 7168 bf16 columns in 16-byte vectors: 4 chunks of 7 warps, no idle lane
    (4096, 896, CombineShape(224, 1, 4, 4096)),
    # 2048 bf16 columns: a chunk of 8 warps
    (8192, 256, CombineShape(256, 1, 1, 8192)),
    # decode: a token's row spread over 28 one-warp blocks
    (1, 896, CombineShape(32, 1, 28, 1)),
    (16, 896, CombineShape(32, 1, 28, 16)),
    # short rows are packed, 128 threads a block, unless the tokens are few
    (10_000, 8, CombineShape(8, 16, 1, 625)),
    (4, 8, CombineShape(8, 1, 1, 4)),
    (10_000, 3, CombineShape(4, 16, 1, 625)),
    (5, 1, CombineShape(1, 1, 1, 5)),
    # no tokens: nothing to launch
    (0, 896, CombineShape(32, 1, 28, 0)),
])
def test_shapes_of_the_design_note(num_tokens, row_vecs, expected):
    assert combine_shape(num_tokens, row_vecs, 132) == expected


def test_packed_blocks_have_pack_threads():
    assert combine_shape(10_000, 16, 132).threads == PACK_THREADS


def test_few_tokens_fill_the_chip_with_smaller_chunks():
    wide = combine_shape(4096, 896, 132)
    narrow = combine_shape(8, 896, 132)
    assert narrow.chunks > wide.chunks
    assert narrow.token_blocks * narrow.chunks >= 8 * wide.chunks


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"row_vecs": 0}, "row_vecs must be >= 1; got 0"),
    ({"max_warps": 9}, "max_warps must be in 1 .. 8; got 9"),
    ({"max_warps": 0}, "max_warps must be in 1 .. 8; got 0"),
    ({"row_vecs": (MAX_GRID_Y + 1) * 256},
     (f"expanded rows of {(MAX_GRID_Y + 1) * 256} vectors need {MAX_GRID_Y + 1} column chunks; "
     f"one launch takes at most {MAX_GRID_Y}")),
])
def test_limits(kwargs, message):
    args = {"num_tokens": 10_000, "row_vecs": 100, "multiprocessors": 132, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        combine_shape(**args)


def test_multi_vector_shapes_and_their_kernel_variant():
    # kimi-k2 prefill with 2 vectors a thread: 448 threads' columns = 14 warps,
    # 2 chunks of 7 warps
    shape = combine_shape(4096, 896, 132, vecs_per_thread=2)
    assert shape == CombineShape(224, 1, 2, 4096, 2)
    assert shape.defines() == (("COMBINE_VECS", 2),)
    assert combine_shape(4096, 896, 132).defines() == ()
    with pytest.raises(ValueError, match=r"vecs_per_thread must be one of \(1, 2, 4, 7, 8\); got 3"):
        combine_shape(4096, 896, 132, vecs_per_thread=3)


@pytest.mark.parametrize(("num_tokens", "row_vecs", "wide"), [
    (4096, 896, True),    # Kimi-K2 prefill
    (512, 896, True),     # Kimi-K2 T=512: 2 chunks of 4 warps x 512 tokens
    (4096, 256, True),    # Qwen3 prefill
    (1, 896, False),      # decode: more threads on the few rows
    (32, 256, False),     # Qwen3 small: 32 blocks
    (10_000, 8, False),   # short rows, packed: 157 wide blocks
    (100_000, 8, True),
])
def test_auto_shape_takes_the_wide_variant_for_many_tokens(num_tokens, row_vecs, wide):
    shape = auto_combine_shape(num_tokens, row_vecs, 132)
    expected = combine_shape(num_tokens, row_vecs, 132, **(WIDE_OPTIONS if wide else {}))
    assert shape == expected
    assert shape.vecs_per_thread == (4 if wide else 1)
    if wide:
        assert shape.token_blocks * shape.chunks >= FILL_BLOCKS_PER_SM * 132
    # options given: exactly combine_shape's
    assert auto_combine_shape(num_tokens, row_vecs, 132, max_warps=2) == combine_shape(
        num_tokens, row_vecs, 132, max_warps=2)


def test_slot_batch_variants():
    shape = combine_shape(4096, 896, 132, vecs_per_thread=4, slot_batch=2)
    assert shape.slot_batch == 2
    assert shape.defines() == (("COMBINE_VECS", 4), ("COMBINE_SLOT_BATCH", 2))
    assert combine_shape(4096, 896, 132, slot_batch=8).defines() == ()
    with pytest.raises(ValueError, match=r"slot_batch must be one of \(2, 4, 8, 16\); got 3"):
        combine_shape(4096, 896, 132, slot_batch=3)


def test_the_warp_slots_variant():
    shape = combine_shape(4096, 896, 132, **WIDE_OPTIONS)
    assert shape.warp_slots and shape.grid == combine_shape(
        4096, 896, 132, vecs_per_thread=4, slot_batch=4,
        max_warps=4).grid  # the same launch as without it, another kernel
    assert shape.defines() == (("COMBINE_VECS", 4), ("COMBINE_SLOT_BATCH", 4),
                               ("COMBINE_WARP_SLOTS", 1))
    # a decode shape cut to one-warp chunks keeps it: a warp is still one token's
    assert combine_shape(1, 896, 132, warp_slots=True).row_threads == 32
    assert combine_shape(1, 896, 132, warp_slots=True).warp_slots
    # packed rows (several tokens a warp) keep the per-thread walk
    packed = combine_shape(4096, 8, 132, warp_slots=True)
    assert packed.tokens_per_block > 1 and not packed.warp_slots
    assert ("COMBINE_WARP_SLOTS", 1) not in packed.defines()
    with pytest.raises(TypeError, match=r"warp_slots must be True or False; got 1"):
        combine_shape(4096, 896, 132, warp_slots=1)


def test_warp_tokens_shorten_the_grid():
    one = combine_shape(4099, 896, 132, **WIDE_OPTIONS)
    two = combine_shape(4099, 896, 132, warp_tokens=2, **WIDE_OPTIONS)
    assert (one.token_blocks, two.token_blocks) == (4099, 2050)
    assert two.chunks == one.chunks and two.row_threads == one.row_threads
    assert two.defines()[-1] == ("COMBINE_WARP_TOKENS", 2)
    # few tokens: the rows are cut finer by the warps along the tokens, not the tokens
    decode = combine_shape(8, 896, 132, warp_slots=True, warp_tokens=4)
    assert decode.token_blocks == 2 and decode.chunks == 28
    # packed rows keep one token a group: no warp_tokens either
    packed = combine_shape(4096, 8, 132, warp_slots=True, warp_tokens=4)
    assert (packed.warp_slots, packed.warp_tokens) == (False, 1)
    assert packed.token_blocks == 4096 // packed.tokens_per_block
    with pytest.raises(ValueError, match=r"warp_tokens must be one of \(1, 2, 4\); got 3"):
        combine_shape(4096, 896, 132, warp_slots=True, warp_tokens=3)
    with pytest.raises(ValueError, match=r"warp_tokens needs warp_slots=True"):
        combine_shape(4096, 896, 132, warp_tokens=2)
    with pytest.raises(TypeError, match=r"warp_tokens must be an int; got bool True"):
        combine_shape(4096, 896, 132, warp_slots=True, warp_tokens=True)


def test_stream_rounds_take_rounds_of_32_over_k_tokens():
    # K = 8: a round is 4 tokens, 2 rounds a warp: 8 tokens a block of chunk warps
    shape = combine_shape(4099, 896, 132, vecs_per_thread=1, slot_batch=4, max_warps=4,
                          stream_rounds=2, top_k=8)
    assert (shape.stream_rounds, shape.token_blocks, shape.chunks) == (2, 513, 7)
    assert shape.defines() == (("COMBINE_SLOT_BATCH", 4), ("COMBINE_STREAM_ROUNDS", 2))
    # K = 3: 10 tokens a round (30 of the 32 lanes hold a slot)
    assert combine_shape(100, 896, 132, stream_rounds=1, top_k=3).token_blocks == 10
    # K > 32: one load cannot hold a token's slots; the warp walk instead
    wide = combine_shape(4096, 896, 132, stream_rounds=1, top_k=40)
    assert (wide.stream_rounds, wide.warp_slots, wide.token_blocks) == (0, True, 4096)
    # packed rows: several tokens a warp; the per-thread walk
    packed = combine_shape(4096, 8, 132, stream_rounds=4, top_k=8)
    assert (packed.stream_rounds, packed.warp_slots) == (0, False)
    assert packed.token_blocks == 4096 // packed.tokens_per_block
    with pytest.raises(ValueError, match=r"stream_rounds needs top_k"):
        combine_shape(4096, 896, 132, stream_rounds=1)
    with pytest.raises(ValueError, match=r"stream_rounds must be one of \(0, 1, 2, 4\); got 3"):
        combine_shape(4096, 896, 132, stream_rounds=3, top_k=8)
    with pytest.raises(TypeError, match=r"stream_rounds must be an int; got bool True"):
        combine_shape(4096, 896, 132, stream_rounds=True, top_k=8)


def test_sparse_slots_reads_x_against_the_slots():
    assert sparse_slots(4096, 8, 4096 * 4) and not sparse_slots(4096, 8, 4096 * 4 + 1)
    # an untrimmed plan's X (the worst case) is never sparse
    assert not sparse_slots(4096, 8, 4096 * 8 + 32 * 127)
    # sparse, with K known, on rows token_rows does not fill (5120 bf16 columns,
    # 640 vectors: 5 a thread of 128): the streamed shape where its grid fills
    # (its row loads by the read-only path: RESIDENT_LOAD_HINT)
    assert auto_combine_shape(4096, 640, 132, top_k=8, sparse=True) == combine_shape(
        4096, 640, 132, fill_blocks_per_sm=0, top_k=8, **SPARSE_WIDE_OPTIONS)._replace(
        load_hint="nc")
    # without K the many-token shape, on any row
    for row_vecs in (640, 896):
        assert auto_combine_shape(4096, row_vecs, 132, sparse=True) == combine_shape(
            4096, row_vecs, 132, fill_blocks_per_sm=0, **WIDE_OPTIONS)._replace(load_hint="nc")


def bulk_covered(shape: CombineShape, num_tokens: int, row_vecs: int,
                 top_k: int) -> np.ndarray:
    """How many threads store each (token, vector) under the bulk layout,
    replaying combine.cu's reduce_fused_bulk: block (bx, by) takes
    bulk_rounds groups of row_threads // K tokens from bx's and column chunk
    by; thread i stores vectors chunk_begin + i, + row_threads, ... of each
    of its tokens."""
    hits = np.zeros((num_tokens, row_vecs), dtype=np.int64)
    block_tokens = shape.row_threads // top_k * shape.bulk_rounds
    thread = np.arange(shape.row_threads)
    for bx in range(shape.token_blocks):
        tokens = bx * block_tokens + np.arange(block_tokens)
        tokens = tokens[tokens < num_tokens]
        for by in range(shape.chunks):
            for c in range(shape.vecs_per_thread):
                v = by * shape.row_threads * shape.vecs_per_thread + thread + c * shape.row_threads
                v = v[v < row_vecs]
                np.add.at(hits, (tokens[:, None], v[None, :]), 1)
    return hits


@pytest.mark.parametrize("seed", range(40))
def test_bulk_blocks_store_every_output_vector_once(seed):
    """bulk_stages: whole-warp blocks of row_threads // K tokens (a thread a
    slot), every (token, vector) stored by one thread; where a block's
    threads are fewer than K or rows are packed, the warp walk or the
    per-thread walk instead."""
    rng = np.random.default_rng(seed)
    num_tokens = int(rng.integers(0, 300))
    row_vecs = int(rng.integers(1, 2000)) if seed % 3 else int(rng.integers(1, 70))
    top_k = int(rng.choice([1, 3, 8, 10, 33, 64, 100, 300]))
    vecs, stages = int(rng.choice([1, 2, 4])), int(rng.choice([2, 4, 8]))
    rounds = int(rng.choice([1, 2, 4]))
    shape_mps, shape_warps = int(rng.choice([1, 8, 132])), int(rng.integers(1, 9))
    shape_fill = float(rng.choice([0.0, 1.0, 4.0, 16.0]))
    shape = combine_shape(num_tokens, row_vecs, shape_mps, max_warps=shape_warps,
                          fill_blocks_per_sm=shape_fill, vecs_per_thread=vecs,
                          bulk_stages=stages, bulk_rounds=rounds, top_k=top_k)
    packed = -(-row_vecs // vecs) <= 16
    assert (shape.bulk_stages == 0) == (packed or shape.row_threads < top_k)
    # a launch without bulk copies: the same options' per-thread walk
    assert combine_shape(num_tokens, row_vecs, shape_mps, max_warps=shape_warps,
                         fill_blocks_per_sm=shape_fill, vecs_per_thread=vecs,
                         bulk_stages=stages, bulk_rounds=rounds, top_k=top_k,
                         bulk_ok=False) == combine_shape(
        num_tokens, row_vecs, shape_mps, max_warps=shape_warps, fill_blocks_per_sm=shape_fill,
        vecs_per_thread=vecs, top_k=top_k)
    if not shape.bulk_stages:
        assert shape.warp_slots == (not packed) and shape.bulk_rounds == 1
        return
    assert shape.row_threads % 32 == 0 and shape.tokens_per_block == 1
    assert shape.token_blocks == -(-num_tokens // (shape.row_threads // top_k * rounds))
    assert shape.shared_bytes == stages * shape.row_threads * vecs * 16
    assert ("COMBINE_BULK_STAGES", stages) in shape.defines()
    assert (("COMBINE_BULK_ROUNDS", rounds) in shape.defines()) == (rounds != 1)
    assert (bulk_covered(shape, num_tokens, row_vecs, top_k) == 1).all()


def test_the_bulk_layout_of_the_expert_parallel_prefill():
    # DeepSeek-V3 EP8 prefill: 7168 bf16 columns = 896 vectors, 2 a thread;
    # 448 threads' columns = 14 warps in 4 chunks of 4 warps: 128 threads, 16
    # tokens (K = 8) a block, 4 stages of 4 KiB
    shape = combine_shape(4096, 896, 132, vecs_per_thread=2, max_warps=4, bulk_stages=4,
                          top_k=8)
    assert (shape.row_threads, shape.chunks, shape.token_blocks) == (128, 4, 256)
    assert shape.shared_bytes == 4 * 128 * 2 * 16 and shape.threads == 128
    # at 8k, two groups of 16 tokens a block: half the token blocks
    rounds = combine_shape(8192, 896, 132, vecs_per_thread=2, max_warps=4, bulk_stages=4,
                           bulk_rounds=2, top_k=8)
    assert (rounds.row_threads, rounds.token_blocks, rounds.chunks) == (128, 256, 4)
    # (at 4096 that grid would be short of 4 blocks an SM: rows are cut finer)
    assert combine_shape(4096, 896, 132, vecs_per_thread=2, max_warps=4, bulk_stages=4,
                         bulk_rounds=2, top_k=8).chunks == 5


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"bulk_stages": 4, "top_k": None}, ValueError, "bulk_stages needs top_k"),
    ({"bulk_stages": 3}, ValueError, "bulk_stages must be one of (0, 2, 4, 8); got 3"),
    ({"bulk_stages": True}, TypeError, "bulk_stages must be an int; got bool True"),
    ({"bulk_stages": 2, "warp_slots": True}, ValueError,
     "bulk_stages is a layout of its own: not with warp_slots or stream_rounds"),
    ({"bulk_stages": 2, "stream_rounds": 1}, ValueError,
     "bulk_stages is a layout of its own: not with warp_slots or stream_rounds"),
    ({"bulk_rounds": 2}, ValueError, "bulk_rounds needs bulk_stages"),
    ({"bulk_stages": 2, "bulk_rounds": 3}, ValueError,
     "bulk_rounds must be one of (1, 2, 4); got 3"),
    ({"bulk_stages": 2, "bulk_rounds": True}, TypeError,
     "bulk_rounds must be an int; got bool True"),
])
def test_the_bulk_options_reject(kwargs, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        combine_shape(4096, 896, 132, **{"top_k": 8, **kwargs})


def test_auto_shape_takes_a_bulk_default_only_where_the_launch_allows(monkeypatch):
    """No default has bulk_stages yet; were a sparse candidate to have it, a
    launch without 16-byte accesses on sm_90 (bulk_ok) would take the next
    candidate (the stream) instead of a bulk kernel it cannot run."""
    from cupy_moe.combine import launch_shape

    assert launch_shape.SPARSE_CANDIDATES == (SPARSE_WIDE_OPTIONS,)
    assert not any(options.get("bulk_stages") for options in (WIDE_OPTIONS, SPARSE_WIDE_OPTIONS))
    bulk = {"vecs_per_thread": 2, "max_warps": 4, "bulk_stages": 4}
    monkeypatch.setattr(launch_shape, "SPARSE_CANDIDATES", (bulk, SPARSE_WIDE_OPTIONS))
    # rows token_rows does not fill (640 vectors), where the sparse candidates decide
    assert auto_combine_shape(4096, 640, 132, top_k=8, bulk_ok=True, sparse=True) == \
        combine_shape(4096, 640, 132, fill_blocks_per_sm=0, top_k=8, **bulk)._replace(
            load_hint="nc")
    assert auto_combine_shape(4096, 640, 132, top_k=8, sparse=True) == combine_shape(
        4096, 640, 132, fill_blocks_per_sm=0, top_k=8, **SPARSE_WIDE_OPTIONS)._replace(
        load_hint="nc")


@pytest.mark.parametrize("name", ["max_warps", "vecs_per_thread", "slot_batch", "warp_tokens",
                                  "stream_rounds", "bulk_stages", "bulk_rounds"])
def test_int_options_reject_floats_and_take_numpy_ints(name):
    """Each int option becomes a -D define of the kernel's source: a float
    ("4.0") is a TypeError naming it; a NumPy int is taken as a Python int."""
    value = {"max_warps": 4, "vecs_per_thread": 2, "slot_batch": 4, "warp_tokens": 2,
             "stream_rounds": 1, "bulk_stages": 4, "bulk_rounds": 2}[name]
    others = ({"warp_slots": True} if name == "warp_tokens"
              else {"bulk_stages": 4} if name == "bulk_rounds" else {})
    with pytest.raises(TypeError, match=f"^{name} must be an int; got float {float(value)}$"):
        combine_shape(8192, 896, 132, top_k=8, **others, **{name: float(value)})
    shape = combine_shape(8192, 896, 132, top_k=8, **others, **{name: np.int64(value)})
    assert shape == combine_shape(8192, 896, 132, top_k=8, **others, **{name: value})
    assert all(type(v) is int for _, v in shape.defines())


def test_token_rows_compile_k_and_say_where_rows_are_full():
    # DeepSeek-V3 / Kimi-K2 rows, 896 vectors: 7 a thread over 128 threads, exactly
    shape = combine_shape(4096, 896, 132, vecs_per_thread=7, max_warps=4, top_k=8,
                          token_rows=True)
    assert (shape.row_threads, shape.chunks, shape.token_blocks) == (128, 1, 4096)
    assert shape.defines() == (("COMBINE_VECS", 7), ("COMBINE_TOKEN_ROWS", 8),
                               ("COMBINE_FULL_ROWS", 1))
    # 8 a thread: 112 threads' columns in 4 warps, the last vectors past the row
    shape = combine_shape(4096, 896, 132, vecs_per_thread=8, max_warps=4, top_k=8,
                          token_rows=True)
    assert shape.token_rows == 8 and not shape.full_rows
    assert combine_shape(4096, 896, 132, top_k=8).token_rows == 0


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"token_rows": True}, ValueError, r"token_rows needs top_k in 1 \.\. 32; got None"),
    ({"token_rows": True, "top_k": 33}, ValueError, r"token_rows needs top_k in 1 \.\. 32; got 33"),
    ({"token_rows": True, "top_k": 8, "warp_slots": True}, ValueError,
     "token_rows is a layout of its own"),
    ({"token_rows": 1, "top_k": 8}, TypeError, r"token_rows must be True or False; got 1"),
])
def test_token_rows_rejects(options, error, message):
    with pytest.raises(error, match=message):
        combine_shape(4096, 896, 132, **options)


@pytest.mark.parametrize("row_vecs, vecs, chunks", [
    (896, 7, 1),    # 7168 bf16 columns (DeepSeek-V3, Kimi-K2): TileKernels' layout
    (256, 2, 1),    # 2048 (Qwen3-30B-A3B)
    (512, 4, 1),    # 4096
    (1024, 8, 1),   # 8192: 8 a thread rather than 4 in 2 chunks
    (1792, 7, 2),   # 7168 float32 columns
])
def test_token_rows_options_fill_rows_with_whole_groups(row_vecs, vecs, chunks):
    options = token_rows_options(row_vecs, 8)
    assert options == {"vecs_per_thread": vecs, "max_warps": 4, "token_rows": True}
    shape = combine_shape(4096, row_vecs, 132, top_k=8, **options)
    assert (shape.row_threads, shape.chunks, shape.token_rows, shape.full_rows) == \
        (128, chunks, 8, True)
    assert (covered(shape, 3, row_vecs) == 1).all()


@pytest.mark.parametrize("row_vecs, top_k", [
    (640, 8),    # 5120 columns: 5 vectors a thread is no choice
    (128, 8),    # 1024: one vector a thread, the default shape's
    (896, None),  # K unknown
    (896, 33),   # K above a warp's lanes
    (96, 8),     # fewer vectors than a group's threads
])
def test_token_rows_options_none_where_groups_do_not_fill_rows(row_vecs, top_k):
    assert token_rows_options(row_vecs, top_k) is None


@pytest.mark.parametrize("num_tokens, row_vecs, sparse, expected", [
    (4096, 896, False, {"row_threads": 128, "chunks": 1}),   # Kimi-K2 prefill
    (4096, 896, True, {"row_threads": 128, "chunks": 1}),    # DeepSeek-V3 EP8, trimmed
    (8192, 256, False, {"row_threads": 128, "chunks": 1}),   # Qwen3 prefill 8k
    (512, 896, False, {"row_threads": 64, "chunks": 2}),     # Kimi-K2 T=512: rows cut in 2
    (300, 896, False, {"row_threads": 64, "chunks": 2}),
    (200, 896, False, None),   # 2-warp chunks do not fill the chip: the wide shape
    (150, 896, False, None),   # 1-warp chunks would: too few threads, the default
    (32, 896, False, None),    # small: the default shape, cut finer
    (1, 256, False, None),     # decode
    (4096, 640, False, None),  # rows groups do not fill
])
def test_auto_shape_takes_token_rows_where_groups_fill_rows_and_chip(num_tokens, row_vecs,
                                                                     sparse, expected):
    shape = auto_combine_shape(num_tokens, row_vecs, 132, top_k=8, sparse=sparse)
    if expected is None:
        assert shape.token_rows == 0
        assert shape == auto_combine_shape(num_tokens, row_vecs, 132, sparse=sparse)
        return
    # a sparse plan's loads are all .nc already: no hint of its own for few-live tokens
    assert shape == combine_shape(num_tokens, row_vecs, 132, top_k=8,
                                  **token_rows_options(row_vecs, 8))._replace(
        load_hint="nc" if sparse else "cs", few_live_load_hint="" if sparse else "nc")
    assert (shape.row_threads, shape.chunks, shape.token_rows, shape.full_rows) == \
        (expected["row_threads"], expected["chunks"], 8, True)
    assert shape.token_blocks * shape.chunks >= FILL_BLOCKS_PER_SM * 132


def test_fits_half_l2_counts_the_rows_a_call_can_touch():
    l2 = 50 * 2**20  # the H100's and H200's L2
    # Qwen3-30B-A3B T = 512: 4096 rows of 4 KiB read, 512 written: 18.9 MB
    assert fits_half_l2(512, 8, 4096, 4096, l2)
    # Kimi-K2 T = 512: 66 MB
    assert not fits_half_l2(512, 8, 4096, 14336, l2)
    # a padded plan's X counts only as far as the T * K slots can reach
    assert fits_half_l2(512, 8, 10**6, 4096, l2)
    # exactly half the L2, and one byte over
    assert fits_half_l2(1, 1, 1, l2 // 4, l2)
    assert not fits_half_l2(1, 1, 1, l2 // 4 + 1, l2)
    assert not fits_half_l2(1, 1, 1, 2, 0)  # L2 size unknown


def test_auto_shape_loads_by_the_read_only_path_where_rows_may_be_in_l2():
    """RESIDENT_LOAD_HINT where the call fits in half the L2 or the plan is
    sparse, on whichever shape is chosen; evict-first elsewhere; explicit
    hints or shape options override."""
    for num_tokens, row_vecs in ((512, 256), (32, 896), (4096, 896)):
        plain = auto_combine_shape(num_tokens, row_vecs, 132, top_k=8)
        resident = auto_combine_shape(num_tokens, row_vecs, 132, top_k=8, l2_resident=True)
        assert plain.load_hint == "cs" and resident == plain._replace(
            load_hint="nc", few_live_load_hint="")
        assert ("VECTOR_LOAD_HINT", 3) in resident.defines()
        assert not any(name.startswith("VECTOR_") for name, _ in plain.defines())
    assert auto_combine_shape(512, 256, 132, top_k=8, l2_resident=True,
                              load_hint="cg").load_hint == "cg"
    # shape options given: combine_shape's shape, hints as given
    assert auto_combine_shape(512, 256, 132, top_k=8, l2_resident=True,
                              max_warps=2) == combine_shape(512, 256, 132, top_k=8, max_warps=2)
    assert auto_combine_shape(512, 256, 132, top_k=8, store_hint="plain",
                              max_warps=2).defines()[-1] == ("VECTOR_STORE_HINT", 1)


def test_few_live_tokens_take_their_own_load_hint_on_token_rows_only():
    """FEW_LIVE_LOAD_HINT on the token_rows shape whose own loads are .cs;
    nothing where every token already loads so, nor on other shapes (no
    module of its own for a define that changes nothing)."""
    dense = auto_combine_shape(4096, 896, 132, top_k=8)
    assert dense.token_rows and dense.few_live_load_hint == FEW_LIVE_LOAD_HINT == "nc"
    assert ("COMBINE_FEW_LIVE_LOAD_HINT", 3) in dense.defines()
    assert auto_combine_shape(4096, 896, 132, top_k=8, l2_resident=True).few_live_load_hint == ""
    assert auto_combine_shape(4096, 896, 132, top_k=8,
                              few_live_load_hint="cs").defines() == dense._replace(
        few_live_load_hint="").defines()
    assert not any(name == "COMBINE_FEW_LIVE_LOAD_HINT" for name, _ in dense._replace(
        few_live_load_hint="").defines())
    assert auto_combine_shape(4096, 896, 132, top_k=8,
                              few_live_load_hint="cg").few_live_load_hint == "cg"
    # not token_rows: no define (the decode shape; the sparse stream shape)
    for num_tokens, row_vecs in ((1, 896), (4096, 640)):
        shape = auto_combine_shape(num_tokens, row_vecs, 132, top_k=8, few_live_load_hint="nc")
        assert shape.token_rows == 0 and shape.few_live_load_hint == ""
    # shape options given: only where asked
    rows = auto_combine_shape(4096, 896, 132, top_k=8, **token_rows_options(896, 8))
    assert rows.few_live_load_hint == ""
    assert auto_combine_shape(4096, 896, 132, top_k=8, **token_rows_options(896, 8),
                              few_live_load_hint="nc") == dense


@pytest.mark.parametrize("kwargs, message", [
    ({"few_live_load_hint": "evict_first"},
     "few_live_load_hint must be one of ('cs', 'plain', 'cg', 'nc'); got 'evict_first'"),
    ({"load_hint": "evict_first"},
     "load_hint must be one of ('cs', 'plain', 'cg', 'nc'); got 'evict_first'"),
    ({"store_hint": "nc"}, "store_hint must be one of ('cs', 'plain', 'cg'); got 'nc'"),
    ({"store_hint": True}, "store_hint must be one of ('cs', 'plain', 'cg'); got True"),
])
def test_cache_hints_reject(kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        auto_combine_shape(4096, 896, 132, top_k=8, **kwargs)
