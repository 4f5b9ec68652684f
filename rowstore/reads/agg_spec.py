"""An aggregate request checked against a schema (docs/rfcs/0012-aggregates.md): its group keys
(columns or buckets), its aggregates with their columns, ranks and ``by`` columns, and the NaN
order of ``max``; the columns an engine reads for it, by the names :func:`cname` gives them."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from rowstore.errors import QueryError
from rowstore.reads.buckets import GroupKey, edges, parse_bucket
from rowstore.reads.predicates import NUMERIC
from rowstore.schema import Column, PrimaryKey, SchemaVersion
from rowstore.types import Kind

FNS = ("count", "sum", "min", "max", "mean", "count_distinct", "quantile", "median", "approx_count_distinct",
       "first", "last")
SKETCHES = ("quantile", "median", "approx_count_distinct")
PICKS = ("first", "last")
FLOATS = {Kind.FLOAT32, Kind.FLOAT64}
_SUMMABLE = NUMERIC - {Kind.TIMESTAMP, Kind.DATE}
_ORDERED = NUMERIC | {Kind.STRING, Kind.BOOL}
_KEYS = NUMERIC | {Kind.STRING, Kind.BINARY, Kind.UUID, Kind.BOOL}
NAN_ORDERS = ("ignore", "largest")


@dataclass(frozen=True)
class Agg:
    fn: str
    column: Column | None  # None: count(*)
    q: float | None = None  # a quantile's rank
    by: Column | None = None  # first/last: the column whose least/greatest value picks the row
    alias: str | None = None  # "as": the answer column's name

    @property
    def name(self) -> str:
        if self.alias is not None:
            return self.alias
        if self.column is None:
            return self.fn
        return f"quantile_{self.q:g}_{self.column.name}" if self.fn == "quantile" else f"{self.fn}_{self.column.name}"


@dataclass(frozen=True)
class AggSpec:
    group_by: tuple[GroupKey, ...]
    aggs: tuple[Agg, ...]
    nan_largest: bool = False  # NaN orders above every number in max (rowstore.reads.aggregates' doc)
    pk: PrimaryKey | None = None  # the key that breaks first/last ties (None: no first/last)

    @property
    def special(self) -> bool:
        """Whether an aggregate is computed outside Arrow's hash aggregation (sketches, picks)."""
        return any(a.fn in SKETCHES or a.fn in PICKS for a in self.aggs)

    def nan_max(self, a: Agg) -> bool:
        """Whether ``a`` is a max whose NaN wins (a float column under ``nan: "largest"``)."""
        return self.nan_largest and a.fn == "max" and a.column is not None and a.column.type.kind in FLOATS

    def used(self) -> set[int]:
        """The ids of the columns the request names: group keys, values and first/last's ``by``."""
        return {k.column.id for k in self.group_by} | {a.column.id for a in self.aggs if a.column is not None} | \
            {a.by.id for a in self.aggs if a.by is not None}

    def columns(self) -> list[Column]:
        """Every column whose values the aggregate needs (group keys first)."""
        out = {k.column.id: k.column for k in self.group_by}
        out.update({a.column.id: a.column for a in self.aggs if a.column is not None})
        out.update({a.by.id: a.by for a in self.aggs if a.by is not None})
        out.update({c.id: c for c in (self.pk.columns if self.pk is not None else ())})
        return list(out.values())


def cname(col: Column) -> str:
    """A column's name in the rows an engine hands to :func:`rowstore.reads.aggregates.partial`
    (by id: stable)."""
    return f"c{col.id}"


def key_values(rows: pa.Table, k: GroupKey) -> pa.Array | pa.ChunkedArray:
    v = rows.column(cname(k.column))
    return v if k.bucket is None else edges(v, k.column, k.bucket)


def parse_spec(schema: SchemaVersion, group_by: object, aggregates: object, nan: object = None) -> AggSpec:
    """The request's ``group_by``, ``aggregates`` and ``nan``, checked (QueryError: 400,
    nothing changed)."""
    if nan is not None and (not isinstance(nan, str) or nan not in NAN_ORDERS):
        raise QueryError(f'"nan" must be one of {", ".join(NAN_ORDERS)}, not {str(nan)[:40]!r}')
    group_by = [] if group_by is None else group_by
    if not isinstance(group_by, list):
        raise QueryError('"group_by" must be a list of column names or {"bucket", "width"} objects')
    keys = tuple(_key(schema, g) for g in group_by)
    if len({k.column.id for k in keys if k.bucket is None}) != sum(k.bucket is None for k in keys):
        raise QueryError("group_by names a column twice")
    if not isinstance(aggregates, list) or not aggregates:
        raise QueryError('"aggregates" must be a non-empty list of {"fn", "column"} objects')
    aggs = tuple(_agg(schema, a) for a in aggregates)
    names = [k.name for k in keys] + [a.name for a in aggs]
    if len(set(names)) != len(names):
        raise QueryError(f"two answer columns would have one name: {names} (\"as\" names one)")
    pk = schema.pk if any(a.fn in PICKS for a in aggs) else None
    return AggSpec(keys, aggs, nan == "largest", pk)


def _key(schema: SchemaVersion, g: object) -> GroupKey:
    """One ``group_by`` entry: a column name, or ``{"bucket": col, "width": w, "origin"?, "as"?}``."""
    if isinstance(g, str):
        c = _column(schema, g, "group_by")
        if c.type.kind not in _KEYS:
            raise QueryError(f"group_by: column {c.name!r} is {c.type}: it cannot be a group key")
        return GroupKey(c, None, c.name)
    if not isinstance(g, dict) or "bucket" not in g or "width" not in g or set(g) - {"bucket", "width", "origin", "as"}:
        raise QueryError(f'group_by entry {str(g)[:80]}: expected a column name or {{"bucket": column, "width": w, '
                         f'"origin"?, "as"?}}')
    c = _column(schema, g["bucket"], "group_by bucket")
    return GroupKey(c, parse_bucket(c, g), _alias(g) or f"bucket_{c.name}")


def _alias(d: dict[str, object]) -> str | None:
    name = d.get("as")
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 128):
        raise QueryError(f'"as" must be a name of 1 to 128 characters, not {str(name)[:40]!r}')
    return name


def _column(schema: SchemaVersion, name: object, what: str) -> Column:
    col = schema.by_name(name) if isinstance(name, str) else None
    if col is None:
        raise QueryError(f"{what}: no column {name!r}")
    return col


def _agg(schema: SchemaVersion, a: object) -> Agg:
    if not isinstance(a, dict) or set(a) - {"fn", "column", "as", "q", "by"} or a.get("fn") not in FNS:
        raise QueryError(f"aggregate {str(a)[:80]}: expected {{\"fn\": one of {', '.join(FNS)}, \"column\": name}}")
    fn, alias = a["fn"], _alias(a)
    if ("q" in a) != (fn == "quantile"):
        raise QueryError(f'aggregate {fn}: "q" is the rank of a quantile, and a quantile needs one')
    if ("by" in a) != (fn in PICKS):
        raise QueryError(f'aggregate {fn}: "by" names the column whose greatest (last) or least (first) value '
                         "picks the row, and first and last need one")
    if "column" not in a:
        if fn != "count":
            raise QueryError(f"aggregate {fn} needs a column")
        return Agg(fn, None, alias=alias)
    col = _column(schema, a["column"], f"aggregate {fn}")
    k = col.type.kind
    if fn in ("quantile", "median"):
        q = a.get("q", 0.5)
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
            raise QueryError(f'quantile of column {col.name!r}: "q" must be a number in [0, 1], not {str(q)[:40]!r}')
        if k not in _SUMMABLE:
            raise QueryError(f"{fn} of column {col.name!r}: it is {col.type}, not a number")
        return Agg(fn, col, q=float(q), alias=alias)
    if fn in PICKS:
        by = _column(schema, a["by"], f"aggregate {fn} by")
        if by.type.kind not in NUMERIC | {Kind.STRING}:
            raise QueryError(f"{fn} by column {by.name!r}: it is {by.type}; by is a number, a time or a string")
        return Agg(fn, col, by=by, alias=alias)
    if fn == "approx_count_distinct" and k not in _KEYS:
        raise QueryError(f"approx_count_distinct of column {col.name!r}: {col.type} values cannot be compared")
    if fn in ("sum", "mean") and k not in _SUMMABLE:
        raise QueryError(f"{fn} of column {col.name!r}: it is {col.type}, not a number")
    if fn in ("min", "max") and k not in _ORDERED:
        raise QueryError(f"{fn} of column {col.name!r}: {col.type} values have no order")
    if fn == "count_distinct" and k not in _KEYS:
        raise QueryError(f"count_distinct of column {col.name!r}: {col.type} values cannot be compared")
    return Agg(fn, col, alias=alias)
