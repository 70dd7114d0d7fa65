"""A dry run of the GPU tests' logic on a machine without a GPU (a pytest
plugin; not a test, not a benchmark).

NumPy stands in for CuPy and one device is reported, so the GPU tests run
instead of skipping: their CuPy arrays are NumPy arrays, and the ops take
the CPU backend (the NumPy oracle). A test whose setup, oracle or checks are
wrong then fails here, before it costs device time; kernels, plans, streams
and graphs are not exercised (tests that reach them fail here by design:
raw kernels, non-default streams). Torch's CUDA cases still skip. Kernel
behaviour that differs from the oracle on purpose (a hint that disagrees
with the map) cannot be checked this way.

    PYTHONPATH=benchmarks python -m pytest -p fake_cupy_plugin -p no:cacheprovider \\
        tests/test_swiglu_gpu.py tests/test_expand_gpu_*.py

(twenty-second session: the expand, swiglu and layer GPU suites, 3,115
passed, 2 failed by design: test_cupy_non_default_stream and
test_activations_are_those_of_the_oracle, which launch raw kernels.)
"""

from __future__ import annotations

import sys
import types

import numpy as np


class _AnyAttribute(types.ModuleType):
    """A module whose unknown attributes are submodules of the same kind
    (``cupy.cuda.driver...``), so that imports and attribute lookups at
    import time succeed; calling one raises."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _AnyAttribute(f"{self.__name__}.{name}")
        setattr(self, name, sub)
        return sub

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"fake cupy: {self.__name__} has no CPU stand-in")


def _fake_cupy() -> types.ModuleType:
    fake = _AnyAttribute("cupy")
    for name in dir(np):
        if not name.startswith("__"):
            setattr(fake, name, getattr(np, name))
    fake.asnumpy = lambda a, *args, **kwargs: np.array(a, copy=True)
    fake.asarray = lambda a, dtype=None: np.asarray(a, dtype=dtype)
    fake.cuda.runtime.getDeviceCount = lambda: 1
    return fake


if "cupy" in sys.modules:
    raise RuntimeError("fake_cupy_plugin must be loaded before anything imports cupy")
_fake = _fake_cupy()
sys.modules.update({"cupy": _fake, "cupy.cuda": _fake.cuda,
                    "cupy.cuda.runtime": _fake.cuda.runtime})
