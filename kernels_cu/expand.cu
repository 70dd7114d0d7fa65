// Expand to fused: scatter token rows (and their scale factors) to the
// expert-major rows of a grouped-GEMM input, zero-filling padding rows (or
// leaving them alone: zero_padding = 0).
//
// One launch does all of it (padding-heavy plans may instead leave their
// padding rows to a second kernel that overlaps it: the *_overlapped copy
// kernels and expand_zero_padding_rows; calls that pass each row's token may
// write the output by position instead: expand_to_fused_gather, at the end).
// The token-major kernels' grid: its x dimension holds two kinds of
// blocks, its y dimension splits a row into column chunks of
// EXPAND_THREADS * vecs_per_thread accesses, its z dimension splits the K
// slots into groups of slots_per_block (small batches only: more, smaller
// blocks put more SMs to work when there are few tokens):
//   blocks [0, T)          token t: load one chunk of x[t] into registers
//                          once, store it to each valid slot of the block's
//                          group; chunk 0 also moves x_sf[t].
//   blocks x >= T          zero-fill, rows_per_zero_block (<= 32) output rows
//                          each from row first_zero_row on, numbered across
//                          the z planes too: zero the rows with
//                          pos_to_expert[p] < 0 (if zero_padding), every other
//                          row when T == 0 and, column-major SF, the pad
//                          columns X .. align(X, 4). Where a row is one chunk
//                          (one y plane), a run of such rows is one flat
//                          range (zero_row_runs; EXPAND_ZERO_RUNS).
//                          (expand_to_fused_bulk_zero_rows numbers them across
//                          the y planes as well and zeroes whole rows; see
//                          ZERO_ROWS below.)
// zero_padding = 0 leaves padding rows (data and scale factors) as they are.
// Unless T == 0 the host then starts the zero-fill blocks at first_zero_row =
// X: only the column-major SF's pad columns get any, the other layouts none
// (the grid is the token blocks alone), and no padding row is looked at.
// Rows are raw bytes moved in VEC_BYTES accesses; the host picks the widest
// width that divides the row length and both base addresses, so no row needs
// a tail. Offsets are 64-bit. A slot outside [0, X) is skipped, never written.
// Two kernels share this layout: expand_to_fused_v{16,8,4,2,1} hold chunks in
// registers (every GPU, every batch); expand_to_fused_bulk{,_zero_rows} move
// 16-byte rows through shared memory with the bulk-copy engine (sm_90+,
// batches that fill the chip; see their comment). The host
// (cupy_moe/expand/plan.py) picks per call shape.
//
// CUPY_MOE_SF_MODE (set by the loader): 0 no scale factors, 1 row-major
// [X, S] float32, 2 TMA-aligned column-major [S, sf_ld] (float32 or packed
// UE8M0 int32: both are moved as 4-byte words).

#ifndef CUPY_MOE_SF_MODE
#define CUPY_MOE_SF_MODE 0
#endif

// Which kernels the module holds, a bit each (cupy_moe/expand/plan.py's
// KERNEL_BITS: 0 *_v16, 1 *_v8, 2 *_v16_overlapped, 3 *_v4, 4 *_v2, 5 *_v1,
// 6 *_bulk, 7 *_bulk_zero_rows, 8 *_bulk_zero_rows_plain, 9
// *_bulk_overlapped, 10 expand_zero_padding_rows, 11 *_gather, 12 the two
// routing_* checks, 13 *_rows). A launch asks for its own kernel alone, so that a first
// call in a fresh kernel cache compiles the one or two it launches; default
// all (the compile tests).
#ifndef EXPAND_KERNELS
#define EXPAND_KERNELS 0x3FFF
#endif

#define SF_NONE 0
#define SF_ROW_MAJOR 1
#define SF_COL_MAJOR 2

#include "vector_access.cuh"
#include "bulk_copy.cuh"
#include "dependent_launch.cuh"
#include "zero_fill.cuh"

// Threads per block and the most vectors a thread holds in flight. The loader
// passes both (cupy_moe/expand/tuning.py), since the host sizes the column
// chunks with the same numbers; these defaults only serve NVRTC runs without
// them.
#ifndef EXPAND_THREADS
#define EXPAND_THREADS 256
#endif
#ifndef EXPAND_UNROLL
#define EXPAND_UNROLL 4
#endif

static_assert(EXPAND_THREADS % 32 == 0, "blocks are whole warps (the zero-fill ballots)");

// The register kernel compiled for one call's row: its bytes and the accesses
// a thread holds (ExpandTuning.compiled_row; 0: read from the argument block).
// With both fixed, the unrolled access loops lose their dead iterations and
// the row offsets their 64-bit multiplies (the kernel is instruction-bound on
// short rows: ncu, Qwen3's 3 KiB fp8 rows). Only expand_to_fused_body reads
// them; the host gives such a module to the register kernel's launch alone.
#ifndef EXPAND_ROW_BYTES
#define EXPAND_ROW_BYTES 0
#endif
#ifndef EXPAND_VECS_PER_THREAD
#define EXPAND_VECS_PER_THREAD 0
#endif
static_assert(EXPAND_VECS_PER_THREAD >= 0 && EXPAND_VECS_PER_THREAD <= EXPAND_UNROLL,
              "a thread holds at most EXPAND_UNROLL accesses");

// The register kernels' blocks an SM the compiler must leave room for
// (ExpandTuning.register_min_blocks; 0: no bound but the block size). 256
// threads at 37 registers (no SF) fit 6 blocks an SM, not 8.
#ifndef EXPAND_MIN_BLOCKS
#define EXPAND_MIN_BLOCKS 0
#endif
#if EXPAND_MIN_BLOCKS > 0
#define EXPAND_REGISTER_BOUNDS __launch_bounds__(EXPAND_THREADS, EXPAND_MIN_BLOCKS)
#else
#define EXPAND_REGISTER_BOUNDS __launch_bounds__(EXPAND_THREADS)
#endif

// Zero-fill by runs (ExpandTuning.zero_fill_runs: 1, or 2 with the run's loop
// unrolled): see zero_row_runs.
#ifndef EXPAND_ZERO_RUNS
#define EXPAND_ZERO_RUNS 0
#endif

// The argument block, passed by value. The host packs it field for field
// (cupy_moe/expand/plan.py, EXPAND_ARGS), in this order.
struct ExpandArgs {
    const unsigned char* x;           // [T, row_bytes]
    const int* token_topk_to_pos;     // [T, K]
    const int* pos_to_expert;         // [X]
    unsigned char* out;               // [X, row_bytes]
    const unsigned int* x_sf;         // [T, S] 4-byte words, or null
    unsigned int* out_sf;             // [X, S] or [S, sf_ld], or null
    const int* pos_to_token;          // [X] token of each row, or null (sf_pass)
    i64 row_bytes;                    // H * itemsize(x)
    int num_tokens;                   // T
    int top_k;                        // K
    int num_expanded;                 // X
    int sf_columns;                   // S (0 without scale factors)
    int sf_ld;                        // align(X, 4): column-major leading dim
    int rows_per_zero_block;          // 1 .. 32 (a warp ballot covers them)
    int vecs_per_thread;              // a chunk is blockDim.x * this many accesses
    int slots_per_block;              // 1 .. K
    int zero_padding;                 // 1: zero padding rows; 0: leave them
    int first_zero_row;               // first row of zero-fill block 0: 0, or X
    int sf_pass;                      // SF_PASS_*: which scale factors the SF pass writes
    int sf_pass_blocks;               // copy kernels: blocks x < this of plane (0, 0),
                                      // the SF pass
    int zero_row_blocks;              // expand_zero_padding_rows: blocks [0, this) zero
                                      // rows, the rest are the SF pass
    int rows_per_gather_block;        // expand_to_fused_gather: 1 .. EXPAND_THREADS
    int token_blocks;                 // expand_to_fused_rows: blocks [0, this) move tokens
};

// Scale factors by position (column-major SF only; ExpandTuning.sf_by_position):
// the token-major blocks scatter a token's S words to K rows, sf_ld * 4 bytes
// apart, so every store is a partial 32-byte sector shared with rows of other
// tokens (ncu: 27.4 of 32 bytes a sector, the packed-SF prefill plan L2-bound
// 8% behind the row-major one). The SF pass instead walks positions, a thread
// a row, so that a warp's stores fill whole sectors. Its blocks come first in
// the copy kernel's grid (x < sf_pass_blocks; only plane (0, 0)'s work, the
// others' return), so that they run beside the first wave of copies, not
// after the last (a second kernel started by programmatic dependent launch
// can start only once every copy block has started: as one, the pass ran at
// the tail, 3-6 points of the copy behind). Where the padding rows have a
// kernel of their own (whose copy kernel is token blocks only, all started
// at once) they may be that kernel's last blocks instead (x >=
// zero_row_blocks of expand_zero_padding_rows; ExpandTuning.
// sf_pass_beside_zero_kernel): in the copy kernel they delayed the zero
// kernel's start, 1-3 points behind:
//   SF_PASS_NONE    the token and zero-fill blocks move and zero every scale
//                   factor (no pass blocks)
//   SF_PASS_ZEROS   the pass zeroes them (padding rows, the pad columns,
//                   expert rows when T == 0); token blocks still scatter theirs
//   SF_PASS_ALL     the pass writes every one, reading row p's token from
//                   pos_to_token[p] (only given where the caller has it:
//                   fused_mapping's pos_to_token)
#define SF_PASS_NONE 0
#define SF_PASS_ZEROS 1
#define SF_PASS_ALL 2

template <int VEC_BYTES>
__device__ __forceinline__ void zero_row_chunk(unsigned char* out, i64 row, i64 n_vec, i64 vec_begin,
                                               int vecs_per_thread) {
    typedef typename VecOf<VEC_BYTES>::type Vec;
    Vec zero;
    memset(&zero, 0, sizeof(Vec));
    Vec* dst = reinterpret_cast<Vec*>(out) + row * n_vec;
#pragma unroll
    for (int u = 0; u < EXPAND_UNROLL; ++u) {
        i64 idx = vec_begin + u * EXPAND_THREADS + threadIdx.x;
        if (u < vecs_per_thread && idx < n_vec) store_once(dst + idx, zero);
    }
}

__device__ __forceinline__ void store_sf_row(unsigned int* out_sf, const ExpandArgs& a, i64 row,
                                             int s, unsigned int word) {
#if CUPY_MOE_SF_MODE == SF_ROW_MAJOR
    out_sf[row * a.sf_columns + s] = word;
#elif CUPY_MOE_SF_MODE == SF_COL_MAJOR
    out_sf[static_cast<i64>(s) * a.sf_ld + row] = word;
#endif
}

// Zero-fill blocks are blocks x >= T of every plane. Those that zero a column
// chunk (each y plane has its own) are numbered x-major across the z planes,
// (x - T) * gridDim.z + z, so that a grid split by slots has no idle planes.
__device__ __forceinline__ i64 zero_block_of_chunk_grid(int zero_column) {
    return static_cast<i64>(zero_column) * gridDim.z + blockIdx.z;
}

// The rows zero-fill block `zero_block` covers that need zeros: padding rows
// (pos_to_expert < 0) when zero_padding is set, expert rows when there are no
// tokens (no slot writes them: the result is zeros), and, column-major SF, the
// pad columns [X, align(X, 4)) (SF only; zeroed whatever zero_padding says).
__device__ __forceinline__ ZeroRows rows_to_zero(const ExpandArgs& a, i64 zero_block) {
#if CUPY_MOE_SF_MODE == SF_COL_MAJOR
    // the pad columns X .. sf_ld have no data row: the SF pass zeroes them
    const i64 zero_rows = a.sf_pass == SF_PASS_NONE ? a.sf_ld : a.num_expanded;
#else
    const i64 zero_rows = a.num_expanded;
#endif
    const i64 first_row = a.first_zero_row + zero_block * a.rows_per_zero_block;
    return padding_rows_ballot(a.pos_to_expert, first_row, a.rows_per_zero_block, zero_rows,
                               a.num_expanded,
                               /*padding_rows=*/a.zero_padding != 0,
                               /*expert_rows=*/a.num_tokens == 0);
}

// Zero scale factors of the rows in `rows`.
__device__ __forceinline__ void zero_sf_rows(const ExpandArgs& a, ZeroRows rows, int threads) {
#if CUPY_MOE_SF_MODE != SF_NONE
    if (a.sf_pass != SF_PASS_NONE) return;  // the SF pass zeroes them
    for (unsigned mask = rows.mask; mask != 0; mask &= mask - 1) {
        const i64 p = rows.first_row + __ffs(mask) - 1;
        for (int s = threadIdx.x; s < a.sf_columns; s += threads) store_sf_row(a.out_sf, a, p, s, 0u);
    }
#endif
}

// A zero-fill block: zero_data(p) zeroes this block's column chunk of data
// row p, for each of its rows that needs it; then their scale factors.
// (Scale factors by chunk 0's blocks only.)
template <typename ZeroData>
__device__ __forceinline__ void zero_fill(const ExpandArgs& a, i64 zero_block, int threads,
                                          ZeroData zero_data) {
    const ZeroRows rows = rows_to_zero(a, zero_block);
    for (unsigned mask = rows.mask; mask != 0; mask &= mask - 1) {
        const i64 p = rows.first_row + __ffs(mask) - 1;
        if (p < a.num_expanded) zero_data(p);
    }
    if (blockIdx.y == 0) zero_sf_rows(a, rows, threads);
}

// A zero-fill block whose chunk is the whole row (one y plane; EXPAND_ZERO_RUNS):
// consecutive rows are then consecutive bytes, so each run of rows in `rows`
// is one flat range, stored by all the block's threads together (no row loop,
// no lanes idle where a row is shorter than the chunk); the row-major scale
// factors of a run likewise one range of words. Column-major ones as
// zero_sf_rows does. Rows at or past X (the column-major pad columns) have
// no data.
template <int VEC_BYTES>
__device__ __forceinline__ void zero_row_runs(const ExpandArgs& a, ZeroRows rows, i64 n_vec) {
    typedef typename VecOf<VEC_BYTES>::type Vec;
    Vec zero;
    memset(&zero, 0, sizeof(Vec));
    for (unsigned mask = rows.mask; mask != 0;) {
        const int first = __ffs(mask) - 1;
        const unsigned from_first = mask >> first;  // the run starts at bit 0
        const int run = from_first == 0xffffffffu ? 32 : __ffs(~from_first) - 1;
        mask &= ~static_cast<unsigned>(((1ull << run) - 1) << first);
        const i64 begin = rows.first_row + first;
        const i64 end = min(begin + run, static_cast<i64>(a.num_expanded));
        if (begin >= end) continue;
        Vec* dst = reinterpret_cast<Vec*>(a.out) + begin * n_vec;
        const int vecs = static_cast<int>((end - begin) * n_vec);  // <= 32 rows of one chunk
        // (EXPAND_ZERO_RUNS 2: the loop unrolled by 4, stores issued in bursts
        // as the row-by-row path's unrolled accesses are)
#if EXPAND_ZERO_RUNS == 2
#pragma unroll 4
#endif
        for (int i = threadIdx.x; i < vecs; i += EXPAND_THREADS) store_once(dst + i, zero);
#if CUPY_MOE_SF_MODE == SF_ROW_MAJOR
        if (a.sf_pass == SF_PASS_NONE) {  // (always, row-major: the pass is column-major's)
            unsigned int* sf = a.out_sf + begin * a.sf_columns;
            const int words = static_cast<int>((end - begin) * a.sf_columns);
            for (int i = threadIdx.x; i < words; i += EXPAND_THREADS) sf[i] = 0u;
        }
#endif
    }
#if CUPY_MOE_SF_MODE == SF_COL_MAJOR
    zero_sf_rows(a, rows, EXPAND_THREADS);
#endif
}

// The SF pass (sf_pass != SF_PASS_NONE, column-major SF): thread p of the
// pass blocks writes all S scale factors of row p, p in [0, sf_ld): zeros
// for the pad columns, for padding rows when zero_padding is set and for expert
// rows when there are no tokens; x_sf[pos_to_token[p]] for an expert row with
// SF_PASS_ALL (zeros where that is no token in [0, T), as the gather kernel
// gives the row's data: never read). A warp's stores of one column are 32
// consecutive words: whole sectors.
__device__ __forceinline__ void sf_by_position(const ExpandArgs& a, int pass_block) {
#if CUPY_MOE_SF_MODE == SF_COL_MAJOR
    const i64 p = static_cast<i64>(pass_block) * blockDim.x + threadIdx.x;
    if (p >= a.sf_ld) return;
    long long token = -1;  // the row whose words go to p; -1: zeros
    if (p < a.num_expanded) {
        if (__ldg(a.pos_to_expert + p) < 0) {
            if (!a.zero_padding) return;
        } else if (a.num_tokens > 0) {
            if (a.sf_pass != SF_PASS_ALL) return;  // its token block writes it
            token = __ldg(a.pos_to_token + p);
            if (token >= a.num_tokens) token = -1;
        }
    }
    unsigned int* dst = a.out_sf + p;
    if (token < 0) {
        for (int s = 0; s < a.sf_columns; ++s) dst[static_cast<i64>(s) * a.sf_ld] = 0u;
    } else {
        const unsigned int* src = a.x_sf + token * a.sf_columns;
        for (int s = 0; s < a.sf_columns; ++s) dst[static_cast<i64>(s) * a.sf_ld] = __ldg(src + s);
    }
#endif
}

// The copy kernels' first step: blocks x < sf_pass_blocks are the SF pass's
// (plane (0, 0) does it); returns false for them, else the block's number
// among the token and zero-fill blocks.
__device__ __forceinline__ bool copy_or_zero_block(const ExpandArgs& a, int& block) {
    block = blockIdx.x;
    if (block < a.sf_pass_blocks) {
        if (blockIdx.y == 0 && blockIdx.z == 0) sf_by_position(a, block);
        return false;
    }
    block -= a.sf_pass_blocks;
    return true;
}

// OVERLAPPED: the copy kernel of a call whose padding rows
// expand_zero_padding_rows zeroes (the host launches no zero-fill blocks):
// it lets that kernel start at once.
template <int VEC_BYTES, bool OVERLAPPED = false>
__device__ __forceinline__ void expand_to_fused_body(const ExpandArgs& a) {
    if constexpr (OVERLAPPED) let_dependents_start();
    typedef typename VecOf<VEC_BYTES>::type Vec;
    const i64 n_vec = (EXPAND_ROW_BYTES > 0 ? EXPAND_ROW_BYTES : a.row_bytes) / VEC_BYTES;
    const int vecs_per_thread = EXPAND_VECS_PER_THREAD > 0 ? EXPAND_VECS_PER_THREAD
                                                           : a.vecs_per_thread;
    // a compiled row that fits one chunk: no y planes, so the accesses past
    // the row are known at compile time and their iterations drop out
    constexpr bool one_chunk =
        EXPAND_ROW_BYTES > 0 && EXPAND_VECS_PER_THREAD > 0 &&
        EXPAND_ROW_BYTES / VEC_BYTES <= EXPAND_THREADS * EXPAND_VECS_PER_THREAD;
    const i64 vec_begin =
        one_chunk ? 0 : static_cast<i64>(blockIdx.y) * (EXPAND_THREADS * vecs_per_thread);
    int block;
    if (!copy_or_zero_block(a, block)) return;

    if (block < a.num_tokens) {
        // Scatter: one read of the chunk, a store per slot of the group.
        const i64 t = block;
        const int* slots = a.token_topk_to_pos + t * a.top_k;
        const int k_begin = blockIdx.z * a.slots_per_block;
        const int k_end = min(a.top_k, k_begin + a.slots_per_block);
#if CUPY_MOE_SF_MODE != SF_NONE
        // Issue the first scale-factor load with the row loads, so that its
        // latency overlaps theirs instead of following the row stores.
        const bool moves_sf = blockIdx.y == 0 && threadIdx.x < a.sf_columns &&
                              a.sf_pass != SF_PASS_ALL;
        const unsigned int first_word = moves_sf ? a.x_sf[t * a.sf_columns + threadIdx.x] : 0u;
#endif
        const Vec* src = reinterpret_cast<const Vec*>(a.x) + t * n_vec;
        Vec held[EXPAND_UNROLL];
#pragma unroll
        for (int u = 0; u < EXPAND_UNROLL; ++u) {
            i64 idx = vec_begin + u * EXPAND_THREADS + threadIdx.x;
            if (u < vecs_per_thread && idx < n_vec) held[u] = load_once(src + idx);
        }
        for (int k = k_begin; k < k_end; ++k) {
            const int p = __ldg(slots + k);
            if (p < 0 || p >= a.num_expanded) continue;  // dropped, or malformed
            Vec* dst = reinterpret_cast<Vec*>(a.out) + static_cast<i64>(p) * n_vec;
#pragma unroll
            for (int u = 0; u < EXPAND_UNROLL; ++u) {
                i64 idx = vec_begin + u * EXPAND_THREADS + threadIdx.x;
                if (u < vecs_per_thread && idx < n_vec) store_once(dst + idx, held[u]);
            }
        }
#if CUPY_MOE_SF_MODE != SF_NONE
        if (moves_sf) {
            for (int s = threadIdx.x; s < a.sf_columns; s += EXPAND_THREADS) {
                const unsigned int word = s == threadIdx.x ? first_word
                                                           : a.x_sf[t * a.sf_columns + s];
                for (int k = k_begin; k < k_end; ++k) {
                    const int p = __ldg(slots + k);
                    if (p < 0 || p >= a.num_expanded) continue;
                    store_sf_row(a.out_sf, a, p, s, word);
                }
            }
        }
#endif
        return;
    }

    // Zero-fill: padding rows (expert rows too when there are no tokens) and,
    // for the column-major SF, the pad columns X .. sf_ld that a TMA load reads.
#if EXPAND_ZERO_RUNS
    if (gridDim.y == 1) {
        zero_row_runs<VEC_BYTES>(a, rows_to_zero(a, zero_block_of_chunk_grid(block - a.num_tokens)),
                                 n_vec);
        return;
    }
#endif
    zero_fill(a, zero_block_of_chunk_grid(block - a.num_tokens), EXPAND_THREADS, [&](i64 p) {
        zero_row_chunk<VEC_BYTES>(a.out, p, n_vec, vec_begin, vecs_per_thread);
    });
}

#define DEFINE_EXPAND_KERNEL(VEC_BYTES)                                              \
    extern "C" __global__ void EXPAND_REGISTER_BOUNDS                                \
    expand_to_fused_v##VEC_BYTES(const ExpandArgs args) {                            \
        expand_to_fused_body<VEC_BYTES>(args);                                       \
    }

#if EXPAND_KERNELS & (1 << 0)
DEFINE_EXPAND_KERNEL(16)
#endif
#if EXPAND_KERNELS & (1 << 1)
DEFINE_EXPAND_KERNEL(8)
#endif

#if EXPAND_KERNELS & (1 << 2)
extern "C" __global__ void EXPAND_REGISTER_BOUNDS
expand_to_fused_v16_overlapped(const ExpandArgs args) {
    expand_to_fused_body<16, true>(args);
}
#endif

#if EXPAND_KERNELS & (1 << 3)
DEFINE_EXPAND_KERNEL(4)
#endif
#if EXPAND_KERNELS & (1 << 4)
DEFINE_EXPAND_KERNEL(2)
#endif
#if EXPAND_KERNELS & (1 << 5)
DEFINE_EXPAND_KERNEL(1)
#endif

// ---------------------------------------------------------------------------
// Bulk-copy variant (sm_90 and newer; 16-byte aligned rows only), for batches
// big enough to fill the chip with chunks. One warp per block, same grid
// layout as above with blockDim.x == 32: lane 0 loads the block's chunk of
// x[t] (32 * vecs_per_thread vectors; the last chunk of a row may be
// shorter) into shared memory with one cp.async.bulk, then lane k stores it
// to slot k with one bulk store (so slots_per_block must be <= 32). Few
// instructions per byte and many small blocks per SM keep more loads in
// flight than the register variant: measured +4 points of the copy bandwidth
// on kimi-k2-prefill, +13 on qwen3-30b-prefill (benchmarks/NOTES.md).
// Scale factors use ordinary loads and stores; zero-fill, see ZERO_CHUNKS
// and ZERO_ROWS below.

#define BULK_THREADS 32

// Zero-fill blocks of the bulk kernel, two layouts (the host picks one by row
// length; benchmarks/NOTES.md has the measurements):
//   ZERO_CHUNKS  as in the register kernel: a block zeroes its column chunk of
//                its rows with 16-byte stores, chunk 0's blocks their scale
//                factors; blocks numbered across the z planes.
//   ZERO_ROWS    a block zeroes its rows whole (every chunk), by bulk stores
//                from a zeroed stage, and their scale factors; blocks numbered
//                across the y and z planes, so there are gridDim.y times fewer.
//   ZERO_ROWS_PLAIN  as ZERO_ROWS, but by 16-byte stores, the warp's lanes
//                across each row: no stage, so the launch's shared memory is
//                the copy chunk's and more blocks fit an SM.
enum BulkZeroFill { ZERO_CHUNKS, ZERO_ROWS, ZERO_ROWS_PLAIN };

template <BulkZeroFill ZERO_FILL, bool OVERLAPPED = false>
__device__ __forceinline__ void expand_to_fused_bulk_body(const ExpandArgs& a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (OVERLAPPED) let_dependents_start();  // see expand_to_fused_body
    extern __shared__ __align__(128) unsigned char stage[];
    __shared__ __align__(8) unsigned long long loaded;
    const int lane = threadIdx.x;
    const i64 n_vec = a.row_bytes / 16;
    const i64 stage_vecs = static_cast<i64>(BULK_THREADS) * a.vecs_per_thread;  // a full chunk
    const i64 chunk_begin = static_cast<i64>(blockIdx.y) * stage_vecs;
    const i64 chunk_vecs = min(stage_vecs, n_vec - chunk_begin);
    const unsigned chunk_bytes = static_cast<unsigned>(chunk_vecs * 16);
    int block;
    if (!copy_or_zero_block(a, block)) return;

    if (block < a.num_tokens) {
        const i64 t = block;
        const unsigned stage_at = shared_address(stage);
        const unsigned loaded_at = shared_address(&loaded);
        const int* slots = a.token_topk_to_pos + t * a.top_k;
        const int k = blockIdx.z * a.slots_per_block + lane;
        const int k_end = min(a.top_k, (blockIdx.z + 1) * a.slots_per_block);
        const int p = k < k_end ? __ldg(slots + k) : -1;
        // A token whose slots are all dropped (expert parallelism: remote
        // experts) is not read at all: its row and scale factors go nowhere.
        // Waiting for the slots first costs a block one load's latency;
        // the other blocks of the SM stream meanwhile.
        if (__ballot_sync(0xffffffffu, p >= 0 && p < a.num_expanded) == 0u) return;
        if (lane == 0) {
            mbarrier_expect(loaded_at, chunk_bytes);
            bulk_load(stage_at, a.x + t * a.row_bytes + chunk_begin * 16, chunk_bytes, loaded_at);
        }
        __syncwarp();
#if CUPY_MOE_SF_MODE != SF_NONE
        // Scale factors while the chunk is in flight (chunk 0's blocks only).
        if (blockIdx.y == 0 && a.sf_pass != SF_PASS_ALL) {
            for (int s = lane; s < a.sf_columns; s += BULK_THREADS) {
                const unsigned int word = a.x_sf[t * a.sf_columns + s];
                for (int j = blockIdx.z * a.slots_per_block; j < k_end; ++j) {
                    const int q = __ldg(slots + j);
                    if (q >= 0 && q < a.num_expanded) store_sf_row(a.out_sf, a, q, s, word);
                }
            }
        }
#endif
        mbarrier_wait(loaded_at);
        if (p >= 0 && p < a.num_expanded) {
            bulk_store(a.out + static_cast<i64>(p) * a.row_bytes + chunk_begin * 16, stage_at,
                       chunk_bytes);
            bulk_stores_done_reading();
        }
        return;
    }

    const int zero_column = block - a.num_tokens;
    if (ZERO_FILL == ZERO_CHUNKS) {
        zero_fill(a, zero_block_of_chunk_grid(zero_column), BULK_THREADS, [&](i64 p) {
            uint4* dst = reinterpret_cast<uint4*>(a.out) + p * n_vec + chunk_begin;
            for (i64 i = lane; i < chunk_vecs; i += BULK_THREADS) store_once(dst + i, make_uint4(0, 0, 0, 0));
        });
        return;
    }
    const i64 zero_block = (static_cast<i64>(blockIdx.z) * gridDim.y + blockIdx.y) *
                           (gridDim.x - a.sf_pass_blocks - a.num_tokens) + zero_column;
    const ZeroRows rows = rows_to_zero(a, zero_block);
    // data rows only (the column-major SF's pad columns have no data row)
    const i64 data_left = a.num_expanded - rows.first_row;
    const unsigned data_rows = data_left >= 32 ? rows.mask
                             : data_left <= 0 ? 0u : rows.mask & ((1u << data_left) - 1u);
    if (ZERO_FILL == ZERO_ROWS_PLAIN) {
        for (unsigned mask = data_rows; mask != 0; mask &= mask - 1) {
            uint4* row = reinterpret_cast<uint4*>(a.out) + (rows.first_row + __ffs(mask) - 1) * n_vec;
            for (i64 i = lane; i < n_vec; i += BULK_THREADS) store_once(row + i, make_uint4(0, 0, 0, 0));
        }
    } else if (data_rows != 0) {
        // The whole dynamic stage, which the host may make larger than a copy
        // chunk (padding-heavy plans: few, large bulk stores of zeros run at
        // memset speed, 1 KiB ones do not)
        const i64 zero_vecs = min(static_cast<i64>(dynamic_shared_bytes() / 16), n_vec);
        uint4* zeros = reinterpret_cast<uint4*>(stage);
        for (i64 i = lane; i < zero_vecs; i += BULK_THREADS) zeros[i] = make_uint4(0, 0, 0, 0);
        fence_shared_for_bulk();
        __syncwarp();
        if ((data_rows >> lane) & 1u) {  // lane r zeroes row first_row + r
            unsigned char* row = a.out + (rows.first_row + lane) * a.row_bytes;
            for (i64 begin = 0; begin < n_vec; begin += zero_vecs)
                bulk_store(row + begin * 16, shared_address(stage),
                           static_cast<unsigned>(min(zero_vecs, n_vec - begin) * 16));
            bulk_stores_done_reading();
        }
    }
    zero_sf_rows(a, rows, BULK_THREADS);
#else
    __trap();  // the host launches these kernels on sm_90 and newer only
#endif
}

#if EXPAND_KERNELS & (1 << 6)
extern "C" __global__ void __launch_bounds__(BULK_THREADS) expand_to_fused_bulk(const ExpandArgs a) {
    expand_to_fused_bulk_body<ZERO_CHUNKS>(a);
}
#endif

#if EXPAND_KERNELS & (1 << 7)
extern "C" __global__ void __launch_bounds__(BULK_THREADS)
expand_to_fused_bulk_zero_rows(const ExpandArgs a) {
    expand_to_fused_bulk_body<ZERO_ROWS>(a);
}
#endif

#if EXPAND_KERNELS & (1 << 8)
extern "C" __global__ void __launch_bounds__(BULK_THREADS)
expand_to_fused_bulk_zero_rows_plain(const ExpandArgs a) {
    expand_to_fused_bulk_body<ZERO_ROWS_PLAIN>(a);
}
#endif

// token blocks only: no zero-fill layout to choose
#if EXPAND_KERNELS & (1 << 9)
extern "C" __global__ void __launch_bounds__(BULK_THREADS)
expand_to_fused_bulk_overlapped(const ExpandArgs a) {
    expand_to_fused_bulk_body<ZERO_CHUNKS, true>(a);
}
#endif

// Padding rows by a kernel of their own (padding-heavy plans, where the host
// asks for it: ExpandTuning.zero_kernel_from_bytes; 16-byte rows and output,
// sm_90+). The copy kernel (a *_overlapped one) then has no zero-fill blocks
// and lets this kernel start at once (programmatic dependent launch): the two
// write disjoint rows, so the zeros stream while the rows are copied, by
// blocks of EXPAND_THREADS threads with plain 16-byte stores (what runs at
// memset speed, benchmarks/results/zero_fill_sweep.md), not by the copy
// kernel's one-warp blocks. Block b takes the rows_per_zero_block rows from
// first_zero_row + b * rows_per_zero_block on, as a zero-fill block of the
// copy kernel would (rows_to_zero: padding rows, every row when T == 0, the
// column-major SF's pad columns), and their scale factors. Its last block
// waits for the copy kernel before it exits, so that the stream's next
// kernel, which waits for this one, never starts before both are done. Only
// the last: a block that waits keeps its SM slot until the copy kernel ends,
// and when every block waited, the first wave of zero-fill blocks sat idle
// through the copies instead of making room for the next.
// With an SF pass (sf_pass) its row blocks leave scale factors alone, and its
// blocks from zero_row_blocks on are the pass's (sf_by_position).
#if EXPAND_KERNELS & (1 << 10)
extern "C" __global__ void __launch_bounds__(EXPAND_THREADS)
expand_zero_padding_rows(const ExpandArgs a) {
    if (static_cast<int>(blockIdx.x) >= a.zero_row_blocks) {
        sf_by_position(a, blockIdx.x - a.zero_row_blocks);
        if (blockIdx.x == gridDim.x - 1) wait_for_previous_kernel();
        return;
    }
    const ZeroRows rows = rows_to_zero(a, blockIdx.x);  // each warp: the same ballot
    const i64 n_vec = a.row_bytes / 16;
    uint4* out = reinterpret_cast<uint4*>(a.out);
    for (unsigned mask = rows.mask; mask != 0; mask &= mask - 1) {
        const i64 p = rows.first_row + __ffs(mask) - 1;
        if (p >= a.num_expanded) break;  // the SF pad columns come last: no data row
        uint4* row = out + p * n_vec;
        for (i64 i = threadIdx.x; i < n_vec; i += EXPAND_THREADS)
            store_once(row + i, make_uint4(0, 0, 0, 0));
    }
    zero_sf_rows(a, rows, EXPAND_THREADS);
    if (blockIdx.x == gridDim.x - 1) wait_for_previous_kernel();
}
#endif

// ---------------------------------------------------------------------------
// Rows by position (calls that pass pos_to_token, where the host asks for it:
// ExpandTuning.gather_x_bytes_below; 16-byte rows and bases). The token-major
// kernels above read a token's row once and store it K times, and zero the
// padding rows in blocks of another kind; on padding-heavy plans of short
// rows (Qwen3's 3 KiB fp8 rows at 512 tokens: three rows in four are
// padding) they are bound by instruction issue, 7-9% behind the seed's
// kernel. Here every block does the same work, rows_per_gather_block
// consecutive output rows, a warp a row at a time, each row whole: its
// token's row of x (read through L2, where x stays while it is small: each
// token's row is read K times and every store is evict-first) or zeros.
// Row-major scale factors travel with their row; column-major ones are the
// SF pass's (blocks x < sf_pass_blocks, SF_PASS_ALL: whole sectors). Row p
// gets:
//   padding row (pos_to_expert[p] < 0)       zeros, or nothing (zero_padding 0)
//   expert row, pos_to_token[p] in [0, T)    x[pos_to_token[p]] and its scale factors
//   expert row, any other pos_to_token[p]    zeros (T == 0, or a hint that
//                                            disagrees with the map)
// token_topk_to_pos is not read: the hint stands for it (validate=True checks
// that the two agree; where they do, the results are the token-major kernels').
#define GATHER_UNROLL 8  // 16-byte loads a lane has in flight: a 3 KiB row in one round

#define GATHER_SKIP (-2)   // a row this warp leaves alone (or no row)
#define GATHER_ZEROS (-1)  // a row of zeros

// A read-only load the compiler issues where it is written: without it, the
// pos_to_token load sank into the branch on pos_to_expert, two round trips
// in a row instead of one.
__device__ __forceinline__ int load_issued_here(const int* p) {
    int value;
    asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(value) : "l"(p));
    return value;
}

#if EXPAND_KERNELS & (1 << 11)
extern "C" __global__ void __launch_bounds__(EXPAND_THREADS)
expand_to_fused_gather(const ExpandArgs a) {
    int block;
    if (!copy_or_zero_block(a, block)) return;
    constexpr int WARPS = EXPAND_THREADS / 32;
    const int lane = threadIdx.x & 31;
    const i64 n_vec = a.row_bytes / 16;
    // this warp's rows: first + WARPS * j, at most 32 of them (the host keeps
    // rows_per_gather_block <= EXPAND_THREADS)
    const i64 first = static_cast<i64>(block) * a.rows_per_gather_block + (threadIdx.x >> 5);
    const i64 end = min(static_cast<i64>(block + 1) * a.rows_per_gather_block,
                        static_cast<i64>(a.num_expanded));
    // Lane j looks up the warp's row j up front (both loads at once), so
    // that no row waits on a chain of dependent loads.
    int lane_source = GATHER_SKIP;
    const i64 lane_row = first + static_cast<i64>(lane) * WARPS;
    if (lane_row < end) {
        const int expert = load_issued_here(a.pos_to_expert + lane_row);
        const int token = load_issued_here(a.pos_to_token + lane_row);
        lane_source = expert < 0 ? (a.zero_padding ? GATHER_ZEROS : GATHER_SKIP)
                    : token >= 0 && token < a.num_tokens ? token : GATHER_ZEROS;
    }
    for (int j = 0; j < 32; ++j) {
        const i64 p = first + static_cast<i64>(j) * WARPS;
        if (p >= end) break;  // the same for every lane
        const int source = __shfl_sync(0xffffffffu, lane_source, j);
        if (source == GATHER_SKIP) continue;
        uint4* dst = reinterpret_cast<uint4*>(a.out) + p * n_vec;
        if (source == GATHER_ZEROS) {
            for (i64 i = lane; i < n_vec; i += 32) store_once(dst + i, make_uint4(0, 0, 0, 0));
        } else {
            const uint4* src = reinterpret_cast<const uint4*>(a.x) + source * n_vec;
            for (i64 base = lane; base < n_vec; base += 32 * GATHER_UNROLL) {
                uint4 held[GATHER_UNROLL];
#pragma unroll
                for (int u = 0; u < GATHER_UNROLL; ++u) {
                    const i64 i = base + u * 32;
                    if (i < n_vec) held[u] = __ldg(src + i);
                }
#pragma unroll
                for (int u = 0; u < GATHER_UNROLL; ++u) {
                    const i64 i = base + u * 32;
                    if (i < n_vec) store_once(dst + i, held[u]);
                }
            }
        }
#if CUPY_MOE_SF_MODE == SF_ROW_MAJOR
        unsigned int* sf_dst = a.out_sf + p * a.sf_columns;
        const unsigned int* sf_src = a.x_sf + static_cast<i64>(max(source, 0)) * a.sf_columns;
        for (int s = lane; s < a.sf_columns; s += 32)
            sf_dst[s] = source == GATHER_ZEROS ? 0u : __ldg(sf_src + s);
#endif
    }
}
#endif

// ---------------------------------------------------------------------------
// The lean rows kernel (ExpandTuning.rows_kernel_*; no scale factors, 16-byte
// rows and bases, calls with tokens): the seed's algorithm with none of the
// register kernel's generality. Blocks [0, token_blocks = T * G) are token
// blocks, block (t, g) moving token t's whole row, held in registers, to the rows of its
// slots g * slots_per_block .. (g + 1) * slots_per_block - 1 (G groups a
// token; a dropped slot, or a position >= X, is skipped, and a group with no
// slot left reads nothing); then a block a row from first_zero_row, zeroing
// it where pos_to_expert < 0 (no such blocks with zero_padding 0). Rows are
// at most EXPAND_ROWS_THREADS * EXPAND_ROWS_UNROLL vectors (the host checks).
// A zero-fill block is one map load and a row's stores, a token block one
// row's load and its slots' stores: on the padding-heavy plans of small and
// medium batches, where the other kernels trail the seed by 4-12% in a CUDA
// graph, it comes within 3% of the seed or passes it; on tightly packed
// calls of the same shapes it loses (few token blocks, each storing K rows
// one after another), so it is off by default (ExpandTuning says more).
// EXPAND_ROWS_BY_POSITION 1 (calls that pass pos_to_token): no token blocks;
// block p writes row p alone, from both map words loaded at once: zeros for
// a padding row (nothing with zero_padding 0), x[pos_to_token[p]] for an
// expert row, zeros where that token is outside 0 .. T-1 (as the gather
// kernel). Every block is one row whatever the routing, so a tightly packed
// call gets X row copies where the token blocks would each store K rows. This
// layout is the default for calls of few tokens and small outputs given
// pos_to_token (ExpandTuning.rows_by_position_*). By position, row-major scale
// factors come along: block p also writes row p's S words (x_sf[token]'s,
// or zeros where the row gets zeros); token blocks take no scale factors.
#ifndef EXPAND_ROWS_THREADS
#define EXPAND_ROWS_THREADS 256
#endif
#ifndef EXPAND_ROWS_BY_POSITION
#define EXPAND_ROWS_BY_POSITION 0
#endif
// vectors a thread holds: the host compiles it for the call's row (ceil(row
// vectors / threads): fewer registers, ExpandTuning.rows_kernel_fitted_unroll);
// else room for rows of up to 16 KiB, 1,024 vectors (Kimi-K2's bf16 rows are
// 14 KiB), whatever the block size divides
#ifndef EXPAND_ROWS_UNROLL
#define EXPAND_ROWS_UNROLL ((1024 + EXPAND_ROWS_THREADS - 1) / EXPAND_ROWS_THREADS)
#endif

// A row of n_vec 16-byte vectors, held in registers EXPAND_ROWS_UNROLL a thread.
struct RowsHeld {
    uint4 v[EXPAND_ROWS_UNROLL];
    __device__ __forceinline__ void load(const uint4* src, int n_vec) {
#pragma unroll
        for (int u = 0; u < EXPAND_ROWS_UNROLL; ++u) {
            const int i = threadIdx.x + u * EXPAND_ROWS_THREADS;
            if (i < n_vec) v[u] = __ldg(src + i);
        }
    }
    __device__ __forceinline__ void store(uint4* dst, int n_vec) const {
#pragma unroll
        for (int u = 0; u < EXPAND_ROWS_UNROLL; ++u) {
            const int i = threadIdx.x + u * EXPAND_ROWS_THREADS;
            if (i < n_vec) dst[i] = v[u];
        }
    }
};

__device__ __forceinline__ void zero_rows_row(uint4* dst, int n_vec) {
    for (int i = threadIdx.x; i < n_vec; i += EXPAND_ROWS_THREADS)
        dst[i] = make_uint4(0, 0, 0, 0);
}

#if EXPAND_KERNELS & (1 << 13)
extern "C" __global__ void __launch_bounds__(EXPAND_ROWS_THREADS)
expand_to_fused_rows(const ExpandArgs a) {
#if EXPAND_ROWS_BY_POSITION && (CUPY_MOE_SF_MODE == SF_NONE || CUPY_MOE_SF_MODE == SF_ROW_MAJOR)
    {
        // row_bytes >= 0: a shift, without a signed division's fix-ups (fewer
        // instructions on the routed path; in time level with the division on
        // the H100, results/expand_lean_by_position_h100.md)
        const int n_vec = static_cast<int>(a.row_bytes >> 4);
        // the grid is X blocks; row p's offsets as one wide multiply each
        const int p = static_cast<int>(blockIdx.x);
        const int expert = load_issued_here(a.pos_to_expert + p);
        const int token = load_issued_here(a.pos_to_token + p);
        uint4* dst = reinterpret_cast<uint4*>(a.out) + static_cast<i64>(p) * n_vec;
#if CUPY_MOE_SF_MODE == SF_ROW_MAJOR
        // row p's S words sit together (row-major SF), stored with its data
        unsigned int* sf_dst = a.out_sf + static_cast<i64>(p) * a.sf_columns;
#endif
        if (expert < 0 || token < 0 || token >= a.num_tokens) {
            if (expert < 0 && !a.zero_padding) return;  // tested off the routed path
            zero_rows_row(dst, n_vec);
#if CUPY_MOE_SF_MODE == SF_ROW_MAJOR
            for (int s = threadIdx.x; s < a.sf_columns; s += EXPAND_ROWS_THREADS) sf_dst[s] = 0u;
#endif
            return;
        }
        RowsHeld row;
        row.load(reinterpret_cast<const uint4*>(a.x) + static_cast<i64>(token) * n_vec, n_vec);
#if CUPY_MOE_SF_MODE == SF_ROW_MAJOR
        // the words' loads wait while the row's are in flight
        const unsigned int* sf_src = a.x_sf + static_cast<i64>(token) * a.sf_columns;
        for (int s = threadIdx.x; s < a.sf_columns; s += EXPAND_ROWS_THREADS)
            sf_dst[s] = __ldg(sf_src + s);
#endif
        row.store(dst, n_vec);
        return;
    }
#elif CUPY_MOE_SF_MODE == SF_NONE
    const int n_vec = static_cast<int>(a.row_bytes / 16);
    const int block = blockIdx.x;
    if (block >= a.token_blocks) {
        // A zero-fill block: nothing computed before its map load (these
        // blocks are short: their start-up is a share of the launch's time).
        const i64 p = static_cast<i64>(a.first_zero_row) + (block - a.token_blocks);
        if (p >= a.num_expanded || __ldg(a.pos_to_expert + p) >= 0) return;
        zero_rows_row(reinterpret_cast<uint4*>(a.out) + p * n_vec, n_vec);
        return;
    }
    const int groups = a.token_blocks / a.num_tokens;  // slot groups a token
    const int t = block / groups;
    const int k_begin = (block - t * groups) * a.slots_per_block;
    const int k_end = min(a.top_k, k_begin + a.slots_per_block);
    const int* slots = a.token_topk_to_pos + static_cast<i64>(t) * a.top_k;
    bool any = false;
    for (int k = k_begin; k < k_end; ++k) {
        const int p = __ldg(slots + k);
        any |= p >= 0 && p < a.num_expanded;
    }
    if (!any) return;  // every slot dropped (expert parallelism: remote experts)
    RowsHeld row;
    row.load(reinterpret_cast<const uint4*>(a.x) + static_cast<i64>(t) * n_vec, n_vec);
    for (int k = k_begin; k < k_end; ++k) {
        const int p = __ldg(slots + k);
        if (p < 0 || p >= a.num_expanded) continue;  // dropped, or malformed
        row.store(reinterpret_cast<uint4*>(a.out) + static_cast<i64>(p) * n_vec, n_vec);
    }
#else
    // the host launches it without scale factors, or by position with
    // row-major ones
    __trap();
#endif
}
#endif

// ---------------------------------------------------------------------------
// validate=True: find the first offending slot of each kind in two passes,
// without a per-row host round trip. found[] starts at ROUTING_NONE ("none";
// every byte 0x7F, so the host sets it with one memset):
//   found[0] first flat slot with a position >= X            (out of range)
//   found[1] first flat slot naming a row with pos_to_expert < 0
//   found[2] first flat slot repeating an earlier slot's row (duplicate)
//   found[3] first expert row (pos_to_expert >= 0) no slot names
//   found[4] first flat slot t*K + k whose row's pos_to_token is not t (only
//            with pos_to_token)
// first_slot[X] (ROUTING_NONE-initialised) gets the smallest slot naming each row.

#define ROUTING_NONE 0x7F7F7F7F7F7F7F7FLL

struct RoutingArgs {
    const int* token_topk_to_pos;   // [T * K]
    const int* pos_to_expert;       // [X]
    const int* pos_to_token;        // [X], or null
    long long* first_slot;          // [X]
    long long* found;               // [5]
    i64 num_slots;                  // T * K
    int num_expanded;               // X
    int top_k;                      // K
};

#if EXPAND_KERNELS & (1 << 12)
extern "C" __global__ void routing_first_slots(const RoutingArgs a) {
    for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < a.num_slots;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        const int p = a.token_topk_to_pos[i];
        if (p >= a.num_expanded) {
            atomicMin(a.found + 0, i);
        } else if (p >= 0) {
            if (a.pos_to_expert[p] < 0) atomicMin(a.found + 1, i);
            if (a.pos_to_token != nullptr && a.pos_to_token[p] != i / a.top_k)
                atomicMin(a.found + 4, i);
            atomicMin(a.first_slot + p, i);
        }
    }
}
#endif

#if EXPAND_KERNELS & (1 << 12)
extern "C" __global__ void routing_repeats_and_gaps(const RoutingArgs a) {
    const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
    const i64 start = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x;
    for (i64 i = start; i < a.num_slots; i += stride) {
        const int p = a.token_topk_to_pos[i];
        if (p >= 0 && p < a.num_expanded && a.first_slot[p] != i) atomicMin(a.found + 2, i);
    }
    for (i64 p = start; p < a.num_expanded; p += stride) {
        if (a.pos_to_expert[p] >= 0 && a.first_slot[p] == ROUTING_NONE)
            atomicMin(a.found + 3, p);
    }
}
#endif
