"""The public routing-plan op: ``fused_mapping``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.arrays import ArrayKind, common_kind, describe, numpy_to_torch, torch_to_numpy
from ..runtime.extras import require_cupy
from ..runtime.fast_path import TorchFastPath
from ..runtime.rules import require_bool, require_int
from ..runtime.sizes import align_up
from .reference import FusedMapping, fused_mapping_numpy
from .rules import check_fused_mapping, raise_mapping_error

__all__ = ["fused_mapping", "FusedMapping"]

_fast_path = TorchFastPath()
_run_torch_fast = None  # mapping.gpu.run_torch_fast, bound when the GPU code is loaded


def fused_mapping(topk_ids: Any, num_experts: int, *, alignment: int = 128,
                  num_expanded: int | None = None, trim: bool = False,
                  validate: bool = False) -> FusedMapping:
    """The expert-major routing plan of ``topk_ids``: where each (token, slot)
    goes in a grouped GEMM's input, and what each row holds.

    Expert e owns rows ``expert_start[e] .. expert_start[e] + align(count_e,
    alignment)``, experts in order; its slots take the first ``count_e`` of
    them in ascending ``t * K + k``, whatever the GPU, grid or SM count (no
    atomics decide an order), bit-identical to the NumPy backend. The rest of
    a segment and every row past the last segment are padding: -1 in
    ``pos_to_expert`` (DeepGEMM's contiguous-layout ``grouped_layout``),
    ``pos_to_token`` and ``pos_to_token_topk``.

    Parameters
    ----------
    topk_ids : array [T, K], int32 or int64 (what ``torch.topk`` returns)
        Expert of each slot. A negative id is a dropped slot; an id >=
        ``num_experts`` is dropped too (expert parallelism: a remote expert).
    num_experts : int >= 1
        E, the experts of this rank (at most 4096 on the GPU).
    alignment : int >= 1
        Rows per segment are a multiple of this (the GEMM's M block, 128 for
        DeepGEMM).
    num_expanded : int >= 0, optional
        X, the rows of the plan. By default the tight worst case, known on the
        host without a synchronisation: ``floor((T*K + min(E, T*K) *
        (alignment - 1)) / alignment) * alignment``. Slots whose rows would fall
        at or past X are dropped (nothing is written outside the outputs).
    trim : bool
        Cut the row arrays to the exact X (the end of the last segment, at
        most ``num_expanded``): one host synchronisation.
    validate : bool
        Raise ValueError for the first slot whose id is >= ``num_experts``, or
        else the first routed slot that found no row below X: the host waits
        for the GPU (``topk_ids`` and ``token_topk_to_pos`` are copied to it).

    Returns
    -------
    FusedMapping (a NamedTuple of int32 arrays of the input's kind)
        ``token_topk_to_pos [T, K]``, ``pos_to_expert [X]``, ``pos_to_token
        [X]``, ``pos_to_token_topk [X]`` (``t * K + k``), ``expert_start [E]``,
        ``expert_end [E]`` (start + count), ``tokens_per_expert [E]``. On the
        GPU they are views of one allocation.

    Raises
    ------
    TypeError
        ``topk_ids`` is not an array, a size is not an int, a flag not a bool.
    ValueError
        A shape, dtype or size rule fails, or ``validate=True`` finds a fault.
        Also a tensor on another device than the CPU or CUDA, a sparse tensor, a lazily
        negated tensor view (pass ``.resolve_neg()``), a NumPy array of non-native
        byte order.
    """
    global _run_torch_fast
    if (trim is False and validate is False and type(num_experts) is int
            and type(alignment) is int and (num_expanded is None or type(num_expanded) is int)):
        plan = _fast_path.lookup((num_experts, alignment, num_expanded), (topk_ids,))
        if plan is not None:
            return _run_torch_fast(plan, topk_ids)
    desc = describe("topk_ids", topk_ids)
    kind, _ = common_kind({"topk_ids": desc})
    num_experts = require_int("num_experts", num_experts)
    alignment = require_int("alignment", alignment)
    if num_expanded is not None:
        num_expanded = require_int("num_expanded", num_expanded)
    scalars = (num_experts, alignment, num_expanded)
    trim, validate = require_bool("trim", trim), require_bool("validate", validate)
    problem = check_fused_mapping(desc, num_experts, alignment, num_expanded)
    if kind.on_gpu:
        require_cupy()
        from .gpu import run_mapping, run_torch_fast
        _run_torch_fast = run_torch_fast
        result, plan = run_mapping(kind, problem, topk_ids, trim, validate)
        if kind is ArrayKind.TORCH_CUDA:
            _fast_path.remember(scalars, (desc,), plan)
        return result
    host_ids = torch_to_numpy(topk_ids) if kind is ArrayKind.TORCH_CPU else topk_ids
    result = fused_mapping_numpy(host_ids, num_experts, alignment=alignment,
                                 num_expanded=problem.num_expanded)
    if validate:
        raise_mapping_error(np.asarray(host_ids), result.token_topk_to_pos, problem)
    if trim:
        exact = int(align_up(result.tokens_per_expert.astype(np.int64), alignment).sum())
        result = result.trimmed(min(exact, problem.num_expanded))
    if kind is ArrayKind.TORCH_CPU:
        result = FusedMapping(*(numpy_to_torch(np.ascontiguousarray(a)) for a in result))
    return result
