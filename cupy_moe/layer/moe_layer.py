"""An end-to-end MoE layer: the library's token-layout ops around a grouped GEMM.

bf16 path::

    route -> fused_mapping -> expand_to_fused -> GEMM (gate/up) -> SwiGLU (bf16)
          -> GEMM (down) -> reduce_fused (weighted by the router)

fp8 path::

    route -> fused_mapping -> quantize_fp8 -> expand_to_fused_with_sf
          -> dequantize -> GEMM (gate/up) -> swiglu_quantize_fp8 (weighted)
          -> dequantize -> GEMM (down) -> reduce_fused

The GEMMs are a stand-in (``grouped_gemm``: NumPy, ``torch._grouped_mm`` or
a per-expert loop), not DeepGEMM; the fp8 path dequantizes the expanded fp8
rows with their scale factors into bf16 before each GEMM (what an fp8 GEMM
does inside). Expert weights stay bf16: the activations are what the
token-layout steps move and quantize.

Array kinds: NumPy arrays run on the CPU (the library's NumPy backend, NumPy
GEMMs); torch tensors run on their device (the ops' GPU kernels on CUDA,
torch's GEMMs); CuPy arrays run the library ops on CuPy arrays and the GEMMs,
router and bf16 SwiGLU through zero-copy torch views (torch is needed), the
ops on CuPy's current stream and torch's work on torch's (both default to the
legacy default stream, so they are ordered).
"""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np

from ..combine import reduce_fused
from ..expand import expand_to_fused, expand_to_fused_with_sf
from ..interop import as_cupy, as_torch
from ..mapping import FusedMapping, fused_mapping
from ..quantize import quantize_fp8, swiglu_quantize_fp8
from ..runtime.arrays import ArrayKind, common_kind, describe
from ..runtime.rules import require_bool, require_int
from .grouped_gemm import grouped_gemm, resolve_method
from .routing import route

__all__ = ["BF16_STEPS", "FP8_STEPS", "LIBRARY_STEPS", "MoeLayer", "moe_layer"]

BF16_STEPS = ("route", "mapping", "expand", "gemm_gate_up", "swiglu", "gemm_down", "reduce")
FP8_STEPS = ("route", "mapping", "quantize", "expand", "dequantize_gate_up", "gemm_gate_up",
             "swiglu", "dequantize_down", "gemm_down", "reduce")
# What each step calls, per path: the library's ops (the token-layout steps)
# and the rest.
LIBRARY_STEPS = {
    "bf16": {"mapping": "fused_mapping", "expand": "expand_to_fused",
             "reduce": "reduce_fused"},
    "fp8": {"mapping": "fused_mapping", "quantize": "quantize_fp8",
            "expand": "expand_to_fused_with_sf", "swiglu": "swiglu_quantize_fp8",
            "reduce": "reduce_fused"},
}

_BF16_NAMES = {ArrayKind.NUMPY: "bfloat16", ArrayKind.TORCH_CPU: "bfloat16",
               ArrayKind.TORCH_CUDA: "bfloat16", ArrayKind.CUPY: "uint16"}
_LOGIT_DTYPES = ("float32", "bfloat16", "float16")
# CuPy results of the ops -> the torch dtype their bits are
_TORCH_VIEW_OF = {"uint16": "bfloat16", "uint8": "float8_e4m3fn"}


def moe_layer(x: Any, router_logits: Any, w_gate_up: Any, w_down: Any, *, top_k: int,
              alignment: int = 128, fp8: bool = False, num_per_channels: int = 128,
              renormalize: bool = True, gemm: str = "auto", zero_padding: bool = True,
              return_intermediates: bool = False) -> Any:
    """One MoE layer's routed experts, end to end (module docstring: the steps).

    Parameters
    ----------
    x : array [T, H], bfloat16 (CuPy: uint16 bf16 bits)
        Token rows. T may be 0.
    router_logits : array [T, E], float32 (bfloat16, float16 also; CuPy has
        no bfloat16: float32 or float16 there)
        Router scores; softmax then top-k (``routing.route``).
    w_gate_up : array [E, 2I, H], bfloat16
        Each expert's gate (rows 0 .. I) and up (rows I .. 2I) projections.
    w_down : array [E, H, I], bfloat16
        Each expert's down projection.
    top_k : int, 1 <= top_k <= E
    alignment : int >= 1
        Rows per expert segment are a multiple of this (the GEMM's M block).
    fp8 : bool
        The fp8 path: e4m3 activations with float32 scale factors, one per
        ``num_per_channels`` channels (row-major layout).
    num_per_channels : {32, 128}
        The fp8 path's block size.
    renormalize : bool
        Divide each token's top-k weights by their sum (Qwen3's
        ``norm_topk_prob``); else the raw softmax probabilities.
    gemm : {"auto", "numpy", "grouped_mm", "loop"}
        The grouped GEMM's method (``grouped_gemm``); "auto" picks (a
        per-expert loop where H or I is not a multiple of 8, which
        ``torch._grouped_mm`` refuses; "grouped_mm" there is a ValueError).
    zero_padding : bool
        False: the expand and (fp8) SwiGLU-quantize steps leave padding rows
        unwritten (their ``zero_padding=False``), which saves the zero-fill's
        stores on padded plans. The output is the same bit for bit: the GEMMs
        compute each row from that row alone, the bf16 SwiGLU zeroes padding
        rows, and ``reduce_fused`` reads routed rows only. The intermediates'
        padding rows then hold anything (NaN included).
    return_intermediates : bool
        Also return every step's outputs (a dict).

    Returns
    -------
    out : array [T, H], bfloat16, x's kind and device
        ``sum_k topk_weights[t, k] * down_e(swiglu(gate_up_e(x[t])))``.
        Within ``dense_reference.tolerance(fp8)`` of
        ``dense_reference.dense_moe_reference`` (relative Frobenius error).
    intermediates : dict (with ``return_intermediates``)
        ``topk_ids``, ``topk_weights``, ``plan`` (the ``FusedMapping``),
        ``expanded`` (and on fp8 ``x_fp8``, ``x_sf``, ``expanded_sf``,
        ``gate_up_input``), ``h`` ([X, 2I]), ``act`` (fp8: and ``act_sf``,
        ``down_input``), ``y`` ([X, H]), ``out``, ``gemm`` (the method used);
        padding rows zero unless ``zero_padding=False``, but for ``h`` and
        ``y`` past the last expert's segment with ``gemm="grouped_mm"``
        (torch leaves them unspecified).
        For CuPy inputs the GEMM side's arrays are torch views.

    Raises
    ------
    TypeError
        An argument is not an array, arrays of different kinds are mixed, or a
        size or flag has the wrong type.
    ValueError
        A shape or dtype does not fit the layer, ``top_k`` is out of range, or
        ``gemm`` is unknown or does not fit the arrays' kind.
    """
    layer = MoeLayer(x, router_logits, w_gate_up, w_down, top_k=top_k, alignment=alignment,
                     fp8=fp8, num_per_channels=num_per_channels, renormalize=renormalize,
                     gemm=gemm, zero_padding=zero_padding)
    out = layer.run()
    if return_intermediates:
        return out, dict(layer.state, gemm=layer.gemm)
    return out


class MoeLayer:
    """A layer call taken apart: ``run()`` does every step in order;
    ``run_step(name)`` one of them (the benchmark times them one by one).

    Each step reads its inputs from ``state`` and writes its outputs there, so
    once ``run()`` has been called any step can be repeated on its own.
    ``steps`` names them in order; ``LIBRARY_STEPS[path]`` says which are the
    library's ops. Arguments as in :func:`moe_layer`.
    """

    def __init__(self, x: Any, router_logits: Any, w_gate_up: Any, w_down: Any, *, top_k: int,
                 alignment: int = 128, fp8: bool = False, num_per_channels: int = 128,
                 renormalize: bool = True, gemm: str = "auto",
                 zero_padding: bool = True) -> None:
        descs = {"x": describe("x", x), "router_logits": describe("router_logits", router_logits),
                 "w_gate_up": describe("w_gate_up", w_gate_up),
                 "w_down": describe("w_down", w_down)}
        self.kind, _ = common_kind(descs)
        self.top_k = require_int("top_k", top_k)
        self.alignment = require_int("alignment", alignment)
        self.fp8 = require_bool("fp8", fp8)
        self.num_per_channels = require_int("num_per_channels", num_per_channels)
        self.renormalize = require_bool("renormalize", renormalize)
        self.zero_padding = require_bool("zero_padding", zero_padding)
        self.num_experts, self.intermediate = _check_shapes(
            self.kind, descs, self.top_k, self.alignment, self.num_per_channels)
        self.path = "fp8" if self.fp8 else "bf16"
        self.steps = FP8_STEPS if self.fp8 else BF16_STEPS
        self._via_cupy = self.kind is ArrayKind.CUPY
        if self._via_cupy:
            x, router_logits, w_gate_up, w_down = (
                as_torch(x, "bfloat16"), as_torch(router_logits),
                as_torch(w_gate_up, "bfloat16"), as_torch(w_down, "bfloat16"))
        self._torch = self.kind is not ArrayKind.NUMPY
        self.x, self.router_logits = x, router_logits
        self.w_gate_up, self.w_down = w_gate_up, w_down
        self.gemm = resolve_method(x, gemm, {"H": x.shape[1], "I": self.intermediate})
        self.state: dict[str, Any] = {}

    def run(self) -> Any:
        """Every step in order; the output ``[T, H]`` (of the inputs' kind)."""
        for name in self.steps:
            self.run_step(name)
        return self.output()

    def output(self) -> Any:
        out = self.state["out"]
        return as_cupy(out) if self._via_cupy else out

    def run_step(self, name: str) -> None:
        """One step (``steps`` names them); its inputs must be in ``state``."""
        if name not in self.steps:
            raise ValueError(f"the {self.path} path has no step {name!r}; its steps: "
                             f"{', '.join(self.steps)}")
        getattr(self, f"_step_{name}")()

    # --- the library's ops, on the arrays' own kind ---------------------------

    def _op(self, op, *args, **kwargs):
        """``op`` on the inputs' kind: torch tensors go to CuPy and back for CuPy callers."""
        if not self._via_cupy:
            return op(*args, **kwargs)
        torch = sys.modules["torch"]

        def to_op(a):
            return as_cupy(a) if isinstance(a, torch.Tensor) else a

        def from_op(a):
            return as_torch(a, _TORCH_VIEW_OF.get(a.dtype.name))

        result = op(*map(to_op, args), **{k: to_op(v) for k, v in kwargs.items()})
        if isinstance(result, FusedMapping):
            return FusedMapping(*map(from_op, result))
        if isinstance(result, tuple):
            return tuple(map(from_op, result))
        return from_op(result)

    # --- the steps ------------------------------------------------------------

    def _step_route(self) -> None:
        ids, weights = route(self.router_logits, self.top_k, renormalize=self.renormalize)
        self.state.update(topk_ids=ids, topk_weights=weights)

    def _step_mapping(self) -> None:
        self.state["plan"] = self._op(fused_mapping, self.state["topk_ids"], self.num_experts,
                                      alignment=self.alignment)

    def _step_quantize(self) -> None:
        self.state["x_fp8"], self.state["x_sf"] = self._op(
            quantize_fp8, self.x, num_per_channels=self.num_per_channels)

    def _step_expand(self) -> None:
        plan = self.state["plan"]
        if self.fp8:
            self.state["expanded"], self.state["expanded_sf"] = self._op(
                expand_to_fused_with_sf, self.state["x_fp8"], self.state["x_sf"],
                plan.token_topk_to_pos, plan.pos_to_expert,
                num_per_channels=self.num_per_channels, zero_padding=self.zero_padding,
                pos_to_token=plan.pos_to_token)
        else:
            self.state["expanded"] = self._op(expand_to_fused, self.x, plan.token_topk_to_pos,
                                              plan.pos_to_expert, zero_padding=self.zero_padding,
                                              pos_to_token=plan.pos_to_token)

    def _step_dequantize_gate_up(self) -> None:
        self.state["gate_up_input"] = self._dequantize(self.state["expanded"],
                                                       self.state["expanded_sf"])

    def _step_gemm_gate_up(self) -> None:
        rows = self.state["gate_up_input"] if self.fp8 else self.state["expanded"]
        self.state["h"] = self._gemm(rows, self.w_gate_up)

    def _step_swiglu(self) -> None:
        plan, h = self.state["plan"], self.state["h"]
        if self.fp8:
            self.state["act"], self.state["act_sf"] = self._op(
                swiglu_quantize_fp8, h, num_per_channels=self.num_per_channels,
                topk_weights=self.state["topk_weights"],
                pos_to_token_topk=plan.pos_to_token_topk, pos_to_expert=plan.pos_to_expert,
                zero_padding=self.zero_padding, token_topk_to_pos=plan.token_topk_to_pos)
        else:
            self.state["act"] = self._swiglu_bf16(h, plan.pos_to_expert)

    def _step_dequantize_down(self) -> None:
        self.state["down_input"] = self._dequantize(self.state["act"], self.state["act_sf"])

    def _step_gemm_down(self) -> None:
        rows = self.state["down_input"] if self.fp8 else self.state["act"]
        self.state["y"] = self._gemm(rows, self.w_down)

    def _step_reduce(self) -> None:
        # fp8: swiglu_quantize_fp8 has applied the router's weights already
        weights = None if self.fp8 else self.state["topk_weights"]
        self.state["out"] = self._op(reduce_fused, self.state["y"],
                                     self.state["plan"].token_topk_to_pos, weights)

    # --- the GEMM side (NumPy or torch) ---------------------------------------

    def _gemm(self, rows: Any, weights: Any) -> Any:
        plan = self.state["plan"]
        return grouped_gemm(rows, weights, plan.expert_start, plan.tokens_per_expert,
                            alignment=self.alignment, method=self.gemm)

    def _swiglu_bf16(self, h: Any, pos_to_expert: Any) -> Any:
        """``silu(gate) * up`` in float32, rounded to bf16; padding rows zero."""
        inter = self.intermediate
        if self._torch:
            torch = sys.modules["torch"]
            gate, up = h[:, :inter].float(), h[:, inter:].float()
            act = torch.nn.functional.silu(gate) * up
            act = torch.where((pos_to_expert >= 0)[:, None], act, 0.0)
            return act.to(torch.bfloat16)
        gate, up = h[:, :inter].astype(np.float32), h[:, inter:].astype(np.float32)
        with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g: silu -> -0
            act = gate / (np.float32(1) + np.exp(-gate)) * up
        act[np.asarray(pos_to_expert) < 0] = 0
        return act.astype(ml_dtypes.bfloat16)

    def _dequantize(self, codes: Any, scale_factors: Any) -> Any:
        """e4m3 codes [X, C] times their blocks' float32 scale factors, as bf16."""
        npc, cols = self.num_per_channels, codes.shape[1]
        if self._torch:
            torch = sys.modules["torch"]
            scales = scale_factors.repeat_interleave(npc, dim=1)[:, :cols]
            return (codes.float() * scales).to(torch.bfloat16)
        scales = np.repeat(np.asarray(scale_factors), npc, axis=1)[:, :cols]
        # padding rows left unwritten (zero_padding=False) may hold inf * 0
        with np.errstate(invalid="ignore", over="ignore"):
            return (codes.astype(np.float32) * scales).astype(ml_dtypes.bfloat16)


def _check_shapes(kind: ArrayKind, descs: dict, top_k: int, alignment: int,
                  num_per_channels: int) -> tuple[int, int]:
    """(E, I) of the layer; ValueError naming the first rule that fails."""
    bf16 = _BF16_NAMES[kind]
    for name in ("x", "w_gate_up", "w_down"):
        if descs[name].dtype != bf16:
            raise ValueError(f"{name} must be bf16 ({bf16} on {kind.value}); "
                             f"got {descs[name].dtype}")
    if descs["router_logits"].dtype not in _LOGIT_DTYPES:
        raise ValueError(f"router_logits must be one of {', '.join(_LOGIT_DTYPES)}; "
                         f"got {descs['router_logits'].dtype}")
    shapes = {name: tuple(desc.shape) for name, desc in descs.items()}
    for name, ndim, layout in (("x", 2, "[T, H]"), ("router_logits", 2, "[T, E]"),
                               ("w_gate_up", 3, "[E, 2I, H]"), ("w_down", 3, "[E, H, I]")):
        if len(shapes[name]) != ndim:
            raise ValueError(f"{name} must be {ndim}-D {layout}; got shape {shapes[name]}")
    (tokens, hidden), (experts, two_inter, _) = shapes["x"], shapes["w_gate_up"]
    inter = two_inter // 2
    expected = {"router_logits": (tokens, experts), "w_gate_up": (experts, 2 * inter, hidden),
                "w_down": (experts, hidden, inter)}
    if two_inter % 2 or two_inter == 0:
        raise ValueError(f"w_gate_up must be [E, 2I, H] with I >= 1; got shape "
                         f"{shapes['w_gate_up']}")
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise ValueError(f"{name} must have shape {shape} (x {shapes['x']}, w_gate_up "
                             f"{shapes['w_gate_up']}); got {shapes[name]}")
    if experts < 1:
        raise ValueError(f"the layer needs at least one expert; got E = {experts}")
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be in [1, E = {experts}]; got {top_k}")
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1; got {alignment}")
    if num_per_channels not in (32, 128):
        raise ValueError(f"num_per_channels must be 32 or 128; got {num_per_channels}")
    return experts, inter
