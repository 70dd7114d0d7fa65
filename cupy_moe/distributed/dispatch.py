"""Expert-parallel dispatch: each token row to the ranks that hold its experts,
then the receiving rank's routing plan and expand.

Steps, on every rank of the group:

1. Which ranks each token goes to: rank r holds experts ``r * E/R .. (r + 1)
   * E/R`` (``partition``); a token goes once to every rank owning at least
   one of its K slots (a negative id or an id >= E is a dropped slot).
2. Count exchange: per destination, the rows and the local slots (slots of
   its experts) it will get, and what the ranks must agree on (H, K, E,
   dtypes), in one ``all_to_all_single`` of int64, read on the host: the one
   host synchronisation of the call, which no all-to-all of data of unknown
   size can avoid (its split sizes are host integers). The local slot count
   M bounds the received plan: X = ``worst_case_rows(M, E/R, alignment)``
   rows, at most ``(E/R) * (alignment - 1)`` of them padding, instead of the
   bound for all N * K received slots.
3. One ``all_to_all_single`` of byte rows, a row per (destination,
   token): the token's row of x, with fp8 its scale factors, then its
   source token index, its K slots as the destination's local expert ids
   (-1 for another rank's or a dropped slot) and its K weights (a collective
   costs far more host time than the copies that pack and unpack the
   pieces). A destination receives rows by source rank, then by source
   token, ascending: the order depends on the routing alone.
4. ``fused_mapping`` of the received local ids over the E/R local experts,
   then ``expand_to_fused`` (or ``expand_to_fused_with_sf``).

Everything but step 2's read runs on the tensors' device without a host
synchronisation (no boolean masks, no ``nonzero``): the (rank, token) pairs
sent are the ``sum(send_splits)`` True entries of an [R, T] mask, found by
``nonzero_static`` (their count is known since the exchange).
"""

from __future__ import annotations

from typing import Any

from ..expand import expand_to_fused, expand_to_fused_with_sf
from ..mapping import fused_mapping
from ..mapping.reference import worst_case_rows
from ..runtime.bounded_cache import BoundedCache
from .exchange import (
    all_to_all_rows, byte_rows, first_true, group_info, load_torch, out_of_step_on_error,
    require_in_step,
)
from .handle import Dispatched, DispatchHandle
from .rules import (
    SIGNATURE_WIDTH, DispatchProblem, check_dispatch, raise_disagreement, refused_signature,
)

__all__ = ["dispatch", "refuse_dispatch"]


def dispatch(x: Any, topk_ids: Any, topk_weights: Any, num_experts: int, *, group: Any = None,
             x_sf: Any = None, alignment: int = 128, num_per_channels: int = 128,
             use_tma_aligned_col_major_sf: bool = False,
             zero_padding: bool = True) -> Dispatched:
    """Send each token row to the ranks that hold its experts; expand what
    arrives into this rank's grouped-GEMM layout (module docstring: the steps).

    A collective: every rank of ``group`` calls it, with the same H, K,
    ``num_experts`` and dtypes (checked; every rank raises ValueError if one
    differs). T may differ between ranks, and be 0.

    Parameters
    ----------
    x : torch.Tensor [T, H]
        Token rows: bfloat16 or float16 (or uint16 holding bf16 bits: rows
        travel as bytes, and ``expanded_x`` keeps x's dtype); with ``x_sf``,
        float8_e4m3fn (or uint8 / int8: any 1-byte payload). CPU tensors with a gloo group, CUDA
        tensors with NCCL.
    topk_ids : torch.Tensor [T, K], int32 or int64
        Global expert id of each slot; negative or >= ``num_experts``: dropped.
    topk_weights : torch.Tensor [T, K], float32
        Router weight of each slot; travels with the token for ``combine``.
    num_experts : int
        E, the experts of the whole layer; a multiple of the group's size R.
        This rank holds experts ``rank * E/R .. (rank + 1) * E/R``.
    group : torch.distributed ProcessGroup, optional
        Default: the default process group.
    x_sf : torch.Tensor [T, S], float32 or int32 (packed UE8M0), optional
        Per-block scale factors of fp8 ``x``, any layout (sent row-major), as
        ``expand_to_fused_with_sf`` takes them.
    alignment : int >= 1
        The received plan's segment alignment (the grouped GEMM's M block).
    num_per_channels : {32, 128}
        Channels per scale factor (with ``x_sf``).
    use_tma_aligned_col_major_sf : bool
        ``expanded_sf`` in the TMA-aligned column-major layout (needed for
        int32 ``x_sf``), as in ``expand_to_fused_with_sf``.
    zero_padding : bool
        False: the expand leaves padding rows unwritten (as
        ``expand_to_fused(zero_padding=False)``; rank-local, not checked
        across ranks).

    Returns
    -------
    Dispatched
        ``expanded_x [X, H]`` (x's dtype; padding rows zero unless
        ``zero_padding=False``), ``expanded_sf
        [X, S]`` or None, and the ``handle`` (``DispatchHandle``: the split
        sizes, each received row's source token, local ids and weights, the
        plan) that ``combine`` takes. X = ``worst_case_rows(M, E/R,
        alignment)`` for the M local slots received: the rows past the last
        segment are padding too.

    Raises
    ------
    TypeError
        An argument is not a torch tensor (or a size / flag has the wrong
        type), tensors of different kinds are mixed, or one requires grad
        while grad mode is on.
    ValueError
        A shape or dtype rule fails, ``num_experts`` is not a multiple of the
        group's size, a CPU tensor meets an NCCL group, or (on every rank at
        once, after the count exchange) the ranks disagree on H, K,
        ``num_experts``, the dtypes or the scale-factor layout, or another
        rank refused its own arguments.
    RuntimeError
        torch.distributed is not initialized.

    A rank whose own arguments break a rule still takes part in the count
    exchange, saying so, and then raises its error; the other ranks raise a
    ValueError naming it, after the same collective (so that rank, too, waits
    for the others to reach dispatch, up to the group's timeout). (A rank that cannot
    reach the exchange, e.g. not in the group, leaves the others waiting
    until the group's timeout.) A failure after the count exchange (a
    collective or the local plan failing on one rank) cannot be told to the
    others without one more collective: they wait in their next one, and
    this rank refuses every later dispatch and combine on the group
    (RuntimeError) until it is destroyed and made anew.
    """
    require_in_step(group)
    try:
        problem = check_dispatch(x, topk_ids, topk_weights, num_experts, x_sf, alignment,
                                 num_per_channels, use_tma_aligned_col_major_sf, group,
                                 zero_padding)
    except Exception:
        refuse_dispatch(group, x, topk_ids, topk_weights, x_sf)
        raise
    torch = load_torch()
    info, partition = problem.info, problem.partition
    local_experts = partition.local_experts
    ranks, signature_rows = _constants(torch, problem, x.device)

    # the owner rank of each slot: a dropped id (< 0 or >= E) gives one
    # outside [0, R), which no rank matches
    ids = topk_ids.to(torch.int64)
    owned = ids.div(local_experts, rounding_mode="floor").unsqueeze(0) == ranks  # [R, T, K]
    goes_to = owned.any(dim=2)  # [R, T]

    # 2. the count exchange (the host synchronisation); a disagreement raises
    # on every rank there, in step
    send_splits, recv_headers = _exchange_counts(torch, problem, goes_to, owned, signature_rows)
    with out_of_step_on_error(info.group):  # the other ranks go on to the data
        return _exchange_and_expand(torch, problem, x, x_sf, ids, topk_weights, owned, goes_to,
                                    send_splits, recv_headers)


# per (device, R, signature): the ranks [R, 1, 1] and the header's signature
# columns [R, SIGNATURE_WIDTH], made once (each is a launch or a copy a call).
# Made on the caller's stream and complete before any later call reads them
# on another: the count exchange's host synchronisation on that stream
# follows in the call that makes them.
_constants_cache = BoundedCache()


def _constants(torch: Any, problem: DispatchProblem, device: Any) -> tuple[Any, Any]:
    world = problem.info.world_size
    key = (device, world, problem.signature())
    found = _constants_cache.get(key)
    if found is None:
        ranks = torch.arange(world, device=device).view(world, 1, 1)
        signature = torch.tensor(problem.signature(), dtype=torch.int64)
        if device.type == "cuda":  # a pinned, non-blocking copy: a pageable one syncs the stream
            signature = signature.pin_memory().to(device, non_blocking=True)
        found = _constants_cache.put(key, (ranks, signature.expand(world, -1).contiguous()))
    return found


def _exchange_and_expand(torch: Any, problem: DispatchProblem, x: Any, x_sf: Any, ids: Any,
                         topk_weights: Any, owned: Any, goes_to: Any, send_splits: list[int],
                         recv_headers: list[list[int]]) -> Dispatched:
    """Steps 3 and 4 (module docstring), after the count exchange."""
    info, partition = problem.info, problem.partition
    world, local_experts = info.world_size, partition.local_experts
    num_tokens, top_k = problem.num_tokens, problem.top_k
    recv_splits = [header[0] for header in recv_headers]
    local_slots = sum(header[1] for header in recv_headers)
    num_expanded = worst_case_rows(local_slots, local_experts, problem.alignment)

    # 3. the (rank, token) pairs sent, destination-major and token-ascending
    # (the nonzero entries of goes_to in their flat order; their number is
    # known since the exchange, so no sync), and one row of bytes a pair:
    # the payload, its scale factors, then the metadata (source token, the
    # K slots as the destination's local ids or -1, the K weights), all in
    # one all-to-all
    num_sent = sum(send_splits)
    per_rank = max(num_tokens, 1)  # no pairs when T == 0
    pairs = first_true(torch, goes_to.view(-1), num_sent)  # rank * T + token
    send_token = pairs.remainder(per_rank)
    own = owned.view(-1, top_k).index_select(0, pairs)  # the slots that are the rank's
    local_ids = ids.remainder(local_experts).to(torch.int32).index_select(0, send_token)
    columns = [byte_rows(x).index_select(0, send_token)]
    if problem.has_sf:
        columns.append(byte_rows(x_sf).index_select(0, send_token))
    columns += [byte_rows(send_token.to(torch.int32).unsqueeze(1)),
                byte_rows(torch.where(own, local_ids, -1)),
                byte_rows(topk_weights.index_select(0, send_token))]
    widths = [column.shape[1] for column in columns]
    received = all_to_all_rows(torch.cat(columns, dim=1), send_splits, recv_splits, info.group)
    parts = iter(_split_columns(torch, received, widths))
    recv_x = next(parts).view(x.dtype)
    recv_sf = next(parts).view(x_sf.dtype) if problem.has_sf else None
    recv_src_token = next(parts).view(torch.int32).view(-1)
    recv_ids = next(parts).view(torch.int32)
    recv_weights = next(parts).view(torch.float32)

    # 4. the local plan and expand
    plan = fused_mapping(recv_ids, local_experts, alignment=problem.alignment,
                         num_expanded=num_expanded)
    if problem.has_sf:
        expanded_x, expanded_sf = expand_to_fused_with_sf(
            recv_x, recv_sf, plan.token_topk_to_pos, plan.pos_to_expert,
            num_per_channels=problem.num_per_channels,
            use_tma_aligned_col_major_sf=problem.sf_col_major,
            zero_padding=problem.zero_padding, pos_to_token=plan.pos_to_token)
    else:
        expanded_x = expand_to_fused(recv_x, plan.token_topk_to_pos, plan.pos_to_expert,
                                     zero_padding=problem.zero_padding,
                                     pos_to_token=plan.pos_to_token)
        expanded_sf = None
    handle = DispatchHandle(info.rank, world, num_tokens, problem.hidden, local_experts,
                            tuple(send_splits), tuple(recv_splits), send_token, recv_src_token,
                            recv_ids, recv_weights, local_slots, plan, info.group)
    return Dispatched(expanded_x, expanded_sf, handle)


def refuse_dispatch(group: Any, *tensors: Any) -> None:
    """This rank's side of the count exchange when its own arguments (or
    anything before the exchange, e.g. ``ep_moe_layer``'s router) failed: a
    header of the usual width whose signature says "refused", so that the
    other ranks raise with it instead of waiting. Nothing happens where no
    exchange is possible (no initialized group, not a member of it), where
    this rank is out of step or owes a combine on the group (the others wait
    in another collective: ``require_in_step``), or where the exchange itself
    fails: the caller raises its own error either way.

    The header goes where the other ranks' headers go, which is where their
    ``x`` is: the device of the first CUDA tensor among ``tensors`` (the
    call's arguments), else, if the group has no CPU backend (pure NCCL), the
    current CUDA device, else the CPU."""
    try:
        info = group_info(group)
        # out of step, or owing a combine: the others wait in another
        # collective, with which this header would pair
        require_in_step(group)
    except (RuntimeError, ValueError):
        return
    torch = load_torch()
    try:
        device = _refusal_device(torch, info, tensors)
        header = torch.zeros((info.world_size, 2 + SIGNATURE_WIDTH), dtype=torch.int64,
                             device=device)
        header[:, 2:] = torch.tensor(refused_signature(), dtype=torch.int64, device=device)
        ones = [1] * info.world_size
        all_to_all_rows(header, ones, ones, info.group)
    except Exception:  # noqa: BLE001 - the caller's own error is the one to raise
        return


def _refusal_device(torch: Any, info: Any, tensors: tuple[Any, ...]) -> Any:
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
            return tensor.device
    # "nccl", "gloo", "cpu:gloo,cuda:nccl" (init_process_group() with no
    # backend named reports "undefined" from get_backend, its config here)
    get_config = getattr(torch.distributed, "get_backend_config", None)
    config = get_config(info.group) if get_config is not None else info.backend
    if "cpu" not in config and "gloo" not in config:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _split_columns(torch: Any, rows: Any, widths: list[int]) -> list[Any]:
    """``rows [N, sum(widths)]`` uint8 cut into contiguous ``[N, width]``
    pieces, left to right."""
    pieces, start = [], 0
    for width in widths:
        if rows.shape[0] == 0:  # an empty slice may have strides view() refuses
            pieces.append(torch.empty((0, width), dtype=torch.uint8, device=rows.device))
        else:
            pieces.append(rows[:, start:start + width].contiguous())
        start += width
    return pieces


def _exchange_counts(torch: Any, problem: DispatchProblem, goes_to: Any, owned: Any,
                     signature_rows: Any) -> tuple[list[int], list[list[int]]]:
    """The count exchange: this rank's rows per destination, and from each
    source rank its header ``[rows, local slots, signature...]`` (rows it
    sends here, how many of their slots are this rank's experts, what the
    ranks must agree on). ValueError, on every rank, when the signatures
    differ or a rank refused its arguments (``refuse_dispatch``). The
    header's width is the same on every rank whatever the arguments, so a
    disagreement cannot break the exchange itself."""
    info = problem.info
    world = info.world_size
    header = torch.cat([goes_to.sum(dim=1, dtype=torch.int64).unsqueeze(1),
                        owned.sum(dim=(1, 2), dtype=torch.int64).unsqueeze(1),
                        signature_rows], dim=1)
    ones = [1] * world
    received = all_to_all_rows(header, ones, ones, info.group)
    host = torch.cat([header[:, 0], received.flatten()]).tolist()  # the host sync
    width = header.shape[1]
    assert width == 2 + SIGNATURE_WIDTH  # what refuse_dispatch sends
    headers = [host[world + s * width: world + (s + 1) * width] for s in range(world)]
    raise_disagreement(info.rank, problem.signature(), [tuple(h[2:]) for h in headers])
    return host[:world], headers
