"""Model shapes of the MoE layers the library targets, and random inputs of
those shapes: token rows, router logits and expert weights.

The weights are random (no checkpoint is read): the layer's numerics, not a
model's outputs, are what is checked. Values are scaled so that every stage
stays near unit size (``x ~ N(0, 1)``, a projection's weights ``~ N(0,
1/fan_in)``), where bf16 and e4m3 rounding errors are relative errors.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from ..runtime.extras import require_torch

__all__ = ["MODELS", "MoeInputs", "MoeShape", "model_shape", "random_moe_inputs"]


class MoeShape(NamedTuple):
    """The sizes of one MoE layer: hidden H, expert intermediate I, experts E, top-k K."""

    name: str
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int

    def weight_bytes(self) -> int:
        """Bytes of the bf16 expert weights: ``w_gate_up [E, 2I, H]`` plus ``w_down [E, H, I]``."""
        return 2 * 3 * self.num_experts * self.intermediate * self.hidden

    def with_experts(self, num_experts: int) -> MoeShape:
        return self._replace(num_experts=num_experts)


# The manifest's models (cupy_moe/harness/workloads.yaml, "the combine and the
# fp8 producers"): Kimi-K2 and Qwen3-30B-A3B, both top-8, softmax routers.
MODELS: dict[str, MoeShape] = {
    "kimi-k2": MoeShape("kimi-k2", hidden=7168, intermediate=2048, num_experts=384, top_k=8),
    "qwen3-30b-a3b": MoeShape("qwen3-30b-a3b", hidden=2048, intermediate=768, num_experts=128,
                              top_k=8),
}


def model_shape(name: str) -> MoeShape:
    """The shape of a model of :data:`MODELS`; ValueError naming the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


class MoeInputs(NamedTuple):
    """One layer call's inputs (NumPy, or torch tensors on one device).

    ``x [T, H]`` bf16, ``router_logits [T, E]`` float32, ``w_gate_up [E, 2I,
    H]`` bf16 (gate rows first, then up rows), ``w_down [E, H, I]`` bf16.
    """

    x: Any
    router_logits: Any
    w_gate_up: Any
    w_down: Any


def random_moe_inputs(shape: MoeShape, num_tokens: int, *, seed: int = 0,
                      device: str | None = None) -> MoeInputs:
    """Random inputs of ``shape`` for ``num_tokens`` tokens.

    ``device=None`` gives NumPy arrays (bf16 as ``ml_dtypes.bfloat16``), drawn
    by ``numpy.random.default_rng(seed)`` one expert at a time (no float32
    copy of all the weights); a torch device string (``"cuda"``, ``"cpu"``)
    gives torch tensors drawn there by a ``torch.Generator`` seeded with
    ``seed`` (the two do not draw the same values).
    """
    hidden, inter, experts = shape.hidden, shape.intermediate, shape.num_experts
    if device is None:
        rng = np.random.default_rng(seed)
        bf16 = ml_dtypes.bfloat16
        x = rng.standard_normal((num_tokens, hidden), dtype=np.float32).astype(bf16)
        logits = rng.standard_normal((num_tokens, experts), dtype=np.float32)
        w_gate_up = np.empty((experts, 2 * inter, hidden), dtype=bf16)
        w_down = np.empty((experts, hidden, inter), dtype=bf16)
        for e in range(experts):
            w_gate_up[e] = (rng.standard_normal((2 * inter, hidden), dtype=np.float32)
                            * np.float32(hidden ** -0.5)).astype(bf16)
            w_down[e] = (rng.standard_normal((hidden, inter), dtype=np.float32)
                         * np.float32(inter ** -0.5)).astype(bf16)
        return MoeInputs(x, logits, w_gate_up, w_down)
    torch = require_torch(f"random_moe_inputs(device={device!r})")

    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*size: int, scale: float = 1.0, dtype=torch.bfloat16):
        out = torch.empty(size, dtype=dtype, device=device)
        return out.normal_(0.0, scale, generator=gen)

    return MoeInputs(normal(num_tokens, hidden),
                     normal(num_tokens, experts, dtype=torch.float32),
                     normal(experts, 2 * inter, hidden, scale=hidden ** -0.5),
                     normal(experts, hidden, inter, scale=inter ** -0.5))
