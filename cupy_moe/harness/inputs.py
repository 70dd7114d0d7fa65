"""Inputs for a workload: random payload bits and a realistic routing plan
(packed into the stated rows, or the workload's seeded real plan), or (for
``fused_mapping``) random top-k expert ids.

Shared by the GPU tests, the benchmarks and the CLI, so that what is timed is
what is tested. Everything is NumPy on the host; callers move it to a device.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from cupy_moe.reference import fused_mapping_numpy

from .manifest import MAPPING_OP_NAMES, Workload

__all__ = ["fitted_routing", "numpy_dtype", "plan_routing", "random_bits", "random_topk_ids",
           "workload_inputs"]

# Share of the slots random_topk_ids drops (-1): a few, as where a router
# masks some slots.
TOPK_DROP = 0.02


def numpy_dtype(name) -> np.dtype:
    """NumPy dtype of a manifest dtype name (bf16 and fp8 from ml_dtypes), or of a dtype."""
    if isinstance(name, str):
        return np.dtype(getattr(ml_dtypes, name, None) or name)
    return np.dtype(name)


def random_bits(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    """An array of ``dtype`` whose bytes are uniformly random: every code of the
    type occurs, NaN and infinity encodings and negative zero included."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = rng.integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def fitted_routing(rng: np.random.Generator, num_tokens: int, top_k: int, num_expanded: int,
                   *, num_experts: int = 32, max_alignment: int = 16,
                   drop: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Expert-major routing of random experts with dropped slots, in exactly X rows.

    Each slot picks a random expert (a ``drop`` share is dropped); experts'
    segments are aligned to the largest power of two <= ``max_alignment``
    that fits the layout in ``num_expanded`` rows (more slots are dropped if
    even alignment 1 does not); padding rows fill the rest. Returns int32
    ``token_topk_to_pos [T, K]`` and ``pos_to_expert [X]``.
    """
    topk_ids = rng.integers(0, num_experts, size=(num_tokens, top_k))
    topk_ids[rng.random(topk_ids.shape) < drop] = -1
    while True:
        alignment = max_alignment
        while True:
            plan = fused_mapping_numpy(topk_ids, num_experts, alignment=alignment)
            token_topk_to_pos, pos_to_expert = plan.token_topk_to_pos, plan.pos_to_expert
            if pos_to_expert.shape[0] <= num_expanded or alignment == 1:
                break
            alignment //= 2
        if pos_to_expert.shape[0] <= num_expanded:
            break
        topk_ids[rng.random(topk_ids.shape) < 0.1] = -1
    tail = np.full(num_expanded - pos_to_expert.shape[0], -1, dtype=np.int32)
    return token_topk_to_pos, np.concatenate([pos_to_expert, tail])


def random_topk_ids(rng: np.random.Generator, num_tokens: int, top_k: int, num_experts: int,
                    *, drop: float = TOPK_DROP, dtype="int64") -> np.ndarray:
    """Top-k expert ids ``[T, K]`` of ``dtype``: each slot an expert drawn
    uniformly from ``[0, num_experts)``, independently (a token may pick an
    expert twice), then each slot set to -1 (dropped) with probability
    ``drop``."""
    topk_ids = rng.integers(0, num_experts, size=(num_tokens, top_k), dtype=np.int64)
    topk_ids[rng.random(topk_ids.shape) < drop] = -1
    return topk_ids.astype(numpy_dtype(dtype), copy=False)


def plan_routing(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """The real plan of an expand workload with a ``plan:``: int32
    ``token_topk_to_pos [T, K]`` and ``pos_to_expert [X]`` of
    ``fused_mapping_numpy`` over the plan's seeded ids (those of other ranks'
    experts dropped), at the exact X. The same on every call (new arrays)."""
    spec = workload.plan
    if spec is None:
        raise ValueError(f"{workload.label}: the workload has no plan")
    topk_ids = spec.topk_ids(workload.num_tokens, workload.top_k)
    plan = fused_mapping_numpy(topk_ids, spec.num_experts, alignment=spec.alignment)
    if plan.pos_to_expert.shape != (workload.num_expanded,):  # the manifest's X is this plan's
        raise AssertionError(f"{workload.label}: the plan has {plan.pos_to_expert.shape[0]} "
                             f"rows, the manifest says {workload.num_expanded}")
    return plan.token_topk_to_pos, plan.pos_to_expert


def workload_inputs(workload: Workload, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Host inputs of one manifest workload, keyed by argument name: ``x [T, H]``
    (and ``x_sf [T, S]``) of the workload's dtypes with random bits,
    ``token_topk_to_pos [T, K]`` and ``pos_to_expert [X]`` int32 from
    :func:`fitted_routing`, or from :func:`plan_routing` for a workload with a
    plan (``rng`` then draws the payload only); for ``fused_mapping``,
    ``topk_ids [T, K]`` of the workload's dtype from :func:`random_topk_ids`."""
    if workload.op in MAPPING_OP_NAMES:
        return {"topk_ids": random_topk_ids(rng, workload.num_tokens, workload.top_k,
                                            workload.num_experts, dtype=workload.dtype)}
    inputs = {"x": random_bits(rng, workload.shapes["x"], numpy_dtype(workload.dtype))}
    if workload.sf_dtype is not None:
        inputs["x_sf"] = random_bits(rng, workload.shapes["x_sf"], numpy_dtype(workload.sf_dtype))
    if workload.plan is not None:
        inputs["token_topk_to_pos"], inputs["pos_to_expert"] = plan_routing(workload)
    else:
        inputs["token_topk_to_pos"], inputs["pos_to_expert"] = fitted_routing(
            rng, workload.num_tokens, workload.top_k, workload.num_expanded)
    return inputs
