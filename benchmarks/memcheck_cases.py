"""A representative subset of calls for compute-sanitizer (memcheck, initcheck).

Every kernel variant and access width (the bulk-copy kernel forced on small
batches too), odd H, T == 0, X == 0, a malformed map
with positions past X, the column-major pad columns and validate=True; each
result is also checked bit-exact against the NumPy reference. Run it under the
sanitizer from benchmarks/gpu_check.sh.

    python benchmarks/memcheck_cases.py [--registers-only]

--registers-only keeps every call on the register kernel: initcheck does not
see the bulk-copy engine's writes, so it reports the bulk kernel's outputs as
uninitialised when they are copied to the host. Whether memcheck instruments
the bulk engine's own accesses is not documented either; what shows that the
bulk kernel writes every output byte and nothing past the outputs are the GPU
tests (poisoned outputs, guard rows behind malformed maps, both kernels).
"""

from __future__ import annotations

import sys

import cupy
import ml_dtypes
import numpy as np

import cupy_moe
from cupy_moe import _gpu, reference
from cupy_moe._checks import sf_columns


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(f"u{a.itemsize}")


def run_case(rng, num_tokens, hidden, top_k, num_expanded, *, layout, npc=128, malformed=False):
    fp8 = np.dtype(ml_dtypes.float8_e4m3fn)
    x = rng.integers(0, 256, (num_tokens, hidden), dtype=np.uint8)
    slots = np.full(num_tokens * top_k, -1, dtype=np.int32)
    used = min(num_tokens * top_k, num_expanded)
    slots[rng.permutation(num_tokens * top_k)[:used]] = rng.permutation(num_expanded)[:used]
    token_topk_to_pos = slots.reshape(num_tokens, top_k)
    if malformed and token_topk_to_pos.size:
        token_topk_to_pos.reshape(-1)[:: 3] = num_expanded + 7
    # rows no valid slot targets are padding: a well-formed map but for the
    # deliberately out-of-range slots
    pos_to_expert = np.full(num_expanded, -1, dtype=np.int32)
    pos_to_expert[token_topk_to_pos[(token_topk_to_pos >= 0) & (token_topk_to_pos < num_expanded)]] = 1
    dmap, dp2e = cupy.asarray(token_topk_to_pos), cupy.asarray(pos_to_expert)
    if layout == "none":
        got = cupy_moe.expand_to_fused(cupy.asarray(x.view(np.uint8).astype(np.uint16)), dmap, dp2e)
        want = reference.expand_to_fused_numpy(x.astype(np.uint16), token_topk_to_pos, pos_to_expert)
        assert np.array_equal(cupy.asnumpy(got), want)
        return
    col_major, sf_dtype = {"row": (False, np.float32), "col-f32": (True, np.float32),
                           "col-ue8m0": (True, np.int32)}[layout]
    s = sf_columns(hidden, npc, packed_ue8m0=sf_dtype is np.int32)
    x_sf = rng.integers(0, 2**32, (num_tokens, s), dtype=np.uint32).view(sf_dtype)
    got_x, got_sf = cupy_moe.expand_to_fused_with_sf(
        cupy.asarray(x), cupy.asarray(x_sf), dmap, dp2e, num_per_channels=npc,
        use_tma_aligned_col_major_sf=col_major)
    want_x, want_sf = reference.expand_to_fused_with_sf_numpy(
        x.view(fp8), x_sf, token_topk_to_pos, pos_to_expert, col_major=col_major)
    assert np.array_equal(cupy.asnumpy(got_x), bits(want_x))
    assert np.array_equal(bits(cupy.asnumpy(got_sf)), bits(want_sf))


def main() -> int:
    registers_only = "--registers-only" in sys.argv[1:]
    saved = dict(_gpu.GRID_POLICY)
    if registers_only:
        _gpu.configure(grid_policy={"BULK_MIN_BLOCKS": float("inf")})
    rng = np.random.default_rng(7)
    cases = 0
    for layout in ("none", "row", "col-f32", "col-ue8m0"):
        for hidden in (1, 7, 37, 577, 7168):
            for num_tokens, top_k, num_expanded in ((5, 3, 17), (0, 8, 6), (4, 2, 0), (33, 9, 301)):
                run_case(rng, num_tokens, hidden, top_k, num_expanded, layout=layout)
                run_case(rng, num_tokens, hidden, top_k, num_expanded, layout=layout, malformed=True)
                cases += 2
    # the bulk-copy kernels (sm_90+) on every batch size: 16-byte rows, whole
    # or split into chunks with a short last one; rows of 8 KiB and more
    # (16400) take the whole-row zero-fill kernel
    if not registers_only:
        _gpu.configure(grid_policy={"BULK_MIN_BLOCKS": 0.0})
    for layout in ("none", "row", "col-f32", "col-ue8m0"):
        for hidden in (16, 2064, 7168, 16400):
            for num_tokens, top_k, num_expanded in ((5, 3, 17), (0, 8, 6), (33, 9, 301)):
                run_case(rng, num_tokens, hidden, top_k, num_expanded, layout=layout)
                run_case(rng, num_tokens, hidden, top_k, num_expanded, layout=layout, malformed=True)
                cases += 2
    _gpu.configure(grid_policy=saved)
    # validate=True: the routing kernels, on a good map and on a bad one
    x = cupy.zeros((3, 64), dtype=cupy.uint16)
    good = cupy.asarray(np.array([[0, 1], [2, -1], [3, 4]], dtype=np.int32))
    cupy_moe.expand_to_fused(x, good, cupy.asarray(np.array([0, 0, 1, 1, 1], np.int32)), validate=True)
    try:
        cupy_moe.expand_to_fused(x, good, cupy.asarray(np.array([0, 0, 1, -1], np.int32)), validate=True)
    except ValueError:
        pass
    else:
        raise AssertionError("validate=True accepted a map with an out-of-range slot")
    cupy.cuda.Device().synchronize()
    print(f"memcheck cases: {cases + 2} calls, all bit-exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
