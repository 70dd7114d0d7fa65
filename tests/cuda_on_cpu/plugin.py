"""A pytest plugin: the GPU tests, their kernels run on the CPU.

CuPy is replaced by NumPy whose arrays are ``DeviceArray`` (an ndarray
subclass the ops take for CuPy arrays of device 0); the ops' GPU code runs
unchanged and every kernel launch runs on the CPU (cuda_on_cpu). So the GPU
suites check the kernels, bit for bit, on a machine without a GPU; slowly
(a fiber per CUDA thread), and not what only a GPU has: streams other than
the default, CUDA graphs, torch's CUDA tensors (those tests skip), timing.

    PYTHONPATH=tests python -m pytest -p cuda_on_cpu.plugin -p no:cacheprovider \\
        tests/test_swiglu_gpu.py tests/test_quantize_gpu.py ...

(from the repository root; PYTHONPATH because pytest loads ``-p`` plugins
before the conftest that puts tests/ on the path; benchmarks/cpu_check.sh
runs every GPU file this way). Not part of the README's test command: it
replaces ``cupy`` for the whole process. Each test's launches take a random
block and thread order seeded from its id; its outputs' canaries are
checked after it.
"""

from __future__ import annotations

import sys
import types
import zlib

import numpy as np
import pytest


class DeviceArray(np.ndarray):
    """A NumPy array standing for a CuPy array on device 0."""

    @property
    def data(self):  # cupy's MemoryPointer: .ptr, and .mem, its allocation
        owner = self
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        return types.SimpleNamespace(
            ptr=self.ctypes.data,
            mem=types.SimpleNamespace(ptr=owner.ctypes.data, size=owner.nbytes))

    @property
    def device(self):
        return types.SimpleNamespace(id=0)

    def get(self):
        return np.array(self).view(np.ndarray)


def _fenced_device_copy(array: np.ndarray) -> DeviceArray:
    """A device array's memory: a copy against an inaccessible page (after its
    end when its size keeps it 16-byte aligned, else before its start), so a
    kernel reading past it faults instead of passing unseen."""
    from cuda_on_cpu.device import fenced

    side = "after" if array.nbytes % 16 == 0 else "before"
    copy = fenced(array, side)
    _allocations.append(copy)
    return copy.view(DeviceArray)


# Device memory lives to the end of its test, as in CuPy's pool, where freed
# memory stays mapped and a later allocation is ordered after the kernels
# before it (a test may pass a temporary's pointer to a launch; unmapped
# here at once, it would fault).
_allocations: list = []


def _views_device_memory(array: np.ndarray) -> bool:
    base = array.base
    while isinstance(base, np.ndarray):
        if isinstance(base, DeviceArray):
            return True
        base = base.base
    return False


def _on_device(value):
    if isinstance(value, np.ndarray) and not isinstance(value, DeviceArray):
        # a view of device memory stays one; new memory is fenced
        return (value.view(DeviceArray) if _views_device_memory(value)
                else _fenced_device_copy(value))
    if isinstance(value, tuple):
        return tuple(_on_device(v) for v in value)
    if isinstance(value, list):
        return [_on_device(v) for v in value]
    return value


def _wrapped(function):
    def call(*args, **kwargs):
        return _on_device(function(*args, **kwargs))
    call.__name__ = getattr(function, "__name__", "function")
    return call


class _Unavailable(types.ModuleType):
    """cupy's GPU-only corners: lookups succeed; a call skips the test that
    makes it (non-default streams, graphs, raw kernels of the tests' own:
    the hardware instructions those check are what the emulation stands in
    for)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _Unavailable(f"{self.__name__}.{name}")
        setattr(self, name, sub)
        return sub

    def __call__(self, *args, **kwargs):
        pytest.skip(f"cuda_on_cpu: {self.__name__} has no CPU stand-in")


def _asarray(a, dtype=None, order=None):
    if isinstance(a, DeviceArray) and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return _fenced_device_copy(np.array(a, dtype=dtype, order=order or "K", copy=True))


def _fake_cupy() -> types.ModuleType:
    fake = _Unavailable("cupy")
    for name in dir(np):
        if name.startswith("__"):
            continue
        value = getattr(np, name)
        callable_function = (callable(value) and not isinstance(value, type)
                             and not isinstance(value, types.ModuleType))
        setattr(fake, name, _wrapped(value) if callable_function else value)
    fake.ndarray = DeviceArray
    fake.asarray = fake.array = _asarray
    fake.asnumpy = lambda a, *args, **kwargs: np.array(a, copy=True).view(np.ndarray)
    fake.ascontiguousarray = lambda a, dtype=None: _asarray(np.ascontiguousarray(a, dtype))
    fake.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(
        as_strided=lambda a, *args, **kwargs: np.lib.stride_tricks.as_strided(
            a, *args, subok=True, **kwargs)))
    fake.cuda.runtime.getDeviceCount = lambda: 1
    fake.cuda.runtime.getDevice = lambda: 0
    fake.cuda.get_current_stream = lambda *args: types.SimpleNamespace(
        ptr=0, synchronize=lambda: None)
    fake.cuda.Device = lambda device=0: types.SimpleNamespace(
        id=device, synchronize=lambda: None, __enter__=None)
    return fake


if "cupy" in sys.modules:
    raise RuntimeError("cuda_on_cpu.plugin must be loaded before anything imports cupy")
_fake = _fake_cupy()
sys.modules.update({"cupy": _fake, "cupy.cuda": _fake.cuda,
                    "cupy.cuda.runtime": _fake.cuda.runtime,
                    "cupy.cuda.driver": _fake.cuda.driver,
                    "cupy.cuda.nvrtc": _fake.cuda.nvrtc})


@pytest.fixture(autouse=True)
def _kernels_on_the_cpu(monkeypatch, request):
    from cuda_on_cpu.device import emulated_gpu

    seed = zlib.crc32(request.node.nodeid.encode()) or 1
    gpu = emulated_gpu(monkeypatch, seed=seed, device_arrays=DeviceArray)
    yield gpu
    gpu.check_canaries()
    _allocations.clear()
