"""Stand-ins shared by the benchmark tests: the GPU benchmark's control flow
runs on the CPU with these.
"""

from __future__ import annotations


class FakeTimer:
    """GpuTimer's interface: runs each function once, records each call,
    returns fixed figures. ``memset=False``: a memset figure is an error (the
    ops without a copy + memset floor)."""

    def __init__(self, *, memset: bool = True) -> None:
        self.calls: list[tuple] = []
        self.memset = memset

    def median_us(self, fn, iters, *, flush=True):
        fn()
        self.calls.append(("median_us", iters))
        return 4.0

    def copy_us(self, nbytes, iters):
        self.calls.append(("copy_us", nbytes, iters))
        return 2.5

    def memset_us(self, nbytes, iters):
        if not self.memset:
            raise AssertionError("this op has no copy + memset floor")
        self.calls.append(("memset_us", nbytes, iters))
        return 1.0
