"""How the quantize kernels are cut into blocks (pure Python: tested without a GPU).

Two kernels per op (kernels_cu/quantize.cu has the details). ``*_vec``
(``H % npc == 0``, aligned arrays): the output's 16-byte input chunks, a
warp taking 32 x 32 columns' worth of them, interleaved across its lanes so
that every access is coalesced, the chunks numbered row after row (a
chunk's row is its block index divided by S: ``block_magic`` /
``block_shift``). swiglu_quantize_fp8 with H a multiple of one of
``QuantizeTuning.segment_columns`` (512, then 768; 1024, then 768 for calls
that zero-fill many padding rows: ``fill_segment_columns``) takes
``*_rows512``, ``*_rows768`` or ``*_rows`` (1024) instead, row-major: the
rows are cut into segments of that many columns, ``passes`` a row (a
segment's row is its index divided by ``passes``: ``pass_magic`` /
``pass_shift``), a warp a segment, reading its row's maps and weight once.
swiglu_quantize_fp8 calls with few live rows (decode) take ``*_vec1``
(``*_vec`` with one 16-byte chunk a lane) or, with many padding rows,
``*_block_rows`` (a block ``block_rows`` whole rows, a live row one chunk a
thread).
``*_any`` (every shape): a lane takes 32 columns of one row, ``npc / 32``
lanes one scale-factor block, a row is ``lanes_per_row = S * npc / 32``
lanes, the grid's lanes row after row (a warp may end one row and start the
next, so no lane idles on narrow rows); a lane's row is its index divided by
``lanes_per_row`` (``row_magic`` / ``row_shift``). The kernels divide by a
multiply-shift, never a division instruction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..runtime.cache_hints import (
    LOAD_HINTS,
    STORE_HINTS,
    hint_defines,
    require_hint_index,
)
from ..runtime.sizes import ceil_div

__all__ = [
    "DEFAULT_TUNING",
    "LANE_COLUMNS",
    "BLOCK_ROWS_MAX_THREADS",
    "MAX_ROWS_A_BLOCK",
    "MAX_THREADS",
    "QuantizeShape",
    "QuantizeTuning",
    "SEGMENT_COLUMNS",
    "SEGMENT_WIDTHS",
    "SF_COL_MAJOR_F32",
    "SF_COL_MAJOR_UE8M0",
    "SF_LAYOUTS",
    "SF_ROW_MAJOR_F32",
    "division_magic",
    "launch_shape",
]

LANE_COLUMNS = 32      # QUANT_LANE_COLS of kernels_cu/quantize.cu
SEGMENT_COLUMNS = 32 * LANE_COLUMNS  # swiglu *_rows: the columns of one segment
# the segment widths of the row-major kernels: *_rows256 and *_rows512 (a
# lane 1 or 2 of *_rows' 4 chunks), *_rows768 (3) and *_rows
SEGMENT_WIDTHS = (256, 512, 768, SEGMENT_COLUMNS)
MAX_THREADS = 256      # QUANT_MAX_THREADS: the kernels' launch bound
BLOCK_ROWS_MAX_THREADS = 1024  # QUANT_BLOCK_ROWS_MAX_THREADS: *_block_rows' launch bound
MAX_ROWS_A_BLOCK = 32  # *_block_rows: a block's rows (one ballot of their maps)
TILE_ROWS, TILE_COLUMNS = 8, 128  # QUANT_TILE_ROWS, QUANT_TILE_COLS: quantize *_tiles' tile
MAX_LANES = 2**31 - 1  # lane indices stay below 2^31: the magic number's range
# the scale-factor layouts, as the kernels' sf_layout field numbers them
SF_ROW_MAJOR_F32, SF_COL_MAJOR_F32, SF_COL_MAJOR_UE8M0 = 0, 1, 2
SF_LAYOUTS = (SF_ROW_MAJOR_F32, SF_COL_MAJOR_F32, SF_COL_MAJOR_UE8M0)


@dataclass(frozen=True)
class QuantizeTuning:
    """Block size policy and compile-time choices of the quantize kernels.

    ``threads`` per block when the grid has at least ``full_blocks_from``
    blocks of that size per SM, else ``small_threads`` (decode: more, smaller
    blocks spread a few rows' warps over more SMs). 128 against 256: SwiGLU
    prefill and medium shapes +0.7 to +3.9 points of the copy bandwidth,
    quantize_fp8 unchanged (benchmarks/NOTES.md, tenth session).
    ``narrow_live_rows``: swiglu_quantize_fp8 calls with at most this many
    live rows (known from the shapes alone: at most T * K where weights are
    given, else X) take ``*_vec1``, one 16-byte chunk a lane (8 bf16 or 4
    float32 columns) instead of 32 columns: at decode a live row's warps are
    the kernel's critical path, and a lane's arithmetic is most of it
    (benchmarks/NOTES.md, twelfth session). 0: never. Of those calls, the
    ones whose codes (X * I bytes) reach ``block_rows_from_bytes`` take
    ``*_block_rows`` instead: a block whole rows (about
    ``block_rows_blocks_per_sm`` blocks an SM, at most ``MAX_ROWS_A_BLOCK``
    rows a block), so that a few hundred blocks, not thousands of warps,
    zero the padding rows. Kimi-K2's decode plan (X = 1024, I = 2048: 2 MiB)
    3.13 -> 2.69 us a call in a graph; with 0.75 MiB (DeepSeek-V3 EP8 and
    Qwen3 decode) *_vec1 stayed ahead by 0.1-0.2 us (benchmarks/NOTES.md,
    thirteenth session). 0: always, ``inf``: never. (Two chunks a lane,
    ``*_vec2``, measured 3.73 against 3.13 us on Kimi-K2's decode plan and
    was removed.)
    ``unzeroed_block_rows_from_bytes``: with ``zero_padding=False`` the
    padding rows cost only their maps' loads, so a sparse plan is the few
    live rows' chain plus the grid's size: calls whose codes per row that
    may be live (X * I / (T * K)) reach this take the few-live-rows grid
    too, whatever their live rows (``*_block_rows`` from
    ``block_rows_from_bytes``). Measured (nineteenth session, us a call in
    a graph, wide -> ``*_block_rows``): Kimi-K2 T = 32, E = 384 (X =
    23808, 186 KiB a row) 10.4 -> 6.7; it lost on Qwen3 T = 32 (X = 14848,
    I = 768: 43 KiB, 4.9 -> 7.7), DeepSeek-V3 EP8 T = 32 (24 KiB, 4.0 ->
    4.3) and the medium plans (2-24 KiB, 5.8-22.6 -> 10.9-38.2). inf:
    never. (``*_block_rows`` with a block's live rows spread over its
    warps, blocks of 256-1024 threads, lost or tied there: removed.)
    ``by_slot_from_rows_per_slot``: swiglu_quantize_fp8 calls given
    ``token_topk_to_pos`` with ``zero_padding=False`` and at least this
    many rows a slot (X / (T * K)) take the ``*_slots`` kernels: the
    coalesced kernel of T * K rows, each slot's work its row's, so padding
    rows cost nothing, not even their maps' loads. Measured (twenty-third
    session, results/swiglu_by_slot_h200.md, us a call in a graph, rows
    visited -> by slot): Qwen3 T = 32 (58 rows a slot) 4.90 -> 2.46,
    DeepSeek-V3 EP8 T = 32 (12) 3.97 -> 2.48, Kimi-K2 T = 32 (93) 6.65 ->
    2.72, T = 512 (12) 22.43 -> 15.01, Qwen3 T = 512 (4) 8.09 -> 6.33; lost
    at one row a slot (DeepSeek-V3 EP8 T = 512: 5.79 -> 6.00). inf: never.
    ``narrow_slot_columns_per_sm``: of those calls, the ones with at most
    this many columns an SM (T * K * I / SMs) take ``*_vec1_slots`` (a lane
    a 16-byte chunk), the rest ``*_rows_slots`` / ``*_rows768_slots`` /
    ``*_vec_slots`` (32 columns a lane): vec1's grid is 4 or 8 times the
    wide one's, a gain while it fits the machine at once. Measured (us a
    call in a graph, wide -> vec1; results/swiglu_by_slot_h200.md): 256
    slots (1,489-3,972 columns an SM) 2.92 -> 2.46, 3.49 -> 2.48, 3.70 ->
    2.72; Kimi-K2 crosses between 7,944 (4.20 -> 3.56) and 15,888 (5.35 ->
    5.52), Qwen3 at about 11,916 (4.28 -> 4.30); 4,096 slots (23,831 and
    63,550) 6.30 -> 7.15, 15.03 -> 16.29. Plans whose slots are mostly
    dropped (DeepSeek-V3 EP8: a dropped slot's warps exit at once) gain
    from vec1 further (T = 128, 15,888: 3.96 -> 3.02), which the host
    cannot see without a sync. 0: never, inf: always.
    ``software_e4m3`` compiles the integer e4m3 rounding on sm_89+ too, in
    place of the hardware conversion (the GPU tests check that both give the
    same codes).
    ``rows_min_blocks`` (0: the compiler's choice) asks the compiler to fit
    that many blocks of the SwiGLU ``*_rows`` kernel (and of ``*_rows512`` /
    ``*_rows256``: none gained there, thirty-seventh session) on an SM: fewer
    registers a thread, more warps in flight (5 gives 46 registers with a
    few spills, against 63: within a point of the default on the GPU in the tenth
    session, 2-2.5 points behind it in the seventeenth; 6 lost 4-14). The
    bf16 ``*_rows768`` kernel has 5 built in (+1.3 to +1.8 on Qwen3 prefill);
    float32's ``*_rows768`` follows this setting. (Two
    segments a warp of ``*_rows``, the second's loads issued before the
    first's arithmetic, lost 11-16 points and were removed: benchmarks/
    NOTES.md, tenth session.)
    ``segment_columns``: the segment widths of the row-major kernels, in the
    order tried: the first that divides I picks the kernel (1024:
    ``*_rows``; 768: ``*_rows768``, a lane 3 of its 4 chunks; 512 / 256:
    ``*_rows512`` / ``*_rows256``, 2 / 1); none: ``*_vec``. 768 at Qwen3's
    I = 768 in place of ``*_vec``: prefill 70.6 -> 81.9% of the copy, 8k
    77.5 -> 86.6, packed 68.0 -> 76.9, medium 41.5 -> 46.7 (45 registers,
    40 warps an SM). 512 in place of 1024 (thirty-seventh session, H100, at
    I = 2048, A/B in one run, twice with the L2 flushed and once in a
    graph; benchmarks/NOTES.md): bf16 ``*_rows512`` takes 40 registers
    against 63, twice the warps with half the chain each; DeepSeek-V3 EP8
    prefill (T = 4096) 77.9 -> 81.9% of the copy, 8k 95.6 -> 97.9, T = 512
    10.3 -> 10.0 µs (zero_padding off 9.5 -> 8.7), Kimi-K2 T = 512 with
    zero_padding off 20.9 -> 18.9, Kimi-K2 prefill within 1%; but the plans
    that zero-fill many padding rows lost (Kimi-K2 T = 32 25.1 -> 27.3,
    T = 512 54.8 -> 56.2: a padding warp's map loads then cover half the
    bytes), hence ``fill_segment_columns``. At I = 1536 / 2560 / 3072 (on
    ``*_rows768`` / ``*_vec`` / ``*_rows`` before) 512 ran 3-9% faster than
    those (at 3072 level with 768). 256 lost 4-20%. (Before the
    unrolled butterflies, 512- and 256-column segments lost 2-10 points.)
    ``fill_segment_columns``: the widths, in the same sense, of swiglu calls
    that zero at least ``fill_segments_from_bytes`` bytes of codes in rows
    known to be padding (zero_padding on, with weights: (X - T * K) * I):
    at I = 2048 the 1024-column ``*_rows`` from 16 MiB (Kimi-K2 T = 32:
    48 MB, T = 512: 92 MB, prefill: 34 MB, within 1% either way; DeepSeek-V3
    EP8 T = 32, 5.8 MB, 9.0 -> 8.5 µs on 512).
    (A warp a whole row, ``*_rows_whole``, with an L2 prefetch of the row
    ahead, was taken in the fourteenth and sixteenth sessions and lost to
    ``*_rows`` once ``*_rows`` had the unrolled butterflies: Kimi-K2 prefill
    85.3 -> 86.5%, DeepSeek-V3 EP8 8k 72.2 -> 76.3, 8k 89.0 -> 88.4; removed.
    The same prefetch in the ``*_vec`` kernels lost 1-9 points.
    benchmarks/NOTES.md, seventeenth session.)
    ``sf_column_tiles``: quantize_fp8 calls with column-major float32 scale
    factors and H % 128 == 0 take ``*_tiles``, a warp an 8-row x 128-column
    tile, so that one store writes a block column's 8 scale factors (one
    32-byte sector) where ``*_vec`` writes 8 columns' (a sector each).
    Measured (eighteenth session, two rounds): Kimi-K2 prefill 83.9 ->
    88.8% of the copy (row-major: 90.3), Qwen3 prefill 55.2 -> 56.7, medium
    shapes level.
    ``packed_sf_tiles``: the same for packed UE8M0 scale factors (a block
    column's 8 rows are one byte each of 8 consecutive words: one 32-byte
    sector a store, where ``*_vec`` stores a row's 8 blocks into 2 words of
    2 sectors). No kernel change (``*_tiles`` stores through the same
    store_scale_factor). Measured (nineteenth session): Kimi-K2 prefill
    with 32-column blocks 84.1 -> 88.2% of the copy (with the word stores
    below 83.6 -> 88.8), 128-column blocks level (87.9 -> 87.3 and 88.3 ->
    87.9; row-major 89.7 in the eighteenth), Qwen3 and the medium shapes
    level. On by default.
    ``packed_sf_word_stores``: packed UE8M0, a row's last block stores its
    byte and the missing blocks' zero bytes in one aligned 2- or 4-byte store
    (QUANTIZE_PACKED_WORD_STORES; since the thirty-sixth session not in
    quantize_fp8's ``*_vec1`` / ``*_tiles`` while ``*_packed_pad_words``
    below are on) instead of a loop of byte stores: in the
    row-major SwiGLU kernels, which are bound by instruction issue, the
    packed path's ~50 SASS instructions a segment (the loop, 64-bit row
    arithmetic) are what Qwen3's packed SF costs (77.7% of the copy against
    81.9 for column-major float32). Measured (nineteenth session): Qwen3
    prefill SwiGLU 77.7 -> 79.9%, quantize_fp8 54.6 -> 56.1, but Kimi-K2
    prefill SwiGLU 87.0 -> 85.2 (no missing bytes there; the binary's
    schedule differs), medium shapes within the spread: a trade, off.
    ``tiles_from_rows``: ``*_tiles`` (either of the two above) only for
    calls of at least this many rows; fewer take ``*_vec``. 0: every call.
    A sweep option (thirty-fourth session): beside TileKernels' per_token_cast
    on the H100, Kimi-K2 column-major at T = 1 and 512 ran 11% behind on
    ``*_tiles`` while row-major (``*_vec``) ran ahead
    (results/quantize_tk_h100.md). Measured (thirty-fifth session, H100,
    8 / 1024 / 8192 rows): decode and T = 512 within +-0.2 µs of the
    default, cold and in a graph; T = 4096 with 8192 lost 6%: 0 stays.
    ``vec1_columns_per_sm``: quantize_fp8 calls with at most this many
    columns an SM (R * H / SMs) take ``*_vec1`` (a lane one 16-byte chunk),
    whatever their scale-factor layout, in place of ``*_vec`` / ``*_tiles``:
    at decode a lane's arithmetic over 32 columns is most of the kernel's
    critical path, as in swiglu's ``narrow_live_rows``. 0: never, inf:
    always. Measured (thirty-fifth session, µs a call in a CUDA graph,
    ``*_vec`` / ``*_tiles`` -> ``*_vec1`` in one run, results/
    quantize_decode_h100.md): Kimi-K2 T = 1 (54 columns an SM) on the H100
    row-major 1.61 -> 1.48, column-major 1.95 -> 1.70, packed 2.05 -> 1.79
    (TileKernels' per_token_cast 1.73 / 1.69 / 1.59; those runs stored row
    R-1's column-major SF in aligned groups, since dropped: ~0.1 more on
    packed); T = 4 and 16 0.07-0.2 faster; on the H200 T = 64 (3,475 an
    SM) column-major and packed lost 0.1 and Qwen3 T = 128 (1,986) 0.07,
    T = 64 (993) level: hence 1024.
    ``vec1_packed_pad_words``: quantize_fp8's ``*_vec1`` with packed UE8M0
    scale factors writes row R-1's pad-column words whole, by each word's
    first block, where every other kernel has each block store its byte of
    each in a loop over rows (QUANTIZE_VEC1_PACKED_PAD_WORDS; False: that
    loop). ``tiles_packed_pad_words``: the same in quantize_fp8's
    ``*_tiles`` (QUANTIZE_TILES_PACKED_PAD_WORDS), whose rows before R-1
    also skip the loop (ncu, Kimi-K2 T = 512: packed ran 1.61 M warp
    instructions against column-major float32's 1.47 M in the same kernel).
    Measured (thirty-sixth session, H100, A/B in one run, µs a call in a
    CUDA graph; benchmarks/results/quantize_decode_h100.md): ``*_vec1``
    Kimi-K2 T = 1 1.84 -> 1.66, Qwen3 T = 4 1.70 -> 1.67, T = 16 / 64 0.04 /
    0.06 faster; ``*_tiles`` Kimi-K2 T = 512 3.7 -> 3.4, Qwen3 T = 4096
    6.0 -> 5.6; with the L2 flushed within 2%, prefill included. Tried there
    and dropped: a word's bytes gathered from the warp's blocks by shuffles
    into one store (the same 0.1 µs at T = 1, 0.04 slower at T = 16 and
    64), and the thirty-fifth session's float32 column-major group stores
    (0.03 slower).
    ``packed_sf_pad_words``: the same in every kernel, through
    ``store_scale_factor`` (SwiGLU's included; QUANTIZE_PACKED_SF_PAD_WORDS,
    before ``packed_sf_word_stores``). A sweep option, off: measured
    (thirty-sixth session, H100, twice cold and twice in a graph) SwiGLU's
    packed prefill and medium plans level (+-0.5%), its column-major ones
    slower (DeepSeek-V3 EP8 8k 28.8 -> 29.4 µs in a graph, EP8 T = 512 6.5
    -> 6.8): the shared store path is inlined into every kernel, whatever
    the call's layout (as the thirty-fifth session's group stores).
    ``resident_load_hint``: the input rows' load hint (vector_access.cuh's
    VECTOR_LOAD_HINT: 0 .cs, 1 plain, 2 .cg, 3 .nc) of calls whose bytes
    (rows read, codes and scale factors written) fit in half the L2
    (runtime.cache_hints.half_l2_holds), where the rows may still be there
    from the kernel that wrote them; ``load_hint`` that of the others and
    ``store_hint`` the codes' stores (0 .cs, 1 plain, 2 .cg). Measured
    (thirty-fourth session, results/quantize_tk_h100.md, H100, µs a call in
    a CUDA graph): quantize_fp8 on Qwen3 prefill (T = 4096, H = 2048:
    25 MB) 8.44 with evict-first loads, 5.12 by the read-only path
    (TileKernels' per_token_cast 5.83-6.00); with the L2 flushed, A/B in
    one run (thirty-fifth session, twice): within the spread of .cs and
    plain loads (11.4-12.0 µs either way).
    """

    threads: int = 128
    small_threads: int = 64
    full_blocks_from: float = 2.0
    software_e4m3: bool = False
    rows_min_blocks: int = 0
    narrow_live_rows: int = 64
    block_rows_from_bytes: float = float(1 << 20)
    block_rows_blocks_per_sm: float = 1.0
    unzeroed_block_rows_from_bytes: float = float(128 << 10)
    by_slot_from_rows_per_slot: float = 2.0
    narrow_slot_columns_per_sm: float = 8192.0
    segment_columns: tuple[int, ...] = (512, 768)
    fill_segment_columns: tuple[int, ...] = (SEGMENT_COLUMNS, 768)
    fill_segments_from_bytes: float = float(16 << 20)
    sf_column_tiles: bool = True
    packed_sf_tiles: bool = True
    packed_sf_word_stores: bool = False
    tiles_from_rows: int = 0
    vec1_columns_per_sm: float = 1024.0
    vec1_packed_pad_words: bool = True
    tiles_packed_pad_words: bool = True
    packed_sf_pad_words: bool = False
    resident_load_hint: int = 3
    load_hint: int = 0
    store_hint: int = 0

    def __post_init__(self) -> None:
        for name in ("threads", "small_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value % 32 or not (
                    32 <= value <= MAX_THREADS):
                raise ValueError(f"QuantizeTuning.{name} must be whole warps in 32 .. "
                                 f"{MAX_THREADS}; got {value!r}")
        if isinstance(self.full_blocks_from, bool) or not isinstance(
                self.full_blocks_from, (int, float)) or self.full_blocks_from < 0:
            raise ValueError(f"QuantizeTuning.full_blocks_from must be a number >= 0; got "
                             f"{self.full_blocks_from!r}")
        if isinstance(self.rows_min_blocks, bool) or not isinstance(
                self.rows_min_blocks, int) or not 0 <= self.rows_min_blocks <= 32:
            raise ValueError(f"QuantizeTuning.rows_min_blocks must be an int in 0 .. 32; got "
                             f"{self.rows_min_blocks!r}")
        for name in ("narrow_live_rows", "tiles_from_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"QuantizeTuning.{name} must be an int >= 0; got {value!r}")
        _require_number("block_rows_from_bytes", self.block_rows_from_bytes)
        _require_number("block_rows_blocks_per_sm", self.block_rows_blocks_per_sm,
                        positive=True)
        _require_number("unzeroed_block_rows_from_bytes", self.unzeroed_block_rows_from_bytes)
        _require_number("by_slot_from_rows_per_slot", self.by_slot_from_rows_per_slot)
        _require_number("narrow_slot_columns_per_sm", self.narrow_slot_columns_per_sm)
        _require_number("vec1_columns_per_sm", self.vec1_columns_per_sm)
        _require_number("fill_segments_from_bytes", self.fill_segments_from_bytes)
        for name in ("segment_columns", "fill_segment_columns"):
            widths = getattr(self, name)
            if not isinstance(widths, tuple) or not all(
                    type(width) is int and width in SEGMENT_WIDTHS for width in widths):
                raise ValueError(f"QuantizeTuning.{name} must be a tuple of widths in "
                                 f"{SEGMENT_WIDTHS}; got {widths!r}")
        for name, hints in (("resident_load_hint", LOAD_HINTS), ("load_hint", LOAD_HINTS),
                            ("store_hint", STORE_HINTS)):
            require_hint_index("QuantizeTuning", name, getattr(self, name), hints)
        for name in ("software_e4m3", "sf_column_tiles", "packed_sf_tiles",
                     "packed_sf_word_stores", "vec1_packed_pad_words",
                     "tiles_packed_pad_words", "packed_sf_pad_words"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"QuantizeTuning.{name} must be True or False; got "
                                f"{getattr(self, name)!r}")

    def defines(self, resident: bool = False) -> tuple[tuple[str, int], ...]:
        """The compile-time part (the kernel source's QUANTIZE_* macros), and
        the cache hints (VECTOR_LOAD_HINT, VECTOR_STORE_HINT) where not .cs:
        ``resident_load_hint`` for a call that fits in half the L2
        (``resident``), else ``load_hint``. The ``*_rows256`` kernels are
        compiled only where the segment widths name 256."""
        load = self.resident_load_hint if resident else self.load_hint
        return (("QUANTIZE_SOFTWARE_E4M3", int(self.software_e4m3)),
                ("QUANTIZE_ROWS_MIN_BLOCKS", int(self.rows_min_blocks)),
                ("QUANTIZE_PACKED_WORD_STORES", int(self.packed_sf_word_stores)),
                *((("QUANTIZE_VEC1_PACKED_PAD_WORDS", 0),) if not self.vec1_packed_pad_words
                  else ()),
                *((("QUANTIZE_TILES_PACKED_PAD_WORDS", 0),) if not self.tiles_packed_pad_words
                  else ()),
                *((("QUANTIZE_PACKED_SF_PAD_WORDS", 1),) if self.packed_sf_pad_words else ()),
                *((("QUANTIZE_ROWS256", 1),)
                  if 256 in self.segment_columns + self.fill_segment_columns else ()),
                *hint_defines(int(load), int(self.store_hint)))


def _require_number(name: str, value: object, *, positive: bool = False) -> None:
    """A QuantizeTuning threshold: an int or float (not a bool), >= 0 (or >
    0), inf allowed, NaN not."""
    bound = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            value > 0 if positive else value >= 0):
        raise ValueError(f"QuantizeTuning.{name} must be a number {bound}; got {value!r}")


DEFAULT_TUNING = QuantizeTuning()


class QuantizeShape(NamedTuple):
    threads: int          # *_any: threads per block
    blocks: int           # *_any: blocks (0: nothing to launch, no rows)
    vec_threads: int      # *_vec: threads per block
    vec_blocks: int       # *_vec: blocks; 0 when H % npc != 0 (or no rows)
    lanes_per_row: int
    group_log2: int       # log2 of the lanes per scale-factor block (*_any)
    row_magic: int        # *_any: row of lane l = (l * row_magic) >> row_shift
    row_shift: int
    block_magic: int      # quantize *_vec: row of block b = (b * block_magic) >> block_shift
    block_shift: int
    rows: bool            # the coalesced kernel is swiglu's *_rows (else *_vec)
    narrow: bool          # ... or *_vec1 (one 16-byte chunk a lane) or swiglu's *_block_rows
    block_rows: int       # *_block_rows: rows a block (0: another kernel)
    passes: int           # *_rows: segments a row (of segment_columns columns); *_tiles: tiles
    pass_magic: int       # *_rows: row of segment s = (s * pass_magic) >> pass_shift
    pass_shift: int
    segment_columns: int = SEGMENT_COLUMNS  # *_rows: a segment's columns (rows only)
    tiles: bool = False   # quantize *_tiles: passes (and its magic) count column tiles

    def grid(self, vector: bool) -> tuple[int, int]:
        """(blocks, threads) of one kernel."""
        return (self.vec_blocks, self.vec_threads) if vector else (self.blocks, self.threads)


def division_magic(divisor: int) -> tuple[int, int]:
    """``(magic, shift)`` with ``(n * magic) >> shift == n // divisor`` for every
    ``0 <= n < 2**31`` (``1 <= divisor < 2**31``); ``magic < 2**32``.

    With ``l = ceil(log2 divisor)`` and ``magic = ceil(2**(31 + l) / divisor)``,
    ``n * magic / 2**(31 + l)`` exceeds ``n / divisor`` by less than
    ``n / 2**(31 + l) < 2**-l <= 1 / divisor``: too little to reach the next
    integer (Granlund and Montgomery's round-up method).
    """
    if not 1 <= divisor < 2**31:
        raise ValueError(f"divisor must be in 1 .. 2**31 - 1; got {divisor}")
    log = (divisor - 1).bit_length()
    return ceil_div(1 << (31 + log), divisor), 31 + log


def launch_shape(num_rows: int, hidden: int, num_per_channels: int, multiprocessors: int,
                 tuning: QuantizeTuning = DEFAULT_TUNING, *,
                 swiglu: bool = False, narrow_columns: int = 0,
                 sf_layout: int = SF_ROW_MAJOR_F32, fill_bytes: int = 0) -> QuantizeShape:
    """The grid of one call: a function of the shapes (and the SM count) only.

    ``swiglu``: where H is whole segments (of the first width of
    ``tuning.segment_columns`` that divides it), the coalesced grid is
    swiglu_quantize_fp8's row-major *_rows one (a warp a segment of a row),
    else *_vec's (a warp 32 x 32 columns of the chunks numbered row after
    row). ``fill_bytes``: the codes the call zero-fills in rows known to be
    padding; from ``tuning.fill_segments_from_bytes`` the widths are
    ``tuning.fill_segment_columns``.
    ``narrow_columns`` (> 0: the columns of a 16-byte chunk of the input
    dtype): the few-rows grid instead, *_vec1's (a lane one chunk) or, for
    swiglu from ``tuning.block_rows_from_bytes`` of codes, *_block_rows'
    (a block ``block_rows`` whole rows, a thread a chunk of a live row: at
    least the row's chunks, whole warps, at most
    ``BLOCK_ROWS_MAX_THREADS``). ``sf_layout`` (one of ``SF_LAYOUTS``):
    quantize_fp8 with column-major float32 scale factors
    (``SF_COL_MAJOR_F32``) and ``tuning.sf_column_tiles``, or packed UE8M0
    (``SF_COL_MAJOR_UE8M0``) and ``tuning.packed_sf_tiles``, where H % 128
    == 0, there are at least ``tuning.tiles_from_rows`` rows and the grid
    is not narrow: *_tiles' grid (a warp an 8 x 128 tile)."""
    if type(sf_layout) is not int or sf_layout not in SF_LAYOUTS:
        raise ValueError(f"sf_layout must be one of {SF_LAYOUTS}; got {sf_layout!r}")
    lanes_per_block = num_per_channels // LANE_COLUMNS
    sf_blocks = ceil_div(hidden, num_per_channels)
    lanes_per_row = sf_blocks * lanes_per_block
    threads, blocks = _grid(ceil_div(num_rows * lanes_per_row, 32), multiprocessors, tuning)
    if blocks * threads > MAX_LANES:
        raise ValueError(f"{num_rows} rows of {hidden} columns are too many for one launch "
                         f"(at most {MAX_LANES} lanes of {LANE_COLUMNS} columns)")
    vec_threads = vec_blocks = block_rows = 0
    narrow = narrow_columns > 0
    # swiglu's row-major kernels: segments of the first width that divides H
    widths = (tuning.fill_segment_columns if fill_bytes >= tuning.fill_segments_from_bytes
              else tuning.segment_columns)
    width = next((columns for columns in widths if hidden % columns == 0),
                 0) if swiglu and not narrow else 0
    rows = width > 0
    passes = max(1, ceil_div(hidden, width or SEGMENT_COLUMNS))
    tiles = (((sf_layout == SF_COL_MAJOR_F32 and tuning.sf_column_tiles)
              or (sf_layout == SF_COL_MAJOR_UE8M0 and tuning.packed_sf_tiles)) and not swiglu
             and hidden % TILE_COLUMNS == 0 and hidden % num_per_channels == 0
             and num_rows >= tuning.tiles_from_rows and not narrow)
    if tiles:
        passes = hidden // TILE_COLUMNS
    if (hidden % num_per_channels == 0 and narrow and swiglu
            and num_rows * hidden >= tuning.block_rows_from_bytes):
        # about block_rows_blocks_per_sm blocks an SM, each its rows whole
        wanted_blocks = max(1, int(tuning.block_rows_blocks_per_sm * multiprocessors))
        block_rows = min(MAX_ROWS_A_BLOCK, max(1, ceil_div(num_rows, wanted_blocks)))
        vec_blocks = ceil_div(num_rows, block_rows)
        vec_threads = min(BLOCK_ROWS_MAX_THREADS,
                          max(32, ceil_div(hidden // narrow_columns, 32) * 32))
    elif hidden % num_per_channels == 0:
        # a warp: 32 lanes x 32 columns of the [R, H] output, row after row,
        # or (*_rows) a segment, or (*_vec1) 32 lanes x narrow_columns
        lane_columns = narrow_columns if narrow else LANE_COLUMNS
        warps = (num_rows * passes if rows
                 else ceil_div(num_rows, TILE_ROWS) * passes if tiles
                 else ceil_div(num_rows * hidden, 32 * lane_columns))
        vec_threads, vec_blocks = _grid(warps, multiprocessors, tuning)
        if vec_blocks * vec_threads > MAX_LANES:
            raise ValueError(f"{num_rows} rows of {hidden} columns are too many for one "
                             f"launch (at most {MAX_LANES // 32} warps)")
    row_magic, row_shift = division_magic(lanes_per_row)
    block_magic, block_shift = division_magic(sf_blocks)
    pass_magic, pass_shift = division_magic(passes)
    return QuantizeShape(threads, blocks, vec_threads, vec_blocks, lanes_per_row,
                         lanes_per_block.bit_length() - 1, row_magic, row_shift, block_magic,
                         block_shift, rows, narrow, block_rows, passes, pass_magic, pass_shift,
                         width or SEGMENT_COLUMNS, tiles)


def _grid(warps: int, multiprocessors: int, tuning: QuantizeTuning) -> tuple[int, int]:
    """(threads, blocks) for ``warps`` warps: small blocks when they are few."""
    threads = tuning.threads
    if warps < tuning.full_blocks_from * multiprocessors * (threads // 32):
        threads = tuning.small_threads
    return threads, ceil_div(warps * 32, threads)
