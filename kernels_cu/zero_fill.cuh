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
// `walk_end` are looked at: a row needs zeros when it is at or past
// `data_rows` (pad rows beyond the data, e.g. the column-major SF's pad
// columns), when `all_rows` is set, or when pos_to_expert[row] < 0.
__device__ __forceinline__ ZeroRows padding_rows_ballot(const int* pos_to_expert, i64 first_row,
                                                        int rows, i64 walk_end, i64 data_rows,
                                                        bool all_rows) {
    const int lane = threadIdx.x & 31;
    const i64 lane_row = first_row + lane;
    bool lane_zero = false;
    if (lane < rows && lane_row < walk_end)
        lane_zero = lane_row >= data_rows || all_rows || __ldg(pos_to_expert + lane_row) < 0;
    return {first_row, __ballot_sync(0xffffffffu, lane_zero)};
}
