// Per-token, per-block fp8 (e4m3) quantization, and SwiGLU fused with it.
//
//   quantize_fp8_*:        out[r] = e4m3(x[r] * scale), x [R, H]
//   swiglu_quantize_fp8_*: out[r] = e4m3(act[r] * scale), act = (silu(gate) *
//                          up) * weight of h[r] = [gate | up] ([R, 2H]); rows
//                          with pos_to_expert < 0, or (with weights) a slot
//                          outside [0, T*K), are padding: zero codes, zero
//                          scale factors (zero_padding off: not written, but
//                          for the SF pad columns), their inputs never read.
// Each row is cut into blocks of npc (32 or 128) columns, each with its own
// scale factor. quantize_e4m3.cuh and quantize_exp.cuh hold the arithmetic;
// the NumPy oracle (cupy_moe/quantize/) does the same, bit for bit.
//
// Three layouts of the work, one per kernel (the host picks per call):
//
// *_vec: H % npc == 0, input 16-byte and output 16-byte aligned. The [R, H]
//   output is cut into 16-byte input chunks (8 bf16 or 4 float32 columns,
//   never across rows: H % 32 == 0) numbered row after row; warp w takes the
//   32 * LOADS chunks from 32 * LOADS * w on, lane l the chunks 32 * k + l of
//   them (k < LOADS = 32 columns / chunk): every load instruction of a warp
//   reads 512 contiguous bytes, every store writes contiguous codes. A block
//   (npc / chunk columns consecutive chunks, aligned) is held by an aligned
//   group of lanes in one instruction k: its amax is an xor-shuffle reduction
//   over the group; lane j < LOADS of a group computes the scale of
//   instruction j's block (one division pair per lane; round_sf: a division
//   and the exponent's inverse), hands it to the group
//   by shuffles and stores that block's scale factor. SwiGLU finds each
//   chunk's row (and its maps and weight) per chunk.
// *_vec1: *_vec with one chunk a lane (8 bf16 or 4 float32 columns, LOADS
//   = 1), for calls with few live rows (decode): a live row's warps are
//   then the kernel's critical path, and a lane's arithmetic over 32
//   columns most of it (quantize_fp8: for every scale-factor layout, where
//   the call has few columns an SM).
// swiglu_quantize_fp8_*_block_rows: the same conditions, for the same calls
//   where their codes reach 1 MiB (QuantizeTuning.block_rows_from_bytes:
//   Kimi-K2's decode plan, X = 1024, I = 2048, 3.13 -> 2.69 us a call in a
//   graph; at 0.75 MiB *_vec1 stayed ahead by 0.1-0.2 us): block b takes
//   rows [b R, b R + R) (R =
//   block_rows <= 32) whole. Its warps read the rows' maps (lane i row i)
//   and agree by a ballot which are live; the block's threads take each
//   live row in turn, one 16-byte chunk a thread as in *_vec1 (a block of
//   at least the row's chunks, up to 1024 threads), and zero the padding
//   rows' codes (16-byte stores across the rows) and scale factors while
//   the first live chunk's loads are in flight (or alone). So
//   about one block an SM covers X rows of padding (*_vec1: a warp every
//   256 or 512 columns, thousands of blocks at decode) while a live row
//   keeps *_vec1's short per-lane chain.
// swiglu_quantize_fp8_*_rows: the same conditions and H % 1024 == 0; the
//   same chunks, lanes and groups, but row-major: segment s is the output
//   columns [1024 p, 1024 p + 1024) of row s / passes (p = s % passes,
//   passes = H / 1024), and warp w takes segment w. The row's maps and weight
//   are read once per segment, a padding row's segment stores zeros without
//   loading h, and every address is the row's base plus 32-bit offsets:
//   SwiGLU is bound by instruction issue, and this spends ~5 fewer an element
//   on indexing (Kimi-K2, I = 2048: 75 -> 79% of the copy).
// swiglu_quantize_fp8_*_rows768: *_rows with 768-column segments, a lane 3
//   of its 4 chunks (H % 768 == 0, H % 1024 != 0: Qwen3's I = 768, a warp a
//   row): 45 registers against *_rows' 60, 40 warps an SM, and Qwen3 prefill
//   70.6 -> 81.9% of the copy against *_vec (benchmarks/NOTES.md,
//   seventeenth session).
// swiglu_quantize_fp8_*_rows512 / *_rows256: *_rows with 512- / 256-column
//   segments, a lane 2 / 1 of its 4 chunks (H % 512 or 256 == 0). 512 is
//   the default where H % 512 == 0 (bf16: 40 registers against 63, twice
//   the warps, half the chain each: DeepSeek-V3 EP8 prefill 77.9 -> 81.9%
//   of the copy); the calls that zero-fill many padding rows keep *_rows
//   (QuantizeTuning.fill_segment_columns). 256 is a sweep option (it lost),
//   compiled only with QUANTIZE_ROWS256.
//   (A warp a whole row of 1024-column segments,
//   *_rows_whole, with an L2 prefetch of the row ahead, lost to *_rows once
//   *_rows had its unrolled butterflies, and was removed.)
// quantize_fp8_*_tiles: *_vec's conditions and H % 128 == 0, for
//   column-major scale factors, float32 (QuantizeTuning.sf_column_tiles) or
//   packed UE8M0 (QuantizeTuning.packed_sf_tiles: Kimi-K2 prefill with
//   32-column blocks 84.1 -> 88.2%, nineteenth session): a
//   warp takes an 8-row x 128-column tile, a lane a 16-byte chunk of one of
//   its rows in each of its loads (bf16: two rows an instruction, 16 lanes
//   each; float32: one row, 32 lanes), so that the lanes holding the scale
//   factors of one block column hold its 8 rows: one 32-byte store, where
//   *_vec's warp (1024 columns of one row) stores 8 columns' floats, one
//   sector each (ncu on Kimi-K2 prefill: 298k more L2 write requests than
//   row-major, 1.3 us; Kimi-K2 prefill 83.9 -> 88.8% of the copy with it,
//   eighteenth session). Tile t is column tile t % passes of row group t /
//   passes.
// swiglu_quantize_fp8_*_{vec,vec1,rows,rows768}_slots: the same kernels
//   over the T * K slots instead of the R rows, for calls that pass
//   token_topk_to_pos (slot_to_row) with zero_padding off
//   (QuantizeTuning.by_slot_from_rows_per_slot): slot s's work is row
//   slot_to_row[s], weighted by topk_weights[s], where that row is in [0,
//   R); a dropped slot's warps write nothing, padding rows are never
//   visited, and block 0 zeroes the column-major SF pad columns. A sparse
//   plan's cost is then its slots', not its X rows' maps (Qwen3, T = 32:
//   256 slots for 14,848 rows).
// *_any: every H and alignment. A lane takes 32 consecutive columns of one
//   row (element accesses), npc / 32 lanes one block; a row is lanes_per_row
//   = S * npc / 32 lanes, the grid's lanes row after row (a warp may end one
//   row and start the next). The group's first lane stores the scale factor.
//
// A row is found by a multiply-shift with a host-computed magic number (no
// division): *_vec divides a block index by S, *_rows a segment index by
// passes, *_any a lane index by lanes_per_row, all below 2^31. Packed UE8M0
// scale factors are stored as bytes (byte b % 4 of word b / 4; the last
// block of a row also zeroes the missing blocks' bytes of its word: in a
// loop, or with QUANTIZE_PACKED_WORD_STORES in one 2- or 4-byte store with
// its own byte), so no block needs another's. Row R-1's scale factors also zero the column-major
// SF's pad columns R .. sf_ld (quantize_fp8's *_vec1 and *_tiles, packed: a
// whole word each, by the word's first block).
// *_bf16 / *_f32: the input dtype. Offsets are 64-bit; nothing is written
// outside the outputs.

#include "vector_access.cuh"
#include "quantize_e4m3.cuh"
#include "quantize_exp.cuh"

#define QUANT_LANE_COLS 32   // columns a lane quantizes (both kernels)
#define QUANT_MAX_THREADS 256

// Blocks an SM should hold of the *_rows kernels (0: the compiler's choice):
// a register budget for more warps in flight (cupy_moe/quantize/launch_shape.py,
// QuantizeTuning.rows_min_blocks).
#ifndef QUANTIZE_ROWS_MIN_BLOCKS
#define QUANTIZE_ROWS_MIN_BLOCKS 0
#endif
// 1: a packed UE8M0 row's last block stores its byte and the missing
// blocks' zero bytes in one aligned store (QuantizeTuning.packed_sf_word_stores;
// built in the eighteenth session without a device, off until measured).
#ifndef QUANTIZE_PACKED_WORD_STORES
#define QUANTIZE_PACKED_WORD_STORES 0
#endif
// quantize_fp8's *_vec1 / *_tiles, packed UE8M0: a block's byte without
// store_scale_factor's loop over rows, and row R-1's pad-column words whole,
// by each word's first block (store_packed_sf_pad_words;
// QuantizeTuning.vec1_packed_pad_words / tiles_packed_pad_words). 0:
// store_scale_factor, as every other kernel.
#ifndef QUANTIZE_VEC1_PACKED_PAD_WORDS
#define QUANTIZE_VEC1_PACKED_PAD_WORDS 1
#endif
#ifndef QUANTIZE_TILES_PACKED_PAD_WORDS
#define QUANTIZE_TILES_PACKED_PAD_WORDS 1
#endif
// 1: every kernel's packed UE8M0 store (store_scale_factor) as
// store_packed_sf_pad_words, before QUANTIZE_PACKED_WORD_STORES
// (QuantizeTuning.packed_sf_pad_words; a sweep option, off: it slowed
// SwiGLU's column-major calls up to 4%, thirty-sixth session).
#ifndef QUANTIZE_PACKED_SF_PAD_WORDS
#define QUANTIZE_PACKED_SF_PAD_WORDS 0
#endif
// 1: the *_rows256 kernels too (a tuning whose segment widths name 256)
#ifndef QUANTIZE_ROWS256
#define QUANTIZE_ROWS256 0
#endif
// Which kernels the module holds, as bit masks: QUANTIZE_OPS 1 quantize_fp8,
// 2 swiglu_quantize_fp8; QUANTIZE_INPUTS 1 bfloat16, 2 float32. A plan asks
// for its own op and input dtype only (cupy_moe/quantize/gpu.py), and of
// those the one kernel it launches (QUANTIZE_KERNELS, below), so that an op's
// first call in a fresh kernel cache waits for that kernel's compile alone.
// Default: all of them (the compile tests). The self-test kernels are in
// every module; QUANTIZE_OPS=0 gives them alone (the GPU tests that run them).
#ifndef QUANTIZE_OPS
#define QUANTIZE_OPS 3
#endif
#ifndef QUANTIZE_INPUTS
#define QUANTIZE_INPUTS 3
#endif
// QUANTIZE_KERNELS: which kernels of those ops and dtypes, a bit a kernel
// form in the order of cupy_moe/quantize/gpu.py's KERNEL_FORMS (bit 0 *_vec,
// 1 *_vec1, 2 *_any, ...; default: all). A plan asks for the one kernel it
// launches (its element-access *_any twin, for misaligned pointers, is a
// module of its own, compiled at the first such call): swiglu's module then
// compiles one kernel of its twelve, ~0.25 s of NVRTC where the twelve take
// ~2 s (this machine's NVRTC 12.9).
#ifndef QUANTIZE_KERNELS
#define QUANTIZE_KERNELS 0x7FFF
#endif
#if QUANTIZE_KERNELS & (1 << 0)
#define QUANT_KEEP_vec(...) __VA_ARGS__
#else
#define QUANT_KEEP_vec(...)
#endif
#if QUANTIZE_KERNELS & (1 << 1)
#define QUANT_KEEP_vec1(...) __VA_ARGS__
#else
#define QUANT_KEEP_vec1(...)
#endif
#if QUANTIZE_KERNELS & (1 << 2)
#define QUANT_KEEP_any(...) __VA_ARGS__
#else
#define QUANT_KEEP_any(...)
#endif
#if QUANTIZE_KERNELS & (1 << 3)
#define QUANT_KEEP_tiles(...) __VA_ARGS__
#else
#define QUANT_KEEP_tiles(...)
#endif
#if QUANTIZE_KERNELS & (1 << 4)
#define QUANT_KEEP_block_rows(...) __VA_ARGS__
#else
#define QUANT_KEEP_block_rows(...)
#endif
#if QUANTIZE_KERNELS & (1 << 5)
#define QUANT_KEEP_rows(...) __VA_ARGS__
#else
#define QUANT_KEEP_rows(...)
#endif
#if QUANTIZE_KERNELS & (1 << 6)
#define QUANT_KEEP_rows768(...) __VA_ARGS__
#else
#define QUANT_KEEP_rows768(...)
#endif
#if QUANTIZE_KERNELS & (1 << 7)
#define QUANT_KEEP_rows512(...) __VA_ARGS__
#else
#define QUANT_KEEP_rows512(...)
#endif
#if QUANTIZE_KERNELS & (1 << 8)
#define QUANT_KEEP_rows256(...) __VA_ARGS__
#else
#define QUANT_KEEP_rows256(...)
#endif
#if QUANTIZE_KERNELS & (1 << 9)
#define QUANT_KEEP_vec_slots(...) __VA_ARGS__
#else
#define QUANT_KEEP_vec_slots(...)
#endif
#if QUANTIZE_KERNELS & (1 << 10)
#define QUANT_KEEP_vec1_slots(...) __VA_ARGS__
#else
#define QUANT_KEEP_vec1_slots(...)
#endif
#if QUANTIZE_KERNELS & (1 << 11)
#define QUANT_KEEP_rows_slots(...) __VA_ARGS__
#else
#define QUANT_KEEP_rows_slots(...)
#endif
#if QUANTIZE_KERNELS & (1 << 12)
#define QUANT_KEEP_rows768_slots(...) __VA_ARGS__
#else
#define QUANT_KEEP_rows768_slots(...)
#endif
#if QUANTIZE_KERNELS & (1 << 13)
#define QUANT_KEEP_rows512_slots(...) __VA_ARGS__
#else
#define QUANT_KEEP_rows512_slots(...)
#endif
#if QUANTIZE_KERNELS & (1 << 14)
#define QUANT_KEEP_rows256_slots(...) __VA_ARGS__
#else
#define QUANT_KEEP_rows256_slots(...)
#endif
#if QUANTIZE_ROWS_MIN_BLOCKS > 0
#define QUANT_ROWS_BOUNDS __launch_bounds__(QUANT_MAX_THREADS, QUANTIZE_ROWS_MIN_BLOCKS)
#else
#define QUANT_ROWS_BOUNDS __launch_bounds__(QUANT_MAX_THREADS)
#endif
// bf16 *_rows768: five 256-thread blocks an SM (48 registers at most; it
// takes 45), as QUANTIZE_ROWS_MIN_BLOCKS=5 gives it: Qwen3 prefill +1.3 to
// +1.8 points of the copy against the compiler's choice, where *_rows lost
// 2-2.5 with it (benchmarks/NOTES.md, seventeenth session). float32's keeps
// the compiler's choice (the bound spills it; not measured).
#define QUANT_ROWS768_BOUNDS_bf16 __launch_bounds__(QUANT_MAX_THREADS, 5)
#define QUANT_ROWS768_BOUNDS_f32 QUANT_ROWS_BOUNDS
#define QUANT_FULL_MASK 0xFFFFFFFFu

#define SF_ROW_MAJOR_F32 0
#define SF_COL_MAJOR_F32 1
#define SF_COL_MAJOR_UE8M0 2

// The argument block, passed by value; cupy_moe/quantize/gpu.py packs it field
// for field (QUANTIZE_ARGS), in this order.
struct QuantizeArgs {
    const void* x;                 // [R, H] (quantize) or [R, 2H] (swiglu), bf16 bits or f32
    unsigned char* out;            // [R, H] e4m3 codes
    void* out_sf;                  // f32 [R, S] / f32 [S, sf_ld] / int32 [ceil(S/4), sf_ld]
    const float* topk_weights;     // [num_weights], or null
    const int* pos_to_token_topk;  // [R], or null (null exactly when topk_weights is)
    const int* pos_to_expert;      // [R], or null
    const int* slot_to_row;        // *_slots: [T * K] token_topk_to_pos (row of each slot)
    i64 num_rows;                  // R
    i64 num_weights;               // T * K (with weights; *_slots: the slots it visits)
    i64 row_magic;                 // *_any: row of lane l = (l * row_magic) >> row_shift
    i64 block_magic;               // *_vec: row of block b = (b * block_magic) >> block_shift
    i64 pass_magic;                // *_rows: row of warp w = (w * pass_magic) >> pass_shift
    int hidden;                    // H: columns of out
    int sf_blocks;                 // S = ceil(H / npc)
    int sf_ld;                     // align(R, 4): leading dim of the column-major buffer
    int group_log2;                // log2(npc / 32): lanes per block in *_any
    int lanes_per_row;             // *_any: S * npc / 32
    int row_shift;
    int block_shift;
    int pass_shift;
    int passes;                    // *_rows: warps per row, H / 1024
    int sf_layout;                 // SF_ROW_MAJOR_F32, SF_COL_MAJOR_F32, SF_COL_MAJOR_UE8M0
    int round_sf;                  // 1: power-of-two scale factors
    int block_rows;                // *_block_rows: rows a block, 1 .. 32
    int zero_padding;              // swiglu: 1: padding rows get zero codes and SF; 0: not written
};

__device__ __forceinline__ unsigned magic_divide(unsigned n, i64 magic, int shift) {
    return static_cast<unsigned>((static_cast<unsigned long long>(n) *
                                  static_cast<unsigned long long>(magic)) >> shift);
}

__device__ __forceinline__ float bf16_low(unsigned pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_high(unsigned pair) {
    return __uint_as_float(pair & 0xFFFF0000u);
}

// Whether row `row` is a padding row, and its weight (1 without weights: x * 1
// is x, the bits of no multiply). Only for active lanes.
__device__ __forceinline__ bool swiglu_row(const QuantizeArgs& a, i64 row, float& weight) {
    weight = 1.0f;
    const bool weighted = a.topk_weights != nullptr;
    const int expert = a.pos_to_expert != nullptr ? __ldg(a.pos_to_expert + row) : 0;
    const int slot = weighted ? __ldg(a.pos_to_token_topk + row) : 0;
    const bool padding = expert < 0 || (weighted && (slot < 0 || slot >= a.num_weights));
    if (weighted && !padding) weight = __ldg(a.topk_weights + slot);
    return padding;
}

#if QUANTIZE_PACKED_WORD_STORES
// Byte `first` of a packed word and, when zero_after > 0 (the row's last
// block), the zero bytes above it, in aligned stores: 4 bytes (first 0), a
// byte and 2 (first 1), 2 (first 2: the byte and one zero).
__device__ __forceinline__ void store_packed_byte(unsigned char* word, int first,
                                                  unsigned char byte, int zero_after) {
    if (zero_after == 0) {
        word[first] = byte;
    } else if (first == 0) {
        *reinterpret_cast<unsigned*>(word) = byte;
    } else if (first == 1) {
        word[1] = byte;
        *reinterpret_cast<unsigned short*>(word + 2) = 0;
    } else {
        *reinterpret_cast<unsigned short*>(word + 2) = byte;
    }
}
#endif

// Packed UE8M0: the pad-column words R .. sf_ld (at most 3) of the word
// column `words`, zero, given row = R-1.
__device__ __forceinline__ void zero_packed_pad_words(unsigned* words, i64 row, i64 sf_ld) {
#pragma unroll
    for (int pad = 1; pad < 4; ++pad)
        if (row + pad < sf_ld) words[row + pad] = 0u;
}

// Packed UE8M0, block `block` of row `row`: its exponent byte and (the
// row's last block) the zero bytes after it; row R-1's pad-column words (at
// most 3) whole, by each word's first block, where store_scale_factor's
// default has every block store its byte of each in a loop over rows: at
// T = 1 that loop was 0.17 us of a 1.84 us call (thirty-sixth session, H100,
// a CUDA graph). quantize_fp8's *_vec1 and *_tiles call it directly, every
// kernel through store_scale_factor with QUANTIZE_PACKED_SF_PAD_WORDS.
__device__ __forceinline__ void store_packed_sf_pad_words(const QuantizeArgs& a, i64 row,
                                                          int block, float sf) {
    unsigned* column = static_cast<unsigned*>(a.out_sf) + static_cast<i64>(block >> 2) * a.sf_ld;
    unsigned char* word = reinterpret_cast<unsigned char*>(column + row);
    // sf is a power of two or +inf (round_sf): its exponent byte, 0xFF for inf
    word[block & 3] = static_cast<unsigned char>(__float_as_uint(sf) >> 23);
    if (block == a.sf_blocks - 1)
        for (int j = (block & 3) + 1; j < 4; ++j) word[j] = 0;
    if ((block & 3) == 0 && row == a.num_rows - 1) zero_packed_pad_words(column, row, a.sf_ld);
}

// Block `block` of row `row`: its scale factor sf (0 for a padding row) in
// the layout; row R-1 also zeroes the column-major pad columns R .. sf_ld.
// Without own_row, only those pad columns (a padding row R-1 that is not
// written: zero_padding off).
__device__ __forceinline__ void store_scale_factor(const QuantizeArgs& a, i64 row, int block,
                                                   float sf, bool padding, bool own_row = true) {
    const bool last_row = row == a.num_rows - 1;
    if (a.sf_layout == SF_ROW_MAJOR_F32) {
        if (own_row) static_cast<float*>(a.out_sf)[row * a.sf_blocks + block] = padding ? 0.0f : sf;
        return;
    }
    if (a.sf_layout == SF_COL_MAJOR_F32) {
        float* column = static_cast<float*>(a.out_sf) + static_cast<i64>(block) * a.sf_ld;
        if (own_row) column[row] = padding ? 0.0f : sf;
        if (last_row) {  // at most 3 pad columns
            for (int pad = 1; pad < 4; ++pad)
                if (row + pad < a.sf_ld) column[row + pad] = 0.0f;
        }
        return;
    }
#if QUANTIZE_PACKED_SF_PAD_WORDS
    if (own_row) {
        store_packed_sf_pad_words(a, row, block, padding ? 0.0f : sf);
    } else if (last_row && (block & 3) == 0) {  // the pad words alone, by each word's first block
        zero_packed_pad_words(
            static_cast<unsigned*>(a.out_sf) + static_cast<i64>(block >> 2) * a.sf_ld, row,
            a.sf_ld);
    }
    return;
#endif
    // packed UE8M0: sf's exponent byte (sf is a power of two, or +inf: 0xFF)
    const unsigned char byte = padding ? 0 : static_cast<unsigned char>(__float_as_uint(sf) >> 23);
    const int zero_bytes_after = block == a.sf_blocks - 1 ? 3 - (block & 3) : 0;
    unsigned char* column =
        static_cast<unsigned char*>(a.out_sf) + static_cast<i64>(block >> 2) * a.sf_ld * 4;
#if QUANTIZE_PACKED_WORD_STORES
    if (own_row) store_packed_byte(column + row * 4, block & 3, byte, zero_bytes_after);
    if (last_row)  // row R-1 only: the pad columns' words
        for (i64 r = row + 1; r < a.sf_ld; ++r)
            store_packed_byte(column + r * 4, block & 3, 0, zero_bytes_after);
#else
    const i64 end = last_row ? a.sf_ld : row + 1;
    for (i64 r = own_row ? row : row + 1; r < end; ++r) {
        unsigned char* word = column + r * 4;
        word[block & 3] = r == row ? byte : 0;
        for (int j = 1; j <= zero_bytes_after; ++j) word[(block & 3) + j] = 0;
    }
#endif
}

// A padding row's block `block`: zero scale factor, or with zero_padding
// off nothing but the pad columns that row R-1 owns.
__device__ __forceinline__ void store_padding_scale_factor(const QuantizeArgs& a, i64 row,
                                                           int block) {
    if (a.zero_padding)
        store_scale_factor(a, row, block, 0.0f, true);
    else if (row == a.num_rows - 1)
        store_scale_factor(a, row, block, 0.0f, true, false);
}

// The column-major SF pad columns R .. sf_ld of every block column (4-byte
// elements: float32, or packed words), by the calling block's threads. The
// *_slots kernels call it from block 0: their warps visit the slots' rows,
// which need not include row R-1, the pad columns' owner elsewhere.
__device__ __forceinline__ void zero_sf_pad_columns(const QuantizeArgs& a) {
    if (a.sf_layout == SF_ROW_MAJOR_F32) return;
    const int pad = static_cast<int>(a.sf_ld - a.num_rows);  // 0 .. 3
    const int columns = a.sf_layout == SF_COL_MAJOR_F32 ? a.sf_blocks : (a.sf_blocks + 3) >> 2;
    for (int i = static_cast<int>(threadIdx.x); i < pad * columns;
         i += static_cast<int>(blockDim.x)) {
        const int column = i / pad;
        static_cast<unsigned*>(a.out_sf)[static_cast<i64>(column) * a.sf_ld + a.num_rows +
                                         (i - column * pad)] = 0u;
    }
}

// Four values scaled and coded, the first in the low byte.
__device__ __forceinline__ unsigned quantize4(const float* v, float scale) {
    return quant_e4m3x4(__fmul_rn(v[0], scale), __fmul_rn(v[1], scale), __fmul_rn(v[2], scale),
                        __fmul_rn(v[3], scale));
}

// ---------------------------------------------------------------------------
// *_vec: coalesced 16-byte chunks (see the top of the file). The pieces
// the *_vec and *_rows kernels share come first.

template <typename In> struct VecLayout {
    static constexpr int CHUNK = 16 / sizeof(In);                // columns per 16-byte chunk
    static constexpr int LOADS = QUANT_LANE_COLS / CHUNK;        // chunks per lane
    static constexpr int CHUNK_LOG2 = sizeof(In) == 2 ? 3 : 2;   // log2(CHUNK)
};

__device__ __forceinline__ void unpack_chunk(const uint4& v, unsigned (&words)[4]) {
    words[0] = v.x; words[1] = v.y; words[2] = v.z; words[3] = v.w;
}

// The values of LOADS chunks (x, or swiglu of gate and up times the chunk's
// row's weight) and each chunk's amax (fmaxf ignores NaN, as np.fmax). A dead
// chunk's words are 0: it gives +0 (silu(0) * 0 * w is +0).
template <typename In, bool SWIGLU, int LOADS = VecLayout<In>::LOADS>
__device__ __forceinline__ void chunk_values(
        const unsigned (&raw)[2][LOADS][4], const float (&weight)[LOADS],
        float (&v)[LOADS][VecLayout<In>::CHUNK], float (&amax)[LOADS]) {
    constexpr int CHUNK = VecLayout<In>::CHUNK;
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
#pragma unroll
        for (int i = 0; i < CHUNK; ++i) {
            float value, up;
            if constexpr (sizeof(In) == 2) {
                value = (i % 2) ? bf16_high(raw[0][k][i / 2]) : bf16_low(raw[0][k][i / 2]);
                up = (i % 2) ? bf16_high(raw[1][k][i / 2]) : bf16_low(raw[1][k][i / 2]);
            } else {
                value = __uint_as_float(raw[0][k][i]);
                up = __uint_as_float(raw[1][k][i]);
            }
            v[k][i] = SWIGLU ? quant_swiglu_f32(value, up, weight[k]) : value;
        }
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < CHUNK; ++i) m = fmaxf(m, fabsf(v[k][i]));
        amax[k] = m;
    }
}

// Each instruction k's block scale, for every lane of the group that holds
// the block: the group's amax by xor-shuffles, then lane j < LOADS of a group
// computes instruction j's block's scale factor and scale (one division pair
// a lane) and the group gets each scale by a shuffle. Returns the lane's own
// block's scale factor (meaningful for in_group < LOADS). Every lane calls it.
template <int GROUP, int LOADS>
__device__ __forceinline__ void group_amax(float (&amax)[LOADS]) {
#pragma unroll
    for (int offset = 1; offset < GROUP; offset <<= 1)
#pragma unroll
        for (int k = 0; k < LOADS; ++k)
            amax[k] = fmaxf(amax[k], __shfl_xor_sync(QUANT_FULL_MASK, amax[k], offset));
}

// UNROLLED (the *_rows kernels): group is npc / CHUNK, 4 or 16 lanes (bf16),
// 8 or 32 (float32), and each has its unrolled butterfly; the loop over a
// run-time count costs ~30 instructions a lane more (its branches and the
// convergence tests before each shuffle). With the untested whole-segment
// stores it gave SwiGLU prefill 0.6-1.6 points; in *_vec the unrolled one
// cost Qwen3 (I = 768) 2.5 (benchmarks/NOTES.md, sixteenth session), so
// *_vec keeps the loop.
template <int LOADS, bool UNROLLED = false>
__device__ __forceinline__ float group_scales(float (&amax)[LOADS], int lane, int group,
                                              bool round_sf, float (&scale)[LOADS]) {
    if (!UNROLLED) {
        for (int offset = 1; offset < group; offset <<= 1)
#pragma unroll
            for (int k = 0; k < LOADS; ++k)
                amax[k] = fmaxf(amax[k], __shfl_xor_sync(QUANT_FULL_MASK, amax[k], offset));
    } else if (group == 16) {  // bf16 at npc 128 first: the prefill shapes
        group_amax<16>(amax);
    } else if (group == 4) {
        group_amax<4>(amax);
    } else if (group == 8) {
        group_amax<8>(amax);
    } else {
        group_amax<32>(amax);
    }
    const int in_group = lane & (group - 1);
    float my_amax = amax[0];
#pragma unroll
    for (int k = 1; k < LOADS; ++k)
        if (in_group == k) my_amax = amax[k];
    float sf, my_scale;
    quant_block_scales(my_amax, round_sf, sf, my_scale);
    const int group_base = lane & ~(group - 1);
#pragma unroll
    for (int k = 0; k < LOADS; ++k)
        scale[k] = __shfl_sync(QUANT_FULL_MASK, my_scale, group_base + k);
    return sf;
}

// One chunk's codes: 8 bytes (bf16 input) or 4 (float32) at codes[index].
template <typename In>
__device__ __forceinline__ void store_codes(unsigned char* out, i64 index,
                                            const float (&v)[VecLayout<In>::CHUNK], float scale) {
    if constexpr (sizeof(In) == 2) {
        store_once(reinterpret_cast<uint2*>(out) + index,
                   make_uint2(quantize4(v, scale), quantize4(v + 4, scale)));
    } else {
        store_once(reinterpret_cast<unsigned*>(out) + index, quantize4(v, scale));
    }
}

template <typename In>
__device__ __forceinline__ void store_zero_codes(unsigned char* out, i64 index) {
    if constexpr (sizeof(In) == 2) {
        store_once(reinterpret_cast<uint2*>(out) + index, make_uint2(0u, 0u));
    } else {
        store_once(reinterpret_cast<unsigned*>(out) + index, 0u);
    }
}

// *_vec: chunks numbered row after row (both ops); LOADS chunks a lane
// (swiglu at decode, *_vec1: one; every LOADS keeps to the lanes of a
// block, 4 at least, since lane j < LOADS of a group computes instruction
// j's scale). BY_SLOT (swiglu *_vec_slots, *_vec1_slots): the chunks of the
// T * K slots' rows, numbered slot after slot; slot s's chunks go to row
// slot_to_row[s] (none where that is outside [0, R)), weighted by
// topk_weights[s]; nothing else is written but the SF pad columns.
template <typename In, bool SWIGLU, int LOADS = VecLayout<In>::LOADS, bool BY_SLOT = false>
__device__ __forceinline__ void quantize_vec_body(const QuantizeArgs& a) {
    constexpr int CHUNK = VecLayout<In>::CHUNK;
    static_assert(SWIGLU || !BY_SLOT, "by slot: swiglu only");
    const int lane = threadIdx.x & 31;
    const unsigned warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const i64 row_chunks = a.hidden / CHUNK;
    const i64 total_chunks = (BY_SLOT ? a.num_weights : a.num_rows) * row_chunks;
    // chunks per block: npc / CHUNK = 2^(group_log2 + log2(32 / CHUNK))
    const int group_log2 = a.group_log2 + (5 - VecLayout<In>::CHUNK_LOG2);
    const int group = 1 << group_log2;                // lanes per block in one instruction
    const int in_group = lane & (group - 1);
    const i64 first = static_cast<i64>(warp) * (32 * LOADS) + lane;
    if (BY_SLOT && blockIdx.x == 0) zero_sf_pad_columns(a);

    // swiglu: each chunk's row's maps first, all of them (one latency), then
    // the data and the weights together
    bool padding[LOADS];
    int slot[LOADS];
    i64 target[LOADS];  // BY_SLOT: the chunk's row (its slot's), or 0 where none
    const bool weighted = SWIGLU && a.topk_weights != nullptr;
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
        const i64 chunk = first + 32 * k;
        padding[k] = chunk >= total_chunks;  // past the last row: nothing to do
        slot[k] = 0;
        target[k] = 0;
        if (SWIGLU && !padding[k]) {
            const i64 row = magic_divide(static_cast<unsigned>(chunk >> group_log2),
                                         a.block_magic, a.block_shift);
            if constexpr (BY_SLOT) {
                const int to = __ldg(a.slot_to_row + row);
                padding[k] = to < 0 || to >= a.num_rows;
                slot[k] = static_cast<int>(row);
                target[k] = padding[k] ? 0 : to;
            } else {
                const int expert = a.pos_to_expert != nullptr ? __ldg(a.pos_to_expert + row) : 0;
                if (weighted) slot[k] = __ldg(a.pos_to_token_topk + row);
                padding[k] = expert < 0 || (weighted && (slot[k] < 0 || slot[k] >= a.num_weights));
            }
        }
    }
    // BY_SLOT: where chunk `chunk` (numbered slot after slot) of instruction k
    // lies in the output, in chunks (the row-major numbering: itself)
    auto out_chunk = [&](int k, i64 chunk) -> i64 {
        if constexpr (BY_SLOT)
            return chunk + (target[k] - static_cast<i64>(slot[k])) * row_chunks;
        else
            return chunk;
    };
    if (SWIGLU) {
        // A warp whose chunks are all padding (most of a decode plan's rows)
        // stores zero codes and zero scale factors, what the arithmetic below
        // gives for zero words, without running it. Warp-uniform: the
        // shuffles below need every lane. (BY_SLOT: dropped slots, nothing.)
        bool any_live = false;
#pragma unroll
        for (int k = 0; k < LOADS; ++k) any_live = any_live || !padding[k];
        if (!__any_sync(QUANT_FULL_MASK, any_live)) {
            if (BY_SLOT) return;
            if (a.zero_padding) {
#pragma unroll
                for (int k = 0; k < LOADS; ++k)
                    if (first + 32 * k < total_chunks)
                        store_zero_codes<In>(a.out, first + 32 * k);
            }
            const i64 chunk = first + 32 * in_group;
            if (in_group >= LOADS || chunk >= total_chunks) return;
            const unsigned block = static_cast<unsigned>(chunk >> group_log2);
            const unsigned row = magic_divide(block, a.block_magic, a.block_shift);
            store_padding_scale_factor(a, row, static_cast<int>(block - row * a.sf_blocks));
            return;
        }
    }
    unsigned raw[2][LOADS][4];  // [x or gate, up][chunk][word]
    bool all_live = true;
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
        all_live = all_live && !padding[k];
#pragma unroll
        for (int w = 0; w < 4; ++w) raw[0][k][w] = raw[1][k][w] = 0u;
    }
    // h's rows hold 2 * row_chunks chunks: output chunk c of row r is gate
    // chunk r * 2 * row_chunks + c (= c + r * row_chunks), up row_chunks on
    auto load = [&](int k) {
        const i64 chunk = out_chunk(k, first + 32 * k);
        const uint4* src = reinterpret_cast<const uint4*>(a.x) + chunk;
        if (SWIGLU) {
            if constexpr (BY_SLOT)
                src += target[k] * row_chunks;
            else
                src += static_cast<i64>(magic_divide(static_cast<unsigned>(chunk >> group_log2),
                                                     a.block_magic, a.block_shift)) * row_chunks;
            unpack_chunk(load_once(src + row_chunks), raw[1][k]);
        }
        unpack_chunk(load_once(src), raw[0][k]);
    };
    // all loads in one branch when every chunk is live (the common case), so
    // that they are issued together
    if (all_live) {
#pragma unroll
        for (int k = 0; k < LOADS; ++k) load(k);
    } else {
#pragma unroll
        for (int k = 0; k < LOADS; ++k)
            if (!padding[k]) load(k);
    }
    // the weights after the data: both in flight together (x * 1 is x:
    // without weights, the bits of no multiply)
    float weight[LOADS];
#pragma unroll
    for (int k = 0; k < LOADS; ++k)
        weight[k] = weighted && !padding[k] ? __ldg(a.topk_weights + slot[k]) : 1.0f;
    float v[LOADS][CHUNK], amax[LOADS], scale[LOADS];
    chunk_values<In, SWIGLU, LOADS>(raw, weight, v, amax);
    const float sf = group_scales<LOADS>(amax, lane, group, a.round_sf != 0, scale);
    // (swiglu, zero_padding off or by slot: a padding row's chunks are not written)
    const bool store_padding = !SWIGLU || (a.zero_padding && !BY_SLOT);
#pragma unroll
    for (int k = 0; k < LOADS; ++k)
        if (first + 32 * k < total_chunks && (store_padding || !padding[k]))
            store_codes<In>(a.out, out_chunk(k, first + 32 * k), v[k], scale[k]);
    if (in_group >= LOADS) return;
    const i64 chunk = first + 32 * in_group;
    if (chunk >= total_chunks) return;
    const unsigned block = static_cast<unsigned>(chunk >> group_log2);
    const unsigned row = magic_divide(block, a.block_magic, a.block_shift);  // BY_SLOT: the slot
    bool row_padding = false;
    i64 out_row = row;
#pragma unroll
    for (int k = 0; k < LOADS; ++k)
        if (in_group == k) {
            row_padding = SWIGLU && padding[k];
            if (BY_SLOT) out_row = target[k];
        }
    if (row_padding) {
        if (!BY_SLOT)
            store_padding_scale_factor(a, row, static_cast<int>(block - row * a.sf_blocks));
    } else {
#if QUANTIZE_VEC1_PACKED_PAD_WORDS
        if constexpr (!SWIGLU && LOADS == 1) {
            if (a.sf_layout == SF_COL_MAJOR_UE8M0) {
                store_packed_sf_pad_words(a, out_row,
                                          static_cast<int>(block - row * a.sf_blocks), sf);
                return;
            }
        }
#endif
        store_scale_factor(a, out_row, static_cast<int>(block - row * a.sf_blocks), sf, false);
    }
}

// quantize_fp8_*_tiles (see the top): tile w of warp w. Lane l's chunk in
// each load is chunk (l % ROW_LANES) of the tile's columns, of row (l /
// ROW_LANES) + k * ROWS_A_LOAD of the tile in load k: a block's chunks are
// one group of lanes in one load (group = npc / CHUNK <= ROW_LANES), as in
// *_vec, and group_scales gives lane j < LOADS of a group load j's scale
// factor, whose row is the group's row in load j.
#define QUANT_TILE_ROWS 8
#define QUANT_TILE_COLS 128
template <typename In>
__device__ __forceinline__ void quantize_tiles_body(const QuantizeArgs& a) {
    constexpr int CHUNK = VecLayout<In>::CHUNK;
    constexpr int LOADS = VecLayout<In>::LOADS;            // 4 (bf16) or 8 (float32)
    constexpr int ROW_LANES = QUANT_TILE_COLS / CHUNK;     // 16 or 32 lanes a tile row
    constexpr int ROWS_A_LOAD = 32 / ROW_LANES;            // 2 or 1
    static_assert(LOADS * ROWS_A_LOAD == QUANT_TILE_ROWS, "a warp's loads cover the tile");
    const int lane = threadIdx.x & 31;
    const unsigned tile = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const unsigned row_group = magic_divide(tile, a.pass_magic, a.pass_shift);
    // the grid's last warps (whole warps: no shuffle waits)
    if (static_cast<i64>(row_group) * QUANT_TILE_ROWS >= a.num_rows) return;
    const int column_tile = static_cast<int>(tile - row_group * static_cast<unsigned>(a.passes));
    const i64 row_chunks = a.hidden / CHUNK;
    const int chunk = column_tile * ROW_LANES + (lane % ROW_LANES);  // in the row
    const i64 first_row = static_cast<i64>(row_group) * QUANT_TILE_ROWS + lane / ROW_LANES;
    unsigned raw[2][LOADS][4];  // [x, unused][load][word]
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
#pragma unroll
        for (int w = 0; w < 4; ++w) raw[0][k][w] = raw[1][k][w] = 0u;
        const i64 row = first_row + k * ROWS_A_LOAD;
        // rows past the last: zeros (a group is one row: all in or all out)
        if (row < a.num_rows)
            unpack_chunk(load_once(reinterpret_cast<const uint4*>(a.x) + row * row_chunks + chunk),
                         raw[0][k]);
    }
    float weight[LOADS], v[LOADS][CHUNK], amax[LOADS], scale[LOADS];
#pragma unroll
    for (int k = 0; k < LOADS; ++k) weight[k] = 1.0f;
    chunk_values<In, false, LOADS>(raw, weight, v, amax);
    const int group_log2 = a.group_log2 + (5 - VecLayout<In>::CHUNK_LOG2);
    const int group = 1 << group_log2;
    const float sf = group_scales<LOADS>(amax, lane, group, a.round_sf != 0, scale);
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
        const i64 row = first_row + k * ROWS_A_LOAD;
        if (row < a.num_rows) store_codes<In>(a.out, row * row_chunks + chunk, v[k], scale[k]);
    }
    const int in_group = lane & (group - 1);
    if (in_group >= LOADS) return;
    const int group_first = lane - in_group;  // the group's row and block: its first lane's
    const i64 row = static_cast<i64>(row_group) * QUANT_TILE_ROWS + group_first / ROW_LANES +
                    in_group * ROWS_A_LOAD;
    if (row >= a.num_rows) return;
    const int block = (column_tile * ROW_LANES + group_first % ROW_LANES) >> group_log2;
#if QUANTIZE_TILES_PACKED_PAD_WORDS
    if (a.sf_layout == SF_COL_MAJOR_UE8M0) {
        store_packed_sf_pad_words(a, row, block, sf);
        return;
    }
#endif
    store_scale_factor(a, row, block, sf, false);
}

// swiglu_quantize_fp8_*_rows: segment s (a warp's 1024 columns) is segment
// p = s % passes of row s / passes; warp w takes segment w. The pieces of a
// segment first, then the body. (Two segments a warp, the second's loads
// issued before the first's arithmetic, lost 11-16 points of the copy
// bandwidth on the GPU: benchmarks/NOTES.md, tenth session.)

// One segment, as a lane sees it: the row and its maps (warp-uniform) and
// the lane's chunks.
struct RowsSegment {
    i64 row;
    unsigned char* out_row;
    int segment_first;  // the segment's first chunk, in the row
    int first;          // the lane's chunk at k = 0, in the row
    int sf_chunk;       // instruction in_group's block, whose scale factor the lane stores
    bool stores_sf;     // ... if in_group < LOADS and the block is in the row
    int group_log2;     // log2(npc / CHUNK): lanes a block in one instruction
    bool weighted;      // topk_weights given
    int expert;         // the row's maps: pos_to_expert (0 without)
    int slot;           // and topk_weights slot (with weights; else 0)
};

// Segment `segment`, of row row32 (< num_rows), and the row's maps (all lanes
// read the same words: one transaction each). BY_SLOT: row32 is a slot (<
// num_weights), the row slot_to_row's (expert -1 where that is outside [0,
// R): no row), the slot its own.
template <typename In, int LOADS, bool BY_SLOT = false>
__device__ __forceinline__ RowsSegment rows_segment(const QuantizeArgs& a, unsigned segment,
                                                   unsigned row32, int lane, int row_chunks) {
    constexpr int SEGMENT_CHUNKS = 32 * LOADS;  // 1024 columns (*_rows768: 768)
    RowsSegment s;
    s.row = row32;
    if constexpr (BY_SLOT) {
        const int to = __ldg(a.slot_to_row + row32);
        const bool in_range = to >= 0 && to < a.num_rows;
        s.row = in_range ? to : 0;
        s.expert = in_range ? 0 : -1;
        s.slot = static_cast<int>(row32);
    }
    const int segment_first = static_cast<int>(segment - row32 * a.passes) * SEGMENT_CHUNKS;
    s.segment_first = segment_first;
    s.first = segment_first + lane;
    s.group_log2 = a.group_log2 + (5 - VecLayout<In>::CHUNK_LOG2);
    const int group = 1 << s.group_log2;
    const int in_group = lane & (group - 1);
    // a group's chunks are all below the row's end or all past it (row_chunks
    // is a multiple of the group)
    s.sf_chunk = segment_first + 32 * in_group + (lane & ~(group - 1));
    s.stores_sf = in_group < LOADS && s.sf_chunk < row_chunks;
    s.out_row = a.out + s.row * a.hidden;
    s.weighted = a.topk_weights != nullptr;
    if constexpr (!BY_SLOT) {
        s.expert = a.pos_to_expert != nullptr ? __ldg(a.pos_to_expert + s.row) : 0;
        s.slot = s.weighted ? __ldg(a.pos_to_token_topk + s.row) : 0;
    }
    return s;
}

// A padding segment: zero codes and scale factors, what the arithmetic gives
// for zero words, without reading h (zero_padding off: only row R-1's SF pad
// columns).
template <typename In, int LOADS>
__device__ __forceinline__ void rows_store_zeros(const QuantizeArgs& a, const RowsSegment& s,
                                                 int row_chunks) {
    if (a.zero_padding) {
#pragma unroll
        for (int k = 0; k < LOADS; ++k)
            if (s.first + 32 * k < row_chunks) store_zero_codes<In>(s.out_row, s.first + 32 * k);
    }
    if (s.stores_sf) store_padding_scale_factor(a, s.row, s.sf_chunk >> s.group_log2);
}

// A live segment's loads: the lane's gate and up chunks, then the row's
// weight (both in flight together; x * 1 is x: without weights, the bits of
// no multiply). Returns the weight.
template <typename In, int LOADS>
__device__ __forceinline__ float rows_load(const QuantizeArgs& a, const RowsSegment& s,
                                           int row_chunks, unsigned (&raw)[2][LOADS][4]) {
    // h's row holds 2 * row_chunks chunks: gate, then up
    const uint4* gate = reinterpret_cast<const uint4*>(a.x) + s.row * (2 * row_chunks) + s.first;
    const uint4* up = gate + row_chunks;
#pragma unroll
    for (int k = 0; k < LOADS; ++k)
#pragma unroll
        for (int w = 0; w < 4; ++w) raw[0][k][w] = raw[1][k][w] = 0u;
    if (s.segment_first + 32 * LOADS <= row_chunks) {  // the whole segment: no tests
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            unpack_chunk(load_once(gate + 32 * k), raw[0][k]);
            unpack_chunk(load_once(up + 32 * k), raw[1][k]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < LOADS; ++k)
            if (s.first + 32 * k < row_chunks) {
                unpack_chunk(load_once(gate + 32 * k), raw[0][k]);
                unpack_chunk(load_once(up + 32 * k), raw[1][k]);
            }
    }
    return s.weighted ? __ldg(a.topk_weights + s.slot) : 1.0f;
}

// The arithmetic's arrays. The kernel body declares them, beside raw, and
// hands them to rows_quantize: so the one-segment kernel compiles to the
// SASS it had as one function (arrays declared in rows_quantize, promoted to
// registers apart from raw, moved its register allocation).
template <typename In, int LOADS> struct RowsScratch {
    float weight[LOADS];
    float v[LOADS][VecLayout<In>::CHUNK];
    float amax[LOADS];
    float scale[LOADS];
};

// A live segment's values, scales and stores. Every lane calls it (shuffles).
template <typename In, int LOADS>
__device__ __forceinline__ void rows_quantize(const QuantizeArgs& a, const RowsSegment& s,
                                              int lane, int row_chunks,
                                              const unsigned (&raw)[2][LOADS][4],
                                              float row_weight, RowsScratch<In, LOADS>& t) {
#pragma unroll
    for (int k = 0; k < LOADS; ++k) t.weight[k] = row_weight;
    chunk_values<In, true, LOADS>(raw, t.weight, t.v, t.amax);
    const float sf = group_scales<LOADS, true>(t.amax, lane, 1 << s.group_log2, a.round_sf != 0,
                                         t.scale);
    if (s.segment_first + 32 * LOADS <= row_chunks) {  // the whole segment: no tests
#pragma unroll
        for (int k = 0; k < LOADS; ++k)
            store_codes<In>(s.out_row, s.first + 32 * k, t.v[k], t.scale[k]);
    } else {
#pragma unroll
        for (int k = 0; k < LOADS; ++k)
            if (s.first + 32 * k < row_chunks)
                store_codes<In>(s.out_row, s.first + 32 * k, t.v[k], t.scale[k]);
    }
    if (s.stores_sf) store_scale_factor(a, s.row, s.sf_chunk >> s.group_log2, sf, false);
}

// BY_SLOT (*_rows_slots, *_rows768_slots): the segments of the T * K slots'
// rows, slot after slot, as in *_vec_slots: a dropped slot's warps write
// nothing, block 0 zeroes the SF pad columns.
template <typename In, int LOADS = VecLayout<In>::LOADS, bool BY_SLOT = false>
__device__ __forceinline__ void swiglu_rows_one_segment(const QuantizeArgs& a) {
    const int lane = threadIdx.x & 31;
    const unsigned warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (BY_SLOT && blockIdx.x == 0) zero_sf_pad_columns(a);
    const unsigned row32 = magic_divide(warp, a.pass_magic, a.pass_shift);
    // the grid's last warps (whole warps: no shuffle waits)
    if (row32 >= (BY_SLOT ? a.num_weights : a.num_rows)) return;
    const int row_chunks = a.hidden >> VecLayout<In>::CHUNK_LOG2;
    const RowsSegment s = rows_segment<In, LOADS, BY_SLOT>(a, warp, row32, lane, row_chunks);
    // a padding row (pos_to_expert < 0, or with weights a slot outside
    // [0, T*K)): zero codes and scale factors, h never read (BY_SLOT: a
    // dropped slot, nothing)
    if (s.expert < 0 || (s.weighted && (s.slot < 0 || s.slot >= a.num_weights))) {
        if (!BY_SLOT) rows_store_zeros<In, LOADS>(a, s, row_chunks);
        return;
    }
    unsigned raw[2][LOADS][4];  // [gate, up][chunk][word]
    const float row_weight = rows_load<In, LOADS>(a, s, row_chunks, raw);
    RowsScratch<In, LOADS> scratch;
    rows_quantize<In, LOADS>(a, s, lane, row_chunks, raw, row_weight, scratch);
}

// ---------------------------------------------------------------------------
// *_any: 32 consecutive columns per lane, element accesses (see the top).

// A padding row's lane of *_any: its columns' zero codes (unless
// zero_padding is off) and, from a block's first lane, the block's scale
// factor (store_padding_scale_factor).
__device__ __forceinline__ void any_padding_lane(const QuantizeArgs& a, i64 row, int col,
                                                 int task, int block) {
    if (a.zero_padding) {
        unsigned char* out_row = a.out + row * a.hidden;
        for (int i = 0; i < QUANT_LANE_COLS && col + i < a.hidden; ++i) out_row[col + i] = 0;
    }
    if ((task & ((1 << a.group_log2) - 1)) == 0 && block < a.sf_blocks)
        store_padding_scale_factor(a, row, block);
}

template <typename In, bool SWIGLU>
__device__ __forceinline__ void quantize_any_body(const QuantizeArgs& a) {
    // the host keeps every lane index below 2^31 (the magic number's range)
    const unsigned lane_index = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned lane_row = magic_divide(lane_index, a.row_magic, a.row_shift);
    // lanes past the last row stay to the end: the shuffles need every lane
    const bool active = lane_row < a.num_rows;
    const i64 row = active ? lane_row : 0;
    const int task = static_cast<int>(lane_index - lane_row * a.lanes_per_row);
    const int block = task >> a.group_log2;
    const int col = task * QUANT_LANE_COLS;
    const int hidden = a.hidden;

    bool padding = false;
    float weight = 1.0f;
    if (SWIGLU && active) padding = swiglu_row(a, row, weight);
    if (SWIGLU && !__any_sync(QUANT_FULL_MASK, active && !padding)) {
        // a warp of padding rows: zeros, without the arithmetic (see *_vec)
        if (active) any_padding_lane(a, row, col, task, block);
        return;
    }
    const In* first =
        static_cast<const In*>(a.x) + row * (SWIGLU ? 2 * static_cast<i64>(hidden) : hidden);
    In raw[2][QUANT_LANE_COLS];
#pragma unroll
    for (int i = 0; i < QUANT_LANE_COLS; ++i) {
        const bool in = active && !padding && col + i < hidden;
        raw[0][i] = in ? first[col + i] : In(0);
        raw[1][i] = SWIGLU && in ? first[hidden + col + i] : In(0);
    }
    float v[QUANT_LANE_COLS];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < QUANT_LANE_COLS; ++i) {
        float value, up;
        if constexpr (sizeof(In) == 2) {
            value = bf16_low(raw[0][i]);
            up = bf16_low(raw[1][i]);
        } else {
            value = raw[0][i];
            up = raw[1][i];
        }
        v[i] = SWIGLU ? quant_swiglu_f32(value, up, weight) : value;  // 0 past H
        amax = fmaxf(amax, fabsf(v[i]));
    }
    const int group = 1 << a.group_log2;
    for (int offset = 1; offset < group; offset <<= 1)
        amax = fmaxf(amax, __shfl_xor_sync(QUANT_FULL_MASK, amax, offset));
    float sf, scale;
    quant_block_scales(amax, a.round_sf != 0, sf, scale);
    if (!active) return;
    if (SWIGLU && padding) {  // a padding row beside live ones in the warp
        any_padding_lane(a, row, col, task, block);
        return;
    }

    unsigned char* out_row = a.out + row * hidden;
#pragma unroll
    for (int w = 0; w < QUANT_LANE_COLS / 4; ++w) {
        const unsigned codes = quantize4(v + 4 * w, scale);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (col + 4 * w + i < hidden)
                out_row[col + 4 * w + i] = static_cast<unsigned char>(codes >> (8 * i));
    }
    if ((task & (group - 1)) == 0 && block < a.sf_blocks)
        store_scale_factor(a, row, block, sf, false);
}

// ---------------------------------------------------------------------------
// swiglu_quantize_fp8_*_block_rows (see the top of the file).

#define QUANT_BLOCK_ROWS_MAX_THREADS 1024

// Every (row, column) of a block's R rows whose row is a bit of `rows_mask`,
// `per_row` columns a row, the block's threads across them: calls
// visit(row, column). One division a thread; then steps of blockDim.x.
template <typename Visit>
__device__ __forceinline__ void for_rows_columns(unsigned rows_mask, int rows, int per_row,
                                                 Visit visit) {
    const int step_rows = static_cast<int>(blockDim.x) / per_row;
    const int step_columns = static_cast<int>(blockDim.x) - step_rows * per_row;
    int r = static_cast<int>(threadIdx.x) / per_row;
    int c = static_cast<int>(threadIdx.x) - r * per_row;
    while (r < rows) {
        if ((rows_mask >> r) & 1u) visit(r, c);
        r += step_rows;
        c += step_columns;
        if (c >= per_row) {
            c -= per_row;
            ++r;
        }
    }
}

template <typename In>
__device__ __forceinline__ void swiglu_block_rows_body(const QuantizeArgs& a) {
    constexpr int CHUNK = VecLayout<In>::CHUNK;
    const int lane = threadIdx.x & 31;
    const int row_chunks = a.hidden >> VecLayout<In>::CHUNK_LOG2;
    const i64 row0 = static_cast<i64>(blockIdx.x) * a.block_rows;
    const int rows = static_cast<int>(min(static_cast<i64>(a.block_rows), a.num_rows - row0));
    // the rows' maps, lane i row i, in every warp (the same words: one
    // transaction each), so that every warp knows every row without a barrier
    const bool weighted = a.topk_weights != nullptr;
    int slot = 0;
    bool padding = true;
    if (lane < rows) {
        const int expert = a.pos_to_expert != nullptr ? __ldg(a.pos_to_expert + row0 + lane) : 0;
        if (weighted) slot = __ldg(a.pos_to_token_topk + row0 + lane);
        padding = expert < 0 || (weighted && (slot < 0 || slot >= a.num_weights));
    }
    const unsigned live = __ballot_sync(QUANT_FULL_MASK, !padding);
    const unsigned dead = (rows == 32 ? QUANT_FULL_MASK : (1u << rows) - 1u) & ~live;

    // padding rows: zero codes (H % 16 == 0 and out 16-byte aligned: the
    // conditions of every coalesced kernel) and zero scale factors; each
    // thread its share, once: while its first live chunk's loads are in
    // flight, else after the live rows
    // (zero_padding off: no codes, and scale factors only for row R-1's SF
    // pad columns)
    const bool last_row_here = row0 + rows == a.num_rows;
    const unsigned dead_codes = a.zero_padding ? dead : 0u;
    const unsigned dead_sf = a.zero_padding ? dead
                             : last_row_here ? dead & (1u << (rows - 1)) : 0u;
    bool zeroed = dead_sf == 0u;
    auto zero_padding_rows = [&]() {
        for_rows_columns(dead_codes, rows, a.hidden >> 4, [&](int r, int v) {
            store_once(reinterpret_cast<uint4*>(a.out + (row0 + r) * a.hidden) + v,
                       make_uint4(0u, 0u, 0u, 0u));
        });
        for_rows_columns(dead_sf, rows, a.sf_blocks, [&](int r, int block) {
            store_padding_scale_factor(a, row0 + r, block);
        });
        zeroed = true;
    };

    // live rows first (the critical path), one after another: a thread one
    // 16-byte chunk of the row at a time (all of it at once where the block
    // has the row's chunks); a warp past the row's end skips, and the lanes
    // of a partial warp past it run the arithmetic on zero words for the
    // shuffles, storing nothing
    const int group_log2 = a.group_log2 + (5 - VecLayout<In>::CHUNK_LOG2);
    const int in_group = lane & ((1 << group_log2) - 1);
    for (unsigned todo = live; todo; todo &= todo - 1) {
        const int r = __ffs(todo) - 1;
        const i64 row = row0 + r;
        const int row_slot = __shfl_sync(QUANT_FULL_MASK, slot, r);
        const uint4* gate = reinterpret_cast<const uint4*>(a.x) + row * 2 * row_chunks;
        for (int c0 = static_cast<int>(threadIdx.x) & ~31; c0 < row_chunks;
             c0 += static_cast<int>(blockDim.x)) {
            const int c = c0 + lane;
            const bool in_row = c < row_chunks;
            unsigned raw[2][1][4] = {};
            if (in_row) {
                unpack_chunk(load_once(gate + c), raw[0][0]);
                unpack_chunk(load_once(gate + row_chunks + c), raw[1][0]);
            }
            // after the data: both in flight together (x * 1 is x)
            const float weight[1] = {weighted ? __ldg(a.topk_weights + row_slot) : 1.0f};
            if (!zeroed) zero_padding_rows();
            float v[1][CHUNK], amax[1], scale[1];
            chunk_values<In, true, 1>(raw, weight, v, amax);
            const float sf = group_scales<1>(amax, lane, 1 << group_log2, a.round_sf != 0,
                                             scale);
            if (!in_row) continue;
            store_codes<In>(a.out, row * row_chunks + c, v[0], scale[0]);
            if (in_group == 0) store_scale_factor(a, row, c >> group_log2, sf, false);
        }
    }
    if (!zeroed) zero_padding_rows();
}

#define DEFINE_QUANTIZE_KERNELS(IN_NAME, IN_TYPE)                                            \
    QUANT_KEEP_vec(                                                                          \
    extern "C" __global__ void __launch_bounds__(QUANT_MAX_THREADS)                          \
    quantize_fp8_##IN_NAME##_vec(const QuantizeArgs a) {                                     \
        quantize_vec_body<IN_TYPE, false>(a);                                                \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_vec1(                                                                         \
    extern "C" __global__ void __launch_bounds__(QUANT_MAX_THREADS)                          \
    quantize_fp8_##IN_NAME##_vec1(const QuantizeArgs a) {                                    \
        quantize_vec_body<IN_TYPE, false, 1>(a);                                             \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_tiles(                                                                        \
    extern "C" __global__ void __launch_bounds__(QUANT_MAX_THREADS)                          \
    quantize_fp8_##IN_NAME##_tiles(const QuantizeArgs a) {                                   \
        quantize_tiles_body<IN_TYPE>(a);                                                     \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_any(                                                                          \
    extern "C" __global__ void __launch_bounds__(QUANT_MAX_THREADS)                          \
    quantize_fp8_##IN_NAME##_any(const QuantizeArgs a) {                                     \
        quantize_any_body<IN_TYPE, false>(a);                                                \
    }                                                                                        \
    )

#define DEFINE_SWIGLU_KERNELS(IN_NAME, IN_TYPE)                                              \
    QUANT_KEEP_vec(                                                                          \
    extern "C" __global__ void __launch_bounds__(QUANT_MAX_THREADS)                          \
    swiglu_quantize_fp8_##IN_NAME##_vec(const QuantizeArgs a) {                              \
        quantize_vec_body<IN_TYPE, true>(a);                                                 \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_rows(                                                                         \
    extern "C" __global__ void QUANT_ROWS_BOUNDS                                             \
    swiglu_quantize_fp8_##IN_NAME##_rows(const QuantizeArgs a) {                             \
        swiglu_rows_one_segment<IN_TYPE>(a);                                                 \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_rows768(                                                                      \
    extern "C" __global__ void QUANT_ROWS768_BOUNDS_##IN_NAME                                \
    swiglu_quantize_fp8_##IN_NAME##_rows768(const QuantizeArgs a) {                          \
        swiglu_rows_one_segment<IN_TYPE, VecLayout<IN_TYPE>::LOADS * 3 / 4>(a);              \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_rows512(                                                                      \
    extern "C" __global__ void QUANT_ROWS_BOUNDS                                             \
    swiglu_quantize_fp8_##IN_NAME##_rows512(const QuantizeArgs a) {                          \
        swiglu_rows_one_segment<IN_TYPE, VecLayout<IN_TYPE>::LOADS / 2>(a);                  \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_vec1(                                                                         \
    extern "C" __global__ void __launch_bounds__(QUANT_MAX_THREADS)                          \
    swiglu_quantize_fp8_##IN_NAME##_vec1(const QuantizeArgs a) {                             \
        quantize_vec_body<IN_TYPE, true, 1>(a);                                              \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_block_rows(                                                                   \
    extern "C" __global__ void __launch_bounds__(QUANT_BLOCK_ROWS_MAX_THREADS)               \
    swiglu_quantize_fp8_##IN_NAME##_block_rows(const QuantizeArgs a) {                       \
        swiglu_block_rows_body<IN_TYPE>(a);                                                  \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_any(                                                                          \
    extern "C" __global__ void __launch_bounds__(QUANT_MAX_THREADS)                          \
    swiglu_quantize_fp8_##IN_NAME##_any(const QuantizeArgs a) {                              \
        quantize_any_body<IN_TYPE, true>(a);                                                 \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_vec_slots(                                                                    \
    extern "C" __global__ void __launch_bounds__(QUANT_MAX_THREADS)                          \
    swiglu_quantize_fp8_##IN_NAME##_vec_slots(const QuantizeArgs a) {                        \
        quantize_vec_body<IN_TYPE, true, VecLayout<IN_TYPE>::LOADS, true>(a);                \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_vec1_slots(                                                                   \
    extern "C" __global__ void __launch_bounds__(QUANT_MAX_THREADS)                          \
    swiglu_quantize_fp8_##IN_NAME##_vec1_slots(const QuantizeArgs a) {                       \
        quantize_vec_body<IN_TYPE, true, 1, true>(a);                                        \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_rows_slots(                                                                   \
    extern "C" __global__ void QUANT_ROWS_BOUNDS                                             \
    swiglu_quantize_fp8_##IN_NAME##_rows_slots(const QuantizeArgs a) {                       \
        swiglu_rows_one_segment<IN_TYPE, VecLayout<IN_TYPE>::LOADS, true>(a);                \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_rows768_slots(                                                                \
    extern "C" __global__ void QUANT_ROWS768_BOUNDS_##IN_NAME                                \
    swiglu_quantize_fp8_##IN_NAME##_rows768_slots(const QuantizeArgs a) {                    \
        swiglu_rows_one_segment<IN_TYPE, VecLayout<IN_TYPE>::LOADS * 3 / 4, true>(a);        \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_rows512_slots(                                                                \
    extern "C" __global__ void QUANT_ROWS_BOUNDS                                             \
    swiglu_quantize_fp8_##IN_NAME##_rows512_slots(const QuantizeArgs a) {                    \
        swiglu_rows_one_segment<IN_TYPE, VecLayout<IN_TYPE>::LOADS / 2, true>(a);            \
    }                                                                                        \
    )

// *_rows256 and its _slots twin: a sweep option (they lost), compiled only
// where a tuning's widths name 256 (QUANTIZE_ROWS256), so that the default
// module does not pay their compile time
#define DEFINE_ROWS256_KERNELS(IN_NAME, IN_TYPE)                                             \
    QUANT_KEEP_rows256(                                                                      \
    extern "C" __global__ void QUANT_ROWS_BOUNDS                                             \
    swiglu_quantize_fp8_##IN_NAME##_rows256(const QuantizeArgs a) {                          \
        swiglu_rows_one_segment<IN_TYPE, VecLayout<IN_TYPE>::LOADS / 4>(a);                  \
    }                                                                                        \
    )                                                                                        \
    QUANT_KEEP_rows256_slots(                                                                \
    extern "C" __global__ void QUANT_ROWS_BOUNDS                                             \
    swiglu_quantize_fp8_##IN_NAME##_rows256_slots(const QuantizeArgs a) {                    \
        swiglu_rows_one_segment<IN_TYPE, VecLayout<IN_TYPE>::LOADS / 4, true>(a);            \
    }                                                                                        \
    )

#if QUANTIZE_INPUTS & 1
#if QUANTIZE_OPS & 1
DEFINE_QUANTIZE_KERNELS(bf16, unsigned short)
#endif
#if QUANTIZE_OPS & 2
DEFINE_SWIGLU_KERNELS(bf16, unsigned short)
#if QUANTIZE_ROWS256
DEFINE_ROWS256_KERNELS(bf16, unsigned short)
#endif
#endif
#endif
#if QUANTIZE_INPUTS & 2
#if QUANTIZE_OPS & 1
DEFINE_QUANTIZE_KERNELS(f32, float)
#endif
#if QUANTIZE_OPS & 2
DEFINE_SWIGLU_KERNELS(f32, float)
#if QUANTIZE_ROWS256
DEFINE_ROWS256_KERNELS(f32, float)
#endif
#endif
#endif

// ---------------------------------------------------------------------------
// Test support (the GPU tests call these; no op does). The first two record
// in *mismatch, with atomicMin, the first float32 bit pattern of [first,
// first + count) where two computations that must agree differ; the caller
// initialises *mismatch to 0xFFFFFFFF ("none").

// quant_rcp_1_to_2p126 (quantize_exp.cuh) against CUDA's correctly rounded
// __frcp_rn.
extern "C" __global__ void quantize_selftest_reciprocal(unsigned first, unsigned count,
                                                        unsigned* mismatch) {
    const unsigned stride = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        const float d = __uint_as_float(first + i);
        if (__float_as_uint(quant_rcp_1_to_2p126(d)) != __float_as_uint(__frcp_rn(d)))
            atomicMin(mismatch, first + i);
    }
}

// The e4m3 codes of the conversion this module was compiled with (hardware
// on sm_89+ unless QUANTIZE_SOFTWARE_E4M3) against the integer rounding.
// The ops convert products only (x * scale), so the inputs here are too:
// v * one and -v * one, `one` 1.0f at run time (not folded away).
extern "C" __global__ void quantize_selftest_e4m3(unsigned first, unsigned count,
                                                  unsigned* mismatch, float one) {
    const unsigned stride = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        const float v = __uint_as_float(first + i);
        const unsigned codes = quant_e4m3x4(__fmul_rn(v, one), __fmul_rn(-v, one),
                                            __fmul_rn(v, one), one);
        const unsigned expected = quant_e4m3_software(v) | (quant_e4m3_software(-v) << 8) |
                                  (quant_e4m3_software(v) << 16) | (0x38u << 24);
        if (codes != expected) atomicMin(mismatch, first + i);
    }
}

// A float32 multiply whose result is NaN gives the one NaN 0x7FFFFFFF,
// whatever the NaN operand's sign and payload (what the e4m3 conversion's
// NaN codes rest on): every NaN pattern of [first, first + count) times
// `scale`, and `scale` times it.
extern "C" __global__ void quantize_selftest_product_nan(unsigned first, unsigned count,
                                                         unsigned* mismatch, float scale) {
    const unsigned stride = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        const float v = __uint_as_float(first + i);
        if (__float_as_uint(__fmul_rn(v, scale)) != 0x7FFFFFFFu ||
            __float_as_uint(__fmul_rn(scale, v)) != 0x7FFFFFFFu)
            atomicMin(mismatch, first + i);
    }
}

// out[i] = quant_swiglu_f32(gate[i], up[i], weight[i]): the activations, for
// a bit-for-bit comparison with numerics.swiglu_f32.
extern "C" __global__ void quantize_selftest_swiglu(const float* gate, const float* up,
                                                    const float* weight, float* out, i64 n) {
    const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = quant_swiglu_f32(gate[i], up[i], weight[i]);
}
