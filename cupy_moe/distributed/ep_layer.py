"""The MoE layer of ``cupy_moe.layer.moe_layer``, expert-parallel: each rank
holds E/R experts and routes its own tokens.

bf16 path::

    route -> dispatch (fused_mapping + expand_to_fused on the received rows)
          -> GEMM (gate/up) -> SwiGLU -> GEMM (down) -> combine

fp8 path::

    route -> quantize_fp8 -> dispatch (fp8 rows + scale factors; expand_to_fused_with_sf)
          -> dequantize -> GEMM (gate/up) -> swiglu_quantize_fp8 (weighted)
          -> dequantize -> GEMM (down) -> combine (unweighted)

The GEMM, SwiGLU and dequantize steps are ``MoeLayer``'s own, run on the
received rows with this rank's expert shards: ``EpMoeLayer`` subclasses it
and replaces the mapping and expand steps by ``dispatch``, the reduce by
``combine``.

Equality with the one-process layer over the full weights (the tokens of all
ranks, in rank order, as one batch; same path and arguments):

- Bit-exact, whatever R: the routing (each token's row of the router is the
  same), the fp8 codes and scale factors (per token), and every expanded
  row (a byte copy). Every expert gets the same rows in the same order as in
  the one-process layer (source rank, then token), so the per-row expert
  outputs are the same wherever the GEMM's result for a row depends on its
  expert's rows alone: tested on the CPU (torch's ``_grouped_mm``); on a
  GPU, ``gemm="loop"`` runs the same per-expert matmuls, while
  ``_grouped_mm`` chooses its kernel for the whole problem (not promised
  there). Given equal expert outputs, every token whose valid
  slots all sit on one rank gets the one-process output bit for bit (its
  float32 partial is the one-process accumulator: ``combine``'s numerics).
  With R = 1 that is every token.
- Any other token: the float32 sum is split at rank boundaries
  (``combine``), so its output may differ from the one-process output in
  the final bf16 rounding: the relative Frobenius distance between the two
  outputs is at most two bf16 roundings, 2^-8 (plus the float32
  reassociation, ~K * 2^-24), and the output stays within
  ``dense_reference.tolerance(fp8)`` of the dense reference, as the
  one-process layer does.
"""

from __future__ import annotations

from typing import Any

from ..layer.moe_layer import MoeLayer
from ..layer.routing import route
from ..runtime.rules import require_bool, require_int
from .combine import combine
from .dispatch import dispatch, refuse_dispatch
from .exchange import out_of_step_on_error
from .rules import check_ep_layer

__all__ = ["EP_BF16_STEPS", "EP_FP8_STEPS", "EpMoeLayer", "ep_moe_layer"]

EP_BF16_STEPS = ("route", "dispatch", "gemm_gate_up", "swiglu", "gemm_down", "combine")
EP_FP8_STEPS = ("route", "quantize", "dispatch", "dequantize_gate_up", "gemm_gate_up",
                "swiglu", "dequantize_down", "gemm_down", "combine")
# the steps before dispatch's count exchange: a rank failing in one of them
# still takes its part in the exchange (refuse_dispatch), so that the others
# raise with it instead of waiting there
_BEFORE_EXCHANGE = ("route", "quantize")


def ep_moe_layer(x: Any, router_logits: Any, w_gate_up_local: Any, w_down_local: Any, *,
                 top_k: int, num_experts: int, group: Any = None, alignment: int = 128,
                 fp8: bool = False, num_per_channels: int = 128, renormalize: bool = True,
                 gemm: str = "auto", zero_padding: bool = True,
                 return_intermediates: bool = False) -> Any:
    """One MoE layer's routed experts, expert-parallel over ``group``
    (module docstring: the steps, and how it equals the one-process layer).

    A collective: every rank of the group calls it with its own tokens and
    its shards of the expert weights.

    Parameters
    ----------
    x : torch.Tensor [T, H], bfloat16
        This rank's token rows (CPU with a gloo group, CUDA with NCCL). T may
        differ between ranks, and be 0.
    router_logits : torch.Tensor [T, E], float32 (bfloat16, float16 also)
        Router scores over all E experts; softmax then top-k (``route``).
    w_gate_up_local : torch.Tensor [E / R, 2I, H], bfloat16
        The gate and up projections of this rank's experts, global experts
        ``rank * E/R .. (rank + 1) * E/R`` (``ExpertPartition.shard``).
    w_down_local : torch.Tensor [E / R, H, I], bfloat16
        Their down projections.
    top_k : int, 1 <= top_k <= E
    num_experts : int
        E, a multiple of the group's size R.
    group : torch.distributed ProcessGroup, optional
        Default: the default process group.
    alignment, fp8, num_per_channels, renormalize, gemm, zero_padding
        As in ``moe_layer`` (``zero_padding=False``: dispatch's expand and the
        SwiGLU-quantize leave padding rows unwritten; the output is the same
        bit for bit).
    return_intermediates : bool
        Also return every step's outputs (a dict; see ``EpMoeLayer``).

    Returns
    -------
    out : torch.Tensor [T, H], bfloat16
        ``sum_k topk_weights[t, k] * down_e(swiglu(gate_up_e(x[t])))``, e the
        slot's expert, wherever it is held.
    intermediates : dict (with ``return_intermediates``)

    Raises
    ------
    TypeError, ValueError
        As ``moe_layer`` (the shard shapes must be those of E / R experts),
        plus ``dispatch``'s rules. A rank failing before dispatch's count
        exchange (its own arguments, the router) raises its error and the
        others a ValueError naming it, after that exchange (``dispatch``).
    RuntimeError
        An earlier call failed on this rank after the ranks had begun
        exchanging data (a step after dispatch's count exchange): the group is
        out of step for this rank; destroy it and make a new one.
    """
    layer = EpMoeLayer(x, router_logits, w_gate_up_local, w_down_local, top_k=top_k,
                       num_experts=num_experts, group=group, alignment=alignment, fp8=fp8,
                       num_per_channels=num_per_channels, renormalize=renormalize, gemm=gemm,
                       zero_padding=zero_padding)
    out = layer.run()
    if return_intermediates:
        return out, dict(layer.state, gemm=layer.gemm)
    return out


class EpMoeLayer(MoeLayer):
    """An expert-parallel layer call taken apart, as ``MoeLayer`` (``run``,
    ``run_step``, ``steps``, ``state``); arguments as in :func:`ep_moe_layer`.

    ``state`` after ``run()``: ``source_topk_ids``, ``source_topk_weights``
    (this rank's router output, [T, K]); fp8: ``x_fp8``, ``x_sf``;
    ``handle`` (``DispatchHandle``); then, for the N received rows, what the
    one-process layer holds for its tokens: ``topk_ids`` (local ids, [N, K]),
    ``topk_weights``, ``plan``, ``expanded`` (fp8: ``expanded_sf``,
    ``gate_up_input``), ``h``, ``act`` (fp8: ``act_sf``, ``down_input``),
    ``y``; and ``out`` [T, H].
    """

    def __init__(self, x: Any, router_logits: Any, w_gate_up_local: Any, w_down_local: Any, *,
                 top_k: int, num_experts: int, group: Any = None, alignment: int = 128,
                 fp8: bool = False, num_per_channels: int = 128, renormalize: bool = True,
                 gemm: str = "auto", zero_padding: bool = True) -> None:
        try:
            self._take_arguments(x, router_logits, w_gate_up_local, w_down_local, top_k,
                                 num_experts, group, alignment, fp8, num_per_channels,
                                 renormalize, gemm, zero_padding)
        except Exception:
            refuse_dispatch(group, x, router_logits)  # the other ranks raise with this one
            raise

    def _take_arguments(self, x, router_logits, w_gate_up_local, w_down_local, top_k,
                        num_experts, group, alignment, fp8, num_per_channels, renormalize,
                        gemm, zero_padding) -> None:
        # MoeLayer.__init__ checks a one-process layer's shapes (E experts in
        # the weights); this sets the same attributes, which its steps read,
        # after the expert-parallel rules.
        self.top_k = require_int("top_k", top_k)
        self.alignment = require_int("alignment", alignment)
        self.fp8 = require_bool("fp8", fp8)
        self.num_per_channels = require_int("num_per_channels", num_per_channels)
        self.renormalize = require_bool("renormalize", renormalize)
        self.zero_padding = require_bool("zero_padding", zero_padding)
        problem = check_ep_layer(x, router_logits, w_gate_up_local, w_down_local,
                                 top_k=self.top_k, num_experts=num_experts, group=group,
                                 alignment=self.alignment,
                                 num_per_channels=self.num_per_channels, gemm=gemm)
        self.kind, self.gemm = problem.kind, problem.gemm
        self.group, self.rank = group, problem.info.rank
        self.partition = problem.partition
        self.num_experts = problem.partition.num_experts
        self.num_local_experts = problem.partition.local_experts
        self.intermediate = problem.intermediate
        self.path = "fp8" if self.fp8 else "bf16"
        self.steps = EP_FP8_STEPS if self.fp8 else EP_BF16_STEPS
        self._via_cupy, self._torch = False, True
        self.x, self.router_logits = x, router_logits
        self.w_gate_up, self.w_down = w_gate_up_local, w_down_local
        self.state: dict[str, Any] = {}

    def run_step(self, name: str) -> None:
        if name not in self.steps:
            super().run_step(name)  # its ValueError
        elif name in _BEFORE_EXCHANGE:
            try:
                super().run_step(name)
            except Exception:
                refuse_dispatch(self.group, self.x, self.router_logits)
                raise
        elif name == "dispatch":
            super().run_step(name)  # it keeps track of its own collectives
        else:
            # after dispatch: the other ranks go on to combine's collective,
            # which this rank would not reach (a layer cannot retry combine
            # alone, as a caller of combine may)
            with out_of_step_on_error(self.group):
                super().run_step(name)

    def _step_route(self) -> None:
        # the router's output on this rank's tokens; "topk_ids" / "topk_weights"
        # are the received rows' (what the inherited swiglu step reads)
        ids, weights = route(self.router_logits, self.top_k, renormalize=self.renormalize)
        self.state.update(source_topk_ids=ids, source_topk_weights=weights)

    def _step_dispatch(self) -> None:
        state = self.state
        rows, sf = (state["x_fp8"], state["x_sf"]) if self.fp8 else (self.x, None)
        dispatched = dispatch(rows, state["source_topk_ids"], state["source_topk_weights"],
                              self.num_experts, group=self.group, x_sf=sf,
                              alignment=self.alignment, num_per_channels=self.num_per_channels,
                              zero_padding=self.zero_padding)
        handle = dispatched.handle
        state.update(handle=handle, plan=handle.plan, topk_ids=handle.recv_topk_ids,
                     topk_weights=handle.recv_topk_weights, expanded=dispatched.expanded_x)
        if self.fp8:
            state["expanded_sf"] = dispatched.expanded_sf

    def _step_combine(self) -> None:
        # fp8: swiglu_quantize_fp8 has applied the router's weights already
        self.state["out"] = combine(self.state["y"], self.state["handle"], group=self.group,
                                    weighted=not self.fp8)
