"""The NumPy oracles of every op family, in one namespace.

Each family keeps its reference beside its kernels (``cupy_moe.expand.reference``,
``cupy_moe.mapping.reference``, ...); this module only gathers them for users and
tests that want the plain-NumPy answer of any op.
"""

from .combine.reference import reduce_fused_numpy
from .expand.reference import (
    expand_to_fused_numpy,
    expand_to_fused_with_sf_numpy,
    find_routing_errors,
)
from .mapping.reference import fused_mapping_numpy
from .quantize.reference import (
    dequantize_fp8_numpy,
    quantize_fp8_numpy,
    swiglu_quantize_fp8_numpy,
)

__all__ = ["expand_to_fused_numpy", "expand_to_fused_with_sf_numpy", "find_routing_errors",
           "fused_mapping_numpy", "reduce_fused_numpy", "quantize_fp8_numpy",
           "swiglu_quantize_fp8_numpy", "dequantize_fp8_numpy"]
