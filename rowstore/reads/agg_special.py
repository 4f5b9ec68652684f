"""The aggregates Arrow's hash aggregation does not compute — quantiles and approximate distinct
counts as sketches (:mod:`rowstore.reads.sketches`), first and last as picks
(:mod:`rowstore.reads.picks`) — over groups numbered here, so that Arrow's aggregates of the
same rows, grouped by that number, line up with them; the numbering also groups the merge."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.reads.agg_spec import PICKS, AggSpec, cname, key_values
from rowstore.reads.picks import at_best, key_order, pick
from rowstore.reads.sketches import hll_partials, kll_partials

KEY = "_key"  # rows may bring their keys' order (picks.key_order), null where no pick can take the row
GID = "_gid"  # rows may bring their group numbers (pick_rows's: the same rows, so the same numbering)


def special(rows: pa.Table, cols: pa.Table, keys: list[str], ops: list[tuple[str | list[str], str]],
            spec: AggSpec) -> tuple[pa.Table, dict[str, pa.Array | pa.ChunkedArray]]:
    """(Arrow's aggregates, the keys and the sketches and picks) with the groups numbered first:
    Arrow's aggregation then groups by that number, so its rows line up with the sketches'."""
    gid, groups = group_ids(cols, keys) if GID not in rows.column_names else \
        _groups(cols, keys, rows.column(GID).to_numpy())
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


def pick_rows(rows: pa.Table, spec: AggSpec) -> tuple[np.ndarray, np.ndarray]:
    """Which rows a first/last may take (at their group's least/greatest ``by``), and every
    row's group number: an engine finds the keys of those rows alone and hands them to
    :func:`rowstore.reads.aggregates.partial` as ``KEY``, the numbers as ``GID`` (not numbered
    twice)."""
    cols = pa.table({f"g{j}": key_values(rows, k) for j, k in enumerate(spec.group_by)} or
                    {"_k": pa.nulls(rows.num_rows, pa.int8())})
    gid, groups = group_ids(cols, [f"g{j}" for j in range(len(spec.group_by))])
    out = np.zeros(rows.num_rows, bool)
    for a in spec.aggs:
        if a.fn in PICKS:
            assert a.by is not None  # parse_spec
            out |= at_best(rows.column(cname(a.by)), gid, groups.num_rows, a.fn == "last")
    return out, gid


def group_ids(P: pa.Table, keys: list[str]) -> tuple[np.ndarray, pa.Table]:
    """Each partial row's group number, and the groups' keys in that numbering (groups numbered
    in the order they first appear). Each key column is dictionary-encoded (a hash pass, nulls
    a value of their own) and the codes combined column by column, renumbered densely after
    each so that they stay below the row count."""
    if not keys:
        return _groups(P, keys, np.zeros(P.num_rows, np.int64))
    gid: np.ndarray | None = None
    for k in keys:
        code, m = _codes(P.column(k))
        gid = code if gid is None else _codes(pa.array(gid * m + code))[0]
    assert gid is not None  # keys is not empty
    return _groups(P, keys, gid)


def _groups(P: pa.Table, keys: list[str], gid: np.ndarray) -> tuple[np.ndarray, pa.Table]:
    """(``gid``, the groups' keys in that numbering): each group's first row's."""
    if not keys:
        return gid, pa.table({"_": pa.nulls(1 if P.num_rows else 0, pa.int8())})
    n = int(gid.max()) + 1 if len(gid) else 0
    first = np.empty(n, np.int64)
    first[gid[::-1]] = np.arange(len(gid) - 1, -1, -1)  # each group's first row: the last write wins
    return gid, P.select(keys).take(pa.array(first))


def _codes(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Dense codes of ``col``'s values (null one of them) in order of first appearance, and how many."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    d = pc.dictionary_encode(col, null_encoding="encode")
    return d.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), len(d.dictionary)
