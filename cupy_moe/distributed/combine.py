"""Expert-parallel combine: the expert outputs back to the tokens' own ranks,
summed in a fixed order.

Numerics, for a token t of rank s (every step is deterministic):

1. On each rank r that received t: ``P_r = reduce_fused(y_expanded, ...,
   out=<float32>)`` for t's received row: t's local slots in k order, ``acc
   = fma(float32(y), w[k], acc)`` in float32 from +0, *not rounded* (a
   float32 ``out`` holds reduce_fused's sums as they are).
2. ``P_r`` goes back to rank s as float32 (``all_to_all_single``).
3. Rank s sums ``out = ((-0 + P_r0) + P_r1) + ...`` in float32 over the
   ranks r0 < r1 < ... that t went to (ascending rank order), and rounds
   once to the dtype of ``y_expanded`` (bf16: round to nearest even; NaN as
   the canonical NaN of ``reduce_fused``). -0 is addition's identity, +0 is
   not: a partial of -0 (a negative product that underflows) stays -0, as
   in the one-process chain. A token with no valid slot went nowhere: +0,
   reduce_fused's zeros.

Why float32 partials, not bf16 (half the bytes): the result is rounded once,
as in the one-process ``reduce_fused``. A token whose slots all sit on one
rank then gets exactly the one-process bits (``-0 + P = P``, the same fma
chain), and any other token differs from it only by where the float32 sum
splits, far below one bf16 rounding; bf16 partials would add a bf16
rounding per partial (up to R of them) to every such token. The price is 2x
the combine's bytes on the wire (4 vs 2 per element);
``benchmarks/bench_ep.py`` measures it next to the bare all-to-all.
"""

from __future__ import annotations

from typing import Any

from ..combine import reduce_fused
from ..combine.reference import CANONICAL_NAN_BITS
from ..combine.rules import ELEMENT_FORMAT
from .exchange import (
    all_to_all_rows,
    combine_done,
    load_torch,
    out_of_step_on_error,
    owes_combine_on_error,
    require_in_step,
)
from .handle import DispatchHandle
from .rules import check_combine

__all__ = ["combine"]


def combine(y_expanded: Any, handle: DispatchHandle, *, group: Any = None,
            weighted: bool = True) -> Any:
    """Send each received token's expert outputs back to its rank and sum
    them there (the inverse of :func:`dispatch`; module docstring: numerics).

    A collective: every rank of the group calls it, with the handle of its
    own ``dispatch`` call.

    Parameters
    ----------
    y_expanded : torch.Tensor [X, H], bfloat16, float16 or float32
        The expert outputs in the layout of ``handle.plan`` (X rows, H =
        dispatch's H; padding rows are never read), on dispatch's device.
    handle : DispatchHandle
        ``dispatch(...).handle``.
    group : torch.distributed ProcessGroup, optional
        Dispatch's group (default: the default process group).
    weighted : bool
        Weight each slot by its router weight (``handle.recv_topk_weights``);
        False sums the slots unweighted (when the weights were applied
        before, e.g. by ``swiglu_quantize_fp8``).

    Returns
    -------
    torch.Tensor [T, H], y_expanded's dtype, device
        Per token of this rank's dispatch, the weighted sum of its slots'
        expert outputs (zeros for a token with no valid slot).

    Raises
    ------
    TypeError
        ``y_expanded`` is not a torch tensor, ``handle`` is not a
        ``DispatchHandle``, ``weighted`` is not a bool.
    ValueError
        ``y_expanded``'s shape, dtype or device does not fit the handle, or
        ``group`` is not dispatch's (rank and size differ), or a CPU tensor
        meets an NCCL group. All checked before the one collective, which
        the other ranks may have entered by then: they wait in it until this
        rank calls combine again with the right arguments. Until it does,
        ``dispatch`` on the group is refused on this rank (RuntimeError):
        its count exchange would pair with their combine's.
    RuntimeError
        An earlier dispatch (or an ``ep_moe_layer`` step) failed on this rank
        after the ranks had begun exchanging data, or this combine's exchange
        failed (destroy the process group and make a new one).
    """
    require_in_step(group, combining=True)
    # dispatch's group is the one whose ranks wait (this call's may be wrong)
    groups = (group, handle.group) if isinstance(handle, DispatchHandle) else (group,)
    with owes_combine_on_error(*groups):  # before the collective the others may be in
        problem = check_combine(y_expanded, handle, group, weighted)
        torch = load_torch()
        weights = handle.recv_topk_weights if problem.weighted else None
        slot_rows = handle.plan.token_topk_to_pos
        # the float32 sums straight from y_expanded: reduce_fused reads the
        # routed rows only (at decode most of X is padding) and rounds nothing
        partials = reduce_fused(y_expanded, slot_rows, weights,
                                out=torch.empty((slot_rows.shape[0], handle.hidden),
                                                dtype=torch.float32, device=y_expanded.device))
    with out_of_step_on_error(problem.info.group):
        returned = all_to_all_rows(partials, list(handle.recv_splits),
                                   list(handle.send_splits), problem.info.group)
    combine_done(*groups)
    acc = torch.zeros((handle.num_tokens, handle.hidden), dtype=torch.float32,
                      device=y_expanded.device)
    # -0 where a partial comes back (module docstring, step 3)
    acc.index_fill_(0, handle.send_token_index, -0.0)
    # one index_add_ per destination rank, in rank order: a token appears at
    # most once per rank, so each call adds one value per element (no order
    # between atomics to decide) and the calls run in order
    start = 0
    for count in handle.send_splits:
        if count:
            rows = slice(start, start + count)
            acc.index_add_(0, handle.send_token_index[rows], returned[rows])
            start += count
    # NaN as reduce_fused gives it: one canonical NaN (torch's cast keeps others)
    canonical = _canonical_nan(torch, problem.dtype, y_expanded.dtype, acc.device)
    return torch.where(acc.isnan(), canonical, acc.to(y_expanded.dtype))


# per (dtype, device): reduce_fused's NaN as a 0-d tensor, made once (a launch
# a call before); by a blocking copy, so that it is complete before any
# stream reads it
_canonical_nans: dict[tuple[str, Any], Any] = {}


def _canonical_nan(torch: Any, dtype_name: str, dtype: Any, device: Any) -> Any:
    key = (dtype_name, device)
    found = _canonical_nans.get(key)
    if found is None:
        bits = torch.tensor(CANONICAL_NAN_BITS[ELEMENT_FORMAT[dtype_name]],
                            dtype=torch.int32 if dtype_name == "float32" else torch.int16)
        found = _canonical_nans[key] = bits.view(dtype).to(device)
    return found

