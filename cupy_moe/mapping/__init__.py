"""The routing plan family: from top-k expert ids to the expert-major layout."""

from .reference import fused_mapping_numpy

__all__ = ["fused_mapping_numpy"]
