"""Expand workloads routed by real plans (``plan:`` in workloads.yaml): the
manifest derives X from the seeded plan, the strict check of ``plan:``, the
copy/zero split of the roofline bytes, the inputs, and the benchmark's copy +
memset floor (CPU backend, and the GPU path's control flow with CPU stand-ins).
"""

from __future__ import annotations

import copy
import functools
import json
import re
import time
from dataclasses import asdict, replace
from importlib import resources

import numpy as np
import pytest
import yaml
from bench_cases import FakeTimer
from helpers import assert_bits_equal

from cupy_moe.harness import manifest, report, runner
from cupy_moe.harness.cli import main
from cupy_moe.harness.inputs import plan_mapping, plan_routing, workload_inputs
from cupy_moe.harness.manifest import (
    OP_NAMES,
    PlanSpec,
    Workload,
    load_workloads,
    parse_manifest,
    roofline_bytes,
)
from cupy_moe.harness.rooflines import (
    SplitBytes,
    expand_split_bytes,
    expand_to_fused_bytes,
    expand_to_fused_with_sf_bytes,
)
from cupy_moe.mapping import worst_case_rows
from cupy_moe.reference import fused_mapping_numpy
from cupy_moe.runtime.sizes import align_up, ceil_div

pytestmark = pytest.mark.smoke

PLANS = [w for op in OP_NAMES for w in load_workloads(op) if w.plan is not None]
FLOOR_FIELDS = ("zero_bytes", "memset_zero_us", "copy_routed_us", "pct_copy_memset_model")

# label: (T, E, ep_ranks, X, routed rows R, used tokens U) of some plan
# workloads; X, R, U follow from numpy's default_rng(0) stream (a change there
# would change every plan workload's figures: this test says so)
KNOWN = {
    "kimi-k2-decode-e128-plan": (1, 128, 1, 1024, 8, 1),
    "qwen3-30b-small-e128-plan": (32, 128, 1, 14848, 256, 32),
    "kimi-k2-small-e384-plan": (32, 384, 1, 23808, 256, 32),
    "qwen3-30b-medium-e256-plan": (512, 256, 1, 32768, 4096, 512),
    "kimi-k2-prefill-e128-plan": (4096, 128, 1, 40704, 32768, 4096),
    "qwen3-30b-prefill-e384-plan": (4096, 384, 1, 49152, 32768, 4096),
    "qwen3-30b-small-e48-ep8-plan": (32, 48, 8, 3072, 34, 19),
    "kimi-k2-medium-e32-ep8-plan": (512, 32, 8, 4096, 516, 344),
    "kimi-k2-prefill-e48-ep8-plan": (4096, 48, 8, 6144, 4128, 2700),
    "kimi-k2-prefill-e256-plan-sf-packed": (4096, 256, 1, 48128, 32768, 4096),
}


def plan_workload(label: str) -> Workload:
    (found,) = [w for w in PLANS if w.label == label]
    return found


# --- the manifest's plan workloads --------------------------------------------------

def test_the_plan_workloads_cover_models_batches_experts_and_expert_parallelism():
    bf16 = {w.label: w for w in load_workloads("expand_to_fused") if w.plan is not None}
    for model, hidden in (("kimi-k2", 7168), ("qwen3-30b", 3072)):
        for size, tokens in (("decode", 1), ("small", 32), ("medium", 512), ("prefill", 4096)):
            for experts in (128, 256, 384):
                w = bf16.pop(f"{model}-{size}-e{experts}-plan")
                assert (w.num_tokens, w.hidden, w.top_k, w.dtype) == (tokens, hidden, 8,
                                                                       "bfloat16")
                assert w.plan == PlanSpec(num_experts=experts, alignment=128, seed=0)
            if size == "decode":
                continue
            for experts in (48, 32):  # 48 of 384, 32 of 256 experts: 8 ranks
                w = bf16.pop(f"{model}-{size}-e{experts}-ep8-plan")
                assert (w.num_tokens, w.hidden, w.top_k) == (tokens, hidden, 8)
                assert w.plan == PlanSpec(num_experts=experts, alignment=128, seed=0, ep_ranks=8)
    assert bf16 == {}
    sf = [w for w in load_workloads("expand_to_fused_with_sf") if w.plan is not None]
    assert len(sf) == 14
    for w in sf:
        assert w.dtype == "float8_e4m3fn" and w.num_per_channels == 128
        blocks = ceil_div(w.hidden, 128)
        if w.label.endswith("-sf-packed"):
            assert (w.sf_dtype, w.use_tma_aligned_col_major_sf, w.sf_columns) == (
                "int32", True, ceil_div(blocks, 4))
        else:
            assert w.label.endswith("-sf-row-major")
            assert (w.sf_dtype, w.use_tma_aligned_col_major_sf, w.sf_columns) == (
                "float32", False, blocks)
        # the same routing as the bf16 workload of the same stem
        stem = w.label.rsplit("-sf-", 1)[0]
        twin = next((b for b in load_workloads("expand_to_fused") if b.label == stem), None)
        if twin is not None:
            assert (w.plan, w.num_tokens, w.num_expanded) == (twin.plan, twin.num_tokens,
                                                              twin.num_expanded)


@pytest.mark.parametrize("label", sorted(KNOWN))
def test_x_and_the_routed_rows_are_the_seeded_plans(label):
    w = plan_workload(label)
    tokens, experts, ranks, num_expanded, routed, used = KNOWN[label]
    assert (w.num_tokens, w.plan.num_experts, w.plan.ep_ranks) == (tokens, experts, ranks)
    assert (w.num_expanded, w.routed_rows, w.used_tokens) == (num_expanded, routed, used)
    assert w.shapes["pos_to_expert"] == (num_expanded,)
    assert list(w.shapes) == [name for name in ("x", "x_sf", "token_topk_to_pos",
                                                "pos_to_expert") if name in w.shapes]


@pytest.mark.parametrize("w", PLANS, ids=lambda w: w.label)
def test_x_is_the_exact_rows_of_the_plan_built_independently(w):
    # the ids drawn here, not by the harness: uniform over all ranks' experts
    spec = w.plan
    ids = np.random.default_rng(spec.seed).integers(
        0, spec.num_experts * spec.ep_ranks, size=(w.num_tokens, w.top_k))
    np.testing.assert_array_equal(spec.topk_ids(w.num_tokens, w.top_k), ids)
    local = ids < spec.num_experts
    counts = np.bincount(ids[local], minlength=spec.num_experts)
    assert w.num_expanded == int(align_up(counts, 128).sum())
    assert w.routed_rows == int(local.sum())
    assert w.used_tokens == int(local.any(axis=1).sum())
    if spec.ep_ranks == 1:
        assert w.routed_rows == w.num_tokens * w.top_k and w.used_tokens == w.num_tokens


def test_x_is_the_trimmed_plan_of_fused_mapping_numpy():
    w = plan_workload("kimi-k2-medium-e48-ep8-plan")
    ids = np.random.default_rng(0).integers(0, 384, size=(512, 8))
    # the op's default size (the worst case), trimmed to the exact rows
    bound = worst_case_rows(512 * 8, 48, 128)
    full = fused_mapping_numpy(ids, 48, alignment=128, num_expanded=bound)
    exact = int(full.expert_start[-1] + align_up(int(full.tokens_per_expert[-1]), 128))
    assert exact == w.num_expanded == 6144 < bound
    assert not (full.pos_to_expert[exact:] >= 0).any()
    plan = full.trimmed(exact)
    token_topk_to_pos, pos_to_expert = plan_routing(w)
    assert_bits_equal(token_topk_to_pos, plan.token_topk_to_pos, "token_topk_to_pos")
    assert_bits_equal(pos_to_expert, plan.pos_to_expert, "pos_to_expert")
    # remote experts' slots (ids >= 48) are dropped, every local one placed
    assert ((token_topk_to_pos >= 0) == (ids < 48)).all()
    assert np.count_nonzero(pos_to_expert >= 0) == w.routed_rows == 516


@pytest.mark.parametrize("tokens", [4096, 8192])
def test_an_untrimmed_plan_is_fused_mappings_default_x(tokens):
    """trimmed: false: the same routing at the X fused_mapping takes without a
    host sync (the worst case), the rows past the trimmed plan's padding; the
    same routed rows, used tokens and roofline bytes; and X no longer says
    that most slots are dropped (combine's sparse_slots)."""
    from cupy_moe.combine.launch_shape import sparse_slots

    suffix = "-8k" if tokens == 8192 else ""
    reduce = {w.label: w for w in load_workloads("reduce_fused")}
    trimmed = reduce[f"reduce-dsv3-ep8-prefill{suffix}-plan"]
    untrimmed = reduce[f"reduce-dsv3-ep8-prefill{suffix}-plan-untrimmed"]
    assert untrimmed.plan == replace(trimmed.plan, trimmed=False)
    assert untrimmed.num_expanded == worst_case_rows(tokens * 8, 32, 128) > trimmed.num_expanded
    assert (untrimmed.routed_rows, untrimmed.used_tokens, untrimmed.bytes) == (
        trimmed.routed_rows, trimmed.used_tokens, trimmed.bytes)
    exact, full = plan_mapping(trimmed), plan_mapping(untrimmed)
    assert full.pos_to_expert.shape == (untrimmed.num_expanded,)
    assert_bits_equal(full.token_topk_to_pos, exact.token_topk_to_pos, "token_topk_to_pos")
    assert_bits_equal(full.pos_to_expert[:trimmed.num_expanded], exact.pos_to_expert,
                      "pos_to_expert")
    assert (full.pos_to_expert[trimmed.num_expanded:] == -1).all()
    assert sparse_slots(tokens, 8, trimmed.num_expanded)
    assert not sparse_slots(tokens, 8, untrimmed.num_expanded)


@pytest.mark.parametrize("label", ["qwen3-30b-decode-e384-plan", "kimi-k2-small-e32-ep8-plan",
                                   "qwen3-30b-small-e128-plan-sf-packed"])
def test_workload_inputs_of_a_plan_workload(label, rng):
    w = plan_workload(label)
    first = workload_inputs(w, rng)
    again = workload_inputs(w, np.random.default_rng(1))
    # both ops get the plan's pos_to_token too (the hint)
    assert list(first) == ["x"] + (["x_sf"] if w.sf_columns else []) + [
        "token_topk_to_pos", "pos_to_expert", "pos_to_token"]
    np.testing.assert_array_equal(first["pos_to_token"], plan_mapping(w).pos_to_token)
    assert first["x"].shape == w.shapes["x"] and first["x"].dtype.name == w.dtype
    if w.sf_columns:
        assert first["x_sf"].shape == w.shapes["x_sf"]
        assert first["x_sf"].dtype.name == w.sf_dtype
    # the routing is the seed's, whatever the generator; the payload is not
    for name in ("token_topk_to_pos", "pos_to_expert"):
        assert first[name].dtype == np.int32
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.array_equal(first["x"].view(np.uint8), again["x"].view(np.uint8))
    pos_to_expert = first["pos_to_expert"]
    assert pos_to_expert.shape == (w.num_expanded,)
    # expert-major segments of 128-row multiples, padding (-1) at each one's end
    experts = pos_to_expert[pos_to_expert >= 0]
    assert (np.diff(experts) >= 0).all() and experts.max() < w.plan.num_experts
    starts = np.flatnonzero(np.diff(np.r_[-2, np.maximum.accumulate(pos_to_expert)]))
    assert (starts % 128 == 0).all()


def test_the_plan_sizes_are_cached_and_the_manifest_loads_fast():
    data = yaml.safe_load(resources.files("cupy_moe.harness").joinpath("workloads.yaml")
                          .read_text())
    manifest._plan_sizes.cache_clear()
    manifest._plan_topk_ids.cache_clear()
    start = time.perf_counter()
    parse_manifest(data)
    cold = time.perf_counter() - start
    assert cold < 0.25, f"the manifest took {cold * 1e3:.0f} ms to check"  # ~3 ms here
    ids = PLANS[0].plan.topk_ids(PLANS[0].num_tokens, PLANS[0].top_k)
    assert not ids.flags.writeable  # cached: nobody may change it


# --- the strict check of plan: ----------------------------------------------------

@functools.cache
def _packaged_text() -> str:
    return resources.files("cupy_moe.harness").joinpath("workloads.yaml").read_text()


def packaged_manifest() -> dict:
    """workloads.yaml as loaded, a new copy each call (callers change it);
    libyaml's safe loader where PyYAML has it (the pure-Python one is slow)."""
    return yaml.load(_packaged_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def entry_index(op: str, label: str) -> int:
    (index,) = [i for i, w in enumerate(load_workloads(op)) if w.label == label]
    return index


PLAN_LABEL = "kimi-k2-small-e128-plan"
PLAN_INDEX = entry_index("expand_to_fused", PLAN_LABEL)
WHERE = f"workloads.yaml: expand_to_fused workload {PLAN_INDEX} ({PLAN_LABEL})"


def with_plan_entry(**changes) -> dict:
    """The packaged manifest with keys of the kimi-k2-small-e128-plan entry
    changed (None: removed); ``plan_*`` keys change keys of its plan."""
    data = copy.deepcopy(packaged_manifest())
    entry = data["expand_to_fused"]["workloads"][PLAN_INDEX]
    assert entry["label"] == PLAN_LABEL
    for key, value in changes.items():
        target, key = (entry["plan"], key[5:]) if key.startswith("plan_") else (entry, key)
        if value is None:
            target.pop(key)
        else:
            target[key] = value
    return data


@pytest.mark.parametrize(("changes", "error", "message"), [
    ({"plan": 128}, TypeError,
     (f"{WHERE}: plan must be a mapping with keys ['alignment', 'ep_ranks', 'num_experts', "
      "'seed', 'trimmed']; got 128 (int)")),
    ({"plan": [128, 128, 0]}, TypeError,
     (f"{WHERE}: plan must be a mapping with keys ['alignment', 'ep_ranks', 'num_experts', "
      "'seed', 'trimmed']; got [128, 128, 0] (list)")),
    ({"plan_experts": 8}, ValueError,
     (f"{WHERE}: plan: unknown key(s) ['experts']; allowed: ['alignment', 'ep_ranks', "
      "'num_experts', 'seed', 'trimmed']")),
    ({"plan_seed": None}, ValueError, f"{WHERE}: plan: missing key(s) ['seed']"),
    ({"plan_num_experts": None, "plan_alignment": None}, ValueError,
     f"{WHERE}: plan: missing key(s) ['alignment', 'num_experts']"),
    ({"plan_num_experts": "128"}, TypeError,
     f"{WHERE}: plan.num_experts must be an int; got '128' (str)"),
    ({"plan_alignment": 128.0}, TypeError,
     f"{WHERE}: plan.alignment must be an int; got 128.0 (float)"),
    ({"plan_ep_ranks": True}, TypeError,
     f"{WHERE}: plan.ep_ranks must be an int; got True (bool)"),
    ({"plan_num_experts": 0}, ValueError, f"{WHERE}: plan.num_experts must be >= 1; got 0"),
    ({"plan_alignment": -128}, ValueError, f"{WHERE}: plan.alignment must be >= 1; got -128"),
    ({"plan_ep_ranks": 0}, ValueError, f"{WHERE}: plan.ep_ranks must be >= 1; got 0"),
    ({"plan_seed": -1}, ValueError, f"{WHERE}: plan.seed must be >= 0; got -1"),
    ({"plan_trimmed": 1}, TypeError,
     f"{WHERE}: plan.trimmed must be true or false; got 1 (int)"),
    # X comes from the plan only
    ({"pos_to_expert": [14848]}, ValueError,
     (f"{WHERE}: pos_to_expert and plan exclude each other: a plan workload's X is derived "
      "from its plan; leave pos_to_expert out")),
    ({"plan": None}, ValueError,
     f"{WHERE}: missing key(s) ['pos_to_expert'] (or a plan to derive X from)"),
    ({"token_topk_to_pos": [32, 0]}, ValueError,
     f"{WHERE}: a plan workload needs K >= 1 slots a token; token_topk_to_pos is [32, 0]"),
    ({"x": [31, 7168]}, ValueError,
     (f"{WHERE}: the shapes disagree on T (their first size): "
      "{'x': 31, 'token_topk_to_pos': 32}")),
])
def test_a_bad_plan_entry_is_rejected_with_its_name(changes, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        parse_manifest(with_plan_entry(**changes))


def test_ep_ranks_may_be_left_out_and_fused_mapping_takes_no_plan():
    (w,) = [w for w in parse_manifest(with_plan_entry(plan_ep_ranks=1))["expand_to_fused"]
            if w.label == PLAN_LABEL]
    assert w == plan_workload(PLAN_LABEL) and w.plan.ep_ranks == 1
    data = copy.deepcopy(packaged_manifest())
    data["fused_mapping"]["workloads"][0]["plan"] = {"num_experts": 8, "alignment": 128,
                                                     "seed": 0}
    with pytest.raises(ValueError, match=re.escape(
            "workloads.yaml: fused_mapping workload 0 (mapping-decode): unknown key(s) "
            "['plan']")):
        parse_manifest(data)


def test_a_workload_built_by_hand_derives_x_or_checks_the_stated_one():
    spec = PlanSpec(num_experts=4, alignment=8, seed=5)
    shapes = {"x": (6, 32), "token_topk_to_pos": (6, 2)}
    w = Workload("expand_to_fused", "by-hand", shapes, "bfloat16", plan=spec)
    plan = fused_mapping_numpy(spec.topk_ids(6, 2), 4, alignment=8)
    assert w.shapes == {**shapes, "pos_to_expert": (plan.pos_to_expert.shape[0],)}
    assert (w.routed_rows, w.used_tokens) == (12, 6)
    stated = {**shapes, "pos_to_expert": w.shapes["pos_to_expert"]}
    assert Workload("expand_to_fused", "by-hand", stated, "bfloat16", plan=spec) == w
    with pytest.raises(ValueError, match=re.escape(
            f"by-hand: pos_to_expert [7] is not the plan's [{w.num_expanded}] rows")):
        Workload("expand_to_fused", "by-hand", {**shapes, "pos_to_expert": (7,)}, "bfloat16",
                 plan=spec)


# --- roofline bytes: copy and zero ------------------------------------------------

# T=3, H=10, K=2, X=8 (S=5): every size different
SMALL = {"x": (3, 10), "token_topk_to_pos": (3, 2), "pos_to_expert": (8,)}
SMALL_SF = {**SMALL, "x_sf": (3, 5)}


def test_split_bytes_by_hand():
    # bf16 row 20 bytes; R=5 routed rows, U=2 used tokens:
    # copy = x 2*20 + maps 3*2*4 + 8*4 + routed 5*20; zero = padding (8-5)*20
    assert expand_split_bytes(SMALL, 2, routed_rows=5, used_tokens=2) == (40 + 24 + 32 + 100,
                                                                          60)
    assert expand_to_fused_bytes(SMALL, 2, used_tokens=2) == 196 + 60
    # every token read by default: the seed's formula
    assert sum(expand_split_bytes(SMALL, 2, routed_rows=5)) == expand_to_fused_bytes(SMALL, 2)
    # fp8 + SF: row 10 + 5*4 = 30 bytes, read for U tokens, written for X rows
    split = expand_split_bytes(SMALL_SF, 1, routed_rows=6, used_tokens=3)
    assert split == SplitBytes(copy_bytes=90 + 24 + 32 + 180, zero_bytes=60)
    assert sum(split) == expand_to_fused_with_sf_bytes(SMALL_SF, 1, used_tokens=3)
    assert sum(split) == roofline_bytes("expand_to_fused_with_sf", SMALL_SF, 1)
    # all rows padding, no token used: maps read, zeros written
    assert expand_split_bytes(SMALL, 2, routed_rows=0, used_tokens=0) == (56, 160)
    with pytest.raises(ValueError, match=re.escape("routed_rows must be in [0, X = 8]; got 9")):
        expand_split_bytes(SMALL, 2, routed_rows=9)
    with pytest.raises(ValueError, match=re.escape("used_tokens must be in [0, T = 3]; got 4")):
        expand_to_fused_bytes(SMALL, 2, used_tokens=4)


@pytest.mark.parametrize(("label", "copy_bytes", "zero_bytes"), [
    # T=1 H=3072 bf16 (row 6144), K=8, X=1024, R=8, U=1:
    # copy 1*6144 + 8*4 + 1024*4 + 8*6144, zero (1024 - 8) * 6144
    ("qwen3-30b-decode-e128-plan", 6144 + 32 + 4096 + 49_152, 1016 * 6144),
    # T=32 of which U=19 have a local slot, X=3072, R=34:
    # copy 19*6144 + 32*8*4 + 3072*4 + 34*6144, zero (3072 - 34) * 6144
    ("qwen3-30b-small-e48-ep8-plan", 116_736 + 1024 + 12_288 + 208_896, 3038 * 6144),
    # fp8 + packed SF: row 3072 + 6*4 = 3096; T=U=32, X=14848, R=256:
    # copy 32*3096 + 32*8*4 + 14848*4 + 256*3096, zero (14848 - 256) * 3096
    ("qwen3-30b-small-e128-plan-sf-packed", 99_072 + 1024 + 59_392 + 792_576, 14_592 * 3096),
])
def test_plan_workload_bytes_by_hand(label, copy_bytes, zero_bytes):
    w = plan_workload(label)
    assert w.split_bytes() == (copy_bytes, zero_bytes)
    assert w.bytes == copy_bytes + zero_bytes


@pytest.mark.parametrize("w", PLANS, ids=lambda w: w.label)
def test_plan_workload_bytes_add_up(w):
    copy_bytes, zero_bytes = w.split_bytes()
    assert copy_bytes + zero_bytes == w.bytes
    row = w.hidden * w.elem_bytes + 4 * (w.sf_columns or 0)
    assert zero_bytes == (w.num_expanded - w.routed_rows) * row
    # all ranks' experts local: the seed's formula of the shapes
    if w.plan.ep_ranks == 1:
        assert w.bytes == roofline_bytes(w.op, w.shapes, w.elem_bytes)
    else:
        assert w.bytes < roofline_bytes(w.op, w.shapes, w.elem_bytes)


def test_a_workload_without_plan_splits_its_drawn_routing(rng):
    w = load_workloads("expand_to_fused")[1]  # kimi-k2-small: fitted_routing
    assert w.plan is None and w.routed_rows is None and w.used_tokens is None
    with pytest.raises(ValueError, match="kimi-k2-small: no plan; give the routed_rows"):
        w.split_bytes()
    host = workload_inputs(w, rng)
    routed = int(np.count_nonzero(host["pos_to_expert"] >= 0))
    assert 0 < routed < w.num_expanded
    split = runner.split_bytes(w, host)
    assert split == w.split_bytes(routed) and sum(split) == w.bytes
    with pytest.raises(ValueError, match="mapping-decode: fused_mapping has no copy/memset"):
        load_workloads("fused_mapping")[0].split_bytes(0)


# --- the benchmark -----------------------------------------------------------------

CPU_LABELS = ["kimi-k2-decode-e384-plan", "qwen3-30b-small-e128-plan",
              "qwen3-30b-medium-e48-ep8-plan", "kimi-k2-decode-e384-plan-sf-row-major",
              "qwen3-30b-small-e128-plan-sf-packed"]


@pytest.mark.parametrize("label", CPU_LABELS)
def test_bench_cpu_workload_of_a_plan_is_bit_exact(label, rng):
    w = plan_workload(label)
    record = runner.bench_cpu_workload(w, 1, rng)
    assert record.status == "ok", record.status
    assert record.bytes == w.bytes and record.cpu_us > 0
    assert f" X={w.num_expanded} plan E=" in record.shapes
    assert all(getattr(record, name) is None for name in FLOOR_FIELDS)


def test_shapes_text_names_the_plan():
    assert runner._shapes_text(plan_workload("kimi-k2-small-e128-plan")) == (
        "T=32 H=7168 K=8 X=14848 plan E=128 A=128 routed=256 +pos_to_token")
    assert runner._shapes_text(plan_workload("kimi-k2-medium-e48-ep8-plan-sf-packed")) == (
        "T=512 H=7168 K=8 X=6144 plan E=48/384 A=128 routed=516 S=14 int32/col +pos_to_token")
    assert runner._shapes_text(load_workloads("expand_to_fused")[0]) == (
        "T=1 H=7168 K=8 X=16")


def test_bench_quick_on_the_cpu_runs_the_plan_workloads(tmp_path, capsys):
    path = tmp_path / "bench.json"
    code = main(["bench", "--backend", "cpu", "--quick", "--iters", "1", "--json", str(path)])
    assert code == 0
    result = json.loads(path.read_text())
    records = {r["label"]: r for r in result["records"]}
    (skip_note,) = [n for n in result["notes"] if n.startswith("--quick on the CPU skips")]
    skipped = skip_note.split(": ", 1)[1].split(", ")
    for w in PLANS:
        if w.bytes > runner.CPU_QUICK_MAX_BYTES:
            assert w.label in skipped and w.label not in records
            continue
        r = records.pop(w.label)
        assert r["status"] == "ok" and r["bytes"] == w.bytes and r["cpu_us"] > 0
        assert all(key in r and r[key] is None for key in FLOOR_FIELDS)
    assert all(r["status"] == "ok" for r in records.values())
    assert sum(w.bytes <= runner.CPU_QUICK_MAX_BYTES for w in PLANS) >= 20
    out = capsys.readouterr().out
    assert "| expand | qwen3-30b-decode-e128-plan | T=1 H=3072 K=8 X=1024 plan E=128 " in out


# the GPU path's control flow, with CPU tensors and fixed timings (FakeTimer:
# tests/bench_cases.py)

@pytest.fixture
def cpu_torch_backend(monkeypatch):
    """bench_gpu_workload's torch backend with CPU tensors (the op runs its CPU
    path); the graph timer returns a fixed figure."""
    torch = pytest.importorskip("torch")
    from cupy_moe.runtime.arrays import numpy_to_torch

    monkeypatch.setattr(runner, "_to_torch", lambda a: numpy_to_torch(np.ascontiguousarray(a)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(runner, "torch_graph_us", lambda fn: 0.75)


@pytest.mark.parametrize("label", ["kimi-k2-decode-e128-plan", "qwen3-30b-small-e48-ep8-plan",
                                   "qwen3-30b-small-e128-plan-sf-packed"])
def test_bench_gpu_workload_times_the_copy_memset_floor(cpu_torch_backend, label, rng):
    w = plan_workload(label)
    timer = FakeTimer()
    record = runner.bench_gpu_workload(w, timer, "torch", 5, 3.0, rng, kernel_only=True)
    assert record.status == "ok", record.status
    copy_bytes, zero_bytes = w.split_bytes()
    assert timer.calls == [("median_us", 5), ("copy_us", w.bytes // 2, 5),
                           ("copy_us", copy_bytes // 2, 5), ("memset_us", zero_bytes, 5)]
    assert (record.gpu_us, record.copy_same_bytes_us) == (4.0, 2.5)
    assert record.zero_bytes == zero_bytes
    assert (record.copy_routed_us, record.memset_zero_us) == (2.5, 1.0)
    assert record.pct_copy_memset_model == 100 * (2.5 + 1.0) / 4.0
    # the existing figures keep their meaning
    assert record.gbps == w.bytes / 4.0 / 1e3
    assert record.pct_copy_roofline == 100 * record.gbps / 3.0e3


def test_bench_gpu_workload_of_a_fitted_workload_splits_its_draw(cpu_torch_backend):
    w = load_workloads("expand_to_fused")[4]  # qwen3-30b-decode: fitted_routing
    timer = FakeTimer()
    record = runner.bench_gpu_workload(w, timer, "torch", 3, 3.0, np.random.default_rng(9),
                                       kernel_only=True)
    host = workload_inputs(w, np.random.default_rng(9))  # the same draw
    copy_bytes, zero_bytes = runner.split_bytes(w, host)
    assert copy_bytes + zero_bytes == w.bytes and record.zero_bytes == zero_bytes
    assert timer.calls[2:] == [("copy_us", copy_bytes // 2, 3), ("memset_us", zero_bytes, 3)]
    assert record.pct_copy_memset_model == 87.5


def test_no_padding_needs_no_memset(cpu_torch_backend, rng, monkeypatch):
    # alignment 1: every row routed, nothing to zero
    w = Workload("expand_to_fused", "no-padding", {"x": (16, 64), "token_topk_to_pos": (16, 2)},
                 "bfloat16", plan=PlanSpec(num_experts=4, alignment=1, seed=3))
    assert w.num_expanded == w.routed_rows == 32
    timer = FakeTimer()
    record = runner.bench_gpu_workload(w, timer, "torch", 2, 3.0, rng, kernel_only=True)
    assert record.status == "ok" and record.zero_bytes == 0 and record.memset_zero_us == 0.0
    assert [call[0] for call in timer.calls] == ["median_us", "copy_us", "copy_us"]
    assert record.pct_copy_memset_model == 100 * 2.5 / 4.0


def test_bench_gpu_workload_does_not_time_a_wrong_result(cpu_torch_backend, rng, monkeypatch):
    op = runner.expand_to_fused

    def shifted(x, token_topk_to_pos, pos_to_expert, **kwargs):
        return op(x, token_topk_to_pos.roll(1), pos_to_expert, **kwargs)
    monkeypatch.setattr(runner, "expand_to_fused", shifted)
    timer = FakeTimer()
    record = runner.bench_gpu_workload(plan_workload("qwen3-30b-small-e128-plan"), timer,
                                       "torch", 2, 3.0, rng)
    assert record.status.startswith("MISMATCH expanded_x: ") and timer.calls == []
    assert all(getattr(record, name) is None for name in FLOOR_FIELDS)


# --- the report ----------------------------------------------------------------------

def gpu_result(records) -> dict:
    return {"date": "2026-01-01", "backend": "torch", "iters": 5, "quick": False,
            "versions": {}, "copy_tbps": 3.0, "device": "a GPU", "records": records,
            "notes": []}


def test_the_report_shows_the_floor(cpu_torch_backend, rng, tmp_path):
    w = plan_workload("kimi-k2-decode-e128-plan")
    record = asdict(runner.bench_gpu_workload(w, FakeTimer(), "torch", 5, 3.0, rng,
                                              kernel_only=True))
    lines = report.table_lines(gpu_result([record]))
    assert lines[0] == ("| op | workload | shapes | MB | GPU us | GB/s | % copy | % copy+memset "
                        "| same-size copy us | % same-size copy | copy+memset us | eager us "
                        "| index_select us "
                        "| graph us | torch-ref us | nosync us | x ref | x nosync |")
    gbps = w.bytes / 4.0 / 1e3
    assert lines[2] == (f"| expand | kimi-k2-decode-e128-plan | T=1 H=7168 K=8 X=1024 plan "
                        f"E=128 A=128 routed=8 +pos_to_token | {w.bytes / 1e6:.2f} | 4.0 "
                        f"| {gbps:.0f} "
                        f"| {100 * gbps / 3.0e3:.1f} | 87.5 | 2.5 | 62.5 | 3.5 | - | - | - | - "
                        "| - "
                        "| - | - |")
    summary = report.summary_lines(gpu_result([record]))
    assert any(line.startswith("copy+memset floor (expand ops): ") for line in summary)
    # a result file from before the floor: no such keys, "-" in their columns
    old = {k: v for k, v in record.items() if k not in FLOOR_FIELDS}
    assert report.table_lines(gpu_result([old]))[2].split(" | ")[7:11] == ["-", "2.5", "62.5",
                                                                            "-"]
    # a record without its kernel time (a failed figure): "-"
    assert report.table_lines(gpu_result([{**old, "gpu_us": None}]))[2].split(" | ")[9] == "-"
    assert not any(line.startswith("copy+memset")
                   for line in report.summary_lines(gpu_result([old])))
    pytest.importorskip("matplotlib")
    mapping = asdict(runner.Record("fused_mapping", "mapping-decode", "T=1", 1000,
                                   gpu_us=2.0, gbps=0.5, pct_copy_roofline=0.02))
    report.write_plot(gpu_result([record, mapping]), str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").stat().st_size > 0
