"""The manifest of workloads: shapes of real MoE layers and their roofline bytes.

The shapes live in ``workloads.yaml`` beside this module, the byte counts in
:mod:`cupy_moe.harness.rooflines`; tests, benchmarks and the CLI read
workloads from here only, so a shape is named in one place. The file is
checked strictly when first read (:func:`parse_manifest`): an unknown key, a
missing one, a value of the wrong type or a repeated label is an error that
names the entry.

An expand workload routes its tokens one of two ways. Without ``plan:`` it
states ``pos_to_expert [X]`` and the inputs pack the slots into those X rows
(:func:`cupy_moe.harness.inputs.fitted_routing`, random each run). With
``plan: {num_experts: E, alignment: A, ep_ranks: R, seed: S}`` its routing is
a real plan, fixed by the seed: top-k ids drawn uniformly from ``[0, E*R)``
(:meth:`PlanSpec.topk_ids`), the ids >= E those of other ranks' experts
(dropped), the plan ``fused_mapping_numpy(ids, E, alignment=A)`` with its
exact X (every expert's segment padded to a multiple of A). X is then derived
(:attr:`Workload.num_expanded`), and the entry must not state
``pos_to_expert``.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import yaml

from cupy_moe.mapping.reference import worst_case_rows
from cupy_moe.mapping.rules import TOPK_ID_DTYPES
from cupy_moe.runtime.sizes import align_up

from .rooflines import ROOFLINES, SplitBytes, expand_split_bytes

__all__ = ["ALL_OP_NAMES", "MAPPING_OP_NAMES", "OP_NAMES", "PlanSpec", "Workload",
           "load_workloads", "parse_manifest", "roofline_bytes"]

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
                "pos_to_expert": "shape", "plan": "plan", "dtype": "str"}
_KEYS: dict[str, dict[str, str]] = {
    "expand_to_fused": _EXPAND_KEYS,
    "expand_to_fused_with_sf": {**_EXPAND_KEYS, "x_sf": "shape", "sf_dtype": "str",
                                "num_per_channels": "int",
                                "use_tma_aligned_col_major_sf": "bool"},
    "fused_mapping": {"label": "str", "topk_ids": "shape", "num_experts": "int",
                      "alignment": "int", "dtype": "str"},
}
# keys that may be left out (their default in Workload applies); an expand
# entry has exactly one of pos_to_expert and plan (checked on its own)
_OPTIONAL = {"use_tma_aligned_col_major_sf", "pos_to_expert", "plan"}
# the keys of an expand entry's plan, all ints: key -> least value; ep_ranks
# may be left out (1: every expert is local)
_PLAN_KEYS = {"num_experts": 1, "alignment": 1, "ep_ranks": 1, "seed": 0}
_PLAN_OPTIONAL = {"ep_ranks"}
_DTYPES = {("expand_to_fused", "dtype"): _EXPAND_DTYPES,
           ("expand_to_fused_with_sf", "dtype"): _EXPAND_DTYPES,
           ("expand_to_fused_with_sf", "sf_dtype"): _SF_DTYPES,
           ("fused_mapping", "dtype"): TOPK_ID_DTYPES}
# int keys that must be >= 1
_POSITIVE = ("num_per_channels", "num_experts", "alignment")


@dataclass(frozen=True)
class PlanSpec:
    """The real routing plan of an expand workload (its ``plan:`` entry).

    ``num_experts`` (E) local experts of ``ep_ranks`` (R) ranks' E*R; the
    ids are :meth:`topk_ids`, the plan ``fused_mapping_numpy(ids, E,
    alignment=alignment)`` at its exact X (ids >= E are other ranks'
    experts: dropped).
    """

    num_experts: int
    alignment: int
    seed: int
    ep_ranks: int = 1

    @property
    def total_experts(self) -> int:
        return self.num_experts * self.ep_ranks

    def topk_ids(self, num_tokens: int, top_k: int) -> np.ndarray:
        """The plan's top-k ids, int64 ``[T, K]`` (read-only, cached):
        ``np.random.default_rng(seed).integers(0, E * R, size=(T, K))``, each
        slot an expert of all ranks' drawn uniformly and independently (a
        token may pick an expert twice); none is dropped by the router."""
        return _plan_topk_ids(num_tokens, top_k, self.total_experts, self.seed)

    def sizes(self, num_tokens: int, top_k: int) -> tuple[int, int, int]:
        """``(X, routed_rows, used_tokens)`` of the plan: its exact rows, the
        rows that hold a slot (slots of local experts) and the tokens with at
        least one such slot. Cached: the manifest needs them when it loads."""
        return _plan_sizes(num_tokens, top_k, self.num_experts, self.ep_ranks,
                           self.alignment, self.seed)


@functools.lru_cache(maxsize=64)
def _plan_topk_ids(num_tokens: int, top_k: int, total_experts: int, seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(0, total_experts, size=(num_tokens, top_k),
                                               dtype=np.int64)
    ids.flags.writeable = False
    return ids


@functools.cache
def _plan_sizes(num_tokens: int, top_k: int, num_experts: int, ep_ranks: int, alignment: int,
                seed: int) -> tuple[int, int, int]:
    # The plan's sizes without building it: fused_mapping_numpy gives expert e
    # a segment of align(count_e, A) rows, one after the other.
    ids = _plan_topk_ids(num_tokens, top_k, num_experts * ep_ranks, seed)
    local = ids < num_experts
    counts = np.bincount(ids[local], minlength=num_experts)
    num_expanded = int(align_up(counts, alignment).sum())
    return num_expanded, int(local.sum()), int(local.any(axis=1).sum())


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

    ``plan``: an expand workload's real routing plan (:class:`PlanSpec`), or
    None where :func:`~cupy_moe.harness.inputs.fitted_routing` packs the
    slots into the stated X. With a plan, ``shapes`` may leave out
    ``pos_to_expert``: it is derived, ``(X,)`` of the plan's exact X (a
    stated one must agree); ``routed_rows`` (R) and ``used_tokens`` (U) are
    the plan's too, and :attr:`bytes` reads only the U used tokens' rows.
    Without a plan both are None.
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
    plan: PlanSpec | None = None

    # T, H, K, X: read off the shapes (not arguments). fused_mapping has no H
    # (None); its X is the rows of the plan the op sizes by default, the
    # tight worst case of T * K slots over E experts at alignment A.
    num_tokens: int = field(init=False, compare=False)
    hidden: int | None = field(init=False, compare=False)
    top_k: int = field(init=False, compare=False)
    num_expanded: int = field(init=False, compare=False)
    # a plan workload's routed rows and used tokens (None without a plan)
    routed_rows: int | None = field(init=False, compare=False)
    used_tokens: int | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        sizes: dict[str, Any] = {"routed_rows": None, "used_tokens": None}
        if self.op in MAPPING_OP_NAMES:
            num_tokens, top_k = self.shapes["topk_ids"]
            sizes.update(num_tokens=num_tokens, hidden=None, top_k=top_k,
                         num_expanded=worst_case_rows(num_tokens * top_k, self.num_experts,
                                                      self.alignment))
        else:
            num_tokens, hidden = self.shapes["x"]
            top_k = self.shapes["token_topk_to_pos"][1]
            sizes.update(num_tokens=num_tokens, hidden=hidden, top_k=top_k)
            if self.plan is None:
                sizes["num_expanded"] = self.shapes["pos_to_expert"][0]
            else:
                num_expanded, routed, used = self.plan.sizes(num_tokens, top_k)
                stated = self.shapes.get("pos_to_expert")
                if stated is not None and tuple(stated) != (num_expanded,):
                    raise ValueError(f"{self.label}: pos_to_expert {list(stated)} is not the "
                                     f"plan's [{num_expanded}] rows")
                # pos_to_expert's shape derived, in the usual key order
                shapes = {**self.shapes, "pos_to_expert": (num_expanded,)}
                object.__setattr__(self, "shapes", {name: shapes[name] for name in _INPUT_NAMES
                                                    if name in shapes})
                sizes.update(num_expanded=num_expanded, routed_rows=routed, used_tokens=used)
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
        """Roofline bytes of one call (inputs read once, outputs written once;
        a plan workload reads only its used tokens' rows of ``x``)."""
        if self.op in MAPPING_OP_NAMES:
            return roofline_bytes(self.op, self.shapes, self.elem_bytes,
                                  num_experts=self.num_experts,
                                  num_expanded=self.num_expanded)
        if self.plan is not None:
            return roofline_bytes(self.op, self.shapes, self.elem_bytes,
                                  used_tokens=self.used_tokens)
        return roofline_bytes(self.op, self.shapes, self.elem_bytes)

    def split_bytes(self, routed_rows: int | None = None) -> SplitBytes:
        """:attr:`bytes` of an expand workload as a copy and a memset
        (:func:`~cupy_moe.harness.rooflines.expand_split_bytes`).

        A plan workload knows its routed rows; a workload without a plan is
        routed afresh each run, so ``routed_rows`` (the drawn plan's) must be
        given, and every token's row counts as read (as in :attr:`bytes`)."""
        if self.op in MAPPING_OP_NAMES:
            raise ValueError(f"{self.label}: {self.op} has no copy/memset split")
        if routed_rows is None:
            if self.routed_rows is None:
                raise ValueError(f"{self.label}: no plan; give the routed_rows of its routing")
            routed_rows = self.routed_rows
        return expand_split_bytes(self.shapes, self.elem_bytes, routed_rows=routed_rows,
                                  used_tokens=self.used_tokens)


def _type_name(value: Any) -> str:
    return type(value).__name__


def _check_value(where: str, key: str, kind: str, value: Any) -> None:
    """TypeError unless ``value`` is of ``kind`` ("str", "int", "bool", "shape",
    "plan"); ValueError for a shape of the wrong rank or with a negative size,
    and for a bad plan (:func:`_parse_plan`)."""
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
    elif kind == "plan":
        _parse_plan(where, value)
    else:
        rank = _SHAPE[key]
        if type(value) is not list or any(type(n) is not int for n in value):
            raise TypeError(f"{where}: {key} must be a list of {rank} int(s); got {value!r}")
        if len(value) != rank or any(n < 0 for n in value):
            raise ValueError(f"{where}: {key} must be {rank} size(s) >= 0; got {value!r}")


def _parse_plan(where: str, raw: Any) -> PlanSpec:
    """The :class:`PlanSpec` of an entry's ``plan:``; TypeError for a value
    of the wrong type, ValueError for an unknown or missing key or a value
    below its least (num_experts, alignment, ep_ranks >= 1; seed >= 0)."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"{where}: plan must be a mapping with keys {sorted(_PLAN_KEYS)}; "
                        f"got {raw!r} ({_type_name(raw)})")
    unknown = sorted(str(key) for key in raw if key not in _PLAN_KEYS)
    if unknown:
        raise ValueError(f"{where}: plan: unknown key(s) {unknown}; allowed: "
                         f"{sorted(_PLAN_KEYS)}")
    missing = sorted(key for key in _PLAN_KEYS if key not in raw and key not in _PLAN_OPTIONAL)
    if missing:
        raise ValueError(f"{where}: plan: missing key(s) {missing}")
    for key, value in raw.items():
        _check_value(where, f"plan.{key}", "int", value)
        if value < _PLAN_KEYS[key]:
            raise ValueError(f"{where}: plan.{key} must be >= {_PLAN_KEYS[key]}; got {value}")
    return PlanSpec(**raw)


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
    plan = None
    if op_name in OP_NAMES:
        if "plan" in raw and "pos_to_expert" in raw:
            raise ValueError(f"{where}: pos_to_expert and plan exclude each other: a plan "
                             "workload's X is derived from its plan; leave pos_to_expert out")
        if "plan" not in raw and "pos_to_expert" not in raw:
            raise ValueError(f"{where}: missing key(s) ['pos_to_expert'] (or a plan to "
                             "derive X from)")
        if "plan" in raw:
            plan = _parse_plan(where, raw["plan"])
            if raw["token_topk_to_pos"][1] < 1:
                raise ValueError(f"{where}: a plan workload needs K >= 1 slots a token; "
                                 f"token_topk_to_pos is {raw['token_topk_to_pos']}")
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
        plan=plan,
    )


def parse_manifest(data: Any) -> dict[str, list[Workload]]:
    """The workloads of every op, from the manifest's YAML as loaded.

    ``data`` must map each op of :data:`ALL_OP_NAMES` (no other) to
    ``{workloads: [entry, ...]}``; an entry has exactly its op's keys (see
    ``workloads.yaml``), an expand entry ``pos_to_expert`` or a ``plan``
    (``{num_experts, alignment, seed}`` ints and, optionally, ``ep_ranks``),
    not both. Labels are unique across ops (the CLI selects by label).
    Raises TypeError for a value of the wrong type, ValueError for an unknown
    or missing key, a dtype the op does not take, a bad size, a bad plan or a
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
    # libyaml's loader where PyYAML has it: the pure-Python one takes ~10 ms
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return parse_manifest(yaml.load(text, Loader=loader))  # a safe loader, either way


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
    ``num_expanded=``: its outputs' sizes are not input shapes). The expand
    ops take ``used_tokens=`` (default T), the tokens whose rows are read.
    """
    _require_op(op_name, ROOFLINES)
    return ROOFLINES[op_name](shapes, elem_bytes, **sizes)
