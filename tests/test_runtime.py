"""The shared runtime, host side: argument descriptions and the torch fast
path's keys, scalar rules, address spans, the column-major allocation."""

from __future__ import annotations

import re
import sys
import threading

import numpy as np
import pytest
import torch

from cupy_moe.runtime.arrays import ArrayKind, describe
from cupy_moe.runtime.bounded_cache import BoundedCache
from cupy_moe.runtime.fast_path import TorchFastPath
from cupy_moe.runtime.rules import require_bool, require_int


def _race(targets) -> None:
    """Run each callable on a thread of its own, all at once, switching
    threads as often as CPython allows (races show within a few thousand
    steps instead of hiding behind the GIL's 5 ms slices)."""
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=target) for target in targets]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old_interval)


def test_describe_reads_what_the_rules_need():
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    desc = describe("x", x)
    assert (desc.kind, tuple(desc.shape), desc.dtype, desc.device) == (
        ArrayKind.TORCH_CPU, (2, 8), "bfloat16", None)
    assert desc.contiguous and not desc.requires_grad and desc.writeable
    assert not describe("x", x.t()).contiguous
    frozen = np.zeros(3, dtype=np.int32)
    frozen.flags.writeable = False
    assert describe("p", frozen) == (ArrayKind.NUMPY, (3,), "int32", None, True, False, False)


class _FakePlan:
    device = 0


@pytest.fixture
def fast_path(monkeypatch):
    """A fast path that takes CPU tensors for CUDA ones (its keys are built
    the same way) and believes device 0 is current."""
    path = TorchFastPath()
    path.remember((), (None,), _FakePlan())  # arms it: torch.Tensor, device getter
    path.clear()
    monkeypatch.setattr(path, "_current_device", lambda: 0)
    return path


def test_fast_path_keys_everything_the_rules_read(fast_path):
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    m = torch.zeros(2, 3, dtype=torch.int32)
    p = torch.zeros(6, dtype=torch.int32)
    plan = _FakePlan()
    fast_path.remember((), tuple(describe("", a) for a in (x, m, p)) + (None,), plan)
    assert fast_path.lookup((), (x, m, p, None)) is plan
    assert fast_path.lookup((), (x.clone(), m.clone(), p.clone(), None)) is plan  # same description
    misses = [
        ((), (x[:, :4].contiguous(), m, p, None)),             # another shape
        ((), (x.half(), m, p, None)),                          # another dtype
        ((), (x, m.long(), p, None)),                          # map dtype
        ((), (x, m, p[:5], None)),                             # X
        ((), (x, m, p, torch.zeros(6, 8, dtype=torch.bfloat16))),  # out given
        ((128, False), (x, m, p, None)),                       # other scalars
        ((), (x.t().contiguous().t(), m, p, None)),            # not contiguous
        ((), (x.clone().requires_grad_(True), m, p, None)),    # needs grad
        ((), (x, m.numpy(), p, None)),                         # not a tensor
        ((), (x.to("meta"), m, p, None)),                      # a device we don't take
    ]
    for scalars, arrays in misses:
        assert fast_path.lookup(scalars, arrays) is None


def test_fast_path_never_remembers_what_the_full_path_copies_or_grad_can_change(fast_path):
    x = torch.zeros(2, 8)
    for odd in (x.t(), x.clone().requires_grad_(True)):
        fast_path.remember((), (describe("x", odd),), _FakePlan())
    assert len(fast_path) == 0


def test_fast_path_hands_a_plan_of_another_device_back_to_the_full_path(fast_path, monkeypatch):
    x = torch.zeros(2, 8)
    plan = _FakePlan()
    fast_path.remember((), (describe("x", x),), plan)
    monkeypatch.setattr(fast_path, "_current_device", lambda: 1)
    assert fast_path.lookup((), (x,)) is None


def test_fast_path_keeps_the_newest_plans_only(monkeypatch):
    """Shapes vary between calls (batch sizes; X under expert parallelism):
    the table is bounded, the oldest key goes first and its next call takes
    the full path."""
    path = TorchFastPath(max_plans=3)
    monkeypatch.setattr(path, "_current_device", lambda: 0)
    tensors = [torch.zeros(t, 8) for t in range(1, 6)]
    plans = [_FakePlan() for _ in tensors]
    for tensor, plan in zip(tensors, plans, strict=True):
        path.remember((), (describe("x", tensor),), plan)
    assert len(path) == 3
    assert [path.lookup((), (t,)) for t in tensors] == [None, None, *plans[2:]]


def test_bounded_cache_drops_the_oldest_entry_first():
    cache = BoundedCache(2)
    assert cache.put("a", 1) == 1
    cache.put("b", 2)
    assert cache.get("a") == 1  # a lookup does not refresh an entry
    cache.put("c", 3)
    assert dict(cache) == {"b": 2, "c": 3}
    cache.put("b", 4)  # a new value for a kept key: nothing dropped
    assert dict(cache) == {"b": 4, "c": 3}
    with pytest.raises(ValueError, match=r"max_entries must be >= 1; got 0"):
        BoundedCache(0)


def test_bounded_cache_takes_inserts_from_several_threads():
    """Plans are made on whichever thread calls first: inserts racing at the
    bound must neither raise (two evictions of one oldest key, an eviction
    iterating while another thread inserts) nor leave the table over it.
    Without the insert lock this failed within a few thousand inserts."""
    cache, errors = BoundedCache(4), []

    def insert(thread):
        try:
            for i in range(20000):
                cache.put((thread, i), i)
        except Exception as error:  # noqa: BLE001 - any of them fails the test
            errors.append(error)

    _race([lambda t=t: insert(t) for t in range(8)])
    assert errors == [] and len(cache) == 4


@pytest.mark.parametrize(("value", "message"), [
    (1.0, "n must be an int; got float 1.0"), (True, "n must be an int; got bool True"),
    (None, "n must be an int; got NoneType None"), (np.bool_(True), "n must be an int; got bool")])
def test_require_int_rejects(value, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        require_int("n", value)


def test_require_int_and_bool_accept_numpy_scalars():
    assert require_int("n", np.int32(32)) == 32 and type(require_int("n", np.int64(7))) is int
    assert require_bool("f", np.bool_(True)) is True and require_bool("f", False) is False
    with pytest.raises(TypeError, match=re.escape("f must be True or False; got int 0")):
        require_bool("f", 0)


cupy = pytest.importorskip("cupy")


@pytest.mark.parametrize(("num_expanded", "sf_columns"), [(16, 14), (18, 14), (0, 3), (5, 1)])
def test_torch_column_major_buffer_holds_the_pad_columns(num_expanded, sf_columns):
    # the allocation the GPU path makes, on CPU tensors: an [X, S] view with
    # strides (1, align(X, 4)) of a buffer of S * align(X, 4) elements
    from cupy_moe.runtime.gpu_arrays import TorchCuda

    leading_dim = -(-num_expanded // 4) * 4
    like = torch.zeros(1, sf_columns, dtype=torch.int32)
    out_sf = TorchCuda.empty_col_major(num_expanded, sf_columns, leading_dim, like)
    assert tuple(out_sf.shape) == (num_expanded, sf_columns)
    if num_expanded > 0:
        assert out_sf.stride() == (1, leading_dim)
    assert out_sf.untyped_storage().nbytes() == sf_columns * leading_dim * 4
    assert out_sf.dtype == torch.int32


def test_byte_span_of_strided_views():
    # CPU tensors stand in for CUDA ones: the span is computed from the
    # pointer, shape and strides alone
    from cupy_moe.runtime.arrays import byte_span

    base = torch.zeros(4, 6, dtype=torch.float32)
    start = base.data_ptr()
    assert byte_span(ArrayKind.TORCH_CUDA, base) == (start, start + 96)
    assert byte_span(ArrayKind.TORCH_CUDA, base[1:3, 2:4]) == (start + 32, start + 64)
    assert byte_span(ArrayKind.TORCH_CUDA, base.t()) == (start, start + 96)
    assert byte_span(ArrayKind.TORCH_CUDA, base[:0]) == (0, 0)


def test_the_dynamic_shared_memory_opt_in_is_only_ever_raised(monkeypatch):
    """A kernel's opt-in is its function's, shared by every plan that launches
    it: a plan needing less than an earlier one must not lower it (the
    earlier plan's launches would fail), and each handle has its own."""
    pytest.importorskip("cupy")
    from types import SimpleNamespace

    from cupy_moe.runtime import launch

    calls = []
    monkeypatch.setattr(launch, "driver", SimpleNamespace(
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8,
        funcSetAttribute=lambda *args: calls.append(args)))
    monkeypatch.setattr(launch, "_dynamic_shared_allowed", {})
    launch.allow_dynamic_shared(0x10, 80_000)
    launch.allow_dynamic_shared(0x10, 60_000)  # less: the 80,000 stays
    launch.allow_dynamic_shared(0x10, 80_000)
    launch.allow_dynamic_shared(0x20, 60_000)
    launch.allow_dynamic_shared(0x10, 100_000)
    assert calls == [(0x10, 8, 80_000), (0x20, 8, 60_000), (0x10, 8, 100_000)]


def test_a_launch_in_clusters_passes_both_attributes(monkeypatch):
    """launch_cooperative_in_clusters / max_active_clusters (ctypes, no
    GPU): the CUlaunchConfig the driver gets holds the grid, block, shared
    memory and stream, the cooperative attribute and the cluster size; the
    occupancy query's the cluster attribute alone (the driver's functions
    stood in for)."""
    pytest.importorskip("cupy")
    import ctypes

    from cupy_moe.runtime import launch

    seen = []

    def read_config(address):
        config = launch._LaunchConfig.from_address(address)
        attributes = [(config.attrs[i].id, config.attrs[i].value[0], config.attrs[i].value[1],
                       config.attrs[i].value[2]) for i in range(config.num_attrs)]
        return (tuple(config.grid), tuple(config.block), config.shared_bytes, config.stream,
                attributes)

    def launch_ex(config, handle, params, extra):
        seen.append(("launch", read_config(config), handle, params))
        return 0

    def occupancy(count, handle, config):
        seen.append(("query", read_config(config), handle))
        count._obj.value = 16
        return 0

    monkeypatch.setattr(launch, "_clusters", launch._ClusterLaunch())
    monkeypatch.setattr(launch, "_launch_kernel_ex", launch_ex)
    monkeypatch.setattr(launch, "_max_active_clusters", occupancy)
    launch.launch_cooperative_in_clusters(0xAB, 128, 256, 18432, 0x77, 0x1000, 8)
    assert launch.max_active_clusters(0xAB, 256, 18432, 4) == 16
    cooperative, cluster = (2, 1, 0, 0), (4, 8, 1, 1)
    assert seen == [
        ("launch", ((128, 1, 1), (256, 1, 1), 18432, 0x77, [cooperative, cluster]), 0xAB, 0x1000),
        ("query", ((4, 1, 1), (256, 1, 1), 18432, None, [(4, 4, 1, 1)]), 0xAB)]
    assert ctypes.sizeof(launch._LaunchAttribute) == 72  # CUlaunchAttribute's size (cuda.h)


def test_a_plans_argument_block_binds_the_context_once_per_thread(monkeypatch):
    """A thread that has made no CUDA runtime call has no context, and a
    driver launch there fails: a plan's block binds one (``cudaFree(0)``) the
    first time a thread without one touches it, before its launch; other
    blocks never."""
    import types

    from cupy_moe.runtime import launch
    from cupy_moe.runtime.launch import ArgBlock, ArgStruct

    freed, bound = [], {threading.get_ident(): 0}  # thread -> its current context

    def free(pointer):
        freed.append((threading.get_ident(), pointer))
        bound[threading.get_ident()] = 0xC0  # cudaFree(0) binds the primary context

    monkeypatch.setattr(launch, "runtime", types.SimpleNamespace(free=free))
    monkeypatch.setattr(launch, "driver", types.SimpleNamespace(
        ctxGetCurrent=lambda: bound.get(threading.get_ident(), 0)))
    layout = ArgStruct(("p", "ptr"), ("n", "i64"))
    plan_block = ArgBlock(layout, (7,), bind_context=True)
    other_block = ArgBlock(layout, (7,))
    assert freed == [(threading.get_ident(), 0)]  # made on this thread: bound here
    plan_block.set_pointers(0x1000)
    other_block.set_pointers(0x1000)
    assert len(freed) == 1  # once per thread

    def launch_twice():
        for _ in range(2):
            plan_block.set_pointers(0x2000)
            other_block.set_pointers(0x2000)

    worker = threading.Thread(target=launch_twice)
    worker.start()
    worker.join()
    assert [pointer for _, pointer in freed] == [0, 0]
    assert freed[1][0] == worker.ident

    # a thread that has a context already (e.g. one capturing a CUDA graph)
    # makes no call
    def with_a_context():
        bound[threading.get_ident()] = 0xC1
        plan_block.set_pointers(0x3000)

    worker = threading.Thread(target=with_a_context)
    worker.start()
    worker.join()
    assert len(freed) == 2


def test_concurrent_first_lookups_load_a_kernel_once_and_keep_its_module(monkeypatch):
    """CuPy 13's RawModule, loading lazily in two threads at once, keeps one
    module and unloads the other: a handle taken from the unloaded one would
    dangle. The first lookups load under a lock, once, and keep the Function
    (which holds its module) beside the handle."""
    import time
    import types

    from cupy_moe.runtime import launch

    loads = []

    class FakeModule:
        def get_function(self, name):
            loads.append(name)
            time.sleep(0.01)  # a slow load: the other threads arrive meanwhile
            function = types.SimpleNamespace(ptr=0xF000 + len(loads))
            return types.SimpleNamespace(kernel=function)

    module = FakeModule()
    monkeypatch.setattr(launch, "get_module", lambda source, defines, device: module)
    monkeypatch.setattr(launch, "_functions", {})
    monkeypatch.setattr(launch, "_function_objects", {})
    handles = []
    _race([lambda: handles.append(launch.function_handle("x.cu", (), 0, "kernel"))] * 8)
    key = (0, "x.cu", (), "kernel")
    assert loads == ["kernel"] and handles == [0xF001] * 8
    assert launch._function_objects[key].ptr == 0xF001


def test_the_driver_functions_are_bound_once_whatever_the_threads(monkeypatch):
    """Two threads binding cuLaunchKernelEx at once used to rebind the
    per-thread launch configs, swapping a zeroed one under a launch that had
    filled its own; ``_launch_kernel_ex``, which callers test, comes last."""
    import time
    import types

    from cupy_moe.runtime import launch

    libraries = []

    def fake_cdll(name):
        time.sleep(0.01)
        libraries.append(name)
        return types.SimpleNamespace(cuLaunchKernelEx=types.SimpleNamespace(),
                                     cuOccupancyMaxActiveClusters=types.SimpleNamespace())

    monkeypatch.setattr(launch.ctypes, "CDLL", fake_cdll)
    for name in ("_overlap", "_clusters", "_launch_kernel_ex", "_max_active_clusters"):
        monkeypatch.setattr(launch, name, None)
    seen = []

    def first_launch():
        if launch._launch_kernel_ex is None:
            launch._driver_functions()
        seen.append((launch._overlap, launch._clusters, launch._max_active_clusters))

    _race([first_launch] * 8)
    assert libraries == ["libcuda.so.1"]
    assert len(set(map(id, (s[0] for s in seen)))) == 1 and None not in seen[0]


def test_bytes_to_allocation_end_of_cupy_arrays(monkeypatch):
    """CuPy's own memory: its allocation's size (a pool rounds it up to 512
    bytes). Memory imported by DLPack: CuPy's DLPackMemory.size sums the
    shape's extents (40 bytes for a [2, 8] float32 import, where 64 are
    there), so the imported array's own extent, the root of the view chain,
    is what counts. Stand-ins for cupy's classes: no GPU needed."""
    from types import SimpleNamespace

    from cupy_moe.runtime.arrays import bytes_to_allocation_end

    class FakeArray:  # what bytes_to_allocation_end and byte_span read
        def __init__(self, shape, strides, ptr, mem, base=None):
            self.shape, self.strides, self.itemsize, self.base = shape, strides, 4, base
            self.data = SimpleNamespace(ptr=ptr, mem=mem)

    class DLPackMemory:  # named as cupy._core.dlpack's
        def __init__(self, ptr, size):
            self.ptr, self.size = ptr, size

    class PooledMemory(DLPackMemory):  # another name: CuPy's own memory
        pass

    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(ndarray=FakeArray))
    imported = DLPackMemory(4096, 4 * (2 + 8))
    whole = FakeArray((2, 8), (32, 4), 4096, imported)  # [S, align(X, 4)], imported whole
    column_major = FakeArray((6, 2), (4, 32), 4096, imported, base=whole)
    assert bytes_to_allocation_end(ArrayKind.CUPY, column_major) == 64
    assert bytes_to_allocation_end(ArrayKind.CUPY, FakeArray((6, 2), (4, 32), 4100, imported,
                                                             base=whole)) == 60
    alone = FakeArray((6, 2), (4, 32), 4096, imported)  # the transposed view imported alone
    assert bytes_to_allocation_end(ArrayKind.CUPY, alone) == 56
    pooled = PooledMemory(4096, 512)
    assert bytes_to_allocation_end(ArrayKind.CUPY, FakeArray((6, 2), (4, 32), 4096 + 8,
                                                             pooled)) == 504


@pytest.mark.parametrize("module", ["cupy", "torch"])
def test_a_missing_extra_is_named_with_its_install_line(module, monkeypatch):
    """A GPU call without CuPy, or cupy_moe.distributed without torch, once
    failed with a bare ``No module named ...`` from deep inside."""
    from cupy_moe.distributed.exchange import load_torch
    from cupy_moe.runtime.extras import require_cupy, require_torch

    monkeypatch.setitem(sys.modules, module, None)  # `import module` fails as if absent
    if module == "cupy":
        with pytest.raises(ImportError, match=re.escape(
                "the GPU path needs CuPy, which is not installed: pip install "
                "'cupy-moe[cuda12]' (CUDA 12) or 'cupy-moe[cuda13]' (CUDA 13)")):
            require_cupy("the GPU path")
        with pytest.raises(ImportError, match=re.escape(
                "cupy_moe's GPU path (CUDA arrays: its kernels launch through CuPy) needs CuPy")):
            require_cupy()  # what the ops' GPU branches call
    else:
        with pytest.raises(ImportError, match=re.escape(
                "cupy_moe.distributed (expert parallelism on torch.distributed) needs torch, "
                "which is not installed: pip install 'cupy-moe[torch]'")):
            load_torch()
        with pytest.raises(ImportError, match="as_torch needs torch"):
            require_torch("as_torch")


def test_the_cupy_stream_is_the_named_devices_whichever_is_current(monkeypatch):
    """As TorchCuda.stream: a launch for device 1 must not take device 0's
    stream because device 0 happens to be current."""
    from types import SimpleNamespace

    from cupy_moe.runtime.gpu_arrays import Cupy

    streams = {0: 1000, 1: 2000}
    current_device = 0

    def get_current_stream(device_id=-1):
        return SimpleNamespace(ptr=streams[current_device if device_id < 0 else device_id])

    monkeypatch.setattr(cupy.cuda, "get_current_stream", get_current_stream)
    assert Cupy.stream(1) == 2000 and Cupy.stream(0) == 1000
