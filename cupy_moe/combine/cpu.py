"""``reduce_fused`` on the CPU: NumPy arrays and CPU torch tensors, through the
NumPy reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.arrays import ArrayKind, numpy_to_torch, torch_to_numpy
from . import reference
from .rules import CombineProblem, raise_out_of_range


def run_reduce_fused(kind: ArrayKind, problem: CombineProblem, expanded: Any,
                     token_topk_to_pos: Any, topk_weights: Any, row_scale: Any, out: Any,
                     validate: bool) -> Any:
    """The op on the CPU; returns ``out`` of the caller's kind (the caller's
    own ``out``, written in place, when given)."""
    # np.asarray: an ndarray subclass (np.matrix keeps every index 2-D) is
    # read as the plain array it views
    to_numpy = torch_to_numpy if kind is ArrayKind.TORCH_CPU else np.asarray
    map_np = np.ascontiguousarray(to_numpy(token_topk_to_pos))
    if validate:
        out_of_range = np.flatnonzero(map_np.reshape(-1) >= problem.num_expanded)
        raise_out_of_range(int(out_of_range[0]) if out_of_range.size else -1, problem,
                           lambda i: int(map_np.reshape(-1)[i]))
    weights_np = None if topk_weights is None else to_numpy(topk_weights)
    scale_np = None if row_scale is None else to_numpy(row_scale)
    out_np = None if out is None else to_numpy(out)
    result = reference.reduce_fused_numpy(to_numpy(expanded), map_np, weights_np, scale_np,
                                          out_np)
    if out is not None:
        return out
    return numpy_to_torch(result) if kind is ArrayKind.TORCH_CPU else result
