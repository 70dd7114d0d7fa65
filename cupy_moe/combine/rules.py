"""Shape and dtype rules of ``reduce_fused``, and its error messages.

Rules read ``ArrayDesc`` tuples, so every array kind shares one set of rules
and one wording of each error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..runtime.arrays import ArrayDesc
from ..runtime.rules import check_dtype, check_ndim, check_out

# Expert outputs: bf16 (uint16 carries bf16 bits where an array library has no
# bfloat16, as in the expand ops: CuPy), fp16, fp32. The result has the same dtype.
COMBINE_DTYPES = ("bfloat16", "float16", "float32", "uint16")
MAP_DTYPE = "int32"
SCALE_DTYPE = "float32"
# What the kernels compute in for each dtype (uint16 is bf16 bits).
ELEMENT_FORMAT = {"bfloat16": "bf16", "uint16": "bf16", "float16": "f16", "float32": "f32"}


@dataclass(frozen=True)
class CombineProblem:
    """Sizes of one call, after every rule has been checked."""

    num_tokens: int
    hidden: int
    top_k: int
    num_expanded: int
    dtype: str
    has_weights: bool
    has_row_scale: bool
    # a bf16 / fp16 call's float32 out: the sums stored unrounded
    out_float32: bool = False

    @property
    def element_format(self) -> str:
        return ELEMENT_FORMAT[self.dtype]

    @property
    def out_item_bytes(self) -> int:
        return 4 if self.out_float32 or self.element_format == "f32" else 2

    def out_shape(self) -> tuple[int, int]:
        return (self.num_tokens, self.hidden)

    def out_strides(self) -> tuple[int, int]:
        return (self.hidden, 1)


def check_reduce_fused(expanded: ArrayDesc, token_topk_to_pos: ArrayDesc,
                       topk_weights: ArrayDesc | None,
                       row_scale: ArrayDesc | None) -> CombineProblem:
    """Check the rules of ``reduce_fused`` and return the call's sizes."""
    check_ndim("expanded", expanded, 2, "[X, H]")
    check_ndim("token_topk_to_pos", token_topk_to_pos, 2, "[T, K]")
    check_dtype("expanded", expanded, COMBINE_DTYPES)
    check_dtype("token_topk_to_pos", token_topk_to_pos, (MAP_DTYPE,))
    num_expanded, hidden = expanded.shape
    num_tokens, top_k = token_topk_to_pos.shape
    if hidden < 1:
        raise ValueError(f"expanded must have H = expanded.shape[1] >= 1 columns; got shape "
                         f"{tuple(expanded.shape)}")
    if top_k < 1:
        raise ValueError(f"token_topk_to_pos must have K = shape[1] >= 1 slots; got {top_k}")
    if topk_weights is not None:
        check_ndim("topk_weights", topk_weights, 2, "[T, K]")
        check_dtype("topk_weights", topk_weights, (SCALE_DTYPE,))
        if tuple(topk_weights.shape) != (num_tokens, top_k):
            raise ValueError(f"topk_weights must have the shape of token_topk_to_pos, (T, K) = "
                             f"({num_tokens}, {top_k}); got {tuple(topk_weights.shape)}")
    if row_scale is not None:
        check_ndim("row_scale", row_scale, 1, "[X]")
        check_dtype("row_scale", row_scale, (SCALE_DTYPE,))
        if row_scale.shape[0] != num_expanded:
            raise ValueError(f"row_scale must have one value per row of expanded, X = "
                             f"{num_expanded}; got shape {tuple(row_scale.shape)}")
    return CombineProblem(num_tokens, hidden, top_k, num_expanded, expanded.dtype,
                          topk_weights is not None, row_scale is not None)


def raise_out_of_range(first: int, problem: CombineProblem, map_value) -> None:
    """``validate=True``: ValueError for flat slot ``first`` (>= 0) of
    ``token_topk_to_pos``, whose row ``map_value(first)`` is >= X; nothing
    when ``first`` is -1."""
    if first < 0:
        return
    k = problem.top_k
    raise ValueError(f"token_topk_to_pos[{first // k}, {first % k}] = {map_value(first)} is out "
                     f"of range: expanded has X = {problem.num_expanded} rows")


def check_reduce_fused_out(out: ArrayDesc, problem: CombineProblem) -> CombineProblem:
    """Check a caller's ``out`` (writeable, ``[T, H]``, ``expanded``'s dtype or
    float32) and return the problem with its output format: a float32 ``out``
    of a bf16 / fp16 call holds the sums unrounded."""
    if problem.element_format == "f32":
        check_out("out", out, problem.out_shape(), problem.dtype)
        return problem
    check_out("out", out, problem.out_shape(), (problem.dtype, "float32"),
              dtype_reason="that of the input, or float32 for the unrounded sums")
    return replace(problem, out_float32=out.dtype == "float32")
