"""The worker side of tests/test_distributed.py: gloo processes that run checks.

``run_checks(world_size, names)`` (in the test process) starts ``world_size``
processes (forked from a forkserver that has imported torch once: a spawned
process pays ~2 s of imports); each joins a gloo group (a file:// store in a
temporary directory), runs the named checks of ``CHECKS`` in order and sends
back, per check, None or the traceback of its failure. A rank stops at its first
failure (the others may be waiting for it in a collective: they fail when it
leaves, or at the group's timeout). The parent waits up to a deadline, then
kills what is left, so a hang fails the test instead of blocking CI.

Every rank builds the inputs of every rank from fixed seeds, so each can
compute its expected results without communication. The oracles are plain
loops over tokens and slots, written from the contract, not from the code.

The same checks run on CUDA tensors (tests/test_distributed_gpu.py):
``run_checks(..., device="cuda")`` puts rank r on GPU r % count (ranks may
share a GPU: gloo moves CUDA tensors through host memory, NCCL needs a GPU a
rank), with ``backend="gloo"`` or ``"nccl"``. Each worker keeps its device
in ``DEVICE``: inputs go there (``on_device``), results come back to the
host for the oracles (``host_bits``, ``host_numpy``).
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import queue
import tempfile
import time
import traceback

import ml_dtypes
import numpy as np
import pytest
from helpers import (
    assert_bits_equal,
    from_torch,
    oracle_expand,
    random_payload,
    to_torch,
)

# seconds: a collective waiting for a rank that is gone, and a whole job
GROUP_TIMEOUT_S = 30
JOB_TIMEOUT_S = 120
BF16 = ml_dtypes.bfloat16
# forkserver where the platform has it (Linux, macOS), else spawn
START_METHOD = ("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                else "spawn")


# --- the parent side -----------------------------------------------------------

def run_checks(world_size: int, names: list[str], *, backend: str = "gloo",
               device: str = "cpu") -> dict[str, str | None]:
    """Run ``names`` on ``world_size`` ranks of ``backend`` with tensors on
    ``device`` ("cpu" or "cuda"); per check, None when it passed on every
    rank, else what failed (rank, traceback)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        # the server imports torch once; every rank of every job forks from it
        # (a spawned rank would pay the import each time)
        ctx.set_forkserver_preload(["torch", "torch.distributed", "cupy_moe.distributed",
                                    "cupy_moe.layer", "distributed_cases"])
    results_queue = ctx.Queue()
    failures: dict[str, list[str]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "store")
        processes = [ctx.Process(target=worker, args=(rank, world_size, init_file, names,
                                                      results_queue, backend, device),
                                 daemon=True)
                     for rank in range(world_size)]
        for process in processes:
            process.start()
        reported: dict[int, dict[str, str | None]] = {}
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while len(reported) < world_size and time.monotonic() < deadline:
            try:
                rank, results = results_queue.get(timeout=0.5)
                reported[rank] = results
            except queue.Empty:
                if all(not p.is_alive() for p in processes) and results_queue.empty():
                    break
        for process in processes:  # a rank that reported exits at once
            process.join(timeout=max(0.0, deadline - time.monotonic()) + 1)
            if process.is_alive():
                process.kill()
                process.join()
    for rank in range(world_size):
        if rank not in reported:
            why = (f"timed out after {JOB_TIMEOUT_S} s (a hang?)"
                   if processes[rank].exitcode in (None, -9) else
                   f"exited with code {processes[rank].exitcode} before reporting")
            for name in names:
                failures[name].append(f"rank {rank}: {why}")
            continue
        for name in names:
            if name not in reported[rank]:
                failures[name].append(f"rank {rank}: not run (an earlier check failed)")
            elif reported[rank][name] is not None:
                failures[name].append(f"rank {rank}:\n{reported[rank][name]}")
    return {name: "\n".join(why) if why else None for name, why in failures.items()}


# this worker's tensors' device (run_checks' ``device``; rank r on GPU r % count)
DEVICE = None


def worker(rank: int, world_size: int, init_file: str, names: list[str],
           results_queue, backend: str = "gloo", device: str = "cpu") -> None:
    """One rank: join the group, run the checks, report, leave the group."""
    global DEVICE
    results: dict[str, str | None] = {}
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # several ranks share the CPU
        DEVICE = torch.device("cpu")
        if device == "cuda":
            DEVICE = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(DEVICE)
        dist.init_process_group(backend, init_method="file://" + init_file, rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        try:
            for name in names:
                try:
                    CHECKS[name](rank, world_size)
                    results[name] = None
                except BaseException:  # noqa: BLE001 - reported to the parent
                    results[name] = traceback.format_exc()
                    break
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - e.g. the group could not be formed
        results.setdefault(names[0], traceback.format_exc())
    results_queue.put((rank, results))


# --- tensors on the worker's device, bits back on the host ----------------------

def on_device(array: np.ndarray):
    """A tensor of ``array``'s dtype and bits on this worker's device."""
    tensor = to_torch(array)
    return tensor if DEVICE is None else tensor.to(DEVICE)


def host_bits(tensor) -> np.ndarray:
    """``from_torch`` of a tensor on any device (a host copy)."""
    return from_torch(tensor.cpu())


def host_numpy(tensor) -> np.ndarray:
    """A NumPy copy of an integer or float32 tensor on any device."""
    return tensor.cpu().numpy()


def zeros(shape, dtype):
    """torch.zeros on this worker's device."""
    import torch

    return torch.zeros(shape, dtype=dtype, device=DEVICE)


def ones(shape, dtype):
    """torch.ones on this worker's device."""
    import torch

    return torch.ones(shape, dtype=dtype, device=DEVICE)


# --- inputs every rank can rebuild ---------------------------------------------

def tokens_per_rank(world_size: int) -> list[int]:
    """T of each rank: rank 1 has none."""
    return [11, 0, 7, 5, 3, 9, 1, 4][:world_size]


def routing_inputs(world_size: int, num_experts: int, top_k: int, seed: int):
    """Per rank: topk_ids [T, K] int64 with dropped (-2, -1) and out-of-range
    (E, E + 1) ids and repeated experts, and topk_weights [T, K] float32."""
    out = []
    for rank, tokens in enumerate(tokens_per_rank(world_size)):
        rng = np.random.default_rng([seed, rank])
        ids = rng.integers(-2, num_experts + 2, size=(tokens, top_k))
        weights = rng.standard_normal((tokens, top_k), dtype=np.float32)
        out.append((ids, weights))
    return out


# --- the oracles ---------------------------------------------------------------

def oracle_routes(all_ids: list[np.ndarray], num_experts: int, world_size: int, dest: int):
    """What rank ``dest`` receives: [(source rank, token)] in arrival order,
    and their local ids [N, K] int32 (-1 where the slot is not ``dest``'s)."""
    local = num_experts // world_size
    rows, local_ids = [], []
    for source, ids in enumerate(all_ids):
        for t in range(ids.shape[0]):
            mine = [int(e) - dest * local if 0 <= e < num_experts and e // local == dest else -1
                    for e in ids[t]]
            if max(mine) >= 0:
                rows.append((source, t))
                local_ids.append(mine)
    top_k = all_ids[0].shape[1]
    return rows, np.array(local_ids, dtype=np.int32).reshape(-1, top_k)


def oracle_plan(local_ids: np.ndarray, local_experts: int, alignment: int):
    """The received rows' plan: fused_mapping's, X = the bound for the local slots."""
    from cupy_moe.mapping import fused_mapping_numpy, worst_case_rows

    slots = int(np.count_nonzero(local_ids >= 0))
    return fused_mapping_numpy(local_ids, local_experts, alignment=alignment,
                               num_expanded=worst_case_rows(slots, local_experts, alignment))


def oracle_send(ids: np.ndarray, num_experts: int, world_size: int):
    """(send_splits, send_token_index) of one rank's ids."""
    local = num_experts // world_size
    splits, index = [], []
    for dest in range(world_size):
        tokens = [t for t in range(ids.shape[0])
                  if any(0 <= e < num_experts and e // local == dest for e in ids[t])]
        splits.append(len(tokens))
        index += tokens
    return tuple(splits), np.array(index, dtype=np.int64)


# --- the checks ----------------------------------------------------------------

def _check_dispatch(rank, world, all_ids, all_weights, all_x, num_experts, alignment,
                    all_sf=None, **sf_options):
    """One dispatch call against the oracle; returns it."""
    from cupy_moe.distributed import dispatch

    sf = None if all_sf is None else on_device(all_sf[rank])
    result = dispatch(on_device(all_x[rank]), on_device(all_ids[rank]),
                      on_device(all_weights[rank]), num_experts, x_sf=sf,
                      alignment=alignment, **sf_options)
    handle = result.handle
    rows, local_ids = oracle_routes(all_ids, num_experts, world, rank)
    send_splits, send_index = oracle_send(all_ids[rank], num_experts, world)
    assert handle.send_splits == send_splits, (handle.send_splits, send_splits)
    assert np.array_equal(host_numpy(handle.send_token_index), send_index)
    recv_splits = tuple(sum(1 for s, _ in rows if s == source) for source in range(world))
    assert handle.recv_splits == recv_splits, (handle.recv_splits, recv_splits)
    assert handle.num_tokens == all_x[rank].shape[0] and handle.rank == rank
    assert_bits_equal(host_numpy(handle.recv_src_token),
                      np.array([t for _, t in rows], dtype=np.int32), "recv_src_token")
    assert_bits_equal(host_numpy(handle.recv_topk_ids), local_ids, "recv_topk_ids")
    weights = np.array([all_weights[s][t] for s, t in rows], np.float32).reshape(local_ids.shape)
    assert_bits_equal(host_numpy(handle.recv_topk_weights), weights, "recv_topk_weights")
    plan = oracle_plan(local_ids, num_experts // world, alignment)
    for name, expected in plan._asdict().items():
        assert_bits_equal(host_numpy(getattr(handle.plan, name)), expected, f"plan.{name}")
    recv_x = np.stack([all_x[s][t] for s, t in rows]) if rows else all_x[0][:0]
    # the outputs stay on the inputs' device (a GPU job that fell back to the
    # host would pass the bit checks below)
    assert result.expanded_x.device == handle.plan.token_topk_to_pos.device == DEVICE
    assert_bits_equal(host_bits(result.expanded_x),
                      oracle_expand(recv_x, plan.token_topk_to_pos, plan.pos_to_expert),
                      "expanded_x")
    if all_sf is None:
        assert result.expanded_sf is None
    else:
        recv_sf = np.stack([all_sf[s][t] for s, t in rows]) if rows else all_sf[0][:0]
        expected_sf = oracle_expand(recv_sf, plan.token_topk_to_pos, plan.pos_to_expert)
        assert_bits_equal(host_bits(result.expanded_sf.contiguous()), expected_sf,
                          "expanded_sf")
    return result


def check_dispatch_bf16(rank: int, world: int) -> None:
    """Which token goes where, with dropped and out-of-range ids, repeated
    experts, K > E/R, T = 0 on rank 1, H = 33 (rows not 16-byte aligned);
    twice, the same bits (the order depends on the routing alone)."""
    num_experts, top_k, hidden = 2 * world, 3, 33
    routing = routing_inputs(world, num_experts, top_k, seed=1)
    all_ids = [ids for ids, _ in routing]
    all_weights = [w for _, w in routing]
    all_x = [random_payload(np.random.default_rng([2, r]), (t, hidden), "bfloat16")
             for r, t in enumerate(tokens_per_rank(world))]
    first = _check_dispatch(rank, world, all_ids, all_weights, all_x, num_experts, 4)
    again = _check_dispatch(rank, world, all_ids, all_weights, all_x, num_experts, 4)
    assert_bits_equal(host_bits(again.expanded_x), host_bits(first.expanded_x), "rerun")
    # int32 ids route the same
    int32_ids = [ids.astype(np.int32) for ids in all_ids]
    _check_dispatch(rank, world, int32_ids, all_weights, all_x, num_experts, 1)


def check_dispatch_fp8(rank: int, world: int) -> None:
    """fp8 rows (every byte code, NaNs included) with float32 scale factors
    (random bits) row-major, and packed UE8M0 int32 ones column-major."""
    num_experts, top_k, hidden = 4 * world, 2, 70
    routing = routing_inputs(world, num_experts, top_k, seed=3)
    all_ids = [ids for ids, _ in routing]
    all_weights = [w for _, w in routing]
    tokens = tokens_per_rank(world)
    all_x = [random_payload(np.random.default_rng([4, r]), (t, hidden), "float8_e4m3fn")
             for r, t in enumerate(tokens)]
    all_sf = [random_payload(np.random.default_rng([5, r]), (t, 3), "float32")
              for r, t in enumerate(tokens)]
    _check_dispatch(rank, world, all_ids, all_weights, all_x, num_experts, 8, all_sf,
                    num_per_channels=32)
    packed = [random_payload(np.random.default_rng([6, r]), (t, 1), "int32")
              for r, t in enumerate(tokens)]
    result = _check_dispatch(rank, world, all_ids, all_weights, all_x, num_experts, 8, packed,
                             num_per_channels=32, use_tma_aligned_col_major_sf=True)
    rows = result.expanded_sf.shape[0]
    assert result.expanded_sf.stride() == (1, -(-rows // 4) * 4)


def _expert_outputs(world: int, all_ids, num_experts: int, hidden: int, alignment: int):
    """Per rank, random bf16 expert outputs [X, H] of its received plan (finite)."""
    outputs = []
    for dest in range(world):
        _, local_ids = oracle_routes(all_ids, num_experts, world, dest)
        rows = oracle_plan(local_ids, num_experts // world, alignment).pos_to_expert.shape[0]
        rng = np.random.default_rng([7, dest])
        outputs.append(rng.standard_normal((rows, hidden), dtype=np.float32).astype(BF16))
    return outputs


def oracle_combine(rank, world, all_ids, all_weights, all_y, num_experts, alignment,
                   weighted: bool) -> np.ndarray:
    """combine's result on ``rank``: per token, the float32 partials of the
    ranks it went to (reduce_fused's fma chain, unrounded) added in rank
    order from -0 (+0 where it went nowhere), rounded once to the dtype of
    the expert outputs."""
    from cupy_moe.reference import reduce_fused_numpy

    acc = np.zeros((all_ids[rank].shape[0], all_y[0].shape[1]), dtype=np.float32)
    for dest in range(world):
        rows, _ = oracle_routes(all_ids, num_experts, world, dest)
        for source, t in rows:
            if source == rank:
                acc[t] = -0.0
    for dest in range(world):
        rows, local_ids = oracle_routes(all_ids, num_experts, world, dest)
        plan = oracle_plan(local_ids, num_experts // world, alignment)
        weights = np.array([all_weights[s][t] for s, t in rows],
                           np.float32).reshape(local_ids.shape)
        partials = reduce_fused_numpy(all_y[dest].astype(np.float32), plan.token_topk_to_pos,
                                      weights if weighted else None)
        for n, (source, t) in enumerate(rows):
            if source == rank:
                with np.errstate(invalid="ignore"):  # inf + -inf
                    acc[t] = acc[t] + partials[n]
    result = acc.astype(all_y[0].dtype)
    bits = result.view(f"u{result.itemsize}")
    bits[np.isnan(acc)] = 0x7FFFFFFF if result.itemsize == 4 else 0x7FFF  # reduce_fused's NaN
    return result


def check_combine(rank: int, world: int) -> None:
    """combine against the oracle, weighted and not, bf16 and float32 expert
    outputs (float32: no final rounding hides the order of the sum), NaN and
    infinities included; twice, the same bits; tokens with no valid slot
    give zeros."""
    from cupy_moe.distributed import combine, dispatch

    num_experts, top_k, hidden, alignment = 2 * world, 3, 24, 4
    routing = routing_inputs(world, num_experts, top_k, seed=8)
    all_ids = [ids for ids, _ in routing]
    all_weights = [w for _, w in routing]
    x = np.zeros((all_ids[rank].shape[0], hidden), dtype=BF16)
    handle = dispatch(on_device(x), on_device(all_ids[rank]), on_device(all_weights[rank]),
                      num_experts, alignment=alignment).handle
    bf16_y = _expert_outputs(world, all_ids, num_experts, hidden, alignment)
    for dest, y in enumerate(bf16_y):  # NaN in column 0; +-inf in column 1 (inf - inf: NaN)
        y[:, 0] = np.nan
        y[:, 1] = np.inf if dest % 2 else -np.inf
    # float32 outputs with all 24 significand bits in use
    float32_y = [y.astype(np.float32) * np.float32(1 + 2.0 ** -20) for y in bf16_y]
    for all_y in (bf16_y, float32_y):
        for weighted in (True, False):
            what = f"combine ({all_y[0].dtype}, weighted={weighted})"
            out = combine(on_device(all_y[rank]), handle, weighted=weighted)
            assert out.device == DEVICE
            expected = oracle_combine(rank, world, all_ids, all_weights, all_y, num_experts,
                                      alignment, weighted)
            assert_bits_equal(host_bits(out), expected, what)
            again = combine(on_device(all_y[rank]), handle, weighted=weighted)
            assert_bits_equal(host_bits(again), host_bits(out), f"{what}, rerun")
    ids = all_ids[rank]
    unrouted = ~((ids >= 0) & (ids < num_experts)).any(axis=1)
    assert not host_bits(out)[unrouted].any()


def check_refused_combine(rank: int, world: int) -> None:
    """The last rank's combine is refused (its own arguments) while the others
    wait in combine's exchange: its next dispatch is refused before any
    collective (it once paired with their combine, which returned wrong rows
    without an error); its next combine meets theirs, and every rank gets
    the oracle's bits."""
    import torch

    from cupy_moe.distributed import combine, dispatch

    num_experts, top_k, hidden, alignment = 2 * world, 3, 24, 4
    routing = routing_inputs(world, num_experts, top_k, seed=9)
    all_ids = [ids for ids, _ in routing]
    all_weights = [w for _, w in routing]
    x = np.zeros((all_ids[rank].shape[0], hidden), dtype=BF16)
    args = (on_device(x), on_device(all_ids[rank]), on_device(all_weights[rank]), num_experts)
    handle = dispatch(*args, alignment=alignment).handle
    all_y = _expert_outputs(world, all_ids, num_experts, hidden, alignment)
    y = on_device(all_y[rank])
    if rank == world - 1:
        with pytest.raises(ValueError, match="y_expanded must be one of bfloat16"):
            combine(y.to(torch.int32), handle)
        with pytest.raises(RuntimeError, match="a combine failed on this rank before its "
                                               "exchange"):
            dispatch(*args, alignment=alignment)
    out = combine(y, handle)
    expected = oracle_combine(rank, world, all_ids, all_weights, all_y, num_experts, alignment,
                              True)
    assert_bits_equal(host_bits(out), expected, "combine after a refused combine")
    dispatch(*args, alignment=alignment)  # in step: every rank's next dispatch meets


def check_idle_ranks(rank: int, world: int) -> None:
    """Every slot on rank 0's experts (or dropped): the other ranks receive
    nothing (N = 0, X = 0) and still take part in dispatch and combine."""
    from cupy_moe.distributed import combine

    num_experts, top_k, hidden, alignment = 2 * world, 2, 16, 4
    routing = routing_inputs(world, 2, top_k, seed=9)  # ids in [-2, 4): rank 0's or dropped
    all_ids = [np.where(ids < 2, ids, -1) for ids, _ in routing]
    all_weights = [w for _, w in routing]
    all_x = [random_payload(np.random.default_rng([10, r]), (t, hidden), "bfloat16")
             for r, t in enumerate(tokens_per_rank(world))]
    result = _check_dispatch(rank, world, all_ids, all_weights, all_x, num_experts, alignment)
    if rank > 0:
        assert result.handle.num_received == 0 and result.expanded_x.shape == (0, hidden)
    all_y = _expert_outputs(world, all_ids, num_experts, hidden, alignment)
    out = combine(on_device(all_y[rank]), result.handle)
    expected = oracle_combine(rank, world, all_ids, all_weights, all_y, num_experts, alignment,
                              True)
    assert_bits_equal(host_bits(out), expected, "combine")


def check_errors(rank: int, world: int) -> None:
    """Ranks that disagree on H or num_experts all raise after the count
    exchange (none is left waiting); E not a multiple of R, and weight
    shards of the wrong size, raise before any collective."""
    import torch

    from cupy_moe.distributed import dispatch, ep_moe_layer

    tokens = tokens_per_rank(world)[rank]
    ids = zeros((tokens, 2), torch.int64)
    weights = ones((tokens, 2), torch.float32)
    hidden = 16 if rank == world - 1 else 8
    with pytest.raises(ValueError, match=rf"the ranks disagree on dispatch's arguments: rank "
                                         rf"\d has H \(x.shape\[1\]\) = (8|16), this rank "
                                         rf"\({rank}\) has (8|16)"):
        dispatch(zeros((tokens, hidden), torch.bfloat16), ids, weights, 2 * world)
    experts = 4 * world if rank == 0 else 2 * world
    with pytest.raises(ValueError, match=r"rank \d has num_experts = \d+, this rank"):
        dispatch(zeros((tokens, 8), torch.bfloat16), ids, weights, experts)
    with pytest.raises(ValueError, match=rf"num_experts = {2 * world + 1} is not divisible by "
                                         rf"the {world} ranks of the group"):
        dispatch(zeros((tokens, 8), torch.bfloat16), ids, weights, 2 * world + 1)
    # the layer: E not a multiple of R, and the full weights where a shard belongs
    shape, inputs, _ = layer_inputs(world)
    mine = slice(0, tokens)
    with pytest.raises(ValueError, match=rf"num_experts = {4 * world - 1} is not divisible"):
        ep_moe_layer(inputs.x[mine], inputs.router_logits[mine, 1:], inputs.w_gate_up[1:],
                     inputs.w_down[1:], top_k=4, num_experts=4 * world - 1)
    with pytest.raises(ValueError, match=rf"w_gate_up_local must have shape \(4, 64, 64\) "
                                         rf"\(x \({tokens}, 64\), num_experts {4 * world} over "
                                         rf"{world} ranks: E / R = 4 experts here, I = 32\); "
                                         rf"got \({4 * world}, 64, 64\)"):
        ep_moe_layer(inputs.x[mine], inputs.router_logits[mine], inputs.w_gate_up,
                     inputs.w_down, top_k=4, num_experts=shape.num_experts)
    # the group still works: every rank left the failed calls at the same point
    torch.distributed.barrier()


def check_one_rank_refuses(rank: int, world: int) -> None:
    """One rank's own arguments break a rule (the others' are fine): that
    rank raises its error and every other rank a ValueError naming it, after
    the count exchange, so none waits for the group's timeout. Also ranks
    whose packed scale factors have the same S but not the same
    num_per_channels (H = 128: one word for 32 or 128)."""
    import torch

    from cupy_moe.distributed import dispatch, ep_moe_layer

    last = world - 1
    tokens = tokens_per_rank(world)[rank]
    ids = zeros((tokens, 2), torch.int64)
    weights = ones((tokens, 2), torch.float32)
    refused = rf"rank {last} refused its own arguments to dispatch \(its error says why\); " \
              rf"this rank \({rank}\) stops with it"
    x = zeros((tokens, 8), torch.float32 if rank == last else torch.bfloat16)
    with pytest.raises(ValueError, match=("x must be one of" if rank == last else refused)):
        dispatch(x, ids, weights, 2 * world)
    bad_weights = weights.double() if rank == last else weights
    with pytest.raises(ValueError, match=("topk_weights must be one of float32" if rank == last
                                          else refused)):
        dispatch(zeros((tokens, 8), torch.bfloat16), ids, bad_weights, 2 * world)
    # the layer: the last rank passes the full weights where its shard belongs
    shape, inputs, _ = layer_inputs(world)
    local = slice(rank * 4, (rank + 1) * 4)
    mine = slice(0, tokens)
    w_gate_up = inputs.w_gate_up if rank == last else inputs.w_gate_up[local]
    with pytest.raises(ValueError, match=("w_gate_up_local must have shape" if rank == last
                                          else refused)):
        ep_moe_layer(inputs.x[mine], inputs.router_logits[mine], w_gate_up,
                     inputs.w_down[local], top_k=4, num_experts=shape.num_experts)
    # packed UE8M0 scale factors: S = 1 word for H = 128 with 32 or 128 channels a block
    x8 = zeros((tokens, 128), torch.uint8)
    x_sf = zeros((tokens, 1), torch.int32)
    npc = 32 if rank == last else 128
    with pytest.raises(ValueError, match=r"rank \d has num_per_channels = (32|128), this rank"):
        dispatch(x8, ids, weights, 2 * world, x_sf=x_sf, num_per_channels=npc,
                 use_tma_aligned_col_major_sf=True)
    torch.distributed.barrier()  # the group still works


def check_out_of_step(rank: int, world: int) -> None:
    """A rank failing after the count exchange (here its local plan) cannot
    tell the others, who go on; its later dispatch and combine calls on that
    group are refused at once, before any collective, instead of pairing
    with the others' next collectives. Other groups are unaffected."""
    import importlib

    import torch

    from cupy_moe.distributed import combine, dispatch

    # the module (the package's attribute of that name is the function)
    dispatch_module = importlib.import_module("cupy_moe.distributed.dispatch")

    group = torch.distributed.new_group(list(range(world)))  # poisoned below, alone
    last = world - 1
    tokens = tokens_per_rank(world)[rank]
    x = zeros((tokens, 8), torch.bfloat16)
    ids = zeros((tokens, 2), torch.int64)
    weights = ones((tokens, 2), torch.float32)
    if rank == last:
        def broken_plan(*args, **kwargs):
            raise MemoryError("the local plan failed")

        real_plan = dispatch_module.fused_mapping
        dispatch_module.fused_mapping = broken_plan
        try:
            with pytest.raises(MemoryError, match="the local plan failed"):
                dispatch(x, ids, weights, 2 * world, group=group)
        finally:
            dispatch_module.fused_mapping = real_plan
        out_of_step = r"an earlier dispatch or combine failed on this rank after the ranks " \
                      r"had begun exchanging data"
        with pytest.raises(RuntimeError, match=out_of_step):
            dispatch(x, ids, weights, 2 * world, group=group)
        with pytest.raises(RuntimeError, match=out_of_step):
            combine(zeros((0, 8), torch.bfloat16), None, group=group)
    else:
        dispatch(x, ids, weights, 2 * world, group=group)  # the others finish theirs
    torch.distributed.barrier()  # the default group still works, in step


# --- the expert-parallel layer -------------------------------------------------

def layer_inputs(world: int, *, idle: bool = False):
    """Full inputs of all ranks' tokens (rank order) and the shape: E = 4R
    experts (E/R = 4 = K, so a token can have all its experts on one rank).
    Every third token prefers the experts of rank t % R; ``idle``: only rank
    0's experts are ever chosen."""
    import torch

    from cupy_moe.layer import MoeShape, random_moe_inputs

    shape = MoeShape("ep-test", hidden=64, intermediate=32, num_experts=4 * world, top_k=4)
    total = sum(tokens_per_rank(world))
    inputs = random_moe_inputs(shape, total, seed=12, device="cpu")
    logits = inputs.router_logits.clone()
    local = shape.num_experts // world
    if idle:
        logits[:, local:] = -30.0
    else:
        for t in range(0, total, 3):
            owner = t % world
            logits[t, owner * local:(owner + 1) * local] += 8.0
    inputs = inputs._replace(router_logits=logits)
    if DEVICE is not None:  # drawn on the CPU (the same values on every device)
        inputs = type(inputs)(*(tensor.to(DEVICE) for tensor in inputs))
    return shape, inputs, torch


def _check_layer(rank: int, world: int, fp8: bool, idle: bool = False,
                 gemm: str = "auto", zero_padding: bool = True) -> None:
    from cupy_moe.distributed import ep_moe_layer, partition_experts
    from cupy_moe.layer import dense_moe_reference, moe_layer, relative_error, tolerance

    shape, inputs, torch = layer_inputs(world, idle=idle)
    tokens = tokens_per_rank(world)
    first = sum(tokens[:rank])
    mine = slice(first, first + tokens[rank])
    partition = partition_experts(shape.num_experts, world)
    alignment = 8
    out, ep = ep_moe_layer(inputs.x[mine], inputs.router_logits[mine],
                           partition.shard(inputs.w_gate_up, rank),
                           partition.shard(inputs.w_down, rank), top_k=shape.top_k,
                           num_experts=shape.num_experts, alignment=alignment, fp8=fp8,
                           gemm=gemm, zero_padding=zero_padding, return_intermediates=True)
    ref, one = moe_layer(*inputs, top_k=shape.top_k, alignment=alignment, fp8=fp8, gemm=gemm,
                         return_intermediates=True)
    # the router, per token
    assert torch.equal(ep["source_topk_ids"], one["topk_ids"][mine])
    assert_bits_equal(host_numpy(ep["source_topk_weights"]),
                      host_numpy(one["topk_weights"][mine]), "topk_weights")
    # every received slot: the same expanded row and expert output as one process
    handle, plan = ep["handle"], ep["plan"]
    sources = np.repeat(np.arange(world), handle.recv_splits)
    global_token = np.cumsum([0] + tokens)[sources] + host_numpy(handle.recv_src_token)
    local_ids = host_numpy(handle.recv_topk_ids)
    n, k = np.nonzero(local_ids >= 0)
    g = global_token[n]
    assert np.array_equal(local_ids[n, k] + rank * partition.local_experts,
                          host_numpy(one["topk_ids"])[g, k])
    ep_rows = host_numpy(plan.token_topk_to_pos)[n, k]
    one_rows = host_numpy(one["plan"].token_topk_to_pos)[g, k]
    assert (ep_rows >= 0).all() and (one_rows >= 0).all()
    names = ("expanded", "expanded_sf", "act", "act_sf", "y") if fp8 else ("expanded", "act",
                                                                           "y")
    gemm_exact = gemm == "loop" or DEVICE is None or DEVICE.type == "cpu"
    if not gemm_exact:
        # on a GPU, _grouped_mm picks its kernel for the whole problem: the
        # rows before the first GEMM alone are promised (ep_layer's docstring)
        names = names[:2] if fp8 else names[:1]
    for name in names:
        assert_bits_equal(host_bits(ep[name])[ep_rows], host_bits(one[name])[one_rows],
                          f"{name} of the received slots")
    # the output: bit-exact where a token's slots all sit on one rank
    ids = host_numpy(one["topk_ids"])
    owners = ids // partition.local_experts
    single = (owners == owners[:, :1]).all(axis=1)
    # both kinds of token occur, but on one rank (where every token is single-rank)
    assert single.any() and (idle or world == 1 or not single.all())
    got, expected = host_bits(out), host_bits(ref)[mine]
    if gemm_exact:
        assert_bits_equal(got[single[mine]], expected[single[mine]], "single-rank tokens")
    if idle or world == 1:
        assert single.all()
    # the rest: within two bf16 roundings of one process, and within the tolerance
    assert relative_error(out, ref[mine]) <= 2.0 ** -8
    dense = dense_moe_reference(inputs.x[mine], one["topk_ids"][mine],
                                one["topk_weights"][mine], inputs.w_gate_up, inputs.w_down)
    assert relative_error(out, dense) <= tolerance(fp8)


def check_layer_bf16(rank: int, world: int) -> None:
    _check_layer(rank, world, fp8=False)
    _check_layer(rank, world, fp8=False, gemm="loop")


def check_layer_fp8(rank: int, world: int) -> None:
    _check_layer(rank, world, fp8=True)


def check_layer_leaving_padding(rank: int, world: int) -> None:
    """zero_padding=False (dispatch's expand and the SwiGLU leave padding
    rows unwritten): every received slot's rows and the output as above."""
    _check_layer(rank, world, fp8=False, zero_padding=False)
    _check_layer(rank, world, fp8=True, zero_padding=False)


def check_layer_idle_ranks(rank: int, world: int) -> None:
    """Only rank 0's experts chosen: the other ranks receive nothing, every
    token is single-rank, the output is the one-process output bit for bit."""
    _check_layer(rank, world, fp8=False, idle=True)
    _check_layer(rank, world, fp8=True, idle=True)


CHECKS = {
    "dispatch_bf16": check_dispatch_bf16,
    "dispatch_fp8": check_dispatch_fp8,
    "combine": check_combine,
    "refused_combine": check_refused_combine,
    "idle_ranks": check_idle_ranks,
    "errors": check_errors,
    "one_rank_refuses": check_one_rank_refuses,
    "out_of_step": check_out_of_step,
    "layer_bf16": check_layer_bf16,
    "layer_fp8": check_layer_fp8,
    "layer_idle_ranks": check_layer_idle_ranks,
    "layer_leaving_padding": check_layer_leaving_padding,
}
