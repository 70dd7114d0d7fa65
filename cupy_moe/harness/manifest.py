"""The manifest of workloads: shapes of real MoE layers and their roofline bytes.

The shapes live in ``workloads.yaml`` beside this module, the byte counts in
:mod:`cupy_moe.harness.rooflines`; tests, benchmarks and the CLI read
workloads from here only, so a shape is named in one place.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Mapping

import yaml

from .rooflines import ROOFLINES

__all__ = ["Workload", "OP_NAMES", "load_workloads", "roofline_bytes"]

OP_NAMES = ("expand_to_fused", "expand_to_fused_with_sf")

_ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "uint8": 1, "int8": 1}
_INPUT_NAMES = ("x", "x_sf", "token_topk_to_pos", "pos_to_expert")


@dataclass(frozen=True)
class Workload:
    """One manifest workload of one op.

    ``shapes`` maps each input name (``x [T, H]``, ``token_topk_to_pos
    [T, K]``, ``pos_to_expert [X]`` and, for the SF op, ``x_sf [T, S]``) to
    its shape; ``dtype`` names the dtype of ``x`` (``bfloat16``,
    ``float8_e4m3fn``), ``sf_dtype`` that of ``x_sf`` (``float32``, ``int32``).
    """

    op: str
    label: str
    shapes: Mapping[str, tuple[int, ...]]
    dtype: str
    sf_dtype: str | None = None
    num_per_channels: int | None = None
    use_tma_aligned_col_major_sf: bool = False

    # T, H, K, X: read off the shapes (not arguments)
    num_tokens: int = field(init=False, compare=False)
    hidden: int = field(init=False, compare=False)
    top_k: int = field(init=False, compare=False)
    num_expanded: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        sizes = {"num_tokens": self.shapes["x"][0], "hidden": self.shapes["x"][1],
                 "top_k": self.shapes["token_topk_to_pos"][1],
                 "num_expanded": self.shapes["pos_to_expert"][0]}
        for name, value in sizes.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    @property
    def sf_columns(self) -> int | None:
        return self.shapes["x_sf"][1] if "x_sf" in self.shapes else None

    @property
    def elem_bytes(self) -> int:
        return _ITEM_BYTES[self.dtype]

    @property
    def bytes(self) -> int:
        """Roofline bytes of one call (inputs read once, outputs written once)."""
        return roofline_bytes(self.op, self.shapes, self.elem_bytes)


@functools.cache
def _manifest() -> dict[str, Any]:
    text = resources.files("cupy_moe.harness").joinpath("workloads.yaml").read_text()
    return yaml.safe_load(text)


def _require_op(op_name: str, known: Collection[str]) -> None:
    if op_name not in known:
        raise KeyError(f"no op {op_name!r} in the manifest; known: {sorted(known)}")


def load_workloads(op_name: str) -> list[Workload]:
    """The manifest workloads of ``op_name``, in manifest order."""
    manifest = _manifest()
    _require_op(op_name, manifest)
    return [
        Workload(
            op=op_name,
            label=raw["label"],
            shapes={name: tuple(raw[name]) for name in _INPUT_NAMES if name in raw},
            dtype=raw["dtype"],
            sf_dtype=raw.get("sf_dtype"),
            num_per_channels=raw.get("num_per_channels"),
            use_tma_aligned_col_major_sf=bool(raw.get("use_tma_aligned_col_major_sf", False)),
        )
        for raw in manifest[op_name]["workloads"]
    ]


def roofline_bytes(op_name: str, shapes: Mapping[str, tuple[int, ...]], elem_bytes: int) -> int:
    """Fewest bytes one call of ``op_name`` moves (see :mod:`.rooflines`).

    ``shapes`` maps input names to shapes, as in :attr:`Workload.shapes`;
    ``elem_bytes`` is the item size of ``x``.
    """
    _require_op(op_name, ROOFLINES)
    return ROOFLINES[op_name](shapes, elem_bytes)
