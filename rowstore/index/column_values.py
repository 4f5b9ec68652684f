"""An indexed column's values for given rowids, read from the column index instead of the
rows (docs/rfcs/0012-aggregates.md): each run's side table (the values its structures keep
sorted by rowid for exact refines) and the memtable's exact values. Aggregates use it so
that a filtered group-by decodes no row block.

:func:`sources` takes the sources at one instant on the event loop (runs are immutable once
built; a merge or checkpoint swaps whole objects), :func:`gather` does the vectorized work
and may run in a thread.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from rowstore.index.column_index import ColumnRun, PartitionColumns, _values
from rowstore.index.column_kinds import index_kind
from rowstore.index.rowid_kernels import Positions, match_sorted
from rowstore.schema import Column
from rowstore.types import Kind

_GATHERED = {"axis", "value", "grid"}  # kinds whose structures keep every value exactly
Source = ColumnRun | tuple[np.ndarray, pa.Array]  # a run, or a piece (rowids, values): memtable, version-2 run
# where a source's side table holds the wanted rowids: (its rowid array, the span [a, b) of the
# wanted rowids in its range, the position of each of those in it or -1; None when a == b)
_Found = tuple[np.ndarray, np.intp, np.intp, np.ndarray | None]


def gatherable(cols: PartitionColumns, col: Column) -> bool:
    """Whether the partition's index can give ``col``'s values exactly."""
    return col.id in cols.columns and index_kind(col) in _GATHERED


async def sources(cols: PartitionColumns, col: Column) -> list[Source]:
    """The runs and memtable pieces holding ``col``, as they are now."""
    runs, pieces = await cols.pieces_of(col.id)
    return runs + pieces


def gather(srcs: Sequence[Source], col: Column, rowids: np.ndarray, memo: dict[int, _Found] | None = None,
           positions: Callable[[np.ndarray], Positions] | None = None) -> pa.Array:
    """``col``'s values for the sorted ``rowids`` (null where no source has the row: the
    index leaves nulls out). Only the matched values are taken from each source. ``memo``
    keeps where ``rowids`` were found in each side table's rowid array, for the next column
    of the same request whose side table holds the same array; ``positions`` gives a run's
    side table's :class:`Positions` (kept by the caller: runs do not change), else rowids
    are matched by galloping."""
    memo = {} if memo is None else memo
    typ = col.type.arrow()
    rowids = np.asarray(rowids, np.uint64)
    pieces, hits, base = [], np.full(len(rowids), -1, np.int64), 0
    for src in srcs:
        ids, take = _side_table(src, col)
        if len(ids) == 0:
            continue
        # only the wanted rowids inside this source's range are searched (runs hold ranges)
        found = memo.get(id(ids))
        if found is None or found[0] is not ids:
            a, b = np.searchsorted(rowids, ids[0], "left"), np.searchsorted(rowids, ids[-1], "right")
            at = (positions(ids).of(rowids[a:b]) if positions is not None and not isinstance(src, tuple)
                  else match_sorted(ids, rowids[a:b])) if a < b else None
            found = memo[id(ids)] = (ids, a, b, at)
        _, a, b, pos = found
        if a == b:
            continue
        assert pos is not None  # a < b: matched
        ok = np.zeros(len(rowids), bool)
        ok[a:b] = pos >= 0
        ok &= hits < 0  # the first source wins (a row is in one source, or the same in two)
        if not ok.any():
            continue
        vals = take(pos[ok[a:b]])
        pieces.append(vals.cast(typ) if vals.type != typ else vals)
        hits[ok] = base + np.arange(len(vals))
        base += len(vals)
    if not pieces:
        return pa.nulls(len(rowids), typ)
    allv = pa.concat_arrays(pieces) if len(pieces) > 1 else pieces[0]
    if base == len(rowids) and (hits == np.arange(len(rowids))).all():
        return allv  # one source held every row, in order
    return allv.take(pa.array(np.where(hits < 0, 0, hits), mask=hits < 0))


def _side_table(src: Source, col: Column) -> tuple[np.ndarray, Callable[[np.ndarray], pa.Array]]:
    """(rowids sorted, take(positions) -> values) of one run or memtable piece."""
    if isinstance(src, tuple):  # a memtable piece: exact values
        ids, v = src
        arr = _values(v)
        assert arr is not None  # pieces_of keeps the pieces that hold the column
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        ids = np.asarray(ids, np.uint64)
        if len(ids) < 2 or bool((ids[1:] > ids[:-1]).all()):  # in rowid order (a version-2 run's entries)
            return ids, lambda pos: arr.take(pa.array(pos))
        order = np.argsort(ids, kind="stable")
        return np.asarray(ids, np.uint64)[order], lambda pos: arr.take(pa.array(order[pos]))
    if src.kind == "value":
        vi = src.values
        d = vi.dictionary.cast(pa.binary(16)) if col.type.kind == Kind.UUID else vi.dictionary
        return vi.rowids, lambda pos: d.take(pa.array(vi.codes[pos]))
    if src.kind == "grid":
        g = src.grid
        ids, o = g.by_rowid()
        return ids, lambda pos: pa.StructArray.from_arrays(
            [pa.array(g.x[o[pos]]), pa.array(g.y[o[pos]])], ["x", "y"])
    ax = src.axis  # a number or time: the side table holds the value itself (lo == hi)
    if not len(ax.nan_rowids):
        return ax.rowids, lambda pos: _numbers(ax.lo[pos], col)
    ids = np.concatenate([ax.rowids, ax.nan_rowids])
    order = np.argsort(ids, kind="stable")
    vals = np.concatenate([ax.lo.astype(np.float64), np.full(len(ax.nan_rowids), np.nan)])[order]
    return ids[order], lambda pos: _numbers(vals[pos], col)


def _numbers(v: np.ndarray, col: Column) -> pa.Array:
    k = col.type.kind
    if k == Kind.TIMESTAMP:
        return pa.array(v.astype(np.int64), pa.int64()).cast(col.type.arrow())
    if k == Kind.DATE:
        return pa.array(v.astype(np.int32), pa.int32()).cast(col.type.arrow())
    return pa.array(v).cast(col.type.arrow())
