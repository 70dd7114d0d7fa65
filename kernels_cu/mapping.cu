// The routing plan ("fused mapping"): from top-k expert ids to the
// expert-major row layout of a grouped GEMM, deterministically and without a
// host synchronisation.
//
// Slot i = t * K + k routes to expert e = topk_ids[i] when 0 <= e < E (else it
// is dropped). Expert e owns rows [start_e, start_e + align(count_e, A)),
// experts in order; its slots take the rows from start_e on in ascending i.
// Rows at or past X are not written (their slots are dropped).
//
// Every warp of the grid owns `warp_slots` consecutive slots (a multiple of
// 32), warps in slot order, so a slot's row is
//   start_e + (slots of e in earlier blocks) + (in earlier warps of its block)
//           + (in earlier 32-slot steps of its warp) + (in earlier lanes)
// and no order depends on scheduling. The place kernel counts its warps'
// slots per expert itself (shared-memory atomics on one counter row per warp);
// to place them, a step's lanes of one expert find each other with a match
// ballot and take rows in lane order. The slots of earlier blocks and every
// expert's total come from one of three sources:
//   self-counting (few slots): every place block counts all slots itself, with
//                 shared-memory atomics (counts do not depend on their order):
//                 one launch;
//   block counts: mapping_count_* writes each block's count per expert first;
//                 each place block sums the columns: two launches;
//   cooperative:  mapping_coop_*, one cooperative launch (every block
//                 resident): each block writes its own warps' counts per
//                 expert (uint16), a grid barrier, then each block sums the
//                 columns, 8 experts a 16-byte load.
//                 mapping_coop_cluster_* (sm_90+, launched cooperative in
//                 clusters of C blocks): the blocks of a cluster first add
//                 up their counts through distributed shared memory (each
//                 its prefix within the cluster, and the cluster's totals:
//                 one uint16 row a cluster), so after the grid barrier a
//                 block sums blocks / C rows, not blocks rows.
// A warp's worth of slots (decode) takes none of these: mapping_warp_*
// (below) works the whole plan out in one warp's registers.
// Each row of pos_* is written exactly once: by its slot, or as padding (the
// tail of a segment, or past the last segment).
// *_i32 / *_i64: the dtype of topk_ids.

#include "cluster.cuh"
#include "dependent_launch.cuh"
#include "grid_barrier.cuh"
#include "vector_access.cuh"

#define MAP_MAX_WARPS 32   // warps of a block, at most
#define MAP_BATCH 4        // 32-slot steps a warp has in flight
#define LOAD_BATCH 8       // loads a thread has in flight in a block-strided loop
#define SUM_BATCH 16       // block counts a thread has in flight summing a column
#define COOP_MAX_WARPS 16  // warps of a cooperative block, at most (its registers)
#define CLUSTER_MAX_BLOCKS 8  // blocks of a cluster, at most (the portable size)
// Traced builds only (wrong plans): MAP_TRACE_DROP_STORES 1 drops the place
// phase's three pos-row stores, 2 its token_topk_to_pos store too, to time
// what the phase costs without them (profile_mapping_phases.py -D ...).
#if defined(MAP_TRACE_DROP_STORES) && !defined(MAP_TRACE)
#error "MAP_TRACE_DROP_STORES is for traced builds only"
#endif
#ifndef MAP_TRACE_DROP_STORES
#define MAP_TRACE_DROP_STORES 0
#endif
// The id dtypes the module's kernels take, a bit mask: 1 int32 (the *_i32
// kernels), 2 int64; and which kernels of those, MAPPING_KERNELS: bit 0
// mapping_count_*, 1 mapping_place_*, 2 mapping_coop_*, 3
// mapping_coop_cluster_*, 4 mapping_warp_* (cupy_moe/mapping/gpu.py's
// KERNEL_BITS). A plan asks for its ids' and its own kernels alone, so that
// a first call in a fresh kernel cache compiles one or two kernels of the
// file's ten; default all.
#ifndef MAPPING_IDS
#define MAPPING_IDS 3
#endif
#ifndef MAPPING_KERNELS
#define MAPPING_KERNELS 0x1F
#endif
#ifndef SUM_VECS
#define SUM_VECS 8         // 16-byte loads (8 uint16 block counts) a thread has in flight
#endif

// Phase timestamps for benchmarks/profile_mapping_phases.py: compiled with
// MAP_TRACE defined, thread 0 of each block records its SM's clock at each
// MAP_PHASE(i) into map_trace[block][i]; otherwise MAP_PHASE is nothing.
#ifdef MAP_TRACE
#define MAP_TRACE_PHASES 16
__device__ long long map_trace[1024 * MAP_TRACE_PHASES];
#define MAP_PHASE(i)                                                                   \
    do {                                                                               \
        if (threadIdx.x == 0 && blockIdx.x < 1024)                                     \
            map_trace[blockIdx.x * MAP_TRACE_PHASES + (i)] = clock64();                \
    } while (0)
// MAP_PHASE_AFTER(i, v): the mark once v is known (an empty asm that reads
// v, then the clock: a mark that waits for a load's value, not its issue)
#define MAP_PHASE_AFTER(i, v)                      \
    do {                                           \
        asm volatile("" : : "r"(v) : "memory");    \
        MAP_PHASE(i);                              \
    } while (0)
#else
#define MAP_PHASE(i) \
    do {             \
    } while (0)
#define MAP_PHASE_AFTER(i, v) \
    do {                      \
    } while (0)
#endif

// The argument block, packed field for field by cupy_moe/mapping/gpu.py.
struct MappingArgs {
    const void* topk_ids;      // [N] int32 or int64
    int* token_topk_to_pos;    // [N]
    int* pos_rows;             // [3, X]: pos_to_expert, pos_to_token, pos_to_token_topk
    int* expert_rows;          // [3, E]: expert_start, expert_end, tokens_per_expert
    int* block_counts;         // block-counts mode: [count blocks, E] totals, then
                               // [place blocks, E] prefixes in their count block;
                               // cooperative: [blocks, align(E, 8)] uint16 totals
                               // (16-byte aligned; in clusters, the first
                               // blocks / C rows: the clusters' totals); then
                               // [1]: total rows
    int num_slots;             // N = T * K
    int top_k;                 // K
    int num_experts;           // E
    int alignment;             // A
    int num_expanded;          // X
    int warp_slots;            // slots per warp, a multiple of 32
    int self_counting;         // 1: every place block counts all slots itself
    int count_split;           // place blocks per count block
};

template <typename Id>
__device__ __forceinline__ int routed_expert(const MappingArgs& a, long long slot) {
    if (slot >= a.num_slots) return -1;
    const long long id = static_cast<const Id*>(a.topk_ids)[slot];
    return id >= 0 && id < a.num_experts ? static_cast<int>(id) : -1;
}

// The expert of slot `slot` < N from its raw id (-1: dropped or remote).
template <typename Id>
__device__ __forceinline__ int expert_of(const MappingArgs& a, Id id) {
    return id >= 0 && id < a.num_experts ? static_cast<int>(id) : -1;
}

// The experts of N slots first + u * stride (u < N; -1 at or past `end`):
// every raw id is loaded before any is checked, so that the N loads are in
// flight together (checking each as it came put a branch, and so a round
// trip, before the next load: NVRTC 13, sm_90).
template <typename Id, int N>
__device__ __forceinline__ void load_experts(const MappingArgs& a, long long first,
                                             long long stride, long long end, int (&e)[N]) {
    Id id[N];
#pragma unroll
    for (int u = 0; u < N; ++u) {
        const long long slot = first + static_cast<long long>(u) * stride;
        id[u] = slot < end ? static_cast<const Id*>(a.topk_ids)[slot] : Id(-1);
    }
#pragma unroll
    for (int u = 0; u < N; ++u) e[u] = expert_of<Id>(a, id[u]);
}

// count rounded up to a multiple of alignment: a mask where alignment is a
// power of two (the usual 128; a uniform branch), else an integer division
// (~20 instructions on the expert scan's critical path).
__device__ __forceinline__ int align_rows(int count, int alignment) {
    if ((alignment & (alignment - 1)) == 0) return (count + alignment - 1) & -alignment;
    return (count + alignment - 1) / alignment * alignment;
}

// A cooperative grid's block counts: uint16 (a block has at most 65535
// slots: the launch shape's rule), rows of align(E, 8) so that each 16-byte
// load takes 8 experts of one block.
__device__ __forceinline__ int padded_experts(int experts) {
    return (experts + 7) & ~7;
}

// First slot of block b: every block owns warps * warp_slots slots.
__device__ __forceinline__ long long block_first_slot(const MappingArgs& a, int block) {
    return static_cast<long long>(block) * (blockDim.x >> 5) * a.warp_slots;
}

// The place kernel may start while the count kernel runs (programmatic
// dependent launch, dependent_launch.cuh), and waits for it before reading
// the block counts.

// Count block c covers place blocks [c * split, (c + 1) * split): it counts
// its slots per expert and per place block, and writes its totals and, for
// each of its place blocks, the slots of each expert in the place blocks
// before it within the count block. Few count blocks keep the column sums of
// the place blocks short.
template <typename Id>
__device__ __forceinline__ void count_block(const MappingArgs& a) {
    extern __shared__ int counts[];  // [split, E]
    let_dependents_start();
    const int experts = a.num_experts, split = a.count_split;
    for (int j = threadIdx.x; j < split * experts; j += blockDim.x) counts[j] = 0;
    __syncthreads();
    const int place_slots = (blockDim.x >> 5) * a.warp_slots;  // slots of a place block
    const long long first = block_first_slot(a, blockIdx.x * split);
    const long long last = min(static_cast<long long>(a.num_slots),
                               block_first_slot(a, (blockIdx.x + 1) * split));
    // loads first, LOAD_BATCH at a time: in flight together, not one latency each
    for (long long slot0 = first + threadIdx.x; slot0 < last;
         slot0 += static_cast<long long>(blockDim.x) * LOAD_BATCH) {
        int e[LOAD_BATCH];
        load_experts<Id>(a, slot0, blockDim.x, last, e);
#pragma unroll
        for (int u = 0; u < LOAD_BATCH; ++u) {
            if (e[u] < 0) continue;
            const int sub = static_cast<int>(
                (slot0 + static_cast<long long>(u) * blockDim.x - first) / place_slots);
            atomicAdd(&counts[sub * experts + e[u]], 1);
        }
    }
    __syncthreads();
    int* totals = a.block_counts + static_cast<long long>(blockIdx.x) * experts;
    int* prefixes = a.block_counts + static_cast<long long>(gridDim.x) * experts
                  + static_cast<long long>(blockIdx.x) * split * experts;
    for (int j = threadIdx.x; j < experts; j += blockDim.x) {
        int running = 0;
        for (int sub = 0; sub < split; ++sub) {
            prefixes[sub * experts + j] = running;
            running += counts[sub * experts + j];
        }
        totals[j] = running;
    }
}

#if (MAPPING_IDS & 1) && (MAPPING_KERNELS & (1 << 0))
extern "C" __global__ void __launch_bounds__(MAP_MAX_WARPS * 32)
mapping_count_i32(const MappingArgs a) {
    count_block<int>(a);
}
#endif

#if (MAPPING_IDS & 2) && (MAPPING_KERNELS & (1 << 0))
extern "C" __global__ void __launch_bounds__(MAP_MAX_WARPS * 32)
mapping_count_i64(const MappingArgs a) {
    count_block<long long>(a);
}
#endif

// The experts of this warp's next MAP_BATCH steps of 32 slots (-1: none).
template <typename Id>
__device__ __forceinline__ void load_batch(const MappingArgs& a, long long step_slot,
                                           long long warp_end, int lane, int (&e)[MAP_BATCH]) {
    load_experts<Id>(a, step_slot + lane, 32, warp_end, e);
}

// Padding rows -1 in all three pos rows, for p in [first, end) with the
// lanes of a warp.
__device__ __forceinline__ void pad_rows(const MappingArgs& a, int first, int end, int lane) {
    const long long x = a.num_expanded;
    for (int p = first + lane; p < end; p += 32) {
        a.pos_rows[p] = -1;
        a.pos_rows[x + p] = -1;
        a.pos_rows[2 * x + p] = -1;
    }
}

// Block-counts mode: expert j's column of per-block counts [blocks, E]: adds
// the counts of blocks before `block` to `earlier` and all of them to
// `total`. The column is read in runs of SUM_BATCH blocks (loads in flight
// together: one latency a run, the loop's only wait; a warp's loads are 32
// consecutive experts, coalesced); this thread takes runs first_run,
// first_run + run_step, ...
__device__ __forceinline__ void sum_column(const int* counts, int experts, int j, int first_run,
                                           int run_step, int blocks, int block, int& earlier,
                                           int& total) {
    for (int b0 = first_run * SUM_BATCH; b0 < blocks; b0 += run_step * SUM_BATCH) {
        int count[SUM_BATCH];
#pragma unroll
        for (int u = 0; u < SUM_BATCH; ++u)
            count[u] = b0 + u < blocks ? counts[static_cast<long long>(b0 + u) * experts + j] : 0;
#pragma unroll
        for (int u = 0; u < SUM_BATCH; ++u) {
            earlier += b0 + u < block ? count[u] : 0;
            total += count[u];
        }
    }
}

// Clustered (a cooperative launch in clusters, sm_90+ only): the block's
// totals go to shared memory, where the cluster's blocks read them.
template <typename Id, bool Cooperative, bool Clustered = false>
__device__ __forceinline__ void place_block(const MappingArgs& a) {
    extern __shared__ int shared[];
    const int experts = a.num_experts, warps = blockDim.x >> 5;
    int* warp_counts = shared;                   // [warps, E]: this warp's slots of e so far
    int* base = shared + warps * experts;        // [E]: slots of e in earlier blocks, then
                                                 //      + start_e: the block's first row of e
    int* start = base + experts;                 // [E]: first row of e
    int* tokens = start + experts;               // [E]: slots of e in all
    int* block_totals = tokens + experts;        // [E] (Clustered): this block's slots of e
    __shared__ int warp_sums[MAP_MAX_WARPS];
    __shared__ int total_rows;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long block_first = block_first_slot(a, blockIdx.x);
    const long long warp_first = block_first + static_cast<long long>(warp) * a.warp_slots;
    const long long warp_end = min(static_cast<long long>(a.num_slots),
                                   warp_first + a.warp_slots);
    int* my_counts = warp_counts + warp * experts;
    // a warp of at most MAP_BATCH steps (the usual case) keeps its ids in
    // registers from here to the place phase: loaded first, in flight meanwhile
    const bool one_batch = a.warp_slots <= 32 * MAP_BATCH;
    int first_ids[MAP_BATCH];
    MAP_PHASE(0);
    load_batch<Id>(a, warp_first, warp_end, lane, first_ids);

    for (int j = threadIdx.x; j < warps * experts; j += blockDim.x) warp_counts[j] = 0;
    for (int j = threadIdx.x; j < experts; j += blockDim.x) base[j] = tokens[j] = 0;
    __syncthreads();
    MAP_PHASE(1);

    // this warp's slots per expert, by shared atomics on its own counter row
    // (sums: their order does not matter; a match ballot a step, its
    // leader adding the group, cost ~450 cycles a step at 8 warps an SM)
    for (long long s = warp_first; s < warp_end; s += 32LL * MAP_BATCH) {
        int e[MAP_BATCH];
        if (s == warp_first) {
#pragma unroll
            for (int u = 0; u < MAP_BATCH; ++u) e[u] = first_ids[u];
        } else {
            load_batch<Id>(a, s, warp_end, lane, e);
        }
#pragma unroll
        for (int u = 0; u < MAP_BATCH; ++u)
            if (e[u] >= 0) atomicAdd(&my_counts[e[u]], 1);
    }
    __syncthreads();
    MAP_PHASE(2);
    // per expert: exclusive prefix over this block's warps; the block's total
    // is what a cooperative grid's other blocks sum
    for (int j = threadIdx.x; j < experts; j += blockDim.x) {
        int running = 0;
        // 8 warps' counters loaded before any is written back: stores to the
        // same array in between kept each load behind the last one's store
        // (the compiler cannot prove the rows apart), one shared-memory
        // latency a warp
        for (int w0 = 0; w0 < warps; w0 += 8) {
            int count[8];
#pragma unroll
            for (int u = 0; u < 8; ++u)
                count[u] = w0 + u < warps ? warp_counts[(w0 + u) * experts + j] : 0;
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                if (w0 + u < warps) warp_counts[(w0 + u) * experts + j] = running;
                running += count[u];
            }
        }
        if (Clustered)
            block_totals[j] = running;
        else if (Cooperative)
            reinterpret_cast<unsigned short*>(a.block_counts)[
                static_cast<long long>(blockIdx.x) * padded_experts(experts) + j] =
                static_cast<unsigned short>(running);
        // a grid of one block (decode): its total is every expert's total,
        // and no block comes before it; no second pass over the ids
        if (!Cooperative && gridDim.x == 1) tokens[j] = running;
    }

    // every expert's slots, and those of the earlier blocks: sums (in shared
    // atomics; sums do not depend on their order) of the ids themselves or of
    // the block counts, each load independent of the others
    if (Cooperative) {
        const int padded = padded_experts(experts);
        // Clustered: the rows summed after the grid barrier (a cluster's),
        // and this block's cluster's row
        int rows_summed = 0, my_row = 0;
        if (Clustered) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            // the cluster's blocks add up their totals through distributed
            // shared memory: each gets the slots of e in the cluster's blocks
            // before it (its base so far), and rank 0 writes the cluster's
            // totals (at most C * a block's slots: uint16, the plan's rule)
            // as the cluster's row, pad columns zero. A block's totals stay
            // in its shared memory, unchanged, until every block has passed
            // the grid barrier, so no block reads a peer that has moved on.
            cluster_sync();
            MAP_PHASE(12);
            const unsigned rank = cluster_rank(), size = cluster_size();
            if (size > CLUSTER_MAX_BLOCKS) __trap();  // the plan's rule: C <= 8 (portable)
            rows_summed = gridDim.x / size;
            my_row = blockIdx.x / size;
            unsigned short* cluster_row = reinterpret_cast<unsigned short*>(a.block_counts)
                                        + static_cast<long long>(my_row) * padded;
            for (int j = threadIdx.x; j < padded; j += blockDim.x) {
                int earlier = 0, total = 0;
                if (j < experts) {
                    int count[CLUSTER_MAX_BLOCKS];  // loads in flight together
#pragma unroll
                    for (unsigned r = 0; r < CLUSTER_MAX_BLOCKS; ++r)
                        count[r] = r < size ? load_from_cluster_block(block_totals + j, r) : 0;
#pragma unroll
                    for (unsigned r = 0; r < CLUSTER_MAX_BLOCKS; ++r) {
                        total += count[r];
                        earlier += r < rank ? count[r] : 0;
                    }
                    base[j] = earlier;
                }
                if (rank == 0) cluster_row[j] = static_cast<unsigned short>(total);
            }
            MAP_PHASE(13);  // thread 0's share of the cluster's counts added up
#else
            __trap();  // clusters are sm_90+: the plan never launches this elsewhere
#endif
        } else {
            // the pad columns of this block's row (read with the rest, never used)
            for (int j = experts + threadIdx.x; j < padded; j += blockDim.x)
                reinterpret_cast<unsigned short*>(a.block_counts)[
                    static_cast<long long>(blockIdx.x) * padded + j] = 0;
        }
        MAP_PHASE(3);
        grid_barrier();
        MAP_PHASE(4);
        // every block's (cluster's) counts, 8 experts a 16-byte load: a
        // thread takes a group of 8 experts and every parts-th row from
        // `part` on, with SUM_VECS loads in flight (one batch on the default
        // shapes, whose rows x E keep to 2048 x warps: every block reads the
        // same few KiB, so a round trip is long); consecutive lanes take
        // consecutive groups (coalesced: lanes of one group summing by
        // shuffles instead read 32 rows at once and measured slower,
        // NOTES.md eleventh session)
        const int blocks = Clustered ? rows_summed : static_cast<int>(gridDim.x);
        const int block = Clustered ? my_row : static_cast<int>(blockIdx.x), groups = padded >> 3;
        // (in clusters the rows are few: no more parts than batches of
        // SUM_VECS rows, so that fewer threads end in the shared atomics,
        // 16 a thread, which the expert scan's first read waits behind)
        const int parts = Clustered
            ? max(1, min(static_cast<int>(blockDim.x) / groups,
                         (blocks + SUM_VECS - 1) / SUM_VECS))
            : max(1, static_cast<int>(blockDim.x) / groups);
        const uint4* rows = reinterpret_cast<const uint4*>(a.block_counts);
        for (int t = threadIdx.x; t < groups * parts; t += blockDim.x) {
            const int group = t % groups, part = t / groups;
            int earlier[8], total[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) earlier[i] = total[i] = 0;
            for (int b0 = part; b0 < blocks; b0 += parts * SUM_VECS) {
                uint4 counts[SUM_VECS];
#pragma unroll
                for (int u = 0; u < SUM_VECS; ++u) {
                    const int b = b0 + u * parts;
                    counts[u] = b < blocks ? rows[static_cast<long long>(b) * groups + group]
                                           : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int u = 0; u < SUM_VECS; ++u) {
                    const bool before = b0 + u * parts < block;
                    const unsigned words[4] = {counts[u].x, counts[u].y, counts[u].z,
                                               counts[u].w};
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        const int count = (words[i >> 1] >> (16 * (i & 1))) & 0xffff;
                        total[i] += count;
                        if (before) earlier[i] += count;
                    }
                }
            }
            MAP_PHASE(10);  // thread 0's loads summed (traced builds)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int j = 8 * group + i;
                if (j < experts && earlier[i]) atomicAdd(&base[j], earlier[i]);
                if (j < experts && total[i]) atomicAdd(&tokens[j], total[i]);
            }
        }
    } else if (a.self_counting) {
        for (long long slot0 = gridDim.x == 1 ? a.num_slots : threadIdx.x; slot0 < a.num_slots;
             slot0 += static_cast<long long>(blockDim.x) * LOAD_BATCH) {
            int e[LOAD_BATCH];
            load_experts<Id>(a, slot0, blockDim.x, a.num_slots, e);
#pragma unroll
            for (int u = 0; u < LOAD_BATCH; ++u) {
                if (e[u] < 0) continue;
                atomicAdd(&tokens[e[u]], 1);
                if (slot0 + static_cast<long long>(u) * blockDim.x < block_first)
                    atomicAdd(&base[e[u]], 1);
            }
        }
    } else {
        // block counts: a thread sums an expert's column of count-block
        // totals (plain sums of independent loads, no shared atomic per
        // count) and adds this block's prefix within its count block
        wait_for_previous_kernel();
        const int blocks = gridDim.x / a.count_split, block = blockIdx.x / a.count_split;
        const int* prefixes = a.block_counts + static_cast<long long>(blocks) * experts
                            + static_cast<long long>(blockIdx.x) * experts;
        for (int j = threadIdx.x; j < experts; j += blockDim.x) {
            int earlier = prefixes[j], total = 0;
            sum_column(a.block_counts, experts, j, 0, 1, blocks, block, earlier, total);
            base[j] = earlier;
            tokens[j] = total;
        }
    }
    __syncthreads();
    MAP_PHASE(5);

    // start: exclusive scan over experts of the aligned totals; thread t takes
    // experts [e0, e1), consecutive, so thread order is expert order
    const int per_thread = (experts + blockDim.x - 1) / blockDim.x;
    const int e0 = min(experts, static_cast<int>(threadIdx.x) * per_thread);
    const int e1 = min(experts, e0 + per_thread);
    int rows = 0;
    for (int j = e0; j < e1; ++j) rows += align_rows(tokens[j], a.alignment);
    // thread 0's first read of the sums' shared counters back (traced builds):
    // does it wait behind the sums' queued shared atomics?
    MAP_PHASE_AFTER(11, rows);
    int inclusive = rows;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int other = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += other;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    int row0 = inclusive - rows;
    for (int w = 0; w < warp; ++w) row0 += warp_sums[w];
    for (int j = e0; j < e1; ++j) {
        start[j] = row0;
        base[j] += row0;
        if (blockIdx.x == 0) {
            a.expert_rows[j] = row0;
            a.expert_rows[experts + j] = row0 + tokens[j];
            a.expert_rows[2 * experts + j] = tokens[j];
        }
        row0 += align_rows(tokens[j], a.alignment);
    }
    MAP_PHASE(6);
    if (threadIdx.x == blockDim.x - 1) {
        total_rows = row0;
        if (blockIdx.x == 0)
            a.block_counts[Cooperative ? static_cast<long long>(gridDim.x)
                                         * (padded_experts(experts) / 2)
                           : a.self_counting ? 0
                           : static_cast<long long>(gridDim.x / a.count_split + gridDim.x)
                             * experts] = row0;
    }
    __syncthreads();

    // place: a slot's row is its expert's first row for this warp plus the
    // lanes of its group before it; the group's leader then moves the counter
    // (a match ballot a step: the place phase is bound by its scattered
    // stores, and a shared lane mask per (warp, expert) instead measured
    // slower, NOTES.md fourteenth session)
    const int x = a.num_expanded;
    for (long long s = warp_first; s < warp_end; s += 32LL * MAP_BATCH) {
        int e[MAP_BATCH];
        if (one_batch) {
#pragma unroll
            for (int u = 0; u < MAP_BATCH; ++u) e[u] = first_ids[u];
        } else {
            load_batch<Id>(a, s, warp_end, lane, e);
        }
#pragma unroll
        for (int u = 0; u < MAP_BATCH; ++u) {
            const long long slot = s + 32LL * u + lane;
            const unsigned peers = __match_any_sync(0xffffffffu, e[u]);
            const int rank = __popc(peers & ((1u << lane) - 1u));
            int row = -1, prior = 0;
            if (e[u] >= 0) {
                prior = my_counts[e[u]];
                row = base[e[u]] + prior + rank;
            }
            __syncwarp();  // the group has read the counter ...
            if (e[u] >= 0 && rank == 0) my_counts[e[u]] = prior + __popc(peers);
            __syncwarp();  // ... and the next step reads the moved one
            if (slot < warp_end) {
                if (row >= x) row = -1;  // past the last row: dropped
                // MAP_TRACE_DROP_STORES (traced builds): a dropped store waits on
                // row == -2, which never holds, so the row is still computed
                if (MAP_TRACE_DROP_STORES < 2 || row == -2) a.token_topk_to_pos[slot] = row;
                if (MAP_TRACE_DROP_STORES < 1 ? row >= 0 : row == -2) {
                    a.pos_rows[row] = e[u];
                    a.pos_rows[static_cast<long long>(x) + row] = static_cast<int>(slot) / a.top_k;
                    a.pos_rows[2LL * x + row] = static_cast<int>(slot);
                }
            }
        }
    }

    MAP_PHASE(7);
    // padding, the tail of each segment: warp w takes a run of experts, 32 at
    // a time (a lane each finds its expert's tail: up to the next start), then
    // fills the tails that are not empty one after the other
    const int grid_warps = gridDim.x * warps;
    const int per_warp = (experts + grid_warps - 1) / grid_warps;
    const int run_first = (blockIdx.x * warps + warp) * per_warp;
    const int run_end = min(experts, run_first + per_warp);
    for (int j0 = run_first; j0 < run_end; j0 += 32) {
        const int j = j0 + lane;
        int first = 0, end = 0;
        if (j < run_end) {
            first = start[j] + tokens[j];
            end = min(x, j + 1 < experts ? start[j + 1] : total_rows);
        }
        for (unsigned todo = __ballot_sync(0xffffffffu, first < end); todo; todo &= todo - 1) {
            const int owner = __ffs(todo) - 1;
            pad_rows(a, __shfl_sync(0xffffffffu, first, owner),
                     __shfl_sync(0xffffffffu, end, owner), lane);
        }
    }
    MAP_PHASE(8);
    // and every row past the last segment
    const int grid_threads = gridDim.x * blockDim.x;
    for (int p = total_rows + blockIdx.x * blockDim.x + threadIdx.x; p < x; p += grid_threads) {
        a.pos_rows[p] = -1;
        a.pos_rows[static_cast<long long>(x) + p] = -1;
        a.pos_rows[2LL * x + p] = -1;
    }
    MAP_PHASE(9);
}

#if (MAPPING_IDS & 1) && (MAPPING_KERNELS & (1 << 1))
extern "C" __global__ void __launch_bounds__(MAP_MAX_WARPS * 32)
mapping_place_i32(const MappingArgs a) {
    place_block<int, false>(a);
}
#endif

#if (MAPPING_IDS & 2) && (MAPPING_KERNELS & (1 << 1))
extern "C" __global__ void __launch_bounds__(MAP_MAX_WARPS * 32)
mapping_place_i64(const MappingArgs a) {
    place_block<long long, false>(a);
}
#endif

// Cooperative launches only (grid_barrier): at most one block per SM, of at
// most COOP_MAX_WARPS warps. The launch bounds tell the compiler so (a
// minimum of 1 block an SM): it then keeps all SUM_VECS loads of the column
// sums in flight (95 registers; with the compiler aiming at two blocks an SM,
// 57, and the loads went two at a time, each pair after the last was used:
// NVRTC 13, sm_90).
#define COOP_LAUNCH_BOUNDS __launch_bounds__(COOP_MAX_WARPS * 32, 1)

#if (MAPPING_IDS & 1) && (MAPPING_KERNELS & (1 << 2))
extern "C" __global__ void COOP_LAUNCH_BOUNDS
mapping_coop_i32(const MappingArgs a) {
    place_block<int, true>(a);
}
#endif

#if (MAPPING_IDS & 2) && (MAPPING_KERNELS & (1 << 2))
extern "C" __global__ void COOP_LAUNCH_BOUNDS
mapping_coop_i64(const MappingArgs a) {
    place_block<long long, true>(a);
}
#endif

// Cooperative launches in clusters of 2..CLUSTER_MAX_BLOCKS blocks (sm_90+;
// the cluster size is the launch's, the plan checks it divides the grid).
#if (MAPPING_IDS & 1) && (MAPPING_KERNELS & (1 << 3))
extern "C" __global__ void COOP_LAUNCH_BOUNDS
mapping_coop_cluster_i32(const MappingArgs a) {
    place_block<int, true, true>(a);
}
#endif

#if (MAPPING_IDS & 2) && (MAPPING_KERNELS & (1 << 3))
extern "C" __global__ void COOP_LAUNCH_BOUNDS
mapping_coop_cluster_i64(const MappingArgs a) {
    place_block<long long, true, true>(a);
}
#endif

// A warp's worth of slots (N <= 32: decode). One warp holds every slot, a
// lane each, and works the plan out in registers: the lanes of one expert
// find each other with a match ballot, and each group's leader sums the
// aligned rows of the groups with smaller experts (32 shuffles; no counters
// over all E experts, no barrier before a row is known). The experts with
// slots go to shared memory in expert order; then every thread of the block
// writes its expert rows and padding rows, each found by a binary search
// over at most 32 segments. Every block does the same small warp's work (N
// loads) and writes its own share of the expert and padding rows, so a long
// X spreads over blocks that never wait for each other; block 0 writes the
// slots' rows and the total.
#define WARP_PLAN_THREADS 256

// Entries of a sorted array of n <= 32 that are < key (strict) or <= key.
template <bool Inclusive>
__device__ __forceinline__ int rank_in(const int* sorted, int n, int key) {
    int below = 0;
#pragma unroll
    for (int step = 32; step > 0; step >>= 1) {
        if (below + step <= n) {
            const int value = sorted[below + step - 1];
            if (Inclusive ? value <= key : value < key) below += step;
        }
    }
    return below;
}

template <typename Id>
__device__ __forceinline__ void warp_plan_block(const MappingArgs& a) {
    __shared__ int segment_expert[32];  // the experts with slots, ascending
    __shared__ int segment_start[32];   // their first rows (ascending too)
    __shared__ int segment_slots[32];   // their slots
    __shared__ int segments, total_rows;
    MAP_PHASE(0);
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const int e = routed_expert<Id>(a, lane);  // -1 past the last slot
        const unsigned peers = __match_any_sync(0xffffffffu, e);
        const int leader = __ffs(peers) - 1;
        // a group's leader stands for its expert; the others add nothing
        const int rows = e >= 0 && lane == leader ? align_rows(__popc(peers), a.alignment) : 0;
        int start = 0, order = 0, total = 0;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int other_rows = __shfl_sync(0xffffffffu, rows, i);
            const int other_expert = __shfl_sync(0xffffffffu, e, i);
            if (other_rows && other_expert < e) {
                start += other_rows;
                ++order;
            }
            total += other_rows;
        }
        if (rows) {
            segment_expert[order] = e;
            segment_start[order] = start;
            segment_slots[order] = __popc(peers);
        }
        const unsigned leaders = __ballot_sync(0xffffffffu, rows != 0);
        const int row0 = __shfl_sync(0xffffffffu, start, leader);
        if (lane == 0) {
            segments = __popc(leaders);
            total_rows = total;
        }
        if (blockIdx.x == 0) {
            if (lane < a.num_slots) {
                int row = e >= 0 ? row0 + __popc(peers & ((1u << lane) - 1u)) : -1;
                if (row >= a.num_expanded) row = -1;  // past the last row: dropped
                a.token_topk_to_pos[lane] = row;
                if (row >= 0) {
                    const long long x = a.num_expanded;
                    a.pos_rows[row] = e;
                    a.pos_rows[x + row] = lane / a.top_k;
                    a.pos_rows[2 * x + row] = lane;
                }
            }
            if (lane == 0) a.block_counts[0] = total;  // the self-counting layout's total
        }
    }
    __syncthreads();
    MAP_PHASE(1);
    const int n = segments, rows = total_rows, experts = a.num_experts, x = a.num_expanded;
    const int stride = gridDim.x * blockDim.x;
    const int first = blockIdx.x * blockDim.x + threadIdx.x;
    for (int j = first; j < experts; j += stride) {
        // the first expert with slots at or after j starts where j starts
        const int seg = rank_in<false>(segment_expert, n, j);
        const int start = seg < n ? segment_start[seg] : rows;
        const int count = seg < n && segment_expert[seg] == j ? segment_slots[seg] : 0;
        a.expert_rows[j] = start;
        a.expert_rows[experts + j] = start + count;
        a.expert_rows[2 * experts + j] = count;
    }
    for (int p = first; p < x; p += stride) {
        // the last segment starting at or before p; a row past its slots is padding
        const int seg = rank_in<true>(segment_start, n, p) - 1;
        if (seg < 0 || p >= segment_start[seg] + segment_slots[seg]) {
            a.pos_rows[p] = -1;
            a.pos_rows[static_cast<long long>(x) + p] = -1;
            a.pos_rows[2LL * x + p] = -1;
        }
    }
    MAP_PHASE(2);
}

#if (MAPPING_IDS & 1) && (MAPPING_KERNELS & (1 << 4))
extern "C" __global__ void __launch_bounds__(WARP_PLAN_THREADS)
mapping_warp_i32(const MappingArgs a) {
    warp_plan_block<int>(a);
}
#endif

#if (MAPPING_IDS & 2) && (MAPPING_KERNELS & (1 << 4))
extern "C" __global__ void __launch_bounds__(WARP_PLAN_THREADS)
mapping_warp_i64(const MappingArgs a) {
    warp_plan_block<long long>(a);
}
#endif
