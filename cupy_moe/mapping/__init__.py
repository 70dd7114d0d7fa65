"""The routing plan family: from top-k expert ids to the expert-major layout.

``api`` (the public op), ``rules`` (sizes, messages, validate), ``reference``
(NumPy: the CPU backend and the oracle), ``gpu`` (kernels_cu/mapping.cu).
"""

from .api import fused_mapping
from .reference import FusedMapping, fused_mapping_numpy, worst_case_rows

__all__ = ["fused_mapping", "FusedMapping", "fused_mapping_numpy", "worst_case_rows"]
