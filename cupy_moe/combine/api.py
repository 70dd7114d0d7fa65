"""The public combine op: ``reduce_fused``, the inverse of ``expand_to_fused``.

It describes its arguments once, checks the rules on the descriptions, then
hands the arrays to the CPU (NumPy reference) or the GPU (NVRTC kernel) code
of their kind. Torch calls whose descriptions were checked before take the
fast path straight to their launch plan.
"""

from __future__ import annotations

from typing import Any

from ..runtime.arrays import ArrayKind, common_kind, describe
from ..runtime.extras import require_cupy
from ..runtime.fast_path import TorchFastPath
from ..runtime.rules import check_no_overlap, check_strides, require_bool
from .rules import check_reduce_fused, check_reduce_fused_out

__all__ = ["reduce_fused", "run_with_shape"]

_fast_path = TorchFastPath()
# combine.gpu.run_torch_fast, bound when the GPU code is first loaded (the fast
# path can only hit after that)
_run_torch_fast = None


def reduce_fused(expanded: Any, token_topk_to_pos: Any, topk_weights: Any = None, *,
                 row_scale: Any = None, out: Any = None, validate: bool = False) -> Any:
    """Combine each token's K expert rows into one row: the MoE combine step.

    For each token ``t`` and slot ``k`` in order, with ``p =
    token_topk_to_pos[t, k] >= 0``: ``s = topk_weights[t, k] * row_scale[p]``
    (one float32 multiply; a missing factor is 1) and ``acc = fma(expanded[p],
    s, acc)`` in float32 from +0.0, one rounding per step; the result is
    ``acc`` rounded once to ``expanded``'s dtype (or ``acc`` itself into a
    float32 ``out``). These are DeepSeek TileKernels' reduce_fused numerics;
    the GPU and the CPU agree bit for bit.
    NaN results are the dtype's canonical NaN (see ``combine.reference``).

    Parameters
    ----------
    expanded : array [X, H], bfloat16, float16 or float32 (uint16 holding
        bf16 bits also: CuPy's bf16)
        The expert outputs in the fused, expert-major layout. Any H >= 1;
        X may be 0.
    token_topk_to_pos : array [T, K], int32
        Row of ``expanded`` of each (token, slot); negative = dropped slot. A
        slot >= X is never read (skipped, as a dropped one; see
        ``validate``). T may be 0 (the result is then ``[0, H]``); a token
        whose slots are all dropped gets zeros.
    topk_weights : array [T, K], float32, optional
        Routing weight of each slot; None: 1.
    row_scale : array [X], float32, optional
        A factor per expanded row (e.g. a per-row dequantisation scale),
        multiplied into the slot's weight; None: 1.
    out : array [T, H] of expanded's dtype, or float32, C-contiguous, optional
        Written in place and returned (for CUDA-graph capture, buffer reuse).
        float32 for bfloat16 / float16 input: the float32 sums, not rounded
        to the input's dtype (partial sums that a later step adds, as the
        expert-parallel combine does: one rounding in all, at the end).
    validate : bool
        Raise ValueError naming the first slot (in ``t * K + k`` order) that is
        >= X. On the GPU this costs one host synchronisation (so not inside
        CUDA-graph capture).

    Returns
    -------
    array [T, H], expanded's kind, device and dtype (``out``'s dtype)
        numpy.ndarray, cupy.ndarray or torch.Tensor as given.

    Raises
    ------
    TypeError
        An array argument is not an array, arrays of different kinds are
        mixed, ``validate`` is not a bool, or a torch tensor requires grad
        while grad mode is on (the op is inference-only).
    ValueError
        A shape, dtype or device rule fails (the message names the argument and
        the numbers), ``out`` is read-only, not C-contiguous or overlaps an
        input, or ``validate=True`` finds a slot >= X. Also a tensor on
        another device than the CPU or CUDA, a sparse tensor, a lazily negated
        tensor view (pass ``.resolve_neg()``), a NumPy array of non-native byte
        order.
    """
    if validate is False:
        plan = _fast_path.lookup((), (expanded, token_topk_to_pos, topk_weights, row_scale, out))
        if plan is not None:
            result = _run_torch_fast(plan, expanded, token_topk_to_pos, topk_weights, row_scale,
                                     out)
            if result is not None:
                return result
    return _reduce_fused(expanded, token_topk_to_pos, topk_weights, row_scale, out, validate)


def run_with_shape(expanded: Any, token_topk_to_pos: Any, topk_weights: Any = None, *,
                   row_scale: Any = None, out: Any = None, validate: bool = False,
                   **shape_options: Any) -> Any:
    """``reduce_fused`` with launch-shape overrides (tests and sweeps; no fast
    path): ``shape_options`` are keyword arguments of
    ``combine.launch_shape.combine_shape`` (``max_warps``,
    ``fill_blocks_per_sm``, ``vecs_per_thread``, ``slot_batch``,
    ``warp_slots``, ``warp_tokens``, ``stream_rounds``, ``bulk_stages``,
    ``bulk_rounds``, ``token_rows``; K comes from ``token_topk_to_pos``),
    and the cache hints ``load_hint`` / ``store_hint``, which alone keep the
    shape the call would choose by itself (``auto_combine_shape``). Same
    rules and results; only the grid and the kernel variant differ (the CPU
    ignores them)."""
    return _reduce_fused(expanded, token_topk_to_pos, topk_weights, row_scale, out, validate,
                         shape_options=tuple(sorted(shape_options.items())))


def _reduce_fused(expanded, token_topk_to_pos, topk_weights, row_scale, out, validate,
                  shape_options: tuple | None = None) -> Any:
    """The full path: every rule, then the backend of the arrays' kind."""
    validate = require_bool("validate", validate)
    # in the fast path's key order
    descs = {
        "expanded": describe("expanded", expanded),
        "token_topk_to_pos": describe("token_topk_to_pos", token_topk_to_pos),
        "topk_weights": None if topk_weights is None else describe("topk_weights",
                                                                   topk_weights),
        "row_scale": None if row_scale is None else describe("row_scale", row_scale),
        "out": None if out is None else describe("out", out),
    }
    kind, _ = common_kind(descs)
    problem = check_reduce_fused(descs["expanded"], descs["token_topk_to_pos"],
                                 descs["topk_weights"], descs["row_scale"])
    if out is not None:
        problem = check_reduce_fused_out(descs["out"], problem)
        check_strides("out", kind, out, problem.out_strides(), "C-contiguous")
        check_no_overlap(kind, {"out": (out, 0)},
                         {"expanded": expanded, "token_topk_to_pos": token_topk_to_pos,
                          "topk_weights": topk_weights, "row_scale": row_scale})
    if kind.on_gpu:
        global _run_torch_fast
        require_cupy()
        from .gpu import run_reduce_fused, run_torch_fast
        _run_torch_fast = run_torch_fast
        result, plan = run_reduce_fused(kind, problem, expanded, token_topk_to_pos,
                                        topk_weights, row_scale, out, validate, shape_options)
        if shape_options is None and kind is ArrayKind.TORCH_CUDA:
            _fast_path.remember((), tuple(descs.values()), plan)
        return result
    from .cpu import run_reduce_fused
    return run_reduce_fused(kind, problem, expanded, token_topk_to_pos, topk_weights, row_scale,
                            out, validate)
