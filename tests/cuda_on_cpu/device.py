"""The ops' GPU code on NumPy arrays, its kernels run by cuda_on_cpu.

``emulated_gpu(monkeypatch)`` makes NumPy arrays pass for CuPy arrays of
device 0 (an H200 by its traits: 132 SMs, sm_90, or ``major=8`` for the
pre-Hopper paths) in the expand and quantize ops: their plans, argument
blocks and launches run unchanged, and each launch runs on the CPU. Outputs
the ops allocate come poisoned (0xA5 bytes) with canary margins around
them; ``check_canaries()`` asserts no kernel wrote outside its outputs.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import numpy as np

from . import build

POISON = 0xA5
CANARY = 0x5C
MARGIN = 256  # bytes of canary before and after each output


@dataclass(frozen=True)
class KernelHandle:
    source: str
    defines: tuple
    name: str


@dataclass
class EmulatedGpu:
    major: int = 9
    multiprocessors: int = 132
    seed: int = 0  # nonzero: each launch runs blocks and threads in random orders
    launches: list = field(default_factory=list)   # kernel names, in order
    buffers: list = field(default_factory=list)    # (whole buffer, offset, nbytes)

    # -------- what the plans call
    def function_handle(self, source, defines, device, name):
        return KernelHandle(source, defines, name)

    def device_traits(self, device):
        from cupy_moe.runtime.launch import DeviceTraits
        return DeviceTraits(self.multiprocessors, self.major, 232448, True)

    def launch_kernel(self, handle, gx, gy, gz, bx, by, bz, shared_bytes, stream, params,
                      extra=0):
        self.launches.append(handle.name)
        module = build.module(handle.source, handle.defines, 900 if self.major >= 9 else 800)
        seed = self.seed and self.seed * 1000003 + len(self.launches)
        module.launch(handle.name, (gx, gy, gz), (bx, by, bz), shared_bytes, params, seed=seed)

    def launch_overlapping_previous(self, handle, blocks, threads, shared_bytes, stream,
                                    params_address):
        self.launch_kernel(handle, blocks, 1, 1, threads, 1, 1, shared_bytes, stream,
                           params_address)

    # -------- poisoned allocations with canaries
    def empty(self, shape, dtype=np.float32):
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * dtype.itemsize
        whole = np.full(nbytes + 2 * MARGIN + 64, CANARY, np.uint8)
        # the first element 64-byte aligned, as a GPU allocation's is
        start = MARGIN + (-(whole.ctypes.data + MARGIN) % 64)
        whole[start:start + nbytes] = POISON
        self.buffers.append((whole, start, nbytes))
        return whole[start:start + nbytes].view(dtype).reshape(shape)

    def check_canaries(self) -> None:
        for whole, start, nbytes in self.buffers:
            outside = np.concatenate([whole[:start], whole[start + nbytes:]])
            written = np.flatnonzero(outside != CANARY)
            assert written.size == 0, (
                f"a kernel wrote {written.size} bytes outside an output of {nbytes} bytes")


class _HostArrays:
    """gpu_arrays.Cupy's interface over NumPy arrays (host pointers)."""

    def __init__(self, gpu: EmulatedGpu) -> None:
        self.gpu = gpu

    def stream(self, device):
        return 0

    def device(self, a):
        return 0

    def contiguous(self, a):
        return a if a.flags.c_contiguous else np.ascontiguousarray(a)

    def pointer(self, a):
        return a.ctypes.data

    def item_bytes(self, a):
        return a.itemsize

    def empty(self, shape, like):
        return self.gpu.empty(shape, like.dtype)

    def empty_col_major(self, rows, columns, leading_dim, like):
        return self.gpu.empty((columns, leading_dim), like.dtype)[:, :rows].T

    def empty_int32(self, count, like):
        return self.gpu.empty((count,), np.int32)

    def flat_value(self, a, index):
        return int(a.reshape(-1)[index])

    def to_numpy(self, a):
        return np.array(a)


class _NoDevice:
    def __init__(self, device):
        pass

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def emulated_gpu(monkeypatch, major: int = 9, seed: int = 0) -> EmulatedGpu:
    """Route the expand and quantize ops' NumPy calls through their GPU code
    (``seed``: see EmulatedGpu)."""
    from cupy_moe.expand import api as expand_api
    from cupy_moe.expand import gpu as expand_gpu
    from cupy_moe.expand import plan as expand_plan
    from cupy_moe.quantize import api as quantize_api
    from cupy_moe.quantize import gpu as quantize_gpu
    from cupy_moe.runtime.arrays import ArrayKind, common_kind

    gpu = EmulatedGpu(major=major, seed=seed)
    host = _HostArrays(gpu)

    def numpy_as_cupy(descs):
        kind, device = common_kind(descs)
        return (ArrayKind.CUPY, 0) if kind is ArrayKind.NUMPY else (kind, device)

    driver = types.SimpleNamespace(launchKernel=gpu.launch_kernel)
    fake_cupy = types.SimpleNamespace(empty=gpu.empty, uint8=np.uint8, int32=np.int32,
                                      float32=np.float32)
    for api in (expand_api, quantize_api):
        monkeypatch.setattr(api, "common_kind", numpy_as_cupy)
    for module in (expand_gpu, quantize_gpu):
        monkeypatch.setattr(module, "gpu_library", lambda kind: host)
        monkeypatch.setattr(module, "OnDevice", _NoDevice)
    monkeypatch.setattr(quantize_gpu, "cupy", fake_cupy)
    for module in (expand_plan, quantize_gpu):
        monkeypatch.setattr(module, "function_handle", gpu.function_handle)
        monkeypatch.setattr(module, "device_traits", gpu.device_traits)
        monkeypatch.setattr(module, "driver", driver)
    monkeypatch.setattr(expand_plan, "launch_overlapping_previous",
                        gpu.launch_overlapping_previous)
    # fresh plans: a cached one may hold a real device's handles
    monkeypatch.setattr(quantize_gpu, "_plans", type(quantize_gpu._plans)())
    monkeypatch.setattr(expand_plan, "_plans", type(expand_plan._plans)())
    return gpu


