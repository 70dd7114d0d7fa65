"""What the GPU probes (zero_map_probe.py, row_block_probe.py) share: the
stream their timer times, and how a run's table and records are written."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any


def stream_of_the_timer(graph: bool) -> Callable[[Callable[[int], Any]], Callable[[], Any]]:
    """``wrap(fn)``: a call of ``fn(stream)`` (a raw stream handle) on the
    stream the timer times: torch's current stream (a CUDA graph's capture)
    with ``graph``, else CuPy's."""
    import cupy

    if graph:
        import torch
        return lambda fn: (lambda: fn(torch.cuda.current_stream().cuda_stream))
    return lambda fn: (lambda: fn(cupy.cuda.get_current_stream().ptr))


def cupy_stream(handle: int):
    """The CuPy stream of a raw handle (0: the null stream), to launch on with ``with``."""
    import cupy

    return cupy.cuda.ExternalStream(handle) if handle else cupy.cuda.Stream.null


def finish(text: str, md: pathlib.Path | None, json_path: pathlib.Path | None,
           payload: dict[str, Any]) -> int:
    """Print ``text``, write it to ``md`` and ``payload`` to ``json_path``
    (each where given); exit status 0 if every variant of every record of
    ``payload["records"]`` was right, else 1."""
    print(text)
    if md:
        md.write_text(text)
    if json_path:
        json_path.write_text(json.dumps(payload, indent=1))
    records = payload["records"]
    return 0 if all(v["ok"] for r in records for v in r["variants"].values()) else 1
