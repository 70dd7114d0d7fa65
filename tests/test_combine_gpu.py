"""``reduce_fused`` on the GPU (marker ``gpu``): bit for bit against the NumPy
oracle on fresh random cases (any H, odd ones too, every dtype, CuPy and
torch, NaN/inf/denormal inputs, dropped and out-of-range slots, misaligned
views), every launch shape, out=, streams, CUDA-graph capture, validate=True
and the GPU-only argument rules.

Outputs are poisoned before every run: a caller's ``out`` holds random bits,
and a fresh output is allocated where a freed block of garbage lay.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from combine_cases import (
    SCALE_OPTIONS,
    VALUE_KINDS,
    random_case,
    random_values,
    storage_dtype,
)
from gpu_cases import GPU_MARKS, KINDS, cupy, needs_torch_cuda, torch
from helpers import assert_bits_equal

from cupy_moe.combine import reduce_fused, reduce_fused_numpy
from cupy_moe.combine.api import run_with_shape

pytestmark = GPU_MARKS

# Dtypes each kind carries natively: CuPy has no bfloat16 (uint16 holds its
# bits), torch has no arithmetic on uint16.
DEVICE_DTYPES = {"cupy": ["uint16", "float16", "float32"],
                 "torch": ["bfloat16", "float16", "float32"]}
_BF16 = np.dtype(ml_dtypes.bfloat16)


# -- moving bits -----------------------------------------------------------------------

def to_device(kind: str, array, *, offset: int = 0):
    """A device copy of ``array``'s bits (None stays None), typed for ``kind``,
    starting ``offset`` elements into its allocation (a misaligned view)."""
    if array is None:
        return None
    array = np.ascontiguousarray(array)
    carrier = np.dtype(np.int16) if array.dtype == _BF16 else array.dtype
    flat = np.concatenate([np.zeros(offset, dtype=carrier), array.reshape(-1).view(carrier)])
    if kind == "torch":
        device = torch.from_numpy(flat).cuda()
        if array.dtype == _BF16:
            device = device.view(torch.bfloat16)
        return device[offset:].view(array.shape)
    device = cupy.asarray(flat.view(np.uint16) if array.dtype == _BF16 else flat)
    return device[offset:].reshape(array.shape)


def to_host_bits(kind: str, array) -> np.ndarray:
    """The bits of a device array as unsigned ints (same shape)."""
    if kind == "torch":
        size = array.element_size()
        carrier = {2: torch.int16, 4: torch.int32}[size]
        return array.contiguous().view(carrier).cpu().numpy().view(f"u{size}")
    host = cupy.asnumpy(array)
    return host.view(f"u{host.itemsize}")


def bits_of(array: np.ndarray) -> np.ndarray:
    return array.view(f"u{array.itemsize}")


def poison_allocator(kind: str, nbytes: int) -> None:
    """Leave a block of garbage where the next allocation of this size will
    likely land (both libraries cache freed blocks), so that an unwritten
    output element would show."""
    if nbytes == 0:
        return
    if kind == "torch":
        block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        block.fill_(0x7F)  # bf16/fp16 0x7F7F, f32 0x7F7F7F7F: large finite values
    else:
        block = cupy.empty(nbytes, dtype=cupy.uint8)
        block.fill(0x7F)
    del block


def check_result_kind(kind: str, result, dtype: str, shape) -> None:
    assert tuple(result.shape) == tuple(shape)
    if kind == "torch":
        assert isinstance(result, torch.Tensor) and result.is_cuda
        assert result.dtype == getattr(torch, dtype)
    else:
        assert isinstance(result, cupy.ndarray)
        assert result.dtype == storage_dtype(dtype)


def run_case(kind: str, case: dict, rng, *, use_out: bool, expanded_offset: int = 0,
             out_offset: int = 0, shape_options: dict | None = None,
             expected: np.ndarray | None = None, out_float32: bool = False) -> None:
    """One call on the device against the oracle (``expected``, if the caller
    has it already), bit for bit. ``out_float32``: a float32 ``out`` (the
    unrounded sums of a bf16 / fp16 call)."""
    dtype = "uint16" if case["expanded"].dtype == np.uint16 else case["expanded"].dtype.name
    if out_float32:
        assert use_out
        dtype = "float32"
        if expected is None:
            expected = reduce_fused_numpy(
                **case, out=np.empty(case["token_topk_to_pos"].shape[:1] +
                                     case["expanded"].shape[1:], np.float32))
    if expected is None:
        expected = reduce_fused_numpy(**case)
    args = {name: to_device(kind, a) for name, a in case.items() if name != "expanded"}
    args["expanded"] = to_device(kind, case["expanded"], offset=expanded_offset)
    out = None
    if use_out:
        out = to_device(kind, random_values(rng, expected.shape, dtype, "bits"),
                        offset=out_offset)
    else:
        poison_allocator(kind, expected.nbytes)
    call = reduce_fused if shape_options is None else (
        lambda *a, **k: run_with_shape(*a, **k, **shape_options))
    result = call(args["expanded"], args["token_topk_to_pos"], args["topk_weights"],
                  row_scale=args["row_scale"], out=out)
    if use_out:
        assert result is out
    check_result_kind(kind, result, dtype, expected.shape)
    assert_bits_equal(to_host_bits(kind, result), bits_of(expected), "reduce_fused")


def describe_case(case: dict) -> str:
    x, m = case["expanded"], case["token_topk_to_pos"]
    return (f"X={x.shape[0]} H={x.shape[1]} T={m.shape[0]} K={m.shape[1]} {x.dtype} "
            f"weights={case['topk_weights'] is not None} "
            f"row_scale={case['row_scale'] is not None}")


# -- random cases --------------------------------------------------------------------------

# T * H * K of a random case, at most: keeps the NumPy oracle's share of the
# test's time small (it costs ~30 ns per element and slot)
ELEMENT_BUDGET = 400_000


def _draw_hidden(rng) -> int:
    r = rng.random()
    if r < 0.3:
        return int(rng.integers(1, 65))
    if r < 0.7:
        return int(rng.integers(65, 2049))
    if r < 0.85:
        return int(rng.integers(2049, 9001))
    return int(rng.choice([2048, 2560, 4096, 5120, 7168, 7169, 8999, 9000]))


def _draw_tokens(rng) -> int:
    r = rng.random()
    if r < 0.05:
        return int(rng.integers(0, 3))
    if r < 0.5:
        return int(rng.integers(1, 65))
    return int(rng.integers(65, 601))


def gpu_random_case(rng, kind: str, index: int) -> dict:
    dtypes = DEVICE_DTYPES[kind]
    hidden, top_k = _draw_hidden(rng), int(rng.integers(1, 11))
    num_tokens = _draw_tokens(rng)
    if num_tokens:
        num_tokens = max(1, min(num_tokens, ELEMENT_BUDGET // (hidden * top_k)))
    weights, row_scale = SCALE_OPTIONS[(index // 12) % 4]
    return random_case(rng, num_tokens=num_tokens, hidden=hidden, top_k=top_k,
                       dtype=dtypes[index % 3], value_kind=VALUE_KINDS[(index // 3) % 4],
                       weights=weights, row_scale=row_scale)


@pytest.mark.parametrize("kind", KINDS)
def test_random_cases_are_bit_exact(kind):
    """600 cases per kind (1200 in all): H 1 .. 9000, T 0 .. 600, K 1 .. 10,
    every dtype, value kind and weights/row_scale combination; a share with
    misaligned views (narrower accesses), a share under other launch shapes
    (a tenth of them bulk layouts, which unaligned rows leave for the plain
    shape)."""
    seed = int(np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    for index in range(600):
        case = gpu_random_case(rng, kind, index)
        options = {"use_out": bool(index % 2)}
        if (options["use_out"] and case["expanded"].dtype.itemsize == 2
                and rng.random() < 0.3):
            options["out_float32"] = True  # the unrounded sums
        if rng.random() < 0.15:
            options["expanded_offset"] = int(rng.integers(1, 8))
        if options["use_out"] and rng.random() < 0.15:
            options["out_offset"] = int(rng.integers(1, 8))
        draw = rng.random()
        if draw < 0.1:
            options["shape_options"] = {"max_warps": int(rng.integers(1, 9)),
                                        "fill_blocks_per_sm": float(rng.choice([0, 1, 64]))}
        elif draw < 0.3:  # a warp walking its token's live slots
            options["shape_options"] = {"vecs_per_thread": int(rng.choice([1, 2, 4])),
                                        "slot_batch": int(rng.choice([2, 4])),
                                        "max_warps": int(rng.integers(1, 9)),
                                        "warp_slots": True,
                                        "warp_tokens": int(rng.choice([1, 2, 4]))}
        elif draw < 0.4:  # a warp streaming the live rows of rounds of 32 // K tokens
            options["shape_options"] = {"vecs_per_thread": int(rng.choice([1, 2, 4])),
                                        "slot_batch": int(rng.choice([2, 4])),
                                        "max_warps": int(rng.integers(1, 9)),
                                        "stream_rounds": int(rng.choice([1, 2, 4]))}
        elif draw < 0.45 and case["token_topk_to_pos"].shape[1] <= 32:
            # a group a token, K compiled in
            options["shape_options"] = {"vecs_per_thread": int(rng.choice([1, 2, 4, 7, 8])),
                                        "max_warps": int(rng.integers(1, 9)),
                                        "token_rows": True}
        elif draw < 0.5:  # a block's live rows landed in shared memory by bulk copies
            options["shape_options"] = {"vecs_per_thread": int(rng.choice([1, 2, 4])),
                                        "max_warps": int(rng.integers(1, 9)),
                                        "bulk_stages": int(rng.choice([2, 4, 8])),
                                        "bulk_rounds": int(rng.choice([1, 2, 4])),
                                        "fill_blocks_per_sm": float(rng.choice([0, 4]))}
        try:
            run_case(kind, case, rng, **options)
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, case {index}: {describe_case(case)} "
                                 f"{options}: {error}") from None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("num_tokens", "hidden", "top_k", "dtype_index"), [
    (256, 7168, 8, 0), (512, 2048, 8, 0), (128, 7168, 6, 2), (1, 7168, 8, 0),
    (16, 7168, 8, 1), (64, 2048, 10, 0), (3, 1, 1, 0), (64, 9000, 17, 0), (200, 4097, 9, 1)])
def test_model_shapes(kind, num_tokens, hidden, top_k, dtype_index):
    """Prefill- and decode-like shapes (smaller T than the benchmarks: the
    oracle runs on the CPU), K beyond one batch of slot loads, odd H."""
    rng = np.random.default_rng()
    dtype = DEVICE_DTYPES[kind][dtype_index]
    for use_out in (False, True):
        case = random_case(rng, num_tokens=num_tokens, hidden=hidden, top_k=top_k, dtype=dtype,
                           value_kind="normal", weights=True, row_scale=use_out)
        run_case(kind, case, rng, use_out=use_out)


@pytest.mark.parametrize("kind", KINDS)
def test_every_launch_shape_gives_the_same_bits(kind):
    rng = np.random.default_rng()
    for hidden in (5, 40, 1000, 7168):
        case = random_case(rng, num_tokens=37, hidden=hidden, top_k=9,
                           dtype=DEVICE_DTYPES[kind][0], value_kind="specials", weights=True,
                           row_scale=True)
        expected = reduce_fused_numpy(**case)
        for max_warps in range(1, 9):
            for fill in (0.0, 1.0, 4.0, 1000.0):
                run_case(kind, case, rng, use_out=True, expected=expected,
                         shape_options={"max_warps": max_warps, "fill_blocks_per_sm": fill,
                                        "vecs_per_thread": (1, 2, 4)[(max_warps + int(fill))
                                                                     % 3],
                                        "slot_batch": (2, 4, 8, 16)[max_warps % 4],
                                        "warp_slots": bool(max_warps % 2),
                                        "warp_tokens": (1, 2, 1, 4)[max_warps % 4],
                                        "stream_rounds": (0, 0, 1, 0, 2, 0, 4, 0)[
                                            max_warps - 1]})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("num_tokens", "trim", "hidden", "layout"), [
    (2048, True, 2048, (False, 0, 8)), (2048, False, 2048, (False, 0, 8)),
    (300, True, 2048, (False, 0, 8)), (100, True, 2048, (False, 0, 0)),
    (2048, True, 5120, (False, 1, 0)), (4096, True, 5120, (False, 1, 0)),
    (2048, False, 5120, (True, 0, 0)), (300, True, 5120, (True, 0, 0))])
def test_expert_parallel_plans(kind, num_tokens, trim, hidden, layout):
    """A rank's plan of 32 of 256 experts (seven slots in eight dropped), as
    fused_mapping builds it, under the default launch shape, which ``layout``
    names as (warp_slots, stream_rounds, token_rows). Rows that groups of 128
    threads fill (2048 16-bit columns: 2 vectors a thread) take token_rows
    where the grid fills the chip (T = 300: rows cut in 2 chunks), the
    default shape below that (T = 100). Rows they do not fill (5120: 640
    vectors): trimmed at T = 2048 and 4096, X says most slots are dropped
    (sparse_slots) and a warp streams the live rows of 4 tokens; untrimmed
    (the worst-case X), or at T = 300 where the padding makes X exceed the
    slots, the many-token shape, whose warps walk the live slots. Bit-exact
    each time."""
    from cupy_moe.combine import gpu as combine_gpu
    from cupy_moe.mapping.reference import fused_mapping_numpy, worst_case_rows

    rng = np.random.default_rng()
    top_k = 8
    ids = rng.integers(0, 256, (num_tokens, top_k)).astype(np.int32)
    num_expanded = (None if trim
                    else worst_case_rows(num_tokens * top_k, 32, 128))  # fused_mapping's X
    plan = fused_mapping_numpy(ids, 32, alignment=128, num_expanded=num_expanded)
    token_topk_to_pos = plan.token_topk_to_pos
    num_expanded = plan.pos_to_expert.shape[0]
    # sparse_slots: X at most half of the slots where trimmed (with many tokens)
    assert (2 * num_expanded <= num_tokens * top_k) == (trim and num_tokens >= 2048)
    case = {"expanded": random_values(rng, (num_expanded, hidden), DEVICE_DTYPES[kind][0],
                                      "normal"),
            "token_topk_to_pos": token_topk_to_pos,
            "topk_weights": rng.random((num_tokens, top_k), dtype=np.float32),
            "row_scale": None}
    run_case(kind, case, rng, use_out=False)
    shapes = [launch.shape for plan in combine_gpu._plans.values()
              for launch in plan.kernels.values()
              if plan.problem.num_tokens == num_tokens
              and plan.problem.num_expanded == num_expanded and plan.problem.hidden == hidden]
    assert {(shape.warp_slots, shape.stream_rounds, shape.token_rows)
            for shape in shapes} == {layout}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("top_k", [31, 32, 33, 40, 64])
def test_warp_slots_beyond_one_warp_of_slots(kind, top_k):
    """warp_slots: a warp's lanes hold 32 slots at a time, so K > 32 takes
    more rounds, in k order; chunks of one warp leave lanes past the row
    (H = 1000 bf16: 125 vectors) that still take part in the shuffles."""
    rng = np.random.default_rng()
    for hidden in (1000, 7168):
        case = random_case(rng, num_tokens=23, hidden=hidden, top_k=top_k,
                           dtype=DEVICE_DTYPES[kind][0], value_kind="normal", weights=True,
                           row_scale=bool(top_k % 2))
        expected = reduce_fused_numpy(**case)
        for vecs, batch, warps, tokens in ((1, 8, 1, 1), (2, 4, 4, 2), (4, 2, 8, 4),
                                           (4, 4, 4, 1)):
            run_case(kind, case, rng, use_out=True, expected=expected,
                     shape_options={"vecs_per_thread": vecs, "slot_batch": batch,
                                    "max_warps": warps, "warp_slots": True,
                                    "warp_tokens": tokens})
        # streamed rounds: a token a round up to K = 32, the warp walk beyond
        for vecs, batch, rounds in ((1, 8, 1), (2, 4, 4)):
            run_case(kind, case, rng, use_out=True, expected=expected,
                     shape_options={"vecs_per_thread": vecs, "slot_batch": batch,
                                    "max_warps": 1, "stream_rounds": rounds})


def _expert_parallel_and_dense_cases(rng, kind: str, top_k: int, num_tokens: int):
    """(case, oracle result) pairs: for every dtype of ``kind`` (H = 7168,
    7000 and 2048), special values, weights, row_scale on odd K, first on a
    rank's plan of 32 of 256 experts (most slots dropped, many tokens with
    none; X is the plan's), then on a dense random map."""
    from cupy_moe.mapping.reference import fused_mapping_numpy

    ids = rng.integers(0, 256, (num_tokens, top_k)).astype(np.int32)
    sparse = fused_mapping_numpy(ids, 32, alignment=128).token_topk_to_pos
    for dtype_index, hidden in ((0, 7168), (1, 7000), (2, 2048)):
        dtype = DEVICE_DTYPES[kind][dtype_index]
        for token_topk_to_pos in (sparse, None):
            case = random_case(rng, num_tokens=num_tokens, hidden=hidden, top_k=top_k,
                               dtype=dtype, value_kind="specials", weights=True,
                               row_scale=bool(top_k % 2))
            if token_topk_to_pos is not None:  # the rank's rows: the plan's X
                num_rows = int(token_topk_to_pos.max()) + 1
                case["token_topk_to_pos"] = token_topk_to_pos
                case["expanded"] = random_values(rng, (num_rows, hidden), dtype, "specials")
                if case["row_scale"] is not None:
                    case["row_scale"] = rng.random(num_rows, dtype=np.float32)
            yield case, reduce_fused_numpy(**case)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("top_k", [1, 3, 8, 33, 64])
def test_bulk_layout_on_expert_parallel_and_dense_plans(kind, top_k):
    """bulk_stages: a block's live rows land in shared memory, 2, 4 or 8 in
    flight; on a rank's plan of 32 of 256 experts (most slots dropped, many
    tokens with none) and on a dense one, every dtype, special values, blocks
    of 1 to 8 warps (K = 33 and 64: blocks of one warp fall back to the warp
    walk), 1 to 4 vectors a thread, partial last chunks (H = 7000 bf16 is 875
    vectors), 1, 2 or 4 rounds of tokens a block."""
    rng = np.random.default_rng()
    # the oracle's time grows with T * K * H
    for case, expected in _expert_parallel_and_dense_cases(rng, kind, top_k,
                                                           300 if top_k <= 8 else 80):
        for vecs, warps, stages, rounds in ((1, 4, 4, 1), (2, 4, 2, 2), (4, 8, 8, 1),
                                            (2, 1, 4, 4), (1, 8, 2, 2)):
            run_case(kind, case, rng, use_out=True, expected=expected,
                     shape_options={"vecs_per_thread": vecs, "max_warps": warps,
                                    "bulk_stages": stages, "bulk_rounds": rounds,
                                    "fill_blocks_per_sm": 0.0})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("top_k", [1, 3, 8, 32])
def test_token_rows_on_expert_parallel_and_dense_plans(kind, top_k):
    """token_rows: a group of threads a token, K compiled in, on a rank's plan
    of 32 of 256 experts (most tokens with one live slot or none) and on a
    dense one, every dtype, special values; full rows (7168 bf16 columns: 7
    vectors x 128 threads; 2048: 2 x 128) and rows whose last vectors lie
    past the row (7000 bf16: 875 vectors; 8 vectors a thread), row_scale on
    odd K."""
    rng = np.random.default_rng()
    for case, expected in _expert_parallel_and_dense_cases(rng, kind, top_k,
                                                           300 if top_k <= 8 else 60):
        for vecs, warps in ((7, 4), (8, 4), (2, 8), (1, 1), (4, 2)):
            run_case(kind, case, rng, use_out=True, expected=expected,
                     shape_options={"vecs_per_thread": vecs, "max_warps": warps,
                                    "token_rows": True, "few_live_load_hint": "nc"})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("top_k", [3, 8])
def test_token_rows_mixes_few_live_and_dense_tokens(kind, top_k):
    """token_rows with the few-live branch on (evict-first loads for the
    call, .nc for a token with at most half its slots live): one rank's plan
    where even tokens route to the rank's 32 experts alone (every slot live)
    and odd ones to any of 256 (about one live slot of K, or none), so that
    neighbouring tokens of a block take either branch; bit-exact, every
    dtype, special values."""
    from cupy_moe.mapping.reference import fused_mapping_numpy

    rng = np.random.default_rng()
    num_tokens = 301
    ids = rng.integers(0, 256, (num_tokens, top_k)).astype(np.int32)
    ids[::2] %= 32
    token_topk_to_pos = fused_mapping_numpy(ids, 32, alignment=128).token_topk_to_pos
    live = (token_topk_to_pos >= 0).sum(axis=1)
    assert (live[::2] == top_k).all() and (2 * live[1::2] <= top_k).mean() > 0.5
    num_rows = int(token_topk_to_pos.max()) + 1
    for dtype_index, hidden in ((0, 7168), (1, 7000), (2, 2048)):
        dtype = DEVICE_DTYPES[kind][dtype_index]
        case = random_case(rng, num_tokens=num_tokens, hidden=hidden, top_k=top_k, dtype=dtype,
                           value_kind="specials", weights=True, row_scale=bool(top_k % 2))
        case.update(token_topk_to_pos=token_topk_to_pos,
                    expanded=random_values(rng, (num_rows, hidden), dtype, "specials"))
        if case["row_scale"] is not None:
            case["row_scale"] = rng.random(num_rows, dtype=np.float32)
        expected = reduce_fused_numpy(**case)
        for vecs, warps in ((7, 4), (8, 4), (2, 8)):
            run_case(kind, case, rng, use_out=True, expected=expected,
                     shape_options={"vecs_per_thread": vecs, "max_warps": warps,
                                    "token_rows": True, "load_hint": "cs",
                                    "few_live_load_hint": "nc"})


# one shape of each kernel family: plain slot batches, a warp walking its
# token's live slots, a warp streaming rounds of tokens, a group a token (K
# compiled in; full rows and not), bulk copies (16-byte rows on sm_90+; other
# rows fall back to the plain shape)
FAMILY_SHAPES = {
    "plain": {"vecs_per_thread": 2, "slot_batch": 4, "max_warps": 3},
    "warp-slots": {"vecs_per_thread": 2, "slot_batch": 2, "max_warps": 2, "warp_slots": True,
                   "warp_tokens": 2},
    "stream": {"vecs_per_thread": 1, "slot_batch": 4, "max_warps": 4, "stream_rounds": 2},
    "token-rows": {"vecs_per_thread": 7, "max_warps": 4, "token_rows": True,
                   "few_live_load_hint": "nc"},
    "token-rows-8": {"vecs_per_thread": 8, "max_warps": 1, "token_rows": True},
    "bulk": {"vecs_per_thread": 2, "max_warps": 4, "bulk_stages": 4, "bulk_rounds": 2},
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", sorted(FAMILY_SHAPES))
def test_float32_out_on_every_kernel_family(kind, family):
    """bf16 / fp16 input into a float32 out (the unrounded sums, stored as
    two accesses per input access) on every kernel family, every access
    width (H and the out's offset), tokens whose slots are all dropped (the
    families' rows of zeros) and special values; the oracle's float32 sums
    bit for bit."""
    rng = np.random.default_rng()
    for dtype in DEVICE_DTYPES[kind][:2]:
        for hidden in (1, 3, 6, 8, 40, 896, 7168):
            case = random_case(rng, num_tokens=37, hidden=hidden, top_k=6, dtype=dtype,
                               value_kind="specials", weights=True, row_scale=hidden % 2 == 0,
                               out_of_range=False)
            case["token_topk_to_pos"][::5] = -1
            for out_offset in (0, 1, 2):
                run_case(kind, case, rng, use_out=True, out_offset=out_offset,
                         out_float32=True, shape_options=FAMILY_SHAPES[family])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("load_hint", "store_hint", "few_live"), [
    ("cs", "cs", None), ("plain", "plain", None), ("cg", "cg", None), ("nc", "cs", None),
    ("cs", "cs", "cs"), ("cs", "cs", "cg")])
def test_cache_hints_change_no_bit(kind, load_hint, store_hint, few_live):
    """The cache hints (load_hint, store_hint, few_live_load_hint: sweep
    options; the default takes .nc loads where the call fits half the L2 or
    the plan is sparse, and on token_rows for tokens with at most half their
    slots live) on the shape each call would choose (T = 300: token_rows at
    H = 7168 and 2048, the other shapes at 7000), on a rank's plan and a
    dense map, every dtype, special values."""
    rng = np.random.default_rng()
    hints = {"load_hint": load_hint, "store_hint": store_hint}
    if few_live is not None:
        hints["few_live_load_hint"] = few_live
    for case, expected in _expert_parallel_and_dense_cases(rng, kind, 8, 300):
        run_case(kind, case, rng, use_out=True, expected=expected, shape_options=hints)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype_index", [0, 1, 2])
def test_every_access_width(kind, dtype_index):
    """Rows and bases aligned to 16, 8, 4, 2 bytes (the scalar path for odd H)."""
    rng = np.random.default_rng()
    dtype = DEVICE_DTYPES[kind][dtype_index]
    for hidden in (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 7168, 7169, 7170):
        case = random_case(rng, num_tokens=11, hidden=hidden, top_k=5, dtype=dtype,
                           value_kind="bits", weights=True, row_scale=False)
        expected = reduce_fused_numpy(**case)
        for offset in (0, 1, 2, 4):
            run_case(kind, case, rng, use_out=True, expanded_offset=offset,
                     out_offset=(offset * 3) % 8, expected=expected)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value_kind", ["bits", "specials", "denormal"])
def test_nan_inf_and_denormal_inputs(kind, value_kind):
    rng = np.random.default_rng()
    for dtype in DEVICE_DTYPES[kind]:
        for weights, row_scale in SCALE_OPTIONS:
            case = random_case(rng, num_tokens=50, hidden=129, top_k=8, dtype=dtype,
                               value_kind=value_kind, weights=weights, row_scale=row_scale)
            run_case(kind, case, rng, use_out=False)


# -- corner cases ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_no_tokens(kind):
    rng = np.random.default_rng()
    for dtype in DEVICE_DTYPES[kind]:
        expanded = to_device(kind, random_values(rng, (6, 40), dtype, "normal"))
        empty_map = to_device(kind, np.zeros((0, 4), np.int32))
        result = reduce_fused(expanded, empty_map)
        check_result_kind(kind, result, dtype, (0, 40))
        out = to_device(kind, np.zeros((0, 40), storage_dtype(dtype)))
        assert reduce_fused(expanded, empty_map, out=out, validate=True) is out


@pytest.mark.parametrize("kind", KINDS)
def test_dropped_and_out_of_range_slots_give_zeros(kind):
    rng = np.random.default_rng()
    token_topk_to_pos = np.array([[-1, -1, -1], [6, -5, 2**31 - 1], [-(2**31), 7, 6]],
                                 dtype=np.int32)
    for dtype in DEVICE_DTYPES[kind]:
        case = {"expanded": random_values(rng, (6, 300), dtype, "bits"),
                "token_topk_to_pos": token_topk_to_pos,
                "topk_weights": np.full((3, 3), np.nan, np.float32),
                "row_scale": None}
        run_case(kind, case, rng, use_out=True)


@pytest.mark.parametrize("kind", KINDS)
def test_no_rows_at_all(kind):
    rng = np.random.default_rng()
    case = {"expanded": np.zeros((0, 64), np.float32),
            "token_topk_to_pos": np.array([[-1, 0], [5, -1]], np.int32),
            "topk_weights": None, "row_scale": np.zeros(0, np.float32)}
    run_case(kind, case, rng, use_out=True)


def test_offsets_past_two_to_the_31_elements():
    """Rows far into a > 4 GiB expanded array (64-bit offsets): only the rows
    the map names are written, the rest is left uninitialised."""
    hidden, num_expanded = 4096, 600_000  # 2.46e9 fp16 elements
    rng = np.random.default_rng()
    expanded = cupy.empty((num_expanded, hidden), dtype=cupy.float16)
    rows = np.array([0, 1, num_expanded - 2, num_expanded - 1, 550_000, 524_289], np.int64)
    values = random_values(rng, (rows.size, hidden), "float16", "normal")
    expanded[cupy.asarray(rows)] = cupy.asarray(values)
    # slots into the small host copy, and the same slots into the big array
    token_topk_to_pos = np.array([[2, 3, -1], [4, 5, 0], [1, 3, 2]], np.int32)
    big_rows = np.where(token_topk_to_pos >= 0, rows[np.maximum(token_topk_to_pos, 0)], -1)
    weights = rng.random((3, 3), dtype=np.float32)
    result = reduce_fused(expanded, cupy.asarray(big_rows.astype(np.int32)),
                          cupy.asarray(weights))
    expected = reduce_fused_numpy(values, token_topk_to_pos, weights)
    assert_bits_equal(to_host_bits("cupy", result), bits_of(expected), "reduce_fused")
    # the bulk layout's copies from those rows
    result = run_with_shape(expanded, cupy.asarray(big_rows.astype(np.int32)),
                            cupy.asarray(weights), bulk_stages=2)
    assert_bits_equal(to_host_bits("cupy", result), bits_of(expected), "reduce_fused bulk")
    del expanded


# -- validate=True ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_validate_reports_what_the_cpu_reports(kind):
    expanded = np.zeros((4, 16), np.float32)
    # (a first offender of exactly X = 4: the bound is >= X)
    for rows in ([[0, -1], [3, 7], [4, 1]], [[9, 0]], [[0, 1], [2, 2**31 - 1]], [[0, 4], [9, 1]],
                 [[4]]):
        token_topk_to_pos = np.array(rows, np.int32)
        with pytest.raises(ValueError) as on_cpu:
            reduce_fused(expanded, token_topk_to_pos, validate=True)
        with pytest.raises(ValueError) as on_gpu:
            reduce_fused(to_device(kind, expanded), to_device(kind, token_topk_to_pos),
                         validate=True)
        assert str(on_gpu.value) == str(on_cpu.value)


@pytest.mark.parametrize("kind", KINDS)
def test_validate_accepts_a_well_formed_map(kind):
    rng = np.random.default_rng()
    case = random_case(rng, num_tokens=300, hidden=64, top_k=8, dtype=DEVICE_DTYPES[kind][0],
                       value_kind="normal", weights=True, row_scale=False, out_of_range=False)
    expected = reduce_fused_numpy(**case)
    result = reduce_fused(*(to_device(kind, case[n]) for n in
                            ("expanded", "token_topk_to_pos", "topk_weights")), validate=True)
    assert_bits_equal(to_host_bits(kind, result), bits_of(expected), "reduce_fused")


# -- streams, graphs, the torch fast path ----------------------------------------------------------

def _decode_case(rng, dtype, num_tokens=16, hidden=7168, top_k=8):
    """Arguments of fixed shapes (X = T * K + 5), for tests that copy new
    values into the same device arrays: random rows, weights and map (a
    permutation of the rows, a share of the slots dropped)."""
    num_expanded = num_tokens * top_k + 5
    token_topk_to_pos = rng.permutation(num_expanded)[:num_tokens * top_k]
    token_topk_to_pos[rng.random(token_topk_to_pos.size) < 0.2] = -1
    return {"expanded": random_values(rng, (num_expanded, hidden), dtype, "normal"),
            "token_topk_to_pos": token_topk_to_pos.astype(np.int32).reshape(num_tokens, top_k),
            "topk_weights": rng.random((num_tokens, top_k), dtype=np.float32),
            "row_scale": None}


def test_cupy_non_default_stream():
    rng = np.random.default_rng()
    case = _decode_case(rng, "uint16", num_tokens=64)
    expected = reduce_fused_numpy(**case)
    with cupy.cuda.Stream(non_blocking=True) as stream:
        args = [to_device("cupy", case[n]) for n in
                ("expanded", "token_topk_to_pos", "topk_weights")]
        out = cupy.empty(expected.shape, dtype=cupy.uint16)
        out.fill(0xFFFF)
        result = reduce_fused(*args, out=out)
        host = cupy.asnumpy(result, stream=stream)
        stream.synchronize()
    assert_bits_equal(host, bits_of(expected), "reduce_fused")


@needs_torch_cuda
def test_torch_side_stream_waits_for_its_producer():
    # The op must run on torch's current stream: here a side stream whose long
    # producer kernel writes expanded just before the call.
    rng = np.random.default_rng()
    case = _decode_case(rng, "bfloat16", num_tokens=256, hidden=2048)
    expected = reduce_fused_numpy(**case)
    source = to_device("torch", case["expanded"])
    token_topk_to_pos = to_device("torch", case["token_topk_to_pos"])
    weights = to_device("torch", case["topk_weights"])
    target = torch.zeros_like(source)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25 ms of spinning before the producer
        target.copy_(source)
        result = reduce_fused(target, token_topk_to_pos, weights)
    side.synchronize()
    assert_bits_equal(to_host_bits("torch", result), bits_of(expected), "reduce_fused")


@needs_torch_cuda
@pytest.mark.parametrize("with_out", [True, False])
def test_torch_graph_capture_replays_with_new_inputs(monkeypatch, with_out):
    """A decode shape captured once and replayed with new routing, weights and
    rows; the captured call takes the fast path (no rule is checked again)."""
    rng = np.random.default_rng()
    first = _decode_case(rng, "bfloat16")
    static = {n: to_device("torch", first[n]) for n in
              ("expanded", "token_topk_to_pos", "topk_weights")}
    out = torch.empty((16, 7168), dtype=torch.bfloat16, device="cuda") if with_out else None

    def call():
        return reduce_fused(static["expanded"], static["token_topk_to_pos"],
                            static["topk_weights"], out=out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up: compiles, loads, remembers the plan
    torch.cuda.current_stream().wait_stream(side)
    from cupy_moe.combine import api

    def full_path(*args, **kwargs):
        raise AssertionError("the fast path should have taken this call")

    monkeypatch.setattr(api, "check_reduce_fused", full_path)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = call()
    for _ in range(3):
        case = _decode_case(rng, "bfloat16")
        for name, tensor in static.items():
            tensor.copy_(to_device("torch", case[name]))
        result.view(torch.int16).fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        assert_bits_equal(to_host_bits("torch", result), bits_of(reduce_fused_numpy(**case)),
                          "reduce_fused")


def test_cupy_graph_capture():
    rng = np.random.default_rng()
    first = _decode_case(rng, "float16", num_tokens=4)
    static = {n: to_device("cupy", first[n]) for n in
              ("expanded", "token_topk_to_pos", "topk_weights")}
    out = cupy.empty((4, 7168), dtype=cupy.float16)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        reduce_fused(*static.values(), out=out)  # warm-up: compiles and loads
        stream.synchronize()
        stream.begin_capture()
        reduce_fused(*static.values(), out=out)
        graph = stream.end_capture()
    for _ in range(2):
        case = _decode_case(rng, "float16", num_tokens=4)
        for name, array in static.items():
            array[...] = to_device("cupy", case[name])
        out.fill(np.nan)
        cupy.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        assert_bits_equal(to_host_bits("cupy", out), bits_of(reduce_fused_numpy(**case)),
                          "reduce_fused")


@needs_torch_cuda
def test_torch_fast_path_hits_and_still_checks_overlap(monkeypatch):
    rng = np.random.default_rng()
    case = _decode_case(rng, "float32", num_tokens=8, hidden=256)
    args = [to_device("torch", case[n]) for n in
            ("expanded", "token_topk_to_pos", "topk_weights")]
    reduce_fused(*args)  # full path: remembers the plan
    from cupy_moe.combine import api

    calls = []
    real_check = api.check_reduce_fused
    monkeypatch.setattr(api, "check_reduce_fused",
                        lambda *a, **k: calls.append(1) or real_check(*a, **k))
    for _ in range(2):
        case = _decode_case(rng, "float32", num_tokens=8, hidden=256)
        for tensor, name in zip(args, ("expanded", "token_topk_to_pos", "topk_weights"),
                                strict=True):
            tensor.copy_(to_device("torch", case[name]))
        result = reduce_fused(*args)
        assert_bits_equal(to_host_bits("torch", result), bits_of(reduce_fused_numpy(**case)),
                          "reduce_fused")
    assert not calls, "the fast path should have taken these calls"
    # an out that overlaps an input has the descriptions of a good one: the
    # fast path must hand it to the full path, which raises
    out = args[0][:8]  # expanded's first T rows, as [T, H]
    reduce_fused(*args, out=torch.empty_like(out))  # remembers the key with an out
    with pytest.raises(ValueError, match="out overlaps expanded in memory"):
        reduce_fused(*args, out=out)


@needs_torch_cuda
def test_torch_fast_path_keeps_a_float32_out_apart():
    """The same bf16 call into a bf16 out and into a float32 one: two keys,
    two plans (the out's dtype picks the kernel), each result exact, on the
    full path and on the fast path's hits; the float32 out's overlap with an
    input is still refused (its bytes are twice a bf16 row's)."""
    rng = np.random.default_rng()
    names = ("expanded", "token_topk_to_pos", "topk_weights")
    args = [to_device("torch", a) for a in
            (_decode_case(rng, "bfloat16", num_tokens=8, hidden=256)[n] for n in names)]
    wide = torch.empty((8, 256), dtype=torch.float32, device="cuda")
    narrow = torch.empty((8, 256), dtype=torch.bfloat16, device="cuda")
    for _ in range(3):  # the first round takes the full path, the others hit
        case = _decode_case(rng, "bfloat16", num_tokens=8, hidden=256)
        for tensor, name in zip(args, names, strict=True):
            tensor.copy_(to_device("torch", case[name]))
        wide.fill_(float("nan"))
        narrow.fill_(float("nan"))
        assert reduce_fused(*args, out=wide) is wide
        assert reduce_fused(*args, out=narrow) is narrow
        assert_bits_equal(to_host_bits("torch", wide),
                          bits_of(reduce_fused_numpy(**case, out=np.empty((8, 256), np.float32))),
                          "float32 out")
        assert_bits_equal(to_host_bits("torch", narrow), bits_of(reduce_fused_numpy(**case)),
                          "bf16 out")
    # 8 float32 rows of 256 overlap expanded's rows 0..15 of bf16
    overlapping = args[0][:16].view(torch.float32).view(8, 256)
    with pytest.raises(ValueError, match="out overlaps expanded in memory"):
        reduce_fused(*args, out=overlapping)


# -- GPU argument rules -------------------------------------------------------------------------

@needs_torch_cuda
def test_mixing_cupy_and_torch_is_rejected():
    expanded = cupy.zeros((4, 8), dtype=cupy.float32)
    token_topk_to_pos = torch.zeros((2, 2), dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match=re.escape(
            "all arrays must be of one kind: expanded is cupy.ndarray, token_topk_to_pos is "
            "torch.Tensor (cuda)")):
        reduce_fused(expanded, token_topk_to_pos)


@pytest.mark.parametrize("kind", KINDS)
def test_host_and_device_arrays_are_not_mixed(kind):
    expanded = to_device(kind, np.zeros((4, 8), np.float32))
    with pytest.raises(TypeError, match="all arrays must be of one kind"):
        reduce_fused(expanded, np.zeros((2, 2), np.int32))


@pytest.mark.parametrize("kind", KINDS)
def test_bad_device_outputs_are_rejected(kind):
    expanded = to_device(kind, np.zeros((6, 8), np.float32))
    token_topk_to_pos = to_device(kind, np.array([[0, 1], [2, 3]], np.int32))
    with pytest.raises(ValueError, match=r"out must be C-contiguous, element strides \(8, 1\); "
                                         r"got \(1, 2\)"):
        reduce_fused(expanded, token_topk_to_pos,
                     out=to_device(kind, np.zeros((8, 2), np.float32)).T)
    with pytest.raises(ValueError, match="out overlaps expanded in memory"):
        reduce_fused(expanded, token_topk_to_pos, out=expanded[4:])
    with pytest.raises(ValueError, match=r"out must have dtype float32 \(that of the input\); "
                                         "got float16"):
        reduce_fused(expanded, token_topk_to_pos,
                     out=to_device(kind, np.zeros((2, 8), np.float16)))


@needs_torch_cuda
def test_lazily_negated_cuda_tensors_are_refused():
    """The kernels read the stored bytes, not their negation: a contiguous
    negated view (torch._neg_view) as input or out is refused on the full
    path (the fast path's key leaves the bit out: a first call with it is
    refused before any plan is kept)."""
    expanded = torch.ones((4, 8), dtype=torch.float32, device="cuda")
    token_topk_to_pos = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    out = torch.zeros((2, 8), dtype=torch.float32, device="cuda")
    with pytest.raises(ValueError, match=re.escape(
            "out is a lazily negated view (torch's negative bit is set): pass "
            "out.resolve_neg()")):
        reduce_fused(expanded, token_topk_to_pos, out=torch._neg_view(out))
    with pytest.raises(ValueError, match=re.escape(
            "expanded is a lazily negated view (torch's negative bit is set)")):
        reduce_fused(torch._neg_view(expanded), token_topk_to_pos)
    assert not out.any()


def test_a_cupy_out_stepping_no_whole_element_is_refused():
    """CuPy byte strides of no whole element ((34, 5) for float32): a floor
    division read them as C-contiguous (8, 1), and the kernel would have
    written a plain row-major [2, 8] from a misaligned pointer."""
    expanded = cupy.zeros((6, 8), dtype=cupy.float32)
    token_topk_to_pos = cupy.asarray(np.array([[0, 1], [2, 3]], np.int32))
    buffer = cupy.zeros(32, dtype=cupy.float32)
    out = cupy.lib.stride_tricks.as_strided(buffer, (2, 8), (34, 5))  # strides in bytes
    with pytest.raises(ValueError, match=re.escape(
            "out must be C-contiguous, element strides (8, 1); got (8.5, 1.25)")):
        reduce_fused(expanded, token_topk_to_pos, out=out)
    assert not buffer.any()


@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_device_inputs_are_accepted(kind):
    rng = np.random.default_rng()
    case = random_case(rng, num_tokens=20, hidden=64, top_k=4, dtype="float32",
                       value_kind="normal", weights=True, row_scale=True, out_of_range=False)
    expected = reduce_fused_numpy(**case)
    wide = np.zeros((case["expanded"].shape[0], 128), np.float32)
    wide[:, 1::2] = case["expanded"]
    expanded = to_device(kind, wide)[:, 1::2]
    token_topk_to_pos = to_device(kind, np.ascontiguousarray(case["token_topk_to_pos"].T)).T
    weights = to_device(kind, np.ascontiguousarray(case["topk_weights"].T)).T
    result = reduce_fused(expanded, token_topk_to_pos, weights,
                          row_scale=to_device(kind, np.repeat(case["row_scale"], 2))[::2])
    assert_bits_equal(to_host_bits(kind, result), bits_of(expected), "reduce_fused")


def _device_count() -> int:
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver
        return 0


@pytest.mark.skipif(_device_count() < 2, reason="needs two GPUs")
def test_arrays_on_two_devices_are_rejected():
    expanded = cupy.zeros((4, 8), dtype=cupy.float32)
    with cupy.cuda.Device(1):
        token_topk_to_pos = cupy.zeros((2, 2), dtype=cupy.int32)
    with pytest.raises(ValueError, match="all arrays must be on one device: expanded is on "
                                         "cuda:0, token_topk_to_pos is on cuda:1"):
        reduce_fused(expanded, token_topk_to_pos)
