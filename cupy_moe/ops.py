"""The public ops: expand token rows (and their scale factors) to the fused,
expert-major layout of a grouped GEMM.

Each op checks its arguments once, here, then hands them to the backend of
their array kind: the NumPy reference for NumPy arrays and CPU tensors, the
CUDA kernels for CuPy arrays and CUDA tensors.
"""

from __future__ import annotations

from typing import Any

from . import _checks
from ._arrays import (
    ArrayKind,
    bytes_to_allocation_end,
    common_kind,
    dtype_name,
    element_strides,
)

__all__ = ["expand_to_fused", "expand_to_fused_with_sf"]


# The GPU backend's shortcut for torch calls whose signature was already
# checked (set once the backend is loaded; see _gpu.torch_fast_call).
_fast_call = None


def _backend(kind: ArrayKind):
    global _fast_call
    if kind.on_gpu:
        from . import _gpu  # imports CuPy: only where a GPU array was given
        _fast_call = _gpu.torch_fast_call
        return _gpu
    from . import _cpu
    return _cpu


def _check_out(kind, problem, out, expected_dtype: str) -> None:
    _checks.check_out("out", tuple(out.shape), dtype_name(kind, out),
                      problem.out_shape(), expected_dtype)
    _checks.check_out_strides("out", problem, tuple(out.shape),
                              element_strides(kind, out), sf=False)


def _check_out_sf(kind, problem, out_sf, expected_dtype: str) -> None:
    shape = tuple(out_sf.shape)
    _checks.check_out("out_sf", shape, dtype_name(kind, out_sf),
                      problem.out_sf_shape(), expected_dtype)
    _checks.check_out_strides("out_sf", problem, shape, element_strides(kind, out_sf), sf=True)
    if problem.sf_col_major and problem.num_expanded > 0:
        # The kernels zero the pad columns X .. align(X, 4), which lie past the
        # view's last element: the buffer behind it must hold them.
        needed = problem.sf_columns * problem.sf_leading_dim * 4
        available = bytes_to_allocation_end(kind, out_sf)
        if available < needed:
            raise ValueError(
                f"out_sf must view a buffer of [S, align(X, 4)] = [{problem.sf_columns}, "
                f"{problem.sf_leading_dim}] elements ({needed} bytes, pad columns "
                f"included); only {available} bytes follow its first element"
            )


def expand_to_fused(x: Any, token_topk_to_pos: Any, pos_to_expert: Any, *,
                    out: Any = None, validate: bool = False) -> Any:
    """Scatter token rows to the expert-major rows of a grouped-GEMM input.

    ``out[p] = x[t]`` for every slot with ``token_topk_to_pos[t, k] = p >= 0``;
    negative slots are dropped; rows with ``pos_to_expert[p] < 0`` (padding)
    are zero. A pure byte copy: nothing is weighted or reduced.

    Parameters
    ----------
    x : array [T, H], bfloat16 or float16 (uint16 holding bf16 bits also)
        Token rows. T may be 0 (the result is then all zeros).
    token_topk_to_pos : array [T, K], int32
        Output row of each (token, slot); negative = dropped slot.
    pos_to_expert : array [X], int32
        Expert of each output row; negative = padding row.
    out : array [X, H] of x's dtype, C-contiguous, optional
        Written in place and returned (for CUDA-graph capture, buffer reuse).
    validate : bool
        Check that the map targets each expert row exactly once and nothing
        else, before anything is written. Faults are looked for in this order:
        a slot >= X, a slot naming a padding row, a slot repeating an earlier
        slot's row, an expert row no slot names; the ValueError names the
        first index of the first kind found. On the GPU this costs one host
        synchronisation (so not inside CUDA-graph capture). Without it a
        malformed map never writes outside the outputs, but which rows it
        fills is unspecified.

    Returns
    -------
    array [X, H], x's kind, device and dtype
        numpy.ndarray, cupy.ndarray or torch.Tensor as given.

    Raises
    ------
    TypeError
        An argument is not an array, or arrays of different kinds are mixed.
    ValueError
        A shape, dtype or device rule fails (the message names the argument and
        the numbers), or ``validate=True`` finds a malformed map.
    """
    if _fast_call is not None and not validate:
        result = _fast_call(x, None, token_topk_to_pos, pos_to_expert, out, None, None, False)
        if result is not None:
            return result[0]
    kind, _ = common_kind({"x": x, "token_topk_to_pos": token_topk_to_pos,
                           "pos_to_expert": pos_to_expert, "out": out})
    x_dtype = dtype_name(kind, x)
    problem = _checks.check_expand(
        tuple(x.shape), x_dtype,
        tuple(token_topk_to_pos.shape), dtype_name(kind, token_topk_to_pos),
        tuple(pos_to_expert.shape), dtype_name(kind, pos_to_expert),
    )
    if out is not None:
        _check_out(kind, problem, out, x_dtype)
    result, _ = _backend(kind).run_expand(kind, problem, x, None, token_topk_to_pos,
                                          pos_to_expert, out, None, validate)
    return result


def expand_to_fused_with_sf(x: Any, x_sf: Any, token_topk_to_pos: Any, pos_to_expert: Any, *,
                            num_per_channels: int, use_tma_aligned_col_major_sf: bool = False,
                            out: Any = None, out_sf: Any = None,
                            validate: bool = False) -> tuple[Any, Any]:
    """Scatter quantized token rows and their per-block scale factors.

    The routing contract is that of :func:`expand_to_fused`; each row's scale
    factors travel with it, and padding rows get zero scale factors too.

    Parameters
    ----------
    x : array [T, H], float8_e4m3fn (or uint8 / int8: any 1-byte payload, e.g.
        two fp4 per byte with H counted in bytes)
    x_sf : array [T, S], float32 or int32
        float32: ``S = ceil(H / num_per_channels)``. int32: packed UE8M0, four
        exponent bytes per word (byte j of word w is block 4w + j),
        ``S = ceil(ceil(H / num_per_channels) / 4)``; needs
        ``use_tma_aligned_col_major_sf=True``.
    token_topk_to_pos, pos_to_expert : as in :func:`expand_to_fused`
    num_per_channels : {32, 128}
        Channels per scale-factor block.
    use_tma_aligned_col_major_sf : bool
        Return ``expanded_x_sf`` as the transposed view of the first X columns
        of an ``[S, align(X, 4)]`` buffer (shape [X, S], element strides
        ``(1, align(X, 4))``), the layout a TMA load of a grouped GEMM reads.
        The pad columns X .. align(X, 4) are zero.
    out : array [X, H], optional
    out_sf : array [X, S], optional
        Caller-provided outputs, written and returned. A column-major
        ``out_sf`` must have the strides above and view a buffer that holds
        the pad columns.
    validate : bool
        As in :func:`expand_to_fused`.

    Returns
    -------
    (expanded_x, expanded_x_sf) : arrays [X, H] and [X, S], the inputs' kind

    Raises
    ------
    TypeError, ValueError
        As in :func:`expand_to_fused`, plus the scale-factor rules.
    """
    if _fast_call is not None and not validate:
        result = _fast_call(x, x_sf, token_topk_to_pos, pos_to_expert, out, out_sf,
                            num_per_channels, bool(use_tma_aligned_col_major_sf))
        if result is not None:
            return result
    kind, _ = common_kind({"x": x, "x_sf": x_sf, "token_topk_to_pos": token_topk_to_pos,
                           "pos_to_expert": pos_to_expert, "out": out, "out_sf": out_sf})
    x_dtype, sf_dtype = dtype_name(kind, x), dtype_name(kind, x_sf)
    problem = _checks.check_expand_with_sf(
        tuple(x.shape), x_dtype, tuple(x_sf.shape), sf_dtype,
        tuple(token_topk_to_pos.shape), dtype_name(kind, token_topk_to_pos),
        tuple(pos_to_expert.shape), dtype_name(kind, pos_to_expert),
        num_per_channels=num_per_channels,
        use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
    )
    if out is not None:
        _check_out(kind, problem, out, x_dtype)
    if out_sf is not None:
        _check_out_sf(kind, problem, out_sf, sf_dtype)
    return _backend(kind).run_expand(kind, problem, x, x_sf, token_topk_to_pos,
                                     pos_to_expert, out, out_sf, validate)
