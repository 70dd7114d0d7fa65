"""The torch peers the benchmark measures us against (DESIGN.md section 7).

``torch_reference_*`` re-express the seed's PyTorch reference (zeros, then a
boolean-masked index assignment; the mask costs a host synchronisation).
``torch_nosync_*`` avoid that sync: an ``index_copy_`` into a buffer with one
spill row that dropped slots write to.
"""

from __future__ import annotations

import torch


def _slot_sources(token_topk_to_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, top_k = token_topk_to_pos.shape
    flat = token_topk_to_pos.reshape(-1).to(torch.int64)
    token_ids = torch.arange(num_tokens, device=flat.device).repeat_interleave(top_k)
    return flat, token_ids


def torch_reference_expand(x, token_topk_to_pos, pos_to_expert):
    out = torch.zeros((pos_to_expert.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
    flat, token_ids = _slot_sources(token_topk_to_pos)
    valid = flat >= 0
    out[flat[valid]] = x[token_ids[valid]]
    return out


def torch_reference_expand_with_sf(x, x_sf, token_topk_to_pos, pos_to_expert, *,
                                   use_tma_aligned_col_major_sf=False):
    out = torch_reference_expand(x, token_topk_to_pos, pos_to_expert)
    num_expanded = pos_to_expert.shape[0]
    if use_tma_aligned_col_major_sf:
        padded = -(-num_expanded // 4) * 4
        out_sf = torch.zeros((x_sf.shape[1], padded), dtype=x_sf.dtype,
                             device=x_sf.device)[:, :num_expanded].T
    else:
        out_sf = torch.zeros((num_expanded, x_sf.shape[1]), dtype=x_sf.dtype, device=x_sf.device)
    flat, token_ids = _slot_sources(token_topk_to_pos)
    valid = flat >= 0
    out_sf[flat[valid]] = x_sf[token_ids[valid]]
    return out, out_sf


def _spill_scatter(src, token_topk_to_pos, num_expanded, buffer_shape_tail, make_buffer):
    flat, token_ids = _slot_sources(token_topk_to_pos)
    dest = torch.where(flat >= 0, flat, num_expanded)  # dropped slots land on the spill row
    buffer = make_buffer((num_expanded + 1, *buffer_shape_tail))
    buffer.index_copy_(0, dest, src.index_select(0, token_ids))
    return buffer[:num_expanded]


def torch_nosync_expand(x, token_topk_to_pos, pos_to_expert):
    # index_copy_ has no float8 kernel: move fp8 rows as their bytes.
    rows = x.view(torch.uint8) if x.element_size() == 1 else x

    def zeros(shape):
        return torch.zeros(shape, dtype=rows.dtype, device=x.device)
    out = _spill_scatter(rows, token_topk_to_pos, pos_to_expert.shape[0], (x.shape[1],), zeros)
    return out.view(x.dtype)


def torch_nosync_expand_with_sf(x, x_sf, token_topk_to_pos, pos_to_expert, *,
                                use_tma_aligned_col_major_sf=False):
    out = torch_nosync_expand(x, token_topk_to_pos, pos_to_expert)
    num_expanded, sf_cols = pos_to_expert.shape[0], x_sf.shape[1]
    if use_tma_aligned_col_major_sf:
        # rows of the transposed view of an [S, align(X + 1, 4)] buffer
        def zeros(shape):
            padded = -(-shape[0] // 4) * 4
            return torch.zeros((sf_cols, padded), dtype=x_sf.dtype,
                               device=x_sf.device)[:, :shape[0]].T
    else:
        def zeros(shape):
            return torch.zeros(shape, dtype=x_sf.dtype, device=x_sf.device)
    out_sf = _spill_scatter(x_sf, token_topk_to_pos, num_expanded, (sf_cols,), zeros)
    return out, out_sf
