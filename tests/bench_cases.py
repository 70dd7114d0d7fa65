"""Stand-ins shared by the benchmark tests of the newer ops (reduce_fused,
quantize_fp8, swiglu_quantize_fp8): the GPU benchmark's control flow runs on
the CPU with these.
"""

from __future__ import annotations


class FakeTimer:
    """GpuTimer's interface: runs each function once, returns fixed figures."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def median_us(self, fn, iters, *, flush=True):
        fn()
        self.calls.append(("median_us", iters))
        return 4.0

    def copy_us(self, nbytes, iters):
        self.calls.append(("copy_us", nbytes, iters))
        return 2.5

    def memset_us(self, nbytes, iters):
        raise AssertionError("the newer ops have no copy + memset floor")
