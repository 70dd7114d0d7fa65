"""The workload manifest: labels, consistent shapes, roofline byte counts."""

from __future__ import annotations

import pytest

import cupy_moe
from cupy_moe.harness.manifest import OP_NAMES, Workload, load_workloads, roofline_bytes
from cupy_moe.harness.rooflines import (
    ROOFLINES,
    expand_to_fused_bytes,
    expand_to_fused_with_sf_bytes,
)
from cupy_moe.runtime.sizes import ceil_div

pytestmark = pytest.mark.smoke

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
ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}


def by_hand(workload) -> int:
    """The seed's roofline: inputs read once, outputs written once."""
    (t, h), (_, k), (x,) = (workload.shapes[n] for n in ("x", "token_topk_to_pos",
                                                         "pos_to_expert"))
    e = ITEM_BYTES[workload.dtype]
    total = t * h * e + t * k * 4 + x * 4 + x * h * e
    if "x_sf" in workload.shapes:
        s = workload.shapes["x_sf"][1]
        total += t * s * 4 + x * s * 4
    return total


def test_every_op_has_workloads_and_a_roofline():
    assert tuple(SEED_LABELS) == OP_NAMES
    assert set(ROOFLINES) == set(OP_NAMES)
    assert ROOFLINES["expand_to_fused"] is expand_to_fused_bytes
    assert ROOFLINES["expand_to_fused_with_sf"] is expand_to_fused_with_sf_bytes


@pytest.mark.parametrize("op", list(SEED_LABELS))
def test_workload_labels_are_the_seeds(op):
    workloads = load_workloads(op)
    assert [w.label for w in workloads] == SEED_LABELS[op]
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
    with pytest.raises(KeyError, match="no op 'expand_to_nowhere' in the manifest"):
        load_workloads("expand_to_nowhere")
    with pytest.raises(KeyError, match=r"no op 'expand_to_nowhere' in the manifest; "
                                       r"known: \['expand_to_fused', 'expand_to_fused_with_sf'\]"):
        roofline_bytes("expand_to_nowhere", {"x": (1, 1)}, 2)


def test_public_names():
    assert cupy_moe.load_workloads is load_workloads
    assert cupy_moe.roofline_bytes is roofline_bytes
    assert cupy_moe.Workload is Workload
    assert isinstance(load_workloads("expand_to_fused")[0], cupy_moe.Workload)
