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
exact X (every expert's segment padded to a multiple of A); with ``trimmed:
false`` in the plan, at the X ``fused_mapping`` takes by default without a
host sync instead (the tight worst case of T*K slots, the rows past the last
segment padding). X is then derived (:attr:`Workload.num_expanded`), and the
entry must not state ``pos_to_expert``.

The newer ops state sizes rather than input shapes where their rows come from
a plan. ``reduce_fused`` and ``swiglu_quantize_fp8`` run on the X rows of a
real plan (``plan:`` required, as above; alignment 1 packs the T*K slots
into exactly X = T*K rows): an entry states ``tokens`` (T), ``top_k`` (K) and
``hidden`` (H, reduce) or ``intermediate`` (I, SwiGLU: ``h [X, 2I]``), and
which optional inputs are passed (``topk_weights``, ``row_scale``,
``pos_to_expert``: true or false). ``quantize_fp8`` states ``x: [T, H]``.
The fp8 producers state their scale factors' layout by the op's own keywords
(``num_per_channels`` 32 or 128, ``round_sf``, ``packed_ue8m0``,
``use_tma_aligned_col_major_sf``). :class:`Workload` derives the shapes of
every input the op is called with.
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
from cupy_moe.runtime.sizes import align_up, ceil_div

from .rooflines import ROOFLINES, SplitBytes, expand_split_bytes

__all__ = ["ALL_OP_NAMES", "COMBINE_OP_NAMES", "MAPPING_OP_NAMES", "OP_NAMES",
           "QUANTIZE_OP_NAMES", "PlanSpec", "Workload", "load_workloads", "parse_manifest",
           "roofline_bytes"]

# The expand ops: x [T, H] scattered to [X, H] rows. benchmarks/* iterate
# these and read x's shape, so the routing-plan op is not among them.
OP_NAMES = ("expand_to_fused", "expand_to_fused_with_sf")
# The routing-plan op: topk_ids [T, K] in, the plan's seven int32 arrays out.
MAPPING_OP_NAMES = ("fused_mapping",)
# The combine: expanded [X, H] rows of a plan reduced to [T, H] tokens.
COMBINE_OP_NAMES = ("reduce_fused",)
# The fp8 producers: x [T, H] (or SwiGLU of a plan's h [X, 2I] rows) cast to
# e4m3 bytes and per-block scale factors.
QUANTIZE_OP_NAMES = ("quantize_fp8", "swiglu_quantize_fp8")
# Every op of the manifest, in manifest order (what ``cupy-moe bench`` runs).
ALL_OP_NAMES = OP_NAMES + MAPPING_OP_NAMES + COMBINE_OP_NAMES + QUANTIZE_OP_NAMES
# the ops whose rows are a plan's (``plan:`` required, X derived)
_PLAN_ROW_OPS = ("reduce_fused", "swiglu_quantize_fp8")

_ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1,
               "int8": 1, "int32": 4, "int64": 8}
_EXPAND_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "uint8", "int8")
_SF_DTYPES = ("float32", "int32")
_INPUT_NAMES = ("x", "x_sf", "token_topk_to_pos", "pos_to_expert", "topk_ids")
# the fp8 producers' scale-factor blocks
_QUANT_BLOCKS = (32, 128)

# The keys of a workload entry, by op: key -> what its value must be. A shape
# is a list of non-negative ints of the given rank.
_SHAPE = {"x": 2, "x_sf": 2, "token_topk_to_pos": 2, "pos_to_expert": 1, "topk_ids": 2}
_EXPAND_KEYS = {"label": "str", "x": "shape", "token_topk_to_pos": "shape",
                "pos_to_expert": "shape", "plan": "plan", "dtype": "str"}
# the fp8 producers' keywords, as the ops name them
_QUANT_KEYS = {"num_per_channels": "int", "round_sf": "bool", "packed_ue8m0": "bool",
               "use_tma_aligned_col_major_sf": "bool"}
_PLAN_ROW_KEYS = {"label": "str", "tokens": "int", "top_k": "int", "plan": "plan",
                  "topk_weights": "bool", "dtype": "str"}
_KEYS: dict[str, dict[str, str]] = {
    "expand_to_fused": _EXPAND_KEYS,
    "expand_to_fused_with_sf": {**_EXPAND_KEYS, "x_sf": "shape", "sf_dtype": "str",
                                "num_per_channels": "int",
                                "use_tma_aligned_col_major_sf": "bool"},
    "fused_mapping": {"label": "str", "topk_ids": "shape", "num_experts": "int",
                      "alignment": "int", "dtype": "str"},
    "reduce_fused": {**_PLAN_ROW_KEYS, "hidden": "int", "row_scale": "bool"},
    "quantize_fp8": {"label": "str", "x": "shape", **_QUANT_KEYS, "dtype": "str"},
    "swiglu_quantize_fp8": {**_PLAN_ROW_KEYS, "intermediate": "int", "pos_to_expert": "bool",
                            **_QUANT_KEYS, "zero_padding": "bool", "token_topk_to_pos": "bool"},
}
# keys that may be left out (their default in Workload applies: false for the
# flags but zero_padding, true as in the ops); an expand entry has exactly one
# of pos_to_expert and plan (checked on its own)
_QUANT_OPTIONAL = {"round_sf", "packed_ue8m0", "use_tma_aligned_col_major_sf"}
_OPTIONAL = {
    "expand_to_fused": {"pos_to_expert", "plan"},
    "expand_to_fused_with_sf": {"use_tma_aligned_col_major_sf", "pos_to_expert", "plan"},
    "fused_mapping": set(),
    "reduce_fused": {"topk_weights", "row_scale"},
    "quantize_fp8": _QUANT_OPTIONAL,
    "swiglu_quantize_fp8": ({"topk_weights", "pos_to_expert", "zero_padding", "token_topk_to_pos"}
                            | _QUANT_OPTIONAL),
}
# the int keys of an entry's plan: key -> least value; ep_ranks may be left
# out (1: every expert is local); and one bool, trimmed (true if left out: X
# the plan's exact rows, else fused_mapping's default, the worst case)
_PLAN_KEYS = {"num_experts": 1, "alignment": 1, "ep_ranks": 1, "seed": 0, "trimmed": None}
_PLAN_BOOL_KEYS = {"trimmed"}
_PLAN_OPTIONAL = {"ep_ranks", "trimmed"}
_DTYPES = {("expand_to_fused", "dtype"): _EXPAND_DTYPES,
           ("expand_to_fused_with_sf", "dtype"): _EXPAND_DTYPES,
           ("expand_to_fused_with_sf", "sf_dtype"): _SF_DTYPES,
           ("fused_mapping", "dtype"): TOPK_ID_DTYPES,
           ("reduce_fused", "dtype"): ("bfloat16", "float16", "float32"),
           ("quantize_fp8", "dtype"): ("bfloat16", "float32"),
           ("swiglu_quantize_fp8", "dtype"): ("bfloat16", "float32")}
# int keys that must be >= 1 (tokens may be 0: an idle expert-parallel rank)
_POSITIVE = ("num_per_channels", "num_experts", "alignment", "top_k", "hidden", "intermediate")


class ReadOnlyShapes(dict):
    """A workload's shapes: a dict that refuses changes (the manifest's
    workloads are shared by every ``load_workloads`` call), and pickles and
    copies as itself."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a workload's shapes are read-only (make another Workload, e.g. "
                        "with dataclasses.replace)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __reduce__(self) -> tuple:
        return (type(self), (dict(self),))


@dataclass(frozen=True)
class PlanSpec:
    """The real routing plan of a workload (its ``plan:`` entry): of an expand
    workload, or the rows of ``reduce_fused`` and ``swiglu_quantize_fp8``.

    ``num_experts`` (E) local experts of ``ep_ranks`` (R) ranks' E*R; the
    ids are :meth:`topk_ids`, the plan ``fused_mapping_numpy(ids, E,
    alignment=alignment)`` at its exact X (ids >= E are other ranks'
    experts: dropped), or with ``trimmed`` false at ``worst_case_rows(T*K,
    E, alignment)``, the X ``fused_mapping`` takes by default.
    """

    num_experts: int
    alignment: int
    seed: int
    ep_ranks: int = 1
    trimmed: bool = True

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
        """``(X, routed_rows, used_tokens)`` of the plan: its rows (exact, or
        the worst case where not ``trimmed``), the rows that hold a slot
        (slots of local experts) and the tokens with at least one such slot.
        Cached: the manifest needs them when it loads."""
        num_expanded, routed, used = _plan_sizes(num_tokens, top_k, self.num_experts,
                                                 self.ep_ranks, self.alignment, self.seed)
        if not self.trimmed:
            num_expanded = worst_case_rows(num_tokens * top_k, self.num_experts, self.alignment)
        return num_expanded, routed, used


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

    The newer ops. ``reduce_fused``: ``expanded [X, H]`` (``dtype``),
    ``token_topk_to_pos [T, K]`` and, where the call passes them,
    ``topk_weights [T, K]`` and ``row_scale [X]``. ``quantize_fp8``: ``x [T,
    H]``. ``swiglu_quantize_fp8``: ``h [X, 2I]`` and, where passed,
    ``topk_weights [T, K]`` (with ``pos_to_token_topk [X]``),
    ``pos_to_expert [X]`` and ``token_topk_to_pos [T, K]`` (the plan's hint;
    only with ``zero_padding`` False, where the call leaves padding rows
    unwritten); its :attr:`hidden` is I, the width it quantizes.
    Both plan-row ops need a ``plan`` whose exact X every ``[X, ...]`` shape
    must have; ``tokens_topk`` (T, K) states the plan's slots where no input
    shows them (an unweighted SwiGLU; the parser always gives it). The fp8
    producers take ``num_per_channels``, ``round_sf``, ``packed_ue8m0`` and
    ``use_tma_aligned_col_major_sf`` as the ops do; their ``sf_dtype`` (of
    the SF output) is derived: ``int32`` where packed, else ``float32``; S is
    :attr:`sf_columns`. ``top_k`` and ``num_expanded`` of ``quantize_fp8``
    are None.
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
    round_sf: bool = False
    packed_ue8m0: bool = False
    tokens_topk: tuple[int, int] | None = None
    zero_padding: bool = True

    # T, H, K, X: read off the shapes (not arguments). fused_mapping has no H
    # (None); its X is the rows of the plan the op sizes by default, the
    # tight worst case of T * K slots over E experts at alignment A.
    num_tokens: int = field(init=False, compare=False)
    hidden: int | None = field(init=False, compare=False)
    top_k: int | None = field(init=False, compare=False)
    num_expanded: int | None = field(init=False, compare=False)
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
        elif self.op == "quantize_fp8":
            num_tokens, hidden = self.shapes["x"]
            sizes.update(num_tokens=num_tokens, hidden=hidden, top_k=None, num_expanded=None)
        elif self.op in _PLAN_ROW_OPS:
            sizes.update(self._plan_row_sizes())
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
        if self.op in QUANTIZE_OP_NAMES:
            sizes["sf_dtype"] = "int32" if self.packed_ue8m0 else "float32"
        for name, value in sizes.items():
            object.__setattr__(self, name, value)  # frozen: set once, here
        # read-only too: the manifest's workloads are shared by every
        # load_workloads call, and the sizes above were read off these shapes
        object.__setattr__(self, "shapes", ReadOnlyShapes(self.shapes))

    def _plan_row_sizes(self) -> dict[str, Any]:
        """T, H (I for SwiGLU), K, X, R, U of a plan-row op; ValueError where a
        shape disagrees with the plan or with (T, K)."""
        if self.plan is None:
            raise ValueError(f"{self.label}: {self.op} runs on a plan's rows; give its plan")
        shapes = self.shapes
        if self.op == "reduce_fused":
            rows_name = "expanded"
            num_tokens, top_k = shapes["token_topk_to_pos"]
            hidden = shapes["expanded"][1]
        else:
            rows_name = "h"
            width = shapes["h"][1]
            if width % 2:
                raise ValueError(f"{self.label}: h {list(shapes['h'])} must be [X, 2I]: an even "
                                 "width (gate and up halves)")
            hidden = width // 2
            stated = self.tokens_topk or shapes.get("topk_weights")
            if stated is None:
                raise ValueError(f"{self.label}: give tokens_topk (T, K): no input of an "
                                 "unweighted SwiGLU shows the plan's slots")
            num_tokens, top_k = stated
        if self.tokens_topk is not None and tuple(self.tokens_topk) != (num_tokens, top_k):
            raise ValueError(f"{self.label}: tokens_topk {tuple(self.tokens_topk)} is not "
                             f"({num_tokens}, {top_k}) of the inputs")
        for name in ("topk_weights", "token_topk_to_pos"):
            if name in shapes and tuple(shapes[name]) != (num_tokens, top_k):
                raise ValueError(f"{self.label}: {name} {list(shapes[name])} is not "
                                 f"[T, K] = [{num_tokens}, {top_k}]")
        num_expanded, routed, used = self.plan.sizes(num_tokens, top_k)
        for name in (rows_name, "row_scale", "pos_to_token_topk", "pos_to_expert"):
            if name in shapes and shapes[name][0] != num_expanded:
                raise ValueError(f"{self.label}: {name} {list(shapes[name])} does not have the "
                                 f"plan's {num_expanded} rows")
        return {"num_tokens": num_tokens, "hidden": hidden, "top_k": top_k,
                "num_expanded": num_expanded, "routed_rows": routed, "used_tokens": used}

    @property
    def sf_columns(self) -> int | None:
        """S: the columns of ``x_sf`` (an input of the SF expand op) or of the
        fp8 producers' SF output (``ceil(H / npc)`` floats, or that many
        exponent bytes packed four to an int32 word); None for other ops."""
        if "x_sf" in self.shapes:
            return self.shapes["x_sf"][1]
        if self.op in QUANTIZE_OP_NAMES:
            blocks = ceil_div(self.hidden, self.num_per_channels)
            return ceil_div(blocks, 4) if self.packed_ue8m0 else blocks
        return None

    @property
    def elem_bytes(self) -> int:
        """Item size of ``dtype``: of ``x`` (expand ops, ``quantize_fp8``), of
        ``topk_ids`` (``fused_mapping``), of ``expanded`` (``reduce_fused``) or
        of ``h`` (``swiglu_quantize_fp8``)."""
        return _ITEM_BYTES[self.dtype]

    @property
    def bytes(self) -> int:
        """Roofline bytes of one call (inputs read once, outputs written once;
        a plan workload reads only its used tokens' rows of ``x``; see
        :mod:`.rooflines` for each op)."""
        if self.op in MAPPING_OP_NAMES:
            return roofline_bytes(self.op, self.shapes, self.elem_bytes,
                                  num_experts=self.num_experts,
                                  num_expanded=self.num_expanded)
        if self.op == "reduce_fused":
            return roofline_bytes(self.op, self.shapes, self.elem_bytes,
                                  routed_rows=self.routed_rows)
        if self.op == "quantize_fp8":
            return roofline_bytes(self.op, self.shapes, self.elem_bytes,
                                  sf_columns=self.sf_columns)
        if self.op == "swiglu_quantize_fp8":
            return roofline_bytes(self.op, self.shapes, self.elem_bytes,
                                  routed_rows=self.routed_rows, sf_columns=self.sf_columns,
                                  zero_padding=self.zero_padding)
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
        if self.op not in OP_NAMES:
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
    below its least (num_experts, alignment, ep_ranks >= 1; seed >= 0;
    trimmed true or false)."""
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
        if key in _PLAN_BOOL_KEYS:
            _check_value(where, f"plan.{key}", "bool", value)
            continue
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
    missing = sorted(key for key in allowed
                     if key not in raw and key not in _OPTIONAL[op_name])
    if missing:
        raise ValueError(f"{where}: missing key(s) {missing}")
    for key, value in raw.items():
        _check_value(where, key, allowed[key], value)
        names = _DTYPES.get((op_name, key))
        if names is not None and value not in names:
            raise ValueError(f"{where}: {key} must be one of {list(names)}; got {value!r}")
        if key in _POSITIVE and value < 1:
            raise ValueError(f"{where}: {key} must be >= 1; got {value}")
        if key == "tokens" and value < 0:
            raise ValueError(f"{where}: tokens must be >= 0; got {value}")
    if op_name in QUANTIZE_OP_NAMES:
        _check_scale_factors(where, raw)
    if op_name in _PLAN_ROW_OPS:
        return _parse_plan_rows(op_name, where, raw)
    if op_name == "quantize_fp8":
        return Workload(op=op_name, label=raw["label"], shapes={"x": tuple(raw["x"])},
                        dtype=raw["dtype"], num_per_channels=raw["num_per_channels"],
                        use_tma_aligned_col_major_sf=raw.get("use_tma_aligned_col_major_sf",
                                                             False),
                        round_sf=raw.get("round_sf", False),
                        packed_ue8m0=raw.get("packed_ue8m0", False))
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


def _check_scale_factors(where: str, raw: Mapping[str, Any]) -> None:
    """ValueError unless an fp8 producer's SF keywords are ones the ops take:
    blocks of 32 or 128, and packed UE8M0 only with round_sf (exponents of
    powers of two) in the TMA-aligned column-major layout."""
    if raw["num_per_channels"] not in _QUANT_BLOCKS:
        raise ValueError(f"{where}: num_per_channels must be one of {list(_QUANT_BLOCKS)}; "
                         f"got {raw['num_per_channels']}")
    round_sf = raw.get("round_sf", False)
    col_major = raw.get("use_tma_aligned_col_major_sf", False)
    if raw.get("packed_ue8m0", False) and not (round_sf and col_major):
        raise ValueError(f"{where}: packed_ue8m0 needs round_sf and "
                         f"use_tma_aligned_col_major_sf; got round_sf={round_sf}, "
                         f"use_tma_aligned_col_major_sf={col_major}")


def _parse_plan_rows(op_name: str, where: str, raw: Mapping[str, Any]) -> Workload:
    """The workload of a ``reduce_fused`` or ``swiglu_quantize_fp8`` entry
    (keys checked): the shapes of the inputs it passes, X the plan's."""
    plan = _parse_plan(where, raw["plan"])
    num_tokens, top_k = raw["tokens"], raw["top_k"]
    num_expanded = plan.sizes(num_tokens, top_k)[0]
    weighted = raw.get("topk_weights", False)
    if op_name == "reduce_fused":
        shapes = {"expanded": (num_expanded, raw["hidden"]),
                  "token_topk_to_pos": (num_tokens, top_k)}
        if weighted:
            shapes["topk_weights"] = (num_tokens, top_k)
        if raw.get("row_scale", False):
            shapes["row_scale"] = (num_expanded,)
    else:
        shapes = {"h": (num_expanded, 2 * raw["intermediate"])}
        if weighted:  # a row's weight is topk_weights.flat[pos_to_token_topk[row]]
            shapes["topk_weights"] = (num_tokens, top_k)
            shapes["pos_to_token_topk"] = (num_expanded,)
        if raw.get("pos_to_expert", False):
            shapes["pos_to_expert"] = (num_expanded,)
        if raw.get("token_topk_to_pos", False):
            if not weighted or raw.get("zero_padding", True):
                raise ValueError(f"{where}: token_topk_to_pos needs topk_weights (it is the "
                                 "inverse of pos_to_token_topk) and zero_padding false (the "
                                 "only calls whose kernels read it)")
            shapes["token_topk_to_pos"] = (num_tokens, top_k)
    return Workload(op=op_name, label=raw["label"], shapes=shapes, dtype=raw["dtype"],
                    num_per_channels=raw.get("num_per_channels"),
                    use_tma_aligned_col_major_sf=raw.get("use_tma_aligned_col_major_sf", False),
                    plan=plan, round_sf=raw.get("round_sf", False),
                    packed_ue8m0=raw.get("packed_ue8m0", False),
                    tokens_topk=(num_tokens, top_k),
                    zero_padding=raw.get("zero_padding", True))


def parse_manifest(data: Any) -> dict[str, list[Workload]]:
    """The workloads of every op, from the manifest's YAML as loaded.

    ``data`` must map each op of :data:`ALL_OP_NAMES` (no other) to
    ``{workloads: [entry, ...]}``; an entry has exactly its op's keys (see
    ``workloads.yaml``), an expand entry ``pos_to_expert`` or a ``plan``
    (``{num_experts, alignment, seed}`` ints and, optionally, ``ep_ranks``),
    not both; a ``reduce_fused`` or ``swiglu_quantize_fp8`` entry a plan and
    its sizes (``tokens``, ``top_k``, ``hidden`` or ``intermediate``). Labels
    are unique across ops (the CLI selects by label). Raises TypeError for a
    value of the wrong type, ValueError for an unknown or missing key, a dtype
    the op does not take, a bad size, a bad plan, SF keywords the fp8
    producers do not take or a repeated label; the message names the op, the
    entry and its label.
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


def workload_from_entry(op_name: str, entry: Mapping[str, Any]) -> Workload:
    """One workload of ``op_name`` from an entry written as in
    ``workloads.yaml`` (a sweep's shapes beside the manifest's), under the
    same rules and errors as :func:`parse_manifest`."""
    _require_op(op_name, ALL_OP_NAMES)
    return _parse_workload(op_name, 0, entry)


def load_workloads(op_name: str) -> list[Workload]:
    """The manifest workloads of ``op_name``, in manifest order (KeyError,
    naming the known ops, for an op the manifest does not have)."""
    _require_op(op_name, ALL_OP_NAMES)
    return list(_manifest()[op_name])


def roofline_bytes(op_name: str, shapes: Mapping[str, tuple[int, ...]], elem_bytes: int,
                   **sizes: int) -> int:
    """Fewest bytes one call of ``op_name`` moves (see :mod:`.rooflines`).

    ``shapes`` maps input names to shapes, as in :attr:`Workload.shapes`;
    ``elem_bytes`` is the item size of ``x`` (of ``topk_ids`` for
    ``fused_mapping``, which also takes ``num_experts=`` and
    ``num_expanded=``: its outputs' sizes are not input shapes). The expand
    ops take ``used_tokens=`` (default T), the tokens whose rows are read;
    ``reduce_fused`` and ``swiglu_quantize_fp8`` ``routed_rows=`` (R, the
    rows holding a slot), the fp8 producers ``sf_columns=`` (S),
    ``swiglu_quantize_fp8`` also ``zero_padding=`` (default True).

    KeyError for an op the manifest does not have, ValueError for a shape
    ``shapes`` leaves out, TypeError for a size keyword the op needs and was
    not given (e.g. ``routed_rows=`` of ``reduce_fused``).
    """
    _require_op(op_name, ROOFLINES)
    try:
        return ROOFLINES[op_name](shapes, elem_bytes, **sizes)
    except KeyError as error:
        name = error.args[0] if error.args else None
        if not isinstance(name, str) or name in shapes:
            raise  # not a shape left out
        raise ValueError(f"roofline_bytes({op_name!r}): shapes has no {name!r} "
                         f"(given: {', '.join(shapes) or 'none'})") from None
