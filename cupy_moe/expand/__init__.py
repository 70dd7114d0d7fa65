"""The expand family: token rows (and scale factors) to the expert-major layout.

``api`` (public functions), ``rules`` (shapes, dtypes, messages), ``reference``
(NumPy oracle) and ``cpu`` (the CPU backend), ``tuning`` and ``plan`` (grids of
the kernels in kernels_cu/expand.cu), ``gpu`` (launches on CuPy / torch).
"""

from .api import expand_to_fused, expand_to_fused_with_sf

__all__ = ["expand_to_fused", "expand_to_fused_with_sf"]
