"""An indexed column's values for given rowids, read from the column index instead of the
rows (docs/rfcs/0012-aggregates.md): each run's side table (the values its structures keep
sorted by rowid for exact refines) and the memtable's exact values. Aggregates use it so
that a filtered group-by decodes no row block.

:func:`sources` takes the sources at one instant on the event loop (runs are immutable once
built; a merge or checkpoint swaps whole objects), :func:`gather` does the vectorized work
and may run in a thread.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from rowstore.index.column_index import PartitionColumns, _values, index_kind
from rowstore.schema import Column
from rowstore.types import Kind

_GATHERED = {"axis", "value", "grid"}  # kinds whose structures keep every value exactly


def gatherable(cols: PartitionColumns, col: Column) -> bool:
    """Whether the partition's index can give ``col``'s values exactly."""
    return col.id in cols.columns and index_kind(col) in _GATHERED


def sources(cols: PartitionColumns, col: Column) -> list:
    """The runs and memtable pieces holding ``col``, as they are now."""
    runs = [r[col.id] for r in list(cols.runs.values()) if col.id in r]
    mem = [(ids, v.get(col.id)) for ids, v in [*cols.mem, *(p for tok in cols.frozen for p in tok)]]
    return runs + [(ids, v) for ids, v in mem if v is not None]


def gather(srcs: list, col: Column, rowids: np.ndarray) -> pa.Array:
    """``col``'s values for the sorted ``rowids`` (null where no source has the row: the
    index leaves nulls out)."""
    typ = col.type.arrow()
    pieces, hits = [], np.full(len(rowids), -1, np.int64)
    base = 0
    for src in srcs:
        ids, vals = _side_table(src, col)
        if len(ids) == 0:
            continue
        pos = np.searchsorted(ids, rowids)
        ok = pos < len(ids)
        ok[ok] = ids[pos[ok]] == rowids[ok]
        ok &= hits < 0  # the first source wins (a row is in one source, or the same in two)
        hits[ok] = base + pos[ok]
        pieces.append(vals.cast(typ) if vals.type != typ else vals)
        base += len(ids)
    if not pieces:
        return pa.nulls(len(rowids), typ)
    allv = pa.concat_arrays(pieces)
    return allv.take(pa.array(np.where(hits < 0, 0, hits), mask=hits < 0))


def _side_table(src, col: Column) -> tuple[np.ndarray, pa.Array]:
    """(rowids sorted, values) of one run or memtable piece."""
    if isinstance(src, tuple):  # a memtable piece: exact values
        ids, v = src
        arr = _values(v)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        order = np.argsort(ids, kind="stable")
        return np.asarray(ids, np.uint64)[order], arr.take(pa.array(order))
    if src.kind == "value":
        vi = src.values
        return vi.rowids, _decoded_values(vi, col)
    if src.kind == "grid":
        g = src.grid
        o = g.by_rowid()
        return g.rowids[o], pa.StructArray.from_arrays([pa.array(g.x[o]), pa.array(g.y[o])], ["x", "y"])
    ax = src.axis  # a number or time: the side table holds the value itself (lo == hi)
    ids, vals = ax.rowids, _numbers(ax.lo, col)
    if len(ax.nan_rowids):
        ids = np.concatenate([ids, ax.nan_rowids])
        order = np.argsort(ids, kind="stable")
        vals = pa.concat_arrays([vals, pa.array(np.full(len(ax.nan_rowids), np.nan), col.type.arrow())])
        ids, vals = ids[order], vals.take(pa.array(order))
    return ids, vals


def _numbers(v: np.ndarray, col: Column) -> pa.Array:
    k = col.type.kind
    if k == Kind.TIMESTAMP:
        return pa.array(v.astype(np.int64), pa.int64()).cast(col.type.arrow())
    if k == Kind.DATE:
        return pa.array(v.astype(np.int32), pa.int32()).cast(col.type.arrow())
    return pa.array(v).cast(col.type.arrow())


def _decoded_values(vi, col: Column) -> pa.Array:
    d = vi.dictionary
    if col.type.kind == Kind.UUID:
        d = d.cast(pa.binary(16))
    return d.take(pa.array(vi.codes))
