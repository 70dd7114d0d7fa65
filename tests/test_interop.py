"""Zero-copy exchange between torch and CuPy (``as_cupy`` / ``as_torch``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import cupy_moe


def test_as_cupy_takes_only_cuda_tensors():
    with pytest.raises(TypeError, match=re.escape("tensor must be a torch.Tensor; got "
                                                  "numpy.ndarray")):
        cupy_moe.as_cupy(np.zeros(3))
    with pytest.raises(ValueError, match=re.escape("tensor must be on a CUDA device; got "
                                                   "device 'cpu'")):
        cupy_moe.as_cupy(torch.zeros(3))


def test_as_torch_takes_only_cupy_arrays():
    with pytest.raises(TypeError, match=re.escape("array must be a cupy.ndarray; got "
                                                  "torch.Tensor")):
        cupy_moe.as_torch(torch.zeros(3))
