"""The A/B sweep table of the benchmark programs (cupy_moe/harness/ab_sweep.py),
on the CPU backend with a stand-in timer: a variant whose results differ from
the oracle's bits is reported, never timed; the others are timed on their
preallocated outputs."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cupy_moe.harness import ab_sweep  # noqa: E402
from cupy_moe.quantize.api import run_with_tuning  # noqa: E402
from cupy_moe.quantize.launch_shape import QuantizeTuning  # noqa: E402
from cupy_moe.runtime.arrays import numpy_to_torch, torch_to_numpy  # noqa: E402


class _FixedTimer:
    """Calls each timed function once (it must run) and says 50 µs."""

    def __init__(self) -> None:
        self.timed = []

    def median_us(self, fn, iters):
        self.timed.append(fn())
        return 50.0


def _run(w, inputs, variant, outs):
    kwargs = {"num_per_channels": w.num_per_channels, "round_sf": w.round_sf,
              "packed_ue8m0": w.packed_ue8m0,
              "use_tma_aligned_col_major_sf": w.use_tma_aligned_col_major_sf}
    if outs is not None:
        kwargs.update(out=outs[0], out_sf=outs[1])
    x_fp8, x_sf = run_with_tuning(QuantizeTuning(), w.op, inputs["x"], **kwargs)
    if variant == "wrong":  # one code's lowest bit flipped
        x_fp8 = x_fp8.clone()
        x_fp8.view(dtype=torch.uint8).view(-1)[0] ^= 1
    return x_fp8, x_sf


def test_a_wrong_variant_is_reported_and_the_others_timed_on_their_outputs():
    workloads = ab_sweep.pick_workloads(["quantize_fp8"], ["quant-kimi-k2-decode-row-major"],
                                        pytest.fail)
    timer = _FixedTimer()
    lines = ab_sweep.sweep_table(
        workloads, [("right", "right"), ("wrong", "wrong")], _run, timer, 4.0, 3, "variant",
        np.random.default_rng(0), to_device=lambda a: numpy_to_torch(np.ascontiguousarray(a)),
        to_host=torch_to_numpy)
    w = workloads[0]
    assert lines[1] == "| variant | quant-kimi-k2-decode-row-major |"
    assert lines[3] == f"| right | 50.0 ({w.bytes / 50.0 / 1e6 / 4.0 * 100:.1f}%) |"
    assert re.fullmatch(r"\| wrong \| MISMATCH .*x_fp8.* \|", lines[4])
    assert len(timer.timed) == 1  # the wrong variant was not timed


def test_unknown_labels_are_named():
    errors = []
    picked = ab_sweep.pick_workloads(["quantize_fp8"], ["nope", "quant-kimi-k2-decode-row-major"],
                                     errors.append)
    assert errors == ["--only: unknown quantize_fp8 workload(s) nope"]
    assert [w.label for w in picked] == ["quant-kimi-k2-decode-row-major"]


def test_picked_variants_keep_the_default_first():
    variants = [("default", 0), ("threads=64", 1), ("threads=128", 2), ("rows_min_blocks=5", 3)]
    errors = []
    assert ab_sweep.pick_variants(variants, ["threads="], "--tunings", errors.append) == \
        variants[:3]
    assert ab_sweep.pick_variants(variants, ["rows", "=64"], "--tunings", errors.append) == [
        variants[0], variants[1], variants[3]]
    assert ab_sweep.pick_variants(variants, None, "--tunings", errors.append) == variants
    assert ab_sweep.pick_variants(variants, [], "--tunings", errors.append) == variants
    assert errors == []
    # the default alone matching is no match: named, with the option
    ab_sweep.pick_variants(variants, ["default", "nope"], "--tunings", errors.append)
    assert errors == ["--tunings: no variant name contains any of ['default', 'nope']"]
