"""What an indexed column's runs are made of, shared by both run versions
(docs/format/column-run.md): which structure indexes a column type (its ``kind``), and each
entry's key domain — the numbers, bounds and keys the structures (version 1) and the page
summaries (version 2) compare predicates with."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from rowstore.errors import SchemaError
from rowstore.reads.predicates import BBox, NUMERIC, Term
from rowstore.schema import Column
from rowstore.types import Kind

FORMAT = b"column-run"  # the runs' ``terrascale.format`` (part of the format)
_VALUE_KINDS = {Kind.STRING, Kind.BINARY, Kind.UUID, Kind.BOOL}
_I64 = np.iinfo(np.int64)

Pred = Term | BBox


def index_kind(col: Column) -> str:
    """Which structure indexes this column (docs/format/column-run.md)."""
    k = col.type.kind
    if k == Kind.POINT:
        return "grid"
    if k == Kind.BOX:
        return "box"
    if k == Kind.RANGE:
        return "range"
    if k in NUMERIC:
        return "axis"
    if k in _VALUE_KINDS:
        return "value"
    raise SchemaError(f"column {col.name!r} of type {col.type} cannot be indexed")


def _f(values: pa.StructArray, name: str) -> np.ndarray:
    out: np.ndarray = values.field(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    return out


def _range_bounds(values: pa.StructArray, elem: Kind) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = values.field("lower"), values.field("upper")
    if elem == Kind.FLOAT64:
        lov = lo.to_numpy(zero_copy_only=False).astype(np.float64)
        hiv = hi.to_numpy(zero_copy_only=False).astype(np.float64)
        lov[np.isnan(lov)] = -np.inf  # unbounded (null) or NaN: index as open, the refine decides
        hiv[np.isnan(hiv)] = np.inf
        return lov, hiv
    lo, hi = lo.cast(pa.int64()), hi.cast(pa.int64())
    lov = np.where(_isnull(lo), _I64.min, lo.fill_null(0).to_numpy(zero_copy_only=False))
    hiv = np.where(_isnull(hi), _I64.max, hi.fill_null(0).to_numpy(zero_copy_only=False))
    return lov.astype(np.int64), hiv.astype(np.int64)


def _isnull(arr: pa.Array) -> np.ndarray:
    return arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else np.zeros(len(arr), bool)


def _value_keys(values: pa.Array, k: Kind) -> np.ndarray | pa.Array:
    """What ``ValueIndex`` keys by: Python bools, str for strings, bytes for binary and uuid."""
    if k == Kind.BOOL:
        return values.to_numpy(zero_copy_only=False).astype(bool)
    return values if k == Kind.STRING else values.cast(pa.binary())


def _value_key(v: object, k: Kind) -> object:
    return bool(v) if k == Kind.BOOL else v
