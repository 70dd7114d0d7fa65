// Which rows a zero-fill block must zero, found with one warp ballot.
//
// Zero-fill blocks cover a few consecutive output rows each. Lane r of every
// warp reads row r's expert and a ballot gathers the answers: the block
// waits for one load, not one per row.
#pragma once

#include "vector_access.cuh"

struct ZeroRows {
    i64 first_row;
    unsigned mask;  // bit r: row first_row + r needs zeros
};

// Rows [first_row, first_row + rows) (rows <= 32), of which those below
// `walk_end` are looked at. A row at or past `data_rows` always needs zeros
// (pad rows beyond the data, e.g. the column-major SF's pad columns); a data
// row needs them when it is a padding row (pos_to_expert[row] < 0) and
// `padding_rows` is set, or an expert row and `expert_rows` is set. When the
// flags settle it alone (both set, or neither), pos_to_expert is not read.
__device__ __forceinline__ ZeroRows padding_rows_ballot(const int* pos_to_expert, i64 first_row,
                                                        int rows, i64 walk_end, i64 data_rows,
                                                        bool padding_rows, bool expert_rows) {
    const int lane = threadIdx.x & 31;
    const i64 lane_row = first_row + lane;
    bool lane_zero = false;
    if (lane < rows && lane_row < walk_end) {
        if (lane_row >= data_rows || (padding_rows && expert_rows))
            lane_zero = true;
        else if (padding_rows || expert_rows)
            lane_zero = __ldg(pos_to_expert + lane_row) < 0 ? padding_rows : expert_rows;
    }
    return {first_row, __ballot_sync(0xffffffffu, lane_zero)};
}
