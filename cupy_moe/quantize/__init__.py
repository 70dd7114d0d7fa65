"""The quantize family: per-token, per-block fp8 (e4m3) casts and their scale
factors, plain (``quantize_fp8``) or fused with SwiGLU (``swiglu_quantize_fp8``).

``api`` (public functions), ``rules`` (shapes, dtypes, messages),
``numerics`` (the float32 arithmetic both backends share), ``reference``
(NumPy oracle) and ``cpu`` (the CPU backend), ``launch_shape`` (grids of the
kernels in kernels_cu/quantize.cu), ``gpu`` (launches on CuPy / torch).
"""

from .api import quantize_fp8, swiglu_quantize_fp8
from .reference import dequantize_fp8_numpy, quantize_fp8_numpy, swiglu_quantize_fp8_numpy

__all__ = ["dequantize_fp8_numpy", "quantize_fp8", "quantize_fp8_numpy", "swiglu_quantize_fp8",
           "swiglu_quantize_fp8_numpy"]
