// Kernels that misuse CUDA on purpose, for the emulation's own tests: each
// must be reported, not hang or pass silently.

// Lane 0 waits in a shuffle for lane 1, which waits at the block barrier for
// lane 0: neither can go on.
extern "C" __global__ void selftest_deadlock(int* out) {
    if (threadIdx.x == 0)
        out[0] = __shfl_sync(0x3u, 1, 1);
    else
        __syncthreads();
}

extern "C" __global__ void selftest_trap(const int* flag) {
    if (flag[threadIdx.x]) __trap();
}

// The warp's upper half has returned when the lower half shuffles across
// the whole warp.
extern "C" __global__ void selftest_exited_lanes(int* out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 16);
}

// Every thread adds its block's number (from 1) to one counter, blocks on
// several OS threads at once: the atomics must not lose an addition.
extern "C" __global__ void selftest_sum(unsigned long long* total) {
    atomicAdd(total, static_cast<unsigned long long>(blockIdx.x + 1));
}

// Reads element `index` of `in` (past its end, in the fence's test).
extern "C" __global__ void selftest_read(const int* in, long long index, int* out) {
    out[0] = in[index];
}

// Thread 5 lands 64 bytes of `in` in shared memory by a bulk copy; every
// thread waits for the mbarrier's phase 0 first, so it must read them
// whichever thread runs first. With `never_load`, no copy is issued: the
// wait can never complete.
#include "bulk_copy.cuh"

extern "C" __global__ void selftest_mbarrier(const int* in, int* out, long long never_load) {
    extern __shared__ __align__(128) unsigned char stage[];
    __shared__ __align__(8) unsigned long long loaded;
    const unsigned barrier = shared_address(&loaded);
    if (threadIdx.x == 0) mbarrier_init(barrier);
    __syncthreads();
    if (threadIdx.x == 5 && !never_load) {
        mbarrier_arrive_expect(barrier, 64);
        bulk_load(shared_address(stage), in, 64, barrier);
    }
    mbarrier_wait_parity(barrier, 0);
    out[threadIdx.x] = reinterpret_cast<const int*>(stage)[threadIdx.x % 16];
}

// Each block reads a static shared variable before writing it: garbage in
// every block, also where an earlier block on the same OS thread wrote it.
extern "C" __global__ void selftest_shared_garbage(int* out) {
    __shared__ int value;
    out[blockIdx.x] = value;
    __syncthreads();
    value = 7;
}

// Clusters (a cooperative launch in clusters): each block puts a value per
// thread in its shared memory, then, past the cluster barrier, reads the
// next block's of its cluster; a last barrier keeps every block until the
// others have read it (`last_barrier` 0: none, a read may find its block
// ended). Block `leave` (if any) returns before the first barrier, which
// then does not wait for it (PTX: exited threads do not count), and the
// block reading it finds it ended.
#include "cluster.cuh"

extern "C" __global__ void selftest_cluster(int* out, long long leave, long long last_barrier) {
    extern __shared__ int values[];
    if (blockIdx.x == leave) return;
    values[threadIdx.x] = static_cast<int>(blockIdx.x * 1000 + threadIdx.x);
    cluster_sync();
    const unsigned next = (cluster_rank() + 1) % cluster_size();
    out[blockIdx.x * blockDim.x + threadIdx.x] = load_from_cluster_block(values + threadIdx.x, next);
    if (last_barrier) cluster_sync();
}
