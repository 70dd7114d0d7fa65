"""What a benchmark result looks like to a person: summary lines, a Markdown
table, a bar chart (matplotlib, the ``plot`` extra), and the files they go to.

``result`` is the dict :func:`cupy_moe.harness.runner.run` returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["can_plot", "summary_lines", "table_lines", "write_outputs", "write_plot",
           "write_result_files"]

# The table's short name of each op; an op not named here shows in full.
_OP_SHORT = {"expand_to_fused": "expand", "expand_to_fused_with_sf": "with_sf",
             "fused_mapping": "mapping", "reduce_fused": "reduce", "quantize_fp8": "quant",
             "swiglu_quantize_fp8": "swiglu"}


def can_plot() -> bool:
    """Whether :func:`write_plot` can run here (matplotlib imports)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _model_us(record: dict[str, Any]) -> float | None:
    """The copy + memset floor's time of a record, None where not measured
    (``.get``: records of result files from before these figures lack them)."""
    copy, memset = record.get("copy_routed_us"), record.get("memset_zero_us")
    return None if copy is None or memset is None else copy + memset


def _pct_same_size_copy(record: dict[str, Any]) -> float | None:
    """The same-size copy's time over the kernel's, in percent: the share of
    what a plain copy of the same bytes reaches at this size (launch and ramp
    included), where "% copy" compares with a 1 GiB copy's bandwidth."""
    copy, kernel = record.get("copy_same_bytes_us"), record.get("gpu_us")
    return None if copy is None or not kernel else 100 * copy / kernel


def table_lines(result: dict[str, Any]) -> list[str]:
    """A Markdown table, one row a record; GPU columns, or CPU ones for the cpu
    backend. A figure not measured (None: the torch peers of ``fused_mapping``
    and of the newer ops, say) shows as "-". "% copy+memset" and "copy+memset us" are the expand
    ops' floor of a copy of the routed bytes plus a memset of the padding's
    (:mod:`.runner`). "% same-size copy" is the kernel against a plain copy of
    its bytes timed the same way (:func:`_pct_same_size_copy`)."""
    gpu = result["backend"] != "cpu"
    if gpu:
        header = ["op", "workload", "shapes", "MB", "GPU us", "GB/s", "% copy",
                  "% copy+memset", "same-size copy us", "% same-size copy",
                  "copy+memset us", "eager us",
                  "index_select us", "graph us", "torch-ref us", "nosync us", "x ref",
                  "x nosync"]
    else:
        header = ["op", "workload", "shapes", "MB", "CPU us", "GB/s"]
    rows = [header, ["---"] * len(header)]
    for r in result["records"]:
        op = _OP_SHORT.get(r["op"], r["op"])
        base = [op, r["label"], r["shapes"], f"{r['bytes'] / 1e6:.2f}"]
        if r["status"] != "ok":
            rows.append(base + [r["status"]] + [""] * (len(header) - 5))
        elif gpu:
            rows.append(base + [_fmt(r["gpu_us"], ".1f"), _fmt(r["gbps"], ".0f"),
                                _fmt(r["pct_copy_roofline"], ".1f"),
                                _fmt(r.get("pct_copy_memset_model"), ".1f"),
                                _fmt(r["copy_same_bytes_us"], ".1f"),
                                _fmt(_pct_same_size_copy(r), ".1f"), _fmt(_model_us(r), ".1f"),
                                _fmt(r["eager_us"], ".1f"),
                                _fmt(r["index_select_eager_us"], ".1f"), _fmt(r["graph_us"], ".2f"),
                                _fmt(r["torch_ref_us"], ".1f"), _fmt(r["torch_nosync_us"], ".1f"),
                                _fmt(r["speedup_vs_ref"], ".1f"), _fmt(r["speedup_vs_nosync"], ".1f")])
        else:
            rows.append(base + [_fmt(r["cpu_us"], ".0f"), _fmt(r["gbps"], ".1f")])
    return ["| " + " | ".join(row) + " |" for row in rows]


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The run in a few lines: device, backend, date, iterations, roofline, notes."""
    lines = [(f"cupy-moe bench: {result['device']}, backend {result['backend']}, "
              f"{result['date']}, median of {result['iters']} iterations")]
    if result["copy_tbps"]:
        lines.append(f"roofline: device-to-device copy {result['copy_tbps']:.2f} TB/s "
                     "(read + write), measured in this run; L2 flushed between iterations")
    if any(r.get("pct_copy_memset_model") is not None for r in result["records"]):
        lines.append("copy+memset floor (expand ops): a device-to-device copy of the routed "
                     "bytes (used tokens' rows read, routed rows written, maps read) plus a "
                     "memset of the padding rows' bytes, timed the same way; % copy+memset = "
                     "their time over the kernel's (over 100: the kernel beats the two calls)")
    lines.extend(f"note: {note}" for note in result["notes"])
    return lines


def write_plot(result: dict[str, Any], path: str) -> None:
    """A PNG bar chart: % of copy bandwidth per workload (GB/s on the CPU);
    records without the figure (failed ones) are left out. On the GPU, a
    second bar shows the % of the copy + memset floor where a record has it."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    gpu = result["backend"] != "cpu"
    figure = "pct_copy_roofline" if gpu else "gbps"
    records = [r for r in result["records"] if r["status"] == "ok" and r[figure] is not None]
    ops = ", ".join(dict.fromkeys(r["op"] for r in records)) or "no results"
    records = records[::-1]  # barh draws upwards: the first record on top
    labels = [r["label"] for r in records]
    models = [r.get("pct_copy_memset_model") if gpu else None for r in records]
    paired = any(m is not None for m in models)
    fig, ax = plt.subplots(figsize=(10, (0.5 if paired else 0.35) * len(labels) + 1.5))
    where = list(range(len(labels)))
    height = 0.4 if paired else 0.8
    bars = ax.barh([y + height / 2 if paired else y for y in where],
                   [r[figure] for r in records], height=height, color="tab:green",
                   label="% copy bandwidth")
    ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
    if paired:
        shown = [(y, m) for y, m in zip(where, models, strict=True) if m is not None]
        bars = ax.barh([y - height / 2 for y, _ in shown], [m for _, m in shown],
                       height=height, color="tab:blue", label="% copy+memset floor")
        ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
        ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(where, labels)
    if gpu:
        ax.axvline(100, color="gray", lw=0.8)
        ax.set_xlabel(f"% of device-to-device copy bandwidth ({result['copy_tbps']:.2f} TB/s)"
                      + ("; % of the copy + memset floor's time" if paired else ""))
    else:
        ax.set_xlabel("GB/s (CPU backend)")
    ax.set_title(f"cupy_moe {ops}, {result['device']}, {result['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(result: dict[str, Any], json_path: str | None, markdown_path: str | None,
                  plot_path: str | None) -> None:
    """Writes each of the JSON, the Markdown (summary and table) and the plot
    whose path is given."""
    write_result_files(result, json_path, markdown_path, plot_path,
                       lambda r: summary_lines(r) + [""] + table_lines(r), write_plot)


def write_result_files(result: dict[str, Any], json_path: str | None,
                       markdown_path: str | None, plot_path: str | None,
                       markdown_lines: Callable[[dict[str, Any]], list[str]],
                       plot: Callable[[dict[str, Any], str], None]) -> None:
    """Each of ``result`` as JSON, ``markdown_lines(result)`` and ``plot(result,
    path)`` whose path is given (the bench's and the layer bench's outputs)."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write("\n".join(markdown_lines(result)) + "\n")
    if plot_path:
        plot(result, plot_path)
