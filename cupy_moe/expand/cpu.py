"""The expand ops on the CPU: NumPy arrays and CPU torch tensors, through the
NumPy reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.arrays import ArrayKind, numpy_to_torch, torch_to_numpy
from . import reference
from .rules import ExpandProblem, raise_routing_error


def run_expand(kind: ArrayKind, problem: ExpandProblem, x: Any, x_sf: Any,
               token_topk_to_pos: Any, pos_to_expert: Any,
               out: Any, out_sf: Any, validate: bool, zero_padding: bool,
               pos_to_token: Any = None) -> tuple[Any, Any]:
    """Both ops on the CPU; ``x_sf`` is None for the op without scale factors.

    Returns ``(out, out_sf)`` of the caller's kind; caller-provided outputs are
    written in place and returned as the same objects. With ``zero_padding``
    False, padding rows of a fresh output hold whatever np.empty left there.
    """
    to_numpy = torch_to_numpy if kind is ArrayKind.TORCH_CPU else (lambda a: a)
    topk_np = np.ascontiguousarray(to_numpy(token_topk_to_pos))
    p2e_np = np.ascontiguousarray(to_numpy(pos_to_expert))
    if validate:
        # pos_to_token is only read here: the reference needs no hint
        p2t_np = (None if pos_to_token is None
                  else np.ascontiguousarray(to_numpy(pos_to_token)))
        raise_routing_error(reference.find_routing_errors(topk_np, p2e_np, p2t_np), problem,
                            lambda i: int(topk_np.reshape(-1)[i]),
                            lambda p: int(p2t_np[p]))
    out_np = None if out is None else to_numpy(out)
    x_np = to_numpy(x)
    if x_sf is None:
        result = reference.expand_to_fused_numpy(x_np, topk_np, p2e_np, out_np,
                                                 zero_padding=zero_padding)
        result_sf = None
    else:
        if out_sf is None and kind is ArrayKind.TORCH_CPU:
            # Allocate here, so the tensor handed back owns the whole buffer
            # (pad columns included), not just the view's extent.
            buffer, out_sf_np = reference.empty_sf_output(
                problem.num_expanded, problem.sf_columns, to_numpy(x_sf).dtype,
                col_major=problem.sf_col_major)
            buffer_t = numpy_to_torch(buffer)
            out_sf = buffer_t[:, :problem.num_expanded].T if problem.sf_col_major else buffer_t
        else:
            out_sf_np = None if out_sf is None else to_numpy(out_sf)
        result, result_sf = reference.expand_to_fused_with_sf_numpy(
            x_np, to_numpy(x_sf), topk_np, p2e_np, col_major=problem.sf_col_major,
            out=out_np, out_sf=out_sf_np, zero_padding=zero_padding)
    if kind is ArrayKind.TORCH_CPU:
        # NumPy hands back the very arrays it wrote; torch callers get tensors:
        # their own out=, or views of what NumPy allocated. out_sf is set by
        # now whenever there are scale factors (the caller's, or made above).
        result = out if out is not None else numpy_to_torch(result)
        result_sf = out_sf
    return result, result_sf
