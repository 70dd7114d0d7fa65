"""The manifest of workloads: shapes of real MoE layers and their roofline bytes.

The shapes live in ``workloads.yaml`` beside this module, the byte counts in
:mod:`cupy_moe.harness.rooflines`; tests, benchmarks and the CLI read
workloads from here only, so a shape is named in one place. The file is
checked strictly when first read (:func:`parse_manifest`): an unknown key, a
missing one, a value of the wrong type or a repeated label is an error that
names the entry.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from cupy_moe.mapping.reference import worst_case_rows
from cupy_moe.mapping.rules import TOPK_ID_DTYPES

from .rooflines import ROOFLINES

__all__ = ["ALL_OP_NAMES", "MAPPING_OP_NAMES", "OP_NAMES", "Workload", "load_workloads",
           "parse_manifest", "roofline_bytes"]

# The expand ops: x [T, H] scattered to [X, H] rows. benchmarks/* iterate
# these and read x's shape, so the routing-plan op is not among them.
OP_NAMES = ("expand_to_fused", "expand_to_fused_with_sf")
# The routing-plan op: topk_ids [T, K] in, the plan's seven int32 arrays out.
MAPPING_OP_NAMES = ("fused_mapping",)
# Every op of the manifest, in manifest order (what ``cupy-moe bench`` runs).
ALL_OP_NAMES = OP_NAMES + MAPPING_OP_NAMES

_ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "uint8": 1, "int8": 1,
               "int32": 4, "int64": 8}
_EXPAND_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "uint8", "int8")
_SF_DTYPES = ("float32", "int32")
_INPUT_NAMES = ("x", "x_sf", "token_topk_to_pos", "pos_to_expert", "topk_ids")

# The keys of a workload entry, by op: key -> what its value must be. A shape
# is a list of non-negative ints of the given rank.
_SHAPE = {"x": 2, "x_sf": 2, "token_topk_to_pos": 2, "pos_to_expert": 1, "topk_ids": 2}
_EXPAND_KEYS = {"label": "str", "x": "shape", "token_topk_to_pos": "shape",
                "pos_to_expert": "shape", "dtype": "str"}
_KEYS: dict[str, dict[str, str]] = {
    "expand_to_fused": _EXPAND_KEYS,
    "expand_to_fused_with_sf": {**_EXPAND_KEYS, "x_sf": "shape", "sf_dtype": "str",
                                "num_per_channels": "int",
                                "use_tma_aligned_col_major_sf": "bool"},
    "fused_mapping": {"label": "str", "topk_ids": "shape", "num_experts": "int",
                      "alignment": "int", "dtype": "str"},
}
# keys that may be left out (their default in Workload applies)
_OPTIONAL = {"use_tma_aligned_col_major_sf"}
_DTYPES = {("expand_to_fused", "dtype"): _EXPAND_DTYPES,
           ("expand_to_fused_with_sf", "dtype"): _EXPAND_DTYPES,
           ("expand_to_fused_with_sf", "sf_dtype"): _SF_DTYPES,
           ("fused_mapping", "dtype"): TOPK_ID_DTYPES}
# int keys that must be >= 1
_POSITIVE = ("num_per_channels", "num_experts", "alignment")


@dataclass(frozen=True)
class Workload:
    """One manifest workload of one op.

    ``shapes`` maps each input name to its shape: for the expand ops ``x [T,
    H]``, ``token_topk_to_pos [T, K]``, ``pos_to_expert [X]`` and, for the SF
    op, ``x_sf [T, S]``; for ``fused_mapping`` ``topk_ids [T, K]``. ``dtype``
    names the dtype of ``x`` (``bfloat16``, ``float8_e4m3fn``) or of
    ``topk_ids`` (``int64``, ``int32``), ``sf_dtype`` that of ``x_sf``
    (``float32``, ``int32``). ``num_experts`` (E) and ``alignment`` (A) are
    ``fused_mapping``'s arguments, None for the expand ops.
    """

    op: str
    label: str
    shapes: Mapping[str, tuple[int, ...]]
    dtype: str
    sf_dtype: str | None = None
    num_per_channels: int | None = None
    use_tma_aligned_col_major_sf: bool = False
    num_experts: int | None = None
    alignment: int | None = None

    # T, H, K, X: read off the shapes (not arguments). fused_mapping has no H
    # (None); its X is the rows of the plan the op sizes by default, the
    # tight worst case of T * K slots over E experts at alignment A.
    num_tokens: int = field(init=False, compare=False)
    hidden: int | None = field(init=False, compare=False)
    top_k: int = field(init=False, compare=False)
    num_expanded: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.op in MAPPING_OP_NAMES:
            num_tokens, top_k = self.shapes["topk_ids"]
            sizes = {"num_tokens": num_tokens, "hidden": None, "top_k": top_k,
                     "num_expanded": worst_case_rows(num_tokens * top_k, self.num_experts,
                                                     self.alignment)}
        else:
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
        """Item size of ``x`` (expand ops) or of ``topk_ids`` (``fused_mapping``)."""
        return _ITEM_BYTES[self.dtype]

    @property
    def bytes(self) -> int:
        """Roofline bytes of one call (inputs read once, outputs written once)."""
        if self.op in MAPPING_OP_NAMES:
            return roofline_bytes(self.op, self.shapes, self.elem_bytes,
                                  num_experts=self.num_experts,
                                  num_expanded=self.num_expanded)
        return roofline_bytes(self.op, self.shapes, self.elem_bytes)


def _type_name(value: Any) -> str:
    return type(value).__name__


def _check_value(where: str, key: str, kind: str, value: Any) -> None:
    """TypeError unless ``value`` is of ``kind`` ("str", "int", "bool", "shape");
    ValueError for a shape of the wrong rank or with a negative size."""
    if kind == "str":
        if type(value) is not str:
            raise TypeError(f"{where}: {key} must be a string; got {value!r} "
                            f"({_type_name(value)})")
    elif kind == "int":  # bool is an int in Python, not here
        if type(value) is not int:
            raise TypeError(f"{where}: {key} must be an int; got {value!r} "
                            f"({_type_name(value)})")
    elif kind == "bool":
        if type(value) is not bool:
            raise TypeError(f"{where}: {key} must be true or false; got {value!r} "
                            f"({_type_name(value)})")
    else:
        rank = _SHAPE[key]
        if type(value) is not list or any(type(n) is not int for n in value):
            raise TypeError(f"{where}: {key} must be a list of {rank} int(s); got {value!r}")
        if len(value) != rank or any(n < 0 for n in value):
            raise ValueError(f"{where}: {key} must be {rank} size(s) >= 0; got {value!r}")


def _parse_workload(op_name: str, index: int, raw: Any) -> Workload:
    where = f"workloads.yaml: {op_name} workload {index}"
    if not isinstance(raw, Mapping):
        raise TypeError(f"{where} must be a mapping of keys to values; got {raw!r}")
    if type(raw.get("label")) is str:
        where += f" ({raw['label']})"
    allowed = _KEYS[op_name]
    unknown = sorted(str(key) for key in raw if key not in allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(key for key in allowed if key not in raw and key not in _OPTIONAL)
    if missing:
        raise ValueError(f"{where}: missing key(s) {missing}")
    for key, value in raw.items():
        _check_value(where, key, allowed[key], value)
        names = _DTYPES.get((op_name, key))
        if names is not None and value not in names:
            raise ValueError(f"{where}: {key} must be one of {list(names)}; got {value!r}")
        if key in _POSITIVE and value < 1:
            raise ValueError(f"{where}: {key} must be >= 1; got {value}")
    shapes = {name: tuple(raw[name]) for name in _INPUT_NAMES if name in raw}
    if op_name in MAPPING_OP_NAMES:
        if shapes["topk_ids"][1] < 1:
            raise ValueError(f"{where}: topk_ids must have K >= 1 slots a token; got "
                             f"{list(shapes['topk_ids'])}")
    else:
        tokens = {name: shapes[name][0] for name in ("x", "x_sf", "token_topk_to_pos")
                  if name in shapes}
        if len(set(tokens.values())) > 1:
            raise ValueError(f"{where}: the shapes disagree on T (their first size): {tokens}")
    return Workload(
        op=op_name,
        label=raw["label"],
        shapes=shapes,
        dtype=raw["dtype"],
        sf_dtype=raw.get("sf_dtype"),
        num_per_channels=raw.get("num_per_channels"),
        use_tma_aligned_col_major_sf=raw.get("use_tma_aligned_col_major_sf", False),
        num_experts=raw.get("num_experts"),
        alignment=raw.get("alignment"),
    )


def parse_manifest(data: Any) -> dict[str, list[Workload]]:
    """The workloads of every op, from the manifest's YAML as loaded.

    ``data`` must map each op of :data:`ALL_OP_NAMES` (no other) to
    ``{workloads: [entry, ...]}``; an entry has exactly its op's keys (see
    ``workloads.yaml``). Labels are unique across ops (the CLI selects by
    label). Raises TypeError for a value of the wrong type, ValueError for an
    unknown or missing key, a dtype the op does not take, a bad size or a
    repeated label; the message names the op, the entry and its label.
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"workloads.yaml must map op names to sections; got {_type_name(data)}")
    unknown = sorted(str(name) for name in data if name not in ALL_OP_NAMES)
    if unknown:
        raise ValueError(f"workloads.yaml: unknown op section(s) {unknown}; "
                         f"known: {list(ALL_OP_NAMES)}")
    missing = [name for name in ALL_OP_NAMES if name not in data]
    if missing:
        raise ValueError(f"workloads.yaml: no section for op(s) {missing}")
    workloads: dict[str, list[Workload]] = {}
    seen: dict[str, str] = {}
    for op_name in ALL_OP_NAMES:
        section = data[op_name]
        if not isinstance(section, Mapping) or set(section) != {"workloads"}:
            raise ValueError(f"workloads.yaml: the {op_name} section must have exactly one "
                             f"key, workloads; got {section!r}")
        entries = section["workloads"]
        if type(entries) is not list:
            raise TypeError(f"workloads.yaml: {op_name}.workloads must be a list of entries; "
                            f"got {_type_name(entries)}")
        workloads[op_name] = [_parse_workload(op_name, i, raw) for i, raw in enumerate(entries)]
        for w in workloads[op_name]:
            if w.label in seen:
                raise ValueError(f"workloads.yaml: label {w.label!r} of {op_name} is already "
                                 f"one of {seen[w.label]}; labels must be unique")
            seen[w.label] = op_name
    return workloads


@functools.cache
def _manifest() -> dict[str, list[Workload]]:
    text = resources.files("cupy_moe.harness").joinpath("workloads.yaml").read_text()
    return parse_manifest(yaml.safe_load(text))


def _require_op(op_name: str, known: Collection[str]) -> None:
    if op_name not in known:
        raise KeyError(f"no op {op_name!r} in the manifest; known: {sorted(known)}")


def load_workloads(op_name: str) -> list[Workload]:
    """The manifest workloads of ``op_name``, in manifest order."""
    _require_op(op_name, ALL_OP_NAMES)
    return list(_manifest()[op_name])


def roofline_bytes(op_name: str, shapes: Mapping[str, tuple[int, ...]], elem_bytes: int,
                   **sizes: int) -> int:
    """Fewest bytes one call of ``op_name`` moves (see :mod:`.rooflines`).

    ``shapes`` maps input names to shapes, as in :attr:`Workload.shapes`;
    ``elem_bytes`` is the item size of ``x`` (of ``topk_ids`` for
    ``fused_mapping``, which also takes ``num_experts=`` and
    ``num_expanded=``: its outputs' sizes are not input shapes).
    """
    _require_op(op_name, ROOFLINES)
    return ROOFLINES[op_name](shapes, elem_bytes, **sizes)
