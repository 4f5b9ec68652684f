"""Aggregates as pure, vectorized functions (docs/rfcs/0012-aggregates.md): per-partition
partials by Arrow's hash aggregation, partials merged (across partitions and nodes alike), the
final answer. The request is checked in :mod:`rowstore.reads.agg_spec`; quantiles, approximate
distinct counts, first and last take the path of :mod:`rowstore.reads.agg_special`; grid
histograms are :mod:`rowstore.reads.grids`.

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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import QueryError
from rowstore.reads.agg_special import group_ids, special
from rowstore.reads.agg_spec import FLOATS, PICKS, SKETCHES, Agg, AggSpec, cname, key_values
from rowstore.reads.picks import pick
from rowstore.reads.sketches import answers, merge_sketches

_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max", "mean": "sum"}


# -- partials ------------------------------------------------------------------------------


def partial(rows: pa.Table, spec: AggSpec) -> pa.Table:
    """One place's partial aggregate of ``rows`` (columns named by :func:`cname`)."""
    cols = {f"g{j}": key_values(rows, k) for j, k in enumerate(spec.group_by)}
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
        if a.fn in ("min", "max") and a.column.type.kind in FLOATS:
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
        got, out = special(rows, pa.table(cols), keys, ops, spec)
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
    gid, groups = group_ids(P, keys)
    n = groups.num_rows
    P = P.append_column("_gid", pa.array(gid, pa.int64()))
    ops = [(f"p{i}", _MERGE[a.fn]) for i, a in enumerate(spec.aggs) if a.fn in _MERGE]
    ops += [(f"q{i}", "sum") for i, a in enumerate(spec.aggs) if a.fn == "mean"]
    for i, a in enumerate(spec.aggs):
        if a.fn in ("min", "max") and a.column is not None \
                and a.column.type.kind in FLOATS:  # partials from elsewhere: any NaN
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
        typ = pa.float64() if a.column.type.kind in FLOATS else p.type
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
