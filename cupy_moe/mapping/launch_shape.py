"""How ``fused_mapping``'s kernels are cut into blocks and warps (pure Python:
tested without a GPU).

Every warp owns ``warp_slots`` consecutive slots; a place block keeps one
int32 counter per (warp, expert) and three per expert in shared memory. The
defaults aim at one 32-slot step per warp, enough blocks that none
writes more than ~4 padding rows per thread, and one launch while the slots
are few enough for every block to count them all itself. Medium batches
take count blocks and place blocks of 8 warps; prefill one cooperative
launch of 8-warp blocks whose grid follows from E (benchmarks/NOTES.md,
eleventh and twelfth sessions: the launch-shape sweep per call in a CUDA
graph).
"""

from __future__ import annotations

from typing import NamedTuple

from ..runtime.rules import require_int
from ..runtime.sizes import ceil_div

STEPS_PER_WARP = 1          # 32-slot steps a warp aims at (more blocks beat longer warps)
MIN_WARPS, MAX_WARPS = 8, 32
DEFAULT_MAX_WARPS = 16      # more warps per block: a longer per-expert scan over them
FILL_ROWS_PER_THREAD = 4    # padding rows a thread writes, about, at most
SELF_COUNT_MAX_SLOTS = 2048  # up to here every place block counts all slots: one launch
                            # (shared-memory atomics, a slot each: slow beyond)
BLOCK_COUNT_READS = 24576   # block counts (int32) one place block sums, at most
STATIC_SHARED_BYTES = 1024  # the place kernel's static shared memory, rounded up
COUNT_BLOCKS = 8            # count blocks aimed at: a place block sums a column of them
COUNT_SHARED_INTS = 12288   # a count block's counters: place blocks it covers x E
COOP_MAX_WARPS = 16         # a cooperative block's warps, at most (the kernel's launch bounds)
COOP_MAX_BLOCK_SLOTS = 65535  # a cooperative block's slots, at most (uint16 block counts)
COOP_MIN_SLOTS = 8192       # cooperative above this; two launches of 8-warp blocks up to it
MEDIUM_WARPS = 8            # the two launches' warps there (sweep: 8 beat 16 at 4096 slots)
COOP_COUNT_READS = 24576    # block counts (uint16) a cooperative block sums, at most
CLUSTER_SIZES = (2, 4, 8)   # blocks of a cluster (cluster_blocks; 8: the portable most)
DEFAULT_CLUSTER_BLOCKS = 0  # the default plans' clusters on sm_90+ (0: none; a variant
                            # until measured, benchmarks/NOTES.md twenty-seventh session)
WARP_PLAN_MAX_SLOTS = 32    # up to here one warp works the plan out (mapping_warp_*)
WARP_PLAN_MAX_WARPS = 8     # its blocks' warps (the kernel's launch bounds)
WARP_PLAN_ROWS_PER_THREAD = 1  # expert or padding rows a thread writes, about, at most


class MappingShape(NamedTuple):
    warps: int            # warps per block (threads = 32 * warps)
    blocks: int
    warp_slots: int       # slots per warp, a multiple of 32
    self_counting: bool   # one launch: every place block counts all slots
    shared_bytes: int     # the place kernel's dynamic shared memory
    count_split: int = 1  # place blocks per count block (blocks is a multiple)
    cooperative: bool = False  # one cooperative launch, counts shared through a
                               # grid barrier (not with self_counting)
    one_warp: bool = False  # a warp's worth of slots: one warp of each block works
                            # the plan out, the blocks write the rows (no shared
                            # counters; self_counting's buffer layout)
    cluster_blocks: int = 0  # cooperative, sm_90+: clusters of this many blocks add
                             # up their counts in distributed shared memory before
                             # the grid barrier, so each block sums blocks / C rows
                             # after it (0: no clusters, every block's row)

    @property
    def count_blocks(self) -> int:
        return self.blocks // self.count_split

    @property
    def threads(self) -> int:
        return 32 * self.warps


def place_shared_bytes(warps: int, num_experts: int, cluster_blocks: int = 0) -> int:
    """The place kernel's dynamic shared memory: a counter row per warp, then
    three rows (base, start, tokens), and in clusters a fourth (the block's
    totals, which the cluster's blocks read)."""
    return 4 * (warps + (4 if cluster_blocks else 3)) * num_experts


def max_warps_for(num_experts: int, shared_bytes_optin: int) -> int:
    """Most warps a place block may have: its counters must fit the shared
    memory a block can opt in to."""
    room = shared_bytes_optin - STATIC_SHARED_BYTES - 12 * num_experts
    return min(MAX_WARPS, room // (4 * num_experts))


def mapping_shape(num_slots: int, num_experts: int, num_expanded: int, multiprocessors: int,
                  shared_bytes_optin: int, *, warps: int | None = None,
                  blocks: int | None = None, cooperative: bool = False,
                  one_warp: bool | None = None, cluster_blocks: int = 0) -> MappingShape:
    """The launch shape of one problem; ``warps`` / ``blocks`` override the
    defaults (sweeps). ``cooperative``: the GPU can launch cooperatively, so
    too many slots for self-counting take one cooperative launch (at most a
    block per multiprocessor) instead of count blocks and place blocks.
    ``one_warp``: the one-warp plan (default: up to ``WARP_PLAN_MAX_SLOTS``
    slots; False: the general kernels whatever the slots). A cooperative
    launch keeps its blocks to ``COOP_MAX_WARPS`` warps (fewer than asked
    for when ``warps`` is not given) and ``COOP_MAX_BLOCK_SLOTS`` slots; where
    the slots need more, count blocks and place blocks run instead.
    ``cluster_blocks`` (2, 4 or 8): a cooperative grid in clusters of that
    many blocks (a multiple of it; the default grid follows from the
    clusters' rows, blocks / C, that each block sums); where a cluster's
    slots would pass the uint16 counts or its blocks' extra counter row the
    shared memory, the shape without clusters (its own grid), and where the
    launch is not cooperative, no clusters. The GPU's limits on clusters are
    the plan's to check (gpu.MappingPlan)."""
    # (a float 8.0 would pass the check below and reach the launch's attribute)
    cluster_blocks = require_int("cluster_blocks", cluster_blocks)
    if cluster_blocks and cluster_blocks not in CLUSTER_SIZES:
        raise ValueError(f"cluster_blocks must be 0 or one of {CLUSTER_SIZES}; "
                         f"got {cluster_blocks}")
    given_blocks = blocks
    if one_warp is None:
        one_warp = num_slots <= WARP_PLAN_MAX_SLOTS
    elif one_warp and num_slots > WARP_PLAN_MAX_SLOTS:
        raise ValueError(f"the one-warp plan takes at most {WARP_PLAN_MAX_SLOTS} slots; "
                         f"got {num_slots}")
    if one_warp:
        return _one_warp_shape(num_experts, num_expanded, multiprocessors, warps, blocks)
    fit = max_warps_for(num_experts, shared_bytes_optin)
    if fit < 1:
        raise ValueError(f"{num_experts} experts do not fit the {shared_bytes_optin} bytes of "
                         "shared memory a block of this GPU may have")
    warp_steps = ceil_div(num_slots, 32)
    explicit_warps = warps is not None
    if warps is None:
        warps = min(fit, max(MIN_WARPS, min(DEFAULT_MAX_WARPS,
                                            ceil_div(warp_steps, STEPS_PER_WARP))))
    elif not 1 <= warps <= fit:
        raise ValueError(f"warps must be in 1..{fit} for {num_experts} experts; got {warps}")
    self_counting = num_slots <= SELF_COUNT_MAX_SLOTS
    cooperative = cooperative and num_slots > COOP_MIN_SLOTS
    coop_blocks = None  # a cooperative grid's default, where its warps follow from it
    if cooperative and not explicit_warps:
        coop_blocks = (blocks if blocks is not None
                       else _cooperative_blocks(warp_steps, num_experts, multiprocessors,
                                                max(1, cluster_blocks)))
        # 8 warps: with every batch of loads in flight, 8-warp blocks beat 16
        # on every prefill shape of the sweep (NOTES.md, twelfth session)
        warps = min(fit, MEDIUM_WARPS)
    elif not explicit_warps and not self_counting and num_slots <= COOP_MIN_SLOTS:
        warps = min(fit, MEDIUM_WARPS)
    if cooperative and warps > COOP_MAX_WARPS:  # only given warps can be more
        raise ValueError(f"a cooperative launch has at most {COOP_MAX_WARPS} warps a block; "
                         f"got {warps}")
    if blocks is None and coop_blocks is not None:
        blocks = coop_blocks
    elif blocks is None:
        blocks = max(1, ceil_div(warp_steps, warps * STEPS_PER_WARP),
                     ceil_div(num_expanded, 32 * warps * FILL_ROWS_PER_THREAD))
        blocks = min(blocks, multiprocessors)
        if not self_counting:
            blocks = min(blocks, max(1, BLOCK_COUNT_READS // num_experts))
    elif blocks < 1:
        raise ValueError(f"blocks must be >= 1; got {blocks}")
    elif cooperative and blocks > multiprocessors:
        raise ValueError(f"a cooperative launch has at most a block per multiprocessor "
                         f"({multiprocessors}); got {blocks} blocks")
    split = 1
    if not self_counting and not cooperative:
        split = max(1, min(ceil_div(blocks, COUNT_BLOCKS), COUNT_SHARED_INTS // num_experts))
        blocks = max(split, blocks // split * split)  # warp_slots below covers the rest
    warp_slots = 32 * max(1, ceil_div(warp_steps, blocks * warps))
    if not cooperative:
        cluster_blocks = 0
    elif cluster_blocks and (
            cluster_blocks * warps * warp_slots > COOP_MAX_BLOCK_SLOTS
            or place_shared_bytes(warps, num_experts, cluster_blocks)
            > shared_bytes_optin - STATIC_SHARED_BYTES):
        # no clusters where a cluster's totals would pass uint16 or its extra
        # counter row a block's shared memory: the shape without them, with
        # its own grid unless one was given
        return mapping_shape(num_slots, num_experts, num_expanded, multiprocessors,
                             shared_bytes_optin, warps=warps if explicit_warps else None,
                             blocks=given_blocks, cooperative=True, one_warp=False)
    if cluster_blocks and blocks % cluster_blocks:
        raise ValueError(f"clusters of {cluster_blocks} blocks do not divide a grid of "
                         f"{blocks} blocks")
    if cooperative and warps * warp_slots > COOP_MAX_BLOCK_SLOTS:
        return mapping_shape(num_slots, num_experts, num_expanded, multiprocessors,
                             shared_bytes_optin, warps=warps if explicit_warps else None,
                             blocks=blocks, cooperative=False, one_warp=False)
    return MappingShape(warps, blocks, warp_slots, self_counting,
                        place_shared_bytes(warps, num_experts, cluster_blocks), split,
                        cooperative, cluster_blocks=cluster_blocks)


def _one_warp_shape(num_experts: int, num_expanded: int, multiprocessors: int,
                    warps: int | None, blocks: int | None) -> MappingShape:
    """Enough blocks that a thread writes about one expert row and one padding
    row (every block repeats the warp's few loads; blocks never wait for each
    other), at most a block per multiprocessor."""
    if warps is None:
        warps = WARP_PLAN_MAX_WARPS
    elif not 1 <= warps <= WARP_PLAN_MAX_WARPS:
        raise ValueError(f"warps must be in 1..{WARP_PLAN_MAX_WARPS} for the one-warp plan; "
                         f"got {warps}")
    if blocks is None:
        rows = max(num_experts, num_expanded)
        blocks = min(multiprocessors,
                     max(1, ceil_div(rows, 32 * warps * WARP_PLAN_ROWS_PER_THREAD)))
    elif blocks < 1:
        raise ValueError(f"blocks must be >= 1; got {blocks}")
    return MappingShape(warps, blocks, 32, True, 0, one_warp=True)


def _cooperative_blocks(warp_steps: int, num_experts: int, multiprocessors: int,
                        cluster: int = 1) -> int:
    """A cooperative grid: a 32-slot step for each warp of 8-warp blocks, at
    most a block per multiprocessor and ``cluster * COOP_COUNT_READS // E``
    blocks (after the grid barrier every block reads every block's E counts,
    or every cluster's), rounded down to a power of two (128 blocks at E =
    128, 64 at 256 and 384; 132 at E = 128 measured 12% slower, 128 at E =
    256 and 384 1-9%), and to at least a cluster."""
    wanted = max(cluster, min(multiprocessors, ceil_div(warp_steps, MEDIUM_WARPS),
                              cluster * COOP_COUNT_READS // num_experts))
    return 1 << (wanted.bit_length() - 1)
