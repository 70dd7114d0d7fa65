// The routing plan ("fused mapping"): from top-k expert ids to the
// expert-major row layout of a grouped GEMM, deterministically and without a
// host synchronisation.
//
// Slot i = t * K + k routes to expert e = topk_ids[i] when 0 <= e < E (else it
// is dropped). Expert e owns rows [start_e, start_e + align(count_e, A)),
// experts in order; its slots take the rows from start_e on in ascending i.
// Rows at or past X are not written (their slots are dropped).
//
// Slots are cut into chunks of MAP_CHUNK; three launches, every order fixed by
// slot indices, never by scheduling:
//   mapping_count_*  block b counts chunk b's routed slots per expert
//                    (shared-memory atomics: counts do not depend on their
//                    order); every block also sets its share of the pos_*
//                    rows to -1 (padding until placed).
//   mapping_prefix   block c takes 32 experts: per expert, the exclusive
//                    prefix of the chunk counts (in place) and the total.
//   mapping_place_*  block b: start_e for every expert (an exclusive scan of
//                    the aligned totals, redone by each block: E ints), then
//                    each slot's row = start_e + the chunk prefix + the slots
//                    of e before it in the chunk (a match ballot within the
//                    warp, warps claiming their share in warp order).
// *_i32 / *_i64: the dtype of topk_ids.

#include "vector_access.cuh"

#define MAP_CHUNK 256      // slots per chunk = threads of a count or place block
#define MAP_WARPS (MAP_CHUNK / 32)
#define PREFIX_EXPERTS 32  // experts per prefix block (a warp's lanes)
#define PREFIX_GROUPS 8    // chunk groups per prefix block (its warps)
#define PREFIX_BATCH 8     // chunk counts a prefix thread has in flight

// The argument block, packed field for field by cupy_moe/mapping/gpu.py.
struct MappingArgs {
    const void* topk_ids;      // [N] int32 or int64
    int* token_topk_to_pos;    // [N]
    int* pos_rows;             // [3, X]: pos_to_expert, pos_to_token, pos_to_token_topk
    int* expert_rows;          // [3, E]: expert_start, expert_end, tokens_per_expert
    int* chunk_rows;           // [num_chunks, E] counts, then prefixes; then [1]: total rows
    int num_slots;             // N = T * K
    int top_k;                 // K
    int num_experts;           // E
    int alignment;             // A
    int num_expanded;          // X
    int num_chunks;            // ceil(N / MAP_CHUNK)
};

template <typename Id>
__device__ __forceinline__ int routed_expert(const MappingArgs& a, int slot) {
    if (slot >= a.num_slots) return -1;
    const long long id = static_cast<const Id*>(a.topk_ids)[slot];
    return id >= 0 && id < a.num_experts ? static_cast<int>(id) : -1;
}

__device__ __forceinline__ int align_rows(int count, int alignment) {
    return (count + alignment - 1) / alignment * alignment;
}

template <typename Id>
__device__ __forceinline__ void count_chunk(const MappingArgs& a) {
    extern __shared__ int counts[];
    const long long rows = 3LL * a.num_expanded;
    for (long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
         r += static_cast<long long>(gridDim.x) * blockDim.x)
        a.pos_rows[r] = -1;
    if (blockIdx.x >= a.num_chunks) return;  // a block that only fills
    const int e = routed_expert<Id>(a, blockIdx.x * MAP_CHUNK + threadIdx.x);
    for (int j = threadIdx.x; j < a.num_experts; j += blockDim.x) counts[j] = 0;
    __syncthreads();
    if (e >= 0) atomicAdd(&counts[e], 1);
    __syncthreads();
    int* chunk_counts = a.chunk_rows + static_cast<long long>(blockIdx.x) * a.num_experts;
    for (int j = threadIdx.x; j < a.num_experts; j += blockDim.x) chunk_counts[j] = counts[j];
}

extern "C" __global__ void __launch_bounds__(MAP_CHUNK) mapping_count_i32(const MappingArgs a) {
    count_chunk<int>(a);
}

extern "C" __global__ void __launch_bounds__(MAP_CHUNK) mapping_count_i64(const MappingArgs a) {
    count_chunk<long long>(a);
}

// Thread (group g, lane l) of block c walks chunks [b0, b1) of expert
// 32c + l; with `first` < 0 it only sums them, else it replaces each count by
// `first` plus the counts before it.
__device__ __forceinline__ int walk_counts(const MappingArgs& a, int e, int b0, int b1,
                                           int first) {
    int running = 0;
    for (int b = b0; b < b1; b += PREFIX_BATCH) {
        int counts[PREFIX_BATCH];
#pragma unroll
        for (int u = 0; u < PREFIX_BATCH; ++u)  // loads first: all in flight at once
            counts[u] = b + u < b1 ? a.chunk_rows[static_cast<long long>(b + u) * a.num_experts + e]
                                   : 0;
#pragma unroll
        for (int u = 0; u < PREFIX_BATCH; ++u) {
            if (first >= 0 && b + u < b1)
                a.chunk_rows[static_cast<long long>(b + u) * a.num_experts + e] = first + running;
            running += counts[u];
        }
    }
    return running;
}

extern "C" __global__ void __launch_bounds__(PREFIX_EXPERTS * PREFIX_GROUPS)
mapping_prefix(const MappingArgs a) {
    __shared__ int group_sums[PREFIX_GROUPS][PREFIX_EXPERTS];
    const int lane = threadIdx.x % PREFIX_EXPERTS, group = threadIdx.x / PREFIX_EXPERTS;
    const int e = blockIdx.x * PREFIX_EXPERTS + lane;
    const int per_group = (a.num_chunks + PREFIX_GROUPS - 1) / PREFIX_GROUPS;
    const int b0 = min(a.num_chunks, group * per_group);
    const int b1 = min(a.num_chunks, b0 + per_group);
    const bool active = e < a.num_experts;
    group_sums[group][lane] = active ? walk_counts(a, e, b0, b1, -1) : 0;
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int g = 0; g < PREFIX_GROUPS; ++g) {
        before += g < group ? group_sums[g][lane] : 0;
        total += group_sums[g][lane];
    }
    if (!active) return;
    walk_counts(a, e, b0, b1, before);
    if (group == 0) a.expert_rows[2 * a.num_experts + e] = total;  // tokens_per_expert
}

template <typename Id>
__device__ __forceinline__ void place_chunk(const MappingArgs& a) {
    extern __shared__ int shared[];
    int* start = shared;                  // [E] first row of each expert
    int* claimed = shared + a.num_experts;  // [E] slots of e the earlier warps took
    __shared__ int warp_totals[MAP_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = blockIdx.x * MAP_CHUNK + threadIdx.x;
    const int e = routed_expert<Id>(a, slot);  // issued before the scan: in flight meanwhile

    // start: exclusive scan over experts of the aligned totals; thread t takes
    // experts [e0, e1), consecutive, so thread order is expert order
    const int per_thread = (a.num_experts + MAP_CHUNK - 1) / MAP_CHUNK;
    const int e0 = min(a.num_experts, threadIdx.x * per_thread);
    const int e1 = min(a.num_experts, e0 + per_thread);
    const int* tokens = a.expert_rows + 2 * a.num_experts;
    int rows = 0;
    for (int j = e0; j < e1; ++j) rows += align_rows(tokens[j], a.alignment);
    int inclusive = rows;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int other = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += other;
    }
    if (lane == 31) warp_totals[warp] = inclusive;
    __syncthreads();
    int row0 = inclusive - rows;
    for (int w = 0; w < warp; ++w) row0 += warp_totals[w];
    for (int j = e0; j < e1; ++j) {
        start[j] = row0;
        claimed[j] = 0;
        if (blockIdx.x == 0) {
            a.expert_rows[j] = row0;
            a.expert_rows[a.num_experts + j] = row0 + tokens[j];
        }
        row0 += align_rows(tokens[j], a.alignment);
    }
    if (blockIdx.x == 0 && threadIdx.x == MAP_CHUNK - 1)
        a.chunk_rows[static_cast<long long>(a.num_chunks) * a.num_experts] = row0;
    __syncthreads();

    // the slots of e before this one in the chunk: in the warp by ballot, in
    // earlier warps by what they claimed, warp by warp in order
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int leader = __ffs(peers) - 1;
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const int chunk_first = e >= 0
        ? a.chunk_rows[static_cast<long long>(blockIdx.x) * a.num_experts + e] : 0;
    int warp_first = 0;
    for (int w = 0; w < MAP_WARPS; ++w) {
        if (w == warp && e >= 0 && lane == leader) {
            warp_first = claimed[e];
            claimed[e] = warp_first + __popc(peers);
        }
        __syncthreads();
    }
    warp_first = __shfl_sync(0xffffffffu, warp_first, leader);
    if (slot >= a.num_slots) return;
    int row = e >= 0 ? start[e] + chunk_first + warp_first + rank : -1;
    const int x = a.num_expanded;
    if (row >= x) row = -1;  // past the last row: dropped
    a.token_topk_to_pos[slot] = row;
    if (row >= 0) {
        a.pos_rows[row] = e;
        a.pos_rows[static_cast<long long>(x) + row] = slot / a.top_k;
        a.pos_rows[2LL * x + row] = slot;
    }
}

extern "C" __global__ void __launch_bounds__(MAP_CHUNK) mapping_place_i32(const MappingArgs a) {
    place_chunk<int>(a);
}

extern "C" __global__ void __launch_bounds__(MAP_CHUNK) mapping_place_i64(const MappingArgs a) {
    place_chunk<long long>(a);
}
