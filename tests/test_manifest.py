"""The workload manifest: labels, consistent shapes, roofline byte counts, and
the strict check of workloads.yaml."""

from __future__ import annotations

import copy
import re
from importlib import resources

import pytest
import yaml

import cupy_moe
from cupy_moe.harness.manifest import (
    ALL_OP_NAMES,
    MAPPING_OP_NAMES,
    OP_NAMES,
    Workload,
    load_workloads,
    parse_manifest,
    roofline_bytes,
)
from cupy_moe.harness.rooflines import (
    ROOFLINES,
    expand_to_fused_bytes,
    expand_to_fused_with_sf_bytes,
    fused_mapping_bytes,
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
# label, T, K, E, A of the routing plan's workloads (also benchmarks/bench_fused_mapping.py's shapes)
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
    assert ALL_OP_NAMES == (*OP_NAMES, "fused_mapping")
    assert set(ROOFLINES) == set(ALL_OP_NAMES)
    assert ROOFLINES["expand_to_fused"] is expand_to_fused_bytes
    assert ROOFLINES["expand_to_fused_with_sf"] is expand_to_fused_with_sf_bytes
    assert ROOFLINES["fused_mapping"] is fused_mapping_bytes
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
    known = re.escape("known: ['expand_to_fused', 'expand_to_fused_with_sf', 'fused_mapping']")
    with pytest.raises(KeyError, match="no op 'expand_to_nowhere' in the manifest; " + known):
        load_workloads("expand_to_nowhere")
    with pytest.raises(KeyError, match="no op 'expand_to_nowhere' in the manifest; " + known):
        roofline_bytes("expand_to_nowhere", {"x": (1, 1)}, 2)


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

def packaged_manifest() -> dict:
    text = resources.files("cupy_moe.harness").joinpath("workloads.yaml").read_text()
    return yaml.safe_load(text)


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
            "['expand_to_fused', 'expand_to_fused_with_sf', 'fused_mapping']")):
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
