"""The process group and the one collective expert parallelism uses:
``torch.distributed.all_to_all_single`` of row blocks.

Rows travel as their bytes (a ``uint8`` view): an all-to-all moves data and
never reduces it, and bytes are the one dtype every backend moves (NCCL has no
int16, older gloo builds no bfloat16 or float8), so bf16, fp8, float32 and
int32 rows all take the same path, bit for bit.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

from ..runtime.extras import require_torch

__all__ = ["GroupInfo", "all_to_all_rows", "byte_rows", "check_backend_device", "combine_done",
           "first_true", "group_info", "load_torch", "out_of_step_on_error", "owes_combine_on_error",
           "require_in_step"]

# Groups in which this rank failed between two collectives of one call: the
# other ranks wait in a collective this rank will not reach, and this rank's
# next collective would pair with theirs (data goes to the wrong call; gloo
# was seen to complete even an exchange of the wrong size). Such a group is
# refused until it is destroyed and made anew.
_out_of_step: weakref.WeakSet = weakref.WeakSet()

# Groups in which this rank's combine failed before its one collective (its
# arguments refused, say): the other ranks may wait in that collective, which
# only a combine from this rank can meet (a dispatch's count exchange would
# pair with it, and data would go to the wrong call). dispatch is refused on
# such a group until a combine on it gets through its collective.
_owes_combine: weakref.WeakSet = weakref.WeakSet()


class GroupInfo(NamedTuple):
    """The group a call runs on (None: the default group), this process's rank
    in it, its size and its backend's name (``"gloo"``, ``"nccl"``, ...)."""

    group: Any
    rank: int
    world_size: int
    backend: str


def group_info(group: Any = None) -> GroupInfo:
    """Rank, size and backend of ``group``; no collective is called.

    RuntimeError when torch.distributed is missing or not initialized;
    ValueError when this process is not a member of ``group``.
    """
    torch = load_torch()
    dist = torch.distributed
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call "
                           "torch.distributed.init_process_group first (gloo for CPU "
                           "tensors, nccl for CUDA tensors)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the group it was given")
    return GroupInfo(group, rank, dist.get_world_size(group), str(dist.get_backend(group)))


def _resolved(group: Any) -> Any:
    return group if group is not None else load_torch().distributed.group.WORLD


def require_in_step(group: Any, *, combining: bool = False) -> None:
    """RuntimeError when an earlier call failed on this rank between two of
    its collectives on ``group`` (``out_of_step_on_error``), or, unless
    ``combining``, when a combine failed on this rank before its collective
    (``owes_combine_on_error``). Nothing when torch.distributed is not
    initialized (the call's own checks say so)."""
    dist = load_torch().distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    resolved = _resolved(group)
    if resolved is None:
        return
    if resolved in _out_of_step:
        raise RuntimeError("an earlier dispatch or combine failed on this rank after the "
                           "ranks had begun exchanging data, so this rank is out of step "
                           "with the others (they wait in a collective it will not reach): "
                           "destroy the process group and make a new one")
    if not combining and resolved in _owes_combine:
        raise RuntimeError("a combine failed on this rank before its exchange, in which the "
                           "other ranks may wait (only a combine meets it; this dispatch's "
                           "count exchange would pair with it): call combine again with the "
                           "same handle and the right arguments first, or destroy the process "
                           "group and make a new one")


@contextlib.contextmanager
def owes_combine_on_error(*groups: Any) -> Iterator[None]:
    """Marks ``groups`` as owed a combine by this rank if the block raises: wrap
    what a combine runs before its collective."""
    try:
        yield
    except BaseException:
        for group in groups:
            with contextlib.suppress(Exception):  # no group to mark: the error says why
                resolved = _resolved(group)
                if resolved is not None:
                    _owes_combine.add(resolved)
        raise


def combine_done(*groups: Any) -> None:
    """A combine on ``groups`` got through its collective: nothing is owed."""
    for group in groups:
        resolved = _resolved(group)
        if resolved is not None:
            _owes_combine.discard(resolved)


@contextlib.contextmanager
def out_of_step_on_error(group: Any) -> Iterator[None]:
    """Marks ``group`` out of step for this rank if the block raises: wrap
    what runs once the other ranks may be inside the call's collectives."""
    try:
        yield
    except BaseException:
        resolved = _resolved(group)
        if resolved is not None:
            _out_of_step.add(resolved)
        raise


def check_backend_device(info: GroupInfo, name: str, tensor: Any) -> None:
    """NCCL moves CUDA tensors only: a CPU tensor is a ValueError here, before
    any collective (NCCL itself would fail inside the first one)."""
    if info.backend == "nccl" and not tensor.is_cuda:
        raise ValueError(f"the group's backend is nccl, which moves CUDA tensors; {name} is "
                         f"on {tensor.device} (use a gloo group for CPU tensors)")


def all_to_all_rows(send: Any, send_splits: list[int], recv_splits: list[int],
                    group: Any) -> Any:
    """Rows ``send[sum(send_splits[:r]) ..][:send_splits[r]]`` go to rank r;
    the result holds the rows from rank 0, then rank 1, ... (``recv_splits[s]``
    from rank s), of ``send``'s dtype, trailing shape and device.

    ``send`` is a 2-D tensor; it moves as bytes (module docstring).
    """
    torch = load_torch()
    recv = torch.empty((sum(recv_splits), send.shape[1]), dtype=send.dtype, device=send.device)
    torch.distributed.all_to_all_single(byte_rows(recv), byte_rows(send),
                                        output_split_sizes=list(recv_splits),
                                        input_split_sizes=list(send_splits), group=group)
    return recv


def first_true(torch: Any, flags: Any, count: int) -> Any:
    """Indices (int64, ascending) of the ``count`` True entries of the 1-D
    bool ``flags``, ``count`` known on the host: no host synchronisation
    (``nonzero_static``; a stable sort of the flags where this torch has no
    such kernel for the device)."""
    try:
        return torch.nonzero_static(flags, size=count).view(-1)
    except (AttributeError, NotImplementedError, RuntimeError):
        return torch.argsort((~flags).to(torch.int32), stable=True)[:count]


def byte_rows(rows: Any) -> Any:
    """The ``[n, row_bytes]`` uint8 view of a 2-D tensor's rows (a contiguous
    copy first where it is not contiguous)."""
    torch = load_torch()
    if rows.dtype == torch.uint8:
        return rows.contiguous()
    if rows.numel() == 0:  # an empty tensor may have any strides: view() refuses some
        return torch.empty((rows.shape[0], rows.shape[1] * rows.element_size()),
                           dtype=torch.uint8, device=rows.device)
    return rows.contiguous().view(torch.uint8)


def load_torch() -> Any:
    """torch, with torch.distributed imported (ImportError naming the torch
    extra where torch is missing)."""
    torch = require_torch("cupy_moe.distributed (expert parallelism on torch.distributed)")
    import torch.distributed
    return torch
