"""How ``reduce_fused``'s kernel is cut into blocks (pure Python: tested
without a GPU).

A thread owns one vector (16 bytes where alignment allows; 2 to 8 vectors in
the many-token shapes below) of one token's output row: it loads its vectors of
each of the token's K expert rows (all of a batch of slots before the first
FMA), accumulates in float32 and stores once.
So a block is ``tokens_per_block`` groups of ``row_threads`` threads, each
group one column chunk of one token, and the grid is (token groups, column
chunks). Nothing is shared between threads but a warp's slots, passed by
shuffles (``warp_slots``, ``stream_rounds``), or with ``bulk_stages`` a
block's live rows in shared memory: no atomics; every output element is
written by exactly one thread.

- Rows of at most 16 vectors take a power-of-two group of threads each and
  are packed, several tokens a block (a block of 128 threads), so short rows
  do not leave most of a block idle.
- Longer rows are cut into the fewest chunks of at most ``max_warps`` warps,
  balanced (7168 bf16 columns = 896 vectors = 28 warps: 4 chunks of 7 warps,
  no idle thread; 2048 columns: one chunk of 8 warps).
- Few tokens (decode): while the grid has fewer than ``fill_blocks_per_sm``
  blocks per SM, rows are cut into more, smaller chunks (down to one warp),
  and packed blocks hold fewer tokens, so that more SMs share the loads.
- Many tokens (``auto_combine_shape``, on rows ``token_rows`` below does not
  take): a thread owns 4 vectors of its row and has 4 slots' rows in flight
  (16 loads, against 8 for one vector and 8 slots), in chunks of at most 4
  warps, whenever that grid still has
  ``fill_blocks_per_sm`` blocks per SM: fewer threads per byte, and each
  slot's weight and position loaded once for 4 vectors. Measured on the H200
  (benchmarks/sweep_combine.py): Kimi-K2 prefill 75% -> 98% of the copy
  bandwidth, Qwen3 prefill 72% -> 92%, Kimi-K2 T=512 62% -> 74%; at decode the
  default shape stays faster (more threads share the few rows: 5.8 vs 7.4 us).
- In the many-token shape each warp loads its token's K slots once, lane k
  slot k, and walks only the live ones (``warp_slots``), instead of every
  thread loading and testing every slot: level where every slot is live,
  and where most are dropped (expert parallelism: DeepSeek-V3 EP8, 7 of 8)
  57.6 -> 39.1 us, 48% -> 71% of the copy bandwidth, whatever X says.
- Plans whose X says most slots are dropped (``sparse_slots``: X at most
  half of T * K, a trimmed expert-parallel plan): a warp streams the live
  rows of the 32 // K tokens one load of slots covers (``stream_rounds``),
  4 in flight whichever token they belong to: 36.3 us, 76% (8k: 68.2 us,
  81%). Measured: benchmarks/results/combine_warp_slots_h200.md.
- ``bulk_stages`` (a sweep option, not a default yet): a block's threads share
  the live rows of its ``row_threads // K`` tokens, each row's column chunk
  landed in shared memory by the bulk-copy engine (sm_90+, 16-byte rows),
  that many chunks in flight a block: bytes in flight without registers
  (``bulk_rounds``: that many groups of tokens a block in turn, a shorter
  grid). Built and checked under the CPU emulation; not yet measured.
- ``token_rows`` (the many-token default where it fills rows,
  ``token_rows_options``): a group of threads a token with K compiled into
  the kernel, as TileKernels' reduce_fused is laid out (a block of 128
  threads a 7168-column row, 7 vectors a thread): the slot loop unrolled, a
  token without a live slot stores zeros at once, no vector bounds-tested
  where the row fills the threads' vectors. Taken before the shapes above
  where the row is whole groups of 128 threads (vectors a thread one of
  ``TOKEN_ROWS_VECS``: 7 at 7168 bf16 columns, 2 at 2048), K <= 32,
  and the grid fills the chip with chunks of at least 2 warps; the shapes
  above where it does not. On the H100's DeepSeek-V3 EP8 plans 1-5% ahead
  of them (untrimmed: 44.6 -> 42.1 us, 86.9 -> 92.0% of the copy), level on
  Kimi-K2 and Qwen3 prefill and T = 512, Qwen3 T = 512 11.9 -> 11.5
  (benchmarks/results/reduce_tk_all_h100.md).
- Cache hints: row loads by the read-only path (``RESIDENT_LOAD_HINT``)
  where the call fits in half the L2 or the plan is sparse, evict-first
  elsewhere; stores evict-first (benchmarks/results/reduce_cache_hints_h100.md).

The grid depends only on the call's sizes and the GPU's SM count, never on the
data, so a CUDA graph can capture the call; results do not depend on it.

Why this shape. The op reads K rows and writes one per token: it is bound by
memory, and the kernel's job is to keep enough bytes in flight and to spend
few instructions per byte. 16-byte accesses move 8 bf16 (4 float32) per
instruction; a thread issues its vector loads of a whole batch of slots (8)
back to back before the first FMA, so a block waits one memory latency per
batch, not one per slot; blocks never wait on each other. Each element's sum
is made by one thread, slot by slot in k order, so cutting a row into column
chunks changes no bit, while splitting the K slots across blocks would (it
needs atomics or a second pass, and moves the rounding order): that is never
done. Balanced chunks leave no idle lane on the usual hidden sizes, so
prefill shapes of different H (7168, 2048) run at the same share of the
bandwidth. Rows whose length or base is not a multiple of 16 bytes take
narrower accesses (down to one element for odd H): correct for every H, but
only the aligned shapes are meant to be fast.
"""

from __future__ import annotations

from typing import NamedTuple

from ..runtime.cache_hints import LOAD_HINTS, STORE_HINTS, half_l2_holds, hint_defines
from ..runtime.rules import require_int
from ..runtime.sizes import ceil_div

MAX_WARPS = 8              # warps of one chunk: a row's chunk covers up to 256 vectors
MAX_BLOCK_THREADS = 256    # COMBINE_MAX_THREADS of combine.cu (its __launch_bounds__)
PACK_THREADS = 128         # threads of a block of packed short rows
PACKED_ROW_VECS = 16       # rows of at most this many vectors are packed
FILL_BLOCKS_PER_SM = 4     # fewer blocks than this per SM: cut rows finer
VECS_PER_THREAD = 1        # vectors a thread owns (2 and 4 compiled on demand: sweeps)
VECS_PER_THREAD_CHOICES = (1, 2, 4, 7, 8)
SLOT_BATCH = 8             # slots whose row loads a thread has in flight (combine.cu)
SLOT_BATCH_CHOICES = (2, 4, 8, 16)
WARP_TOKENS_CHOICES = (1, 2, 4)
STREAM_ROUNDS_CHOICES = (0, 1, 2, 4)
BULK_STAGES_CHOICES = (0, 2, 4, 8)
BULK_ROUNDS_CHOICES = (1, 2, 4)
BULK_VEC_BYTES = 16        # the bulk layout's access: whole 16-byte vectors
WARP_LANES = 32
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535


class CombineShape(NamedTuple):
    row_threads: int       # threads on one token's column chunk
    tokens_per_block: int
    chunks: int            # column chunks of a row: the grid's y
    token_blocks: int      # blocks along the tokens: the grid's x (0: nothing to launch)
    vecs_per_thread: int = 1  # vectors a thread owns: a chunk is row_threads * this
    slot_batch: int = SLOT_BATCH  # slots' loads in flight at once, per vector
    warp_slots: bool = False  # a warp shares its token's slots and walks the live ones
    warp_tokens: int = 1  # with warp_slots: consecutive tokens a warp takes in turn
    stream_rounds: int = 0  # > 0: a warp streams the live rows of that many rounds of tokens
    bulk_stages: int = 0  # > 0: a block's live rows land in shared memory, this many in flight
    bulk_rounds: int = 1  # with bulk_stages: groups of row_threads // K tokens a block takes
    token_rows: int = 0  # > 0: K, compiled in: a group a token, its slots unrolled
    full_rows: bool = False  # with token_rows: every thread's vectors lie inside the row
    load_hint: str = "cs"  # the row loads' cache hint (LOAD_HINTS)
    store_hint: str = "cs"  # the output stores' cache hint (STORE_HINTS)
    # with token_rows: the row loads' hint of a token with at most half its
    # slots live (LOAD_HINTS; "": load_hint, as every other token)
    few_live_load_hint: str = ""

    def defines(self) -> tuple[tuple[str, int], ...]:
        """The kernel variant this shape needs (combine.cu's COMBINE_VECS,
        COMBINE_SLOT_BATCH, COMBINE_WARP_SLOTS, COMBINE_WARP_TOKENS,
        COMBINE_STREAM_ROUNDS, COMBINE_BULK_STAGES and COMBINE_BULK_ROUNDS; none
        for the default variant)."""
        defines = []
        if self.vecs_per_thread != 1:
            defines.append(("COMBINE_VECS", self.vecs_per_thread))
        if self.slot_batch != SLOT_BATCH:
            defines.append(("COMBINE_SLOT_BATCH", self.slot_batch))
        if self.warp_slots:
            defines.append(("COMBINE_WARP_SLOTS", 1))
        if self.warp_tokens != 1:
            defines.append(("COMBINE_WARP_TOKENS", self.warp_tokens))
        if self.stream_rounds:
            defines.append(("COMBINE_STREAM_ROUNDS", self.stream_rounds))
        if self.bulk_stages:
            defines.append(("COMBINE_BULK_STAGES", self.bulk_stages))
        if self.bulk_rounds != 1:
            defines.append(("COMBINE_BULK_ROUNDS", self.bulk_rounds))
        if self.token_rows:
            defines.append(("COMBINE_TOKEN_ROWS", self.token_rows))
        if self.full_rows:
            defines.append(("COMBINE_FULL_ROWS", 1))
        if self.few_live_load_hint:
            defines.append(("COMBINE_FEW_LIVE_LOAD_HINT",
                            LOAD_HINTS.index(self.few_live_load_hint)))
        defines.extend(hint_defines(LOAD_HINTS.index(self.load_hint),
                                    STORE_HINTS.index(self.store_hint)))
        return tuple(defines)

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of a block: the bulk layout's stages, each a
        full column chunk of 16-byte vectors."""
        return self.bulk_stages * self.row_threads * self.vecs_per_thread * BULK_VEC_BYTES

    @property
    def threads(self) -> int:
        return self.row_threads * self.tokens_per_block

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.token_blocks, self.chunks, 1)


# the many-token shape (auto_combine_shape); a warp walks its token's live
# slots (free where every slot is live, a gain where most are dropped and X
# does not say so: a plan's X is by default the worst case, not trimmed)
WIDE_OPTIONS = {"vecs_per_thread": 4, "slot_batch": 4, "max_warps": 4, "warp_slots": True}
# ... and where most slots are dropped (``sparse_slots``): a warp streams the
# live rows of 32 // K tokens, 4 in flight (twenty-fifth session, DeepSeek-V3
# EP8 prefill plan: 57.6 -> 36.3 us; 8k 110.8 -> 68.2)
SPARSE_WIDE_OPTIONS = {"vecs_per_thread": 1, "slot_batch": 4, "max_warps": 4,
                       "stream_rounds": 1}
# the option sets of those plans, in order of preference: the first whose grid
# fills the chip and whose kernel the launch allows (``bulk_ok``) is taken
SPARSE_CANDIDATES = (SPARSE_WIDE_OPTIONS,)
# token_rows (taken first, ``token_rows_options``): a token's group of threads
# where the row is not cut finer, as TileKernels lays a 7168-column row out
TOKEN_ROWS_THREADS = 128
# ... and the narrowest chunk it takes where few tokens cut rows finer: 2 warps
# measured (Kimi-K2 T=512); 1-warp chunks of 7 vectors would leave a few
# thousand threads to cover every byte
TOKEN_ROWS_MIN_THREADS = 64
# vectors a thread it takes: those measured (7 and 8 on 7168-column rows, 4
# and 2 on 2048); one vector a thread is the default shape's job
TOKEN_ROWS_VECS = (8, 7, 4, 2)
# The row loads' hint where the rows may still be in L2 from the last kernel
# (a graph's next call; the call's bytes fit in half the L2) or most slots are
# dropped (sparse_slots). Measured on the H100 (thirty-third session,
# benchmarks/results/reduce_cache_hints_h100.md): Qwen3 T = 512 (19 MB) in a
# graph 8.3 -> 4.6 us (TileKernels 4.3); EP8 prefill plans, L2 flushed,
# 42.2 -> 41.3 us (8k 82.4 -> 80.9). (DeepSeek-V3 EP8 T = 512 would gain too,
# 5.5 -> 4.9 in a graph, but its padded X hides its 516 live rows.) Not
# elsewhere: dense calls larger than the L2 lose 1.5-8% (Kimi-K2 prefill 174.4
# -> 177.0, Qwen3 prefill 49.8 -> 54.2; Kimi-K2 T = 512, 66 MB, in a graph
# 22.3 -> 25.2), where the evict-first rows keep L2 for the output.
RESIDENT_LOAD_HINT = "nc"
# The row loads' hint of a token_rows token with at most half its slots live,
# where the call's own hint is evict-first: an expert-parallel plan's tokens
# (one live slot of K = 8, about) whatever X says, as sparse_slots does from
# the shapes alone. Measured on the H100 (thirty-fourth session,
# benchmarks/results/reduce_few_live_h100.md): DeepSeek-V3 EP8 T = 512, whose
# padded X hides its 516 live rows, 5.85 -> 4.46 us a call in a graph
# (TileKernels 3.85); the untrimmed EP8 prefill plans 0.5-0.9% faster with the
# L2 flushed; dense calls level (their tokens never take the branch).
FEW_LIVE_LOAD_HINT = "nc"
# options of auto_combine_shape that change the chosen shape's cache hints only
# (runtime.cache_hints' LOAD_HINTS / STORE_HINTS)
CACHE_HINTS = ("load_hint", "store_hint", "few_live_load_hint")


def token_rows_options(row_vecs: int, top_k: int | None) -> dict | None:
    """The ``token_rows`` options whose groups of ``TOKEN_ROWS_THREADS``
    threads cover a row of ``row_vecs`` vectors exactly (the most vectors a
    thread of ``TOKEN_ROWS_VECS``, so the fewest chunks: 7168 bf16 columns =
    896 vectors, 7; 2048 = 256, 2), or None where none does or K is unknown
    or above 32 (a token's slots are one load a lane)."""
    if top_k is None or not 1 <= top_k <= WARP_LANES:
        return None
    for vecs in TOKEN_ROWS_VECS:
        if row_vecs % (TOKEN_ROWS_THREADS * vecs) == 0:
            return {"vecs_per_thread": vecs, "max_warps": TOKEN_ROWS_THREADS // WARP_LANES,
                    "token_rows": True}
    return None


def sparse_slots(num_tokens: int, top_k: int, num_expanded: int) -> bool:
    """Whether at most half of the T * K slots can have a row of X: an
    expert-parallel plan (a rank's X rows hold the slots routed to its
    experts, about K / ranks a token) rather than one of all the slots.
    Shapes only, never the data: a CUDA graph can capture the call."""
    return 2 * num_expanded <= num_tokens * top_k


def auto_combine_shape(num_tokens: int, row_vecs: int, multiprocessors: int, *,
                       top_k: int | None = None, sparse: bool = False, bulk_ok: bool = False,
                       l2_resident: bool = False, **options) -> CombineShape:
    """The launch shape ``reduce_fused`` takes: ``combine_shape(**options)``
    when options are given (tests, sweeps); else ``token_rows_options``'
    shape where it has them, its rows whole (``full_rows``), chunks of at
    least ``TOKEN_ROWS_MIN_THREADS`` threads and ``FILL_BLOCKS_PER_SM``
    blocks per SM; else the many-token shape where its grid has
    ``FILL_BLOCKS_PER_SM`` blocks per SM without cutting rows finer (one of
    ``SPARSE_CANDIDATES`` where ``sparse``, see ``sparse_slots``, and K is
    known; else ``WIDE_OPTIONS``), and the default shape otherwise. Its row
    loads take ``RESIDENT_LOAD_HINT`` where ``sparse`` or ``l2_resident``
    (the call's bytes fit in half the L2, ``fits_half_l2``), .cs
    (evict-first) otherwise; on the ``token_rows`` shape a token with at most
    half its slots live takes ``FEW_LIVE_LOAD_HINT`` (``few_live_load_hint``,
    "" where it is the call's own hint).
    ``load_hint`` / ``store_hint`` / ``few_live_load_hint`` (sweeps): the
    chosen shape's row loads', output stores' and few-live tokens' row loads'
    cache hint (``LOAD_HINTS``, ``STORE_HINTS``; vector_access.cuh), whoever
    chose the shape.
    ``top_k``: K, for the options that group tokens by their slots
    (``stream_rounds``, ``bulk_stages``). ``bulk_ok``: whether the launch
    may take the bulk layout (16-byte accesses, sm_90 and newer); without it
    a many-token option set with ``bulk_stages`` is passed over for the
    next one (no default has it yet: it is a sweep option)."""
    # cache hints apply to whichever shape is chosen; other options choose it
    hints = {name: options.pop(name) for name in CACHE_HINTS if name in options}
    for name, value in hints.items():
        choices = STORE_HINTS if name == "store_hint" else LOAD_HINTS
        if value not in choices:
            raise ValueError(f"{name} must be one of {choices}; got {value!r}")
    if options:
        shape = combine_shape(num_tokens, row_vecs, multiprocessors, top_k=top_k,
                              bulk_ok=bulk_ok, **options)
    else:
        shape = _auto_shape(num_tokens, row_vecs, multiprocessors, top_k, sparse, bulk_ok)
        if sparse or l2_resident:
            shape = shape._replace(load_hint=RESIDENT_LOAD_HINT)
        shape = shape._replace(few_live_load_hint=FEW_LIVE_LOAD_HINT)
    shape = shape._replace(**hints)
    # only token_rows tells tokens apart, and a hint equal to every token's
    # changes nothing: neither takes a module of its own
    if not shape.token_rows or shape.few_live_load_hint == shape.load_hint:
        shape = shape._replace(few_live_load_hint="")
    return shape


def fits_half_l2(num_tokens: int, top_k: int, num_expanded: int, row_bytes: int,
                 l2_bytes: int) -> bool:
    """Whether the rows a call can read (at most min(X, T * K)) and the rows it
    writes (T) fit in half of an L2 of ``l2_bytes`` (0: unknown, never).
    Shapes only, never the data."""
    return half_l2_holds((min(num_expanded, num_tokens * top_k) + num_tokens) * row_bytes,
                         l2_bytes)


def _auto_shape(num_tokens: int, row_vecs: int, multiprocessors: int, top_k: int | None,
                sparse: bool, bulk_ok: bool) -> CombineShape:
    target = FILL_BLOCKS_PER_SM * multiprocessors
    rows_options = token_rows_options(row_vecs, top_k)
    if rows_options is not None:
        rows = combine_shape(num_tokens, row_vecs, multiprocessors, top_k=top_k, **rows_options)
        if (rows.full_rows and rows.row_threads >= TOKEN_ROWS_MIN_THREADS
                and rows.token_blocks * rows.chunks >= target):
            return rows
    candidates = SPARSE_CANDIDATES if sparse and top_k is not None else ()
    candidates = [wide_options for wide_options in (*candidates, WIDE_OPTIONS)
                  if bulk_ok or not wide_options.get("bulk_stages")]
    for wide_options in candidates:
        wide = combine_shape(num_tokens, row_vecs, multiprocessors, fill_blocks_per_sm=0,
                             top_k=top_k, **wide_options)
        if wide.token_blocks * wide.chunks >= target:
            return wide
    return combine_shape(num_tokens, row_vecs, multiprocessors)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def combine_shape(num_tokens: int, row_vecs: int, multiprocessors: int, *,
                  max_warps: int = MAX_WARPS,
                  fill_blocks_per_sm: float = FILL_BLOCKS_PER_SM,
                  vecs_per_thread: int = VECS_PER_THREAD,
                  slot_batch: int = SLOT_BATCH,
                  warp_slots: bool = False, warp_tokens: int = 1, stream_rounds: int = 0,
                  bulk_stages: int = 0, bulk_rounds: int = 1, bulk_ok: bool = True,
                  token_rows: bool = False,
                  top_k: int | None = None) -> CombineShape:
    """The launch shape of ``num_tokens`` rows of ``row_vecs`` vectors each.

    ``max_warps``, ``fill_blocks_per_sm``, ``vecs_per_thread`` and
    ``slot_batch`` override the defaults (sweeps). A thread owns
    ``vecs_per_thread`` vectors of its row (v, v + row_threads, ...): the
    shape is cut as for rows of ``ceil(row_vecs / vecs_per_thread)`` vectors.
    ``slot_batch`` slots' loads are in flight before their FMAs (it changes
    registers and bytes in flight, never the results: the FMAs stay in slot
    order). ``warp_slots``: each warp loads its token's K slots once (lane k
    slot k) and walks only the live ones, ``slot_batch`` rows at a time,
    shuffling each row and scale to the lanes: for plans that drop most
    slots (expert parallelism). It needs a warp to be one token's, so rows
    packed several to a block (at most ``PACKED_ROW_VECS`` threads' columns)
    keep the per-thread walk (the shape says ``warp_slots=False``); results
    unchanged. ``warp_tokens`` (with ``warp_slots``): each warp takes that
    many consecutive tokens in turn (a grid that many times shorter), so the
    next token's slots are mostly in the cache line already read.
    ``stream_rounds`` (needs ``top_k``, K): a warp takes that many rounds of
    ``32 // K`` consecutive tokens (one load of their slots each) and streams
    their live rows, ``slot_batch`` in flight whatever token they belong to,
    so that batches stay full where tokens have one live slot or none; where
    a warp would span two tokens' columns, or K > 32, the shape falls back to
    ``warp_slots`` (``stream_rounds=0``).
    ``bulk_stages`` (needs ``top_k``; the kernel's 16-byte access on sm_90
    and newer: ``bulk_ok`` says whether the launch has them): a block takes ``row_threads // K``
    consecutive tokens (thread i their flat slot i), lists their live slots
    and has the bulk-copy engine land each one's column chunk in shared
    memory, ``bulk_stages`` chunks in flight, from which every thread sums
    its vectors (``shared_bytes`` of stages a block). Where a block's
    threads are fewer than K the shape falls back to ``warp_slots``, where
    rows are packed or the launch is not ``bulk_ok`` to the per-thread walk
    of the other options (``bulk_stages=0`` each time).
    ``bulk_rounds`` (with ``bulk_stages``): each block takes that many
    consecutive groups of ``row_threads // K`` tokens in turn, its stages
    carried over (a grid that many times shorter: batches whose blocks
    would run in more than one wave).
    ``token_rows`` (needs ``top_k`` in 1 .. 32; not with ``warp_slots``,
    ``stream_rounds`` or ``bulk_stages``): the per-thread walk with K
    compiled in (the shape's ``token_rows`` is K), every thread loading the
    token's K positions at once; ``full_rows`` says that no thread's vector
    lies past the row (``chunks * row_threads * vecs_per_thread`` equals the
    row's vectors), so the kernel tests none.
    """
    if row_vecs < 1:
        raise ValueError(f"row_vecs must be >= 1; got {row_vecs}")
    # ints (NumPy's too) as Python ints: each one may become a -D define
    max_warps, vecs_per_thread, slot_batch, warp_tokens, stream_rounds, bulk_stages, \
        bulk_rounds = (require_int(name, value) for name, value in (
            ("max_warps", max_warps), ("vecs_per_thread", vecs_per_thread),
            ("slot_batch", slot_batch), ("warp_tokens", warp_tokens),
            ("stream_rounds", stream_rounds), ("bulk_stages", bulk_stages),
            ("bulk_rounds", bulk_rounds)))
    if not 1 <= max_warps <= MAX_BLOCK_THREADS // 32:
        raise ValueError(f"max_warps must be in 1 .. {MAX_BLOCK_THREADS // 32}; got {max_warps}")
    if vecs_per_thread not in VECS_PER_THREAD_CHOICES:
        raise ValueError(f"vecs_per_thread must be one of {VECS_PER_THREAD_CHOICES}; "
                         f"got {vecs_per_thread}")
    if slot_batch not in SLOT_BATCH_CHOICES:
        raise ValueError(f"slot_batch must be one of {SLOT_BATCH_CHOICES}; got {slot_batch}")
    if not isinstance(warp_slots, bool):
        raise TypeError(f"warp_slots must be True or False; got {warp_slots!r}")
    if warp_tokens not in WARP_TOKENS_CHOICES:
        raise ValueError(f"warp_tokens must be one of {WARP_TOKENS_CHOICES}; got {warp_tokens}")
    if warp_tokens != 1 and not warp_slots:
        raise ValueError("warp_tokens needs warp_slots=True")
    if stream_rounds not in STREAM_ROUNDS_CHOICES:
        raise ValueError(f"stream_rounds must be one of {STREAM_ROUNDS_CHOICES}; "
                         f"got {stream_rounds}")
    if stream_rounds and top_k is None:
        raise ValueError("stream_rounds needs top_k")
    if bulk_stages not in BULK_STAGES_CHOICES:
        raise ValueError(f"bulk_stages must be one of {BULK_STAGES_CHOICES}; got {bulk_stages}")
    if bulk_stages and top_k is None:
        raise ValueError("bulk_stages needs top_k")
    if bulk_stages and (stream_rounds or warp_slots):
        raise ValueError("bulk_stages is a layout of its own: not with warp_slots or "
                         "stream_rounds")
    if not isinstance(token_rows, bool):
        raise TypeError(f"token_rows must be True or False; got {token_rows!r}")
    if token_rows and (top_k is None or not 1 <= top_k <= WARP_LANES):
        raise ValueError(f"token_rows needs top_k in 1 .. {WARP_LANES}; got {top_k}")
    if token_rows and (warp_slots or stream_rounds or bulk_stages):
        raise ValueError("token_rows is a layout of its own: not with warp_slots, "
                         "stream_rounds or bulk_stages")
    if bulk_rounds not in BULK_ROUNDS_CHOICES:
        raise ValueError(f"bulk_rounds must be one of {BULK_ROUNDS_CHOICES}; got {bulk_rounds}")
    if bulk_rounds != 1 and not bulk_stages:
        raise ValueError("bulk_rounds needs bulk_stages")
    if not bulk_ok:  # no bulk copies here (narrower accesses, or before sm_90)
        bulk_stages, bulk_rounds = 0, 1
    if stream_rounds and not 1 <= top_k <= WARP_LANES:
        stream_rounds, warp_slots = 0, True  # one load cannot cover a token's slots
    # consecutive tokens a warp takes (bulk: a block's, at its widest)
    warp_span = (stream_rounds * (WARP_LANES // top_k) if stream_rounds
                 else max(1, max_warps * WARP_LANES // top_k) * bulk_rounds if bulk_stages
                 else warp_tokens if warp_slots else 1)
    vectors = row_vecs
    row_vecs = ceil_div(row_vecs, vecs_per_thread)  # the threads' columns
    target = fill_blocks_per_sm * multiprocessors
    if row_vecs <= PACKED_ROW_VECS:
        row_threads, chunks = _next_power_of_two(row_vecs), 1
        tokens_per_block = PACK_THREADS // row_threads
        while tokens_per_block > 1 and ceil_div(num_tokens, tokens_per_block) < target:
            tokens_per_block //= 2
    else:
        row_warps = ceil_div(row_vecs, 32)
        chunks = ceil_div(row_warps, max_warps)
        # the warps along the tokens (warp_span tokens a warp)
        token_groups = ceil_div(num_tokens, warp_span)
        if token_groups * chunks < target:
            chunks = min(row_warps, max(chunks, ceil_div(int(target), max(token_groups, 1))))
        warps = ceil_div(row_warps, chunks)
        chunks = ceil_div(row_warps, warps)  # no empty chunk
        row_threads, tokens_per_block = 32 * warps, 1
    if chunks > MAX_GRID_Y:
        raise ValueError(f"expanded rows of {vectors} vectors need {chunks} column chunks; "
                         f"one launch takes at most {MAX_GRID_Y}")
    # a warp shares one token's slots only where no warp spans two tokens
    if row_threads % WARP_LANES:
        warp_slots, warp_tokens, stream_rounds, warp_span = False, 1, 0, 1
        bulk_stages, bulk_rounds = 0, 1
    if bulk_stages:
        # the block's tokens: a thread a slot, bulk_rounds times
        warp_span = row_threads // top_k * bulk_rounds
        if warp_span == 0:  # fewer threads than slots
            bulk_stages, bulk_rounds, warp_slots, warp_span = 0, 1, True, 1
    token_blocks = ceil_div(num_tokens, tokens_per_block * warp_span)
    if token_blocks > MAX_GRID_X:
        raise ValueError(f"T = {num_tokens} tokens need {token_blocks} blocks; one launch "
                         f"takes at most {MAX_GRID_X}")
    # token_rows: no vector of any thread past the row (none bounds-tested)
    full_rows = token_rows and chunks * row_threads * vecs_per_thread == vectors
    return CombineShape(row_threads, tokens_per_block, chunks, token_blocks, vecs_per_thread,
                        slot_batch, warp_slots, warp_tokens, stream_rounds, bulk_stages,
                        bulk_rounds, top_k if token_rows else 0, full_rows)
