"""A/B sweeps of one op's variants (launch shapes, tunings) on manifest workloads.

The benchmark programs ``benchmarks/sweep_combine.py`` and
``benchmarks/sweep_swiglu.py`` differ only in their variants and in how one
variant is called; the rest lives here: each variant is first checked bit for
bit against the NumPy oracle on the workload's inputs, then timed with its
outputs preallocated (``GpuTimer.median_us``: CUDA events, L2 flushed), and
reported as GPU µs and the share of the same-run copy bandwidth over the
workload's roofline bytes.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import runner
from .inputs import workload_inputs
from .manifest import Workload

__all__ = ["RunVariant", "pick_variants", "pick_workloads", "sweep_table"]

# (workload, inputs as to_device made them, the variant, preallocated outputs or
# None) -> the op's outputs, a tuple in runner.output_names order
RunVariant = Callable[[Workload, dict[str, Any], Any, "tuple | None"], tuple]


def sweep_table(workloads: Sequence[Workload], variants: Sequence[tuple[str, Any]],
                run: RunVariant, timer: Any, copy_tbps: float, iters: int,
                variant_column: str, rng: np.random.Generator, *,
                to_device: Callable[[np.ndarray], Any] = runner._to_torch,
                to_host: Callable[[Any], np.ndarray] = runner._torch_to_host) -> list[str]:
    """Markdown lines: a row per variant (named by ``variants``' first items),
    a column per workload, each cell ``µs (% of copy)`` or ``MISMATCH ...``.
    ``timer`` times a callable (``median_us(fn, iters)``); inputs go to the
    device by ``to_device`` (CUDA torch tensors) and results come back by
    ``to_host``; progress goes to stderr."""
    lines = [f"copy {copy_tbps:.2f} TB/s; GPU us (% of copy) per {variant_column}",
             f"| {variant_column} | " + " | ".join(w.label for w in workloads) + " |",
             "|---" * (len(workloads) + 1) + "|"]
    cells: dict[str, list[str]] = {name: [] for name, _ in variants}
    for w in workloads:
        host = workload_inputs(w, rng)
        expected = runner.reference_outputs(w, host)
        inputs = {name: to_device(array) for name, array in host.items()}
        for name, variant in variants:
            outs = run(w, inputs, variant, None)
            problem = runner._mismatch(outs, expected, to_host, runner.output_names(w),
                                       runner.compared_rows(w, host))
            if problem:
                cells[name].append(f"MISMATCH {problem}")
                continue
            us = timer.median_us(functools.partial(run, w, inputs, variant, outs), iters)
            cells[name].append(f"{us:.1f} ({w.bytes / us / 1e6 / copy_tbps * 100:.1f}%)")
        print(w.label, "done", file=sys.stderr, flush=True)
    return lines + [f"| {name} | " + " | ".join(row) + " |" for name, row in cells.items()]


def pick_workloads(op_names: Sequence[str], labels: Sequence[str],
                   error: Callable[[str], Any]) -> list[Workload]:
    """The workloads of ``op_names`` named by ``labels``, in that order;
    ``error`` (``parser.error``, which exits) is called naming the unknown
    ones, which a returning ``error`` leaves out."""
    from .manifest import load_workloads

    known = {w.label: w for op in op_names for w in load_workloads(op)}
    unknown = sorted(set(labels) - set(known))
    if unknown:
        error(f"--only: unknown {' / '.join(op_names)} workload(s) {', '.join(unknown)}")
    return [known[label] for label in labels if label in known]


def pick_variants(variants: Sequence[tuple[str, Any]], texts: Sequence[str] | None,
                  option: str, error: Callable[[str], Any]) -> list[tuple[str, Any]]:
    """The first variant (the default: always) and those whose name contains one
    of ``texts`` (all when ``texts`` is empty or None); ``error`` (``parser.error``)
    is called naming ``option`` when ``texts`` match no other variant."""
    if not texts:
        return list(variants)
    picked = [variants[0], *(v for v in variants[1:] if any(t in v[0] for t in texts))]
    if len(picked) == 1:
        error(f"{option}: no variant name contains any of {list(texts)}")
    return picked
