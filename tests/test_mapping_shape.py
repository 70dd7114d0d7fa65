"""The launch shape of ``fused_mapping``'s kernels (pure Python, no GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_moe.mapping.launch_shape import (
    COOP_MAX_BLOCK_SLOTS,
    COOP_MIN_SLOTS,
    COUNT_SHARED_INTS,
    MAX_WARPS,
    MIN_WARPS,
    SELF_COUNT_MAX_SLOTS,
    WARP_PLAN_MAX_SLOTS,
    MappingShape,
    mapping_shape,
    max_warps_for,
)

H200 = {"multiprocessors": 132, "shared_bytes_optin": 232448}


@pytest.mark.parametrize(("slots", "experts", "rows", "expected"), [
    # decode: the one-warp plan, a block for each 256 padding rows (or experts)
    (8, 384, 1024, MappingShape(8, 4, 32, True, 0, one_warp=True)),
    (32, 4096, 100, MappingShape(8, 16, 32, True, 0, one_warp=True)),
    (1, 1, 1, MappingShape(8, 1, 32, True, 0, one_warp=True)),
    (8, 8, 10**6, MappingShape(8, 132, 32, True, 0, one_warp=True)),
    # few slots, many padding rows: blocks for the padding (~4 rows a thread)
    (256, 256, 32768, MappingShape(8, 32, 32, True, 4 * 11 * 256)),
    # medium: block counts first (two launches), blocks of 8 warps, as many
    # as the padding wants (36, a multiple of the 5 a count block covers)
    (4096, 256, 36608, MappingShape(8, 35, 32, False, 4 * 11 * 256, 5)),
    # prefill without a cooperative launch: a 32-slot step per warp, 16
    # warps a block; blocks capped by the counts a block sums
    # (8 count blocks, each covering 8 place blocks)
    (32768, 384, 81536, MappingShape(16, 64, 32, False, 4 * 19 * 384, 8)),
    (65536, 384, 114304, MappingShape(16, 64, 64, False, 4 * 19 * 384, 8)),
    # many experts: warps limited by shared memory, blocks by the counts read
    (81920, 4096, 600000, MappingShape(11, 6, 1248, False, 4 * 14 * 4096)),
])
def test_default_shapes(slots, experts, rows, expected):
    shape = mapping_shape(slots, experts, rows, **H200)
    assert shape == expected
    assert shape.blocks * shape.warps * shape.warp_slots >= slots
    assert shape.shared_bytes <= H200["shared_bytes_optin"] - 1024


def test_every_slot_has_a_warp_and_shapes_stay_in_bounds():
    for slots in (0, 1, 31, 32, 33, 1000, SELF_COUNT_MAX_SLOTS, SELF_COUNT_MAX_SLOTS + 1,
                  10**6):
        for experts in (1, 7, 384, 4096):
            shape = mapping_shape(slots, experts, slots + 128 * experts, **H200)
            assert shape.blocks * shape.warps * shape.warp_slots >= slots
            assert shape.warp_slots % 32 == 0 and shape.warp_slots >= 32
            assert 1 <= shape.warps <= MAX_WARPS and 1 <= shape.blocks <= 132
            assert shape.self_counting == (slots <= SELF_COUNT_MAX_SLOTS)
            assert shape.blocks % shape.count_split == 0
            assert shape.count_split * experts <= COUNT_SHARED_INTS or shape.count_split == 1
            if experts <= 1024:
                assert shape.warps >= MIN_WARPS


def test_overrides_and_their_errors():
    shape = mapping_shape(32768, 384, 81536, **H200, warps=4, blocks=500)
    # 500 blocks: 32 to a count block (at most 12288 counters: 32 x 384), 15 count blocks
    assert (shape.warps, shape.blocks, shape.warp_slots, shape.count_split) == (4, 480, 32, 32)
    with pytest.raises(ValueError, match=r"warps must be in 1\.\.32 for 384 experts; got 33"):
        mapping_shape(32768, 384, 81536, **H200, warps=33)
    with pytest.raises(ValueError, match=r"warps must be in 1\.\.11 for 4096 experts; got 12"):
        mapping_shape(32768, 4096, 81536, **H200, warps=12)
    with pytest.raises(ValueError, match="blocks must be >= 1; got 0"):
        mapping_shape(32768, 384, 81536, **H200, blocks=0)


@pytest.mark.parametrize(("slots", "experts", "rows", "expected"), [
    # few slots: self-counting whatever the GPU can do
    (8, 384, 1024, MappingShape(8, 4, 32, True, 0, one_warp=True)),
    (33, 384, 1024, MappingShape(8, 1, 32, True, 4 * 11 * 384)),
    # medium: two launches still
    (4096, 256, 36608, MappingShape(8, 35, 32, False, 4 * 11 * 256, 5)),
    # more: one cooperative launch, no count blocks; blocks a power of two
    # up to 24576 // E, 8 warps
    (32768, 128, 49024, MappingShape(8, 128, 32, False, 4 * 11 * 128, 1, True)),
    (32768, 256, 65280, MappingShape(8, 64, 64, False, 4 * 11 * 256, 1, True)),
    (32768, 384, 81536, MappingShape(8, 64, 64, False, 4 * 11 * 384, 1, True)),
    (65536, 384, 114304, MappingShape(8, 64, 128, False, 4 * 11 * 384, 1, True)),
])
def test_cooperative_shapes(slots, experts, rows, expected):
    assert mapping_shape(slots, experts, rows, **H200, cooperative=True) == expected


def test_cooperative_from_just_above_the_medium_slots():
    assert not mapping_shape(COOP_MIN_SLOTS, 256, 40000, **H200, cooperative=True).cooperative
    shape = mapping_shape(COOP_MIN_SLOTS + 1, 256, 40000, **H200, cooperative=True)
    assert shape.cooperative and shape.warps == 8
    # a given grid too
    assert mapping_shape(32768, 384, 81536, **H200, blocks=32, cooperative=True).warps == 8
    assert mapping_shape(32768, 384, 81536, **H200, blocks=132, cooperative=True).warps == 8


def test_a_cooperative_launch_keeps_every_block_resident():
    shape = mapping_shape(32768, 384, 81536, **H200, blocks=132, cooperative=True)
    assert (shape.blocks, shape.count_split, shape.cooperative) == (132, 1, True)
    with pytest.raises(ValueError, match=r"at most a block per multiprocessor \(132\); "
                                         r"got 133 blocks"):
        mapping_shape(32768, 384, 81536, **H200, blocks=133, cooperative=True)


def test_a_cooperative_block_keeps_to_its_warps_and_uint16_counts():
    with pytest.raises(ValueError, match="a cooperative launch has at most 16 warps a block; "
                                         "got 32"):
        mapping_shape(32768, 384, 81536, **H200, warps=32, cooperative=True)
    # 10 million slots on 64 blocks: 156,672 a block, more than uint16 counts
    # hold, so count blocks and place blocks instead
    shape = mapping_shape(10**7, 384, 10**7 + 128 * 384, **H200, cooperative=True)
    assert not shape.cooperative and shape.count_split > 1
    assert shape.warps * shape.warp_slots > COOP_MAX_BLOCK_SLOTS
    shape = mapping_shape(64 * COOP_MAX_BLOCK_SLOTS // 2, 384, 10**7, **H200, cooperative=True)
    assert shape.cooperative and shape.warps * shape.warp_slots <= COOP_MAX_BLOCK_SLOTS


def test_experts_that_do_not_fit_shared_memory_are_refused():
    assert max_warps_for(4096, 48 * 1024) < 1
    with pytest.raises(ValueError, match="4096 experts do not fit the 49152 bytes"):
        mapping_shape(33, 4096, 100, 132, 48 * 1024)
    # the one-warp plan keeps no counter per expert
    assert mapping_shape(32, 4096, 100, 132, 48 * 1024).one_warp


def test_the_one_warp_plan_and_its_errors():
    assert not mapping_shape(8, 384, 1024, **H200, one_warp=False).one_warp
    shape = mapping_shape(WARP_PLAN_MAX_SLOTS, 384, 1024, **H200, warps=2, blocks=300)
    assert (shape.warps, shape.blocks, shape.one_warp, shape.self_counting) == (2, 300, True, True)
    with pytest.raises(ValueError, match="the one-warp plan takes at most 32 slots; got 33"):
        mapping_shape(33, 384, 1024, **H200, one_warp=True)
    with pytest.raises(ValueError, match=r"warps must be in 1\.\.8 for the one-warp plan; got 9"):
        mapping_shape(8, 384, 1024, **H200, warps=9)
    with pytest.raises(ValueError, match="blocks must be >= 1; got 0"):
        mapping_shape(8, 384, 1024, **H200, blocks=0)


def test_the_plan_names_its_kernels_and_aligns_its_scratch(monkeypatch):
    """MappingPlan (host bookkeeping, no GPU): one cooperative kernel, or the
    place and count kernels (the place kernel's handle first: its shared
    memory is set), from the one build; the scratch starts on a 16-byte
    boundary (the column sums' 16-byte loads)."""
    pytest.importorskip("cupy")
    from cupy_moe.mapping import gpu
    from cupy_moe.mapping.rules import MappingProblem
    from cupy_moe.runtime import launch
    from cupy_moe.runtime.launch import DeviceTraits

    monkeypatch.setitem(launch._device_traits, 0, DeviceTraits(132, 9, 232448, True))
    requested = []
    monkeypatch.setattr(gpu, "function_handle",
                        lambda source, defines, device, name: requested.append((defines, name))
                        or len(requested))
    monkeypatch.setattr(gpu.driver, "funcSetAttribute", lambda *args: None)
    problem = MappingProblem(4096, 8, 384, 128, 81536, "int64")
    shape = mapping_shape(32768, 384, 81536, **H200, cooperative=True)
    plan = gpu.MappingPlan(problem, 0, shape)
    # the module of the plan's own kernels for int64 ids alone (MAPPING_IDS:
    # 1 int32, 2 int64; MAPPING_KERNELS: bit 0 count, 1 place, 2 coop)
    assert requested == [((("MAPPING_IDS", 2), ("MAPPING_KERNELS", 4)), "mapping_coop_i64")]
    requested.clear()
    gpu.MappingPlan(problem, 0, mapping_shape(32768, 384, 81536, **H200))
    count_and_place = (("MAPPING_IDS", 2), ("MAPPING_KERNELS", 3))
    assert requested == [(count_and_place, "mapping_place_i64"),
                         (count_and_place, "mapping_count_i64")]
    requested.clear()
    gpu.MappingPlan(MappingProblem(4096, 8, 384, 128, 81536, "int32"), 0,
                    mapping_shape(32768, 384, 81536, **H200))
    count_and_place = (("MAPPING_IDS", 1), ("MAPPING_KERNELS", 3))
    assert requested == [(count_and_place, "mapping_place_i32"),
                         (count_and_place, "mapping_count_i32")]
    assert plan.offsets[3] % 4 == 0
    # the torch views (one split) are the array views (seven slices)
    torch = pytest.importorskip("torch")
    buffer = np.arange(plan.buffer_size, dtype=np.int32)
    for got, want in zip(plan.torch_views(torch.from_numpy(buffer)), plan.views(buffer),
                         strict=True):
        assert got.shape == want.shape and np.array_equal(got.numpy(), want)


def test_cluster_shapes():
    """cluster_blocks: the default cooperative grid follows from the rows a
    block sums after the grid barrier (blocks / C), so E = 384 takes 128
    blocks, not 64; a block keeps one more counter row (its totals, for the
    cluster to read)."""
    shape = mapping_shape(32768, 384, 81536, **H200, cooperative=True, cluster_blocks=8)
    assert shape == MappingShape(8, 128, 32, False, 4 * 12 * 384, 1, True, cluster_blocks=8)
    shape = mapping_shape(65536, 384, 114304, **H200, cooperative=True, cluster_blocks=4)
    assert (shape.blocks, shape.warp_slots, shape.cluster_blocks) == (128, 64, 4)
    # clusters of 2 at E = 128: the plain grid already (128 blocks)
    shape = mapping_shape(32768, 128, 49024, **H200, cooperative=True, cluster_blocks=2)
    assert (shape.blocks, shape.cluster_blocks) == (128, 2)
    # no cooperative launch, no clusters
    assert mapping_shape(4096, 256, 36608, **H200, cooperative=True,
                         cluster_blocks=8).cluster_blocks == 0
    assert mapping_shape(32768, 384, 81536, **H200, cluster_blocks=8).cluster_blocks == 0
    # a cluster's totals must fit uint16: 8 blocks of 16,384 slots do not
    shape = mapping_shape(16 * 16384, 384, 10**6, **H200, blocks=16, cooperative=True,
                          cluster_blocks=8)
    assert shape.cooperative and shape.warps * shape.warp_slots == 16384
    assert shape.cluster_blocks == 0 and shape.shared_bytes == 4 * 11 * 384
    # dropped clusters leave the plain default shape, its own grid (not the
    # larger one the clusters' rule gives)
    # (2^21 slots in clusters of 2 fit: 128 blocks of 16,384 slots, 32,768 a cluster)
    shape = mapping_shape(2**21, 384, 2**23, **H200, cooperative=True, cluster_blocks=2)
    assert (shape.blocks, shape.cluster_blocks) == (128, 2)
    for slots, cluster in ((2**21, 8), (2**22, 2), (2**22, 8)):
        got = mapping_shape(slots, 384, 4 * slots, **H200, cooperative=True,
                            cluster_blocks=cluster)
        assert got == mapping_shape(slots, 384, 4 * slots, **H200, cooperative=True)
    # nor where the cluster's counter row would not fit a block's shared memory
    room = 4 * (8 + 3) * 1000 + 1024  # 8 warps' rows and three more, E = 1000
    assert mapping_shape(32768, 1000, 10**6, 132, room, warps=8, cooperative=True,
                         cluster_blocks=2).cluster_blocks == 0
    assert mapping_shape(32768, 1000, 10**6, 132, room + 4000, warps=8, cooperative=True,
                         cluster_blocks=2).cluster_blocks == 2


def test_cluster_shapes_refused():
    with pytest.raises(ValueError, match=r"cluster_blocks must be 0 or one of \(2, 4, 8\); "
                                         r"got 3"):
        mapping_shape(32768, 384, 81536, **H200, cooperative=True, cluster_blocks=3)
    for bad, kind in ((8.0, "float"), (True, "bool"), ("8", "str")):
        with pytest.raises(TypeError, match=f"cluster_blocks must be an int; got {kind}"):
            mapping_shape(32768, 384, 81536, **H200, cooperative=True, cluster_blocks=bad)
    assert mapping_shape(32768, 384, 81536, **H200, cooperative=True,
                         cluster_blocks=np.int64(8)).cluster_blocks == 8
    with pytest.raises(ValueError, match="clusters of 8 blocks do not divide a grid of 100 "
                                         "blocks"):
        mapping_shape(32768, 384, 81536, **H200, blocks=100, cooperative=True,
                      cluster_blocks=8)


def test_a_cluster_plan_launches_cooperative_in_clusters(monkeypatch):
    """MappingPlan (host bookkeeping, no GPU) for clusters: its kernel, one
    cooperative launch in clusters; refused before sm_90, with a cluster
    size the kernel does not take, or where the GPU holds too few clusters
    at once for every block to be resident."""
    pytest.importorskip("cupy")
    from cupy_moe.mapping import gpu
    from cupy_moe.mapping.rules import MappingProblem
    from cupy_moe.runtime import launch
    from cupy_moe.runtime.launch import DeviceTraits

    monkeypatch.setitem(launch._device_traits, 0, DeviceTraits(132, 9, 232448, True))
    requested, launched, asked = [], [], []
    monkeypatch.setattr(gpu, "function_handle",
                        lambda source, defines, device, name: requested.append(name) or name)
    monkeypatch.setattr(gpu.driver, "funcSetAttribute", lambda *args: None)
    monkeypatch.setattr(gpu, "launch_cooperative_in_clusters",
                        lambda *args: launched.append(args))
    monkeypatch.setattr(gpu, "max_active_clusters",
                        lambda *args: asked.append(args) or 16)
    problem = MappingProblem(4096, 8, 384, 128, 81536, "int64")
    shape = mapping_shape(32768, 384, 81536, **H200, cooperative=True, cluster_blocks=8)
    plan = gpu.MappingPlan(problem, 0, shape)
    assert requested == ["mapping_coop_cluster_i64"]
    assert asked == [("mapping_coop_cluster_i64", 256, 4 * 12 * 384, 8)]
    plan.launch(7, 0x1000, 0x2000)
    handle, blocks, threads, shared_bytes, stream, _, cluster = launched[0]
    assert (handle, blocks, threads, shared_bytes, stream, cluster) == (
        "mapping_coop_cluster_i64", 128, 256, 4 * 12 * 384, 7, 8)
    # the same scratch as without clusters: a row a block (the clusters' rows first)
    plain = gpu.MappingPlan(problem, 0, shape._replace(cluster_blocks=0))
    assert plan.buffer_size == plain.buffer_size and plan.total_index == plain.total_index
    monkeypatch.setattr(gpu, "max_active_clusters", lambda *args: 15)
    with pytest.raises(ValueError, match="this GPU holds 15 clusters of 8 blocks at once; a "
                                         "cooperative grid of 128 blocks needs 16"):
        gpu.MappingPlan(problem, 0, shape)
    for bad, why in (
            (shape._replace(cluster_blocks=3), r"cluster_blocks must be one of \(2, 4, 8\) and "
                                               r"divide the blocks of a cooperative grid on "
                                               r"sm_90\+; got cluster_blocks=3, 128 blocks"),
            (shape._replace(blocks=60), r"got cluster_blocks=8, 60 blocks, cooperative=True"),
            (shape._replace(cooperative=False), r"128 blocks, cooperative=False, sm_9x"),
            (shape._replace(warp_slots=2048), r"a cluster's slot counts are uint16: 8 blocks "
                                              r"of 16384 slots pass 65535"),
            # a hand-edited shape (sweeps) without the cluster's counter row
            (shape._replace(shared_bytes=4 * 11 * 384),
             r"the place kernel needs 18432 bytes of shared memory for 8 warps and 384 "
             r"experts in clusters; the shape gives 16896")):
        with pytest.raises(ValueError, match=why):
            gpu.MappingPlan(problem, 0, bad)
    monkeypatch.setitem(launch._device_traits, 0, DeviceTraits(108, 8, 166912, True))
    with pytest.raises(ValueError, match=r"128 blocks, cooperative=True, sm_8x"):
        gpu.MappingPlan(problem, 0, shape)


def test_the_default_plan_takes_clusters_where_they_are_the_default_and_fit(monkeypatch):
    """DEFAULT_CLUSTER_BLOCKS (0 until measured): set, a default plan on
    sm_90+ takes clusters where the GPU holds its grid's clusters at once,
    else (or where the driver refuses the query) the plain cooperative grid;
    before sm_90 never."""
    pytest.importorskip("cupy")
    from cupy_moe.mapping import gpu, launch_shape
    from cupy_moe.mapping.rules import MappingProblem
    from cupy_moe.runtime import launch
    from cupy_moe.runtime.launch import DeviceTraits

    monkeypatch.setitem(launch._device_traits, 0, DeviceTraits(132, 9, 232448, True))
    monkeypatch.setattr(gpu, "function_handle", lambda source, defines, device, name: name)
    monkeypatch.setattr(gpu.driver, "funcSetAttribute", lambda *args: None)
    held = [16]
    monkeypatch.setattr(gpu, "max_active_clusters", lambda *args: held[0])
    problem = MappingProblem(4096, 8, 384, 128, 81536, "int32")
    assert gpu.MappingPlan(problem, 0).shape.cluster_blocks == 0  # the shipped default
    monkeypatch.setattr(launch_shape, "DEFAULT_CLUSTER_BLOCKS", 8)
    shape = gpu.MappingPlan(problem, 0).shape
    assert (shape.blocks, shape.cluster_blocks) == (128, 8)
    held[0] = 15
    shape = gpu.MappingPlan(problem, 0).shape
    assert (shape.blocks, shape.cluster_blocks) == (64, 0)
    def refused(*args):
        # (made without __init__, which asks the driver library for the message)
        raise gpu.driver.CUDADriverError.__new__(gpu.driver.CUDADriverError)

    monkeypatch.setattr(gpu, "max_active_clusters", refused)
    shape = gpu.MappingPlan(problem, 0).shape
    assert (shape.blocks, shape.cluster_blocks) == (64, 0)
    monkeypatch.setattr(gpu, "max_active_clusters", lambda *args: 16)
    monkeypatch.setitem(launch._device_traits, 0, DeviceTraits(132, 8, 232448, True))
    assert gpu.MappingPlan(problem, 0).shape.cluster_blocks == 0
