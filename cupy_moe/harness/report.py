"""What a benchmark result looks like to a person: summary lines, a Markdown
table, a bar chart (matplotlib, the ``plot`` extra), and the files they go to.

``result`` is the dict :func:`cupy_moe.harness.runner.run` returns.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["can_plot", "summary_lines", "table_lines", "write_outputs", "write_plot"]

# The table's short name of each op; an op not named here shows in full.
_OP_SHORT = {"expand_to_fused": "expand", "expand_to_fused_with_sf": "with_sf",
             "fused_mapping": "mapping"}


def can_plot() -> bool:
    """Whether :func:`write_plot` can run here (matplotlib imports)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_lines(result: dict[str, Any]) -> list[str]:
    """A Markdown table, one row a record; GPU columns, or CPU ones for the cpu
    backend. A figure not measured (None: the torch peers of ``fused_mapping``,
    say) shows as "-"."""
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
        op = _OP_SHORT.get(r["op"], r["op"])
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
    """The run in a few lines: device, backend, date, iterations, roofline, notes."""
    lines = [(f"cupy-moe bench: {result['device']}, backend {result['backend']}, "
              f"{result['date']}, median of {result['iters']} iterations")]
    if result["copy_tbps"]:
        lines.append(f"roofline: device-to-device copy {result['copy_tbps']:.2f} TB/s "
                     "(read + write), measured in this run; L2 flushed between iterations")
    lines.extend(f"note: {note}" for note in result["notes"])
    return lines


def write_plot(result: dict[str, Any], path: str) -> None:
    """A PNG bar chart: % of copy bandwidth per workload (GB/s on the CPU);
    records without the figure (failed ones) are left out."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    gpu = result["backend"] != "cpu"
    figure = "pct_copy_roofline" if gpu else "gbps"
    records = [r for r in result["records"] if r["status"] == "ok" and r[figure] is not None]
    values = [r[figure] for r in records]
    labels = [r["label"] for r in records]
    ops = ", ".join(dict.fromkeys(r["op"] for r in records)) or "no results"
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(labels) + 1.5))
    bars = ax.barh(labels[::-1], values[::-1], color="tab:green")
    ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
    if gpu:
        ax.axvline(100, color="gray", lw=0.8)
        ax.set_xlabel(f"% of device-to-device copy bandwidth ({result['copy_tbps']:.2f} TB/s)")
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
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write("\n".join(summary_lines(result) + [""] + table_lines(result)) + "\n")
    if plot_path:
        write_plot(result, plot_path)
