"""cupy_moe: CUDA raw kernels for the token-layout steps of Mixture-of-Experts layers.

NumPy-style functions that take NumPy arrays and CPU torch tensors (run on
the CPU), CuPy arrays and CUDA torch tensors (run on the GPU, zero-copy), and
return the kind they were given. ``as_cupy`` / ``as_torch`` move GPU arrays
between CuPy and torch without a copy. ``cupy_moe.reference`` (the NumPy
oracles), ``cupy_moe.layer`` (the end-to-end MoE layer) and
``cupy_moe.distributed`` (expert parallelism) load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__
from .combine import reduce_fused
from .expand import expand_to_fused, expand_to_fused_with_sf
from .interop import as_cupy, as_torch
from .mapping import FusedMapping, fused_mapping
from .quantize import quantize_fp8, swiglu_quantize_fp8

__all__ = [
    "expand_to_fused",
    "expand_to_fused_with_sf",
    "fused_mapping",
    "FusedMapping",
    "reduce_fused",
    "quantize_fp8",
    "swiglu_quantize_fp8",
    "as_cupy",
    "as_torch",
    "load_workloads",
    "roofline_bytes",
    "Workload",
    "__version__",
]

# The manifest lives in the benchmark harness, which the ops never import;
# these names load it on first use.
_HARNESS_NAMES = ("load_workloads", "roofline_bytes", "Workload")
# Subpackages that `import cupy_moe` leaves unloaded (the layer and the
# distributed code import torch), reachable as attributes all the same.
_LAZY_SUBPACKAGES = ("reference", "layer", "distributed", "harness")


def __getattr__(name: str) -> Any:
    if name in _HARNESS_NAMES:
        from .harness import manifest
        return getattr(manifest, name)
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'cupy_moe' has no attribute {name!r}")
