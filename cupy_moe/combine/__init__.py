"""The combine family: each token's K expert rows, weighted and summed, back to
one row per token (the MoE combine step, the inverse of ``expand_to_fused``).

``api`` (the public op), ``rules`` (shapes, dtypes, messages), ``fma`` (an exact
float32 fma in NumPy, and why it is exact), ``reference`` (the NumPy oracle and
CPU backend; its docstring has the numerics and what NaN / inf give),
``cpu`` (NumPy arrays, CPU tensors), ``launch_shape`` (the grid of
kernels_cu/combine.cu, and why), ``gpu`` (launches on CuPy / torch).
"""

from .api import reduce_fused
from .reference import reduce_fused_numpy

__all__ = ["reduce_fused", "reduce_fused_numpy"]
