"""Benchmark of the ops over the manifest workloads (DESIGN.md section 7).

Per workload: inputs drawn fresh (random bits, realistic expert-major
routing), our result checked bit-exact against the NumPy reference before
anything is timed, then
- GPU time: median of CUDA-event timings, L2 flushed between iterations;
- GB/s from the roofline byte count, and its share of the device-to-device
  copy bandwidth measured at the start of the same run;
- for the expand ops, the floor of "copy the routed rows, memset the
  padding": a device-to-device copy of the roofline's copy bytes and a memset
  of its zero bytes (:func:`~cupy_moe.harness.rooflines.expand_split_bytes`),
  timed the same way, as a share of the kernel's time;
- eager wall time per call with torch tensors in and out, allocation included,
  against torch's own ``index_select`` of the same rows;
- GPU time per call from replaying a CUDA graph of many calls (small shapes);
- the seed's PyTorch reference and a sync-free torch version, same timings.
The routing plan (``fused_mapping``) gets the GPU time, GB/s and share of the
copy bandwidth, eager and CUDA-graph figures; it has no torch peer here (no
``index_select`` figure either). Without a GPU, the CPU backend's wall time.

The newer ops (``reduce_fused`` of ``cupy_moe.combine``, ``quantize_fp8`` and
``swiglu_quantize_fp8`` of ``cupy_moe.quantize``) get the routing plan's
figures, timed with preallocated outputs (``out=``, ``out_sf=``). Their
oracle is the op itself on NumPy arrays (the NumPy backend is their
reference), taken from its package (:func:`family_op`), so a GPU result is
checked against the CPU's bit for bit; the timed calls go through this
module's names, which tests replace.
Used by ``cupy-moe bench`` and by benchmarks/bench_expand_to_fused.py;
:mod:`.report` formats the result.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from cupy_moe import (
    FusedMapping,
    __version__,
    combine,
    expand_to_fused,
    expand_to_fused_with_sf,
    fused_mapping,
    quantize,
)

# The timed calls of the newer ops go through these names (tests replace them).
from cupy_moe.combine import reduce_fused
from cupy_moe.quantize import quantize_fp8, swiglu_quantize_fp8
from cupy_moe.quantize.reference import swiglu_padding_rows  # (not timed: the checks' rows)
from cupy_moe.reference import (
    expand_to_fused_numpy,
    expand_to_fused_with_sf_numpy,
    fused_mapping_numpy,
)

from .inputs import workload_inputs
from .manifest import MAPPING_OP_NAMES, OP_NAMES, Workload, load_workloads
from .rooflines import SplitBytes
from .timing import GpuTimer, eager_us, torch_graph_us

__all__ = ["CPU_QUICK_MAX_BYTES", "CPU_QUICK_MAX_COMPUTE_BYTES", "GRAPH_MAX_BYTES",
           "NEWER_OP_FAMILIES", "Record", "bench_cpu_workload", "bench_gpu_workload",
           "cpu_quick_max_bytes", "family_op", "reference_outputs",
           "resolve_backend", "run", "split_bytes", "versions"]

# Workloads at most this large get a CUDA-graph replay figure (decode, small).
GRAPH_MAX_BYTES = 8 << 20
# The CPU backend takes seconds a call above this; --quick leaves such workloads out.
CPU_QUICK_MAX_BYTES = 100 << 20
# The same for the newer ops, whose NumPy backend computes (an exact fma
# emulation, exp, fp8 rounding) rather than copies: far fewer bytes a second.
CPU_QUICK_MAX_COMPUTE_BYTES = 4 << 20

# The newer ops and the family package of each.
NEWER_OP_FAMILIES = {"reduce_fused": combine, "quantize_fp8": quantize,
                     "swiglu_quantize_fp8": quantize}


def family_op(op_name: str) -> Callable[..., Any]:
    """The public function of newer op ``op_name``, from its family's package
    (the oracle: the op on NumPy arrays), whatever this module's name for it."""
    return getattr(NEWER_OP_FAMILIES[op_name], op_name)


def _timed_op(op_name: str) -> Callable[..., Any]:
    """This module's name for newer op ``op_name``, looked up at each call
    (the name tests replace)."""
    return {"reduce_fused": reduce_fused, "quantize_fp8": quantize_fp8,
            "swiglu_quantize_fp8": swiglu_quantize_fp8}[op_name]


def cpu_quick_max_bytes(op_name: str) -> int:
    """The largest workload of ``op_name`` that ``--quick`` times on the CPU."""
    return CPU_QUICK_MAX_COMPUTE_BYTES if op_name in NEWER_OP_FAMILIES else CPU_QUICK_MAX_BYTES


@dataclass
class Record:
    """One workload's figures; times in microseconds, None where not measured.

    Its fields are the keys of a record in the JSON that ``cupy-moe bench
    --json`` writes.
    """

    op: str
    label: str
    shapes: str
    bytes: int
    status: str = "ok"
    # the kernel, L2 flushed
    gpu_us: float | None = None
    gbps: float | None = None
    pct_copy_roofline: float | None = None
    # a device-to-device copy moving the same bytes (half read, half written),
    # timed the same way: what launch and ramp cost at this size
    copy_same_bytes_us: float | None = None
    # expand ops, GPU: the roofline bytes split into a copy and a memset
    # (rooflines.expand_split_bytes): zero_bytes the padding rows' (bytes -
    # zero_bytes the copy's); a memset of zero_bytes and a device-to-device
    # copy moving the copy's bytes (half read, half written), timed the same
    # way (0.0 for a memset of no bytes); and that floor's share of the
    # kernel's time, 100 * (copy_routed_us + memset_zero_us) / gpu_us
    zero_bytes: int | None = None
    memset_zero_us: float | None = None
    copy_routed_us: float | None = None
    pct_copy_memset_model: float | None = None
    # per call: eager wall time, and GPU time in a CUDA graph
    eager_us: float | None = None
    graph_us: float | None = None
    index_select_eager_us: float | None = None
    # the torch peers
    torch_ref_us: float | None = None
    torch_nosync_us: float | None = None
    speedup_vs_ref: float | None = None
    speedup_vs_nosync: float | None = None
    # peers' errors and mismatches, by name
    extra: dict = field(default_factory=dict)
    # the CPU backend's median wall time (no GPU)
    cpu_us: float | None = None


def _shapes_text(w: Workload) -> str:
    if w.op in MAPPING_OP_NAMES:
        return (f"T={w.num_tokens} K={w.top_k} E={w.num_experts} A={w.alignment} "
                f"X={w.num_expanded} {w.dtype}")
    if w.op == "quantize_fp8":
        text = f"T={w.num_tokens} H={w.hidden} npc={w.num_per_channels}"
    elif w.op == "swiglu_quantize_fp8":
        text = (f"T={w.num_tokens} I={w.hidden} K={w.top_k} X={w.num_expanded} "
                f"npc={w.num_per_channels}")
    else:
        text = f"T={w.num_tokens} H={w.hidden} K={w.top_k} X={w.num_expanded}"
    if w.plan is not None:
        # E local experts (/ E * ep_ranks of all ranks), the rows of the X that hold a slot
        experts = str(w.plan.num_experts)
        if w.plan.ep_ranks != 1:
            experts += f"/{w.plan.total_experts}"
        text += f" plan E={experts} A={w.plan.alignment} routed={w.routed_rows}"
        if not w.plan.trimmed:  # X is fused_mapping's default, the worst case
            text += " untrimmed"
    if w.sf_columns is not None:
        layout = "col" if w.use_tma_aligned_col_major_sf else "row"
        text += f" S={w.sf_columns} {w.sf_dtype}/{layout}"
        if w.round_sf and not w.packed_ue8m0:  # packed exponents are rounded anyway
            text += " round"
    if w.plan is not None and w.op in OP_NAMES:
        text += " +pos_to_token"  # the call passes the plan's (workload_inputs)
    if w.op in NEWER_OP_FAMILIES:
        # the optional inputs the call passes (reduce_fused's token_topk_to_pos
        # is not optional: SwiGLU's is the plan's hint)
        optional = ("topk_weights", "row_scale", "pos_to_expert") + (
            ("token_topk_to_pos",) if w.op == "swiglu_quantize_fp8" else ())
        text += "".join(f" +{name}" for name in optional if name in w.shapes)
    if w.op == "swiglu_quantize_fp8" and not w.zero_padding:
        text += " zero_padding=False"
    return text


def _new_record(w: Workload) -> Record:
    return Record(w.op, w.label, _shapes_text(w), w.bytes)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(f"u{a.itemsize}")


def reference_outputs(w: Workload, host: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """The NumPy oracle's outputs of workload ``w`` on ``host`` inputs (for
    ``fused_mapping``, the plan's seven arrays in :class:`FusedMapping` order,
    ``w.num_expanded`` rows; for a newer op, the op on the NumPy arrays, its
    function fetched from its package, not through this module's name)."""
    if w.op in NEWER_OP_FAMILIES:
        return _call_newer(w, family_op(w.op), host)
    if w.op in MAPPING_OP_NAMES:
        # a FusedMapping is a tuple already
        return fused_mapping_numpy(host["topk_ids"], w.num_experts, alignment=w.alignment,
                                   num_expanded=w.num_expanded)
    if w.op == "expand_to_fused":
        return (expand_to_fused_numpy(host["x"], host["token_topk_to_pos"],
                                      host["pos_to_expert"]),)
    return expand_to_fused_with_sf_numpy(
        host["x"], host["x_sf"], host["token_topk_to_pos"], host["pos_to_expert"],
        col_major=w.use_tma_aligned_col_major_sf)


def _call_newer(w: Workload, op: Callable[..., Any], args: dict[str, Any], **kwargs) -> tuple:
    """Newer op ``op`` (``w.op``'s function) on ``args``, its optional inputs
    those the workload passes; its results as a tuple."""
    if w.op == "reduce_fused":
        return (op(args["expanded"], args["token_topk_to_pos"], args.get("topk_weights"),
                   row_scale=args.get("row_scale"), **kwargs),)
    sf_kwargs = {"num_per_channels": w.num_per_channels, "round_sf": w.round_sf,
                 "packed_ue8m0": w.packed_ue8m0,
                 "use_tma_aligned_col_major_sf": w.use_tma_aligned_col_major_sf}
    if w.op == "quantize_fp8":
        return tuple(op(args["x"], **sf_kwargs, **kwargs))
    return tuple(op(args["h"], topk_weights=args.get("topk_weights"),
                    pos_to_token_topk=args.get("pos_to_token_topk"),
                    pos_to_expert=args.get("pos_to_expert"),
                    token_topk_to_pos=args.get("token_topk_to_pos"),
                    zero_padding=w.zero_padding, **sf_kwargs, **kwargs))


def _call(w: Workload, args: dict[str, Any], **kwargs) -> tuple:
    """The op of ``w`` on ``args`` (any array kind); its results as a tuple.

    ``fused_mapping`` is called as a user would, with its default X and no
    ``kwargs`` (it has no ``out=``). A newer op is called through this
    module's name for it."""
    if w.op in NEWER_OP_FAMILIES:
        return _call_newer(w, _timed_op(w.op), args, **kwargs)
    if w.op in MAPPING_OP_NAMES:
        return fused_mapping(args["topk_ids"], w.num_experts, alignment=w.alignment, **kwargs)
    if w.op == "expand_to_fused":
        return (expand_to_fused(args["x"], args["token_topk_to_pos"], args["pos_to_expert"],
                                pos_to_token=args.get("pos_to_token"), **kwargs),)
    return expand_to_fused_with_sf(
        args["x"], args["x_sf"], args["token_topk_to_pos"], args["pos_to_expert"],
        num_per_channels=w.num_per_channels,
        use_tma_aligned_col_major_sf=w.use_tma_aligned_col_major_sf,
        pos_to_token=args.get("pos_to_token"), **kwargs)


_EXPAND_OUTPUT_NAMES = ("expanded_x", "expanded_x_sf")
_NEWER_OUTPUT_NAMES = {"reduce_fused": ("out",), "quantize_fp8": ("x_fp8", "x_sf"),
                       "swiglu_quantize_fp8": ("y_fp8", "y_sf")}


def output_names(w: Workload) -> tuple[str, ...]:
    """The names of the op's outputs, in :func:`_call`'s order."""
    if w.op in NEWER_OP_FAMILIES:
        return _NEWER_OUTPUT_NAMES[w.op]
    if w.op in MAPPING_OP_NAMES:
        return FusedMapping._fields
    return _EXPAND_OUTPUT_NAMES[:2 if w.sf_columns is not None else 1]


def compared_rows(w: Workload, host: dict[str, np.ndarray]) -> np.ndarray | None:
    """The output rows a result is checked on: None for every row, or (a
    SwiGLU call with ``zero_padding`` False, whose padding rows hold
    whatever the memory held) a bool mask of the live rows, those the maps
    route a slot to (``pos_to_expert >= 0`` and, weighted, a slot in [0, T *
    K)), as the op defines them."""
    if w.op != "swiglu_quantize_fp8" or w.zero_padding:
        return None
    return ~swiglu_padding_rows(w.num_expanded, pos_to_expert=host.get("pos_to_expert"),
                                pos_to_token_topk=host.get("pos_to_token_topk"),
                                num_slots=w.num_tokens * w.top_k)


def _mismatch(results, expected, to_host: Callable[[Any], np.ndarray], names: Sequence[str],
              rows: np.ndarray | None = None) -> str | None:
    """Where ``results`` differ from ``expected`` bit for bit (shape, item
    size, bits), the output named by ``names``; None if nowhere. ``rows``:
    compare only those rows (a bool mask over every output's first axis;
    the indices reported are then among them)."""
    if len(results) != len(expected):
        return f"{len(results)} outputs, expected {len(expected)}"
    for name, got, want in zip(names, results, expected, strict=True):
        got, want = to_host(got), np.asarray(want)
        if got.dtype.itemsize != want.dtype.itemsize:
            return f"{name}: dtype {got.dtype} != {want.dtype}"
        got_bits, want_bits = _bits(got), _bits(want)
        if got_bits.shape != want_bits.shape:
            return f"{name}: shape {got_bits.shape} != {want_bits.shape}"
        if rows is not None:
            got_bits, want_bits = got_bits[rows], want_bits[rows]
        wrong = np.argwhere(got_bits != want_bits)
        if wrong.size:
            return (f"{name}: {len(wrong)} elements differ, first at "
                    f"{tuple(int(i) for i in wrong[0])}")
    return None


def split_bytes(w: Workload, host: dict[str, np.ndarray]) -> SplitBytes:
    """The copy and zero bytes of expand workload ``w`` on ``host`` inputs: a
    plan workload's own (:meth:`Workload.split_bytes`, checked against the
    inputs), else those of the drawn routing (its routed rows, the
    ``pos_to_expert >= 0`` ones). They add up to ``w.bytes``."""
    routed_rows = int(np.count_nonzero(np.asarray(host["pos_to_expert"]) >= 0))
    if w.plan is not None and routed_rows != w.routed_rows:
        raise AssertionError(f"{w.label}: the inputs route {routed_rows} rows, the plan "
                             f"{w.routed_rows}")
    return w.split_bytes(routed_rows)


def _to_torch(array: np.ndarray):
    from cupy_moe.runtime.arrays import numpy_to_torch
    return numpy_to_torch(np.ascontiguousarray(array)).cuda()


def _torch_to_host(tensor) -> np.ndarray:
    from cupy_moe.runtime.arrays import torch_to_numpy
    return torch_to_numpy(tensor.cpu())


def _to_cupy(array: np.ndarray):
    import cupy
    bits = np.ascontiguousarray(array)
    if bits.dtype.name in ("bfloat16", "float8_e4m3fn"):
        bits = bits.view(f"u{bits.itemsize}")  # CuPy has no such dtypes: move the bits
    return cupy.asarray(bits)


def _peer_mismatch(w: Workload, result, expected: tuple[np.ndarray, ...]) -> str | None:
    """Where a torch peer's result (a tensor, or a tuple of them) differs bit
    for bit from ``w``'s expected outputs, by the op's output names; None if
    nowhere."""
    result = result if isinstance(result, tuple) else (result,)
    return _mismatch(result, expected, _torch_to_host, output_names(w))


def _time_torch_peers(record: Record, w: Workload, targs: dict[str, Any],
                      expected: tuple[np.ndarray, ...], timer: GpuTimer, iters: int,
                      calls: int) -> None:
    """Fills the torch figures of ``record``: ``index_select`` of the same rows,
    the seed's reference and the sync-free version (each checked bit-exact
    first; a peer that fails or differs is noted in ``record.extra``)."""
    import torch

    from . import peers

    flat = targs["token_topk_to_pos"].reshape(-1).long()
    rows = torch.arange(w.num_tokens, device="cuda").repeat_interleave(w.top_k)[flat >= 0]
    record.index_select_eager_us = eager_us(lambda: targs["x"].index_select(0, rows), calls,
                                            torch.cuda.synchronize)
    maps = (targs["token_topk_to_pos"], targs["pos_to_expert"])
    if w.op == "expand_to_fused":
        ref = lambda: peers.torch_reference_expand(targs["x"], *maps)
        nosync = lambda: peers.torch_nosync_expand(targs["x"], *maps)
    else:
        col = w.use_tma_aligned_col_major_sf
        ref = lambda: peers.torch_reference_expand_with_sf(
            targs["x"], targs["x_sf"], *maps, use_tma_aligned_col_major_sf=col)
        nosync = lambda: peers.torch_nosync_expand_with_sf(
            targs["x"], targs["x_sf"], *maps, use_tma_aligned_col_major_sf=col)
    for name, peer in (("torch_ref", ref), ("torch_nosync", nosync)):
        try:
            result = peer()
        except Exception as exc:  # noqa: BLE001 - a peer's failure must not end the run
            record.extra[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            continue
        problem = _peer_mismatch(w, result, expected)
        if problem:
            record.extra[f"{name}_mismatch"] = problem
            continue
        setattr(record, f"{name}_us", timer.median_us(peer, iters))
    if record.torch_ref_us:
        record.speedup_vs_ref = record.torch_ref_us / record.gpu_us
    if record.torch_nosync_us:
        record.speedup_vs_nosync = record.torch_nosync_us / record.gpu_us


def bench_gpu_workload(w: Workload, timer: GpuTimer, backend: str, iters: int,
                       copy_tbps: float, rng: np.random.Generator, *,
                       kernel_only: bool = False) -> Record:
    """One workload on the GPU through ``backend`` ("cupy" or "torch");
    ``kernel_only`` skips the eager and peer figures (the graph figure stays
    for small shapes under torch; the copy + memset floor of the expand ops
    too). ``fused_mapping`` and the newer ops have no torch peers: their
    records get the GPU, copy, eager and (under torch) graph figures."""
    record = _new_record(w)
    host = workload_inputs(w, rng)
    expected = reference_outputs(w, host)
    use_torch = backend == "torch"
    if use_torch:
        import torch
        args = {name: _to_torch(a) for name, a in host.items()}
        to_host, sync = _torch_to_host, torch.cuda.synchronize
    else:
        import cupy
        args = {name: _to_cupy(a) for name, a in host.items()}
        to_host, sync = cupy.asnumpy, cupy.cuda.Device().synchronize
    names = output_names(w)
    problem = _mismatch(_call(w, args), expected, to_host, names, compared_rows(w, host))
    if problem:
        record.status = f"MISMATCH {problem}"
        return record

    expand = w.op in OP_NAMES
    if w.op in MAPPING_OP_NAMES:
        # fused_mapping has no out=: the plain call is timed, and each call
        # allocates its one int32 buffer for the seven outputs (from CuPy's or
        # torch's caching allocator), which is in every figure.
        def timed() -> tuple:
            return _call(w, args)
    else:
        # Timed with preallocated outputs (out=), so the figure is the kernel's.
        outs = _call(w, args)
        out_kwargs = {"out": outs[0]} if len(outs) == 1 else {"out": outs[0], "out_sf": outs[1]}

        def timed() -> tuple:
            return _call(w, args, **out_kwargs)
    record.gpu_us = timer.median_us(timed, iters)
    record.gbps = w.bytes / record.gpu_us / 1e3
    record.pct_copy_roofline = 100 * record.gbps / (copy_tbps * 1e3)
    record.copy_same_bytes_us = timer.copy_us(w.bytes // 2, iters)
    if expand:
        copy_bytes, record.zero_bytes = split_bytes(w, host)
        record.copy_routed_us = timer.copy_us(copy_bytes // 2, iters)
        record.memset_zero_us = (timer.memset_us(record.zero_bytes, iters)
                                 if record.zero_bytes else 0.0)
        record.pct_copy_memset_model = (100 * (record.copy_routed_us + record.memset_zero_us)
                                        / record.gpu_us)
    graphed = use_torch and w.bytes <= GRAPH_MAX_BYTES
    if kernel_only:
        if graphed:
            record.graph_us = torch_graph_us(timed)
        return record
    calls = 100 if w.bytes <= GRAPH_MAX_BYTES else 10
    record.eager_us = eager_us(lambda: _call(w, args), calls, sync)
    if not expand:
        # no torch peer (nor an index_select figure) of the routing plan or the newer ops
        if graphed:
            record.graph_us = torch_graph_us(timed)
        return record

    try:
        import torch

        from . import peers  # noqa: F401 - imports torch; a broken torch skips the peers
    except ImportError:
        return record
    if not torch.cuda.is_available():
        return record
    if graphed:
        record.graph_us = torch_graph_us(timed)
    targs = args if use_torch else {name: _to_torch(a) for name, a in host.items()}
    _time_torch_peers(record, w, targs, expected, timer, iters, calls)
    return record


def bench_cpu_workload(w: Workload, iters: int, rng: np.random.Generator) -> Record:
    """One workload on the CPU backend (NumPy arrays): median wall time of ``iters`` calls."""
    record = _new_record(w)
    host = workload_inputs(w, rng)
    expected = reference_outputs(w, host)
    problem = _mismatch(_call(w, host), expected, np.asarray, output_names(w),
                        compared_rows(w, host))
    if problem:
        record.status = f"MISMATCH {problem}"
        return record
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        _call(w, host)
        times.append((time.perf_counter() - start) * 1e6)
    record.cpu_us = statistics.median(times)
    record.gbps = w.bytes / record.cpu_us / 1e3
    return record


def _gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver
        return False


def resolve_backend(backend: str) -> str:
    """The backend to run: "auto" becomes torch (GPU and torch), cupy (GPU) or
    cpu; a GPU backend asked for on a machine without a GPU is a SystemExit."""
    if backend == "auto":
        if not _gpu_available():
            return "cpu"
        try:
            import torch
            return "torch" if torch.cuda.is_available() else "cupy"
        except ImportError:
            return "cupy"
    if backend in ("cupy", "torch") and not _gpu_available():
        raise SystemExit(f"--backend {backend} needs a CUDA GPU; none was found")
    return backend


def versions() -> dict[str, str]:
    """Versions of cupy_moe, Python, NumPy and of cupy and torch where the run loaded them."""
    found = {"cupy_moe": __version__, "python": platform.python_version(),
             "numpy": np.__version__}
    for name in ("cupy", "torch"):
        module = sys.modules.get(name)
        if module is not None:
            found[name] = module.__version__
    return found


def _select_workloads(ops: list[str], labels: list[str] | None) -> list[Workload]:
    workloads = [w for op in ops for w in load_workloads(op)
                 if not labels or w.label in labels]
    if labels:
        unknown = set(labels) - {w.label for w in workloads}
        if unknown:
            raise SystemExit(f"unknown workload label(s) for {ops}: {sorted(unknown)}")
    return workloads


def run(ops: list[str], labels: list[str] | None, backend: str, iters: int, quick: bool,
        progress=None) -> dict[str, Any]:
    """Benchmark the workloads of ``ops`` (only ``labels``, if given) on ``backend``
    ("auto", "cupy", "torch", "cpu"). Returns the JSON-ready result: date,
    backend, iters, quick, versions, copy_tbps, device, records (one
    :class:`Record` dict a workload), notes. Progress lines go to ``progress``
    (default: ``sys.stderr`` as it is at the call). With ``quick`` on the CPU,
    the workloads over :func:`cpu_quick_max_bytes` are skipped with a note,
    unless ``labels`` names them."""
    if progress is None:
        progress = sys.stderr
    backend = resolve_backend(backend)
    workloads = _select_workloads(ops, labels)
    rng = np.random.default_rng()
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "backend": backend, "iters": iters,
        "quick": quick, "versions": {}, "copy_tbps": None, "device": platform.processor() or
        platform.machine(), "records": [], "notes": [],
    }
    timer = None
    if backend == "cpu":
        result["notes"].append("no GPU: CPU backend (vectorised NumPy); GPU columns empty")
        if quick and not labels:  # a workload named is run, whatever its size
            skipped = [w.label for w in workloads if w.bytes > cpu_quick_max_bytes(w.op)]
            workloads = [w for w in workloads if w.bytes <= cpu_quick_max_bytes(w.op)]
            if skipped:
                result["notes"].append(
                    f"--quick on the CPU skips workloads over {CPU_QUICK_MAX_BYTES >> 20} MiB "
                    f"({CPU_QUICK_MAX_COMPUTE_BYTES >> 20} MiB for "
                    f"{', '.join(NEWER_OP_FAMILIES)}): {', '.join(skipped)}")
    else:
        timer = GpuTimer()
        result["device"] = timer.device_name
        result["copy_tbps"] = timer.copy_tbps()
        print(f"device-to-device copy: {result['copy_tbps']:.2f} TB/s (read + write)",
              file=progress)
    for index, w in enumerate(workloads, 1):
        print(f"[{index}/{len(workloads)}] {w.op} {w.label} ...", file=progress, flush=True)
        if timer is None:
            record = bench_cpu_workload(w, iters, rng)
        else:
            record = bench_gpu_workload(w, timer, backend, iters, result["copy_tbps"], rng)
        result["records"].append(asdict(record))
    result["versions"] = versions()
    return result
