"""cupy_moe: CUDA raw kernels for the token-layout steps of Mixture-of-Experts layers.

NumPy-style functions that take NumPy arrays (run on the CPU), CuPy arrays
and torch tensors (run on the GPU, zero-copy), and return the kind they were
given.
"""

from .manifest import Workload, load_workloads, roofline_bytes
from .ops import expand_to_fused, expand_to_fused_with_sf

__version__ = "0.1.0"

__all__ = [
    "expand_to_fused",
    "expand_to_fused_with_sf",
    "load_workloads",
    "roofline_bytes",
    "Workload",
    "__version__",
]
