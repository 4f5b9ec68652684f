"""Aggregates and grid histograms as pure, vectorized functions (docs/rfcs/0012-aggregates.md):
the request checked against a schema, per-partition partials, partials merged (across
partitions and nodes alike), the final answer; and the cells of a histogram grid.

A partial is an Arrow table: group keys ``g0..`` (a bucketed key: its lower edges,
:mod:`rowstore.reads.buckets`), then per aggregate ``p<i>`` (and ``q<i>``, the count behind a
mean); a count-distinct keeps its distinct values as a list, so that merging partials from
many places stays exact; a quantile or approximate distinct count keeps a serialized sketch
(:mod:`rowstore.reads.sketches`), first and last the picked row's ``by`` and key as ``o<i>``
and ``k<i>`` (:mod:`rowstore.reads.picks`).

NaN in ``min``/``max`` of a float column: Arrow's kernels leave NaN out unless every value of
the group is NaN (``nan: "ignore"``, the default). With ``nan: "largest"`` NaN is above every
number (SQL's order: Spark's, PostgreSQL's): ``max`` is NaN once the group holds a NaN; ``min``
is the same either way (the smallest number, NaN only when there is nothing else).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import QueryError
from rowstore.reads.buckets import GroupKey, edges, parse_bucket
from rowstore.reads.picks import at_best, key_order, pick
from rowstore.reads.predicates import BBox, NUMERIC, parse_bbox
from rowstore.reads.sketches import answers, hll_partials, kll_partials, merge_sketches
from rowstore.schema import Column, PrimaryKey, SchemaVersion
from rowstore.types import Kind

FNS = ("count", "sum", "min", "max", "mean", "count_distinct", "quantile", "median", "approx_count_distinct",
       "first", "last")
SKETCHES = ("quantile", "median", "approx_count_distinct")
PICKS = ("first", "last")
MAX_CELLS = 4096  # per axis
_FLOATS = {Kind.FLOAT32, Kind.FLOAT64}
_SUMMABLE = NUMERIC - {Kind.TIMESTAMP, Kind.DATE}
_ORDERED = NUMERIC | {Kind.STRING, Kind.BOOL}
_KEYS = NUMERIC | {Kind.STRING, Kind.BINARY, Kind.UUID, Kind.BOOL}
_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max", "mean": "sum"}
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
    nan_largest: bool = False  # NaN orders above every number in max (see the module's doc)
    pk: PrimaryKey | None = None  # the key that breaks first/last ties (None: no first/last)

    @property
    def special(self) -> bool:
        """Whether an aggregate is computed outside Arrow's hash aggregation (sketches, picks)."""
        return any(a.fn in SKETCHES or a.fn in PICKS for a in self.aggs)

    def nan_max(self, a: Agg) -> bool:
        """Whether ``a`` is a max whose NaN wins (a float column under ``nan: "largest"``)."""
        return self.nan_largest and a.fn == "max" and a.column is not None and a.column.type.kind in _FLOATS

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
    """A column's name in the rows an engine hands to :func:`partial` (by id: stable)."""
    return f"c{col.id}"


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


# -- partials ------------------------------------------------------------------------------


def partial(rows: pa.Table, spec: AggSpec) -> pa.Table:
    """One place's partial aggregate of ``rows`` (columns named by :func:`cname`)."""
    cols = {f"g{j}": _key_values(rows, k) for j, k in enumerate(spec.group_by)}
    cols["_k"] = pa.array(np.zeros(rows.num_rows, np.int8))  # one group when there are no keys
    ops: list[tuple[str | list[str], str]] = []  # (column, or none for count(*); Arrow aggregation)
    names: dict[str, str] = {}
    for i, a in enumerate(spec.aggs):
        if a.fn in SKETCHES or a.fn in PICKS:
            continue  # computed from each row's group number, below
        if a.column is None:
            ops.append(([], "count_all"))
            names[f"p{i}"] = "count_all"
            continue
        cols[f"v{i}"] = rows.column(cname(a.column))
        if a.fn in ("min", "max") and a.column.type.kind in _FLOATS:
            cols[f"v{i}"] = _quiet(cols[f"v{i}"])
        if a.fn in ("sum", "mean") and _may_overflow(cols[f"v{i}"]):
            cols[f"v{i}"] = cols[f"v{i}"].cast(_WIDE)  # summed exactly, checked below
        fns = {"mean": ["sum", "count"], "count_distinct": ["distinct"]}.get(a.fn, [a.fn])
        ops += [(f"v{i}", f) for f in fns]
        names[f"p{i}"] = f"v{i}_{fns[0]}"
        if a.fn == "mean":
            names[f"q{i}"] = f"v{i}_count"
        if spec.nan_max(a):
            cols[f"n{i}"] = pc.is_nan(cols[f"v{i}"])
            ops.append((f"n{i}", "any"))
    ops = list({(tuple(c) if isinstance(c, list) else c, f): (c, f) for c, f in ops}.values())
    keys = [f"g{j}" for j in range(len(spec.group_by))]
    if spec.special:
        got, out = _special(rows, pa.table(cols), keys, ops, spec)
    else:
        got = pa.table(cols).group_by(keys or ["_k"], use_threads=False).aggregate(ops)
        out = {k: got.column(k) for k in keys}
    out.update({n: got.column(src) for n, src in names.items()})
    for i, a in enumerate(spec.aggs):
        if spec.nan_max(a):
            out[f"p{i}"] = _nan_wins(out[f"p{i}"], got.column(f"n{i}_any"))
        if a.fn in ("sum", "mean") and out[f"p{i}"].type == _WIDE:
            out[f"p{i}"] = _narrow_sum(out[f"p{i}"], a)
    return pa.table(out)


def _key_values(rows: pa.Table, k: GroupKey) -> pa.Array | pa.ChunkedArray:
    v = rows.column(cname(k.column))
    return v if k.bucket is None else edges(v, k.column, k.bucket)


def _special(rows: pa.Table, cols: pa.Table, keys: list[str], ops: list[tuple[str | list[str], str]],
             spec: AggSpec) -> tuple[pa.Table, dict[str, pa.Array | pa.ChunkedArray]]:
    """(Arrow's aggregates, the keys and the sketches and picks) with the groups numbered first:
    Arrow's aggregation then groups by that number, so its rows line up with the sketches'."""
    gid, groups = _group_ids(cols, keys)
    n = groups.num_rows
    got = cols.append_column("_gid", pa.array(gid, pa.int64())).group_by(["_gid"], use_threads=False) \
        .aggregate(ops).sort_by("_gid")
    out: dict[str, pa.Array | pa.ChunkedArray] = {k: groups.column(k) for k in keys}
    key = rows.column(KEY) if KEY in rows.column_names else \
        key_order(spec.pk, [rows.column(cname(c)) for c in spec.pk.columns]) if spec.pk is not None else None
    for i, a in enumerate(spec.aggs):
        if a.column is None:
            continue  # count(*): Arrow's
        if a.fn in ("quantile", "median"):
            out[f"p{i}"] = kll_partials(rows.column(cname(a.column)), gid, n)
        elif a.fn == "approx_count_distinct":
            out[f"p{i}"] = hll_partials(rows.column(cname(a.column)), a.column.type.kind, gid, n)
        elif a.fn in PICKS:
            assert a.by is not None and key is not None  # parse_spec: first/last have both
            out[f"p{i}"], out[f"o{i}"], out[f"k{i}"] = pick(rows.column(cname(a.column)), rows.column(cname(a.by)),
                                                            key, gid, n, a.fn == "last")
    return got, out


KEY = "_key"  # rows may bring their keys' order (picks.key_order), null where no pick can take the row


def pick_rows(rows: pa.Table, spec: AggSpec) -> np.ndarray:
    """Which rows a first/last may take (at their group's least/greatest ``by``): an engine
    finds the keys of these alone and hands them to :func:`partial` as ``KEY``."""
    cols = pa.table({f"g{j}": _key_values(rows, k) for j, k in enumerate(spec.group_by)} or
                    {"_k": pa.nulls(rows.num_rows, pa.int8())})
    gid, groups = _group_ids(cols, [f"g{j}" for j in range(len(spec.group_by))])
    out = np.zeros(rows.num_rows, bool)
    for a in spec.aggs:
        if a.fn in PICKS:
            assert a.by is not None  # parse_spec
            out |= at_best(rows.column(cname(a.by)), gid, groups.num_rows, a.fn == "last")
    return out


_WIDE = pa.decimal128(38, 0)  # integer sums that may leave 64 bits are added in this


def _may_overflow(values: pa.Array | pa.ChunkedArray) -> bool:
    """Whether summing integer ``values`` (in any grouping) may leave Arrow's 64-bit sum:
    their count times their largest magnitude reaches 2^63 (a bound, never a miss)."""
    if not pa.types.is_integer(values.type) or len(values) == 0:
        return False
    mm = pc.min_max(values)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return lo is not None and len(values) * max(abs(lo), abs(hi)) >= 2**63


def _narrow_sum(sums: pa.Array | pa.ChunkedArray, a: Agg, strict: bool = False) -> pa.Array:
    """Exact integer sums back in the column's sum type when they fit; otherwise kept exact
    (a partial's sum may leave 64 bits while the total comes back) — or, ``strict`` (the
    answer's sum), an error: a sum beyond 64 bits is refused, never wrapped."""
    assert a.column is not None  # a sum or a mean names its column
    typ = pa.uint64() if pa.types.is_unsigned_integer(a.column.type.arrow()) else pa.int64()
    try:
        return sums.cast(typ)
    except (pa.ArrowInvalid, OverflowError):
        if not strict:
            return sums
        raise QueryError(f"sum of column {a.column.name!r} is beyond a 64-bit integer; "
                         f"its mean, or a sum over a narrower filter, can be answered") from None


def _quiet(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Every NaN as the one quiet NaN: Arrow's min and max answer by the order of the rows when a
    signalling NaN (or another payload) is among them, as the CPU's min instructions do."""
    return pc.if_else(pc.is_nan(values), pa.scalar(float("nan"), values.type), values)


def _nan_wins(maxima: pa.Array | pa.ChunkedArray, has_nan: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each group's max, NaN where the group held a NaN (Arrow's max left it out)."""
    maxima = maxima.combine_chunks() if isinstance(maxima, pa.ChunkedArray) else maxima
    nan = pa.scalar(float("nan"), maxima.type)
    return pc.if_else(pc.fill_null(has_nan, False), nan, maxima)


def merge(parts: list[pa.Table], spec: AggSpec) -> pa.Table:
    """Partials of one aggregate (from partitions or nodes) as one partial."""
    parts = [p for p in parts if p.num_rows] or parts[:1]
    if not parts:
        raise ValueError("nothing to merge")
    P = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
    keys = [f"g{j}" for j in range(len(spec.group_by))]
    gid, groups = _group_ids(P, keys)
    n = groups.num_rows
    P = P.append_column("_gid", pa.array(gid, pa.int64()))
    ops = [(f"p{i}", _MERGE[a.fn]) for i, a in enumerate(spec.aggs) if a.fn in _MERGE]
    ops += [(f"q{i}", "sum") for i, a in enumerate(spec.aggs) if a.fn == "mean"]
    for i, a in enumerate(spec.aggs):
        if a.fn in ("min", "max") and a.column is not None \
                and a.column.type.kind in _FLOATS:  # partials from elsewhere: any NaN
            P = P.set_column(P.schema.get_field_index(f"p{i}"), f"p{i}", _quiet(P.column(f"p{i}")))
        if a.fn in ("sum", "mean") and _may_overflow(P.column(f"p{i}")):
            P = P.set_column(P.schema.get_field_index(f"p{i}"), f"p{i}", P.column(f"p{i}").cast(_WIDE))
        if spec.nan_max(a):  # a partial's NaN max stays NaN in the merge
            P = P.append_column(f"n{i}", pc.is_nan(P.column(f"p{i}")))
            ops.append((f"n{i}", "any"))
    m = P.group_by(["_gid"], use_threads=False).aggregate(ops).sort_by("_gid") if ops else None
    out = {k: groups.column(k) for k in keys}
    for i, a in enumerate(spec.aggs):
        if a.fn == "count_distinct":
            out[f"p{i}"] = _merge_distinct(P.column(f"p{i}"), gid, n)
        elif a.fn in SKETCHES:
            out[f"p{i}"] = merge_sketches(P.column(f"p{i}"), a.fn, gid, n)
        elif a.fn in PICKS:
            out[f"p{i}"], out[f"o{i}"], out[f"k{i}"] = pick(P.column(f"p{i}"), P.column(f"o{i}"), P.column(f"k{i}"),
                                                            gid, n, a.fn == "last")
        else:
            assert m is not None  # ops holds this aggregate's merge
            out[f"p{i}"] = m.column(f"p{i}_{_MERGE[a.fn]}")
            if spec.nan_max(a):
                out[f"p{i}"] = _nan_wins(out[f"p{i}"], m.column(f"n{i}_any"))
            if a.fn in ("sum", "mean") and out[f"p{i}"].type == _WIDE:
                out[f"p{i}"] = _narrow_sum(out[f"p{i}"], a)
            if a.fn == "mean":
                out[f"q{i}"] = m.column(f"q{i}_sum")
    return pa.table(out)


def _group_ids(P: pa.Table, keys: list[str]) -> tuple[np.ndarray, pa.Table]:
    """Each partial row's group number, and the groups' keys in that numbering (groups numbered
    in the order they first appear). Each key column is dictionary-encoded (a hash pass, nulls
    a value of their own) and the codes combined column by column, renumbered densely after
    each so that they stay below the row count."""
    if not keys:
        return np.zeros(P.num_rows, np.int64), pa.table({"_": pa.nulls(1 if P.num_rows else 0, pa.int8())})
    gid: np.ndarray | None = None
    for k in keys:
        code, m = _codes(P.column(k))
        gid = code if gid is None else _codes(pa.array(gid * m + code))[0]
    assert gid is not None  # keys is not empty
    n = int(gid.max()) + 1 if len(gid) else 0
    first = np.empty(n, np.int64)
    first[gid[::-1]] = np.arange(len(gid) - 1, -1, -1)  # each group's first row: the last write wins
    return gid, P.select(keys).take(pa.array(first))


def _codes(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Dense codes of ``col``'s values (null one of them) in order of first appearance, and how many."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    d = pc.dictionary_encode(col, null_encoding="encode")
    return d.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), len(d.dictionary)


def _merge_distinct(lists: pa.Array | pa.ChunkedArray, gid: np.ndarray, n: int) -> pa.Array:
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    vals = pc.list_flatten(lists)
    owner = gid[pc.list_parent_indices(lists).to_numpy()]
    t = pa.table({"_gid": pa.array(owner, pa.int64()), "v": vals})
    d = t.group_by(["_gid"], use_threads=False).aggregate([("v", "distinct")])
    where = np.full(n, -1, np.int64)
    where[d.column("_gid").to_numpy()] = np.arange(d.num_rows)
    return d.column("v_distinct").combine_chunks().take(pa.array(np.where(where < 0, 0, where), mask=where < 0)) \
        if d.num_rows else pa.nulls(n, lists.type)


def finish(P: pa.Table, spec: AggSpec) -> pa.Table:
    """The answer: one row per group (one row without ``group_by``), aggregates named ``fn``
    (count(*)) or ``fn_column``; group keys and min/max keep their column's type."""
    if not spec.group_by and P.num_rows == 0:
        P = _empty_row(spec)
    out, fields = [], []
    for j, k in enumerate(spec.group_by):
        f = k.field()
        out.append(P.column(f"g{j}").cast(f.type))
        fields.append(f)
    for i, a in enumerate(spec.aggs):
        arr, f = _final(P, i, a)
        out.append(arr)
        fields.append(f)
    return pa.Table.from_arrays(out, schema=pa.schema(fields))


def _final(P: pa.Table, i: int, a: Agg) -> tuple[pa.Array, pa.Field]:
    p = P.column(f"p{i}").combine_chunks()
    if a.fn == "count":
        return p.fill_null(0).cast(pa.int64()), pa.field(a.name, pa.int64())
    assert a.column is not None  # only count(*) names no column
    if a.fn in SKETCHES:
        got = answers(p, a.fn, a.q)
        return got, pa.field(a.name, got.type)
    if a.fn == "count_distinct":
        vals = pc.list_flatten(p)
        valid = vals.is_valid().to_numpy(zero_copy_only=False)
        n = np.bincount(pc.list_parent_indices(p).to_numpy()[valid], minlength=len(p))
        return pa.array(n, pa.int64()), pa.field(a.name, pa.int64())
    if a.fn == "mean":
        s = p.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)  # sums past 2^53 round
        q = P.column(f"q{i}").combine_chunks().fill_null(0).to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore", divide="ignore"):
            m = s / np.where(q == 0, 1, q)
        return pa.array(m, pa.float64(), mask=q == 0), pa.field(a.name, pa.float64())
    if a.fn == "sum":
        if p.type == _WIDE:
            p = _narrow_sum(p, a, strict=True)
        typ = pa.float64() if a.column.type.kind in _FLOATS else p.type
        return p.cast(typ), pa.field(a.name, typ)
    f = a.column.field()
    return p.cast(f.type), pa.field(a.name, f.type, metadata=f.metadata)


def _empty_row(spec: AggSpec) -> pa.Table:
    cols = {}
    for i, a in enumerate(spec.aggs):
        if a.fn == "count":
            cols[f"p{i}"] = pa.array([0], pa.int64())
        elif a.fn == "count_distinct":
            assert a.column is not None  # only count(*) names no column
            cols[f"p{i}"] = pa.array([[]], pa.list_(a.column.type.arrow()))
        elif a.fn in SKETCHES:
            cols[f"p{i}"] = pa.nulls(1, pa.binary())
        elif a.fn in PICKS:
            assert a.column is not None and a.by is not None and spec.pk is not None  # parse_spec
            cols[f"p{i}"] = pa.nulls(1, a.column.type.arrow())
            cols[f"o{i}"] = pa.nulls(1, a.by.type.arrow())
            cols[f"k{i}"] = pa.nulls(1, pa.uint64() if spec.pk.kind == "int64" else pa.binary())
        else:
            assert a.column is not None  # only count(*) names no column
            cols[f"p{i}"] = pa.nulls(1, a.column.type.arrow() if a.fn in ("min", "max") else pa.float64())
            if a.fn == "mean":
                cols[f"q{i}"] = pa.array([0], pa.int64())
    return pa.table(cols)


# -- grid histograms -----------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    box: BBox
    nx: int
    ny: int


def parse_grid(schema: SchemaVersion, column: object, bbox: object, cells: object) -> Grid:
    """The histogram's column, bounding box and cell counts, checked."""
    if not isinstance(bbox, dict) or set(bbox) != {"xmin", "ymin", "xmax", "ymax"}:
        raise QueryError('"bbox" must be an object {xmin, ymin, xmax, ymax}')
    if not isinstance(column, str):
        raise QueryError('"column" must name a point or box column')
    box = parse_bbox(schema, {"column": column, **bbox})
    assert box is not None  # a bbox object was given
    if not isinstance(cells, list) or len(cells) != 2 or not all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_CELLS for n in cells):
        raise QueryError(f'"cells" must be [nx, ny], each 1..{MAX_CELLS}, not {str(cells)[:60]}')
    return Grid(box, cells[0], cells[1])


def cell_counts(values: pa.Array, g: Grid) -> np.ndarray:
    """Counts per cell (``ny`` rows of ``nx``; row 0 at ``ymin``) of the points (a box: its
    centre) inside the box, edges inclusive; a point on an inner edge goes to the higher
    cell, one on ``xmax``/``ymax`` to the last."""
    b = g.box
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    ok = values.is_valid().to_numpy(zero_copy_only=False)
    names = [values.type.field(i).name for i in range(values.type.num_fields)]
    f = {n: values.field(n).to_numpy(zero_copy_only=False) for n in names}
    if b.column.type.kind == Kind.POINT:
        x, y = f["x"], f["y"]
    else:
        x, y = (f["xmin"] + f["xmax"]) / 2, (f["ymin"] + f["ymax"]) / 2
    with np.errstate(invalid="ignore"):
        ok &= (x >= b.xmin) & (x <= b.xmax) & (y >= b.ymin) & (y <= b.ymax)
    ix, iy = _cells_of(x[ok], b.xmin, b.xmax, g.nx), _cells_of(y[ok], b.ymin, b.ymax, g.ny)
    return np.bincount(iy * g.nx + ix, minlength=g.nx * g.ny).astype(np.int64).reshape(g.ny, g.nx)


def cell_edges(lo: float, hi: float, n: int) -> np.ndarray:
    """The ``n + 1`` edges of one axis's cells; the first and last cells are closed by the
    bbox, so their outer edges are -inf and inf."""
    edges = lo + (hi - lo) * (np.arange(0, n + 1, dtype=np.float64) / n)
    edges[0], edges[-1] = -np.inf, np.inf
    return edges


def _cells_of(v: np.ndarray, lo: float, hi: float, n: int) -> np.ndarray:
    """The cell of each value: the number of inner edges ``lo + (hi-lo)·i/n`` at or below it
    (a guess by division, corrected by one where rounding put it across its edge)."""
    edges = cell_edges(lo, hi, n)
    guess = np.floor((v - lo) * (n / (hi - lo))) if hi > lo else np.full(len(v), n - 1.0)
    c: npt.NDArray[np.int64] = np.clip(np.nan_to_num(guess, nan=0.0), 0, n - 1).astype(np.int64)
    c -= v < edges[c]
    c += v >= edges[c + 1]
    return c
