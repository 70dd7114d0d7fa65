"""The torch peers the benchmark measures us against (DESIGN.md section 7).

``torch_reference_*`` re-express the seed's PyTorch reference (zeros, then a
boolean-masked index assignment; the mask costs a host synchronisation).
``torch_nosync_*`` avoid that sync: an ``index_copy_`` into a buffer with one
spill row that dropped slots write to.

Arguments and results are as for the ops: ``x [T, H]``, ``x_sf [T, S]``,
``token_topk_to_pos [T, K]`` int32, ``pos_to_expert [X]`` int32; outputs
``[X, H]`` and ``[X, S]`` (the SF output, with
``use_tma_aligned_col_major_sf``, a transposed view of ``[S, align(X, 4)]``).
"""

from __future__ import annotations

import torch

from cupy_moe.runtime.sizes import align_up


def _slot_sources(token_topk_to_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The destination row of each slot ``[T*K]`` int64 and its token ``[T*K]``."""
    num_tokens, top_k = token_topk_to_pos.shape
    flat = token_topk_to_pos.reshape(-1).to(torch.int64)
    token_ids = torch.arange(num_tokens, device=flat.device).repeat_interleave(top_k)
    return flat, token_ids


def _sf_zeros(num_rows: int, x_sf: torch.Tensor, col_major: bool) -> torch.Tensor:
    """Zero scale factors ``[num_rows, S]`` of ``x_sf``'s dtype: contiguous, or
    (``col_major``) the transposed view of an ``[S, align(num_rows, 4)]`` buffer."""
    sf_columns = x_sf.shape[1]
    if col_major:
        buffer = torch.zeros((sf_columns, align_up(num_rows, 4)), dtype=x_sf.dtype,
                             device=x_sf.device)
        return buffer[:, :num_rows].T
    return torch.zeros((num_rows, sf_columns), dtype=x_sf.dtype, device=x_sf.device)


def torch_reference_expand(x, token_topk_to_pos, pos_to_expert):
    out = torch.zeros((pos_to_expert.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
    flat, token_ids = _slot_sources(token_topk_to_pos)
    valid = flat >= 0
    out[flat[valid]] = x[token_ids[valid]]
    return out


def torch_reference_expand_with_sf(x, x_sf, token_topk_to_pos, pos_to_expert, *,
                                   use_tma_aligned_col_major_sf=False):
    out = torch_reference_expand(x, token_topk_to_pos, pos_to_expert)
    out_sf = _sf_zeros(pos_to_expert.shape[0], x_sf, use_tma_aligned_col_major_sf)
    flat, token_ids = _slot_sources(token_topk_to_pos)
    valid = flat >= 0
    out_sf[flat[valid]] = x_sf[token_ids[valid]]
    return out, out_sf


def _spill_scatter(src, token_topk_to_pos, num_expanded, make_buffer):
    """Rows of ``src`` scattered to ``[num_expanded, ...]`` with ``index_copy_``
    into ``make_buffer(num_expanded + 1)``, whose last row takes dropped slots."""
    flat, token_ids = _slot_sources(token_topk_to_pos)
    dest = torch.where(flat >= 0, flat, num_expanded)  # dropped slots land on the spill row
    buffer = make_buffer(num_expanded + 1)
    buffer.index_copy_(0, dest, src.index_select(0, token_ids))
    return buffer[:num_expanded]


def torch_nosync_expand(x, token_topk_to_pos, pos_to_expert):
    # index_copy_ has no float8 kernel: move fp8 rows as their bytes.
    rows = x.view(torch.uint8) if x.element_size() == 1 else x

    def zeros(num_rows):
        return torch.zeros((num_rows, x.shape[1]), dtype=rows.dtype, device=x.device)
    out = _spill_scatter(rows, token_topk_to_pos, pos_to_expert.shape[0], zeros)
    return out.view(x.dtype)


def torch_nosync_expand_with_sf(x, x_sf, token_topk_to_pos, pos_to_expert, *,
                                use_tma_aligned_col_major_sf=False):
    out = torch_nosync_expand(x, token_topk_to_pos, pos_to_expert)

    # the spill row is one more column of the TMA-aligned buffer: [S, align(X + 1, 4)]
    def zeros(num_rows):
        return _sf_zeros(num_rows, x_sf, use_tma_aligned_col_major_sf)
    out_sf = _spill_scatter(x_sf, token_topk_to_pos, pos_to_expert.shape[0], zeros)
    return out, out_sf
