"""CUDA on the CPU, for tests: the kernels of kernels_cu/ compiled by the host's
C++ compiler with ``cuda_on_cpu.h`` and run thread by thread (each CUDA
thread a fiber; see the header for what is and is not modelled).

``build.module(source, defines)`` translates the sources (each inline PTX
``asm`` statement into its C++ stand-in, dynamic ``extern __shared__`` arrays
into the emulated buffer), compiles them with every kernel registered by
name, and returns a ``Module`` whose ``launch`` takes what ``cuLaunchKernel``
takes. ``device.emulated_gpu`` points the ops' GPU code at it.
"""
