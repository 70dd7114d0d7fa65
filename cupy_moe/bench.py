"""Benchmark of the ops over the manifest workloads (DESIGN.md section 7).

Per workload: inputs drawn fresh (random bits, realistic expert-major
routing), our result checked bit-exact against the NumPy reference before
anything is timed, then
- GPU time: median of CUDA-event timings, L2 flushed between iterations (a
  buffer several times the L2 written, then another read, so no dirty lines
  are left for the timed kernel to write back);
- GB/s from the manifest's byte count, and its share of the device-to-device
  copy bandwidth measured at the start of the same run;
- eager wall time per call with torch tensors in and out, allocation included,
  against torch's own ``index_select`` of the same rows;
- GPU time per call from replaying a CUDA graph of many calls (small shapes);
- the seed's PyTorch reference and a sync-free torch version, same timings.
Used by ``cupy-moe bench`` and by benchmarks/bench_expand_to_fused.py.
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from . import __version__, reference
from .manifest import Workload, load_workloads
from .ops import expand_to_fused, expand_to_fused_with_sf
from .workload_inputs import workload_inputs

# Workloads at most this large get a CUDA-graph replay figure (decode, small).
GRAPH_MAX_BYTES = 8 << 20
GRAPH_CALLS = 100
CPU_QUICK_MAX_BYTES = 100 << 20


@dataclass
class Record:
    op: str
    label: str
    shapes: str
    bytes: int
    status: str = "ok"
    gpu_us: float | None = None
    gbps: float | None = None
    pct_copy_roofline: float | None = None
    # a device-to-device copy moving the same bytes (half read, half written),
    # timed the same way: what launch and ramp cost at this size
    copy_same_bytes_us: float | None = None
    eager_us: float | None = None
    graph_us: float | None = None
    index_select_eager_us: float | None = None
    torch_ref_us: float | None = None
    torch_nosync_us: float | None = None
    speedup_vs_ref: float | None = None
    speedup_vs_nosync: float | None = None
    cpu_us: float | None = None
    extra: dict = field(default_factory=dict)


def _shapes_text(w: Workload) -> str:
    text = f"T={w.num_tokens} H={w.hidden} K={w.top_k} X={w.num_expanded}"
    if w.sf_columns is not None:
        layout = "col" if w.use_tma_aligned_col_major_sf else "row"
        text += f" S={w.sf_columns} {w.sf_dtype}/{layout}"
    return text


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(f"u{a.itemsize}")


# -- GPU timing ----------------------------------------------------------------

class GpuTimer:
    """CUDA-event timings on the current stream, with an L2 flush between runs."""

    def __init__(self, l2_multiple: int = 4) -> None:
        import cupy
        self.cupy = cupy
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        self.device_name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        flush_bytes = l2_multiple * int(props["l2CacheSize"])
        self._written = cupy.empty(flush_bytes, dtype=cupy.uint8)
        self._read = cupy.ones(flush_bytes // 4, dtype=cupy.float32)
        self._sink = cupy.empty((), dtype=cupy.float32)

    def flush_l2(self) -> None:
        self._written.fill(1)
        self.cupy.sum(self._read, out=self._sink)  # leaves clean lines behind

    def median_us(self, fn: Callable[[], Any], iters: int, *, flush: bool = True) -> float:
        cupy = self.cupy
        fn()  # warm-up
        starts = [cupy.cuda.Event() for _ in range(iters)]
        ends = [cupy.cuda.Event() for _ in range(iters)]
        for start, end in zip(starts, ends):
            if flush:
                self.flush_l2()
            start.record()
            fn()
            end.record()
        ends[-1].synchronize()
        return statistics.median(cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in zip(starts, ends))

    def copy_us(self, nbytes: int, iters: int) -> float:
        """Median time of a device-to-device copy of ``nbytes`` (read, then written)."""
        cupy = self.cupy
        src = cupy.ones(max(nbytes, 1), dtype=cupy.uint8)
        dst = cupy.empty_like(src)
        stream = cupy.cuda.get_current_stream().ptr
        kind = cupy.cuda.runtime.memcpyDeviceToDevice

        def copy():
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, kind, stream)

        return self.median_us(copy, iters)

    def copy_tbps(self, nbytes: int = 1 << 30, iters: int = 20) -> float:
        """Device-to-device copy bandwidth, bytes read plus bytes written."""
        return 2 * nbytes / self.copy_us(nbytes, iters) / 1e6


def eager_us(fn: Callable[[], Any], calls: int, sync: Callable[[], None],
             rounds: int = 7) -> float:
    """Wall time per call of back-to-back calls, one synchronisation at the end
    of each round; the median of ``rounds`` rounds (host timings are noisy)."""
    for _ in range(3):
        fn()
    sync()
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(per_call)


def torch_graph_us(fn: Callable[[], Any], calls: int = GRAPH_CALLS, replays: int = 10) -> float:
    """GPU time per call from replays of a CUDA graph of ``calls`` calls."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


# -- one workload ----------------------------------------------------------------

def _reference(w: Workload, host: dict[str, np.ndarray]):
    if w.op == "expand_to_fused":
        return (reference.expand_to_fused_numpy(host["x"], host["token_topk_to_pos"],
                                                host["pos_to_expert"]),)
    return reference.expand_to_fused_with_sf_numpy(
        host["x"], host["x_sf"], host["token_topk_to_pos"], host["pos_to_expert"],
        col_major=w.use_tma_aligned_col_major_sf)


def _call(w: Workload, args: dict[str, Any], **kwargs):
    if w.op == "expand_to_fused":
        return (expand_to_fused(args["x"], args["token_topk_to_pos"], args["pos_to_expert"],
                                **kwargs),)
    return expand_to_fused_with_sf(
        args["x"], args["x_sf"], args["token_topk_to_pos"], args["pos_to_expert"],
        num_per_channels=w.num_per_channels,
        use_tma_aligned_col_major_sf=w.use_tma_aligned_col_major_sf, **kwargs)


def _mismatch(results, expected, to_host) -> str | None:
    for name, got, want in zip(("expanded_x", "expanded_x_sf"), results, expected):
        got_bits, want_bits = _bits(to_host(got)), _bits(want)
        if got_bits.shape != want_bits.shape:
            return f"{name}: shape {got_bits.shape} != {want_bits.shape}"
        wrong = np.argwhere(got_bits != want_bits)
        if wrong.size:
            return f"{name}: {len(wrong)} elements differ, first at {tuple(wrong[0])}"
    return None


def _to_torch(array: np.ndarray):
    from ._arrays import numpy_to_torch
    return numpy_to_torch(np.ascontiguousarray(array)).cuda()


def _torch_to_host(tensor) -> np.ndarray:
    from ._arrays import torch_to_numpy
    return torch_to_numpy(tensor.cpu())


def _to_cupy(array: np.ndarray):
    import cupy
    bits = np.ascontiguousarray(array)
    if bits.dtype.name in ("bfloat16", "float8_e4m3fn"):
        bits = bits.view(f"u{bits.itemsize}")
    return cupy.asarray(bits)


def bench_gpu_workload(w: Workload, timer: GpuTimer, backend: str, iters: int,
                       copy_tbps: float, rng: np.random.Generator, *,
                       kernel_only: bool = False) -> Record:
    """One workload on the GPU; ``kernel_only`` skips eager, graph and peer figures."""
    record = Record(w.op, w.label, _shapes_text(w), w.bytes)
    host = workload_inputs(w, rng)
    expected = _reference(w, host)
    use_torch = backend == "torch"
    if use_torch:
        import torch
        args = {name: _to_torch(a) for name, a in host.items()}
        to_host, sync = _torch_to_host, torch.cuda.synchronize
    else:
        import cupy
        args = {name: _to_cupy(a) for name, a in host.items()}
        to_host, sync = cupy.asnumpy, cupy.cuda.Device().synchronize
    problem = _mismatch(_call(w, args), expected, to_host)
    if problem:
        record.status = f"MISMATCH {problem}"
        return record

    # Timed with preallocated outputs (out=), so the figure is the kernel's.
    outs = _call(w, args)
    out_kwargs = {"out": outs[0]} if len(outs) == 1 else {"out": outs[0], "out_sf": outs[1]}
    record.gpu_us = timer.median_us(lambda: _call(w, args, **out_kwargs), iters)
    record.gbps = w.bytes / record.gpu_us / 1e3
    record.pct_copy_roofline = 100 * record.gbps / (copy_tbps * 1e3)
    record.copy_same_bytes_us = timer.copy_us(w.bytes // 2, iters)
    if kernel_only:
        if use_torch and w.bytes <= GRAPH_MAX_BYTES:
            record.graph_us = torch_graph_us(lambda: _call(w, args, **out_kwargs))
        return record
    calls = 100 if w.bytes <= GRAPH_MAX_BYTES else 10
    record.eager_us = eager_us(lambda: _call(w, args), calls, sync)

    try:
        import torch
        from . import peers
    except ImportError:
        return record
    if not torch.cuda.is_available():
        return record
    targs = args if use_torch else {name: _to_torch(a) for name, a in host.items()}
    if w.bytes <= GRAPH_MAX_BYTES and use_torch:
        record.graph_us = torch_graph_us(lambda: _call(w, targs, **out_kwargs))
    flat = targs["token_topk_to_pos"].reshape(-1).long()
    rows = torch.arange(w.num_tokens, device="cuda").repeat_interleave(w.top_k)[flat >= 0]
    record.index_select_eager_us = eager_us(lambda: targs["x"].index_select(0, rows), calls,
                                            torch.cuda.synchronize)
    if w.op == "expand_to_fused":
        ref = lambda: peers.torch_reference_expand(  # noqa: E731
            targs["x"], targs["token_topk_to_pos"], targs["pos_to_expert"])
        nosync = lambda: peers.torch_nosync_expand(  # noqa: E731
            targs["x"], targs["token_topk_to_pos"], targs["pos_to_expert"])
    else:
        col = w.use_tma_aligned_col_major_sf
        ref = lambda: peers.torch_reference_expand_with_sf(  # noqa: E731
            targs["x"], targs["x_sf"], targs["token_topk_to_pos"], targs["pos_to_expert"],
            use_tma_aligned_col_major_sf=col)
        nosync = lambda: peers.torch_nosync_expand_with_sf(  # noqa: E731
            targs["x"], targs["x_sf"], targs["token_topk_to_pos"], targs["pos_to_expert"],
            use_tma_aligned_col_major_sf=col)
    for name, peer in (("torch_ref", ref), ("torch_nosync", nosync)):
        try:
            result = peer()
        except Exception as exc:  # noqa: BLE001 - a peer's failure must not end the run
            record.extra[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            continue
        result = result if isinstance(result, tuple) else (result,)
        problem = _mismatch(result, expected, _torch_to_host)
        if problem:
            record.extra[f"{name}_mismatch"] = problem
            continue
        setattr(record, f"{name}_us", timer.median_us(peer, iters))
    if record.torch_ref_us:
        record.speedup_vs_ref = record.torch_ref_us / record.gpu_us
    if record.torch_nosync_us:
        record.speedup_vs_nosync = record.torch_nosync_us / record.gpu_us
    return record


def bench_cpu_workload(w: Workload, iters: int, rng: np.random.Generator) -> Record:
    record = Record(w.op, w.label, _shapes_text(w), w.bytes)
    host = workload_inputs(w, rng)
    expected = _reference(w, host)
    problem = _mismatch(_call(w, host), expected, lambda a: a)
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


# -- the whole run ------------------------------------------------------------------

def _gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver
        return False


def resolve_backend(backend: str) -> str:
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


def _versions() -> dict[str, str]:
    versions = {"cupy_moe": __version__, "python": platform.python_version(),
                "numpy": np.__version__}
    for name in ("cupy", "torch"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = module.__version__
    return versions


def run(ops: list[str], labels: list[str] | None, backend: str, iters: int, quick: bool,
        progress=sys.stderr) -> dict[str, Any]:
    backend = resolve_backend(backend)
    workloads = [w for op in ops for w in load_workloads(op)
                 if not labels or w.label in labels]
    if labels:
        unknown = set(labels) - {w.label for w in workloads}
        if unknown:
            raise SystemExit(f"unknown workload label(s) for {ops}: {sorted(unknown)}")
    rng = np.random.default_rng()
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "backend": backend, "iters": iters,
        "quick": quick, "versions": {}, "copy_tbps": None, "device": platform.processor() or
        platform.machine(), "records": [], "notes": [],
    }
    timer = None
    if backend == "cpu":
        result["notes"].append("no GPU: CPU backend (vectorised NumPy); GPU columns empty")
        if quick:
            skipped = [w.label for w in workloads if w.bytes > CPU_QUICK_MAX_BYTES]
            workloads = [w for w in workloads if w.bytes <= CPU_QUICK_MAX_BYTES]
            if skipped:
                result["notes"].append(f"--quick on the CPU skips workloads over "
                                       f"{CPU_QUICK_MAX_BYTES >> 20} MiB: {', '.join(skipped)}")
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
    result["versions"] = _versions()
    return result


# -- output ---------------------------------------------------------------------------

def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_lines(result: dict[str, Any]) -> list[str]:
    gpu = result["backend"] != "cpu"
    if gpu:
        header = ["op", "workload", "shapes", "MB", "GPU us", "GB/s", "% copy",
                  "same-size copy us", "eager us",
                  "index_select us", "graph us", "torch-ref us", "nosync us", "x ref",
                  "x nosync"]
    else:
        header = ["op", "workload", "shapes", "MB", "CPU us", "GB/s"]
    rows = [header, ["---"] * len(header)]
    for r in result["records"]:
        op = "with_sf" if r["op"].endswith("with_sf") else "expand"
        base = [op, r["label"], r["shapes"], f"{r['bytes'] / 1e6:.2f}"]
        if r["status"] != "ok":
            rows.append(base + [r["status"]] + [""] * (len(header) - 5))
        elif gpu:
            rows.append(base + [_fmt(r["gpu_us"], ".1f"), _fmt(r["gbps"], ".0f"),
                                _fmt(r["pct_copy_roofline"], ".1f"),
                                _fmt(r["copy_same_bytes_us"], ".1f"), _fmt(r["eager_us"], ".1f"),
                                _fmt(r["index_select_eager_us"], ".1f"), _fmt(r["graph_us"], ".2f"),
                                _fmt(r["torch_ref_us"], ".1f"), _fmt(r["torch_nosync_us"], ".1f"),
                                _fmt(r["speedup_vs_ref"], ".1f"), _fmt(r["speedup_vs_nosync"], ".1f")])
        else:
            rows.append(base + [_fmt(r["cpu_us"], ".0f"), _fmt(r["gbps"], ".1f")])
    return ["| " + " | ".join(row) + " |" for row in rows]


def summary_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"cupy-moe bench: {result['device']}, backend {result['backend']}, "
             f"{result['date']}, median of {result['iters']} iterations"]
    if result["copy_tbps"]:
        lines.append(f"roofline: device-to-device copy {result['copy_tbps']:.2f} TB/s "
                     "(read + write), measured in this run; L2 flushed between iterations")
    lines.extend(f"note: {note}" for note in result["notes"])
    return lines


def write_plot(result: dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in result["records"] if r["status"] == "ok"]
    gpu = result["backend"] != "cpu"
    values = [r["pct_copy_roofline"] if gpu else r["gbps"] for r in records]
    labels = [r["label"] for r in records]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(labels) + 1.5))
    bars = ax.barh(labels[::-1], values[::-1], color="tab:green")
    ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
    if gpu:
        ax.axvline(100, color="gray", lw=0.8)
        ax.set_xlabel(f"% of device-to-device copy bandwidth ({result['copy_tbps']:.2f} TB/s)")
    else:
        ax.set_xlabel("GB/s (CPU backend)")
    ax.set_title(f"cupy_moe expand_to_fused, {result['device']}, {result['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(result: dict[str, Any], json_path: str | None, markdown_path: str | None,
                  plot_path: str | None) -> None:
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write("\n".join(summary_lines(result) + [""] + table_lines(result)) + "\n")
    if plot_path:
        write_plot(result, plot_path)

