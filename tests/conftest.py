"""Shared fixtures. GPU-only tests mark and skip themselves (marker ``gpu``)."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from cupy_moe.expand.tuning import ExpandTuning
from helpers import GivenPosToToken


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's id: reruns draw the same bits."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# Tunings that force one kernel (the bulk ones wherever the device and the
# row's alignment allow them) whatever the batch size; None is the public op
# with the default tuning (and, for torch, its fast path).
KERNEL_PATHS = {
    "public": None,
    # (padding_share_registers=inf: padding-heavy shapes too)
    "bulk": ExpandTuning(bulk_min_blocks=0.0, padding_share_registers=math.inf,
                         medium_padding_share_registers=math.inf,
                         bulk_whole_row_zero_from=math.inf),
    # whole-row zero-fill blocks on every row length, rows cut into 512-byte
    # chunks so that even short test rows span several y planes
    "bulk-zero-rows": ExpandTuning(bulk_min_blocks=0.0, padding_share_registers=math.inf,
                                   medium_padding_share_registers=math.inf,
                                   bulk_whole_row_zero_from=0, bulk_min_chunk_bytes=512,
                                   bulk_zero_rows_plain=0),
    "registers": ExpandTuning(bulk_min_blocks=math.inf),
    # the register kernel compiled for each call's row (EXPAND_ROW_BYTES)
    "registers-compiled-row": ExpandTuning(bulk_min_blocks=math.inf, compiled_row=1),
    # zero-fill blocks of 32 rows, by runs of rows where a row is one chunk
    "registers-zero-runs": ExpandTuning(bulk_min_blocks=math.inf, zero_fill_runs=1,
                                        zero_rows_registers=32),
    # every shape padding-heavy and on the bulk kernel (chunks always shrink):
    # zero-fill blocks of whole rows in 2 KiB bulk stores of a stage larger
    # than the 512-byte copy chunks
    "bulk-zero-stage": ExpandTuning(bulk_min_blocks=0.0, padding_share_registers=0.0,
                                    padding_whole_chunks_from=math.inf,
                                    shrink_chunks_below=math.inf,
                                    padding_bulk_min_chunk_bytes=512, padding_zero_whole_rows=1,
                                    padding_zero_stage_bytes=2048, bulk_zero_rows_plain=0),
    # the bulk kernel on every call, zero-fill blocks of whole rows on every
    # row length by 16-byte stores (no stage), 512-byte copy chunks
    "bulk-zero-plain": ExpandTuning(bulk_min_blocks=0.0, padding_share_registers=math.inf,
                                    medium_padding_share_registers=math.inf,
                                    bulk_whole_row_zero_from=0, bulk_min_chunk_bytes=512,
                                    bulk_zero_rows_plain=1),
    # every call with tokens padding-heavy, its padding rows zeroed by
    # expand_zero_padding_rows beside the copy kernel (16-byte rows, sm_90+;
    # chunks as before padding_whole_chunks_from: small batches' copies by
    # the bulk kernel)
    "zero-kernel": ExpandTuning(padding_share_registers=0.0, padding_whole_chunks_from=math.inf,
                                zero_kernel_from_bytes=0, zero_kernel_beside_registers=1,
                                sf_pass_beside_zero_kernel=0),
    # column-major scale factors (16-byte rows, sm_90+): by default the copy
    # kernel's SF pass blocks zero them (every one where the call passes
    # pos_to_token: "given-tokens"), beside the zero kernel as its last blocks
    # ("zero-kernel-sf-pass"; "zero-kernel": by its row blocks); "sf-in-line":
    # the token and zero-fill blocks move and zero them
    "sf-in-line": ExpandTuning(sf_by_position=0),
    "given-tokens": GivenPosToToken(ExpandTuning()),
    "zero-kernel-sf-pass": ExpandTuning(
        padding_share_registers=0.0, padding_whole_chunks_from=math.inf, zero_kernel_from_bytes=0,
        zero_kernel_beside_registers=1, sf_pass_beside_zero_kernel=1),
    "zero-kernel-sf-pass-given-tokens": GivenPosToToken(ExpandTuning(
        padding_share_registers=0.0, padding_whole_chunks_from=math.inf, zero_kernel_from_bytes=0,
        zero_kernel_beside_registers=1, sf_pass_beside_zero_kernel=1,
        rows_by_position_tokens_below=0)),
    # rows by position (expand_to_fused_gather) on every call given pos_to_token
    # with 16-byte rows and bases; 40 rows a block: 5 a warp, a short last block
    # (rows by position off: it comes first where it is on)
    "gather": GivenPosToToken(ExpandTuning(gather_x_bytes_below=math.inf, gather_rows=40,
                                           rows_by_position_tokens_below=0)),
    # the lean rows kernel (expand_to_fused_rows) on every call without scale
    # factors, 16-byte rows and bases and tokens: token blocks of all K slots;
    # and of one slot each at 64 threads (16 vectors a thread)
    "rows": ExpandTuning(rows_kernel_tokens_below=math.inf),
    "rows-by-slot": ExpandTuning(rows_kernel_tokens_below=math.inf,
                                 rows_kernel_slot_blocks_below=math.inf, rows_kernel_threads=64),
    # ... token blocks of 3 slots (the last group of a token shorter)
    "rows-groups-of-3": ExpandTuning(rows_kernel_tokens_below=math.inf, rows_kernel_slot_group=3),
    # ... the long rows' layout (128 threads, token blocks of 4 slots) on every
    # such call, whatever its rows, tokens and output
    "rows-long": ExpandTuning(long_rows_tokens_from=1, long_rows_tokens_below=math.inf,
                              long_rows_row_bytes_above=0, long_rows_bytes_below=math.inf),
    # ... by position on every call given pos_to_token: a block a row
    "rows-by-position": GivenPosToToken(ExpandTuning(rows_by_position_tokens_below=math.inf,
                                                     rows_by_position_bytes_below=math.inf)),
}


@pytest.fixture(params=sorted(KERNEL_PATHS))
def kernel_path(request):
    """The tuning of one kernel path (None: the public op)."""
    return KERNEL_PATHS[request.param]
