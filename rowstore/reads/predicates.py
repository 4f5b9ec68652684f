"""Query predicates: parsing and validation against a schema, and exact vectorized evaluation.

``where`` terms are ``[column, op, value]`` with op in ``= != < <= > >=``; a bounding
box names a ``point`` or ``box`` column and four inclusive edges (docs/REFERENCE.md §3).
The masks here are the exact semantics; the column index (``rowstore/index/column_index.py``)
only narrows candidates, and every candidate is re-checked with these masks, so
the index path and the scan path agree by construction (and by a property test).

Semantics per column type:

* numbers, timestamps, dates, strings, binary, uuid, bool: SQL comparison; a null
  value matches nothing (``!=`` included);
* ``range<…>``: the term holds when *some* value of the range satisfies it, i.e.
  the range overlaps the term's interval (``=`` is "contains"); ``!=`` is refused;
* ``point``: inside the box, edges inclusive; ``box``: overlaps the box, edges
  inclusive. Points and boxes take no ``where`` terms (use the bounding box).
"""
from __future__ import annotations

import base64
import datetime as dt
import math
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Iterable, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import QueryError
from rowstore.tables.key_check import Key, check_key, show
from rowstore.tables.keys import KeyRange, bounded_range
from rowstore.schema import Column, PrimaryKey, SchemaVersion
from rowstore.types import Kind

OPS = ("=", "!=", "<", "<=", ">", ">=")
_PC = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
       ">=": pc.greater_equal}
_INTS = {Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8, Kind.UINT16, Kind.UINT32, Kind.UINT64}
_FLOATS = {Kind.FLOAT32, Kind.FLOAT64}
NUMERIC = _INTS | _FLOATS | {Kind.TIMESTAMP, Kind.DATE}
_NP = {"=": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
       ">=": np.greater_equal}


@dataclass(frozen=True)
class Interval:
    """A query interval; ``None`` bounds are unbounded."""

    lo: float | None = None
    hi: float | None = None
    lo_inc: bool = True
    hi_inc: bool = True

    @classmethod
    def from_op(cls, op: str, v: float) -> "Interval":
        return {"=": cls(v, v), "<": cls(None, v, hi_inc=False), "<=": cls(None, v),
                ">": cls(v, None, lo_inc=False), ">=": cls(v, None)}[op]

    def overlaps(self, lo: np.ndarray, hi: np.ndarray) -> npt.NDArray[np.bool_]:
        """Which row intervals ``[lo, hi]`` intersect this one (vectorized, exact)."""
        ok = np.ones(len(lo), bool)
        if self.lo is not None:
            ok &= (hi >= self.lo) if self.lo_inc else (hi > self.lo)
        if self.hi is not None:
            ok &= (lo <= self.hi) if self.hi_inc else (lo < self.hi)
        return ok


@dataclass(frozen=True)
class Term:
    column: Column
    op: str
    value: int | float | str | bytes  # in the column's (or range element's) domain: ints, floats, bytes, str, bool

    def interval(self) -> Interval:
        """The term as a closed/open interval over the value domain (None bounds: unbounded)."""
        # cast: only terms on number, time and range columns have intervals; their values are numbers
        return Interval.from_op(self.op, cast(float, self.value))


@dataclass(frozen=True)
class Between(Term):
    """A lower-bound and an upper-bound term on one number or time column, as one interval
    (a time window): one column-index lookup instead of two half-table ones intersected."""

    upper: Term | None = None

    def interval(self) -> Interval:
        assert self.upper is not None  # fold_ranges makes every Between with its upper term
        a = Interval.from_op(self.op, cast(float, self.value))  # cast: as in Term.interval
        b = Interval.from_op(self.upper.op, cast(float, self.upper.value))
        return Interval(a.lo, b.hi, a.lo_inc, b.hi_inc)


def fold_ranges(preds: Iterable[Term | BBox]) -> list[Term | BBox]:
    """``preds`` with each column's (lower, upper) pair of terms as one :class:`Between` (only
    for plain number/time columns: for a range column two terms are two overlap tests)."""
    lows: dict[int, Term] = {}
    highs: dict[int, Term] = {}
    rest: list[Term | BBox] = []
    for p in preds:
        if isinstance(p, Term) and not isinstance(p, Between) and p.column.type.kind in NUMERIC \
                and p.op in (">", ">=") and p.column.id not in lows:
            lows[p.column.id] = p
        elif isinstance(p, Term) and not isinstance(p, Between) and p.column.type.kind in NUMERIC \
                and p.op in ("<", "<=") and p.column.id not in highs:
            highs[p.column.id] = p
        else:
            rest.append(p)
    for cid, lo in lows.items():
        hi = highs.pop(cid, None)
        rest.append(lo if hi is None else Between(lo.column, lo.op, lo.value, hi))
    return rest + list(highs.values())


def key_bounds(pk: PrimaryKey, terms: Iterable[Term]) -> tuple[list[Key], KeyRange[int] | KeyRange[bytes]]:
    """What ``where`` terms say of the key: the leading components ``=`` fixes, and the key
    range they and the next component's bounds allow (every row a read may keep is in it).
    A scan of that range reads only the keys the terms can match — and, when the fixed
    components cover the partition key, only their partition."""
    by_col: dict[int, list[Term]] = {}
    for t in terms:
        by_col.setdefault(t.column.id, []).append(t)
    equal: list[Key] = []
    for c in pk.columns:
        eq = [t for t in by_col.get(c.id, []) if t.op == "="]
        if not eq:
            break
        equal.append(cast(Key, eq[0].value))
    lower = upper = None
    if len(equal) < len(pk.columns):
        for t in by_col.get(pk.columns[len(equal)].id, []):
            v = cast(Key, t.value)
            if t.op in (">", ">=") and (lower is None or v > lower[0]):  # type: ignore[operator]
                lower = (v, t.op == ">=")
            elif t.op in ("<", "<=") and (upper is None or v < upper[0]):  # type: ignore[operator]
                upper = (v, t.op == "<=")
    return equal, bounded_range(pk, equal, lower, upper)


@dataclass(frozen=True)
class BBox:
    column: Column
    xmin: float
    ymin: float
    xmax: float
    ymax: float


# -- parsing ----------------------------------------------------------------------------


def parse_where(schema: SchemaVersion, where: object) -> list[Term]:
    if where is None:
        return []
    if not isinstance(where, (list, tuple)):
        raise QueryError("where must be a list of [column, op, value] terms")
    return [_term(schema, t) for t in where]


def _term(schema: SchemaVersion, t: object) -> Term:
    if not isinstance(t, (list, tuple)) or len(t) != 3:
        raise QueryError(f"where term {t!r}: expected [column, op, value]")
    name, op, value = t
    col = schema.by_name(name) if isinstance(name, str) else None
    if col is None:
        raise QueryError(f"where term {t!r}: no column {name!r}")
    if op not in OPS:
        raise QueryError(f"where term {t!r}: op must be one of {' '.join(OPS)}")
    k = col.type.kind
    if k in (Kind.POINT, Kind.BOX):
        raise QueryError(f"column {name!r} is a {k.value}: filter it with bbox, not where")
    if k == Kind.JSON:
        raise QueryError(f"column {name!r} is json: it cannot be compared")
    if k == Kind.RANGE and op == "!=":
        raise QueryError(f"column {name!r} is a range: != is not defined on ranges")
    if value is None:
        raise QueryError(f"where term {t!r}: comparing with null matches nothing; null is not a value")
    if col.id in schema.primary_key:  # a key term: the one key check (no wrapping, no other row)
        return Term(col, op, check_key(value, col, nul_ok=schema.pk.kind == "tuple"))
    elem = col.type.elem if k == Kind.RANGE else k
    assert elem is not None  # a range column's type has its element kind
    return Term(col, op, coerce(elem, value, name))


def coerce(kind: Kind, v: Any, name: str = "value") -> int | float | str | bytes:
    """A predicate value in the column's storage domain (timestamps as µs, dates as days). ``v``
    is a JSON value: a conversion's TypeError or ValueError answers a value of another type."""
    try:
        if kind in _INTS:
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise ValueError
            iv = int(v)
            if not -(2**63) <= iv < 2**64:
                raise ValueError
            return iv
        if kind in _FLOATS:
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise ValueError
            f = float(v)
            if math.isnan(f):
                raise ValueError  # NaN compares false with everything; refuse rather than surprise
            return f
        if kind == Kind.BOOL:
            if isinstance(v, str) and v.lower() in ("true", "false"):
                return v.lower() == "true"
            if not isinstance(v, bool):
                raise ValueError
            return v
        if kind == Kind.STRING:
            if not isinstance(v, str):
                raise ValueError
            v.encode()  # a lone surrogate is not text (UnicodeEncodeError is a ValueError)
            return v
        if kind == Kind.BINARY:
            return bytes(v) if isinstance(v, (bytes, bytearray)) else base64.b64decode(v, validate=True)
        if kind == Kind.UUID:
            if isinstance(v, (bytes, bytearray)) and len(v) == 16:
                return bytes(v)
            if not isinstance(v, str):
                raise ValueError
            return uuidlib.UUID(v).bytes
        if kind == Kind.TIMESTAMP:
            return timestamp_us(v)
        if kind == Kind.DATE:
            if isinstance(v, int) and not isinstance(v, bool):
                return v
            return (dt.date.fromisoformat(v) - dt.date(1970, 1, 1)).days
    except (ValueError, TypeError, OverflowError, pa.ArrowInvalid) as e:
        raise QueryError(f"{name}: {show(v)} is not a valid {kind.value}") from e
    raise QueryError(f"{name}: {kind.value} values cannot be compared")


def timestamp_us(v: object) -> int:
    """Integer microseconds, or an ISO-8601 string (``Z`` or an offset; naive means UTC)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if not isinstance(v, str):
        raise ValueError("timestamp")
    t = dt.datetime.fromisoformat(v.replace("Z", "+00:00") if v.endswith("Z") else v)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    delta = t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _arrow_of(kind: Kind) -> pa.DataType:
    from rowstore.types import ColumnType

    return ColumnType(kind).arrow()


def parse_bbox(schema: SchemaVersion, bbox: object) -> BBox | None:
    if bbox is None:
        return None
    if not isinstance(bbox, dict):
        raise QueryError("bbox must be an object {column, xmin, ymin, xmax, ymax}")
    extra = set(bbox) - {"column", "xmin", "ymin", "xmax", "ymax"}
    if extra:
        raise QueryError(f"bbox: unknown field(s) {', '.join(sorted(extra))}")
    name = bbox.get("column")
    col = schema.by_name(name) if isinstance(name, str) else None
    if col is None:
        raise QueryError(f"bbox: no column {name!r}")
    if col.type.kind not in (Kind.POINT, Kind.BOX):
        raise QueryError(f"bbox: column {name!r} is {col.type}, not point or box")
    edges = []
    for f in ("xmin", "ymin", "xmax", "ymax"):
        v = bbox.get(f)
        try:
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v))
        except OverflowError:  # an integer beyond any float
            ok = False
        if not ok:
            raise QueryError(f"bbox: {f} must be a finite number, not {repr(v)[:60]}")
        edges.append(float(cast(float, v)))  # cast: ok says v is an int or a float
    if edges[0] > edges[2] or edges[1] > edges[3]:
        raise QueryError("bbox: xmin must be <= xmax and ymin <= ymax")
    return BBox(col, *edges)


# -- exact evaluation ------------------------------------------------------------------


def term_mask(arr: pa.Array, term: Term) -> npt.NDArray[np.bool_]:
    """Exact: which values satisfy ``term`` (nulls never do)."""
    if isinstance(term, Between):
        assert term.upper is not None  # fold_ranges makes every Between with its upper term
        return term_mask(arr, Term(term.column, term.op, term.value)) & term_mask(arr, term.upper)
    k = term.column.type.kind
    if k == Kind.RANGE:
        return _range_mask(arr, term)
    if k in NUMERIC:  # numpy compares with Python ints of any size exactly; floats in float64
        hit: npt.NDArray[np.bool_] = _NP[term.op](numeric_values(arr, k), term.value)
        return hit & ~_nulls(arr)
    return _bools(_PC[term.op](_comparable(arr, k), _scalar(k, term.value)))


def numeric_values(arr: pa.Array, k: Kind) -> np.ndarray:
    """The comparison domain of a numeric column (index and scan share it): integers as they
    are, floats as float64, timestamps as int64 µs, dates as int32 days; nulls as 0."""
    if k == Kind.TIMESTAMP:
        arr = arr.cast(pa.int64())
    elif k == Kind.DATE:
        arr = arr.cast(pa.int32())
    v = _np(arr)
    return v.astype(np.float64, copy=False) if k in _FLOATS else v


def bbox_mask(arr: pa.Array, box: BBox) -> npt.NDArray[np.bool_]:
    if box.column.type.kind == Kind.POINT:
        x, y = _f64(arr, "x"), _f64(arr, "y")
        m = (x >= box.xmin) & (x <= box.xmax) & (y >= box.ymin) & (y <= box.ymax)
    else:
        m = ((_f64(arr, "xmin") <= box.xmax) & (_f64(arr, "xmax") >= box.xmin)
             & (_f64(arr, "ymin") <= box.ymax) & (_f64(arr, "ymax") >= box.ymin))
    return m & ~_nulls(arr)


def batch_mask(batch: pa.RecordBatch, terms: list[Term], bbox: BBox | None) -> npt.NDArray[np.bool_]:
    """Rows of ``batch`` (columns by name, as in the schema the terms were parsed with)."""
    m = np.ones(batch.num_rows, bool)
    for t in terms:
        m &= term_mask(batch.column(batch.schema.get_field_index(t.column.name)), t)
    if bbox is not None:
        m &= bbox_mask(batch.column(batch.schema.get_field_index(bbox.column.name)), bbox)
    return m


def _comparable(arr: pa.Array, k: Kind) -> pa.Array:
    return arr.cast(pa.binary()) if k == Kind.UUID else arr


def _scalar(k: Kind, v: object) -> pa.Scalar:
    return pa.scalar(v, pa.binary()) if k == Kind.UUID else pa.scalar(v, _arrow_of(k))


def _range_mask(arr: pa.StructArray, term: Term) -> npt.NDArray[np.bool_]:
    """Overlap of each stored range (flags honoured, null bound = unbounded) with the term."""
    q = term.interval()
    lo, hi = arr.field("lower"), arr.field("upper")
    if term.column.type.elem == Kind.TIMESTAMP:
        lo, hi = lo.cast(pa.int64()), hi.cast(pa.int64())
    lo_unb, hi_unb = _nulls(lo), _nulls(hi)
    lov, hiv = _np(lo), _np(hi)
    lo_inc, hi_inc = _bools(arr.field("lower_inclusive")), _bools(arr.field("upper_inclusive"))
    ok = ~_nulls(arr)
    if q.lo is not None:  # the range's upper end reaches the query's lower end
        reach = (hiv > q.lo) | ((hiv == q.lo) & hi_inc & q.lo_inc)
        ok &= hi_unb | reach
    if q.hi is not None:
        reach = (lov < q.hi) | ((lov == q.hi) & lo_inc & q.hi_inc)
        ok &= lo_unb | reach
    return ok


def _np(arr: pa.Array) -> np.ndarray:
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(0, arr.type))
    out: np.ndarray = arr.to_numpy(zero_copy_only=False)
    return out


def _f64(arr: pa.StructArray, name: str) -> np.ndarray:
    a = arr.field(name)
    if a.null_count:
        return _np(a)
    out: np.ndarray = a.to_numpy(zero_copy_only=False)
    return out


def _nulls(arr: pa.Array) -> npt.NDArray[np.bool_]:
    if arr.null_count == 0:
        return np.zeros(len(arr), bool)
    out: npt.NDArray[np.bool_] = arr.is_null().to_numpy(zero_copy_only=False)
    return out


def _bools(arr: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        arr = pc.fill_null(arr, False)
    out: npt.NDArray[np.bool_] = arr.to_numpy(zero_copy_only=False).astype(bool, copy=False)
    return out
