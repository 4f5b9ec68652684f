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
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64

from rowstore.errors import UnavailableError
from rowstore.db.partition import Partition
from rowstore.index.column_index import ColumnRun, bitmap_from
from rowstore.index.column_kinds import Pred
from rowstore.index.column_structures import ids_of
from rowstore.index.column_values import gather, gatherable, sources
from rowstore.index.rowid_kernels import Positions, RowidSet, bin_points
from rowstore.reads.aggregates import merge, partial
from rowstore.reads.agg_special import GID, KEY, pick_rows
from rowstore.reads.agg_spec import AggSpec, cname, parse_spec
from rowstore.reads.grids import Grid, cell_counts, cell_edges, parse_grid
from rowstore.reads.picks import encoded_key_column, key_order
from rowstore.reads.predicates import BBox, Term, batch_mask, fold_ranges, parse_bbox
from rowstore.schema import Column
from rowstore.types import Kind
from rowstore.segments.fetch import fetch
from rowstore.db.read.reader import Reader
from rowstore.db.read.context import ReadContext


T = TypeVar("T")
_PARALLEL_CELLS = 1 << 20  # histograms up to this many cells count their partitions in parallel
# how a partition's rows were read: path, decoded_columns, rows, rows_decoded (a node's: partitions)
Stats = dict[str, Any]


class Aggregator:
    """Partial aggregates and histograms of the partitions served here."""

    def __init__(self, reader: Reader):
        self.reader = reader
        # id(partition index) -> (visible rowids, their RowidSet)
        self._sets: dict[int, tuple[np.ndarray, RowidSet]] = {}
        # a run's side-table rowids -> their Positions, while the run lives (weakly: RunCache evicts)
        self._maps = PositionsOf()

    async def aggregate(self, name: str, group_by: list[Any] | None, aggregates: list[Any],
                        where: list[Any] | None = None, bbox: dict[str, Any] | None = None,
                        as_of: int | None = None, partitions: list[int] | None = None, trusted: bool = False,
                        nan: str | None = None) -> tuple[pa.Table, int, Stats]:
        """(this node's merged partial, T, stats); the spec is checked against the schema at T."""
        c = await self.reader.context(name, as_of, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        spec = parse_spec(c.d.schema, group_by, aggregates, nan)
        terms, box = c.terms(where), parse_bbox(c.d.schema, bbox)
        parts = self._parts(c, partitions)
        walk = key_walk(spec, terms, box) if KEY_WALK else None
        if walk is not None:  # first/last by the key's next column: one entry per group from the key index
            return await self._walked(c, parts, spec, terms, walk)
        keyed = [spec.pk is not None and not all(gatherable(p.columns, x) for x in spec.pk.columns) for p in parts]
        # a keyed partition's keys are decoded for the picks' candidates alone (_with_keys): a key
        # column is read with the rows only when the request uses it otherwise too (a group key,
        # a value, a first/last's ``by`` — a measurement's sensor and time often are)
        pk = {x.id for x in spec.pk.columns} - spec.used() if spec.pk is not None else set()
        works = [await self._prepare(c, part, terms, box, [x for x in spec.columns() if not (k and x.id in pk)],
                                     rowids=k) for part, k in zip(parts, keyed)]

        # each partition in a worker thread of its own: the kernels and Arrow release the GIL
        def run(w: Callable[[], pa.Table]) -> tuple[pa.Table, pa.Table]:
            rows = w()
            return rows, partial(rows, spec)

        async def run_keyed(w: Callable[[], pa.Table], part: Partition) -> tuple[pa.Table, pa.Table]:
            rows = await asyncio.to_thread(w)
            rows = await self._with_keys(c, part, rows, spec)
            return rows, await asyncio.to_thread(partial, rows, spec)
        got = await asyncio.gather(*[run_keyed(w, p) if k else asyncio.to_thread(run, w)
                                     for (w, _), p, k in zip(works, parts, keyed)])
        rows = [r for r, _ in got]
        out = await asyncio.to_thread(merge, [p for _, p in got], spec) if got else _no_partial(spec)
        return out, c.T, _stats_of(works, [r.num_rows for r in rows])

    async def _walked(self, c: ReadContext, parts: list[Partition], spec: AggSpec, terms: list[Term],
                      walk: tuple[int, bool]) -> tuple[pa.Table, int, Stats]:
        """The partial of a first/last per key prefix (:func:`key_walk`): each partition's
        candidates are its prefixes' best keys from the key index, then their rows' columns as
        any aggregate reads them — one row per group instead of every row's ``by``."""
        assert spec.pk is not None  # key_walk: a first/last's
        components, last = walk
        picked = [await p.index.picks(c.T, components, last) for p in parts]
        works = []
        for part, best in zip(parts, picked):
            order = np.argsort(best.rowids, kind="stable")  # the rows come in rowid order
            ids = best.rowids[order]
            w, st = await self._prepare(c, part, terms, None, spec.columns(), rowids=True, only=ids)
            works.append((w, st, ids, encoded_key_column(best.keys[order])))

        def run(w: Callable[[], pa.Table], ids: np.ndarray, key: pa.Array) -> tuple[pa.Table, pa.Table]:
            rows = w()  # the terms (a retention's) may have left some out
            at = np.searchsorted(ids, rows.column("_rowid").to_numpy())
            rows = rows.append_column(KEY, key.take(pa.array(at)))
            return rows, partial(rows, spec)
        got = await asyncio.gather(*[asyncio.to_thread(run, w, ids, key) for w, _, ids, key in works])
        out = await asyncio.to_thread(merge, [p for _, p in got], spec) if got else _no_partial(spec)
        return out, c.T, _stats_of([(w, st) for w, st, _, _ in works], [r.num_rows for r, _ in got])

    async def _with_keys(self, c: ReadContext, part: Partition, rows: pa.Table, spec: AggSpec) -> pa.Table:
        """``rows`` with the keys of the rows a first/last may take (``KEY``), decoded for those
        rows alone: a key the column index does not hold costs a decode, and a group's last
        value needs one row's (RFC 0016)."""
        assert spec.pk is not None and c.d.schema is not None  # a first/last's; a live table
        maybe, gid = await asyncio.to_thread(pick_rows, rows, spec)
        pos = np.flatnonzero(maybe)
        ids = rows.column("_rowid").to_numpy()[pos]
        order = np.argsort(ids, kind="stable")  # fetch answers in rowid order
        keep = set(c.d.schema.primary_key)
        target = replace(c.d.schema, columns=tuple(x for x in c.d.schema.columns if x.id in keep))
        got = (await fetch(self.reader.store, ids, c.schemas, target, f"table {c.d.name!r} partition {part.pid}")).batch
        keys = key_order(spec.pk, [got.column(x.name) for x in spec.pk.columns])
        where = np.full(rows.num_rows, -1, np.int64)
        where[pos[order]] = np.arange(len(pos))
        return rows.append_column(KEY, keys.take(pa.array(where, mask=where < 0))).append_column(GID, pa.array(gid))

    async def histogram(self, name: str, column: str, bbox: dict[str, Any], cells: list[int],
                        where: list[Any] | None = None, as_of: int | None = None, partitions: list[int] | None = None,
                        trusted: bool = False) -> tuple[np.ndarray, int, Stats]:
        """(counts per cell, ny rows of nx, T, stats)."""
        c = await self.reader.context(name, as_of, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        grid = parse_grid(c.d.schema, column, bbox, cells)
        terms = c.terms(where)
        parts = self._parts(c, partitions)
        works: list[tuple[Callable[[], np.ndarray | pa.Table], Stats]]
        if grid.box.column.type.kind == Kind.POINT and all(gatherable(p.columns, grid.box.column) for p in parts):
            works = [await self._prepare_cells(c, part, terms, grid) for part in parts]
        else:
            works = [await self._prepare(c, part, terms, grid.box, [grid.box.column]) for part in parts]

        # each partition in a worker thread of its own (the kernels run without the GIL)
        def run(w: Callable[[], np.ndarray | pa.Table]) -> tuple[np.ndarray, int]:
            got = w()
            if isinstance(got, np.ndarray):  # counted in place from the grid (_prepare_cells)
                return got, int(got.sum())
            return _cells(got, grid), got.num_rows
        if grid.nx * grid.ny <= _PARALLEL_CELLS:
            got = await asyncio.gather(*[asyncio.to_thread(run, w) for w, _ in works])
        else:  # a count array per partition at once would be large: one after another
            got = await asyncio.to_thread(lambda: [run(w) for w, _ in works])
        counts = np.zeros((grid.ny, grid.nx), np.int64)
        for counted, _ in got:
            counts += counted
        return counts, c.T, _stats_of(works, [n for _, n in got])

    async def _prepare_cells(self, c: ReadContext, part: Partition, terms: list[Term],
                             grid: Grid) -> tuple[Callable[[], np.ndarray], Stats]:
        """(work, stats) of a point column's histogram counted straight from its grid runs and
        memtable pieces: each point in the box whose rowid is visible (and passes ``where``)
        is binned once, by one kernel pass over the grid cells the box touches — no rowid is
        sorted or searched (:mod:`rowstore.index.rowid_kernels`)."""
        col, box = grid.box.column, grid.box
        while True:  # the visible rows and the runs at one instant (a merge or a GC pass renames runs)
            await part.columns.build([col.id])
            v = part.columns.version
            ids = await part.index.visible_rowids(c.T)
            narrow = (await self._prepare(c, part, terms, None, [], rowids=True))[0] if terms else None
            srcs = await sources(part.columns, col)
            if part.columns.version == v:
                break
        edges = cell_edges(box.xmin, box.xmax, grid.nx), cell_edges(box.ymin, box.ymax, grid.ny)
        corners = np.array([box.xmin, box.ymin, box.xmax, box.ymax], np.float64)

        def work() -> np.ndarray:
            keep = self._rowid_set(part, ids) if narrow is None else \
                RowidSet(narrow().column("_rowid").to_numpy())
            counts = np.zeros((grid.ny, grid.nx), np.int64)
            for rid, x, y, spans in _point_spans(srcs, box):
                bin_points(rid, x, y, spans, keep.segs, keep.base, keep.bits, corners, *edges, counts)
            return counts
        return work, {"path": "index", "decoded_columns": [], "rows": 0, "rows_decoded": 0}

    def _rowid_set(self, part: Partition, ids: np.ndarray) -> RowidSet:
        """A fresh copy of the visible set's :class:`RowidSet` (counting takes rowids out)."""
        return self._visible_set(part, ids).copy()

    def _visible_set(self, part: Partition, ids: np.ndarray) -> RowidSet:
        """The :class:`RowidSet` of a partition's visible ``ids``, kept while they are the same
        array (never written: takers copy it)."""
        return _kept(self._sets, id(part.index), ids, RowidSet, 1024)  # bound: indexes of partitions long gone

    @staticmethod
    async def _candidates(part: Partition, preds: list[Pred], every: bool) -> Callable[[], BitMap64 | None] | None:
        """What computes, in a thread, what the column index allows for the predicates worth
        a bitmap (``every``: all it can answer — rows about to be decoded cost more than any
        bitmap), intersected (the candidates a query takes, reader.candidates, without their
        sources; None when no index applies) — from the runs and memtable pieces taken here,
        on the loop; None when no predicate's column is indexed."""
        indexed = [p for p in fold_ranges(preds) if p.column.id in part.columns.columns]
        if not indexed:
            return None
        if not every:  # chosen by the runs' shares (nothing read), then only their runs taken
            indexed = _worth_a_bitmap(indexed, [await part.columns.share(p) for p in indexed])
        taken = [(p, part.columns.columns[p.column.id], await part.columns.pieces_of(p.column.id)) for p in indexed]

        def compute() -> BitMap64 | None:
            out = None
            for pred, col, (runs, pieces) in taken:
                got = bitmap_from(col, runs, pieces, pred)
                if got is not None:
                    out = got if out is None else out & got
            return out
        return compute

    def _narrowed(self, part: Partition, ids: np.ndarray, cands: BitMap64 | None) -> np.ndarray:
        """The visible ``ids`` among ``cands`` (all of them when None): a byte lookup each in
        the visible set's :class:`RowidSet` (kept while the visible rowids are the same)."""
        if cands is None:
            return ids
        c = ids_of(cands)
        out: np.ndarray = c[self._visible_set(part, ids).contains(c)]
        return out

    def _positions(self, ids: np.ndarray) -> Positions:
        """The :class:`Positions` of a run's side-table rowids, kept (runs are immutable)."""
        return self._maps(ids)

    def _parts(self, c: ReadContext, partitions: list[int] | None) -> list[Partition]:
        parts = c.table.served() if partitions is None else [c.table.parts[p] for p in partitions]
        if any(p.pid not in c.table.owned for p in parts):
            assert partitions is not None  # the served ones are owned
            raise UnavailableError(f"table {c.d.name!r}: partitions {sorted(set(partitions) - c.table.owned)} "
                                   "are not served by this node")
        return parts

    async def _prepare(self, c: ReadContext, part: Partition, terms: list[Term], box: BBox | None, need: list[Column],
                       rowids: bool = False, only: np.ndarray | None = None) -> tuple[Callable[[], pa.Table], Stats]:
        """(work, stats): what a worker thread runs to get the filtered visible rows' ``need``
        columns (named by ``cname``; and their ``_rowid`` when ``rowids``), with everything it
        reads taken here, on the loop, at one instant; and how they are read. ``only``: the
        rows to read instead (sorted rowids, visible at T)."""
        assert c.d.schema is not None  # describe() refuses a dropped table
        with_rowids = rowids
        preds = terms + ([box] if box is not None else [])
        cols = {x.id: x for x in [*need, *(t.column for t in terms), *([box.column] if box else [])]}
        indexed = [x for x in cols.values() if gatherable(part.columns, x)]
        decode = [x for x in cols.values() if x.id not in {i.id for i in indexed}]
        while True:  # the visible rows and the runs at one instant (a merge or a GC pass renames runs)
            await part.columns.build(cols)  # built first: taken below without waiting, as a rule
            v = part.columns.version
            ids = await part.index.visible_rowids(c.T) if only is None else only
            cands = await self._candidates(part, preds, every=bool(decode))  # computed in a thread
            srcs = {x.id: await sources(part.columns, x) for x in indexed}
            if part.columns.version == v:
                break
        decoded = None
        if decode:
            if cands is not None:
                narrow = cands
                ids, cands = await asyncio.to_thread(lambda: self._narrowed(part, ids, narrow())), None
            skip = await self.reader.zone_mask(c, ids, terms, box)  # groups no row of which can match
            if skip is not None:
                ids = ids[skip]
            keep = {d.id for d in decode} | set(c.d.schema.primary_key)
            target = replace(c.d.schema, columns=tuple(x for x in c.d.schema.columns if x.id in keep))
            if len(ids):
                decoded = (await fetch(self.reader.store, ids, c.schemas, target, f"table {c.d.name!r} "
                                       f"partition {part.pid}")).batch

        def work() -> pa.Table:
            rowids = ids if cands is None else self._narrowed(part, ids, cands())
            memo: dict[int, Any] = {}  # gather()'s: id(a side table's rowids) -> where ``rowids`` are in it
            arrays = {x.id: gather(srcs[x.id], x, rowids, memo, self._positions) for x in indexed}
            for x in decode:
                arrays[x.id] = decoded.column(x.name) if decoded is not None else pa.nulls(0, x.type.arrow())
            rows = pa.table({"_row": pa.nulls(len(rowids), pa.int8()), **{cname(x): arrays[x.id] for x in need},
                             **({"_rowid": rowids} if with_rowids else {})})
            if preds:
                named = pa.RecordBatch.from_arrays([_whole(arrays[x.id]) for x in cols.values()],
                                                   names=[x.name for x in cols.values()])
                rows = rows.filter(pa.array(batch_mask(named, terms, box)))
            return rows
        return work, {"path": "decode" if decode else "index", "decoded_columns": sorted(x.name for x in decode),
                      "rows": 0, "rows_decoded": len(ids) if decode else 0}


BITMAP_SHARE = 0.25  # a predicate selecting more of the rows than this is checked by value instead


def _worth_a_bitmap(preds: list[Pred], shares: list[float]) -> list[Pred]:
    """The predicates whose bitmaps an aggregate builds (``shares``: about which share of the
    rows each selects, ``PartitionColumns.share``): the most selective one, and any other
    that selects at most ``BITMAP_SHARE`` of the rows. A wide one (``v > 0``: a union of half
    the buckets and a refine) costs more as a bitmap than checking its column's values on the
    few candidates left, which the exact re-check of every term does anyway."""
    ranked = sorted(zip(shares, range(len(preds)), preds), key=lambda x: x[:2])
    return [p for j, (sh, _, p) in enumerate(ranked) if j == 0 or sh <= BITMAP_SHARE]


class PositionsOf:
    """The :class:`Positions` of side-table rowid arrays, each kept while its array lives and
    no longer: a run the column cache evicted takes its entry with it (a strong reference here
    would pin the evicted runs' rowids and positions, ``tables.column_cache_bytes`` not counting
    them)."""

    def __init__(self) -> None:
        self._got: dict[int, tuple[weakref.ref[np.ndarray], Positions]] = {}

    def __len__(self) -> int:
        return len(self._got)

    def __call__(self, ids: np.ndarray) -> Positions:
        key = id(ids)
        kept = self._got.get(key)
        if kept is not None and kept[0]() is ids:
            return kept[1]
        got = Positions(ids)
        self._got[key] = (weakref.ref(ids), got)
        weakref.finalize(ids, self._got.pop, key, None)  # runs before ``key`` can name another array
        return got


def _kept(cache: dict[int, tuple[np.ndarray, T]], key: int, ids: np.ndarray, build: Callable[[np.ndarray], T],
          most: int) -> T:
    """``build(ids)``, kept in ``cache`` under ``key`` while ``ids`` is the same array (cleared
    past ``most`` entries)."""
    kept = cache.get(key)
    if kept is None or kept[0] is not ids:
        if len(cache) >= most:
            cache.clear()
        kept = cache[key] = (ids, build(ids))
    return kept[1]


def _point_spans(srcs: list[ColumnRun | tuple[np.ndarray, pa.Array]],
                 box: BBox) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(rowids, x, y, spans) of each source of a point column: a grid run's slices for the
    cell columns the box touches, or a whole memtable piece (a null point never counts)."""
    out = []
    for src in srcs:
        if isinstance(src, tuple):
            ids, v = src
            arr = v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v
            x = arr.field("x").to_numpy(zero_copy_only=False).astype(np.float64)
            y = arr.field("y").to_numpy(zero_copy_only=False).astype(np.float64)
            if arr.null_count:
                x[~arr.is_valid().to_numpy(zero_copy_only=False)] = np.nan
            out.append((np.asarray(ids, np.uint64), x, y, np.array([[0, len(x)]], np.int64)))
            continue
        g = src.grid
        spans = g.column_spans(box.xmin, box.ymin, box.xmax, box.ymax)
        if len(spans):
            out.append((g.rowids, g.x, g.y, spans))
    return out


def _whole(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def _cells(rows: pa.Table, grid: Grid) -> np.ndarray:
    return cell_counts(rows.column(cname(grid.box.column)), grid)


def _stats_of(works: Sequence[tuple[Callable[[], object], Stats]], counts: list[int]) -> Stats:
    """A node's stats: its partitions' added up (``counts``: the rows each one counted)."""
    out = {"path": "index", "decoded_columns": [], "rows": 0, "rows_decoded": 0, "partitions": 0}
    for (_, st), n in zip(works, counts):
        add_stats(out, dict(st, rows=n))
    return out


def add_stats(into: Stats, st: Stats) -> None:
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


KEY_WALK = True  # first/last by the key's next column read from the key index (tests turn it off to compare)
_WALK_BY = {Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8, Kind.UINT16, Kind.UINT32, Kind.UINT64,
            Kind.DATE, Kind.TIMESTAMP}


def key_walk(spec: AggSpec, terms: list[Term], box: BBox | None) -> tuple[int, bool] | None:
    """(group key columns, last) when the key index alone finds each group's pick: every
    aggregate is ``last`` (or every one ``first``) by the key column right after the group
    keys, the group keys are the key's leading columns, and every term only bounds that
    column from below for ``last`` (a retention on the reading's time) or above for ``first``
    — so each group's greatest (least) visible key is its pick, or the group has no row."""
    pk = spec.pk
    if pk is None or pk.kind != "tuple" or box is not None or not spec.aggs:
        return None
    j = len(spec.group_by)
    if j >= len(pk.columns) or any(k.bucket is not None or k.column.id != pk.columns[i].id
                                   for i, k in enumerate(spec.group_by)):
        return None
    by = pk.columns[j]
    fns = {a.fn for a in spec.aggs}
    if by.type.kind not in _WALK_BY or len(fns) != 1 or not fns <= {"first", "last"} or \
            any(a.by is None or a.by.id != by.id for a in spec.aggs):
        return None
    last = fns == {"last"}
    if any(t.column.id != by.id or t.op not in ((">=", ">") if last else ("<=", "<")) for t in terms):
        return None
    return j, last

