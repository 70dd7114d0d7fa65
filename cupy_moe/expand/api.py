"""The public expand ops: token rows (and their scale factors) to the fused,
expert-major layout of a grouped GEMM.

Each op describes its arguments once, checks the rules on the descriptions,
then hands the arrays to the CPU (NumPy reference) or the GPU (NVRTC kernels)
code of their kind. Torch calls whose descriptions were checked before take
the fast path straight to their launch plan.
"""

from __future__ import annotations

from typing import Any

from ..runtime.arrays import ArrayKind, bytes_to_allocation_end, common_kind, describe
from ..runtime.extras import require_cupy
from ..runtime.fast_path import TorchFastPath
from ..runtime.rules import (
    check_no_overlap,
    check_out,
    check_strides,
    require_bool,
    require_int,
)
from .rules import ExpandProblem, check_expand, check_expand_with_sf, check_pos_to_token
from .tuning import DEFAULT_TUNING, ExpandTuning

__all__ = ["expand_to_fused", "expand_to_fused_with_sf", "run_with_tuning"]

# one per op: their keys have different arguments
_plain_fast_path = TorchFastPath()
_sf_fast_path = TorchFastPath()
# expand.gpu.run_torch_fast, bound when the GPU code is first loaded (the fast
# path can only hit after that); an import statement per call costs ~0.5 us
_run_torch_fast = None


def expand_to_fused(x: Any, token_topk_to_pos: Any, pos_to_expert: Any, *,
                    out: Any = None, validate: bool = False, zero_padding: bool = True,
                    pos_to_token: Any = None) -> Any:
    """Scatter token rows to the expert-major rows of a grouped-GEMM input.

    ``out[p] = x[t]`` for every slot with ``token_topk_to_pos[t, k] = p >= 0``;
    negative slots are dropped; rows with ``pos_to_expert[p] < 0`` (padding)
    are zero, or left as they are with ``zero_padding=False``. A pure byte
    copy: nothing is weighted or reduced.

    Parameters
    ----------
    x : array [T, H], bfloat16 or float16 (uint16 holding bf16 bits also)
        Token rows. T may be 0 (the result is then all zeros; with
        ``zero_padding=False``, all but the padding rows).
    token_topk_to_pos : array [T, K], int32
        Output row of each (token, slot); negative = dropped slot.
    pos_to_expert : array [X], int32
        Expert of each output row; negative = padding row.
    out : array [X, H] of x's dtype, C-contiguous, optional
        Written in place and returned (for CUDA-graph capture, buffer reuse).
    validate : bool
        Check that the map targets each expert row exactly once and nothing
        else, before anything is written. Faults are looked for in this order:
        a slot >= X, a slot naming a padding row, a slot repeating an earlier
        slot's row, an expert row no slot names; the ValueError names the
        first index of the first kind found (then a ``pos_to_token`` that
        disagrees with the map). On the GPU this costs one host
        synchronisation (so not inside CUDA-graph capture). Without it a
        malformed map never writes outside the outputs, but which rows it
        fills is unspecified.
    zero_padding : bool
        True: padding rows are zero. False: padding rows are not written, and
        hold what the memory held (a fresh output: anything; a caller's
        ``out``: its previous contents); the call saves the zero-fill's
        stores. Every row with ``pos_to_expert[p] >= 0`` is the same as with
        True, bit for bit, and nothing outside the outputs is written. Safe
        for a consumer that never uses padding rows: a GEMM computes each
        output row from its own input row alone, so a grouped GEMM whose
        padding rows' outputs are not used gives the same results, e.g.
        DeepGEMM's contiguous grouped GEMM with ``pos_to_expert`` as its
        grouped_layout (where -1 marks padding rows). Not for anything that
        reads every row: a plain GEMM over all X rows, a sum or checksum of
        the output, or a comparison with a zero-padded result sees garbage
        in (or from) the padding rows.
    pos_to_token : array [X], int32, optional
        The token of each output row (-1 on padding rows): ``fused_mapping``'s
        ``pos_to_token``. A hint, for speed only, that lets the GPU write the
        output row by row instead of token by token: by default on calls of
        fewer than 1024 tokens whose output is below 32 MB
        (``ExpandTuning.rows_by_position_*``: decode and small batches, 8-18%
        faster on the H100; medium expert-parallel batches); the results are
        the same. It must agree with the map:
        ``pos_to_token[token_topk_to_pos[t, k]] == t`` for every slot that is
        not dropped (``validate=True`` checks it, after the map's own faults).
        Where it does not, what such a row gets is unspecified; nothing
        outside the outputs is written, nothing outside ``x`` read.

    Returns
    -------
    array [X, H], x's kind, device and dtype
        numpy.ndarray, cupy.ndarray or torch.Tensor as given.

    Raises
    ------
    TypeError
        An argument is not an array (None included), arrays of different
        kinds are mixed, a flag (``validate``, ``zero_padding``) is not a
        bool, or a torch tensor requires grad while grad mode is on (the ops
        are inference-only).
    ValueError
        A shape, dtype or device rule fails (the message names the argument and
        the numbers), ``out`` is read-only, not C-contiguous or overlaps an
        input, or ``validate=True`` finds a malformed map (or a ``pos_to_token``
        that disagrees with it). ``pos_to_token`` must be [X] int32. Also
        a tensor on another device than the CPU or CUDA, a sparse tensor, a lazily
        negated tensor view (pass ``.resolve_neg()``), a NumPy array of non-native
        byte order.
    """
    # zero_padding is in the key, as a bool only: 1 == True would find True's plan
    if validate is False and type(zero_padding) is bool:
        plan = _plain_fast_path.lookup((zero_padding,),
                                       (x, token_topk_to_pos, pos_to_expert, pos_to_token, out))
        if plan is not None:
            result = _run_torch_fast(plan, x, None, token_topk_to_pos, pos_to_expert, out,
                                     pos_to_token)
            if result is not None:
                return result[0]
    return _expand(DEFAULT_TUNING, x, None, token_topk_to_pos, pos_to_expert, with_sf=False,
                   num_per_channels=None, use_tma_aligned_col_major_sf=False, out=out,
                   out_sf=None, validate=validate, zero_padding=zero_padding,
                   fast_path=_plain_fast_path, pos_to_token=pos_to_token)[0]


def expand_to_fused_with_sf(x: Any, x_sf: Any, token_topk_to_pos: Any, pos_to_expert: Any, *,
                            num_per_channels: int, use_tma_aligned_col_major_sf: bool = False,
                            out: Any = None, out_sf: Any = None,
                            validate: bool = False,
                            zero_padding: bool = True,
                            pos_to_token: Any = None) -> tuple[Any, Any]:
    """Scatter quantized token rows and their per-block scale factors.

    The routing contract is that of :func:`expand_to_fused`; each row's scale
    factors travel with it, and padding rows get zero scale factors too
    (with ``zero_padding=False``, none: they are left as they are).

    Parameters
    ----------
    x : array [T, H], float8_e4m3fn (or uint8 / int8: any 1-byte payload, e.g.
        two fp4 per byte with H counted in bytes)
    x_sf : array [T, S], float32 or int32
        float32: ``S = ceil(H / num_per_channels)``. int32: packed UE8M0, four
        exponent bytes per word (byte j of word w is block 4w + j),
        ``S = ceil(ceil(H / num_per_channels) / 4)``; needs
        ``use_tma_aligned_col_major_sf=True``.
    token_topk_to_pos, pos_to_expert : as in :func:`expand_to_fused`
    num_per_channels : {32, 128}
        Channels per scale-factor block.
    use_tma_aligned_col_major_sf : bool
        Return ``expanded_x_sf`` as the transposed view of the first X columns
        of an ``[S, align(X, 4)]`` buffer (shape [X, S], element strides
        ``(1, align(X, 4))``), the layout a TMA load of a grouped GEMM reads.
        The pad columns X .. align(X, 4) are zero, whatever ``zero_padding``
        says (they belong to no row).
    out : array [X, H], optional
    out_sf : array [X, S], optional
        Caller-provided outputs, written and returned: ``out`` of x's dtype
        exactly (a uint8 buffer is refused for float8_e4m3fn ``x``, unlike
        ``quantize_fp8``'s ``out``), C-contiguous; ``out_sf`` of x_sf's
        dtype, C-contiguous, or, column-major, with the strides above and
        viewing a buffer that holds the pad columns.
    validate : bool
        As in :func:`expand_to_fused`.
    zero_padding : bool
        As in :func:`expand_to_fused`. The scale factors of padding rows
        follow their data rows: zero with True, not written with False (the
        same consumers are safe: a grouped GEMM scales a row by that row's
        scale factors only). Only the pad columns above are zeroed either way.
    pos_to_token : array [X], int32, optional
        The token of each output row (-1 on padding rows): ``fused_mapping``'s
        ``pos_to_token``. A hint, for speed only: with the column-major layout
        on sm_90+ the GPU then writes the scale factors row by row, in whole
        32-byte sectors, instead of scattering each token's words to its K rows
        (benchmarks/results/sweep_sf_by_position_h200.md); with the row-major
        layout, calls of fewer than 1024 tokens whose output is below 32 MB
        (``ExpandTuning.rows_by_position_*``: decode, small batches, medium
        expert-parallel batches) are written a block an
        output row, data and scale factors together (Kimi-K2's fp8 decode
        plan 10% faster on the H100); where
        ``ExpandTuning.gather_x_bytes_below`` says so (off by default: it lost
        on the H200), the data rows too. The results are the same. It must agree
        with the map: ``pos_to_token[token_topk_to_pos[t, k]] == t`` for every
        slot that is not dropped (``validate=True`` checks it, after the map's
        own faults). Where it does not, what such a row gets (data and scale
        factors) is unspecified; nothing outside the outputs is written,
        nothing outside ``x`` and ``x_sf`` read.

    Returns
    -------
    (expanded_x, expanded_x_sf) : arrays [X, H] and [X, S], the inputs' kind

    Raises
    ------
    TypeError, ValueError
        As in :func:`expand_to_fused`, plus the scale-factor rules
        (``num_per_channels`` that is not an int is a TypeError) and
        ``pos_to_token``'s ([X] int32, the kind of the other arrays; with
        ``validate=True``, agreeing with the map).
    """
    if (validate is False and out_sf is None and type(num_per_channels) is int
            and type(use_tma_aligned_col_major_sf) is bool and type(zero_padding) is bool):
        plan = _sf_fast_path.lookup(
            (num_per_channels, use_tma_aligned_col_major_sf, zero_padding),
            (x, x_sf, token_topk_to_pos, pos_to_expert, pos_to_token, out, None))
        if plan is not None:
            result = _run_torch_fast(plan, x, x_sf, token_topk_to_pos, pos_to_expert, out,
                                     pos_to_token)
            if result is not None:
                return result
    return _expand(DEFAULT_TUNING, x, x_sf, token_topk_to_pos, pos_to_expert, with_sf=True,
                   num_per_channels=num_per_channels,
                   use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, out=out,
                   out_sf=out_sf, validate=validate, zero_padding=zero_padding,
                   fast_path=_sf_fast_path, pos_to_token=pos_to_token)


def run_with_tuning(tuning: ExpandTuning, x: Any, token_topk_to_pos: Any, pos_to_expert: Any,
                    *, x_sf: Any = None, num_per_channels: int | None = None,
                    use_tma_aligned_col_major_sf: bool = False, out: Any = None,
                    out_sf: Any = None, validate: bool = False,
                    zero_padding: bool = True, pos_to_token: Any = None) -> tuple[Any, Any]:
    """Either op under a tuning of its own (tests and sweeps; no fast path).

    The op with scale factors when ``x_sf`` is given, else the plain one
    (then ``out_sf`` of the result is None). Same rules and results as the
    public ops; only the kernel choice and grid differ.
    """
    return _expand(tuning, x, x_sf, token_topk_to_pos, pos_to_expert, with_sf=x_sf is not None,
                   num_per_channels=num_per_channels,
                   use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, out=out,
                   out_sf=out_sf, validate=validate, zero_padding=zero_padding, fast_path=None,
                   pos_to_token=pos_to_token)


def _expand(tuning: ExpandTuning, x, x_sf, token_topk_to_pos, pos_to_expert, *, with_sf: bool,
            num_per_channels, use_tma_aligned_col_major_sf, out, out_sf, validate,
            zero_padding, fast_path: TorchFastPath | None,
            pos_to_token: Any = None) -> tuple[Any, Any]:
    """The full path of both ops: every rule, then the backend of the arrays' kind."""
    validate = require_bool("validate", validate)
    zero_padding = require_bool("zero_padding", zero_padding)
    # in the fast path's key order
    descs = {"x": describe("x", x)}
    if with_sf:
        descs["x_sf"] = describe("x_sf", x_sf)
    descs["token_topk_to_pos"] = describe("token_topk_to_pos", token_topk_to_pos)
    descs["pos_to_expert"] = describe("pos_to_expert", pos_to_expert)
    descs["pos_to_token"] = None if pos_to_token is None else describe("pos_to_token",
                                                                        pos_to_token)
    descs["out"] = None if out is None else describe("out", out)
    if with_sf:
        descs["out_sf"] = None if out_sf is None else describe("out_sf", out_sf)
    kind, _ = common_kind(descs)
    # the fast path's key: the op's scalar settings, in its lookup's order
    if with_sf:
        scalars = (require_int("num_per_channels", num_per_channels),
                   require_bool("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf),
                   zero_padding)
        problem = check_expand_with_sf(
            descs["x"], descs["x_sf"], descs["token_topk_to_pos"], descs["pos_to_expert"],
            num_per_channels=scalars[0], use_tma_aligned_col_major_sf=scalars[1])
    else:
        scalars = (zero_padding,)
        problem = check_expand(descs["x"], descs["token_topk_to_pos"], descs["pos_to_expert"])
    if pos_to_token is not None:
        check_pos_to_token(descs["pos_to_token"], problem)
    _check_outputs(kind, problem, descs, x, x_sf, token_topk_to_pos, pos_to_expert, out, out_sf,
                   pos_to_token)
    if kind.on_gpu:
        global _run_torch_fast
        require_cupy()
        from .gpu import run_expand, run_torch_fast
        _run_torch_fast = run_torch_fast
        result, plan = run_expand(kind, problem, tuning, x, x_sf, token_topk_to_pos,
                                  pos_to_expert, out, out_sf, validate, zero_padding,
                                  pos_to_token)
        if fast_path is not None and kind is ArrayKind.TORCH_CUDA and out_sf is None:
            fast_path.remember(scalars, tuple(descs.values()), plan)
        return result
    from .cpu import run_expand
    return run_expand(kind, problem, x, x_sf, token_topk_to_pos, pos_to_expert, out, out_sf,
                      validate, zero_padding, pos_to_token)


def _check_outputs(kind: ArrayKind, problem: ExpandProblem, descs: dict, x, x_sf,
                   token_topk_to_pos, pos_to_expert, out, out_sf, pos_to_token=None) -> None:
    """Caller-provided outputs: shape, dtype, strides, writeable, extent, no overlap."""
    if out is None and out_sf is None:
        return
    if out is not None:
        check_out("out", descs["out"], problem.out_shape(), descs["x"].dtype)
        check_strides("out", kind, out, problem.out_strides(), "C-contiguous")
    if out_sf is not None:
        check_out("out_sf", descs["out_sf"], problem.out_sf_shape(), descs["x_sf"].dtype)
        check_strides("out_sf", kind, out_sf, problem.out_sf_strides(), problem.out_sf_layout())
        if problem.sf_col_major and problem.num_expanded > 0:
            # The kernels zero the pad columns X .. align(X, 4), which lie past
            # the view's last element: the buffer behind it must hold them.
            needed = problem.out_sf_buffer_bytes()
            available = bytes_to_allocation_end(kind, out_sf)
            if available < needed:
                raise ValueError(
                    f"out_sf must view a buffer of [S, align(X, 4)] = [{problem.sf_columns}, "
                    f"{problem.sf_leading_dim}] elements ({needed} bytes, pad columns "
                    f"included); only {available} bytes follow its first element")
    written_sf = problem.out_sf_buffer_bytes() if problem.sf_col_major else 0
    check_no_overlap(kind, {"out": (out, 0), "out_sf": (out_sf, written_sf)},
                     {"x": x, "x_sf": x_sf, "token_topk_to_pos": token_topk_to_pos,
                      "pos_to_expert": pos_to_expert, "pos_to_token": pos_to_token})
