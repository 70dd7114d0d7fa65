"""The ops' GPU code on NumPy arrays, its kernels run by cuda_on_cpu.

``emulated_gpu(monkeypatch)`` makes NumPy arrays pass for CuPy arrays of
device 0 (an H200 by its traits: 132 SMs, sm_90, or ``major=8`` for the
pre-Hopper paths, built with ``__CUDA_ARCH__`` 800) in every op family
(expand, quantize, combine, the routing plan, the layer): their plans,
argument blocks and launches run unchanged, and each launch runs on the
CPU. Outputs the ops allocate come poisoned (0xA5 bytes) with canary
margins around them; ``check_canaries()`` asserts no kernel wrote outside
its outputs.
"""

from __future__ import annotations

import ctypes
import mmap
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
    handles: list = field(default_factory=list)    # their KernelHandles (source, defines)
    buffers: list = field(default_factory=list)    # (whole buffer, offset, nbytes)

    # -------- what the plans call
    def function_handle(self, source, defines, device, name):
        return KernelHandle(source, defines, name)

    def device_traits(self, device):
        from cupy_moe.runtime.launch import DeviceTraits
        return DeviceTraits(self.multiprocessors, self.major, 232448, True)

    def launch_kernel(self, handle, gx, gy, gz, bx, by, bz, shared_bytes, stream, params,
                      extra=0):
        self._module(handle).launch(handle.name, (gx, gy, gz), (bx, by, bz), shared_bytes,
                                    params, seed=self._launch_seed())

    def launch_cooperative(self, handle, gx, gy, gz, bx, by, bz, shared_bytes, stream, params):
        self._module(handle).launch(handle.name, (gx, gy, gz), (bx, by, bz), shared_bytes,
                                    params, cooperative=True, seed=self._launch_seed())

    def launch_cooperative_in_clusters(self, handle, blocks, threads, shared_bytes, stream,
                                       params, cluster):
        self._module(handle).launch(handle.name, (blocks, 1, 1), (threads, 1, 1), shared_bytes,
                                    params, cooperative=True, seed=self._launch_seed(),
                                    cluster=cluster)

    def max_active_clusters(self, handle, threads, shared_bytes, cluster):
        """As an H100/H200 answers for a block an SM: clusters sit in one of
        8 GPCs of (at least) 16 SMs each."""
        return (self.multiprocessors // 16) * (16 // cluster)

    def _module(self, handle: KernelHandle) -> build.Module:
        """The CPU build of ``handle``'s source for this device's architecture
        (the launch recorded)."""
        self.launches.append(handle.name)
        self.handles.append(handle)
        return build.module(handle.source, handle.defines, 900 if self.major >= 9 else 800)

    def _launch_seed(self) -> int:
        """This launch's orders: from the seed and the launch's number (0: none)."""
        if not self.seed:
            return 0
        return (self.seed * 1000003 + len(self.launches)) % (2**64 - 1) + 1

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
    """gpu_arrays.Cupy's interface over NumPy arrays (host pointers); the
    outputs it allocates are ``array_type`` views, poisoned, with canaries."""

    def __init__(self, gpu: EmulatedGpu, array_type: type) -> None:
        self.gpu, self.array_type = gpu, array_type

    def stream(self, device):
        return 0

    def device(self, a):
        return 0

    def contiguous(self, a):
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).view(self.array_type)

    def pointer(self, a):
        return a.ctypes.data

    def item_bytes(self, a):
        return a.itemsize

    def empty(self, shape, like):
        return self.gpu.empty(shape, like.dtype).view(self.array_type)

    def empty_col_major(self, rows, columns, leading_dim, like):
        return self.empty((columns, leading_dim), like)[:, :rows].T

    def empty_int32(self, count, like):
        return self.gpu.empty((count,), np.int32).view(self.array_type)

    def flat_value(self, a, index):
        return int(a.reshape(-1)[index])

    def to_numpy(self, a):
        return np.array(a).view(np.ndarray)


class _NoDevice:
    def __init__(self, device):
        pass

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def _runtime_stand_in():
    """The few cupy.cuda.runtime calls of the ops' validate paths, on host memory."""
    return types.SimpleNamespace(
        memsetAsync=lambda pointer, value, size, stream: ctypes.memset(pointer, value, size),
        memcpyAsync=lambda dst, src, size, kind, stream: ctypes.memmove(dst, src, size),
        memcpyDeviceToHost=2, streamSynchronize=lambda stream: None, getDevice=lambda: 0)


def emulated_gpu(monkeypatch, major: int = 9, seed: int = 0,
                 device_arrays: type | None = None) -> EmulatedGpu:
    """Route the ops' GPU code to the CPU: NumPy arrays (or, with
    ``device_arrays``, only arrays of that ndarray subclass, the others
    staying on the CPU backend) pass for CuPy arrays of device 0 (an H200 by
    its traits, or ``major=8`` for the pre-Hopper paths); each kernel launch
    runs on the CPU (``seed``: see EmulatedGpu)."""
    import importlib

    from cupy_moe.runtime import arrays
    from cupy_moe.runtime.arrays import ArrayDesc, ArrayKind, common_kind

    gpu = EmulatedGpu(major=major, seed=seed)
    host = _HostArrays(gpu, device_arrays or np.ndarray)
    apis = [importlib.import_module(f"cupy_moe.{name}.api")
            for name in ("expand", "quantize", "combine", "mapping")]
    apis.append(importlib.import_module("cupy_moe.layer.moe_layer"))
    gpu_modules = [importlib.import_module(f"cupy_moe.{name}")
                   for name in ("expand.gpu", "expand.plan", "quantize.gpu", "combine.gpu",
                                "mapping.gpu", "runtime.launch")]
    if device_arrays is None:
        def numpy_as_cupy(descs):
            kind, device = common_kind(descs)
            return (ArrayKind.CUPY, 0) if kind is ArrayKind.NUMPY else (kind, device)

        for api in apis:
            monkeypatch.setattr(api, "common_kind", numpy_as_cupy)
    else:
        def describe(name, array, _describe=arrays.describe):
            if isinstance(array, device_arrays):
                return ArrayDesc(ArrayKind.CUPY, array.shape, array.dtype.name, 0,
                                 array.flags.c_contiguous, False, True)
            return _describe(name, array)

        for api in apis:
            monkeypatch.setattr(api, "describe", describe)
    driver = types.SimpleNamespace(
        launchKernel=gpu.launch_kernel, launchCooperativeKernel=gpu.launch_cooperative,
        funcSetAttribute=lambda *args: None, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8,
        ctxGetCurrent=lambda: 1)  # a context is bound: plans' blocks bind none
    stand_ins = {"gpu_library": lambda kind: host, "OnDevice": _NoDevice,
                 "function_handle": gpu.function_handle, "device_traits": gpu.device_traits,
                 "driver": driver, "runtime": _runtime_stand_in(),
                 "launch_overlapping_previous": gpu.launch_overlapping_previous,
                 "launch_cooperative_in_clusters": gpu.launch_cooperative_in_clusters,
                 "max_active_clusters": gpu.max_active_clusters,
                 "cupy": _cupy_stand_in(gpu, device_arrays or np.ndarray)}
    for module in gpu_modules:
        for name, value in stand_ins.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)
        if hasattr(module, "_plans"):  # fresh plans: a cached one holds a real device's handles
            monkeypatch.setattr(module, "_plans", type(module._plans)())
    return gpu


def _cupy_stand_in(gpu: EmulatedGpu, array_type: type):
    """The cupy functions the ops' GPU code calls itself (outputs, scratch)."""
    def empty(shape, dtype=np.float32):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return gpu.empty(shape, dtype).view(array_type)

    return types.SimpleNamespace(empty=empty, ascontiguousarray=np.ascontiguousarray,
                                 uint8=np.uint8, int32=np.int32, int64=np.int64,
                                 float32=np.float32)


PAGE = mmap.PAGESIZE


def fenced(array: np.ndarray, side: str = "after") -> np.ndarray:
    """A copy of ``array`` against an inaccessible page: right ``"after"`` its
    last byte, or right ``"before"`` its first. A kernel that reads or writes
    past that end faults (the process stops with a segmentation fault, which
    faulthandler traces to the launch) instead of reading a neighbour's bytes
    unseen. ``"before"`` starts the copy on a page; ``"after"`` ends it on
    one, so its start is 16-byte aligned only when its size is a multiple
    of 16 (16-byte accesses need that; a map's 4-byte loads do not)."""
    if side not in ("after", "before"):
        raise ValueError(f"side must be 'after' or 'before'; got {side!r}")
    source = np.ascontiguousarray(array)
    nbytes = source.nbytes
    data_pages = -(-max(nbytes, 1) // PAGE)
    region = mmap.mmap(-1, (data_pages + 1) * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    guard = base + data_pages * PAGE if side == "after" else base
    start = data_pages * PAGE - nbytes if side == "after" else PAGE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if libc.mprotect(guard, PAGE, 0) != 0:  # PROT_NONE
        raise OSError(ctypes.get_errno(), "mprotect of the guard page failed")
    fenced_array = np.frombuffer(region, np.uint8, nbytes, start).view(source.dtype)
    fenced_array = fenced_array.reshape(source.shape)
    fenced_array[...] = source
    return fenced_array
