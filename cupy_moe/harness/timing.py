"""Timers: GPU time by CUDA events with the L2 flushed, host wall time of eager
calls, and GPU time per call from CUDA-graph replays (torch).

cupy and torch are imported where a timer is made, so that the CPU benchmark
and the CLI's ``info`` run without them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["GRAPH_CALLS", "GpuTimer", "device_name", "eager_us", "torch_graph_us"]

GRAPH_CALLS = 100


def device_name(props: Mapping[str, Any]) -> str:
    """The name in ``cupy.cuda.runtime.getDeviceProperties``' dict (bytes on
    some CuPy versions, str on others)."""
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else name


SPIN_CYCLES = 100_000  # ~50 us at 2 GHz: longer than a call's host work
_SPIN_SOURCE = r"""
extern "C" __global__ void spin_cycles(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""


class GpuTimer:
    """CUDA-event timings on the current stream, with an L2 flush between runs.

    The flush writes a buffer ``l2_multiple`` times the L2 size, then reads
    another, so no dirty lines are left for the timed kernel to write back.
    """

    def __init__(self, l2_multiple: int = 4) -> None:
        import cupy
        self.cupy = cupy
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        self.device_name = device_name(props)
        flush_bytes = l2_multiple * int(props["l2CacheSize"])
        self._written = cupy.empty(flush_bytes, dtype=cupy.uint8)
        self._read = cupy.ones(flush_bytes // 4, dtype=cupy.float32)
        self._sink = cupy.empty((), dtype=cupy.float32)
        self._spin = None

    def flush_l2(self) -> None:
        self._written.fill(1)
        self.cupy.sum(self._read, out=self._sink)  # leaves clean lines behind

    def spin(self, cycles: int = SPIN_CYCLES) -> None:
        """Keep the GPU busy for ``cycles`` SM clock cycles (one thread's clock loop)."""
        if self._spin is None:
            self._spin = self.cupy.RawKernel(_SPIN_SOURCE, "spin_cycles")
        self._spin((1,), (1,), (self.cupy.int64(cycles),))

    def median_us(self, fn: Callable[[], Any], iters: int, *, flush: bool = True,
                  hide_host: bool = False) -> float:
        """Median GPU time of ``fn`` in microseconds over ``iters`` runs, after one warm-up.

        ``hide_host``: the GPU spins ~50 us (SPIN_CYCLES) before each run, so that ``fn``'s
        launches are queued before the start event fires and the figure is
        the GPU's time alone (without it, a call whose host side takes longer
        than its kernels is timed by its host side)."""
        cupy = self.cupy
        fn()  # warm-up
        starts = [cupy.cuda.Event() for _ in range(iters)]
        ends = [cupy.cuda.Event() for _ in range(iters)]
        for start, end in zip(starts, ends, strict=True):
            if flush:
                self.flush_l2()
            if hide_host:
                self.spin()
            start.record()
            fn()
            end.record()
        ends[-1].synchronize()
        return statistics.median(cupy.cuda.get_elapsed_time(s, e) * 1e3
                                 for s, e in zip(starts, ends, strict=True))

    def medians_interleaved_us(self, fns: Sequence[Callable[[], Any]], iters: int, *,
                               hide_host: bool = False) -> list[float]:
        """Median GPU time of each of ``fns`` in microseconds, the runs taken
        in turn: ``iters`` times fns[0], fns[1], ... (each run flushed, and
        with ``hide_host`` spun, as in :meth:`median_us`), after one warm-up
        each. Every run of one follows a run of another, so each call meets
        the machine in the same state: timed apart, a 6-15 µs op ran 2-5%
        slower right after its own runs than after another op's (H100,
        benchmarks/NOTES.md, fifty-second session), which favoured whichever
        side a comparison timed second."""
        if not fns:  # (a bench whose ops all failed their checks has none to time)
            return []
        cupy = self.cupy
        for fn in fns:
            fn()  # warm-up
        events = [[(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(iters)] for _ in fns]
        for i in range(iters):
            for fn, runs in zip(fns, events, strict=True):
                self.flush_l2()
                if hide_host:
                    self.spin()
                runs[i][0].record()
                fn()
                runs[i][1].record()
        events[-1][-1][1].synchronize()
        return [statistics.median(cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in runs)
                for runs in events]

    def copy_us(self, nbytes: int, iters: int, *, hide_host: bool = False) -> float:
        """Median time of a device-to-device copy of ``nbytes`` (read, then
        written); ``hide_host`` as in :meth:`median_us`."""
        cupy = self.cupy
        src = cupy.ones(max(nbytes, 1), dtype=cupy.uint8)
        dst = cupy.empty_like(src)
        stream = cupy.cuda.get_current_stream().ptr
        kind = cupy.cuda.runtime.memcpyDeviceToDevice

        def copy():
            cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, kind, stream)

        return self.median_us(copy, iters, hide_host=hide_host)

    def memset_us(self, nbytes: int, iters: int) -> float:
        """Median time of a ``cudaMemsetAsync`` of ``nbytes`` zero bytes (written
        only), timed as :meth:`copy_us` is."""
        cupy = self.cupy
        dst = cupy.empty(max(nbytes, 1), dtype=cupy.uint8)
        stream = cupy.cuda.get_current_stream().ptr

        def memset():
            cupy.cuda.runtime.memsetAsync(dst.data.ptr, 0, nbytes, stream)

        return self.median_us(memset, iters)

    def copy_tbps(self, nbytes: int = 1 << 30, iters: int = 20) -> float:
        """Device-to-device copy bandwidth in TB/s, bytes read plus bytes written."""
        return 2 * nbytes / self.copy_us(nbytes, iters) / 1e6


def eager_us(fn: Callable[[], Any], calls: int, sync: Callable[[], None],
             rounds: int = 7) -> float:
    """Wall time per call of back-to-back calls, one synchronisation at the end
    of each round; the median of ``rounds`` rounds (host timings are noisy)."""
    for _ in range(3):
        fn()
    sync()
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(per_call)


def torch_graph_us(fn: Callable[[], Any], calls: int = GRAPH_CALLS, replays: int = 10) -> float:
    """GPU time per call from replays of a CUDA graph of ``calls`` calls."""
    import torch
    # Capture needs a warm-up on a side stream (lazy initialisation must not
    # land in the graph).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


class WarmTimer(GpuTimer):
    """The sweeps' ``--warm``: GPU time per call replaying a CUDA graph of
    GRAPH_CALLS calls (``torch_graph_us``, as the bench's graph column), no
    L2 flush: calls back to back, each finding in L2 what the last one left
    there. (Events around single calls without the flush, the GPU spinning
    before each, read 2-8x the graph figure on the H100: not used.)"""

    def median_us(self, fn: Callable[[], Any], iters: int, **kwargs: Any) -> float:
        return torch_graph_us(fn, GRAPH_CALLS, replays=max(3, iters // 5))

    def medians_interleaved_us(self, fns: Sequence[Callable[[], Any]], iters: int,
                               **kwargs: Any) -> list[float]:
        """:meth:`median_us` of each in turn (a graph's replays are timed
        back to back by design; every call in it follows its own kind)."""
        return [self.median_us(fn, iters) for fn in fns]
