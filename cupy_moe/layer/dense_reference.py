"""The dense reference of the MoE layer, and how far the layer may be from it.

The reference takes the router's choice (``topk_ids``, ``topk_weights``) as
given and computes, for every token t and slot k with expert e:

    out[t] += topk_weights[t, k] * W_down[e] @ (silu(g) * u),
    [g; u] = W_gate_up[e] @ x[t]

in float64 from the bf16 inputs, with no layout, padding, quantization or
intermediate rounding. (Slots are grouped by expert only to batch the
products; every row is computed independently.)

Tolerances: the layer's error is the relative Frobenius norm
``||out - ref|| / ||ref||`` over the whole [T, H] output
(:func:`relative_error`). Each rounding of a stage to a format with unit
roundoff u leaves a relative error of at most u on that stage's values;
through the layer (random weights scaled to keep every stage near unit size,
so the linear maps neither grow nor shrink a relative error on average) the
stages' errors add. First-order budget:

- bf16 (u = 2^-9): the gate/up GEMM output (u on g and on u; SwiGLU
  ``silu(g) * u`` carries both, silu's relative sensitivity ``1 + g (1 -
  sigmoid(g))`` is at most 1.28 where silu is not small: <= 2.3u), the
  activations (u), the down GEMM output (u), the combined output (u): 5.3u;
  float32 accumulation adds ``sqrt(H) * 2^-24 < 2^-17``.
  ``BF16_TOLERANCE = 8u = 2^-6`` (margin for the few large-sensitivity
  negative gates).
- fp8 (e4m3, 3 mantissa bits: RNE relative error at most d = 2^-4 on normal
  values; per-block scaling puts each block's largest value at 448, so only
  values 2^-8 below the block's largest fall in the subnormals, whose
  absolute error 2^-10 (scaled) is negligible in the norm): x is quantized
  (d, carried twice by SwiGLU as above: 2.3d), the weighted activations are
  quantized (d); on top come the bf16 roundings of the bf16 path (5.3u) and
  of the dequantized operands (2u). Rounding errors of independent values are
  uncorrelated and add in quadrature in the norm, with the RMS of a
  relative error uniform in [-d, d] being d / sqrt(3):
  ``sqrt(2.3^2 + 1) * d / sqrt(3) = 0.091`` for the fp8 roundings, plus
  ``8u`` (the bf16 budget taken whole): ``FP8_TOLERANCE = 2^-4 * 1.45 + 2^-6
  ~= 0.106``. Measured on random inputs: 0.04-0.045 (bf16 path: ~0.004).

The bf16 tolerance is the worst-case sum; the fp8 one is the RMS sum of the
fp8 roundings (a worst-case sum, 3.3d = 0.21, would let a lost scale factor
of a few blocks pass).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

__all__ = ["BF16_TOLERANCE", "FP8_TOLERANCE", "dense_moe_reference", "relative_error",
           "tolerance"]

_BF16_U = 2.0 ** -9
_E4M3_D = 2.0 ** -4
BF16_TOLERANCE = 8 * _BF16_U
FP8_TOLERANCE = math.sqrt(2.3 ** 2 + 1) * _E4M3_D / math.sqrt(3) + 8 * _BF16_U


def tolerance(fp8: bool) -> float:
    """The largest :func:`relative_error` the layer may have on its path."""
    return FP8_TOLERANCE if fp8 else BF16_TOLERANCE


def dense_moe_reference(x: Any, topk_ids: Any, topk_weights: Any, w_gate_up: Any,
                        w_down: Any) -> Any:
    """The layer's output in float64 (see the module docstring).

    ``x [T, H]``, ``topk_ids [T, K]`` (negative or >= E: dropped),
    ``topk_weights [T, K]``, ``w_gate_up [E, 2I, H]``, ``w_down [E, H, I]``:
    all NumPy, or all torch tensors on one device (computed there). Returns
    float64 ``[T, H]`` of that kind.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _dense_torch(torch, x, topk_ids, topk_weights, w_gate_up, w_down)
    num_experts, inter = w_gate_up.shape[0], w_down.shape[2]
    xs = np.asarray(x).astype(np.float64)
    ids = np.asarray(topk_ids)
    weights = np.asarray(topk_weights).astype(np.float64)
    out = np.zeros(xs.shape, dtype=np.float64)
    for expert in np.unique(ids[(ids >= 0) & (ids < num_experts)]).tolist():
        tokens, slots = np.nonzero(ids == expert)
        h = xs[tokens] @ w_gate_up[expert].astype(np.float64).T
        gate, up = h[:, :inter], h[:, inter:]
        act = gate / (1.0 + np.exp(-gate)) * up
        y = act @ w_down[expert].astype(np.float64).T
        np.add.at(out, tokens, weights[tokens, slots][:, None] * y)
    return out


def _dense_torch(torch, x, topk_ids, topk_weights, w_gate_up, w_down):
    num_experts, inter = w_gate_up.shape[0], w_down.shape[2]
    xs = x.double()
    weights = topk_weights.double()
    out = torch.zeros(xs.shape, dtype=torch.float64, device=x.device)
    valid = topk_ids[(topk_ids >= 0) & (topk_ids < num_experts)]
    for expert in torch.unique(valid).tolist():
        tokens, slots = torch.nonzero(topk_ids == expert, as_tuple=True)
        h = xs[tokens] @ w_gate_up[expert].double().T
        gate, up = h[:, :inter], h[:, inter:]
        act = torch.nn.functional.silu(gate) * up
        y = act @ w_down[expert].double().T
        out.index_add_(0, tokens, weights[tokens, slots][:, None] * y)
    return out


def relative_error(out: Any, reference: Any) -> float:
    """``||out - reference|| / ||reference||`` (Frobenius, float64); 0 when both
    are zero, inf when only ``reference`` is.

    NumPy arrays or torch tensors (any float dtype, bf16 included).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor):
        diff = torch.linalg.vector_norm(out.double() - reference.double()).item()
        norm = torch.linalg.vector_norm(reference.double()).item()
    else:
        out64 = np.asarray(out).astype(np.float64)
        ref64 = np.asarray(reference).astype(np.float64)
        diff, norm = float(np.linalg.norm(out64 - ref64)), float(np.linalg.norm(ref64))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm
