"""Launch plans of the expand kernels: which kernel, which grid, which constants.

Everything about a call that depends only on its sizes, dtypes, device,
tuning and ``zero_padding`` is worked out once and kept in an ``ExpandPlan``:
the kernel handles, the grids and each launch's argument block with its
constant fields packed. A call then packs seven pointers and launches.
"""

from __future__ import annotations

from cupy.cuda import driver

from ..runtime.bounded_cache import BoundedCache
from ..runtime.launch import (
    ArgBlock,
    ArgStruct,
    device_traits,
    function_handle,
    launch_overlapping_previous,
)
from ..runtime.sizes import ceil_div
from .rules import ExpandProblem
from .tuning import ExpandTuning

SOURCE = "expand.cu"
SF_NONE, SF_ROW_MAJOR, SF_COL_MAJOR = 0, 1, 2  # CUPY_MOE_SF_MODE of the kernel source
# ExpandArgs.sf_pass: which scale factors the SF pass blocks write, row by row
# (expand.cu's sf_by_position)
SF_PASS_NONE, SF_PASS_ZEROS, SF_PASS_ALL = 0, 1, 2

# struct ExpandArgs of expand.cu, field for field
EXPAND_ARGS = ArgStruct(
    ("x", "ptr"), ("token_topk_to_pos", "ptr"), ("pos_to_expert", "ptr"), ("out", "ptr"),
    ("x_sf", "ptr"), ("out_sf", "ptr"), ("pos_to_token", "ptr"), ("row_bytes", "i64"),
    ("num_tokens", "i32"),
    ("top_k", "i32"), ("num_expanded", "i32"), ("sf_columns", "i32"), ("sf_ld", "i32"),
    ("rows_per_zero_block", "i32"), ("vecs_per_thread", "i32"), ("slots_per_block", "i32"),
    ("zero_padding", "i32"), ("first_zero_row", "i32"), ("sf_pass", "i32"),
    ("sf_pass_blocks", "i32"), ("zero_row_blocks", "i32"), ("rows_per_gather_block", "i32"),
    ("token_blocks", "i32"))

# the fields that differ between launches (ExpandPlan._fields: the rest are the problem's)
_LAUNCH_FIELDS = ("rows_per_zero_block", "vecs_per_thread", "slots_per_block", "first_zero_row",
                  "sf_pass", "sf_pass_blocks", "zero_row_blocks", "rows_per_gather_block",
                  "token_blocks")

# packs a launch's seven pointers into its argument block (the hot path's only packing)
_pack_pointers = EXPAND_ARGS.pointer_packer.pack_into

BULK_SHARED_LIMIT = 16384  # the most dynamic shared memory the bulk kernel asks for
BULK_THREADS = 32  # one warp: a lane per slot (so K <= 32 for the bulk kernel)
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535


# expand.cu's EXPAND_KERNELS bits, by kernel name ("routing": both routing_*
# checks, launched together)
KERNEL_BITS = {
    "expand_to_fused_v16": 0, "expand_to_fused_v8": 1, "expand_to_fused_v16_overlapped": 2,
    "expand_to_fused_v4": 3, "expand_to_fused_v2": 4, "expand_to_fused_v1": 5,
    "expand_to_fused_bulk": 6, "expand_to_fused_bulk_zero_rows": 7,
    "expand_to_fused_bulk_zero_rows_plain": 8, "expand_to_fused_bulk_overlapped": 9,
    "expand_zero_padding_rows": 10, "expand_to_fused_gather": 11, "routing": 12,
    "expand_to_fused_rows": 13}

# the longest row expand_to_fused_rows holds in registers (expand.cu's
# EXPAND_ROWS_THREADS x EXPAND_ROWS_UNROLL 16-byte vectors)
ROWS_KERNEL_MAX_ROW_BYTES = 16 * 1024


def kernel_defines(sf_mode: int, tuning: ExpandTuning,
                   kernel: str | None = None) -> tuple[tuple[str, int], ...]:
    """The module's defines: the SF mode's, the tuning's and, given
    ``kernel`` (a name of KERNEL_BITS), that kernel alone (EXPAND_KERNELS),
    so that a first call in a fresh kernel cache compiles what it launches
    (0.05-0.2 s of NVRTC a kernel; the whole file 0.7-1.5 s)."""
    defines = (("CUPY_MOE_SF_MODE", sf_mode), *tuning.defines())
    if kernel is None:
        return defines
    return (*defines, ("EXPAND_KERNELS", 1 << KERNEL_BITS[kernel]))


class ExpandLaunch:
    """One kernel launch: handle, grid, block size, shared memory, argument block;
    ``zero_launch``: the padding rows' kernel that overlaps it (or None)."""

    __slots__ = ("args", "grid_x", "grid_y", "grid_z", "handle", "name", "shared_bytes",
                 "threads", "zero_launch")

    def __init__(self, name: str, handle: int, grid: tuple[int, int, int], threads: int,
                 shared_bytes: int, args: ArgBlock,
                 zero_launch: ExpandLaunch | None = None) -> None:
        self.name, self.handle, (self.grid_x, self.grid_y, self.grid_z) = name, handle, grid
        self.threads, self.shared_bytes, self.args = threads, shared_bytes, args
        self.zero_launch = zero_launch

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.grid_x, self.grid_y, self.grid_z)

    def constant(self, field: str) -> int:
        """A constant field of the argument block as packed (for tests and sweeps)."""
        layout = self.args.layout
        return layout.packer.unpack_from(self.args.buffer)[layout.names.index(field)]


class ExpandPlan:
    """The launches of one (problem, item size, device, tuning, zero_padding,
    with_pos_to_token), by access width. ``with_pos_to_token``: the calls pass
    each row's token (``launch``'s ``pos_to_token``), which lets the SF pass
    blocks write every scale factor (ExpandTuning.sf_by_position)."""

    __slots__ = ("device", "first_zero_row", "input_bytes", "kernels", "out_bytes",
                 "out_sf_shape", "out_shape", "problem", "row_bytes", "sf_mode", "tuning",
                 "with_pos_to_token", "zero_padding")

    def __init__(self, problem: ExpandProblem, item_bytes: int, device: int,
                 tuning: ExpandTuning, *, zero_padding: bool = True,
                 with_pos_to_token: bool = False) -> None:
        self.device, self.problem, self.tuning = device, problem, tuning
        self.zero_padding, self.with_pos_to_token = zero_padding, with_pos_to_token
        self.sf_mode = (SF_NONE if not problem.has_sf else
                        SF_COL_MAJOR if problem.sf_col_major else SF_ROW_MAJOR)
        self.row_bytes = problem.hidden * item_bytes
        # Zero-fill blocks walk rows from first_zero_row (zero_rows_end says
        # to where). Leaving padding rows alone, the data rows of a call with
        # tokens need no zeros, so the blocks start at X: only the column-major
        # SF's pad columns get blocks, and the other layouts (or X % 4 == 0)
        # launch none. With no tokens the expert rows still need zeros (the
        # kernel's rows_to_zero).
        self.first_zero_row = (0 if zero_padding or problem.num_tokens == 0
                               else problem.num_expanded)
        self.kernels: dict[int, ExpandLaunch] = {}  # by access width in bytes
        # sizes of x, token_topk_to_pos, pos_to_expert, x_sf, pos_to_token; and
        # of out: what the fast path's overlap test compares
        self.input_bytes = (problem.num_tokens * self.row_bytes,
                            problem.num_tokens * problem.top_k * 4, problem.num_expanded * 4,
                            problem.num_tokens * problem.sf_columns * 4,
                            problem.num_expanded * 4 if with_pos_to_token else 0)
        self.out_bytes = problem.num_expanded * self.row_bytes
        self.out_shape, self.out_sf_shape = problem.out_shape(), problem.out_sf_shape()

    def compiles_row(self, vec_bytes: int, threads: int, vecs_per_thread: int) -> bool:
        """Whether the register kernel's launch takes a module compiled for
        the row (ExpandTuning.compiled_row): 1 always; 2 where each thread of
        a column chunk holds one access (a chunk of at most ``threads``
        vectors)."""
        if self.tuning.compiled_row == 2:
            chunk_bytes = min(self.row_bytes, threads * vecs_per_thread * vec_bytes)
            return chunk_bytes <= threads * vec_bytes
        return self.tuning.compiled_row == 1

    def sf_pass(self, vec_bytes: int, zero_kernel: bool = False) -> int:
        """SF_PASS_*: the scale factors that the SF pass blocks write by
        position (column-major SF, 16-byte rows, sm_90+, calls with tokens;
        where it was measured); beside the zero kernel only with
        ``tuning.sf_pass_beside_zero_kernel``. Without ``pos_to_token`` the
        pass only writes zeros: only where the shapes say some rows are
        padding (X > T*K; a tightly packed call would pay for pass blocks with
        nothing to zero but pad columns). Beside the gather kernel
        (``gathers``), whose rows carry no column-major SF, every one."""
        if self.gathers(vec_bytes):
            return SF_PASS_ALL if self.sf_mode == SF_COL_MAJOR else SF_PASS_NONE
        tuning = self.tuning
        if not (tuning.sf_by_position and self.sf_mode == SF_COL_MAJOR and vec_bytes == 16
                and self.problem.num_tokens > 0 and device_traits(self.device).major >= 9
                and (tuning.sf_pass_beside_zero_kernel or not zero_kernel)):
            return SF_PASS_NONE
        if self.with_pos_to_token:
            return SF_PASS_ALL
        padded = self.problem.num_expanded > self.problem.num_tokens * self.problem.top_k
        return SF_PASS_ZEROS if self.zero_padding and padded else SF_PASS_NONE

    def gathers(self, vec_bytes: int) -> bool:
        """Whether the output is written by position (expand_to_fused_gather):
        calls that pass ``pos_to_token``, 16-byte accesses, ``x`` smaller than
        ``tuning.gather_x_bytes_below``; not where the rows kernel writes by
        position (``rows_by_position``)."""
        return (self.with_pos_to_token and vec_bytes == 16
                and self.problem.num_tokens * self.row_bytes < self.tuning.gather_x_bytes_below
                and not self.rows_by_position(vec_bytes))

    def _fits_rows_kernel(self, vec_bytes: int, tokens_below: float,
                          sf_modes: tuple[int, ...] = (SF_NONE,)) -> bool:
        """Scale factors of ``sf_modes`` (by default none), 16-byte accesses,
        rows of at most 16 KiB and ``1 <= T < tokens_below``."""
        return (self.sf_mode in sf_modes and vec_bytes == 16
                and self.row_bytes <= ROWS_KERNEL_MAX_ROW_BYTES
                and 1 <= self.problem.num_tokens < tokens_below)

    def rows_by_position(self, vec_bytes: int) -> bool:
        """Whether the rows kernel writes the call by position, a block a row
        (with its row-major scale factors, if any): calls that pass
        ``pos_to_token``, without scale factors or with row-major ones, that
        fit the rows kernel with ``T < tuning.rows_by_position_tokens_below``
        and an output (X rows of data) of fewer than
        ``tuning.rows_by_position_bytes_below`` bytes."""
        return (self.with_pos_to_token
                and self.problem.num_expanded * self.row_bytes
                < self.tuning.rows_by_position_bytes_below
                and self._fits_rows_kernel(vec_bytes, self.tuning.rows_by_position_tokens_below,
                                           (SF_NONE, SF_ROW_MAJOR)))

    def long_rows(self, vec_bytes: int) -> bool:
        """Whether the call's long rows take the rows kernel with token blocks
        of their own layout: no scale factors, rows longer than
        ``tuning.long_rows_row_bytes_above`` that fit the rows kernel, an
        output (X rows of data) of fewer than ``tuning.long_rows_bytes_below``
        bytes, ``tuning.long_rows_tokens_from <= T < tuning.long_rows_tokens_below``;
        not where the rows kernel writes by position (``rows_by_position``)
        or takes the call under ``tuning.rows_kernel_tokens_below``, which
        sets its own layout."""
        tuning = self.tuning
        return (self.row_bytes > tuning.long_rows_row_bytes_above
                and self.problem.num_expanded * self.row_bytes < tuning.long_rows_bytes_below
                and self.problem.num_tokens >= tuning.long_rows_tokens_from
                and self._fits_rows_kernel(vec_bytes, tuning.long_rows_tokens_below)
                and not self._fits_rows_kernel(vec_bytes, tuning.rows_kernel_tokens_below)
                and not self.rows_by_position(vec_bytes))

    def takes_rows_kernel(self, vec_bytes: int) -> bool:
        """Whether the call takes the lean rows kernel (expand_to_fused_rows):
        by position (``rows_by_position``), or with token blocks: long rows at
        medium batches (``long_rows``), or no scale factors, 16-byte accesses,
        rows of at most 16 KiB, ``1 <= T < tuning.rows_kernel_tokens_below``;
        token blocks not where the call gathers (``gathers``); a grid of at
        most 2^31 - 1 blocks either way."""
        by_position = self.rows_by_position(vec_bytes)
        if not (by_position or (
                (self.long_rows(vec_bytes)
                 or self._fits_rows_kernel(vec_bytes, self.tuning.rows_kernel_tokens_below))
                and not self.gathers(vec_bytes))):
            return False
        return self._rows_grid(by_position, self.long_rows(vec_bytes))[0] <= MAX_GRID_X

    def _rows_grid(self, by_position: bool, long_rows: bool) -> tuple[int, int, int]:
        """(blocks, token blocks, slots a token block) of expand_to_fused_rows:
        by position, X blocks and no token blocks; long rows
        (``long_rows``), token blocks of ``tuning.long_rows_slot_group``
        slots."""
        problem, tuning = self.problem, self.tuning
        if by_position:
            return problem.num_expanded, 0, 0
        group = tuning.long_rows_slot_group if long_rows else tuning.rows_kernel_slot_group
        slots = (1 if problem.num_tokens < tuning.rows_kernel_slot_blocks_below
                 else min(problem.top_k, int(group) or problem.top_k))
        token_blocks = problem.num_tokens * ceil_div(problem.top_k, slots)
        return token_blocks + problem.num_expanded - self.first_zero_row, token_blocks, slots

    def rows_threads(self, by_position: bool, long_rows: bool = False) -> int:
        """Threads a block of expand_to_fused_rows: by position, rows of at
        most ``tuning.rows_by_position_narrow_row_bytes`` without scale
        factors take ``tuning.rows_by_position_narrow_threads`` (unless 0);
        long rows (``long_rows``) ``tuning.long_rows_threads``; else
        ``tuning.rows_kernel_threads``."""
        tuning = self.tuning
        if (by_position and tuning.rows_by_position_narrow_threads and self.sf_mode == SF_NONE
                and self.row_bytes <= tuning.rows_by_position_narrow_row_bytes):
            return int(tuning.rows_by_position_narrow_threads)
        if long_rows:
            return int(tuning.long_rows_threads)
        return int(tuning.rows_kernel_threads)

    def _rows_launch(self, by_position: bool, long_rows: bool) -> ExpandLaunch:
        """expand_to_fused_rows: token blocks of ``_rows_grid``'s slots, then a
        block a row from ``first_zero_row``; or by position, a block a row."""
        blocks, token_blocks, slots = self._rows_grid(by_position, long_rows)
        threads = self.rows_threads(by_position, long_rows)
        # vectors a thread holds: the call's row (fitted), else room for the
        # longest row (the kernel's own default)
        unroll = ((("EXPAND_ROWS_UNROLL", ceil_div(self.row_bytes // 16, threads)),)
                  if self.tuning.rows_kernel_fitted_unroll else ())
        defines = (*kernel_defines(self.sf_mode, self.tuning, "expand_to_fused_rows"),
                   ("EXPAND_ROWS_THREADS", threads), *unroll,
                   *((("EXPAND_ROWS_BY_POSITION", 1),) if by_position else ()))
        handle = function_handle(SOURCE, defines, self.device, "expand_to_fused_rows")
        fields = self._fields(slots_per_block=slots,
                              first_zero_row=0 if by_position else self.first_zero_row,
                              token_blocks=token_blocks)
        return ExpandLaunch("expand_to_fused_rows", handle, (blocks, 1, 1), threads, 0,
                            ArgBlock(EXPAND_ARGS, EXPAND_ARGS.constants(**fields),
                                     bind_context=True))

    def zero_rows_end(self, sf_pass: int) -> int:
        """End of the rows the zero-fill blocks walk: the X data rows, then the
        column-major SF's pad columns X .. align(X, 4) (unless the SF pass
        zeroes those)."""
        if self.sf_mode == SF_COL_MAJOR and sf_pass == SF_PASS_NONE:
            return self.problem.sf_leading_dim
        return self.problem.num_expanded

    def kernel(self, vec_bytes: int) -> ExpandLaunch:
        found = self.kernels.get(vec_bytes)
        if found is None:
            found = self.kernels[vec_bytes] = self._shape_grid(vec_bytes)
        return found

    def _shape_grid(self, vec_bytes: int) -> ExpandLaunch:
        """Kernel, chunk size and slot split for this access width.

        Large batches of 16-byte rows on sm_90+: the bulk-copy kernel, rows
        cut into the fewest equal chunks that make ``bulk_target_blocks``
        blocks (prefill moves whole rows, medium batches quarter rows). Else
        the register kernel: the biggest chunks, all K slots per block; when
        the tokens' chunks are too few to fill the chip, chunks shrink to one
        access per thread and then each block takes one slot. Padding-heavy
        shapes (ExpandTuning says which) take the register kernel unless its
        chunks would shrink, and from ``padding_whole_chunks_from`` token
        chunks keep them whole (one launch). Calls that pass ``pos_to_token`` with a small
        ``x`` may instead write the output by position (``gathers``), and calls
        of few tokens without scale factors (by position, with row-major
        ones too) take the lean rows kernel
        (``takes_rows_kernel``).
        """
        if self.gathers(vec_bytes):
            return self._gather_launch()
        if self.takes_rows_kernel(vec_bytes):
            return self._rows_launch(self.rows_by_position(vec_bytes), self.long_rows(vec_bytes))
        tuning, problem = self.tuning, self.problem
        n_vec = self.row_bytes // vec_bytes
        num_tokens = problem.num_tokens
        traits = device_traits(self.device)
        multiprocessors, major = traits.multiprocessors, traits.major
        # register kernel: the biggest chunks, unless the tokens' chunks are too
        # few to fill the chip
        threads, vecs_per_thread = tuning.threads, tuning.unroll
        chunks = ceil_div(n_vec, threads * vecs_per_thread)
        # padding rows, at least (slots may be dropped): X - T*K of X
        padding_share = (1 - problem.num_tokens * problem.top_k / problem.num_expanded
                         if problem.num_expanded else 0.0)
        routed_bytes = num_tokens * problem.top_k * self.row_bytes
        padding_heavy = padding_share >= (
            tuning.padding_share_registers if routed_bytes >= tuning.medium_copy_bytes
            else min(tuning.padding_share_registers, tuning.medium_padding_share_registers))
        # padding-heavy plans of enough token chunks keep them whole, all K
        # slots a block (ExpandTuning.padding_whole_chunks_from): one
        # register-kernel launch
        whole_chunks = padding_heavy and num_tokens * chunks >= tuning.padding_whole_chunks_from
        shrink = (not whole_chunks
                  and num_tokens * chunks < tuning.shrink_chunks_below * multiprocessors)
        # padding rows by a kernel of their own beside the copies (16-byte rows
        # and output, sm_90+, a copy kernel to overlap: expand.cu's
        # expand_zero_padding_rows)
        zero_bytes = (problem.num_expanded - num_tokens * problem.top_k) * self.row_bytes
        zero_kernel = (vec_bytes == 16 and major >= 9 and padding_heavy and num_tokens > 0
                       and self.zero_padding and zero_bytes >= tuning.zero_kernel_from_bytes
                       and (shrink or tuning.zero_kernel_beside_registers))
        if (vec_bytes == 16 and major >= 9 and problem.top_k <= BULK_THREADS
                and not (padding_heavy and not shrink)):
            # chunks per row: enough to stay under the maximum size, at most
            # what the minimum size allows
            max_chunk = min(int(tuning.bulk_max_chunk_bytes), BULK_SHARED_LIMIT)
            fewest = ceil_div(self.row_bytes, max_chunk)
            min_chunk = (tuning.padding_bulk_min_chunk_bytes if padding_heavy
                         else tuning.bulk_min_chunk_bytes)
            most = max(fewest, self.row_bytes // int(min_chunk))
            if padding_heavy and num_tokens * most < tuning.bulk_min_blocks * multiprocessors:
                # too few copy blocks even so: shorter chunks before the
                # register kernel (instruction-bound on padding-heavy plans)
                most = max(fewest, self.row_bytes // int(tuning.padding_bulk_least_chunk_bytes))
            if num_tokens > 0 and num_tokens * most >= tuning.bulk_min_blocks * multiprocessors:
                wanted = ceil_div(int(tuning.bulk_target_blocks * multiprocessors), num_tokens)
                chunks = min(max(wanted, fewest), most)
                # equal chunks of whole warps' accesses (the last may be shorter)
                lane_vecs = ceil_div(n_vec, chunks * BULK_THREADS)
                whole_rows = (self.row_bytes >= tuning.bulk_whole_row_zero_from
                              or (padding_heavy and tuning.padding_zero_whole_rows))
                stage_bytes = lane_vecs * BULK_THREADS * 16
                zero_rows = tuning.zero_rows_bulk_whole if whole_rows else tuning.zero_rows_bulk
                plain = whole_rows and tuning.bulk_zero_rows_plain
                if whole_rows and padding_heavy and not zero_kernel:
                    zero_rows = tuning.padding_zero_rows_bulk_whole
                    if not plain:
                        # zero-fill blocks store their rows in pieces of the
                        # whole stage: make it large enough for memset-speed
                        # bulk stores
                        stage_bytes = max(stage_bytes, min(
                            int(tuning.padding_zero_stage_bytes), BULK_SHARED_LIMIT,
                            ceil_div(self.row_bytes, 16) * 16))
                return self._launch(
                    "expand_to_fused_bulk_zero_rows_plain" if plain else
                    "expand_to_fused_bulk_zero_rows" if whole_rows else "expand_to_fused_bulk",
                    vec_bytes, BULK_THREADS, lane_vecs, problem.top_k, stage_bytes, zero_rows,
                    zero_whole_rows=whole_rows, zero_kernel=zero_kernel)
        if shrink:
            vecs_per_thread = 1
            chunks = ceil_div(n_vec, threads)
        split = (not whole_chunks
                 and num_tokens * chunks < tuning.split_slots_below * multiprocessors)
        # a zero-fill block zeroes its rows' column chunk: rows enough for
        # about zero_block_bytes_registers
        chunk_bytes = min(self.row_bytes, threads * vecs_per_thread * vec_bytes)
        zero_rows = min(32, max(int(tuning.zero_rows_registers),
                                ceil_div(int(tuning.zero_block_bytes_registers), chunk_bytes)))
        return self._launch(f"expand_to_fused_v{vec_bytes}", vec_bytes, threads, vecs_per_thread,
                            1 if split else problem.top_k, 0, zero_rows, zero_kernel=zero_kernel)

    def _launch(self, kernel: str, vec_bytes: int, threads: int, vecs_per_thread: int,
                slots_per_block: int, shared_bytes: int, rows_per_zero_block: int,
                zero_whole_rows: bool = False, zero_kernel: bool = False) -> ExpandLaunch:
        """The copy kernel's launch; with ``zero_kernel``, its *_overlapped twin
        (token blocks only, letting the next kernel start at once) and the
        padding rows left to expand_zero_padding_rows, which overlaps it. With
        an SF pass, the copy kernel's grid starts with the pass blocks (a
        thread a row), or, beside the zero kernel, that kernel's grid ends with
        them (the zero kernel starts once every copy block has: pass blocks in
        the copy kernel delayed it)."""
        problem = self.problem
        sf_pass = self.sf_pass(vec_bytes, zero_kernel)
        zero_rows_end = self.zero_rows_end(sf_pass)
        if zero_kernel:
            kernel = ("expand_to_fused_bulk_overlapped" if kernel.startswith("expand_to_fused_bulk")
                      else f"{kernel}_overlapped")
        chunk_bytes = threads * vecs_per_thread * vec_bytes
        chunks = ceil_div(self.row_bytes, chunk_bytes)
        if chunks > MAX_GRID_Y:
            raise ValueError(f"x rows of {self.row_bytes} bytes are too long for one launch "
                             f"(at most {MAX_GRID_Y * chunk_bytes} bytes)")
        defines = kernel_defines(self.sf_mode, self.tuning, kernel)
        if kernel.startswith("expand_to_fused_v") and self.compiles_row(vec_bytes, threads,
                                                                        vecs_per_thread):
            # the register kernel compiled for this row (expand.cu's
            # EXPAND_ROW_BYTES): its module serves this launch only
            defines += (("EXPAND_ROW_BYTES", self.row_bytes),
                        ("EXPAND_VECS_PER_THREAD", int(vecs_per_thread)))
        handle = function_handle(SOURCE, defines, self.device, kernel)
        # zero-fill blocks are numbered across the z planes (the kernel's
        # rows_to_zero); whole-row ones across the y planes too
        planes = ceil_div(problem.top_k, slots_per_block)
        zero_blocks = 0 if zero_kernel else ceil_div(zero_rows_end - self.first_zero_row,
                                                     rows_per_zero_block)
        spread = planes * chunks if zero_whole_rows else planes
        sf_pass_blocks = (0 if sf_pass == SF_PASS_NONE or zero_kernel
                          else ceil_div(problem.sf_leading_dim, threads))
        grid = (sf_pass_blocks + problem.num_tokens + ceil_div(zero_blocks, spread), chunks,
                planes)
        fields = self._fields(
            rows_per_zero_block=int(rows_per_zero_block), vecs_per_thread=int(vecs_per_thread),
            slots_per_block=int(slots_per_block), first_zero_row=self.first_zero_row,
            sf_pass=sf_pass, sf_pass_blocks=sf_pass_blocks)
        zero_launch = self._zero_launch(fields, zero_rows_end) if zero_kernel else None
        return ExpandLaunch(kernel, handle, grid, threads, shared_bytes,
                            ArgBlock(EXPAND_ARGS, EXPAND_ARGS.constants(**fields),
                                     bind_context=True), zero_launch)

    def _fields(self, **launch_fields: int) -> dict[str, int]:
        """The argument block's constant fields: the problem's, then
        ``launch_fields`` (the launch's own; 0 for those it leaves out)."""
        problem = self.problem
        return dict(
            row_bytes=self.row_bytes, num_tokens=problem.num_tokens, top_k=problem.top_k,
            num_expanded=problem.num_expanded, sf_columns=problem.sf_columns,
            sf_ld=problem.sf_leading_dim, zero_padding=int(self.zero_padding),
            **{**dict.fromkeys(_LAUNCH_FIELDS, 0), **launch_fields})

    def _gather_launch(self) -> ExpandLaunch:
        """expand_to_fused_gather: blocks of ``tuning.gather_rows`` output rows,
        after the SF pass blocks (column-major SF: every scale factor, by
        ``pos_to_token``; a thread a row)."""
        tuning, problem = self.tuning, self.problem
        threads, rows = int(tuning.threads), int(tuning.gather_rows)
        sf_pass = self.sf_pass(16)
        sf_pass_blocks = ceil_div(problem.sf_leading_dim, threads) if sf_pass else 0
        handle = function_handle(SOURCE,
                                 kernel_defines(self.sf_mode, tuning, "expand_to_fused_gather"),
                                 self.device, "expand_to_fused_gather")
        fields = self._fields(sf_pass=sf_pass, sf_pass_blocks=sf_pass_blocks,
                              rows_per_gather_block=rows)
        return ExpandLaunch("expand_to_fused_gather", handle,
                            (sf_pass_blocks + ceil_div(problem.num_expanded, rows), 1, 1),
                            threads, 0, ArgBlock(EXPAND_ARGS, EXPAND_ARGS.constants(**fields),
                                                 bind_context=True))

    def _zero_launch(self, fields: dict[str, int], zero_rows_end: int) -> ExpandLaunch:
        """expand_zero_padding_rows: blocks of ``tuning.threads`` threads, each
        whole rows of about ``zero_block_bytes_registers`` (1 .. 32 rows);
        then, with an SF pass (``fields["sf_pass"]``), the pass blocks, a
        thread a row."""
        tuning = self.tuning
        rows = min(32, max(1, int(tuning.zero_block_bytes_registers) // self.row_bytes))
        row_blocks = ceil_div(zero_rows_end - self.first_zero_row, rows)
        pass_blocks = (0 if fields["sf_pass"] == SF_PASS_NONE
                       else ceil_div(self.problem.sf_leading_dim, int(tuning.threads)))
        handle = function_handle(SOURCE,
                                 kernel_defines(self.sf_mode, tuning, "expand_zero_padding_rows"),
                                 self.device, "expand_zero_padding_rows")
        constants = EXPAND_ARGS.constants(**{**fields, "rows_per_zero_block": rows,
                                             "zero_row_blocks": row_blocks})
        return ExpandLaunch("expand_zero_padding_rows", handle, (row_blocks + pass_blocks, 1, 1),
                            int(tuning.threads), 0,
                            ArgBlock(EXPAND_ARGS, constants, bind_context=True))

    def launch(self, stream: int, x: int, token_topk_to_pos: int, pos_to_expert: int,
               out: int, x_sf: int, out_sf: int, pos_to_token: int = 0) -> None:
        """Launch on ``stream``; ``pos_to_token`` (an [X] int32 pointer) is
        required when the plan was made ``with_pos_to_token``."""
        # Widest access (16, 8, 4, 2, 1 bytes) dividing the row and both bases.
        bits = self.row_bytes | 16 | x | out
        kernel = self.kernels.get(bits & -bits) or self.kernel(bits & -bits)
        if kernel.grid_x == 0:  # no tokens and no rows to zero
            return
        # written out, not through runtime.launch: this runs on every eager call
        block = kernel.args
        _pack_pointers(block.buffer, 0, x, token_topk_to_pos, pos_to_expert, out, x_sf, out_sf,
                       pos_to_token)
        driver.launchKernel(kernel.handle, kernel.grid_x, kernel.grid_y, kernel.grid_z,
                            kernel.threads, 1, 1, kernel.shared_bytes, stream,
                            block.params_address, 0)
        zero = kernel.zero_launch
        if zero is not None:  # right after the copy kernel, which lets it start
            block = zero.args
            _pack_pointers(block.buffer, 0, x, token_topk_to_pos, pos_to_expert, out, x_sf,
                           out_sf, pos_to_token)
            launch_overlapping_previous(zero.handle, zero.grid_x, zero.threads, 0, stream,
                                        block.params_address)


_plans = BoundedCache()


def plan_for(problem: ExpandProblem, item_bytes: int, device: int,
             tuning: ExpandTuning, *, zero_padding: bool = True,
             with_pos_to_token: bool = False) -> ExpandPlan:
    key = (problem, item_bytes, device, tuning, zero_padding, with_pos_to_token)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, ExpandPlan(problem, item_bytes, device, tuning,
                                          zero_padding=zero_padding,
                                          with_pos_to_token=with_pos_to_token))
    return plan
