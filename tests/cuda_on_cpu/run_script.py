"""Run a Python script (e.g. benchmarks/memcheck_cases.py) with CuPy replaced
and every kernel launch on the CPU, as plugin.py does for the tests; the
outputs the ops allocate are checked for writes outside them at the end.

    python tests/cuda_on_cpu/run_script.py benchmarks/memcheck_cases.py [ARGS...]

For the scripts that only call the ops and check results: one that times
kernels (CUDA events, graphs) stops at the first such call, naming it.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402

from cuda_on_cpu import plugin  # noqa: E402  (installs the stand-in cupy)
from cuda_on_cpu.device import emulated_gpu  # noqa: E402


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    patches = pytest.MonkeyPatch()
    gpu = emulated_gpu(patches, seed=11, device_arrays=plugin.DeviceArray)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
    finally:
        patches.undo()
    gpu.check_canaries()
    print(f"cuda_on_cpu: {len(gpu.launches)} launches on the CPU, nothing written outside "
          f"{len(gpu.buffers)} outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
