"""An end-to-end MoE layer around the library's ops: the router, the routing
plan, the expand (bf16, or fp8 with scale factors), a stand-in grouped GEMM,
SwiGLU (bf16, or fused with the fp8 cast), the second GEMM and the combine;
and the dense reference it is checked against."""

from .dense_reference import (
    BF16_TOLERANCE,
    FP8_TOLERANCE,
    dense_moe_reference,
    relative_error,
    tolerance,
)
from .grouped_gemm import grouped_gemm, segment_ends
from .moe_layer import BF16_STEPS, FP8_STEPS, LIBRARY_STEPS, MoeLayer, moe_layer
from .routing import route
from .weights import MODELS, MoeInputs, MoeShape, model_shape, random_moe_inputs

__all__ = ["BF16_STEPS", "BF16_TOLERANCE", "FP8_STEPS", "FP8_TOLERANCE", "LIBRARY_STEPS",
           "MODELS", "MoeInputs", "MoeLayer", "MoeShape", "dense_moe_reference",
           "grouped_gemm", "model_shape", "moe_layer", "random_moe_inputs", "relative_error",
           "route", "segment_ends", "tolerance"]
