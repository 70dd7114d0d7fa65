// A barrier across every block of a cooperative launch.
//
// A cooperative launch (cuLaunchCooperativeKernel, or the cooperative launch
// attribute) keeps all its blocks resident at once and hands the grid a
// zeroed workspace of the driver's, whose address the driver puts in the
// special registers %envreg1 (high half) and %envreg2 (low half); its second
// 32-bit word is the grid's barrier. That is the driver ABI behind
// cooperative_groups' grid sync (cooperative_groups/details/driver_abi.h of
// the CUDA headers), fixed by binary compatibility: cubins built years ago
// rely on it. Reading it directly spares NVRTC the CUDA headers, which a
// pip-only install may not have. Only a cooperative launch may call this.
#pragma once

__device__ __forceinline__ unsigned* cooperative_barrier_word() {
    unsigned high, low;
    asm volatile("mov.u32 %0, %%envreg1;" : "=r"(high));
    asm volatile("mov.u32 %0, %%envreg2;" : "=r"(low));
    return reinterpret_cast<unsigned*>((static_cast<unsigned long long>(high) << 32) | low) + 1;
}

// Every thread of every block waits here until all have arrived; writes
// before it are visible to reads after it, grid-wide. One thread per block
// arrives: the blocks' additions sum to exactly 2^31 (block 0 adds 2^31 -
// (blocks - 1), the others 1). The word's low 31 bits start at zero (the
// driver zeroes the workspace) and so end at zero after every barrier, and
// its top bit flips exactly when the last block arrives, never before.
__device__ __forceinline__ void grid_barrier() {
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        unsigned* word = cooperative_barrier_word();
        const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
        const bool first = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
        const unsigned add = first ? 0x80000000u - (blocks - 1u) : 1u;
        unsigned before, now;
        // release: the block's writes (ordered before by __syncthreads) go first
        asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;"
                     : "=r"(before) : "l"(word), "r"(add) : "memory");
        do {
            asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(word) : "memory");
        } while (((before ^ now) & 0x80000000u) == 0);
    }
    __syncthreads();
}
