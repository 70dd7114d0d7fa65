"""The workload manifest: labels, consistent shapes, roofline byte counts, and
the strict check of workloads.yaml."""

from __future__ import annotations

import copy
import functools
import re
from importlib import resources

import pytest
import yaml

import cupy_moe
from cupy_moe.harness.manifest import (
    ALL_OP_NAMES,
    COMBINE_OP_NAMES,
    MAPPING_OP_NAMES,
    OP_NAMES,
    QUANTIZE_OP_NAMES,
    PlanSpec,
    Workload,
    load_workloads,
    parse_manifest,
    roofline_bytes,
    workload_from_entry,
)
from cupy_moe.harness.rooflines import (
    ROOFLINES,
    expand_to_fused_bytes,
    expand_to_fused_with_sf_bytes,
    fused_mapping_bytes,
    quantize_fp8_bytes,
    reduce_fused_bytes,
    swiglu_quantize_fp8_bytes,
)
from cupy_moe.mapping import worst_case_rows
from cupy_moe.runtime.sizes import ceil_div

pytestmark = pytest.mark.smoke

# the seed's workloads, routed by fitted_routing into the stated X (the plan
# workloads that follow them are tests/test_bench_plans.py's)
SEED_LABELS = {
    "expand_to_fused": [
        "kimi-k2-decode", "kimi-k2-small", "kimi-k2-medium", "kimi-k2-prefill",
        "qwen3-30b-decode", "qwen3-30b-small", "qwen3-30b-medium", "qwen3-30b-prefill",
    ],
    "expand_to_fused_with_sf": [
        "kimi-k2-decode-sf-row-major", "kimi-k2-medium-sf-row-major",
        "kimi-k2-decode-sf-packed", "kimi-k2-medium-sf-packed",
        "qwen3-30b-small-sf-row-major", "qwen3-30b-small-sf-packed",
    ],
}
# label, T, K, E, A of the routing plan's workloads (also the shapes of
# benchmarks/bench_fused_mapping.py)
MAPPING_WORKLOADS = [
    ("mapping-decode", 1, 8, 384, 128),
    ("mapping-small", 32, 8, 256, 128),
    ("mapping-medium", 512, 8, 256, 128),
    ("mapping-prefill-e128", 4096, 8, 128, 128),
    ("mapping-prefill-e256", 4096, 8, 256, 128),
    ("mapping-prefill-e384", 4096, 8, 384, 128),
    ("mapping-prefill-8k-e384", 8192, 8, 384, 128),
]
ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}


def by_hand(workload) -> int:
    """The seed's roofline: inputs read once, outputs written once (a plan
    workload's x and x_sf: the rows of its used tokens only)."""
    (t, h), (_, k), (x,) = (workload.shapes[n] for n in ("x", "token_topk_to_pos",
                                                         "pos_to_expert"))
    u = t if workload.plan is None else workload.used_tokens
    e = ITEM_BYTES[workload.dtype]
    total = u * h * e + t * k * 4 + x * 4 + x * h * e
    if "x_sf" in workload.shapes:
        s = workload.shapes["x_sf"][1]
        total += u * s * 4 + x * s * 4
    return total


def test_every_op_has_workloads_and_a_roofline():
    assert tuple(SEED_LABELS) == OP_NAMES
    assert MAPPING_OP_NAMES == ("fused_mapping",)
    assert COMBINE_OP_NAMES == ("reduce_fused",)
    assert QUANTIZE_OP_NAMES == ("quantize_fp8", "swiglu_quantize_fp8")
    assert ALL_OP_NAMES == (*OP_NAMES, "fused_mapping", "reduce_fused", "quantize_fp8",
                            "swiglu_quantize_fp8")
    assert set(ROOFLINES) == set(ALL_OP_NAMES)
    assert ROOFLINES["expand_to_fused"] is expand_to_fused_bytes
    assert ROOFLINES["expand_to_fused_with_sf"] is expand_to_fused_with_sf_bytes
    assert ROOFLINES["fused_mapping"] is fused_mapping_bytes
    assert ROOFLINES["reduce_fused"] is reduce_fused_bytes
    assert ROOFLINES["quantize_fp8"] is quantize_fp8_bytes
    assert ROOFLINES["swiglu_quantize_fp8"] is swiglu_quantize_fp8_bytes
    assert all(load_workloads(op) for op in ALL_OP_NAMES)


@pytest.mark.parametrize("op", list(SEED_LABELS))
def test_workload_labels_are_the_seeds(op):
    workloads = load_workloads(op)
    seeds = [w for w in workloads if w.plan is None]
    assert [w.label for w in seeds] == SEED_LABELS[op]
    # the seeds first, then the real-plan workloads
    assert workloads[:len(seeds)] == seeds
    assert all(w.label.endswith(("-plan", "-plan-sf-row-major", "-plan-sf-packed"))
               for w in workloads[len(seeds):])
    assert all(w.op == op for w in workloads)


@pytest.mark.parametrize("op", list(SEED_LABELS))
def test_workload_shapes_are_consistent(op):
    for w in load_workloads(op):
        t, h = w.shapes["x"]
        assert w.shapes["token_topk_to_pos"][0] == t and w.num_tokens == t, w.label
        assert (w.hidden, w.top_k, w.num_expanded) == (
            h, w.shapes["token_topk_to_pos"][1], w.shapes["pos_to_expert"][0])
        assert len(w.shapes["pos_to_expert"]) == 1
        if op == "expand_to_fused":
            assert w.dtype == "bfloat16" and "x_sf" not in w.shapes and w.sf_columns is None
            continue
        assert w.dtype == "float8_e4m3fn" and w.num_per_channels in (32, 128)
        blocks = ceil_div(h, w.num_per_channels)
        if w.sf_dtype == "int32":  # packed UE8M0: 4 exponent bytes a word, col-major only
            assert w.use_tma_aligned_col_major_sf, w.label
            expected_s = ceil_div(blocks, 4)
        else:
            assert w.sf_dtype == "float32", w.label
            expected_s = blocks
        assert w.shapes["x_sf"] == (t, expected_s), w.label
        assert w.sf_columns == expected_s


@pytest.mark.parametrize(("op", "label", "expected"), [
    # 4096*7168*2 + 4096*8*4 + 32768*4 + 32768*7168*2
    ("expand_to_fused", "kimi-k2-prefill", 528_744_448),
    # 1*3072*2 + 1*8*4 + 16*4 + 16*3072*2
    ("expand_to_fused", "qwen3-30b-decode", 104_544),
    # 512*7168 + 512*14*4 + 512*8*4 + 4096*4 + 4096*7168 + 4096*14*4
    ("expand_to_fused_with_sf", "kimi-k2-medium-sf-packed", 33_320_960),
])
def test_roofline_bytes_hand_computed(op, label, expected):
    (workload,) = [w for w in load_workloads(op) if w.label == label]
    assert workload.bytes == expected
    assert roofline_bytes(op, workload.shapes, workload.elem_bytes) == expected
    assert ROOFLINES[op](workload.shapes, workload.elem_bytes) == expected


# T=3, H=10, K=2, X=8 (and S=5): every dimension different, so a term that
# uses the wrong one changes the sum.
SMALL = {"x": (3, 10), "token_topk_to_pos": (3, 2), "pos_to_expert": (8,)}
SMALL_SF = {**SMALL, "x_sf": (3, 5)}


def test_expand_to_fused_bytes_counts_each_array_once():
    # x 3*10*2 + maps 3*2*4 + 8*4 + expanded 8*10*2
    assert expand_to_fused_bytes(SMALL, 2) == 60 + 24 + 32 + 160
    # fp8: x 3*10 + maps 3*2*4 + 8*4 + expanded 8*10
    assert expand_to_fused_bytes(SMALL, 1) == 30 + 24 + 32 + 80
    # no tokens (an idle expert-parallel rank): maps and zeroed rows still count
    assert expand_to_fused_bytes({"x": (0, 10), "token_topk_to_pos": (0, 2),
                                  "pos_to_expert": (8,)}, 2) == 32 + 160


def test_expand_to_fused_with_sf_bytes_adds_scale_factors():
    # x 3*10 + x_sf 3*5*4 + maps 3*2*4 + 8*4 + expanded 8*10 + expanded_sf 8*5*4
    assert expand_to_fused_with_sf_bytes(SMALL_SF, 1) == 30 + 60 + 24 + 32 + 80 + 160
    assert roofline_bytes("expand_to_fused_with_sf", SMALL_SF, 1) == 386
    # X not a multiple of 4: the TMA layout's pad columns are not counted
    shapes = {**SMALL_SF, "pos_to_expert": (7,)}
    assert expand_to_fused_with_sf_bytes(shapes, 1) == 30 + 60 + 24 + 28 + 70 + 140


@pytest.mark.parametrize("op", list(SEED_LABELS))
def test_roofline_bytes_follow_the_seed_formula(op):
    for w in load_workloads(op):
        assert w.bytes == by_hand(w), w.label


def test_unknown_op_is_a_key_error():
    known = re.escape("known: ['expand_to_fused', 'expand_to_fused_with_sf', 'fused_mapping', "
                      "'quantize_fp8', 'reduce_fused', 'swiglu_quantize_fp8']")
    with pytest.raises(KeyError, match="no op 'expand_to_nowhere' in the manifest; " + known):
        load_workloads("expand_to_nowhere")
    with pytest.raises(KeyError, match="no op 'expand_to_nowhere' in the manifest; " + known):
        roofline_bytes("expand_to_nowhere", {"x": (1, 1)}, 2)
    with pytest.raises(KeyError, match="no op 'expand_to_nowhere' in the manifest; " + known):
        workload_from_entry("expand_to_nowhere", {})


def test_roofline_bytes_names_a_shape_left_out():
    with pytest.raises(ValueError, match=re.escape(
            "roofline_bytes('expand_to_fused'): shapes has no 'token_topk_to_pos' (given: x)")):
        roofline_bytes("expand_to_fused", {"x": (4, 8)}, 2)


def test_a_workloads_shapes_are_read_only():
    """load_workloads hands out the manifest's own workloads: a write to one's
    shapes once changed every later load (and disagreed with the sizes read
    off them)."""
    import copy
    import pickle

    w = load_workloads("expand_to_fused")[0]
    for change in (lambda s: s.__setitem__("x", (1, 1)), lambda s: s.update(x=(1, 1)),
                   lambda s: s.pop("x"), lambda s: s.clear()):
        with pytest.raises(TypeError, match="a workload's shapes are read-only"):
            change(w.shapes)
    assert load_workloads("expand_to_fused")[0].shapes == w.shapes
    assert w.shapes["x"] == (w.num_tokens, w.hidden)
    # a workload still pickles and copies (a dict subclass, not a mappingproxy)
    assert pickle.loads(pickle.dumps(w)) == w and copy.deepcopy(w) == w


def test_an_entry_outside_the_manifest_is_the_manifests_twin():
    """A sweep's entry (benchmarks/sweep_swiglu_slots.py) parses as the
    manifest's own does: the same Workload for the same keys, the same errors."""
    manifest = next(w for w in load_workloads("swiglu_quantize_fp8")
                    if w.label == "swiglu-qwen3-30b-a3b-medium-e128-plan-col-major-unzeroed")
    entry = {"label": manifest.label, "tokens": manifest.num_tokens, "top_k": manifest.top_k,
             "intermediate": manifest.hidden,
             "plan": {"num_experts": 128, "alignment": 128, "seed": 0},
             "topk_weights": True, "pos_to_expert": True, "num_per_channels": 128,
             "round_sf": False, "packed_ue8m0": False, "use_tma_aligned_col_major_sf": True,
             "dtype": "bfloat16", "zero_padding": False, "token_topk_to_pos": True}
    assert workload_from_entry("swiglu_quantize_fp8", entry) == manifest
    with pytest.raises(ValueError, match=re.escape(
            f"workloads.yaml: swiglu_quantize_fp8 workload 0 ({manifest.label}): "
            "unknown key(s) ['hidden']")):
        workload_from_entry("swiglu_quantize_fp8", {**entry, "hidden": 768})


# --- the routing plan's workloads ---------------------------------------------

def test_mapping_workloads_are_the_benchmark_shapes():
    workloads = load_workloads("fused_mapping")
    assert [(w.label, w.num_tokens, w.top_k, w.num_experts, w.alignment)
            for w in workloads] == MAPPING_WORKLOADS
    for w in workloads:
        assert w.op == "fused_mapping" and w.dtype == "int64" and w.elem_bytes == 8
        assert dict(w.shapes) == {"topk_ids": (w.num_tokens, w.top_k)}
        assert w.hidden is None and w.sf_columns is None and w.sf_dtype is None
        # X is the op's default: the tight worst case of T * K slots
        assert w.num_expanded == worst_case_rows(w.num_tokens * w.top_k, w.num_experts,
                                                 w.alignment)


@pytest.mark.parametrize(("label", "num_expanded", "expected"), [
    # X = (8 + 8 * 127) // 128 * 128 = 1024 (8 slots reach 8 experts at most);
    # ids 8*8 + token_topk_to_pos 8*4 + pos rows 3*1024*4 + expert rows 3*384*4
    ("mapping-decode", 1024, 64 + 32 + 12_288 + 4_608),
    # X = (32768 + 256 * 127) // 128 * 128 = 65280;
    # 32768*8 + 32768*4 + 3*65280*4 + 3*256*4
    ("mapping-prefill-e256", 65_280, 262_144 + 131_072 + 783_360 + 3_072),
])
def test_mapping_roofline_bytes_hand_computed(label, num_expanded, expected):
    (workload,) = [w for w in load_workloads("fused_mapping") if w.label == label]
    assert workload.num_expanded == num_expanded
    assert workload.bytes == expected
    assert roofline_bytes("fused_mapping", workload.shapes, 8, num_experts=workload.num_experts,
                          num_expanded=num_expanded) == expected


def test_fused_mapping_bytes_counts_each_array_once():
    # T=3, K=2, X=20, E=7: ids 6*8 + token_topk_to_pos 6*4 + 3*20*4 + 3*7*4
    shapes = {"topk_ids": (3, 2)}
    assert fused_mapping_bytes(shapes, 8, num_experts=7, num_expanded=20) == 48 + 24 + 240 + 84
    # int32 ids: 4 bytes an id
    assert fused_mapping_bytes(shapes, 4, num_experts=7, num_expanded=20) == 24 + 24 + 240 + 84
    # no tokens: the expert rows are still written
    assert fused_mapping_bytes({"topk_ids": (0, 8)}, 8, num_experts=7, num_expanded=0) == 84
    with pytest.raises(TypeError, match="missing 2 required keyword-only arguments: "
                                        "'num_experts' and 'num_expanded'"):
        roofline_bytes("fused_mapping", shapes, 8)


# --- the strict check of workloads.yaml -----------------------------------------

@functools.cache
def _packaged_text() -> str:
    return resources.files("cupy_moe.harness").joinpath("workloads.yaml").read_text()


def packaged_manifest() -> dict:
    """workloads.yaml as loaded, a new copy each call (callers change it);
    libyaml's safe loader where PyYAML has it (the pure-Python one is slow)."""
    return yaml.load(_packaged_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def with_entry(op: str, index: int, **changes) -> dict:
    """The packaged manifest with keys of one entry changed (None: removed)."""
    data = copy.deepcopy(packaged_manifest())
    entry = data[op]["workloads"][index]
    for key, value in changes.items():
        if value is None:
            entry.pop(key)
        else:
            entry[key] = value
    return data


def test_the_packaged_manifest_parses_to_what_load_workloads_returns():
    parsed = parse_manifest(packaged_manifest())
    assert list(parsed) == list(ALL_OP_NAMES)
    for op in ALL_OP_NAMES:
        assert parsed[op] == load_workloads(op)
    # load_workloads hands out a copy: a caller cannot change the cached list
    load_workloads("fused_mapping").clear()
    assert len(load_workloads("fused_mapping")) == len(MAPPING_WORKLOADS)


MAPPING_ENTRY = "workloads.yaml: fused_mapping workload 2 (mapping-medium)"
SF_ENTRY = "workloads.yaml: expand_to_fused_with_sf workload 0 (kimi-k2-decode-sf-row-major)"


@pytest.mark.parametrize(("op", "changes", "error", "message"), [
    # unknown and missing keys
    ("fused_mapping", {"hidden": 7168}, ValueError,
     (f"{MAPPING_ENTRY}: unknown key(s) ['hidden']; allowed: ['alignment', 'dtype', "
      "'label', 'num_experts', 'topk_ids']")),
    ("fused_mapping", {"num_experts": None}, ValueError,
     f"{MAPPING_ENTRY}: missing key(s) ['num_experts']"),
    ("fused_mapping", {"alignment": None, "dtype": None}, ValueError,
     f"{MAPPING_ENTRY}: missing key(s) ['alignment', 'dtype']"),
    ("expand_to_fused", {"num_experts": 8}, ValueError,
     ("workloads.yaml: expand_to_fused workload 2 (kimi-k2-medium): unknown key(s) "
      "['num_experts']; allowed: ['dtype', 'label', 'plan', 'pos_to_expert', "
      "'token_topk_to_pos', 'x']")),
    # wrong types
    ("fused_mapping", {"num_experts": "256"}, TypeError,
     f"{MAPPING_ENTRY}: num_experts must be an int; got '256' (str)"),
    ("fused_mapping", {"alignment": 128.0}, TypeError,
     f"{MAPPING_ENTRY}: alignment must be an int; got 128.0 (float)"),
    ("fused_mapping", {"alignment": True}, TypeError,
     f"{MAPPING_ENTRY}: alignment must be an int; got True (bool)"),
    ("fused_mapping", {"topk_ids": "512x8"}, TypeError,
     f"{MAPPING_ENTRY}: topk_ids must be a list of 2 int(s); got '512x8'"),
    ("fused_mapping", {"topk_ids": [512, 8.0]}, TypeError,
     f"{MAPPING_ENTRY}: topk_ids must be a list of 2 int(s); got [512, 8.0]"),
    ("fused_mapping", {"dtype": 64}, TypeError,
     f"{MAPPING_ENTRY}: dtype must be a string; got 64 (int)"),
    ("expand_to_fused_with_sf", {"use_tma_aligned_col_major_sf": "no"}, TypeError,
     f"{SF_ENTRY}: use_tma_aligned_col_major_sf must be true or false; got 'no' (str)"),
    # bad values
    ("fused_mapping", {"topk_ids": [512]}, ValueError,
     f"{MAPPING_ENTRY}: topk_ids must be 2 size(s) >= 0; got [512]"),
    ("fused_mapping", {"topk_ids": [-1, 8]}, ValueError,
     f"{MAPPING_ENTRY}: topk_ids must be 2 size(s) >= 0; got [-1, 8]"),
    ("fused_mapping", {"topk_ids": [512, 0]}, ValueError,
     f"{MAPPING_ENTRY}: topk_ids must have K >= 1 slots a token; got [512, 0]"),
    ("fused_mapping", {"num_experts": 0}, ValueError,
     f"{MAPPING_ENTRY}: num_experts must be >= 1; got 0"),
    ("fused_mapping", {"alignment": -128}, ValueError,
     f"{MAPPING_ENTRY}: alignment must be >= 1; got -128"),
    ("fused_mapping", {"dtype": "bfloat16"}, ValueError,
     f"{MAPPING_ENTRY}: dtype must be one of ['int32', 'int64']; got 'bfloat16'"),
    ("expand_to_fused_with_sf", {"sf_dtype": "float16"}, ValueError,
     f"{SF_ENTRY}: sf_dtype must be one of ['float32', 'int32']; got 'float16'"),
    ("expand_to_fused_with_sf", {"x_sf": [2, 56]}, ValueError,
     (f"{SF_ENTRY}: the shapes disagree on T (their first size): "
      "{'x': 1, 'x_sf': 2, 'token_topk_to_pos': 1}")),
    # a label twice: in one op, and across ops
    ("fused_mapping", {"label": "mapping-decode"}, ValueError,
     ("workloads.yaml: label 'mapping-decode' of fused_mapping is already one of "
      "fused_mapping; labels must be unique")),
    ("fused_mapping", {"label": "kimi-k2-medium"}, ValueError,
     ("workloads.yaml: label 'kimi-k2-medium' of fused_mapping is already one of "
      "expand_to_fused; labels must be unique")),
])
def test_a_bad_entry_is_rejected_with_its_name(op, changes, error, message):
    index = 0 if op == "expand_to_fused_with_sf" else 2
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        parse_manifest(with_entry(op, index, **changes))


def test_optional_keys_take_their_defaults():
    (first, *_) = parse_manifest(with_entry("expand_to_fused_with_sf", 0,
                                            use_tma_aligned_col_major_sf=None))[
        "expand_to_fused_with_sf"]
    assert first.use_tma_aligned_col_major_sf is False


def test_a_bad_section_is_rejected():
    data = packaged_manifest()
    with pytest.raises(TypeError, match=re.escape(
            "workloads.yaml must map op names to sections; got list")):
        parse_manifest([data])
    with pytest.raises(ValueError, match=re.escape(
            "workloads.yaml: unknown op section(s) ['fused_mapping_v2']; known: "
            "['expand_to_fused', 'expand_to_fused_with_sf', 'fused_mapping', 'reduce_fused', "
            "'quantize_fp8', 'swiglu_quantize_fp8']")):
        parse_manifest({**data, "fused_mapping_v2": data["fused_mapping"]})
    without = {op: section for op, section in data.items() if op != "fused_mapping"}
    with pytest.raises(ValueError, match=re.escape(
            "workloads.yaml: no section for op(s) ['fused_mapping']")):
        parse_manifest(without)
    with pytest.raises(ValueError, match=re.escape(
            "workloads.yaml: the fused_mapping section must have exactly one key, workloads; "
            "got {'workloads': [], 'notes': 'x'}")):
        parse_manifest({**data, "fused_mapping": {"workloads": [], "notes": "x"}})
    with pytest.raises(TypeError, match=re.escape(
            "workloads.yaml: fused_mapping.workloads must be a list of entries; got dict")):
        parse_manifest({**data, "fused_mapping": {"workloads": {"label": "x"}}})
    with pytest.raises(TypeError, match=re.escape(
            "workloads.yaml: fused_mapping workload 0 must be a mapping of keys to values; "
            "got 'mapping-decode'")):
        parse_manifest({**data, "fused_mapping": {"workloads": ["mapping-decode"]}})


def test_public_names():
    assert cupy_moe.load_workloads is load_workloads
    assert cupy_moe.roofline_bytes is roofline_bytes
    assert cupy_moe.Workload is Workload
    assert isinstance(load_workloads("expand_to_fused")[0], cupy_moe.Workload)


# --- the combine and the fp8 producers ------------------------------------------

# model: (H, I, E local, ep_ranks) of the newer ops' workloads
MODELS = {"kimi-k2": (7168, 2048, 384, 1), "dsv3-ep8": (7168, 2048, 32, 8),
          "qwen3-30b-a3b": (2048, 768, 128, 1)}
SIZES = {"decode": 1, "small": 32, "medium": 512, "prefill": 4096, "prefill-8k": 8192}


def newer_workload(label: str) -> Workload:
    (found,) = [w for op in COMBINE_OP_NAMES + QUANTIZE_OP_NAMES for w in load_workloads(op)
                if w.label == label]
    return found


def test_the_newer_ops_cover_the_models_and_batches():
    reduce = {w.label: w for w in load_workloads("reduce_fused")}
    for model in ("kimi-k2", "qwen3-30b-a3b"):
        hidden, _, experts, _ = MODELS[model]
        for size, tokens in SIZES.items():
            # alignment 1: the T*K slots packed into exactly T*K rows, every one routed
            w = reduce[f"reduce-{model}-{size}"]
            assert (w.num_tokens, w.hidden, w.top_k, w.dtype) == (tokens, hidden, 8, "bfloat16")
            assert w.plan == PlanSpec(num_experts=experts, alignment=1, seed=0)
            assert w.num_expanded == w.routed_rows == tokens * 8 and w.used_tokens == tokens
            assert dict(w.shapes) == {"expanded": (tokens * 8, hidden),
                                      "token_topk_to_pos": (tokens, 8),
                                      "topk_weights": (tokens, 8)}
    for size, tokens in SIZES.items():  # DeepSeek-V3, 32 of 256 experts on this rank
        w = reduce[f"reduce-dsv3-ep8-{size}-plan"]
        assert w.plan == PlanSpec(num_experts=32, alignment=128, seed=0, ep_ranks=8)
        assert w.routed_rows < tokens * 8 and w.num_expanded % 128 == 0
    padded = reduce["reduce-kimi-k2-medium-e384-plan"]
    assert (padded.num_expanded, padded.routed_rows) == (49152, 4096)
    assert reduce["reduce-kimi-k2-medium-row-scale"].shapes["row_scale"] == (4096,)
    assert "topk_weights" not in reduce["reduce-qwen3-30b-a3b-medium-unweighted"].shapes

    quant = {w.label: w for w in load_workloads("quantize_fp8")}
    layouts = {"row-major": (False, False, False), "col-major": (False, False, True),
               "packed": (True, True, True)}
    for w in quant.values():
        layout = next(name for name in layouts if w.label.endswith(name))
        assert (w.round_sf, w.packed_ue8m0, w.use_tma_aligned_col_major_sf) == layouts[layout]
        assert w.num_per_channels == (32 if "-npc32-" in w.label else 128)
        assert w.dtype == "bfloat16" and w.top_k is None and w.num_expanded is None
        assert w.sf_dtype == ("int32" if layout == "packed" else "float32")
        blocks = ceil_div(w.hidden, w.num_per_channels)
        assert w.sf_columns == (ceil_div(blocks, 4) if layout == "packed" else blocks)
    for size, tokens in SIZES.items():
        assert quant[f"quant-kimi-k2-{size}-row-major"].shapes == {"x": (tokens, 7168)}
        assert quant[f"quant-qwen3-30b-a3b-{size}-row-major"].shapes == {"x": (tokens, 2048)}
    assert {w.num_per_channels for w in quant.values()} == {32, 128}

    swiglu = {w.label: w for w in load_workloads("swiglu_quantize_fp8")}
    for model, (_, intermediate, experts, ranks) in MODELS.items():
        for size, tokens in SIZES.items():
            stem = f"swiglu-{model}-{size}-" + ("plan" if ranks > 1 else f"e{experts}-plan")
            w = swiglu[f"{stem}-col-major"]
            assert w.plan == PlanSpec(num_experts=experts, alignment=128, seed=0,
                                      ep_ranks=ranks)
            x = w.num_expanded
            assert dict(w.shapes) == {"h": (x, 2 * intermediate), "topk_weights": (tokens, 8),
                                      "pos_to_token_topk": (x,), "pos_to_expert": (x,)}
            assert (w.num_tokens, w.top_k, w.hidden) == (tokens, 8, intermediate)
            assert w.use_tma_aligned_col_major_sf and not w.round_sf
    labels = [w.label for op in ALL_OP_NAMES for w in load_workloads(op)]
    assert len(labels) == len(set(labels))


@pytest.mark.parametrize(("label", "expected"), [
    # T=32 H=2048 K=8, alignment 1: X = R = 256 rows read, all weighted;
    # rows 256*2048*2 + map 32*8*4 + weights 32*8*4 + out 32*2048*2
    ("reduce-qwen3-30b-a3b-small", 1_048_576 + 1_024 + 1_024 + 131_072),
    # EP8: R=34 of X=3072 rows hold a local slot; only they are read, every
    # token's row written: 34*7168*2 + 32*8*4 + 32*8*4 + 32*7168*2
    ("reduce-dsv3-ep8-small-plan", 487_424 + 1_024 + 1_024 + 458_752),
    # row_scale read at the R=4096 routed rows: 4096*7168*2 + 512*8*4 * 2 + 4096*4 + 512*7168*2
    ("reduce-kimi-k2-medium-row-scale", 58_720_256 + 32_768 + 16_384 + 7_340_032),
    # T=1 H=7168 bf16 read, fp8 written, S = ceil(56 / 4) = 14 packed words: 14336 + 7168 + 14*4
    ("quant-kimi-k2-decode-packed", 14_336 + 7_168 + 56),
    # npc 32: S = 224 floats a token: 512*7168*2 + 512*7168 + 512*224*4
    ("quant-kimi-k2-medium-npc32-row-major", 7_340_032 + 3_670_016 + 458_752),
    # I=768, S=6 floats; X=1024 rows of which R=8 routed: h rows read 8*1536*2,
    # y 1024*768, y_sf 1024*6*4, pos_to_expert 1024*4, pos_to_token_topk 1024*4
    # and 8 weights gathered
    ("swiglu-qwen3-30b-a3b-decode-e128-plan-col-major",
     24_576 + 786_432 + 24_576 + 4_096 + 4_096 + 32),
])
def test_newer_roofline_bytes_hand_computed(label, expected):
    w = newer_workload(label)
    assert w.bytes == expected
    sizes = {"routed_rows": w.routed_rows} if w.op != "quantize_fp8" else {}
    if w.op != "reduce_fused":
        sizes["sf_columns"] = w.sf_columns
    assert roofline_bytes(w.op, w.shapes, w.elem_bytes, **sizes) == expected


def test_newer_rooflines_count_each_array_once():
    # T=3, K=2, H=10, X=8, R=5: every size different
    reduce = {"expanded": (8, 10), "token_topk_to_pos": (3, 2)}
    # rows 5*10*2 + map 3*2*4 + out 3*10*2; + weights 3*2*4; + row_scale 5*4
    assert reduce_fused_bytes(reduce, 2, routed_rows=5) == 100 + 24 + 60
    weighted = {**reduce, "topk_weights": (3, 2), "row_scale": (8,)}
    assert reduce_fused_bytes(weighted, 2, routed_rows=5) == 100 + 24 + 60 + 24 + 20
    assert reduce_fused_bytes(reduce, 4, routed_rows=0) == 24 + 120  # float32, no slot routed
    # x 3*10*2 read, 3*10 fp8 + 3*7*4 SF written
    assert quantize_fp8_bytes({"x": (3, 10)}, 2, sf_columns=7) == 60 + 30 + 84
    # h [8, 2*6]: without pos_to_expert all 8 rows are read, with it the R=5
    swiglu = {"h": (8, 12)}
    assert swiglu_quantize_fp8_bytes(swiglu, 2, routed_rows=5, sf_columns=3) == (
        8 * 24 + 8 * 6 + 8 * 3 * 4)
    masked = {**swiglu, "pos_to_expert": (8,), "topk_weights": (3, 2), "pos_to_token_topk": (8,)}
    assert swiglu_quantize_fp8_bytes(masked, 2, routed_rows=5, sf_columns=3) == (
        5 * 24 + 8 * 6 + 8 * 3 * 4 + 8 * 4 + 8 * 4 + 5 * 4)
    with pytest.raises(ValueError, match=re.escape("routed_rows must be in [0, X = 8]; got 9")):
        reduce_fused_bytes(reduce, 2, routed_rows=9)


def entry_of(op: str, label: str) -> int:
    (index,) = [i for i, w in enumerate(load_workloads(op)) if w.label == label]
    return index


REDUCE_INDEX = entry_of("reduce_fused", "reduce-kimi-k2-small")
QUANT_INDEX = entry_of("quantize_fp8", "quant-kimi-k2-decode-packed")
SWIGLU_INDEX = entry_of("swiglu_quantize_fp8", "swiglu-kimi-k2-decode-e384-plan-col-major")
REDUCE_ENTRY = f"workloads.yaml: reduce_fused workload {REDUCE_INDEX} (reduce-kimi-k2-small)"
QUANT_ENTRY = f"workloads.yaml: quantize_fp8 workload {QUANT_INDEX} (quant-kimi-k2-decode-packed)"
SWIGLU_ENTRY = (f"workloads.yaml: swiglu_quantize_fp8 workload {SWIGLU_INDEX} "
                "(swiglu-kimi-k2-decode-e384-plan-col-major)")
NEWER_INDEX = {"reduce_fused": REDUCE_INDEX, "quantize_fp8": QUANT_INDEX,
               "swiglu_quantize_fp8": SWIGLU_INDEX}


@pytest.mark.parametrize(("op", "changes", "error", "message"), [
    ("reduce_fused", {"x": [32, 7168]}, ValueError,
     (f"{REDUCE_ENTRY}: unknown key(s) ['x']; allowed: ['dtype', 'hidden', 'label', 'plan', "
      "'row_scale', 'tokens', 'top_k', 'topk_weights']")),
    # X comes from the plan only: the plan is required
    ("reduce_fused", {"plan": None}, ValueError, f"{REDUCE_ENTRY}: missing key(s) ['plan']"),
    ("reduce_fused", {"hidden": 0}, ValueError, f"{REDUCE_ENTRY}: hidden must be >= 1; got 0"),
    ("reduce_fused", {"top_k": 0}, ValueError, f"{REDUCE_ENTRY}: top_k must be >= 1; got 0"),
    ("reduce_fused", {"tokens": -1}, ValueError, f"{REDUCE_ENTRY}: tokens must be >= 0; got -1"),
    ("reduce_fused", {"tokens": "32"}, TypeError,
     f"{REDUCE_ENTRY}: tokens must be an int; got '32' (str)"),
    ("reduce_fused", {"row_scale": 1}, TypeError,
     f"{REDUCE_ENTRY}: row_scale must be true or false; got 1 (int)"),
    ("reduce_fused", {"dtype": "float8_e4m3fn"}, ValueError,
     (f"{REDUCE_ENTRY}: dtype must be one of ['bfloat16', 'float16', 'float32']; "
      "got 'float8_e4m3fn'")),
    ("reduce_fused", {"plan": {"num_experts": 384, "alignment": 0, "seed": 0}}, ValueError,
     f"{REDUCE_ENTRY}: plan.alignment must be >= 1; got 0"),
    ("quantize_fp8", {"num_per_channels": 64}, ValueError,
     f"{QUANT_ENTRY}: num_per_channels must be one of [32, 128]; got 64"),
    ("quantize_fp8", {"use_tma_aligned_col_major_sf": False}, ValueError,
     (f"{QUANT_ENTRY}: packed_ue8m0 needs round_sf and use_tma_aligned_col_major_sf; "
      "got round_sf=True, use_tma_aligned_col_major_sf=False")),
    ("quantize_fp8", {"round_sf": None}, ValueError,
     (f"{QUANT_ENTRY}: packed_ue8m0 needs round_sf and use_tma_aligned_col_major_sf; "
      "got round_sf=False, use_tma_aligned_col_major_sf=True")),
    ("quantize_fp8", {"x": [7168]}, ValueError,
     f"{QUANT_ENTRY}: x must be 2 size(s) >= 0; got [7168]"),
    ("quantize_fp8", {"num_per_channels": None}, ValueError,
     f"{QUANT_ENTRY}: missing key(s) ['num_per_channels']"),
    ("quantize_fp8", {"dtype": "float16"}, ValueError,
     f"{QUANT_ENTRY}: dtype must be one of ['bfloat16', 'float32']; got 'float16'"),
    ("quantize_fp8", {"sf_dtype": "int32"}, ValueError,
     (f"{QUANT_ENTRY}: unknown key(s) ['sf_dtype']; allowed: ['dtype', 'label', "
      "'num_per_channels', 'packed_ue8m0', 'round_sf', 'use_tma_aligned_col_major_sf', 'x']")),
    ("swiglu_quantize_fp8", {"intermediate": None, "tokens": None}, ValueError,
     f"{SWIGLU_ENTRY}: missing key(s) ['intermediate', 'tokens']"),
    ("swiglu_quantize_fp8", {"pos_to_expert": [1024]}, TypeError,
     f"{SWIGLU_ENTRY}: pos_to_expert must be true or false; got [1024] (list)"),
    ("swiglu_quantize_fp8", {"num_per_channels": 0}, ValueError,
     f"{SWIGLU_ENTRY}: num_per_channels must be >= 1; got 0"),
    ("swiglu_quantize_fp8", {"zero_padding": "no"}, TypeError,
     f"{SWIGLU_ENTRY}: zero_padding must be true or false; got 'no' (str)"),
    # the hint only where the kernels read it: weighted, padding rows left
    ("swiglu_quantize_fp8", {"token_topk_to_pos": True}, ValueError,
     (f"{SWIGLU_ENTRY}: token_topk_to_pos needs topk_weights (it is the inverse of "
      "pos_to_token_topk) and zero_padding false (the only calls whose kernels read it)")),
    ("swiglu_quantize_fp8", {"token_topk_to_pos": True, "zero_padding": False,
                             "topk_weights": False}, ValueError,
     (f"{SWIGLU_ENTRY}: token_topk_to_pos needs topk_weights (it is the inverse of "
      "pos_to_token_topk) and zero_padding false (the only calls whose kernels read it)")),
    # labels are unique across all ops, the newer ones too
    ("quantize_fp8", {"label": "reduce-kimi-k2-decode"}, ValueError,
     ("workloads.yaml: label 'reduce-kimi-k2-decode' of quantize_fp8 is already one of "
      "reduce_fused; labels must be unique")),
])
def test_a_bad_newer_entry_is_rejected_with_its_name(op, changes, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        parse_manifest(with_entry(op, NEWER_INDEX[op], **changes))


def test_the_newer_ops_optional_keys_default_to_false():
    parsed = parse_manifest(with_entry("reduce_fused", REDUCE_INDEX, topk_weights=None))
    w = parsed["reduce_fused"][REDUCE_INDEX]
    assert dict(w.shapes) == {"expanded": (256, 7168), "token_topk_to_pos": (32, 8)}
    parsed = parse_manifest(with_entry("swiglu_quantize_fp8", SWIGLU_INDEX, topk_weights=None,
                                       pos_to_expert=None, use_tma_aligned_col_major_sf=None))
    w = parsed["swiglu_quantize_fp8"][SWIGLU_INDEX]
    # no input shows T and K: the workload keeps them from the entry
    assert dict(w.shapes) == {"h": (1024, 4096)} and (w.num_tokens, w.top_k) == (1, 8)
    assert not w.use_tma_aligned_col_major_sf and w.sf_dtype == "float32"
    # without pos_to_expert every row of h is read
    assert w.bytes == 1024 * 4096 * 2 + 1024 * 2048 + 1024 * 16 * 4
    # zero_padding defaults to true, as in the op; no hint
    assert w.zero_padding and "token_topk_to_pos" not in w.shapes


def test_an_unzeroed_swiglu_entry_passes_the_hint_and_writes_the_routed_rows():
    parsed = parse_manifest(with_entry("swiglu_quantize_fp8", SWIGLU_INDEX, zero_padding=False,
                                       token_topk_to_pos=True))
    w = parsed["swiglu_quantize_fp8"][SWIGLU_INDEX]
    assert not w.zero_padding and w.shapes["token_topk_to_pos"] == (1, 8)
    # Kimi-K2 decode: X = 1024, R = 8 routed rows of I = 2048, S = 16 floats:
    # the 8 rows of h read, their codes and SF written, the hint (1 * 8 int32)
    # and the 8 routed rows' weights read; no pos_to_expert, no pos_to_token_topk
    assert w.bytes == 8 * 4096 * 2 + 8 * 2048 + 8 * 16 * 4 + 8 * 4 + 8 * 4
    unhinted = parse_manifest(with_entry("swiglu_quantize_fp8", SWIGLU_INDEX,
                                         zero_padding=False))["swiglu_quantize_fp8"][SWIGLU_INDEX]
    # without the hint the maps are read whole
    assert unhinted.bytes == (8 * 4096 * 2 + 8 * 2048 + 8 * 16 * 4 + 1024 * 4 + 1024 * 4
                              + 8 * 4)
    # the manifest's own: decode to medium of every model and two prefill
    # plans, each beside its zeroed twin
    unzeroed = [w for w in load_workloads("swiglu_quantize_fp8") if not w.zero_padding]
    zeroed = {w.label: w for w in load_workloads("swiglu_quantize_fp8") if w.zero_padding}
    assert len(unzeroed) == 11
    assert sum(w.num_tokens == 4096 for w in unzeroed) == 2
    for w in unzeroed:
        twin = zeroed[w.label.removesuffix("-unzeroed")]
        assert "token_topk_to_pos" in w.shapes and w.num_tokens in (1, 32, 512, 4096)
        assert (w.num_expanded, w.routed_rows, w.plan) == (twin.num_expanded, twin.routed_rows,
                                                           twin.plan)
        assert w.bytes < twin.bytes


def test_a_newer_workload_built_by_hand_checks_its_shapes_against_the_plan():
    spec = PlanSpec(num_experts=4, alignment=8, seed=5)
    num_expanded = spec.sizes(6, 2)[0]
    w = Workload("reduce_fused", "by-hand", {"expanded": (num_expanded, 32),
                                             "token_topk_to_pos": (6, 2)}, "float32", plan=spec)
    assert (w.num_tokens, w.hidden, w.top_k, w.num_expanded) == (6, 32, 2, num_expanded)
    assert w.elem_bytes == 4 and w.sf_columns is None
    with pytest.raises(ValueError, match=re.escape(
            f"by-hand: expanded [7, 32] does not have the plan's {num_expanded} rows")):
        Workload("reduce_fused", "by-hand", {"expanded": (7, 32), "token_topk_to_pos": (6, 2)},
                 "float32", plan=spec)
    with pytest.raises(ValueError, match="by-hand: reduce_fused runs on a plan's rows"):
        Workload("reduce_fused", "by-hand", {"expanded": (7, 32), "token_topk_to_pos": (6, 2)},
                 "float32")
    with pytest.raises(ValueError, match=re.escape("by-hand: give tokens_topk (T, K)")):
        Workload("swiglu_quantize_fp8", "by-hand", {"h": (num_expanded, 64)}, "bfloat16",
                 num_per_channels=32, plan=spec)
    with pytest.raises(ValueError, match=re.escape("by-hand: h [16, 63] must be [X, 2I]")):
        Workload("swiglu_quantize_fp8", "by-hand", {"h": (16, 63)}, "bfloat16",
                 num_per_channels=32, plan=spec, tokens_topk=(6, 2))
    with pytest.raises(ValueError, match=re.escape(
            "by-hand: tokens_topk (6, 3) is not (6, 2) of the inputs")):
        Workload("reduce_fused", "by-hand", {"expanded": (num_expanded, 32),
                                             "token_topk_to_pos": (6, 2)}, "float32", plan=spec,
                 tokens_topk=(6, 3))
    with pytest.raises(ValueError, match=re.escape(
            "by-hand: topk_weights [6, 3] is not [T, K] = [6, 2]")):
        Workload("reduce_fused", "by-hand", {"expanded": (num_expanded, 32),
                                             "token_topk_to_pos": (6, 2),
                                             "topk_weights": (6, 3)}, "float32", plan=spec)
    with pytest.raises(ValueError, match="has no copy/memset split"):
        w.split_bytes(0)
