// Thread block clusters (sm_90+): the blocks of a cluster run at once on
// one GPC and may read each other's shared memory (distributed shared
// memory). Only a kernel launched in clusters may call these; the cluster
// is 1-D along x, so a block's rank in its cluster is blockIdx.x % size.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// This block's rank in its cluster, and the cluster's blocks.
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

__device__ __forceinline__ unsigned cluster_size() {
    unsigned blocks;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(blocks));
    return blocks;
}

// Every thread of every block of the cluster arrives, then waits: shared
// memory written before it by any block of the cluster is visible after it
// to every block (release / acquire at cluster scope). Whole warps,
// converged (.aligned); __syncwarp first, as a branch on the thread index
// may come just before.
__device__ __forceinline__ void cluster_sync() {
    __syncwarp();
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n"
        "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The int at `p` (this block's shared memory) in the shared memory of the
// cluster's block `rank`: the same offset, read across the cluster.
__device__ __forceinline__ int load_from_cluster_block(const int* p, unsigned rank) {
    const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
    unsigned remote;
    int value;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(value) : "r"(remote) : "memory");
    return value;
}

#endif
