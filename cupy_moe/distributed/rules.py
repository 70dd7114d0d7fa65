"""Argument rules of the expert-parallel ops, checked on each rank before its
first collective, and the cross-rank agreement check of ``dispatch``.

A rank whose own arguments fail here still takes part in ``dispatch``'s count
exchange, with a header that says so (``refused_signature``), and then raises
its error; every other rank raises a ValueError naming it after the same
collective, so none is left waiting. Arguments that must agree between ranks
(H, K, num_experts, dtypes, scale-factor layout) are compared in that exchange
too. Where a rank cannot reach the exchange at all (torch.distributed not
initialized, not a member of the group) the others wait until the group's
timeout, as with any collective API.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..expand.rules import check_expand, check_expand_with_sf
from ..layer.grouped_gemm import resolve_method
from ..mapping.rules import MAX_EXPERTS, MAX_EXPERTS_GPU, MAX_ROWS, check_topk_ids
from ..runtime.arrays import ArrayDesc, ArrayKind, common_kind, describe
from ..runtime.rules import check_dtype, check_ndim, require_bool, require_int
from .exchange import GroupInfo, check_backend_device, group_info
from .handle import DispatchHandle
from .partition import ExpertPartition, partition_experts

__all__ = ["COMBINE_DTYPES", "SIGNATURE_WIDTH", "CombineProblem", "DispatchProblem",
           "EpLayerProblem", "check_combine", "check_dispatch", "check_ep_layer",
           "raise_disagreement", "refused_signature"]

WEIGHT_DTYPE = "float32"
# combine's expert outputs and result (uint16 bf16 bits are CuPy's, not torch's)
COMBINE_DTYPES = ("bfloat16", "float16", "float32")
# dtypes as small ints for the cross-rank check (0: no scale factors)
_DTYPE_CODES = ("bfloat16", "float16", "uint16", "float8_e4m3fn", "uint8", "int8", "float32",
                "int32")
_LOGIT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DispatchProblem:
    """One ``dispatch`` call's sizes, after every rank-local rule held."""

    info: GroupInfo
    partition: ExpertPartition
    num_tokens: int
    hidden: int
    top_k: int
    alignment: int
    x_dtype: str
    sf_columns: int = 0
    sf_dtype: str | None = None
    num_per_channels: int = 128
    sf_col_major: bool = False
    zero_padding: bool = True

    @property
    def has_sf(self) -> bool:
        return self.sf_dtype is not None

    def signature(self) -> tuple[int, ...]:
        """What every rank must agree on, as ints, after a status of 0 (see
        :func:`raise_disagreement`). ``num_per_channels`` only with scale
        factors: packed UE8M0 words can have the same S for 32 and 128."""
        return (0, self.hidden, self.top_k, self.partition.num_experts,
                _DTYPE_CODES.index(self.x_dtype) + 1, self.sf_columns,
                0 if self.sf_dtype is None else _DTYPE_CODES.index(self.sf_dtype) + 1,
                self.num_per_channels if self.has_sf else 0)


_SIGNATURE_NAMES = ("status", "H (x.shape[1])", "K (topk_ids.shape[1])", "num_experts",
                    "x's dtype", "S (x_sf.shape[1])", "x_sf's dtype", "num_per_channels")
SIGNATURE_WIDTH = len(_SIGNATURE_NAMES)


def refused_signature() -> tuple[int, ...]:
    """The signature of a rank whose own arguments failed its rules: status 1."""
    return (1,) + (0,) * (SIGNATURE_WIDTH - 1)


def raise_disagreement(rank: int, mine: tuple[int, ...], theirs: list[tuple[int, ...]]) -> None:
    """ValueError for the first rank that refused its own arguments, else
    for the first rank whose signature differs from this rank's.

    Every rank compares all signatures, so when one differs every rank raises
    here, after the same collective: none is left waiting in another one.
    """
    for other, signature in enumerate(theirs):
        if signature[0]:
            raise ValueError(f"rank {other} refused its own arguments to dispatch (its error "
                             f"says why); this rank ({rank}) stops with it")
    for other, signature in enumerate(theirs):
        for name, their_value, my_value in zip(_SIGNATURE_NAMES, signature, mine, strict=True):
            if their_value != my_value:
                if name.endswith("dtype"):
                    their_value, my_value = (_DTYPE_CODES[v - 1] if v else "none"
                                             for v in (their_value, my_value))
                raise ValueError(f"the ranks disagree on dispatch's arguments: rank {other} "
                                 f"has {name} = {their_value}, this rank ({rank}) has "
                                 f"{my_value}; every rank must pass the same H, K, "
                                 "num_experts, dtypes and scale-factor layout")


def check_dispatch(x, topk_ids, topk_weights, num_experts, x_sf, alignment, num_per_channels,
                   use_tma_aligned_col_major_sf, group,
                   zero_padding: bool = True) -> DispatchProblem:
    """Every rank-local rule of ``dispatch``; the call's sizes."""
    descs = {"x": describe("x", x), "topk_ids": describe("topk_ids", topk_ids),
             "topk_weights": describe("topk_weights", topk_weights),
             "x_sf": None if x_sf is None else describe("x_sf", x_sf)}
    kind = _torch_kind(descs, "dispatch")
    num_experts = require_int("num_experts", num_experts)
    alignment = require_int("alignment", alignment)
    num_per_channels = require_int("num_per_channels", num_per_channels)
    col_major = require_bool("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf)
    zero_padding = require_bool("zero_padding", zero_padding)
    ids = descs["topk_ids"]
    num_tokens, top_k = check_topk_ids(ids)
    check_ndim("x", descs["x"], 2, "[T, H]")
    if descs["x"].shape[0] != num_tokens:
        raise ValueError(f"x must have one row per token of topk_ids, T = {num_tokens}; got "
                         f"shape {tuple(descs['x'].shape)}")
    # expand's own rules on x (and x_sf), with the maps the received tokens will have
    maps = (_int32_desc(kind, (num_tokens, top_k)), _int32_desc(kind, (0,)))
    if x_sf is None:
        expand = check_expand(descs["x"], *maps)
    else:
        expand = check_expand_with_sf(descs["x"], descs["x_sf"], *maps,
                                      num_per_channels=num_per_channels,
                                      use_tma_aligned_col_major_sf=col_major)
    weights = descs["topk_weights"]
    check_ndim("topk_weights", weights, 2, "[T, K]")
    check_dtype("topk_weights", weights, (WEIGHT_DTYPE,))
    if tuple(weights.shape) != (num_tokens, top_k):
        raise ValueError(f"topk_weights must have the shape of topk_ids, (T, K) = "
                         f"({num_tokens}, {top_k}); got {tuple(weights.shape)}")
    if not 1 <= alignment <= MAX_ROWS:  # fused_mapping's rule, checked before the exchange
        raise ValueError(f"alignment must be in 1 .. {MAX_ROWS}; got {alignment}")
    info, partition = _group_and_partition(group, num_experts, kind, x)
    return DispatchProblem(info, partition, num_tokens, expand.hidden, top_k, alignment,
                           expand.x_dtype, expand.sf_columns, expand.sf_dtype,
                           num_per_channels, col_major, zero_padding)


@dataclass(frozen=True)
class CombineProblem:
    """One ``combine`` call, after every rank-local rule held."""

    info: GroupInfo
    weighted: bool
    dtype: str


def check_combine(y_expanded, handle, group, weighted) -> CombineProblem:
    """Every rank-local rule of ``combine``."""
    if not isinstance(handle, DispatchHandle):
        raise TypeError(f"handle must be the DispatchHandle dispatch returned; got "
                        f"{type(handle).__module__}.{type(handle).__qualname__}")
    weighted = require_bool("weighted", weighted)
    descs = {"y_expanded": describe("y_expanded", y_expanded),
             "handle.plan.token_topk_to_pos": describe("handle.plan.token_topk_to_pos",
                                                       handle.plan.token_topk_to_pos)}
    _torch_kind(descs, "combine")
    y = descs["y_expanded"]
    check_ndim("y_expanded", y, 2, "[X, H]")
    check_dtype("y_expanded", y, COMBINE_DTYPES)
    expected = (handle.plan.pos_to_expert.shape[0], handle.hidden)
    if tuple(y.shape) != expected:
        raise ValueError(f"y_expanded must have the plan's X rows and dispatch's H columns, "
                         f"(X, H) = {expected}: combine returns rows where dispatch took "
                         f"them from; got {tuple(y.shape)}")
    info = group_info(group)
    if (info.rank, info.world_size) != (handle.rank, handle.world_size):
        raise ValueError(f"combine's group must be dispatch's: dispatch ran as rank "
                         f"{handle.rank} of {handle.world_size}, this group has rank "
                         f"{info.rank} of {info.world_size}")
    check_backend_device(info, "y_expanded", y_expanded)
    return CombineProblem(info, weighted, y.dtype)


@dataclass(frozen=True)
class EpLayerProblem:
    """One expert-parallel layer call's sizes, after every rank-local rule held."""

    kind: ArrayKind
    info: GroupInfo
    partition: ExpertPartition
    intermediate: int
    gemm: str


def check_ep_layer(x, router_logits, w_gate_up_local, w_down_local, *, top_k, num_experts,
                   group, alignment, num_per_channels, gemm) -> EpLayerProblem:
    """Every rank-local rule of ``ep_moe_layer`` (top_k, alignment and
    num_per_channels are ints already)."""
    names = ("x", "router_logits", "w_gate_up_local", "w_down_local")
    arrays = (x, router_logits, w_gate_up_local, w_down_local)
    descs = {name: describe(name, array) for name, array in zip(names, arrays, strict=True)}
    kind = _torch_kind(descs, "ep_moe_layer")
    num_experts = require_int("num_experts", num_experts)
    for name in ("x", "w_gate_up_local", "w_down_local"):
        check_dtype(name, descs[name], ("bfloat16",))
    check_dtype("router_logits", descs["router_logits"], _LOGIT_DTYPES)
    shapes = {name: tuple(desc.shape) for name, desc in descs.items()}
    for name, ndim, layout in (("x", 2, "[T, H]"), ("router_logits", 2, "[T, E]"),
                               ("w_gate_up_local", 3, "[E / R, 2I, H]"),
                               ("w_down_local", 3, "[E / R, H, I]")):
        check_ndim(name, descs[name], ndim, layout)
    info, partition = _group_and_partition(group, num_experts, kind, x)
    (tokens, hidden), two_inter = shapes["x"], shapes["w_gate_up_local"][1]
    if two_inter % 2 or two_inter == 0:
        raise ValueError(f"w_gate_up_local must be [E / R, 2I, H] with I >= 1; got shape "
                         f"{shapes['w_gate_up_local']}")
    inter, local = two_inter // 2, partition.local_experts
    expected = {"router_logits": (tokens, num_experts),
                "w_gate_up_local": (local, 2 * inter, hidden),
                "w_down_local": (local, hidden, inter)}
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise ValueError(f"{name} must have shape {shape} (x {shapes['x']}, num_experts "
                             f"{num_experts} over {info.world_size} ranks: E / R = {local} "
                             f"experts here, I = {inter}); got {shapes[name]}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, E = {num_experts}]; got {top_k}")
    if not 1 <= alignment <= MAX_ROWS:  # fused_mapping's rule, checked before the exchange
        raise ValueError(f"alignment must be in 1 .. {MAX_ROWS}; got {alignment}")
    if num_per_channels not in (32, 128):
        raise ValueError(f"num_per_channels must be 32 or 128; got {num_per_channels}")
    return EpLayerProblem(kind, info, partition, inter,
                          resolve_method(x, gemm, {"H": hidden, "I": inter}))


def _torch_kind(descs: dict[str, ArrayDesc | None], op: str) -> ArrayKind:
    """The arrays' one kind, which must be torch's (torch.distributed moves them)."""
    kind, _ = common_kind(descs)
    if not kind.is_torch:
        first = next(name for name, desc in descs.items() if desc is not None)
        raise TypeError(f"{op} takes torch tensors (torch.distributed moves them); {first} is "
                        f"a {kind.value}")
    return kind


def _group_and_partition(group, num_experts: int, kind: ArrayKind,
                         tensor) -> tuple[GroupInfo, ExpertPartition]:
    info = group_info(group)
    partition = partition_experts(num_experts, info.world_size)
    # fused_mapping's limits, on the local experts it plans for (checked before
    # the exchange: after it a refusal would leave the group out of step)
    if partition.local_experts > MAX_EXPERTS:
        raise ValueError(f"num_experts / world_size must be <= {MAX_EXPERTS} (fused_mapping's "
                         f"int32 expert ids); got {partition.local_experts}")
    if kind.on_gpu and partition.local_experts > MAX_EXPERTS_GPU:
        raise ValueError(f"num_experts / world_size must be <= {MAX_EXPERTS_GPU} on the GPU "
                         f"(fused_mapping's limit); got {partition.local_experts}")
    check_backend_device(info, "x", tensor)
    return info, partition


def _int32_desc(kind: ArrayKind, shape: tuple[int, ...]) -> ArrayDesc:
    """The description of a well-formed int32 map (to run expand's rules on x alone)."""
    return ArrayDesc(kind, shape, "int32", None, True, False, True)
