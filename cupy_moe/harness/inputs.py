"""Inputs for a workload: random payload bits and a realistic routing plan
(packed into the stated rows, or the workload's seeded real plan), or (for
``fused_mapping``) random top-k expert ids. The newer ops compute on their
payloads, so theirs are finite random values (:func:`random_values`) rather
than random bits, with router weights and the rows of the workload's plan.

Shared by the GPU tests, the benchmarks and the CLI, so that what is timed is
what is tested. Everything is NumPy on the host; callers move it to a device.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from cupy_moe.mapping.reference import FusedMapping
from cupy_moe.reference import fused_mapping_numpy

from .manifest import MAPPING_OP_NAMES, OP_NAMES, Workload

__all__ = ["fitted_routing", "numpy_dtype", "plan_mapping", "plan_routing", "random_bits",
           "random_topk_ids", "random_values", "random_weights", "workload_inputs"]

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


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype, *,
                  row_spread: float = 0.0) -> np.ndarray:
    """Finite values of ``dtype`` (float32 drawn, rounded to nearest even):
    standard normal, each row times ``2**u`` with ``u`` uniform in
    ``[-row_spread, row_spread]`` (rows of very different magnitude, as
    activations have, where a quantizer's scale factors should vary)."""
    values = rng.standard_normal(shape, dtype=np.float32)
    if row_spread and values.ndim == 2:
        exponents = rng.uniform(-row_spread, row_spread, size=(shape[0], 1))
        values *= np.exp2(exponents).astype(np.float32)
    return values.astype(numpy_dtype(dtype))


def random_weights(rng: np.random.Generator, num_tokens: int, top_k: int) -> np.ndarray:
    """Router weights ``[T, K]`` float32: positive, each token's summing to
    about 1 (a softmax's top-k, renormalised)."""
    raw = rng.random((num_tokens, top_k), dtype=np.float32) + np.float32(1e-3)
    return (raw / raw.sum(axis=1, keepdims=True)).astype(np.float32)


def plan_mapping(workload: Workload) -> FusedMapping:
    """The real plan of a workload with a ``plan:`` (an expand plan workload,
    ``reduce_fused``, ``swiglu_quantize_fp8``): ``fused_mapping_numpy`` over
    the plan's seeded ids (those of other ranks' experts dropped), at the
    exact X (or, for an untrimmed plan, the manifest's worst-case X: the rows
    past the last segment padding), all seven int32 arrays. The same on
    every call (new arrays)."""
    spec = workload.plan
    if spec is None:
        raise ValueError(f"{workload.label}: the workload has no plan")
    topk_ids = spec.topk_ids(workload.num_tokens, workload.top_k)
    plan = fused_mapping_numpy(topk_ids, spec.num_experts, alignment=spec.alignment,
                               num_expanded=None if spec.trimmed else workload.num_expanded)
    if plan.pos_to_expert.shape != (workload.num_expanded,):  # the manifest's X is this plan's
        raise AssertionError(f"{workload.label}: the plan has {plan.pos_to_expert.shape[0]} "
                             f"rows, the manifest says {workload.num_expanded}")
    return plan


def plan_routing(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """int32 ``token_topk_to_pos [T, K]`` and ``pos_to_expert [X]`` of the
    workload's real plan (:func:`plan_mapping`)."""
    plan = plan_mapping(workload)
    return plan.token_topk_to_pos, plan.pos_to_expert


def _routed_rows_values(rng: np.random.Generator, shape: tuple[int, int], dtype,
                        pos_to_expert: np.ndarray) -> np.ndarray:
    """``[X, W]`` rows of a plan: random values (:func:`random_values`) on the
    routed rows, zeros on the padding rows, as a grouped GEMM gives them
    (expand zero-fills its padding rows). Zeros cost nothing to draw, and
    the padded plans' X is mostly padding."""
    values = np.zeros(shape, dtype=numpy_dtype(dtype))
    routed = np.flatnonzero(pos_to_expert >= 0)
    values[routed] = random_values(rng, (routed.size, shape[1]), dtype)
    return values


def _newer_op_inputs(workload: Workload, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Host inputs of ``reduce_fused``, ``quantize_fp8`` or
    ``swiglu_quantize_fp8``, keyed and ordered as ``workload.shapes``."""
    shapes = workload.shapes
    if workload.op == "quantize_fp8":
        # rows from 2^-8 to 2^8 times a standard normal: scale factors vary
        return {"x": random_values(rng, shapes["x"], workload.dtype, row_spread=8.0)}
    plan = plan_mapping(workload)
    rows = "expanded" if workload.op == "reduce_fused" else "h"
    available = {
        rows: lambda: _routed_rows_values(rng, shapes[rows], workload.dtype,
                                          plan.pos_to_expert),
        "token_topk_to_pos": lambda: plan.token_topk_to_pos,
        "topk_weights": lambda: random_weights(rng, workload.num_tokens, workload.top_k),
        "row_scale": lambda: np.exp2(rng.uniform(-2, 2, size=shapes["row_scale"]),
                                     dtype=np.float32),
        "pos_to_token_topk": lambda: plan.pos_to_token_topk,
        "pos_to_expert": lambda: plan.pos_to_expert,
    }
    return {name: available[name]() for name in shapes}


def workload_inputs(workload: Workload, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Host inputs of one manifest workload, keyed by argument name: ``x [T, H]``
    (and ``x_sf [T, S]``) of the workload's dtypes with random bits,
    ``token_topk_to_pos [T, K]`` and ``pos_to_expert [X]`` int32 from
    :func:`fitted_routing`, or from the workload's plan (:func:`plan_mapping`;
    ``rng`` then draws the payload only; then also ``pos_to_token [X]``, the
    hint a caller with the plan passes); for
    ``fused_mapping``,
    ``topk_ids [T, K]`` of the workload's dtype from :func:`random_topk_ids`.

    The newer ops get one array a name of ``workload.shapes``: finite values
    (:func:`random_values`) for ``x`` and for the routed rows of ``expanded``
    and ``h`` (their padding rows zero, as a grouped GEMM leaves them), router
    weights (:func:`random_weights`), ``row_scale`` float32 in ``[1/4, 4]``,
    and the maps of the workload's plan (:func:`plan_mapping`)."""
    if workload.op in MAPPING_OP_NAMES:
        return {"topk_ids": random_topk_ids(rng, workload.num_tokens, workload.top_k,
                                            workload.num_experts, dtype=workload.dtype)}
    if workload.op not in OP_NAMES:
        return _newer_op_inputs(workload, rng)
    inputs = {"x": random_bits(rng, workload.shapes["x"], numpy_dtype(workload.dtype))}
    if workload.sf_dtype is not None:
        inputs["x_sf"] = random_bits(rng, workload.shapes["x_sf"], numpy_dtype(workload.sf_dtype))
    if workload.plan is not None:
        plan = plan_mapping(workload)
        inputs["token_topk_to_pos"], inputs["pos_to_expert"] = (plan.token_topk_to_pos,
                                                                plan.pos_to_expert)
        inputs["pos_to_token"] = plan.pos_to_token  # the hint a caller with the plan passes
    else:
        inputs["token_topk_to_pos"], inputs["pos_to_expert"] = fitted_routing(
            rng, workload.num_tokens, workload.top_k, workload.num_expanded)
    return inputs
