"""Kernel launches: argument blocks from a struct description, kernel handles,
device traits, the current device.

Per-call host work is what decode latency is made of, so launches go straight
to ``cuLaunchKernel`` with a pre-built argument block: the constant fields are
packed once per launch configuration, a call packs only its pointers.
Imports CuPy: only GPU code paths import this module.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any, NamedTuple

from cupy.cuda import driver, runtime

from .loader import get_module

__all__ = ["ArgStruct", "ArgBlock", "function_handle", "allow_dynamic_shared",
           "DEFAULT_DYNAMIC_SHARED_BYTES", "DeviceTraits",
           "device_traits", "OnDevice", "launch", "launch_overlapping_previous",
           "launch_cooperative_in_clusters", "max_active_clusters"]

# C field types of a kernel argument struct: struct code and size (= alignment)
_FIELD_TYPES = {"ptr": ("Q", 8), "i64": ("q", 8), "i32": ("i", 4)}


class ArgStruct:
    """A kernel's by-value argument struct, field by field in declaration order.

    Packs the way the CUDA compiler lays the struct out: each field at its
    natural alignment, the size rounded up to the largest alignment. Pointer
    fields come first (a call fills only those; see ArgBlock).
    """

    def __init__(self, *fields: tuple[str, str]) -> None:
        layout, offset, widest = "<", 0, 1
        for _, field_type in fields:
            code, size = _FIELD_TYPES[field_type]
            pad = -offset % size
            layout += f"{pad}x{code}" if pad else code
            offset += pad + size
            widest = max(widest, size)
        if offset % widest:
            layout += f"{-offset % widest}x"
        self.names = tuple(name for name, _ in fields)
        self.pointer_count = next((i for i, (_, t) in enumerate(fields) if t != "ptr"),
                                  len(fields))
        self.packer = struct.Struct(layout)
        self.pointer_packer = struct.Struct("<" + "Q" * self.pointer_count)

    @property
    def size(self) -> int:
        return self.packer.size

    def constants(self, **values: int) -> tuple[int, ...]:
        """The non-pointer fields, in order, from keyword values (all required)."""
        names = self.names[self.pointer_count:]
        missing = set(names) - set(values)
        extra = set(values) - set(names)
        if missing or extra:
            raise TypeError(f"argument struct fields: missing {sorted(missing)}, "
                            f"unknown {sorted(extra)}")
        return tuple(values[name] for name in names)


def _bind_context() -> None:
    """Bind the current device's primary CUDA context to this thread if it
    has none.

    A plan's argument block is first touched in a thread right before its
    first launch there, with the plan's device current. A thread that has
    made no CUDA runtime call yet (a worker handed tensors made elsewhere,
    torch's autograd thread) has no context bound, and a driver launch fails
    with CUDA_ERROR_INVALID_CONTEXT; ``cudaFree(0)`` binds one. Only then:
    a thread with a context (every thread that could be capturing a CUDA
    graph) makes no call that a capture might refuse. Where the driver is
    missing (the plan tests' stand-in devices) nothing is bound and a real
    launch, if any, reports the driver's own error.
    """
    try:
        if not driver.ctxGetCurrent():
            runtime.free(0)
    except RuntimeError:  # CUDADriverError, CUDARuntimeError, no libcuda at all
        pass


class ArgBlock(threading.local):
    """A per-thread argument block and the one-entry ``void*`` array pointing at it.

    The driver copies the argument bytes at launch, so the block is refilled
    for every call; per thread, so concurrent callers don't collide. With
    ``constants`` (the struct's non-pointer fields) each thread's block starts
    with them packed, and ``set_pointers`` packs only the leading pointers.
    ``bind_context`` (a plan's blocks): each thread that touches the block
    binds the current device's CUDA context first (see ``__init__``).
    """

    def __init__(self, layout: ArgStruct, constants: tuple[int, ...] | None = None, *,
                 bind_context: bool = False) -> None:
        if bind_context:
            _bind_context()
        self.layout = layout
        self.buffer = (ctypes.c_uint64 * -(-layout.size // 8))()
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(self.buffer))
        self.params_address = ctypes.addressof(self.params)
        if constants is not None:
            layout.packer.pack_into(self.buffer, 0, *([0] * layout.pointer_count), *constants)

    def set_pointers(self, *pointers: int) -> None:
        self.layout.pointer_packer.pack_into(self.buffer, 0, *pointers)

    def set_all(self, *values: int) -> None:
        self.layout.packer.pack_into(self.buffer, 0, *values)


def launch(handle: int, grid: tuple[int, int, int], threads: int, shared_bytes: int,
           stream: int, block: ArgBlock) -> None:
    driver.launchKernel(handle, grid[0], grid[1], grid[2], threads, 1, 1, shared_bytes, stream,
                        block.params_address, 0)


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union."""
    _fields_ = (("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", ctypes.c_int * 16))


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (ctypes pads hStream to 8 bytes as the C compiler does)."""
    _fields_ = (("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint))


# CU_LAUNCH_ATTRIBUTE_COOPERATIVE, _CLUSTER_DIMENSION,
# _PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
_COOPERATIVE, _CLUSTER_DIMENSION, _PROGRAMMATIC_STREAM_SERIALIZATION = 2, 4, 6


class _OverlapLaunch(threading.local):
    """cuLaunchKernelEx with programmatic stream serialisation (CuPy has no
    binding of it): a per-thread config, its attribute set once."""

    def __init__(self) -> None:
        self.attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        self.attribute.value[0] = 1
        self.config = _LaunchConfig(attrs=ctypes.pointer(self.attribute), num_attrs=1)
        self.config.grid[1] = self.config.grid[2] = 1
        self.config.block[1] = self.config.block[2] = 1
        self.config_address = ctypes.addressof(self.config)


class _ClusterLaunch(threading.local):
    """cuLaunchKernelEx of a cooperative grid in clusters: a per-thread
    config with both attributes (the cluster size set per launch), and the
    occupancy query's config with the cluster attribute alone."""

    def __init__(self) -> None:
        self.attributes = (_LaunchAttribute * 2)()
        self.attributes[0].id = _COOPERATIVE
        self.attributes[0].value[0] = 1
        self.attributes[1].id = _CLUSTER_DIMENSION
        self.attributes[1].value[1] = self.attributes[1].value[2] = 1
        self.config = _LaunchConfig(
            attrs=ctypes.cast(self.attributes, ctypes.POINTER(_LaunchAttribute)), num_attrs=2)
        self.query = _LaunchConfig(attrs=ctypes.pointer(self.attributes[1]), num_attrs=1)
        for config in (self.config, self.query):
            config.grid[1] = config.grid[2] = 1
            config.block[1] = config.block[2] = 1
        self.config_address = ctypes.addressof(self.config)
        self.query_address = ctypes.addressof(self.query)


_overlap = None  # _OverlapLaunch, made on first use (loads the driver library)
_clusters = None  # _ClusterLaunch, likewise
_launch_kernel_ex = _max_active_clusters = None
_driver_functions_lock = threading.Lock()


def _driver_functions() -> None:
    """The driver's cuLaunchKernelEx and cuOccupancyMaxActiveClusters (CuPy
    binds neither), and the per-thread launch configs, on first use: once,
    under a lock (a second thread rebinding ``_overlap`` or ``_clusters``
    would swap another, zeroed config under a launch filling its own), and
    ``_launch_kernel_ex``, which callers test, published last."""
    global _overlap, _clusters, _launch_kernel_ex, _max_active_clusters
    with _driver_functions_lock:
        if _launch_kernel_ex is not None:
            return
        library = ctypes.CDLL("libcuda.so.1")
        launch_ex = library.cuLaunchKernelEx
        launch_ex.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        launch_ex.restype = ctypes.c_int
        occupancy = library.cuOccupancyMaxActiveClusters
        occupancy.argtypes = (ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_void_p)
        occupancy.restype = ctypes.c_int
        _overlap, _clusters = _OverlapLaunch(), _ClusterLaunch()
        _max_active_clusters = occupancy
        _launch_kernel_ex = launch_ex


def launch_overlapping_previous(handle: int, blocks: int, threads: int, shared_bytes: int,
                                stream: int, params_address: int) -> None:
    """Launch a kernel that may start while the previous kernel of the stream
    still runs (Hopper's programmatic dependent launch): the kernel waits for
    it with ``griddepcontrol.wait`` before reading what it wrote, and the
    previous kernel lets it start with ``griddepcontrol.launch_dependents``.
    Captured into CUDA graphs as a programmatic edge."""
    if _launch_kernel_ex is None:
        _driver_functions()
    overlap = _overlap
    config = overlap.config
    config.grid[0], config.block[0], config.shared_bytes = blocks, threads, shared_bytes
    config.stream = stream
    status = _launch_kernel_ex(overlap.config_address, handle, params_address, None)
    if status:
        driver.check_status(status)


def _cluster_config(blocks: int, threads: int, shared_bytes: int, stream: int,
                    cluster: int, query: bool = False) -> int:
    """The address of this thread's cluster launch config (``query``: the
    occupancy query's, without the cooperative attribute), filled in."""
    if _launch_kernel_ex is None:
        _driver_functions()
    clusters = _clusters
    config = clusters.query if query else clusters.config
    config.grid[0], config.block[0], config.shared_bytes = blocks, threads, shared_bytes
    config.stream = stream
    clusters.attributes[1].value[0] = cluster
    return clusters.query_address if query else clusters.config_address


def launch_cooperative_in_clusters(handle: int, blocks: int, threads: int, shared_bytes: int,
                                   stream: int, params_address: int, cluster: int) -> None:
    """A cooperative launch (every block resident at once) whose blocks form
    clusters of ``cluster`` consecutive blocks (sm_90+; ``blocks`` a
    multiple of it, at most ``cluster * max_active_clusters(...)``)."""
    config = _cluster_config(blocks, threads, shared_bytes, stream, cluster)
    status = _launch_kernel_ex(config, handle, params_address, None)
    if status:
        driver.check_status(status)


def max_active_clusters(handle: int, threads: int, shared_bytes: int, cluster: int) -> int:
    """How many clusters of ``cluster`` blocks of kernel ``handle`` the GPU
    holds at once (the driver's occupancy query: clusters sit in one GPC
    each, so this can be less than multiprocessors // cluster)."""
    config = _cluster_config(cluster, threads, shared_bytes, 0, cluster, query=True)
    count = ctypes.c_int(0)
    status = _max_active_clusters(ctypes.byref(count), handle, config)
    if status:
        driver.check_status(status)
    return count.value


_functions: dict[tuple, int] = {}
# the cupy Function objects behind the handles: each holds its loaded module,
# so no handle outlives the module it points into
_function_objects: dict[tuple, Any] = {}
_functions_lock = threading.Lock()


def function_handle(source: str, defines: tuple[tuple[str, int], ...], device: int,
                    name: str) -> int:
    """Driver handle of kernel ``name`` of ``source`` compiled with ``defines``."""
    key = (device, source, defines, name)
    handle = _functions.get(key)
    if handle is None:
        module = get_module(source, defines, device)
        # One thread at a time loads: CuPy 13's RawModule loads its module
        # lazily and, when two threads race, keeps one load and unloads the
        # other, whose handle would then dangle.
        with _functions_lock:
            handle = _functions.get(key)
            if handle is None:
                function = module.get_function(name).kernel  # a loaded cupy.cuda.Function
                _function_objects[key] = function
                handle = _functions[key] = function.ptr
    return handle


# shared memory a block gets without its kernel's opt-in (static and dynamic together)
DEFAULT_DYNAMIC_SHARED_BYTES = 48 * 1024

_dynamic_shared_allowed: dict[int, int] = {}  # function handle -> the opt-in it has
_dynamic_shared_lock = threading.Lock()


def allow_dynamic_shared(handle: int, shared_bytes: int) -> None:
    """Let kernel ``handle`` launch with ``shared_bytes`` of dynamic shared
    memory, past the 48 KiB a launch gets without the kernel's opt-in.

    The opt-in belongs to the function, which every plan with the same
    module and name shares, so it is only ever raised: a later plan setting
    a smaller one would make an earlier plan's launches fail.
    """
    with _dynamic_shared_lock:
        if _dynamic_shared_allowed.get(handle, 0) >= shared_bytes:
            return
        driver.funcSetAttribute(handle, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                shared_bytes)
        _dynamic_shared_allowed[handle] = shared_bytes


class DeviceTraits(NamedTuple):
    multiprocessors: int
    major: int  # compute capability major: 9 = Hopper (bulk copies, TMA)
    shared_bytes_optin: int  # dynamic shared memory a block may opt in to
    cooperative_launch: bool = False  # all blocks of a grid can be made resident
    l2_bytes: int = 0  # the L2 cache's size (0: unknown)


_device_traits: dict[int, DeviceTraits] = {}


def device_traits(device: int) -> DeviceTraits:
    traits = _device_traits.get(device)
    if traits is None:
        props = runtime.getDeviceProperties(device)
        traits = _device_traits[device] = DeviceTraits(
            props["multiProcessorCount"], props["major"],
            props.get("sharedMemPerBlockOptin", 48 * 1024),
            bool(props.get("cooperativeLaunch", 0)), int(props.get("l2CacheSize", 0)))
    return traits


def current_device() -> int:
    return runtime.getDevice()


class OnDevice:
    """Make ``device`` current for the call, only when it is not already."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.previous = None

    def __enter__(self) -> None:
        current = runtime.getDevice()
        if current != self.device:
            self.previous = current
            runtime.setDevice(self.device)

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            runtime.setDevice(self.previous)
