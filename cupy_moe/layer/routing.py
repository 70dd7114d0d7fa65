"""The router: softmax over the logits, then the top-k experts of each token."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..runtime.rules import require_int

__all__ = ["route"]


def route(router_logits: Any, top_k: int, *, renormalize: bool = True) -> tuple[Any, Any]:
    """Top-k routing of ``router_logits [T, E]`` (NumPy array or torch tensor).

    ``probs = softmax(logits)`` in float32 over the E experts; each token's
    ``top_k`` most probable experts, most probable first. NumPy breaks ties by
    the lower expert index (a stable sort); ``torch.topk`` does not promise
    an order for ties (random logits have none). With ``renormalize`` (the
    Qwen3 router's ``norm_topk_prob``) a token's K weights are divided by
    their sum, so they add up to 1; without it they are the softmax
    probabilities themselves.

    Returns ``(topk_ids [T, K] int64, topk_weights [T, K] float32)`` of the
    logits' kind and device (int64: what ``torch.topk`` returns and
    ``fused_mapping`` takes). TypeError for a ``top_k`` that is not an int,
    ValueError unless ``1 <= top_k <= E``.
    """
    top_k = require_int("top_k", top_k)
    shape = np.shape(router_logits)
    experts = shape[-1] if shape else 0
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be in [1, E = {experts}]; got {top_k}")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(router_logits, torch.Tensor):
        probs = torch.softmax(router_logits.float(), dim=-1)
        weights, ids = torch.topk(probs, top_k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights.contiguous()
    logits = np.asarray(router_logits, dtype=np.float32)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = shifted / shifted.sum(axis=-1, keepdims=True)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k].astype(np.int64)
    weights = np.take_along_axis(probs, ids, axis=-1)
    if renormalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return ids, np.ascontiguousarray(weights, dtype=np.float32)
