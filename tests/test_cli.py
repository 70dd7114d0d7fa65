"""The ``cupy-moe`` command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cupy_moe
from cupy_moe.harness import runner
from cupy_moe.harness.cli import main
from cupy_moe.harness.manifest import load_workloads

pytestmark = pytest.mark.smoke

REPO_ROOT = Path(__file__).resolve().parent.parent

# The keys of the JSON that `cupy-moe bench --json` writes: result files and
# scripts read them, so a rename is a breaking change.
RESULT_KEYS = {"date", "backend", "iters", "quick", "versions", "copy_tbps", "device",
               "records", "notes"}
RECORD_KEYS = {"op", "label", "shapes", "bytes", "status", "gpu_us", "gbps",
               "pct_copy_roofline", "copy_same_bytes_us", "zero_bytes", "memset_zero_us",
               "copy_routed_us", "pct_copy_memset_model", "eager_us", "graph_us",
               "index_select_eager_us", "torch_ref_us", "torch_nosync_us", "speedup_vs_ref",
               "speedup_vs_nosync", "cpu_us", "extra"}


def test_info_prints_versions_and_backends(capsys):
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"cupy_moe {cupy_moe.__version__} (python ")
    assert f"numpy: {np.__version__}" in lines
    (backends,) = [line for line in lines if line.startswith("backends:")]
    assert "cpu (numpy)" in backends


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"cupy-moe {cupy_moe.__version__}\n"


def test_module_help_exits_zero():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", "cupy_moe", "--help"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "usage: cupy-moe" in done.stdout
    assert "info" in done.stdout


def test_subpackages_load_on_first_use_and_import_cupy_moe_leaves_torch_alone():
    """``import cupy_moe`` alone: the README's ``cupy_moe.reference.*_numpy``
    and ``cupy_moe.layer.moe_layer`` are attributes (loaded on first use), and
    torch is not imported until one of them needs it."""
    code = (
        "import sys, cupy_moe\n"
        "assert 'torch' not in sys.modules and 'cupy_moe.layer' not in sys.modules\n"
        "found = (cupy_moe.reference.fused_mapping_numpy, cupy_moe.layer.moe_layer,\n"
        "         cupy_moe.distributed.dispatch)\n"
        "from cupy_moe.reference import fused_mapping_numpy\n"
        "from cupy_moe.layer import moe_layer\n"
        "from cupy_moe.distributed import dispatch\n"
        "assert found == (fused_mapping_numpy, moe_layer, dispatch)\n"
        "try:\n"
        "    cupy_moe.no_such_name\n"
        "except AttributeError as error:\n"
        "    print(error)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "module 'cupy_moe' has no attribute 'no_such_name'\n"


@pytest.mark.parametrize("backend", ["cupy", "torch"])
def test_a_gpu_backend_without_a_gpu_is_refused(backend, monkeypatch):
    monkeypatch.setattr(runner, "_gpu_available", lambda: False)
    with pytest.raises(SystemExit, match=re.escape(
            f"--backend {backend} needs a CUDA GPU; none was found")):
        runner.resolve_backend(backend)
    assert runner.resolve_backend("auto") == "cpu"


def test_bench_quick_on_the_cpu_writes_json_and_markdown(tmp_path, capsys):
    # Without a GPU (or with --backend cpu) the bench times the CPU backend,
    # still checks every result bit-exact first, and says so.
    path = tmp_path / "bench.json"
    code = main(["bench", "--quick", "--backend", "cpu", "--iters", "1",
                 "--workload", "qwen3-30b-decode", "--workload", "kimi-k2-decode-sf-packed",
                 "--json", str(path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "backend cpu" in out and "note: no GPU: CPU backend" in out
    assert "| expand | qwen3-30b-decode |" in out
    assert "| with_sf | kimi-k2-decode-sf-packed |" in out
    result = json.loads(path.read_text())
    assert set(result) == RESULT_KEYS
    assert all(set(r) == RECORD_KEYS for r in result["records"])
    assert [r["label"] for r in result["records"]] == ["qwen3-30b-decode",
                                                      "kimi-k2-decode-sf-packed"]
    assert all(r["status"] == "ok" and r["cpu_us"] > 0 for r in result["records"])
    assert result["records"][0]["bytes"] == load_workloads("expand_to_fused")[4].bytes
    assert path.with_suffix(".md").read_text().count("\n| ") >= 3


def test_bench_op_fused_mapping_on_the_cpu_prints_every_mapping_row(tmp_path, capsys):
    path = tmp_path / "mapping.json"
    code = main(["bench", "--backend", "cpu", "--op", "fused_mapping", "--quick", "--iters", "1",
                 "--json", str(path)])
    assert code == 0
    captured = capsys.readouterr()
    workloads = load_workloads("fused_mapping")
    rows = [line for line in captured.out.splitlines() if line.startswith("| mapping |")]
    assert [row.split(" | ")[1:4] for row in rows] == [
        [w.label, (f"T={w.num_tokens} K={w.top_k} E={w.num_experts} A={w.alignment} "
                   f"X={w.num_expanded} int64"), f"{w.bytes / 1e6:.2f}"] for w in workloads]
    assert "| expand |" not in captured.out and "| with_sf |" not in captured.out
    # --quick skips no mapping workload: all are small
    assert "note: no GPU: CPU backend" in captured.out and "skips" not in captured.out
    assert [line for line in captured.err.splitlines() if line.startswith("[")] == [
        f"[{i}/7] fused_mapping {w.label} ..." for i, w in enumerate(workloads, 1)]
    result = json.loads(path.read_text())
    assert set(result) == RESULT_KEYS and result["backend"] == "cpu"
    assert all(set(r) == RECORD_KEYS for r in result["records"])
    assert [(r["op"], r["label"], r["bytes"]) for r in result["records"]] == [
        ("fused_mapping", w.label, w.bytes) for w in workloads]
    for r in result["records"]:
        assert r["status"] == "ok" and r["cpu_us"] > 0 and r["gbps"] > 0 and r["extra"] == {}
        assert all(r[key] is None for key in RECORD_KEYS - {"op", "label", "shapes", "bytes",
                                                            "status", "gbps", "cpu_us", "extra"})
    assert path.with_suffix(".md").read_text().count("\n| mapping |") == 7


def test_bench_all_selects_workloads_of_every_op_by_label(capsys):
    code = main(["bench", "--backend", "cpu", "--iters", "1", "--workload", "mapping-decode",
                 "--workload", "qwen3-30b-decode"])
    assert code == 0
    rows = [line.split(" | ")[:2] for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| expand |", "| mapping |"))]
    # manifest order: the expand ops first
    assert rows == [["| expand", "qwen3-30b-decode"], ["| mapping", "mapping-decode"]]


def test_bench_op_repeats_select_several_ops_in_manifest_order(capsys):
    code = main(["bench", "--backend", "cpu", "--iters", "1", "--op", "fused_mapping",
                 "--op", "expand_to_fused", "--op", "fused_mapping",
                 "--workload", "mapping-decode", "--workload", "qwen3-30b-decode"])
    assert code == 0
    rows = [line.split(" | ")[:2] for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| expand |", "| mapping |"))]
    assert rows == [["| expand", "qwen3-30b-decode"], ["| mapping", "mapping-decode"]]


def test_bench_op_fused_mapping_rejects_other_ops_labels_and_unknown_ops(capsys):
    with pytest.raises(SystemExit, match=re.escape(
            "unknown workload label(s) for ['fused_mapping']: ['kimi-k2-decode']")):
        main(["bench", "--backend", "cpu", "--op", "fused_mapping", "--workload",
              "kimi-k2-decode"])
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--backend", "cpu", "--op", "fused_mapping_v2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --op: invalid choice: 'fused_mapping_v2'" in err
    assert "fused_mapping" in err.split("choose from", 1)[1]


# one small workload of each newer op, in manifest order
NEWER_LABELS = {"reduce_fused": "reduce-qwen3-30b-a3b-decode",
                "quantize_fp8": "quant-qwen3-30b-a3b-decode-row-major",
                "swiglu_quantize_fp8": "swiglu-dsv3-ep8-decode-plan-col-major"}


def test_bench_the_newer_ops_on_the_cpu_writes_their_records(tmp_path, capsys):
    path = tmp_path / "newer.json"
    argv = ["bench", "--backend", "cpu", "--iters", "1", "--json", str(path)]
    for label in [*NEWER_LABELS.values(), "mapping-decode"]:
        argv += ["--workload", label]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split(" | ")[:2] for line in out.splitlines()
            if line.startswith(("| reduce |", "| quant |", "| swiglu |", "| mapping |"))]
    # manifest order: the routing plan, then the combine and the fp8 producers
    assert rows == [["| mapping", "mapping-decode"], ["| reduce", NEWER_LABELS["reduce_fused"]],
                    ["| quant", NEWER_LABELS["quantize_fp8"]],
                    ["| swiglu", NEWER_LABELS["swiglu_quantize_fp8"]]]
    result = json.loads(path.read_text())
    assert set(result) == RESULT_KEYS and result["backend"] == "cpu"
    records = result["records"][1:]
    assert [(r["op"], r["label"]) for r in records] == list(NEWER_LABELS.items())
    for r in records:
        (w,) = [w for w in load_workloads(r["op"]) if w.label == r["label"]]
        assert set(r) == RECORD_KEYS and r["bytes"] == w.bytes and r["extra"] == {}
        assert r["status"] == "ok" and r["cpu_us"] > 0 and r["gbps"] > 0
        assert all(r[key] is None for key in RECORD_KEYS - {"op", "label", "shapes", "bytes",
                                                            "status", "gbps", "cpu_us", "extra"})
    assert records[2]["shapes"] == ("T=1 I=2048 K=8 X=384 npc=128 plan E=32/256 A=128 "
                                    "routed=3 S=16 float32/col +topk_weights +pos_to_expert")


def test_bench_plot_without_matplotlib_fails_before_timing(tmp_path, capsys, monkeypatch):
    # None in sys.modules makes `import matplotlib` raise ImportError, as on a
    # machine without the plot extra.
    monkeypatch.setitem(sys.modules, "matplotlib", None)

    def run_must_not_start(*args, **kwargs):
        raise AssertionError("the benchmark ran although the plot could not be written")
    monkeypatch.setattr(runner, "run", run_must_not_start)

    code = main(["bench", "--backend", "cpu", "--iters", "1", "--workload", "qwen3-30b-decode",
                 "--json", str(tmp_path / "bench.json"), "--plot", str(tmp_path / "bench.png")])
    assert code == 2
    captured = capsys.readouterr()
    assert "--plot needs matplotlib, the plot extra" in captured.err
    assert "cupy-moe[plot]" in captured.err
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_bench_rejects_unknown_workloads_and_bad_iteration_counts(capsys):
    with pytest.raises(SystemExit, match="unknown workload label"):
        main(["bench", "--backend", "cpu", "--workload", "no-such-workload"])
    with pytest.raises(SystemExit):
        main(["bench", "--iters", "0"])
    assert "--iters: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--iters", "abc"])
    assert "--iters: must be an integer, got 'abc'" in capsys.readouterr().err


def test_bench_refuses_output_paths_it_cannot_write_before_the_run(tmp_path, capsys,
                                                                   monkeypatch):
    def run_must_not_start(*args, **kwargs):
        raise AssertionError("the benchmark ran although its outputs could not be written")
    monkeypatch.setattr(runner, "run", run_must_not_start)
    monkeypatch.setattr("cupy_moe.harness.report.can_plot", lambda: True)
    missing = tmp_path / "no-folder"
    for args, message in (
            (["--json", str(missing / "b.json")],
             f"--json {missing / 'b.json'}: no folder {missing}"),
            (["--markdown", str(missing / "b.md")],
             f"--markdown {missing / 'b.md'}: no folder {missing}"),
            (["--json", str(tmp_path)], f"--json {tmp_path} is a folder; give a file name"),
            (["--json", "."], "--json . is a folder; give a file name"),
            (["--json", str(tmp_path / "b.md")],
             f"--json {tmp_path / 'b.md'}: the Markdown table goes beside it with the suffix .md "
             "and would overwrite it; name the JSON file *.json"),
            (["--json", str(tmp_path / "b.json"), "--markdown", str(tmp_path / "b.json")],
             f"--json and --markdown name the same file, {tmp_path / 'b.json'}"),
            (["--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.json")],
             f"--json and --plot name the same file, {tmp_path / 'b.json'}")):
        assert main(["bench", "--backend", "cpu", "--workload", "qwen3-30b-decode", *args]) == 2
        assert f"cupy-moe bench: {message}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bench_quick_runs_a_workload_named_whatever_its_size(monkeypatch):
    """--quick on the CPU skips the largest workloads, but not one the caller
    names (it once printed an empty table and exited 0)."""
    timed = []

    def fake_bench(w, iters, rng):
        timed.append(w.label)
        return runner._new_record(w)
    monkeypatch.setattr(runner, "bench_cpu_workload", fake_bench)
    big = [w.label for w in load_workloads("expand_to_fused")
           if w.bytes > runner.cpu_quick_max_bytes(w.op)]
    with open(os.devnull, "w") as quiet:
        named = runner.run(["expand_to_fused"], big[:1], "cpu", 1, True, progress=quiet)
        assert timed == big[:1] and not any("skips" in n for n in named["notes"])
        timed.clear()
        everything = runner.run(["expand_to_fused"], None, "cpu", 1, True, progress=quiet)
    assert big[0] not in timed and any(big[0] in n for n in everything["notes"])


def test_version_is_written_in_one_place():
    # pyproject.toml reads cupy_moe._version; an installed package's metadata
    # must therefore agree with the module
    from importlib import metadata

    try:
        installed = metadata.version("cupy-moe")
    except metadata.PackageNotFoundError:
        pytest.skip("cupy-moe is not installed (running from the source tree)")
    assert installed == cupy_moe.__version__
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and "cupy_moe._version.__version__" in text
