"""The grouped GEMM over the expert-major layout ``fused_mapping`` plans.

A stand-in, not DeepGEMM: it computes what a contiguous-layout grouped GEMM
computes (row p of the input times the weights of expert
``pos_to_expert[p]``), in bf16 with float32 accumulation, so that the
library's token-layout steps around it can be run and checked end to end. It
is neither tuned nor fp8: the fp8 path dequantizes its operands to bf16
first (``moe_layer``).

Methods:

- ``"numpy"`` (NumPy arrays): per expert, the float32 product of its routed
  rows ``expert_start[e] .. expert_end[e]`` (bf16 values, exact in float32)
  with its weights, rounded to bf16; every other row (padding) is zero.
- ``"grouped_mm"`` (torch): one ``torch._grouped_mm`` over the segments, group
  e ending at ``expert_start[e] + align(count_e, alignment)`` (offsets on the
  device: no host synchronisation, CUDA-graph capturable). Padding rows inside
  a segment are multiplied like routed rows (zero rows in, zero rows out);
  rows past the last segment are not written (unspecified).
- ``"loop"`` (torch, where ``_grouped_mm`` is missing or refuses the device):
  one matmul per expert over its routed rows; the segment bounds are read on
  the host (one synchronisation: not capturable). Padding rows are zero.

Consumers never read padding rows' outputs: ``swiglu_quantize_fp8`` zeroes
them, ``reduce_fused`` only reads routed rows.
"""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["GEMM_METHODS", "grouped_gemm", "resolve_method", "segment_ends"]

GEMM_METHODS = ("auto", "numpy", "grouped_mm", "loop")

# torch device -> whether torch._grouped_mm ran there (tried once per device)
_grouped_mm_works: dict[str, bool] = {}


def segment_ends(expert_start: Any, tokens_per_expert: Any, alignment: int) -> Any:
    """End row of each expert's segment: ``expert_start + align(count, alignment)``,
    int32, of the inputs' kind (the cumulative offsets ``_grouped_mm`` takes)."""
    counts = tokens_per_expert
    ends = expert_start + (counts + (alignment - 1)) // alignment * alignment
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(ends, torch.Tensor):
        return ends.to(torch.int32)
    return ends.astype(np.int32)


def _probe_grouped_mm(device: Any) -> bool:
    """Whether ``torch._grouped_mm`` runs bf16 on ``device`` (a tiny call, once per device)."""
    key = str(device)
    if key not in _grouped_mm_works:
        import torch
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            try:
                a = torch.zeros(32, 16, dtype=torch.bfloat16, device=device)
                b = torch.zeros(2, 16, 16, dtype=torch.bfloat16, device=device)
                offs = torch.tensor([16, 32], dtype=torch.int32, device=device)
                torch._grouped_mm(a, b.transpose(1, 2), offs=offs)
            except (RuntimeError, NotImplementedError):
                ok = False
        _grouped_mm_works[key] = ok
    return _grouped_mm_works[key]


# torch._grouped_mm needs 16-byte strides: bf16 feature widths of a multiple of 8
GROUPED_MM_WIDTH_MULTIPLE = 8


def resolve_method(a: Any, method: str = "auto", widths: dict[str, int] | None = None) -> str:
    """The method ``grouped_gemm`` uses for ``a``: ``"numpy"`` for NumPy arrays;
    for torch tensors ``method``, where ``"auto"`` is ``"grouped_mm"`` if it runs
    on the tensor's device and every feature width in ``widths`` (name ->
    the K or N of a GEMM to come, e.g. ``{"H": ..., "I": ...}``) is a
    multiple of 8, else ``"loop"``. ValueError for an unknown method, one that
    does not fit the array kind, or ``"grouped_mm"`` with such a width."""
    if method not in GEMM_METHODS:
        raise ValueError(f"gemm must be one of {', '.join(GEMM_METHODS)}; got {method!r}")
    torch = sys.modules.get("torch")
    is_torch = torch is not None and isinstance(a, torch.Tensor)
    if not is_torch:
        if method not in ("auto", "numpy"):
            raise ValueError(f"gemm={method!r} needs torch tensors; NumPy arrays take "
                             "'numpy' (or 'auto')")
        return "numpy"
    if method == "numpy":
        raise ValueError("gemm='numpy' needs NumPy arrays; torch tensors take 'grouped_mm', "
                         "'loop' (or 'auto')")
    odd = {name: width for name, width in (widths or {}).items()
           if width % GROUPED_MM_WIDTH_MULTIPLE}
    if method == "auto":
        return "grouped_mm" if not odd and _probe_grouped_mm(a.device) else "loop"
    if method == "grouped_mm" and odd:
        named = ", ".join(f"{name} = {width}" for name, width in odd.items())
        raise ValueError(f"gemm='grouped_mm' needs feature widths that are multiples of "
                         f"{GROUPED_MM_WIDTH_MULTIPLE} (torch._grouped_mm's 16-byte strides); "
                         f"got {named} (gemm='loop' or 'auto' takes any)")
    return method


def grouped_gemm(a: Any, w: Any, expert_start: Any, tokens_per_expert: Any, *,
                 alignment: int, method: str = "auto") -> Any:
    """``out[p] = a[p] @ w[e].T`` for each routed row p of expert e.

    Parameters
    ----------
    a : array [X, K], bfloat16 (NumPy ml_dtypes, or torch)
        The expert-major rows (``expand_to_fused``'s output, padding rows zero).
    w : array [E, N, K], bfloat16
        Each expert's weights, output features first (``nn.Linear``'s layout).
    expert_start, tokens_per_expert : array [E], int32
        ``fused_mapping``'s: expert e's routed rows are ``expert_start[e] ..
        expert_start[e] + tokens_per_expert[e]``, its segment is padded to a
        multiple of ``alignment`` rows.
    alignment : int
        The plan's alignment.
    method : {"auto", "numpy", "grouped_mm", "loop"}
        See the module docstring; :func:`resolve_method` picks for "auto".

    Returns
    -------
    array [X, N], bfloat16, of a's kind and device. Routed rows are the
    float32-accumulated products rounded to bf16; padding rows are zero, or
    (``"grouped_mm"``, rows past the last segment) unspecified.
    """
    method = resolve_method(a, method, {"K": a.shape[1], "N": w.shape[1]})
    num_rows, num_out = a.shape[0], w.shape[1]
    if method == "numpy":
        out = np.zeros((num_rows, num_out), dtype=ml_dtypes.bfloat16)
        starts = np.asarray(expert_start).tolist()
        counts = np.asarray(tokens_per_expert).tolist()
        for expert, (start, count) in enumerate(zip(starts, counts, strict=True)):
            if count:
                rows = a[start:start + count].astype(np.float32)
                product = rows @ w[expert].astype(np.float32).T
                out[start:start + count] = product.astype(ml_dtypes.bfloat16)
        return out
    import torch
    if method == "grouped_mm":
        offsets = segment_ends(expert_start, tokens_per_expert, alignment)
        return torch._grouped_mm(a, w.transpose(1, 2), offs=offsets)
    out = torch.zeros((num_rows, num_out), dtype=a.dtype, device=a.device)
    for expert, (start, count) in enumerate(zip(expert_start.tolist(),
                                                tokens_per_expert.tolist(), strict=True)):
        if count:
            torch.matmul(a[start:start + count], w[expert].T, out=out[start:start + count])
    return out
