"""The MoE layer on the CPU (NumPy, and CPU torch tensors): both paths against
the dense float64 reference within the stated tolerances, the grouped GEMM
against a per-row loop bit for bit, the router, the reference itself, the
argument errors and ``cupy-moe layer``."""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import pytest

from cupy_moe.harness.cli import main
from cupy_moe.layer import (
    BF16_TOLERANCE,
    FP8_TOLERANCE,
    MoeLayer,
    MoeShape,
    dense_moe_reference,
    grouped_gemm,
    moe_layer,
    random_moe_inputs,
    relative_error,
    route,
    tolerance,
)
from cupy_moe.reference import fused_mapping_numpy

SMALL = MoeShape("small", hidden=256, intermediate=128, num_experts=16, top_k=4)
BF16 = ml_dtypes.bfloat16


def _run(inputs, shape, **kwargs):
    out, steps = moe_layer(*inputs, top_k=shape.top_k, return_intermediates=True, **kwargs)
    reference = dense_moe_reference(inputs.x, steps["topk_ids"], steps["topk_weights"],
                                    inputs.w_gate_up, inputs.w_down)
    return out, steps, relative_error(out, reference)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("alignment", [1, 16, 128])
@pytest.mark.parametrize("tokens", [1, 37])
def test_layer_within_tolerance(tokens, alignment, fp8):
    inputs = random_moe_inputs(SMALL, tokens, seed=tokens)
    out, steps, error = _run(inputs, SMALL, alignment=alignment, fp8=fp8)
    assert out.shape == (tokens, SMALL.hidden) and out.dtype == BF16
    assert steps["gemm"] == "numpy"
    assert error <= tolerance(fp8), f"relative error {error:.4f} > {tolerance(fp8):.4f}"
    if fp8:  # the fp8 path does quantize: clearly worse than the bf16 budget
        assert error > BF16_TOLERANCE


def test_tolerance_catches_a_wrong_expert():
    """A layer that sends every slot to the wrong expert's weights is far
    outside even the fp8 tolerance: the check can fail."""
    inputs = random_moe_inputs(SMALL, 37, seed=3)
    out, steps = moe_layer(*inputs, top_k=SMALL.top_k, fp8=True, return_intermediates=True)
    wrong = dense_moe_reference(inputs.x, (steps["topk_ids"] + 1) % SMALL.num_experts,
                                steps["topk_weights"], inputs.w_gate_up, inputs.w_down)
    assert relative_error(out, wrong) > 5 * FP8_TOLERANCE


def test_layer_alignment_does_not_change_the_output():
    """Padding rows never reach the output: every alignment gives the same bits."""
    inputs = random_moe_inputs(SMALL, 37, seed=5)
    for fp8 in (False, True):
        outs = [moe_layer(*inputs, top_k=SMALL.top_k, alignment=a, fp8=fp8) for a in (1, 8, 128)]
        for out in outs[1:]:
            assert np.array_equal(out.view(np.uint16), outs[0].view(np.uint16))


def test_layer_without_tokens():
    inputs = random_moe_inputs(SMALL, 0, seed=0)
    for fp8 in (False, True):
        out = moe_layer(*inputs, top_k=SMALL.top_k, fp8=fp8)
        assert out.shape == (0, SMALL.hidden)


@pytest.mark.parametrize("gemm", ["auto", "loop"])
def test_layer_without_tokens_on_cpu_torch_tensors(gemm):
    """The CPU backend's empty results come back as torch tensors with real
    strides (NumPy 2 gives empty arrays zero strides, which
    torch._grouped_mm refuses)."""
    torch = pytest.importorskip("torch")
    inputs = random_moe_inputs(SMALL, 0, seed=0, device="cpu")
    for fp8 in (False, True):
        out = moe_layer(*inputs, top_k=SMALL.top_k, fp8=fp8, gemm=gemm)
        assert isinstance(out, torch.Tensor) and tuple(out.shape) == (0, SMALL.hidden)


def test_layer_intermediates_follow_the_plan():
    inputs = random_moe_inputs(SMALL, 20, seed=7)
    _, steps, _ = _run(inputs, SMALL, alignment=16, fp8=True)
    plan = steps["plan"]
    expected = fused_mapping_numpy(steps["topk_ids"], SMALL.num_experts, alignment=16)
    assert np.array_equal(plan.token_topk_to_pos, expected.token_topk_to_pos)
    padding = plan.pos_to_expert < 0
    for name in ("expanded", "gate_up_input", "h", "act", "y"):
        assert not steps[name][padding].astype(np.float32).any(), f"{name}: padding not zero"
    assert steps["expanded"].shape == (plan.pos_to_expert.shape[0], SMALL.hidden)
    assert steps["act"].dtype == ml_dtypes.float8_e4m3fn
    assert steps["h"].shape == (plan.pos_to_expert.shape[0], 2 * SMALL.intermediate)


def test_layer_on_cpu_torch_tensors():
    torch = pytest.importorskip("torch")
    inputs = random_moe_inputs(SMALL, 37, seed=11, device="cpu")
    for fp8 in (False, True):
        for gemm in ("auto", "loop"):
            out, _, error = _run(inputs, SMALL, fp8=fp8, gemm=gemm)
            assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
            assert error <= tolerance(fp8), f"{gemm}: {error:.4f}"


# --- the grouped GEMM ----------------------------------------------------------

def _integer_case(rng, tokens=29, top_k=3, experts=6, k_dim=48, n_dim=40, alignment=8):
    """Small-integer operands: every product and sum is exact in float32 (and
    bf16 holds the results), so any summation order gives the same bits."""
    topk_ids = rng.integers(0, experts, size=(tokens, top_k))
    plan = fused_mapping_numpy(topk_ids, experts, alignment=alignment,
                               num_expanded=fused_mapping_numpy(
                                   topk_ids, experts, alignment=alignment).pos_to_expert.size
                               + 2 * alignment)  # rows past the last segment too
    x = rng.integers(-3, 4, size=(tokens, k_dim)).astype(BF16)
    rows = np.zeros((plan.pos_to_expert.size, k_dim), dtype=BF16)
    routed = plan.token_topk_to_pos.reshape(-1)
    rows[routed] = np.repeat(x, top_k, axis=0)
    w = rng.integers(-3, 4, size=(experts, n_dim, k_dim)).astype(BF16)
    return plan, rows, w


def _per_row(plan, rows, w):
    expected = np.zeros((rows.shape[0], w.shape[1]), dtype=BF16)
    for p, expert in enumerate(plan.pos_to_expert.tolist()):
        if expert >= 0:
            expected[p] = (rows[p].astype(np.float64) @ w[expert].astype(np.float64).T)
    return expected


def test_grouped_gemm_numpy_matches_a_row_loop(rng):
    plan, rows, w = _integer_case(rng)
    out = grouped_gemm(rows, w, plan.expert_start, plan.tokens_per_expert, alignment=8)
    assert np.array_equal(out.view(np.uint16), _per_row(plan, rows, w).view(np.uint16))


@pytest.mark.parametrize("method", ["grouped_mm", "loop"])
def test_grouped_gemm_torch_matches_a_row_loop(rng, method):
    torch = pytest.importorskip("torch")
    if method == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    plan, rows, w = _integer_case(rng)
    expected = _per_row(plan, rows, w)
    t = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in
         (("start", plan.expert_start), ("count", plan.tokens_per_expert))}
    out = grouped_gemm(torch.from_numpy(rows.view(np.int16)).view(torch.bfloat16),
                       torch.from_numpy(w.view(np.int16)).view(torch.bfloat16),
                       t["start"], t["count"], alignment=8, method=method)
    got = out.view(torch.int16).numpy().view(BF16)
    # rows past the last segment: unspecified for grouped_mm; zero for the loop
    compared = slice(None) if method == "loop" else slice(
        0, int(plan.expert_start[-1] + -(-plan.tokens_per_expert[-1] // 8) * 8))
    assert np.array_equal(got[compared].view(np.uint16), expected[compared].view(np.uint16))


# --- the router and the reference ------------------------------------------------

def test_route_numpy(rng):
    logits = rng.standard_normal((9, 12)).astype(np.float32)
    ids, weights = route(logits, 3, renormalize=False)
    probs = np.exp(logits.astype(np.float64))
    probs /= probs.sum(axis=1, keepdims=True)
    for t in range(9):
        order = sorted(range(12), key=lambda e: (-probs[t, e], e))[:3]
        assert ids[t].tolist() == order
        np.testing.assert_allclose(weights[t], probs[t, order], rtol=1e-6)
    ids_n, weights_n = route(logits, 3)
    assert np.array_equal(ids_n, ids) and ids.dtype == np.int64
    np.testing.assert_allclose(weights_n.sum(axis=1), 1.0, rtol=1e-6)
    tied_ids, _ = route(np.zeros((2, 6), np.float32), 4)
    assert tied_ids.tolist() == [[0, 1, 2, 3]] * 2  # ties: lower expert first


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_route_refuses_a_top_k_outside_one_to_e(kind):
    """NumPy once returned E columns for top_k > E and E - 1 for top_k = -1;
    torch raised its own RuntimeError."""
    logits = np.zeros((3, 4), np.float32)
    if kind == "torch":
        logits = pytest.importorskip("torch").from_numpy(logits)
    for top_k in (0, -1, 5):
        with pytest.raises(ValueError,
                           match=re.escape(f"top_k must be in [1, E = 4]; got {top_k}")):
            route(logits, top_k)
    with pytest.raises(TypeError, match="top_k must be an int; got bool"):
        route(logits, True)
    ids, _ = route(logits, 4)
    assert tuple(ids.shape) == (3, 4)


def test_auto_gemm_takes_the_loop_where_grouped_mm_cannot():
    """torch._grouped_mm needs feature widths of a multiple of 8 (16-byte bf16
    strides): "auto" takes the per-expert loop there (it once picked
    grouped_mm and failed inside the GEMM step, after an EP exchange), and
    "grouped_mm" is refused up front, naming the width."""
    torch = pytest.importorskip("torch")
    from cupy_moe.layer.grouped_gemm import resolve_method

    a = torch.zeros(4, 60, dtype=torch.bfloat16)
    assert resolve_method(a, "auto", {"H": 60, "I": 32}) == "loop"
    with pytest.raises(ValueError, match=re.escape(
            "gemm='grouped_mm' needs feature widths that are multiples of 8 "
            "(torch._grouped_mm's 16-byte strides); got H = 60, I = 36")):
        resolve_method(a, "grouped_mm", {"H": 60, "I": 36})
    shape = MoeShape("odd", hidden=60, intermediate=36, num_experts=4, top_k=2)
    inputs = random_moe_inputs(shape, 5, seed=1, device="cpu")
    layer = MoeLayer(*inputs, top_k=2, alignment=4)
    assert layer.gemm == "loop"
    out = layer.run()
    reference = dense_moe_reference(inputs.x, layer.state["topk_ids"],
                                    layer.state["topk_weights"], inputs.w_gate_up, inputs.w_down)
    assert relative_error(out, reference) <= tolerance(False)


def test_dense_reference_matches_a_token_loop(rng):
    shape = MoeShape("tiny", hidden=8, intermediate=4, num_experts=5, top_k=2)
    inputs = random_moe_inputs(shape, 6, seed=2)
    ids = rng.integers(-1, 6, size=(6, 2))  # -1 and 5 (= E): dropped slots
    weights = rng.random((6, 2)).astype(np.float32)
    expected = np.zeros((6, 8))
    for t in range(6):
        for k in range(2):
            e = int(ids[t, k])
            if 0 <= e < 5:
                h = inputs.w_gate_up[e].astype(np.float64) @ inputs.x[t].astype(np.float64)
                act = h[:4] / (1 + np.exp(-h[:4])) * h[4:]
                expected[t] += float(weights[t, k]) * (inputs.w_down[e].astype(np.float64) @ act)
    got = dense_moe_reference(inputs.x, ids, weights, inputs.w_gate_up, inputs.w_down)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


# --- argument errors -------------------------------------------------------------

def _args(**changes):
    inputs = random_moe_inputs(MoeShape("e", 32, 16, 4, 2), 5, seed=0)._asdict()
    inputs.update(changes)
    return inputs


@pytest.mark.parametrize("changes, kwargs, error, match", [
    ({}, {"top_k": 0}, ValueError, r"top_k must be in \[1, E = 4\]; got 0"),
    ({}, {"top_k": 5}, ValueError, r"top_k must be in \[1, E = 4\]; got 5"),
    ({}, {"top_k": 2.0}, TypeError, "top_k must be an int"),
    ({}, {"top_k": 2, "alignment": 0}, ValueError, "alignment must be >= 1; got 0"),
    ({}, {"top_k": 2, "fp8": 1}, TypeError, "fp8 must be True or False"),
    ({}, {"top_k": 2, "num_per_channels": 64}, ValueError, "num_per_channels must be 32 or 128"),
    ({}, {"top_k": 2, "gemm": "cublas"}, ValueError, "gemm must be one of auto, numpy"),
    ({}, {"top_k": 2, "gemm": "grouped_mm"}, ValueError, "gemm='grouped_mm' needs torch"),
    ({"x": np.zeros((5, 32), np.float32)}, {"top_k": 2}, ValueError,
     "x must be bf16 .* got float32"),
    ({"router_logits": np.zeros((5, 4), np.int32)}, {"top_k": 2}, ValueError,
     "router_logits must be one of float32"),
    ({"router_logits": np.zeros((5, 3), np.float32)}, {"top_k": 2}, ValueError,
     r"router_logits must have shape \(5, 4\)"),
    ({"w_down": np.zeros((4, 32, 8), BF16)}, {"top_k": 2}, ValueError,
     r"w_down must have shape \(4, 32, 16\)"),
    ({"w_gate_up": np.zeros((4, 31, 32), BF16)}, {"top_k": 2}, ValueError,
     r"w_gate_up must be \[E, 2I, H\]"),
    ({"x": np.zeros((5,), BF16)}, {"top_k": 2}, ValueError, r"x must be 2-D \[T, H\]"),
    ({"x": None}, {"top_k": 2}, TypeError, "x must be a numpy.ndarray"),
    ({"router_logits": np.zeros((5, 0), np.float32), "w_gate_up": np.zeros((0, 32, 32), BF16),
      "w_down": np.zeros((0, 32, 16), BF16)}, {"top_k": 1}, ValueError,
     "^the layer needs at least one expert; got E = 0$"),
], ids=["top_k-0", "top_k-over-E", "top_k-float", "alignment-0", "fp8-int", "npc-64",
        "gemm-unknown", "gemm-needs-torch", "x-float32", "logits-int", "logits-shape",
        "w_down-shape", "w_gate_up-odd", "x-1d", "x-none", "no-experts"])
def test_layer_argument_errors(changes, kwargs, error, match):
    with pytest.raises(error, match=match):
        moe_layer(**_args(**changes), **kwargs)


def test_layer_mixed_kinds():
    torch = pytest.importorskip("torch")
    args = _args()
    args["router_logits"] = torch.from_numpy(args["router_logits"])
    with pytest.raises(TypeError, match="all arrays must be of one kind"):
        moe_layer(**args, top_k=2)


def test_layer_unknown_step():
    layer = MoeLayer(**_args(), top_k=2)
    with pytest.raises(ValueError, match="the bf16 path has no step 'quantize'"):
        layer.run_step("quantize")


# --- the command -----------------------------------------------------------------

def test_cli_layer_cpu(tmp_path, capsys):
    path = tmp_path / "layer.json"
    rc = main(["layer", "--model", "qwen3-30b-a3b", "--experts", "8", "--tokens", "8",
               "--backend", "cpu", "--iters", "1", "--json", str(path)])
    assert rc == 0
    result = json.loads(path.read_text())
    assert [(r["path"], r["ok"]) for r in result["runs"]] == [("bf16", True), ("fp8", True)]
    fp8 = result["runs"][1]
    assert [s["step"] for s in fp8["steps"]][:4] == ["route", "mapping", "quantize", "expand"]
    assert fp8["rel_error"] <= fp8["tolerance"] == FP8_TOLERANCE
    assert path.with_suffix(".md").exists()
    out = capsys.readouterr().out
    assert "| expand | expand_to_fused_with_sf |" in out


def test_cli_layer_refuses_what_cannot_run(capsys, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="pass --experts N"):
        main(["layer", "--model", "kimi-k2", "--tokens", "1", "--backend", "cpu"])
    with pytest.raises(SystemExit, match="--experts 4 is below its top-k"):
        main(["layer", "--experts", "4", "--tokens", "1", "--backend", "cpu"])
    # refused before the weights are drawn (they took ~10 s before the refusal)
    from cupy_moe.harness import layer_bench

    def no_inputs(*args):
        raise AssertionError("inputs drawn for a run that cannot go")
    monkeypatch.setattr(layer_bench, "_layer_inputs", no_inputs)
    for gemm in ("grouped_mm", "loop"):
        with pytest.raises(SystemExit, match=re.escape(
                f"--gemm {gemm} needs CUDA tensors (--backend torch or cupy); --backend cpu "
                "takes numpy (or auto)")):
            main(["layer", "--experts", "8", "--tokens", "1", "--backend", "cpu", "--gemm", gemm])
    monkeypatch.setattr(layer_bench, "resolve_backend", lambda backend: backend)  # no GPU here
    for backend in ("torch", "cupy"):  # the layer views CuPy inputs as torch tensors
        with pytest.raises(SystemExit, match=re.escape(
                f"--gemm numpy needs NumPy arrays (--backend cpu); --backend {backend} takes "
                "grouped_mm or loop")):
            layer_bench.run_layer_bench(["qwen3-30b-a3b"], 1, ["bf16"], backend, gemm="numpy")
    with pytest.raises(SystemExit):
        main(["layer", "--seed", "-1"])
    assert "--seed: must be >= 0, got -1" in capsys.readouterr().err
    # output paths are checked before the run
    for args, message in (
            (["--json", str(tmp_path / "no-folder" / "l.json")],
             f"--json {tmp_path / 'no-folder' / 'l.json'}: no folder {tmp_path / 'no-folder'}"),
            (["--json", str(tmp_path / "l.md")],
             f"--json {tmp_path / 'l.md'}: the Markdown table goes beside it"),
            (["--plot", str(tmp_path)], f"--plot {tmp_path} is a folder; give a file name")):
        if args[0] == "--plot":
            monkeypatch.setattr("cupy_moe.harness.report.can_plot", lambda: True)
        assert main(["layer", "--experts", "8", "--tokens", "1", "--backend", "cpu",
                     *args]) == 2
        assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_torch_peers_compute_the_library_steps():
    """The benchmark's torch-only equivalents (run here on CPU tensors) give the
    library steps' results: the plan and the expand bit for bit, the casts and
    the combine within a rounding."""
    torch = pytest.importorskip("torch")
    from cupy_moe.harness.layer_bench import torch_peers

    inputs = random_moe_inputs(SMALL, 37, seed=13, device="cpu")
    for fp8 in (False, True):
        layer = MoeLayer(*inputs, top_k=SMALL.top_k, fp8=fp8)
        layer.run()
        state, peers = layer.state, torch_peers(layer)
        token_topk_to_pos, pos_to_expert = peers["mapping"][1]()
        assert torch.equal(token_topk_to_pos, state["plan"].token_topk_to_pos)
        assert torch.equal(pos_to_expert, state["plan"].pos_to_expert)
        reduced = peers["reduce"][1]().float()
        assert torch.allclose(reduced, state["out"].float(), rtol=2 ** -7, atol=1e-3)
        if not fp8:
            assert torch.equal(peers["expand"][1]().view(torch.int16),
                               state["expanded"].view(torch.int16))
            continue
        codes, scale_factors = peers["expand"][1]()
        assert torch.equal(codes.view(torch.uint8), state["expanded"].view(torch.uint8))
        assert torch.equal(scale_factors, state["expanded_sf"])
        for step, (codes_key, sf_key) in (("quantize", ("x_fp8", "x_sf")),
                                          ("swiglu", ("act", "act_sf"))):
            codes, scale_factors = peers[step][1]()
            assert torch.allclose(scale_factors, state[sf_key], rtol=1e-6, atol=0)
            differ = (codes.view(torch.uint8) != state[codes_key].view(torch.uint8)).float()
            assert differ.mean() < 0.01, f"{step}: {differ.mean():.4f} of the codes differ"


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_leaving_padding_rows_gives_the_same_output(kind, fp8, monkeypatch):
    """zero_padding=False: the expand (and fp8 SwiGLU) steps leave padding rows
    unwritten (the flag reaches those ops); the layer's output is the
    zero-padded one's, bit for bit, also when those rows hold NaN (set here by
    hand: fresh NumPy outputs hold whatever np.empty gives)."""
    import importlib

    layer_module = importlib.import_module("cupy_moe.layer.moe_layer")

    passed, hinted, slot_hinted = [], [], []

    def spy_on(name):
        op = getattr(layer_module, name)

        def spy(*args, **kwargs):
            passed.append((name, kwargs.get("zero_padding")))
            if name.startswith("expand"):  # the plan's pos_to_token, the hint
                hinted.append(kwargs.get("pos_to_token") is not None)
            else:  # swiglu: the plan's token_topk_to_pos, its hint, agreeing with the maps
                slot_hinted.append(kwargs.get("token_topk_to_pos") is not None)
                kwargs = {**kwargs, "validate": True}
            return op(*args, **kwargs)
        return spy

    for name in ("expand_to_fused", "expand_to_fused_with_sf", "swiglu_quantize_fp8"):
        monkeypatch.setattr(layer_module, name, spy_on(name))
    if kind == "torch":
        torch = pytest.importorskip("torch")
        inputs = random_moe_inputs(SMALL, 37, seed=13, device="cpu")
    else:
        inputs = random_moe_inputs(SMALL, 37, seed=13)
    zeroed = moe_layer(*inputs, top_k=SMALL.top_k, fp8=fp8, alignment=16)
    passed.clear()
    layer = MoeLayer(*inputs, top_k=SMALL.top_k, fp8=fp8, alignment=16, zero_padding=False)
    layer.run()
    assert passed == ([("expand_to_fused_with_sf", False), ("swiglu_quantize_fp8", False)]
                      if fp8 else [("expand_to_fused", False)])
    assert hinted == [True, True]  # the zero-padded run's expand, then this one's
    assert slot_hinted == ([True, True] if fp8 else [])
    padding = np.asarray(layer.state["plan"].pos_to_expert) < 0
    assert padding.any()
    name = "gate_up_input" if fp8 else "expanded"
    rows = layer.state[name]
    if kind == "torch":
        rows[torch.from_numpy(padding)] = float("nan")
    else:
        rows[padding] = np.nan
    for step in layer.steps[layer.steps.index("gemm_gate_up"):]:
        layer.run_step(step)
    out = layer.output()
    if kind == "torch":
        assert torch.equal(out.view(torch.int16), zeroed.view(torch.int16))
    else:
        assert np.array_equal(out.view(np.uint16), zeroed.view(np.uint16))
    with pytest.raises(TypeError, match="zero_padding must be True or False"):
        MoeLayer(*inputs, top_k=SMALL.top_k, zero_padding="no")


def test_cli_layer_leave_padding(tmp_path, capsys):
    rc = main(["layer", "--model", "qwen3-30b-a3b", "--experts", "8", "--tokens", "8",
               "--backend", "cpu", "--iters", "1", "--path", "fp8", "--leave-padding"])
    assert rc == 0
    out = capsys.readouterr().out
    assert ", padding rows left unwritten" in out
    assert "rel. error vs dense float64 reference" in out and "FAILED" not in out



def test_route_breaks_ties_by_the_lower_expert_index():
    """As its docstring says (a stable sort of the negated scores)."""
    row = np.array([0, 1, 1, 0, 1, 1, 0, 1] * 4, np.float32)  # E = 32, 16 tied maxima
    ids, weights = route(np.tile(row, (5, 1)), 4)
    assert ids.tolist() == [[1, 2, 4, 5]] * 5
    assert np.array_equal(weights, np.full((5, 4), 0.25, np.float32))


def test_relative_error_against_a_zero_reference():
    """inf where only the reference is zero, 0 where both are."""
    assert relative_error(np.ones(3), np.zeros(3)) == np.inf
    assert relative_error(np.zeros(3), np.zeros(3)) == 0.0
