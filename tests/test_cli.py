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
