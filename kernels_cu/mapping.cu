// The routing plan ("fused mapping"): from top-k expert ids to the
// expert-major row layout of a grouped GEMM, deterministically and without a
// host synchronisation.
//
// Slot i = t * K + k routes to expert e = topk_ids[i] when 0 <= e < E (else it
// is dropped). Expert e owns rows [start_e, start_e + align(count_e, A)),
// experts in order; its slots take the rows from start_e on in ascending i.
// Rows at or past X are not written (their slots are dropped).
//
// Three launches, every order fixed by slot indices, never by scheduling:
//   mapping_count_*  block b counts the routed slots of chunk b (MAP_CHUNK
//                    consecutive slots) per expert (shared-memory atomics:
//                    counts do not depend on their order); all blocks also
//                    set the pos_* rows to -1 (padding until placed).
//   mapping_scan     one block: per expert, the exclusive prefix of the chunk
//                    counts and the total; an exclusive scan of the aligned
//                    totals over experts gives start_e; each chunk's count is
//                    replaced by the first row its slots of e take.
//   mapping_place_*  block b (one warp) walks chunk b in slot order, 32 slots
//                    a step: lanes of one expert find their rank with a match
//                    ballot, the lowest of them advances the expert's next row.
// *_i32 / *_i64: the dtype of topk_ids.

#include "vector_access.cuh"

#define MAP_CHUNK 1024         // slots per chunk: one warp, 32 steps of 32 slots
#define MAP_COUNT_THREADS 256  // threads of a counting block
#define MAP_SCAN_THREADS 1024  // threads of the scan block
#define MAP_SCAN_BATCH 8       // chunk counts a scan thread has in flight

static_assert(MAP_CHUNK == 32 * 32, "a place block is one warp taking 32 steps");

// The argument block, packed field for field by cupy_moe/mapping/gpu.py.
struct MappingArgs {
    const void* topk_ids;      // [N] int32 or int64
    int* token_topk_to_pos;    // [N]
    int* pos_rows;             // [3, X]: pos_to_expert, pos_to_token, pos_to_token_topk
    int* expert_rows;          // [3, E]: expert_start, expert_end, tokens_per_expert
    int* chunk_rows;           // [num_chunks, E] scratch, then [1]: the total of the rows
    int num_slots;             // N = T * K
    int top_k;                 // K
    int num_experts;           // E
    int alignment;             // A
    int num_expanded;          // X
    int num_chunks;            // ceil(N / MAP_CHUNK)
};

template <typename Id>
__device__ __forceinline__ int routed_expert(const MappingArgs& a, int slot) {
    const long long id = static_cast<const Id*>(a.topk_ids)[slot];
    return id >= 0 && id < a.num_experts ? static_cast<int>(id) : -1;
}

template <typename Id>
__device__ __forceinline__ void count_chunk(const MappingArgs& a) {
    extern __shared__ int counts[];
    // the pos_* rows are padding until placed (spread over every block)
    const long long rows = 3LL * a.num_expanded;
    for (long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
         r += static_cast<long long>(gridDim.x) * blockDim.x)
        a.pos_rows[r] = -1;
    if (blockIdx.x >= a.num_chunks) return;  // a block that only fills
    for (int e = threadIdx.x; e < a.num_experts; e += blockDim.x) counts[e] = 0;
    __syncthreads();
    const int begin = blockIdx.x * MAP_CHUNK;
    const int end = min(a.num_slots, begin + MAP_CHUNK);
    constexpr int PER_THREAD = MAP_CHUNK / MAP_COUNT_THREADS;
    int experts[PER_THREAD];
#pragma unroll
    for (int u = 0; u < PER_THREAD; ++u) {  // every load in flight before the first atomic
        const int slot = begin + u * MAP_COUNT_THREADS + threadIdx.x;
        experts[u] = slot < end ? routed_expert<Id>(a, slot) : -1;
    }
#pragma unroll
    for (int u = 0; u < PER_THREAD; ++u)
        if (experts[u] >= 0) atomicAdd(&counts[experts[u]], 1);
    __syncthreads();
    int* chunk_counts = a.chunk_rows + static_cast<long long>(blockIdx.x) * a.num_experts;
    for (int e = threadIdx.x; e < a.num_experts; e += blockDim.x) chunk_counts[e] = counts[e];
}

extern "C" __global__ void __launch_bounds__(MAP_COUNT_THREADS) mapping_count_i32(const MappingArgs a) {
    count_chunk<int>(a);
}

extern "C" __global__ void __launch_bounds__(MAP_COUNT_THREADS) mapping_count_i64(const MappingArgs a) {
    count_chunk<long long>(a);
}

__device__ __forceinline__ int align_rows(int count, int alignment) {
    return (count + alignment - 1) / alignment * alignment;
}

// Walk expert e's column of chunk counts in batches of MAP_SCAN_BATCH loads.
// With `first_row` < 0 only sum them; else replace each by the first row its
// chunk's slots of e take (first_row plus the counts of the chunks before).
__device__ __forceinline__ int walk_chunk_counts(const MappingArgs& a, int e, int first_row) {
    int running = 0;
    for (int b0 = 0; b0 < a.num_chunks; b0 += MAP_SCAN_BATCH) {
        int counts[MAP_SCAN_BATCH];
#pragma unroll
        for (int u = 0; u < MAP_SCAN_BATCH; ++u)
            counts[u] = b0 + u < a.num_chunks
                            ? a.chunk_rows[static_cast<long long>(b0 + u) * a.num_experts + e] : 0;
#pragma unroll
        for (int u = 0; u < MAP_SCAN_BATCH; ++u) {
            if (first_row >= 0 && b0 + u < a.num_chunks)
                a.chunk_rows[static_cast<long long>(b0 + u) * a.num_experts + e] = first_row + running;
            running += counts[u];
        }
    }
    return running;
}

extern "C" __global__ void __launch_bounds__(MAP_SCAN_THREADS) mapping_scan(const MappingArgs a) {
    __shared__ int warp_totals[MAP_SCAN_THREADS / 32];
    // thread t takes experts [e0, e1): consecutive, so thread order is expert order
    const int per_thread = (a.num_experts + MAP_SCAN_THREADS - 1) / MAP_SCAN_THREADS;
    const int e0 = min(a.num_experts, threadIdx.x * per_thread);
    const int e1 = min(a.num_experts, e0 + per_thread);
    int rows = 0;  // aligned rows of this thread's experts
    for (int e = e0; e < e1; ++e) {
        const int count = walk_chunk_counts(a, e, -1);
        a.expert_rows[2 * a.num_experts + e] = count;
        rows += align_rows(count, a.alignment);
    }
    // exclusive scan of `rows` over the block: within warps, then of warp totals
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inclusive = rows;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int other = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += other;
    }
    if (lane == 31) warp_totals[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        int total = warp_totals[lane];
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int other = __shfl_up_sync(0xffffffffu, total, d);
            if (lane >= d) total += other;
        }
        warp_totals[lane] = total;  // inclusive over warps
    }
    __syncthreads();
    int start = inclusive - rows + (warp > 0 ? warp_totals[warp - 1] : 0);
    for (int e = e0; e < e1; ++e) {
        const int count = a.expert_rows[2 * a.num_experts + e];
        a.expert_rows[e] = start;
        a.expert_rows[a.num_experts + e] = start + count;
        walk_chunk_counts(a, e, start);
        start += align_rows(count, a.alignment);
    }
    if (threadIdx.x == MAP_SCAN_THREADS - 1)
        a.chunk_rows[static_cast<long long>(a.num_chunks) * a.num_experts] = start;
}

template <typename Id>
__device__ __forceinline__ void place_chunk(const MappingArgs& a) {
    extern __shared__ int next_row[];
    const int lane = threadIdx.x;
    const int* first_rows = a.chunk_rows + static_cast<long long>(blockIdx.x) * a.num_experts;
    for (int e = lane; e < a.num_experts; e += 32) next_row[e] = first_rows[e];
    const int begin = blockIdx.x * MAP_CHUNK;
    int experts[32];
#pragma unroll
    for (int s = 0; s < 32; ++s) {  // every load in flight before the walk
        const int slot = begin + s * 32 + lane;
        experts[s] = slot < a.num_slots ? routed_expert<Id>(a, slot) : -1;
    }
    __syncwarp();
    const unsigned lanes_below = (1u << lane) - 1u;
    const int x = a.num_expanded;
#pragma unroll
    for (int s = 0; s < 32; ++s) {
        const int slot = begin + s * 32 + lane;
        const int e = experts[s];
        const unsigned same = __match_any_sync(0xffffffffu, e);
        int row = e >= 0 ? next_row[e] + __popc(same & lanes_below) : -1;
        __syncwarp();
        if (e >= 0 && (same & lanes_below) == 0) next_row[e] += __popc(same);
        __syncwarp();
        if (row >= x) row = -1;  // past the last row: dropped
        if (slot < a.num_slots) {
            a.token_topk_to_pos[slot] = row;
            if (row >= 0) {
                a.pos_rows[row] = e;
                a.pos_rows[static_cast<long long>(x) + row] = slot / a.top_k;
                a.pos_rows[2LL * x + row] = slot;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(32) mapping_place_i32(const MappingArgs a) {
    place_chunk<int>(a);
}

extern "C" __global__ void __launch_bounds__(32) mapping_place_i64(const MappingArgs a) {
    place_chunk<long long>(a);
}
