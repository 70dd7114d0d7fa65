"""The manifest of workloads: shapes of real MoE layers and roofline byte counts.

The data lives in ``workloads.yaml`` beside this module; tests, benchmarks and
the CLI read workloads from here only, so a shape is named in one place.
"""

from __future__ import annotations

import ast
import functools
import operator
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

import yaml

__all__ = ["Workload", "OP_NAMES", "load_workloads", "roofline_bytes"]

OP_NAMES = ("expand_to_fused", "expand_to_fused_with_sf")

_ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "uint8": 1, "int8": 1}


@dataclass(frozen=True)
class Workload:
    """One manifest workload of one op.

    ``shapes`` maps each input name (``x``, ``token_topk_to_pos``,
    ``pos_to_expert`` and, for the SF op, ``x_sf``) to its shape.
    """

    op: str
    label: str
    shapes: Mapping[str, tuple[int, ...]]
    dtype: str
    sf_dtype: str | None = None
    num_per_channels: int | None = None
    use_tma_aligned_col_major_sf: bool = False

    @property
    def num_tokens(self) -> int:
        return self.shapes["x"][0]

    @property
    def hidden(self) -> int:
        return self.shapes["x"][1]

    @property
    def top_k(self) -> int:
        return self.shapes["token_topk_to_pos"][1]

    @property
    def num_expanded(self) -> int:
        return self.shapes["pos_to_expert"][0]

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
    text = resources.files("cupy_moe").joinpath("workloads.yaml").read_text()
    return yaml.safe_load(text)


def _op_entry(op_name: str) -> dict[str, Any]:
    manifest = _manifest()
    if op_name not in manifest:
        raise KeyError(f"no op {op_name!r} in the manifest; known: {sorted(manifest)}")
    return manifest[op_name]


def load_workloads(op_name: str) -> list[Workload]:
    """The manifest workloads of ``op_name``, in manifest order."""
    entry = _op_entry(op_name)
    workloads = []
    for raw in entry["workloads"]:
        shapes = {
            name: tuple(raw[name])
            for name in ("x", "x_sf", "token_topk_to_pos", "pos_to_expert")
            if name in raw
        }
        workloads.append(
            Workload(
                op=op_name,
                label=raw["label"],
                shapes=shapes,
                dtype=raw["dtype"],
                sf_dtype=raw.get("sf_dtype"),
                num_per_channels=raw.get("num_per_channels"),
                use_tma_aligned_col_major_sf=bool(raw.get("use_tma_aligned_col_major_sf", False)),
            )
        )
    return workloads


_BINARY_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.FloorDiv: operator.floordiv}


def _evaluate(expression: str, names: Mapping[str, Any]) -> int:
    """Integer arithmetic over ``names``: + - * //, ``name[i]``; nothing else."""

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            return _BINARY_OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.Subscript):
            return walk(node.value)[walk(node.slice)]
        raise ValueError(f"unsupported element in manifest expression {expression!r}: "
                         f"{ast.dump(node)}")

    return int(walk(ast.parse(expression, mode="eval")))


def roofline_bytes(op_name: str, shapes: Mapping[str, tuple[int, ...]], elem_bytes: int) -> int:
    """Fewest bytes one call of ``op_name`` moves, by the manifest's formula.

    ``shapes`` maps input names to shapes, as in :attr:`Workload.shapes`;
    ``elem_bytes`` is the item size of ``x``.
    """
    entry = _op_entry(op_name)
    variables = {var: _evaluate(expr, shapes) for var, expr in entry["vars"].items()}
    variables["elem_bytes"] = elem_bytes
    return _evaluate(entry["bytes"], variables)
