"""Time the seed's TileLang "expand to fused" kernels beside ours (GPU only).

The workloads: the manifest's real-plan expand workloads (labels ending in
``-plan``, and ``-plan-sf-*`` for the fp8 + scale factor op).

    source benchmarks/peer_setup.sh
    PYTHONPATH=$PWD:$PYTHONPATH python3 benchmarks/bench_expand_seed.py \\
        [--label L ...] [--iters 30] [--rounds 1] [--max-seconds 240] [--hide-host] \\
        [--out seed.json] [--md seed.md]
    python3 benchmarks/bench_expand_seed.py --extract-only DIR   # no GPU needed

What it measures, per workload (inputs from ``workload_inputs``: random bits,
the workload's seeded plan):
- ours: the public op (``cupy_moe.expand_to_fused`` /
  ``expand_to_fused_with_sf``) on torch CUDA tensors, outputs preallocated
  (``out=``, ``out_sf=``), as ``cupy-moe bench`` times it (given the plan's
  ``pos_to_token``, a hint the seed's op does not take; the default kernels
  read it on the column-major SF plans only);
- seed: the pull request's op (``MoeExpandToFusedFwdOp`` /
  ``MoeExpandToFusedWithSFFwdOp``) called as its own benchmark calls it,
  ``op(*inputs)`` with int32 maps and fp8 as ``torch.float8_e4m3fn``; it
  allocates its outputs on every call (torch's caching allocator: host work
  only);
- the floor of the same run: a device-to-device copy of the routed bytes plus
  a memset of the padding bytes (``runner.split_bytes``), and the copy
  bandwidth (``GpuTimer.copy_tbps``).
Every figure is ``GpuTimer.median_us`` (CUDA events, L2 flushed before each
run; ``--hide-host`` also spins the GPU ~50 us first, so that host work of a
call is not in its figure), or with ``--graph`` both ops' time per call in
replays of a CUDA graph of 100 calls (``WarmTimer``: no host time, no flush,
so a call finds in L2 what the last one left; the floor keeps the flushed
events). Ours, the seed and the variants are timed in turn, run by run
(flushed events: each run follows another op's run; timed apart, a 6-15 µs
op read 2-5% slower right after its own runs), or graph after graph.
``--rounds N`` does that N times (the order reversed every other round),
each figure the median of its
rounds and each ratio the median of the rounds' ratios, with their range;
a workload where ours trails in every round is counted "slower", where it
leads in every round "faster", else "within the spread" (the summary line
under the table). Before anything is timed, both ops' results are
checked bit for bit against the NumPy reference, on outputs filled with 0xFF
bytes first, so that a padding row left unwritten shows. The seed allocates
its own outputs: its first call's outputs are poisoned and freed, and the
check call is expected to get the same memory back from torch's caching
allocator; where it does not, the status says the padding went unchecked.
A mismatch or a seed error is noted in the row's status; nothing is raised.

The seed's code is not in this repository and must not be: it is read at run
time from the carried pull-request text ``.peers/seed/expand_to_fused_pr.diff.txt``
(ignored by git), whose two new files (the TileLang kernels and the op
wrappers) are written into a temporary directory beside small stand-ins,
written here, for the TileOPs modules they import (``Kernel``, ``Op``, the
package ``__init__``s). Without that text or without tilelang, the script
says so in one line and exits 0.

TileLang compiles once per static configuration (hidden, top-k, dtypes, SF
layout; the token counts are dynamic symbols), so the first workload of each
configuration pays the compile; ``--max-seconds`` (from the start) skips the
workloads left once it is spent, so that a run fits one device call. The JSON
and Markdown files are rewritten after every workload, so a run cut short
leaves what it measured.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import hashlib
import importlib
import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIFF = REPO_ROOT / ".peers" / "seed" / "expand_to_fused_pr.diff.txt"

# The pull request's files this benchmark needs, as the PR text names them.
SEED_FILES = ("tileops/kernels/moe/expand_to_fused.py", "tileops/ops/moe/expand_to_fused.py")
SEED_OPS_MODULE = "tileops.ops.moe.expand_to_fused"

# Stand-ins for the TileOPs modules the seed's files import and the PR does
# not contain. Written for this benchmark (not TileOPs' code): only the
# attributes and methods the two files use.
_KERNEL_BASE_STANDIN = '''"""Stand-in for TileOPs' kernel base (bench_expand_seed.py): what the
seed's kernels use, nothing more."""


class Kernel:
    dtype = None
    supported_archs = None

    def __init__(self, *args, **kwargs):
        self.config = {}

    def init_config(self, config=None, tune=False):
        # no autotuning: the expand kernels have no tunable config
        self.config = dict(config or {})

    @staticmethod
    def dtype_to_str(dtype):
        # torch.bfloat16 -> "bfloat16": TileLang names the types as torch does
        return str(dtype).rpartition(".")[2]

    @property
    def dtype_str(self):
        return self.dtype_to_str(self.dtype)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)
'''

_OP_BASE_STANDIN = '''"""Stand-in for TileOPs' op base (bench_expand_seed.py): kernel dispatch
by the op's default map, calls go to forward."""


class Op:
    kernel_map = None

    def dispatch_kernel(self, kernel_map=None):
        self.kernel_map = {**self.default_kernel_map, **(kernel_map or {})}

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)
'''

_PACKAGE_STANDIN = '"""Stand-in package (bench_expand_seed.py)."""\n'

# relative path -> source of every stand-in module
STANDINS = {
    "tileops/__init__.py": _PACKAGE_STANDIN,
    "tileops/kernels/__init__.py": _PACKAGE_STANDIN,
    "tileops/kernels/kernel_base.py": _KERNEL_BASE_STANDIN,
    "tileops/kernels/moe/__init__.py": _PACKAGE_STANDIN,
    "tileops/ops/__init__.py": _PACKAGE_STANDIN,
    "tileops/ops/op_base.py": _OP_BASE_STANDIN,
    # not the PR's: that one imports ops of TileOPs that are not here
    "tileops/ops/moe/__init__.py": _PACKAGE_STANDIN,
}

_NEW_FILE_HUNK = re.compile(r"^@@ -0,0 \+1(?:,(\d+))? @@")
# how far below its path line a new file's hunk header may be (blank lines)
_HUNK_SEARCH_LINES = 3


# --- the seed's code, from the PR text ------------------------------------------------------


def extract_new_file(diff_lines: Sequence[str], path: str) -> str:
    """The text of new file ``path`` in the PR text: the ``+`` lines of the
    ``@@ -0,0 +1,N @@`` hunk after the line that names it, ``+`` stripped.
    ValueError where the path is missing, is not a new file, or its hunk
    holds fewer than N lines (a truncated text)."""
    try:
        start = [line.strip() for line in diff_lines].index(path)
    except ValueError:
        raise ValueError(f"{path}: not in the PR text") from None
    for offset in range(1, _HUNK_SEARCH_LINES + 1):
        index = start + offset
        match = _NEW_FILE_HUNK.match(diff_lines[index]) if index < len(diff_lines) else None
        if match:
            break
    else:
        raise ValueError(f"{path}: no '@@ -0,0 +1,N @@' hunk below it (not a new file?)")
    count = int(match.group(1) or 1)
    body = diff_lines[index + 1:index + 1 + count]
    added = [line for line in body if line.startswith("+")]
    if len(added) != count:
        raise ValueError(f"{path}: the hunk says {count} lines, the text has {len(added)} "
                         f"'+' lines (truncated?)")
    return "\n".join(line[1:] for line in added) + "\n"


def write_seed_package(diff_path: Path, dest: Path) -> list[Path]:
    """Write the seed's files (from the PR text at ``diff_path``) and the
    stand-ins under ``dest``; each is compiled (syntax only) first. Returns
    the paths written. ValueError or SyntaxError where the text is unusable."""
    lines = diff_path.read_text(encoding="utf-8").splitlines()
    sources = {path: extract_new_file(lines, path) for path in SEED_FILES}
    sources.update(STANDINS)
    written = []
    for relative, source in sources.items():
        compile(source, relative, "exec")  # a SyntaxError names the file
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source, encoding="utf-8")
        written.append(target)
    return written


def import_seed_ops(package_dir: Path) -> tuple[type, type]:
    """``(MoeExpandToFusedFwdOp, MoeExpandToFusedWithSFFwdOp)`` imported from
    ``package_dir`` (put first on ``sys.path``). Any ``tileops`` imported
    before is dropped, and the module must come from ``package_dir``: a
    TileOPs installed elsewhere must not stand in for the seed."""
    for name in [name for name in sys.modules if name == "tileops" or
                 name.startswith("tileops.")]:
        del sys.modules[name]
    sys.path.insert(0, str(package_dir))
    module = importlib.import_module(SEED_OPS_MODULE)
    if not Path(module.__file__).resolve().is_relative_to(package_dir.resolve()):
        raise ImportError(f"{SEED_OPS_MODULE} came from {module.__file__}, not {package_dir}")
    return module.MoeExpandToFusedFwdOp, module.MoeExpandToFusedWithSFFwdOp


def file_digest(path: Path) -> str:
    """The first 12 hex digits of the file's SHA-256 (names the seed text timed)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


# --- workloads and inputs -------------------------------------------------------------------


def plan_workloads(labels: Sequence[str] | None) -> list:
    """The expand workloads with a real plan, in manifest order; only
    ``labels`` if given (SystemExit naming any that is not one of them)."""
    from cupy_moe.harness.manifest import OP_NAMES, load_workloads

    workloads = [w for op in OP_NAMES for w in load_workloads(op) if w.plan is not None]
    if not labels:
        return workloads
    known = {w.label for w in workloads}
    unknown = sorted(set(labels) - known)
    if unknown:
        raise SystemExit(f"not plan expand workloads: {unknown}; known: {sorted(known)}")
    return [w for w in workloads if w.label in labels]


def torch_dtype(name: str):
    """The torch dtype of a manifest dtype name (``float8_e4m3fn`` included)."""
    import torch
    return getattr(torch, name)


def make_seed_op(w, seed_classes: tuple[type, type]):
    """The seed's op for workload ``w``, built as the PR's benchmark builds it
    (dtypes committed at construction)."""
    expand_op, with_sf_op = seed_classes
    if w.op == "expand_to_fused":
        return expand_op(dtype=torch_dtype(w.dtype))
    return with_sf_op(num_per_channels=w.num_per_channels,
                      use_tma_aligned_col_major_sf=w.use_tma_aligned_col_major_sf,
                      dtype=torch_dtype(w.dtype), sf_dtype=torch_dtype(w.sf_dtype))


def seed_config(w) -> tuple:
    """What the seed compiles a kernel for (TileLang's static configuration):
    workloads that share it share one compile."""
    return (w.op, w.hidden, w.top_k, w.dtype, w.sf_dtype, w.num_per_channels,
            w.use_tma_aligned_col_major_sf)


def seed_inputs(w, targs: dict[str, Any]) -> tuple:
    """The seed op's positional inputs: ``(x, [x_sf,] token_topk_to_pos,
    pos_to_expert)``, maps as int32 (its contract; ours are int32 already,
    so ``.to`` returns them as they are)."""
    import torch
    maps = (targs["token_topk_to_pos"].to(torch.int32), targs["pos_to_expert"].to(torch.int32))
    if w.op == "expand_to_fused":
        return (targs["x"], *maps)
    return (targs["x"], targs["x_sf"], *maps)


def as_tuple(result) -> tuple:
    """An op's result as a tuple of tensors (the SF op returns two)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


# --- checks ---------------------------------------------------------------------------------


def poison(tensors) -> list[int]:
    """Fill the whole storage behind each tensor with 0xFF bytes (the pad
    columns of a column-major SF buffer too); their storages' addresses."""
    for tensor in tensors:
        tensor.untyped_storage().fill_(0xFF)
    return [tensor.untyped_storage().data_ptr() for tensor in tensors]


def _bits(tensor):
    """The tensor's elements as integers of the same size, contiguous."""
    import torch
    kinds = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return tensor.contiguous().view(kinds[tensor.element_size()])


def device_mismatch(results: Sequence, expected: Sequence, names: Sequence[str]) -> str | None:
    """Where ``results`` differ from ``expected`` (both CUDA tensors) bit for
    bit: item size, shape, bits; the output named by ``names``. None if nowhere.
    On the device: a host round trip of the largest outputs takes seconds."""
    import torch
    if len(results) != len(expected):
        return f"{len(results)} outputs, expected {len(expected)}"
    for name, got, want in zip(names, results, expected, strict=True):
        if got.element_size() != want.element_size():
            return f"{name}: dtype {got.dtype} != {want.dtype}"
        if tuple(got.shape) != tuple(want.shape):
            return f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        got_bits, want_bits = _bits(got), _bits(want)
        if not torch.equal(got_bits, want_bits):
            wrong = torch.nonzero(got_bits != want_bits)
            return (f"{name}: {wrong.shape[0]} elements differ, first at "
                    f"{tuple(wrong[0].tolist())}")
    return None


# --- timing ---------------------------------------------------------------------------------


def pct_of_copy(nbytes: int, us: float | None, copy_tbps: float) -> float | None:
    """``nbytes`` in ``us`` as a percentage of the copy bandwidth (TB/s)."""
    return None if not us else 100 * (nbytes / us / 1e6) / copy_tbps


def pct_of_floor(floor_us: float | None, us: float | None) -> float | None:
    """The copy + memset floor's time as a percentage of ``us``."""
    return None if not us or floor_us is None else 100 * floor_us / us


def check_ours(w, targs: dict[str, Any], expected_dev: tuple) -> tuple[Callable, str | None]:
    """Our op on ``targs``: its outputs allocated by a first call, poisoned,
    written by a call with ``out=`` and checked. Returns the timed call (same
    outputs) and the mismatch text (None if bit-exact)."""
    from cupy_moe.harness import runner

    outs = as_tuple(runner._call(w, targs))
    out_kwargs = {"out": outs[0]} if len(outs) == 1 else {"out": outs[0], "out_sf": outs[1]}
    poison(outs)
    results = as_tuple(runner._call(w, targs, **out_kwargs))
    problem = device_mismatch(results, expected_dev, runner.output_names(w))

    def timed():
        return runner._call(w, targs, **out_kwargs)

    return timed, problem


def variant_call(w, name: str, targs: dict[str, Any], expected_dev: tuple) -> Callable | str:
    """Our op under the sweep config ``name``, into outputs poisoned and
    checked first: the call to time, or the mismatch text. Configs that read
    ``pos_to_token`` (sweep_kernel_config's WITH_POS_TO_TOKEN) are given the
    plan's."""
    from sweep_kernel_config import CONFIGS, WITH_POS_TO_TOKEN, _run

    from cupy_moe.harness import runner

    tuning = dict(CONFIGS)[name]
    given = name in WITH_POS_TO_TOKEN and "pos_to_token" in targs
    outs = _run(w, tuning, targs, (), given)
    poison(outs)
    problem = device_mismatch(as_tuple(_run(w, tuning, targs, outs, given)), expected_dev,
                              runner.output_names(w))
    if problem:
        return f"mismatch: {problem}"
    return lambda: _run(w, tuning, targs, outs, given)


def time_rounds(calls: dict[str, Callable], rounds: int, timer, iters: int,
                hide_host: bool) -> dict[str, list[float]]:
    """Each call's median µs over ``iters`` runs, round after round: in each
    round the calls' runs taken in turn (``timer.medians_interleaved_us``:
    flushed events interleave run by run, graph replays go one call after
    the other), the order reversed every other round, so that a drift of the
    machine's speed (clocks, heat, a neighbour) reaches both sides of a
    ratio alike and no side always runs first."""
    names = list(calls)
    figures: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        medians = timer.medians_interleaved_us([calls[name] for name in order], iters,
                                               hide_host=hide_host)
        for name, us in zip(order, medians, strict=True):
            figures[name].append(us)
    return figures


def round_ratios(seed_us: Sequence[float], ours_us: Sequence[float]) -> list[float]:
    """seed / ours of each round (the same round's figures)."""
    return [s / o for s, o in zip(seed_us, ours_us, strict=True)]


def check_seed(op, w, args: tuple, expected_dev: tuple) -> tuple[Callable, str | None, bool]:
    """The seed op on ``args`` (compiled already): its outputs of a call
    poisoned and freed, then a call checked. Returns the timed call, the
    mismatch text (None if bit-exact) and whether the checked outputs lay on
    the poisoned memory (else an unwritten padding row could pass)."""
    import torch
    from cupy_moe.harness import runner

    first = as_tuple(op(*args))
    torch.cuda.synchronize()
    # free blocks of other sizes go back to the driver, so the allocator's
    # best fit for the next call is the poisoned memory
    torch.cuda.empty_cache()
    poisoned = set(poison(first))
    del first
    results = as_tuple(op(*args))
    on_poison = all(t.untyped_storage().data_ptr() in poisoned for t in results)
    problem = device_mismatch(results, expected_dev, runner.output_names(w))
    return (lambda: op(*args)), problem, on_poison


def error_text(exc: BaseException, limit: int = 2000) -> str:
    """``Type: message`` on one line, at most ``limit`` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def cuda_alive() -> bool:
    """Whether the CUDA context still works (a faulting kernel leaves it dead)."""
    import torch
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any failure: the context is gone
        return False


class SeedError(RuntimeError):
    """The seed's op could not be built or run; the message is its error text."""


class SeedRunner:
    """The seed's ops, one per static configuration, with each
    configuration's first-call (compile) time or error remembered: a
    configuration that failed to build is not built again."""

    def __init__(self, seed_classes: tuple[type, type]) -> None:
        self.seed_classes = seed_classes
        self.ops: dict[tuple, Any] = {}
        self.errors: dict[tuple, str] = {}

    def ready_op(self, w, args: tuple):
        """The compiled seed op of ``w``'s configuration (first call on
        ``args`` if new) and that call's seconds (0.0 if built before).
        SeedError with the error text where it cannot run."""
        key = seed_config(w)
        if key in self.errors:
            raise SeedError(f"(as before) {self.errors[key]}")
        if key in self.ops:
            return self.ops[key], 0.0
        import torch
        start = time.perf_counter()
        try:
            op = make_seed_op(w, self.seed_classes)
            op(*args)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the seed's failure is a result too
            self.errors[key] = error_text(exc)
            raise SeedError(self.errors[key]) from exc
        self.ops[key] = op
        return op, time.perf_counter() - start


def bench_workload(w, seeds: SeedRunner, timer, iters: int, copy_tbps: float, rng,
                   hide_host: bool, variants: Sequence[str] = (),
                   floor_timer=None, rounds: int = 1) -> dict[str, Any]:
    """One workload's record: both ops checked, then timed in ``rounds``
    rounds (``time_rounds``), beside the copy + memset floor of the same run
    (by ``floor_timer``, default ``timer``); ``variants``:
    sweep_kernel_config.py's configs (by name) of our op, each checked and
    timed alike, in the same rounds."""
    floor_timer = floor_timer or timer
    from cupy_moe.harness import runner
    from cupy_moe.harness.inputs import workload_inputs

    record = new_record(w)
    host = workload_inputs(w, rng)
    expected_dev = tuple(runner._to_torch(a) for a in runner.reference_outputs(w, host))
    targs = {name: runner._to_torch(a) for name, a in host.items()}

    ours = seed = None
    try:
        ours, record["ours_check"] = check_ours(w, targs, expected_dev)
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        record["ours_error"] = error_text(exc)
    args = seed_inputs(w, targs)
    try:
        op, record["seed_first_call_s"] = seeds.ready_op(w, args)
        seed, record["seed_check"], record["seed_poisoned"] = check_seed(op, w, args,
                                                                          expected_dev)
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        record["seed_error"] = str(exc) if isinstance(exc, SeedError) else error_text(exc)
    if not cuda_alive():
        record["cuda_context_lost"] = True
        record["status"] = status_text(record)
        return record

    calls = {f"variant {name}": variant_call(w, name, targs, expected_dev) for name in variants}
    record["variants"] = {name: calls[f"variant {name}"] for name in variants
                          if isinstance(calls[f"variant {name}"], str)}  # mismatches
    calls = {key: call for key, call in calls.items() if not isinstance(call, str)}
    if ours is not None:
        calls["ours"] = ours
    if seed is not None:
        calls["seed"] = seed
    figures = time_rounds(calls, rounds, timer, iters, hide_host)
    for key, us in figures.items():
        if key.startswith("variant "):
            name = key.removeprefix("variant ")
            record["variants"][name] = statistics.median(us)
            if "seed" in figures:
                record["variant_ratios"][name] = round_ratios(figures["seed"], us)
    record["variants"] = {name: record["variants"][name] for name in variants}  # their order
    if "ours" in figures:
        record["ours_rounds_us"] = figures["ours"]
        record["ours_us"] = statistics.median(figures["ours"])
    if "seed" in figures:
        record["seed_rounds_us"] = figures["seed"]
        record["seed_us"] = statistics.median(figures["seed"])
    copy_bytes, zero_bytes = (int(n) for n in runner.split_bytes(w, host))
    record.update(copy_bytes=copy_bytes, zero_bytes=zero_bytes,
                  copy_routed_us=floor_timer.copy_us(copy_bytes // 2, iters),
                  memset_zero_us=floor_timer.memset_us(zero_bytes, iters) if zero_bytes else 0.0)
    fill_ratios(record, copy_tbps)
    record["status"] = status_text(record)
    return record


def new_record(w) -> dict[str, Any]:
    """A workload's record with its sizes and every figure unmeasured (None)."""
    from cupy_moe.harness import runner
    return {"label": w.label, "op": w.op, "shapes": runner._shapes_text(w), "bytes": w.bytes,
            "mb": w.bytes / 1e6, "num_tokens": w.num_tokens, "hidden": w.hidden,
            "top_k": w.top_k, "num_expanded": w.num_expanded, "routed_rows": w.routed_rows,
            "ours_us": None, "seed_us": None, "seed_over_ours": None,
            "ours_pct_copy": None, "seed_pct_copy": None,
            "copy_bytes": None, "zero_bytes": None, "copy_routed_us": None,
            "memset_zero_us": None, "floor_us": None,
            "ours_pct_copy_memset": None, "seed_pct_copy_memset": None,
            "ours_check": None, "ours_error": None, "seed_check": None, "seed_poisoned": None,
            "seed_first_call_s": None, "seed_error": None, "status": "not run",
            "ours_rounds_us": [], "seed_rounds_us": [], "seed_over_ours_rounds": [],
            "variants": {}, "variant_ratios": {}}


def fill_ratios(record: dict[str, Any], copy_tbps: float) -> None:
    """The record's derived figures: speed ratio, shares of the copy
    bandwidth and of the copy + memset floor."""
    ours, seed = record["ours_us"], record["seed_us"]
    record["floor_us"] = record["copy_routed_us"] + record["memset_zero_us"]
    rounds = round_ratios(record["seed_rounds_us"], record["ours_rounds_us"]) if (
        record["seed_rounds_us"] and record["ours_rounds_us"]) else []
    record["seed_over_ours_rounds"] = rounds
    # one round: the two medians' ratio; more: the median of the rounds' ratios
    record["seed_over_ours"] = (statistics.median(rounds) if rounds else
                                seed / ours if ours and seed else None)
    for name, us in (("ours", ours), ("seed", seed)):
        record[f"{name}_pct_copy"] = pct_of_copy(record["bytes"], us, copy_tbps)
        record[f"{name}_pct_copy_memset"] = pct_of_floor(record["floor_us"], us)


def status_text(record: dict[str, Any]) -> str:
    """``ok``, or what went wrong or was left unchecked, ``;``-separated."""
    notes = []
    if record["ours_error"]:
        notes.append(f"ours error: {record['ours_error']}")
    if record["ours_check"]:
        notes.append(f"ours MISMATCH {record['ours_check']}")
    if record["seed_error"]:
        notes.append(f"seed error: {record['seed_error']}")
    if record["seed_check"]:
        notes.append(f"seed MISMATCH {record['seed_check']}")
    if record["seed_poisoned"] is False:
        notes.append("seed padding unchecked (its output missed the poisoned memory)")
    if record.get("cuda_context_lost"):
        notes.append("CUDA context lost: the run stops")
    return "; ".join(notes) or "ok"


# --- report ---------------------------------------------------------------------------------


def git_commit() -> str:
    """``git rev-parse --short HEAD`` of the repository (``+dirty`` with
    uncommitted changes to tracked files), or ``unknown``."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=20, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def run_info(device: str, copy_tbps: float, iters: int, hide_host: bool,
             diff_path: Path, graph: bool = False, rounds: int = 1) -> dict[str, Any]:
    """What every record carries about its run: device, date, versions,
    commit, copy bandwidth, timing settings, the seed text's digest."""
    from cupy_moe.harness import runner
    versions = runner.versions()
    for name in ("tilelang", "tvm_ffi"):
        module = sys.modules.get(name)
        versions[name] = getattr(module, "__version__", "?") if module else "not loaded"
    return {"device": device, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "commit": git_commit(), "versions": versions, "copy_tbps": copy_tbps,
            "iters": iters, "rounds": rounds, "hide_host": hide_host, "graph": graph,
            "l2_flushed": not graph,
            "seed_text_sha256": file_digest(diff_path)}


def header_line(info: dict[str, Any]) -> str:
    """One line naming the run (device, date, versions, commit, copy bandwidth)."""
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    timing = ("per call in a CUDA graph of 100 calls, L2 not flushed (the floor: L2 flushed)"
              if info.get("graph") else
              "L2 flushed" + (", host hidden (spin)" if info["hide_host"] else ""))
    return (f"expand to fused, ours vs the seed's TileLang kernel: {info['device']}, "
            f"{info['date']}, commit {info['commit']}, seed text {info['seed_text_sha256']}; "
            f"{versions}; copy {info['copy_tbps']:.2f} TB/s; median of {info['iters']}"
            + (f" in each of {info['rounds']} rounds" if info.get("rounds", 1) > 1 else "") + ", "
            f"{timing}")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _short(text: str, limit: int = 120) -> str:
    text = text.replace("|", "/")  # a '|' would split the Markdown cell
    return text if len(text) <= limit else text[:limit - 3] + "..."


TABLE_HEADER = ("workload", "shapes", "MB", "ours µs", "seed µs", "seed/ours",
                "ours % copy", "seed % copy", "copy+memset µs", "ours % copy+memset",
                "seed % copy+memset", "status")


def table_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """The Markdown table, one row a record ("-": not measured)."""
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    for r in records:
        cells = [r["label"], r["shapes"], f"{r['mb']:.1f}", _fmt(r["ours_us"], ".1f"),
                 _fmt(r["seed_us"], ".1f"), ratio_text(r["seed_over_ours"],
                                                       r.get("seed_over_ours_rounds", [])),
                 _fmt(r["ours_pct_copy"], ".1f"), _fmt(r["seed_pct_copy"], ".1f"),
                 _fmt(r["floor_us"], ".1f"), _fmt(r["ours_pct_copy_memset"], ".1f"),
                 _fmt(r["seed_pct_copy_memset"], ".1f"), _short(r["status"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def ratio_text(ratio: float | None, rounds: Sequence[float]) -> str:
    """A ratio, and with more than one round the rounds' lowest and highest."""
    if ratio is None or len(rounds) < 2:
        return _fmt(ratio, ".2f")
    return f"{ratio:.2f} ({min(rounds):.2f}-{max(rounds):.2f})"


def verdict(rounds: Sequence[float]) -> str:
    """Of a workload's rounds: "faster" (ours ahead in every round),
    "slower" (behind in every round), or "within the spread"."""
    if min(rounds) > 1:
        return "faster"
    if max(rounds) < 1:
        return "slower"
    return "within the spread"


def summary_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """With rounds: how many workloads ours leads or trails in every round,
    and those it trails by name."""
    judged = [(r["label"], verdict(r["seed_over_ours_rounds"]), r["seed_over_ours"])
              for r in records if len(r.get("seed_over_ours_rounds", [])) > 1]
    if not judged:
        return []
    counts = {v: sum(1 for _, verdict_of, _ in judged if verdict_of == v)
              for v in ("faster", "within the spread", "slower")}
    behind = [f"{label} {ratio:.3f}" for label, v, ratio in judged if v == "slower"]
    return ["", f"Over {len(judged)} workloads timed in rounds: ours faster in every round on "
            f"{counts['faster']}, slower in every round on {counts['slower']}"
            + (f" ({', '.join(behind)})" if behind else "")
            + f", within the rounds' spread on {counts['within the spread']}."]


LEGEND = ("seed/ours: seed µs / ours µs (above 1: ours faster); timed in rounds, the median "
          "of the rounds' ratios, (lowest-highest) in brackets. % copy: the roofline bytes "
          "(MB) a second as a share of the same run's device-to-device copy bandwidth. "
          "copy+memset µs: a copy of the routed rows' bytes plus a memset of the padding "
          "rows' bytes, timed alike; % copy+memset: that floor's time as a share of the op's. "
          "The seed's op allocates its outputs per call (host work only).")


def variant_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """seed µs over each variant's µs (above 1: the variant faster), a row a
    record; none when no variant ran."""
    names = list(dict.fromkeys(name for r in records for name in r.get("variants", {})))
    if not names:
        return []
    lines = ["Variants of ours (sweep_kernel_config.py configs): seed µs / variant µs", "",
             "| workload | default | " + " | ".join(names) + " |",
             "|" + "---|" * (len(names) + 2)]
    for r in records:
        cells = [r["label"], ratio_text(r["seed_over_ours"], r.get("seed_over_ours_rounds", []))]
        for name in names:
            value = r.get("variants", {}).get(name)
            rounds = r.get("variant_ratios", {}).get(name, [])
            if isinstance(value, str):
                cells.append(_short(value, 40))
            elif rounds:
                cells.append(ratio_text(statistics.median(rounds), rounds))
            else:
                cells.append(_fmt(r["seed_us"] / value if value and r["seed_us"] else None,
                                  ".2f"))
        lines.append("| " + " | ".join(cells) + " |")
    return ["", *lines]


def markdown_text(header: str, records: Sequence[dict[str, Any]]) -> str:
    return "\n".join([header, "", *table_lines(records), *summary_lines(records), "", LEGEND,
                      *variant_lines(records)]) + "\n"


def write_outputs(records: list[dict[str, Any]], header: str, json_path: str | None,
                  md_path: str | None) -> None:
    """The JSON list of records and the Markdown (header, table, legend)."""
    if json_path:
        Path(json_path).write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    if md_path:
        Path(md_path).write_text(markdown_text(header, records), encoding="utf-8")


def skipped_record(w, info: dict[str, Any], reason: str) -> dict[str, Any]:
    record = {**new_record(w), **info}
    record["status"] = f"skipped: {reason}"
    return record


def one_line(record: dict[str, Any]) -> str:
    """A workload's result as a progress line."""
    return (f"    ours {_fmt(record['ours_us'], '.1f')} us, seed "
            f"{_fmt(record['seed_us'], '.1f')} us (seed/ours "
            f"{_fmt(record['seed_over_ours'], '.2f')}), floor {_fmt(record['floor_us'], '.1f')}"
            f" us; seed first call {_fmt(record['seed_first_call_s'], '.1f')} s; "
            f"{_short(record['status'], 300)}")


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", action="append", help="a plan workload (repeatable)")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=1,
                        help="time ours, the seed and the variants in turn this many times, "
                             "each a median of --iters, and report the median of the "
                             "rounds' ratios with their range (default 1)")
    parser.add_argument("--variant", action="append", default=[], metavar="CONFIG",
                        help="also time our op under this sweep_kernel_config.py config "
                             "(by its name; repeatable)")
    parser.add_argument("--max-seconds", type=float, default=240.0,
                        help="skip the workloads left after this many seconds")
    timing = parser.add_mutually_exclusive_group()
    timing.add_argument("--hide-host", action="store_true",
                        help="spin the GPU before each timed run (GPU time alone)")
    timing.add_argument("--graph", action="store_true",
                        help="time both ops per call in replays of a CUDA graph of 100 calls "
                             "(no host time, no L2 flush: each call finds in L2 what the "
                             "last left); the copy + memset floor stays L2-flushed")
    parser.add_argument("--out", metavar="JSON", help="JSON list of records")
    parser.add_argument("--md", metavar="MD", help="Markdown table")
    parser.add_argument("--diff", default=str(DEFAULT_DIFF), help="the seed's PR text")
    parser.add_argument("--extract-only", metavar="DIR",
                        help="write the seed's files and the stand-ins to DIR, then exit")
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def prepare_seed(diff_path: Path) -> tuple[type, type]:
    """The seed's op classes, from its files written to a temporary
    directory (removed at exit; TileLang reads the kernel's source from it
    when it compiles)."""
    package_dir = Path(tempfile.mkdtemp(prefix="seed_expand_"))
    atexit.register(shutil.rmtree, package_dir, True)
    write_seed_package(diff_path, package_dir)
    return import_seed_ops(package_dir)


def run(args: argparse.Namespace, diff_path: Path, seed_classes: tuple[type, type],
        start: float) -> int:
    """Every selected workload, results written as they come; 1 if ours
    failed or mismatched on one (or a workload failed), else 0."""
    import cupy
    import numpy as np
    import torch

    from sweep_kernel_config import CONFIGS

    from cupy_moe.harness.timing import GpuTimer, WarmTimer

    unknown = sorted(set(args.variant) - {name for name, _ in CONFIGS})
    if unknown:
        raise SystemExit(f"--variant: no sweep_kernel_config.py config named {unknown}")
    workloads = plan_workloads(args.label)
    # (the floor's copy and memset run on CuPy's stream, which a torch graph
    # capture cannot take: they keep the flushed events in --graph)
    floor_timer = GpuTimer()
    timer = WarmTimer() if args.graph else floor_timer
    copy_tbps = floor_timer.copy_tbps()
    info = run_info(timer.device_name, copy_tbps, args.iters, args.hide_host, diff_path,
                    graph=args.graph, rounds=args.rounds)
    header = header_line(info)
    print(header, flush=True)
    seeds = SeedRunner(seed_classes)
    rng = np.random.default_rng()
    records: list[dict[str, Any]] = []
    stop_reason = None
    for index, w in enumerate(workloads, 1):
        elapsed = time.perf_counter() - start
        if stop_reason is None and elapsed > args.max_seconds:
            stop_reason = f"--max-seconds {args.max_seconds:g} spent"
        if stop_reason:
            records.append(skipped_record(w, info, stop_reason))
            continue
        print(f"[{index}/{len(workloads)}] {w.label} ({elapsed:.1f} s)", flush=True)
        try:
            record = bench_workload(w, seeds, timer, args.iters, copy_tbps, rng,
                                    args.hide_host, args.variant, floor_timer, args.rounds)
        except Exception as exc:  # noqa: BLE001 - one workload's failure ends only it
            record = new_record(w)
            record["status"] = f"error: {error_text(exc)}"
            if not cuda_alive():
                record["cuda_context_lost"] = True
        record = {**info, **record}
        records.append(record)
        print(one_line(record), flush=True)
        if record.get("cuda_context_lost"):
            stop_reason = f"CUDA context lost at {w.label}"
        else:
            # the next workload's buffers start from an empty cache
            torch.cuda.empty_cache()
            cupy.get_default_memory_pool().free_all_blocks()
        write_outputs(records, header, args.out, args.md)
    write_outputs(records, header, args.out, args.md)
    print(f"\ndone in {time.perf_counter() - start:.1f} s\n")
    print(markdown_text(header, records), end="")
    failed = [r for r in records if r["ours_check"] or r["ours_error"]
              or r["status"].startswith("error")]
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    diff_path = Path(args.diff)
    if not diff_path.is_file():
        print(f"bench_expand_seed: no seed PR text at {diff_path}; nothing to compare, skipped")
        return 0
    if args.extract_only:
        for path in write_seed_package(diff_path, Path(args.extract_only)):
            print(path)
        return 0
    if importlib.util.find_spec("tilelang") is None:
        print("bench_expand_seed: tilelang is not importable (source benchmarks/peer_setup.sh "
              "with the carried .peers bundle); the seed is not timed, skipped")
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench_expand_seed: no CUDA GPU visible to torch; this benchmark is GPU only")
        return 1
    try:
        seed_classes = prepare_seed(diff_path)
    except Exception as exc:  # noqa: BLE001 - any failure: one line, no comparison
        print(f"bench_expand_seed: the seed's ops cannot be loaded: {error_text(exc, 500)}")
        return 0
    return run(args, diff_path, seed_classes, start)


if __name__ == "__main__":
    sys.exit(main())
