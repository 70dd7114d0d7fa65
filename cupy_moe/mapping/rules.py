"""Rules of ``fused_mapping`` and its error messages."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.arrays import ArrayDesc
from ..runtime.rules import check_dtype, check_ndim
from ..runtime.sizes import MAX_ROWS
from .reference import worst_case_rows

TOPK_ID_DTYPES = ("int32", "int64")
# the place kernel keeps (warps + 3) int32 per expert in shared memory: 4096
# experts leave room for 8+ warps on every GPU since Ampere (163+ KiB a block)
MAX_EXPERTS_GPU = 4096
# expert ids and positions are int32 on every backend
MAX_EXPERTS = 2**31 - 1


@dataclass(frozen=True)
class MappingProblem:
    """Sizes of one call, after every rule held; ``num_expanded`` is the X the
    outputs are sized for (the worst case unless given)."""

    num_tokens: int
    top_k: int
    num_experts: int
    alignment: int
    num_expanded: int
    id_dtype: str

    @property
    def num_slots(self) -> int:
        return self.num_tokens * self.top_k


def check_topk_ids(topk_ids: ArrayDesc) -> tuple[int, int]:
    """``(T, K)`` of a ``[T, K]`` int32/int64 ``topk_ids`` with K >= 1 (also
    expert parallelism's dispatch rule)."""
    check_ndim("topk_ids", topk_ids, 2, "[T, K]")
    check_dtype("topk_ids", topk_ids, TOPK_ID_DTYPES)
    num_tokens, top_k = topk_ids.shape
    if top_k < 1:
        raise ValueError(f"topk_ids must have K = shape[1] >= 1 slots; got shape "
                         f"{tuple(topk_ids.shape)}")
    return num_tokens, top_k


def check_fused_mapping(topk_ids: ArrayDesc, num_experts: int, alignment: int,
                        num_expanded: int | None) -> MappingProblem:
    num_tokens, top_k = check_topk_ids(topk_ids)
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1; got {num_experts}")
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"num_experts must be <= {MAX_EXPERTS} (int32 ids); got {num_experts}")
    if topk_ids.kind.on_gpu and num_experts > MAX_EXPERTS_GPU:
        raise ValueError(f"num_experts must be <= {MAX_EXPERTS_GPU} on the GPU; got {num_experts}")
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1; got {alignment}")
    if alignment > MAX_ROWS:  # (with no slots the row bound below would let it through)
        raise ValueError(f"alignment must be <= {MAX_ROWS} rows; got {alignment}")
    bound = worst_case_rows(num_tokens * top_k, num_experts, alignment)
    given = num_expanded is not None
    if not given:
        num_expanded = bound
    elif num_expanded < 0:
        raise ValueError(f"num_expanded must be >= 0; got {num_expanded}")
    # every segment start must fit int32 too, whatever X is
    if max(num_expanded, bound) > MAX_ROWS:
        rows = (f"{bound} rows and num_expanded is {num_expanded}" if given
                else f"{bound} rows (the default num_expanded)")
        raise ValueError(f"T * K = {num_tokens * top_k} slots with alignment {alignment} may need "
                         f"{rows}; at most {MAX_ROWS} rows are supported")
    return MappingProblem(num_tokens, top_k, num_experts, alignment, num_expanded,
                          topk_ids.dtype)


def raise_mapping_error(topk_ids: np.ndarray, token_topk_to_pos: np.ndarray,
                        problem: MappingProblem) -> None:
    """``validate=True``: ValueError for the first slot with an id >= E, else
    for the first routed slot that found no row below X."""
    flat = topk_ids.reshape(-1)
    k = problem.top_k
    remote = np.flatnonzero(flat >= problem.num_experts)
    if remote.size:
        i = int(remote[0])
        raise ValueError(f"topk_ids[{i // k}, {i % k}] = {int(flat[i])} is not an expert: "
                         f"num_experts = {problem.num_experts} (such slots are dropped "
                         "without validate=True)")
    routed = flat >= 0
    dropped = np.flatnonzero(routed & (token_topk_to_pos.reshape(-1) < 0))
    if dropped.size:
        i = int(dropped[0])
        raise ValueError(f"topk_ids[{i // k}, {i % k}] = {int(flat[i])} found no row: its "
                         f"expert's segment reaches past num_expanded = {problem.num_expanded} "
                         "(such slots are dropped without validate=True)")
