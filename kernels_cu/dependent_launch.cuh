// Programmatic dependent launch (sm_90+): a kernel launched with programmatic
// stream serialisation (cupy_moe/runtime/launch.py,
// launch_overlapping_previous) may start once every block of the kernel
// before it has called let_dependents_start (or exited), and must call
// wait_for_previous_kernel before it touches anything that kernel writes or
// reads; the wait returns when that kernel has completed and its memory
// operations are visible. Elsewhere, or launched plainly, the stream orders
// the kernels and these are no-ops.
#pragma once

__device__ __forceinline__ void let_dependents_start() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
