// reduce_fused, the MoE combine: each token's K expert rows, weighted and
// summed in float32, back to one row per token.
//
//   for each token t, slots k = 0 .. K-1 in order, p = token_topk_to_pos[t, k]
//   with 0 <= p < X (a negative slot is dropped; one >= X is skipped, never
//   read):
//       s   = topk_weights[t, k] * row_scale[p]    (__fmul_rn; a missing
//                                                   factor is 1: s = w, s =
//                                                   row_scale[p], or s = 1)
//       acc = __fmaf_rn(float(expanded[p, h]), s, acc)   from acc = +0.0f
//   out[t, h] = acc rounded once to the dtype (round to nearest even), or,
//   with COMBINE_OUT_F32 (a bf16/fp16 call given a float32 out), acc itself.
//
// Explicit __fmul_rn / __fmaf_rn: no contraction or reassociation can change
// a bit, and the loader never passes fast-math or flush-to-zero (denormals
// are kept). NaN results are stored as one canonical NaN per dtype
// (0x7FFFFFFF, bf16/fp16 0x7FFF), whatever the hardware's payload, so that
// the NumPy oracle (cupy_moe/combine/reference.py) matches bit for bit.
//
// Layout (cupy_moe/combine/launch_shape.py picks it): a thread owns
// COMBINE_VECS VEC_BYTES vectors of one token's output row (v, v +
// row_threads, ...). A block is tokens_per_block groups of row_threads
// threads; the grid is (token groups, column chunks of row_threads *
// COMBINE_VECS vectors).
// A thread loads its vector of a batch of COMBINE_SLOT_BATCH slots' rows
// before the first FMA of the batch (the loads are in flight together: one
// memory latency per batch, not per slot), then accumulates them in slot
// order (or, with COMBINE_WARP_SLOTS, a warp shares its token's slots by
// shuffles and walks only the live ones). No shared memory, no atomics, no
// barriers; every output vector is written once. The host picks VEC_BYTES
// (16, 8, 4 or 2; at least the element size) as the widest access dividing
// the row length and both base addresses, so odd H and misaligned views take
// narrower accesses, down to one element. Offsets are 64-bit.
//
// With COMBINE_BULK_STAGES (16-byte rows, sm_90+) a block's threads share
// the live rows instead: the bulk-copy engine lands each one's column chunk
// in shared memory, several in flight, and the threads sum from there, a
// block barrier after each chunk (see reduce_fused_bulk). Still no atomics,
// and every output vector is written once.
//
// Kernels: reduce_fused_{f32,bf16,f16}_v{16,8,4,2} (f32 from 4 bytes up), and
// reduce_fused_first_out_of_range (validate=True).

#include "bulk_copy.cuh"
#include "vector_access.cuh"

// Slots whose row loads a thread has in flight at once (registers: this many
// vectors, times COMBINE_VECS). The host compiles the variant its launch shape
// asks for (combine/launch_shape.py slot_batch); the default is 8.
#ifndef COMBINE_SLOT_BATCH
#define COMBINE_SLOT_BATCH 8
#endif
// Vectors of a row a thread owns: v, v + row_threads, ... (the host compiles
// the variant its launch shape asks for: combine/launch_shape.py
// vecs_per_thread). More bytes in flight per load of the slots and weights:
// with 4 vectors and 4 slots (the many-token shape, auto_combine_shape) the
// H200 reaches 92-98% of the copy bandwidth on prefill, against 72-75% with
// 1 and 8. (With 2 and 8, ptxas (sm_90) spills 8 bytes in two kernels.)
#ifndef COMBINE_VECS
#define COMBINE_VECS 1
#endif
// 1: a warp loads its token's slots once, lane k slot k (a warp is one
// token's: the host takes this only where row_threads is a multiple of 32),
// and walks the live ones only, COMBINE_SLOT_BATCH rows in flight at once,
// handing each slot's row and scale to the lanes by shuffles
// (launch_shape.py warp_slots). Expert-parallel plans drop most slots (seven
// of eight on DeepSeek-V3 EP8): the per-thread walk spends its loads and
// instructions on dropped slots and waits one latency a batch for positions.
// Results unchanged (the live slots are taken in k order); with 0 the kernel
// is the one measured before the switch existed.
#ifndef COMBINE_WARP_SLOTS
#define COMBINE_WARP_SLOTS 0
#endif
// With COMBINE_WARP_SLOTS: consecutive tokens a warp takes one after the
// other (launch_shape.py warp_tokens), so that the next token's slots and
// weights are mostly in the cache line the last ones came in.
#ifndef COMBINE_WARP_TOKENS
#define COMBINE_WARP_TOKENS 1
#endif
// N > 0: the live rows of a warp's tokens as one stream (launch_shape.py
// stream_rounds; 1 <= K <= 32, a warp one token group's). A round is the
// floor(32 / K) consecutive tokens whose slots one warp load covers (lane
// l: token l / K, slot l % K); the warp walks the round's live slots in
// (token, k) order, COMBINE_SLOT_BATCH rows in flight whatever token they
// belong to, and stores a token's row when the stream moves past it. So a
// batch is full wherever the round has that many live rows, where the
// per-token walk of a plan with one live slot a token holds one. N rounds a
// warp. Results unchanged (each token's sum still in k order).
#ifndef COMBINE_STREAM_ROUNDS
#define COMBINE_STREAM_ROUNDS 0
#endif
// N > 0: a block's live rows land in shared memory by bulk copies, N
// column chunks in flight (launch_shape.py bulk_stages; 16-byte rows, sm_90+,
// K <= the block's threads). The block takes row_threads / K consecutive
// tokens, thread i their flat slot i: the live slots are listed in (token,
// k) order, thread 0 keeps N of their chunks in flight, and every thread
// sums its COMBINE_VECS vectors of each chunk as it lands and stores a
// token's row after its last slot. Rows in flight cost shared memory, not
// registers (the register walks hold at most slot_batch rows a warp and
// reached ~80% of the copy bandwidth on expert-parallel plans, where tokens
// have one live row or none). Results unchanged (each token's sum in k order).
#ifndef COMBINE_BULK_STAGES
#define COMBINE_BULK_STAGES 0
#endif
// With COMBINE_BULK_STAGES: consecutive groups of row_threads / K tokens a
// block takes one after the other (launch_shape.py bulk_rounds), its stages
// and mbarriers carried over: a grid that many times shorter, for batches
// whose blocks would otherwise run in more than one wave.
#ifndef COMBINE_BULK_ROUNDS
#define COMBINE_BULK_ROUNDS 1
#endif
// K > 0: a block (a group) a token, with K compiled in (launch_shape.py
// token_rows; no warp_slots, stream or bulk layout): every thread loads the
// token's K positions and scales at once, then, slot by slot in k order,
// its COMBINE_VECS vectors of each live row and their FMAs (the slot loop
// unrolled: a later slot's loads may go before an earlier one's FMAs), and a
// token with no live slot stores zeros without the rounding path. Few
// instructions a token, for expert-parallel plans where most tokens have one
// live slot or none (TileKernels' reduce_fused ran 3.5-5.6x fewer than our
// other layouts there; benchmarks/results/reduce_tk_ep8_h100.md).
// COMBINE_FULL_ROWS 1 (the host's promise): every thread's COMBINE_VECS
// vectors lie inside the row, so no vector is bounds-tested.
#ifndef COMBINE_TOKEN_ROWS
#define COMBINE_TOKEN_ROWS 0
#endif
#ifndef COMBINE_FULL_ROWS
#define COMBINE_FULL_ROWS 0
#endif
// With COMBINE_TOKEN_ROWS, a token with at most half its slots live (an
// expert-parallel plan's, whatever X says of it) loads its rows under this
// hint (vector_access.cuh's VECTOR_LOAD_HINT values); -1: under the module's
// VECTOR_LOAD_HINT, as every other token. A token's threads all take the
// same branch; the hint changes no bit.
#ifndef COMBINE_FEW_LIVE_LOAD_HINT
#define COMBINE_FEW_LIVE_LOAD_HINT -1
#endif

// The largest block the host launches (cupy_moe/combine/launch_shape.py), and
// the blocks of that size an SM must hold at least: with this bound ptxas
// neither spills (it did with the thread bound alone) nor takes more than 128
// registers; two such blocks keep 2 * 256 * COMBINE_SLOT_BATCH 16-byte loads
// in flight per SM, more than its share of the memory bandwidth needs.
#define COMBINE_MAX_THREADS 256
#define COMBINE_MIN_BLOCKS 2

// 1: a bf16 or fp16 call stores its sums unrounded, as float32 (the host's
// float32 `out`: partial sums that a later step adds, as expert-parallel
// combine's); each input vector's sums are then two output vectors of
// VEC_BYTES. float32 calls ignore it (their sums are float32 already).
#ifndef COMBINE_OUT_F32
#define COMBINE_OUT_F32 0
#endif

// The argument block, passed by value. The host packs it field for field
// (cupy_moe/combine/gpu.py, COMBINE_ARGS), in this order.
struct CombineArgs {
    const void* expanded;          // [X, H]
    const int* token_topk_to_pos;  // [T, K]
    const float* topk_weights;     // [T, K], or null
    const float* row_scale;        // [X], or null
    void* out;                     // [T, H], expanded's dtype or (COMBINE_OUT_F32) float32
    i64 row_vecs;                  // H * itemsize / VEC_BYTES
    i64 num_tokens;                // T
    i64 num_expanded;              // X
    int top_k;                     // K
    int row_threads;               // threads on one token's column chunk
    int tokens_per_block;
};

#define FMT_F32 0
#define FMT_BF16 1
#define FMT_F16 2

// Each dtype's bits, their exact widening to float and the one rounding back.
template <int FMT> struct Format;

template <> struct Format<FMT_F32> {
    typedef unsigned int Bits;
    static __device__ __forceinline__ float widen(Bits b) { return __uint_as_float(b); }
    static __device__ __forceinline__ Bits narrow(float f) {
        return f != f ? 0x7FFFFFFFu : __float_as_uint(f);
    }
};

template <> struct Format<FMT_BF16> {
    typedef unsigned short Bits;
    static __device__ __forceinline__ float widen(Bits b) {
        return __uint_as_float(static_cast<unsigned int>(b) << 16);
    }
    // Round to nearest even on the bits: add just under half of the dropped
    // part's unit, plus the kept part's last bit (ties go to even). Carries
    // run into the exponent as they should (up to inf); denormals need
    // nothing special (bf16 has float32's exponent range). NaN apart.
    static __device__ __forceinline__ Bits narrow(float f) {
        if (f != f) return 0x7FFF;
        const unsigned int u = __float_as_uint(f);
        return static_cast<Bits>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    // Two at once, `first` in the low half (the lower address): on sm_80 and
    // newer one cvt.rn.bf16x2.f32 (round to nearest even, a NaN to the
    // canonical 0x7FFF, as narrow gives) for the ~6 integer operations and
    // the NaN select of each narrow.
    static __device__ __forceinline__ unsigned int narrow_pair(float first, float second) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        unsigned int packed;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(second), "f"(first));
        return packed;
#else
        return narrow(first) | static_cast<unsigned int>(narrow(second)) << 16;
#endif
    }
};

template <> struct Format<FMT_F16> {
    typedef unsigned short Bits;
    static __device__ __forceinline__ float widen(Bits b) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
        return f;
    }
    // cvt.rn: round to nearest even, fp16 denormals kept, overflow to inf.
    static __device__ __forceinline__ Bits narrow(float f) {
        if (f != f) return 0x7FFF;
        Bits h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

// Output vectors of VEC_BYTES per input vector (COMBINE_OUT_F32).
template <int FMT>
struct OutVecs {
    static constexpr int value = COMBINE_OUT_F32 && FMT != FMT_F32 ? 2 : 1;
};

// The first output vector of input vector `index` (t * row_vecs + column
// vector) of out, in VEC_BYTES units.
template <int FMT, int VEC_BYTES>
__device__ __forceinline__ typename VecOf<VEC_BYTES>::type* out_vectors(const CombineArgs& a,
                                                                        i64 index) {
    return reinterpret_cast<typename VecOf<VEC_BYTES>::type*>(a.out) + index * OutVecs<FMT>::value;
}

// Token t's row of zeros (no live slot): what store_row stores for sums of +0
// (+0 is all zero bits in every format).
template <int FMT, int VEC_BYTES>
__device__ __forceinline__ void store_zero_row(const CombineArgs& a, i64 t, i64 v) {
    typedef typename VecOf<VEC_BYTES>::type Vec;
#pragma unroll
    for (int c = 0; c < COMBINE_VECS; ++c) {
        if (!COMBINE_FULL_ROWS && v + c * a.row_threads >= a.row_vecs) break;
        Vec* out = out_vectors<FMT, VEC_BYTES>(a, t * a.row_vecs + v + c * a.row_threads);
#pragma unroll
        for (int h = 0; h < OutVecs<FMT>::value; ++h) store_once(out + h, Vec());
    }
}

// The float32 sums of this thread's vectors of token t's row (acc from
// zero), slot by slot in k order; a thread loads its vector of a batch of
// COMBINE_SLOT_BATCH slots' rows before the batch's first FMA.
template <int FMT, int VEC_BYTES>
__device__ __forceinline__ void accumulate_slot_batches(
        const CombineArgs& a, i64 t, i64 v,
        float (&acc)[COMBINE_VECS][VEC_BYTES / sizeof(typename Format<FMT>::Bits)]) {
    typedef Format<FMT> F;
    typedef typename F::Bits Bits;
    typedef typename VecOf<VEC_BYTES>::type Vec;
    constexpr int ELEMS = VEC_BYTES / static_cast<int>(sizeof(Bits));
    const int* slots = a.token_topk_to_pos + t * a.top_k;
    const float* weights = a.topk_weights == nullptr ? nullptr : a.topk_weights + t * a.top_k;
    const Vec* rows = reinterpret_cast<const Vec*>(a.expanded) + v;

    for (int k0 = 0; k0 < a.top_k; k0 += COMBINE_SLOT_BATCH) {
        // The batch's slots and weights (independent loads, issued together).
        int pos[COMBINE_SLOT_BATCH];
        float weight[COMBINE_SLOT_BATCH];
#pragma unroll
        for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
            const int k = k0 + j;
            pos[j] = -1;
            weight[j] = 1.0f;
            if (k < a.top_k) {
                const int p = __ldg(slots + k);
                pos[j] = p >= 0 && p < a.num_expanded ? p : -1;
                if (weights != nullptr) weight[j] = __ldg(weights + k);
            }
        }
        // Every used row's vectors in flight before any FMA.
        Vec held[COMBINE_SLOT_BATCH][COMBINE_VECS];
#pragma unroll
        for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
#pragma unroll
            for (int c = 0; c < COMBINE_VECS; ++c) {
                if (pos[j] >= 0 && v + c * a.row_threads < a.row_vecs)
                    held[j][c] = load_once(rows + static_cast<i64>(pos[j]) * a.row_vecs +
                                           c * a.row_threads);
            }
        }
        float scale[COMBINE_SLOT_BATCH];
#pragma unroll
        for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
            scale[j] = weight[j];
            if (a.row_scale != nullptr && pos[j] >= 0) {
                const float row = __ldg(a.row_scale + pos[j]);
                scale[j] = weights != nullptr ? __fmul_rn(weight[j], row) : row;
            }
        }
        // In slot order: the order of the roundings is the result.
#pragma unroll
        for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
            if (pos[j] < 0) continue;
#pragma unroll
            for (int c = 0; c < COMBINE_VECS; ++c) {
                Bits bits[ELEMS];
                memcpy(bits, &held[j][c], sizeof(Vec));
#pragma unroll
                for (int e = 0; e < ELEMS; ++e)
                    acc[c][e] = __fmaf_rn(F::widen(bits[e]), scale[j], acc[c][e]);
            }
        }
    }
}

#if COMBINE_WARP_SLOTS
// The same sums, by a warp that is one token's: lane j holds slot k0 + j's
// row and scale, and the warp walks the live ones only (COMBINE_WARP_SLOTS).
template <int FMT, int VEC_BYTES>
__device__ __forceinline__ void accumulate_live_slots(
        const CombineArgs& a, i64 t, i64 v,
        float (&acc)[COMBINE_VECS][VEC_BYTES / sizeof(typename Format<FMT>::Bits)]) {
    typedef Format<FMT> F;
    typedef typename F::Bits Bits;
    typedef typename VecOf<VEC_BYTES>::type Vec;
    constexpr int ELEMS = VEC_BYTES / static_cast<int>(sizeof(Bits));
    const int* slots = a.token_topk_to_pos + t * a.top_k;
    const float* weights = a.topk_weights == nullptr ? nullptr : a.topk_weights + t * a.top_k;
    const Vec* rows = reinterpret_cast<const Vec*>(a.expanded) + v;

    const int warp_lane = static_cast<int>(threadIdx.x & 31u);
    for (int k0 = 0; k0 < a.top_k; k0 += 32) {
        // lane j: slot k0 + j's row and scale (as below: weight * row_scale)
        const int k = k0 + warp_lane;
        int lane_pos = -1;
        float lane_scale = 1.0f;
        if (k < a.top_k) {
            const int p = __ldg(slots + k);
            lane_pos = p >= 0 && p < a.num_expanded ? p : -1;
            if (weights != nullptr) lane_scale = __ldg(weights + k);
            if (a.row_scale != nullptr && lane_pos >= 0) {
                const float row = __ldg(a.row_scale + lane_pos);
                lane_scale = weights != nullptr ? __fmul_rn(lane_scale, row) : row;
            }
        }
        // the same in every lane: the loop below is uniform across the warp
        unsigned live = __ballot_sync(0xFFFFFFFFu, lane_pos >= 0);
        while (live != 0) {
            // the next COMBINE_SLOT_BATCH live slots, lowest k first
            int pos[COMBINE_SLOT_BATCH];
            float scale[COMBINE_SLOT_BATCH];
#pragma unroll
            for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
                pos[j] = -1;
                scale[j] = 1.0f;
                if (live != 0) {
                    const int source = __ffs(static_cast<int>(live)) - 1;
                    live &= live - 1;
                    pos[j] = __shfl_sync(0xFFFFFFFFu, lane_pos, source);
                    scale[j] = __shfl_sync(0xFFFFFFFFu, lane_scale, source);
                }
            }
            Vec held[COMBINE_SLOT_BATCH][COMBINE_VECS];
#pragma unroll
            for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
#pragma unroll
                for (int c = 0; c < COMBINE_VECS; ++c) {
                    // lanes past the row sum zeros they never store (no test
                    // in the FMA loop: with one, ptxas spilled at 4 vectors and
                    // 4 slots)
                    held[j][c] = Vec();
                    if (pos[j] >= 0 && v + c * a.row_threads < a.row_vecs)
                        held[j][c] = load_once(rows + static_cast<i64>(pos[j]) * a.row_vecs +
                                               c * a.row_threads);
                }
            }
#pragma unroll
            for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
                if (pos[j] < 0) continue;
#pragma unroll
                for (int c = 0; c < COMBINE_VECS; ++c) {
                    Bits bits[ELEMS];
                    memcpy(bits, &held[j][c], sizeof(Vec));
#pragma unroll
                    for (int e = 0; e < ELEMS; ++e)
                        acc[c][e] = __fmaf_rn(F::widen(bits[e]), scale[j], acc[c][e]);
                }
            }
        }
    }
}
#endif

// out[t]'s vectors of this thread: each sum rounded once.
template <int FMT, int VEC_BYTES>
__device__ __forceinline__ void store_row(
        const CombineArgs& a, i64 t, i64 v,
        const float (&acc)[COMBINE_VECS][VEC_BYTES / sizeof(typename Format<FMT>::Bits)]) {
    typedef Format<FMT> F;
    typedef typename F::Bits Bits;
    typedef typename VecOf<VEC_BYTES>::type Vec;
    constexpr int ELEMS = VEC_BYTES / static_cast<int>(sizeof(Bits));
#pragma unroll
    for (int c = 0; c < COMBINE_VECS; ++c) {
        if (v + c * a.row_threads >= a.row_vecs) break;
        Vec* out = out_vectors<FMT, VEC_BYTES>(a, t * a.row_vecs + v + c * a.row_threads);
        if constexpr (OutVecs<FMT>::value == 2) {  // the sums themselves, as float32
            unsigned int wide[ELEMS];
#pragma unroll
            for (int e = 0; e < ELEMS; ++e) wide[e] = Format<FMT_F32>::narrow(acc[c][e]);
            Vec halves[2];
            memcpy(halves, wide, sizeof(halves));
            store_once(out, halves[0]);
            store_once(out + 1, halves[1]);
            continue;
        }
        Vec result;
        if constexpr (FMT == FMT_BF16 && ELEMS % 2 == 0) {
            unsigned int pairs[ELEMS / 2];
#pragma unroll
            for (int e = 0; e < ELEMS; e += 2)
                pairs[e / 2] = F::narrow_pair(acc[c][e], acc[c][e + 1]);
            memcpy(&result, pairs, sizeof(Vec));
        } else {
            Bits bits[ELEMS];
#pragma unroll
            for (int e = 0; e < ELEMS; ++e) bits[e] = F::narrow(acc[c][e]);
            memcpy(&result, bits, sizeof(Vec));
        }
        store_once(out, result);
    }
}

#if COMBINE_STREAM_ROUNDS || COMBINE_BULK_STAGES
// Flat slot `flat`'s row (-1 where dropped or >= X) and scale (weight *
// row_scale, as above; `scale` keeps its value, 1, where a factor is missing).
__device__ __forceinline__ void load_slot(const CombineArgs& a, i64 flat, int& pos,
                                          float& scale) {
    const int p = __ldg(a.token_topk_to_pos + flat);
    pos = p >= 0 && p < a.num_expanded ? p : -1;
    if (a.topk_weights != nullptr) scale = __ldg(a.topk_weights + flat);
    if (a.row_scale != nullptr && pos >= 0) {
        const float row = __ldg(a.row_scale + pos);
        scale = a.topk_weights != nullptr ? __fmul_rn(scale, row) : row;
    }
}

#endif

#if COMBINE_STREAM_ROUNDS
// COMBINE_STREAM_ROUNDS rounds of floor(32 / K) tokens from `first`, their
// live rows as one stream (see COMBINE_STREAM_ROUNDS).
template <int FMT, int VEC_BYTES>
__device__ __forceinline__ void reduce_fused_stream(const CombineArgs& a, i64 first, i64 v) {
    typedef Format<FMT> F;
    typedef typename F::Bits Bits;
    typedef typename VecOf<VEC_BYTES>::type Vec;
    constexpr int ELEMS = VEC_BYTES / static_cast<int>(sizeof(Bits));
    const Vec* rows = reinterpret_cast<const Vec*>(a.expanded) + v;
    const int warp_lane = static_cast<int>(threadIdx.x & 31u);
    const int round_tokens = 32 / a.top_k;
    const int lane_token = warp_lane / a.top_k;  // round_tokens and up: no slot
    const int lane_slot = warp_lane - lane_token * a.top_k;
    // the whole slot mask of one token (K bits)
    const unsigned token_bits = a.top_k == 32 ? 0xFFFFFFFFu : (1u << a.top_k) - 1u;

    float acc[COMBINE_VECS][ELEMS];
#pragma unroll
    for (int c = 0; c < COMBINE_VECS; ++c)
#pragma unroll
        for (int e = 0; e < ELEMS; ++e) acc[c][e] = 0.0f;
    i64 acc_token = -1;  // the token acc sums (none yet)

#pragma unroll 1
    for (int round = 0; round < COMBINE_STREAM_ROUNDS; ++round) {
        const i64 base = first + static_cast<i64>(round) * round_tokens;
        if (base >= a.num_tokens) break;
        // this lane's slot: its row and scale (weight * row_scale, as above)
        int lane_pos = -1;
        float lane_scale = 1.0f;
        if (lane_token < round_tokens && base + lane_token < a.num_tokens)
            load_slot(a, (base + lane_token) * a.top_k + lane_slot, lane_pos, lane_scale);
        // the same in every lane: everything below is uniform across the warp
        unsigned live = __ballot_sync(0xFFFFFFFFu, lane_pos >= 0);
        for (int token = 0; token < round_tokens && base + token < a.num_tokens; ++token) {
            if (((live >> (token * a.top_k)) & token_bits) == 0)
                store_zero_row<FMT, VEC_BYTES>(a, base + token, v);
        }
        while (live != 0) {
            // the next COMBINE_SLOT_BATCH live slots of the round, in (token, k) order
            int pos[COMBINE_SLOT_BATCH];
            float scale[COMBINE_SLOT_BATCH];
            int token_of[COMBINE_SLOT_BATCH];
#pragma unroll
            for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
                pos[j] = -1;
                scale[j] = 1.0f;
                token_of[j] = 0;
                if (live != 0) {
                    const int source = __ffs(static_cast<int>(live)) - 1;
                    live &= live - 1;
                    pos[j] = __shfl_sync(0xFFFFFFFFu, lane_pos, source);
                    scale[j] = __shfl_sync(0xFFFFFFFFu, lane_scale, source);
                    token_of[j] = __shfl_sync(0xFFFFFFFFu, lane_token, source);
                }
            }
            Vec held[COMBINE_SLOT_BATCH][COMBINE_VECS];
#pragma unroll
            for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
#pragma unroll
                for (int c = 0; c < COMBINE_VECS; ++c) {
                    held[j][c] = Vec();  // lanes past the row: zeros, never stored
                    if (pos[j] >= 0 && v + c * a.row_threads < a.row_vecs)
                        held[j][c] = load_once(rows + static_cast<i64>(pos[j]) * a.row_vecs +
                                               c * a.row_threads);
                }
            }
#pragma unroll
            for (int j = 0; j < COMBINE_SLOT_BATCH; ++j) {
                if (pos[j] < 0) continue;
                const i64 t = base + token_of[j];
                if (t != acc_token) {  // the stream moved past acc_token: its row is done
                    if (acc_token >= 0) store_row<FMT, VEC_BYTES>(a, acc_token, v, acc);
#pragma unroll
                    for (int c = 0; c < COMBINE_VECS; ++c)
#pragma unroll
                        for (int e = 0; e < ELEMS; ++e) acc[c][e] = 0.0f;
                    acc_token = t;
                }
#pragma unroll
                for (int c = 0; c < COMBINE_VECS; ++c) {
                    Bits bits[ELEMS];
                    memcpy(bits, &held[j][c], sizeof(Vec));
#pragma unroll
                    for (int e = 0; e < ELEMS; ++e)
                        acc[c][e] = __fmaf_rn(F::widen(bits[e]), scale[j], acc[c][e]);
                }
            }
        }
    }
    if (acc_token >= 0) store_row<FMT, VEC_BYTES>(a, acc_token, v, acc);
}
#endif

#if COMBINE_BULK_STAGES
// One live slot of a bulk block's tokens (the list is in (token, k) order).
struct BulkSlot {
    int pos;      // its row of expanded
    float scale;  // weight * row_scale, as above
    int token;    // the token, counted from the block's first
};

// COMBINE_BULK_ROUNDS groups of row_threads / K tokens from blockIdx.x's,
// column chunk blockIdx.y of row_threads * COMBINE_VECS 16-byte vectors (see
// COMBINE_BULK_STAGES). The dynamic shared memory holds COMBINE_BULK_STAGES
// chunks, a full chunk's bytes apart; each stage has an mbarrier, armed by
// thread 0 for the chunk's bytes each time a load is issued into it. The
// block's chunks are numbered across its rounds: chunk n lands in stage n %
// STAGES and completes that stage's phase n / STAGES, so a wait names parity
// (n / STAGES) & 1. A stage is loaded again only after the block barrier
// that follows every thread's reading of it.
template <int FMT>
__device__ __forceinline__ void reduce_fused_bulk(const CombineArgs& a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    typedef Format<FMT> F;
    typedef typename F::Bits Bits;
    constexpr int ELEMS = 16 / static_cast<int>(sizeof(Bits));
    constexpr int STAGES = COMBINE_BULK_STAGES;
    extern __shared__ __align__(128) unsigned char stages[];
    __shared__ __align__(8) unsigned long long loaded[STAGES];
    __shared__ BulkSlot live_slots[COMBINE_MAX_THREADS];
    __shared__ int warp_live[COMBINE_MAX_THREADS / 32];
    __shared__ unsigned char token_live[COMBINE_MAX_THREADS];

    const int tid = static_cast<int>(threadIdx.x);
    const int warp = tid >> 5, lane = tid & 31;
    const int block_tokens = a.row_threads / a.top_k;
    const i64 stage_vecs = static_cast<i64>(a.row_threads) * COMBINE_VECS;  // a full chunk
    const i64 chunk_begin = static_cast<i64>(blockIdx.y) * stage_vecs;
    const unsigned chunk_bytes =
        static_cast<unsigned>(min(stage_vecs, a.row_vecs - chunk_begin) * 16);
    const unsigned stage_bytes = static_cast<unsigned>(stage_vecs * 16);
    const i64 v = chunk_begin + tid;  // this thread's vectors: v, v + row_threads, ...
    const unsigned char* chunks = static_cast<const unsigned char*>(a.expanded) + chunk_begin * 16;
    const i64 row_bytes = a.row_vecs * 16;
    const unsigned stage_at = shared_address(stages);
    // chunk n of the block (counted across its rounds) into its stage
    const auto load_chunk = [&](int n, int pos) {
        const int s = n % STAGES;
        const unsigned barrier = shared_address(&loaded[s]);
        mbarrier_arrive_expect(barrier, chunk_bytes);
        bulk_load(stage_at + s * stage_bytes, chunks + pos * row_bytes, chunk_bytes, barrier);
    };
    if (tid < STAGES) mbarrier_init(shared_address(&loaded[tid]));
    int taken = 0;  // the block's chunks of its rounds before this one

#pragma unroll 1
    for (int round = 0; round < COMBINE_BULK_ROUNDS; ++round) {
        const i64 first =
            (static_cast<i64>(blockIdx.x) * COMBINE_BULK_ROUNDS + round) * block_tokens;
        if (first >= a.num_tokens) break;  // the same in every thread
        const int tokens =
            static_cast<int>(min(static_cast<i64>(block_tokens), a.num_tokens - first));
        // thread i: the round's flat slot i (token i / K, slot i % K)
        const int token = tid / a.top_k;
        int pos = -1;
        float scale = 1.0f;
        if (token < tokens)
            load_slot(a, (first + token) * a.top_k + (tid - token * a.top_k), pos, scale);
        if (tid < block_tokens) token_live[tid] = 0;
        const unsigned live = __ballot_sync(0xFFFFFFFFu, pos >= 0);
        if (lane == 0) warp_live[warp] = __popc(live);
        __syncthreads();
        // the live slots, listed in flat order: this warp's place after the warps before
        int listed = 0, total = 0;
        for (int w = 0; w < a.row_threads / 32; ++w) {
            if (w < warp) listed += warp_live[w];
            total += warp_live[w];
        }
        if (pos >= 0) {
            live_slots[listed + __popc(live & ((1u << lane) - 1u))] = BulkSlot{pos, scale, token};
            token_live[token] = 1;
        }
        __syncthreads();

        // the round's first chunks: every stage is free (the chunks of the
        // rounds before were all read before their last block barrier)
        if (tid == 0)
            for (int i = 0; i < min(STAGES, total); ++i) load_chunk(taken + i, live_slots[i].pos);
        // rows of the tokens without a live slot while the first chunks land
        for (int t = 0; t < tokens; ++t)
            if (!token_live[t]) store_zero_row<FMT, 16>(a, first + t, v);

        float acc[COMBINE_VECS][ELEMS];
#pragma unroll
        for (int c = 0; c < COMBINE_VECS; ++c)
#pragma unroll
            for (int e = 0; e < ELEMS; ++e) acc[c][e] = 0.0f;
#pragma unroll 1
        for (int i = 0; i < total; ++i) {
            const int n = taken + i, s = n % STAGES;
            mbarrier_wait_parity(shared_address(&loaded[s]),
                                 static_cast<unsigned>(n / STAGES) & 1u);
            const BulkSlot slot = live_slots[i];
            const uint4* stage = reinterpret_cast<const uint4*>(stages + s * stage_bytes);
#pragma unroll
            for (int c = 0; c < COMBINE_VECS; ++c) {
                if (v + c * a.row_threads >= a.row_vecs) break;
                const uint4 held = stage[tid + c * a.row_threads];
                Bits bits[ELEMS];
                memcpy(bits, &held, sizeof(uint4));
#pragma unroll
                for (int e = 0; e < ELEMS; ++e)
                    acc[c][e] = __fmaf_rn(F::widen(bits[e]), slot.scale, acc[c][e]);
            }
            if (i + 1 == total || live_slots[i + 1].token != slot.token) {  // its last slot
                store_row<FMT, 16>(a, first + slot.token, v, acc);
#pragma unroll
                for (int c = 0; c < COMBINE_VECS; ++c)
#pragma unroll
                    for (int e = 0; e < ELEMS; ++e) acc[c][e] = 0.0f;
            }
            __syncthreads();  // every thread is done with stage s: load it again
            if (tid == 0 && i + STAGES < total) load_chunk(n + STAGES, live_slots[i + STAGES].pos);
        }
        // No barrier before the next round rewrites the flags, counts and
        // list: every thread read this round's list and flags before the
        // chunk loop's last barrier (or, with no live slot, found every flag
        // 0, which is what the next round writes first), and the next round
        // writes the list only after a barrier of its own.
        taken += total;
    }
#else
    __trap();  // the host launches bulk shapes on sm_90 and newer only
#endif
}
#endif

#if COMBINE_TOKEN_ROWS
// The sums of token t's vectors of this thread from its K slots' positions
// (-1: none) and scales, each in k order from +0, rounded once and stored;
// rows loaded under hint LOAD_HINT.
template <int FMT, int VEC_BYTES, int LOAD_HINT>
__device__ __forceinline__ void sum_token_slots(const CombineArgs& a, i64 t, i64 v,
                                                const int (&pos)[COMBINE_TOKEN_ROWS],
                                                const float (&scale)[COMBINE_TOKEN_ROWS]) {
    typedef Format<FMT> F;
    typedef typename F::Bits Bits;
    typedef typename VecOf<VEC_BYTES>::type Vec;
    constexpr int K = COMBINE_TOKEN_ROWS;
    constexpr int ELEMS = VEC_BYTES / static_cast<int>(sizeof(Bits));
    const Vec* rows = reinterpret_cast<const Vec*>(a.expanded) + v;
    float acc[COMBINE_VECS][ELEMS];
#pragma unroll
    for (int c = 0; c < COMBINE_VECS; ++c)
#pragma unroll
        for (int e = 0; e < ELEMS; ++e) acc[c][e] = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        if (pos[k] < 0) continue;
        Vec held[COMBINE_VECS];
#pragma unroll
        for (int c = 0; c < COMBINE_VECS; ++c) {
            held[c] = Vec();
            if (COMBINE_FULL_ROWS || v + c * a.row_threads < a.row_vecs)
                held[c] = load_hinted<LOAD_HINT>(rows + static_cast<i64>(pos[k]) * a.row_vecs +
                                                 c * a.row_threads);
        }
        // the row's scale after its row loads, so that both are in flight
        // together (loaded before them, each slot's scale cost the token a
        // latency of its own before its first row load)
        float s = scale[k];
        if (a.row_scale != nullptr) {
            const float row = __ldg(a.row_scale + pos[k]);
            s = a.topk_weights != nullptr ? __fmul_rn(s, row) : row;
        }
#pragma unroll
        for (int c = 0; c < COMBINE_VECS; ++c) {
            Bits bits[ELEMS];
            memcpy(bits, &held[c], sizeof(Vec));
#pragma unroll
            for (int e = 0; e < ELEMS; ++e)
                acc[c][e] = __fmaf_rn(F::widen(bits[e]), s, acc[c][e]);
        }
    }
    store_row<FMT, VEC_BYTES>(a, t, v, acc);
}

// Token t's vectors of this thread (COMBINE_TOKEN_ROWS above): the same sums
// as accumulate_slot_batches + store_row, each in k order from +0, rounded once.
template <int FMT, int VEC_BYTES>
__device__ __forceinline__ void reduce_token_row(const CombineArgs& a, i64 t, i64 v) {
    constexpr int K = COMBINE_TOKEN_ROWS;
    const int* slots = a.token_topk_to_pos + t * K;
    int pos[K];
    float scale[K];
    int live = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int p = __ldg(slots + k);
        pos[k] = p >= 0 && p < a.num_expanded ? p : -1;
        live += pos[k] >= 0;
        scale[k] = a.topk_weights == nullptr ? 1.0f : __ldg(a.topk_weights + t * K + k);
    }
    if (live == 0) {
        store_zero_row<FMT, VEC_BYTES>(a, t, v);
        return;
    }
#if COMBINE_FEW_LIVE_LOAD_HINT >= 0 && COMBINE_FEW_LIVE_LOAD_HINT != VECTOR_LOAD_HINT
    if (2 * live <= K) {
        sum_token_slots<FMT, VEC_BYTES, COMBINE_FEW_LIVE_LOAD_HINT>(a, t, v, pos, scale);
        return;
    }
#endif
    sum_token_slots<FMT, VEC_BYTES, VECTOR_LOAD_HINT>(a, t, v, pos, scale);
}
#endif

template <int FMT, int VEC_BYTES>
__device__ __forceinline__ void reduce_fused_body(const CombineArgs& a) {
    constexpr int ELEMS = VEC_BYTES / static_cast<int>(sizeof(typename Format<FMT>::Bits));
    static_assert(ELEMS >= 1, "a vector holds at least one element");
#if COMBINE_BULK_STAGES
    // a block's threads share its tokens' live rows (reduce_fused_bulk)
    if constexpr (VEC_BYTES == 16) reduce_fused_bulk<FMT>(a);
    else __trap();  // the host launches bulk shapes on 16-byte rows only
#else
    const int group = threadIdx.x / a.row_threads;
    const int lane = threadIdx.x - group * a.row_threads;
    // this thread's vectors: v, v + row_threads, ... (COMBINE_VECS of them)
    const i64 v = static_cast<i64>(blockIdx.y) * a.row_threads * COMBINE_VECS + lane;
#if COMBINE_TOKEN_ROWS
    const i64 t = static_cast<i64>(blockIdx.x) * a.tokens_per_block + group;
    if (t >= a.num_tokens || v >= a.row_vecs) return;
    reduce_token_row<FMT, VEC_BYTES>(a, t, v);
#elif COMBINE_STREAM_ROUNDS
    // whole warps: lanes past the row take part in the shuffles
    reduce_fused_stream<FMT, VEC_BYTES>(
        a, (static_cast<i64>(blockIdx.x) * a.tokens_per_block + group) * (32 / a.top_k) *
               COMBINE_STREAM_ROUNDS, v);
#elif COMBINE_WARP_SLOTS
    // COMBINE_WARP_TOKENS consecutive tokens a warp, one after the other (the
    // next token's slots are mostly in the cache line just read). Whole warps
    // return: lanes past the row take part in the shuffles.
    const i64 first = (static_cast<i64>(blockIdx.x) * a.tokens_per_block + group) *
                      COMBINE_WARP_TOKENS;
#pragma unroll 1
    for (int i = 0; i < COMBINE_WARP_TOKENS; ++i) {
        const i64 t = first + i;
        if (t >= a.num_tokens) return;
        float acc[COMBINE_VECS][ELEMS];
#pragma unroll
        for (int c = 0; c < COMBINE_VECS; ++c)
#pragma unroll
            for (int e = 0; e < ELEMS; ++e) acc[c][e] = 0.0f;
        accumulate_live_slots<FMT, VEC_BYTES>(a, t, v, acc);
        store_row<FMT, VEC_BYTES>(a, t, v, acc);
    }
#else
    const i64 t = static_cast<i64>(blockIdx.x) * a.tokens_per_block + group;
    if (t >= a.num_tokens || v >= a.row_vecs) return;
    float acc[COMBINE_VECS][ELEMS];
#pragma unroll
    for (int c = 0; c < COMBINE_VECS; ++c)
#pragma unroll
        for (int e = 0; e < ELEMS; ++e) acc[c][e] = 0.0f;
    accumulate_slot_batches<FMT, VEC_BYTES>(a, t, v, acc);
    store_row<FMT, VEC_BYTES>(a, t, v, acc);
#endif
#endif
}

#define DEFINE_REDUCE_FUSED_KERNEL(NAME, FMT, VEC_BYTES)                             \
    extern "C" __global__ void __launch_bounds__(COMBINE_MAX_THREADS, COMBINE_MIN_BLOCKS) \
    reduce_fused_##NAME##_v##VEC_BYTES(const CombineArgs args) {                     \
        reduce_fused_body<FMT, VEC_BYTES>(args);                                     \
    }

// The reduce_fused kernels a module holds: a plan's holds the one it launches
// (cupy_moe/combine/gpu.py: COMBINE_ONE_FORMAT, its FMT_* + 1, and
// COMBINE_ONE_VEC, its access bytes), so that NVRTC compiles one kernel where
// the file has 11 (a token_rows variant with K = 32 compiled in took 5-10 s
// for all of them). 0, the default: every one (the compile tests); a format
// of -1: none (the validate kernel below, which every module holds, alone).
#ifndef COMBINE_ONE_FORMAT
#define COMBINE_ONE_FORMAT 0
#endif
#ifndef COMBINE_ONE_VEC
#define COMBINE_ONE_VEC 0
#endif
#define COMBINE_HOLDS(FMT, VEC_BYTES)                                                \
    ((COMBINE_ONE_FORMAT == 0 || COMBINE_ONE_FORMAT == (FMT) + 1) &&                 \
     (COMBINE_ONE_VEC == 0 || COMBINE_ONE_VEC == (VEC_BYTES)))

#if COMBINE_HOLDS(FMT_F32, 16)
DEFINE_REDUCE_FUSED_KERNEL(f32, FMT_F32, 16)
#endif
#if COMBINE_HOLDS(FMT_F32, 8)
DEFINE_REDUCE_FUSED_KERNEL(f32, FMT_F32, 8)
#endif
#if COMBINE_HOLDS(FMT_F32, 4)
DEFINE_REDUCE_FUSED_KERNEL(f32, FMT_F32, 4)
#endif
#if COMBINE_HOLDS(FMT_BF16, 16)
DEFINE_REDUCE_FUSED_KERNEL(bf16, FMT_BF16, 16)
#endif
#if COMBINE_HOLDS(FMT_BF16, 8)
DEFINE_REDUCE_FUSED_KERNEL(bf16, FMT_BF16, 8)
#endif
#if COMBINE_HOLDS(FMT_BF16, 4)
DEFINE_REDUCE_FUSED_KERNEL(bf16, FMT_BF16, 4)
#endif
#if COMBINE_HOLDS(FMT_BF16, 2)
DEFINE_REDUCE_FUSED_KERNEL(bf16, FMT_BF16, 2)
#endif
#if COMBINE_HOLDS(FMT_F16, 16)
DEFINE_REDUCE_FUSED_KERNEL(f16, FMT_F16, 16)
#endif
#if COMBINE_HOLDS(FMT_F16, 8)
DEFINE_REDUCE_FUSED_KERNEL(f16, FMT_F16, 8)
#endif
#if COMBINE_HOLDS(FMT_F16, 4)
DEFINE_REDUCE_FUSED_KERNEL(f16, FMT_F16, 4)
#endif
#if COMBINE_HOLDS(FMT_F16, 2)
DEFINE_REDUCE_FUSED_KERNEL(f16, FMT_F16, 2)
#endif

// ---------------------------------------------------------------------------
// validate=True: the first flat slot whose row is >= X. *found starts at
// COMBINE_NONE (every byte 0x7F: the host sets it with one memset).

#define COMBINE_NONE 0x7F7F7F7F7F7F7F7FLL

struct CombineCheckArgs {
    const int* token_topk_to_pos;  // [T * K]
    long long* found;              // [1]
    i64 num_slots;                 // T * K
    i64 num_expanded;              // X
};

extern "C" __global__ void reduce_fused_first_out_of_range(const CombineCheckArgs a) {
    const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
    for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < a.num_slots;
         i += stride) {
        if (a.token_topk_to_pos[i] >= a.num_expanded) atomicMin(a.found, i);
    }
}
