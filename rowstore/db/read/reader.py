"""Reads at a snapshot: ``as_of`` resolved to a closed timestamp T, the table definition
at T, and the reconstruction rule applied through the key index — a row version is
visible at T iff it is the newest version of its key with ``commit_ts <= T`` and not a
deletion (RFC 0003). Point gets take a scalar path (``points.py``); many keys, ranges and
queries are vectorized, the column index narrowing candidates that are then re-checked
exactly; ordered scans are paged (``scans.py``)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from rowstore.errors import FutureTimestampError, HistoryPurgedError, QueryError, UnavailableError
from rowstore.hlc import MAX_TS, HybridClock, ms_of, ts_from_ms
from rowstore.tables.keys import encode_columns, key_arrays, partitions_of
from rowstore.reads.zones import group_keep, keep_mask, segments_of
from rowstore.reads.predicates import BBox, Term, batch_mask, fold_ranges, parse_bbox
from rowstore.reads.retention import kept_terms
from rowstore.schema import SchemaVersion
from rowstore.segments.fetch import fetch
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableCatalog
from rowstore.tables.key_check import check_key_lists, check_keys
from rowstore.db.partition import Partition
from rowstore.timeline import Timeline
from rowstore.db.read.context import ReadContext, check_columns, check_limit, where_of
from rowstore.db.read.points import PointReads
from rowstore.db.read.scans import Scans
from rowstore.db.registry import TableRegistry
from rowstore.db.tasks import BackgroundTasks
from terrafs.failpoints import mutated

MAX_LIMIT = 2**63 - 1  # any limit is fine (docs/REFERENCE.md §3)
# How far the purge horizon trails the retention horizon: a read of the present chosen on one
# node (its closed timestamp, or the largest of several nodes') reaches the others a moment
# later, and a read that passed the check goes on while merges and GC run. History younger
# than retention + this is never purged, so such reads find every version they need.
PURGE_LAG_MS = 5_000
_FINISH_ON_LOOP = 20_000  # rows a query's merge handles on the event loop; more go to a worker thread
LAGGING_MS = 300  # how far behind the mutation ``lagging_read`` serves a read of the present


class Reader(PointReads, Scans):
    """Reads of the tables served here at a snapshot; point reads and scans are its parts
    (:class:`PointReads`, :class:`Scans`)."""

    def __init__(self, store: SegmentStore, definitions: TableCatalog, tables: TableRegistry, clock: HybridClock,
                 timeline: Timeline, tasks: BackgroundTasks,
                 leases_of: Callable[[str, Iterable[int], int], Awaitable[None] | None],
                 retention_ms: int, closed_wait_s: float, purge_lag_ms: int = PURGE_LAG_MS):
        """``leases_of(table id, pids, T)`` raises when a replicated partition among ``pids`` is
        led here without a current lease (the leader's reads need a majority, RFC 0010 §5), and
        answers what a read at T must await first, if anything (``Leadership.check_lease``)."""
        self.store, self.definitions, self.tables = store, definitions, tables
        self.clock, self.timeline, self.tasks, self.leases_of = clock, timeline, tasks, leases_of
        self.retention_ms, self.closed_wait_s, self.purge_lag_ms = retention_ms, closed_wait_s, purge_lag_ms
        self._points = {}  # name -> what a point read at the present needs

    def horizon(self) -> int:
        """The retention horizon: a caller's ``as_of`` below it is refused (410)."""
        return ts_from_ms(max(self.clock.now_ms() - self.retention_ms, 0))

    def purge_horizon(self) -> int:
        """What merges and GC may purge below (RFC 0009: H): ``purge_lag_ms`` behind both the
        retention horizon and the closed timestamp, so that a read accepted at T >= this one's
        value when it started never loses a version it needs while it runs."""
        lag = self.purge_lag_ms
        return max(min(ts_from_ms(max(self.clock.now_ms() - self.retention_ms - lag, 0)),
                       self.timeline.closed - ts_from_ms(lag)), 0)

    async def snapshot(self, as_of: int | None = None, trusted: bool = False) -> int:
        """The read timestamp: the present by default (``Timeline.present``, once closed); a given T
        once it is closed. ``trusted``:
        T comes from another node's clock (a read across nodes, RFC 0010 §4), which may run
        ahead of this node's wall clock — observed and waited for, never refused as future."""
        if as_of is None:
            T = self.timeline.present
            if T > self.timeline.closed and not await self.timeline.wait_closed(T, self.closed_wait_s):
                raise UnavailableError(f"a batch prepared here at {T}, perhaps visible on other nodes already, is "
                                       f"not decided yet (closed timestamp {self.timeline.closed}); retry")
            return self._present(T)
        if isinstance(as_of, bool) or not isinstance(as_of, int) or not 0 <= as_of <= MAX_TS:
            raise QueryError(f"as_of must be a commit timestamp (an integer 0..{MAX_TS}), not {as_of!r}")
        # T from another node (a read of the present there, or a caller's T it checked) is
        # refused only where versions may be gone; a caller's T at the retention horizon.
        floor = self.purge_horizon() if trusted else self.horizon()
        if as_of < floor:
            raise HistoryPurgedError(f"as_of {as_of} is before the retention horizon {floor}")
        if as_of <= self.timeline.closed:
            return as_of
        if ms_of(as_of) > self.clock.now_ms() and not trusted:
            raise FutureTimestampError(f"as_of {as_of} is in the future (closed timestamp {self.timeline.closed})")
        self.clock.observe(as_of)  # later commits get larger timestamps; wait for the older ones
        if not await self.timeline.wait_closed(as_of, self.closed_wait_s):
            if trusted:  # a T the cluster chose (a read of the present): not the caller's doing
                raise UnavailableError(f"a write in flight here holds the read timestamp {as_of} back (closed "
                                       f"timestamp {self.timeline.closed}); retry")
            raise FutureTimestampError(f"as_of {as_of} is not closed yet (closed timestamp {self.timeline.closed})")
        return as_of

    @staticmethod
    def _present(T: int) -> int:
        """A read of the present at ``T`` (a closed timestamp) — or, with the test-only mutation
        ``lagging_read`` (terrafs/failpoints.py), behind it, as a lagging replica would serve it."""
        return T - ts_from_ms(LAGGING_MS) if mutated("lagging_read") else T

    async def context(self, name: str, as_of: int | None, trusted: bool = False, leased: bool = True) -> ReadContext:
        """``leased``: refuse when a replicated partition led here has no current lease (False:
        the read uses no partition's index, only objects)."""
        T = await self.snapshot(as_of, trusted)
        d = await self.definitions.describe(name, T)
        table = await self.tables.table(d)
        if leased and (wait := self.leases_of(d.table_id, table.owned, T)) is not None:
            await wait
        return ReadContext(T, d, table, await self.tables.schemas_of(d), tuple(kept_terms(d, T)))

    async def get_many(self, name: str, keys: Sequence[object] | pa.Array, as_of: int | None = None) -> pa.Table:
        """Rows for many keys at once (vectorized lookups and reads), in key order; absent
        keys are left out."""
        c = await self.context(name, as_of)
        assert c.d.schema is not None  # describe() refuses a dropped table
        pk = c.d.schema.pk
        karrs = check_key_lists(keys, pk) if not isinstance(keys, pa.Array) else \
            [check_keys(keys, pk.columns[0], nul_ok=pk.kind == "tuple")]
        enc = encode_columns(pk, karrs)
        pids = partitions_of(pk, karrs, len(c.table.parts), enc)
        ids: list[np.ndarray] = []
        for p in np.unique(pids):
            index = c.table.parts[p].index
            got = await index.get_many(enc[pids == p], c.T)
            ids.append(got[got != 0])
            if index.consolidation_due:
                self.tasks.spawn(index.merge_memtable())
        rowids = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.uint64)
        rows = (await fetch(self.store, rowids, c.schemas, c.d.schema, f"table {name!r}")).batch
        if c.kept:  # a version older than the retention is not there
            rows = rows.filter(pa.array(batch_mask(rows, list(c.kept), None)))
        return finish([rows], c.d.schema, None, None)

    async def get_rows(self, name: str, keys: Sequence[object], as_of: int | None = None,
                       columns: list[str] | None = None, partitions: list[int] | None = None,
                       trusted: bool = False) -> tuple[pa.Table, int]:
        """The rows of many keys (users' keys) at T, each with ``__pos``, its key's position in
        ``keys`` (a key with no row at T has none; a key asked twice, two); ``partitions``:
        the keys' partitions must be among those (a read across nodes)."""
        c = await self.context(name, as_of, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        check_columns(c.d.schema, columns)
        pk = c.d.schema.pk
        karrs = check_key_lists(keys, pk)
        enc = encode_columns(pk, karrs)
        pids = partitions_of(pk, karrs, len(c.table.parts), enc)
        allowed = c.table.owned if partitions is None else c.table.owned & set(partitions)
        found = np.zeros(len(enc), np.uint64)
        for p in np.unique(pids).tolist():
            if p not in allowed:
                raise UnavailableError(f"table {name!r}: partition {p} is not served by this node")
            at = np.flatnonzero(pids == p)
            found[at] = await c.table.parts[p].index.get_many(enc[at], c.T)
        pos = np.flatnonzero(found)
        ids = np.unique(found[pos])
        rows = (await fetch(self.store, ids, c.schemas, c.d.schema, f"table {name!r}")).batch
        if c.kept:  # a version older than the retention is not there: its key has no row
            old = ids[~batch_mask(rows, list(c.kept), None)]
            pos = pos[~np.isin(found[pos], old)]
        t = pa.Table.from_batches([rows]).take(pa.array(np.searchsorted(ids, found[pos])))
        if columns is not None:
            t = t.select(columns)
        return t.append_column("__pos", pa.array(pos, pa.int64())), c.T

    async def query(self, name: str, where: list[Any] | None = None, bbox: dict[str, Any] | None = None,
                    columns: list[str] | None = None, limit: int | None = 10_000, as_of: int | None = None,
                    partitions: list[int] | None = None, trusted: bool = False) -> tuple[pa.Table, int]:
        """Rows visible at T matching every ``where`` term and the bounding box, in key order;
        ``partitions``: only those (a read across nodes asks each node for its own)."""
        c = await self.context(name, as_of, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        terms, box = c.terms(where), parse_bbox(c.d.schema, bbox)
        check_columns(c.d.schema, columns)
        check_limit(limit)
        parts = c.table.served() if partitions is None else [c.table.parts[p] for p in partitions]
        if any(p.pid not in c.table.owned for p in parts):
            assert partitions is not None  # the served ones are owned
            raise UnavailableError(f"table {name!r}: partitions {sorted(set(partitions) - c.table.owned)} "
                                   "are not served by this node")
        target = narrowed(c.d.schema, columns, terms, box)
        out = await asyncio.gather(*[self._query_part(c, part, terms, box, limit, target) for part in parts])
        if sum(p.num_rows for p in out) > _FINISH_ON_LOOP:  # a sort and a gather of many rows: off the loop
            return await asyncio.to_thread(finish, out, c.d.schema, columns, limit), c.T
        return finish(out, c.d.schema, columns, limit), c.T

    async def _query_part(self, c: ReadContext, part: Partition, terms: list[Term], box: BBox | None,
                          limit: int | None, target: SchemaVersion) -> pa.RecordBatch:
        """The partition's matching rows with ``target``'s columns (the key and the terms'
        columns among them): a columnar segment reads only those. When more rows may match
        than ``limit``, the key and the terms' columns are read first, and the other columns
        only of the first ``limit`` matches by key (no other row can be in the answer)."""
        assert c.d.schema is not None  # describe() refuses a dropped table
        cands, srcs = await candidates(part, terms + ([box] if box is not None else []))
        if cands is None:  # no index applies: the partition's visible rows, in key order
            return await self._scan_part(c, part, terms, box, limit, target)
        assert srcs is not None  # set with cands
        keep = await self.zone_mask(c, cands, terms, box)
        if keep is not None:
            cands, srcs = cands[keep], srcs[keep]
        tested = narrowed(c.d.schema, [], terms, box)
        keys_first = limit is not None and len(cands) > limit and len(tested.columns) < len(target.columns)
        rows = await fetch(self.store, cands, c.schemas, tested if keys_first else target,
                           where_of(c, part))  # in rowid order, as cands
        keys = encode_columns(c.d.schema.pk, key_arrays(c.d.schema.pk, rows.batch))
        visible = (rows.commit_ts <= np.uint64(c.T)) & ~rows.deleted
        idx = np.flatnonzero(visible)
        visible[idx] = ~await part.index.superseded(keys[idx], rows.commit_ts[idx], srcs[idx], c.T)
        match = visible & batch_mask(rows.batch, terms, box)
        if not keys_first:
            return rows.batch.filter(pa.array(match))
        at = np.flatnonzero(match)
        if len(at) > (limit or 0):
            at = np.sort(at[np.argsort(keys[at], kind="stable")[:limit]])
        return (await fetch(self.store, cands[at], c.schemas, target, where_of(c, part))).batch

    async def _scan_part(self, c: ReadContext, part: Partition, terms: list[Term], box: BBox | None,
                         limit: int | None, target: SchemaVersion) -> pa.RecordBatch:
        """Visible rows in key order, fetched in growing chunks until ``limit`` of them match:
        the answer is the first ``limit`` keys overall, so no partition needs more."""
        assert c.d.schema is not None  # describe() refuses a dropped table
        ids = (await part.index.scan(c.T)).rowids  # key order
        keep = await self.zone_mask(c, ids, terms, box)
        if keep is not None:
            ids = ids[keep]
        got, at, step = [], 0, max(4 * (limit or 0), 4096)
        while at < len(ids):
            chunk = ids[at : at + step] if limit is not None else ids
            at += len(chunk)
            rows = await fetch(self.store, chunk, c.schemas, target, where_of(c, part))  # rowid order
            got.append(rows.batch.filter(pa.array(batch_mask(rows.batch, terms, box))) if terms or box else rows.batch)
            if limit is not None and sum(x.num_rows for x in got) >= limit:
                break
            step *= 4
        got = [b for b in got if b.num_rows]
        if not got:
            return _empty_batch(target)
        return got[0] if len(got) == 1 else pa.Table.from_batches(got).combine_chunks().to_batches()[0]


    async def zone_mask(self, c: ReadContext, ids: np.ndarray, terms: list[Term],
                        box: BBox | None) -> np.ndarray | None:
        """Rows of segments whose cluster range the query misses are left out (RFC 0009), and
        rows of columnar segments' groups whose column statistics it misses (RFC 0014)."""
        if len(ids) == 0 or (box is None and not terms):
            return None
        keep = None
        segids = segments_of(ids)
        if c.d.cluster_by is not None:
            keep = keep_mask(ids, await self.store.clusters(segids), terms, box)
        groups = group_keep(ids, await self.store.columnar_segments(segids), terms, box)
        if groups is not None:
            keep = groups if keep is None else keep & groups
        return keep

    async def retained(self, c: ReadContext, part: Partition, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` (visible rowids of ``part``) the table's retention keeps, exactly —
        for a plan whose bitmaps readers take as they are. Rows the zone maps show to be newer
        than the cutoff are kept unread; the others' retention column is read."""
        keep = np.ones(len(ids), bool)
        if not c.kept or len(ids) == 0:
            return keep
        assert c.d.schema is not None  # describe() refuses a dropped table
        t = c.kept[0]
        maybe = await self.zone_mask(c, ids, [Term(t.column, "<", t.value)], None)  # may hold older rows
        at = np.arange(len(ids)) if maybe is None else np.flatnonzero(maybe)
        if len(at):
            at = at[np.argsort(ids[at], kind="stable")]  # fetch answers in rowid order; ids may be in key order
            rows = await fetch(self.store, ids[at], c.schemas, narrowed(c.d.schema, [], list(c.kept), None),
                               where_of(c, part))
            keep[at] = batch_mask(rows.batch, list(c.kept), None)
        return keep


async def candidates(part: Partition, preds: list[Term | BBox]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Sorted rowids every usable column index allows, with each one's source run (RFC 0002);
    (None, None) when no predicate can use an index."""
    cands = srcs = None
    for pred in fold_ranges(preds):
        got = await part.columns.candidates(pred)
        if got is None:
            continue
        if cands is None:
            cands, srcs = got
        else:
            assert srcs is not None  # set with cands
            cands, i, _ = np.intersect1d(cands, got[0], assume_unique=True, return_indices=True)
            srcs = srcs[i]
    return cands, srcs


def narrowed(schema: SchemaVersion, columns: list[str] | None, terms: list[Term], box: BBox | None) -> SchemaVersion:
    """``schema`` with only what a read returns and tests: ``columns`` (all when None), the
    key and the columns of the terms and the bbox."""
    if columns is None:
        return schema
    keep = {*columns, *schema.pk.names, *(t.column.name for t in terms), *([box.column.name] if box else [])}
    return replace(schema, columns=tuple(x for x in schema.columns if x.name in keep))


def _empty_batch(schema: SchemaVersion) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], c.type.arrow()) for c in schema.columns], schema=schema.arrow())


def finish(parts: list[pa.RecordBatch], schema: SchemaVersion, columns: list[str] | None,
           limit: int | None) -> pa.Table:
    """Partitions' rows as one table in key order, cut to ``limit``, with ``columns``. Only
    the columns returned (and the key) are gathered; the order comes from a stable sort of the
    encoded keys, which merges parts already in key order in linear time."""
    names = [c.name for c in schema.columns] if columns is None else \
        [*columns, *(k for k in schema.pk.names if k not in columns)]
    arrow = schema.arrow()
    out_schema = pa.schema([arrow.field(x) for x in names])
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return out_schema.empty_table().select(columns if columns is not None else names)
    t = pa.Table.from_batches([p.select(names) for p in parts], schema=out_schema)
    if t.num_rows > 1:
        keys = encode_columns(schema.pk, key_arrays(schema.pk, t))
        order = np.argsort(keys, kind="stable")
        if limit is not None:
            order = order[:limit]
        own = not len(order) or (int(order[-1]) == len(order) - 1 and not bool((order[1:] < order[:-1]).any()))
        if not own:  # not the rows' own order (or a prefix of it)
            t = t.take(pa.array(order))
    if limit is not None:
        t = t.slice(0, limit)
    return t.select(list(columns)) if columns is not None else t
