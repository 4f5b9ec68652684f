"""Aggregates and grid histograms of one node's partitions at one snapshot
(docs/rfcs/0012-aggregates.md).

The rows that count are found as a query finds them: the visible rowids at T from the key
index, narrowed by what the column index allows for ``where`` and ``bbox`` (the structures
queries ask, as roaring bitmaps intersected without sorting), then re-checked exactly with
the query's own masks. The values of the filtered rows come from the column index's side tables where a
column is indexed (:mod:`rowstore.index.column_values`), and from decoding only those rows'
needed columns otherwise. Each partition yields a partial; this node merges its own.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64

from rowstore.errors import UnavailableError
from rowstore.index.column_structures import bitmap, ids_of
from rowstore.index.column_values import gather, gatherable, sources
from rowstore.reads.aggregates import AggSpec, Grid, cell_counts, cname, merge, parse_grid, parse_spec, partial
from rowstore.reads.predicates import batch_mask, fold_ranges, parse_bbox, parse_where
from rowstore.schema import Column
from rowstore.segments.fetch import fetch
from rowstore.db.read.reader import ReadContext, Reader


class Aggregator:
    """Partial aggregates and histograms of the partitions served here."""

    def __init__(self, reader: Reader):
        self.reader = reader
        self._visible: dict = {}  # id(partition index) -> (visible rowids, their bitmap)

    async def aggregate(self, name: str, group_by, aggregates, where=None, bbox=None, as_of=None,
                        partitions=None, trusted: bool = False, nan=None) -> tuple[pa.Table, int, dict]:
        """(this node's merged partial, T, stats); the spec is checked against the schema at T."""
        c = await self.reader.context(name, as_of, trusted)
        spec = parse_spec(c.d.schema, group_by, aggregates, nan)
        terms, box = parse_where(c.d.schema, where), parse_bbox(c.d.schema, bbox)
        works = [await self._prepare(c, part, terms, box, spec.columns()) for part in self._parts(c, partitions)]

        def run():  # every partition in one hop to a worker thread
            rows = [w() for w, _ in works]
            return merge([partial(r, spec) for r in rows], spec) if rows else _no_partial(spec), rows
        out, rows = await asyncio.to_thread(run)
        return out, c.T, _stats_of(works, rows)

    async def histogram(self, name: str, column, bbox, cells, where=None, as_of=None, partitions=None,
                        trusted: bool = False) -> tuple[np.ndarray, int, dict]:
        """(counts per cell, ny rows of nx, T, stats)."""
        c = await self.reader.context(name, as_of, trusted)
        grid = parse_grid(c.d.schema, column, bbox, cells)
        terms = parse_where(c.d.schema, where)
        works = [await self._prepare(c, part, terms, grid.box, [grid.box.column])
                 for part in self._parts(c, partitions)]

        def run():
            rows = [w() for w, _ in works]
            counts = np.zeros((grid.ny, grid.nx), np.int64)
            for r in rows:
                counts += _cells(r, grid)
            return counts, rows
        counts, rows = await asyncio.to_thread(run)
        return counts, c.T, _stats_of(works, rows)

    @staticmethod
    def _candidates(part, preds) -> BitMap64 | None:
        """What the column index allows for every predicate it can answer, intersected as
        bitmaps (the candidates a query takes, reader.candidates, without their sources);
        None when no index applies."""
        out = None
        for pred in fold_ranges(preds):
            got = part.columns.bitmap_of(pred)
            if got is not None:
                out = got if out is None else out & got
        return out

    def _narrowed(self, part, ids: np.ndarray, cands: BitMap64) -> np.ndarray:
        """The visible ``ids`` among ``cands``: one bitmap AND (the visible set's bitmap is kept
        with the array it was made from)."""
        key = id(part.index)
        kept = self._visible.get(key)
        if kept is None or kept[0] is not ids:
            if len(self._visible) >= 1024:  # indexes of partitions long gone
                self._visible.clear()
            kept = (ids, bitmap(ids))
            self._visible[key] = kept
        return ids_of(kept[1] & cands)

    def _parts(self, c: ReadContext, partitions) -> list:
        parts = c.table.served() if partitions is None else [c.table.parts[p] for p in partitions]
        if any(p.pid not in c.table.owned for p in parts):
            raise UnavailableError(f"table {c.d.name!r}: partitions {sorted(set(partitions) - c.table.owned)} "
                                   "are not served by this node")
        return parts

    async def _prepare(self, c: ReadContext, part, terms, box, need: list[Column]) -> tuple:
        """(work, stats): what a worker thread runs to get the filtered visible rows' ``need``
        columns (named by ``cname``), with everything it reads taken here, on the loop, at
        one instant; and how they are read."""
        ids = await part.index.visible_rowids(c.T)
        preds = terms + ([box] if box is not None else [])
        cands = self._candidates(part, preds)
        cols = {x.id: x for x in [*need, *(t.column for t in terms), *([box.column] if box else [])]}
        indexed = [x for x in cols.values() if gatherable(part.columns, x)]
        decode = [x for x in cols.values() if x.id not in {i.id for i in indexed}]
        srcs = {x.id: sources(part.columns, x) for x in indexed}
        decoded = None
        if decode:
            ids, cands = (ids if cands is None else self._narrowed(part, ids, cands)), None
            keep = {d.id for d in decode} | {c.d.schema.primary_key}
            target = replace(c.d.schema, columns=tuple(x for x in c.d.schema.columns if x.id in keep))
            if len(ids):
                decoded = (await fetch(self.reader.store, ids, c.schemas, target, f"table {c.d.name!r} "
                                       f"partition {part.pid}")).batch

        def work() -> pa.Table:
            rowids = ids if cands is None else self._narrowed(part, ids, cands)
            arrays = {x.id: gather(srcs[x.id], x, rowids) for x in indexed}
            for x in decode:
                arrays[x.id] = decoded.column(x.name) if decoded is not None else pa.nulls(0, x.type.arrow())
            rows = pa.table({"_row": pa.nulls(len(rowids), pa.int8()), **{cname(x): arrays[x.id] for x in need}})
            if preds:
                named = pa.RecordBatch.from_arrays([_whole(arrays[x.id]) for x in cols.values()],
                                                   names=[x.name for x in cols.values()])
                rows = rows.filter(pa.array(batch_mask(named, terms, box)))
            return rows
        return work, {"path": "decode" if decode else "index", "decoded_columns": sorted(x.name for x in decode),
                      "rows": 0, "rows_decoded": len(ids) if decode else 0}


def _whole(a) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def _cells(rows: pa.Table, grid: Grid) -> np.ndarray:
    return cell_counts(rows.column(cname(grid.box.column)), grid)


def _stats_of(works: list, rows: list) -> dict:
    """A node's stats: its partitions' added up."""
    out = {"path": "index", "decoded_columns": [], "rows": 0, "rows_decoded": 0, "partitions": 0}
    for (_, st), r in zip(works, rows):
        add_stats(out, dict(st, rows=r.num_rows))
    return out


def add_stats(into: dict, st: dict) -> None:
    """One partition's stats added to a node's (or a node's to the answer's)."""
    if st["path"] == "decode":
        into["path"] = "decode"
    into["decoded_columns"] = sorted(set(into["decoded_columns"]) | set(st["decoded_columns"]))
    into["rows"] += st["rows"]
    into["rows_decoded"] += st["rows_decoded"]
    into["partitions"] += st.get("partitions", 1)


def _no_partial(spec: AggSpec) -> pa.Table:
    """The partial of no partition (a node serving none of the asked ones)."""
    empty = pa.table({cname(x): pa.array([], x.type.arrow()) for x in spec.columns()})
    return partial(empty, spec)
