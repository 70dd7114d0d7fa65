"""The ``cupy-moe`` command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cupy_moe
from cupy_moe.cli import main

pytestmark = pytest.mark.smoke

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_info_prints_versions_and_backends(capsys):
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"cupy_moe {cupy_moe.__version__} (python ")
    assert f"numpy: {np.__version__}" in lines
    (backends,) = [line for line in lines if line.startswith("backends:")]
    assert "cpu (numpy)" in backends


def test_module_help_exits_zero():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", "cupy_moe", "--help"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: cupy-moe" in done.stdout
    assert "info" in done.stdout


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
    import json
    result = json.loads(path.read_text())
    assert [r["label"] for r in result["records"]] == ["qwen3-30b-decode",
                                                      "kimi-k2-decode-sf-packed"]
    assert all(r["status"] == "ok" and r["cpu_us"] > 0 for r in result["records"])
    assert result["records"][0]["bytes"] == cupy_moe.load_workloads("expand_to_fused")[4].bytes
    assert path.with_suffix(".md").read_text().count("\n| ") >= 3


def test_bench_rejects_unknown_workloads_and_bad_iteration_counts(capsys):
    with pytest.raises(SystemExit, match="unknown workload label"):
        main(["bench", "--backend", "cpu", "--workload", "no-such-workload"])
    with pytest.raises(SystemExit):
        main(["bench", "--iters", "0"])
    assert "--iters: must be >= 1, got 0" in capsys.readouterr().err
