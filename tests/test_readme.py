"""The README's NumPy quick example runs as written and does what its
comments say (a reader copies it first)."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np

README = Path(__file__).resolve().parent.parent / "README.md"


def _numpy_example() -> str:
    text = README.read_text(encoding="utf-8")
    found = re.search(r"^NumPy \(CPU[^\n]*\n\n```python\n(.*?)^```", text, re.S | re.M)
    assert found, "README.md has no NumPy quick example"
    return found.group(1)


def test_the_numpy_quick_example_does_what_its_comments_say():
    scope: dict = {}
    exec(compile(_numpy_example(), str(README), "exec"), scope)  # noqa: S102 - our own README
    x, y, z = scope["x"], scope["y"], scope["z"]
    assert y.shape == (7, 2) and y.dtype == ml_dtypes.bfloat16        # "[7, 2] bf16"
    assert z.shape == (3, 2) and z.dtype == ml_dtypes.bfloat16        # "[3, 2] bf16"
    assert np.array_equal(z.view(np.uint16), x.view(np.uint16))       # "== x here"
    x8, x_sf = scope["x8"], scope["x_sf"]
    assert x8.shape == (4, 256) and x8.dtype == ml_dtypes.float8_e4m3fn
    assert x_sf.shape == (4, 2) and x_sf.dtype == np.float32          # "[4, 2] f32"
    # padding rows are zero; each routed row is its token's
    assert not y[5:].view(np.uint16).any()
    assert np.array_equal(y[[0, 3]].view(np.uint16), x[[0, 0]].view(np.uint16))
