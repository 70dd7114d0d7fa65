"""Host-side bookkeeping of the GPU backend that needs CuPy but no GPU."""

import pytest

pytest.importorskip("cupy")

from cupy_moe._checks import ExpandProblem  # noqa: E402

from cupy_moe import _gpu  # noqa: E402


def test_configure_forgets_plans_made_under_other_settings():
    kernel, policy = dict(_gpu.KERNEL_CONFIG), dict(_gpu.GRID_POLICY)
    _gpu._plans["stale"] = object()
    _gpu._torch_plans["stale"] = object()
    try:
        _gpu.configure(kernel={"EXPAND_UNROLL": 2}, grid_policy={"SPLIT_SLOTS_BELOW": 0.0})
        assert _gpu.KERNEL_CONFIG["EXPAND_UNROLL"] == 2
        assert _gpu.GRID_POLICY["SPLIT_SLOTS_BELOW"] == 0.0
        assert "stale" not in _gpu._plans and "stale" not in _gpu._torch_plans
        assert ("EXPAND_UNROLL", 2) in _gpu._defines(0)
    finally:
        _gpu.configure(kernel=kernel, grid_policy=policy)
    assert _gpu.KERNEL_CONFIG == kernel and _gpu.GRID_POLICY == policy


def test_argument_blocks_match_the_kernel_structs():
    # struct ExpandArgs: 6 pointers, an int64, 8 int32; RoutingArgs: 4
    # pointers, an int64, an int32 padded to the struct's 8-byte alignment.
    assert _gpu._EXPAND_ARGS.size == 6 * 8 + 8 + 8 * 4
    assert _gpu._ROUTING_ARGS.size == 4 * 8 + 8 + 8


@pytest.fixture
def fake_h200(monkeypatch):
    """Plans for a device 0 with 132 SMs and compute capability 9.x, no GPU needed."""
    monkeypatch.setitem(_gpu._device_traits, 0, (132, 9))
    monkeypatch.setattr(_gpu, "_function", lambda device, sf_mode, name: name)
    yield
    _gpu._plans.clear()


def _launch_for(num_tokens, hidden, item_bytes=2, vec_bytes=16, top_k=8, **sf):
    problem = ExpandProblem(num_tokens, hidden, top_k, num_tokens * top_k,
                            "bfloat16" if item_bytes == 2 else "float8_e4m3fn", **sf)
    return _gpu._Plan(problem, item_bytes, 0).kernel(vec_bytes)


@pytest.mark.parametrize(("num_tokens", "hidden", "chunk_bytes", "chunks"), [
    (4096, 7168, 14336, 1),   # kimi-k2-prefill: whole rows
    (4096, 3072, 6144, 1),    # qwen3-30b-prefill
    (512, 7168, 3584, 4),     # kimi-k2-medium: 2048 blocks >= 12 x 132, equal quarters
    (512, 3072, 2048, 3),     # qwen3-30b-medium: 1536 < 12 x 132, the most chunks of >= 2 KiB
    (32, 7168, 2048, 7),      # kimi-k2-small: 224 blocks >= 132
    (4096, 16384, 16384, 2),  # rows longer than the biggest chunk
    (500, 7000, 3584, 4),     # 14000 bytes: 4 chunks of 7 vectors per lane, the last short
])
def test_bulk_kernel_chunks_for_the_batch(fake_h200, num_tokens, hidden, chunk_bytes, chunks):
    launch = _launch_for(num_tokens, hidden)
    # rows of 8 KiB and more: zero-fill blocks of whole rows
    assert launch.handle == ("expand_to_fused_bulk_zero_rows" if hidden * 2 >= 8192
                             else "expand_to_fused_bulk")
    assert (launch.threads, launch.shared_bytes, launch.grid_y) == (32, chunk_bytes, chunks)
    assert launch.tail[-2:] == (chunk_bytes // 16 // 32, 8)  # vecs_per_thread, slots_per_block
    assert (chunks - 1) * chunk_bytes < launch.tail[0] <= chunks * chunk_bytes  # row_bytes


@pytest.mark.parametrize(("num_tokens", "hidden", "vec_bytes", "major", "top_k"), [
    (1, 7168, 16, 9, 8),      # decode: too few blocks
    (32, 3072, 16, 9, 8),     # qwen3-30b-small: 96 chunks of 2 KiB < 132 SMs
    (4096, 7168, 8, 9, 8),    # 8-byte aligned rows
    (4096, 7168, 16, 8, 8),   # sm_80: no bulk-copy engine
    (4096, 7168, 16, 9, 33),  # more slots than the warp's lanes
])
def test_register_kernel_elsewhere(fake_h200, monkeypatch, num_tokens, hidden, vec_bytes, major,
                                   top_k):
    monkeypatch.setitem(_gpu._device_traits, 0, (132, major))
    launch = _launch_for(num_tokens, hidden, vec_bytes=vec_bytes, top_k=top_k)
    assert launch.handle == f"expand_to_fused_v{vec_bytes}"
    assert (launch.threads, launch.shared_bytes) == (_gpu.KERNEL_CONFIG["EXPAND_THREADS"], 0)


def test_no_tokens_take_the_register_kernel_even_when_bulk_is_forced(fake_h200):
    # T == 0 only zero-fills; the bulk kernel's chunking divides by T
    policy = dict(_gpu.GRID_POLICY)
    _gpu.configure(grid_policy={"BULK_MIN_BLOCKS": 0.0})
    try:
        assert _launch_for(0, 7168).handle == "expand_to_fused_v16"
    finally:
        _gpu.configure(grid_policy=policy)


@pytest.mark.parametrize(("bulk_min_blocks", "handle"), [
    (0.0, "expand_to_fused_bulk"), (float("inf"), "expand_to_fused_v16")])
def test_forcing_a_kernel_reaches_small_batches(fake_h200, bulk_min_blocks, handle):
    # what the GPU tests' kernel_path fixture relies on: 5 tokens of 32-byte rows
    policy = dict(_gpu.GRID_POLICY)
    _gpu.configure(grid_policy={"BULK_MIN_BLOCKS": bulk_min_blocks})
    try:
        assert _launch_for(5, 16).handle == handle
        assert _launch_for(4096, 7168).handle.startswith(handle)  # bulk: either zero-fill
    finally:
        _gpu.configure(grid_policy=policy)


@pytest.mark.parametrize(("num_tokens", "hidden", "num_expanded", "col_major", "grid"), [
    # decode, register kernel, slots split over 8 planes: 16 rows in 2-row
    # zero-fill blocks = 8 blocks, one column of them across the planes
    (1, 7168, 16, False, (1 + 1, 4, 8)),
    # 40 rows -> 20 zero-fill blocks over 8 planes: 3 columns (4 blocks idle)
    (1, 7168, 40, False, (1 + 3, 4, 8)),
    # column-major SF: the pad columns count, align(18, 4) = 20 rows
    (1, 1024, 18, True, (1 + 2, 1, 8)),
    # qwen3-30b-medium, bulk kernel, 3 chunks: 4096 rows in 4-row blocks of a chunk
    (512, 3072, 4096, False, (512 + 1024, 3, 1)),
    # kimi-k2-prefill, 14 KiB rows: 32768 rows in 2-row blocks of whole rows
    (4096, 7168, 32768, False, (4096 + 16384, 1, 1)),
    # kimi-k2-medium, 4 chunks: 2048 whole-row blocks, numbered across the y planes
    (512, 7168, 4096, False, (512 + 512, 4, 1)),
    # kimi-k2-small, 7 chunks: 128 whole-row blocks over 7 planes, 19 columns (5 idle)
    (32, 7168, 256, False, (32 + 19, 7, 1)),
])
def test_zero_fill_blocks_span_the_slot_planes(fake_h200, num_tokens, hidden, num_expanded,
                                               col_major, grid):
    item_bytes = 1 if col_major else 2
    sf = {"sf_columns": 2, "sf_col_major": True} if col_major else {}
    problem = ExpandProblem(num_tokens, hidden, 8, num_expanded,
                            "float8_e4m3fn" if col_major else "bfloat16", **sf)
    launch = _gpu._Plan(problem, item_bytes, 0).kernel(16)
    assert (launch.grid_x, launch.grid_y, launch.grid_z) == grid
    rows = launch.tail[6]
    zero_rows = -(-num_expanded // 4) * 4 if col_major else num_expanded
    # every row is some zero-fill block's, and no whole column of blocks is idle
    columns = launch.grid_x - num_tokens
    planes = launch.grid_z * (launch.grid_y if launch.handle.endswith("_zero_rows") else 1)
    assert columns * planes * rows >= zero_rows > (columns - 1) * planes * rows


def test_whole_row_zero_fill_policy_reaches_short_rows(fake_h200):
    # what the GPU tests' "bulk-zero-rows" kernel path relies on: 2 KiB rows
    # of 5 tokens take the whole-row zero-fill kernel, cut into 4 chunks
    policy = dict(_gpu.GRID_POLICY)
    _gpu.configure(grid_policy={"BULK_MIN_BLOCKS": 0.0, "BULK_WHOLE_ROW_ZERO_FROM": 0,
                                "BULK_MIN_CHUNK_BYTES": 512})
    try:
        launch = _launch_for(5, 1024)
        assert launch.handle == "expand_to_fused_bulk_zero_rows"
        assert (launch.shared_bytes, launch.grid_y) == (512, 4)
    finally:
        _gpu.configure(grid_policy=policy)


def test_bulk_slot_planes_split_the_slots_and_share_the_zero_fill(fake_h200):
    # kimi-k2-small with the (default-off) slot split forced into 3 planes:
    # 8 slots -> 3 per block, planes of 3, 3, 2; the 128 whole-row zero-fill
    # blocks spread over 7 chunks x 3 planes: 7 columns (19 blocks idle)
    policy = dict(_gpu.GRID_POLICY)
    _gpu.configure(grid_policy={"BULK_SPLIT_SLOTS_BELOW": float("inf"), "BULK_SLOT_PLANES": 3})
    try:
        launch = _launch_for(32, 7168)
        assert launch.handle == "expand_to_fused_bulk_zero_rows"
        assert (launch.grid_x, launch.grid_y, launch.grid_z) == (32 + 7, 7, 3)
        assert launch.tail[-1] == 3  # slots_per_block
    finally:
        _gpu.configure(grid_policy=policy)


@pytest.mark.parametrize("rows", [0, 33])
def test_rows_per_zero_fill_block_must_fit_a_warp_ballot(fake_h200, rows):
    policy = dict(_gpu.GRID_POLICY)
    _gpu.configure(grid_policy={"ZERO_ROWS_REGISTERS": rows})
    try:
        with pytest.raises(ValueError, match=rf"rows per zero-fill block must be in 1 \.\. 32, "
                                             rf"not {rows}"):
            _launch_for(1, 7168)
    finally:
        _gpu.configure(grid_policy=policy)


@pytest.mark.parametrize(("num_expanded", "sf_columns"), [(16, 14), (18, 14), (0, 3), (5, 1)])
def test_torch_column_major_sf_buffer_holds_the_pad_columns(num_expanded, sf_columns):
    # The allocation the GPU path makes, on CPU tensors: an [X, S] view with
    # strides (1, align(X, 4)) of a buffer of S * align(X, 4) elements.
    torch = pytest.importorskip("torch")
    leading_dim = -(-num_expanded // 4) * 4
    like = torch.zeros(1, sf_columns, dtype=torch.int32)
    out_sf = _gpu._TorchCuda.empty_col_major(sf_columns, leading_dim, num_expanded, like)
    assert tuple(out_sf.shape) == (num_expanded, sf_columns)
    if num_expanded > 0:
        assert out_sf.stride() == (1, leading_dim)
    assert out_sf.untyped_storage().nbytes() == sf_columns * leading_dim * 4
    assert out_sf.dtype == torch.int32


def test_torch_signature_keys_everything_the_checks_read():
    # CPU tensors stand in for CUDA ones: the key is built the same way.
    torch = pytest.importorskip("torch")
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    m = torch.zeros(2, 3, dtype=torch.int32)
    p = torch.zeros(6, dtype=torch.int32)
    sf = torch.zeros(2, 1, dtype=torch.float32)
    out = torch.zeros(6, 8, dtype=torch.bfloat16)

    def key(*args, npc=None, col=False):
        return _gpu._torch_signature(*args, npc, col)

    base = key(x, None, m, p, None, None)
    assert base[-1] is True  # all contiguous
    variants = [
        key(x[:, :4], None, m, p, None, None),                   # another shape
        key(x.half(), None, m, p, None, None),                   # another dtype
        key(x, None, m.long(), p, None, None),                   # map dtype
        key(x, None, m, p[:5], None, None),                      # X
        key(x, None, m, p, out, None),                           # out given
        key(x, sf, m, p, None, None, npc=128),                   # SF op
        key(x, sf, m, p, None, None, npc=128, col=True),         # its layout
    ]
    assert len({base, *variants}) == len(variants) + 1
    # an SF op with out and one with x_sf only never share a key
    assert key(x, sf, m, p, out, None, npc=128) != key(x, sf, m, p, None, None, npc=128)
    # a non-contiguous argument is keyed as such (the fast path never stores it)
    assert key(x.t().contiguous().t(), None, m, p, None, None)[-1] is False
    assert key(x, None, m, p, out[:, ::2], None)[-1] is False
    # not taken: a caller's out_sf, an argument that is not exactly a tensor
    assert key(x, sf, m, p, None, torch.zeros(2, 1), npc=128) is None
    assert key(x, None, m.numpy(), p, None, None) is None
