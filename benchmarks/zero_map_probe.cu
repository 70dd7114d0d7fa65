// Padding-row zero-fill patterns that read the map first (pos_to_expert < 0
// marks a row to zero), timed by benchmarks/zero_map_probe.py against a
// memset of the same bytes and against the same patterns with the map's
// answer known in advance. The question (issue 13): how much of the zero
// kernel's gap to the seed comes from waiting on the map before the stores.
//
// Every kernel zeroes the padding rows of out[X, n_vec] (16-byte vectors)
// and nothing else; the script checks that on a poisoned buffer first.
// Compiled by NVRTC (cupy.RawModule); templates by name expressions.

typedef long long i64;

template <int ST>
__device__ __forceinline__ void store_zero16(uint4* p) {
    if constexpr (ST == 0) {
        *p = make_uint4(0u, 0u, 0u, 0u);
    } else {
        __stcs(p, make_uint4(0u, 0u, 0u, 0u));
    }
}

template <int THREADS, int ST>
__device__ __forceinline__ void zero_row(uint4* row, int n_vec, int first) {
    for (int i = first; i < n_vec; i += THREADS) store_zero16<ST>(row + i);
}

// Whether row p is padding: read from the map (MAPPED), or from the rule the
// script laid the map out by (each segment of `segment` rows starts with
// data_rows data rows), with no load: the store pattern alone.
template <bool MAPPED>
__device__ __forceinline__ bool is_padding(const int* map, int data_rows, i64 p, int segment) {
    if constexpr (MAPPED) {
        return map[p] < 0;
    } else {
        return static_cast<int>(p % segment) >= data_rows;
    }
}

// The library's zero kernel as it is: blocks of THREADS, `rows` rows each;
// each warp ballots the block's rows, then the whole block zeroes each
// padding row in turn.
template <int THREADS, int ST, bool MAPPED>
__global__ void __launch_bounds__(THREADS)
rows_by_block(uint4* out, const int* map, int data_rows, int X, int n_vec, int rows,
              int segment) {
    const i64 first = static_cast<i64>(blockIdx.x) * rows;
    const int lane = threadIdx.x & 31;
    const i64 p = first + lane;
    const bool pad = lane < rows && p < X && is_padding<MAPPED>(map, data_rows, p, segment);
    for (unsigned mask = __ballot_sync(0xffffffffu, pad); mask != 0; mask &= mask - 1) {
        const i64 row = first + __ffs(mask) - 1;
        zero_row<THREADS, ST>(out + row * n_vec, n_vec, threadIdx.x);
    }
}

// The seed's geometry: a block of THREADS a row; one map load (every
// thread the same word).
template <int THREADS, int ST, bool MAPPED>
__global__ void __launch_bounds__(THREADS)
row_a_block(uint4* out, const int* map, int data_rows, int X, int n_vec, int segment) {
    const i64 p = blockIdx.x;
    if (is_padding<MAPPED>(map, data_rows, p, segment))
        zero_row<THREADS, ST>(out + p * n_vec, n_vec, threadIdx.x);
}

// Persistent warps: grid of whole waves, warp w of W zeroes rows w, w + W,
// ...; the next row's map word is loaded before this row's stores, so no
// warp waits on the map but for its first row.
template <int ST, bool MAPPED>
__global__ void __launch_bounds__(256)
rows_by_warp_pipelined(uint4* out, const int* map, int data_rows, int X, int n_vec,
                       int segment) {
    const int lane = threadIdx.x & 31;
    const i64 warps = static_cast<i64>(gridDim.x) * 8;
    i64 p = static_cast<i64>(blockIdx.x) * 8 + (threadIdx.x >> 5);
    bool pad = p < X && is_padding<MAPPED>(map, data_rows, p, segment);
    while (p < X) {
        const i64 next = p + warps;
        const bool next_pad = next < X && is_padding<MAPPED>(map, data_rows, next, segment);
        if (pad) zero_row<32, ST>(out + p * n_vec, n_vec, lane);
        p = next;
        pad = next_pad;
    }
}

// Persistent blocks of 256: block b of B zeroes rows b, b + B, ..., the
// whole block a row, the next row's word loaded before this row's stores.
template <int ST, bool MAPPED>
__global__ void __launch_bounds__(256)
rows_by_block_pipelined(uint4* out, const int* map, int data_rows, int X, int n_vec,
                        int segment) {
    i64 p = blockIdx.x;
    bool pad = p < X && is_padding<MAPPED>(map, data_rows, p, segment);
    while (p < X) {
        const i64 next = p + gridDim.x;
        const bool next_pad = next < X && is_padding<MAPPED>(map, data_rows, next, segment);
        if (pad) zero_row<256, ST>(out + p * n_vec, n_vec, threadIdx.x);
        p = next;
        pad = next_pad;
    }
}
