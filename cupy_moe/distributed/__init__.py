"""Expert parallelism on torch.distributed: each of R ranks holds E/R experts.

``partition`` (which rank owns which experts), ``exchange`` (the group, and
``all_to_all_single`` of row blocks), ``rules`` (argument checks, before any
collective), ``dispatch`` (token rows to the ranks of their experts, then the
local ``fused_mapping`` + expand), ``combine`` (expert outputs back, summed in
float32 in rank order), ``ep_layer`` (the MoE layer, expert-parallel).

Inputs are torch tensors: CPU tensors with a gloo group, CUDA tensors with
NCCL. The group defaults to the default process group.
"""

from .combine import combine
from .dispatch import dispatch
from .ep_layer import EP_BF16_STEPS, EP_FP8_STEPS, EpMoeLayer, ep_moe_layer
from .handle import Dispatched, DispatchHandle
from .partition import ExpertPartition, partition_experts

__all__ = ["EP_BF16_STEPS", "EP_FP8_STEPS", "DispatchHandle", "Dispatched", "EpMoeLayer",
           "ExpertPartition", "combine", "dispatch", "ep_moe_layer", "partition_experts"]
