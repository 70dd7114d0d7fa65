// Write-only zero-fill variants, timed against cudaMemsetAsync by
// benchmarks/zero_fill_sweep.py (which says what is measured and why).
//
// Every kernel zeroes exactly the bytes [0, n) it is given (n a multiple of
// 16, the base 16-byte aligned) and nothing else; the script checks that on a
// poisoned buffer with guard regions before it times anything.
//
// Compiled by NVRTC (cupy.RawModule) with no includes: uint4, make_uint4 and
// __stcs are NVRTC builtins. Templates are reached through name expressions.
// Code that needs a newer architecture than the device traps instead of
// failing the whole module; the script does not launch it there.

typedef long long i64;

// ---------------------------------------------------------------------------
// Store flavours of one 16-byte zero store.
//
//   ST_PLAIN      st.global.v4.u32          (what plain C++ compiles to)
//   ST_CS         st.global.cs.v4.u32       (__stcs: evict-first / streaming;
//                                            what the expand kernels use)
//   ST_L1NA       st.global.L1::no_allocate (sm_70+)
//   ST_L2EF       st.global.L2::cache_hint with an L2 evict_first policy (sm_80+)
//   ST_L1NA_L2EF  both qualifiers
// ---------------------------------------------------------------------------
#define ST_PLAIN 0
#define ST_CS 1
#define ST_L1NA 2
#define ST_L2EF 3
#define ST_L1NA_L2EF 4

// An L2 evict_first cache policy for the .L2::cache_hint flavours. Made once
// per thread: createpolicy is an instruction, and `asm volatile` keeps the
// compiler from hoisting it out of a store loop by itself.
template <int ST>
__device__ __forceinline__ unsigned long long store_policy() {
    unsigned long long policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (ST == ST_L2EF || ST == ST_L1NA_L2EF) {
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    }
#endif
    return policy;
}

template <int ST>
__device__ __forceinline__ void store_zero16(uint4* p, unsigned long long policy) {
    if constexpr (ST == ST_PLAIN) {
        *p = make_uint4(0u, 0u, 0u, 0u);
    } else if constexpr (ST == ST_CS) {
        __stcs(p, make_uint4(0u, 0u, 0u, 0u));
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        const unsigned z = 0u;
        if constexpr (ST == ST_L1NA) {
            asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1, %1, %1, %1};"
                         :: "l"(p), "r"(z) : "memory");
        } else if constexpr (ST == ST_L2EF) {
            asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %1, %1, %1}, %2;"
                         :: "l"(p), "r"(z), "l"(policy) : "memory");
        } else {
            asm volatile("st.global.L1::no_allocate.L2::cache_hint.v4.u32"
                         " [%0], {%1, %1, %1, %1}, %2;"
                         :: "l"(p), "r"(z), "l"(policy) : "memory");
        }
#else
        __trap();
#endif
    }
}

// ---------------------------------------------------------------------------
// Families 1 and 5: grid-stride loops, 256 threads, grid = k * SM count.
//
// Each loop step a thread stores PER 16-byte vectors. ADJACENT: its vectors
// are neighbours (thread t: 2t, 2t + 1 for PER = 2; a warp instruction then
// covers every other 16 bytes of a 1 KiB span); otherwise they are a whole
// grid apart (each warp instruction covers 512 contiguous bytes). PER = 1 is
// the plain grid-stride loop of family 1.
//
// Loops with a runtime trip count are kept rolled (#pragma unroll 1): left to
// itself the compiler unrolls the plain-store loop 4x but not the ones with
// inline-asm stores (__stcs is inline asm too), which would make the store
// flavours differ in more than the store. PER is the explicit unrolling.
// ---------------------------------------------------------------------------
template <int ST, int PER, bool ADJACENT>
__global__ void __launch_bounds__(256) zero_grid_stride(uint4* __restrict__ out, i64 n_vec) {
    const i64 threads = static_cast<i64>(gridDim.x) * blockDim.x;
    const i64 tid = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
    const unsigned long long policy = store_policy<ST>();
#pragma unroll 1
    for (i64 tile = 0; tile < n_vec; tile += threads * PER) {
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const i64 idx = tile + (ADJACENT ? tid * PER + j : j * threads + tid);
            if (idx < n_vec) store_zero16<ST>(out + idx, policy);
        }
    }
}

// ---------------------------------------------------------------------------
// Family 2: one block per CHUNK_BYTES chunk, no loop; grid = ceil(n / chunk).
// A thread's stores are THREADS vectors apart (each warp instruction is 512
// contiguous bytes). Only the last block can be partial, so full blocks take
// a path without bounds checks.
// ---------------------------------------------------------------------------
template <int CHUNK_BYTES, int THREADS, int ST>
__global__ void __launch_bounds__(THREADS) zero_chunk(uint4* __restrict__ out, i64 n_vec) {
    constexpr int CHUNK_VECS = CHUNK_BYTES / 16;
    constexpr int PER = CHUNK_VECS / THREADS;
    static_assert(PER >= 1 && PER * THREADS == CHUNK_VECS, "a chunk is whole rounds of the block");
    const i64 chunk_begin = static_cast<i64>(blockIdx.x) * CHUNK_VECS;
    uint4* dst = out + chunk_begin + threadIdx.x;
    const unsigned long long policy = store_policy<ST>();
    if (chunk_begin + CHUNK_VECS <= n_vec) {
#pragma unroll
        for (int u = 0; u < PER; ++u) store_zero16<ST>(dst + u * THREADS, policy);
    } else {
        const i64 left = n_vec - chunk_begin - threadIdx.x;
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            if (u * THREADS < left) store_zero16<ST>(dst + u * THREADS, policy);
        }
    }
}

// ---------------------------------------------------------------------------
// Family 3: n_rows rows of row_vecs vectors, laid out back to back as in the
// expand output, zeroed row by row so that each row boundary costs what it
// costs there (a loop restart with a partial last round of stores). Loops
// kept rolled, as in the grid-stride kernels.
// ---------------------------------------------------------------------------

// One warp per row; 256-thread blocks hold 8 rows.
template <int ST>
__global__ void __launch_bounds__(256) zero_rows_warp(uint4* __restrict__ out, i64 n_rows,
                                                      int row_vecs) {
    const i64 row = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    if (row >= n_rows) return;
    const int lane = threadIdx.x & 31;
    const unsigned long long policy = store_policy<ST>();
    uint4* dst = out + row * row_vecs;
#pragma unroll 1
    for (int i = lane; i < row_vecs; i += 32) store_zero16<ST>(dst + i, policy);
}

// One 256-thread block per rows_per_block consecutive rows, one row after
// the other (rows_per_block = 1: a block per row; the expand's registers path
// gives its zero-fill blocks about 16 KiB of rows, at least 2).
template <int ST>
__global__ void __launch_bounds__(256) zero_rows_block(uint4* __restrict__ out, i64 n_rows,
                                                       int row_vecs, int rows_per_block) {
    const i64 first = static_cast<i64>(blockIdx.x) * rows_per_block;
    const i64 end = first + rows_per_block < n_rows ? first + rows_per_block : n_rows;
    const unsigned long long policy = store_policy<ST>();
    for (i64 row = first; row < end; ++row) {
        uint4* dst = out + row * row_vecs;
#pragma unroll 1
        for (int i = threadIdx.x; i < row_vecs; i += 256) store_zero16<ST>(dst + i, policy);
    }
}

// ---------------------------------------------------------------------------
// Family 4: bulk (TMA) stores, sm_90+. The block zeroes SMEM_BYTES of shared
// memory, makes those writes visible to the async proxy (each writing thread
// fences, then the block syncs), and thread 0 alone issues
// cp.async.bulk.global.shared::cta stores of that buffer.
//
// The output is cut into pieces of SMEM_BYTES (the last one shorter, still a
// multiple of 16). Loop step s of block b stores pieces
// [(s * gridDim.x + b) * pieces_per_step, ... + pieces_per_step):
//   grid-stride      pieces_per_step = 1, grid = k * SM count
//   chunk per block  pieces_per_step = P, grid = ceil(pieces / P): one step
// All stores go in one bulk group; the thread waits until the engine has read
// the shared buffer (wait_group.read), as the block may not retire while its
// shared memory is still being read. The global writes are complete when the
// grid is.
// ---------------------------------------------------------------------------
__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <int SMEM_BYTES, bool HINT>
__global__ void __launch_bounds__(128) zero_bulk(unsigned char* __restrict__ out, i64 nbytes,
                                                 int pieces_per_step) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static_assert(SMEM_BYTES % 16 == 0, "bulk sizes are multiples of 16");
    __shared__ __align__(128) uint4 zeros[SMEM_BYTES / 16];
    for (int i = threadIdx.x; i < SMEM_BYTES / 16; i += blockDim.x) zeros[i] = make_uint4(0u, 0u, 0u, 0u);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x != 0) return;

    const unsigned src = shared_address(zeros);
    unsigned long long policy = 0;
    if constexpr (HINT) {
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    }
    const i64 n_pieces = (nbytes + SMEM_BYTES - 1) / SMEM_BYTES;
    const i64 step = static_cast<i64>(gridDim.x) * pieces_per_step;
    for (i64 first = static_cast<i64>(blockIdx.x) * pieces_per_step; first < n_pieces; first += step) {
        const i64 last = first + pieces_per_step < n_pieces ? first + pieces_per_step : n_pieces;
        for (i64 piece = first; piece < last; ++piece) {
            const i64 offset = piece * SMEM_BYTES;
            const i64 left = nbytes - offset;
            const unsigned bytes = static_cast<unsigned>(left < SMEM_BYTES ? left : SMEM_BYTES);
            if constexpr (HINT) {
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint"
                             " [%0], [%1], %2, %3;"
                             :: "l"(out + offset), "r"(src), "r"(bytes), "l"(policy) : "memory");
            } else {
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                             :: "l"(out + offset), "r"(src), "r"(bytes) : "memory");
            }
        }
    }
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#else
    __trap();
#endif
}
