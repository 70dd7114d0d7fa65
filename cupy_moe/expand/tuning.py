"""Tuning of the expand kernels: compile-time sizes and the grid policy.

One frozen object, part of every plan's key: nothing here changes at run
time. The defaults are measured, not derived (benchmarks/NOTES.md has the
sweeps behind each); experiments make their own with
``dataclasses.replace(DEFAULT_TUNING, ...)`` and pass it to
``cupy_moe.expand.api.run_with_tuning``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..runtime.cache_hints import (
    LOAD_HINTS,
    STORE_HINTS,
    hint_defines,
    require_hint_index,
)

__all__ = ["ExpandTuning", "DEFAULT_TUNING"]


@dataclass(frozen=True)
class ExpandTuning:
    """How the expand kernels are compiled and how a call's grid is cut.

    Block counts are in multiples of the GPU's SM count.

    Register kernel (every GPU; decode and small batches, unaligned rows):
    ``threads`` per block, each holding up to ``unroll`` accesses of a row
    chunk (both compiled in). Below ``shrink_chunks_below`` token chunks,
    chunks shrink to one access per thread; below ``split_slots_below``, each
    block takes one slot, so that more SMs share the stores.
    ``zero_rows_registers``: output rows per zero-fill block, at least; more
    where its column chunk is short, so that a block zeroes about
    ``zero_block_bytes_registers`` (blocks of a few KiB run far below memset
    speed).

    Bulk-copy kernel (sm_90+, 16-byte rows): used when rows cut into chunks
    of ``bulk_min_chunk_bytes`` give at least ``bulk_min_blocks`` blocks; a
    row is cut into the fewest equal chunks of at most ``bulk_max_chunk_bytes``
    that give ``bulk_target_blocks`` blocks. Rows of at least
    ``bulk_whole_row_zero_from`` bytes are zero-filled by blocks of
    ``zero_rows_bulk_whole`` whole rows, shorter ones by blocks of
    ``zero_rows_bulk`` rows' column chunk (default 0: whole rows on every
    row length; with bulk stores from a stage, whole rows had won on Kimi-K2's
    14 KiB rows and lost on 6-7 KiB ones, with 16-byte stores,
    ``bulk_zero_rows_plain``, they win on both). A zero-fill block writes its
    rows one after another: few rows keep it from being the launch's longest
    block.

    Padding-heavy plans (real plans at small and medium batches): when at
    least ``padding_share_registers`` of the output rows must be padding (by
    shapes alone: X - T*K of the X rows; the lower of that and
    ``medium_padding_share_registers`` where the routed rows, T*K of them,
    are fewer than ``medium_copy_bytes``:
    expert-parallel plans at medium batches, X = 6144 for T*K = 4096, whose
    shapes do not show that most of their slots are dropped; their register
    kernel tied or beat the seed where the bulk kernel trailed it by 3-6%,
    while prefill plans with the same share, 200-470 MB of routed rows, lost
    5-9% off the bulk kernel; benchmarks/NOTES.md, thirteenth session), the
    register kernel runs whenever
    its chunks need no shrinking (its 256-thread zero-fill blocks beat the
    bulk kernel's one-warp ones), and else the bulk kernel's chunks may be as
    short as ``padding_bulk_min_chunk_bytes`` (more copy blocks for few
    tokens), or ``padding_bulk_least_chunk_bytes`` where that still leaves
    too few blocks for the bulk kernel (Qwen3's 3 KiB fp8 rows at 32
    tokens: 192 blocks of 512 bytes instead of the register kernel, which is
    instruction-bound there; shorter chunks elsewhere only tie). There the
    bulk kernel's zero-fill blocks of whole rows (rows of
    ``bulk_whole_row_zero_from`` bytes, or every row when
    ``padding_zero_whole_rows`` is 1) take ``padding_zero_rows_bulk_whole``
    rows each and store them in bulk stores of a shared stage of
    ``padding_zero_stage_bytes`` at least (at most 16 KiB and the row; 1 KiB
    copy chunks would otherwise make them 1 KiB stores, far below memset
    speed). benchmarks/NOTES.md has the sweep behind these.

    ``bulk_zero_rows_plain`` (0 or 1): the bulk kernel's zero-fill blocks of
    whole rows store zeros with 16-byte stores, the warp's lanes across each
    row, instead of bulk stores from a zeroed stage; the launch then asks for
    only the copy chunk's shared memory (more blocks an SM). With whole rows
    on every row length (``bulk_whole_row_zero_from`` 0) it beat the staged
    and column-chunk zero-fill on the EP8 and fp8 plans by 2-4% and lost
    nowhere by more than the run-to-run spread (benchmarks/NOTES.md, tenth
    session).

    ``zero_kernel_from_bytes``: padding-heavy calls with at least this many
    bytes of padding rows (16-byte rows, sm_90+, T > 0) zero them by a second
    kernel of ``threads``-thread blocks (whole rows, about
    ``zero_block_bytes_registers`` a block) that overlaps the copy kernel
    (programmatic dependent launch); the copy kernel (its ``*_overlapped``
    twin) then has no zero-fill blocks. Only beside the bulk kernel's copies
    unless ``zero_kernel_beside_registers`` is 1: where the register kernel
    copies (medium batches), its own zero-fill blocks did as well or better.
    64 MB: the small-batch plans of 90-340 MB of padding gained 2-4% (Kimi-K2,
    Qwen3, Kimi-K2 fp8), the 19-47 MB ones (EP8, Qwen3 fp8) lost. Since
    ``padding_whole_chunks_from`` those small batches keep whole register
    chunks, so by default the zero kernel comes only with fewer token
    chunks (decode-sized batches over 64 MB of padding rows).

    ``padding_whole_chunks_from``: padding-heavy calls whose tokens make at
    least this many register-kernel chunks (T x chunks, whole chunks) keep
    them whole, all K slots a block, where chunks would shrink (small
    batches): one launch of token blocks and zero-fill blocks instead of the
    bulk kernel's copies (and beside them, from ``zero_kernel_from_bytes``,
    the zero kernel). inf: never. Measured on the H100 beside the seed's
    kernel (forty-eighth session, results/expand_seed_whole_chunks_h100.md,
    the bench's timing; inf as a variant): Qwen3 small e128 31.8 -> 30.8 us
    (seed 30.3), e256 / e384 2% faster, Kimi-K2 small and its fp8 plans
    level to 6% faster (packed SF e256 52.1 -> 49.1), the EP8 small plans
    within +-3%. With the host's time hidden (the GPU spinning first) the
    Qwen3 gain is 0.6%: most of it is the launch saved. Decode (T = 1: one
    token block would store all K rows) lost 10% on Kimi-K2 with whole
    chunks, hence 16: the small batches' 32 token chunks, not decode's 1.

    ``compiled_row`` (0, 1 or 2): the register kernel is compiled for the
    call's row, its bytes and accesses a thread (EXPAND_ROW_BYTES,
    EXPAND_VECS_PER_THREAD: a module per row length), so that its unrolled
    access loops lose their dead iterations: on 3 KiB rows a thread holds one
    access of four (ncu had the kernel instruction-bound on Qwen3's fp8
    plans, the seed's kernel, compiled per shape, at 16% SM throughput
    against our 66%). Measured (twenty-fourth session,
    results/sweep_compiled_row_h200.md, % of the copy): Qwen3 fp8 medium
    73.0 -> 75.2 (row-major SF), 75.1 -> 76.4 (packed), but its bf16 medium
    plans (6 KiB rows) 0.5-0.9 points down and decode 3.04 -> 3.16 us. 2:
    only where each thread of a chunk holds one access (a chunk of at most
    ``threads`` vectors: the rows that gained), not yet measured as a rule;
    0 until it is.

    ``zero_fill_runs`` (0, 1 or 2): the register kernel's zero-fill blocks,
    where a row is one chunk (one y plane), zero each run of consecutive
    rows that need it as one flat byte range (and its row-major scale
    factors as one range of words), all the block's threads together,
    instead of row by row, each row's stores on the threads of its chunk
    (a quarter of a 256-thread block idle on 3 KiB rows; the SF words of a
    row on 24 threads, row after row). Measured on an H100 (twenty-ninth
    session, results/sweep_zero_runs_h100.md, % of the copy, 0 -> 1): Qwen3
    fp8 medium row-major SF 89.2 -> 92.1, Kimi-K2 medium EP8 97.7 -> 98.6,
    the other plans within a point (Qwen3 bf16 medium EP8 89.2 -> 88.5,
    packed SF 91.2 -> 90.7, decode 3.37 -> 3.40 us); on the H200
    (results/sweep_zero_runs_h200.md) 74.2 -> 76.8-77.1 on that plan, the
    EP8 medium plans 0.7-0.9 down, the rest level. So 1. 2: the same with
    each run's store loop unrolled by 4 (row by row, a row's stores come in
    unrolled bursts: the EP8 loss?); not yet measured.

    ``register_min_blocks``: the register kernels are compiled to fit this
    many blocks an SM (``__launch_bounds__``' second argument: registers
    capped at 65,536 / (threads x this)); 0: no bound but the block size.
    Without SF the 256-thread kernel takes 37 registers: 6 blocks an SM, not
    8. Measured with 8 on the H200 (twenty-ninth session,
    results/sweep_zero_runs_h200.md): level within the rounds' spread on ten
    plans (Qwen3 EP8 medium +0.9, packed SF -0.9). So 0.

    ``sf_by_position`` (0 or 1): column-major scale factors (16-byte rows,
    sm_90+, T > 0) are written by pass blocks that walk positions, a thread a
    row, so that stores fill whole 32-byte sectors (the copy kernel's first
    blocks): the zeros (padding rows, pad columns; where X > T*K), and every
    scale factor when the call passes ``pos_to_token``. Beside the zero kernel
    only with ``sf_pass_beside_zero_kernel`` (0 or 1), as the zero kernel's
    last blocks (pass blocks in the copy kernel delay its start: it starts
    once every copy block has). The token-major blocks' SF
    stores are 4 bytes each, ``align(X, 4) * 4`` bytes apart. Packed-SF
    plans, % of the copy (benchmarks/NOTES.md, twentieth session): Kimi-K2
    medium 88.9 -> 98.9 (99.9 given pos_to_token), prefill 85.2 -> 87.2
    (92.0), medium EP8 67.6 -> 75.5, Qwen3 small 68.5 -> 71.8, medium 67.7
    -> 76.3 (77.0); decode 3.83 -> 3.46 us. Kimi-K2 small (145 MB of
    padding: the zero kernel's plans) lost 1-3 points with the pass blocks
    in the copy kernel and gained with them in the zero kernel: packed 86.0
    -> 90.0 (90.2 given pos_to_token), float32 row-major 93.3 -> 93.2;
    every plan without the zero kernel or column-major SF level within the
    rounds' spread (benchmarks/NOTES.md, twenty-fourth session). So
    ``sf_pass_beside_zero_kernel`` 1 (0: those calls' SF by the token and
    zero-fill blocks).

    ``gather_x_bytes_below``: calls that pass ``pos_to_token`` (16-byte rows
    and bases) whose ``x`` holds fewer bytes than this write the output by
    position instead (expand.cu's ``expand_to_fused_gather``): blocks of
    ``gather_rows`` consecutive output rows (1 .. ``threads``), a warp a row,
    each row its token's row of ``x`` (read through L2, so ``x`` should fit
    there: it is read K times) or zeros; column-major scale factors by the SF
    pass. Every block does the same work, where the token-major kernels pair
    token blocks with zero-fill blocks (instruction-bound on Qwen3's 3 KiB
    fp8 rows, 0.91-0.93 of the seed's kernel). 0: never. Measured on the
    H200 (twenty-fourth session, results/sweep_gather_h200.md, % of the
    copy, default -> 8 rows a block): it lost on the small and medium plans
    (Qwen3 small 86.3 -> 84.7, medium 90.4 -> 83.5, EP8 medium 70.5 -> 64.2;
    Kimi-K2 decode 43.3 -> 40.0, medium EP8 87.8 -> 75.8), level on
    prefill, and on every call 20-30 points down on prefill (x read K times
    past L2); ahead only on the packed-SF plans, where the SF pass given
    ``pos_to_token`` gains as much without it. Off; more rows a block lost
    more.

    ``rows_kernel_tokens_below``: calls without scale factors (16-byte rows
    of at most 16 KiB and bases, ``zero_padding`` either way) with
    ``1 <= T < this`` tokens take expand.cu's lean rows kernel, the seed's
    algorithm without the register kernel's generality: token blocks of
    whole rows, then a block of ``rows_kernel_threads`` a padding row. A
    token block takes all K slots, or one where ``T <
    rows_kernel_slot_blocks_below`` (decode: K blocks store the K rows at
    once). 0: never (the default). Measured on the H100 (forty-ninth
    session, results/expand_rows_kernel_h100.md, seed / ours, T < 1024 at
    128 threads against the default): in a CUDA graph it lifts the plans
    that trail the seed (Qwen3 EP8 small 0.94 -> 0.97, medium 0.88 -> 0.97,
    Kimi-K2 medium EP8 0.97 -> 1.06, decode plans 1.03-1.21 -> 1.15-1.24)
    and costs some that lead (Qwen3 medium EP8 e48 1.03 -> 0.97, Kimi-K2
    small EP8 1.02 -> 0.98); but on tightly packed calls of the same shapes
    (X = T*K, every slot routed) it loses 5-65% (Kimi-K2 T = 512 93.4 ->
    84.9% of the copy, T = 32 2.64 -> 4.39 µs), and shapes alone cannot tell
    those from expert-parallel plans whose slots are mostly dropped. So off.
    ``rows_kernel_slot_group``: from ``rows_kernel_slot_blocks_below`` tokens
    on, a token block takes this many slots (the last group of a token may
    be shorter); 0: all K. More token blocks for tightly packed calls, where
    a block of all K slots stores K rows in turn. Measured on the H100
    (fiftieth session, results/expand_rows_groups_h100.md, 128 threads) it
    does not rescue them: 4 slots bring Kimi-K2 T = 512 back to the default
    (92.2 against 91.8% of the copy; all K: 83.9) but Kimi-K2 T = 32 stays
    behind (3.37 against 2.45 µs) and Qwen3 T = 512 too (72.3 against 76.1),
    while the EP8 plans' gain shrinks (Qwen3 medium e32 EP8 in a graph, seed
    / ours: 0.97 with all K, 0.92 with 4, 0.88 with 2).
    ``rows_kernel_threads``: threads a block (whole warps, 32 .. 1024); 256
    by default, as the GPU tests ran it, though 128 measured 1-5% faster on
    the EP8 plans (the figures above).
    ``rows_kernel_fitted_unroll``: 1 (the default): the rows kernel is
    compiled for the call's row, a thread holding ceil(row vectors /
    rows_kernel_threads) vectors (a module per such count); 0: one module for
    every row, a thread holding room for 16 KiB rows (1,024 vectors). ptxas
    (sm_90): the by-position kernel at 128 threads takes 48 registers with
    room for 16 KiB and 32 for Qwen3's 6 KiB rows (3 vectors a thread), 24
    at 256 threads (30 with room for 16 KiB).
    ``rows_by_position_narrow_threads``, ``rows_by_position_narrow_row_bytes``:
    by position, rows of at most the second (8 KiB) without scale factors
    (the plain op: Qwen3's 6 KiB bf16 rows, 6 vectors a thread) take blocks
    of the first (64 threads); longer rows, calls with scale factors and
    token blocks take ``rows_kernel_threads``. 0 threads: every block
    ``rows_kernel_threads``. Measured on the H100 (fifty-fifth session,
    results/expand_split_by_count_h100.md; seed / ours in a CUDA graph, the
    default swapped between runs): Qwen3 small EP8 plans 0.97-0.98 -> 0.99-1.01
    (6.2 -> 6.0-6.1 µs), Qwen3 T = 32 given pos_to_token 1.97 -> 1.90 µs,
    the medium plans and calls level; Kimi-K2's fp8 rows with row-major
    scale factors (7 KiB) lost at 64 threads (decode 1.49 -> 1.65 µs, T =
    512 10.45 -> 10.91), hence no scale factors; Kimi-K2's 14 KiB bf16 rows
    lost in the probe (decode 1.88 against 1.60 µs), hence the row bound.
    ``long_rows_tokens_from``, ``long_rows_tokens_below``,
    ``long_rows_row_bytes_above``, ``long_rows_bytes_below``,
    ``long_rows_threads``, ``long_rows_slot_group``: calls without scale
    factors whose rows are longer than ``long_rows_row_bytes_above`` (8 KiB;
    Kimi-K2's 14 KiB bf16 rows) and fit the rows kernel, with ``from <= T <
    below`` tokens (512 .. 1023) and an output (X rows of data) below
    ``long_rows_bytes_below`` (64 MB), that the rows kernel does not write by
    position, take it with token blocks: blocks of ``long_rows_threads``
    (128), a token block storing ``long_rows_slot_group`` (4) of its token's
    slots, then a block a padding row. ``rows_kernel_tokens_below``, where it
    takes the call, sets its own layout instead. Measured on the H100
    (fifty-sixth session, results/expand_long_rows_h100.md; seed / ours in a
    CUDA graph, on any output): Kimi-K2 medium e32 EP8 plan 0.96 -> 1.05
    (24.6 -> 22.4 µs, the seed 23.6), the plans of more output 1-2% slower
    (e128 1.03 -> 1.01, e48 EP8 1.05 -> 1.04; hence the bytes bound); the
    tightly packed Kimi-K2 T = 512 call of the same shapes 24.66 -> 24.36 µs
    in a graph but 91.3 -> 89.0% of the copy with the L2 flushed. 256
    threads and 2 or 8 slots measured worse. At 32 tokens the tight call lost
    (fiftieth session: Kimi-K2 T = 32 2.45 -> 3.37 µs), and rows of at most
    8 KiB lost at 512 (Qwen3 T = 512 76.1 -> 72.3% of the copy), hence the
    bounds. ``long_rows_tokens_from`` at inf: off.
    ``rows_by_position_tokens_below``, ``rows_by_position_bytes_below``:
    calls that pass ``pos_to_token``, without scale factors or with row-major
    ones (16-byte rows of at most 16 KiB and bases), with ``1 <= T < the
    first`` tokens and an output of fewer than ``the second`` bytes (X * row
    bytes) take the rows kernel by position, blocks of
    ``rows_kernel_threads``: no token blocks, block p writes row p alone from
    its two map words (x's row of its token and its S scale factors, or
    zeros). Every block is one row whatever the routing, so a tightly
    packed call gets X row copies where token blocks would each store K
    rows. Before ``gather_x_bytes_below``'s warp-a-row gather and the
    token-block rows kernel. Measured on the H100 (fifty-first session,
    results/expand_rows_by_position_h100.md, in a CUDA graph, 256 threads):
    first at every T < 1024 against the old default, decode and T = 32
    calls given pos_to_token 8-18% faster (Qwen3 T = 32 2.40 -> 1.97 µs),
    the decode plans and the Qwen3 small EP8 plans (19 MB) closer to the
    seed or past it; but outputs of 44 MB and more lost (Kimi-K2 small EP8,
    seed / ours 1.02 -> 0.98; Qwen3 small E = 128 1.02 -> 0.98; at T = 512
    every plan of 35 MB or more 7-15%), and tightly packed T = 512 calls too
    (Qwen3 8.58 -> 8.91 µs). So: T < 64 and outputs below 32 MB (below 1024
    tokens since the fifty-third session, see the end). As the
    default (second call): Qwen3 / Kimi-K2 T = 1 1.67 -> 1.47 / 1.78 -> 1.62
    µs, T = 32 2.31 -> 1.93 / 2.68 -> 2.43; seed / ours in a graph, Qwen3
    decode plans 1.03-1.05 -> 1.20-1.24, Kimi-K2 1.18-1.23 -> 1.28-1.30,
    Qwen3 small EP8 0.94-0.95 -> 0.98 (host hidden 0.94-0.99 -> 0.94-1.03);
    the plans it does not take unchanged. Row-major scale factors came along
    in the fifty-second session (results/expand_sf_by_position_h100.md, H100,
    seed / ours in a CUDA graph): Kimi-K2's fp8 decode plan 0.99-1.03 ->
    1.12-1.16 (3.90 -> 3.46 µs), 1.04-1.06 with the host hidden; no other SF
    plan of the manifest is taken. The fifty-third session
    (results/expand_rows_by_position_t1024.md, CUDA graph) raised the tokens
    bound to 1024 under the same bytes bound: three manifest workloads change
    kernel. Seed / ours on Qwen3 medium e32 EP8 (T = 512, 25 MB) 0.89 -> 0.97
    on the H100, 0.91 -> 1.00 on the H200; tightly packed Qwen3 T = 512 8.81
    -> 8.84 µs (H100) and 8.02 -> 7.92 (H200); tightly packed Kimi-K2 T = 512
    fp8 with row-major SF 8.96 -> 9.05 (H200).
    """

    # register kernel
    threads: int = 256
    unroll: int = 4
    shrink_chunks_below: float = 2.0
    split_slots_below: float = 1.0
    zero_rows_registers: int = 2
    zero_block_bytes_registers: int = 16 * 1024
    compiled_row: int = 0
    zero_fill_runs: int = 1
    register_min_blocks: int = 0
    # bulk-copy kernel
    bulk_min_blocks: float = 1.0
    bulk_target_blocks: float = 12.0
    bulk_min_chunk_bytes: int = 2 * 1024
    bulk_max_chunk_bytes: int = 16 * 1024
    bulk_whole_row_zero_from: float = 0.0
    zero_rows_bulk: int = 4
    zero_rows_bulk_whole: int = 2
    # padding-heavy plans
    padding_share_registers: float = 0.5
    medium_padding_share_registers: float = 0.3
    medium_copy_bytes: float = 128e6
    padding_bulk_min_chunk_bytes: int = 1024
    padding_bulk_least_chunk_bytes: int = 512
    padding_zero_whole_rows: int = 0
    padding_zero_stage_bytes: int = 16 * 1024
    padding_zero_rows_bulk_whole: int = 1
    bulk_zero_rows_plain: int = 1
    zero_kernel_from_bytes: float = 64e6
    zero_kernel_beside_registers: int = 0
    padding_whole_chunks_from: float = 16.0
    # scale factors
    sf_by_position: int = 1
    sf_pass_beside_zero_kernel: int = 1
    # rows by position (calls that pass pos_to_token)
    gather_x_bytes_below: float = 0.0
    gather_rows: int = 16
    # the lean rows kernel (calls without scale factors; by position, row-major ones too)
    rows_kernel_tokens_below: float = 0.0
    rows_kernel_slot_blocks_below: float = 2.0
    rows_kernel_slot_group: int = 0
    rows_kernel_threads: int = 256
    rows_kernel_fitted_unroll: int = 1
    rows_by_position_tokens_below: float = 1024.0
    rows_by_position_bytes_below: float = 32e6
    rows_by_position_narrow_threads: int = 64
    rows_by_position_narrow_row_bytes: int = 8 * 1024
    long_rows_tokens_from: float = 512.0
    long_rows_tokens_below: float = 1024.0
    long_rows_row_bytes_above: int = 8 * 1024
    long_rows_bytes_below: float = 64e6
    long_rows_threads: int = 128
    long_rows_slot_group: int = 4
    # cache hints of the register kernels' accesses: indices into
    # runtime.cache_hints' LOAD_HINTS (.cs, plain, .cg, .nc) / STORE_HINTS
    # (.cs, plain, .cg); 0, .cs, adds no define
    load_hint: int = 0
    store_hint: int = 0

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"ExpandTuning.{field.name} must be a number >= 0; "
                                 f"got {value!r}")
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"ExpandTuning.threads must be whole warps in 32 .. 1024 (the "
                             f"zero-fill ballots); got {self.threads}")
        if not 1 <= self.gather_rows <= self.threads:  # a lane looks up each of a warp's rows
            raise ValueError(f"ExpandTuning.gather_rows must be in 1 .. threads "
                             f"({self.threads}); got {self.gather_rows}")
        # the rows kernel's block sizes (the narrow one may be 0: off)
        for name, zero_off in (("rows_kernel_threads", False), ("long_rows_threads", False),
                               ("rows_by_position_narrow_threads", True)):
            value = getattr(self, name)
            if (value or not zero_off) and (value % 32 or not 32 <= value <= 1024):
                raise ValueError(f"ExpandTuning.{name} must be {'0 or ' if zero_off else ''}"
                                 f"whole warps in 32 .. 1024; got {value}")
        for name in ("rows_kernel_slot_group", "long_rows_slot_group"):
            if not float(getattr(self, name)).is_integer():  # NaN and inf too
                raise ValueError(f"ExpandTuning.{name} must be a whole number of "
                                 f"slots; got {getattr(self, name)!r}")
        if not 1 <= self.unroll <= 16:
            raise ValueError(f"ExpandTuning.unroll must be in 1 .. 16; got {self.unroll}")
        for name in ("zero_rows_registers", "zero_rows_bulk", "zero_rows_bulk_whole",
                     "padding_zero_rows_bulk_whole"):
            if not 1 <= getattr(self, name) <= 32:  # one warp ballot covers a block's rows
                raise ValueError(f"ExpandTuning.{name} must be in 1 .. 32; "
                                 f"got {getattr(self, name)}")
        for name in ("padding_zero_whole_rows", "bulk_zero_rows_plain",
                     "zero_kernel_beside_registers", "sf_by_position",
                     "sf_pass_beside_zero_kernel", "rows_kernel_fitted_unroll"):
            if getattr(self, name) not in (0, 1):
                raise ValueError(f"ExpandTuning.{name} must be 0 or 1; "
                                 f"got {getattr(self, name)!r}")
        if not float(self.register_min_blocks).is_integer():
            raise ValueError(f"ExpandTuning.register_min_blocks must be a whole number of "
                             f"blocks; got {self.register_min_blocks!r}")
        if self.register_min_blocks * self.threads > 2048:  # an SM holds 2,048 threads
            raise ValueError(f"ExpandTuning.register_min_blocks must leave blocks of "
                             f"{self.threads} threads room on an SM (at most "
                             f"{2048 // self.threads}); got {self.register_min_blocks}")
        for name, hints in (("load_hint", LOAD_HINTS), ("store_hint", STORE_HINTS)):
            require_hint_index("ExpandTuning", name, getattr(self, name), hints)
        if self.zero_fill_runs not in (0, 1, 2):
            raise ValueError(f"ExpandTuning.zero_fill_runs must be 0, 1 or 2; "
                             f"got {self.zero_fill_runs!r}")
        if self.compiled_row not in (0, 1, 2):
            raise ValueError(f"ExpandTuning.compiled_row must be 0, 1 or 2; "
                             f"got {self.compiled_row!r}")
        if self.padding_zero_stage_bytes % 16:
            raise ValueError(f"ExpandTuning.padding_zero_stage_bytes must be a multiple of 16 "
                             f"(bulk stores); got {self.padding_zero_stage_bytes!r}")
        for name in ("bulk_min_chunk_bytes", "padding_bulk_min_chunk_bytes",
                     "padding_bulk_least_chunk_bytes"):
            if not 16 <= getattr(self, name) <= self.bulk_max_chunk_bytes:
                raise ValueError(f"ExpandTuning needs 16 <= {name} <= bulk_max_chunk_bytes; "
                                 f"got {getattr(self, name)}, {self.bulk_max_chunk_bytes}")

    def defines(self) -> tuple[tuple[str, int], ...]:
        """The compile-time part (the kernel source's EXPAND_* macros);
        EXPAND_ZERO_RUNS and EXPAND_MIN_BLOCKS only where set (the source's
        defaults: row by row, no bound but the block size), and the cache
        hints (VECTOR_LOAD_HINT, VECTOR_STORE_HINT) only where not .cs."""
        runs = (("EXPAND_ZERO_RUNS", int(self.zero_fill_runs)),) if self.zero_fill_runs else ()
        bound = ((("EXPAND_MIN_BLOCKS", int(self.register_min_blocks)),)
                 if self.register_min_blocks else ())
        hints = hint_defines(int(self.load_hint), int(self.store_hint))
        return (("EXPAND_THREADS", int(self.threads)), ("EXPAND_UNROLL", int(self.unroll)),
                *runs, *bound, *hints)


DEFAULT_TUNING = ExpandTuning()
