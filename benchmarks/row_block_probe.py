"""The seed's algorithm, written lean, on the real plans (issue 13; GPU only).

In a CUDA graph every library kernel trails the seed's TileLang kernel by
4-10% on the Qwen3 EP8 plans (results/expand_seed_ep8_graph_variants_h100.md), while
a bare zero-fill of a block a row reaches memset speed there
(results/zero_map_probe_graph_h100.md). This probe times, on the
manifest's plan workloads (bf16, no scale factors), the kernels of
benchmarks/row_block_probe.cu: the seed's grid (max(T, X) blocks, each a
row's zero-fill and a token's scatter) and the roles apart (T token blocks,
then blocks of 1-2 rows) and the slots apart (T x K slot blocks, then
the rows) and the rows by position (X blocks, block p writing row p from
``pos_to_token``: the gather a block a row) and the split by slot count
(token blocks store the rows of tokens with at most 1 or 3 live slots, row
blocks the rest: a device-side choice between the two; T + X blocks, or
the seed's max(T, X)) and the slots and rows merged (max(T x K, X)
blocks, block b slot b's copy and row b's zero-fill, one round trip), at
64-256 threads,
beside a memset of the padding bytes, and the library's own launch under
sweep_kernel_config.py configs (``--library NAME``, repeatable; by default
the default and the rows kernel at 128 threads) in the same process. The
seed is timed by bench_expand_seed.py in the same device call. Any expand
workload of the manifest can be named (the fp8 op's too: the probe's kernels
move the rows alone, the library its scale factors as well): the tightly
packed ones get the ``pos_to_token`` their map implies. The block-a-row
gather is also timed on torch's buffers (as the library's timings get them)
beside CuPy's. Every kernel's output is checked bit for bit against the
NumPy reference on a poisoned buffer first.

    PYTHONPATH=. python3 benchmarks/row_block_probe.py [--cold] [--label L ...]
        [--library NAME ...] --md OUT.md --json OUT.json

Timing: per call in replays of a CUDA graph of 100 calls (torch's capture, L2
not flushed), or with ``--cold`` CUDA events with the L2 flushed and the
host hidden.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
from probe_report import cupy_stream, finish, stream_of_the_timer

from cupy_moe.runtime.sizes import ceil_div

SOURCE = pathlib.Path(__file__).with_name("row_block_probe.cu")
DEFAULT_LABELS = ["qwen3-30b-small-e48-ep8-plan", "qwen3-30b-small-e32-ep8-plan",
                  "qwen3-30b-medium-e48-ep8-plan", "qwen3-30b-medium-e32-ep8-plan",
                  "kimi-k2-medium-e32-ep8-plan", "qwen3-30b-small-e128-plan"]


def variants(n_vec: int) -> list[tuple[str, str, str, int]]:
    """(name, template, grid kind, rows a block) for rows of ``n_vec`` 16-byte vectors."""
    out = []
    for threads in (64, 128):
        vpt = ceil_div(n_vec, threads)
        out.append((f"seed's grid: {threads} thr", f"seed_grid<{threads}, {vpt}>", "seed", 1))
    for threads, rows in ((64, 1), (64, 2), (128, 1), (256, 1)):
        vpt = ceil_div(n_vec, threads)
        out.append((f"roles apart: {threads} thr, {rows} row(s) a block",
                    f"split_roles<{threads}, {vpt}, {rows}>", "split", rows))
    for threads, rows in ((64, 1), (128, 1), (256, 1)):
        vpt = ceil_div(n_vec, threads)
        out.append((f"slots apart: {threads} thr, {rows} row(s) a block",
                    f"split_slots<{threads}, {vpt}, {rows}>", "slots", rows))
    for threads in (64, 128, 256):
        vpt = ceil_div(n_vec, threads)
        out.append((f"rows by position: {threads} thr", f"gather_rows<{threads}, {vpt}>",
                    "gather", 1))
    for threads, most, spec in ((64, 3, True), (128, 3, True), (256, 3, True), (128, 3, False),
                                (128, 1, True)):
        vpt = ceil_div(n_vec, threads)
        out.append((f"split by count: {threads} thr, tokens of <= {most} slots"
                    + ("" if spec else ", row loaded after the count"),
                    f"split_by_count<{threads}, {vpt}, {most}, {'true' if spec else 'false'}>",
                    "count", 1))
    for threads in (64, 128):
        vpt = ceil_div(n_vec, threads)
        out.append((f"split by count on the seed's grid: {threads} thr, tokens of <= 3 slots",
                    f"split_by_count_merged<{threads}, {vpt}, 3>", "count merged", 1))
    for threads, spec in ((64, True), (128, True), (256, True), (64, False), (128, False)):
        vpt = ceil_div(n_vec, threads)
        out.append((f"slots and rows merged: {threads} thr"
                    + ("" if spec else ", row loaded after the position"),
                    f"slots_and_rows<{threads}, {vpt}, {'true' if spec else 'false'}>",
                    "slots rows", 1))
    return out


def pos_to_token_of(token_topk_to_pos: np.ndarray, num_expanded: int) -> np.ndarray:
    """[X] int32: the token of each row the map names, -1 elsewhere."""
    rows = np.full(num_expanded, -1, dtype=np.int32)
    tokens = np.broadcast_to(np.arange(token_topk_to_pos.shape[0], dtype=np.int32)[:, None],
                             token_topk_to_pos.shape)
    live = (token_topk_to_pos >= 0) & (token_topk_to_pos < num_expanded)
    rows[token_topk_to_pos[live]] = tokens[live]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", action="append", default=[])
    parser.add_argument("--cold", action="store_true",
                        help="CUDA events, L2 flushed, host hidden (default: a CUDA graph)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--library", action="append", default=[], metavar="NAME",
                        help="a sweep_kernel_config.py config of the library to time too "
                             "(repeatable; default: the default and the rows kernel at 128 "
                             "threads); given pos_to_token only where the config is in "
                             "sweep_kernel_config.WITH_POS_TO_TOKEN (the default given it: "
                             "'SF by position: all, given pos_to_token')")
    parser.add_argument("--md", type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)

    import cupy
    import torch

    from cupy_moe.harness import runner
    from cupy_moe.harness.inputs import workload_inputs
    from cupy_moe.harness.manifest import load_workloads
    from cupy_moe.harness.timing import GpuTimer, WarmTimer

    import sweep_kernel_config as sweep

    timer = GpuTimer() if args.cold else WarmTimer()
    labels = args.label or DEFAULT_LABELS
    # the fp8 op's workloads too: the probe's kernels move the rows alone
    workloads = {w.label: w for op in ("expand_to_fused", "expand_to_fused_with_sf")
                 for w in load_workloads(op)}
    unknown = [label for label in labels if label not in workloads]
    if unknown:
        parser.error(f"not expand_to_fused workloads: {unknown}")
    configs = dict(sweep.CONFIGS)
    library = args.library or ["default", "rows kernel: T < 1024, 128 threads"]
    unknown = [name for name in library if name not in configs]
    if unknown:
        parser.error(f"not sweep_kernel_config.py configs: {unknown}")

    on_timer_stream = stream_of_the_timer(not args.cold)

    records = []
    for label in labels:
        w = workloads[label]
        host = workload_inputs(w, np.random.default_rng(0))
        expected = runner.reference_outputs(w, host)[0].view(np.uint8)
        num_tokens, top_k = host["token_topk_to_pos"].shape
        num_expanded = host["pos_to_expert"].shape[0]
        row_bytes = expected.shape[1]
        n_vec = row_bytes // 16
        x = cupy.asarray(host["x"].view(np.uint8))
        ttp = cupy.asarray(host["token_topk_to_pos"])
        p2e = cupy.asarray(host["pos_to_expert"])
        host_p2t = host.get("pos_to_token")
        if host_p2t is None:
            host_p2t = pos_to_token_of(host["token_topk_to_pos"], num_expanded)
        p2t = cupy.asarray(host_p2t)
        out = cupy.empty((num_expanded, row_bytes), dtype=cupy.uint8)
        padding_rows = int((host["pos_to_expert"] < 0).sum())
        zero_bytes = padding_rows * row_bytes
        scratch = cupy.empty(max(zero_bytes, 1), dtype=cupy.uint8)
        memset_us = timer.median_us(on_timer_stream(
            lambda s: cupy.cuda.runtime.memsetAsync(scratch.data.ptr, 0, zero_bytes, s)),
            args.iters, hide_host=True)
        names = [template for _, template, _, _ in variants(n_vec)]
        module = cupy.RawModule(code=SOURCE.read_text(), options=("-std=c++17",),
                                name_expressions=names)
        record = {"label": label, "T": num_tokens, "K": top_k, "X": num_expanded,
                  "row_bytes": row_bytes, "padding_rows": padding_rows,
                  "zero_bytes": zero_bytes, "memset_us": memset_us, "variants": {}}
        for name, template, kind, rows in variants(n_vec):
            kernel = module.get_function(template)
            threads = int(template.split("<")[1].split(",")[0])
            grid = (max(num_tokens, num_expanded) if kind in ("seed", "count merged") else
                    max(num_tokens * top_k, num_expanded) if kind == "slots rows" else
                    num_expanded if kind == "gather" else
                    (num_tokens * top_k if kind == "slots" else num_tokens)
                    + ceil_div(num_expanded, rows))
            kernel_args = (x, p2t if kind == "gather" else ttp, p2e, out, np.int32(num_tokens),
                           np.int32(top_k), np.int32(num_expanded), np.int32(n_vec))
            if kind.startswith("count"):  # both maps: the slots and pos_to_token
                kernel_args += (p2t,)
            record["variants"][name] = checked_us(kernel, grid, threads, kernel_args, out,
                                                  expected, timer, on_timer_stream, args.iters)
        # the block-a-row gather on torch's buffers (x, maps and out as the
        # library's timings get them) instead of CuPy's: placement, not code
        on_torch = [cupy.asarray(t) for t in (
            torch.from_numpy(np.ascontiguousarray(host["x"].view(np.uint8))).cuda(),
            torch.from_numpy(host_p2t).cuda(),
            torch.from_numpy(np.ascontiguousarray(host["pos_to_expert"])).cuda(),
            torch.empty((num_expanded, row_bytes), dtype=torch.uint8, device="cuda"))]
        for threads in (128, 256):
            template = f"gather_rows<{threads}, {ceil_div(n_vec, threads)}>"
            kernel = module.get_function(template)
            t_x, t_p2t, t_p2e, t_out = on_torch
            kernel_args = (t_x, t_p2t, t_p2e, t_out, np.int32(num_tokens), np.int32(top_k),
                           np.int32(num_expanded), np.int32(n_vec))
            record["variants"][f"rows by position on torch's buffers: {threads} thr"] = (
                checked_us(kernel, num_expanded, threads, kernel_args, t_out, expected, timer,
                           on_timer_stream, args.iters))
        record["variants"].update(library_variants(w, host, host_p2t, library, configs,
                                                   timer, on_timer_stream, args.iters))
        records.append(record)
        print(f"{label}: memset {memset_us:.2f} us", file=sys.stderr)

    timing = (f"CUDA events, L2 flushed, host hidden, median of {args.iters}" if args.cold
              else "per call in replays of a CUDA graph of 100 calls, L2 not flushed")
    lines = [f"# The seed's algorithm written lean, on the plans ({timer.device_name})", "",
             f"{timing}. Every kernel checked bit for bit on a poisoned output first. "
             "memset: of the padding rows' bytes alone.", ""]
    lines += ["| variant | " + " | ".join(r["label"] for r in records) + " |",
              "|---|" + "---|" * len(records)]
    lines.append("| memset of the padding bytes | " + " | ".join(
        f"{r['memset_us']:.2f} µs ({r['zero_bytes'] / 1e6:.1f} MB)" for r in records) + " |")
    for name in records[0]["variants"]:
        lines.append(f"| {name} | " + " | ".join(
            "WRONG" if not r["variants"][name]["ok"] else f"{r['variants'][name]['us']:.2f} µs"
            for r in records) + " |")
    return finish("\n".join(lines) + "\n", args.md, args.json,
                  {"device": timer.device_name, "cold": args.cold, "records": records})


def checked_us(kernel, grid: int, threads: int, kernel_args: tuple, out, expected: np.ndarray,
               timer, on_timer_stream, iters: int) -> dict:
    """One probe kernel on the timer's stream: ``out`` (a CuPy uint8 array)
    poisoned, written, checked bit for bit against ``expected``, then timed
    (NaN where wrong). Returns its record."""
    import cupy
    import torch

    def launch(stream):
        with cupy_stream(stream):
            kernel((grid,), (threads,), kernel_args)

    run = on_timer_stream(launch)
    out.fill(0xFF)
    run()
    torch.cuda.synchronize()
    ok = bool(np.array_equal(cupy.asnumpy(out), expected))
    us = timer.median_us(run, iters, hide_host=True) if ok else float("nan")
    return {"us": us, "grid": grid, "threads": threads, "ok": ok}


def library_variants(w, host: dict, host_p2t: np.ndarray, names: list[str], configs: dict,
                     timer, on_timer_stream, iters: int) -> dict[str, dict]:
    """The library's plan launch under each named config (pos_to_token given
    where the config reads it), checked first through ``run_with_tuning`` on
    a poisoned output, as sweep_kernel_config.py does."""
    import sweep_kernel_config as sweep
    import torch

    from cupy_moe.expand.tuning import DEFAULT_TUNING
    from cupy_moe.harness.runner import reference_outputs

    inputs = {name: sweep._to_torch(a) for name, a in host.items()}
    inputs["pos_to_token"] = sweep._to_torch(host_p2t)
    expected = tuple(sweep._to_torch(e) for e in reference_outputs(w, host))
    outs = sweep._run(w, DEFAULT_TUNING, inputs)
    pointers = sweep._pointers(inputs, outs)
    found = {}
    for name in names:
        tuning = configs[name]
        given = name in sweep.WITH_POS_TO_TOKEN
        problem = sweep._check(w, tuning, inputs, expected, outs, given)
        torch.cuda.synchronize()
        us = float("nan")
        if problem is None:
            plan = sweep._plan(w, inputs, tuning, given)
            extra = inputs["pos_to_token"].data_ptr() if given else 0
            run = on_timer_stream(lambda stream, plan=plan, extra=extra:
                                  plan.launch(stream, *pointers, extra))
            us = timer.median_us(run, iters, hide_host=True)
        found[f"library: {name}"] = {"us": us, "ok": problem is None, "problem": problem}
    return found


if __name__ == "__main__":
    sys.exit(main())
