// The seed's algorithm for expand_to_fused, written lean (issue 13): blocks
// of THREADS threads, each one output row's zero-fill and/or one token's
// scatter, on 16-byte vectors of bf16 rows (no scale factors). Timed by
// benchmarks/row_block_probe.py on the real-plan workloads beside a memset
// of the padding bytes; the question is whether this structure, with none
// of the library kernels' generality, runs at or below the seed's figure on
// the Qwen3 EP8 plans, where every library kernel trails the seed by 4-10%
// in a CUDA graph.
//
// Compiled by NVRTC (cupy.RawModule); templates by name expressions.

typedef long long i64;

// Token t's row, VPT vectors a thread, to each of its K slots' rows (a
// negative position is a dropped slot).
template <int THREADS, int VPT>
__device__ __forceinline__ void scatter_token(const uint4* x, const int* token_topk_to_pos,
                                              uint4* out, int t, int top_k, int n_vec) {
    uint4 row[VPT];
    const uint4* src = x + static_cast<i64>(t) * n_vec;
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
        const int i = threadIdx.x + u * THREADS;
        if (i < n_vec) row[u] = __ldg(src + i);
    }
    for (int k = 0; k < top_k; ++k) {
        const int p = __ldg(token_topk_to_pos + static_cast<i64>(t) * top_k + k);
        if (p < 0) continue;
        uint4* dst = out + static_cast<i64>(p) * n_vec;
#pragma unroll
        for (int u = 0; u < VPT; ++u) {
            const int i = threadIdx.x + u * THREADS;
            if (i < n_vec) dst[i] = row[u];
        }
    }
}

// One row, VPT vectors a thread, loaded whole before any store.
template <int THREADS, int VPT>
__device__ __forceinline__ void copy_row(const uint4* src, uint4* dst, int n_vec) {
    uint4 row[VPT];
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
        const int i = threadIdx.x + u * THREADS;
        if (i < n_vec) row[u] = __ldg(src + i);
    }
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
        const int i = threadIdx.x + u * THREADS;
        if (i < n_vec) dst[i] = row[u];
    }
}

template <int THREADS>
__device__ __forceinline__ void zero_row(uint4* out, int p, int n_vec) {
    uint4* dst = out + static_cast<i64>(p) * n_vec;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int i = threadIdx.x; i < n_vec; i += THREADS) dst[i] = zero;
}

// Rows first .. first + ROWS - 1 zeroed where they are padding: every map
// load before any store.
template <int THREADS, int ROWS>
__device__ __forceinline__ void zero_padding_rows(const int* pos_to_expert, uint4* out, int first,
                                                  int num_expanded, int n_vec) {
    bool pad[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
        pad[r] = first + r < num_expanded && __ldg(pos_to_expert + first + r) < 0;
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
        if (pad[r]) zero_row<THREADS>(out, first + r, n_vec);
}

// The seed's grid: max(T, X) blocks; block b zeroes row b if it is padding,
// then (b < T) scatters token b.
template <int THREADS, int VPT>
__global__ void __launch_bounds__(THREADS)
seed_grid(const uint4* x, const int* token_topk_to_pos, const int* pos_to_expert, uint4* out,
          int num_tokens, int top_k, int num_expanded, int n_vec) {
    const int b = blockIdx.x;
    if (b < num_expanded && __ldg(pos_to_expert + b) < 0) zero_row<THREADS>(out, b, n_vec);
    if (b < num_tokens)
        scatter_token<THREADS, VPT>(x, token_topk_to_pos, out, b, top_k, n_vec);
}

// Roles apart: T token blocks first (scheduled first), then X row blocks of
// ROWS rows each that zero their padding rows.
template <int THREADS, int VPT, int ROWS>
__global__ void __launch_bounds__(THREADS)
split_roles(const uint4* x, const int* token_topk_to_pos, const int* pos_to_expert, uint4* out,
            int num_tokens, int top_k, int num_expanded, int n_vec) {
    const int b = blockIdx.x;
    if (b < num_tokens) {
        scatter_token<THREADS, VPT>(x, token_topk_to_pos, out, b, top_k, n_vec);
        return;
    }
    const int first = (b - num_tokens) * ROWS;
    zero_padding_rows<THREADS, ROWS>(pos_to_expert, out, first, num_expanded, n_vec);
}

// Slots apart: T * K slot blocks first, block t * K + k copying token t's
// row to slot k's row (a dropped slot's block ends after one load), then
// row blocks of ROWS rows each that zero their padding rows. Decode (T = 1)
// gets K blocks for its K rows, where a token block stores them one by one.
template <int THREADS, int VPT, int ROWS>
__global__ void __launch_bounds__(THREADS)
split_slots(const uint4* x, const int* token_topk_to_pos, const int* pos_to_expert, uint4* out,
            int num_tokens, int top_k, int num_expanded, int n_vec) {
    const int b = blockIdx.x;
    const int num_slots = num_tokens * top_k;
    if (b < num_slots) {
        const int p = __ldg(token_topk_to_pos + b);
        if (p < 0) return;
        copy_row<THREADS, VPT>(x + static_cast<i64>(b / top_k) * n_vec,
                               out + static_cast<i64>(p) * n_vec, n_vec);
        return;
    }
    const int first = (b - num_slots) * ROWS;
    zero_padding_rows<THREADS, ROWS>(pos_to_expert, out, first, num_expanded, n_vec);
}

// Rows by position (the gather): X blocks, block p writing output row p
// alone: zeros where pos_to_expert[p] < 0, else token pos_to_token[p]'s row
// (zeros for a token outside 0 .. T-1). Both map words are loaded at once;
// a routed row's load of x waits on its token. Every block one row whatever
// the routing: tightly packed calls get X row copies (no token block storing
// K rows in turn), padding-heavy ones X - routed zero-fills.
template <int THREADS, int VPT>
__global__ void __launch_bounds__(THREADS)
gather_rows(const uint4* x, const int* pos_to_token, const int* pos_to_expert, uint4* out,
            int num_tokens, int top_k, int num_expanded, int n_vec) {
    const int p = blockIdx.x;
    const int expert = __ldg(pos_to_expert + p);
    const int token = __ldg(pos_to_token + p);
    if (expert < 0 || token < 0 || token >= num_tokens) {
        zero_row<THREADS>(out, p, n_vec);
        return;
    }
    copy_row<THREADS, VPT>(x + static_cast<i64>(token) * n_vec, out + static_cast<i64>(p) * n_vec,
                           n_vec);
}

// The split's pieces: a row of VPT vectors a thread into registers and out
// again, the live slots of a token (0 <= position < X), and a token's row
// stored to each of them.
template <int THREADS, int VPT>
__device__ __forceinline__ void load_row(const uint4* src, uint4 (&row)[VPT], int n_vec) {
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
        const int i = threadIdx.x + u * THREADS;
        if (i < n_vec) row[u] = __ldg(src + i);
    }
}

template <int THREADS, int VPT>
__device__ __forceinline__ void store_row(uint4* dst, const uint4 (&row)[VPT], int n_vec) {
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
        const int i = threadIdx.x + u * THREADS;
        if (i < n_vec) dst[i] = row[u];
    }
}

__device__ __forceinline__ int live_slots(const int* slots, int top_k, int num_expanded) {
    int live = 0;
    for (int k = 0; k < top_k; ++k) {
        const int q = __ldg(slots + k);
        live += q >= 0 && q < num_expanded;
    }
    return live;
}

template <int THREADS, int VPT>
__device__ __forceinline__ void store_to_slots(const int* slots, uint4* out,
                                               const uint4 (&row)[VPT], int top_k,
                                               int num_expanded, int n_vec) {
    for (int k = 0; k < top_k; ++k) {
        const int q = __ldg(slots + k);
        if (q < 0 || q >= num_expanded) continue;
        store_row<THREADS, VPT>(out + static_cast<i64>(q) * n_vec, row, n_vec);
    }
}

// Split by slot count (a device-side choice between the two layouts above):
// T token blocks, then X row blocks. Token block t loads its row beside its
// K slots (one round trip) and stores it to its live slots where it has at
// most C of them (expert parallelism: on the EP8 plans 93% of the tokens
// have 0-2 local slots, all but one of 512 0-3); a row block zeroes a
// padding row and, for a routed row, loads its token's
// slots (beside the row where SPEC: the token block has just read it, so
// from L2) and stores the row only where the token has more than C live
// slots (tightly packed calls). So every row is written once, by a block
// that waited one round trip (EP: token blocks) or two (packed: row blocks).
// The maps must agree (pos_to_token[p] == t for each live slot p of t).
template <int THREADS, int VPT, int C, bool SPEC>
__global__ void __launch_bounds__(THREADS)
split_by_count(const uint4* x, const int* token_topk_to_pos, const int* pos_to_expert, uint4* out,
               int num_tokens, int top_k, int num_expanded, int n_vec, const int* pos_to_token) {
    const int b = blockIdx.x;
    int t = b;
    int p = -1;
    if (b >= num_tokens) {
        p = b - num_tokens;
        const int expert = __ldg(pos_to_expert + p);
        t = __ldg(pos_to_token + p);
        if (expert < 0 || t < 0 || t >= num_tokens) {
            zero_row<THREADS>(out, p, n_vec);
            return;
        }
    }
    const uint4* src = x + static_cast<i64>(t) * n_vec;
    uint4 row[VPT];
    if (SPEC || p < 0) load_row<THREADS, VPT>(src, row, n_vec);
    const int* slots = token_topk_to_pos + static_cast<i64>(t) * top_k;
    const int live = live_slots(slots, top_k, num_expanded);
    if (p >= 0) {
        if (live <= C) return;  // the token's block stores it
        if (!SPEC) load_row<THREADS, VPT>(src, row, n_vec);
        store_row<THREADS, VPT>(out + static_cast<i64>(p) * n_vec, row, n_vec);
        return;
    }
    if (live > C) return;  // the rows' blocks store them
    store_to_slots<THREADS, VPT>(slots, out, row, top_k, num_expanded, n_vec);
}

// The same split on the seed's grid: max(T, X) blocks, block b both token
// b's block (b < T) and row b's (b < X), its map words, token b's slots and
// token b's row loaded in one round trip. As above, a token of at most C
// live slots stores its rows itself; a routed row whose token has more is
// stored by its row's block (the token's slots and row loaded beside each
// other: a second round trip).
template <int THREADS, int VPT, int C>
__global__ void __launch_bounds__(THREADS)
split_by_count_merged(const uint4* x, const int* token_topk_to_pos, const int* pos_to_expert,
                      uint4* out, int num_tokens, int top_k, int num_expanded, int n_vec,
                      const int* pos_to_token) {
    const int b = blockIdx.x;
    int expert = -1;
    int t = -1;
    if (b < num_expanded) {
        expert = __ldg(pos_to_expert + b);
        t = __ldg(pos_to_token + b);
    }
    if (b < num_tokens) {
        uint4 row[VPT];
        load_row<THREADS, VPT>(x + static_cast<i64>(b) * n_vec, row, n_vec);
        const int* slots = token_topk_to_pos + static_cast<i64>(b) * top_k;
        if (live_slots(slots, top_k, num_expanded) <= C)
            store_to_slots<THREADS, VPT>(slots, out, row, top_k, num_expanded, n_vec);
    }
    if (b >= num_expanded) return;
    if (expert < 0 || t < 0 || t >= num_tokens) {
        zero_row<THREADS>(out, b, n_vec);
        return;
    }
    uint4 row[VPT];
    load_row<THREADS, VPT>(x + static_cast<i64>(t) * n_vec, row, n_vec);
    if (live_slots(token_topk_to_pos + static_cast<i64>(t) * top_k, top_k, num_expanded) <= C)
        return;  // token t's block stores it
    store_row<THREADS, VPT>(out + static_cast<i64>(b) * n_vec, row, n_vec);
}

// Slots and rows merged: max(T * K, X) blocks, block b both slot b's (b <
// T * K: token b / K's row to position token_topk_to_pos[b]) and row b's
// (b < X: zeros where it is padding). Its two map words and, where SPEC,
// the token's row are loaded in one round trip, so every store waits one;
// without SPEC a routed slot's row load waits on its position (two round
// trips, as by position). A tightly packed call gets T * K row copies (x
// read K times, from L2 after the first), an expert-parallel plan X -
// routed zero-fills and, where SPEC, T * K row loads, the dropped slots'
// wasted. One wave where max(T * K, X) blocks fit the chip at once.
template <int THREADS, int VPT, bool SPEC>
__global__ void __launch_bounds__(THREADS)
slots_and_rows(const uint4* x, const int* token_topk_to_pos, const int* pos_to_expert, uint4* out,
               int num_tokens, int top_k, int num_expanded, int n_vec) {
    const int b = blockIdx.x;
    const bool has_slot = b < num_tokens * top_k;
    const int p = has_slot ? __ldg(token_topk_to_pos + b) : -1;
    const bool pad = b < num_expanded && __ldg(pos_to_expert + b) < 0;
    const uint4* src = x + static_cast<i64>(b / top_k) * n_vec;
    uint4 row[VPT];
    if (SPEC && has_slot) load_row<THREADS, VPT>(src, row, n_vec);
    if (pad) zero_row<THREADS>(out, b, n_vec);
    if (p < 0 || p >= num_expanded) return;
    if (!SPEC) load_row<THREADS, VPT>(src, row, n_vec);
    store_row<THREADS, VPT>(out + static_cast<i64>(p) * n_vec, row, n_vec);
}
