"""The optional packages behind the GPU and torch paths, imported with an
error that names the extra installing them (a bare ``No module named
'cupy'`` from deep inside an op says neither what needs it nor how to get
it)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["CUPY_INSTALL", "TORCH_INSTALL", "require_cupy", "require_torch"]

CUPY_INSTALL = "pip install 'cupy-moe[cuda12]' (CUDA 12) or 'cupy-moe[cuda13]' (CUDA 13)"
TORCH_INSTALL = "pip install 'cupy-moe[torch]'"


def _require(module: str, package: str, install: str, what: str) -> Any:
    loaded = sys.modules.get(module)
    if loaded is not None:  # (~30 ns: the GPU full path asks on every call)
        return loaded
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing = isinstance(error, ModuleNotFoundError) and error.name == module
        state = "is not installed" if missing else f"cannot be imported ({error})"
        raise ImportError(f"{what} needs {package}, which {state}: {install}") from error


def require_cupy(what: str = "cupy_moe's GPU path (CUDA arrays: its kernels launch "
                                "through CuPy)") -> Any:
    """``cupy``, or ImportError saying that ``what`` (by default the ops' GPU
    path) needs it and how to install it."""
    return _require("cupy", "CuPy", CUPY_INSTALL, what)


def require_torch(what: str) -> Any:
    """``torch``, or ImportError saying that ``what`` needs it and how to install it."""
    return _require("torch", "torch", TORCH_INSTALL, what)
