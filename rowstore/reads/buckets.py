"""Bucketed group keys of an aggregate (docs/rfcs/0016-time-series-aggregates.md): a
``group_by`` entry ``{"bucket": col, "width": w}`` groups by each value's bucket, named by its
lower edge. Time buckets (timestamp, date) take a duration in the configuration's grammar and
an optional ``origin`` (default the Unix epoch); numeric buckets are ``[k·w, (k+1)·w)``.

Edges are computed in the column's storage domain (µs, days, integers) without leaving it: the
remainder of the value and of the origin are taken apart, so no subtraction can wrap.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rowstore.errors import QueryError
from rowstore.reads.predicates import coerce
from rowstore.schema import Column
from rowstore.types import TS, Kind

DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")  # node/config.py parses durations with this
DURATION_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_US = {"ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}
_DAY_US = 86_400_000_000
_SIGNED = {Kind.INT8: 8, Kind.INT16: 16, Kind.INT32: 32, Kind.INT64: 64}
_UNSIGNED = {Kind.UINT8: 8, Kind.UINT16: 16, Kind.UINT32: 32, Kind.UINT64: 64}
_FLOAT_MAX = {Kind.FLOAT32: float(np.finfo(np.float32).max), Kind.FLOAT64: float(np.finfo(np.float64).max)}
_I64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Bucket:
    """How a column's values become bucket edges: ``width`` and ``origin`` in the column's
    storage domain (µs, days, or the number itself)."""
    width: int | float
    origin: int = 0


@dataclass(frozen=True)
class GroupKey:
    """One ``group_by`` entry: a column's values, or their buckets; ``name`` is its answer column's."""
    column: Column
    bucket: Bucket | None = None
    name: str = ""

    def field(self) -> pa.Field:
        if self.bucket is None:
            return self.column.field().with_name(self.name)
        return pa.field(self.name, edge_type(self.column, self.bucket))


def duration_us(text: object) -> int | None:
    """A duration (``5m``, ``1h``, ``7d``: the configuration's grammar) in µs; None if not one."""
    m = DURATION.match(text) if isinstance(text, str) else None
    return int(m.group(1)) * _US[m.group(2)] if m else None


def parse_bucket(col: Column, entry: dict[str, object]) -> Bucket:
    """``entry``'s width (and origin) for ``col``, checked: a 400 for a width that is zero,
    negative, not a number or duration, or beyond the column's range; a column that is neither
    numeric nor a time."""
    k, w = col.type.kind, entry.get("width")
    what = f"bucket of column {col.name!r}"
    if k in (Kind.TIMESTAMP, Kind.DATE):
        us = duration_us(w)
        if us is None or us <= 0:
            raise QueryError(f'{what}: "width" must be a positive duration like 5m, 1h or 7d, not {str(w)[:40]!r}')
        if us > _I64_MAX:
            raise QueryError(f"{what}: width {w!r} is beyond the range of a timestamp")
        origin = 0 if entry.get("origin") is None else coerce(k, entry["origin"], f"{what}: origin")
        assert isinstance(origin, int)  # a time's storage domain is integers
        if k == Kind.DATE:
            if us % _DAY_US:
                raise QueryError(f"{what}: a date's width is whole days, not {w!r}")
            if us // _DAY_US > 2**31 - 1 or not -(2**31) <= origin < 2**31:
                raise QueryError(f"{what}: width or origin beyond the range of a date")
            return Bucket(us // _DAY_US, origin)
        if not -(2**63) <= origin <= _I64_MAX:
            raise QueryError(f"{what}: origin beyond the range of a timestamp")
        return Bucket(us, origin)
    if "origin" in entry:
        raise QueryError(f"{what}: only a timestamp or date bucket has an origin")
    if isinstance(w, bool) or not isinstance(w, (int, float)):
        raise QueryError(f'{what}: "width" must be a positive number, not {str(w)[:40]!r}')
    if k in _SIGNED or k in _UNSIGNED:
        top = 2 ** (_SIGNED[k] - 1) - 1 if k in _SIGNED else 2 ** _UNSIGNED[k] - 1
        if not 0 < w <= top or not math.isfinite(w):
            raise QueryError(f"{what}: width {w!r} must be above zero and at most {top} ({col.type})")
        return Bucket(w)
    if k in _FLOAT_MAX:
        if not 0 < w <= _FLOAT_MAX[k] or not math.isfinite(w):
            raise QueryError(f"{what}: width {w!r} must be a finite number above zero, at most {col.type}'s largest")
        return Bucket(float(w))
    raise QueryError(f"{what}: it is {col.type}; a bucket is of a number, a timestamp or a date")


def edge_type(col: Column, b: Bucket) -> pa.DataType:
    """The answer's type of a bucket's edges: the time's type, int64/uint64 for integer widths
    of integers (an edge may lie below a narrow type's least value), float64 otherwise."""
    k = col.type.kind
    if k == Kind.TIMESTAMP:
        return TS
    if k == Kind.DATE:
        return pa.date32()
    if isinstance(b.width, float) or k in _FLOAT_MAX:
        return pa.float64()
    return pa.uint64() if k in _UNSIGNED else pa.int64()


def edges(values: pa.Array | pa.ChunkedArray, col: Column, b: Bucket) -> pa.Array:
    """Each value's bucket, as its lower edge (null stays null), vectorized."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    typ, k = edge_type(col, b), col.type.kind
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_floating(typ):
        v = values.cast(pa.float64()).fill_null(0).to_numpy()
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.floor(v / b.width) * b.width
        return pa.array(e, typ, mask=~valid)
    if typ == pa.uint64():
        u = values.cast(pa.uint64()).fill_null(0).to_numpy()
        return pa.array(u - u % np.uint64(b.width), typ, mask=~valid)
    dom = pa.int64() if k != Kind.DATE else pa.int32()
    v = values.cast(dom).cast(pa.int64()).fill_null(0).to_numpy()
    w = np.int64(b.width)
    r = (v % w - np.int64(b.origin % b.width)) % w  # (v - origin) mod w, without forming v - origin
    low = v < np.iinfo(np.int64).min + r
    if (low & valid).any():
        raise QueryError(f"bucket of column {col.name!r}: a value's bucket starts below the range of {typ}")
    e = pa.array(v - r, pa.int64(), mask=~valid)
    return e.cast(pa.int32()).cast(typ) if k == Kind.DATE else e.cast(typ)
