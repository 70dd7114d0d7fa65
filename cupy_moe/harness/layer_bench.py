"""``cupy-moe layer``: the MoE layer of ``cupy_moe.layer`` on a model's shapes,
checked against its dense reference and timed step by step.

On a GPU (torch backend) each step gets its GPU time (CUDA events, L2 flushed,
the host hidden behind a spin: ``GpuTimer``), its per-call time in a captured
CUDA graph where it can be captured (not the per-expert-loop GEMM, which reads
segment bounds on the host) and its eager wall time; next to the library's
token-layout steps, the same figures for a torch-only equivalent
(:func:`torch_peers`). The CuPy backend gives GPU and eager times (no graphs,
no peers). Without a GPU the CPU backend's wall time per step.
"""

from __future__ import annotations

import datetime
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from cupy_moe.layer import (
    LIBRARY_STEPS,
    MoeLayer,
    dense_moe_reference,
    model_shape,
    random_moe_inputs,
    relative_error,
    tolerance,
)

from .report import write_result_files
from .runner import resolve_backend, versions
from .timing import GpuTimer, eager_us, torch_graph_us

__all__ = ["run_layer_bench", "table_lines", "torch_peers", "write_outputs", "write_plot"]

# Calls per captured graph and replays: the GEMM steps of the big shapes take
# milliseconds, so fewer than the op benchmarks' GRAPH_CALLS.
GRAPH_CALLS, GRAPH_REPLAYS = 10, 5
EAGER_CALLS = 10
# The CPU backend refuses weights above this (Kimi-K2's are 34 GB): --experts
# makes a smaller layer of the same H and I.
CPU_MAX_WEIGHT_BYTES = 4 << 30


def torch_peers(layer: MoeLayer) -> dict[str, tuple[str, Callable[[], Any]]]:
    """Torch-only equivalents of the layer's token-layout steps (torch CUDA
    layers; ``layer.run()`` must have run): step -> (what it does, a
    sync-free callable reading the layer's state)."""
    import torch

    state, num_experts, alignment = layer.state, layer.num_experts, layer.alignment
    npc = layer.num_per_channels
    plan, x = state["plan"], layer.x
    num_rows = plan.pos_to_expert.shape[0]
    tokens, top_k = plan.token_topk_to_pos.shape
    slot_token = torch.arange(tokens * top_k, device=x.device) // top_k
    rows = plan.token_topk_to_pos.reshape(-1).long()  # every slot is routed: no -1 here

    def mapping():
        flat = state["topk_ids"].reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync
        segments = (counts + alignment - 1) // alignment * alignment
        starts = torch.cumsum(segments, 0) - segments
        sorted_ids = flat[order]
        rank = torch.arange(flat.numel(), device=flat.device) - (torch.cumsum(counts, 0)
                                                                 - counts)[sorted_ids]
        slot_rows = starts[sorted_ids] + rank
        token_topk_to_pos = torch.empty_like(flat, dtype=torch.int32)
        token_topk_to_pos[order] = slot_rows.to(torch.int32)
        pos_to_expert = torch.full((num_rows,), -1, dtype=torch.int32, device=flat.device)
        pos_to_expert[slot_rows] = sorted_ids.to(torch.int32)
        return token_topk_to_pos.view(tokens, top_k), pos_to_expert

    def scatter_rows(values):
        out = torch.zeros((num_rows, values.shape[1]), dtype=values.dtype, device=values.device)
        return out.index_copy_(0, rows, values.index_select(0, slot_token))

    def per_block_fp8(values):
        count, cols = values.shape
        blocks = values.float().view(count, cols // npc, npc)
        scale_factors = blocks.abs().amax(dim=-1).clamp_min(1e-4) / 448.0
        codes = (blocks / scale_factors[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        return codes.view(count, cols), scale_factors

    def reduce():
        gathered = state["y"].index_select(0, rows).view(tokens, top_k, -1).float()
        if layer.fp8:
            return gathered.sum(dim=1).to(torch.bfloat16)
        weights = state["topk_weights"][..., None]
        return (gathered * weights).sum(dim=1).to(torch.bfloat16)

    peers = {"mapping": ("argsort (stable) + scatter_add counts + cumsum", mapping),
             "reduce": ("index_select + weighted sum (fp32)", reduce)}
    if not layer.fp8:
        peers["expand"] = ("zeros + index_select + index_copy_", lambda: scatter_rows(x))
        return peers

    def expand_sf():
        codes = scatter_rows(state["x_fp8"].view(torch.uint8)).view(torch.float8_e4m3fn)
        return codes, scatter_rows(state["x_sf"])

    def swiglu():
        h, inter = state["h"], layer.intermediate
        weight = state["topk_weights"].reshape(-1)[plan.pos_to_token_topk.clamp_min(0).long()]
        act = torch.nn.functional.silu(h[:, :inter].float()) * h[:, inter:].float()
        routed = (plan.pos_to_expert >= 0)[:, None]
        codes, scale_factors = per_block_fp8(torch.where(routed, act * weight[:, None], 0.0))
        return codes, scale_factors * routed  # padding rows: SF 0, as the library's

    if layer.x.shape[1] % npc == 0:
        peers["quantize"] = ("per-block amax, divide, cast (fp32)",
                             lambda: per_block_fp8(x))
    peers["expand"] = ("zeros + index_select + index_copy_ (codes, SF)", expand_sf)
    if layer.intermediate % npc == 0:
        peers["swiglu"] = ("silu * up * weight, per-block fp8 cast (fp32)", swiglu)
    return peers


def _cpu_step_us(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _gpu_figures(fn: Callable[[], Any], timer: GpuTimer, iters: int, sync, graphs: bool,
                 capturable: bool) -> dict[str, float | None]:
    figures = {"gpu_us": timer.median_us(fn, iters, hide_host=True),
               "eager_us": eager_us(fn, EAGER_CALLS, sync, rounds=3), "graph_us": None}
    if graphs and capturable:
        figures["graph_us"] = torch_graph_us(fn, GRAPH_CALLS, GRAPH_REPLAYS)
    return figures


def _layer_inputs(backend: str, shape, tokens: int, seed: int):
    if backend == "cpu":
        return random_moe_inputs(shape, tokens, seed=seed)
    inputs = random_moe_inputs(shape, tokens, seed=seed, device="cuda")
    if backend == "cupy":
        from cupy_moe import as_cupy
        return type(inputs)(*(as_cupy(a) for a in inputs))
    return inputs


def bench_layer(shape, tokens: int, fp8: bool, inputs, backend: str, iters: int,
                timer: GpuTimer | None, alignment: int, gemm: str,
                zero_padding: bool = True) -> dict[str, Any]:
    """One run: the check against the dense reference, then the step figures."""
    layer = MoeLayer(*inputs, top_k=shape.top_k, alignment=alignment, fp8=fp8, gemm=gemm,
                     zero_padding=zero_padding)
    start = time.perf_counter()
    layer.run()
    first_s = time.perf_counter() - start
    state = layer.state
    reference = dense_moe_reference(layer.x, state["topk_ids"], state["topk_weights"],
                                    layer.w_gate_up, layer.w_down)
    error = relative_error(state["out"], reference)
    del reference
    first_out = state["out"]
    limit = tolerance(fp8)
    record: dict[str, Any] = {
        "model": shape.name, "hidden": shape.hidden, "intermediate": shape.intermediate,
        "num_experts": shape.num_experts, "top_k": shape.top_k, "tokens": tokens,
        "path": layer.path, "alignment": alignment, "gemm": layer.gemm,
        "zero_padding": zero_padding,
        "rows": int(state["plan"].pos_to_expert.shape[0]), "first_call_s": first_s,
        "rel_error": error, "tolerance": limit, "ok": bool(error <= limit), "steps": [],
    }
    library = LIBRARY_STEPS[layer.path]
    if backend == "cpu":
        for name in layer.steps:
            record["steps"].append({"step": name, "op": library.get(name) or _NON_LIBRARY[name],
                                    "cpu_us": _cpu_step_us(partial(layer.run_step, name),
                                                           iters)})
        record["layer_cpu_us"] = _cpu_step_us(layer.run, iters)
        return record
    use_torch = backend == "torch"
    if use_torch:
        import torch
        sync = torch.cuda.synchronize
    else:
        import cupy
        sync = cupy.cuda.Device().synchronize
    graphs = use_torch
    loop_gemm = layer.gemm == "loop"
    peers = torch_peers(layer) if use_torch else {}
    for name in layer.steps:
        entry = {"step": name, "op": library.get(name) or _NON_LIBRARY[name]}
        entry.update(_gpu_figures(partial(layer.run_step, name), timer, iters, sync, graphs,
                                  not (loop_gemm and name.startswith("gemm"))))
        if name in peers and name in library:
            what, peer = peers[name]
            entry["peer"] = what
            entry.update({f"peer_{key}": value for key, value in
                          _gpu_figures(peer, timer, iters, sync, graphs, True).items()})
        record["steps"].append(entry)
    whole = _gpu_figures(layer.run, timer, iters, sync, graphs, not loop_gemm)
    record.update({f"layer_{key}": value for key, value in whole.items()})
    # the steps were re-run (and captured) many times: the same output again
    layer.run()
    record["same_after_timing"] = bool(relative_error(layer.state["out"], first_out) == 0)
    return record


_NON_LIBRARY = {"route": "softmax + topk", "gemm_gate_up": "grouped GEMM (stand-in)",
                "gemm_down": "grouped GEMM (stand-in)", "swiglu": "SwiGLU (bf16)",
                "dequantize_gate_up": "dequantize (GEMM stand-in)",
                "dequantize_down": "dequantize (GEMM stand-in)"}


def run_layer_bench(models: list[str], tokens: int, paths: list[str], backend: str = "auto",
                    iters: int = 20, experts: int | None = None, seed: int = 0,
                    alignment: int = 128, gemm: str = "auto", progress=None,
                    zero_padding: bool = True) -> dict[str, Any]:
    """Every (model, path) run; the JSON-ready result (date, backend, device,
    versions, runs, notes)."""
    if progress is None:
        progress = sys.stderr
    backend = resolve_backend(backend)
    # the arrays decide which GEMMs run (grouped_gemm.resolve_method; the
    # layer views CuPy inputs as torch tensors): refused before minutes of
    # drawing weights
    if gemm in ("grouped_mm", "loop") and backend == "cpu":
        raise SystemExit(f"--gemm {gemm} needs CUDA tensors (--backend torch or cupy); "
                         "--backend cpu takes numpy (or auto)")
    if gemm == "numpy" and backend != "cpu":
        raise SystemExit(f"--gemm numpy needs NumPy arrays (--backend cpu); --backend {backend} "
                         "takes grouped_mm or loop (or auto)")
    shapes = [model_shape(name) for name in models]
    if experts is not None:
        for shape in shapes:
            if experts < shape.top_k:
                raise SystemExit(f"{shape.name}: --experts {experts} is below its top-k "
                                 f"({shape.top_k})")
        shapes = [s.with_experts(experts) for s in shapes]
    result: dict[str, Any] = {"date": datetime.date.today().isoformat(), "backend": backend,
                              "device": platform.processor() or platform.machine(),
                              "iters": iters, "runs": [], "notes": []}
    timer = None
    if backend == "cpu":
        result["notes"].append("no GPU: CPU backend (NumPy ops, NumPy GEMMs), wall time per "
                               "step; no torch peers")
        for shape in shapes:
            if shape.weight_bytes() > CPU_MAX_WEIGHT_BYTES:
                raise SystemExit(f"{shape.name}: {shape.weight_bytes() / 2**30:.1f} GiB of "
                                 f"weights is too much for the CPU backend (limit "
                                 f"{CPU_MAX_WEIGHT_BYTES >> 30} GiB); pass --experts N")
    else:
        timer = GpuTimer()
        result["device"] = timer.device_name
    for shape in shapes:
        print(f"{shape.name}: drawing inputs (T={tokens}, E={shape.num_experts}, "
              f"{shape.weight_bytes() / 2**30:.1f} GiB of weights) ...", file=progress,
              flush=True)
        inputs = _layer_inputs(backend, shape, tokens, seed)
        for path in paths:
            print(f"{shape.name} {path} ...", file=progress, flush=True)
            result["runs"].append(bench_layer(shape, tokens, path == "fp8", inputs, backend,
                                              iters, timer, alignment, gemm, zero_padding))
        del inputs
    result["versions"] = versions()
    return result


def _fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def table_lines(result: dict[str, Any]) -> list[str]:
    """Summary lines and one Markdown table per run."""
    lines = [(f"cupy-moe layer: {result['device']}, backend {result['backend']}, "
              f"{result['date']}, median of {result['iters']} iterations")]
    lines += [f"note: {note}" for note in result["notes"]]
    gpu = result["backend"] != "cpu"
    for run in result["runs"]:
        title = (f"### {run['model']} {run['path']}: T={run['tokens']}, H={run['hidden']}, "
                 f"I={run['intermediate']}, E={run['num_experts']}, K={run['top_k']}, "
                 f"X={run['rows']} rows (alignment {run['alignment']}), GEMM {run['gemm']}"
                 + ("" if run.get("zero_padding", True) else ", padding rows left unwritten"))
        check = (f"rel. error vs dense float64 reference {run['rel_error']:.4f} "
                 f"(tolerance {run['tolerance']:.4f}): {'ok' if run['ok'] else 'FAILED'}")
        lines += ["", title, check, ""]
        if gpu:
            header = ["step", "op", "GPU us", "graph us", "eager us", "torch peer",
                      "peer GPU us", "peer graph us", "peer eager us"]
        else:
            header = ["step", "op", "CPU us"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for s in run["steps"]:
            if gpu:
                cells = [s["step"], s["op"], _fmt(s["gpu_us"]), _fmt(s["graph_us"]),
                         _fmt(s["eager_us"]), s.get("peer", "-"), _fmt(s.get("peer_gpu_us")),
                         _fmt(s.get("peer_graph_us")), _fmt(s.get("peer_eager_us"))]
            else:
                cells = [s["step"], s["op"], _fmt(s["cpu_us"], ".0f")]
            lines.append("| " + " | ".join(cells) + " |")
        if gpu:
            total = ["**layer**", "all steps", _fmt(run["layer_gpu_us"]),
                     _fmt(run["layer_graph_us"]), _fmt(run["layer_eager_us"])] + ["-"] * 4
        else:
            total = ["**layer**", "all steps", _fmt(run["layer_cpu_us"], ".0f")]
        lines.append("| " + " | ".join(total) + " |")
    return lines


def write_plot(result: dict[str, Any], path: str) -> None:
    """A PNG: per run, each step's time (GPU: events; CPU: wall), the torch
    peer's beside the library's token-layout steps; log scale."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpu = result["backend"] != "cpu"
    key = "gpu_us" if gpu else "cpu_us"
    runs = result["runs"]
    cols = min(2, len(runs)) or 1
    rows = math.ceil(len(runs) / cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.2 * rows), squeeze=False)
    # the grid may have one axis more than runs (hidden below)
    for ax, run in zip(axes.flat, runs, strict=False):
        steps = run["steps"][::-1]
        where = list(range(len(steps)))
        ours = [s[key] for s in steps]
        bars = ax.barh([y + 0.2 for y in where], ours, height=0.4, color="tab:green",
                       label="cupy_moe layer step")
        ax.bar_label(bars, fmt="%.0f", padding=2, fontsize=7)
        peer = [(y, s.get("peer_gpu_us")) for y, s in zip(where, steps, strict=True)
                if s.get("peer_gpu_us") is not None]
        if peer:
            bars = ax.barh([y - 0.2 for y, _ in peer], [v for _, v in peer], height=0.4,
                           color="tab:gray", label="torch-only equivalent")
            ax.bar_label(bars, fmt="%.0f", padding=2, fontsize=7)
        ax.set_yticks(where, [f"{s['step']}\n({s['op']})" for s in steps], fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("GPU us (CUDA events, L2 flushed)" if gpu else "CPU wall us")
        ax.set_title(f"{run['model']} {run['path']}, T={run['tokens']}, X={run['rows']}, "
                     f"err {run['rel_error']:.3f}", fontsize=9)
        ax.legend(loc="lower right", fontsize=7)
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    fig.suptitle(f"cupy_moe MoE layer per step, {result['device']}, {result['date']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: dict[str, Any], json_path: str | None, markdown_path: str | None,
                  plot_path: str | None) -> None:
    """Each of the JSON, the Markdown table and the plot whose path is given."""
    write_result_files(result, json_path, markdown_path, plot_path, table_lines, write_plot)
