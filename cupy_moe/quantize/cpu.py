"""The quantize ops on the CPU: NumPy arrays and CPU torch tensors, through the
NumPy reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..expand.reference import empty_sf_output
from ..runtime.arrays import ArrayKind, numpy_to_torch, torch_to_numpy
from . import reference
from .rules import QuantizeProblem


def run_quantize(kind: ArrayKind, problem: QuantizeProblem, x: Any, topk_weights: Any,
                 pos_to_token_topk: Any, pos_to_expert: Any, out: Any,
                 out_sf: Any) -> tuple[Any, Any]:
    """Either op on the CPU (``x`` is ``h`` for swiglu; absent maps are None).

    Returns ``(out, out_sf)`` of the caller's kind; caller-provided outputs are
    written in place and returned as the same objects.
    """
    to_numpy = torch_to_numpy if kind is ArrayKind.TORCH_CPU else (lambda a: a)
    out_np = None if out is None else to_numpy(out)
    if out_sf is None and kind is ArrayKind.TORCH_CPU:
        # Allocate here, so that the tensor handed back owns the whole buffer
        # (pad columns included), not just the view's extent.
        buffer, out_sf_np = empty_sf_output(problem.num_rows, problem.sf_columns,
                                            np.dtype(problem.sf_dtype),
                                            col_major=problem.col_major)
        buffer_t = numpy_to_torch(buffer)
        out_sf = buffer_t[:, :problem.num_rows].T if problem.col_major else buffer_t
    else:
        out_sf_np = None if out_sf is None else to_numpy(out_sf)
    settings = {"num_per_channels": problem.num_per_channels, "round_sf": problem.round_sf,
                "packed_ue8m0": problem.packed_ue8m0,
                "use_tma_aligned_col_major_sf": problem.col_major, "out": out_np,
                "out_sf": out_sf_np}
    x_np = np.ascontiguousarray(to_numpy(x))
    if problem.swiglu:
        maps = {name: None if a is None else np.ascontiguousarray(to_numpy(a))
                for name, a in (("topk_weights", topk_weights),
                                ("pos_to_token_topk", pos_to_token_topk),
                                ("pos_to_expert", pos_to_expert))}
        result, result_sf = reference.swiglu_quantize_fp8_numpy(
            x_np, **maps, **settings, zero_padding=problem.zero_padding)
    else:
        result, result_sf = reference.quantize_fp8_numpy(x_np, **settings)
    if kind is ArrayKind.TORCH_CPU:
        # NumPy hands back the arrays it wrote; torch callers get tensors:
        # their own out= / out_sf=, or views of what NumPy allocated
        result = out if out is not None else numpy_to_torch(result)
        result_sf = out_sf
    return result, result_sf
