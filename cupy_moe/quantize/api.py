"""The public quantize ops: per-token, per-block fp8 (e4m3) casts that produce
the scale factors ``expand_to_fused_with_sf`` takes, plain or fused with SwiGLU.

Each op describes its arguments once, checks the rules on the descriptions,
then hands the arrays to the CPU (NumPy reference) or the GPU (NVRTC kernels)
code of their kind. Torch calls whose descriptions were checked before (and
that pass no outputs) take the fast path straight to their launch plan.

Numerics (``numerics`` has them operation by operation; CPU and GPU agree bit
for bit). Per row, per block of ``num_per_channels`` columns (the last block
may be partial): ``amax`` = the largest ``|v|`` of the block, NaN ignored,
floored at 1e-4; ``sf = amax / 448`` (IEEE float32 division); with
``round_sf`` the bits of ``sf`` are rounded up to a power of two
(``(bits + 0x7FFFFF) & 0x7F800000``) and ``scale = 1 / sf``, else
``scale = 448 / amax``; each value becomes ``e4m3(clamp(v * scale, -448,
448))``, rounded to nearest even (ml_dtypes' float8_e4m3fn).

NaN and infinity, on both backends:
- a NaN value does not take part in its block's ``amax`` and is coded 0x7F
  (e4m3fn's NaN, whatever the sign); the block's other values are quantized
  as if it were absent.
- a ±inf value makes ``amax = +inf``: ``sf = +inf`` (float32 +inf; UE8M0
  byte 0xFF, its NaN) and ``scale = 0``, so the block's finite values are
  coded ±0 and its infinities (inf * 0) and NaNs 0x7F; dequantized, every
  value of the block is NaN. An overflowing block never passes for a finite one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.arrays import (
    ArrayKind,
    bytes_to_allocation_end,
    common_kind,
    describe,
    torch_to_numpy,
)
from ..runtime.extras import require_cupy
from ..runtime.fast_path import TorchFastPath
from ..runtime.rules import check_no_overlap, check_out, check_strides, require_bool, require_int
from .launch_shape import DEFAULT_TUNING, QuantizeTuning
from .rules import (
    FP8_OUT_DTYPES,
    QuantizeProblem,
    check_quantize,
    check_slot_rows,
    check_swiglu,
)

__all__ = ["quantize_fp8", "run_with_tuning", "swiglu_quantize_fp8"]

_quantize_fast_path = TorchFastPath()
_swiglu_fast_path = TorchFastPath()
# quantize.gpu.run_torch_fast, bound when the GPU code is first loaded (the
# fast path can only hit after that)
_run_torch_fast = None


def quantize_fp8(x: Any, *, num_per_channels: int = 128, round_sf: bool = False,
                 packed_ue8m0: bool = False, use_tma_aligned_col_major_sf: bool = False,
                 out: Any = None, out_sf: Any = None) -> tuple[Any, Any]:
    """Cast token rows to fp8 e4m3 with one scale factor per block of channels.

    ``x[t, j] ~ x_fp8[t, j] * x_sf[t, j // num_per_channels]`` (packed: the
    block's UE8M0 byte, ``2**(byte - 127)``). Row-major float32 outputs are
    what ``expand_to_fused_with_sf`` reads as ``x`` and ``x_sf`` (same
    ``num_per_channels``); the column-major layouts are those of its output
    and of a grouped GEMM's scale-factor input (as ``x_sf`` of an expand they
    are copied to row-major on every call). The module
    docstring of ``cupy_moe.quantize.api`` has the exact arithmetic and what
    NaN and infinity give.

    Parameters
    ----------
    x : array [T, H], bfloat16 or float32 (uint16 holding bf16 bits also)
        Token rows. T may be 0 (empty results).
    num_per_channels : {32, 128}
        Channels per scale-factor block; ``S = ceil(H / num_per_channels)``
        blocks per row, the last one partial when H is not a multiple.
    round_sf : bool
        Round each scale factor up to a power of two (then the quantized values
        use ``scale = 1 / sf`` exactly).
    packed_ue8m0 : bool
        Return the scale factors as packed UE8M0: int32 ``[T, ceil(S / 4)]``,
        byte j of word w (little-endian) the exponent byte of block 4w + j's
        (power-of-two) scale factor, 0 for the last word's missing blocks.
        Needs ``round_sf=True`` and ``use_tma_aligned_col_major_sf=True``.
    use_tma_aligned_col_major_sf : bool
        Return ``x_sf`` as the transposed view of the first T columns of an
        ``[S, align(T, 4)]`` buffer (shape [T, S], element strides
        ``(1, align(T, 4))``), the layout a TMA load of a grouped GEMM reads;
        the pad columns T .. align(T, 4) are zero.
    out : array [T, H], float8_e4m3fn or uint8, C-contiguous, optional
    out_sf : array [T, S] of the SF dtype and layout above, optional
        Caller-provided outputs, written and returned (CUDA-graph capture,
        buffer reuse). A column-major ``out_sf`` must view a buffer that holds
        the pad columns.

    Returns
    -------
    (x_fp8, x_sf)
        ``x_fp8 [T, H]``: float8_e4m3fn (NumPy: ml_dtypes; torch: native),
        uint8 codes on CuPy. ``x_sf [T, S]``: float32, or int32 when packed.
        Of x's kind and device.

    Raises
    ------
    TypeError
        An argument is not an array (None included for ``x``), kinds are
        mixed, a flag is not a bool, ``num_per_channels`` is not an int, or a
        torch tensor requires grad while grad mode is on.
    ValueError
        A shape, dtype, stride, device or setting rule fails (the message names
        the argument and the numbers), or an output is read-only or overlaps
        an input or the other output. Also a tensor on another device than
        the CPU or CUDA, a sparse tensor, a lazily negated tensor view (pass
        ``.resolve_neg()``), a NumPy array of non-native byte order.
    """
    if (out is None and out_sf is None and type(num_per_channels) is int
            and type(round_sf) is bool and type(packed_ue8m0) is bool
            and type(use_tma_aligned_col_major_sf) is bool):
        plan = _quantize_fast_path.lookup(
            (num_per_channels, round_sf, packed_ue8m0, use_tma_aligned_col_major_sf), (x,))
        if plan is not None:
            return _run_torch_fast(plan, x, None, None, None, None)
    return _quantize(DEFAULT_TUNING, x, None, None, None, swiglu=False,
                     num_per_channels=num_per_channels, round_sf=round_sf,
                     packed_ue8m0=packed_ue8m0,
                     use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, out=out,
                     out_sf=out_sf, fast_path=_quantize_fast_path)


def swiglu_quantize_fp8(h: Any, *, num_per_channels: int = 128, topk_weights: Any = None,
                        pos_to_token_topk: Any = None, pos_to_expert: Any = None,
                        round_sf: bool = False, packed_ue8m0: bool = False,
                        use_tma_aligned_col_major_sf: bool = False, out: Any = None,
                        out_sf: Any = None, zero_padding: bool = True,
                        token_topk_to_pos: Any = None,
                        validate: bool = False) -> tuple[Any, Any]:
    """SwiGLU of a grouped GEMM's output rows, weighted, cast to fp8 e4m3.

    Row p of ``h = [gate | up]`` gives the float32 activations
    ``act = (silu(gate) * up) * w``, in that order of roundings, with
    ``silu(g) = g * (1 / (1 + exp(-g)))`` (``exp``: ``numerics.exp_f32``; the
    reciprocal IEEE-rounded) and ``w = topk_weights.flat[pos_to_token_topk[p]]``
    (no factor without weights). The weighted activations are quantized as
    :func:`quantize_fp8` quantizes ``x`` (the scale factors cover the weighted
    values). A padding row (``pos_to_expert[p] < 0``, or with weights
    ``pos_to_token_topk[p]`` outside ``[0, T * K)``) is zero: codes 0 and
    scale factors 0 (UE8M0 byte 0), as ``expand_to_fused_with_sf`` zeroes
    padding rows; its ``h`` row is not read. With ``zero_padding=False`` it
    is not written either (see below).

    NaN and infinity: ``exp`` saturates (``exp(x)`` is ``exp(clamp(x,
    -86.5, 87))``, so ``exp(+inf)`` is finite; a NaN argument is clamped like
    -inf, ``silu`` still gives NaN through its factor ``g``), ``silu(NaN) = NaN``,
    ``silu(+inf) = +inf``, ``silu(-inf) = -inf * tiny = -inf``; NaN and inf
    products follow IEEE float32 (``0 * inf`` is NaN). The activations then
    quantize as in :func:`quantize_fp8`.

    Speed: with ``topk_weights`` [T, K] at most ``T * K`` rows are live, and
    where that is at most ``QuantizeTuning.narrow_live_rows`` (64: decode)
    the GPU takes a kernel with one 16-byte chunk a lane, which keeps a live
    row's chain short (from 1 MiB of codes, one that gives each block whole
    rows, so that few blocks zero the padding rows). Without weights any of
    the X rows may be live, so a decode plan's call runs the wide kernel
    (Kimi-K2 decode, X = 1024: 4.3 against 2.7 us a call in a CUDA graph on
    an H200). With ``zero_padding=False`` the whole-rows kernel also takes
    plans with at least 128 KiB of codes per row that may be live
    (``QuantizeTuning.unzeroed_block_rows_from_bytes``; Kimi-K2, T = 32,
    E = 384: 10.4 -> 6.7 us). Given ``token_topk_to_pos`` too, calls with
    at least 2 rows a slot (``QuantizeTuning.by_slot_from_rows_per_slot``)
    visit the T * K slots instead of the X rows (the ``*_slots`` kernels), so
    padding rows cost nothing: T = 32 plans 2.5-2.7 us a call in a CUDA
    graph, against 4.0-6.7 visiting the rows.

    Parameters
    ----------
    h : array [X, 2I], bfloat16 or float32 (uint16 holding bf16 bits also)
        Gate (first I columns) and up (last I) projections, X may be 0.
    num_per_channels : {32, 128}
    topk_weights : array [T, K], float32, optional
        Routing weights; needs ``pos_to_token_topk``.
    pos_to_token_topk : array [X], int32, optional
        ``t * K + k`` of the slot row p holds (``fused_mapping``'s), -1 for padding.
    pos_to_expert : array [X], int32, optional
        Expert of each row, negative for padding rows (``fused_mapping``'s).
    round_sf, packed_ue8m0, use_tma_aligned_col_major_sf, out, out_sf
        As in :func:`quantize_fp8`, with X rows and I columns.
    zero_padding : bool
        True: padding rows are zero (codes and scale factors). False: their
        codes and scale factors are not written and hold what the memory held
        (fresh outputs: anything; a caller's ``out`` / ``out_sf``: their
        previous contents); the call saves the zero-fill's stores, most of a
        padded plan's bytes at small batches (DeepSeek-V3 EP8, T = 32: 34
        live rows of 3,072). Every live row is the same as with True, bit for
        bit, the column-major SF pad columns X .. align(X, 4) are zeroed
        either way (they belong to no row), and nothing outside the outputs
        is written. Safe for consumers that never read padding rows, as
        ``expand_to_fused(zero_padding=False)`` is: a grouped GEMM that scales
        a row by that row's scale factors and whose padding rows' outputs go
        unused (DeepGEMM's contiguous layout with ``pos_to_expert`` as its
        grouped_layout), then ``reduce_fused``, which reads slots' rows only.
        Not for anything that reads every row.
    token_topk_to_pos : array [T, K], int32, optional
        The row of each slot, -1 where dropped (``fused_mapping``'s): the
        inverse of ``pos_to_token_topk``, so it needs the weights. A hint,
        for speed only: with ``zero_padding=False`` the GPU can then visit
        the T * K slots instead of the X rows, where
        ``QuantizeTuning.by_slot_from_rows_per_slot`` says so (from 2 rows
        a slot); the results are the same. It must name
        exactly the live rows, each from its own slot:
        ``token_topk_to_pos.flat[s] == p`` for every live row p with
        ``pos_to_token_topk[p] == s``, and no other entry >= 0
        (``validate=True`` checks it). Where it does not, which rows are
        written is unspecified; nothing outside the outputs is written,
        nothing outside ``h`` read.
    validate : bool
        Check ``token_topk_to_pos`` against the maps before anything is
        written; the ValueError names the first fault (a row >= X, a slot
        naming a padding row, a slot naming a row that holds another slot, a
        live row its slot does not name). On the GPU the three maps are
        copied to the host, each copy waiting for the current stream (so
        not inside CUDA-graph capture). Without ``token_topk_to_pos`` there
        is nothing to check.

    Returns
    -------
    (y_fp8 [X, I], y_sf [X, S]) as in :func:`quantize_fp8`, ``S`` from I.

    Raises
    ------
    TypeError, ValueError
        As in :func:`quantize_fp8`; also for ``topk_weights`` without
        ``pos_to_token_topk`` (or the reverse), for maps of the wrong dtype
        or length, for ``token_topk_to_pos`` without the weights or of
        another shape than theirs, and (``validate=True``) for a
        ``token_topk_to_pos`` that disagrees with the maps.
    """
    if (validate is False and out is None and out_sf is None and type(num_per_channels) is int
            and type(round_sf) is bool and type(packed_ue8m0) is bool
            and type(use_tma_aligned_col_major_sf) is bool and type(zero_padding) is bool):
        plan = _swiglu_fast_path.lookup(
            (num_per_channels, round_sf, packed_ue8m0, use_tma_aligned_col_major_sf,
             zero_padding),
            (h, topk_weights, pos_to_token_topk, pos_to_expert, token_topk_to_pos))
        if plan is not None:
            return _run_torch_fast(plan, h, topk_weights, pos_to_token_topk, pos_to_expert,
                                   token_topk_to_pos)
    return _quantize(DEFAULT_TUNING, h, topk_weights, pos_to_token_topk, pos_to_expert,
                     swiglu=True, num_per_channels=num_per_channels, round_sf=round_sf,
                     packed_ue8m0=packed_ue8m0,
                     use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, out=out,
                     out_sf=out_sf, zero_padding=zero_padding, fast_path=_swiglu_fast_path,
                     token_topk_to_pos=token_topk_to_pos, validate=validate)


def run_with_tuning(tuning: QuantizeTuning, op: str, x: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``op`` (``"quantize_fp8"`` or ``"swiglu_quantize_fp8"``) under a tuning of
    its own (tests and sweeps; no fast path). Same rules and results as the
    public ops; only the block size and the compiled variant differ."""
    if op not in ("quantize_fp8", "swiglu_quantize_fp8"):
        raise ValueError(f"op must be 'quantize_fp8' or 'swiglu_quantize_fp8'; got {op!r}")
    swiglu = op == "swiglu_quantize_fp8"
    maps = {name: kwargs.pop(name, None)
            for name in ("topk_weights", "pos_to_token_topk", "pos_to_expert")} if swiglu else {}
    settings = {"num_per_channels": 128, "round_sf": False, "packed_ue8m0": False,
                "use_tma_aligned_col_major_sf": False, "out": None, "out_sf": None}
    if swiglu:
        settings.update(zero_padding=True, token_topk_to_pos=None, validate=False)
    unknown = set(kwargs) - set(settings)
    if unknown:
        raise TypeError(f"{op}() got unexpected keyword arguments {sorted(unknown)}")
    settings.update(kwargs)
    return _quantize(tuning, x, maps.get("topk_weights"), maps.get("pos_to_token_topk"),
                     maps.get("pos_to_expert"), swiglu=swiglu, fast_path=None, **settings)


def _quantize(tuning: QuantizeTuning, x, topk_weights, pos_to_token_topk, pos_to_expert, *,
              swiglu: bool, num_per_channels, round_sf, packed_ue8m0,
              use_tma_aligned_col_major_sf, out, out_sf, zero_padding=True,
              fast_path: TorchFastPath | None, token_topk_to_pos: Any = None,
              validate: bool = False) -> tuple[Any, Any]:
    """The full path of both ops: every rule, then the backend of the arrays' kind."""
    scalars = (require_int("num_per_channels", num_per_channels),
               require_bool("round_sf", round_sf),
               require_bool("packed_ue8m0", packed_ue8m0),
               require_bool("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf))
    if swiglu:  # the fast path's key: swiglu's flags after the shared ones
        scalars += (require_bool("zero_padding", zero_padding),)
        validate = require_bool("validate", validate)
    # in the fast path's key order
    if swiglu:
        inputs = {"h": x, "topk_weights": topk_weights, "pos_to_token_topk": pos_to_token_topk,
                  "pos_to_expert": pos_to_expert, "token_topk_to_pos": token_topk_to_pos}
        descs = {name: None if a is None and name != "h" else describe(name, a)
                 for name, a in inputs.items()}
    else:
        inputs = {"x": x}
        descs = {"x": describe("x", x)}
    out_descs = {name: None if a is None else describe(name, a)
                 for name, a in (("out", out), ("out_sf", out_sf))}
    kind, _ = common_kind({**descs, **out_descs})
    settings = {"num_per_channels": scalars[0], "round_sf": scalars[1],
                "packed_ue8m0": scalars[2], "col_major": scalars[3]}
    if swiglu:
        problem = check_swiglu(descs["h"], descs["topk_weights"], descs["pos_to_token_topk"],
                               descs["pos_to_expert"], **settings, zero_padding=scalars[4],
                               token_topk_to_pos=descs["token_topk_to_pos"])
    else:
        problem = check_quantize(descs["x"], **settings)
    _check_outputs(kind, problem, out_descs, out, out_sf, inputs)
    if validate and token_topk_to_pos is not None:
        _validate_slot_rows(kind, problem, token_topk_to_pos, pos_to_token_topk, pos_to_expert)
    if kind.on_gpu:
        global _run_torch_fast
        require_cupy()
        from .gpu import run_quantize, run_torch_fast
        _run_torch_fast = run_torch_fast
        result, plan = run_quantize(kind, problem, tuning, x, topk_weights, pos_to_token_topk,
                                    pos_to_expert, token_topk_to_pos, out, out_sf)
        if (fast_path is not None and kind is ArrayKind.TORCH_CUDA and out is None
                and out_sf is None):
            fast_path.remember(scalars, tuple(descs.values()), plan)
        return result
    from .cpu import run_quantize
    return run_quantize(kind, problem, x, topk_weights, pos_to_token_topk, pos_to_expert, out,
                        out_sf)


def _validate_slot_rows(kind: ArrayKind, problem: QuantizeProblem, token_topk_to_pos: Any,
                        pos_to_token_topk: Any, pos_to_expert: Any) -> None:
    """``validate=True``: the hint against the maps, on host copies (on the
    GPU each copy waits for the current stream)."""
    if kind.on_gpu:
        from ..runtime.gpu_arrays import gpu_library
        to_numpy = gpu_library(kind).to_numpy
    else:
        to_numpy = torch_to_numpy if kind is ArrayKind.TORCH_CPU else np.asarray
    check_slot_rows(to_numpy(token_topk_to_pos), to_numpy(pos_to_token_topk),
                    None if pos_to_expert is None else to_numpy(pos_to_expert),
                    problem.num_rows)


def _check_outputs(kind: ArrayKind, problem: QuantizeProblem, out_descs: dict, out, out_sf,
                   inputs: dict) -> None:
    """Caller-provided outputs: shape, dtype, strides, writeable, extent, no overlap."""
    if out is None and out_sf is None:
        return
    if out is not None:
        check_out("out", out_descs["out"], problem.out_shape(), FP8_OUT_DTYPES,
                  dtype_reason=None)
        check_strides("out", kind, out, (problem.hidden, 1), "C-contiguous")
    if out_sf is not None:
        check_out("out_sf", out_descs["out_sf"], problem.out_sf_shape(), problem.sf_dtype,
                  dtype_reason=None)
        check_strides("out_sf", kind, out_sf, problem.out_sf_strides(), problem.out_sf_layout())
        if problem.col_major and problem.num_rows > 0:
            # the pad columns R .. align(R, 4) lie past the view's last element:
            # the buffer behind it must hold them
            needed = problem.out_sf_buffer_bytes()
            available = bytes_to_allocation_end(kind, out_sf)
            if available < needed:
                raise ValueError(
                    f"out_sf must view a buffer of [S, align(R, 4)] = [{problem.sf_columns}, "
                    f"{problem.sf_leading_dim}] elements ({needed} bytes, pad columns "
                    f"included); only {available} bytes follow its first element")
    written_sf = problem.out_sf_buffer_bytes() if problem.col_major else 0
    check_no_overlap(kind, {"out": (out, 0), "out_sf": (out_sf, written_sf)}, inputs)
