// Experimental scatter kernels for the prefill shapes (16-byte accesses, no
// scale factors), timed against the library kernel by prefill_variants.py.
// Not part of the package: each variant tests one hypothesis about why a
// read-once / write-K-times stream stays below the copy bandwidth.
//
// Every variant: x [T, n_vec] uint4, token_topk_to_pos [T, K], pos_to_expert
// [X], out [X, n_vec] uint4; token rows scattered, padding rows zeroed.

typedef long long i64;

struct Args {
    const uint4* x;
    const int* token_topk_to_pos;
    const int* pos_to_expert;
    uint4* out;
    i64 n_vec;
    int num_tokens;
    int top_k;
    int num_expanded;
    int rows_per_zero_block;
    int chunk_vec;  // bulkc: vectors per block (grid y = chunks)
    int pad;
};

__device__ __forceinline__ void zero_rows(const Args& a, i64 first, i64 last, int tid, int nthreads) {
    if (last > a.num_expanded) last = a.num_expanded;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (i64 p = first; p < last; ++p) {
        if (__ldg(a.pos_to_expert + p) >= 0) continue;
        uint4* dst = a.out + p * a.n_vec;
        for (i64 i = tid; i < a.n_vec; i += nthreads) __stcs(dst + i, zero);
    }
}

// The library's structure: one block per token, the row in registers, one
// store per slot; blocks after T zero rows_per_zero_block rows each.
// LOAD = 0 stores a constant instead (diagnostic: the write-only ceiling).
template <int THREADS, int UNROLL, int LOAD>
__device__ __forceinline__ void regs_body(const Args& a) {
    if (blockIdx.x >= a.num_tokens) {
        const i64 first = static_cast<i64>(blockIdx.x - a.num_tokens) * a.rows_per_zero_block;
        zero_rows(a, first, first + a.rows_per_zero_block, threadIdx.x, THREADS);
        return;
    }
    const i64 t = blockIdx.x;
    const uint4* src = a.x + t * a.n_vec;
    const int* slots = a.token_topk_to_pos + t * a.top_k;
    for (i64 base = 0; base < a.n_vec; base += THREADS * UNROLL) {
        uint4 held[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const i64 idx = base + u * THREADS + threadIdx.x;
            if (idx < a.n_vec) held[u] = LOAD ? __ldcs(src + idx) : make_uint4(t, idx, 0, 0);
        }
        for (int k = 0; k < a.top_k; ++k) {
            const int p = __ldg(slots + k);
            if (p < 0) continue;
            uint4* dst = a.out + static_cast<i64>(p) * a.n_vec;
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const i64 idx = base + u * THREADS + threadIdx.x;
                if (idx < a.n_vec) __stcs(dst + idx, held[u]);
            }
        }
    }
}

// Persistent blocks: the grid is a few blocks per SM; each walks tokens
// t, t + G, ... and loads the next token's row while storing this one's, so
// no block ever waits for its own load. Needs n_vec <= THREADS * UNROLL.
template <int THREADS, int UNROLL>
__device__ __forceinline__ void persist_body(const Args& a) {
    uint4 cur[UNROLL], nxt[UNROLL];
    int t = blockIdx.x;
    if (t < a.num_tokens) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const i64 idx = u * THREADS + threadIdx.x;
            if (idx < a.n_vec) cur[u] = __ldcs(a.x + t * a.n_vec + idx);
        }
    }
    for (; t < a.num_tokens; t += gridDim.x) {
        const int next = t + gridDim.x;
        if (next < a.num_tokens) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const i64 idx = u * THREADS + threadIdx.x;
                if (idx < a.n_vec) nxt[u] = __ldcs(a.x + static_cast<i64>(next) * a.n_vec + idx);
            }
        }
        const int* slots = a.token_topk_to_pos + static_cast<i64>(t) * a.top_k;
        for (int k = 0; k < a.top_k; ++k) {
            const int p = __ldg(slots + k);
            if (p < 0) continue;
            uint4* dst = a.out + static_cast<i64>(p) * a.n_vec;
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const i64 idx = u * THREADS + threadIdx.x;
                if (idx < a.n_vec) __stcs(dst + idx, cur[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) cur[u] = nxt[u];
    }
    for (i64 first = static_cast<i64>(blockIdx.x) * a.rows_per_zero_block; first < a.num_expanded;
         first += static_cast<i64>(gridDim.x) * a.rows_per_zero_block)
        zero_rows(a, first, first + a.rows_per_zero_block, threadIdx.x, THREADS);
}

#define REGS(T, U, L) \
    extern "C" __global__ void __launch_bounds__(T) regs_##T##_##U##_##L(const Args a) { regs_body<T, U, L>(a); }
REGS(256, 4, 1)
REGS(256, 4, 0)
REGS(128, 8, 1)
REGS(128, 4, 1)
REGS(128, 3, 1)
REGS(512, 2, 1)
REGS(64, 14, 1)

#define PERSIST(T, U) \
    extern "C" __global__ void __launch_bounds__(T) persist_##T##_##U(const Args a) { persist_body<T, U>(a); }
PERSIST(256, 4)
PERSIST(128, 8)
PERSIST(128, 3)

// ---------------------------------------------------------------------------
// Bulk-copy engine (sm_90): one warp per block. Lane 0 loads the whole row
// into shared memory with cp.async.bulk; lane k then issues one bulk store of
// the row to slot k. STAGES = 2 with persistent blocks: the next token's
// load overlaps this token's stores.

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bulk_load(unsigned stage, unsigned bar, const void* src, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(stage), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

__device__ __forceinline__ void bulk_wait(unsigned bar, unsigned parity) {
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n"
                 "}" :: "r"(bar), "r"(parity) : "memory");
}

template <int STAGES>
__device__ __forceinline__ void bulk_body(const Args& a) {
    extern __shared__ __align__(128) unsigned char stage[];
    __shared__ __align__(8) unsigned long long bars[STAGES];
    const int lane = threadIdx.x;
    const unsigned bytes = static_cast<unsigned>(a.n_vec * 16);
    const int num_token_blocks = STAGES == 1 ? a.num_tokens : gridDim.x;
    if (STAGES == 1 && blockIdx.x >= a.num_tokens) {
        const i64 first = static_cast<i64>(blockIdx.x - a.num_tokens) * a.rows_per_zero_block;
        zero_rows(a, first, first + a.rows_per_zero_block, lane, 32);
        return;
    }
    if (lane == 0) {
        for (int s = 0; s < STAGES; ++s)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(bars + s)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    int t = blockIdx.x;
    if (lane == 0 && t < a.num_tokens)
        bulk_load(smem_addr(stage), smem_addr(bars), a.x + static_cast<i64>(t) * a.n_vec, bytes);
    for (int i = 0; t < a.num_tokens; ++i, t += num_token_blocks) {
        const int s = i % STAGES;
        const int next = t + num_token_blocks;
        if (STAGES > 1) {
            // The other stage's previous stores must have left shared memory.
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            __syncwarp();
            if (lane == 0 && next < a.num_tokens) {
                const int o = (i + 1) % STAGES;
                bulk_load(smem_addr(stage + o * bytes), smem_addr(bars + o),
                          a.x + static_cast<i64>(next) * a.n_vec, bytes);
            }
        }
        bulk_wait(smem_addr(bars + s), (i / STAGES) & 1);
        if (lane < a.top_k) {
            const int p = __ldg(a.token_topk_to_pos + static_cast<i64>(t) * a.top_k + lane);
            if (p >= 0)
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                             :: "l"(a.out + static_cast<i64>(p) * a.n_vec), "r"(smem_addr(stage + s * bytes)),
                                "r"(bytes) : "memory");
        }
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        if (STAGES == 1) break;
    }
    // The block may not retire while the engine still reads its shared memory.
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    if (STAGES > 1) {
        for (i64 first = static_cast<i64>(blockIdx.x) * a.rows_per_zero_block; first < a.num_expanded;
             first += static_cast<i64>(gridDim.x) * a.rows_per_zero_block)
            zero_rows(a, first, first + a.rows_per_zero_block, lane, 32);
    }
}

extern "C" __global__ void __launch_bounds__(32) bulk_1(const Args a) { bulk_body<1>(a); }
extern "C" __global__ void __launch_bounds__(32) bulk_2(const Args a) { bulk_body<2>(a); }

// Chunked bulk copy: grid (T + zero blocks, chunks of chunk_vec vectors), one
// warp per block, one bulk load and up to K bulk stores of one chunk. More,
// smaller blocks: more loads in flight per SM (smem per block = the chunk).
// ZERO_BULK = 1: padding rows are zeroed by bulk stores from a zeroed stage.
// ZERO_FIRST = 1: the zero-fill blocks come first in the grid, so that the
// grid's tail is token blocks (padding rows cluster at the end of X).
template <int ZERO_BULK, int ZERO_FIRST>
__device__ __forceinline__ void bulkc_body(const Args& a) {
    extern __shared__ __align__(128) unsigned char stage[];
    __shared__ __align__(8) unsigned long long bar;
    const int lane = threadIdx.x;
    const i64 begin = static_cast<i64>(blockIdx.y) * a.chunk_vec;
    const i64 count = min(static_cast<i64>(a.chunk_vec), a.n_vec - begin);
    const unsigned bytes = static_cast<unsigned>(count * 16);
    const int zero_blocks = (a.num_expanded + a.rows_per_zero_block - 1) / a.rows_per_zero_block;
    const int token_block = ZERO_FIRST ? static_cast<int>(blockIdx.x) - zero_blocks : blockIdx.x;
    const int zero_block = ZERO_FIRST ? blockIdx.x : static_cast<int>(blockIdx.x) - a.num_tokens;
    if (ZERO_FIRST ? token_block < 0 : token_block >= a.num_tokens) {
        const i64 first = static_cast<i64>(zero_block) * a.rows_per_zero_block;
        i64 last = first + a.rows_per_zero_block;
        if (last > a.num_expanded) last = a.num_expanded;
        if (!ZERO_BULK) {
            const uint4 zero = make_uint4(0, 0, 0, 0);
            for (i64 p = first; p < last; ++p) {
                if (__ldg(a.pos_to_expert + p) >= 0) continue;
                for (i64 i = lane; i < count; i += 32) __stcs(a.out + p * a.n_vec + begin + i, zero);
            }
            return;
        }
        // Zero the stage (generic proxy), make it visible to the bulk engine,
        // then one bulk store per padding row of the group.
        bool any = false;
        for (i64 p = first; p < last; ++p) any |= __ldg(a.pos_to_expert + p) < 0;
        if (!any) return;
        for (i64 i = lane; i < count; i += 32) reinterpret_cast<uint4*>(stage)[i] = make_uint4(0, 0, 0, 0);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncwarp();
        const i64 p = first + lane;
        if (lane < a.rows_per_zero_block && p < last && __ldg(a.pos_to_expert + p) < 0)
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                         :: "l"(a.out + p * a.n_vec + begin), "r"(smem_addr(stage)), "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        return;
    }
    const i64 t = token_block;
    if (lane == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(&bar)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        bulk_load(smem_addr(stage), smem_addr(&bar), a.x + t * a.n_vec + begin, bytes);
    }
    __syncwarp();
    int p = -1;
    if (lane < a.top_k) p = __ldg(a.token_topk_to_pos + t * a.top_k + lane);
    bulk_wait(smem_addr(&bar), 0);
    if (p >= 0)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     :: "l"(a.out + static_cast<i64>(p) * a.n_vec + begin), "r"(smem_addr(stage)),
                        "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(32) bulkc_0(const Args a) { bulkc_body<0, 0>(a); }
extern "C" __global__ void __launch_bounds__(32) bulkc_1(const Args a) { bulkc_body<1, 0>(a); }
extern "C" __global__ void __launch_bounds__(32) bulkz_0(const Args a) { bulkc_body<0, 1>(a); }
extern "C" __global__ void __launch_bounds__(32) bulkz_1(const Args a) { bulkc_body<1, 1>(a); }
